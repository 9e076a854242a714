#include "input_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "byte_source.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"
#include "parquet_reader.h"

namespace fs = std::filesystem;

namespace meshtrain::detail {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

// The format a file's name and first bytes say, or a reason to skip it.
bool classify(const fs::path& p, InputFormat* format, std::string* reason) {
  const std::string name = p.filename().string();
  if (!name.empty() && name[0] == '.') {
    *reason = "hidden file";
    return false;
  }
  std::string ext = lower(p.extension().string());
  std::string stem_ext = ext;
  if (ext == ".gz" || ext == ".gzip" || ext == ".zst" || ext == ".zstd") {
    stem_ext = lower(p.stem().extension().string());
  }
  static const std::set<std::string> binary = {
      ".bin", ".npy", ".npz", ".pt", ".pth", ".safetensors", ".ckpt", ".arrow", ".feather", ".tiktoken",
      ".zip", ".tar", ".7z", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".pdf", ".so", ".o", ".a", ".exe",
      ".pyc", ".whl", ".idx", ".model"};
  if (ext == ".bz2" || ext == ".xz" || ext == ".lz4" || ext == ".lzma") {
    *reason = "unsupported compression " + ext + " (gzip and zstd are read)";
    return false;
  }
  if (stem_ext == ".dat") {
    *reason = "fortune index file (.dat)";
    return false;
  }
  if (binary.count(stem_ext)) {
    *reason = "binary format (" + stem_ext + ")";
    return false;
  }
  if (stem_ext == ".csv" || stem_ext == ".tsv") {
    *reason = "CSV/TSV is structured and has no text column convention; convert it to JSONL";
    return false;
  }
  if (stem_ext == ".parquet") {
    if (!parquet_supported()) {
      *reason = "Parquet support is not built in (Arrow/Parquet C++ not found at configure time)";
      return false;
    }
    *format = InputFormat::kParquet;
    return true;
  }
  const std::string head = read_prefix(p.string(), 8000);
  if (stem_ext == ".jsonl" || stem_ext == ".ndjson" || stem_ext == ".jsonlines") {
    *format = InputFormat::kJsonl;
    return true;
  }
  if (stem_ext == ".json") {
    size_t first = head.find_first_not_of(" \t\r\n");
    // A .json file holding one object per line is JSON Lines in disguise.
    *format = first != std::string::npos && head[first] == '[' ? InputFormat::kJsonArray : InputFormat::kJsonl;
    return true;
  }
  // Like git: a NUL byte near the start marks a binary file.
  if (head.find('\0') != std::string::npos) {
    *reason = "binary content (NUL bytes)";
    return false;
  }
  if (is_blank(head)) {
    *reason = "empty";
    return false;
  }
  *format = InputFormat::kText;
  return true;
}

class TextDocuments : public DocumentReader {
 public:
  TextDocuments(const std::string& path, const std::string& split) : lines_(open_source(path)), split_(split) {
    if (split_ == "paragraph") {
      // fortune files separate entries by "%" lines, which may hold blank lines.
      const std::string head = read_prefix(path, 1 << 16);
      if (head.rfind("%\n", 0) == 0 || head.find("\n%\n") != std::string::npos ||
          head.find("\n%\r\n") != std::string::npos)
        split_ = "fortune";
    }
  }
  bool next(std::string& doc) override {
    doc.clear();
    std::string line;
    while (lines_.next(line)) {
      if (split_ == "line") {
        if (is_blank(line)) continue;
        doc = line;
        return true;
      }
      bool boundary = split_ == "fortune" ? (line == "%" || line == "%\r")
                      : split_ == "paragraph" ? is_blank(line)
                                              : false;
      if (boundary) {
        if (!is_blank(doc)) return true;
        doc.clear();
        continue;
      }
      doc += line;
      doc += '\n';
    }
    return !is_blank(doc);
  }
  int64_t consumed() const override { return lines_.consumed(); }

 private:
  LineReader lines_;
  std::string split_;
};

std::string text_of(const nlohmann::json& record, const std::string& key, const std::string& where) {
  MT_CHECK(record.is_object(), where, ": expected a JSON object with a \"", key, "\" string, got ",
           record.type_name());
  auto it = record.find(key);
  MT_CHECK(it != record.end(), where, ": no \"", key, "\" key (keys: ",
           [&] {
             std::string keys;
             for (auto k = record.begin(); k != record.end(); ++k) keys += (keys.empty() ? "" : ", ") + k.key();
             return keys;
           }(),
           "); choose the text field with --text-key");
  MT_CHECK(it->is_string(), where, ": \"", key, "\" is a ", it->type_name(), ", not a string");
  return it->get<std::string>();
}

class JsonlDocuments : public DocumentReader {
 public:
  JsonlDocuments(const std::string& path, const std::string& key) : path_(path), key_(key), lines_(open_source(path)) {}
  bool next(std::string& doc) override {
    std::string line;
    while (lines_.next(line)) {
      ++line_no_;
      if (is_blank(line)) continue;
      const std::string where = path_ + ":" + std::to_string(line_no_);
      nlohmann::json record;
      try {
        record = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        MT_FAIL(where, ": not valid JSON (JSON Lines needs one object per line): ", e.what());
      }
      doc = text_of(record, key_, where);
      if (!doc.empty()) return true;
    }
    return false;
  }
  int64_t consumed() const override { return lines_.consumed(); }

 private:
  std::string path_, key_;
  LineReader lines_;
  int64_t line_no_ = 0;
};

// A JSON array has to be parsed whole; big corpora come as JSON Lines.
class JsonArrayDocuments : public DocumentReader {
 public:
  JsonArrayDocuments(const std::string& path, const std::string& key) : path_(path), key_(key) {
    auto src = open_source(path);
    std::string text;
    std::vector<char> buf(1 << 20);
    while (size_t got = src->read(buf.data(), buf.size())) text.append(buf.data(), got);
    consumed_ = src->consumed();
    try {
      records_ = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      MT_FAIL(path, ": not valid JSON: ", e.what());
    }
    MT_CHECK(records_.is_array(), path, ": expected a JSON array of objects");
  }
  bool next(std::string& doc) override {
    while (index_ < records_.size()) {
      const auto& r = records_[index_];
      const std::string where = path_ + " [" + std::to_string(index_++) + "]";
      doc = r.is_string() ? r.get<std::string>() : text_of(r, key_, where);
      if (!doc.empty()) return true;
    }
    return false;
  }
  int64_t consumed() const override { return consumed_; }

 private:
  std::string path_, key_;
  nlohmann::json records_;
  size_t index_ = 0;
  int64_t consumed_ = 0;
};

// "" when p can be opened for reading, else why not (errno's words).
std::string unreadable(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  return "";
}

// Appends the regular files under folder (recursively, sorted per folder,
// hidden folders and links to folders not entered) to found, and what is
// skipped -- FIFOs, devices, broken links, link loops, unreadable files and
// folders -- with the reason to skipped. Returns why folder itself cannot be
// listed, "" when it can.
std::string list_folder(const fs::path& folder, std::vector<fs::path>& found, std::vector<SkippedFile>& skipped) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  if (ec) return ec.message();
  std::sort(entries.begin(), entries.end());
  for (const fs::path& e : entries) {
    const fs::file_status st = fs::status(e, ec);  // links followed
    if (ec) {
      // ELOOP: a link loop; ENOENT: a link to nothing. Either is named, never fatal.
      skipped.push_back({e.string(), ec == std::errc::too_many_symbolic_link_levels
                                         ? "a symbolic link loop (" + ec.message() + "), not a regular file"
                                     : ec == std::errc::no_such_file_or_directory ? "a broken link, not a regular file"
                                                                                  : "cannot be read: " + ec.message()});
      continue;
    }
    if (fs::is_directory(st)) {
      // Hidden folders (.git, .cache) hold no corpus; a linked folder may link back (a loop).
      if (e.filename().string().rfind('.', 0) == 0 || fs::is_symlink(e, ec)) continue;
      const std::string why = list_folder(e, found, skipped);
      if (!why.empty()) skipped.push_back({e.string(), "a folder that cannot be read: " + why});
    } else if (fs::is_regular_file(st)) {
      const std::string why = unreadable(e);
      if (why.empty()) found.push_back(e);
      else skipped.push_back({e.string(), "cannot be read: " + why});
    } else {
      // A FIFO or a device would block or never end: listed, never read.
      skipped.push_back({e.string(), non_regular_kind(e.string()) + ", not a regular file"});
    }
  }
  return "";
}

}  // namespace

const char* format_name(InputFormat f) {
  switch (f) {
    case InputFormat::kText: return "text";
    case InputFormat::kJsonl: return "jsonl";
    case InputFormat::kJsonArray: return "json";
    case InputFormat::kParquet: return "parquet";
  }
  return "?";
}

InputPlan plan_inputs(const std::vector<std::string>& inputs) {
  MT_CHECK(!inputs.empty(), "prepare-data: no --input given");
  std::vector<fs::path> candidates;
  std::vector<SkippedFile> special;
  for (const auto& input : inputs) {
    fs::path p(input);
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    MT_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "prepare-data: --input '", input, "' cannot be ",
             "read: ", ec.message());
    MT_CHECK(fs::exists(st), "prepare-data: --input '", input, "' does not exist");
    if (fs::is_directory(st)) {
      std::vector<fs::path> found;
      const std::string why = list_folder(p, found, special);
      MT_CHECK(why.empty(), "prepare-data: --input '", input, "' cannot be read: ", why);
      std::sort(found.begin(), found.end());
      candidates.insert(candidates.end(), found.begin(), found.end());
    } else {
      require_regular_file(input, "prepare-data: --input");
      const std::string why = unreadable(p);
      MT_CHECK(why.empty(), "prepare-data: --input '", input, "' cannot be read: ", why);
      candidates.push_back(p);
    }
  }
  // A link is dropped when its target is listed too (fortune's art.u8 -> art),
  // whichever of the two sorts first; a repeated real file is dropped as well.
  std::set<fs::path> real;
  for (const auto& p : candidates) {
    if (!fs::is_symlink(p)) real.insert(fs::canonical(p));
  }
  InputPlan plan;
  for (auto& sp : special) plan.skipped.push_back(sp);
  std::set<fs::path> seen;
  for (const auto& p : candidates) {
    const fs::path target = fs::canonical(p);
    if ((fs::is_symlink(p) && real.count(target)) || !seen.insert(target).second) {
      plan.skipped.push_back({p.string(), "duplicate of " + target.string()});
      continue;
    }
    InputFile f;
    f.path = p.string();
    f.bytes = static_cast<int64_t>(fs::file_size(target));
    std::string reason;
    if (classify(p, &f.format, &reason)) {
      plan.files.push_back(f);
    } else {
      plan.skipped.push_back({p.string(), reason});
    }
  }
  return plan;
}

std::unique_ptr<DocumentReader> open_documents(const InputFile& file, const std::string& text_key,
                                               const std::string& text_split) {
  switch (file.format) {
    case InputFormat::kJsonl: return std::make_unique<JsonlDocuments>(file.path, text_key);
    case InputFormat::kJsonArray: return std::make_unique<JsonArrayDocuments>(file.path, text_key);
    case InputFormat::kParquet: return open_parquet_documents(file.path, text_key);
    case InputFormat::kText: break;
  }
  return std::make_unique<TextDocuments>(file.path, text_split);
}

}  // namespace meshtrain::detail
