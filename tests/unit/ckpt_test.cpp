// ckpt/: safetensors I/O, sharded save with manifest and checksums, reshard on
// read, keep-last-k, recovery from corrupt/partial checkpoints, export.
// Several "ranks" are played in one process through the save steps of
// checkpoint_steps.h; save_checkpoint itself runs on a world of one.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/core/check.h"
#include "local_communicator.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class CkptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("mt_ckpt_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& rel) const { return (dir_ / rel).string(); }

  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

void flip_byte(const std::string& file, int64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c;
  f.get(c);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x5A));
}

// ---- crc32c ----------------------------------------------------------------

TEST(Crc32c, KnownVectorAndIncremental) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c_update(0, s.data(), s.size()), 0xE3069283u);  // the standard check value
  std::string big(100003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + 7);
  const uint32_t whole = crc32c_update(0, big.data(), big.size());
  uint32_t parts = crc32c_update(0, big.data(), 13);
  parts = crc32c_update(parts, big.data() + 13, big.size() - 13);
  EXPECT_EQ(whole, parts);
  EXPECT_EQ(crc32c_string(0xE3069283u), "crc32c:e3069283");
}

// ---- safetensors -----------------------------------------------------------

TEST_F(CkptTest, SafetensorsRoundTrip) {
  torch::manual_seed(0);
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"a.f32", torch::randn({2, 3})},
      {"b.bf16", torch::randn({5}).to(at::kBFloat16)},
      {"c.i64", torch::arange(12, at::kLong).reshape({3, 1, 4})},
      {"d.f16", torch::randn({1, 2}).to(at::kHalf)},
      {"e.u8", torch::arange(7, at::kByte)},
      {"f.scalar", torch::tensor(3.5)},
      {"g.empty", torch::zeros({0, 3})},
      {"h.transposed", torch::arange(6, at::kFloat).reshape({2, 3}).t()},  // non-contiguous
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"who", "ckpt_test"}};
  const auto digest = write_safetensors(path("t.safetensors"), tensors, meta);
  EXPECT_EQ(digest.bytes, static_cast<int64_t>(fs::file_size(path("t.safetensors"))));
  EXPECT_EQ(digest.crc32c, crc32c_file(path("t.safetensors")));

  const auto f = read_safetensors(path("t.safetensors"));
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors) names.push_back(n);
  EXPECT_EQ(f.names(), names);
  EXPECT_EQ(f.metadata(), meta);
  for (const auto& [n, t] : tensors) {
    EXPECT_EQ(f.dtype(n), t.scalar_type()) << n;
    EXPECT_EQ(f.shape(n), t.sizes().vec()) << n;
    EXPECT_TRUE(same(f.get(n), t)) << n;
  }
  EXPECT_NE(error_of([&] { f.get("nope"); }).find("nope"), std::string::npos);
}

TEST_F(CkptTest, SafetensorsByteLayout) {
  const auto t = torch::tensor({1.0f, 2.0f, -3.0f});
  write_safetensors(path("x.safetensors"), {{"w", t}}, {{"k", "v"}});
  std::ifstream in(path("x.safetensors"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);  // data starts 8-byte aligned
  ASSERT_EQ(bytes.size(), 8 + n + 12);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));  // trailing spaces are valid JSON whitespace
  EXPECT_EQ(header["w"]["dtype"], "F32");
  EXPECT_EQ(header["w"]["shape"], nlohmann::json({3}));
  EXPECT_EQ(header["w"]["data_offsets"], nlohmann::json({0, 12}));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  float data[3];
  std::memcpy(data, bytes.data() + 8 + n, 12);
  EXPECT_EQ(data[2], -3.0f);  // raw little-endian floats
}

TEST_F(CkptTest, SafetensorsRejectsDamage) {
  write_safetensors(path("ok.safetensors"), {{"w", torch::ones({64})}});
  const auto size = fs::file_size(path("ok.safetensors"));

  fs::copy_file(path("ok.safetensors"), path("trunc.safetensors"));
  fs::resize_file(path("trunc.safetensors"), size - 10);
  auto err = error_of([&] { read_safetensors(path("trunc.safetensors")); });
  EXPECT_NE(err.find("trunc.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  fs::copy_file(path("ok.safetensors"), path("tiny.safetensors"));
  fs::resize_file(path("tiny.safetensors"), 5);
  err = error_of([&] { read_safetensors(path("tiny.safetensors")); });
  EXPECT_NE(err.find("tiny.safetensors"), std::string::npos) << err;

  fs::copy_file(path("ok.safetensors"), path("badjson.safetensors"));
  flip_byte(path("badjson.safetensors"), 8);  // the header's opening '{'
  err = error_of([&] { read_safetensors(path("badjson.safetensors")); });
  EXPECT_NE(err.find("badjson.safetensors"), std::string::npos) << err;

  fs::copy_file(path("ok.safetensors"), path("badlen.safetensors"));
  flip_byte(path("badlen.safetensors"), 6);  // header length becomes huge
  err = error_of([&] { read_safetensors(path("badlen.safetensors")); });
  EXPECT_NE(err.find("badlen.safetensors"), std::string::npos) << err;

  err = error_of([&] { read_safetensors(path("absent.safetensors")); });
  EXPECT_NE(err.find("absent.safetensors"), std::string::npos) << err;
}

// ---- sharded checkpoints ---------------------------------------------------

struct Global {
  std::string name;
  at::Tensor value;
  int64_t split_dim;
};

std::vector<Global> globals() {
  torch::manual_seed(1);
  return {
      {"model.a", torch::randn({8, 6}), 0},                          // split rows
      {"model.b", torch::randn({4, 8}).to(at::kBFloat16), 1},       // split columns
      {"model.c", torch::randn({5}), -1},                            // replicated
      {"optim.d", torch::arange(24, at::kLong).reshape({6, 4}), 0},  // integer state
  };
}

// The tensors `rank` of `num_ranks` holds, each tensor split num_ranks ways;
// replicated tensors are written by rank 0 only.
std::vector<NamedTensor> local_shards(const std::vector<Global>& gs, int rank, int num_ranks) {
  std::vector<NamedTensor> out;
  for (const auto& g : gs) {
    ShardSpec spec{g.value.sizes().vec(), g.split_dim, 0, 1};
    at::Tensor t = g.value;
    if (g.split_dim >= 0) {
      spec.shard = rank;
      spec.num_shards = num_ranks;
      t = g.value.chunk(num_ranks, g.split_dim)[rank];
    }
    out.push_back({g.name, t, spec, g.split_dim >= 0 || rank == 0});
  }
  return out;
}

// Plays a save by num_ranks ranks with the steps save_checkpoint runs.
std::string save_as_ranks(const std::string& run_dir, int64_t step, const std::vector<Global>& gs, int num_ranks,
                          const nlohmann::json& state, int64_t max_to_keep = 0) {
  const std::string staging = make_staging_dir(run_dir, step, "test");
  std::vector<RankShards> ranks;
  for (int r = 0; r < num_ranks; ++r) {
    ranks.push_back(write_rank_shards(staging, r, local_shards(gs, r, num_ranks)));
    ranks.back() = rank_shards_from_json(to_json(ranks.back()));  // as it travels between ranks
  }
  return commit_checkpoint(run_dir, staging, step, build_manifest(step, num_ranks, ranks), state, max_to_keep);
}

TEST_F(CkptTest, TwoRankSaveReshardsOnRead) {
  const auto gs = globals();
  const nlohmann::json state = {{"step", 7}, {"cursor", {{"shard", 2}, {"pos", 123}}}, {"rng", {1, 2, 3}}};
  const auto dir = save_as_ranks(path("run"), 7, gs, 2, state);
  EXPECT_EQ(fs::path(dir).filename(), "step_00000007");
  EXPECT_TRUE(fs::exists(fs::path(dir) / "rank_00000.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "rank_00001.safetensors"));

  const CheckpointReader r(dir);
  r.verify();
  EXPECT_EQ(r.step(), 7);
  EXPECT_EQ(r.world_size(), 2);
  EXPECT_EQ(r.trainer_state(), state);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"model.a", "model.b", "model.c", "optim.d"}));
  const auto& m = r.manifest()["tensors"];
  EXPECT_EQ(m["model.b"]["split_dim"], 1);
  EXPECT_EQ(m["model.b"]["num_shards"], 2);
  EXPECT_EQ(m["model.b"]["dtype"], "BF16");
  EXPECT_EQ(m["model.c"]["num_shards"], 1);

  for (const auto& g : gs) {
    EXPECT_TRUE(r.has(g.name));
    EXPECT_EQ(r.global_shape(g.name), g.value.sizes().vec());
    EXPECT_TRUE(same(r.read(g.name), g.value)) << g.name;
    for (int64_t dim = -1; dim < g.value.dim(); ++dim)
      for (int64_t n : {1, 2, 4}) {
        if (dim == -1 && n > 1) continue;
        if (dim >= 0 && g.value.size(dim) % n) continue;
        for (int64_t i = 0; i < n; ++i) {
          const at::Tensor want = dim < 0 ? g.value : g.value.chunk(n, dim)[i];
          EXPECT_TRUE(same(r.read(g.name, {g.value.sizes().vec(), dim, i, n}), want))
              << g.name << " dim " << dim << " shard " << i << "/" << n;
        }
      }
  }
}

// Expert parallelism's two splits: experts (dim 0) over ep = 2 and hidden
// units (dim 1) over tp = 2, four ranks; read back whole, by one split or
// the other, and by the two splits of another mesh.
TEST_F(CkptTest, TwoLevelSplitReshardsOnRead) {
  torch::manual_seed(3);
  const at::Tensor w = torch::randn({4, 6, 3});  // [experts, hidden, d]
  const std::string staging = make_staging_dir(path("run"), 2, "test");
  std::vector<RankShards> ranks;
  for (int r = 0; r < 4; ++r) {
    const int tp = r % 2, ep = r / 2;
    ShardSpec spec{w.sizes().vec(), 1, tp, 2};
    spec.outer_dim = 0;
    spec.outer_shard = ep;
    spec.outer_shards = 2;
    EXPECT_EQ(shard_shape(spec), (std::vector<int64_t>{2, 3, 3}));
    const at::Tensor mine = w.chunk(2, 0)[ep].chunk(2, 1)[tp].contiguous();
    ranks.push_back(write_rank_shards(staging, r, {{"model.layers.0.moe.experts.w_in", mine, spec, true}}));
    ranks.back() = rank_shards_from_json(to_json(ranks.back()));
  }
  const auto dir = commit_checkpoint(path("run"), staging, 2, build_manifest(2, 4, ranks), nlohmann::json::object(), 0);
  const CheckpointReader r(dir);
  r.verify();
  const auto& m = r.manifest()["tensors"]["model.layers.0.moe.experts.w_in"];
  EXPECT_EQ(m["outer_dim"], 0);
  EXPECT_EQ(m["outer_shards"], 2);
  EXPECT_EQ(m["shards"].size(), 4u);
  EXPECT_TRUE(same(r.read("model.layers.0.moe.experts.w_in"), w));
  for (int64_t n : {1, 2, 4}) {
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_TRUE(same(r.read("model.layers.0.moe.experts.w_in", {w.sizes().vec(), 0, i, n}), w.chunk(n, 0)[i])) << i << "/" << n;
      // ep = n on dim 0 with tp = 3 on dim 1.
      for (int64_t t = 0; t < 3; ++t) {
        ShardSpec want{w.sizes().vec(), 1, t, 3};
        want.outer_dim = 0;
        want.outer_shard = i;
        want.outer_shards = n;
        EXPECT_TRUE(same(r.read("model.layers.0.moe.experts.w_in", want), w.chunk(n, 0)[i].chunk(3, 1)[t]))
            << "ep " << i << "/" << n << " tp " << t << "/3";
      }
    }
  }
  const std::string text = inspect_checkpoint(dir);
  EXPECT_NE(text.find("model.layers.0.moe.experts.w_in  [4, 6, 3]  F32  experts (dim 0) in 2, split dim 1 in 2"), std::string::npos)
      << text;
  // An outer split on the split dim itself is refused.
  ShardSpec bad{w.sizes().vec(), 1, 0, 2};
  bad.outer_dim = 1;
  bad.outer_shards = 2;
  EXPECT_THROW(shard_shape(bad), Error);
}

TEST_F(CkptTest, ReadErrorsNameTensorAndShapes) {
  const auto dir = save_as_ranks(path("run"), 1, globals(), 2, nlohmann::json::object());
  const CheckpointReader r(dir);
  auto err = error_of([&] { r.read("model.missing", {{2}}); });
  EXPECT_NE(err.find("model.missing"), std::string::npos) << err;
  EXPECT_NE(err.find("step_00000001"), std::string::npos) << err;
  err = error_of([&] { r.read("model.a", {{8, 7}, 0, 0, 2}); });
  EXPECT_NE(err.find("model.a"), std::string::npos) << err;
  EXPECT_NE(err.find("[8, 7]"), std::string::npos) << err;
  EXPECT_NE(err.find("[8, 6]"), std::string::npos) << err;
  err = error_of([&] { r.read("model.a", {{8, 6}, 1, 0, 4}); });  // 6 columns don't split 4 ways
  EXPECT_NE(err.find("model.a"), std::string::npos) << err;
}

TEST_F(CkptTest, ManifestRejectsInconsistentRanks) {
  const auto gs = globals();
  const std::string staging = make_staging_dir(path("run"), 3, "x");
  const auto r0 = write_rank_shards(staging, 0, local_shards(gs, 0, 2));
  auto err = error_of([&] { build_manifest(3, 1, {r0}); });  // shard 1 of the split tensors is missing
  EXPECT_NE(err.find("no rank wrote shard 1"), std::string::npos) << err;
  err = error_of([&] { build_manifest(3, 2, {r0, r0}); });
  EXPECT_NE(err.find("written by both"), std::string::npos) << err;

  auto bad = local_shards(gs, 1, 2);
  bad[0].tensor = torch::zeros({3, 6});  // not a half of 8 rows
  err = error_of([&] { write_rank_shards(staging, 1, bad); });
  EXPECT_NE(err.find("model.a"), std::string::npos) << err;

  RankShards failed;
  failed.rank = 1;
  failed.error = "disk full";
  err = error_of([&] { build_manifest(3, 2, {r0, failed}); });
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
  EXPECT_NE(err.find("disk full"), std::string::npos) << err;
}

std::vector<NamedTensor> world_of_one(float value) {
  return {{"model.w", torch::full({4, 2}, value), {{4, 2}, 0, 0, 1}},
          {"model.bias", torch::full({2}, value), {{2}}}};
}

TEST_F(CkptTest, SaveKeepsLastKAndPointsLatest) {
  LocalCommunicator world;
  const std::string run = path("run");
  for (int64_t step : {10, 20, 30, 40}) save_checkpoint(run, step, world_of_one(step), {{"step", step}}, world, 2);

  const fs::path root = fs::path(run) / "checkpoints";
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"latest", "step_00000030", "step_00000040"}));
  std::ifstream latest(root / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000040");

  const auto found = find_latest_checkpoint(run);
  ASSERT_TRUE(found);
  EXPECT_EQ(fs::path(*found).filename(), "step_00000040");
  const CheckpointReader r(*found);
  EXPECT_EQ(r.trainer_state()["step"], 40);
  EXPECT_TRUE(same(r.read("model.w"), torch::full({4, 2}, 40.0f)));
  EXPECT_FALSE(find_latest_checkpoint(path("nothing_here")));
}

TEST_F(CkptTest, ResaveOfSameStepReplacesIt) {
  LocalCommunicator world;
  const std::string run = path("run");
  save_checkpoint(run, 5, world_of_one(1), {{"v", 1}}, world, 3);
  save_checkpoint(run, 5, world_of_one(2), {{"v", 2}}, world, 3);
  const CheckpointReader r(*find_latest_checkpoint(run));
  EXPECT_EQ(r.trainer_state()["v"], 2);
  EXPECT_TRUE(same(r.read("model.bias"), torch::full({2}, 2.0f)));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(fs::path(run) / "checkpoints")) ++entries, (void)e;
  EXPECT_EQ(entries, 2);  // step_00000005 and latest, nothing left aside
}

TEST_F(CkptTest, FailedSaveLeavesPreviousCheckpoint) {
  LocalCommunicator world;
  const std::string run = path("run");
  save_checkpoint(run, 1, world_of_one(1), {{"v", 1}}, world, 3);
  auto bad = world_of_one(2);
  bad[0].tensor = torch::zeros({3, 2});
  const auto err = error_of([&] { save_checkpoint(run, 2, bad, {{"v", 2}}, world, 3); });
  EXPECT_NE(err.find("model.w"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(fs::path(run) / "checkpoints" / "step_00000002"));
  for (const auto& e : fs::directory_iterator(fs::path(run) / "checkpoints"))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000001");
}

TEST_F(CkptTest, CorruptTruncatedOrMissingShardFallsBack) {
  const auto gs = globals();
  const std::string run = path("run");
  save_as_ranks(run, 100, gs, 2, {{"step", 100}});
  const auto newest = save_as_ranks(run, 200, gs, 2, {{"step", 200}});
  const std::string shard = (fs::path(newest) / "rank_00001.safetensors").string();
  const std::string backup = path("rank_00001.backup");
  fs::copy_file(shard, backup);

  // A flipped byte in the tensor data: headers still parse, the checksum doesn't match.
  flip_byte(shard, static_cast<int64_t>(fs::file_size(shard)) - 3);
  const auto err = error_of([&] { CheckpointReader(newest).verify(); });
  EXPECT_NE(err.find("rank_00001.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000100");

  fs::copy_file(backup, shard, fs::copy_options::overwrite_existing);
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000200");

  fs::resize_file(shard, fs::file_size(shard) / 2);
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000100");

  fs::remove(shard);
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000100");

  fs::copy_file(backup, shard);
  fs::remove(fs::path(newest) / "manifest.json");
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000100");
}

TEST_F(CkptTest, LeftoverStagingDirsAreIgnoredThenRemoved) {
  const auto gs = globals();
  const std::string run = path("run");
  save_as_ranks(run, 100, gs, 2, {{"step", 100}});
  const fs::path root = fs::path(run) / "checkpoints";
  // A crash mid-save leaves a staging dir, possibly of a newer step, with or without a manifest.
  fs::create_directories(root / "step_00000300.tmp-4242");
  std::ofstream(root / "step_00000300.tmp-4242" / "rank_00000.safetensors") << "partial";
  fs::copy(root / "step_00000100", root / "step_00000400.tmp-77");
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000100");

  // Without `latest`, the directory scan still skips staging dirs.
  fs::remove(root / "latest");
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000100");

  save_as_ranks(run, 110, gs, 2, {{"step", 110}});
  EXPECT_FALSE(fs::exists(root / "step_00000300.tmp-4242"));
  EXPECT_FALSE(fs::exists(root / "step_00000400.tmp-77"));
  EXPECT_EQ(fs::path(*find_latest_checkpoint(run)).filename(), "step_00000110");
}

TEST_F(CkptTest, ExportWritesOneUnshardedFile) {
  const auto gs = globals();
  const auto dir = save_as_ranks(path("run"), 9, gs, 2, {{"step", 9}});
  export_checkpoint(dir, path("all.safetensors"));
  const auto f = read_safetensors(path("all.safetensors"));
  EXPECT_EQ(f.names().size(), gs.size());
  for (const auto& g : gs) EXPECT_TRUE(same(f.get(g.name), g.value)) << g.name;
  EXPECT_EQ(f.metadata().at("format"), "pt");

  export_checkpoint(dir, path("model.safetensors"), "model.");
  const auto m = read_safetensors(path("model.safetensors"));
  EXPECT_EQ(m.names(), (std::vector<std::string>{"model.a", "model.b", "model.c"}));
  EXPECT_NE(error_of([&] { export_checkpoint(dir, path("none.safetensors"), "zzz."); }).find("zzz."),
            std::string::npos);
}

// Python's safetensors is the reference reader; it is optional in CI.
TEST_F(CkptTest, ExportLoadsInPythonSafetensors) {
  const std::string python = std::string(MT_SOURCE_DIR) + "/.deps/venv/bin/python";
  if (!fs::exists(python) ||
      std::system((python + " -c 'import safetensors' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "python safetensors not installed in .deps/venv (pip install safetensors to run this)";
  const auto gs = globals();
  const auto dir = save_as_ranks(path("run"), 9, gs, 2, {{"step", 9}});
  export_checkpoint(dir, path("all.safetensors"));
  // safetensors.deserialize is the library's own (Rust) parser and validator,
  // and needs no tensor framework: the venv's torch is only there for libtorch.
  const std::string script = path("check.py");
  std::ofstream(script) << "import array, json, sys, safetensors\n"
                           "def values(dtype, data):\n"
                           "    if dtype == 'BF16':  # widen to float32 by appending 16 zero bits\n"
                           "        b = bytearray()\n"
                           "        for i in range(0, len(data), 2): b += b'\\0\\0' + data[i:i + 2]\n"
                           "        return array.array('f', bytes(b))\n"
                           "    return array.array({'F32': 'f', 'I64': 'q'}[dtype], data)\n"
                           "out = {}\n"
                           "for name, t in safetensors.deserialize(open(sys.argv[1], 'rb').read()):\n"
                           "    out[name] = {'dtype': t['dtype'], 'shape': t['shape'],\n"
                           "                 'sum': float(sum(values(t['dtype'], bytes(t['data']))))}\n"
                           "print(json.dumps(out))\n";
  const std::string out = path("py.json");
  ASSERT_EQ(std::system((python + " " + script + " " + path("all.safetensors") + " > " + out).c_str()), 0);
  std::ifstream in(out);
  const auto seen = nlohmann::json::parse(in);
  ASSERT_EQ(seen.size(), gs.size()) << seen;
  for (const auto& g : gs) {
    const auto& t = seen.at(g.name);
    EXPECT_EQ(t["dtype"], safetensors_dtype_name(g.value.scalar_type())) << g.name;
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), g.value.sizes().vec()) << g.name;
    const double sum = g.value.to(at::kDouble).sum().item<double>();
    EXPECT_NEAR(t["sum"].get<double>(), sum, 1e-9 * (1 + std::abs(sum))) << g.name;
  }

  // And the other way: a file Python writes reads here.
  const std::string writer = path("write.py");
  std::ofstream(writer) << "import ctypes, struct, sys, safetensors\n"
                           "raw = {'x': ('float32', 'F32', [2], struct.pack('<2f', 1.5, -2.0)),\n"
                           "       'y': ('int64', 'I64', [1, 1], struct.pack('<q', 7))}\n"
                           "if hasattr(safetensors, 'TensorSpec'):  # 0.8+: raw pointers\n"
                           "    keep = {k: ctypes.create_string_buffer(v[3], len(v[3])) for k, v in raw.items()}\n"
                           "    specs = {k: safetensors.TensorSpec(dtype=v[0], shape=v[2], data_ptr=ctypes.addressof(keep[k]),\n"
                           "                                       data_len=len(v[3])) for k, v in raw.items()}\n"
                           "else:\n"
                           "    specs = {k: {'dtype': v[1], 'shape': v[2], 'data': v[3]} for k, v in raw.items()}\n"
                           "open(sys.argv[1], 'wb').write(safetensors.serialize(specs, metadata={'m': 'v'}))\n";
  ASSERT_EQ(std::system((python + " " + writer + " " + path("py.safetensors")).c_str()), 0);
  const auto f = read_safetensors(path("py.safetensors"));
  EXPECT_TRUE(same(f.get("x"), torch::tensor({1.5f, -2.0f})));
  EXPECT_TRUE(same(f.get("y"), torch::full({1, 1}, 7, at::kLong)));
  EXPECT_EQ(f.metadata().at("m"), "v");
}

TEST_F(CkptTest, InspectListsTensorsAndState) {
  const auto dir = save_as_ranks(path("run"), 12, globals(), 2,
                                 {{"step", 12}, {"config", {{"a", 1}, {"b", 2}}}, {"rng", {1, 2, 3, 4}}});
  const std::string text = inspect_checkpoint(dir);
  for (const char* want : {"step 12", "2 ranks", "model.a", "[8, 6]", "F32", "split dim 0 in 2", "model.b", "BF16",
                           "split dim 1 in 2", "model.c", "replicated", "optim.d", "I64", "config: {2 keys}",
                           "rng: [4 items]", "step: 12"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " not in:\n" << text;
}

}  // namespace
}  // namespace meshtrain
