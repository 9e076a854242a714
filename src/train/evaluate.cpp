// Validation loss (see evaluate.h).
#include "meshtrain/train/evaluate.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/pipeline.h"

namespace meshtrain {

double evaluate(Session& s) {
  const Config& cfg = s.config();
  if (cfg.eval_steps == 0) return std::nan("");
  DataLoader* val = s.val_loader();
  MT_CHECK(val, "evaluate() reads validation data, which the meta device has none of");
  ParallelModel& pm = s.model();
  pm.model->eval();
  RoundSpec spec;
  spec.backward = false;
  double ce = 0, tokens = 0;
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
      ce += sum_value(r.ce_sum);
      tokens += r.tokens;
    }
  } catch (...) {
    // A stop throws out of the loop; the checkpoint saved next must hold the
    // training state, not the evaluation's.
    val->restore(saved);
    pm.model->train();
    throw;
  }
  val->restore(saved);
  at::Tensor t = at::tensor({ce, tokens}, at::kDouble);
  if (s.mesh().coord().tp != 0) t.zero_();  // tp replicas hold the same sums
  s.mesh().cpu_world().all_reduce(t);
  pm.model->train();
  return t[1].item<double>() > 0 ? t[0].item<double>() / t[1].item<double>() : std::nan("");
}

}  // namespace meshtrain
