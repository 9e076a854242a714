#pragma once
// AdamW (decoupled weight decay) over a fixed list of parameters. Weight decay
// applies to matrices only (not norms, biases), decided by the caller per
// parameter. State (moments, step) is exposed by name so checkpoints can save
// it with the same shard layout as the parameter it belongs to.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct OptimParam {
  std::string name;     // global name (checkpoints)
  at::Tensor param;     // the model's parameter (updated in place)
  bool decay = true;    // weight decay applies
  at::Tensor exp_avg;   // first moment, fp32, param's shape
  at::Tensor exp_avg_sq;
};

class AdamW {
 public:
  AdamW(std::vector<OptimParam> params, const LrConfig& cfg);

  // One update with learning rate lr from each parameter's .grad(). Parameters
  // without a gradient are left alone (their moments too).
  void step(double lr);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  std::vector<OptimParam>& params() { return params_; }
  const std::vector<OptimParam>& params() const { return params_; }

 private:
  std::vector<OptimParam> params_;
  double beta1_, beta2_, eps_, weight_decay_;
  int64_t step_ = 0;
};

}  // namespace meshtrain
