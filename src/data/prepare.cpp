#include "meshtrain/data/prepare.h"

#include <cstdint>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <thread>

#include "input_files.h"
#include "output_guard.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/data/shard_writer.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/data/tokenizer_fingerprint.h"

namespace fs = std::filesystem;

namespace meshtrain {
namespace {

// --workers above this many per core is refused (a typo, not a need).
constexpr int64_t kWorkersPerCore = 4;

using Clock = std::chrono::steady_clock;

// Documents are assigned to train or val in blocks of this many, in input
// order: each block holds its share of the fraction, the documents picked
// by a seeded hash, so the split is exact, random, reproducible and
// streamable, and never follows file boundaries.
constexpr size_t kBlockDocs = 128;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The documents of every input file in order, in blocks with their split.
class DocumentStream {
 public:
  DocumentStream(const detail::InputPlan& plan, const PrepareOptions& opt) : plan_(plan), opt_(opt) {
    for (const auto& f : plan_.files) total_bytes_ += f.bytes;
  }

  // Next block of documents and whether each goes to validation; false at the end.
  bool next_block(std::vector<std::string>& docs, std::vector<char>& is_val) {
    docs.clear();
    if (!have_lookahead_ && !read_one(lookahead_)) return false;
    have_lookahead_ = false;
    docs.push_back(std::move(lookahead_));
    std::string doc;
    while (docs.size() < kBlockDocs && read_one(doc)) docs.push_back(std::move(doc));
    const bool last = !(have_lookahead_ = read_one(lookahead_));
    assign(docs, last, is_val);
    return true;
  }

  int64_t bytes_done() const { return finished_bytes_ + (reader_ ? reader_->consumed() : 0); }
  int64_t total_bytes() const { return total_bytes_; }
  int64_t documents() const { return documents_; }

 private:
  bool read_one(std::string& doc) {
    while (true) {
      if (!reader_) {
        if (file_ >= plan_.files.size()) return false;
        reader_ = detail::open_documents(plan_.files[file_], opt_.text_key, opt_.text_split);
      }
      if (reader_->next(doc)) {
        ++documents_;
        return true;
      }
      finished_bytes_ += plan_.files[file_].bytes;
      reader_.reset();
      ++file_;
    }
  }

  void assign(const std::vector<std::string>& docs, bool last, std::vector<char>& is_val) {
    const auto m = static_cast<int64_t>(docs.size());
    const int64_t end = assigned_ + m;
    const double f = opt_.val_fraction;
    auto target = static_cast<int64_t>(std::llround(static_cast<double>(end) * f));
    // At least one validation document, and at least one for training.
    if (last && f > 0) target = std::max<int64_t>(target, 1);
    if (last) target = std::min<int64_t>(target, end - 1);
    const int64_t k = std::clamp<int64_t>(target - val_so_far_, 0, m);
    std::vector<std::pair<uint64_t, int64_t>> order;
    for (int64_t i = 0; i < m; ++i) order.emplace_back(splitmix64(opt_.seed ^ splitmix64(assigned_ + i)), i);
    std::sort(order.begin(), order.end());
    is_val.assign(docs.size(), 0);
    for (int64_t i = 0; i < k; ++i) is_val[static_cast<size_t>(order[static_cast<size_t>(i)].second)] = 1;
    val_so_far_ += k;
    assigned_ = end;
  }

  const detail::InputPlan& plan_;
  const PrepareOptions& opt_;
  size_t file_ = 0;
  std::unique_ptr<detail::DocumentReader> reader_;
  int64_t finished_bytes_ = 0, total_bytes_ = 0, documents_ = 0;
  int64_t assigned_ = 0, val_so_far_ = 0;
  std::string lookahead_;
  bool have_lookahead_ = false;
};

// Calls opt.progress at most twice a second.
class ProgressTicker {
 public:
  ProgressTicker(const PrepareOptions& opt, Clock::time_point start) : opt_(opt), start_(start), last_(start) {}
  void tick(const DocumentStream& s, int64_t tokens, bool force = false) {
    if (!opt_.progress) return;
    auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now;
    PrepareProgress p;
    p.bytes_done = s.bytes_done();
    p.bytes_total = s.total_bytes();
    p.documents = s.documents();
    p.tokens = tokens;
    p.seconds = std::chrono::duration<double>(now - start_).count();
    opt_.progress(p);
  }

 private:
  const PrepareOptions& opt_;
  Clock::time_point start_, last_;
};

Tokenizer make_tokenizer(const PrepareOptions& opt, const detail::InputPlan& plan) {
  if (opt.vocab_size <= 0) return load_tokenizer(opt.tokenizer_file, opt.pattern);
  // Train on the training documents only (up to the byte budget), so the
  // tokenizer never sees validation text.
  DocumentStream stream(plan, opt);
  std::vector<std::string> train, block;
  std::vector<char> is_val;
  int64_t bytes = 0;
  while (bytes < opt.tokenizer_train_bytes && stream.next_block(block, is_val)) {
    throw_if_stop_requested("prepare-data (reading the tokenizer's training text)");
    for (size_t i = 0; i < block.size(); ++i) {
      if (is_val[i] || bytes >= opt.tokenizer_train_bytes) continue;
      bytes += static_cast<int64_t>(block[i].size());
      train.push_back(std::move(block[i]));
    }
  }
  return Tokenizer::train(train, opt.vocab_size, opt.pattern.empty() ? "gpt2" : opt.pattern);
}

struct Tokenized {
  std::vector<int32_t> train, val;
  int64_t train_docs = 0, val_docs = 0;
};

struct SplitResult {
  int64_t train_docs = 0, val_docs = 0;
  std::vector<std::string> train_shards, val_shards;
  int64_t train_tokens = 0, val_tokens = 0;
};

// Reader (this thread) -> workers -> writer, with at most max_in_flight
// blocks between reading and writing. The first error (or stop request)
// anywhere aborts all three; rethrow() then raises it.
class TokenizePipeline {
 public:
  explicit TokenizePipeline(int workers) : max_in_flight_(2 * workers + 2) {}

  // A worker: tokenizes blocks from the queue until reading is done.
  void work(const Tokenizer& tok) {
    try {
      EncodeCache cache;
      while (true) {
        Block b;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return aborted_ || !queue_.empty() || reading_done_; });
          if (aborted_ || queue_.empty()) return;
          b = std::move(queue_.front());
          queue_.pop_front();
        }
        Tokenized t;
        for (size_t i = 0; i < b.docs.size(); ++i) {
          auto& dst = b.is_val[i] ? t.val : t.train;
          tok.encode(b.docs[i], cache, dst);
          dst.push_back(tok.eot());
          ++(b.is_val[i] ? t.val_docs : t.train_docs);
        }
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(b.seq, std::move(t));
        cv_.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // The writer: appends tokenized blocks to the shards in reading order.
  void write(const PrepareOptions& opt, const Tokenizer& tok, const fs::path& out, SplitResult& result) {
    try {
      const bool uint32 = tok.vocab_size() > 65536;
      const std::string fp = tokenizer_fingerprint(tok);  // in every shard header
      ShardWriter train((out / "train").string(), "train", opt.shard_tokens, uint32, fp);
      ShardWriter val((out / "val").string(), "val", opt.shard_tokens, uint32, fp);
      for (int64_t next = 0;; ++next) {
        Tokenized t;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return aborted_ || done_.count(next) || (reading_done_ && next == blocks_); });
          if (aborted_) return;
          if (!done_.count(next)) break;
          t = std::move(done_[next]);
          done_.erase(next);
        }
        train.append(t.train);
        val.append(t.val);
        result.train_docs += t.train_docs;
        result.val_docs += t.val_docs;
        std::lock_guard<std::mutex> lock(mu_);
        tokens_written_ += static_cast<int64_t>(t.train.size() + t.val.size());
        --in_flight_;
        cv_.notify_all();
      }
      result.train_tokens = train.tokens();
      result.val_tokens = val.tokens();
      result.train_shards = train.finish();
      result.val_shards = val.finish();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // The reader (the calling thread): queues blocks of documents, then tells
  // the workers and the writer that no more come.
  void read(const PrepareOptions& opt, const detail::InputPlan& plan, Clock::time_point start) {
    try {
      DocumentStream stream(plan, opt);
      ProgressTicker ticker(opt, start);
      Block b;
      while (stream.next_block(b.docs, b.is_val)) {
        // A stop request fails the pipeline like any error: the staging folder
        // is removed and the output stays as it was.
        throw_if_stop_requested("prepare-data (tokenizing)");
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return aborted_ || in_flight_ < max_in_flight_; });
        if (aborted_) break;
        b.seq = blocks_++;
        ++in_flight_;
        queue_.push_back(std::move(b));
        cv_.notify_all();
        const int64_t tokens = tokens_written_;
        lock.unlock();
        ticker.tick(stream, tokens);
      }
      ticker.tick(stream, tokens_written_, true);
    } catch (...) {
      fail(std::current_exception());
    }
    std::lock_guard<std::mutex> lock(mu_);
    reading_done_ = true;
    cv_.notify_all();
  }

  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Block {
    int64_t seq;
    std::vector<std::string> docs;
    std::vector<char> is_val;
  };

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = e;
    aborted_ = true;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Block> queue_;
  std::map<int64_t, Tokenized> done_;
  int64_t in_flight_ = 0, blocks_ = 0, tokens_written_ = 0;
  bool reading_done_ = false, aborted_ = false;
  std::exception_ptr error_;
  const int64_t max_in_flight_;
};

SplitResult tokenize_and_write(const PrepareOptions& opt, const detail::InputPlan& plan, const Tokenizer& tok,
                               const fs::path& out, int workers, Clock::time_point start) {
  TokenizePipeline pipeline(workers);
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back([&] { pipeline.work(tok); });
  SplitResult result;
  std::thread writer([&] { pipeline.write(opt, tok, out, result); });
  pipeline.read(opt, plan, start);
  for (auto& t : pool) t.join();
  writer.join();
  pipeline.rethrow();
  return result;
}

}  // namespace

std::string to_string(const PrepareSummary& s) {
  std::ostringstream os;
  os << "prepare-data: " << s.files << " files (" << s.skipped.size() << " skipped), "
     << s.train_documents + s.val_documents << " documents (" << s.train_documents << " train, " << s.val_documents
     << " val), " << s.train_tokens << " train / " << s.val_tokens << " val tokens, vocab " << s.vocab_size << ", "
     << std::fixed << std::setprecision(1) << s.seconds << " s, "
     << static_cast<double>(s.input_bytes) / 1e6 / std::max(s.seconds, 1e-9) << " MB/s with " << s.workers
     << " workers -> " << s.output_dir;
  return os.str();
}

std::vector<std::string> skipped_summary(const PrepareSummary& s) {
  // Reasons in the order first seen; a duplicate's reason names its original,
  // which would make every duplicate a reason of its own.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& [file, reason] : s.skipped) {
    const std::string key =
        reason.rfind("duplicate of ", 0) == 0 ? "duplicate of another input (the same file, or a link to it)" : reason;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
    it->second.push_back(file);
  }
  const std::string manifest = (fs::path(s.output_dir) / "manifest.json").string();
  std::vector<std::string> lines;
  for (const auto& [reason, files] : groups)
    lines.push_back("prepare-data: skipped " + std::to_string(files.size()) + (files.size() == 1 ? " input" : " inputs") +
                    ": " + reason + " (e.g. " + fs::path(files.front()).filename().string() + "; all listed in " +
                    manifest + ", -v prints them)");
  return lines;
}

namespace {

// The options' values and combinations, before anything is read or written.
void check_prepare_options(const PrepareOptions& opt) {
  MT_CHECK(!opt.output_dir.empty(), "prepare-data: --output is required");
  MT_CHECK((opt.vocab_size > 0) != !opt.tokenizer_file.empty(),
           "prepare-data: give exactly one of --vocab-size (train a tokenizer) and --tokenizer (a vocabulary file)");
  // Training evaluates on the val split, so a dataset without one would fail
  // its first run: 0 is refused rather than silently raised to one document.
  MT_CHECK(opt.val_fraction > 0.0 && opt.val_fraction < 1.0, "prepare-data: --val-fraction must be in (0, 1), got ",
           opt.val_fraction, opt.val_fraction == 0.0 ? " (training evaluates on the validation documents; any "
           "fraction > 0 gives at least one)" : "");
  MT_CHECK(opt.shard_tokens > 0, "prepare-data: --shard-tokens must be positive, got ", opt.shard_tokens);
  MT_CHECK(opt.workers >= 0, "prepare-data: --workers must be >= 0 (0: all cores), got ", opt.workers);
  // Each worker is a thread holding documents in flight: thousands of them
  // (a typo) add memory and switching, never speed.
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  MT_CHECK(opt.workers <= kWorkersPerCore * cores, "prepare-data: --workers ", opt.workers, " is more than ",
           kWorkersPerCore, " per core of this machine's ", cores, " (", kWorkersPerCore * cores, "); threads beyond ",
           "the cores add memory and switching, not speed (0 uses every core)");
  MT_CHECK(opt.text_split == "paragraph" || opt.text_split == "line" || opt.text_split == "file",
           "prepare-data: --text-split must be paragraph, line or file, got \"", opt.text_split, "\"");
  MT_CHECK(!opt.text_key.empty(), "prepare-data: --text-key must not be empty");
}

// The manifest of a dataset: what went in, what was skipped, the tokenizer
// and the shards.
nlohmann::json dataset_manifest(const PrepareOptions& opt, const detail::InputPlan& plan, const Tokenizer& tok,
                                const SplitResult& r) {
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& s : plan.skipped) skipped.push_back({{"path", s.path}, {"reason", s.reason}});
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : plan.files) files.push_back({{"path", f.path}, {"format", detail::format_name(f.format)}});
  return {
      {"format", "meshtrain-data"},
      {"version", 2},
      {"tokenizer", "tokenizer.json"},
      {"tokenizer_fingerprint", tokenizer_fingerprint(tok)},
      {"vocab_size", tok.vocab_size()},
      {"eot", tok.eot()},
      {"shard_version", tok.vocab_size() > 65536 ? kShardVersionU32 : kShardVersionU16},
      {"seed", opt.seed},
      {"val_fraction", opt.val_fraction},
      {"inputs", opt.inputs},
      {"files", files},
      {"skipped", skipped},
      {"train", {{"documents", r.train_docs}, {"tokens", r.train_tokens}, {"shards", r.train_shards}}},
      {"val", {{"documents", r.val_docs}, {"tokens", r.val_tokens}, {"shards", r.val_shards}}},
  };
}

}  // namespace

PrepareSummary prepare_data(const PrepareOptions& opt) {
  const auto start = Clock::now();
  check_prepare_options(opt);
  fs::path out = fs::absolute(opt.output_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  detail::check_prepare_output(out, opt.inputs);
  std::vector<std::string> leftovers = detail::remove_prepare_leftovers(out);

  const detail::InputPlan plan = detail::plan_inputs(opt.inputs);
  if (plan.files.empty()) {
    std::string why;
    for (const auto& s : plan.skipped) why += "\n  " + s.path + ": " + s.reason;
    MT_FAIL("prepare-data: no usable input files", why.empty() ? " (the inputs are empty folders)" : ":" + why);
  }
  const Tokenizer tok = make_tokenizer(opt, plan);
  const int workers = opt.workers > 0 ? opt.workers : std::max(1u, std::thread::hardware_concurrency());

  fs::path tmp = out.parent_path() / (out.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  SplitResult r;
  try {
    fs::create_directories(tmp);
    tok.save((tmp / "tokenizer.json").string());
    r = tokenize_and_write(opt, plan, tok, tmp, workers, start);
    MT_CHECK(r.train_docs + r.val_docs >= 2, "prepare-data: the inputs hold ", r.train_docs + r.val_docs,
             " documents; need at least 2 (one for train, one for val). A single text file is split at blank "
             "lines (--text-split paragraph) or lines (--text-split line)");
    const nlohmann::json manifest = dataset_manifest(opt, plan, tok, r);
    {
      std::ofstream m(tmp / "manifest.json");
      MT_CHECK(m, "cannot write ", (tmp / "manifest.json").string());
      m << manifest.dump(2) << '\n';
      MT_CHECK(m.good(), "error writing ", (tmp / "manifest.json").string());
    }
    throw_if_stop_requested("prepare-data");  // last chance before the output is replaced
    fs::remove_all(out);
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  PrepareSummary summary;
  summary.files = static_cast<int64_t>(plan.files.size());
  for (const auto& s : plan.skipped) summary.skipped.emplace_back(s.path, s.reason);
  summary.train_documents = r.train_docs;
  summary.val_documents = r.val_docs;
  summary.train_tokens = r.train_tokens;
  summary.val_tokens = r.val_tokens;
  for (const auto& f : plan.files) summary.input_bytes += f.bytes;
  summary.vocab_size = tok.vocab_size();
  summary.workers = workers;
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  summary.output_dir = out.string();
  summary.removed_leftovers = std::move(leftovers);
  return summary;
}

}  // namespace meshtrain
