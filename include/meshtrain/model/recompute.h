#pragma once
// Activation checkpointing (Chen et al. 2016; Megatron's recompute): a segment
// of the forward runs without recording the autograd graph, keeping only its
// input; the backward pass runs the segment again with grad enabled and
// backpropagates through that copy. Memory of the segment's intermediate
// activations is traded for one more forward.
//
// Dropout stays bit-identical: the CPU (and, for CUDA inputs, the current
// CUDA) generator state is saved before the forward and restored around the
// recompute, so the recomputed masks are the forward's and the generator
// continues afterwards where the forward left it.
//
// MoE side outputs: the aux and z losses a segment adds to its ForwardAux are
// outputs of the checkpointed function, so they keep their gradients; the
// detached statistics (expert counts, drops) are copied to the caller's aux.
#include <ATen/core/Tensor.h>

#include <functional>

#include "meshtrain/model/transformer.h"

namespace meshtrain {

// The modes (the config's ActivationCheckpointing): none keeps everything;
// full recomputes each transformer layer from its input; selective recomputes
// only each layer's feed-forward (dense MLP or MoE), whose hidden activations
// (hidden_dim wide, twice) are the largest a layer keeps while the attention
// core under SDPA keeps little on its efficient kernels.

// A segment: hidden state in, hidden state out; it may add MoE terms to aux
// (never nullptr when called from recompute_in_backward()). It must be deterministic given
// the generator state, and must not depend on anything changed between forward
// and backward.
using Segment = std::function<at::Tensor(const at::Tensor& x, ForwardAux* aux)>;

// fn(x, aux) with its activations recomputed in backward. Without grad mode or
// when x needs no gradient it just calls fn (nothing to recompute for).
at::Tensor recompute_in_backward(const Segment& fn, const at::Tensor& x, ForwardAux* aux);

}  // namespace meshtrain
