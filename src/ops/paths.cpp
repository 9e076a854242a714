// ops/paths.h: a fused operator's path as a user-scope RecordFunction event.
#ifndef NDEBUG
#error "paths.cpp must be compiled with NDEBUG, as libtorch is (see CMakeLists.txt)"
#endif
#include "meshtrain/ops/paths.h"

#include <ATen/record_function.h>

#include <string>

#include "kernels.h"
#include "row_math.h"
#include "strided.h"

namespace meshtrain::ops {

void note_path(const char* op, bool fast, const char* what) {
  at::RecordFunction guard(at::RecordScope::USER_SCOPE);
  if (!guard.isActive()) return;
  // RecordFunction keeps a view of the name: it must outlive the guard.
  const std::string name = std::string(kPathPrefix) + op + (fast ? "|fast|" : "|fallback|") + what;
  guard.before(name, c10::ArrayRef<const c10::IValue>{});
}

bool paths_observed() {
  const at::RecordFunction probe(at::RecordScope::USER_SCOPE);
  return probe.isActive();
}

namespace impl {

bool vector_rows(const char* op, const at::Tensor& like, int64_t cols, int64_t ld,
                 std::initializer_list<const void*> ptrs) {
  const char* why_not = rows::rows_scalar_reason(like.element_size(), cols, ld, ptrs);
  note_row_path(op, why_not);
  return why_not == nullptr;
}

bool vector_rope(const at::Tensor& x, const at::Tensor& out, const at::Tensor& cos, const at::Tensor& sin,
                 int64_t seq_dim) {
  const rows::Strided s = strided_layout(x, out, seq_dim);
  const char* why_not = rows::rope_scalar_reason(x.element_size(), s, x.const_data_ptr(), out.const_data_ptr(),
                                                 cos.const_data_ptr<float>(), sin.const_data_ptr<float>());
  note_row_path("rope", why_not);
  return why_not == nullptr;
}

}  // namespace impl

}  // namespace meshtrain::ops
