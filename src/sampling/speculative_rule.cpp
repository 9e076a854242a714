// Speculative sampling's acceptance rule (see speculative_rule.h).
#include "meshtrain/sampling/speculative_rule.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

// A uniform double in [0, 1): the top 53 bits of the generator's next 64
// (as std::generate_canonical), read under the generator's lock as ATen's
// own samplers do.
double uniform(at::Generator& gen) {
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return static_cast<double>(impl->random64() >> 11) * 0x1.0p-53;
}

// Inverse of the cumulative weights at one uniform draw; ids of weight 0 are
// skipped, so none is drawn even where the sum rounds.
int64_t draw_from(const double* w, int64_t V, at::Generator& gen) {
  double total = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < V; ++i) {
    if (w[i] > 0) {
      total += w[i];
      last = i;
    }
  }
  MT_CHECK(last >= 0, "a token drawn from weights that are all 0 (or negative)");
  const double x = uniform(gen) * total;
  double sum = 0;
  for (int64_t i = 0; i < last; ++i) {
    if (w[i] <= 0) continue;
    sum += w[i];
    if (x < sum) return i;
  }
  return last;
}

}  // namespace

int64_t draw(const at::Tensor& w, at::Generator& gen) {
  MT_CHECK(w.dim() == 1, "draw: weights must be [V], got ", w.sizes());
  const at::Tensor d = w.to(at::kCPU, at::kDouble).contiguous();
  return draw_from(d.data_ptr<double>(), d.size(0), gen);
}

DraftVerdict verify_drafts(const at::Tensor& p, const at::Tensor& q, const std::vector<int64_t>& drafts,
                           at::Generator& gen) {
  const auto n = static_cast<int64_t>(drafts.size());
  MT_CHECK(p.dim() == 2 && p.size(0) == n + 1, "speculative sampling: p must be [drafts + 1, V] = [", n + 1,
           ", V], got ", p.sizes());
  MT_CHECK(n == 0 || (q.dim() == 2 && q.size(0) == n && q.size(1) == p.size(1)),
           "speculative sampling: q must be [drafts, V] = [", n, ", ", p.size(1), "], got ",
           q.defined() ? q.sizes() : at::IntArrayRef{});
  const int64_t V = p.size(1);
  const at::Tensor pd = p.to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor qd = n > 0 ? q.to(at::kCPU, at::kDouble).contiguous() : at::Tensor();
  const double* P = pd.data_ptr<double>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t d = drafts[static_cast<size_t>(k)];
    MT_CHECK(d >= 0 && d < V, "speculative sampling: draft ", k + 1, " is id ", d, ", outside [0, ", V, ")");
    const double* pk = P + k * V;
    const double* qk = qd.data_ptr<double>() + k * V;
    MT_CHECK(qk[d] > 0, "speculative sampling: draft ", k + 1, " (id ", d,
             ") has probability 0 under the distribution it was drawn from");
    // Kept with probability min(1, p/q); a ratio of 0 or >= 1 needs no draw
    // (so at temperature 0 nothing is drawn).
    if (pk[d] >= qk[d] || (pk[d] > 0 && uniform(gen) < pk[d] / qk[d])) continue;
    std::vector<double> residual(static_cast<size_t>(V));
    bool any = false;
    for (int64_t i = 0; i < V; ++i) {
      residual[static_cast<size_t>(i)] = std::max(0.0, pk[i] - qk[i]);
      any = any || residual[static_cast<size_t>(i)] > 0;
    }
    // A rejection means p < q at d, so p > q somewhere else: the residual
    // is empty only when rounding ate it, and then p is as good as it.
    return {k, draw_from(any ? residual.data() : pk, V, gen)};
  }
  return {n, draw_from(P + n * V, V, gen)};
}

}  // namespace meshtrain
