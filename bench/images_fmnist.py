#!/usr/bin/env python3
"""Accuracy through the image-folder importer: Fashion-MNIST as PNG files, imported by
`dpdata images`, trained by inputs/resnet.ini beside the same run on the idx import.

    python3 bench/images_fmnist.py --build BUILD --work DIR [--data IDX_DIR] [--device cuda|cpu]
        [--epochs N] [--steps N] [--threads N] [--dry-run]

1. bench/fmnist_png.py writes the idx files (--data, default Debian's
   /usr/share/datasets/fashion-mnist) as DIR/png/{train,test}/<label>_<name>/NNNNN.png.
2. `BUILD/dpdata images --folder DIR/png/train --out DIR/png-train.h5 --size 28 --channels 1`
   (and test); `BUILD/dpdata fashion-mnist --dir IDX_DIR --out-dir DIR/idx`.
3. Where h5py imports: the PNG import's pixels and labels against the idx import's, the idx
   rows taken in the folder's order (by label, then file name: a stable sort by label). 28x28
   files at --size 28 need no resampling, so they should be equal byte for byte.
4. `mpirun -np 1 BUILD/dptrain --config inputs/resnet.ini` on each pair (no checkpoints, metrics
   in DIR/<name>.jsonl): the final test accuracy is the metrics file's last "eval" record.
Prints one JSON line per step and a last line with both accuracies and whether the PNG import's
reaches --target (0.945: inputs/resnet.ini's 16 epochs reached 0.9494 on the idx import).
--device cpu trains on the CPU in fp32 (hours for 16 epochs: cap it with --steps).
--dry-run prints the commands without running them.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def say(**rec):
    print(json.dumps({"bench": "images_fmnist", **rec}), flush=True)


def run(cmd, a, log=None):
    """Runs cmd (a list), its output to log; returns (exit status, output, seconds)."""
    if a.dry_run:
        print("would run:", " ".join(cmd), flush=True)
        return 0, "", 0.0
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n" + p.stdout)
    return p.returncode, p.stdout, time.time() - t0


def has_images_command(a):
    p = subprocess.run([os.path.join(a.build, "dpdata"), "images", "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return p.returncode == 0 and "--folder" in p.stdout


def compare(png_h5, idx_h5):
    """PNG import against idx import, the idx rows in the folder's order; None without h5py."""
    try:
        import h5py
        import numpy as np
    except ImportError:
        return None
    with h5py.File(png_h5, "r") as f, h5py.File(idx_h5, "r") as g:
        xp, yp = f["features"][()], f["labels"][()]
        xi, yi = g["features"][()], g["labels"][()]
        order = np.argsort(yi, kind="stable")
        same_shape = xp.shape == xi.shape
        return {"png_shape": list(xp.shape), "idx_shape": list(xi.shape),
                "labels_equal": bool(np.array_equal(yp, yi[order])),
                "pixels_equal": bool(same_shape and np.array_equal(xp, xi[order])),
                "max_abs_diff": int(np.abs(xp.astype(int) - xi[order].astype(int)).max()) if same_shape else None,
                "png_attrs": {k: float(v) for k, v in f["features"].attrs.items() if k in ("scale", "offset")},
                "idx_attrs": {k: float(v) for k, v in g["features"].attrs.items() if k in ("scale", "offset")}}


def train(a, name, train_h5, test_h5):
    metrics = os.path.join(a.work, name + ".jsonl")
    cmd = ["mpirun", "-np", "1", "--bind-to", "none", os.path.join(a.build, "dptrain"), "--config",
           os.path.join(a.root, "inputs/resnet.ini"), "--data.train", train_h5, "--data.test", test_h5,
           "--checkpoint.dir", "", "--log.metrics", metrics, "--log.progress", "false"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    if "LD_LIBRARY_PATH" in os.environ:  # cuDNN's copy, where gpu_run.sh puts it first
        cmd[1:1] = ["-x", "LD_LIBRARY_PATH"]
    if os.path.exists(metrics) and not a.dry_run:
        os.remove(metrics)
    if a.device == "cpu":
        cmd += ["--device.type", "cpu", "--train.precision", "fp32"]
    if a.epochs:
        cmd += ["--train.epochs", str(a.epochs)]
    if a.steps:
        cmd += ["--train.steps", str(a.steps)]
    rc, out, wall = run(cmd, a, os.path.join(a.work, name + ".log"))
    if a.dry_run:
        return None
    evals = [json.loads(line) for line in open(metrics) if '"eval"' in line] if os.path.exists(metrics) else []
    done = re.search(r"done: .*? in ([0-9.]+) s, ([0-9]+) samples/s", out)
    rec = {"step": "train", "data": name, "rc": rc, "accuracy": evals[-1]["accuracy"] if evals else None,
           "loop_s": float(done.group(1)) if done else None, "samples_per_s": float(done.group(2)) if done else None,
           "wall_s": round(wall, 2)}
    if rc != 0:
        rec["tail"] = out[-1500:]
    say(**rec)
    return rec["accuracy"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="folder with dptrain and dpdata")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder with the four idx .gz files")
    ap.add_argument("--work", required=True)
    ap.add_argument("--root", default=os.path.dirname(HERE), help="the repository (inputs/resnet.ini)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--epochs", type=int, default=0, help="train.epochs (0: inputs/resnet.ini's 16)")
    ap.add_argument("--steps", type=int, default=0, help="train.steps cap (0: none)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="dpdata images --threads and PNG writers")
    ap.add_argument("--target", type=float, default=0.945)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    png = os.path.join(a.work, "png")
    if not os.path.isdir(os.path.join(png, "test")):
        rc, out, s = run([sys.executable, os.path.join(HERE, "fmnist_png.py"), "--data", a.data, "--out", png,
                          "--workers", str(a.threads)], a)
        say(step="png", rc=rc, seconds=round(s, 2))
        if rc != 0:
            sys.exit(f"images_fmnist: fmnist_png.py failed:\n{out[-2000:]}")
    idx = os.path.join(a.work, "idx")
    rc, out, s = run([os.path.join(a.build, "dpdata"), "fashion-mnist", "--dir", a.data, "--out-dir", idx], a)
    say(step="import idx", rc=rc, seconds=round(s, 2))
    pairs = {"idx": (os.path.join(idx, "fashion-mnist-train.h5"), os.path.join(idx, "fashion-mnist-test.h5"))}
    if a.dry_run or has_images_command(a):
        pairs["png"] = (os.path.join(a.work, "png-train.h5"), os.path.join(a.work, "png-test.h5"))
        for split, h5 in zip(("train", "test"), pairs["png"]):
            if os.path.exists(h5) and not a.dry_run:
                os.remove(h5)
            rc, out, s = run([os.path.join(a.build, "dpdata"), "images", "--folder", os.path.join(png, split), "--out", h5,
                              "--size", "28", "--channels", "1", "--threads", str(a.threads)], a,
                             os.path.join(a.work, f"import-{split}.log"))
            say(step=f"import png {split}", rc=rc, seconds=round(s, 2), **({"tail": out[-1500:]} if rc else {}))
            if rc != 0:
                del pairs["png"]
                break
        if "png" in pairs and not a.dry_run:
            for split, i in (("test", 1), ("train", 0)):
                say(step=f"compare {split}", **(compare(pairs["png"][i], pairs["idx"][i]) or {"skipped": "no h5py"}))
    else:
        say(step="import png", error=f"{a.build}/dpdata has no 'images' command: the PNG run is skipped")
    acc = {name: train(a, name, *files) for name, files in sorted(pairs.items(), key=lambda kv: kv[0] != "png")}
    if a.dry_run:
        return
    p = acc.get("png")
    say(step="result", png_accuracy=p, idx_accuracy=acc.get("idx"), target=a.target,
        png_meets_target=p is not None and p >= a.target)


if __name__ == "__main__":
    main()
