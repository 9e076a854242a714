#pragma once
// The run's configuration: plain structs in the Jaxformer layout (docs/ARCHITECTURE.md,
// "Config"). No tensors here. load.h fills them from JSON + CLI overrides;
// validate() rejects impossible combinations before any work, naming the key.
// Keys with a fixed set of values are enums (choices.h), parsed as the file is
// read, so no code outside config/ checks or compares their spelling.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/choices.h"

namespace meshtrain {

struct ModelConfig {
  int64_t model_dimension = 64;
  int64_t vocab_size = 512;
  int64_t n_head = 4;
  int64_t blocks = 1;            // the model has blocks * layers_per_block layers
  int64_t layers_per_block = 2;
  int64_t T = 32;                // context length; must equal data_config.T
  int64_t latent_dim = 0;        // MLA: shared down-projection width
  int64_t dhR = 0;               // MLA: decoupled rope dims per head (0: no rope in MLA)
  double dropout_rate = 0.0;
  ModelDtype model_dtype = ModelDtype::Float32;  // float32 | bfloat16 (one policy on every device: model/mixed_precision.h)
  // none | tensorwise | rowwise | blockwise: FP8 GEMMs in the linear layers (needs bfloat16; model/fp8_linear.h)
  Fp8Recipe fp8_recipe = Fp8Recipe::None;
  int64_t k = 2;                 // MoE: experts per token
  int64_t n_experts = 0;         // MoE: routed experts
  int64_t n_shared = 0;          // MoE: always-on shared experts
  double capacity_factor = 1.25; // MoE: tokens per expert <= cf * tokens * k / n_experts; 0: dropless
  AttentionKind attention = AttentionKind::Mha;  // mha | mla
  FfnKind ffn = FfnKind::Dense;                  // dense | moe
  bool tie_embeddings = true;
  int64_t mlp_hidden = 0;        // 0: 4 * model_dimension (dense); expert hidden for MoE
  RouterScore router_score = RouterScore::Softmax;  // softmax | sigmoid
  double router_z_loss = 0.0;
  double rope_theta = 10000.0;
  bool mla_last_layer_no_rope = true;    // Jaxformer: dhR = 0 in each block's last layer
  double init_std = 0.02;
  // Jaxformer's architecture (docs/JAXFORMER.md). "jaxformer" fills the keys
  // below (and attention/ffn/router_score) with Jaxformer's values where the
  // file does not set them; "auto" picks it for a file in Jaxformer's own
  // layout (latent_dim given, no attention/ffn key), "meshtrain" otherwise.
  Architecture architecture = Architecture::Auto;  // auto | meshtrain | jaxformer (a Jaxformer-layout file reads
                                                   // as jaxformer)
  bool linear_bias = false;             // every linear layer (not the head) adds a bias
  bool norm_bias = false;               // RMSNorms add a bias after the gain
  // split: q rope from the query latent, k rope from x (DeepSeek-V2);
  // joint_latent: both from [c_kv, c_q] (Jaxformer)
  MlaRopeInput mla_rope_input = MlaRopeInput::Split;
  MoeLayers moe_layers = MoeLayers::All;  // all | last_in_block (Jaxformer: one MoE layer per block)
  // mlp: n_shared GELU MLPs; linear: one d -> n_shared*d linear whose n_shared
  // chunks are summed (Jaxformer); linear_discarded: its parameters exist but
  // its output is dropped (Jaxformer's code)
  SharedExpert shared_expert = SharedExpert::Mlp;
  // model | layers (Jaxformer: the layer stack only, no embedding table, head or final norm)
  ActiveParamsScope active_params_scope = ActiveParamsScope::Model;

  // Options that make Llama / DeepSeek-V3 checkpoints expressible exactly
  // (hf/); the defaults keep the Jaxformer model.
  // gelu (tanh) | swiglu (silu(w_gate x) * w_in x), dense MLP and experts
  MlpActivation mlp_activation = MlpActivation::Gelu;
  int64_t n_kv_head = 0;                 // MHA key/value heads (grouped-query attention); 0: n_head
  bool mla_latent_norm = false;          // MLA: RMSNorm on the q and kv latents (DeepSeek-V3)
  bool router_bias = false;              // MoE: per-expert score bias added for top-k selection only
  double router_bias_update_rate = 0.0;  // MoE: after each step bias_e += rate * sign(mean load - load_e) (V3's gamma)
  double routed_scaling_factor = 1.0;    // MoE: routed experts' gates are scaled by this
  int64_t n_group = 1;                   // MoE: experts form n_group groups; tokens pick from topk_group of them
  int64_t topk_group = 1;
  int64_t first_k_dense = 0;             // MoE: the first k layers use a dense MLP
  int64_t dense_mlp_hidden = 0;          // hidden units of an MoE model's dense layers; 0: as the experts
  // DeepSeek-V3's multi-token prediction (model/mtp.h): mtp_depth chained
  // modules after the last layer, their losses weighted lambda / depth.
  int64_t mtp_depth = 0;
  double mtp_loss_weight = 0.3;

  int64_t n_layers() const { return blocks * layers_per_block; }
  int64_t head_dim() const { return model_dimension / n_head; }
  int64_t hidden_dim() const { return mlp_hidden > 0 ? mlp_hidden : 4 * model_dimension; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  bool gated_mlp() const { return is_gated(mlp_activation); }  // w_gate exists (config/choices.h)
  // Hidden units of the dense MLP (an MoE model's dense layers: dense_mlp_hidden when set).
  int64_t dense_hidden_dim() const { return ffn == FfnKind::Moe && dense_mlp_hidden > 0 ? dense_mlp_hidden : hidden_dim(); }
};

// One entry of data_config.datasets (Megatron's blended datasets): a
// prepare-data output folder and its share of the training sequences.
struct DatasetWeight {
  std::string path;
  double weight = 1.0;
  bool operator==(const DatasetWeight& o) const { return path == o.path && weight == o.weight; }
};

struct DataConfig {
  std::string data_dir = "data/fortunes";
  std::string train_folder_name = "train";
  std::string val_folder_name = "val";
  // "llmc": shard folders (llm.c headers, .npy); "nanogpt": nanoGPT's
  // headerless uint16 data_dir/train.bin and data_dir/val.bin.
  DataFormat format = DataFormat::Llmc;
  // Non-empty: training sequences are drawn from these folders in proportion
  // to their weights (each with train_folder_name inside); validation reads
  // data_dir as usual.
  std::vector<DatasetWeight> datasets;
  int64_t T = 32;
  int64_t train_batch_size = 8;  // sequences per accumulation round, over all dp ranks
  int64_t val_batch_size = 8;
  int64_t micro_batch_size = 0;  // pipeline microbatch; 0: the whole dp share
  // Packed sequences: attention only within a document (a document ends
  // with the end-of-text token) and rope positions restarting at each
  // (Megatron's --reset-attention-mask --reset-position-ids).
  bool document_masking = false;
  // The end-of-text token id; -1: the data's (manifest.json "eot", else its tokenizer.json).
  int64_t eot_token = -1;
};

struct LrConfig {
  double max_lr = 1e-3;
  double min_lr = 0.0;        // lr at step 0 (start of warmup)
  double end_lr = 1e-4;       // lr after the cosine decay
  int64_t warmup_steps = 10;
  int64_t end_steps = 100;    // total schedule length, warmup included (optax decay_steps)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

struct DeviceConfig {
  std::array<int64_t, 3> n_device_axis{1, 1, 1};  // dp, pp, tp
  DeviceChoice device = DeviceChoice::Auto;       // auto | cpu | cuda
  // auto | nccl | mpi: how ranks exchange tensors. auto = NCCL for CUDA, MPI
  // for CPU; mpi on CUDA stages tensors through pinned host memory, so several
  // ranks can share one GPU (NCCL refuses that).
  CollectivesChoice collectives = CollectivesChoice::Auto;
  // Routed MoE experts split over this many ranks of the dp group (divides dp);
  // tokens reach them by all-to-all (parallel/expert_parallel.h).
  int64_t expert_parallel = 1;
  // Context parallelism: each sequence split over this many ranks (a fourth
  // mesh axis, world = dp * pp * tp * cp), parallel/context_parallel.h.
  int64_t context_parallel = 1;
  int64_t cp() const { return context_parallel; }
  // Which attention kernels CUDA's sdpa may use: auto = torch's choice
  // (cuDNN's on an H200), or the one named (model/attention.h,
  // prefer_attention_backend).
  AttentionBackend attention_backend = AttentionBackend::Auto;
  // The whole training step (every round's forward and backward, the
  // gradient norm, clipping, AdamW) captured once as a CUDA graph and
  // replayed (train/step_graph.h): no launch gaps, no host time per kernel.
  // One rank, static shapes; what cannot be captured is refused at start-up
  // (validate.cpp). On the CPU the step is checked for graph safety instead.
  bool cuda_graphs = false;
  int64_t dp() const { return n_device_axis[0]; }
  int64_t pp() const { return n_device_axis[1]; }
  int64_t tp() const { return n_device_axis[2]; }
  int64_t world() const { return dp() * pp() * tp() * cp(); }
};

struct InferenceConfig {
  std::string prompt = "hello world";
  int64_t batch_size = 1;
  int64_t top_k = 50;
  double temperature = 1.0;
  int64_t max_tokens = 32;
  bool use_cache = true;
  // A sample ends at the tokenizer's end-of-text token, as a document does in
  // the training data; false keeps sampling max_tokens into the next "document".
  bool stop_at_eot = true;
  // With stop_at_eot: end-of-text is not drawn for the first min_tokens new
  // tokens (Hugging Face's min_new_tokens), so a sample shows text.
  int64_t min_tokens = 0;
  int64_t n_devices = 1;
  // Self-speculative decoding with the model's multi-token prediction modules
  // (sampling/speculative.h), greedy or sampled: needs mtp_depth >= 1.
  bool speculative = false;
};

// DeepSpeed curriculum learning ("fixed_linear" on seqlen), see optim/rampup.h.
struct SeqLenWarmupConfig {
  int64_t min_difficulty = 0;         // sequence length at step 0
  int64_t difficulty_step = 8;        // lengths are multiples of this (tensor-core friendly)
  int64_t total_curriculum_step = 0;  // steps until data_config.T; 0: off
};

struct Config {
  ModelConfig model;
  DataConfig data;
  LrConfig lr;
  DeviceConfig device;
  InferenceConfig inference;
  SeqLenWarmupConfig seq_len_warmup;

  std::string output_dir = "runs";
  std::string name = "run";
  int64_t training_steps = 100;
  int64_t grad_step = 1;          // gradient accumulation rounds per optimizer step
  double alpha = 0.0;             // MoE aux-loss weight
  int64_t checkpoint_steps = 50;  // evaluate + checkpoint every N steps
  int64_t eval_steps = 4;         // validation batches per evaluation
  uint64_t seed = 0;
  double grad_clip_norm = 1.0;    // 0: no clipping

  // meshtrain extensions (not in Jaxformer's file)
  PipelineSchedule pipeline_schedule = PipelineSchedule::OneFOneB;  // gpipe | 1f1b | interleaved
  int64_t virtual_stages = 1;                  // interleaved: chunks of layers per pp rank (Megatron's v)
  std::vector<double> pipeline_pass_costs;     // zb-h1 / zbv: [forward, B, W] lengths; empty: from FLOPs
  bool sequence_parallel = false;
  int64_t zero_stage = 0;                      // 1: AdamW moments sharded over dp
  bool fsdp_keep_gathered = false;             // zero_stage 2/3: layers stay gathered, gradients whole, over a step
  bool overlap_grad_reduce = true;             // zero_stage 0: dp all-reduce in buckets during backward
  ModelDtype optimizer_state_dtype = ModelDtype::Float32;  // AdamW moments: float32 | bfloat16 (fp32 math)
  bool optimizer_writes_casts = true;          // bf16 model, zero_stage 0: AdamW writes the weights' bf16 casts
  double grad_bucket_mb = 25;                  // bucket size of that all-reduce, MiB
  std::vector<int64_t> rampup_batch_size;      // [start, increment, samples] (Megatron); empty: off
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::None;  // none | full | selective
  int64_t max_to_keep = 3;
  NanPolicy nan_policy = NanPolicy::Skip;      // skip | stop
  int64_t max_nan_skips = 10;                  // nan_policy skip: give up after this many skips in a row
  int64_t stop_check_steps = 1;                // agree on a stop request every N steps (and at every checkpoint)
  int64_t log_every = 1;
  int64_t sample_every = 0;                    // print a sample every N steps (0: at the end only)
  int64_t torch_threads = 1;                   // intra-op threads per rank on CPU
  double watchdog_seconds = 600;               // abort when a step makes no progress this long (0: off)
  bool async_checkpoint = false;               // write checkpoints on a background thread (ckpt/background_save.h)
  int64_t flight_recorder_size = 2048;         // collectives each rank remembers (core/flight_recorder.h; 0: off)
  double straggler_threshold = 0.2;            // name the slowest rank when its step is this much above the median

  // Where the run lives: output_dir/name.
  std::string run_dir() const;
  // zero_stage as it runs on dp ranks: with one dp rank there is nothing to shard, and
  // ZeRO/FSDP would only add copies (a layer's gather and release per
  // microbatch), so the stage-0 step runs: the same math, the same memory.
  int64_t zero_stage_on(int64_t dp) const { return dp > 1 ? zero_stage : 0; }
};

}  // namespace meshtrain
