#!/usr/bin/python3
"""docs/formats.md's Python examples, run as written (ctest docs_formats_snippets).

    /usr/bin/python3 tests/docs/formats_snippets.py --build BUILD --doc docs/formats.md

1. The h5py example writes data/mine-train.h5; `dpdata validate` must accept it.
2. dptrain trains resnet18(stem=small) for one step on that file and checkpoints it; the
   torchvision example must load the checkpoint strictly (its file name swapped for the real one),
   and the model's tensors must then equal the file's.
3. The model.init example (torchvision's resnet18 written with h5py) starts a resnet18 run on
   3-channel images of 10 classes: loaded, its 1000-class head re-initialised.
Skips (exit 77) without h5py, numpy, torch or torchvision (python3-h5py, python3-torchvision).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap

try:
    import h5py  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--doc", required=True)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    blocks = re.findall(r"```python\n(.*?)```", open(a.doc, encoding="utf-8").read(), re.S)
    write = next(b for b in blocks if "create_dataset" in b)
    load = next(b for b in blocks if "load_state_dict" in b)
    init = textwrap.dedent(next(b for b in blocks if "resnet18().state_dict()" in b))
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "data"))
        subprocess.run([sys.executable, "-c", write], cwd=tmp, check=True)
        subprocess.run([os.path.join(a.build, "dpdata"), "validate", "data/mine-train.h5"],
                       cwd=tmp, check=True)
        subprocess.run([os.path.join(a.build, "dptrain"), "--model.layers", "resnet18(stem=small)",
                        "--data.train", "data/mine-train.h5", "--train.batch_per_rank", "8",
                        "--train.steps", "1", "--checkpoint.dir", "ck"],
                       cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        ckpt = os.path.join("ck", sorted(os.listdir(os.path.join(tmp, "ck")))[-1])
        names = re.findall(r'h5py\.File\("([^"]+)"', load)
        assert names, "the torchvision example opens no checkpoint by name"
        check = load.replace(names[0], ckpt) + (
            "\nimport numpy as np\n"
            "with h5py.File(%r, 'r') as f:\n"
            "    sd = m.state_dict()\n"
            "    bad = [k for k in f['model']\n"
            "           if not np.array_equal(sd[k].numpy(), f['model'][k][()])]\n"
            "    assert not bad and len(sd) == len(f['model']), bad\n"
            "print('loaded %%d tensors strictly' %% len(sd))\n" % ckpt)
        subprocess.run([sys.executable, "-c", check], cwd=tmp, check=True)
        subprocess.run([sys.executable, "-c", init], cwd=tmp, check=True)
        w = re.findall(r'h5py\.File\("([^"]+)"', init)[0]
        subprocess.run([sys.executable, "-c",
                        "import h5py, numpy as np\n"
                        "with h5py.File('rgb.h5', 'w') as f:\n"
                        "    f['features'] = np.random.default_rng(0).random((8, 3, 32, 32), dtype=np.float32)\n"
                        "    f['labels'] = np.arange(8) % 10\n"
                        "    f.attrs['num_classes'] = 10\n"], cwd=tmp, check=True)
        out = subprocess.run([os.path.join(a.build, "dptrain"), "--model.layers", "resnet18", "--model.init", w,
                              "--data.train", "rgb.h5", "--train.batch_per_rank", "8", "--train.steps", "1"],
                             cwd=tmp, check=True, stdout=subprocess.PIPE, text=True).stdout
        assert "120 tensors loaded" in out and "the head re-initialised" in out, out[-3000:]
    print("docs/formats.md: the h5py, torchvision and model.init examples run as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
