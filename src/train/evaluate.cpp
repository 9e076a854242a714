// Validation loss (see evaluate.h).
#include "meshtrain/train/evaluate.h"

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/pipeline.h"

namespace meshtrain {

Evaluation evaluate(Session& s) {
  const Config& cfg = s.config();
  const size_t depth = static_cast<size_t>(cfg.model.mtp_depth);
  if (cfg.eval_steps == 0) return {std::nan(""), std::vector<double>(depth, std::nan(""))};
  DataLoader* val = s.val_loader();
  MT_CHECK(val, "evaluate() reads validation data, which the meta device has none of");
  ParallelModel& pm = s.model();
  pm.model->eval();
  RoundSpec spec;
  spec.backward = false;
  // ce, tokens, then each depth's loss sum (on the last stage only).
  std::vector<double> sums(2 + depth, 0.0);
  const Cursor saved = val->cursor();
  val->restore(Cursor{});  // every evaluation reads the same batches
  try {
    for (int64_t i = 0; i < cfg.eval_steps; ++i) {
      s.watchdog().beat("evaluation batch " + std::to_string(i + 1));
      s.stop_point("evaluation");
      Batch b = val->next();
      CastScope casts(pm.model->precision());
      RoundSums r = run_round(pm, s.mesh(), cfg, b.inputs.to(s.device()), b.targets.to(s.device()), spec,
                              b.inputs.is_cpu() ? b.inputs : at::Tensor());
      sums[0] += sum_value(r.ce_sum);
      sums[1] += r.tokens;
      for (size_t k = 0; k < r.mtp_sum.size() && k < depth; ++k) sums[2 + k] += sum_value(r.mtp_sum[k]);
    }
  } catch (...) {
    // A stop throws out of the loop; the checkpoint saved next must hold the
    // training state, not the evaluation's.
    val->restore(saved);
    pm.model->train();
    throw;
  }
  val->restore(saved);
  at::Tensor t = at::tensor(sums, at::kDouble);
  if (s.mesh().coord().tp != 0) t.zero_();  // tp replicas hold the same sums
  s.mesh().cpu_world().all_reduce(t);
  pm.model->train();
  const double tokens = t[1].item<double>();
  auto mean = [&](int64_t i) { return tokens > 0 ? t[i].item<double>() / tokens : std::nan(""); };
  Evaluation e;
  e.loss = mean(0);
  for (size_t k = 0; k < depth; ++k) e.mtp_loss.push_back(mean(2 + static_cast<int64_t>(k)));
  return e;
}

}  // namespace meshtrain
