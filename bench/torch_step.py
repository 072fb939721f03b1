#!/usr/bin/env python3
"""The peer for bench-step on a GPU: PyTorch training the same MLP shapes with SGD (Nesterov
momentum 0.9), the same batch and precision, data already on the GPU, at its strongest. Modes:
  eager          zero_grad(set_to_none=True), forward (bf16: autocast), loss, backward, opt.step()
  graph          that step captured once as a CUDA graph and replayed (PyTorch's whole-network
                 capture recipe: gradients set to None before capture, allocated in the graph's pool)
  compile-model  torch.compile(model), the optimizer eager (what "torch.compile" meant before)
  compile-step   the whole step (forward, backward and opt.step()) in one torch.compile'd function
  all            every mode above
plus the cuBLAS GEMM ceilings (8192^3 TF32, bf16) with --gemm. Prints one JSON object per
measurement (a mode that cannot run gets "error"), then {"bench": "torch-step-best", ...}: the
strongest row, the one to compare against.

    python3 bench/torch_step.py --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision bf16 --modes all
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODES = ["eager", "graph", "compile-model", "compile-step"]


def mlp(widths, device):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(device)


def time_ms(fn, steps, repeat, warmup, cuda):
    """Median (min, max) over `repeat` runs of `steps` calls after `warmup` untimed ones: CUDA
    events on a GPU, perf_counter on the CPU (--device cpu, a dry run)."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        if cuda:
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) / steps)
        else:
            out.append((time.perf_counter() - t0) * 1e3 / steps)
    return statistics.median(out), min(out), max(out)


def step_fn(model, opt, x, y, bf16, dev, set_to_none=True, zero=True, cache=True):
    def step():
        if zero:
            opt.zero_grad(set_to_none=set_to_none)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16, cache_enabled=cache):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return step


def capture(fn, warmup=3):
    """fn warmed up on a side stream (cuDNN's autotuner runs there), then captured in a CUDA graph:
    returns its replay (PyTorch's CUDA graphs notes)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def graphed(model, opt, x, y, bf16):
    # PyTorch's CUDA graphs notes, whole-network capture: warm up on a side stream, set the
    # gradients to None, capture one step (backward allocates them in the graph's pool and each
    # replay overwrites them: no zeroing pass), replay. Autocast's cast cache is off, as those
    # notes require inside a capture (each weight is cast once per step either way).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        warm = step_fn(model, opt, x, y, bf16, "cuda", cache=False)
        for _ in range(5):
            warm()
    torch.cuda.current_stream().wait_stream(s)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step_fn(model, opt, x, y, bf16, "cuda", zero=False, cache=False)()
    return g.replay


def gemm_ceiling(dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms, lo, hi = time_ms(lambda: a @ b, 20, 3, 20, True)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def make(mode, a, widths, device):
    """The step function of a mode, or a reason why it cannot run here."""
    cuda = device.type == "cuda"
    if mode == "graph" and not cuda:
        return None, "CUDA graphs need a GPU"
    if mode.startswith("compile") and not hasattr(torch, "compile"):
        return None, f"torch.compile not in torch {torch.__version__}"
    torch.manual_seed(0)
    model = mlp(widths, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    x = torch.randn(a.batch, widths[0], device=device)
    y = torch.randint(0, widths[-1], (a.batch,), device=device)
    bf16 = a.precision == "bf16"
    kw = {"mode": a.compile_mode} if a.compile_mode else {}
    if mode == "graph":
        return graphed(model, opt, x, y, bf16), None
    if mode == "compile-model":
        model = torch.compile(model, **kw)
    fn = step_fn(model, opt, x, y, bf16, device.type, set_to_none=not a.keep_grads)
    if mode == "compile-step":
        fn = torch.compile(fn, **kw)
    return fn, None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", default="tf32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--modes", default="eager,graph", help="comma-separated: " + ", ".join(MODES) + ", or all")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first (compilation happens there)")
    p.add_argument("--compile-mode", default="", help="torch.compile's mode (default: its default)")
    p.add_argument("--keep-grads", action="store_true", help="zero_grad(set_to_none=False), the slower setting")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the logic")
    p.add_argument("--gemm", action="store_true", help="also measure the 8192^3 GEMM ceilings")
    a = p.parse_args()
    modes = MODES if a.modes == "all" else a.modes.split(",")
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m} (modes: {', '.join(MODES)}, all)")
    cuda = a.device == "cuda"
    if a.gemm and cuda:
        print(json.dumps({"bench": "gemm", "tf32_tflops": round(gemm_ceiling(torch.float32, True), 1),
                          "bf16_tflops": round(gemm_ceiling(torch.bfloat16, False), 1),
                          "fp32_tflops": round(gemm_ceiling(torch.float32, False), 1)}), flush=True)
    widths = [int(w) for w in a.layers.split(",")]
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    device = torch.device(a.device)
    params = sum((widths[i] + 1) * widths[i + 1] for i in range(len(widths) - 1))
    rows = []
    for mode in modes:
        row = {"bench": "torch-step", "mode": mode, "layers": a.layers, "batch": a.batch,
               "precision": a.precision, "torch": torch.__version__,
               "zero_grad": "set_to_none=False" if a.keep_grads and mode != "graph" else "set_to_none=True"}
        try:
            fn, why = make(mode, a, widths, device)
            if fn is None:
                row["error"] = why
            else:
                ms, lo, hi = time_ms(fn, a.steps, a.repeat, a.warmup, cuda)
                sps = a.batch / (ms * 1e-3)
                row.update({"ms_per_step": round(ms, 5), "ms_min": round(lo, 5), "ms_max": round(hi, 5),
                            "samples_per_s": round(sps, 1), "model_tflops": round(6 * params * sps / 1e12, 2)})
        except Exception as e:  # one mode failing (a compile error) must not hide the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        print(json.dumps(row), flush=True)
        rows.append(row)
    timed = [r for r in rows if "ms_per_step" in r]
    if timed:
        best = min(timed, key=lambda r: r["ms_per_step"])
        print(json.dumps({"bench": "torch-step-best", "mode": best["mode"], "layers": a.layers, "batch": a.batch,
                          "precision": a.precision, "ms_per_step": best["ms_per_step"],
                          "model_tflops": best["model_tflops"],
                          "rows": {r["mode"]: r["ms_per_step"] for r in timed}}), flush=True)


if __name__ == "__main__":
    main()
