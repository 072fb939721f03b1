#!/usr/bin/env python3
"""dptrain --predict against the model's own evaluation: a small image tree (PNG, 3 classes) is
imported with `dpdata images` at 14 x 14 (crop_size 12 / eval_crop_ratio 0.875), a model trained
on it with random_resized_crop and normalisation, then
  - --predict on the tree (1 and 2 ranks: the same CSV bytes) names as top class the folder's
    class exactly as often as --eval's accuracy on the imported file says (the same pixels
    through two paths: the importer and --predict's own decoding);
  - each row's probabilities are in [0, 1], descending, and with --top-k 3 (all classes) sum to 1
    within 1e-5; class columns hold the folder names the checkpoint carries;
  - --eval's per-class table (1 and 2 ranks alike) holds, per class, the folder's name, its 40
    rows and as many correct ones as --predict's top-1 gets in that folder, its correct rows
    summing to the accuracy --eval prints (the device's count; the table's is the host's argmax);
  - a corrupt file gets a row with no classes and its reason in the problem column;
  - a folder with no images, a missing path and --predict without --checkpoint exit 2.
The model is a preset (resnet18, stem=small) whose head takes its classes from the data: --predict
plans it with the checkpoint's classes.
Exits 77 (skip) without PIL.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from PIL import Image
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(cmd, ok=True):
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if ok and r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def class_table(out):
    """--eval's per-class lines: {class: (rows, correct, name)}."""
    table, inside = {}, False
    for line in out.splitlines():
        f = line.split()
        if f[:4] == ["class", "rows", "correct", "accuracy"]:
            inside = True
        elif inside and len(f) >= 4 and f[0].isdigit():
            table[int(f[0])] = (int(f[1]), int(f[2]), " ".join(f[4:]))
        else:
            inside = False
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    dptrain, dpdata = os.path.join(a.build, "dptrain"), os.path.join(a.build, "dpdata")
    failures = []
    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        colours = {"apple": (200, 40, 40), "leaf": (40, 180, 60), "sky": (50, 90, 210)}
        for name, col in colours.items():
            os.makedirs(os.path.join(tree, name))
            for i in range(40):
                h, w = int(rng.integers(18, 30)), int(rng.integers(18, 30))
                px = np.clip(np.array(col)[None, None, :] + rng.normal(0, 150, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(px).save(os.path.join(tree, name, f"{i:03d}.png"))
        data = os.path.join(tmp, "data.h5")
        run([dpdata, "images", "--folder", tree, "--out", data, "--size", "14"])
        ck = os.path.join(tmp, "ck")
        common = ["--model.layers", "resnet18(stem=small)", "--device.type", "cpu",
                  "--train.precision", "fp32", "--log.metrics", ""]
        run(["mpirun", "-np", "1", dptrain, "--config", os.path.join(a.root, "inputs", "cnn.ini"), *common,
             "--data.train", data, "--data.test", data, "--train.batch_per_rank", "10", "--train.steps", "10",
             "--train.lr", "0.05", "--data.augment", "random_resized_crop,flip", "--data.crop_size", "12",
             "--data.mean", "0.5,0.5,0.5", "--data.std", "0.25,0.25,0.25", "--checkpoint.dir", ck])
        ckpt = os.path.join(ck, sorted(f for f in os.listdir(ck) if f.endswith(".h5"))[-1])
        ev = run(["mpirun", "-np", "1", dptrain, "--eval", "--checkpoint", ckpt, "--data.test", data]).stdout
        acc = float(ev.split("accuracy ")[1].split()[0])
        ev2 = run(["mpirun", "-np", "2", "--oversubscribe", dptrain, "--eval", "--checkpoint", ckpt,
                   "--data.test", data]).stdout
        table = class_table(ev)
        print("--eval per class:", table)
        if table != class_table(ev2):
            failures.append(f"--eval's per-class table on 2 ranks {class_table(ev2)} != 1 rank's {table}")
        if sorted(table) != [0, 1, 2] or [table[c][2] for c in range(3)] != sorted(colours) or \
                any(table[c][0] != 40 for c in table):
            failures.append(f"--eval's per-class table {table}: wanted classes 0-2 named {sorted(colours)}, 40 rows each")
        elif abs(sum(v[1] for v in table.values()) / 120 - acc) > 5e-5:
            failures.append(f"--eval's per-class correct rows {table} do not sum to its accuracy {acc}")
        # A corrupt file among the images to predict.
        bad = os.path.join(tree, "sky", "999.png")
        with open(bad, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\nnot really")
        outs = {}
        for ranks in (1, 2):
            out = os.path.join(tmp, f"p{ranks}.csv")
            run(["mpirun", "-np", str(ranks), "--oversubscribe", dptrain, "--predict", tree, "--checkpoint", ckpt,
                 "--top-k", "3", "--predictions", out])
            outs[ranks] = open(out, "rb").read()
        if outs[1] != outs[2]:
            failures.append("the CSVs of 1 and 2 ranks differ")
        rows = list(csv.DictReader(open(os.path.join(tmp, "p2.csv"))))
        good = [r for r in rows if not r["problem"]]
        badrows = [r for r in rows if r["problem"]]
        right = sum(r["class_1"] == os.path.basename(os.path.dirname(r["path"])) for r in good) / len(good)
        print(f"--eval accuracy {acc:.4f}; --predict top-1 matches the folder for {right:.4f} of {len(good)} images")
        if abs(right - acc) > 5e-5:  # --eval prints 4 decimals
            failures.append(f"--predict's top-1 accuracy {right} != --eval's {acc}")
        per_folder = {name: sum(r["class_1"] == name for r in good if os.path.basename(os.path.dirname(r["path"])) == name)
                      for name in colours}
        if {v[2]: v[1] for v in table.values()} != per_folder:
            failures.append(f"--eval's correct rows per class {table} != --predict's per folder {per_folder}")
        if len(good) != 120 or len(badrows) != 1 or not badrows[0]["path"].endswith("999.png") or badrows[0]["class_1"]:
            failures.append(f"rows: {len(good)} good, problem rows {[(r['path'], r['problem']) for r in badrows]}")
        else:
            print(f"corrupt file: {badrows[0]['problem']}")
        for r in good:
            p = [float(r[f"probability_{j}"]) for j in (1, 2, 3)]
            names = {r[f"class_{j}"] for j in (1, 2, 3)}
            if names != set(colours) or not all(0 <= x <= 1 for x in p) or p != sorted(p, reverse=True) or \
                    abs(sum(p) - 1) > 1e-5:
                failures.append(f"row {r}")
                break
        # Bad invocations: exit 2 with a message.
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        for cmd, want in [([dptrain, "--predict", empty, "--checkpoint", ckpt], "no .jpg, .jpeg or .png"),
                          ([dptrain, "--predict", os.path.join(tmp, "nope"), "--checkpoint", ckpt], "no such file"),
                          ([dptrain, "--predict", tree], "needs --checkpoint")]:
            r = run(["mpirun", "-np", "2", "--oversubscribe", *cmd], ok=False)
            if r.returncode == 0 or want not in r.stdout + r.stderr:
                failures.append(f"{' '.join(cmd[1:3])}: exit {r.returncode}, wanted a message with '{want}'")
    for f in failures:
        print("FAIL:", f)
    print("predict_check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
