#pragma once
// Meta-device kernels for the GPU ops a CUDA training step would run but that
// libtorch implements for CUDA only (their meta functions live in PyTorch's
// Python layer), so `bench --device meta` dispatches what a GPU would:
//  - scaled_dot_product_attention -> the flash kernels (forward + backward)
//    when a GPU would pick them (bf16/fp16, equal q/k/v head size <= 256, no
//    mask), else the efficient-attention kernels (masks, unequal head sizes);
//  - _fused_rms_norm (+ backward), _fused_adamw_, _grouped_mm, mm.dtype;
//  - item() (_local_scalar_dense) answers 0 and nonzero answers every index,
//    so code that still reads device values runs on; the observer counts them
//    as host syncs.
// Installed once per process; affects meta tensors only.
namespace meshtrain {

void install_meta_kernels();

}  // namespace meshtrain
