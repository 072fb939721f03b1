#!/usr/bin/python3
"""Cross-check dptrain against PyTorch, step by step.

For each case of a small matrix (optimizer x activation x ranks x accumulate x data type x lr
schedule, and convolutional layer lists with dropout and augmentation) this script
  1. writes a small dataset (`dpdata synth blobs`, float32; or an h5py-written uint8 file with
     scale/offset attributes and int64 labels),
  2. runs `mpirun -np R dptrain` for a few dozen steps with data.shuffle = false, a checkpoint
     before the first step (checkpoint.at_start) and one at the end, metrics every step,
  3. replays the same run in PyTorch: an nn.Sequential of nn.Linear + activations (or of the
     layer list: nn.Conv2d, pooling, nn.Flatten, ...) loaded from the at-start checkpoint,
     global batch k = rows [kG, (k+1)G) (DESIGN.md, data order), dropout masks and
     augmentation draws recomputed here from their definitions (dropout.hpp, augment.cpp),
     F.cross_entropy (mean over the global batch), torch.optim with the same hyper-parameters,
     and the learning rate of each step from an independent implementation of the schedule,
  4. compares per-step losses and learning rates (metrics JSONL) and the final parameters and
     optimizer state (final checkpoint) against torch, and fails loudly on any mismatch.

Usage (ctest runs it this way):
  /usr/bin/python3 tests/torch_crosscheck.py --build <build dir> --root <repo root>
Exit codes: 0 all cases agree, 1 a mismatch (message names case, step/tensor and the error),
2 dptrain or the set-up failed, 77 skipped (no torch/h5py/numpy or no mpirun).
`--perturb X` multiplies torch's learning rate by (1 + X): a way to see the check has teeth
(e.g. --perturb 0.01 must fail every case).
"""
import argparse
import json
import math
import os
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
except ImportError as e:  # ctest maps this exit code to "skipped" (SKIP_RETURN_CODE)
    print(f"torch_crosscheck: SKIPPED: {sys.executable} cannot import {e.name!r} ({e})")
    sys.exit(SKIP)

# ---------------------------------------------------------------------------------------------
# Tolerances.
# Both sides compute in fp32; they differ only in summation order (OpenBLAS GEMM blocking vs
# torch's, gradients summed per rank / per micro-batch then reduced over MPI vs one pass over
# the global batch, the loss summed in double by dptrain vs float by torch). A single step's
# loss then agrees to a few ulp (~1e-7 relative); the metrics file prints 6 significant digits
# (<= 5e-6 relative), and over 30-40 steps the parameter differences (below) move later
# losses by ~1e-6. LOSS_RTOL = 1e-4 leaves > 10x margin over what we observe (max ~5e-6) while
# any real semantic difference (a wrong row, a missing weight-decay term, momentum off by
# one step, lr 1% off) shows up at 1e-3 or more within a few steps.
LOSS_RTOL = 1e-4
# Parameters after N steps: each step adds rounding noise of ~1e-7 relative to the update;
# Adam divides by sqrt(v), which amplifies noise on entries whose gradient is tiny, and the
# tanh/sigmoid/gelu derivatives differ by an ulp between std::erf/exp and torch. We compare
# elementwise |a - b| <= PARAM_ATOL * scale + PARAM_RTOL * |b|, scale = max|b| of the tensor
# (so the absolute floor follows the tensor's magnitude). Observed max errors: parameters
# <= 3e-6 of the scale, optimizer state <= 1.3e-6 (see the note below); 1e-3
# relative / 1e-4 of scale absolute leaves ~7x margin and still catches a 1% lr error or a
# dropped weight-decay term by orders of magnitude (`--perturb 0.01` fails every case).
PARAM_RTOL = 1e-3
PARAM_ATOL = 1e-4
LR_RTOL = 1e-5  # metrics print lr with 6 significant digits
# A note on Adam's eps. Adam's first update is lr * g / (|g| + eps): for an entry whose gradient
# nearly cancels (|g| ~ eps while its terms are ~1e-3), rounding noise d in g moves the
# parameter by up to lr * d / eps. With eps = 1e-8, d ~ 1e-10 and lr = 0.01 that is 1e-4:
# the whole tolerance, for a perfectly correct implementation (we measured 1.4e-4 of max|b|
# on one sigmoid weight with |g| = 5.5e-8 after one step; 5e-5 with eps = 1e-6, where the
# same entry sees d ~ 1e-9). The sigmoid case therefore uses eps = 1e-5 (worst case
# lr * d / eps ~ 1e-6); the relu Adam case keeps the default 1e-8 (its dead units give exact
# zeros on both sides) and the gelu case uses 1e-6.
# Adam's scalars: torch forms 1 - beta and the bias corrections in double from the Python
# floats and rounds them to float once; dptrain does the same (adam_scalars). When it formed
# them in float from float(beta2), its exp_avg_sq came out ~1.3e-5 (relative) below torch's for
# beta2 = 0.999; now the optimizer state agrees to ~1e-6.

N_ROWS, DIM, CLASSES = 2048, 20, 5
LAYERS = [DIM, 48, 24, CLASSES]

# Each case: name, ranks, batch_per_rank, accumulate, optimizer, activation, hyper-parameters,
# dataset ("f32" blobs from dpdata, "u8" h5py-written), schedule.
CASES = [
    dict(name="sgd_relu", ranks=2, b=16, acc=1, opt="sgd", act="relu", lr=0.1, wd=0.0,
         data="f32", steps=30),
    dict(name="momentum_tanh_wd", ranks=2, b=16, acc=1, opt="momentum", act="tanh", lr=0.05,
         momentum=0.9, wd=0.01, data="f32", steps=30),
    dict(name="nesterov_relu_1rank", ranks=1, b=32, acc=1, opt="nesterov", act="relu", lr=0.05,
         momentum=0.8, wd=0.0, data="f32", steps=30),
    dict(name="adam_gelu", ranks=2, b=16, acc=1, opt="adam", act="gelu", lr=0.01, wd=0.0,
         beta1=0.85, beta2=0.99, eps=1e-6, data="f32", steps=30),
    # eps = 1e-5 here, see the note on Adam's eps above.
    dict(name="adamw_sigmoid_wd_acc2", ranks=2, b=8, acc=2, opt="adamw", act="sigmoid", lr=0.01,
         wd=0.05, eps=1e-5, data="f32", steps=30),
    # uint8 features with scale/offset written by h5py, int64 labels, accumulate 3 over 2 ranks
    # (G = 48, so 40 steps wrap into a second epoch), Adam with L2 weight decay, cosine
    # schedule with warm-up and a floor.
    dict(name="adam_wd_relu_u8_cosine_acc3", ranks=2, b=8, acc=3, opt="adam", act="relu",
         lr=0.005, wd=0.01, data="u8", steps=50, schedule="cosine", warmup=5, min_lr=0.0005),
    dict(name="nesterov_gelu_wd_u8", ranks=2, b=16, acc=1, opt="nesterov", act="gelu", lr=0.05,
         momentum=0.9, wd=0.005, data="u8", steps=30),
    # The layer-wise optimizers against RefLARS / RefLAMB below (torch has neither): weights
    # take the trust ratio and weight decay, biases neither. The lars case keeps the default
    # coefficient (0.001, so lr is large, as LARS is used); the last lamb case clips the ratio
    # at 0.1 (fc0's and fc2's ratios start above it: the case fails against a reference
    # without the clip) with a warm-up and cosine schedule on 1 rank.
    dict(name="lars_relu_wd", ranks=2, b=16, acc=1, opt="lars", act="relu", lr=2.0,
         momentum=0.9, wd=0.0005, data="f32", steps=30),
    dict(name="lamb_tanh_wd_acc2", ranks=2, b=8, acc=2, opt="lamb", act="tanh", lr=0.02,
         wd=0.01, eps=1e-6, trust=0.8, data="f32", steps=30),
    dict(name="lamb_relu_clip_cosine_1rank", ranks=1, b=32, acc=1, opt="lamb", act="relu",
         lr=0.02, wd=0.001, eps=1e-6, trust_clip=0.1, data="u8", steps=40,
         schedule="cosine", warmup=5, min_lr=0.001),
]


# Layer lists on images (C x H x W); dptrain keeps images NHWC and conv weights (out, k, k, c)
# inside and converts at flatten and at the checkpoint, so these check the layouts as well as the
# numerics. Tolerances are the MLP's: convolutions are sums like the Linear layers' GEMMs.
IMG = (2, 8, 8)  # two channels: the model's input goes NCHW -> NHWC
CNN_A = ("conv(4,3,pad=1) relu maxpool(2) conv(6,3,stride=2,pad=1) tanh avgpool(2,stride=1) "
         "flatten linear(12) gelu linear(5)")
CNN_B = ("conv(4,3,pad=1) relu maxpool(2) dropout(0.2) conv(6,3) sigmoid flatten linear(10) relu "
         "dropout(0.5) linear(5)")
CASES += [
    dict(name="cnn_nesterov_wd", ranks=2, b=8, acc=1, opt="nesterov", layers=CNN_A, lr=0.05,
         momentum=0.9, wd=0.01, data="img", steps=30),
    # Dropout on an image (NCHW element order over NHWC memory) and on features; masks keyed
    # by the sample's place in the global batch, across 2 ranks x 2 micro-batches.
    dict(name="cnn_dropout_adam_acc2", ranks=2, b=4, acc=2, opt="adam", layers=CNN_B, lr=0.01,
         wd=0.0, eps=1e-6, data="img", steps=30),
    # One rank, uint8 images, random crops and flips, 40 steps over two epochs (G = 24).
    dict(name="cnn_augment_momentum_1rank_u8", ranks=1, b=24, acc=1, opt="momentum", layers=CNN_A,
         lr=0.05, momentum=0.9, wd=0.0, data="img_u8", steps=40, augment="crop,flip", pad=2),
]
N_IMG = 480


class Mismatch(Exception):
    pass


class SetupError(Exception):
    pass


def run(cmd, env=None, what=""):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        raise SetupError(f"{what or cmd[0]} failed (exit {p.returncode}):\n  $ {' '.join(cmd)}\n"
                         + p.stdout[-4000:])
    return p.stdout


def make_datasets(tmp, dpdata):
    f32 = os.path.join(tmp, "blobs-f32.h5")
    run([dpdata, "synth", "blobs", "--n", str(N_ROWS), "--dim", str(DIM), "--classes",
         str(CLASSES), "--spread", "1.5", "--seed", "7", "--out", f32], what="dpdata synth blobs")
    rng = np.random.default_rng(3)
    y = rng.integers(0, CLASSES, N_ROWS).astype(np.int64)
    centres = rng.integers(40, 215, (CLASSES, DIM))
    raw = np.clip(centres[y] + rng.normal(0, 40, (N_ROWS, DIM)), 0, 255).astype(np.uint8)
    u8 = os.path.join(tmp, "blobs-u8.h5")
    with h5py.File(u8, "w") as f:
        d = f.create_dataset("features", data=raw)
        d.attrs["scale"] = np.float32(1 / 64)
        d.attrs["offset"] = np.float32(-2.0)
        f.create_dataset("labels", data=y)
        f.attrs["num_classes"] = np.int64(CLASSES)
    # Images: class-dependent blobs on a 2x8x8 grid, float32 and uint8 with scale/offset.
    yi = rng.integers(0, CLASSES, N_IMG).astype(np.int64)
    proto = rng.normal(0, 1, (CLASSES,) + IMG)
    imgs = (proto[yi] + rng.normal(0, 0.8, (N_IMG,) + IMG)).astype(np.float32)
    img = os.path.join(tmp, "img-f32.h5")
    with h5py.File(img, "w") as f:
        f.create_dataset("features", data=imgs)
        f.create_dataset("labels", data=yi.astype(np.int32))
        f.attrs["num_classes"] = np.int64(CLASSES)
    raw8 = np.clip(imgs * 40 + 128, 0, 255).astype(np.uint8)
    img_u8 = os.path.join(tmp, "img-u8.h5")
    with h5py.File(img_u8, "w") as f:
        d = f.create_dataset("features", data=raw8)
        d.attrs["scale"] = np.float32(1 / 40)
        d.attrs["offset"] = np.float32(-3.2)
        f.create_dataset("labels", data=yi)
        f.attrs["num_classes"] = np.int64(CLASSES)
    return {"f32": f32, "u8": u8, "img": img, "img_u8": img_u8}


def load_dataset(path):
    """Features as dptrain sees them: float32(raw) * scale + offset, in fp32."""
    with h5py.File(path, "r") as f:
        feats = f["features"]
        raw = feats[...]
        y = f["labels"][...].astype(np.int64)
        scale = np.float32(feats.attrs.get("scale", 1.0))
        offset = np.float32(feats.attrs.get("offset", 0.0))
    x = raw.astype(np.float32) * scale + offset
    if x.ndim == 2 or x.shape[1:] != IMG:
        x = x.reshape(x.shape[0], -1)
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)


def write_ini(path, c, data_file, ckdir, metrics):
    lines = [
        "[model]",
        *([f"layers = {c['layers']}"] if "layers" in c else
          ["layers = " + ",".join(map(str, LAYERS)), f"activation = {c['act']}"]),
        "[data]", f"train = {data_file}", "shuffle = false",
        f"augment = {c.get('augment', 'none')}", f"crop_padding = {c.get('pad', 4)}",
        "[train]", "epochs = 100", f"steps = {c['steps']}", f"batch_per_rank = {c['b']}",
        f"accumulate = {c['acc']}", f"optimizer = {c['opt']}", f"lr = {c['lr']!r}",
        f"momentum = {c.get('momentum', 0.9)!r}", f"weight_decay = {c['wd']!r}",
        f"beta1 = {c.get('beta1', 0.9)!r}", f"beta2 = {c.get('beta2', 0.999)!r}",
        f"eps = {c.get('eps', 1e-8)!r}", "lr_scaling = none",
        f"trust_coefficient = {c.get('trust', 0.0)!r}", f"trust_clip = {c.get('trust_clip', 0.0)!r}",
        f"warmup_steps = {c.get('warmup', 0)}", f"schedule = {c.get('schedule', 'constant')}",
        f"min_lr = {c.get('min_lr', 0.0)!r}", f"seed = {SEED}", "sync = gradients",
        "[device]", "type = cpu", "threads = 1",
        "[comm]", "backend = mpi",
        "[checkpoint]", f"dir = {ckdir}", "every_steps = 0", "keep = 0", "at_start = true",
        "resume = none",
        "[log]", f"metrics = {metrics}", "every_steps = 1", "progress = false",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_ckpt(path):
    out = {}
    with h5py.File(path, "r") as f:
        attrs = {k: f.attrs[k] for k in f.attrs}
        f.visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
    return attrs, out


def expected_lr(c, step, total):
    """The lr of a (1-based) step, written from the schedule's definition, not from optim.cpp:
    linear warm-up from 0 to lr over warmup_steps (lr_scaling = none: step w has lr), then
    constant, or a half-cosine that starts at lr on step w + 1 and ends at min_lr on the last
    step (torch CosineAnnealingLR with T_max = total - w - 1, at epoch step - w - 1)."""
    lr, w = c["lr"], c.get("warmup", 0)
    if w > 0 and step <= w:
        return lr * step / w
    if c.get("schedule", "constant") == "cosine":
        t_max = max(1, total - w - 1)
        e = min(step - w - 1, t_max)
        lo = c.get("min_lr", 0.0)
        return lo + (lr - lo) * 0.5 * (1 + math.cos(math.pi * e / t_max))
    return lr


def build_model(act, params):
    acts = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
            "gelu": lambda: torch.nn.GELU(approximate="none")}
    mods = []
    for i in range(len(LAYERS) - 1):
        lin = torch.nn.Linear(LAYERS[i], LAYERS[i + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(params[f"model/fc{i}/weight"]))
            lin.bias.copy_(torch.from_numpy(params[f"model/fc{i}/bias"]))
        mods.append(lin)
        if i < len(LAYERS) - 2:
            mods.append(acts[act]())
    return torch.nn.Sequential(*mods)


# ---- dptrain's dropout masks and augmentation draws, from their definitions ----------------
M64 = (1 << 64) - 1


def mix64(x):
    """SplitMix64's finaliser (dropout.hpp), on numpy uint64 arrays or Python ints."""
    if isinstance(x, int):
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & M64
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & M64
        return x ^ (x >> 31)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def dropout_keep(seed, layer, step, positions, elements, p):
    """Keep mask (len(positions), elements): dropout_key(seed, layer, step, position), then
    element e kept when mix64(key ^ e) >> 32 >= floor(p * 2^32) (dropout.hpp)."""
    k = mix64(seed ^ ((0x9E3779B97F4A7C15 * (layer + 1)) & M64))
    k = mix64(k ^ step)
    keys = np.array([mix64(k ^ ((pos * 0xD1B54A32D192ED03) & M64)) for pos in positions], dtype=np.uint64)
    e = np.arange(elements, dtype=np.uint64)
    h = mix64(keys[:, None] ^ e[None, :])
    return (h >> np.uint64(32)) >= np.uint64(int(p * 4294967296.0))


class Dropout(torch.nn.Module):
    """dptrain's inverted dropout: the mask of (seed, layer, step, position in the global batch,
    NCHW element); x * mask * float(1 / (1 - p))."""

    def __init__(self, p, layer, seed):
        super().__init__()
        self.p, self.layer, self.seed, self.step = p, layer, seed, 0

    def forward(self, x):
        n = x.shape[0]
        keep = dropout_keep(self.seed, self.layer, self.step, range(n), x[0].numel(), self.p)
        scale = np.float32(1.0 / (1.0 - self.p))
        m = torch.from_numpy(np.where(keep, scale, np.float32(0)).astype(np.float32)).reshape(x.shape)
        return x * m


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        return mix64(self.s)

    def below(self, n):  # Lemire's multiply-and-reject, as src/data/order.cpp
        m = self.next() * n
        if (m & M64) < n:
            t = ((1 << 64) - n) % n
            while (m & M64) < t:
                m = self.next() * n
        return m >> 64


def augment_draw(seed, epoch, row, crop, flip, pad):
    """augment.cpp's draw of (seed, epoch, file row): (flip, dy, dx)."""
    k = SplitMix64(seed ^ 0x6A09E667F3BCC909).next()
    k = SplitMix64(k ^ epoch).next()
    g = SplitMix64(k ^ row)
    f = flip and (g.next() >> 63) != 0
    dy = dx = pad
    if crop:
        dy, dx = g.below(2 * pad + 1), g.below(2 * pad + 1)
    return f, dy, dx


def augment(xb, rows, epoch, c):
    """torchvision's RandomCrop(padding) then RandomHorizontalFlip, with dptrain's draws."""
    crop, flip, pad = "crop" in c["augment"], "flip" in c["augment"], c["pad"]
    out = np.zeros_like(xb.numpy())
    H, W = xb.shape[2], xb.shape[3]
    padded = np.pad(xb.numpy(), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    for i, r in enumerate(rows):
        f, dy, dx = augment_draw(SEED, epoch, r, crop, flip, pad)
        win = padded[i, :, dy:dy + H, dx:dx + W]
        out[i] = win[:, :, ::-1] if f else win
    return torch.from_numpy(out)


SEED = 11  # train.seed of every case (write_ini)


def build_list_model(layers, params):
    """nn.Sequential of the normalised layer list, weights from the checkpoint."""
    acts = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
            "gelu": lambda: torch.nn.GELU(approximate="none")}
    mods, conv, fc, shape = [], 0, 0, IMG
    for pos, tok in enumerate(layers.split()):
        name, _, args = tok.partition("(")
        pa = [a for a in args.rstrip(")").split(",") if a]
        kw = dict(a.split("=") for a in pa if "=" in a)
        pa = [a for a in pa if "=" not in a]
        if name == "conv":
            out, k = int(pa[0]), int(pa[1])
            m = torch.nn.Conv2d(shape[0], out, k, stride=int(kw["stride"]), padding=int(kw["pad"]))
            w, b = params[f"model/conv{conv}/weight"], params[f"model/conv{conv}/bias"]
            conv += 1
            h = (shape[1] + 2 * m.padding[0] - k) // m.stride[0] + 1
            shape = (out, h, (shape[2] + 2 * m.padding[0] - k) // m.stride[0] + 1)
        elif name in ("maxpool", "avgpool"):
            k, st = int(pa[0]), int(kw["stride"])
            m = (torch.nn.MaxPool2d if name == "maxpool" else torch.nn.AvgPool2d)(k, stride=st)
            shape = (shape[0], (shape[1] - k) // st + 1, (shape[2] - k) // st + 1)
            w = None
        elif name == "flatten":
            m, w = torch.nn.Flatten(), None
            shape = (int(np.prod(shape)),)
        elif name == "linear":
            m = torch.nn.Linear(shape[0], int(pa[0]))
            w, b = params[f"model/fc{fc}/weight"], params[f"model/fc{fc}/bias"]
            fc += 1
            shape = (int(pa[0]),)
        elif name == "dropout":
            m, w = Dropout(float(pa[0]), pos, SEED), None
        else:
            m, w = acts[name](), None
        if w is not None:
            with torch.no_grad():
                m.weight.copy_(torch.from_numpy(w))
                m.bias.copy_(torch.from_numpy(b))
        mods.append(m)
    return torch.nn.Sequential(*mods)


class RefLARS(torch.optim.Optimizer):
    """LARS as README.md states it (You et al., arXiv 1708.03888, with torch.optim.SGD's
    momentum on the trust-scaled gradient), written here from the formulas, not from dptrain:
    per tensor of a group with adapt=True, r = eta*|w| / (|g| + wd*|w|) (1 where a norm is 0,
    at most clip when clip > 0); a group with adapt=False (biases) has r = 1 and no weight
    decay. d = r*(g + wd*w); momentum_buffer = mu*momentum_buffer + d; w -= lr*momentum_buffer."""

    def __init__(self, params, lr, momentum, weight_decay, eta, clip):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      eta=eta, clip=clip, adapt=True))

    @torch.no_grad()
    def step(self):
        for grp in self.param_groups:
            wd = grp["weight_decay"] if grp["adapt"] else 0.0
            for p in grp["params"]:
                g = p.grad
                r = torch.ones((), dtype=p.dtype)
                if grp["adapt"]:
                    wn, gn = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                    if wn > 0 and gn > 0:
                        r = grp["eta"] * wn / (gn + wd * wn)
                        if grp["clip"] > 0:
                            r = torch.clamp(r, max=grp["clip"])
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p)
                buf = st["momentum_buffer"]
                buf.mul_(grp["momentum"]).add_((g + wd * p) * r)
                p.sub_(grp["lr"] * buf)


class RefLAMB(torch.optim.Optimizer):
    """LAMB as README.md states it (You et al., arXiv 1904.00962, Algorithm 2 with Adam's bias
    corrections): m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g^2,
    u = (m / (1-b1^t)) / (sqrt(v) / sqrt(1-b2^t) + eps) + wd*w, r = eta*|w| / |u| per tensor of
    a group with adapt=True (1 where a norm is 0, at most clip when clip > 0), r = 1 and wd = 0
    for adapt=False (biases); w -= lr*r*u."""

    def __init__(self, params, lr, betas, eps, weight_decay, eta, clip):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      eta=eta, clip=clip, adapt=True))

    @torch.no_grad()
    def step(self):
        for grp in self.param_groups:
            b1, b2 = grp["betas"]
            wd = grp["weight_decay"] if grp["adapt"] else 0.0
            for p in grp["params"]:
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                u = (m / (1 - b1 ** t)) / (v.sqrt() / math.sqrt(1 - b2 ** t) + grp["eps"]) + wd * p
                r = torch.ones((), dtype=p.dtype)
                if grp["adapt"]:
                    wn, un = torch.linalg.vector_norm(p), torch.linalg.vector_norm(u)
                    if wn > 0 and un > 0:
                        r = grp["eta"] * wn / un
                        if grp["clip"] > 0:
                            r = torch.clamp(r, max=grp["clip"])
                p.sub_(grp["lr"] * r * u)


def make_optimizer(c, model, lr):
    o = c["opt"]
    if o in ("lars", "lamb"):
        # Weights (2-D) adapt; biases (1-D) take neither the trust ratio nor weight decay.
        groups = [dict(params=[q for q in model.parameters() if q.dim() > 1], adapt=True),
                  dict(params=[q for q in model.parameters() if q.dim() == 1], adapt=False)]
        eta = c.get("trust", 0.0) or (0.001 if o == "lars" else 1.0)
        if o == "lars":
            return RefLARS(groups, lr=lr, momentum=c.get("momentum", 0.9), weight_decay=c["wd"],
                           eta=eta, clip=c.get("trust_clip", 0.0))
        return RefLAMB(groups, lr=lr, betas=(c.get("beta1", 0.9), c.get("beta2", 0.999)),
                       eps=c.get("eps", 1e-8), weight_decay=c["wd"], eta=eta,
                       clip=c.get("trust_clip", 0.0))
    params = model.parameters()
    if o == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.0, weight_decay=c["wd"])
    if o in ("momentum", "nesterov"):
        return torch.optim.SGD(params, lr=lr, momentum=c["momentum"], weight_decay=c["wd"],
                               nesterov=(o == "nesterov"))
    cls = torch.optim.Adam if o == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=(c.get("beta1", 0.9), c.get("beta2", 0.999)),
               eps=c.get("eps", 1e-8), weight_decay=c["wd"])


def compare_tensor(case, name, got, want, rtol, atol_rel):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Mismatch(f"[{case}] tensor {name}: shape {got.shape} in dptrain vs {want.shape} in torch")
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = np.abs(got - want)
    bound = atol_rel * max(scale, 1e-30) + rtol * np.abs(want)
    bad = ~(err <= bound)  # NaN counts as bad
    norm_err = float(np.max(err / max(scale, 1e-30))) if want.size else 0.0
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err / bound, -1))), err.shape)
        raise Mismatch(
            f"[{case}] tensor {name}: {int(bad.sum())}/{err.size} elements outside "
            f"|a-b| <= {atol_rel:g}*max|b| + {rtol:g}*|b|; worst at {tuple(map(int, i))}: dptrain "
            f"{got[i]:.9g} torch {want[i]:.9g} (abs err {err[i]:.3g}, max|b| {scale:.3g}, "
            f"max abs err / max|b| {norm_err:.3g})")
    return norm_err


def torch_state_name(opt_kind):
    return {"momentum": ["momentum_buffer"], "nesterov": ["momentum_buffer"],
            "lars": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"],
            "adamw": ["exp_avg", "exp_avg_sq"], "lamb": ["exp_avg", "exp_avg_sq"]}.get(opt_kind, [])


def run_case(c, tmp, tools, datasets, mpirun, perturb):
    name = c["name"]
    d = os.path.join(tmp, name)
    os.makedirs(d)
    ini, ckdir, metrics = os.path.join(d, "run.ini"), os.path.join(d, "ck"), os.path.join(d, "m.jsonl")
    write_ini(ini, c, datasets[c["data"]], ckdir, metrics)
    cmd = [mpirun, "-np", str(c["ranks"]), "--oversubscribe", "--bind-to", "none",
           tools["dptrain"], "--config", ini]
    t0 = time.time()
    run(cmd, what=f"[{name}] dptrain")
    t_dpt = time.time() - t0

    S = c["steps"]
    G = c["b"] * c["ranks"] * c["acc"]
    logged = [json.loads(l) for l in open(metrics) if l.strip()]
    logged = [m for m in logged if "eval" not in m and "step" in m]  # not the start records
    if [m["step"] for m in logged] != list(range(1, S + 1)):
        raise Mismatch(f"[{name}] metrics: expected steps 1..{S}, got {[m['step'] for m in logged]}")
    ck0 = os.path.join(ckdir, "ckpt-000000000.h5")
    ckN = os.path.join(ckdir, f"ckpt-{S:09d}.h5")
    for p in (ck0, ckN):
        if not os.path.exists(p):
            raise SetupError(f"[{name}] checkpoint {p} missing; have {sorted(os.listdir(ckdir))}")
    _, p0 = read_ckpt(ck0)
    attrsN, pN = read_ckpt(ckN)
    if int(attrsN["step"]) != S:
        raise Mismatch(f"[{name}] final checkpoint: step attribute {attrsN['step']} != {S}")

    X, Y = load_dataset(datasets[c["data"]])
    per_epoch = X.shape[0] // G
    torch.manual_seed(0)
    attrs0, _ = read_ckpt(ck0)
    if "layers" in c:
        model = build_list_model(str(attrs0["model"].decode() if isinstance(attrs0["model"], bytes) else attrs0["model"]), p0)
    else:
        model = build_model(c["act"], p0)
    opt = make_optimizer(c, model, c["lr"])
    max_loss_rel = max_lr_rel = 0.0
    for s in range(1, S + 1):
        lr = expected_lr(c, s, S)
        m = logged[s - 1]
        lr_rel = abs(m["lr"] - lr) / max(abs(lr), 1e-30)
        max_lr_rel = max(max_lr_rel, lr_rel)
        if lr_rel > LR_RTOL:
            raise Mismatch(f"[{name}] step {s}: lr {m['lr']!r} in metrics, expected {lr!r} "
                           f"(rel err {lr_rel:.3g} > {LR_RTOL:g})")
        k = (s - 1) % per_epoch  # shuffle = false: every epoch is the identity order
        xb, yb = X[k * G:(k + 1) * G], Y[k * G:(k + 1) * G]
        for mod in model:
            if isinstance(mod, Dropout):
                mod.step = s - 1  # steps taken before this one
        if c.get("augment", "none") != "none":
            xb = augment(xb, range(k * G, (k + 1) * G), (s - 1) // per_epoch, c)
        for g in opt.param_groups:
            g["lr"] = lr * (1 + perturb)
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        want = float(loss)
        rel = abs(m["loss"] - want) / max(abs(want), 1e-30)
        max_loss_rel = max(max_loss_rel, rel)
        if not rel <= LOSS_RTOL:
            raise Mismatch(f"[{name}] step {s} (rows {k * G}..{(k + 1) * G - 1}): loss "
                           f"{m['loss']!r} in dptrain metrics vs {want!r} in torch "
                           f"(rel err {rel:.3g} > {LOSS_RTOL:g})")

    max_param = max_state = 0.0
    named = [(f"fc{i}", m) for i, m in enumerate(m for m in model if isinstance(m, torch.nn.Linear))]
    named += [(f"conv{i}", m) for i, m in enumerate(m for m in model if isinstance(m, torch.nn.Conv2d))]
    for layer, lin in named:
        for part in ("weight", "bias"):
            t = getattr(lin, part)
            key = f"model/{layer}/{part}"
            if key not in pN:
                raise Mismatch(f"[{name}] final checkpoint lacks /{key}")
            max_param = max(max_param, compare_tensor(name, f"/{key} after step {S}", pN[key],
                                                      t.detach().numpy(), PARAM_RTOL, PARAM_ATOL))
            for st in torch_state_name(c["opt"]):
                skey = f"optimizer/{st}/{layer}/{part}"
                if skey not in pN:
                    raise Mismatch(f"[{name}] final checkpoint lacks /{skey}")
                max_state = max(max_state, compare_tensor(
                    name, f"/{skey} after step {S}", pN[skey], opt.state[t][st].numpy(),
                    PARAM_RTOL, PARAM_ATOL))
    return dict(case=name, ranks=c["ranks"], G=G, steps=S, max_loss_rel=max_loss_rel,
                max_lr_rel=max_lr_rel, max_param_err=max_param, max_state_err=max_state,
                dptrain_s=t_dpt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="build dir holding dptrain and dpdata")
    ap.add_argument("--root", required=True, help="repository root")
    ap.add_argument("--case", action="append", help="run only this case (repeatable)")
    ap.add_argument("--perturb", type=float, default=0.0,
                    help="multiply torch's lr by 1+X (must make the check fail)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args()

    tools = {}
    for t in ("dptrain", "dpdata"):
        cand = [os.path.join(a.build, t), os.path.join(a.root, t)]
        found = next((p for p in cand if os.path.isfile(p) and os.access(p, os.X_OK)), None)
        if not found:
            print(f"torch_crosscheck: ERROR: no {t} executable in {' or '.join(cand)}")
            return 2
        tools[t] = os.path.abspath(found)
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        print("torch_crosscheck: SKIPPED: no mpirun on PATH")
        return SKIP
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    os.environ["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    cases = [c for c in CASES if not a.case or c["name"] in a.case]
    if not cases:
        print(f"torch_crosscheck: ERROR: no case named {a.case}; have {[c['name'] for c in CASES]}")
        return 2
    print(f"torch_crosscheck: torch {torch.__version__}, h5py {h5py.__version__}, numpy "
          f"{np.__version__}; dptrain {tools['dptrain']}; {len(cases)} case(s)")
    print(f"tolerances: loss rel {LOSS_RTOL:g}; params/state |a-b| <= {PARAM_ATOL:g}*max|b| + "
          f"{PARAM_RTOL:g}*|b|; lr rel {LR_RTOL:g}")
    tmp = tempfile.mkdtemp(prefix="dpt-torch-xcheck-")
    failures, rows = [], []
    try:
        datasets = make_datasets(tmp, tools["dpdata"])
        for c in cases:
            try:
                rows.append(run_case(c, tmp, tools, datasets, mpirun, a.perturb))
                r = rows[-1]
                print(f"  PASS {r['case']:<30} R={r['ranks']} G={r['G']:<3} steps={r['steps']:<3} "
                      f"loss rel {r['max_loss_rel']:.2e}  lr rel {r['max_lr_rel']:.1e}  "
                      f"params {r['max_param_err']:.2e}  opt state {r['max_state_err']:.2e}  "
                      f"(dptrain {r['dptrain_s']:.2f} s)", flush=True)
            except Mismatch as e:
                failures.append(str(e))
                print(f"  FAIL {c['name']}: {e}", flush=True)
    except SetupError as e:
        print(f"torch_crosscheck: ERROR: {e}")
        return 2
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"torch_crosscheck: FAILED: {len(failures)} of {len(cases)} case(s) disagree with "
              "PyTorch:")
        for f in failures:
            print("  " + f)
        return 1
    print(f"torch_crosscheck: OK: {len(cases)} case(s) agree with PyTorch "
          "(errors are max over steps/elements; params/state errors are |a-b|/max|b|)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
