#!/usr/bin/env python3
"""Fashion-MNIST's idx files as grayscale PNG files in torchvision's ImageFolder layout.

    python3 bench/fmnist_png.py [--data /usr/share/datasets/fashion-mnist] --out DIR [--workers N]

Reads train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
t10k-labels-idx1-ubyte.gz (Debian's dataset-fashion-mnist puts them in
/usr/share/datasets/fashion-mnist) and writes DIR/train/<class>/NNNNN.png and
DIR/test/<class>/NNNNN.png, 28x28 mode "L", NNNNN the image's 1-based index in its idx file.

Class folders are "<label>_<name>" (0_T-shirt_top, 1_Trouser, ... 9_Ankle_boot): an image
folder's class index is its folder's place in sorted order (torchvision's find_classes), and the
label prefix makes that order the idx labels'. Within a class, sorted file names keep the idx
order. Prints one JSON line per split.
"""
import argparse
import gzip
import json
import os
import struct
import time
from multiprocessing import Pool

import numpy as np
from PIL import Image

CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"]
SPLITS = {"train": "train", "test": "t10k"}


def folder(label):
    return f"{label}_{CLASSES[label]}"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        magic = struct.unpack(">I", f.read(4))[0]
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        if magic >> 8 != 0x08:  # unsigned bytes
            raise ValueError(f"{path}: idx type {magic >> 8:#x}, expected 0x08 (uint8)")
        return np.frombuffer(f.read(), np.uint8).reshape(dims)


def write_chunk(job):
    out, images, labels, first = job
    for k, (img, lab) in enumerate(zip(images, labels)):
        Image.fromarray(img, "L").save(os.path.join(out, folder(int(lab)), f"{first + k + 1:05d}.png"))
    return len(images)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder with the four idx .gz files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    a = ap.parse_args()
    with Pool(a.workers) as pool:
        for split, stem in SPLITS.items():
            t0 = time.time()
            x = read_idx(os.path.join(a.data, f"{stem}-images-idx3-ubyte.gz"))
            y = read_idx(os.path.join(a.data, f"{stem}-labels-idx1-ubyte.gz"))
            if x.shape[0] != y.shape[0] or x.shape[1:] != (28, 28) or y.max() >= len(CLASSES):
                raise SystemExit(f"fmnist_png: {stem}: {x.shape} images, {y.shape} labels (max {y.max()})")
            root = os.path.join(a.out, split)
            for c in range(len(CLASSES)):
                os.makedirs(os.path.join(root, folder(c)), exist_ok=True)
            step = 1000
            n = sum(pool.map(write_chunk, [(root, x[i:i + step], y[i:i + step], i) for i in range(0, len(x), step)]))
            print(json.dumps({"bench": "fmnist_png", "split": split, "images": n, "out": root,
                              "per_class": np.bincount(y, minlength=len(CLASSES)).tolist(),
                              "seconds": round(time.time() - t0, 2)}), flush=True)


if __name__ == "__main__":
    main()
