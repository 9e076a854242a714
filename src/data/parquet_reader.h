#pragma once
// Parquet input (one document per row of a string column), compiled in when
// Arrow/Parquet C++ were found (MESHTRAIN_HAVE_PARQUET).
#include <memory>
#include <string>

namespace meshtrain::detail {

class DocumentReader;
bool parquet_supported();
std::unique_ptr<DocumentReader> open_parquet_documents(const std::string& path, const std::string& text_key);

}  // namespace meshtrain::detail
