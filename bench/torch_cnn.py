#!/usr/bin/env python3
"""The peer for bench-step's layer lists on a GPU: PyTorch training the same convolutional
network (parsed from dptrain's layer-list syntax: conv, maxpool, avgpool, relu, tanh, sigmoid,
gelu, flatten, linear, dropout) with SGD (Nesterov momentum 0.9), the same batch and precision
(bf16 by torch.autocast; TF32 for cuBLAS and cuDNN), synthetic data already on the GPU; cuDNN
with its autotuner (cudnn.benchmark) in every mode:
  eager          plain PyTorch, zero_grad(set_to_none=True)
  graph          the whole step captured in a CUDA graph (PyTorch's whole-network recipe)
  compile-step   forward, backward and opt.step() in one torch.compile'd function
  compile-model  torch.compile(model), the optimizer eager (not run unless asked)
each in PyTorch's default memory format (NCHW) and in channels_last (NHWC, which cuDNN's
tensor-core convolutions prefer). Prints one JSON object per measurement; the best of them is
the peer to beat. Model TFLOP/s is counted as bench-step counts it: 6 x the forward
multiply-adds per sample. GPU memory, per measurement (each starts from an emptied cache and
reset peak statistics): torch.cuda.max_memory_allocated() over the whole measurement (model,
optimizer state, batch, cuDNN's autotuning, the warm-up and timed steps) as `peak_mib`, and over
steps run after the timing, from a reset, as `steady_peak_mib`; max_memory_reserved() as
`reserved_mib`.

    python3 bench/torch_cnn.py --layers "conv(32,3,pad=1) relu maxpool(2) flatten linear(10)" \\
        --input 1,28,28 --batch 256 --precision bf16 --modes eager,graph,compile-step
"""
import argparse
import gc
import json
import re

import torch
import torch.nn as nn

# The step, its CUDA-graph capture and the timing are torch_step.py's (the MLP peer): one recipe.
from torch_step import graphed, step_fn, time_ms


def preset(layers, shape):
    """torchvision's ResNet for a preset word of dptrain's lists ("resnet50", "resnet18(stem=small)"),
    the input channels from the data, 10 classes; None for any other list. The small stem is a 3x3
    stride-1 conv without bias and no max pool (dptrain's stem=small)."""
    m = re.fullmatch(r"\s*(resnet(?:18|34|50))(?:\(([^)]*)\))?\s*", layers)
    if not m:
        return None
    import torchvision
    kw = dict(a.strip().split("=") for a in (m.group(2) or "").split(",") if "=" in a)
    net = getattr(torchvision.models, m.group(1))(num_classes=int(kw.get("classes", 10)))
    if kw.get("stem") == "small":
        net.conv1 = nn.Conv2d(shape[0], 64, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif shape[0] != 3:
        net.conv1 = nn.Conv2d(shape[0], 64, 7, stride=2, padding=3, bias=False)
    # Forward multiply-adds of convs and linears, counted on one sample (as build() counts them).
    macs = [0]
    def hook(mod, inp, out):
        if isinstance(mod, nn.Conv2d):
            macs[0] += out[0].numel() * (mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
                                         + (mod.bias is not None))
        else:
            macs[0] += mod.out_features * (mod.in_features + 1)
    hs = [mod.register_forward_hook(hook) for mod in net.modules() if isinstance(mod, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        net.eval()(torch.zeros((1,) + tuple(shape)))
    for h in hs:
        h.remove()
    return net.train(), int(kw.get("classes", 10)), macs[0]


def build(layers, shape):
    """nn.Sequential of a layer list on (C, H, W) inputs (or a preset's torchvision ResNet), and
    its forward multiply-adds."""
    p = preset(layers, shape)
    if p:
        return p
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": lambda: nn.GELU(approximate="none")}
    mods, macs = [], 0
    for tok in re.findall(r"[a-z]+(?:\([^)]*\))?", layers):
        name, _, args = tok.partition("(")
        parts = [a.strip() for a in args.rstrip(")").split(",") if a.strip()]
        kw = dict(a.split("=") for a in parts if "=" in a)
        pos = [a for a in parts if "=" not in a]
        if name == "conv":
            out, k = int(pos[0]), int(pos[1])
            s, p = int(kw.get("stride", 1)), int(kw.get("pad", 0))
            m = nn.Conv2d(shape[0], out, k, stride=s, padding=p)
            shape = (out, (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1)
            macs += (out * m.in_channels * k * k + out) * shape[1] * shape[2]
        elif name in ("maxpool", "avgpool"):
            k = int(pos[0])
            s = int(kw.get("stride", k))
            m = (nn.MaxPool2d if name == "maxpool" else nn.AvgPool2d)(k, stride=s)
            shape = (shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1)
        elif name == "flatten":
            m = nn.Flatten()
            shape = (shape[0] * shape[1] * shape[2],) if len(shape) == 3 else shape
        elif name == "linear":
            n_in = shape[0] if len(shape) == 1 else shape[0] * shape[1] * shape[2]
            m = nn.Linear(n_in, int(pos[0]))
            macs += (n_in + 1) * int(pos[0])
            shape = (int(pos[0]),)
        elif name == "dropout":
            m = nn.Dropout(float(pos[0]))
        else:
            m = acts[name]()
        mods.append(m)
    return nn.Sequential(*mods), shape[0], macs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", required=True)
    p.add_argument("--input", default="1,28,28", help="C,H,W")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--modes", default="eager,graph,compile-step",
                   help="comma-separated: eager, graph, compile-step, compile-model")
    p.add_argument("--formats", default="nchw,nhwc")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    shape = tuple(int(v) for v in a.input.split(","))
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.benchmark = True
    mib = 1.0 / (1 << 20)
    for fmt in a.formats.split(","):
        for mode in a.modes.split(","):
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            torch.manual_seed(0)
            model, classes, macs = build(a.layers, shape)
            mf = torch.channels_last if fmt == "nhwc" else torch.contiguous_format
            model = model.cuda().to(memory_format=mf)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
            x = torch.randn((a.batch,) + shape, device="cuda").to(memory_format=mf)
            y = torch.randint(0, classes, (a.batch,), device="cuda")
            try:
                bf16 = a.precision == "bf16"
                if mode == "graph":
                    fn = graphed(model, opt, x, y, bf16)
                else:
                    m = torch.compile(model) if mode == "compile-model" else model
                    fn = step_fn(m, opt, x, y, bf16, "cuda")
                    if mode == "compile-step":
                        fn = torch.compile(fn)
                ms, lo, hi = time_ms(fn, a.steps, a.repeat, 20, True)
                peak = torch.cuda.max_memory_allocated()
                reserved = torch.cuda.max_memory_reserved()
                torch.cuda.reset_peak_memory_stats()
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
                steady = torch.cuda.max_memory_allocated()
            except Exception as e:  # a mode this torch cannot run is reported, not fatal
                print(json.dumps({"bench": "torch-cnn", "mode": mode, "format": fmt, "error": str(e)[:300]}), flush=True)
                continue
            sps = a.batch / (ms * 1e-3)
            print(json.dumps({"bench": "torch-cnn", "mode": mode, "format": fmt, "layers": a.layers,
                              "input": a.input, "batch": a.batch, "precision": a.precision,
                              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                              "ms_per_step": round(ms, 5), "ms_min": round(lo, 5), "ms_max": round(hi, 5),
                              "samples_per_s": round(sps, 1), "model_tflops": round(6 * macs * sps / 1e12, 2),
                              "peak_mib": round(peak * mib, 1), "steady_peak_mib": round(steady * mib, 1),
                              "reserved_mib": round(reserved * mib, 1), "allocated_before_mib": round(before * mib, 1)}),
                  flush=True)
            del model, opt, x, y
            fn = None
            if mode.startswith("compile"):
                torch._dynamo.reset()


if __name__ == "__main__":
    main()
