// The session's side of checkpoints: which components make up the run's state
// (train/components.h), what the header of trainer_state.json holds (step,
// samples consumed, config, mesh), and which checkpoint a run starts from.
#include <torch/torch.h>

#include <chrono>
#include <filesystem>

#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/resume.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/train/components.h"
#include "meshtrain/train/session.h"

namespace meshtrain {

namespace {

// --checkpoint names one step_XXXXXXXX folder; a run dir or its checkpoints/
// folder is a common slip, answered with the folders it holds.
void check_checkpoint_dir(const std::string& dir, const std::string& run_dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(fs::path(dir) / "manifest.json")) return;
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "run/checkpoints/"
  std::vector<std::string> inside = list_checkpoints(p.string());
  if (inside.empty() && p.has_parent_path()) inside = list_checkpoints(p.parent_path().string());  // DIR = run/checkpoints
  std::string hint = "a checkpoint is a step_XXXXXXXX folder, e.g. in " + checkpoints_root(run_dir);
  if (!inside.empty()) hint = "did you mean " + inside.front() + " (the newest there)?";
  MT_FAIL("--checkpoint ", dir, " is not a checkpoint (it has no manifest.json); ", hint);
}

}  // namespace

void Session::setup_checkpointing() {
  checkpointer_ = std::make_unique<Checkpointer>(cfg_.run_dir(), mesh_->cpu_world(), cfg_.max_to_keep);
  const int64_t vocab = cfg_.model.vocab_size;
  const auto add = [&](const std::string& name, std::unique_ptr<Stateful> c) {
    checkpointer_->add(name, *c);
    components_.push_back(std::move(c));
  };
  add("model", std::make_unique<ModelState>(*pm_, *mesh_, vocab));
  add("optim", std::make_unique<OptimizerState>(*pm_, *mesh_, vocab, *pm_->data_parallel));
  add("data", std::make_unique<DataState>(*train_loader_, *val_loader_));
  add("rng", std::make_unique<RngState>(at::detail::getDefaultCPUGenerator()));
  // On GPU, dropout draws from the device's CUDA generator: saved as well, so a
  // resume on GPU is exact (checkpoints without it keep the seeded stream).
  if (device_.is_cuda()) add("rng_cuda", std::make_unique<RngState>(at::globalContext().defaultGenerator(device_)));
}

nlohmann::json Session::checkpoint_header() const {
  nlohmann::json header;
  header["step"] = progress_.step;
  header["consumed_samples"] = progress_.consumed_samples;
  header["config"] = to_json(cfg_);
  // [dp, pp, tp] as n_device_axis says, and cp beside them (checkpoint inspect shows both).
  header["mesh"] = {mesh_->shape().data_dp(), mesh_->shape().pp, mesh_->shape().tp};
  header["context_parallel"] = mesh_->shape().cp;
  if (!opts_.init_from_hf.empty()) header["init_from_hf"] = opts_.init_from_hf;
  // Which tokenizer made the data these weights learned from (checked on resume).
  if (!data_tokenizer_.fingerprint.empty()) {
    header["tokenizer_fingerprint"] = data_tokenizer_.fingerprint;
    header["tokenizer_data"] = data_tokenizer_.where;
  }
  return header;
}

void Session::save_checkpoint() {
  checkpointer_->save(progress_.step, checkpoint_header());
  spdlog::info("saved checkpoint of step {} in {}/checkpoints", progress_.step, cfg_.run_dir());
}

CheckpointCost Session::save_checkpoint_in_loop(bool finish) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); };
  const auto start = Clock::now();
  CheckpointCost cost;
  cost.background = cfg_.async_checkpoint;
  if (!cfg_.async_checkpoint) {
    save_checkpoint();
    cost.blocked = seconds(start);
    return cost;
  }
  // At most one save in flight: the previous one is committed first.
  if (const int64_t previous = checkpointer_->in_flight_step(); previous >= 0) {
    watchdog_->beat("waiting for the background save of step " + std::to_string(previous));
    checkpointer_->finish_background();
    cost.waited = seconds(start);
    spdlog::info("saved checkpoint of step {} in {}/checkpoints (background; waited {:.3f} s for it)", previous,
                 cfg_.run_dir(), cost.waited);
  }
  checkpointer_->start_background(progress_.step, checkpoint_header(), test_hooks_.checkpoint_write_delay(progress_.step));
  if (finish) {
    checkpointer_->finish_background();
    spdlog::info("saved checkpoint of step {} in {}/checkpoints", progress_.step, cfg_.run_dir());
  }
  cost.blocked = seconds(start);
  return cost;
}

double Session::commit_written_checkpoint() {
  const int64_t step = checkpointer_->in_flight_step();
  if (step < 0) return 0;
  const auto start = std::chrono::steady_clock::now();
  if (!checkpointer_->commit_if_written()) return 0;
  spdlog::info("saved checkpoint of step {} in {}/checkpoints (written in the background)", step, cfg_.run_dir());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Session::check_resumed_config(const std::string& dir, const nlohmann::json& trainer_state) const {
  MT_CHECK(trainer_state.contains("step") && trainer_state["step"].is_number_integer(), "checkpoint ", dir,
           ": trainer_state.json has no step");
  if (!trainer_state.contains("config")) return;  // written by hand or by a tool: shapes are still checked
  const ResumeDiff diff = compare_for_resume(trainer_state["config"], cfg_);
  if (!diff.refused.empty()) {
    std::string keys;
    for (const auto& line : diff.refused) keys += "\n  " + line;
    MT_FAIL("checkpoint ", dir, " was saved from a different model; refusing to load it with changed model keys:",
            keys, "\nSet them back to the checkpoint's values, or train a new run (--name, or --fresh to start over",
            " in this one)");
  }
  for (const auto& line : diff.warned) spdlog::warn("resuming {} with a changed config key: {}", dir, line);
  check_resumed_tokenizer(dir, trainer_state);
}

// The ids the checkpoint learned must mean the same tokens in the data it goes
// on with; a checkpoint or data without a fingerprint cannot be checked.
void Session::check_resumed_tokenizer(const std::string& dir, const nlohmann::json& trainer_state) const {
  const auto saved = trainer_state.contains("tokenizer_fingerprint") && trainer_state["tokenizer_fingerprint"].is_string()
                         ? trainer_state["tokenizer_fingerprint"].get<std::string>()
                         : std::string();
  const std::string& now = data_tokenizer_.fingerprint;
  if (saved.empty() || now.empty()) {
    if (is_rank0_ && saved.empty())
      spdlog::info("note: checkpoint {} does not record which tokenizer made its data (saved before fingerprints): "
                   "it cannot be checked against this run's data", dir);
    else if (is_rank0_)
      spdlog::info("note: this run's data has no tokenizer fingerprint: it cannot be checked against checkpoint {}'s "
                   "(tokenizer {})", dir, saved);
    return;
  }
  if (saved == now) return;
  const std::string saved_where = trainer_state.value("tokenizer_data", std::string("?"));
  const std::string what = detail::concat("checkpoint ", dir, " was trained on data of tokenizer ", saved, " (",
                                          saved_where, "), but this run's data is of tokenizer ", now, " (",
                                          data_tokenizer_.where, "): the same ids mean different tokens");
  MT_CHECK(opts_.allow_tokenizer_change, what, ". Point data_config at data of the checkpoint's tokenizer, or pass ",
           "train --allow-tokenizer-change to continue on the new data on purpose");
  if (is_rank0_) spdlog::warn("{}; continuing because of --allow-tokenizer-change", what);
}

void Session::apply_header(const nlohmann::json& st) {
  progress_.step = st.at("step").get<int64_t>();
  // Older checkpoints predate the rampup: every step took the full batch.
  progress_.consumed_samples =
      st.value("consumed_samples", progress_.step * cfg_.data.train_batch_size * cfg_.grad_step);
}

void Session::resume() {
  const Checkpointer::Check check = [this](const std::string& dir, const nlohmann::json& st) {
    check_resumed_config(dir, st);
  };
  if (!opts_.checkpoint.empty()) {
    check_checkpoint_dir(opts_.checkpoint, cfg_.run_dir());
    apply_header(checkpointer_->load(opts_.checkpoint, check));
    weights_from_ = opts_.checkpoint;
    return;
  }
  if (opts_.fresh) {
    checkpointer_->protect_unreadable();
    return;
  }
  if (auto found = checkpointer_->load_newest(check)) {
    apply_header(found->second);
    weights_from_ = found->first;
    return;
  }
  MT_CHECK(!opts_.require_checkpoint, "run ", cfg_.run_dir(), " has no checkpoint to load (train it first, pass ",
           "--checkpoint DIR, or --random_weights to use an untrained model on purpose)");
}

}  // namespace meshtrain
