#!/usr/bin/env python3
"""The PyTorch peer for inputs/resnet.ini's recipe: time to a test accuracy on Fashion-MNIST.

torchvision's resnet18 with dptrain's small stem (bench/torch_cnn.py's preset: a 3x3 stride-1
first convolution, no max pool), channels_last, bf16 autocast, the recipe of inputs/resnet.ini:
batch 256 (the last partial batch dropped: 234 steps an epoch), one permutation per epoch,
random crops from the image padded with 2 zeros on every side and left-right flips per sample,
SGD with Nesterov momentum 0.9 and weight decay 5e-4 (PyTorch's SGD update, written with
foreach ops so that the learning rate is a device tensor), a linear warm-up over 234 steps from 0
to 0.1 then a cosine to 0 at the last step (dptrain's LrSchedule), label smoothing 0.1, 16 epochs;
the test set evaluated after every epoch. Pixels are x / 255, as `dpdata fashion-mnist` stores them.
The data lives on the GPU; the augmentation runs there.

Modes: eager; graph (the whole training step, augmentation included, captured once as a CUDA
graph and replayed: PyTorch's whole-network recipe, the strongest mode for this network in
bench/torch_cnn.py's measurements). Before timing, each mode runs its warm-up steps (cuDNN's
autotuner, the capture) and then restores the initial weights, batch-norm statistics and zero
momentum, so the timed run trains from the same start. The clock starts at the first timed step
and includes the evaluations; data loading and warm-up are outside it (dptrain's figure excludes
its data import likewise). One JSON line per mode:
{"bench": "torch-recipe", "mode": ..., "epochs": [{"epoch", "test_acc", "seconds"}, ...],
 "target": 0.94, "seconds_to_target": ..., "final_acc": ..., "seconds": ...}.

    python3 bench/torch_recipe.py --dir /usr/share/datasets/fashion-mnist --modes graph,eager
"""
import argparse
import copy
import gzip
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from torch_cnn import preset
from torch_step import capture


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load(d, device):
    def images(name):
        return torch.from_numpy(idx(os.path.join(d, name), 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)

    def labels(name):
        return torch.from_numpy(idx(os.path.join(d, name), 8).astype(np.int64))

    return (images("train-images-idx3-ubyte.gz").to(device), labels("train-labels-idx1-ubyte.gz").to(device),
            images("t10k-images-idx3-ubyte.gz").to(device), labels("t10k-labels-idx1-ubyte.gz").to(device))


def lr_at(step, a, total):
    """dptrain's LrSchedule: step counts from 1; warm-up from 0, then cosine to 0 at the last step."""
    w = a.warmup
    if w > 0 and step <= w:
        return a.lr * step / w
    span = max(1, total - w - 1)
    t = min(1.0, (step - w - 1) / span)
    return 0.5 * a.lr * (1.0 + math.cos(math.pi * t))


def augment(x, pad):
    """Random crops from x zero-padded by `pad` on every side, then random left-right flips, per sample."""
    b, c, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (b, 1), device=x.device)
    ox = torch.randint(0, 2 * pad + 1, (b, 1), device=x.device)
    rows = (oy + torch.arange(h, device=x.device)).view(b, 1, h, 1).expand(b, c, h, w + 2 * pad)
    xp = torch.gather(xp, 2, rows)
    cols = (ox + torch.arange(w, device=x.device)).view(b, 1, 1, w).expand(b, c, h, w)
    out = torch.gather(xp, 3, cols)
    flip = torch.rand(b, device=x.device) < 0.5
    return torch.where(flip.view(b, 1, 1, 1), out.flip(3), out)


def run(mode, a, data, device):
    xtr, ytr, xte, yte = data
    torch.manual_seed(a.seed)
    model, classes, _ = preset("resnet18(stem=small,classes=10)", (1, 28, 28))
    cuda = device.type == "cuda"
    mf = torch.channels_last
    model = model.to(device).to(memory_format=mf)
    params = [p for p in model.parameters()]
    bufs = [torch.zeros_like(p) for p in params]
    lr_t = torch.zeros((), device=device)
    start = copy.deepcopy(model.state_dict())
    steps_per_epoch = xtr.shape[0] // a.batch
    total = steps_per_epoch * a.epochs
    idx_t = torch.zeros(a.batch, dtype=torch.long, device=device)
    bf16 = a.precision == "bf16"

    def step():
        x = augment(xtr.index_select(0, idx_t), a.crop_padding).contiguous(memory_format=mf)
        y = ytr.index_select(0, idx_t)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            loss = F.cross_entropy(model(x), y, label_smoothing=a.smoothing)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():  # torch.optim.SGD's update (nesterov, weight decay), lr a device tensor
            d = torch._foreach_add(grads, params, alpha=a.weight_decay)
            torch._foreach_mul_(bufs, a.momentum)
            torch._foreach_add_(bufs, d)
            torch._foreach_add_(d, bufs, alpha=a.momentum)
            torch._foreach_mul_(d, lr_t)
            torch._foreach_sub_(params, d)

    run_step = step
    # Warm-up (cuDNN's autotuner; the capture in graph mode), then back to the initial state.
    idx_t.copy_(torch.arange(a.batch, device=device))
    lr_t.fill_(0.0)
    if mode == "graph":
        run_step = capture(step, 3)
    else:
        for _ in range(3):
            step()
    with torch.no_grad():
        model.load_state_dict(start)
        for b in bufs:
            b.zero_()
    if cuda:
        torch.cuda.synchronize()

    def evaluate():
        model.eval()
        hits = 0
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for i in range(0, xte.shape[0], 1000):
                out = model(xte[i:i + 1000].contiguous(memory_format=mf))
                hits += int((out.argmax(1) == yte[i:i + 1000]).sum())
        model.train()
        return hits / xte.shape[0]

    gen = torch.Generator(device="cpu")
    epochs, to_target = [], None
    t0 = time.perf_counter()
    step_no = 0
    for epoch in range(a.epochs):
        gen.manual_seed(a.seed * 1000 + epoch)
        perm = torch.randperm(xtr.shape[0], generator=gen).to(device)
        for k in range(steps_per_epoch):
            step_no += 1
            idx_t.copy_(perm[k * a.batch:(k + 1) * a.batch])
            lr_t.fill_(lr_at(step_no, a, total))
            run_step()
        acc = evaluate()  # synchronises (.sum() to the host)
        sec = time.perf_counter() - t0
        epochs.append({"epoch": epoch + 1, "test_acc": acc, "seconds": round(sec, 3)})
        if to_target is None and acc >= a.target:
            to_target = round(sec, 3)
    out = {"bench": "torch-recipe", "mode": mode, "torch": torch.__version__, "precision": a.precision,
           "batch": a.batch, "steps": total, "epochs": epochs, "target": a.target,
           "seconds_to_target": to_target, "final_acc": epochs[-1]["test_acc"], "seconds": epochs[-1]["seconds"]}
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/usr/share/datasets/fashion-mnist", help="the four idx .gz files")
    p.add_argument("--modes", default="graph,eager")
    p.add_argument("--device", default="cuda")
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=234)
    p.add_argument("--smoothing", type=float, default=0.1)
    p.add_argument("--crop-padding", type=int, default=2)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--target", type=float, default=0.94)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="train rows used (0: all; a dry run on the CPU)")
    a = p.parse_args()
    device = torch.device(a.device)
    torch.backends.cudnn.benchmark = True
    data = load(a.dir, device)
    if a.limit:
        data = (data[0][:a.limit], data[1][:a.limit], data[2][:a.limit], data[3][:a.limit])
    for mode in a.modes.split(","):
        if mode == "graph" and device.type != "cuda":
            print(json.dumps({"bench": "torch-recipe", "mode": mode, "error": "graph needs a GPU"}), flush=True)
            continue
        run(mode, a, data, device)


if __name__ == "__main__":
    main()
