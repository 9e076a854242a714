#pragma once
// Mixed precision, spelled out in the layers (not at::autocast), the same on
// every device (CPU, CUDA, and the meta device of `bench --device meta`).
//
// The policy (model_config.model_dtype "bfloat16"): the parameters, their
// gradients and AdamW's state stay fp32 (the master weights); the layers cast
// their matmul operands to bf16, so GEMMs, attention, the residual stream and
// the activations sent between pipeline stages are bf16; fp32 stays where the
// numbers need it: norm statistics, softmax / cross-entropy accumulation (the
// fused kernels, ops/fused.h), the MoE router, weight gradients of the head
// (accumulated in fp32), and the optimizer. "float32": no cast anywhere.
//
// On top of bf16, model_config.fp8_recipe runs the linear layers' GEMMs in
// FP8 (model/fp8_linear.h): the weights they mark here, fused_linear and
// batched_linear take to the FP8 functions.
//
// The policy is passed, never kept per thread: the LayerFactory hands one
// MixedPrecision to every layer it makes, and the model keeps it. CUDA's
// autograd engine runs backward -- and with it the activation recomputation
// of model/recompute.h -- on a thread of its own, which sees the same policy
// and the same cast cache as the forward.
//
// Cast cache: inside a CastScope (one accumulation round, one evaluation
// batch, one sample) the bf16 cast of a parameter is made once and shared by
// the microbatches (as autocast caches within its region), so the weights
// are cast once per round. FSDP forgets a layer's casts when it gathers the
// layer for a forward (parallel/fsdp.cpp): its backward order relies on every
// node of a layer being created inside that layer's forward. Outside a scope
// nothing is cached, so a cast never outlives an optimizer update.
//
// Kept casts (keep_casts; the replicated optimizer of a bf16 model turns them
// on, optimizer_writes_casts): each parameter's cast lives in a buffer of its
// own across steps, and the optimizer writes the updated weights' casts into
// it in its update pass (ops/adamw.h), so a step reads the fp32 weights once,
// in the optimizer, instead of once more to cast them. A kept cast is used
// only while its parameter is as it was when the cast was written (same
// version counter and storage); any other write to the parameter (a
// checkpoint load, a broadcast) makes the next use cast it again. The values
// are the same bits as a fresh cast, and the gradient flows to the fp32
// parameter as through Tensor::to.
#include <ATen/core/Tensor.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <memory>

#include "meshtrain/config/choices.h"
#include "meshtrain/model/fp8_linear.h"
#include "meshtrain/ops/fp8.h"

namespace meshtrain {

class WeightGradQueue;

struct PrecisionPolicy {
  // Matmul operands and activations between layers and stages; kFloat: no cast.
  at::ScalarType compute = at::kFloat;
  // FP8 GEMMs in the linear layers on top of a bf16 policy (model/fp8_linear.h).
  Fp8Recipe fp8 = Fp8Recipe::None;

  // model_config.model_dtype and fp8_recipe.
  static PrecisionPolicy from_model_dtype(ModelDtype model_dtype, Fp8Recipe fp8 = Fp8Recipe::None);
  bool mixed() const { return compute != at::kFloat; }
  // One line for the start-up log and `plan`.
  std::string describe() const;
};

class MixedPrecision {
 public:
  explicit MixedPrecision(PrecisionPolicy policy = {}) : policy_(policy) {}
  MixedPrecision(const MixedPrecision&) = delete;
  MixedPrecision& operator=(const MixedPrecision&) = delete;

  const PrecisionPolicy& policy() const { return policy_; }
  // The dtype of the hidden states the layers pass on (and the pipeline sends).
  at::ScalarType activation_dtype() const { return policy_.compute; }

  // t in the compute dtype when t is floating point; a parameter's cast is
  // shared inside a CastScope while grad mode is on.
  at::Tensor operand(const at::Tensor& t);
  // A parameter's compute-dtype copy without autograd history, its rows
  // zero-padded to `rows` (0: as many as it has), for the functions of
  // model/mixed_matmul.h, which take the fp32 parameter itself and return its
  // fp32 gradient. Shared inside a CastScope by every such use (a tied
  // embedding and head share one). Under fp32 compute: t itself, or a padded
  // copy.
  at::Tensor operand_detached(const at::Tensor& t, int64_t rows = 0);
  // at::linear(x, w, b) with the operands in the compute dtype (b may be undefined).
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});
  // One GEMM for the projections of x by several weights (q, k and v): x
  // times the weights' rows concatenated, plus the biases' (all or none),
  // or plus `residual` ([.., rows], the compute dtype, contiguous; no
  // biases then) folded into the GEMM. Where the weights are fp32 leaves
  // that take gradients (a mixed policy, grad mode on; FSDP's gathered casts
  // are read as operand_detached reads them), their gradients leave the
  // weight-gradient GEMM in fp32 (model/mixed_matmul.h's mixed_linear)
  // instead of as a bf16 product cast up afterwards.
  at::Tensor fused_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases = {},
                          const at::Tensor& residual = {});
  // FP8 (model/fp8_linear.h). The layers' GEMM weights are marked as the
  // factory makes them, with how a mesh splits their GEMMs; fused_linear and
  // batched_linear run a marked weight's GEMMs in FP8 (the LM head, the
  // embedding and the router are never marked).
  bool fp8() const { return policy_.fp8 != Fp8Recipe::None; }
  void mark_fp8(const at::Tensor& param, std::shared_ptr<const Fp8Split> split);
  void unmark_fp8(const at::Tensor& param);
  // param's split, or null where param is not an FP8 GEMM weight (or no recipe is set).
  const Fp8Split* fp8_split(const at::Tensor& param) const;
  // Context parallelism: the max over the cp ranks, for every scale group
  // spanning tokens (each rank holds chunks of every sequence).
  void set_fp8_token_reduce(AmaxReduce cp) { fp8_tokens_ = std::move(cp); }
  const AmaxReduce& fp8_token_reduce() const { return fp8_tokens_; }
  // The marked weight param [.., N, K] quantized from its compute-dtype cast
  // (operand_detached) as the recipe's forward operand, or, `transposed`,
  // as the input-gradient GEMM's [.., K, N]; shared inside a CastScope.
  ops::Fp8Tensor fp8_weight(const at::Tensor& param, bool transposed);
  // Drops the cached cast of `param` (and its FP8 quantizations): its next use casts it anew (FSDP).
  void forget(const at::Tensor& param);
  // operand(param) returns `cast` until forget(param) or the outermost scope
  // closes: FSDP's weights gathered in the compute dtype (parallel/fsdp.h).
  // operand_detached(param) then reads it too (the fp32 param may be empty).
  void provide(const at::Tensor& param, at::Tensor cast);
  // Cached casts now (tests).
  size_t cached() const;

  // Kept casts for these parameters (see the top of this file); a mixed
  // policy only.
  void keep_casts(const std::vector<at::Tensor>& params);
  // The buffer the optimizer writes param's updated cast into ([param's
  // shape], the first rows of a padded cast), undefined while it has none.
  at::Tensor cast_to_write(const at::Tensor& param);
  // The optimizer wrote the casts of these parameters with their update:
  // they hold the parameters as they are now.
  void casts_written(const std::vector<at::Tensor>& params);
  // Casts made (a parameter read without a kept cast that matches it); tests
  // and the performance model count them.
  int64_t casts_made() const;

  // Zero-bubble pipelines: every linear layer takes its weight gradients
  // from the functions of model/mixed_matmul.h (also under fp32 compute),
  // whose weight-gradient GEMMs can then be deferred.
  void set_split_backward(bool on) { split_backward_ = on; }
  // While set (a B pass), those GEMMs are queued into q instead of run
  // (WeightGradQueue); null runs them. Set and cleared around a backward.
  void defer_weight_grads(WeightGradQueue* q) { deferred_ = q; }
  WeightGradQueue* deferred_weight_grads() const { return deferred_; }

 private:
  friend class CastScope;
  void open();
  void close();
  // Whether mixed_linear may take these parameters (see fused_linear).
  bool grads_in_fp32(at::TensorList params);

  const PrecisionPolicy policy_;
  bool split_backward_ = false;
  WeightGradQueue* deferred_ = nullptr;
  // Forward (main thread) and recomputation (the autograd engine's thread on
  // CUDA) take turns on the cache; the lock makes that safe by construction.
  mutable std::mutex mu_;
  int depth_ = 0;
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> cache_;  // impl -> (source, cast)
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> detached_;  // operand_detached's
  std::unordered_map<const c10::TensorImpl*, at::Tensor> provided_;  // provide()'s casts, without their history
  // FP8: the marked weights' splits, and their quantizations in this scope
  // (two per weight: forward, transposed).
  std::unordered_map<const c10::TensorImpl*, std::shared_ptr<const Fp8Split>> fp8_marked_;
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, ops::Fp8Tensor>> fp8_cache_[2];
  AmaxReduce fp8_tokens_;

  struct Kept {
    at::Tensor param, cast;  // cast: [rows >= param's, ...], rows past the parameter's zero
    int64_t version = -1;    // param's version counter when cast was written
    const void* data = nullptr;
  };
  // The kept cast of t with at least `rows` rows, written anew when t changed
  // since; undefined where t has none. Called under mu_.
  at::Tensor kept(const at::Tensor& t, int64_t rows);
  std::unordered_set<const c10::TensorImpl*> keep_;  // keep_casts' parameters
  std::unordered_map<const c10::TensorImpl*, Kept> kept_;
  int64_t casts_made_ = 0;
};

// The lifetime of the cast cache: the casts made while the outermost scope
// is open are shared and dropped when it closes.
class CastScope {
 public:
  explicit CastScope(MixedPrecision& p) : p_(p) { p_.open(); }
  ~CastScope() { p_.close(); }
  CastScope(const CastScope&) = delete;
  CastScope& operator=(const CastScope&) = delete;

 private:
  MixedPrecision& p_;
};

}  // namespace meshtrain
