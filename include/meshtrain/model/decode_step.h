#pragma once
// One decoding step over any way of running the model, so the sampling loop
// (train/generate.h) and the pipeline (parallel/pipeline_generate.h) meet in
// the model layer instead of parallel/ reaching up into train/.
//
// forward runs this rank's piece over `context` [1, t] (growing `cache` when
// given) and returns the next-token logits [V] where this rank computes them,
// undefined elsewhere; share makes every rank agree on the sampled token (-1
// where this rank did not sample).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "meshtrain/model/transformer.h"

namespace meshtrain {

using ForwardFn = std::function<at::Tensor(const at::Tensor& context, KVCache* cache)>;
using ShareFn = std::function<int32_t(int32_t token)>;

}  // namespace meshtrain
