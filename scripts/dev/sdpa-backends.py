#!/usr/bin/env python3
"""Times PyTorch's attention backends (flash, cuDNN, memory-efficient) on one
GPU for a model's attention shape, forward + backward, causal, bf16: which
one `meshtrain` should ask for (issue: the attention backend chosen by
measurement). Prints one JSON line per backend and one summary line.

Usage: scripts/dev/sdpa-backends.py [--batch 32] [--heads 12] [--seq 1024] [--head-dim 64] [--iters 20]
"""
import argparse
import json
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    dev = "cuda"
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dy = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    # Causal attention FLOPs, forward (2 GEMMs) + backward (5): half the square.
    flop = 7 * 2 * a.batch * a.heads * a.seq * a.seq * a.head_dim / 2
    results = {}
    for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel([backend]):
                for _ in range(3):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dy)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(a.iters):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dy)
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) / a.iters * 1e3
            results[name] = ms
            print(json.dumps({"backend": name, "ms_fwd_bwd": round(ms, 3), "tflops": round(flop / ms / 1e9, 1),
                              "shape": list(shape)}))
        except Exception as e:  # a backend that refuses the shape
            print(json.dumps({"backend": name, "error": str(e).splitlines()[0][:200]}))
    if results:
        best = min(results, key=results.get)
        print(json.dumps({"fastest": best, "ms": {k: round(v, 3) for k, v in results.items()}}))


if __name__ == "__main__":
    main()
