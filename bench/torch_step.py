#!/usr/bin/env python3
"""The peer for bench-step on a GPU: PyTorch training the same MLP shapes with SGD (Nesterov
momentum 0.9), the same batch and precision, data already on the GPU; eager, the whole step
captured in a CUDA graph, and torch.compile; plus the cuBLAS GEMM ceilings (8192^3 TF32, bf16).
Prints one JSON object per measurement.

    python3 bench/torch_step.py --layers 784,1024,1024,10 --batch 256 --precision tf32 --modes eager,graph
"""
import argparse
import json
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).cuda()


def time_ms(fn, steps, repeat):
    """Median over `repeat` runs of `steps` calls, timed with CUDA events after a warm-up."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / steps)
    return statistics.median(out), min(out), max(out)


def step_fn(model, opt, x, y, bf16):
    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return step


def graphed(step):
    # Whole-step capture as in PyTorch's CUDA graphs notes: warm up on a side stream, capture, replay.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(5):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g.replay


def gemm_ceiling(dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms, lo, hi = time_ms(lambda: a @ b, 20, 3)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", default="tf32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--modes", default="eager,graph")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--gemm", action="store_true", help="also measure the 8192^3 GEMM ceilings")
    a = p.parse_args()
    if a.gemm:
        print(json.dumps({"bench": "gemm", "tf32_tflops": round(gemm_ceiling(torch.float32, True), 1),
                          "bf16_tflops": round(gemm_ceiling(torch.bfloat16, False), 1),
                          "fp32_tflops": round(gemm_ceiling(torch.float32, False), 1)}), flush=True)
    widths = [int(w) for w in a.layers.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    params = sum((widths[i] + 1) * widths[i + 1] for i in range(len(widths) - 1))
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        model = mlp(widths)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        x = torch.randn(a.batch, widths[0], device="cuda")
        y = torch.randint(0, widths[-1], (a.batch,), device="cuda")
        bf16 = a.precision == "bf16"
        if mode == "compile":
            model = torch.compile(model)
        fn = step_fn(model, opt, x, y, bf16)
        if mode == "graph":
            fn = graphed(fn)
        ms, lo, hi = time_ms(fn, a.steps, a.repeat)
        sps = a.batch / (ms * 1e-3)
        print(json.dumps({"bench": "torch-step", "mode": mode, "layers": a.layers, "batch": a.batch,
                          "precision": a.precision, "torch": torch.__version__,
                          "ms_per_step": round(ms, 5), "ms_min": round(lo, 5), "ms_max": round(hi, 5),
                          "samples_per_s": round(sps, 1),
                          "model_tflops": round(6 * params * sps / 1e12, 2)}), flush=True)


if __name__ == "__main__":
    main()
