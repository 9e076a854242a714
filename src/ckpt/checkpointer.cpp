#include "meshtrain/ckpt/checkpointer.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "json_collectives.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// How one rank fared with a candidate checkpoint; the worst outcome over the
// ranks decides for all of them, so every rank loads the same checkpoint.
enum Outcome : int64_t { kLoaded = 0, kUnreadable = 1, kRefused = 2 };

// Checkpoints written before components owned their state kept everything
// flat at the top of trainer_state.json.
nlohmann::json component_values(const nlohmann::json& state, const std::string& name) {
  if (state.contains("components")) return state["components"].value(name, nlohmann::json::object());
  nlohmann::json v = nlohmann::json::object();
  if (name == "optim" && state.contains("optimizer_steps")) v["steps"] = state["optimizer_steps"];
  if (name == "optim" && !state.contains("optimizer_steps") && state.contains("step")) v["steps"] = state["step"];
  if (name == "data" && state.contains("train_cursor")) {
    v["train_cursor"] = state["train_cursor"];
    v["val_cursor"] = state.value("val_cursor", nlohmann::json());
  }
  if (name == "rng" && state.contains("rng_cpu")) v["state"] = state["rng_cpu"];
  return v;
}

}  // namespace

Checkpointer::Checkpointer(std::string run_dir, Communicator& world, int64_t max_to_keep)
    : run_dir_(std::move(run_dir)), world_(world), max_to_keep_(max_to_keep) {}

void Checkpointer::add(const std::string& name, Stateful& component) {
  for (const auto& c : components_) MT_ASSERT(c.first != name, "two checkpoint components named ", name);
  components_.emplace_back(name, &component);
}

Checkpointer::~Checkpointer() {
  if (!background_) return;
  spdlog::warn("the background save of checkpoint step {} is not committed (the run stopped on an error): the "
               "previous checkpoint stays the newest; waiting for its writer", background_->job().step);
  background_.reset();
}

std::vector<NamedTensor> Checkpointer::gather_state(nlohmann::json& header) {
  std::vector<NamedTensor> local;
  header["components"] = nlohmann::json::object();
  for (const auto& [name, component] : components_) {
    ComponentState s = component->state();
    for (auto& t : s.tensors) {
      t.name = name + "." + t.name;
      local.push_back(std::move(t));
    }
    header["components"][name] = std::move(s.values);
  }
  return local;
}

void Checkpointer::committed(int64_t step) {
  // An unreadable checkpoint of this step was set aside under another name;
  // the name now belongs to the readable save.
  unreadable_.erase(std::remove(unreadable_.begin(), unreadable_.end(), checkpoint_dir_name(step)), unreadable_.end());
}

void Checkpointer::save(int64_t step, nlohmann::json header) {
  finish_background();  // saves commit in the order they were taken
  const std::vector<NamedTensor> local = gather_state(header);
  save_checkpoint(run_dir_, step, local, header, world_, max_to_keep_, unreadable_);
  committed(step);
}

void Checkpointer::start_background(int64_t step, nlohmann::json header, double delay_seconds) {
  finish_background();
  BackgroundSave::Job job;
  job.tensors = gather_state(header);
  own_tensors(job.tensors);
  job.staging_dir = stage_checkpoint(run_dir_, step, world_);
  job.step = step;
  job.rank = world_.rank();
  job.trainer_state = std::move(header);
  job.delay_seconds = delay_seconds;
  background_ = std::make_unique<BackgroundSave>(std::move(job));
}

bool Checkpointer::commit_if_written() {
  if (!background_) return false;
  // Every rank learns at the same call whether all writers are done.
  at::Tensor pending = at::full({1}, static_cast<int64_t>(!background_->written()), at::kLong);
  world_.all_reduce(pending, ReduceOp::Max);
  if (pending.item<int64_t>() != 0) return false;
  finish_background();
  return true;
}

void Checkpointer::finish_background() {
  if (!background_) return;
  const std::unique_ptr<BackgroundSave> save = std::move(background_);
  const RankShards& mine = save->wait();
  const auto& job = save->job();
  commit_rank_shards(run_dir_, job.staging_dir, job.step, mine, job.trainer_state, world_, max_to_keep_, unreadable_);
  committed(job.step);
}

std::string Checkpointer::try_load(const std::string& dir, const Check& check, nlohmann::json& state) {
  Outcome outcome = kLoaded;
  std::string why;
  try {
    CheckpointReader reader(dir);
    reader.verify();
    state = reader.trainer_state();
    try {
      if (check) check(dir, state);
    } catch (...) {
      outcome = kRefused;
      throw;
    }
    at::NoGradGuard no_grad;
    for (const auto& [name, component] : components_)
      component->load_state(ComponentReader(reader, name, component_values(state, name)));
  } catch (const std::exception& e) {
    if (outcome == kLoaded) outcome = kUnreadable;
    why = e.what();
  }
  // Every rank's outcome and reason, so each rank can name the one that failed.
  const auto all = ckpt_comm::all_gather_json(world_, {{"outcome", static_cast<int64_t>(outcome)}, {"why", why}});
  int64_t worst = kLoaded;
  for (const auto& r : all) worst = std::max(worst, r.at("outcome").get<int64_t>());
  if (worst == kLoaded) return "";
  std::string reason;
  for (size_t r = 0; r < all.size() && reason.empty(); ++r)
    if (all[r].at("outcome").get<int64_t>() == worst)
      reason = (all.size() > 1 ? "rank " + std::to_string(r) + ": " : std::string()) + all[r].at("why").get<std::string>();
  MT_CHECK(worst != kRefused, reason);
  return reason;
}

nlohmann::json Checkpointer::load(const std::string& dir, const Check& check) {
  // Named by the user (--checkpoint): a folder no resume would pick is
  // refused before it is read, so its next save cannot remove what it loaded.
  const std::string aside = set_aside_checkpoint(dir);
  MT_CHECK(aside.empty(), "--checkpoint ", dir, ": ", aside);
  nlohmann::json state;
  const std::string why = try_load(dir, check, state);
  MT_CHECK(why.empty(), "cannot load checkpoint ", dir, ": ", why);
  spdlog::info("resumed from {} (step {})", dir, state.value("step", int64_t{0}));
  return state;
}

std::optional<std::pair<std::string, nlohmann::json>> Checkpointer::load_newest(const Check& check) {
  const auto candidates = list_checkpoints(run_dir_);
  std::string reasons;
  for (const auto& dir : candidates) {
    nlohmann::json state;
    const std::string why = try_load(dir, check, state);
    if (why.empty()) {
      spdlog::info("resumed from {} (step {})", dir, state.value("step", int64_t{0}));
      return std::make_pair(dir, state);
    }
    spdlog::warn("{}", "skipping checkpoint " + dir + ": " + why);
    unreadable_.push_back(fs::path(dir).filename().string());
    reasons += "\n  " + dir + ": " + why;
  }
  if (candidates.empty()) return std::nullopt;
  MT_FAIL("run ", run_dir_, " has ", candidates.size(), " checkpoint(s) but none can be read; refusing to start over ",
          "on top of them (they are left as they are). Restore or move them, or pass --fresh to start from step 0 ",
          "while keeping them:", reasons);
}

void Checkpointer::protect_unreadable() {
  if (world_.rank() != 0) return;  // rank 0 alone commits and prunes
  for (const auto& dir : list_checkpoints(run_dir_)) {
    try {
      CheckpointReader(dir).verify();
    } catch (const std::exception& e) {
      spdlog::warn("{}", "checkpoint " + dir + " cannot be read (" + e.what() + "): this run leaves it alone");
      unreadable_.push_back(fs::path(dir).filename().string());
    }
  }
}

}  // namespace meshtrain
