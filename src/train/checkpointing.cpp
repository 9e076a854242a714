// The trainer's side of checkpoints: which tensors of this rank go in (model
// parameters and AdamW moments, each with its global layout so any mesh can
// read them back) and the trainer state (step, RNG, data cursors, config).
#include <torch/torch.h>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

ShardSpec spec_of(const ParamLayout& l, const Mesh& mesh) {
  ShardSpec s;
  s.global_shape = l.global_shape;
  s.split_dim = l.split_dim;
  if (l.split_dim >= 0) {
    s.shard = mesh.coord().tp;
    s.num_shards = mesh.shape().tp;
  }
  return s;
}

nlohmann::json rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor st = gen.get_state();
  std::vector<uint8_t> bytes(st.data_ptr<uint8_t>(), st.data_ptr<uint8_t>() + st.numel());
  return bytes;
}

void set_rng_state(const nlohmann::json& j) {
  auto bytes = j.get<std::vector<uint8_t>>();
  at::Tensor st = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(st.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(st);
}

// Reads this rank's chunk of `name`. The vocabulary is padded to a multiple of
// tp (padding rows are zero), so embedding/head tables saved under another tp
// may have a different row count: their first `vocab` rows are what matters.
at::Tensor read_chunk(const CheckpointReader& r, const std::string& name, const ShardSpec& want, int64_t vocab) {
  const auto saved = r.global_shape(name);
  if (saved == want.global_shape) return r.read(name, want);
  const auto& g = want.global_shape;
  const auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const bool vocab_rows = ends_with("embed.weight") || ends_with("head.weight");
  MT_CHECK(vocab_rows && saved.size() == 2 && g.size() == 2 && saved[1] == g[1] && saved[0] >= vocab && g[0] >= vocab,
           "checkpoint ", r.dir(), ": tensor '", name, "' has shape [", saved.size() ? saved[0] : 0, ", ...] but this",
           " model needs [", g.size() ? g[0] : 0, ", ...]: it was saved from a different model (check model_config)");
  at::Tensor padded = at::zeros(g, at::TensorOptions().dtype(r.dtype(name)));
  padded.narrow(0, 0, vocab).copy_(r.read(name).narrow(0, 0, vocab));
  if (want.split_dim < 0) return padded;
  return padded.chunk(want.num_shards, want.split_dim)[want.shard].contiguous();
}

}  // namespace

void Trainer::save_checkpoint() {
  std::vector<NamedTensor> local;
  const auto& c = mesh_->coord();
  // Moments per parameter, whole: under ZeRO-1 gathered from the dp slices,
  // so the checkpoint reads back on any dp and any zero_stage.
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  if (zero_) {
    std::tie(exp_avg, exp_avg_sq) = zero_->gather_moments();
  } else {
    for (const auto& o : opt_->params()) {
      exp_avg.push_back(o.exp_avg);
      exp_avg_sq.push_back(o.exp_avg_sq);
    }
  }
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const ParamInfo& p = pm_.params[i];
    // One writer per shard: dp rank 0, tp rank 0 for replicated tensors, and
    // never the tied head copy (the embedding's stage writes it).
    const bool write = c.dp == 0 && !p.layout.tied_copy && (p.layout.split_dim >= 0 || c.tp == 0);
    const ShardSpec spec = spec_of(p.layout, *mesh_);
    local.push_back({"model." + p.layout.global_name, p.tensor.detach().cpu(), spec, write});
    local.push_back({"optim.exp_avg." + p.layout.global_name, exp_avg[i].cpu(), spec, write});
    local.push_back({"optim.exp_avg_sq." + p.layout.global_name, exp_avg_sq[i].cpu(), spec, write});
  }
  nlohmann::json state;
  state["step"] = step_;
  state["optimizer_steps"] = zero_ ? zero_->steps_taken() : opt_->steps_taken();
  state["consumed_samples"] = consumed_samples_;
  state["train_cursor"] = train_loader_->cursor();
  state["val_cursor"] = val_loader_->cursor();
  state["rng_cpu"] = rng_state();
  state["config"] = to_json(cfg_);
  state["mesh"] = {mesh_->shape().dp, mesh_->shape().pp, mesh_->shape().tp};
  meshtrain::save_checkpoint(cfg_.run_dir(), step_, local, state, mesh_->cpu_world(), cfg_.max_to_keep);
  spdlog::info("saved checkpoint of step {} in {}/checkpoints", step_, cfg_.run_dir());
}

void Trainer::load_checkpoint(const std::string& dir) {
  CheckpointReader reader(dir);
  reader.verify();
  at::NoGradGuard no_grad;
  const int64_t vocab = cfg_.model.vocab_size;
  std::vector<at::Tensor> exp_avg(pm_.params.size()), exp_avg_sq(pm_.params.size());
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const ParamInfo& p = pm_.params[i];
    const ShardSpec spec = spec_of(p.layout, *mesh_);
    const std::string name = "model." + p.layout.global_name;
    MT_CHECK(reader.has(name), "checkpoint ", dir, " has no tensor '", name,
             "': it was saved from a different model (check model_config)");
    p.tensor.copy_(read_chunk(reader, name, spec, vocab).to(p.tensor.device(), p.tensor.scalar_type()));
    const std::string m = "optim.exp_avg." + p.layout.global_name, v = "optim.exp_avg_sq." + p.layout.global_name;
    if (reader.has(m) && reader.has(v)) {
      exp_avg[i] = read_chunk(reader, m, spec, vocab);
      exp_avg_sq[i] = read_chunk(reader, v, spec, vocab);
    }
  }
  if (zero_) {
    zero_->load_moments(exp_avg, exp_avg_sq);  // keeps this rank's dp slice
  } else {
    auto& params = opt_->params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!exp_avg[i].defined()) continue;
      params[i].exp_avg.copy_(exp_avg[i].to(params[i].exp_avg.device()));
      params[i].exp_avg_sq.copy_(exp_avg_sq[i].to(params[i].exp_avg_sq.device()));
    }
  }
  const auto& st = reader.trainer_state();
  step_ = st.at("step").get<int64_t>();
  const int64_t opt_steps = st.value("optimizer_steps", step_);
  if (zero_) zero_->set_steps_taken(opt_steps);
  else opt_->set_steps_taken(opt_steps);
  // Older checkpoints predate the rampup: every step took the full batch.
  consumed_samples_ = st.value("consumed_samples", step_ * cfg_.data.train_batch_size * cfg_.grad_step);
  if (opts_.load_data_cursor) {
    // The cursor is a position in the global stream, so it holds on any mesh.
    train_loader_->restore(st.at("train_cursor").get<Cursor>());
    val_loader_->restore(st.at("val_cursor").get<Cursor>());
  }
  if (st.contains("rng_cpu")) set_rng_state(st.at("rng_cpu"));
  spdlog::info("resumed from {} (step {})", dir, step_);
}

}  // namespace meshtrain
