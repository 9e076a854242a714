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

}  // namespace

void Trainer::save_checkpoint() {
  std::vector<NamedTensor> local;
  const auto& c = mesh_->coord();
  auto& params = opt_->params();
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const ParamInfo& p = pm_.params[i];
    // One writer per shard: dp rank 0, tp rank 0 for replicated tensors, and
    // never the tied head copy (the embedding's stage writes it).
    const bool write = c.dp == 0 && !p.layout.tied_copy && (p.layout.split_dim >= 0 || c.tp == 0);
    const ShardSpec spec = spec_of(p.layout, *mesh_);
    local.push_back({"model." + p.layout.global_name, p.tensor.detach().cpu(), spec, write});
    local.push_back({"optim.exp_avg." + p.layout.global_name, params[i].exp_avg.cpu(), spec, write});
    local.push_back({"optim.exp_avg_sq." + p.layout.global_name, params[i].exp_avg_sq.cpu(), spec, write});
  }
  nlohmann::json state;
  state["step"] = step_;
  state["optimizer_steps"] = opt_->steps_taken();
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
  auto& params = opt_->params();
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const ParamInfo& p = pm_.params[i];
    const ShardSpec spec = spec_of(p.layout, *mesh_);
    const std::string name = "model." + p.layout.global_name;
    MT_CHECK(reader.has(name), "checkpoint ", dir, " has no tensor '", name,
             "': it was saved from a different model (check model_config)");
    p.tensor.copy_(reader.read(name, spec).to(p.tensor.device(), p.tensor.scalar_type()));
    const std::string m = "optim.exp_avg." + p.layout.global_name, v = "optim.exp_avg_sq." + p.layout.global_name;
    if (reader.has(m) && reader.has(v)) {
      params[i].exp_avg.copy_(reader.read(m, spec).to(params[i].exp_avg.device()));
      params[i].exp_avg_sq.copy_(reader.read(v, spec).to(params[i].exp_avg_sq.device()));
    }
  }
  const auto& st = reader.trainer_state();
  step_ = st.at("step").get<int64_t>();
  opt_->set_steps_taken(st.value("optimizer_steps", step_));
  if (opts_.load_data_cursor) {
    // The cursor is a position in the global stream, so it holds on any mesh.
    train_loader_->restore(st.at("train_cursor").get<Cursor>());
    val_loader_->restore(st.at("val_cursor").get<Cursor>());
  }
  if (st.contains("rng_cpu")) set_rng_state(st.at("rng_cpu"));
  spdlog::info("resumed from {} (step {})", dir, step_);
}

}  // namespace meshtrain
