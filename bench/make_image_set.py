#!/usr/bin/env python3
"""A folder of JPEG files in torchvision's ImageFolder layout, sized like ImageNet's.

    python3 bench/make_image_set.py OUT_DIR [--count 50000] [--classes 100] [--width 500]
        [--height 375] [--target-kb 110] [--quality 90] [--workers N] [--seed S]

Writes OUT_DIR/class_XXX/img_XXXXXX.jpg: image i belongs to class i mod --classes (balanced).
ImageNet's training JPEGs average about 110 KB at a typical 500x375; these match that so that
reading and decoding them costs what ImageNet's do. Content that compresses like a photograph:
a smooth colour field of several octaves (random low-resolution noise upsampled bicubically),
a few ellipses and rectangles with soft edges, then per-pixel texture noise. The class sets the
field's mean colour and the shapes' palette, so a classifier has something to learn.

The texture noise's amplitude sets the file size: before writing, it is calibrated by bisection
on a fixed sample of 16 images (the same for a given seed and size) so that their mean size is
--target-kb at --quality; the written set's mean lands within a few per cent of it. Each image's
random numbers come from (seed, index), so the files are the same whatever --workers is.
Prints the count, mean/min/max KB and the seconds taken, and one JSON line with the same.
"""
import argparse
import io
import json
import os
import sys
import time
from multiprocessing import Pool

import numpy as np
from PIL import Image, ImageDraw


def class_palette(seed, c):
    """The class's mean colour and three shape colours (uint8 RGB)."""
    r = np.random.default_rng([seed, 1_000_003, c])
    return r.uniform(40, 215, 3), r.uniform(0, 255, (3, 3))


_bank = {}


def noise_bank(seed):
    """2^22 standard normal floats drawn once per process from the seed: each image's texture noise
    is a window of it at an offset of its own (a fresh draw per image cost more than the rest)."""
    if seed not in _bank:
        _bank[seed] = np.random.default_rng([seed, 7]).standard_normal(1 << 22, dtype=np.float32)
    return _bank[seed]


def render(seed, i, classes, w, h, noise):
    """Image i as a PIL RGB image; noise: the texture noise's standard deviation (0-255 scale)."""
    c = i % classes
    r = np.random.default_rng([seed, i])
    base, shapes = class_palette(seed, c)
    # Field and shapes at a quarter of the size, then one bicubic upscale: smooth gradients and
    # soft edges, as a lens gives, for little work.
    lw, lh = (w + 3) // 4, (h + 3) // 4
    field = np.zeros((lh, lw, 3), np.float32)
    # Octaves of smooth noise (coarse: large amplitude), as a photograph's spectrum falls with frequency.
    for cells, amp in ((3, 60.0), (8, 30.0), (24, 14.0)):
        gw, gh = cells + 1, max(2, cells * h // w + 1)
        g = r.normal(0.0, amp, (gh, gw, 3)).astype(np.float32)
        for ch in range(3):
            field[:, :, ch] += np.asarray(Image.fromarray(g[:, :, ch], mode="F").resize((lw, lh), Image.BICUBIC))
    field += r.normal(0.0, 6.0, (lh, lw, 3)).astype(np.float32)  # the finest octave: one value per 4x4 pixels
    img = Image.fromarray(np.clip(field + base, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    for k in range(int(r.integers(3, 8))):
        x0, y0 = r.uniform(-0.2, 0.9) * lw, r.uniform(-0.2, 0.9) * lh
        x1, y1 = x0 + r.uniform(0.1, 0.6) * lw, y0 + r.uniform(0.1, 0.6) * lh
        col = tuple(int(v) for v in np.clip(shapes[k % 3] + r.normal(0, 20, 3), 0, 255))
        (d.ellipse if r.random() < 0.6 else d.rectangle)([x0, y0, x1, y1], fill=col)
    px = np.asarray(img.resize((w, h), Image.BICUBIC), np.float32)
    # Texture: per-pixel noise, partly shared by the channels (luminance grain), partly not.
    bank = noise_bank(seed)
    o1, o2 = r.integers(0, bank.size - 4 * w * h, 2)
    px += (noise * bank[o1:o1 + w * h]).reshape(h, w, 1)
    px += (0.35 * noise * bank[o2:o2 + 3 * w * h]).reshape(h, w, 3)
    return Image.fromarray(np.clip(px, 0, 255).astype(np.uint8), "RGB")


def encoded_size(args):
    seed, i, classes, w, h, noise, quality = args
    buf = io.BytesIO()
    render(seed, i, classes, w, h, noise).save(buf, "JPEG", quality=quality)
    return buf.tell()


def write_one(args):
    out, seed, i, classes, w, h, noise, quality = args
    path = os.path.join(out, f"class_{i % classes:03d}", f"img_{i:06d}.jpg")
    render(seed, i, classes, w, h, noise).save(path, "JPEG", quality=quality)
    return os.path.getsize(path)


def calibrate(pool, a):
    """The texture noise's amplitude that gives the sample a mean of --target-kb (bisection)."""
    sample = [a.count + 7919 * k for k in range(16)]  # indices past the set: the same sample for any --count
    target = a.target_kb * 1024
    lo, hi = 0.0, 40.0
    for _ in range(12):
        mid = 0.5 * (lo + hi)
        mean = np.mean(pool.map(encoded_size, [(a.seed, i, a.classes, a.width, a.height, mid, a.quality) for i in sample]))
        if mean < target:
            lo = mid
        else:
            hi = mid
        if abs(mean - target) < 0.01 * target:
            break
    return mid, mean / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=50000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--width", type=int, default=500)
    ap.add_argument("--height", type=int, default=375)
    ap.add_argument("--target-kb", type=float, default=110.0, help="mean file size wanted (KB = 1024 bytes)")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality (Pillow's scale)")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.count < 1 or a.classes < 1:
        sys.exit("make_image_set: --count and --classes must be positive")
    t0 = time.time()
    for c in range(min(a.classes, a.count)):
        os.makedirs(os.path.join(a.out, f"class_{c:03d}"), exist_ok=True)
    with Pool(a.workers) as pool:
        noise, sample_kb = calibrate(pool, a)
        t1 = time.time()
        print(f"calibrated: texture noise {noise:.2f} at quality {a.quality}, sample mean {sample_kb:.1f} KB "
              f"({t1 - t0:.1f} s)", flush=True)
        jobs = [(a.out, a.seed, i, a.classes, a.width, a.height, noise, a.quality) for i in range(a.count)]
        sizes = np.array(pool.map(write_one, jobs, chunksize=64), np.float64) / 1024
    t2 = time.time()
    rec = {"bench": "make_image_set", "out": a.out, "count": a.count, "classes": a.classes,
           "width": a.width, "height": a.height, "quality": a.quality, "noise": round(noise, 3),
           "target_kb": a.target_kb, "mean_kb": round(sizes.mean(), 1), "min_kb": round(sizes.min(), 1),
           "max_kb": round(sizes.max(), 1), "total_mb": round(sizes.sum() / 1024, 1), "workers": a.workers,
           "seconds": round(t2 - t0, 2), "write_seconds": round(t2 - t1, 2)}
    off = 100 * (sizes.mean() / a.target_kb - 1)
    print(f"{a.count} files in {a.classes} classes: mean {sizes.mean():.1f} KB ({off:+.1f}% of {a.target_kb:g}), "
          f"min {sizes.min():.1f}, max {sizes.max():.1f}; {t2 - t0:.1f} s ({t2 - t1:.1f} s writing, "
          f"{a.count / (t2 - t1):.0f} files/s, {a.workers} workers)")
    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
