#!/usr/bin/env python3
"""Fine-tuning on Fashion-MNIST, dptrain beside PyTorch, in one run.

    python3 bench/finetune_fmnist.py --build BUILD --data DIR --out OUT [--device cuda|cpu]
        [--labelled 100,1000] [--seeds 3] [--quick]

1. Pretraining: resnet18(stem=small) trained by dptrain (inputs/resnet.ini's recipe, --pre-epochs
   epochs) on the Fashion-MNIST training images of classes 0-4 (30,000), tested on their test
   images.
2. The task: classes 5-9 with each --labelled count of training images (balanced, drawn with
   the seed), tested on all 5,000 test images of classes 5-9; labels 5-9 become 0-4. For each
   of --seeds seeds (the draw, train.seed and PyTorch's seed), every run below takes the same
   --steps steps (batch 50, whole epochs), AdamW (weight decay 0.01), one schedule (linear
   warm-up over half an epoch, cosine to 0), no augmentation:
   - dptrain fine_tune: model.init = the pretrained checkpoint, model.init_skip = fc (a new head),
     train.freeze = body for one epoch with batch norm trainable (fastai's fine_tune), then
     everything with the body at train.body_lr_scale = 0.1;
   - dptrain feature extractor: the same start, the body and its batch norm frozen for the whole
     run (train_bn = false: torchvision's tutorial);
   - dptrain from scratch: no model.init, nothing frozen;
   - PyTorch, the fine_tune and feature-extractor recipes: torchvision's resnet18 with the small
     stem, the pretrained checkpoint loaded strictly through scripts/h5_to_torch.py, a new fc,
     frozen parameters with requires_grad = False, the body in a parameter group at 0.1x, the
     same schedule (LambdaLR), eager, channels_last and bf16 autocast on the GPU.
3. Prints one line per run (test accuracy; training-loop seconds; process seconds for dptrain),
   a summary line per count and recipe (mean, min-max over the seeds), and writes
   OUT/finetune.json.
--quick: a few hundred images and a few steps, to check the script on the CPU.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import h5py
import numpy as np


def write_set(path, a, b, fa):
    with h5py.File(path, "w") as g:
        d = g.create_dataset("features", data=a)
        for k, v in fa.items():
            d.attrs[k] = v
        g.create_dataset("labels", data=b.astype(np.int32))
        g.attrs["num_classes"] = np.int64(5)
    return path


def subsets(data, out, quick):
    """The pretraining sets (classes 0-4) and the task's test set (classes 5-9, as 0-4)."""
    with h5py.File(os.path.join(data, "fashion-mnist-train.h5"), "r") as f:
        x, y, fa = f["features"][()], f["labels"][()], dict(f["features"].attrs)
    with h5py.File(os.path.join(data, "fashion-mnist-test.h5"), "r") as f:
        xt, yt = f["features"][()], f["labels"][()]
    pre, pre_t, new_t = np.flatnonzero(y < 5), np.flatnonzero(yt < 5), np.flatnonzero(yt >= 5)
    if quick:
        pre, pre_t, new_t = pre[:256], pre_t[:200], new_t[:200]
    paths = {"pre-train": write_set(os.path.join(out, "pre-train.h5"), x[pre], y[pre], fa),
             "pre-test": write_set(os.path.join(out, "pre-test.h5"), xt[pre_t], yt[pre_t], fa),
             "ft-test": write_set(os.path.join(out, "ft-test.h5"), xt[new_t], yt[new_t] - 5, fa)}
    return paths, fa, (x, y)


def labelled_set(out, train, fa, labelled, seed):
    """labelled training images of classes 5-9 (balanced, drawn with the seed), as 0-4."""
    x, y = train
    rng = np.random.default_rng(seed)
    per = labelled // 5
    new = np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), per, replace=False) for c in range(5, 10)]))
    return write_set(os.path.join(out, f"ft-train-{labelled}-{seed}.h5"), x[new], y[new] - 5, fa)


def dptrain(args, name, keys):
    """One dptrain run; returns (final test accuracy, loop seconds, process seconds, its output)."""
    metrics = os.path.join(args.out, name + ".jsonl")
    dev = ["--device.type", "cpu", "--train.precision", "fp32"] if args.device == "cpu" else []
    cmd = ["mpirun", "-np", "1", "--bind-to", "none", os.path.join(args.build, "dptrain"), "--config",
           os.path.join(args.root, "inputs/resnet.ini"), "--checkpoint.dir", os.path.join(args.out, name),
           "--checkpoint.resume", "none", "--checkpoint.every_steps", "0", "--log.metrics", metrics,
           "--log.progress", "false", *dev, *keys]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - t0
    with open(os.path.join(args.out, name + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout)
    if p.returncode != 0:
        sys.exit(f"finetune_fmnist: dptrain {name} failed (exit {p.returncode}):\n{p.stdout[-3000:]}")
    evals = [json.loads(line) for line in open(metrics) if '"eval"' in line]
    loop = float(re.search(r"done: .*? in ([0-9.]+) s", p.stdout).group(1))
    return evals[-1]["accuracy"], loop, wall, p.stdout


def schedule(step, total, warmup):
    """dptrain's lr factor at 1-based step (warm-up from 0, then cosine to 0 at the last step)."""
    if warmup and step <= warmup:
        return step / warmup
    t = min(1.0, (step - warmup - 1) / max(1, total - warmup - 1))
    return 0.5 * (1 + math.cos(math.pi * t))


def torch_run(args, train, test, fa, pth, recipe, epochs, lr, batch, warmup, seed):
    import torch
    import torch.nn.functional as F
    import torchvision
    dev = torch.device(args.device)
    torch.manual_seed(seed)

    def load(path):
        with h5py.File(path, "r") as f:
            x = torch.from_numpy(f["features"][()]).to(dev).float() * float(fa.get("scale", 1.0)) + float(fa.get("offset", 0.0))
            return x.contiguous(memory_format=torch.channels_last), torch.from_numpy(f["labels"][()].astype(np.int64)).to(dev)
    x, y = load(train)
    xt, yt = load(test)
    m = torchvision.models.resnet18(num_classes=5)
    m.conv1 = torch.nn.Conv2d(1, 64, 3, 1, 1, bias=False)
    m.maxpool = torch.nn.Identity()
    m.load_state_dict(torch.load(pth), strict=True)
    m.fc = torch.nn.Linear(512, 5)  # a new head, PyTorch's default initialisation
    m = m.to(dev).to(memory_format=torch.channels_last)
    head = list(m.fc.parameters())
    body = [p for n, p in m.named_parameters() if not n.startswith("fc.")]
    scale = 0.1 if recipe == "fine_tune" else 1.0
    opt = torch.optim.AdamW([{"params": body, "lr": lr * scale}, {"params": head, "lr": lr}], lr=lr, weight_decay=0.01)
    steps_per_epoch = x.shape[0] // batch
    total = epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: schedule(k + 1, total, warmup))
    bn_params = {id(p) for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d) for p in mod.parameters()}

    def freeze(on):
        for p in body:  # fine_tune: batch norm trains (fastai's train_bn); feature extractor: nothing does
            p.requires_grad_(not on or (recipe == "fine_tune" and id(p) in bn_params))
    freeze(True)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.time()
    g = torch.Generator(device="cpu").manual_seed(seed)
    m.train()
    for epoch in range(epochs):
        if recipe == "fine_tune" and epoch == 1:
            freeze(False)
        order = torch.randperm(x.shape[0], generator=g).to(dev)
        for s in range(steps_per_epoch):
            idx = order[s * batch:(s + 1) * batch]
            with amp:
                loss = F.cross_entropy(m(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    loop = time.time() - t0
    m.eval()
    correct = 0
    with torch.no_grad(), amp:
        for i in range(0, xt.shape[0], 1000):
            correct += (m(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
    return correct / xt.shape[0], loop


def spread(v):
    return {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--data", required=True, help="folder with fashion-mnist-{train,test}.h5 (dpdata fashion-mnist)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--labelled", default="1000", help="comma-separated counts of labelled images (multiples of 5)")
    ap.add_argument("--seeds", type=int, default=1, help="draws of the labelled set and of each run's seed")
    ap.add_argument("--pre-epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=240, help="every fine-tuning run's steps (batch 50)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    counts = [int(c) for c in a.labelled.split(",")]
    if a.quick:
        counts, a.pre_epochs, a.steps, a.seeds = [100], 1, 12, 1
    os.makedirs(a.out, exist_ok=True)
    paths, fa, train = subsets(a.data, a.out, a.quick)
    pre_batch = 64 if a.quick else 256
    n_pre = h5py.File(paths["pre-train"], "r")["labels"].shape[0]
    acc, loop, wall, _ = dptrain(a, "pretrain", [
        "--data.train", paths["pre-train"], "--data.test", paths["pre-test"], "--train.epochs", str(a.pre_epochs),
        "--train.batch_per_rank", str(pre_batch), "--train.warmup_steps", str(n_pre // pre_batch)])
    runs_out = [{"run": "pretrain (dptrain, classes 0-4)", "accuracy": acc, "loop_s": loop, "wall_s": wall}]
    print(f"pretrain: classes 0-4, test accuracy {acc:.4f}, loop {loop:.2f} s", flush=True)
    pre = os.path.join(a.out, "pretrain", sorted(f for f in os.listdir(os.path.join(a.out, "pretrain")) if f.endswith(".h5"))[-1])
    pth = os.path.join(a.out, "pretrain.pth")
    subprocess.run([sys.executable, os.path.join(a.root, "scripts/h5_to_torch.py"), pre, pth], check=True)
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
        have_torch = True
    except ImportError as e:
        print(f"PyTorch runs skipped: {e}")
        have_torch = False
    batch = 25 if a.quick else 50
    summary = []
    for labelled in counts:
        per_epoch = labelled // batch
        epochs = max(1, a.steps // per_epoch)  # the same steps whatever the count: epochs × steps an epoch
        warmup = max(1, per_epoch // 2)
        by_run = {}
        for seed in range(a.seeds):
            train_h5 = labelled_set(a.out, train, fa, labelled, seed)
            common = ["--data.train", train_h5, "--data.test", paths["ft-test"], "--data.augment", "none",
                      "--train.epochs", str(epochs), "--train.batch_per_rank", str(batch), "--train.optimizer", "adamw",
                      "--train.lr", str(a.lr), "--train.weight_decay", "0.01", "--train.warmup_steps", str(warmup),
                      "--train.label_smoothing", "0", "--train.seed", str(seed + 1)]
            init = ["--model.init", pre, "--model.init_skip", "fc"]
            runs = [("dptrain fine_tune", "ft", init + ["--train.freeze", "body", "--train.freeze_epochs", "1",
                                                        "--train.body_lr_scale", "0.1"]),
                    ("dptrain feature extractor", "fx", init + ["--train.freeze", "body", "--train.train_bn", "false"]),
                    ("dptrain from scratch", "scratch", [])]
            for title, name, keys in runs:
                acc, loop, wall, _ = dptrain(a, f"{name}-{labelled}-{seed}", common + keys)
                runs_out.append({"run": title, "labelled": labelled, "seed": seed, "steps": epochs * per_epoch,
                                 "accuracy": acc, "loop_s": loop, "wall_s": wall})
                by_run.setdefault(title, []).append((acc, loop))
                print(f"{labelled} labelled, seed {seed}, {title}: test accuracy {acc:.4f}, loop {loop:.2f} s, "
                      f"process {wall:.2f} s", flush=True)
            if have_torch:
                for title, recipe in (("PyTorch fine_tune", "fine_tune"), ("PyTorch feature extractor", "extract")):
                    acc, loop = torch_run(a, train_h5, paths["ft-test"], fa, pth, recipe, epochs, a.lr, batch, warmup,
                                          seed + 1)
                    runs_out.append({"run": title, "labelled": labelled, "seed": seed, "steps": epochs * per_epoch,
                                     "accuracy": acc, "loop_s": loop})
                    by_run.setdefault(title, []).append((acc, loop))
                    print(f"{labelled} labelled, seed {seed}, {title}: test accuracy {acc:.4f}, loop {loop:.2f} s",
                          flush=True)
        for title, v in by_run.items():
            row = {"labelled": labelled, "run": title, "seeds": len(v), "accuracy": spread([x[0] for x in v]),
                   "loop_s": spread([x[1] for x in v])}
            summary.append(row)
            print(f"summary: {labelled} labelled, {title}: accuracy mean {row['accuracy']['mean']:.4f} "
                  f"({row['accuracy']['min']:.4f}-{row['accuracy']['max']:.4f}) over {len(v)} seed(s), "
                  f"loop mean {row['loop_s']['mean']:.2f} s", flush=True)
    with open(os.path.join(a.out, "finetune.json"), "w") as f:
        json.dump({"labelled": counts, "seeds": a.seeds, "steps": a.steps, "batch": batch, "lr": a.lr,
                   "device": a.device, "summary": summary, "runs": runs_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
