#include "meshtrain/data/data_tokenizer.h"

#include <filesystem>

#include "json_file.h"
#include "meshtrain/core/check.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/data/tokenizer_fingerprint.h"

namespace fs = std::filesystem;

namespace meshtrain {

std::string dataset_fingerprint(const std::string& dir, std::string* source) {
  const fs::path manifest = fs::path(dir) / "manifest.json", tok_file = fs::path(dir) / "tokenizer.json";
  std::string claimed;
  if (fs::is_regular_file(manifest)) {
    const nlohmann::json j = detail::read_json_file(manifest.string(), "dataset manifest");
    if (j.is_object() && j.contains("tokenizer_fingerprint")) {
      MT_CHECK(j.at("tokenizer_fingerprint").is_string(), manifest.string(),
               ": tokenizer_fingerprint is not a string");
      claimed = j.at("tokenizer_fingerprint").get<std::string>();
      fingerprint_bits(claimed);  // 16 hex digits, else an error naming it
    }
  }
  if (fs::is_regular_file(tok_file)) {
    const std::string actual = tokenizer_fingerprint(Tokenizer::load(tok_file.string()));
    MT_CHECK(claimed.empty() || actual == claimed, tok_file.string(), " is tokenizer ", actual,
             ", but the data of ", dir, " was made by tokenizer ", claimed, " (", manifest.string(),
             "): the tokenizer file was replaced; restore it or prepare the data again");
    if (claimed.empty()) {
      if (source) *source = tok_file.string();
      return actual;
    }
  }
  if (source) *source = claimed.empty() ? "" : manifest.string();
  return claimed;
}

DataTokenizer check_data_tokenizer(const std::vector<DatasetFiles>& datasets) {
  DataTokenizer out;
  for (const auto& ds : datasets) {
    std::string source;
    const std::string claimed = dataset_fingerprint(ds.dir, &source);
    // The reference every shard is held to: the dataset's own files, else the
    // first shard that carries a fingerprint.
    std::string ref = claimed, ref_from = source;
    std::string marked, unmarked;  // a shard with and one without a fingerprint
    for (const auto& f : ds.files) {
      const std::string fp = ShardReader(f, 0, ds.format).tokenizer_fingerprint();
      if (fp.empty()) {
        if (unmarked.empty()) unmarked = f;
        continue;
      }
      if (marked.empty()) marked = f;
      if (ref.empty()) {
        ref = fp;
        ref_from = "shard " + f;
        continue;
      }
      MT_CHECK(fp == ref, "shard ", f, " was made by tokenizer ", fp, ", but the data of ", ds.dir,
               " is of tokenizer ", ref, " (", ref_from, "): it comes from another dataset; remove it");
    }
    // prepare-data marks every shard it writes: an unmarked one among marked
    // ones, or in a folder whose manifest names a fingerprint, was put there
    // from elsewhere.
    const bool claims = !claimed.empty() && source == (fs::path(ds.dir) / "manifest.json").string();
    MT_CHECK(unmarked.empty() || (marked.empty() && !claims), "shard ", unmarked,
             " carries no tokenizer fingerprint, but ",
             marked.empty() ? "the manifest " + source + " says every shard of " + ds.dir + " has one"
                            : "shard " + marked + " of the same data has one",
             " (tokenizer ", ref, "): it does not come from this dataset; remove it");
    if (ref.empty()) {
      out.notes.push_back("the data in " + ds.dir +
                          " carries no tokenizer fingerprint (llm.c / nanoGPT / .npy files or older prepare-data "
                          "output without tokenizer.json): which tokenizer made it cannot be checked");
      continue;
    }
    if (!unmarked.empty())
      out.notes.push_back("the shards of " + ds.dir + " carry no tokenizer fingerprint (older prepare-data output): " +
                          "checked against " + source + " only");
    if (out.fingerprint.empty()) {
      out.fingerprint = ref;
      out.where = ds.dir;
      continue;
    }
    MT_CHECK(ref == out.fingerprint, "the run's data mixes tokenizers: ", out.where, " was made by tokenizer ",
             out.fingerprint, ", ", ds.dir, " by tokenizer ", ref,
             " (the same ids mean different tokens); prepare every dataset with one tokenizer (prepare-data "
             "--tokenizer ", out.where, "/tokenizer.json)");
  }
  return out;
}

}  // namespace meshtrain
