#pragma once
// Helpers shared by the data/ unit tests (data_test, tokenizer_test).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain::test {

namespace fs = std::filesystem;


class TempDir {
 public:
  TempDir() {
    static int counter = 0;  // unique names within this process; pid across processes
    path_ = fs::temp_directory_path() /
            ("mt_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs fn and returns the meshtrain::Error message ("" when nothing was thrown).
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> sample_documents() {
  std::vector<std::string> docs;
  for (int i = 0; i < 200; ++i) {
    docs.push_back("The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs " +
                   std::to_string(i) + " times.\nIt's the end of the story, and they'll read it again.\n");
  }
  return docs;
}

const std::vector<std::string>& unicode_samples() {
  static const std::vector<std::string> samples = {
      "",
      "plain ascii, with punctuation!? and   spaces\n\n\ttabs",
      "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m",       // accents
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0 \xe4\xb8\xad\xe6\x96\x87",  // CJK
      "emoji \xf0\x9f\x98\x80\xf0\x9f\x9a\x80 and \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd!",  // emoji + skin tone
      "broken utf-8: \xff\xfe \xc3 end \xe6\x97",                                      // invalid bytes too
      "<|endoftext|> is plain text here",
      "numbers 1234567890 3.14159 and 'quotes' don't won't I'm we've",
  };
  return samples;
}

}  // namespace meshtrain::test
