#!/usr/bin/env python3
"""The three GEMMs of one Linear layer's training step, timed one by one with cuBLAS (through
torch.matmul, which passes the operands' strides straight to cuBLAS), in the layouts an MLP
with row-major (batch, features) activations and (out, in) weights gives them:

  forward  y  = x · Wᵀ     both operands K-major
  input    dx = dz · W     B (W) N-major
  weight   dW = dzᵀ · x    A (dzᵀ) M-major, B (x) N-major

and the same products with both operands made K-major first (the transposes timed apart).
Hopper's tensor cores read TF32 operands only K-major, so the gap between the rows shows what
explicit transposes could win. Prints one JSON object per measurement.

    python3 bench/gemm_layouts.py --batch 4096 --width 4096 --precision tf32,bf16
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import time_ms  # noqa: E402  (CUDA-event timing, median of repeats)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--precision", default="tf32,bf16")
    a = ap.parse_args()
    B, N = a.batch, a.width
    for prec in a.precision.split(","):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        dt = torch.bfloat16 if prec == "bf16" else torch.float32
        x = torch.randn(B, N, device="cuda", dtype=dt)
        w = torch.randn(N, N, device="cuda", dtype=dt)
        dz = torch.randn(B, N, device="cuda", dtype=dt)
        flop = 2.0 * B * N * N
        wt = w.t().contiguous()
        dzt = dz.t().contiguous()
        xt = x.t().contiguous()
        cases = {
            "forward x.Wt (K,K)": lambda: torch.matmul(x, w.t()),
            "input dz.W (K,N)": lambda: torch.matmul(dz, w),
            "input dz.(Wt)t (K,K)": lambda: torch.matmul(dz, wt.t()),
            "weight dzt.x (M,N)": lambda: torch.matmul(dz.t(), x),
            "weight dzt.(xt)t (K,K)": lambda: torch.matmul(dzt, xt.t()),
            "weight dzt.(xt)t (M,K)": lambda: torch.matmul(dz.t(), xt.t()),
            "weight dzt.x (K,N)": lambda: torch.matmul(dzt, x),
            "transpose W": lambda: w.t().contiguous(),
            "transpose dz": lambda: dz.t().contiguous(),
        }
        for name, fn in cases.items():
            ms = time_ms(fn, 50, 5)[0]
            rec = {"precision": prec, "case": name, "ms": round(ms, 4)}
            if not name.startswith("transpose"):
                rec["tflops"] = round(flop / ms / 1e9, 1)
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
