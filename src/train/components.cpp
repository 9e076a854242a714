#include "meshtrain/train/components.h"

#include <torch/torch.h>

#include <cstring>

#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/core/text.h"
#include "meshtrain/parallel/checkpoint_writer.h"
#include "meshtrain/parallel/fsdp.h"

namespace meshtrain {

namespace {

ShardSpec spec_of(const ParamLayout& l, Mesh& mesh) {
  ShardSpec s;
  s.global_shape = l.global_shape;
  s.split_dim = l.split_dim;
  if (l.split_dim >= 0) {
    s.shard = mesh.coord().tp;
    s.num_shards = mesh.shape().tp;
  }
  // Routed experts under expert parallelism: dim 0 is also split over ep.
  if (l.expert_split && mesh.shape().ep > 1) {
    s.outer_dim = 0;
    s.outer_shard = mesh.ep_rank();
    s.outer_shards = mesh.shape().ep;
  }
  return s;
}

// "dim 1 is 512 in the checkpoint but this model needs 256 ([64, 512] vs [64, 256])".
std::string shape_difference(const std::vector<int64_t>& saved, const std::vector<int64_t>& want) {
  if (saved.size() != want.size())
    return "the checkpoint has " + std::to_string(saved.size()) + " dims " + shape_str(saved) + ", this model needs " +
           std::to_string(want.size()) + " " + shape_str(want);
  for (size_t d = 0; d < saved.size(); ++d)
    if (saved[d] != want[d])
      return "dim " + std::to_string(d) + " is " + std::to_string(saved[d]) + " in the checkpoint but this model " +
             "needs " + std::to_string(want[d]) + " (" + shape_str(saved) + " vs " + shape_str(want) + ")";
  return "same shape " + shape_str(saved);
}

// This rank's chunk of `name`, the tensor of (or the moment of) a parameter
// laid out as `l`. The vocabulary is padded to a multiple of tp (padding rows
// are zero), so embedding/head tables (ParamLayout::vocab_rows) saved under
// another tp may have a different row count: their first `vocab` rows are
// what matters.
at::Tensor read_chunk(const ComponentReader& in, const std::string& name, const ParamLayout& l, const ShardSpec& want,
                      int64_t vocab) {
  MT_CHECK(in.has(name), "checkpoint ", in.dir(), " is incomplete: it has no tensor '", in.full_name(name), "'");
  const auto saved = in.global_shape(name);
  if (saved == want.global_shape) return in.read(name, want);
  const auto& g = want.global_shape;
  MT_CHECK(l.vocab_rows && saved.size() == 2 && g.size() == 2 && saved[1] == g[1] && saved[0] >= vocab && g[0] >= vocab,
           "checkpoint ", in.dir(), ": tensor '", in.full_name(name), "': ", shape_difference(saved, g),
           ": it was saved from a different model (check model_config)");
  at::Tensor padded = at::zeros(g, at::TensorOptions().dtype(in.dtype(name)));
  padded.narrow(0, 0, vocab).copy_(in.read(name).narrow(0, 0, vocab));
  if (want.split_dim < 0) return padded;
  return padded.chunk(want.num_shards, want.split_dim)[want.shard].contiguous();
}

// One owner per shard (writes_checkpoint, parallel/checkpoint_writer.h):
// only it holds the tensor on the host; the others list it unwritten.
void add_written(ComponentState& s, const std::string& name, const at::Tensor& host, const ParamLayout& l,
                 Mesh& mesh) {
  const bool write = writes_checkpoint(l, mesh);
  MT_ASSERT(write == host.defined(), "checkpoint tensor '", name, "': this rank ", write ? "writes" : "does not write",
            " it but ", host.defined() ? "holds" : "lacks", " a host copy");
  s.tensors.push_back({name, host, spec_of(l, mesh), write});
}

// A multi-token prediction module (model/mtp.h) a checkpoint may lack: a
// run can add model_config.mtp_depth to a model trained without it.
bool mtp_param(const ParamLayout& l) { return l.global_name.rfind("mtp.", 0) == 0; }

}  // namespace

ComponentState ModelState::state() const {
  // zero_stage 3's parameters are gathered from their dp shards to the
  // writers only; every other rank copies nothing.
  HostCopies host;
  const std::vector<at::Tensor> saved = params_to_save(pm_, mesh_, host);
  host.wait();
  // Units that evaluation or sampling left whole are sharded again (local),
  // so a save leaves zero_stage 3 at rest, as plan models it.
  release_params(pm_, /*written=*/false);
  ComponentState s;
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const ParamLayout& l = pm_.params[i].layout;
    add_written(s, l.global_name, saved[i], l, mesh_);
  }
  return s;
}

void ModelState::load_state(const ComponentReader& in) {
  gather_params(pm_);
  int64_t fresh = 0;
  for (const ParamInfo& p : pm_.params) {
    if (mtp_param(p.layout) && !in.has(p.layout.global_name)) {
      ++fresh;  // keeps its initial value
      continue;
    }
    const at::Tensor t = read_chunk(in, p.layout.global_name, p.layout, spec_of(p.layout, mesh_), vocab_);
    p.tensor.detach().copy_(t.to(p.tensor.device(), p.tensor.scalar_type()));
  }
  release_params(pm_, /*written=*/true);
  if (fresh > 0)
    spdlog::info("checkpoint {} has no multi-token prediction modules: their {} tensors (mtp.*) start from their "
                 "initialisation, with zero optimizer moments", in.dir(), fresh);
}

ComponentState OptimizerState::state() const {
  // Whole per parameter, so the checkpoint reads back on any dp and any
  // zero_stage; ZeRO-1 and FSDP gather their dp slices to the writers only.
  HostCopies host;
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  std::tie(exp_avg, exp_avg_sq) = opt_.moments_to_save(host);
  host.wait();
  ComponentState s;
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const ParamLayout& l = pm_.params[i].layout;
    add_written(s, "exp_avg." + l.global_name, exp_avg[i], l, mesh_);
    add_written(s, "exp_avg_sq." + l.global_name, exp_avg_sq[i], l, mesh_);
  }
  s.values["steps"] = opt_.steps_taken();
  return s;
}

void OptimizerState::load_state(const ComponentReader& in) {
  MT_CHECK(in.values().contains("steps"), "checkpoint ", in.dir(), " is incomplete: no optimizer step count");
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  for (const ParamInfo& p : pm_.params) {
    const ShardSpec spec = spec_of(p.layout, mesh_);
    if (mtp_param(p.layout) && !in.has("exp_avg." + p.layout.global_name)) {  // ModelState::load_state logs it
      exp_avg.push_back(at::zeros(shard_shape(spec), at::kFloat));
      exp_avg_sq.push_back(at::zeros(shard_shape(spec), at::kFloat));
      continue;
    }
    exp_avg.push_back(read_chunk(in, "exp_avg." + p.layout.global_name, p.layout, spec, vocab_));
    exp_avg_sq.push_back(read_chunk(in, "exp_avg_sq." + p.layout.global_name, p.layout, spec, vocab_));
  }
  const int64_t steps = in.values().at("steps").get<int64_t>();
  opt_.load_moments(exp_avg, exp_avg_sq);  // ZeRO-1 keeps this rank's dp slice
  opt_.set_steps_taken(steps);
}

ComponentState DataState::state() const {
  ComponentState s;
  s.values["train_cursor"] = train_.cursor();
  s.values["val_cursor"] = val_.cursor();
  return s;
}

void DataState::load_state(const ComponentReader& in) {
  MT_CHECK(in.values().contains("train_cursor") && in.values().contains("val_cursor"), "checkpoint ", in.dir(),
           " is incomplete: no data loader positions");
  train_.restore(in.values().at("train_cursor").get<Cursor>());
  val_.restore(in.values().at("val_cursor").get<Cursor>());
}

ComponentState RngState::state() const {
  at::Generator gen = gen_;  // a handle: get_state() is not const
  const at::Tensor st = gen.get_state();
  ComponentState s;
  s.values["state"] = std::vector<uint8_t>(st.data_ptr<uint8_t>(), st.data_ptr<uint8_t>() + st.numel());
  return s;
}

void RngState::load_state(const ComponentReader& in) {
  // Older checkpoints may predate the saved RNG: the seed's stream goes on.
  if (!in.values().contains("state")) return;
  const auto bytes = in.values().at("state").get<std::vector<uint8_t>>();
  at::Tensor st = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  if (!bytes.empty()) std::memcpy(st.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  gen_.set_state(st);
}

}  // namespace meshtrain
