// The operator observer (see op_observer.h): RecordFunction start/end
// callbacks keep a per-thread stack of the ops in flight, so an op learns
// whether any kernel ran inside it before deciding whether it is one itself.
#ifndef NDEBUG
#error "op_observer.cpp must be compiled with NDEBUG, as libtorch is (see CMakeLists.txt)"
#endif
#include "meshtrain/perf/op_observer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

enum class Kind { Other, Gemm, Fp8Gemm, Attention };

// What the schema and the registered kernels say about one operator overload.
// Indexed ops touch the indexed elements only, not their whole operands.
enum class Access { Dense, Gather, ScatterInPlace };

struct OpInfo {
  Access access = Access::Dense;
  bool kernel = true;      // can be a kernel (not a view, allocation or metadata op)
  bool composite = false;  // only forwards to other ops (CompositeImplicitAutograd)
  bool fused = false;      // one GPU kernel whatever it decomposes to here
  bool sync = false;       // reads device memory on the host
  Kind kind = Kind::Other;
  std::vector<bool> write_only;  // per argument: written, never read (out=, copy_ dst)
  std::vector<bool> written;     // per argument: written (schema-declared mutable)
};

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

OpInfo classify(const char* name, const char* overload) {
  OpInfo info;
  const std::string n = name;
  info.fused = starts_with(name, "aten::_foreach_") || starts_with(name, "aten::_fused_adam") ||
               starts_with(name, "aten::_fused_rms_norm") || starts_with(name, "aten::_scaled_dot_product_") ||
               starts_with(name, "aten::_flash_attention_") || starts_with(name, "aten::_efficient_attention_") ||
               n == "aten::_grouped_mm" || starts_with(name, "meshtrain::");
  if (one_of(n, {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::mv", "aten::addmv",
                 "aten::dot", "aten::vdot", "aten::_grouped_mm", "aten::_scaled_mm", "aten::_int_mm",
                 "meshtrain::linear_gelu", "meshtrain::linear_dgelu"}))
    info.kind = Kind::Gemm;
  // ops/fp8.h's FP8 GEMM (at::_scaled_mm or its emulation: one GEMM on a GPU).
  if (n == "meshtrain::fp8_mm") info.kind = Kind::Fp8Gemm;
  if (starts_with(name, "aten::_scaled_dot_product_flash_attention") ||
      starts_with(name, "aten::_scaled_dot_product_efficient_attention") ||
      starts_with(name, "aten::_scaled_dot_product_cudnn_attention") ||
      starts_with(name, "aten::_flash_attention_") || starts_with(name, "aten::_efficient_attention_"))
    info.kind = Kind::Attention;
  if (n == "aten::_fused_sdp_choice") info.fused = false, info.kind = Kind::Other;
  info.sync = one_of(n, {"aten::_local_scalar_dense", "aten::nonzero", "aten::_unique", "aten::_unique2",
                         "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
                         "aten::masked_select", "aten::is_nonzero", "aten::equal", "aten::bincount",
                         "aten::repeat_interleave"});
  // gather / index_select read the rows they return; in-place scatters and
  // index_add_ / index_copy_ read their source and read-modify-write as many
  // elements of self.
  if (one_of(n, {"aten::gather", "aten::index_select"})) info.access = Access::Gather;
  if (one_of(n, {"aten::scatter_", "aten::scatter_add_", "aten::scatter_reduce_", "aten::index_add_",
                 "aten::index_copy_", "aten::index_put_", "aten::_index_put_impl_"}))
    info.access = Access::ScatterInPlace;
  // Allocations, metadata and host reads that launch nothing by themselves.
  // (_unsafe_view and alias are views whose schemas do not say so.)
  if (one_of(n, {"aten::_unsafe_view", "aten::alias", "aten::_reshape_alias", "aten::lift", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                 "aten::new_empty_strided", "aten::resize_", "aten::resize_as_", "aten::set_", "aten::_resize_output_",
                 "aten::lift_fresh", "aten::result_type", "aten::size", "aten::sym_size", "aten::stride",
                 "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::requires_grad_",
                 "aten::retain_grad", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::contiguous",
                 "aten::to", "aten::type_as", "aten::detach", "aten::detach_", "aten::_fused_sdp_choice",
                 "aten::record_stream", "aten::_version", "aten::output_nr", "aten::_fw_primal", "aten::data",
                 "aten::set_data", "aten::is_leaf"}))
    info.kernel = false;

  const auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!op) return info;
  info.composite = op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  const c10::FunctionSchema& schema = op->schema();
  for (const auto& r : schema.returns())
    if (r.alias_info() && !r.alias_info()->isWrite()) info.kernel = false;  // a view
  // In-place ops read what they write (mul_, add_), except those that only
  // overwrite it; out= arguments are written only.
  const bool overwrite = one_of(n, {"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_",
                                    "aten::bernoulli_", "aten::random_", "aten::exponential_"});
  for (const auto& a : schema.arguments()) {
    const bool written = a.alias_info() && a.alias_info()->isWrite();
    info.write_only.push_back(written && (a.kwarg_only() || overwrite));
    info.written.push_back(written);
  }
  return info;
}

// Bytes a kernel touches in t: broadcast (stride-0) dimensions are read once.
double tensor_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  double n = 1;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.stride(i) != 0) n *= static_cast<double>(t.size(i));
  if (t.numel() == 0) n = 0;
  return n * static_cast<double>(t.element_size());
}

template <class F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) f(e.toTensor());
  }
}

double dim(const at::Tensor& t, int64_t i) { return static_cast<double>(t.size(i)); }

// FLOPs of a GEMM from its operands (multiply-adds count 2).
double gemm_flop(const std::string& n, c10::ArrayRef<const c10::IValue> in) {
  auto T = [&](size_t i) { return in.at(i).toTensor(); };
  if (n == "aten::mm") return 2 * dim(T(0), 0) * dim(T(0), 1) * dim(T(1), 1);
  if (n == "aten::addmm") return 2 * dim(T(1), 0) * dim(T(1), 1) * dim(T(2), 1);
  if (n == "aten::bmm") return 2 * dim(T(0), 0) * dim(T(0), 1) * dim(T(0), 2) * dim(T(1), 2);
  if (n == "aten::baddbmm" || n == "aten::addbmm")
    return 2 * dim(T(1), 0) * dim(T(1), 1) * dim(T(1), 2) * dim(T(2), 2);
  if (n == "aten::mv") return 2 * dim(T(0), 0) * dim(T(0), 1);
  if (n == "aten::addmv") return 2 * dim(T(1), 0) * dim(T(1), 1);
  if (n == "aten::dot" || n == "aten::vdot") return 2 * dim(T(0), 0);
  if (n == "aten::_grouped_mm") {
    // [M, K] x [G, K, N] with group offsets: every row meets one group.
    const at::Tensor a = T(0), b = T(1);
    const double M = a.dim() == 2 ? dim(a, 0) : dim(a, 0) * dim(a, 1);
    return 2 * M * dim(b, b.dim() - 2) * dim(b, b.dim() - 1);
  }
  if (n == "aten::_scaled_mm" || n == "aten::_int_mm") return 2 * dim(T(0), 0) * dim(T(0), 1) * dim(T(1), 1);
  // ops/gelu_gemm.h, batched or not: x [.., M, K] times w [.., N, K]^T; dy [.., M, N] times w [.., N, H].
  if (n == "meshtrain::linear_gelu") return 2 * static_cast<double>(T(0).numel()) * dim(T(1), T(1).dim() - 2);
  if (n == "meshtrain::linear_dgelu") return 2 * static_cast<double>(T(0).numel()) * dim(T(1), T(1).dim() - 1);
  // ops/fp8.h: a [.., M, K] times b [.., N, K]^T.
  if (n == "meshtrain::fp8_mm") return 2 * static_cast<double>(T(0).numel()) * dim(T(3), T(3).dim() - 2);
  return 0;
}

// Attention FLOPs: QK^T and PV forward; backward recomputes QK^T and runs
// four more products (dV, dP, dQ, dK). Causal masks skip half the tiles.
double attention_flop(const std::string& n, c10::ArrayRef<const c10::IValue> in) {
  const bool backward = n.size() > 9 && n.compare(n.size() - 9, 9, "_backward") == 0;
  const size_t q_at = backward ? 1 : 0;  // backward: grad_out first
  const at::Tensor q = in.at(q_at).toTensor(), k = in.at(q_at + 1).toTensor(), v = in.at(q_at + 2).toTensor();
  if (q.dim() != 4) return 0;
  bool causal = false;
  for (size_t i = q_at + 3; i < in.size(); ++i)
    if (in[i].isBool()) {
      // The first bool after the tensors is is_causal in the flash and
      // efficient signatures (efficient's compute_log_sumexp comes earlier
      // but follows an optional tensor, so skip bools right after q, k, v, bias).
      if (starts_with(n.c_str(), "aten::_scaled_dot_product_efficient_attention") && !backward && i == q_at + 4)
        continue;
      causal = in[i].toBool();
      break;
    }
  const double bh_tt = dim(q, 0) * dim(q, 1) * dim(q, 2) * dim(k, 2) * (causal ? 0.5 : 1.0);
  const double dqk = dim(q, 3), dv = dim(v, 3);
  return backward ? 2 * bh_tt * (3 * dqk + 2 * dv) : 2 * bh_tt * (dqk + dv);
}

struct Frame {
  const OpInfo* info = nullptr;
  std::string name;
  bool suppressed = false;  // inside a fused op: its pieces are not kernels
  bool kernel_below = false;
  bool on_device = false;
  double in_bytes = 0, flop = 0;
  // Mutable arguments: their bytes count as written once, whether or not the
  // op returns them (in-place ops return self, foreach and fused ops nothing).
  double written_bytes = 0;
  std::vector<const c10::TensorImpl*> written;
};

class Context : public at::ObserverContext {};

}  // namespace

struct OpObserver::State {
  at::Device device;
  std::mutex mu;
  std::unordered_map<std::string, OpInfo> infos;
  OpTotals totals;
  at::CallbackHandle handle = 0;

  explicit State(at::Device d) : device(d) {}

  const OpInfo& info(const char* name, const char* overload) {
    std::lock_guard<std::mutex> lock(mu);
    const std::string key = std::string(name) + "." + overload;
    auto it = infos.find(key);
    if (it == infos.end()) it = infos.emplace(key, classify(name, overload)).first;
    return it->second;
  }
};

namespace {

// The RecordFunction API takes plain function pointers, so the callbacks find
// the active observer here; one observer at a time (checked).
std::atomic<OpObserver::State*> g_active{nullptr};
thread_local std::vector<Frame> t_stack;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  OpObserver::State* s = g_active.load();
  if (!s || !fn.operator_name()) return nullptr;  // autograd nodes, user scopes
  Frame f;
  f.name = fn.name();
  f.info = &s->info(fn.name(), fn.overload_name());
  f.suppressed = !t_stack.empty() && (t_stack.back().suppressed || t_stack.back().info->fused);
  if (!f.suppressed) {
    const auto inputs = fn.inputs();
    bool d2h = false;
    double last_tensor = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const bool write_only = i < f.info->write_only.size() && f.info->write_only[i];
      const bool written = i < f.info->written.size() && f.info->written[i];
      // Indexed ops: self (argument 0) is touched only where indexed.
      const bool skip = f.info->access != Access::Dense && i == 0;
      for_each_tensor(inputs[i], [&](const at::Tensor& t) {
        if (!t.defined()) return;
        if (t.device() == s->device) {
          f.on_device = true;
          if (!write_only && !skip) f.in_bytes += tensor_bytes(t);
          if (written && f.info->access == Access::Dense) {
            f.written_bytes += tensor_bytes(t);
            f.written.push_back(t.unsafeGetTensorImpl());
          }
          last_tensor = tensor_bytes(t);
        }
      });
    }
    // In-place scatters: as many elements of self read and written as the
    // source (the last tensor argument) has.
    if (f.info->access == Access::ScatterInPlace) f.in_bytes += 2 * last_tensor;
    // copy_(dst on the host, src on the device): a device-to-host read (on
    // the CPU every copy is host to host).
    if (f.name == "aten::copy_" && inputs.size() >= 2 && inputs[0].isTensor() && inputs[1].isTensor())
      d2h = !s->device.is_cpu() && inputs[0].toTensor().device().is_cpu() &&
            inputs[1].toTensor().device() == s->device;
    if (f.on_device && (f.info->sync || d2h)) {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->totals.host_syncs;
      ++s->totals.by_op[f.name + " (host sync)"].calls;
    }
    if (f.on_device && (f.info->kind == Kind::Gemm || f.info->kind == Kind::Fp8Gemm))
      f.flop = gemm_flop(f.name, inputs);
    // An FP8 quantization without a given amax reads x twice: the amax, then
    // the scaled cast.
    if (f.on_device && f.name == "meshtrain::fp8_quantize" && inputs.size() >= 4 && inputs[3].isNone())
      f.in_bytes += tensor_bytes(inputs[0].toTensor());
    if (f.on_device && f.info->kind == Kind::Attention) f.flop = attention_flop(f.name, inputs);
  }
  t_stack.push_back(std::move(f));
  return std::make_unique<Context>();
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  OpObserver::State* s = g_active.load();
  if (!ctx || t_stack.empty()) return;
  Frame f = std::move(t_stack.back());
  t_stack.pop_back();
  bool counted = false;
  if (s && !f.suppressed && f.on_device && f.info->kernel && !f.kernel_below &&
      (f.info->fused || !f.info->composite)) {
    double out_bytes = 0;
    for (const c10::IValue& v : fn.outputs())
      for_each_tensor(v, [&](const at::Tensor& t) {
        const bool returned_argument =
            std::find(f.written.begin(), f.written.end(), t.unsafeGetTensorImpl()) != f.written.end();
        if (t.defined() && t.device() == s->device && !returned_argument) out_bytes += tensor_bytes(t);
      });
    if (f.info->access == Access::Gather) out_bytes *= 2;  // the rows read, then written
    if (f.info->access == Access::ScatterInPlace) out_bytes = 0;  // counted with the source
    const double bytes = f.in_bytes + out_bytes + f.written_bytes;
    std::lock_guard<std::mutex> lock(s->mu);
    OpTotals& t = s->totals;
    ++t.kernels;
    if (f.info->kind == Kind::Gemm) {
      t.gemm_flop += f.flop;
      t.gemm_bytes += bytes;
    } else if (f.info->kind == Kind::Fp8Gemm) {
      t.fp8_gemm_flop += f.flop;
      t.fp8_gemm_bytes += bytes;
    } else if (f.info->kind == Kind::Attention) {
      t.attention_flop += f.flop;
      t.attention_bytes += bytes;
    } else {
      t.other_bytes += bytes;
    }
    OpRow& row = t.by_op[f.name];
    ++row.calls;
    row.flop += f.flop;
    row.bytes += bytes;
    counted = true;
  }
  if (!t_stack.empty()) t_stack.back().kernel_below |= counted || f.kernel_below || f.info->fused;
}

}  // namespace

OpObserver::OpObserver(at::Device device) : state_(std::make_unique<State>(device)) {
  State* expected = nullptr;
  MT_ASSERT(g_active.compare_exchange_strong(expected, state_.get()), "only one OpObserver may be active at a time");
  state_->handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                             .needsInputs(true)
                                             .needsOutputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
}

OpObserver::~OpObserver() {
  at::removeCallback(state_->handle);
  g_active.store(nullptr);
  t_stack.clear();
}

const OpTotals& OpObserver::totals() const { return state_->totals; }

void OpObserver::reset() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->totals = OpTotals{};
}

}  // namespace meshtrain
