#!/usr/bin/env python3
"""PyTorch's training step for one of bench-step's layer lists, its CUDA kernels summed per name by
torch.profiler (real clocks, unlike Nsight Compute's default base clocks): the peer's side of a
kernel-by-kernel comparison. The model, data and step are torch_cnn.py's (channels_last, bf16
autocast, Nesterov SGD, cuDNN autotuned); 20 warm-up steps, then --steps profiled.

    python3 bench/torch_kernels.py --layers "conv(128,3,pad=1) relu maxpool(2) flatten linear(10)" \\
        --input 3,64,64 --batch 256 --mode compile-step
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from torch_cnn import build
from torch_step import step_fn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", required=True)
    p.add_argument("--input", default="1,28,28", help="C,H,W")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--mode", default="compile-step", choices=["eager", "compile-step"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=45)
    a = p.parse_args()
    shape = tuple(int(v) for v in a.input.split(","))
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model, classes, _ = build(a.layers, shape)
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    x = torch.randn((a.batch,) + shape, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (a.batch,), device="cuda")
    fn = step_fn(model, opt, x, y, True, "cuda")
    if a.mode == "compile-step":
        fn = torch.compile(fn)
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.device_time_total for e in ev)
    print(f"{a.steps} steps, {total / 1e3 / a.steps:.3f} ms of GPU kernels per step (summed)")
    for e in sorted(ev, key=lambda e: -e.device_time_total)[:a.top]:
        print(f"{e.device_time_total / a.steps:10.1f} us/step {e.count / a.steps:5.1f}/step  {e.key[:150]}")


if __name__ == "__main__":
    main()
