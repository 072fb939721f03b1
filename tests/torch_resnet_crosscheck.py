#!/usr/bin/python3
"""Cross-check dptrain's resnet18(stem=small) against torchvision's, step by step.

For each case (1 rank; 2 ranks with model.sync_bn false and true; accumulation; weight decay
off batch norm and biases with label smoothing) this script
  1. writes a small synthetic image set (1 x 8 x 8, class prototypes plus noise) with h5py,
  2. runs `mpirun -np R dptrain` with `model.layers = resnet18(stem=small)` for a few steps
     with data.shuffle = false, a checkpoint before the first step and one at the end,
     metrics every step, then `dptrain --eval` on the final checkpoint,
  3. builds torchvision's resnet18 (conv1 a 3x3 stride-1 conv without bias on one channel,
     maxpool the identity: the small stem), loads the step-0 checkpoint with a *strict*
     load_state_dict of {k: f["model"][k]} (the torchvision key names are the contract), and
     replays the run: global batch k = rows [kG, (k+1)G) (DESIGN.md, data order); with
     sync_bn = false each rank's micro-batch is a forward pass of its own with that rank's
     running statistics (held per rank here, averaged over the ranks before the final
     checkpoint as dptrain does); with sync_bn = true a micro-batch is every rank's rows in one
     pass; F.cross_entropy summed / G, torch.optim.SGD (Nesterov, weight decay, or two
     parameter groups when decay_bn_and_bias = false),
  4. compares the first step tightly (its loss, every tensor of the step-1 checkpoint:
     parameters, running means and variances, num_batches_tracked exactly), later steps'
     losses, every tensor of the final checkpoint and --eval's test loss (running statistics,
     plain cross-entropy) loosely: ReLU's kinks make fp32 runs drift (see the tolerances).

Usage (ctest runs it this way):
  /usr/bin/python3 tests/torch_resnet_crosscheck.py --build <build dir> --root <repo root>
--build is any folder holding the dptrain executable (a build folder, or binaries copied to a
GPU machine). `--device cuda` runs dptrain on the CUDA backend (train.precision = fp32) against
the same torch replay on the CPU; `--mpirun-args="..."` adds options to every mpirun, and with
Open MPI the script forwards LD_LIBRARY_PATH (-x) when it is set.
Exit codes: 0 all cases agree, 1 a mismatch, 2 dptrain or the set-up failed, 77 skipped (no
torch/torchvision/h5py/numpy, no mpirun, or --device cuda where no GPU is visible). `--perturb X`
multiplies torch's lr by (1 + X): the check must then fail (e.g. --perturb 0.01).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77

try:
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchvision
except ImportError as e:  # ctest maps this exit code to "skipped" (SKIP_RETURN_CODE)
    print(f"torch_resnet_crosscheck: SKIPPED: {sys.executable} cannot import {e.name!r} ({e}); "
          "Debian: apt-get install python3-torchvision")
    sys.exit(SKIP)

# Tolerances. Both sides compute in fp32 and differ in summation order only (im2col + OpenBLAS
# GEMMs vs torch's convolutions; batch statistics summed in double by dptrain and by torch's CPU
# kernels, in other orders; gradients reduced over ranks vs accumulated here).
# Step 1 (every op once, forward and backward, the update, batch statistics over the right rows,
# running statistics averaged over the ranks) is checked tightly: we observe losses within
# ~2e-6 relative and tensors within ~2e-6 of their scale, so the tolerances below leave > 20x
# margin, while a 1% learning-rate error (--perturb 0.01), a statistic over the wrong rows or
# running statistics not averaged fail it.
LOSS_RTOL = 1e-4
PARAM_RTOL = 1e-3
PARAM_ATOL = 1e-4  # of the tensor's max |value|
# Later steps drift apart through ReLU's kinks: in every batch some units' inputs lie within
# ~1e-6 of 0 (float64 shows |input| down to 1e-6 in layer1..layer4), where fp32 rounding
# decides whether the unit's gradient passes; in layer4's 2x2 maps one unit is a few % of a
# channel's gradient. dptrain's gradient from its own state agrees with torch's in float64 to
# ~3e-6 on batches without such a unit and differs by a few % in one block's tensors on batches
# with one, and torch in float32 drifts from itself in float64 by 2.5e-3 in loss over 7 steps.
# Later steps are therefore checked loosely: losses within LATE_RTOL, every final tensor within
# FINAL_RTOL of how far it moved from step 0 (in norm; observed up to 0.18), --eval's loss
# against torch's run within LATE_RTOL and against torch on the same checkpoint to its printed
# 4 decimals.
LATE_RTOL = 2e-2
FINAL_RTOL = 0.25
# --device cuda keeps these tolerances: dptrain's fp32 on the GPU is FMA math without TF32 and
# without Winograd or FFT convolutions (src/cuda/conv/cudnn_conv.cpp), and batch statistics summed in
# double by its own kernels, so it should differ from torch's fp32 by summation order only.
# Summation order can still put a ReLU input that lies a few 1e-7 of its tensor's spread from 0
# on the other side of the kink, and that one unit's gradient, passed or stopped, moves step 1's
# tensors below it by more than the tolerances leave (on the H200, 2026-12-02: r2_local_bn_acc2's
# bn1.bias[0], -2.11523e-05 against torch's -2.10548e-05, 0.46%). Where step 1 fails against
# torch in float32 and in float64 (below), it is judged a third way: against torch's float64
# step with one ReLU input within KINK_RTOL of its tensor's largest |value| taken the other way,
# nearest first. Every tensor must then agree within the step-1 tolerances; the unit that
# explains it is printed, and the later steps are compared with torch's float32 run that takes
# that unit the same way (the two runs go on from the same side of the kink). That is exact
# arithmetic with a different tie at the kink, not a wider tolerance: an lr 1% off (--perturb
# 0.01) still fails every case, with or without a unit taken the other way. (r2_local_bn_acc2 on
# the H200: layer3.0's ReLU after its add, rank 1's second micro-batch, an input at +3.9e-06 in
# float64, 6.8e-07 of its tensor's spread; taken the other way, float64 gives bn1.bias[0] =
# -2.11527e-05, 3.9e-10 from dptrain. Against torch's unchanged run, its final layer1.0.bn1.bias
# then lies 0.29x its change away, over FINAL_RTOL.)
KINK_RTOL = 1e-5
KINK_MAX_TRIES = 64

IMG = (1, 12, 12)
CLASSES = 4
N_TRAIN, N_TEST = 160, 64
SEED = 5

CASES = [
    dict(name="r1", ranks=1, b=16, acc=1, sync_bn=False),
    dict(name="r2_local_bn", ranks=2, b=8, acc=1, sync_bn=False),
    dict(name="r2_sync_bn", ranks=2, b=8, acc=1, sync_bn=True),
    dict(name="r2_local_bn_acc2", ranks=2, b=4, acc=2, sync_bn=False),
    dict(name="r2_sync_bn_acc2_nodecay_smooth", ranks=2, b=4, acc=2, sync_bn=True, decay_bn_and_bias=False,
         label_smoothing=0.1),
]
STEPS, LR, MOMENTUM, WD = int(os.environ.get("DPT_XCHECK_STEPS", 6)), 0.002, 0.9, 5e-3


# The layer-list cross-check's harness: its errors and its way of running a command.
from torch_crosscheck import Mismatch, SetupError, run  # noqa: E402


def make_datasets(tmp):
    rng = np.random.default_rng(9)
    proto = rng.normal(0, 1, (CLASSES,) + IMG)
    out = {}
    for name, n in (("train", N_TRAIN), ("test", N_TEST)):
        y = rng.integers(0, CLASSES, n).astype(np.int64)
        x = (proto[y] + rng.normal(0, 0.9, (n,) + IMG)).astype(np.float32)
        path = os.path.join(tmp, f"img-{name}.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("features", data=x)
            f.create_dataset("labels", data=y)
            f.attrs["num_classes"] = np.int64(CLASSES)
        out[name] = (path, torch.from_numpy(x), torch.from_numpy(y))
    return out


def write_ini(path, c, data, ckdir, metrics, device):
    # cuda: cuDNN's heuristic picks the convolution algorithms (no timing), so a rerun of a
    # failing case repeats its numbers.
    device_lines = ["type = cuda", "conv_tuning = heuristic"] if device == "cuda" else ["type = cpu", "threads = 1"]
    lines = [
        "[model]", "layers = resnet18(stem=small)", f"sync_bn = {str(c['sync_bn']).lower()}",
        "[data]", f"train = {data['train'][0]}", f"test = {data['test'][0]}", "shuffle = false",
        "[train]", "epochs = 1", f"steps = {STEPS}", f"batch_per_rank = {c['b']}", f"accumulate = {c['acc']}",
        "optimizer = nesterov", f"lr = {LR!r}", f"momentum = {MOMENTUM!r}", f"weight_decay = {WD!r}",
        f"decay_bn_and_bias = {str(c.get('decay_bn_and_bias', True)).lower()}",
        f"label_smoothing = {c.get('label_smoothing', 0.0)!r}", "lr_scaling = none", f"seed = {SEED}",
        "precision = fp32",
        "[device]", *device_lines,
        "[comm]", "backend = mpi",
        "[checkpoint]", f"dir = {ckdir}", "every_steps = 1", "keep = 0", "at_start = true", "resume = none",
        "[log]", f"metrics = {metrics}", "every_steps = 1", "progress = false",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_ckpt(path):
    with h5py.File(path, "r") as f:
        return {k: f["model"][k][()] for k in f["model"]}


def torchvision_resnet18(state):
    m = torchvision.models.resnet18(num_classes=CLASSES)
    m.conv1 = torch.nn.Conv2d(IMG[0], 64, 3, 1, 1, bias=False)
    m.maxpool = torch.nn.Identity()
    m.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}, strict=True)
    return m


def bn_buffers(m):
    """Running means, variances and counts: what each rank holds for itself (sync_bn = false)."""
    return dict(m.named_buffers())


def averaged(ranks_stats):
    """dptrain's average of the ranks' running statistics before an evaluation or checkpoint:
    a float sum over the ranks, times float(1 / R). (dptrain goes on from the average; the
    update is linear, so averaging once at the end is the same to rounding.)"""
    R = len(ranks_stats)
    out = {}
    for n in ranks_stats[0]:
        s = ranks_stats[0][n].clone()
        if not s.is_floating_point():  # num_batches_tracked: the same on every rank
            out[n] = s
            continue
        for r in range(1, R):
            s += ranks_stats[r][n]
        out[n] = s * torch.tensor(1.0 / R, dtype=s.dtype)
    return out


class Kinks:
    """What the replay's ReLUs do besides ReLU: record every input (record, a dict filled with
    (pass, module, call) -> input), or take one unit the other way (flip = (pass, module, call,
    flat index)). A pass is one forward pass of the run, in order."""

    def __init__(self, record=None, flip=None):
        self.record, self.flip, self.pass_id, self.calls = record, flip, -1, {}

    def next_pass(self):
        self.pass_id += 1
        self.calls = {}


class KinkReLU(torch.nn.Module):
    """torch.nn.ReLU as x * (x > 0), with Kinks' recording and flipping."""

    def __init__(self, name, kinks):
        super().__init__()
        self.name, self.kinks = name, kinks

    def forward(self, x):
        k = self.kinks
        call = k.calls.get(self.name, 0)
        k.calls[self.name] = call + 1
        key = (k.pass_id, self.name, call)
        if k.record is not None:
            k.record[key] = x.detach().clone()
        mask = x > 0
        if k.flip is not None and k.flip[:3] == key:
            mask = mask.clone()
            mask.view(-1)[k.flip[3]] ^= True
        return x * mask.to(x.dtype)


def with_kinks(m, kinks):
    for name, mod in list(m.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, torch.nn.ReLU):
                setattr(mod, child_name, KinkReLU(f"{name}.{child_name}".lstrip("."), kinks))
    return m


def replay(c, state, data, perturb, dtype=torch.float32, steps=STEPS, kinks=None):
    """The run in torch; returns (per-step losses, state_dict after step 1, final state_dict, test loss).
    kinks: a Kinks for the ReLUs (torch's own where None)."""
    m = torchvision_resnet18(state).to(dtype)
    if kinks is not None:
        with_kinks(m, kinks)
    m.train()
    R, b, A = c["ranks"], c["b"], c["acc"]
    G = R * b * A
    if c.get("decay_bn_and_bias", True):
        groups = [dict(params=list(m.parameters()))]
    else:
        groups = [dict(params=[p for p in m.parameters() if p.ndim > 1]),
                  dict(params=[p for p in m.parameters() if p.ndim <= 1], weight_decay=0.0)]
    opt = torch.optim.SGD(groups, lr=LR * (1 + perturb), momentum=MOMENTUM, nesterov=True, weight_decay=WD)
    smooth = c.get("label_smoothing", 0.0)
    x, y = data["train"][1].to(dtype), data["train"][2]
    # sync_bn = false: every rank's running statistics, swapped into the model for its passes.
    ranks_stats = [{n: t.clone() for n, t in bn_buffers(m).items()} for _ in range(R)]
    losses, first = [], None
    for k in range(steps):
        opt.zero_grad()
        total = 0.0
        for a in range(A):
            base = k * G + a * b * R
            if c["sync_bn"] or R == 1:
                rows = slice(base, base + b * R)
                if kinks is not None:
                    kinks.next_pass()
                loss = F.cross_entropy(m(x[rows]), y[rows], reduction="sum", label_smoothing=smooth)
                (loss / G).backward()
                total += loss.item()
                continue
            for r in range(R):
                with torch.no_grad():
                    for n, t in bn_buffers(m).items():
                        t.copy_(ranks_stats[r][n])
                rows = slice(base + r * b, base + (r + 1) * b)
                if kinks is not None:
                    kinks.next_pass()
                loss = F.cross_entropy(m(x[rows]), y[rows], reduction="sum", label_smoothing=smooth)
                (loss / G).backward()
                total += loss.item()
                ranks_stats[r] = {n: t.clone() for n, t in bn_buffers(m).items()}
        opt.step()
        losses.append(total / G)
        if k == 0:
            first = {n: t.clone() for n, t in m.state_dict().items()}
            first.update(averaged(ranks_stats) if not c["sync_bn"] and R > 1 else {})
    if not c["sync_bn"] and R > 1:
        with torch.no_grad():
            for n, t in averaged(ranks_stats).items():
                bn_buffers(m)[n].copy_(t)
    if steps < STEPS:  # step 1 alone: no evaluation
        return losses, first, m.state_dict(), None
    m.eval()
    with torch.no_grad():
        xt, yt = data["test"][1].to(dtype), data["test"][2]
        test_loss = F.cross_entropy(m(xt), yt, reduction="sum").item() / len(yt)
    return losses, first, m.state_dict(), test_loss


def check_tensors(c, what, ck, sd, start=None, limit=None, exact=None, rounding=None):
    """Every tensor of dptrain's checkpoint against torch's state_dict. start = None: elementwise
    within PARAM_ATOL of the tensor's scale + PARAM_RTOL, plus twice torch's own rounding error
    where `exact` (torch's run in float64) is given, or twice `rounding` (that error, per tensor)
    where sd is itself a float64 run. start given: per tensor, the norm of the difference within
    `limit` times the norm of torch's change since start. Returns the worst error relative to
    what was allowed."""
    if set(ck) != set(sd):
        raise Mismatch(f"{c['name']}: checkpoint keys differ from torchvision's: {sorted(set(ck) ^ set(sd))[:5]}")
    worst = 0.0
    for k, t in sd.items():
        a, tn = np.asarray(ck[k]).astype(np.float64), t.numpy().astype(np.float64)
        if k.endswith("num_batches_tracked"):
            if np.asarray(ck[k]).dtype != np.int64 or int(a) != int(tn):
                raise Mismatch(f"{c['name']}: {what}: {k} = {ck[k]!r}, torch {int(tn)}")
            continue
        if start is None:
            scale = float(np.abs(tn).max()) or 1.0
            err = np.abs(a - tn)
            allowed = PARAM_ATOL * scale + PARAM_RTOL * np.abs(tn)
            if exact is not None:
                allowed = allowed + 2 * np.abs(tn - exact[k].numpy().astype(np.float64))
            if rounding is not None:
                allowed = allowed + 2 * rounding[k]
            ratio = float((err / allowed).max())
            if ratio > 1:
                i = int(np.argmax(err / allowed))
                f64 = f", float64 {exact[k].numpy().flat[i]}" if exact is not None else ""
                raise Mismatch(f"{c['name']}: {what}: tensor {k} element {i}: {a.flat[i]} vs torch {tn.flat[i]}{f64} "
                               f"(|diff| {err.flat[i]:.2e}, allowed {allowed.flat[i]:.2e})")
        else:
            moved = np.linalg.norm(tn - np.asarray(start[k], dtype=np.float64))
            ratio = float(np.linalg.norm(a - tn) / (limit * moved + 1e-12))
            if ratio > 1:
                raise Mismatch(f"{c['name']}: {what}: tensor {k} differs from torch by {np.linalg.norm(a - tn):.2e} "
                               f"(norm), more than {limit:g} x its change {moved:.2e}")
        worst = max(worst, ratio)
    return worst


def judge_at_a_kink(c, start, data, perturb, ck1, t_first, exact, inputs, failure):
    """Step 1 against torch's float64 step with one ReLU input near its kink taken the other way
    (see KINK_RTOL), nearest first. Returns the worst error relative to what was allowed and the
    unit, (pass, module, call, index), for the first unit that explains every tensor. Raises
    `failure`, extended, where none does."""
    near = []
    for key, x in inputs.items():
        a = x.abs().view(-1)
        spread = float(a.max()) or 1.0
        for i in torch.nonzero(a <= KINK_RTOL * spread).view(-1).tolist():
            near.append((float(a[i]) / spread, key, i, float(x.view(-1)[i])))
    near.sort(key=lambda n: n[0])
    rounding = {k: np.abs(t_first[k].numpy().astype(np.float64) - exact[k].numpy().astype(np.float64))
                for k in t_first if not k.endswith("num_batches_tracked")}
    tried = near[:KINK_MAX_TRIES]
    for rel, (pass_id, module, call), i, x in tried:
        variant = replay(c, start, data, perturb, torch.float64, steps=1,
                         kinks=Kinks(flip=(pass_id, module, call, i)))[1]
        try:
            worst = check_tensors(c, "after step 1", ck1, variant, rounding=rounding)
        except Mismatch:
            continue
        print(f"  note: {c['name']}: step 1 agrees with float64 torch where one ReLU input at its kink is "
              f"taken the other way: {module} (its use {call + 1} in forward pass {pass_id + 1}), unit {i}, "
              f"input {x:+.2e} ({rel:.1e} of its tensor's largest |value|); against torch unchanged: {failure}",
              flush=True)
        return worst, (pass_id, module, call, i)
    raise Mismatch(f"{failure}; nor does any of the {len(tried)} ReLU input(s) within {KINK_RTOL:g} of their "
                   f"tensor's largest |value| from the kink, taken the other way, explain it")


def run_case(c, tmp, tools, data, mpirun, perturb, device):
    """mpirun: the launcher and the options every launch takes."""
    d = os.path.join(tmp, c["name"])
    os.makedirs(d)
    ini, ckdir, metrics = os.path.join(d, "run.ini"), os.path.join(d, "ck"), os.path.join(d, "m.jsonl")
    write_ini(ini, c, data, ckdir, metrics, device)
    t0 = time.time()
    run([*mpirun, "-np", str(c["ranks"]), "--bind-to", "none", tools["dptrain"], "--config", ini], what="dptrain")
    seconds = time.time() - t0
    losses = []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r and "eval" not in r:
                losses.append(float(r["loss"]))
    if len(losses) != STEPS:
        raise Mismatch(f"{c['name']}: dptrain logged {len(losses)} steps, expected {STEPS}")
    ck = lambda step: read_ckpt(os.path.join(ckdir, f"ckpt-{step:09d}.h5"))
    final = os.path.join(ckdir, f"ckpt-{STEPS:09d}.h5")
    out = run([*mpirun, "-np", str(c["ranks"]), "--bind-to", "none", tools["dptrain"], "--eval",
               "--checkpoint", final, "--data.test", data["test"][0]], what="dptrain --eval")
    m = re.search(r"loss ([0-9.eE+-]+), accuracy", out)
    if not m:
        raise SetupError(f"no loss in dptrain --eval's output:\n{out[-2000:]}")
    eval_loss = float(m.group(1))

    start = ck(0)
    t_losses, t_first, t_final, t_eval = replay(c, start, data, perturb)
    worst = {}
    # Step 1: every op once, forward, backward, update, batch statistics over the right rows
    # and running statistics averaged: tight.
    rel = abs(losses[0] - t_losses[0]) / abs(t_losses[0])
    if rel > LOSS_RTOL:
        raise Mismatch(f"{c['name']}: step 1 loss {losses[0]} vs torch {t_losses[0]} (rel {rel:.2e})")
    try:
        worst["step1"] = check_tensors(c, "after step 1", ck(1), t_first)
    except Mismatch as e:
        # Where an element sums many terms that cancel (a batch-norm bias gradient), torch's
        # float32 itself lies off the exact value by more than the tolerance leaves: judged
        # again with twice torch's own error there (its run in float64) added to the allowance.
        inputs = {}
        exact = replay(c, start, data, perturb, torch.float64, steps=1, kinks=Kinks(record=inputs))[1]
        try:
            worst["step1"] = check_tensors(c, "after step 1", ck(1), t_first, exact=exact)
            print(f"  note: {c['name']}: step 1 judged with float64 torch's rounding error as well ({e})", flush=True)
        except Mismatch as e64:
            worst["step1"], unit = judge_at_a_kink(c, start, data, perturb, ck(1), t_first, exact, inputs, e64)
            # The later steps go on from dptrain's side of the kink: against torch's run (float32)
            # with the same unit taken the same way.
            t_losses, _, t_final, t_eval = replay(c, start, data, perturb, kinks=Kinks(flip=unit))
    # Later steps: ReLU's kinks (see LATE_RTOL) make them drift apart within a few 1e-3.
    for s_ in range(1, STEPS):
        rel = abs(losses[s_] - t_losses[s_]) / abs(t_losses[s_])
        worst["loss"] = max(worst.get("loss", 0.0), rel / LATE_RTOL)
        if rel > LATE_RTOL:
            raise Mismatch(f"{c['name']}: step {s_ + 1} loss {losses[s_]} vs torch {t_losses[s_]} (rel {rel:.2e})")
    worst["final"] = check_tensors(c, f"after step {STEPS}", ck(STEPS), t_final, start, FINAL_RTOL)
    # --eval prints 4 decimals: against torch's evaluation of the same checkpoint, then that
    # against torch's own run within the twins' spread.
    mt = torchvision_resnet18(ck(STEPS)).eval()
    with torch.no_grad():
        own = F.cross_entropy(mt(data["test"][1]), data["test"][2], reduction="sum").item() / N_TEST
    if abs(eval_loss - own) > 6e-5:
        raise Mismatch(f"{c['name']}: --eval loss {eval_loss} but torch on the same checkpoint {own:.6f}")
    rel = abs(own - t_eval) / abs(t_eval)
    worst["eval"] = rel / LATE_RTOL
    if rel > LATE_RTOL:
        raise Mismatch(f"{c['name']}: test loss {own} vs torch {t_eval} (rel {rel:.2e})")
    return c["name"], worst, seconds


def mpirun_command(mpirun, extra):
    """The launcher with the caller's options. Open MPI's also forwards LD_LIBRARY_PATH (-x), where
    a GPU machine's cuDNN may be found: ranks that its daemons start elsewhere would not inherit it
    (on one host it changes nothing)."""
    cmd = [mpirun] + shlex.split(extra)
    if os.environ.get("LD_LIBRARY_PATH"):
        v = subprocess.run([mpirun, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if "Open MPI" in v.stdout or "open-mpi" in v.stdout:
            cmd += ["-x", "LD_LIBRARY_PATH"]
    return cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="folder holding the dptrain executable")
    ap.add_argument("--root", required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="dptrain's device.type (cuda: fp32 on the GPU; torch stays on the CPU)")
    ap.add_argument("--mpirun-args", default="", help='extra options for every mpirun, in the = form: --mpirun-args="-x FOO"')
    ap.add_argument("--case", action="append", help="run only this case (repeatable)")
    ap.add_argument("--perturb", type=float, default=0.0)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args()
    tools = {}
    for t in ("dptrain",):
        p = os.path.join(a.build, t)
        if not (os.path.isfile(p) and os.access(p, os.X_OK)):
            print(f"torch_resnet_crosscheck: ERROR: no {t} in {a.build}")
            return 2
        tools[t] = os.path.abspath(p)
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        print("torch_resnet_crosscheck: SKIPPED: no mpirun on PATH")
        return SKIP
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    os.environ["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    launch = mpirun_command(mpirun, a.mpirun_args)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cases = [c for c in CASES if not a.case or c["name"] in a.case]
    print(f"torch_resnet_crosscheck: torch {torch.__version__}, torchvision {torchvision.__version__}; "
          f"{len(cases)} case(s), {STEPS} steps each; dptrain on {a.device}; {' '.join(launch)}")
    tmp = tempfile.mkdtemp(prefix="dpt-resnet-xcheck-")
    failures = []
    try:
        data = make_datasets(tmp)
        for c in cases:
            try:
                name, w, s = run_case(c, tmp, tools, data, launch, a.perturb, a.device)
                print(f"  PASS {name:<32} worst error / allowed: step 1 {w['step1']:.3f}, later losses {w['loss']:.3f}, "
                      f"final tensors {w['final']:.3f}, eval {w['eval']:.3f}  (dptrain {s:.1f} s)", flush=True)
            except Mismatch as e:
                failures.append(str(e))
                print(f"  FAIL {e}", flush=True)
    except SetupError as e:
        # dptrain's own words where device.type = cuda finds no GPU: a skip, as the GPU tests'.
        if a.device == "cuda" and "no CUDA device is visible" in str(e):
            print(f"torch_resnet_crosscheck: SKIPPED: --device cuda, but no CUDA device is visible to dptrain "
                  f"({tools['dptrain']})")
            return SKIP
        print(f"torch_resnet_crosscheck: ERROR: {e}")
        return 2
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"torch_resnet_crosscheck: FAILED: {len(failures)} of {len(cases)} case(s)")
        return 1
    print("torch_resnet_crosscheck: all cases agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
