#!/usr/bin/env python3
"""PyTorch's pipeline from JPEG files to a ResNet training step: the peer for dptrain on an
imported image folder.

    python3 bench/torch_imagefolder.py --images DIR [--workers N] [--batch 256] [--steps K]
        [--warmup W] [--arch resnet50] [--mode graph|compile-step|eager] [--parts loader,train,synthetic]
        [--loader-only] [--prefetch 2] [--device cuda|cpu] [--precision bf16|fp32]

torchvision's reference recipe for ImageNet, as strong as it honestly goes:
- data: ImageFolder (PIL decode, .convert("RGB")), RandomResizedCrop(224) (scale (0.08, 1),
  ratio (3/4, 4/3)), RandomHorizontalFlip, ToTensor, Normalize(ImageNet's mean and std), all on
  the CPU workers; DataLoader(num_workers=N (default: one per core), pin_memory=True,
  persistent_workers=True, prefetch_factor=--prefetch, shuffle=True, drop_last=True); each batch
  copied to the GPU with non_blocking=True into the step's input tensor (channels_last).
- step: torchvision's --arch with one output per class folder, channels_last, bf16 autocast,
  cuDNN's autotuner, SGD (Nesterov momentum 0.9), zero_grad(set_to_none=True); by default the
  whole step captured in a CUDA graph (--mode graph: PyTorch's fastest ResNet-50 step on one H200
  on 2026-12-01, 4,791 img/s against 4,692 eager and 4,243 compiled), the step code and capture
  being bench/torch_step.py's, as bench/torch_cnn.py uses them.
Parts (--parts; --loader-only is --parts loader), each timed over --steps batches after
--warmup untimed ones (the warm-up also fills the loader's queue), one JSON line each:
  loader     the loader alone: batches drawn and copied to the device, no step;
  train      the step fed by the loader;
  synthetic  the same step on one random batch resident on the device (no loader): the ceiling.
--device cpu runs a smoke check here (eager, fp32): e.g. --arch resnet18 --batch 8 --steps 3.
"""
import argparse
import json
import os
import shutil
import sys
import time

import torch
import torchvision
from torchvision import transforms as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import graphed, step_fn  # noqa: E402  (the peers' one step recipe)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def say(**rec):
    print(json.dumps({"bench": "torch_imagefolder", **rec}), flush=True)


def make_loader(a, dev):
    tf = T.Compose([T.RandomResizedCrop(a.crop), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(a.images, transform=tf)
    kw = dict(persistent_workers=True, prefetch_factor=a.prefetch) if a.workers > 0 else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
                                         pin_memory=dev.type == "cuda", **kw)
    return ds, loader


def batches(loader):
    """Batches without end: epoch after epoch (persistent workers carry over)."""
    while True:
        for b in loader:
            yield b


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(dev, warmup, steps, one):
    """Seconds for `steps` calls of one() after `warmup` untimed ones, the device drained at both ends."""
    for _ in range(warmup):
        one()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    sync(dev)
    return time.perf_counter() - t0


def make_step(a, dev, classes):
    """The training step on static input tensors (x, y): returns (step, x, y)."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.arch)(num_classes=classes).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5)
    x = torch.randn(a.batch, 3, a.crop, a.crop, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (a.batch,), device=dev)
    bf16 = a.precision == "bf16"
    if a.mode == "graph":
        return graphed(model, opt, x, y, bf16), x, y
    fn = step_fn(model, opt, x, y, bf16, dev.type)
    return (torch.compile(fn) if a.mode == "compile-step" else fn), x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", required=True, help="ImageFolder root: DIR/<class>/<file>")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader workers (default: one per core)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--steps", type=int, default=100, help="timed batches per part")
    ap.add_argument("--warmup", type=int, default=20, help="untimed batches before each part's timing")
    ap.add_argument("--arch", default="resnet50", help="a torchvision.models constructor")
    ap.add_argument("--mode", choices=("graph", "compile-step", "eager"), default=None,
                    help="the step: a CUDA graph (default on cuda), torch.compile, or eager (default on cpu)")
    ap.add_argument("--parts", default="loader,train,synthetic")
    ap.add_argument("--loader-only", action="store_true", help="--parts loader")
    ap.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor (batches per worker)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default=None, help="default: bf16 on cuda, fp32 on cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    a.mode = a.mode or ("graph" if dev.type == "cuda" else "eager")
    a.precision = a.precision or ("bf16" if dev.type == "cuda" else "fp32")
    if dev.type == "cpu" and a.mode == "graph":
        sys.exit("torch_imagefolder: --mode graph needs --device cuda")
    parts = ["loader"] if a.loader_only else a.parts.split(",")
    torch.backends.cudnn.benchmark = True
    shm = shutil.disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else 0
    ds, loader = make_loader(a, dev)
    classes = len(ds.classes)
    common = {"arch": a.arch, "batch": a.batch, "crop": a.crop, "workers": a.workers, "prefetch": a.prefetch,
              "steps": a.steps, "warmup": a.warmup, "device": a.device, "precision": a.precision}
    say(part="setup", images=len(ds), classes=classes, cores=os.cpu_count(), shm_gb=round(shm / 2**30, 1),
        torch=torch.__version__, torchvision=torchvision.__version__, **common)
    it = batches(loader)
    if "loader" in parts:
        def draw():
            xb, yb = next(it)
            xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
        s = timed(dev, a.warmup, a.steps, draw)
        say(part="loader", images_per_s=round(a.steps * a.batch / s, 1), seconds=round(s, 3), **common)
    if "train" in parts or "synthetic" in parts:
        step, x, y = make_step(a, dev, classes)
        if "train" in parts:
            def fed():
                xb, yb = next(it)
                x.copy_(xb.to(dev, non_blocking=True))  # NCHW batch into the channels_last input
                y.copy_(yb.to(dev, non_blocking=True))
                step()
            s = timed(dev, a.warmup, a.steps, fed)
            say(part="train", mode=a.mode, images_per_s=round(a.steps * a.batch / s, 1), seconds=round(s, 3), **common)
        if "synthetic" in parts:
            x.copy_(torch.randn_like(x))
            s = timed(dev, a.warmup, a.steps, step)
            say(part="synthetic", mode=a.mode, images_per_s=round(a.steps * a.batch / s, 1), seconds=round(s, 3),
                **common)


if __name__ == "__main__":
    main()
