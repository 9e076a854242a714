#include "meshtrain/parallel/grad_buckets.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <string>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

// The layer chunk whose backward finishes a parameter's gradient:
// "layers.12.attn.wq.weight" -> the chunk holding layer 12; the embedding is
// in the first virtual stage (chunk 0), the final norm and head in the last.
int64_t chunk_of(const std::string& path, const std::vector<LayerSpan>& chunks) {
  const std::string prefix = "layers.";
  if (path.compare(0, prefix.size(), prefix) != 0)
    return path.compare(0, 6, "embed.") == 0 ? 0 : static_cast<int64_t>(chunks.size()) - 1;
  const int64_t layer = std::stoll(path.substr(prefix.size(), path.find('.', prefix.size()) - prefix.size()));
  for (size_t c = 0; c < chunks.size(); ++c)
    if (layer >= chunks[c].first && layer < chunks[c].end) return static_cast<int64_t>(c);
  MT_FAIL("parameter '", path, "' is in no layer chunk of this pipeline stage");
}

// Whether the dp sum of p can run during backward: the parameters whose
// gradient needs another group or another sum first are summed after it
// (see grad_buckets.h).
bool bucketable(const ParamInfo& p, const Mesh& mesh) {
  if (!p.tensor.requires_grad()) return false;
  if (p.sequence_parallel_grad && mesh.shape().tp > 1) return false;
  if (p.layout.expert_split && mesh.shape().ep > 1) return false;  // expert_dp(), not dp
  if (p.layout.tied_embedding && mesh.shape().pp > 1) return false;
  return true;
}

// libtorch's C++ side of register_post_accumulate_grad_hook: one hook per
// tensor, called by AccumulateGrad once .grad holds this pass's sum.
struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  explicit ReadyHook(std::function<void()> f) : fire(std::move(f)) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { fire(); }
  std::function<void()> fire;
};

}  // namespace

GradBuckets::GradBuckets(ParallelModel& pm, Mesh& mesh, int64_t bucket_bytes) : pm_(pm), comm_(mesh.dp()) {
  MT_CHECK(bucket_bytes > 0, "grad_bucket_mb must be positive, got ", bucket_bytes, " bytes");
  const size_t n = pm.params.size();
  bucket_of_.assign(n, -1);
  chunk_of_.assign(n, -1);
  armed_.assign(n, 0);
  ready_.assign(n, 0);
  const std::vector<LayerSpan> chunks = pm.model->range().chunks();
  int64_t bytes = 0;
  for (size_t k = n; k-- > 0;) {
    ParamInfo& p = pm.params[k];
    if (!bucketable(p, mesh)) continue;
    chunk_of_[k] = chunk_of(p.path, chunks);
    const auto nbytes = static_cast<int64_t>(p.tensor.nbytes());
    const bool same_dtype =
        !buckets_.empty() && pm.params[buckets_.back().params.front()].tensor.scalar_type() == p.tensor.scalar_type();
    if (buckets_.empty() || !same_dtype || bytes + nbytes > bucket_bytes) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(k);
    bytes += nbytes;
    bucket_of_[k] = static_cast<int64_t>(buckets_.size()) - 1;
    torch::autograd::impl::set_post_acc_grad_hooks(p.tensor,
                                                   std::make_unique<ReadyHook>([this, k] { on_grad_ready(k); }));
  }
  // One flat buffer per bucket; each gradient lives in it as a view (DDP's
  // gradient_as_bucket_view), so the all-reduce needs no cat and no copy back.
  view_of_.resize(n);
  for (Bucket& b : buckets_) {
    int64_t total = 0;
    for (size_t k : b.params) total += pm.params[k].tensor.numel();
    const at::Tensor& first = pm.params[b.params.front()].tensor;
    b.flat = at::zeros({total}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k : b.params) {
      const at::Tensor& t = pm.params[k].tensor;
      view_of_[k] = b.flat.narrow(0, offset, t.numel()).view(t.sizes());
      offset += t.numel();
    }
  }
  const at::Device device = pm.params.front().tensor.device();
  if (device.is_cuda()) side_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
}

GradBuckets::~GradBuckets() {
  // The hooks point at this object: the parameters may outlive it.
  for (size_t k = 0; k < bucket_of_.size(); ++k)
    if (bucket_of_[k] >= 0) torch::autograd::impl::set_post_acc_grad_hooks(pm_.params[k].tensor, nullptr);
}

void GradBuckets::arm(int64_t chunk) {
  for (size_t k = 0; k < chunk_of_.size(); ++k)
    if (bucket_of_[k] >= 0 && chunk_of_[k] == chunk) armed_[k] = 1;
}

void GradBuckets::adopt(size_t k) {
  at::Tensor& t = pm_.params[k].tensor;
  const at::Tensor& view = view_of_[k];
  if (t.grad().defined() && t.grad().is_alias_of(view)) return;
  // The step's first gradient (a fresh tensor, or none: an expert that got
  // no token takes part as zeros) moves into the bucket; later passes
  // accumulate into the view in place.
  at::NoGradGuard no_grad;
  if (t.grad().defined())
    view.copy_(t.grad());
  else
    view.zero_();
  t.mutable_grad() = view;
}

int64_t GradBuckets::grads_in_buckets() const {
  int64_t n = 0;
  for (size_t k = 0; k < view_of_.size(); ++k) {
    const at::Tensor& g = pm_.params[k].tensor.grad();
    if (bucket_of_[k] >= 0 && g.defined() && g.is_alias_of(view_of_[k])) ++n;
  }
  return n;
}

int64_t GradBuckets::bucketed_params() const {
  int64_t n = 0;
  for (int64_t b : bucket_of_) n += b >= 0 ? 1 : 0;
  return n;
}

void GradBuckets::on_grad_ready(size_t k) {
  adopt(k);
  if (!armed_[k]) return;  // an earlier microbatch: the gradient is still accumulating
  MT_ASSERT(!ready_[k], "parameter '", pm_.params[k].path, "' got a gradient after it was final");
  ready_[k] = 1;
  ++buckets_[static_cast<size_t>(bucket_of_[k])].ready;
  launch_ready();
}

void GradBuckets::launch_ready() {
  // In index order only: all dp ranks then issue the same sequence.
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].params.size()) {
    launch(buckets_[next_++]);
    if (!in_finish_) ++launched_in_backward_;
  }
}

void GradBuckets::launch(Bucket& b) {
  at::NoGradGuard no_grad;
  for (size_t k : b.params) adopt(k);
  std::optional<c10::StreamGuard> on_side;
  if (side_) {
    // The side stream starts once the gradients exist on the stream that made them.
    const c10::Device device = side_->device();
    c10::Event produced(device.type());
    produced.record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
    produced.block(*side_);
    on_side.emplace(*side_);
    // The bucket is used on the side stream too: the allocator must not
    // reuse its memory before it is done.
    b.flat.record_stream(*side_);
  }
  comm_.all_reduce(b.flat);  // in place: the gradients are views of it
}

void GradBuckets::finish() {
  in_finish_ = true;
  for (Bucket& b : buckets_) b.ready = b.params.size();  // what is left goes now
  launch_ready();
  in_finish_ = false;
  if (side_) {
    // The optimizer and the norm read the gradients on the current stream.
    const c10::Device device = side_->device();
    c10::Event reduced(device.type());
    reduced.record(*side_);
    reduced.block(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  }
  last_launched_in_backward_ = launched_in_backward_;
  launched_in_backward_ = 0;
  for (Bucket& b : buckets_) b.ready = 0;
  next_ = 0;
  std::fill(armed_.begin(), armed_.end(), 0);
  std::fill(ready_.begin(), ready_.end(), 0);
}

}  // namespace meshtrain
