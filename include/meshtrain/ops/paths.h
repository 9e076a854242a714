#pragma once
// Which path a fused operator took, and why (issue 45: where cuBLASLt
// declines a shape or a row is not whole 16-byte vectors, the operators fall
// back to slower code that computes the same values, with no trace of it).
//
// Every operator with a fast path and a fallback names the one it took, per
// call, as a RecordFunction event of user scope called
//   "meshtrain.path|<op>|fast|<path>"   or   "meshtrain.path|<op>|fallback|<reason>".
// Nothing is built when nobody listens (one branch per call), the events
// show in profiler traces beside the kernels, and `meshtrain bench` counts
// them (train/path_counter.h) into its JSON's "paths".
#include <string>

namespace meshtrain::ops {

inline constexpr const char* kPathPrefix = "meshtrain.path|";

// Records that `op` took its fast path (`what`: which, e.g. "16-byte vectors")
// or a fallback (`what`: the reason).
void note_path(const char* op, bool fast, const char* what);

// For the row kernels (RMSNorm, RoPE, cross-entropy, slot rows): the
// 16-byte-vector path where `why_not` is null, else the element-by-element
// path and why_not as its reason.
inline void note_row_path(const char* op, const char* why_not) {
  note_path(op, why_not == nullptr, why_not ? why_not : "16-byte vectors");
}

// Whether anything listens to note_path (so a caller may skip working out
// a reason that costs host time, like the attention backend).
bool paths_observed();

}  // namespace meshtrain::ops
