#pragma once
// The FLOPs a model does per token: MFU's numerator (perf/) and the relative
// lengths of a pipeline stage's passes that zero-bubble plans are made with
// (parallel/). Facts of the model alone: no mesh, no device.
#include "meshtrain/config/config.h"

namespace meshtrain {

// Training FLOPs per token, nanoGPT / llm.c estimate_mfu: 6*N + 12*L*H*Q*T with
// N all parameters (embedding included; MoE: the active ones) and Q the head
// size. MLA scores use hd + dhR dims and values hd, so its attention term is
// 6*H*(2*hd + dhR)*T per layer (= 12*H*Q*T when dhR = 0). Multi-token
// prediction (mtp_depth D) adds its modules to N and L, and D more head
// GEMMs, 6*d*V each (Megatron-Core counts MTP alike).
double flops_per_token(const ModelConfig& m);

// A layer stack's forward, input-gradient (B) and weight-gradient (W)
// passes in FLOPs per token, relative to the forward: the GEMMs' 2N each
// (N the parameters a token uses), attention's score and value products
// once forward and twice in B (their gradients have no weight).
struct PassCostRatios {
  double backward_input = 1, backward_weight = 1;
};
PassCostRatios pass_cost_ratios(const ModelConfig& m);

}  // namespace meshtrain
