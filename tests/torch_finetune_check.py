#!/usr/bin/python3
"""Weights in and out against torchvision: model.init from a PyTorch state_dict, exactly.

  1. torchvision's resnet18 with the small stem (conv1 a 3x3 stride-1 conv without bias on one
     channel, maxpool the identity; docs/models.md) takes a few SGD steps in train mode on
     random images, so its weights and batch norm's running statistics and counts move off
     their initial values; its state_dict is saved with torch.save.
  2. scripts/torch_to_h5.py converts the .pth; the test also writes the same tensors as a
     .safetensors file of its own (F32, num_batches_tracked I64; the format is 8 bytes of
     header length, a JSON header, the raw little-endian data).
  3. `dptrain --eval --checkpoint W --model.layers resnet18(stem=small)` on both files, on 1
     and 2 CPU ranks (`--device cuda`: on the GPU, fp32): the test loss must equal torchvision's
     eval-mode loss on the same images within 1e-5 relative (both sides sum in fp32 in
     different orders: observed ~1e-7).
  4. The round trip: a 2-step run from the .h5 (its step-0 checkpoint), scripts/h5_to_torch.py
     to a .pth that torchvision's model loads with strict=True, scripts/torch_to_h5.py back, and
     a run from that file: its step-0 checkpoint's /model tensors are bitwise those of the first
     (parameters, running statistics, num_batches_tracked).
  5. A new head: resnet18(stem=small,classes=4) from the 10-class weights re-initialises fc.weight
     and fc.bias (saying so) and starts every other tensor bitwise from the file.
  6. A frozen body (train.freeze = body, train.train_bn = false) for 2 steps: every parameter but
     fc's bitwise the file's, fc's moved; and the same run with every backward pass kept
     (DPT_FROZEN_BACKWARD=full) ends bitwise equal (on the GPU with cuDNN's heuristic choice).

Usage (ctest runs it this way):
  /usr/bin/python3 tests/torch_finetune_check.py --build <build dir> --root <repo root>
Exit codes: 0 all agree, 1 a mismatch, 2 dptrain or the set-up failed, 77 skipped (no
torch/torchvision/h5py/numpy or mpirun; --device cuda where no GPU is visible).
`--perturb X` scales one tensor of the converted file by (1 + X): the check must then fail.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchvision
except ImportError as e:
    print(f"torch_finetune_check: SKIPPED: {sys.executable} cannot import {e.name!r}; "
          "Debian: apt-get install python3-torchvision python3-h5py")
    sys.exit(SKIP)

IMG, CLASSES, N_TEST = (1, 12, 12), 10, 96
RTOL = 1e-5


class Mismatch(Exception):
    pass


class SetupError(Exception):
    pass


def run(cmd, what, expect_fail=False):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if (p.returncode != 0) != expect_fail:
        raise SetupError(f"{what}: exit {p.returncode}:\n  $ {' '.join(cmd)}\n{p.stdout[-4000:]}")
    return p.stdout


def small_resnet18(classes):
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = torch.nn.Conv2d(IMG[0], 64, 3, 1, 1, bias=False)
    m.maxpool = torch.nn.Identity()
    return m


def pretrained(tmp):
    """A model whose weights and running statistics moved (train mode, SGD), its test set."""
    torch.manual_seed(4)
    m = small_resnet18(CLASSES)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    m.train()
    for _ in range(3):
        x = torch.randn(32, *IMG)
        y = torch.randint(0, CLASSES, (32,))
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    m.eval()
    rng = np.random.default_rng(11)
    x = rng.normal(0, 1, (N_TEST,) + IMG).astype(np.float32)
    y = rng.integers(0, CLASSES, N_TEST).astype(np.int64)
    test = os.path.join(tmp, "test.h5")
    with h5py.File(test, "w") as f:
        f.create_dataset("features", data=x)
        f.create_dataset("labels", data=y)
        f.attrs["num_classes"] = np.int64(CLASSES)
    with torch.no_grad():
        loss = F.cross_entropy(m(torch.from_numpy(x)), torch.from_numpy(y)).item()
    pth = os.path.join(tmp, "pretrained.pth")
    torch.save(m.state_dict(), pth)
    return m, pth, test, loss


def write_safetensors(path, sd):
    header, blobs, at = {}, [], 0
    for k, v in sd.items():
        a = v.detach().numpy()
        a = a.astype("<i8") if not v.is_floating_point() else a.astype("<f4")
        b = a.tobytes()
        header[k] = {"dtype": "I64" if a.dtype.kind == "i" else "F32", "shape": list(a.shape),
                     "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def model_tensors(path):
    with h5py.File(path, "r") as f:
        out = {}
        f["model"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return out


def eval_loss(tools, mpirun, ranks, weights, test, layers, device):
    out = run([*mpirun, "-np", str(ranks), "--bind-to", "none", tools["dptrain"], "--eval", "--checkpoint", weights,
               "--data.test", test, "--data.train", test, "--model.layers", layers, "--device.type", device,
               "--train.batch_per_rank", "16",
               # ranks sharing one GPU talk over MPI (NCCL refuses two ranks on one device)
               *(["--comm.backend", "mpi"] if device == "cuda" and ranks > 1 else [])],
              f"dptrain --eval {os.path.basename(weights)} on {ranks} rank(s)")
    m = re.search(r"loss ([0-9.eE+-]+), accuracy", out)
    if not m:
        raise SetupError(f"no loss in dptrain --eval's output:\n{out[-2000:]}")
    return float(m.group(1)), out


def train_from(tools, tmp, name, weights, test, layers, device, extra=()):
    d = os.path.join(tmp, name)
    out = run([tools["dptrain"], "--data.train", test, "--model.layers", layers, "--model.init", weights,
               "--train.epochs", "1", "--train.steps", "2", "--train.batch_per_rank", "16", "--train.lr", "0.01",
               "--device.type", device, "--checkpoint.dir", d, "--checkpoint.at_start", "true",
               "--checkpoint.keep", "0", "--log.progress", "false", *extra], f"dptrain from {os.path.basename(weights)}")
    return os.path.join(d, "ckpt-000000000.h5"), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--perturb", type=float, default=0.0)
    a = ap.parse_args()
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        print("torch_finetune_check: SKIPPED: no mpirun")
        return SKIP
    if a.device == "cuda" and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        print("torch_finetune_check: SKIPPED: --device cuda and no GPU is visible")
        return SKIP
    mpirun = [mpirun] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["--oversubscribe"]
    tools = {"dptrain": os.path.join(a.build, "dptrain")}
    scripts = os.path.join(a.root, "scripts")
    py = sys.executable
    layers = "resnet18(stem=small)"
    tmp = tempfile.mkdtemp(prefix="dpt-finetune-")
    try:
        m, pth, test, t_loss = pretrained(tmp)
        h5 = os.path.join(tmp, "pretrained.h5")
        run([py, os.path.join(scripts, "torch_to_h5.py"), pth, h5], "scripts/torch_to_h5.py")
        if a.perturb:
            with h5py.File(h5, "r+") as f:
                f["model/layer2.0.conv1.weight"][...] *= np.float32(1 + a.perturb)
        st = os.path.join(tmp, "pretrained.safetensors")
        write_safetensors(st, m.state_dict())
        # 3. --eval from both files, 1 and 2 ranks, against torchvision's eval-mode loss.
        for w in (h5, st):
            for ranks in (1, 2):
                loss, out = eval_loss(tools, mpirun, ranks, w, test, layers, a.device)
                rel = abs(loss - t_loss) / abs(t_loss)
                print(f"  --eval {os.path.basename(w)}, {ranks} rank(s): loss {loss!r}, torchvision {t_loss!r}, "
                      f"rel {rel:.2e}", flush=True)
                if rel > RTOL:
                    raise Mismatch(f"--eval {w} on {ranks} rank(s): loss {loss} vs torchvision {t_loss} "
                                   f"(rel {rel:.2e} > {RTOL})")
        # 4. The round trip dptrain -> .pth -> dptrain, bitwise.
        ck0, _ = train_from(tools, tmp, "first", h5, test, layers, a.device)
        back = os.path.join(tmp, "back.pth")
        run([py, os.path.join(scripts, "h5_to_torch.py"), ck0, back], "scripts/h5_to_torch.py")
        small_resnet18(CLASSES).load_state_dict(torch.load(back), strict=True)
        h5b = os.path.join(tmp, "back.h5")
        run([py, os.path.join(scripts, "torch_to_h5.py"), back, h5b], "scripts/torch_to_h5.py (back)")
        ck0b, _ = train_from(tools, tmp, "again", h5b, test, layers, a.device)
        first, again = model_tensors(ck0), model_tensors(ck0b)
        if first.keys() != again.keys():
            raise Mismatch(f"round trip: tensor names differ: {sorted(set(first) ^ set(again))[:5]}")
        for k in first:
            if first[k].dtype != again[k].dtype or first[k].tobytes() != again[k].tobytes():
                raise Mismatch(f"round trip: {k} is not bitwise the same")
        # The first run's step-0 model is the file it started from (torchvision's tensors).
        sd = m.state_dict()
        for k, v in sd.items():
            if not np.array_equal(first[k], v.numpy()):
                raise Mismatch(f"model.init: {k} at step 0 is not the file's tensor")
        print(f"  round trip: {len(first)} tensors bitwise equal; step 0 is torchvision's state_dict", flush=True)
        # 5. A new head for 4 classes.
        test4 = os.path.join(tmp, "test4.h5")
        with h5py.File(test, "r") as f, h5py.File(test4, "w") as g:
            g.create_dataset("features", data=f["features"][()])
            g.create_dataset("labels", data=f["labels"][()] % 4)
            g.attrs["num_classes"] = np.int64(4)
        ck4, out = train_from(tools, tmp, "head", st, test4, "resnet18(stem=small,classes=4)", a.device)
        if "the head re-initialised" not in out or "fc.weight" not in out:
            raise Mismatch(f"a 4-class model from 10-class weights: no line naming the re-initialised head:\n{out}")
        four = model_tensors(ck4)
        if four["fc.weight"].shape != (4, 512):
            raise Mismatch(f"new head: fc.weight has shape {four['fc.weight'].shape}")
        for k, v in sd.items():
            if not k.startswith("fc.") and not np.array_equal(four[k], v.numpy()):
                raise Mismatch(f"new head: {k} at step 0 is not the file's tensor")
        print("  new head: fc re-initialised (4 classes), every other tensor from the file", flush=True)
        # 6. A frozen body, with the backward pass stopped below fc, against every pass kept.
        frz = ["--train.freeze", "body", "--train.train_bn", "false", "--device.conv_tuning", "heuristic"]
        ckf, out = train_from(tools, tmp, "frozen", h5, test, layers, a.device, frz)
        if not re.search(r"lowest trainable layer: \d+ layers? computes? no gradient", out):
            raise Mismatch(f"a frozen body: no line saying the backward pass stops:\n{out[-3000:]}")
        os.environ["DPT_FROZEN_BACKWARD"] = "full"
        try:
            ckfull, _ = train_from(tools, tmp, "frozen-full", h5, test, layers, a.device, frz)
        finally:
            del os.environ["DPT_FROZEN_BACKWARD"]
        end, end_full = (model_tensors(c.replace("000000000", "000000002")) for c in (ckf, ckfull))
        params = {n for n, _ in m.named_parameters()}
        for k, v in sd.items():
            same = np.array_equal(end[k], v.numpy())
            if k in params and k.startswith("fc.") == same:
                raise Mismatch(f"a frozen body: {k} {'did not move' if same else 'moved'}")
            if end[k].tobytes() != end_full[k].tobytes():
                raise Mismatch(f"a frozen body: {k} differs from the run that kept every backward pass")
        print("  frozen body: every parameter but fc's bitwise the file's; equal to keeping every pass", flush=True)
    except Mismatch as e:
        print(f"torch_finetune_check: FAILED: {e}")
        return 1
    except SetupError as e:
        print(f"torch_finetune_check: SET-UP FAILED: {e}")
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("torch_finetune_check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
