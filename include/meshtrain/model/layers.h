#pragma once
// Building blocks of the model and the LayerFactory seam between the model
// (single-device math, this folder) and tensor parallelism (parallel/).
//
// The model never asks "am I sharded?". It creates its linear/embedding/head
// layers through a LayerFactory and wraps hand-written tensor-parallel regions
// (MoE experts) with enter_tp/exit_tp. The default factory here is the
// single-device one; parallel/tensor_parallel.h provides the sharded one.
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/model/dropout_rng.h"
#include "meshtrain/model/gelu_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/model/token_dispatcher.h"
#include "meshtrain/ops/fused.h"

namespace meshtrain {

// Parameter init that does not depend on the mesh: `name` (the parameter's
// global name, e.g. "layers.3.attn.wq") is drawn from N(0, std) over its
// global shape with a generator seeded by (seed, name). Shards are slices.
at::Tensor init_normal(uint64_t seed, const std::string& name, at::IntArrayRef global_shape, double std);
uint64_t param_seed(uint64_t seed, const std::string& name);

// A linear map y = x W^T, W stored [out_local, in_local].
class Linear : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  // residual + forward(x): the residual stream's add. An unsharded layer
  // folds it into its GEMM (addmm: the add costs no kernel of its own, and
  // its backward is the gradient itself); a tp row layer adds after its
  // reduction, since each rank holds a partial sum.
  virtual at::Tensor forward_residual(const at::Tensor& x, const at::Tensor& residual) {
    return residual + forward(x);
  }
  // forward(a.h), or forward_residual(a.h, residual) where residual is
  // defined, for the GELU of the previous GEMM (model/gelu_matmul.h): a
  // layer that ends in its own GEMM takes GELU's derivative inside that
  // GEMM's input gradient. The default takes it through autograd's gelu.
  virtual at::Tensor forward_gelu(const GeluPre& a, const at::Tensor& residual);
  // The pieces of forward for layers fused into one GEMM (QKV): what the
  // layer does to its input before the matmul (column-parallel: the tp region
  // entry; shared by layers reading the same tensor) and its local weight.
  // Only layers whose forward is exactly matmul(input(x), weight()^T) fuse.
  virtual at::Tensor input(const at::Tensor& x) { return x; }
  virtual const at::Tensor& weight() const = 0;
  virtual at::Tensor bias() const { return {}; }  // undefined: none
};

// Token embedding: tokens [B, T] int64 -> [B, T, d] (or the sequence shard).
class Embedding : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& tokens) = 0;
  virtual at::Tensor weight() const = 0;  // local [vocab_local, d]
};

// Output head + loss. Vocabulary may be sharded and padded; padded entries are
// never predicted, sampled, or counted.
class LMHead : public torch::nn::Module {
 public:
  // Per-token cross-entropy [B, T] (fp32) for targets [B, T] (h is the last
  // hidden state, already normed). The full logits are never gathered under tp.
  virtual at::Tensor token_losses(const at::Tensor& h, const at::Tensor& targets) = 0;
  // Full-vocabulary logits [B, T, vocab_size] for sampling (padding removed).
  virtual at::Tensor logits(const at::Tensor& h) = 0;
};

// How one parameter is laid out: its global shape, the dim split over tp
// (-1: replicated), and the name it is saved under (checkpoints, init). The
// tied head copy on the last pipeline stage has path and global name
// "embed.weight" (Transformer registers it there) and tied_copy set.
struct ParamLayout {
  std::vector<int64_t> global_shape;
  int64_t split_dim = -1;
  std::string global_name;
  bool tied_copy = false;  // a replica of another stage's parameter: never saved twice
  // The embedding with a copy on the last stage (tied_copy), read by the LM
  // head (tie_embeddings) or the multi-token prediction modules (mtp_depth,
  // also untied): the first stage's table and that copy; under pipeline
  // parallelism their gradients are summed over pp.
  bool tied_embedding = false;
  // Rows by vocabulary id (the embedding and the head), padded past
  // vocab_size to a multiple of tp: a checkpoint or Hugging Face table with
  // another padding is read by its first vocab_size rows.
  bool vocab_rows = false;
  // A routed-expert tensor: dim 0 indexes the experts and is split over the
  // token dispatcher's ranks (expert parallelism) on top of split_dim's tp
  // split; its gradient is summed over the ranks holding the same experts.
  bool expert_split = false;
  // Replicated over tp but computed from this rank's own sequence chunk under
  // sequence parallelism (norms, MLA's down-projections and rope key,
  // replicated kv heads, a row layer's bias): its gradient is then a partial
  // sum over tp. Recorded by whoever creates the parameter; parallelize reads it.
  bool reads_sequence_shard = false;
  // An MoE layer's score bias (router_bias): moved by the load-balancing rule
  // (train/router_bias.cpp), never by the optimizer (it has no gradient).
  bool router_score_bias = false;
  // The layers read it only through its cast to the compute dtype
  // (MixedPrecision::operand: linear and expert weights; never norms, biases
  // or the fp32 router): zero_stage 3 may gather it in bf16 (parallel/fsdp.h).
  bool compute_cast = false;
};

class RMSNorm;

// What a replicated layer reads under sequence parallelism: this rank's
// sequence chunk (its gradient is partial over tp) or the gathered sequence
// (the MoE router and Jaxformer's shared projection: the whole gradient).
enum class SequenceInput { Shard, Gathered };

// Names: column/row/replicated/kv_heads/norm/embedding/head take the layer's
// global name ("layers.0.attn.wq", "embed", "head") and draw its weight under
// name + ".weight", which is also what named_parameters() reports once the
// model registers the layer under that path. param() takes the full parameter
// name. Sharded factories draw the same global tensor and slice it.
class LayerFactory {
 public:
  virtual ~LayerFactory() = default;

  // Every parameter created through this factory, keyed by its path in
  // Transformer::named_parameters() (e.g. "layers.0.attn.wq.weight").
  // Linear/Embedding/LMHead weights created for `name` have path name + ".weight";
  // param(name, ...) has path `name` (its caller registers it there).
  const std::map<std::string, ParamLayout>& layouts() const { return layouts_; }
  void record_layout(const std::string& path, ParamLayout layout) { layouts_[path] = std::move(layout); }
  // Sets ParamLayout::compute_cast of a recorded parameter.
  void set_compute_cast(const std::string& path, bool on) { layouts_.at(path).compute_cast = on; }

  // FP8 (model/fp8_linear.h): which dim of a GEMM weight [.., N, K] tp
  // splits, and mark_fp8, which marks w as an FP8 GEMM weight on the
  // precision policy (a no-op without an FP8 recipe) with the reductions
  // that make every rank's scales one process's: over tp for a split dim,
  // and for the tokens of a replicated layer reading the sequence shard
  // under sequence parallelism. The column/row/replicated/kv_heads layers
  // mark their weights themselves; the MoE layer its experts'.
  enum class Fp8Shard { None, Out, In };
  void mark_fp8(const at::Tensor& w, Fp8Shard shard, bool reads_sequence_shard);

  uint64_t seed() const { return seed_; }
  void set_seed(uint64_t s) { seed_ = s; }
  // Where parameters are created (layers built outside the factory, such as
  // norms, take it from here): the meta device for MetaLayerFactory.
  virtual at::Device param_device() const { return at::Device(at::kCPU); }
  // The precision policy and cast cache of every layer made here and of the
  // model (model/mixed_precision.h): fp32 unless set before the model is built.
  const std::shared_ptr<MixedPrecision>& precision() const { return precision_; }
  void set_precision(std::shared_ptr<MixedPrecision> p) { precision_ = std::move(p); }

  // bias: the layer also adds a bias name + ".bias" [out], initialised to
  // zero (model_config.linear_bias); split with the output features for
  // column layers, replicated (added once, after the sum) for row layers.
  // Output features split over tp; input is the full (replicated) activation.
  virtual std::shared_ptr<Linear> column(const std::string& name, int64_t in, int64_t out, double std,
                                         bool bias = false);
  // Input features split over tp; output summed over tp.
  virtual std::shared_ptr<Linear> row(const std::string& name, int64_t in, int64_t out, double std,
                                      bool bias = false);
  // Not split (small MLA down-projections, the shared rope key, the router);
  // `input` records what it reads under sequence parallelism.
  virtual std::shared_ptr<Linear> replicated(const std::string& name, int64_t in, int64_t out, double std,
                                             bool bias, SequenceInput input);
  // The k/v projection of grouped-query attention: n_heads heads of head_dim,
  // of which each rank computes only the heads its query heads read. Output
  // [B, T, local heads * head_dim]. Unsharded: all heads. Under tp: column-
  // split when tp divides n_heads, else replicated, each rank keeping its one
  // head (Megatron's GQA with more tp ranks than kv heads).
  virtual std::shared_ptr<Linear> kv_heads(const std::string& name, int64_t in, int64_t n_heads, int64_t head_dim,
                                           double std, bool bias);
  // A replicated RMSNorm "name" over d features (reads the sequence shard).
  std::shared_ptr<RMSNorm> norm(const std::string& name, int64_t d, bool bias);
  virtual std::shared_ptr<Embedding> embedding(const std::string& name, int64_t vocab, int64_t d, double std);
  // tied: the embedding whose weight the head reuses (nullptr: own weight `name`).
  virtual std::shared_ptr<LMHead> head(const std::string& name, int64_t d, int64_t vocab, double std,
                                       std::shared_ptr<Embedding> tied);

  // Raw pieces for hand-written tp regions (MoE experts):
  // the local shard of a parameter drawn over global_shape, split along
  // split_dim over tp (-1: replicated).
  // std == 0: zeros (biases).
  virtual at::Tensor param(const std::string& name, std::vector<int64_t> global_shape, int64_t split_dim, double std);
  // A routed-expert parameter (dim 0: the experts): like param(), and this
  // rank keeps only the experts of its token dispatcher's rank (all of them
  // without expert parallelism). The layout records expert_split.
  at::Tensor expert_param(const std::string& name, std::vector<int64_t> global_shape, int64_t split_dim,
                          double std);
  // How MoE layers reach their experts: the local dispatcher unless
  // parallel/ installs the all-to-all one (before the model is built).
  const std::shared_ptr<TokenDispatcher>& token_dispatcher() const { return dispatcher_; }
  void set_token_dispatcher(std::shared_ptr<TokenDispatcher> d) { dispatcher_ = std::move(d); }
  // Region entry (fwd identity, bwd all-reduce; under sequence parallelism:
  // all-gather along dim 1 fwd, reduce-scatter bwd) and exit_tp (the mirror).
  virtual at::Tensor enter_tp(const at::Tensor& x) { return x; }
  virtual at::Tensor exit_tp(const at::Tensor& x) { return x; }
  // Replicated compute on the full sequence (e.g. the MoE router under sequence
  // parallelism): all-gather fwd / keep own chunk bwd; identity otherwise.
  virtual at::Tensor gather_sequence(const at::Tensor& x) { return x; }
  // The mirror: keep own sequence chunk fwd / all-gather bwd; identity otherwise.
  virtual at::Tensor scatter_sequence(const at::Tensor& x) { return x; }
  // Where the model's dropout masks come from (dropout_rng.h): one stream
  // for everything on a single device; parallel/'s tp factory gives each tp
  // rank its own masks inside tp-sharded regions.
  virtual std::shared_ptr<DropoutRng> dropout_rng() const { return std::make_shared<DropoutRng>(); }
  // Sequence parallelism is on: parameters whose layout says
  // reads_sequence_shard get partial gradients over tp (parallelize.cpp).
  virtual bool sequence_parallel() const { return false; }
  // The max of an amax tensor over this factory's tp ranks (empty: no tp).
  virtual AmaxReduce tp_amax_max() { return {}; }

 protected:
  // Layouts shared by every factory: a row layer's bias (replicated, added to
  // the sequence shard) and a replicated layer's weight and bias.
  void record_row_bias(const std::string& path, int64_t out);
  void record_replicated(const std::string& name, int64_t in, int64_t out, bool bias, SequenceInput input);
  // The global tensor of parameter `name`: init_normal(seed, name, shape, std),
  // or zeros when std == 0. Every parameter is drawn here, so a factory that
  // only counts (MetaLayerFactory) can skip the work.
  virtual at::Tensor draw(const std::string& name, at::IntArrayRef global_shape, double std);

 private:
  uint64_t seed_ = 0;
  std::map<std::string, ParamLayout> layouts_;
  std::shared_ptr<TokenDispatcher> dispatcher_ = std::make_shared<TokenDispatcher>();
  std::shared_ptr<MixedPrecision> precision_ = std::make_shared<MixedPrecision>();
  // mark_fp8's splits, one per kind (weights fused into one GEMM share theirs).
  std::map<std::pair<Fp8Shard, bool>, std::shared_ptr<const Fp8Split>> fp8_splits_;
};

// Builds the model's parameters on the meta device (shapes, no storage or
// init), so a model too big for this machine can still be built and counted.
class MetaLayerFactory : public LayerFactory {
 public:
  at::Device param_device() const override { return at::Device(at::kMeta); }

 protected:
  at::Tensor draw(const std::string& name, at::IntArrayRef global_shape, double std) override;
};

// y = x W^T (+ b) with W [out, in] drawn over its global shape; b optional;
// the operands in `precision`'s compute dtype (nullptr: fp32, no cast).
class PlainLinear : public Linear {
 public:
  explicit PlainLinear(at::Tensor w, at::Tensor b = {}, std::shared_ptr<MixedPrecision> precision = nullptr);
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor forward_residual(const at::Tensor& x, const at::Tensor& residual) override;
  at::Tensor forward_gelu(const GeluPre& a, const at::Tensor& residual) override;
  const at::Tensor& weight() const override { return weight_; }
  at::Tensor bias() const override { return bias_; }

 private:
  at::Tensor weight_, bias_;
  std::shared_ptr<MixedPrecision> precision_;
};

// x / rms(x) * weight (+ bias when `bias`: Jaxformer's RMSNorm has a beta),
// in x's dtype with fp32 statistics: one fused kernel each way (ops/fused.h).
class RMSNorm : public torch::nn::Module {
 public:
  explicit RMSNorm(int64_t d, double eps = 1e-6, bool bias = false, at::Device device = at::kCPU);
  at::Tensor forward(const at::Tensor& x);
  // The residual add before the norm, fused: returns (a + b, norm(a + b)).
  std::pair<at::Tensor, at::Tensor> forward_add(const at::Tensor& a, const at::Tensor& b);
  // The norm of a residual stream x: returns (x, norm(x)); x's other consumers
  // take the first, so its gradient is summed inside the norm's backward.
  std::pair<at::Tensor, at::Tensor> forward_keep(const at::Tensor& x);

 private:
  at::Tensor weight_, bias_;
  double eps_;
};

// Rotary embedding, half-split convention (GPT-NeoX / Llama-HF): dim i pairs
// with dim i + dim/2, rotated by angle pos * theta^(-2i/dim). fp32 tables are
// computed once per (dim, device) and extended when a longer position range
// is asked for; the rotation is one fused kernel each way (ops/fused.h),
// fp32 math on the activations' dtype.
class Rotary {
 public:
  explicit Rotary(double theta) : theta_(theta) {}
  // x [..., T, ..., dim] with positions offset.. along dimension seq_dim (T
  // = x.size(seq_dim)); the dims between seq_dim and the last are broadcast
  // (e.g. q and k stacked as [B, T, 2, H, dim] with seq_dim 1).
  at::Tensor apply(const at::Tensor& x, int64_t offset, int64_t seq_dim);
  // x [B, T, ..., dim] with each token at its own position, positions [B, T]
  // (< n): packed documents restart at 0, context-parallel chunks sit apart
  // (model/token_layout.h). The same rope kernel over B * T rows, each with
  // its own table row.
  at::Tensor apply_at(const at::Tensor& x, const at::Tensor& positions, int64_t n);
  // The tables covering positions [0, n) of a dim-wide rotation on device.
  const ops::RopeTables& tables(int64_t dim, int64_t n, const at::Device& device);
  // One table row per token of positions [B, T] (row b * T + t): the kernels
  // then rotate rows [1, B * T, ...] at offset 0.
  ops::RopeTables tables_at(int64_t dim, const at::Tensor& positions, int64_t n, const at::Device& device);

 private:
  double theta_;
  std::map<std::string, ops::RopeTables> cache_;  // key: dim, device
};

// One-off rotation of x [..., T, dim] (T is dim -2); Rotary caches the tables.
at::Tensor apply_rope(const at::Tensor& x, int64_t offset, double theta);

}  // namespace meshtrain
