// Parquet documents through Arrow/Parquet C++ from the pyarrow wheel (found
// beside torch, cmake/Dependencies.cmake). Arrow's headers need C++20, so
// this one file is compiled as C++20; only std types cross its interface.
// Row groups are read one at a time, so memory holds one row group's column.
#include "parquet_reader.h"

#include "input_files.h"
#include "meshtrain/core/check.h"

#ifdef MESHTRAIN_HAVE_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <cstdint>
#include <parquet/arrow/reader.h>
#endif

namespace meshtrain::detail {

#ifdef MESHTRAIN_HAVE_PARQUET
namespace {

class ParquetDocuments : public DocumentReader {
 public:
  ParquetDocuments(const std::string& path, const std::string& key) : path_(path) {
    auto file = arrow::io::ReadableFile::Open(path);
    MT_CHECK(file.ok(), "cannot open Parquet file ", path, ": ", file.status().ToString());
    auto size = (*file)->GetSize();
    bytes_ = size.ok() ? *size : 0;
    auto reader = parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
    MT_CHECK(reader.ok(), path, " is not a readable Parquet file: ", reader.status().ToString());
    reader_ = std::move(*reader);
    std::shared_ptr<arrow::Schema> schema;
    auto st = reader_->GetSchema(&schema);
    MT_CHECK(st.ok(), path, ": cannot read the Parquet schema: ", st.ToString());
    column_ = schema->GetFieldIndex(key);
    if (column_ < 0) {
      std::string names;
      for (const auto& f : schema->fields()) names += (names.empty() ? "" : ", ") + f->name();
      MT_FAIL(path, ": no column \"", key, "\" (columns: ", names, "); choose the text column with --text-key");
    }
    type_ = schema->field(column_)->type()->id();
    MT_CHECK(type_ == arrow::Type::STRING || type_ == arrow::Type::LARGE_STRING ||
                 type_ == arrow::Type::STRING_VIEW,
             path, ": column \"", key, "\" holds ", schema->field(column_)->type()->ToString(),
             ", not strings");
    // A flat string column comes back as column 0 of each row group's table.
  }

  bool next(std::string& doc) override {
    while (true) {
      if (chunk_ && row_ < chunk_->length()) {
        const int64_t r = row_++;
        if (chunk_->IsNull(r)) continue;
        std::string_view v = type_ == arrow::Type::STRING
                                 ? static_cast<const arrow::StringArray&>(*chunk_).GetView(r)
                             : type_ == arrow::Type::LARGE_STRING
                                 ? static_cast<const arrow::LargeStringArray&>(*chunk_).GetView(r)
                                 : static_cast<const arrow::StringViewArray&>(*chunk_).GetView(r);
        if (v.empty()) continue;
        doc.assign(v.data(), v.size());
        return true;
      }
      if (table_ && next_chunk_ < table_->column(0)->num_chunks()) {
        chunk_ = table_->column(0)->chunk(next_chunk_++);
        row_ = 0;
        continue;
      }
      if (row_group_ >= reader_->num_row_groups()) {
        done_ = true;
        return false;
      }
      auto t = reader_->ReadRowGroup(row_group_++, std::vector<int>{column_});
      MT_CHECK(t.ok(), path_, ": cannot read row group ", row_group_ - 1, ": ", t.status().ToString());
      table_ = *t;
      next_chunk_ = 0;
      chunk_.reset();
    }
  }

  int64_t consumed() const override {
    const int groups = reader_->num_row_groups();
    return done_ || groups == 0 ? bytes_ : bytes_ * row_group_ / groups;
  }

 private:
  std::string path_;
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  int column_ = -1;
  arrow::Type::type type_ = arrow::Type::STRING;
  int row_group_ = 0;
  std::shared_ptr<arrow::Table> table_;
  int next_chunk_ = 0;
  std::shared_ptr<arrow::Array> chunk_;
  int64_t row_ = 0, bytes_ = 0;
  bool done_ = false;
};

}  // namespace

bool parquet_supported() { return true; }

std::unique_ptr<DocumentReader> open_parquet_documents(const std::string& path, const std::string& text_key) {
  return std::make_unique<ParquetDocuments>(path, text_key);
}

#else

bool parquet_supported() { return false; }

std::unique_ptr<DocumentReader> open_parquet_documents(const std::string& path, const std::string& /*text_key*/) {
  MT_FAIL("cannot read ", path, ": this build has no Parquet support (pyarrow's Arrow/Parquet C++ not found)");
}

#endif

}  // namespace meshtrain::detail
