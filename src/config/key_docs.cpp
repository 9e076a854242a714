// One description per config key, written from config.h, choices.h and
// validate.cpp: what the key means, its unit, the values validate() accepts
// and what the default stands for. The type, the default value, the allowed
// names of a choice and what a resume does are not repeated here: the
// reference (reference.cpp) takes them from the code. A key added to
// schema.h without a line here fails unit.config_test.
#include <algorithm>

#include "meshtrain/config/reference.h"

namespace meshtrain {

namespace {

const std::vector<KeyDoc> kModel = {
    {"model_config.model_dimension", "Width d of the residual stream. At least 1, divisible by n_head, and d / n_head "
                                     "(the head size) must be even: RoPE rotates pairs."},
    {"model_config.vocab_size", "Rows of the embedding table and columns of the LM head; every token id of the data "
                                "must be below it. At most 2^31 (ids are 32-bit). A table padded past the tokenizer "
                                "(GPT-2's 50304) never samples the padding ids."},
    {"model_config.n_head", "Attention heads (query heads under grouped-query attention). Divides model_dimension and "
                            "must be divisible by tp."},
    {"model_config.blocks", "The model has blocks x layers_per_block layers. The grouping matters only to "
                            "moe_layers last_in_block and mla_last_layer_no_rope (the last layer of each block)."},
    {"model_config.layers_per_block", "Layers per block (see blocks). pp must not exceed the layer count, and "
                                      "pipeline_schedule interleaved needs the layer count to be a multiple of pp x "
                                      "virtual_stages (zbv: of 2 x pp)."},
    {"model_config.T", "Context length in tokens: the positions the model is trained at. Must equal data_config.T."},
    {"model_config.latent_dim", "MLA: width of the shared query and key/value latents (the down-projections of x). "
                                "Must be above 0 with attention mla; unused otherwise."},
    {"model_config.dhR", "MLA: decoupled RoPE dimensions per head (DeepSeek's rope key and queries); 0 means no rope in "
                         "MLA. Even."},
    {"model_config.dropout_rate", "Dropout probability on attention and the residual stream, in [0, 1). Parity between "
                                  "meshes is exact only at 0 (masks are drawn per tp rank)."},
    {"model_config.model_dtype", "Precision policy on every device: float32 computes in fp32; bfloat16 keeps fp32 master "
                                 "weights, gradients and optimizer state and runs matmuls, attention and activations in "
                                 "bf16 (norm statistics, softmax and the router in fp32)."},
    {"model_config.fp8_recipe", "FP8 GEMMs in the linear layers (attention and MLA projections, the MLP, shared and "
                                "routed experts; forward and both backward GEMMs), on top of model_dtype bfloat16: none; "
                                "tensorwise (one just-in-time scale per tensor, e4m3 forward operands, e5m2 gradients); "
                                "rowwise (a scale per row of each operand, e4m3); blockwise (DeepSeek-V3: activations and "
                                "gradients in 1x128 tiles, weights in 128x128 blocks, e4m3). The embedding, LM head, "
                                "router, norms and loss stay bf16/fp32, as do master weights, gradients and optimizer "
                                "state, so a resume may switch recipes. Blockwise needs every dim tp splits to be whole "
                                "128-wide tiles per rank and no context_parallel (docs/precision.md)."},
    {"model_config.k", "MoE: experts each token is routed to (top-k), in [1, n_experts]."},
    {"model_config.n_experts", "MoE: routed experts per MoE layer; at least 1 with ffn moe. Divisible by n_group and by "
                               "device_config.expert_parallel."},
    {"model_config.n_shared", "MoE: always-on shared experts added to the routed ones (their form: shared_expert). At "
                              "least 0."},
    {"model_config.capacity_factor", "MoE: each expert takes at most ceil(capacity_factor x T x k / n_experts) "
                                     "assignments per sequence, the rest are dropped; 0 is dropless (no token dropped, "
                                     "grouped GEMMs over per-expert counts). At least 0."},
    {"model_config.attention", "mha: multi-head attention (grouped-query with n_kv_head); mla: DeepSeek's Multi-head "
                               "Latent Attention (latent_dim, dhR)."},
    {"model_config.ffn", "dense: one MLP per layer; moe: a Mixture-of-Experts layer (n_experts, k, n_shared), in the "
                         "layers moe_layers and first_k_dense select."},
    {"model_config.tie_embeddings", "The LM head reads the embedding table (one parameter); false gives the head a "
                                    "weight of its own."},
    {"model_config.mlp_hidden", "Hidden units of the dense MLP, or of each expert in an MoE model; 0 means 4 x "
                                "model_dimension. Must be divisible by tp."},
    {"model_config.router_score", "MoE router scores: softmax over the experts, or an independent sigmoid per expert "
                                  "(Jaxformer, DeepSeek-V3); the k gates are renormalised over the chosen experts."},
    {"model_config.router_z_loss", "Weight of the router z-loss (mean squared logsumexp of the router logits) added "
                                   "to the loss; 0 turns it off. At least 0."},
    {"model_config.rope_theta", "RoPE base frequency (500000 for Llama 3). Above 0."},
    {"model_config.mla_last_layer_no_rope", "MLA: the last layer of each block has no rope (Jaxformer's dhR = 0 "
                                            "there)."},
    {"model_config.init_std", "Standard deviation of the normal initialisation of the weights. Above 0."},
    {"model_config.mlp_activation", "Activation of the dense MLP and the experts: gelu (tanh approximation) or swiglu "
                                    "(silu(w_gate x) * w_in x, a third projection). swiglu refuses linear_bias."},
    {"model_config.n_kv_head", "Key/value heads for grouped-query attention (mha only); 0 means n_head. n_head must be "
                               "a multiple of it, and it and tp must divide one another."},
    {"model_config.mla_latent_norm", "MLA: RMSNorm on the query and key/value latents (DeepSeek-V3's q_a_layernorm and "
                                     "kv_a_layernorm). Needs attention mla and mla_rope_input split."},
    {"model_config.router_bias", "MoE: a per-expert score bias used for top-k selection only, without a gradient "
                                 "(DeepSeek-V3's e_score_correction_bias)."},
    {"model_config.router_bias_update_rate", "MoE, auxiliary-loss-free balancing: after each step bias_e += rate x "
                                             "sign(mean load - load_e), from the loads summed over the whole mesh. At "
                                             "least 0; above 0 needs router_bias."},
    {"model_config.routed_scaling_factor", "MoE: the routed experts' gates (normalised over the k) are multiplied by "
                                           "this. Above 0; only 1 without ffn moe."},
    {"model_config.n_group", "MoE group-limited routing: the experts form n_group groups and a token picks only from "
                             "the topk_group groups whose two best scores sum highest. Divides n_experts, at least 2 "
                             "experts a group when above 1."},
    {"model_config.topk_group", "MoE: groups a token may pick experts from (see n_group), in [1, n_group]; k must not "
                                "exceed the experts in topk_group groups."},
    {"model_config.first_k_dense", "MoE models: the first k layers have a dense MLP (of dense_mlp_hidden units) instead "
                                   "of experts. At most the layer count; 0 without ffn moe."},
    {"model_config.dense_mlp_hidden", "Hidden units of an MoE model's dense layers (first_k_dense, and the dense "
                                      "layers moe_layers last_in_block leaves); 0 means the experts' mlp_hidden."},
    {"model_config.architecture", "Which defaults fill the architecture keys a file leaves out: jaxformer fills in "
                                  "Jaxformer's model (MLA, MoE in the last layer of each block, biases, sigmoid "
                                  "router, ...); auto picks jaxformer for a file in Jaxformer's layout (latent_dim "
                                  "given, no attention or ffn key), meshtrain otherwise."},
    {"model_config.linear_bias", "Every linear layer but the head adds a zero-initialised bias (Jaxformer). Refused "
                                 "with a gated mlp_activation."},
    {"model_config.norm_bias", "Every RMSNorm adds a bias after its gain (Jaxformer)."},
    {"model_config.mla_rope_input", "MLA: split takes the query rope from the query latent and the key rope from x "
                                    "(DeepSeek); joint_latent takes both from the joint latent [c_kv, c_q] "
                                    "(Jaxformer)."},
    {"model_config.moe_layers", "MoE: which layers have experts: all of them, or the last layer of each block "
                                "(Jaxformer), the others a dense MLP."},
    {"model_config.shared_expert", "MoE shared experts: mlp is n_shared MLPs; linear one replicated d -> n_shared x d "
                                   "projection whose chunks are summed; linear_discarded keeps its parameters but "
                                   "drops its output, as Jaxformer's code does."},
    {"model_config.active_params_scope", "What the active-parameter count covers: the whole model, or only the layer "
                                         "stack (Jaxformer: no embedding, head or final norm)."},
    {"model_config.mtp_depth", "DeepSeek-V3's multi-token prediction: D chained modules after the last layer; module k "
                             "predicts the token k + 1 ahead from module k - 1's hidden state and the embedding of the "
                             "token k ahead, through the shared head (docs/models.md). 0 turns it off; at least 0. "
                             "Under pp the last stage holds a copy of the embedding for them."},
    {"model_config.mtp_loss_weight", "lambda of multi-token prediction: the loss is the main loss + lambda / mtp_depth x "
                                     "the sum of the modules' losses. In [0, 10]."},
};

const std::vector<KeyDoc> kData = {
    {"data_config.data_dir", "The prepare-data output folder: train and validation shards, tokenizer.json and "
                             "manifest.json (validation always reads it, also under a blend). No control characters."},
    {"data_config.train_folder_name", "Folder of the training shards inside data_dir (and inside each blended "
                                      "dataset). Not empty."},
    {"data_config.val_folder_name", "Folder of the validation shards inside data_dir. Not empty."},
    {"data_config.format", "llmc: shard folders (llm.c's uint16 and uint32 headers, .npy token arrays); nanogpt: "
                           "nanoGPT's headerless uint16 data_dir/train.bin and data_dir/val.bin."},
    {"data_config.datasets", "A blend (Megatron's blended datasets): training sequences drawn from these prepare-data "
                             "folders in proportion to their weights (each above 0), all made by one tokenizer. "
                             "Empty: data_dir alone."},
    {"data_config.T", "Tokens per training sequence; must equal model_config.T and, under context parallelism, be "
                      "divisible by 2 x context_parallel (x tp with sequence_parallel)."},
    {"data_config.train_batch_size", "Sequences per accumulation round over all dp ranks (a step takes grad_step "
                                     "rounds). Divisible by dp."},
    {"data_config.val_batch_size", "Sequences per validation batch over all dp ranks. Divisible by dp."},
    {"data_config.micro_batch_size", "Sequences per pipeline microbatch on one dp rank; 0 means the whole dp share "
                                     "(one microbatch). Must divide train_batch_size / dp."},
    {"data_config.document_masking", "Attention only within a document (a document ends with the end-of-text token) "
                                     "and rope positions restarting at each document (Megatron's "
                                     "--reset-attention-mask --reset-position-ids)."},
    {"data_config.eot_token", "The end-of-text token id; -1 takes the data's (manifest.json's eot, else its "
                              "tokenizer.json). Must be below vocab_size."},
};

const std::vector<KeyDoc> kLr = {
    {"lr.max_lr", "Peak learning rate, reached at the end of the warmup. At least 0."},
    {"lr.min_lr", "Learning rate at step 0, where the linear warmup starts. At most max_lr."},
    {"lr.end_lr", "Learning rate at the end of the cosine decay, kept after end_steps. At most max_lr."},
    {"lr.warmup_steps", "Steps of linear warmup from min_lr to max_lr. At most end_steps."},
    {"lr.end_steps", "Length of the whole schedule, warmup included (optax's decay_steps): the cosine decay runs from "
                     "warmup_steps to end_steps."},
    {"lr.beta1", "AdamW's first-moment decay, in [0, 1)."},
    {"lr.beta2", "AdamW's second-moment decay, in [0, 1). With bf16 moments (optimizer_state_dtype) a value above "
                 "0.996 is warned about: the decay falls below bf16's rounding."},
    {"lr.eps", "AdamW's epsilon. Above 0."},
    {"lr.weight_decay", "AdamW's decoupled weight decay, applied to matrices (parameters of 2 or more dimensions), "
                        "never to norms and biases. At least 0."},
};

const std::vector<KeyDoc> kDevice = {
    {"device_config.n_device_axis", "The mesh [dp, pp, tp], each at least 1; dp x pp x tp x context_parallel must be "
                                    "the number of ranks mpirun starts. Rank order: tp fastest, then cp, dp, pp."},
    {"device_config.device", "auto: the rank's GPU when this build has CUDA and a GPU is visible, else the CPU; cpu "
                             "or cuda forces one (cuda fails without a GPU)."},
    {"device_config.collectives", "How ranks exchange tensors: auto is NCCL on CUDA and MPI on CPU; mpi on CUDA "
                                  "stages tensors through pinned host memory, so ranks may share a GPU. nccl refuses "
                                  "device cpu."},
    {"device_config.expert_parallel", "Ranks of the dp group that split each MoE layer's routed experts; tokens reach "
                                      "them by all-to-all. Divides dp x context_parallel and n_experts; above 1 needs "
                                      "ffn moe."},
    {"device_config.context_parallel", "Ranks each sequence is split over (a fourth mesh axis; world = dp x pp x tp x "
                                       "cp). At least 1; T must be divisible by 2 x context_parallel."},
    {"device_config.attention_backend", "Which kernels CUDA's attention may use: auto is PyTorch's choice; a named one "
                                        "leaves out the fused kernels PyTorch would try before it (math: none)."},
    {"device_config.cuda_graphs", "Capture the whole training step once as a CUDA graph and replay it. One rank and "
                                  "fixed shapes only: refused with more ranks, rampup_batch_size, seq_len_warmup, "
                                  "dropless MoE, document_masking or activation_checkpointing."},
};

const std::vector<KeyDoc> kInference = {
    {"inference_config.prompt", "The text the end-of-run sample and generate continue (generate --prompt replaces "
                                "it)."},
    {"inference_config.batch_size", "Samples drawn at once, in [1, 1024]."},
    {"inference_config.top_k", "Draw only from the k most likely tokens; 0 means the whole vocabulary. At least 0."},
    {"inference_config.temperature", "Softmax temperature of sampling; 0 is greedy (argmax). At least 0."},
    {"inference_config.max_tokens", "New tokens per sample at most, in [0, 65536]."},
    {"inference_config.use_cache", "Keep a key/value cache between new tokens; false runs the whole context again for "
                                   "each token."},
    {"inference_config.n_devices", "Jaxformer's inference device count: accepted and ignored with a warning (generate "
                                   "runs on the ranks mpirun starts)."},
    {"inference_config.speculative", "Self-speculative decoding: the multi-token prediction modules draft up to "
                                     "mtp_depth tokens, one forward of the model (on its KV cache with use_cache) "
                                     "verifies them by speculative sampling's rule. At temperature 0 the output is "
                                     "plain greedy sampling's token for token; above it, distributed exactly as plain "
                                     "sampling's, not the same tokens for the same seed (docs/models.md). Needs "
                                     "model_config.mtp_depth >= 1 and pp 1 (both checked up front)."},
    {"inference_config.stop_at_eot", "A sample ends at the tokenizer's end-of-text token, as a document does; false "
                                     "samples max_tokens into the next document."},
    {"inference_config.min_tokens", "With stop_at_eot, end-of-text is never drawn for the first min_tokens new tokens "
                                    "(Hugging Face's min_new_tokens), so a young model still shows text. In [0, 65536]."},
};

const std::vector<KeyDoc> kSeqLenWarmup = {
    {"seq_len_warmup.min_difficulty", "Curriculum (DeepSpeed's fixed_linear on sequence length): the sequence length "
                                      "at step 0, in [1, data_config.T] when the warmup is on."},
    {"seq_len_warmup.difficulty_step", "Lengths of the curriculum are multiples of this (at least 1; under sequence "
                                       "parallelism or context parallelism also of tp or 2 x cp)."},
    {"seq_len_warmup.total_curriculum_step", "Steps until the sequence length reaches data_config.T; 0 turns the "
                                             "warmup off."},
};

const std::vector<KeyDoc> kTop = {
    {"output_dir", "Folder that holds the runs; a run lives in output_dir/name. Taken as given (no control "
                   "characters); every host must see it at the same path."},
    {"name", "The run's folder inside output_dir: one folder name (no '/', not '.' or '..', no control "
             "characters)."},
    {"training_steps", "Optimizer steps the run trains to (a resumed run continues to this count). At least 0."},
    {"grad_step", "Gradient accumulation: rounds of train_batch_size sequences per optimizer step. At least 1."},
    {"alpha", "Weight of the MoE load-balancing (auxiliary) loss; 0 leaves it out of the loss. At least 0."},
    {"checkpoint_steps", "Every N steps (and at the last) the run evaluates and saves a checkpoint. At least 1."},
    {"eval_steps", "Validation batches per evaluation; 0 skips evaluation. At least 0."},
    {"seed", "Seeds initialisation (per parameter, by its global name: the same on every mesh), dropout and "
             "sampling."},
    {"grad_clip_norm", "Gradients are scaled down when their global norm exceeds this; 0 turns clipping off. At "
                       "least 0."},
    {"pipeline_schedule", "Pipeline schedule with pp above 1: gpipe, 1f1b (one forward, one backward), interleaved "
                          "(Megatron's interleaved 1F1B over virtual_stages chunks per rank), zb-h1 (zero-bubble "
                          "ZB-H1: 1F1B's memory, each backward split into an input-gradient pass B and a "
                          "weight-gradient pass W that fills the bubbles) or zbv (zero-bubble ZB-V: two layer chunks "
                          "a stage laid out in a V, the embedding and the head both on stage 0; the layers must be a "
                          "multiple of 2 x pp)."},
    {"virtual_stages", "interleaved: chunks of layers per pp rank (Megatron's v); above 1 needs pipeline_schedule "
                       "interleaved (the layers a multiple of pp x v and the microbatches per round a multiple of pp) "
                       "or zbv, which always runs two chunks a stage (1 or 2 accepted)."},
    {"pipeline_pass_costs", "zb-h1 / zbv: the relative lengths [forward, B, W] of a stage's forward, input-gradient "
                            "and weight-gradient passes that the plans are made with (measure them: bench's "
                            "zero-bubble timing, a profile). Empty: from the model's FLOPs (plan prints them; full "
                            "recomputation adds a forward to B). Other schedules ignore it; it changes the order of "
                            "passes, never the numbers."},
    {"sequence_parallel", "Norms and dropout run on sequence shards between tensor-parallel regions (Megatron-Core); "
                          "T must be divisible by tp."},
    {"zero_stage", "0: replicated AdamW; 1: optimizer state sharded over dp (ZeRO-1); 2: gradients sharded too; 3: "
                   "parameters sharded too (FSDP). With dp 1 every stage runs as 0."},
    {"fsdp_keep_gathered", "zero_stage 2 or 3 (refused otherwise): a layer gathered in a step stays gathered, and its "
                           "gradients whole, until the optimizer step (one gather and one reduce-scatter per layer "
                           "and step instead of per microbatch)."},
    {"overlap_grad_reduce", "zero_stage 0 with dp above 1: the dp all-reduce of the gradients runs in buckets during "
                            "the last backward pass instead of after it."},
    {"optimizer_state_dtype", "The dtype AdamW keeps its two moments in (float32 or bfloat16); the update computes in "
                              "fp32 either way. bfloat16 halves the optimizer state."},
    {"optimizer_writes_casts", "bf16 model, zero_stage 0: AdamW writes each weight's bf16 cast in its update pass and "
                               "the next forward reads it instead of casting again (2 bytes a parameter kept between "
                               "steps). No effect elsewhere."},
    {"grad_bucket_mb", "Size of overlap_grad_reduce's buckets in MiB, in (0, 65536]."},
    {"rampup_batch_size", "Batch-size rampup as Megatron's --rampup-batch-size: [start, increment, samples], or empty "
                          "(off). start and increment must be multiples of dp x micro_batch_size."},
    {"activation_checkpointing", "Recompute activations in backward instead of keeping them: none, full (each layer) "
                                 "or selective (each layer's feed-forward)."},
    {"max_to_keep", "Complete checkpoints kept in the run's checkpoints/ (older ones are pruned). At least 1."},
    {"nan_policy", "A step whose loss or gradient norm is not finite: skip drops its update (and stops the run after "
                   "max_nan_skips in a row); stop ends the run with an error naming the step."},
    {"max_nan_skips", "nan_policy skip: the run ends with an error after this many skipped steps in a row. At least "
                      "1."},
    {"stop_check_steps", "The ranks agree on a stop request (a signal) every N steps and at every checkpoint: one "
                         "host all-reduce per N steps, up to N - 1 more steps before the save. At least 1."},
    {"log_every", "A metrics row and console line every N steps. At least 1."},
    {"sample_every", "At a checkpoint step that is a multiple of N, print a sample; 0 samples once, at the end of "
                     "training. At least 0."},
    {"torch_threads", "Intra-op threads per rank on CPU. At least 1."},
    {"watchdog_seconds", "A rank whose phase (start-up, a step, evaluation, saving, sampling) makes no progress this "
                         "long aborts the job, naming the stuck rank. In [0, 86400]; 0 turns the watchdog off."},
    {"async_checkpoint", "Write checkpoints on a background thread: training pauses only for a copy of the state into "
                         "host memory (one save in flight at a time)."},
    {"flight_recorder_size", "Collectives and point-to-point ops each rank remembers, to name the one a hang is in. "
                             "In [0, 1048576]; 0 turns the recorder off."},
    {"straggler_threshold", "With several ranks, the slowest rank is named when its time per step outside collectives "
                            "is this fraction above the median (0.2: 20%). In [0, 100]."},
};

std::vector<KeyDoc> all_docs() {
  std::vector<KeyDoc> all;
  for (const auto* part : {&kModel, &kData, &kLr, &kDevice, &kInference, &kSeqLenWarmup, &kTop})
    all.insert(all.end(), part->begin(), part->end());
  return all;
}

}  // namespace

const std::vector<KeyDoc>& key_docs() {
  static const std::vector<KeyDoc> docs = all_docs();
  return docs;
}

std::string_view key_description(std::string_view path) {
  const auto& docs = key_docs();
  const auto it = std::find_if(docs.begin(), docs.end(), [&](const KeyDoc& d) { return path == d.path; });
  return it == docs.end() ? std::string_view{} : std::string_view(it->text);
}

}  // namespace meshtrain
