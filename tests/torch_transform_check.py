#!/usr/bin/env python3
"""Resized crops (augment.hpp) against torchvision's transforms, through tests/transform_probe:

1. random_resized_crop's windows: for several image shapes, 20,000 of our windows against
   20,000 of torchvision's RandomResizedCrop.get_params: the two-sample Kolmogorov-Smirnov
   distance of the area fraction, of log(width / height), of the top and left offsets as
   fractions of their room, each < 0.03 (the 0.1% critical value at these sizes is 0.019;
   0.03 leaves room for the discrete sides); every window inside the image; flips 50% +- 2%.
   Then a shape where every try fails (a 1 x 200 strip) gives torchvision's fallback window.
2. A window resized: F.resized_crop(img, top, left, h, w, [oh, ow], antialias=True), then hflip
   and Normalize, against ours on a random float image, windows shrunk (to 0.3x), enlarged
   (4x), thin, whole; max abs difference <= 2e-6 (float sums in another order).
3. Evaluation: torchvision's Resize(256) + CenterCrop(224) of a 256 x 256 image is our center
   window (crop_size 224, eval_crop_ratio 0.875) exactly; windows for other sizes are printed
   beside Resize + CenterCrop's and must lie within one pixel of the same square.
Exits 77 (skip) without torch or torchvision.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)


def ks(a, b):
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b))))


def features(wins, h, w):
    wins = np.asarray(wins, float)
    top, left, wh, ww = wins[:, 0], wins[:, 1], wins[:, 2], wins[:, 3]
    room_y, room_x = h - wh, w - ww
    fy = np.where(room_y > 0, top / np.maximum(room_y, 1), 0.5)
    fx = np.where(room_x > 0, left / np.maximum(room_x, 1), 0.5)
    return {"area": wh * ww / (h * w), "log_ratio": np.log(ww / wh), "top": fy, "left": fx}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    args = ap.parse_args()
    failures = []
    n = 20000
    torch.manual_seed(0)
    for (h, w, scale, ratio) in [(256, 256, "0.08,1", "0.75,1.3333333333333333"), (375, 500, "0.08,1", "0.75,1.3333333333333333"),
                                 (28, 28, "0.35,1", "0.75,1.3333333333333333"), (64, 300, "0.5,1", "0.5,2")]:
        out = subprocess.run([args.probe, "draws", str(h), str(w), str(n), scale, ratio, "1"], check=True,
                             capture_output=True, text=True).stdout.split("\n")
        ours = [list(map(int, l.split())) for l in out if l.strip()]
        sc = [float(v) for v in scale.split(",")]
        ra = [float(v) for v in ratio.split(",")]
        img = torch.empty(1, h, w)
        theirs = [T.RandomResizedCrop.get_params(img, sc, ra) for _ in range(n)]
        inside = all(0 <= t and 0 <= l and 0 < wh and 0 < ww and t + wh <= h and l + ww <= w for t, l, wh, ww, _ in ours)
        if not inside:
            failures.append(f"{h}x{w}: a window outside the image")
        fo, ft = features([o[:4] for o in ours], h, w), features(theirs, h, w)
        for k in fo:
            d = ks(fo[k], ft[k])
            print(f"{h}x{w} scale {scale} ratio {ratio}: KS distance of {k} {d:.4f}")
            if d > 0.03:
                failures.append(f"{h}x{w}: {k} distribution differs from torchvision's (KS {d:.4f} > 0.03)")
        flips = sum(o[4] for o in ours) / n
        print(f"{h}x{w}: flipped {flips:.4f}")
        if abs(flips - 0.5) > 0.02:
            failures.append(f"{h}x{w}: flips {flips:.4f}")
    # The fallback: no window of area >= 8% and ratio in [3/4, 4/3] fits a 1 x 200 strip.
    out = subprocess.run([args.probe, "draws", "1", "200", "5", "0.08,1", "0.75,1.3333333333333333", "0"], check=True,
                         capture_output=True, text=True).stdout.split("\n")
    want = T.RandomResizedCrop.get_params(torch.empty(1, 1, 200), [0.08, 1.0], [3 / 4, 4 / 3])
    for l in out:
        if l.strip() and tuple(map(int, l.split()[:4])) != tuple(want):
            failures.append(f"fallback window {l} != torchvision's {want}")
    print(f"fallback window of a 1x200 image: {out[0]} (torchvision {want})")

    # 2. The resize of a window.
    rng = np.random.default_rng(5)
    c, h, w = 3, 60, 80
    img = rng.random((c, h, w), dtype=np.float32)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    cases = [(5, 7, 50, 66, 20, 20, 0), (5, 7, 50, 66, 20, 20, 1), (10, 3, 12, 9, 48, 36, 1), (0, 0, 60, 80, 60, 80, 0),
             (2, 30, 40, 3, 16, 16, 0), (0, 0, 60, 80, 224, 224, 1), (11, 13, 37, 41, 224, 224, 0)]
    with tempfile.TemporaryDirectory() as tmp:
        fin, fout = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
        img.tofile(fin)
        for top, left, wh, ww, oh, ow, flip in cases:
            for norm in (False, True):
                cmd = [args.probe, "crop", fin, fout, str(c), str(h), str(w), str(oh), str(ow), str(top), str(left), str(wh),
                       str(ww), str(flip)]
                if norm:
                    cmd += [",".join(map(str, mean)), ",".join(map(str, std))]
                subprocess.run(cmd, check=True)
                ours = np.fromfile(fout, dtype=np.float32).reshape(c, oh, ow)
                t = F.resized_crop(torch.from_numpy(img), top, left, wh, ww, [oh, ow], antialias=True)
                if flip:
                    t = F.hflip(t)
                if norm:
                    t = F.normalize(t, mean, std)
                d = float(np.max(np.abs(ours - t.numpy())))
                print(f"window {top},{left} {wh}x{ww} -> {oh}x{ow} flip {flip} normalised {norm}: max abs diff {d:.2e}")
                if not d <= 2e-6:
                    failures.append(f"window {top},{left} {wh}x{ww} -> {oh}x{ow}: max abs diff {d:.2e} > 2e-6")

        # 3. Evaluation: Resize(256) + CenterCrop(224) of a 256 x 256 image.
        big = rng.random((3, 256, 256), dtype=np.float32)
        big.tofile(fin)
        out = subprocess.run([args.probe, "center", "256", "256", "224", "0.875"], check=True, capture_output=True,
                             text=True).stdout.split()
        top, left, wh, ww = map(int, out)
        subprocess.run([args.probe, "crop", fin, fout, "3", "256", "256", "224", "224", str(top), str(left), str(wh),
                        str(ww), "0"], check=True)
        ours = np.fromfile(fout, dtype=np.float32).reshape(3, 224, 224)
        t = F.center_crop(F.resize(torch.from_numpy(big), 256, antialias=True), 224).numpy()
        d = float(np.max(np.abs(ours - t)))
        print(f"Resize(256) + CenterCrop(224) of 256x256: window {out}, max abs diff {d:.2e}")
        if d != 0.0:
            failures.append(f"center crop of a 256x256 image differs from torchvision's by {d:.2e}")
        for (h2, w2, size, ratio) in [(300, 300, 224, 0.875), (256, 320, 224, 0.875), (160, 160, 128, 0.875), (28, 28, 24, 0.875)]:
            out = subprocess.run([args.probe, "center", str(h2), str(w2), str(size), str(ratio)], check=True,
                                 capture_output=True, text=True).stdout.split()
            top, left, wh, ww = map(int, out)
            # torchvision: shorter side to R = size / ratio, then a centered size x size: in the
            # stored image's pixels a square of side size * min(h, w) / R at the center.
            r = int(size / ratio)
            side = size * min(h2, w2) / r
            want_top, want_left = (h2 - side) / 2, (w2 - side) / 2
            ok = abs(wh - side) <= 1 and abs(ww - side) <= 1 and abs(top - want_top) <= 1 and abs(left - want_left) <= 1
            print(f"center window of {h2}x{w2} for {size} at {ratio}: {out}, torchvision's square {want_top:.2f},{want_left:.2f} side {side:.2f}")
            if not ok:
                failures.append(f"center window of {h2}x{w2}: {out} vs side {side:.2f} at {want_top:.2f},{want_left:.2f}")
    for f in failures:
        print("FAIL:", f)
    print("torch_transform_check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
