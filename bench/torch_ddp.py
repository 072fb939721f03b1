#!/usr/bin/env python3
"""The PyTorch DDP peer for bench-scaling: the same model, optimizer, batch per GPU and precision as
dptrain's scaling rows, data on the GPU, one process per GPU under torchrun.

    torchrun --standalone --nproc_per_node=2 bench/torch_ddp.py --layers 784,4096,4096,4096,4096,10 \\
        --batch 4096 --precision bf16
    torchrun --standalone --nproc_per_node=2 bench/torch_ddp.py --layers "resnet50(classes=10)" \\
        --input 3,224,224 --batch 256 --precision bf16
    python3 bench/torch_ddp.py --batch 4096 --precision bf16      # one process: no DDP wrapper

The model: --layers as MLP widths (784,4096,10: nn.Linear layers, --activation between them); or,
with --input C,H,W (or a --layers that is not widths), a layer list of dptrain's syntax built by
torch_cnn.build: "conv(32,3,pad=1) relu maxpool(2) flatten linear(10)" as nn.Sequential, a preset
("resnet18(stem=small,classes=10)", resnet34, resnet50) as torchvision's ResNet; the model and the
random images (batch, C, H, W) in channels_last, labels in [0, classes).

Each step: zero_grad(set_to_none=True), forward (bf16: under torch.autocast), cross-entropy,
backward, optimizer step. Rows, each timed with CUDA events over --repeat windows of --steps steps
after --warmup untimed ones (compilation happens there), the slowest process's median:
  - eager: with more than one process, DistributedDataParallel(gradient_as_bucket_view=True) for
    each --buckets value of bucket_cap_mb (the fastest is "DDP with its best bucket"); with one
    process, the plain model (so weak-scaling efficiency t1 / tN comes from this one script);
  - compile-model: torch.compile around the (DDP) model at the best bucket — with DDP, PyTorch's
    DDPOptimizer splits the compiled graph at bucket boundaries so reductions overlap backward;
  - compile-step: the whole step (forward, backward, optimizer step) in one torch.compile'd
    function, the (DDP) model inside it.
Rank 0 prints one JSON line: {"bench": "torch-ddp", ..., "rows": [...], "strongest": {...}} (and
writes it to --json-out, which does not depend on how the launcher handles the workers' stdout).
A row that cannot run (torch.compile missing, a compile error) has "error" and no time.
--device cpu runs the same logic on CPU processes over gloo (timing with perf_counter): a dry run.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_cnn.py beside this script

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}


def log(msg):
    print(f"[torch_ddp rank {os.environ.get('RANK', '0')}] {msg}", file=sys.stderr, flush=True)


def mlp(widths, activation, device):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers).to(device)


def is_widths(layers):
    return all(w.strip().isdigit() for w in layers.split(","))


def net(a, shape, device):
    """(model on device, classes, forward multiply-adds per sample): an MLP of --layers' widths
    (shape None; its multiply-adds, the parameters, are counted in main), else torch_cnn.build's
    network of a layer list or preset on (C, H, W) images, in channels_last."""
    if shape is None:
        widths = [int(w) for w in a.layers.split(",")]
        return mlp(widths, a.activation, device), widths[-1], None
    import torch_cnn  # imported here: the MLP path needs neither it nor torchvision
    model, classes, macs = torch_cnn.build(a.layers, shape)
    return model.to(device).to(memory_format=torch.channels_last), classes, macs


def optimizer(a, params):
    # torch.optim's formulas, as dptrain follows them (DESIGN.md).
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=a.lr, weight_decay=a.weight_decay)
    if a.optimizer in ("momentum", "nesterov"):
        return torch.optim.SGD(params, lr=a.lr, momentum=a.momentum, nesterov=a.optimizer == "nesterov",
                               weight_decay=a.weight_decay)
    if a.optimizer == "adam":
        return torch.optim.Adam(params, lr=a.lr, weight_decay=a.weight_decay)
    return torch.optim.AdamW(params, lr=a.lr, weight_decay=a.weight_decay)


class Timer:
    """Wall time of a window of GPU work: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, cuda):
        self.cuda = cuda

    def start(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def stop_ms(self):
        if self.cuda:
            self.b.record()
            torch.cuda.synchronize()
            return self.a.elapsed_time(self.b)
        return (time.perf_counter() - self.t0) * 1e3


def time_step(step, a, cuda, world):
    """(median, min, max, per-rank medians): the slowest process's median over the windows."""
    for _ in range(a.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    timer, windows = Timer(cuda), []
    for _ in range(a.repeat):
        if world > 1:
            dist.barrier()
        timer.start()
        for _ in range(a.steps):
            step()
        windows.append(timer.stop_ms() / a.steps)
    mine = [statistics.median(windows), min(windows), max(windows)]
    if world == 1:
        return mine[0], mine[1], mine[2], [mine[0]]
    t = torch.tensor(mine, dtype=torch.float64, device="cuda" if cuda else "cpu")
    every = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(every, t)
    every = [e.tolist() for e in every]
    slowest = max(every, key=lambda e: e[0])
    return slowest[0], slowest[1], slowest[2], [e[0] for e in every]


def make_step(model, opt, x, y, autocast_dev, bf16):
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(autocast_dev, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return step


def build(a, shape, device, local_rank, world, bucket_mb):
    torch.manual_seed(0)
    model = net(a, shape, device)[0]
    if world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[local_rank] if device.type == "cuda" else None, bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=True)
    return model, optimizer(a, model.parameters())


def run_row(a, kind, bucket_mb, shape, macs, x, y, device, local_rank, world):
    cuda = device.type == "cuda"
    row = {"kind": kind, "ddp": world > 1, "bucket_mb": bucket_mb if world > 1 else None}
    if kind != "eager" and not hasattr(torch, "compile"):
        row["error"] = f"torch.compile not in torch {torch.__version__}"
        return row
    try:
        model, opt = build(a, shape, device, local_rank, world, bucket_mb)
        if kind == "compile-model":
            model = torch.compile(model)
        step = make_step(model, opt, x, y, device.type, a.precision == "bf16")
        if kind == "compile-step":
            step = torch.compile(step)
        ms, lo, hi, per_rank = time_step(step, a, cuda, world)
    except Exception as e:  # a compile failure is a finding, not a crash of the whole peer
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        log(f"{kind} failed: {row['error']}")
        if world > 1:
            dist.barrier()
        return row
    samples = a.batch * world / (ms * 1e-3)
    row.update({"ms_per_step": round(ms, 5), "ms_min": round(lo, 5), "ms_max": round(hi, 5),
                "per_rank_ms": [round(v, 5) for v in per_rank], "samples_per_s": round(samples, 1),
                "model_tflops": round(6 * macs * samples / 1e12, 2)})
    log(f"{kind} bucket {bucket_mb}: {ms:.4f} ms/step")
    return row


def unpin():
    # Launched from an MPI rank, this process inherits that rank's core binding; use every core.
    try:
        os.sched_setaffinity(0, range(os.cpu_count()))
    except (OSError, AttributeError):
        pass


def report(a, rank, world, cuda, local_rank, rows, partial, error=""):
    """Rank 0 writes the rows so far to --json-out (a launch cut short by its time limit still
    leaves its finished rows) and, once complete, prints them as one JSON line."""
    if rank != 0:
        return
    timed = [r for r in rows if "ms_per_step" in r]
    eager = [r for r in timed if r["kind"] == "eager"]
    out = {"bench": "torch-ddp", "error": error or ("" if timed or partial else "no row could be timed"),
           "partial": partial, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(local_rank) if cuda else "cpu",
           "world_size": world, "layers": a.layers, "input": a.input, "activation": a.activation,
           "batch_per_gpu": a.batch, "global_batch": a.batch * world, "precision": a.precision, "optimizer": a.optimizer,
           "warmup": a.warmup, "steps": a.steps, "repeat": a.repeat,
           "best_bucket_mb": min(eager, key=lambda r: r["ms_per_step"])["bucket_mb"] if eager and world > 1 else None,
           "rows": rows, "strongest": min(timed, key=lambda r: r["ms_per_step"]) if timed else None}
    line = json.dumps(out)
    if a.json_out:
        with open(a.json_out + ".tmp", "w") as f:
            f.write(line + "\n")
        os.replace(a.json_out + ".tmp", a.json_out)
    if not partial:
        print(line, flush=True)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="784,4096,4096,4096,4096,10",
                   help="MLP widths, or a layer list / preset of dptrain's syntax (with --input)")
    p.add_argument("--input", help="C,H,W of a layer list's images (default 1,28,28 for a list)")
    p.add_argument("--activation", default="relu", choices=sorted(ACTIVATIONS))
    p.add_argument("--batch", type=int, default=4096, help="samples per process (GPU)")
    p.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--optimizer", default="nesterov", choices=["sgd", "momentum", "nesterov", "adam", "adamw"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--buckets", default="25,50,100,200", help="DDP bucket_cap_mb values (MB)")
    p.add_argument("--compile", default="step", choices=["none", "model", "step", "both"])
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--unpin", action="store_true", help="reset the inherited CPU binding")
    p.add_argument("--json-out", help="rank 0 also writes its JSON line to this file")
    a = p.parse_args()
    if a.input is None and not is_widths(a.layers):
        a.input = "1,28,28"  # torch_cnn.py's default
    if a.input is not None and is_widths(a.layers):
        p.error("--input goes with a layer list; --layers " + a.layers + " are MLP widths")
    return a


def main():
    a = parse()
    if a.unpin:
        unpin()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("torch_ddp.py: --device cuda but torch sees no GPU")
    if cuda:
        torch.cuda.set_device(local_rank)
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    shape = tuple(int(v) for v in a.input.split(",")) if a.input else None
    if shape is None:
        widths = [int(w) for w in a.layers.split(",")]
        classes, macs = widths[-1], sum((widths[i] + 1) * widths[i + 1] for i in range(len(widths) - 1))
    else:
        try:  # the network once, for its classes and multiply-adds: a list it cannot build is named
            _, classes, macs = net(a, shape, torch.device("cpu"))
        except Exception as e:
            why = f"torch_cnn.build cannot build {a.layers!r}: {type(e).__name__}: {e}"[:300]
            log(why)
            report(a, rank, world, cuda, local_rank, [], partial=False, error=why)
            if world > 1:
                dist.destroy_process_group()
            sys.exit(1)
    torch.manual_seed(1 + rank)  # each process its own batch, as each dptrain rank its own rows
    if shape is None:
        x = torch.randn(a.batch, widths[0], device=device)
    else:
        x = torch.randn((a.batch,) + shape, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (a.batch,), device=device)

    buckets = [float(b) for b in a.buckets.split(",")] if world > 1 else [None]
    kinds = {"none": [], "model": ["compile-model"], "step": ["compile-step"],
             "both": ["compile-model", "compile-step"]}[a.compile]
    rows = []
    for b in buckets:
        rows.append(run_row(a, "eager", b, shape, macs, x, y, device, local_rank, world))
        report(a, rank, world, cuda, local_rank, rows, partial=True)
    timed = [r for r in rows if "ms_per_step" in r]
    best_bucket = min(timed, key=lambda r: r["ms_per_step"])["bucket_mb"] if timed else buckets[0]
    for k in kinds:
        rows.append(run_row(a, k, best_bucket, shape, macs, x, y, device, local_rank, world))
        report(a, rank, world, cuda, local_rank, rows, partial=k != kinds[-1])
    if not kinds:
        report(a, rank, world, cuda, local_rank, rows, partial=False)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
