#pragma once
// Products with an fp32 master parameter used in the compute dtype
// (model/mixed_precision.h), as autograd functions that take the parameter
// itself and return its gradient in fp32 straight from the GEMM (or the
// embedding's scatter). Through a plain cast, autograd would instead produce
// a bf16 gradient and cast it back (a read and a write of every weight), and,
// for a weight used transposed, hand AccumulateGrad a transposed gradient
// that it copies into the parameter's layout (another fp32 read and write).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace meshtrain {

class MixedPrecision;

// A tied embedding's weight gradient, handed from the LM head's backward to
// the embedding's when one stage holds both (the head's runs first): the
// head leaves its fp32 [V, d] gradient here instead of returning it, and the
// embedding's backward adds its rows into it and returns the sum. That is one
// scatter of the batch's rows instead of a dense [V, d] gradient of the
// embedding's own plus a [V, d] add of the two (1.2 GB a step for a 100K x
// 768 table).
struct TiedGrad {
  std::mutex mu;
  at::Tensor head;  // the head's gradient waiting for the embedding's rows, or undefined
};

// dW = dy^T x for a weight of dtype param_dtype, accumulated in fp32 when
// dy and x are bf16/fp16 and the weight fp32: a GEMM with an fp32 output
// where the backend has one (CUDA, meta), else (CPU) the exact fp32 upcast
// of the operands, so every device sums the products in fp32. dy [.., out],
// x [.., in] (leading dims flattened) -> [out, in]; with `batched`, dy
// [E, S, out] and x [E, S, in] -> [E, out, in].
at::Tensor weight_grad(const at::Tensor& dy, const at::Tensor& x, at::ScalarType param_dtype, bool batched = false);

// Gradient accumulation inside the weight-gradient GEMM (Megatron's
// gradient_accumulation_fusion). Where AccumulateGrad would add a new
// gradient of `param` into its existing one in place anyway -- an earlier
// microbatch's gradient of param's shape and dtype, contiguous, on dy's
// device, without history, in a backward without grad mode -- the GEMM adds
// dy^T x into it itself (beta = 1); param's post-accumulate hook (the dp
// buckets' readiness) still runs once the pass reaches param, as before.
// That saves a read of both gradients and a write per parameter and
// microbatch after the first (12 bytes a parameter in fp32).
bool grad_accumulates_in_gemm(const at::Tensor& param, const at::Tensor& dy);
// weight_grad(dy, x, param's dtype, batched) for param, or, where
// grad_accumulates_in_gemm, that added into param's gradient and an
// undefined tensor returned (autograd then has nothing to accumulate).
// With precision's weight gradients deferred (a zero-bubble pipeline's B
// pass, WeightGradQueue below), the product is queued instead and an
// undefined tensor returned.
at::Tensor param_weight_grad(const at::Tensor& param, const at::Tensor& dy, const at::Tensor& x, bool batched = false,
                             MixedPrecision* precision = nullptr);

// The weight-gradient GEMMs a backward pass left for later: zero-bubble
// pipelines split a layer chunk's backward into B (input gradients: what
// the stage before waits for) and W (these products), scheduled apart
// (parallel/pipeline_plan.h). While a queue is set on the model's
// MixedPrecision (defer_weight_grads), param_weight_grad queues each product
// with its operands; run() then adds them into their parameters' gradients,
// in order. No post-accumulate hook runs for them (it ran in B, with nothing
// added): the pipeline executor sums such gradients after the last W. Only
// the products made here are deferred: norms, biases, the embedding and any
// operator with a backward of its own take their gradients in B.
// after_run: what must follow this W (FSDP's reduce-scatter of a layer the B
// passed through), run once the products are added.
class WeightGradQueue {
 public:
  void push(const at::Tensor& param, const at::Tensor& dy, const at::Tensor& x, bool batched);
  // A product computed by `dw` (fp32, param's shape): the FP8 GEMMs
  // (model/fp8_linear.h), whose operands were quantized in B.
  void push(const at::Tensor& param, std::function<at::Tensor()> dw);
  void after_run(std::function<void()> f);
  void run();
  // Products and after_run calls waiting.
  size_t size() const;

 private:
  struct Entry {
    at::Tensor param, dy, x;
    bool batched;
    std::function<at::Tensor()> dw;  // set: the product is dw()
  };
  mutable std::mutex mu_;  // pushed from the thread running backward
  std::vector<Entry> entries_;
  std::vector<std::function<void()>> after_;
};

// param's weight gradient made by `dw` (an fp32 product of param's shape):
// returned, or, with precision's weight gradients deferred, queued and an
// undefined tensor returned (the FP8 GEMMs' param_weight_grad).
at::Tensor param_weight_grad(const at::Tensor& param, std::function<at::Tensor()> dw, MixedPrecision* precision);

// x [E, S, in] times each w[e] [out, in] transposed -> [E, S, out] in the
// compute dtype (the experts' batched GEMM); w's gradient comes out fp32.
// A weight marked FP8 runs model/fp8_linear.h's fp8_batched_linear with
// `segments` (each expert's rows from that many senders).
at::Tensor batched_linear(const at::Tensor& x, const at::Tensor& w, MixedPrecision& precision, int64_t segments = 1);

// x [.., in] times the weights' rows concatenated ([sum of out, in]) plus
// the biases' (or plus residual [.., sum of out], no biases), in the compute
// dtype: MixedPrecision::fused_linear where the weights are fp32 leaves.
// Each weight's and bias's gradient comes out fp32, its rows of one fp32
// weight-gradient GEMM (the bias's: of the column sums in fp32).
at::Tensor mixed_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases, const at::Tensor& residual,
                        MixedPrecision& precision);

// Rows `index` of the table w [V, d] in the compute dtype (the embedding
// lookup; index any shape of int64 in [0, V)); w's gradient comes out fp32,
// summed in fp32. The cast table is padded to `rows` rows so that a tied
// head's padded GEMM (model/cross_entropy.h) shares it. tied (optional): the
// head's gradient, added to (see TiedGrad).
at::Tensor embedding_rows(const at::Tensor& w, const at::Tensor& index, MixedPrecision& precision, int64_t rows,
                          TiedGrad* tied = nullptr);

}  // namespace meshtrain
