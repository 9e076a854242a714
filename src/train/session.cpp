// The one assembly of a run (see session.h).
#include "meshtrain/train/session.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string>

#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/dist/device.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/train/data_sources.h"
#include "meshtrain/train/placement.h"
#include "meshtrain/train/shared_run_dir.h"

namespace meshtrain {

namespace fs = std::filesystem;

Session::Session(const Config& cfg, Runtime& runtime, SessionOptions opts, const Communicator* world)
    : cfg_(cfg),
      opts_(std::move(opts)),
      device_(pick_device(cfg, runtime, opts_.meta)),
      test_hooks_(TestHooks::from_environment()) {
  std::unique_ptr<Communicator> own_world;
  if (!world) {
    own_world = runtime.world();
    world = own_world.get();
  }
  is_rank0_ = world->rank() == 0;
  world_rank_ = runtime.rank();
  validate(cfg_);
  validate_world(cfg_, world->size());
  MT_CHECK(!opts_.meta || world->size() == 1, "the meta device models one rank; run it without mpirun (world ",
           world->size(), ")");
  // From here on every phase is watched: a hang in NCCL init or a checkpoint
  // load ends the job like a hang in a step.
  watchdog_ = opts_.watchdog;
  if (!watchdog_) {
    own_watchdog_ = std::make_unique<Watchdog>(cfg_.watchdog_seconds, world->rank(), world->size(),
                                               world->size() > 1 ? cfg_.run_dir() + "/heartbeats" : "");
    watchdog_ = own_watchdog_.get();
  }

  // 1. device and mesh.
  watchdog_->beat("start-up: mesh and communicators");
  at::set_num_threads(static_cast<int>(std::max<int64_t>(1, cfg_.torch_threads)));
  // Collectives are non-const only because they count their bytes; the
  // world given to the Session is read-only otherwise (its counters unused).
  check_gpu_per_rank(const_cast<Communicator&>(*world), cfg_, device_);
  if (device_.is_cuda()) prefer_attention_backend(cfg_.device.attention_backend);
  // Under context parallelism the cp ranks of a batch share are dp ranks of the mesh (mesh.h).
  const int cp = static_cast<int>(cfg_.device.cp());
  MeshShape shape{static_cast<int>(cfg_.device.dp()) * cp, static_cast<int>(cfg_.device.pp()),
                  static_cast<int>(cfg_.device.tp()), static_cast<int>(cfg_.device.expert_parallel), cp};
  mesh_ = std::make_unique<Mesh>(*world, shape, pick_backend(cfg_, device_));
  flight_ = std::make_unique<FlightRecorder>(cfg_.flight_recorder_size, world->rank());
  mesh_->record_flight(*flight_);
  watchdog_->attach_flight(flight_.get(), world->size() > 1 && !opts_.meta ? cfg_.run_dir() + "/flight" : "");
  if (mesh_->backend() == "nccl" && is_rank0_) spdlog::info("NCCL {} (library loaded at run time)", nccl_runtime_version());
  log_placement(*mesh_, runtime, device_);

  // 2. data first: a missing folder should fail before the model is built.
  watchdog_->beat("start-up: data loaders");
  build_data();

  // 3-5. model, parallelism, optimizer.
  watchdog_->beat("start-up: building the model");
  build_model();

  // 6. checkpointer and resume.
  if (opts_.meta) {
    MT_CHECK(opts_.fresh && opts_.checkpoint.empty(), "the meta device loads no checkpoint");
    return;
  }
  if (opts_.check_shared_run_dir && world->size() > 1) {
    watchdog_->beat("start-up: checking that every rank sees the run dir");
    check_run_dir_shared(cfg_.run_dir(), mesh_->cpu_world());
  }
  watchdog_->beat("start-up: loading the checkpoint");
  setup_checkpointing();
  resume();
  loaded_step_ = progress_.step;
  watchdog_->beat("start-up done");
}

Session::~Session() {
  if (!watchdog_ || !flight_) return;
  // An error on its way out (main aborts the other ranks next): what this
  // rank's collectives were is kept for `meshtrain flight`.
  if (std::uncaught_exceptions() > 0 && watchdog_->write_flight("error"))
    spdlog::warn("flight recorder written to {}/flight", cfg_.run_dir());
  watchdog_->attach_flight(nullptr, "");  // main's watchdog outlives this recorder
}

void Session::build_data() {
  if (opts_.meta) return;  // synthetic batches (train/step.cpp): no data folder is read
  // Before any loader: a shard of another tokenizer is named, not read.
  data_tokenizer_ = check_data_tokenizer(run_datasets(cfg_));
  if (is_rank0_) {
    for (const auto& note : data_tokenizer_.notes) spdlog::info("note: {}", note);
    if (!data_tokenizer_.fingerprint.empty())
      spdlog::info("data: tokenizer {} ({})", data_tokenizer_.fingerprint, data_tokenizer_.where);
  }
  if (cfg_.data.document_masking && cfg_.data.eot_token < 0) cfg_.data.eot_token = data_eot_token(cfg_.data);
  RunLoaders loaders = make_loaders(cfg_, mesh_->data_rank(), mesh_->shape().data_dp());
  train_loader_ = std::move(loaders.train);
  val_loader_ = std::move(loaders.val);
  // The next round's batch is read while this one trains (pinned on CUDA);
  // the loader's cursor stays that of the batches consumed (checkpoints).
  prefetcher_ = std::make_unique<BatchPrefetcher>(*train_loader_, device_.is_cuda());
  const fs::path tok = fs::path(cfg_.data.data_dir) / "tokenizer.json";
  if (fs::exists(tok)) {
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(tok.string()));
    MT_CHECK(tokenizer_->vocab_size() <= cfg_.model.vocab_size, "model_config.vocab_size=", cfg_.model.vocab_size,
             " is smaller than the tokenizer's vocabulary (", tokenizer_->vocab_size(), " in ", tok.string(), ")");
  }
}

void Session::build_model() {
  torch::manual_seed(cfg_.seed);
  pm_ = parallelize(cfg_, *mesh_, device_, opts_.meta);

  const ParamCount pc = count_params(cfg_.model);
  spdlog::info("model: {} layers, d {}, {} heads, {} / {} | parameters: {:.3f}M total, {:.3f}M active per token",
               cfg_.model.n_layers(), cfg_.model.model_dimension, cfg_.model.n_head, choice_name(cfg_.model.attention),
               choice_name(cfg_.model.ffn), pc.total / 1e6, pc.active / 1e6);
  std::string stage_layers;
  for (const LayerSpan& c : pm_->range.chunks())
    stage_layers += (stage_layers.empty() ? "[" : " [") + std::to_string(c.first) + ", " + std::to_string(c.end) + ")";
  const MeshShape& shape = mesh_->shape();
  const std::string cp = shape.cp > 1 ? fmt::format(" x cp {}", shape.cp) : "";
  spdlog::info("mesh: dp {} x pp {} x tp {}{} on {} ({}), stage layers {}", shape.data_dp(), shape.pp, shape.tp, cp,
               device_.str(), mesh_->backend(), stage_layers);
  spdlog::info("precision: {}", pm_->model->precision().policy().describe());
}

int Session::stop_agreed() {
  // Every rank must stop at the same point, so the signal of any rank (a
  // signal may reach only some of them) is shared before acting on it.
  at::Tensor sig = at::full({1}, static_cast<int64_t>(stop_requested()), at::kLong);
  mesh_->cpu_world().all_reduce(sig, ReduceOp::Max);
  const int agreed = static_cast<int>(sig.item<int64_t>());
  if (agreed && !flight_written_) flight_written_ = watchdog_->write_flight("stop signal " + std::to_string(agreed));
  return agreed;
}

void Session::stop_point(const std::string& during) {
  if (const int sig = stop_agreed()) throw Stopped(sig, during);
}

}  // namespace meshtrain
