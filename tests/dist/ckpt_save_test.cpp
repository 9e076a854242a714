// Checkpoint saves bring to the host only what each rank writes, and gather
// sharded state (ZeRO-1's and FSDP's moments, zero_stage 3's parameters) to
// the writers alone: the files are byte for byte those zero_stage 0 writes on
// the same mesh (every writer saving the tensors it holds, as saves always
// did), no rank all-gathers anything to save, and ranks that write nothing
// hold no bytes for it. Prints the bytes moved per save, then and now.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/parallel/checkpoint_writer.h"
#include "meshtrain/parallel/fsdp.h"
#include "ckpt_cases.h"

using namespace meshtrain;

namespace {

namespace fs = std::filesystem;

const std::string kData = test::scratch_dir("ckpt-save-data");

using test::SaveCase;

Config config(const SaveCase& k, int stage, const std::string& what) {
  Config c = test::save_case_config(k, stage, kData, "save-" + what);
  c.training_steps = 3;
  c.checkpoint_steps = 3;
  return c;
}


// The tensor files and the manifest (shapes, splits, writers, sizes, CRCs):
// everything of a checkpoint but trainer_state.json, which names the config
// (and so differs, with its size and CRC in the manifest).
std::set<std::string> tensor_files(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name == "manifest.json" || e.path().extension() == ".safetensors") out.insert(name);
  }
  return out;
}

void expect_same_files(const fs::path& ref, const fs::path& got) {
  const auto names = tensor_files(ref);
  ASSERT_GT(names.size(), 1u) << ref;
  ASSERT_EQ(names, tensor_files(got)) << ref << " vs " << got;
  for (const auto& name : names) {
    if (name != "manifest.json") {
      EXPECT_TRUE(test::file_contents(ref / name) == test::file_contents(got / name))
          << name << " differs: " << ref << " vs " << got;
      continue;
    }
    auto a = nlohmann::json::parse(test::file_contents(ref / name));
    auto b = nlohmann::json::parse(test::file_contents(got / name));
    ASSERT_TRUE(a.at("files").contains("trainer_state.json")) << ref;
    a["files"].erase("trainer_state.json");
    b["files"].erase("trainer_state.json");
    EXPECT_EQ(a, b) << "manifests differ beyond trainer_state.json: " << ref << " vs " << got;
  }
}

int64_t op_bytes(const Communicator& c, const char* op) {
  const auto it = c.bytes_by_op().find(op);
  return it == c.bytes_by_op().end() ? 0 : it->second;
}

std::vector<Communicator*> axes(Mesh& m) { return {&m.dp(), &m.expert_dp(), &m.tp(), &m.pp()}; }

}  // namespace

// zero_stage 0, 1 and 3 load one checkpoint and save it again: the files
// must not depend on how the state was sharded, nor may saving all-gather it.
TEST(CkptSave, FilesMatchZeroStage0WithoutAllGather) {
  const auto all = test::save_cases(test_runtime().size());
  if (all.empty()) GTEST_SKIP() << "runs at np 2 and 4";
  for (const SaveCase& k : all) {
    SCOPED_TRACE(k.str());
    const Config ref = config(k, 0, "ref");
    {
      SessionOptions o;
      o.fresh = true;
      o.quiet = true;
      Trainer t(ref, test_runtime(), o);
      t.train();  // saves step 3
    }
    const fs::path ref_dir = fs::path(ref.run_dir()) / "checkpoints" / checkpoint_dir_name(3);
    for (int stage : {0, 1, 3}) {
      SCOPED_TRACE("zero_stage " + std::to_string(stage));
      const Config c = config(k, stage, "again");
      SessionOptions o;
      o.checkpoint = ref_dir.string();
      o.quiet = true;
      Trainer t(c, test_runtime(), o);
      ASSERT_EQ(t.step(), 3);
      for (Communicator* a : axes(t.mesh())) a->reset_bytes();
      t.save_checkpoint();
      for (Communicator* a : axes(t.mesh())) EXPECT_EQ(op_bytes(*a, "all_gather"), 0) << "saving all-gathered";
      if (stage > 0 && k.dp > 1) EXPECT_GT(op_bytes(t.mesh().dp(), "gather"), 0) << "the dp shards were not gathered";
      test_runtime().world()->barrier();
      if (test_runtime().rank() == 0)
        expect_same_files(ref_dir, fs::path(c.run_dir()) / "checkpoints" / checkpoint_dir_name(3));
    }
  }
}

// What one save moves, per rank: ranks that write nothing hold nothing on the
// host and receive nothing; the writer gets only what it writes, in chunks
// (a 4 KiB chunk gives the same tensors as the default 64 MiB); no rank
// all-gathers the moments (the former path: every rank received both whole
// fp32 moments, 2 * 4 * padded bytes, on its device).
TEST(CkptSave, OnlyWritersHoldWhatTheyWrite) {
  const auto all = test::save_cases(test_runtime().size());
  if (all.empty()) GTEST_SKIP() << "runs at np 2 and 4";
  for (const SaveCase& k : all) {
    for (int stage : {1, 3}) {
      SCOPED_TRACE(k.str() + " zero_stage " + std::to_string(stage));
      Config c = config(k, stage, "bytes");
      c.checkpoint_steps = 1000;
      SessionOptions o;
      o.fresh = true;
      o.quiet = true;
      Trainer t(c, test_runtime(), o);
      t.train();
      Mesh& mesh = t.mesh();
      ParallelModel& pm = t.model();
      DataParallel& opt = t.data_parallel();

      int64_t written_params = 0, written_moments = 0;
      for (const ParamInfo& p : pm.params)
        if (writes_checkpoint(p.layout, mesh)) {
          written_params += p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
          written_moments += 2 * p.tensor.numel() * 4;
        }
      const bool writes_any = written_moments > 0;
      if (mesh.coord().dp >= k.ep) EXPECT_FALSE(writes_any) << "dp rank " << mesh.coord().dp << " writes";

      for (Communicator* a : axes(mesh)) a->reset_bytes();
      HostCopies host;
      const auto [m, v] = opt.moments_to_save(host);
      host.wait();
      int64_t gathered = 0, all_gathered = 0;
      // expert_dp is dp itself when ep is 1: count each communicator once.
      const std::set<Communicator*> groups{&mesh.dp(), &mesh.expert_dp()};
      for (Communicator* g : groups) {
        gathered += op_bytes(*g, "gather");
        all_gathered += op_bytes(*g, "all_gather");
      }
      EXPECT_EQ(all_gathered, 0);
      EXPECT_EQ(host.host_bytes(), written_moments) << "host bytes of the moments";
      EXPECT_EQ(host.copied_bytes(), pm.params.front().tensor.is_cuda() ? written_moments : 0);
      // The former path all-gathered both moments of every flat space onto
      // every rank: 2 * 4 * padded bytes per space (exactly state_numel * 4 *
      // dp without expert parallelism; at least that over expert_dp with it),
      // and held every parameter's whole moments on the host.
      const int64_t before = opt.state_numel() * 4 * (k.dp / k.ep);
      int64_t numel = 0;
      for (const ParamInfo& p : pm.params) numel += p.tensor.numel();
      if (k.ep == 1) EXPECT_LE(gathered, before);
      if (!writes_any) EXPECT_LE(gathered, opt.state_numel() * 4) << "a non-writer sends its slices only";
      std::printf("np %d %s zero_stage %d rank %d (dp %d tp %d pp %d): moments per save: before: all_gather %s%lld B "
                  "received, host %lld B; now: gather %lld B, host %lld B (copied from device %lld B)\n",
                  test_runtime().size(), k.str().c_str(), stage, test_runtime().rank(), mesh.coord().dp,
                  mesh.coord().tp, mesh.coord().pp, k.ep > 1 ? ">= " : "", static_cast<long long>(before),
                  static_cast<long long>(2 * 4 * numel), static_cast<long long>(gathered),
                  static_cast<long long>(host.host_bytes()), static_cast<long long>(host.copied_bytes()));

      HostCopies small(4096);
      const auto [m4, v4] = opt.moments_to_save(small);
      small.wait();
      EXPECT_EQ(small.host_bytes(), host.host_bytes());
      for (size_t i = 0; i < pm.params.size(); ++i) {
        ASSERT_EQ(m4[i].defined(), m[i].defined()) << pm.params[i].layout.global_name;
        ASSERT_EQ(m[i].defined(), writes_checkpoint(pm.params[i].layout, mesh)) << pm.params[i].layout.global_name;
        if (!m[i].defined()) continue;
        EXPECT_TRUE(at::equal(m4[i], m[i])) << "exp_avg of " << pm.params[i].layout.global_name << " chunked";
        EXPECT_TRUE(at::equal(v4[i], v[i])) << "exp_avg_sq of " << pm.params[i].layout.global_name << " chunked";
      }

      // Parameters: under zero_stage 3 gathered from the shards, chunk by
      // chunk, equal to the whole parameters an all-gather makes.
      for (Communicator* a : axes(mesh)) a->reset_bytes();
      HostCopies hp(4096);
      const std::vector<at::Tensor> saved = params_to_save(pm, mesh, hp);
      hp.wait();
      for (Communicator* a : axes(mesh)) EXPECT_EQ(op_bytes(*a, "all_gather"), 0);
      EXPECT_EQ(hp.host_bytes(), written_params) << "host bytes of the parameters";
      gather_params(pm);  // the reference: every rank whole
      for (size_t i = 0; i < pm.params.size(); ++i) {
        ASSERT_EQ(saved[i].defined(), writes_checkpoint(pm.params[i].layout, mesh)) << pm.params[i].layout.global_name;
        if (saved[i].defined())
          EXPECT_TRUE(at::equal(saved[i], pm.params[i].tensor.detach().cpu())) << pm.params[i].layout.global_name;
      }
      release_params(pm, /*written=*/false);
    }
  }
}
