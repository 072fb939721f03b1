#!/usr/bin/python3
"""`dpdata images` against torchvision's ImageFolder on the same tree (ctest images_torchvision).

    /usr/bin/python3 tests/images_torchvision_check.py --dpdata build/dpdata

Builds tests/images_tree.py's "good" tree (every PNG kind, gray/CMYK/EXIF JPEGs, nested folders,
a name that is not UTF-8, a .txt file) and checks, with torchvision 0.14 and PIL as the oracle:
  - class_names == ImageFolder.classes and labels == the targets of ImageFolder.samples, in order;
  - --full-decode, --size 32: every row equals ImageFolder's loader + Resize(32) + CenterCrop(32)
    exactly (max abs diff 0 on uint8: dpdata reproduces Pillow's fixed-point BILINEAR
    resampling), for images already 32x32 and for resized ones; the same with --channels 1
    against convert('L');
  - default decoding (libjpeg's DCT-domain downscale for JPEGs): PNG rows still exact, JPEG rows
    within a mean abs diff of 8 of torchvision's: decoding at M/8 averages blocks where PIL's
    BILINEAR weighs a triangle, a different antialiasing filter; these test images are mostly
    noise, the worst case for it (4.7 and 5.9 for 500x375 and 64x48 JPEGs down to 32);
  - a 16-bit gray PNG: the high byte of each value (PIL clips mode I to 255 instead; see
    docs/decisions.md); --exif-transpose: ImageOps.exif_transpose's pixels.
Exit 0 when all holds, 1 otherwise, 77 (skip) without torchvision or h5py.
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torchvision
    from PIL import Image, ImageOps
    from torchvision import transforms
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import images_tree  # noqa: E402

S = 32
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(dpdata, args):
    r = subprocess.run([dpdata, "images"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        sys.exit(f"dpdata images {' '.join(args)} exited {r.returncode}")


def read(path):
    with h5py.File(path, "r") as f:
        return f["features"][()], f["labels"][()], [str(c) for c in f.attrs.get("class_names", [])]


def reference(path, mode, exif=False):
    img = Image.open(path)
    if exif:
        img = ImageOps.exif_transpose(img)
    img = img.convert(mode)
    img = transforms.CenterCrop(S)(transforms.Resize(S)(img))
    a = np.asarray(img)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpdata", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        images_tree.make_good(tree)
        ds = torchvision.datasets.ImageFolder(tree)
        paths = [p for p, _ in ds.samples]
        jpeg = [p.lower().endswith((".jpg", ".jpeg")) for p in paths]

        out = os.path.join(tmp, "full.h5")
        run(args.dpdata, ["--folder", tree, "--out", out, "--size", str(S), "--full-decode"])
        x, y, names = read(out)
        check(names == ds.classes, f"class_names {names} == ImageFolder.classes {ds.classes}")
        check(list(y) == [t for _, t in ds.samples], f"{len(y)} labels in ImageFolder's sample order")
        diffs = [int(np.abs(x[i].astype(int) - reference(p, "RGB")).max()) for i, p in enumerate(paths)]
        check(max(diffs) == 0, f"--full-decode RGB rows equal torchvision's (max abs diff per row {diffs})")

        out = os.path.join(tmp, "gray.h5")
        run(args.dpdata, ["--folder", tree, "--out", out, "--size", str(S), "--full-decode", "--channels", "1"])
        x1, _, _ = read(out)
        diffs = [int(np.abs(x1[i].astype(int) - reference(p, "L")).max()) for i, p in enumerate(paths)]
        check(x1.shape[1] == 1 and max(diffs) == 0, f"--channels 1 rows equal convert('L') (max abs diff {diffs})")

        out = os.path.join(tmp, "fast.h5")
        run(args.dpdata, ["--folder", tree, "--out", out, "--size", str(S), "--threads", "3"])
        xf, _, _ = read(out)
        png_max = max(int(np.abs(xf[i].astype(int) - x[i]).max()) for i in range(len(paths)) if not jpeg[i])
        jpg_mean = [float(np.abs(xf[i].astype(int) - x[i]).mean()) for i in range(len(paths)) if jpeg[i]]
        check(png_max == 0, "default decoding: PNG rows unchanged")
        check(max(jpg_mean) <= 8.0, f"default decoding: JPEG rows within mean abs diff 8 of torchvision's ({jpg_mean})")

        exif = [i for i, p in enumerate(paths) if p.endswith("exif6.jpg")][0]
        out = os.path.join(tmp, "exif.h5")
        run(args.dpdata, ["--folder", tree, "--out", out, "--size", str(S), "--full-decode", "--exif-transpose"])
        xe, _, _ = read(out)
        d = int(np.abs(xe[exif].astype(int) - reference(paths[exif], "RGB", exif=True)).max())
        check(d == 0, f"--exif-transpose equals ImageOps.exif_transpose (max abs diff {d})")
        check(not np.array_equal(xe[exif], x[exif]), "without --exif-transpose the EXIF-rotated JPEG is as stored")

        g16 = os.path.join(tmp, "g16", "a", "g.png")
        os.makedirs(os.path.dirname(g16))
        v = images_tree.make_gray16(g16)
        out = os.path.join(tmp, "g16.h5")
        run(args.dpdata, ["--folder", os.path.dirname(os.path.dirname(g16)), "--out", out, "--size", "29",
                          "--channels", "1"])
        xg, _, _ = read(out)
        want = (v >> 8).astype(np.uint8)[:, 3:32]  # 35 wide: center crop of 29 starts at round(3.0)
        check(np.array_equal(xg[0, 0], want), "16-bit gray PNG: the high byte of each value")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
