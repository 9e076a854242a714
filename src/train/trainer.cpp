#include "meshtrain/train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"
#include "meshtrain/core/host.h"
#include "meshtrain/core/log.h"
#include "meshtrain/core/run_lock.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/core/watchdog.h"
#include "meshtrain/dist/device.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/optim/rampup.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/pipeline_generate.h"
#include "meshtrain/train/generate.h"
#include "meshtrain/train/shared_run_dir.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// The device of this rank: with CUDA, the GPU its local rank maps to
// (dist/device.h), made current before any other CUDA or NCCL call; the meta
// device for bench --device meta (shapes only, nothing computed).
at::Device pick_device(const Config& cfg, const Runtime& rt, const TrainOptions& opts) {
  if (opts.meta) return at::Device(at::kMeta);
  const std::string& d = cfg.device.device;
  if (d == "cpu") return at::Device(at::kCPU);
  const bool cuda = torch::cuda::is_available();
  MT_CHECK(d != "cuda" || cuda, "device_config.device is \"cuda\" but no CUDA device is available to this build");
  if (!cuda) return at::Device(at::kCPU);
  NodeTopology topo{hostname(), rt.rank(), rt.local_rank(), rt.local_size(), visible_cuda_devices()};
  return use_cuda_device(cuda_device_index(topo, /*share_gpus=*/cfg.device.collectives == "mpi"));
}

Backend pick_backend(const Config& cfg, const at::Device& device) {
  const std::string& c = cfg.device.collectives;
  MT_CHECK(c != "nccl" || device.is_cuda(), "device_config.collectives is \"nccl\" but this rank runs on ", device.str(),
           ": NCCL moves CUDA tensors only (use \"auto\" or \"mpi\")");
  if (c == "mpi") return Backend::Mpi;
  return device.is_cuda() ? Backend::Nccl : Backend::Mpi;
}

// Fixed-width rows of text gathered from every rank (rank order).
std::vector<std::string> gather_text(Communicator& world, std::string text) {
  constexpr int64_t kWidth = 256;
  text.resize(static_cast<size_t>(kWidth), '\0');
  const at::Tensor mine = at::from_blob(text.data(), {kWidth}, at::kByte).clone();
  const at::Tensor all = world.all_gather(mine, 0);
  std::vector<std::string> rows;
  for (int r = 0; r < world.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * kWidth;
    rows.emplace_back(p, strnlen(p, static_cast<size_t>(kWidth)));
  }
  return rows;
}

// Before any NCCL communicator exists: the ranks of one host must drive
// different GPUs (a launcher giving each rank one visible GPU must give each a
// different one). Compared by UUID, since every such rank calls its GPU 0.
void check_gpu_per_rank(Communicator& world, const Config& cfg, const at::Device& device) {
  const std::string uuid = device.is_cuda() ? cuda_device_uuid(device.index()) : "";
  const std::vector<std::string> rows = gather_text(world, hostname() + '\n' + uuid);
  std::vector<RankGpu> gpus;
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t nl = rows[r].find('\n');
    const std::string id = nl == std::string::npos ? "" : rows[r].substr(nl + 1);
    if (!id.empty()) gpus.push_back(RankGpu{static_cast<int>(r), rows[r].substr(0, nl), id});
  }
  check_one_gpu_per_rank(gpus, /*share_gpus=*/cfg.device.collectives == "mpi");
}

// One line per rank, printed by rank 0 in rank order (other ranks log only
// warnings): where each rank runs, to spot two ranks on one GPU at a glance.
void log_placement(Mesh& mesh, const Runtime& rt, const at::Device& device) {
  std::string line = detail::concat("rank ", rt.rank(), " on ", hostname(), " (local ", rt.local_rank(), "/",
                                    rt.local_size(), "): mesh (dp ", mesh.coord().dp, ", pp ", mesh.coord().pp,
                                    ", tp ", mesh.coord().tp, ")");
  if (device.is_cuda()) {
    const int i = device.index();
    line += detail::concat(", GPU ", i, " (", cuda_device_name(i), ", physical id ",
                           physical_gpu_id(std::getenv("CUDA_VISIBLE_DEVICES"), i), ")");
  } else {
    line += ", cpu";
  }
  const std::vector<std::string> rows = gather_text(mesh.cpu_world(), line);
  if (mesh.cpu_world().rank() != 0) return;
  for (const std::string& row : rows) spdlog::info("{}", row);
}

std::string data_folder(const Config& cfg, const std::string& sub) {
  const fs::path p = fs::path(cfg.data.data_dir) / sub;
  MT_CHECK(fs::is_directory(p), "data folder '", p.string(), "' does not exist (data_config.data_dir + ",
           sub == cfg.data.train_folder_name ? "train_folder_name" : "val_folder_name",
           "); create it with: meshtrain prepare-data --input <text files> --output ", cfg.data.data_dir);
  return p.string();
}

// nanoGPT keeps train.bin and val.bin side by side in data_dir.
std::string nanogpt_file(const Config& cfg, const std::string& name) {
  const fs::path p = fs::path(cfg.data.data_dir) / name;
  MT_CHECK(fs::is_regular_file(p), "data_config.format is \"nanogpt\" but ", p.string(),
           " does not exist (nanoGPT's prepare.py writes train.bin and val.bin into data_dir)");
  return p.string();
}

// data_config.datasets: each entry's training files (its train_folder_name
// shards, or nanoGPT's train.bin) with its weight.
std::vector<DataSource> blend_sources(const Config& cfg) {
  std::vector<DataSource> sources;
  for (const auto& ds : cfg.data.datasets) {
    DataSource src;
    src.weight = ds.weight;
    if (cfg.data.format == "nanogpt") {
      const fs::path p = fs::path(ds.path) / "train.bin";
      MT_CHECK(fs::is_regular_file(p), "data_config.datasets: ", p.string(), " does not exist");
      src.files = {p.string()};
      src.format = ShardFormat::kNanoGpt;
    } else {
      const fs::path p = fs::path(ds.path) / cfg.data.train_folder_name;
      MT_CHECK(fs::is_directory(p), "data_config.datasets: folder ", p.string(),
               " does not exist (prepare it with meshtrain prepare-data --output ", ds.path, ")");
      src.files = list_shards(p.string());
    }
    sources.push_back(std::move(src));
  }
  return sources;
}

// Every dataset the run reads with its shard files, for the tokenizer check
// (data/data_tokenizer.h): the training data (data_dir or each blend member)
// and the validation data (data_dir).
std::vector<DatasetFiles> run_datasets(const Config& cfg) {
  if (cfg.data.format == "nanogpt" && cfg.data.datasets.empty())
    return {{cfg.data.data_dir, {nanogpt_file(cfg, "train.bin"), nanogpt_file(cfg, "val.bin")}, ShardFormat::kNanoGpt}};
  std::vector<DatasetFiles> out;
  if (cfg.data.datasets.empty()) {
    DatasetFiles d{cfg.data.data_dir, list_shards(data_folder(cfg, cfg.data.train_folder_name)), ShardFormat::kLlmc};
    for (auto& f : list_shards(data_folder(cfg, cfg.data.val_folder_name))) d.files.push_back(std::move(f));
    out.push_back(std::move(d));
    return out;
  }
  const auto sources = blend_sources(cfg);
  for (size_t i = 0; i < sources.size(); ++i)
    out.push_back({cfg.data.datasets[i].path, sources[i].files, sources[i].format});
  out.push_back({cfg.data.data_dir, list_shards(data_folder(cfg, cfg.data.val_folder_name)), ShardFormat::kLlmc});
  return out;
}

}  // namespace

Trainer::Trainer(const Config& cfg, Runtime& runtime, TrainOptions opts, const Communicator* world)
    : cfg_(cfg),
      runtime_(runtime),
      opts_(std::move(opts)),
      device_(pick_device(cfg, runtime, opts_)),
      test_hooks_(TestHooks::from_environment()) {
  std::unique_ptr<Communicator> own_world;
  if (!world) {
    own_world = runtime.world();
    world = own_world.get();
  }
  is_rank0_ = world->rank() == 0;
  validate(cfg_);
  validate_world(cfg_, world->size());
  // From here on every phase is watched: a hang in NCCL init or a checkpoint
  // load ends the job like a hang in a step.
  watchdog_ = opts_.watchdog;
  if (!watchdog_) {
    own_watchdog_ = std::make_unique<Watchdog>(cfg_.watchdog_seconds, world->rank(), world->size(),
                                               world->size() > 1 ? cfg_.run_dir() + "/heartbeats" : "");
    watchdog_ = own_watchdog_.get();
  }
  watchdog_->beat("start-up: mesh and communicators");
  at::set_num_threads(static_cast<int>(std::max<int64_t>(1, cfg_.torch_threads)));

  // Collectives are non-const only because they count their bytes; the
  // world given to the Trainer is read-only otherwise (its counters unused).
  check_gpu_per_rank(const_cast<Communicator&>(*world), cfg_, device_);

  MeshShape shape{static_cast<int>(cfg_.device.dp()), static_cast<int>(cfg_.device.pp()),
                  static_cast<int>(cfg_.device.tp()), static_cast<int>(cfg_.device.expert_parallel)};
  mesh_ = std::make_unique<Mesh>(*world, shape, pick_backend(cfg_, device_));
  if (mesh_->backend() == "nccl" && is_rank0_) spdlog::info("NCCL {} (library loaded at run time)", nccl_runtime_version());
  log_placement(*mesh_, runtime_, device_);

  // Data first: a missing folder should fail before the model is built.
  watchdog_->beat("start-up: data loaders");
  const int dp_rank = mesh_->coord().dp, dp = shape.dp;
  MT_CHECK(!opts_.meta || world->size() == 1, "the meta device models one rank; run it without mpirun (world ",
           world->size(), ")");
  if (!opts_.meta) {
    // Before any loader: a shard of another tokenizer is named, not read.
    data_tokenizer_ = check_data_tokenizer(run_datasets(cfg_));
    if (is_rank0_) {
      for (const auto& note : data_tokenizer_.notes) spdlog::info("note: {}", note);
      if (!data_tokenizer_.fingerprint.empty())
        spdlog::info("data: tokenizer {} ({})", data_tokenizer_.fingerprint, data_tokenizer_.where);
    }
  }
  if (opts_.meta) {
    // Synthetic batches (next_train_batch): no data folder is read.
  } else if (!cfg_.data.datasets.empty()) {
    train_loader_ = std::make_unique<DataLoader>(blend_sources(cfg_), cfg_.data.T, cfg_.data.train_batch_size,
                                                 dp_rank, dp, cfg_.model.vocab_size);
    val_loader_ = std::make_unique<DataLoader>(data_folder(cfg_, cfg_.data.val_folder_name), cfg_.data.T,
                                               cfg_.data.val_batch_size, dp_rank, dp, cfg_.model.vocab_size);
  } else if (cfg_.data.format == "nanogpt") {
    train_loader_ = std::make_unique<DataLoader>(std::vector<std::string>{nanogpt_file(cfg_, "train.bin")},
                                                 ShardFormat::kNanoGpt, cfg_.data.T, cfg_.data.train_batch_size,
                                                 dp_rank, dp, cfg_.model.vocab_size);
    val_loader_ = std::make_unique<DataLoader>(std::vector<std::string>{nanogpt_file(cfg_, "val.bin")},
                                               ShardFormat::kNanoGpt, cfg_.data.T, cfg_.data.val_batch_size, dp_rank,
                                               dp, cfg_.model.vocab_size);
  } else {
    train_loader_ = std::make_unique<DataLoader>(data_folder(cfg_, cfg_.data.train_folder_name), cfg_.data.T,
                                                 cfg_.data.train_batch_size, dp_rank, dp, cfg_.model.vocab_size);
    val_loader_ = std::make_unique<DataLoader>(data_folder(cfg_, cfg_.data.val_folder_name), cfg_.data.T,
                                               cfg_.data.val_batch_size, dp_rank, dp, cfg_.model.vocab_size);
  }
  // The next round's batch is read while this one trains (pinned on CUDA);
  // the loader's cursor stays that of the batches consumed (checkpoints).
  if (train_loader_) prefetcher_ = std::make_unique<BatchPrefetcher>(*train_loader_, device_.is_cuda());
  const fs::path tok = fs::path(cfg_.data.data_dir) / "tokenizer.json";
  if (!opts_.meta && fs::exists(tok)) {
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(tok.string()));
    MT_CHECK(tokenizer_->vocab_size() <= cfg_.model.vocab_size, "model_config.vocab_size=", cfg_.model.vocab_size,
             " is smaller than the tokenizer's vocabulary (", tokenizer_->vocab_size(), " in ", tok.string(), ")");
  }

  watchdog_->beat("start-up: building the model");
  torch::manual_seed(cfg_.seed);
  pm_ = build_parallel_model(cfg_, *mesh_, opts_.meta);
  pm_.model->to(device_);
  for (auto& p : pm_.params) p.tensor = pm_.model->named_parameters()[p.path];
  opt_ = make_optimizer(pm_, *mesh_, cfg_);

  const ParamCount pc = count_params(cfg_.model);
  spdlog::info("model: {} layers, d {}, {} heads, {} / {} | parameters: {:.3f}M total, {:.3f}M active per token",
               cfg_.model.n_layers(), cfg_.model.model_dimension, cfg_.model.n_head, cfg_.model.attention,
               cfg_.model.ffn, pc.total / 1e6, pc.active / 1e6);
  std::string stage_layers;
  for (const LayerSpan& c : pm_.range.chunks())
    stage_layers += (stage_layers.empty() ? "[" : " [") + std::to_string(c.first) + ", " + std::to_string(c.end) + ")";
  spdlog::info("mesh: dp {} x pp {} x tp {} on {} ({}), stage layers {}", shape.dp, shape.pp, shape.tp,
               device_.str(), mesh_->backend(), stage_layers);
  spdlog::info("precision: {}", pm_.model->precision().policy().describe());
  if (cfg_.zero_stage > 0 && cfg_.zero_stage_on(shape.dp) == 0)
    spdlog::info("zero_stage {}: nothing to shard with dp 1, runs as zero_stage 0", cfg_.zero_stage);

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
  watchdog_->beat("start-up done");
}

Trainer::~Trainer() = default;

StepStats Trainer::reduce_stats(const RoundSums& sums, double global_tokens, int64_t seq_len) {
  // One world-wide sum on the device, read later (StepStats::read): ce lives
  // on the last stage, aux on every stage; only tp rank 0 contributes so tp
  // replicas are not counted twice.
  const int64_t n_layers = cfg_.model.n_layers();
  const int64_t E = cfg_.model.ffn == "moe" ? cfg_.model.n_experts : 0;
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(device_);
  auto value = [&](const at::Tensor& t) { return t.defined() ? t.reshape({1}) : at::zeros({1}, opts); };
  std::vector<at::Tensor> parts = {value(sums.ce_sum), value(sums.aux_sum), value(sums.z_sum), value(sums.dropped),
                                   value(sums.assigned)};
  if (E > 0) {
    // expert_tokens has one entry per MoE layer of this stage, in order; with
    // moe_layers "last_in_block" those are not all of its layers. Layers this
    // stage does not own (or dense ones) stay zero.
    std::vector<int64_t> moe_layers;
    for (int64_t i : pm_.range.layers())
      if (is_moe_layer(cfg_.model, i)) moe_layers.push_back(i);
    MT_ASSERT(sums.expert_tokens.size() <= moe_layers.size(), "expert counts for ", sums.expert_tokens.size(),
              " layers but the stage has ", moe_layers.size(), " MoE layers");
    at::Tensor experts = at::zeros({n_layers * E}, opts);
    for (size_t l = 0; l < sums.expert_tokens.size(); ++l)
      if (sums.expert_tokens[l].defined()) experts.narrow(0, moe_layers[l] * E, E).copy_(sums.expert_tokens[l]);
    parts.push_back(experts);
  }
  at::Tensor t = at::cat(parts);
  // tp ranks hold the same statistics, so the sum over the mesh is the sum
  // over dp and pp; their communicators move device tensors (NCCL on GPU), so
  // the statistics never leave the device, and the tp traffic stays the model's.
  for (Communicator* c : {&mesh_->dp(), &mesh_->pp()})
    if (c->size() > 1) c->all_reduce(t);
  StepStats s;
  s.device = t;
  s.tokens = global_tokens;  // every token of the step reaches the loss on some rank
  s.seq_len = seq_len;
  s.n_layers = n_layers;
  s.n_experts = E;
  return s;
}

void StepStats::read() {
  if (read_done) return;
  read_done = true;
  std::vector<at::Tensor> parts = {device};
  if (grad_norm_t.defined()) parts.push_back(grad_norm_t.reshape({1}).to(at::kDouble));
  const at::Tensor host = at::cat(parts).cpu();  // the one device-to-host read of the step
  const auto a = host.accessor<double, 1>();
  loss = tokens > 0 ? a[0] / tokens : 0.0;
  const double sequences = seq_len > 0 ? tokens / static_cast<double>(seq_len) : 0.0;
  aux_loss = sequences > 0 ? a[1] / sequences : 0.0;
  z_loss = sequences > 0 ? a[2] / sequences : 0.0;
  dropped_fraction = a[4] > 0 ? a[3] / a[4] : 0.0;
  const int64_t base = 5, E = n_experts;
  expert_fraction.clear();
  for (int64_t l = 0; l < n_layers && E > 0; ++l) {
    std::vector<double> f(static_cast<size_t>(E));
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += a[base + l * E + e];
    if (total <= 0) continue;  // a dense layer
    for (int64_t e = 0; e < E; ++e) f[static_cast<size_t>(e)] = a[base + l * E + e] / total;
    expert_fraction.push_back(std::move(f));
  }
  if (grad_norm_t.defined()) grad_norm = a[host.size(0) - 1];
}

StepStats Trainer::train_step() {
  test_hooks_.before_step(step_ + 1, runtime_.rank());
  watchdog_->beat("train step " + std::to_string(step_ + 1));
  pm_.model->train();
  for (auto& p : pm_.params) p.tensor.mutable_grad() = at::Tensor();
  // Batch-size rampup and sequence-length warmup (optim/rampup.h) set this
  // step's shape; the loss stays the mean over the tokens actually trained on.
  const int64_t batch = global_batch_at(cfg_, consumed_samples_), T = seq_len_at(cfg_, step_);
  const double global_tokens = static_cast<double>(batch * cfg_.grad_step * T);
  const double global_seqs = static_cast<double>(batch * cfg_.grad_step);
  RoundSpec spec;
  spec.ce_scale = 1.0 / global_tokens;
  spec.aux_scale = cfg_.alpha / global_seqs;
  spec.z_scale = cfg_.model.router_z_loss / global_seqs;
  spec.backward_thread = opts_.backward_thread;
  RoundSums total;
  for (int64_t r = 0; r < cfg_.grad_step; ++r) {
    spec.final_round = r + 1 == cfg_.grad_step;  // gradients final: dp sum during backward (grad_buckets.h)
    Batch b = next_train_batch(batch, round_batch_at(cfg_, consumed_samples_, r + 1));
    // Shorter sequences are the first T tokens of each (DeepSpeed's seqlen
    // truncation); the pipeline takes its activation shape from inputs.size(1).
    const at::Tensor in = b.inputs.narrow(1, 0, T).contiguous(), tg = b.targets.narrow(1, 0, T).contiguous();
    RoundSums s;
    {
      CastScope casts(pm_.model->precision());  // the round's microbatches share the weights' bf16 casts
      s = run_round(pm_, *mesh_, cfg_, in.to(device_, /*non_blocking=*/true), tg.to(device_, true), spec);
    }
    total += s;
  }
  consumed_samples_ += batch * cfg_.grad_step;
  double wait = 0;
  if (mesh_->shape().pp > 1) {
    // The pipeline bubble as the stages see it: time blocked waiting for a
    // neighbour, on the rank that waited most.
    at::Tensor w = at::full({1}, total.wait_seconds, at::kDouble);
    mesh_->cpu_world().all_reduce(w, ReduceOp::Max);
    wait = w.item<double>();
  }
  // Under ZeRO-1 the dp sum is a reduce-scatter, done with the norm in apply_update().
  synchronize_gradients(pm_, *mesh_, /*dp=*/cfg_.zero_stage_on(mesh_->shape().dp) == 0);
  test_hooks_.after_backward(step_ + 1, pm_);
  StepStats stats = reduce_stats(total, global_tokens, T);
  stats.pipeline_wait_seconds = wait;
  stats.batch_size = batch;
  stats.seq_len = T;
  return stats;
}

Batch Trainer::next_train_batch(int64_t global_batch, int64_t following) {
  if (prefetcher_) return prefetcher_->next(global_batch, following);
  // Meta: token values never matter, only the shape of this rank's share.
  const int64_t local = global_batch / mesh_->shape().dp;
  const at::Tensor tokens = at::zeros({local, cfg_.data.T}, at::kLong);
  return {tokens, tokens};
}

double Trainer::evaluate() {
  if (cfg_.eval_steps == 0) return std::nan("");
  MT_CHECK(val_loader_, "evaluate() reads validation data, which the meta device has none of");
  pm_.model->eval();
  RoundSpec spec;
  spec.backward = false;
  double ce = 0, tokens = 0;
  const Cursor saved = val_loader_->cursor();
  val_loader_->restore(Cursor{});  // every evaluation reads the same batches
  try {
    for (int64_t i = 0; i < cfg_.eval_steps; ++i) {
      watchdog_->beat("evaluation batch " + std::to_string(i + 1));
      stop_point("evaluation");
      Batch b = val_loader_->next();
      CastScope casts(pm_.model->precision());
      RoundSums s = run_round(pm_, *mesh_, cfg_, b.inputs.to(device_), b.targets.to(device_), spec);
      ce += sum_value(s.ce_sum);
      tokens += s.tokens;
    }
  } catch (...) {
    // A stop throws out of the loop; the checkpoint saved next must hold the
    // training state, not the evaluation's.
    val_loader_->restore(saved);
    pm_.model->train();
    throw;
  }
  val_loader_->restore(saved);
  at::Tensor t = at::tensor({ce, tokens}, at::kDouble);
  if (mesh_->coord().tp != 0) t.zero_();
  mesh_->cpu_world().all_reduce(t);
  pm_.model->train();
  return t[1].item<double>() > 0 ? t[0].item<double>() / t[1].item<double>() : std::nan("");
}

std::string Trainer::sample() {
  if (!tokenizer_) {
    spdlog::warn("no tokenizer.json in {}: skipping the sample", cfg_.data.data_dir);
    return {};
  }
  if (cfg_.sequence_parallel && mesh_->shape().tp > 1) {
    spdlog::warn("sampling with sequence_parallel is not supported yet: skipping the sample");
    return {};
  }
  SampleOptions so;
  so.max_tokens = cfg_.inference.max_tokens;
  so.top_k = cfg_.inference.top_k;
  so.temperature = cfg_.inference.temperature;
  so.use_cache = cfg_.inference.use_cache;
  so.seed = cfg_.seed + static_cast<uint64_t>(step_);
  so.vocab_limit = tokenizer_->vocab_size();
  if (cfg_.inference.stop_at_eot) so.stop_token = tokenizer_->eot();
  so.check_stop = [this] {
    watchdog_->beat("sampling");
    stop_point("sampling");
  };
  std::vector<int32_t> prompt = tokenizer_->encode(cfg_.inference.prompt);
  if (prompt.empty()) prompt.push_back(tokenizer_->eot());
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(cfg_.inference.batch_size), prompt);
  std::vector<std::vector<int32_t>> out;
  CastScope casts(pm_.model->precision());
  try {
    if (mesh_->shape().pp == 1) {
      out = generate(*pm_.model, prompts, so);
    } else {
      pm_.model->eval();
      out = generate(cfg_.model, device_, pipeline_forward(pm_, *mesh_), pipeline_share(pm_, *mesh_), prompts, so);
    }
  } catch (const NonFiniteLogits& e) {
    pm_.model->train();
    throw NonFiniteLogits(std::string(e.what()) + ": the weights of " + weights_source() +
                          " hold NaN or inf (a diverged run? evaluate it, or sample an earlier checkpoint)");
  } catch (...) {
    pm_.model->train();  // a stop throws out of the sampling loop
    throw;
  }
  pm_.model->train();
  // The caller shows it: train() in its log, `generate` once on stdout.
  return cfg_.inference.prompt + tokenizer_->decode_text(out.at(0));
}

std::string Trainer::weights_source() const {
  if (train_start_step_ >= 0 && step_ > train_start_step_) {
    char name[32];
    std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step_));
    return "the model trained to step " + std::to_string(step_) + " (checkpoint " + cfg_.run_dir() +
           "/checkpoints/" + name + ")";
  }
  return weights_from_.empty() ? std::string("the untrained model (--random_weights)") : "checkpoint " + weights_from_;
}

void Trainer::warn_starved_experts(const StepStats& s) {
  // Router collapse shows as experts that receive no token step after step.
  constexpr int64_t kPatience = 50;
  size_t n = 0;
  for (const auto& layer : s.expert_fraction) n += layer.size();
  starved_steps_.resize(n, 0);
  size_t i = 0;
  for (size_t l = 0; l < s.expert_fraction.size(); ++l)
    for (size_t e = 0; e < s.expert_fraction[l].size(); ++e, ++i) {
      starved_steps_[i] = s.expert_fraction[l][e] > 0 ? 0 : starved_steps_[i] + 1;
      if (starved_steps_[i] > 0 && starved_steps_[i] % kPatience == 0)
        spdlog::warn("MoE layer {} expert {} got no tokens for {} steps (router collapse?)", l, e, starved_steps_[i]);
    }
}

void Trainer::log_step(const StepStats& s, double lr, double grad_norm, double seconds) {
  nlohmann::json row;
  row["step"] = step_;
  row["loss"] = s.loss;
  row["lr"] = lr;
  row["grad_norm"] = grad_norm;
  row["tokens_per_sec"] = seconds > 0 ? s.tokens / seconds : 0.0;
  if (mesh_->shape().pp > 1 && seconds > 0) row["pipeline_bubble"] = s.pipeline_wait_seconds / seconds;
  if (!cfg_.rampup_batch_size.empty()) row["batch_size"] = s.batch_size;
  if (cfg_.seq_len_warmup.total_curriculum_step > 0) row["seq_len"] = s.seq_len;
  if (cfg_.model.ffn == "moe") {
    row["aux_loss"] = s.aux_loss;
    row["loss_cross"] = s.loss;
    row["dropped_fraction"] = s.dropped_fraction;
    if (cfg_.model.router_z_loss > 0) row["z_loss"] = s.z_loss;
    row["expert_load"] = s.expert_fraction;
    // MaxVio (DeepSeek's balance metric): max load / mean load - 1 per MoE layer.
    std::vector<double> max_vio;
    for (const auto& f : s.expert_fraction)
      if (!f.empty()) max_vio.push_back(*std::max_element(f.begin(), f.end()) * static_cast<double>(f.size()) - 1.0);
    row["max_vio"] = max_vio;
    warn_starved_experts(s);
  }
  metrics_->log(row);
  if (!opts_.quiet && (step_ % std::max<int64_t>(1, cfg_.log_every) == 0 || step_ == cfg_.training_steps))
    spdlog::info("{}{}", format_step_line(row), progress_suffix());
}

int Trainer::stop_agreed() {
  // Every rank must stop at the same point, so the signal of any rank (a
  // signal may reach only some of them) is shared before acting on it.
  at::Tensor sig = at::full({1}, static_cast<int64_t>(stop_requested()), at::kLong);
  mesh_->cpu_world().all_reduce(sig, ReduceOp::Max);
  return static_cast<int>(sig.item<int64_t>());
}

void Trainer::stop_point(const std::string& during) {
  if (const int sig = stop_agreed()) throw Stopped(sig, during);
}

void Trainer::apply_update(StepStats& s, double lr) {
  at::NoGradGuard ng;
  const at::Tensor norm = opt_->reduce_gradients();
  s.grad_norm_t = norm;
  // Everything below stays on the device. A non-finite loss or norm skips
  // the update there (found_inf); nan_policy acts when the step is read.
  const at::Tensor ce = s.device.narrow(0, 0, 1).squeeze(0);
  const at::Tensor found_inf = at::logical_not(at::isfinite(ce) & at::isfinite(norm)).to(at::kFloat);
  at::Tensor grad_scale;
  if (cfg_.grad_clip_norm > 0) {
    // Clip only above the threshold, as min(1, c / (norm + 1e-6)) would not:
    // the gradients are divided by (norm + 1e-6) / c inside the fused update.
    const at::Tensor clip = at::full({}, cfg_.grad_clip_norm, norm.options());
    grad_scale = at::where(norm > clip, (norm + 1e-6) / clip, at::ones_like(norm)).to(at::kFloat);
  }
  opt_->step(lr, found_inf, grad_scale);
}

void Trainer::read_step(StepStats& s) {
  s.read();
  if (std::isfinite(s.loss) && std::isfinite(s.grad_norm)) {
    nan_skips_in_a_row_ = 0;
    return;
  }
  // The update was skipped on the device (found_inf); step_ + 1: the number
  // this step gets in the log and metrics.jsonl.
  MT_CHECK(cfg_.nan_policy != "stop", "non-finite loss or gradient at step ", step_ + 1, " (loss ", s.loss,
           ", grad norm ", s.grad_norm, "); nan_policy is \"stop\"");
  ++nan_skips_in_a_row_;
  spdlog::warn("step {}: non-finite loss ({}) or grad norm ({}): update skipped (nan_policy skip, {} of at most {} "
               "in a row)", step_ + 1, s.loss, s.grad_norm, nan_skips_in_a_row_, cfg_.max_nan_skips);
  // Skipping forever would burn the run's budget on a diverged model and exit 0.
  MT_CHECK(nan_skips_in_a_row_ < cfg_.max_nan_skips, "nan_policy skip: steps ", step_ + 2 - nan_skips_in_a_row_,
           " to ", step_ + 1, " (", nan_skips_in_a_row_, " in a row, max_nan_skips) all had a non-finite loss or ",
           "gradient; giving up. The checkpoints saved so far are untouched; lower lr.max_lr or resume from an ",
           "earlier checkpoint");
}

std::string Trainer::progress_suffix() const {
  // The ETA only helps a person watching a terminal; logs and pipes skip it.
  if (!Progress::stderr_is_terminal() || train_start_step_ < 0) return {};
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start_).count();
  return ", " + Progress(train_start_step_, cfg_.training_steps).eta(step_, elapsed);
}

void Trainer::open_run_dir() {
  if (metrics_) return;
  // Rank 0 writes the run dir; the others learn whether it could lock it.
  std::string error;
  if (is_rank0_) {
    try {
      run_lock_ = std::make_unique<RunLock>(cfg_.run_dir());
      // Found now, not at the first save after hours of training.
      require_writable_folder(cfg_.run_dir() + "/checkpoints", "checkpoint folder");
      require_writable_folder(cfg_.run_dir() + "/tb", "TensorBoard folder");
      const std::string metrics = cfg_.run_dir() + "/metrics.jsonl", kind = non_regular_kind(metrics);
      MT_CHECK(kind.empty() || kind == "missing", "the metrics file ", metrics, " is ", kind,
               ", not a regular file; move it away or choose another output_dir / name");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  at::Tensor failed = at::full({1}, static_cast<int64_t>(!error.empty()), at::kLong);
  mesh_->cpu_world().all_reduce(failed, ReduceOp::Max);
  MT_CHECK(failed.item<int64_t>() == 0, is_rank0_ ? error : "rank 0 could not lock the run dir " + cfg_.run_dir());
  // Only after the lock: opening repairs metrics.jsonl, which must not race another run.
  // One row per step: rows an earlier attempt logged after the step resumed
  // from are dropped, and --fresh sets the old file aside.
  metrics_ = std::make_unique<MetricsLogger>(cfg_.run_dir(), is_rank0_, /*tensorboard=*/true,
                                             MetricsStart{step_, opts_.fresh});
}

double Trainer::train() {
  open_run_dir();
  const int64_t total = cfg_.training_steps;
  train_start_ = std::chrono::steady_clock::now();
  train_start_step_ = step_;
  Watchdog& watchdog = *watchdog_;
  if (step_ >= total) {
    spdlog::info("run {} is already at step {} of {}: nothing to train", cfg_.run_dir(), step_, total);
    return losses_.empty() ? std::nan("") : losses_.back();
  }
  spdlog::info("training {} -> {} steps, {} tokens per step, run dir {}", step_, total,
               cfg_.data.train_batch_size * cfg_.grad_step * cfg_.data.T, cfg_.run_dir());
  double last = std::nan("");
  if (const int sig = stop_agreed()) {
    spdlog::warn("stop requested (signal {}) before the first step: nothing trained, nothing to save", sig);
    return last;
  }
  while (step_ < total) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(cfg_.lr, step_);
    StepStats s = train_step();
    apply_update(s, lr);
    test_hooks_.after_update(step_ + 1, pm_);
    read_step(s);  // the step's one host read: every step is logged (metrics.jsonl)
    update_score_bias(s);
    const double norm = s.grad_norm;
    ++step_;
    last = s.loss;
    losses_.push_back(s.loss);
    grad_norms_.push_back(norm);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_step(s, lr, norm, secs);
    int stop = stop_agreed();
    const bool boundary = step_ % cfg_.checkpoint_steps == 0 || step_ == total;
    // A stop skips what is left to do but the save, so it is prompt and loses no step.
    if (boundary && !stop) {
      watchdog.beat("evaluation at step " + std::to_string(step_));
      try {
        const double val = evaluate();
        if (std::isfinite(val)) {
          nlohmann::json row = {{"step", step_}, {"val_loss", val}};
          metrics_->log(row);
          spdlog::info("Step {}, Loss: {:.4f}, Eval Loss: {:.4f}", step_, s.loss, val);
        }
      } catch (const Stopped& e) {
        stop = e.signal_number();
        spdlog::warn("{}: the evaluation of step {} is dropped", e.what(), step_);
      }
    }
    if (boundary || stop) {
      watchdog.beat("saving the checkpoint of step " + std::to_string(step_));
      save_checkpoint();
    }
    if (stop) {
      spdlog::warn("stop requested (signal {}): step {} saved, exiting", stop, step_);
      break;
    }
    if (boundary && (cfg_.sample_every == 0 ? step_ == total : step_ % cfg_.sample_every == 0)) {
      watchdog.beat("sampling at step " + std::to_string(step_));
      try {
        const std::string text = sample();
        if (!text.empty()) spdlog::info("sample: {}", text);
      } catch (const Stopped& e) {
        spdlog::warn("{}: step {} is saved, exiting", e.what(), step_);
        break;
      } catch (const NonFiniteLogits& e) {
        // Every rank sees the same logits, so all warn alike: the sample is
        // a report on the run, and the training itself succeeded.
        spdlog::warn("the sample at step {} failed (training is unaffected; the checkpoint is saved): {}", step_,
                     e.what());
      }
    }
  }
  return last;
}

}  // namespace meshtrain
