#pragma once
// prepare-data's inputs: which files are used and how each is cut into
// documents. Formats come from the name (after a .gz/.zst suffix) and the
// content: JSON Lines and JSON arrays give one document per record (the
// text key's value; structured files are never read as raw text), Parquet one
// per row of a text column, and plain text files split at paragraph breaks
// (blank lines) or at fortune's "%" lines. Anything else is reported with
// the reason it was skipped.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain::detail {

enum class InputFormat { kText, kJsonl, kJsonArray, kParquet };

struct InputFile {
  std::string path;
  InputFormat format = InputFormat::kText;
  int64_t bytes = 0;  // on disk (compressed)
};
struct SkippedFile {
  std::string path;
  std::string reason;
};
struct InputPlan {
  std::vector<InputFile> files;
  std::vector<SkippedFile> skipped;
};

// Every file under the inputs (folders recursively, hidden ones skipped), in
// name order, each either used with its format or skipped with a reason.
InputPlan plan_inputs(const std::vector<std::string>& inputs);

// The documents of one file, in order. text_split (plain text only):
// "paragraph" (blank lines; fortune files at "%" lines), "line" or "file".
class DocumentReader {
 public:
  virtual ~DocumentReader() = default;
  virtual bool next(std::string& doc) = 0;
  virtual int64_t consumed() const = 0;  // bytes of the file read so far
};
std::unique_ptr<DocumentReader> open_documents(const InputFile& file, const std::string& text_key,
                                               const std::string& text_split);

const char* format_name(InputFormat f);

}  // namespace meshtrain::detail
