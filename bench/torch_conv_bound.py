#!/usr/bin/env python3
"""The convolutions of a network alone, as cuDNN runs them: a lower bound on any training step
that runs those convolutions through cuDNN unfused (dptrain's or PyTorch's).

For a network of bench-step's lists (a preset such as "resnet18(stem=small)" or a layer list), every
Conv2d's forward pass, then in reverse order its backward pass (the input gradient, except for the
first convolution, whose input is the data; and the weight gradient), on bf16 channels_last tensors
with cuDNN's autotuner (cudnn.benchmark), nothing else: no batch norm, activation, residual sum,
loss or optimizer. Captured in one CUDA graph and replayed, so launch gaps are not counted either.
Measured twice: with any algorithm cuDNN offers, and with deterministic ones only
(torch.backends.cudnn.deterministic, as dptrain keeps). Also each convolution's forward and
backward alone (CUDA events around --per-conv replays), to set beside dptrain's per-op account.

    python3 bench/torch_conv_bound.py --layers "resnet18(stem=small,classes=10)" --input 1,28,28 --batch 256

Prints one JSON object per measurement.
"""
import argparse
import json

import torch
import torch.nn as nn

from torch_cnn import build
from torch_step import capture, time_ms


def conv_list(layers, shape, batch):
    """(module, input shape at `batch`) for every Conv2d of the network, in forward order."""
    model, _, _ = build(layers, shape)
    seen = []
    hs = [m.register_forward_hook(lambda mod, inp, out: seen.append((mod, tuple(inp[0].shape))))
          for m in model.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model.eval()(torch.zeros((1,) + tuple(shape)))
    for h in hs:
        h.remove()
    return [(m, (batch,) + s[1:]) for m, s in seen]


class Convs:
    """Each convolution's bf16 NHWC operands on the GPU, and its passes as closures."""

    def __init__(self, convs):
        cl = torch.channels_last
        self.ops = []
        for i, (m, xs) in enumerate(convs):
            x = torch.randn(xs, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
            w = m.weight.detach().to("cuda", torch.bfloat16).to(memory_format=cl)
            args = (list(m.stride), list(m.padding), list(m.dilation), False, [0, 0], m.groups)
            y = torch.ops.aten.convolution(x, w, None, *args)
            dy = torch.randn_like(y)
            self.ops.append((x, w, dy, args, i > 0))
        self.shapes = [(tuple(m.weight.shape), xs, tuple(m.stride), tuple(m.padding)) for m, xs in convs]

    @staticmethod
    def fwd(op):
        x, w, _, args, _ = op
        return torch.ops.aten.convolution(x, w, None, *args)

    @staticmethod
    def bwd(op):
        x, w, dy, args, dx = op
        return torch.ops.aten.convolution_backward(dy, x, w, None, *args, [dx, True, False])

    def all_fwd(self):
        for op in self.ops:
            self.fwd(op)

    def all_bwd(self):
        for op in reversed(self.ops):
            self.bwd(op)

    def step(self):
        self.all_fwd()
        self.all_bwd()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", required=True)
    p.add_argument("--input", default="1,28,28", help="C,H,W")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--per-conv", type=int, default=50, help="replays per convolution pass timed alone (0: none)")
    p.add_argument("--print-shapes", action="store_true",
                   help="print the convolutions as bench-cudnn-fusion's --shapes (c,h,w,k,r,stride,pad;...) and exit")
    a = p.parse_args()
    shape = tuple(int(v) for v in a.input.split(","))
    if a.print_shapes:
        print(";".join(f"{xs[1]},{xs[2]},{xs[3]},{m.out_channels},{m.kernel_size[0]},{m.stride[0]},{m.padding[0]}"
                       for m, xs in conv_list(a.layers, shape, a.batch)))
        return
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    convs = conv_list(a.layers, shape, a.batch)
    flops = 0
    for (m, xs) in convs:
        co, ci, kh, kw = m.weight.shape
        oh = (xs[2] + 2 * m.padding[0] - kh) // m.stride[0] + 1
        ow = (xs[3] + 2 * m.padding[1] - kw) // m.stride[1] + 1
        flops += 2 * a.batch * oh * ow * co * ci // m.groups * kh * kw
    base = {"bench": "torch-conv-bound", "layers": a.layers, "input": a.input, "batch": a.batch,
            "convs": len(convs), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    for det in (False, True):
        torch.backends.cudnn.deterministic = det
        c = Convs(convs)
        row = dict(base, algorithms="deterministic" if det else "any")
        for part, fn in (("fwd", c.all_fwd), ("bwd", c.all_bwd), ("step", c.step)):
            ms, lo, hi = time_ms(capture(fn), a.steps, a.repeat, 10, True)
            row[part + "_ms"], row[part + "_ms_min"], row[part + "_ms_max"] = round(ms, 5), round(lo, 5), round(hi, 5)
        # Forward flops once, backward twice (the first convolution's input gradient included: an
        # upper count of at most 2% for these networks).
        row["step_tflops"] = round(3 * flops / (row["step_ms"] * 1e-3) / 1e12, 1)
        print(json.dumps(row), flush=True)
        if a.per_conv and not det:
            for i, op in enumerate(c.ops):
                w, xs, st, pd = c.shapes[i]
                print(json.dumps({"bench": "torch-conv-bound-op", "index": i, "weight": w, "input": xs,
                                  "stride": st, "pad": pd,
                                  "fwd_ms": round(time_ms(lambda: Convs.fwd(op), a.per_conv, 1, 3, True)[0], 5),
                                  "bwd_ms": round(time_ms(lambda: Convs.bwd(op), a.per_conv, 1, 3, True)[0], 5)}),
                      flush=True)
        del c


if __name__ == "__main__":
    main()
