#!/usr/bin/env python3
"""Import rate: `dpdata images` against torchvision's ImageFolder doing the same work.

    python3 bench/import_rate.py --build BUILD --images DIR [--size 256] [--workers N]
        [--out /tmp/import-rate.h5] [--batch 256] [--sides dpdata,dpdata-full,torchvision]

Both sides read the same files in ImageFolder layout, decode them, resize the shorter side to
--size with antialiasing and keep the centre --size x --size, in uint8:
  dpdata       `BUILD/dpdata images --folder DIR --out OUT --size S --threads N`, the process's
               wall time (the HDF5 file written included); by default libjpeg decodes a JPEG
               already scaled by M/8 where the result stays at least S on its shorter side
               (500x375 to 256: 6/8), less work than a full decode;
  dpdata-full  the same with --full-decode: every JPEG decoded at full size, as PIL does (the
               like-for-like row; PIL's own draft mode scales by 1/2, 1/4, 1/8 only, which would
               leave 375 -> 187 < 256, so it gives torchvision nothing here);
  torchvision  ImageFolder (its default loader: PIL, .convert("RGB")) with Resize(S),
               CenterCrop(S), PILToTensor() (uint8: no float conversion or normalisation), through
               a DataLoader of N workers, batch --batch, one pass in file order; timed from
               creating the dataset (its folder scan) to the last batch.
Page cache: every file is read once before the timings (its time and rate are reported as
"prefetch"), so both sides read from memory: this measures decoding and resizing, not the disk.
Prints one JSON line per side (images, seconds, images/s) and one with the ratios.
"""
import argparse
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's


def say(**rec):
    print(json.dumps({"bench": "import_rate", **rec}), flush=True)


def image_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.lower().endswith(EXTENSIONS)]


def prefetch(files, threads):
    """Reads every file once (page cache warm); returns (bytes, seconds)."""
    def read(p):
        with open(p, "rb") as f:
            return len(f.read())
    t0 = time.time()
    with ThreadPoolExecutor(threads) as ex:
        n = sum(ex.map(read, files, chunksize=256))
    return n, time.time() - t0


def dpdata_side(a, count, full):
    out = a.out + ".full.h5" if full else a.out
    cmd = [os.path.join(a.build, "dpdata"), "images", "--folder", a.images, "--out", out, "--size", str(a.size),
           "--threads", str(a.workers)] + (["--full-decode"] if full else [])
    if os.path.exists(out):
        os.remove(out)
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    s = time.time() - t0
    rec = {"side": "dpdata-full" if full else "dpdata", "command": " ".join(cmd), "rc": p.returncode, "seconds": round(s, 3)}
    if p.returncode != 0:
        say(**rec, tail=p.stdout[-1500:])
        return None
    rows = count
    try:
        import h5py
        with h5py.File(out, "r") as f:
            rows = f["features"].shape[0]
            rec["shape"] = list(f["features"].shape)
    except ImportError:
        pass
    rec.update(images=rows, images_per_s=round(rows / s, 1), out_mb=round(os.path.getsize(out) / 2**20, 1),
               output_tail=p.stdout.strip().splitlines()[-3:])
    say(**rec)
    if full:
        os.remove(out)
    return rows / s


def torchvision_side(a):
    import torch
    import torchvision
    from torchvision import transforms as T
    torch.set_num_threads(1)  # the workers do the work; the main process only gathers batches
    tf = T.Compose([T.Resize(a.size), T.CenterCrop(a.size), T.PILToTensor()])
    t0 = time.time()
    ds = torchvision.datasets.ImageFolder(a.images, transform=tf)
    t_scan = time.time() - t0
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=False, num_workers=a.workers)
    n, shape = 0, None
    for x, _ in loader:
        n += x.shape[0]
        shape = list(x.shape[1:])
    s = time.time() - t0
    say(side="torchvision", images=n, seconds=round(s, 3), scan_seconds=round(t_scan, 3), images_per_s=round(n / s, 1),
        sample_shape=shape, workers=a.workers, batch=a.batch, torch=torch.__version__, torchvision=torchvision.__version__)
    return n / s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="folder with dpdata")
    ap.add_argument("--images", required=True, help="ImageFolder root: DIR/<class>/<file>")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="dpdata --threads and DataLoader workers")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default="/tmp/import-rate.h5", help="dpdata's output file")
    ap.add_argument("--sides", default="dpdata,dpdata-full,torchvision")
    ap.add_argument("--keep", action="store_true", help="keep dpdata's output file")
    a = ap.parse_args()
    files = image_files(a.images)
    nbytes, s = prefetch(files, max(4, a.workers))
    say(side="prefetch", files=len(files), mb=round(nbytes / 2**20, 1), seconds=round(s, 3),
        mb_per_s=round(nbytes / 2**20 / max(s, 1e-9), 1), page_cache="warm for the timings below")
    rates = {}
    for side in a.sides.split(","):
        rates[side] = torchvision_side(a) if side == "torchvision" else dpdata_side(a, len(files), side == "dpdata-full")
    if rates.get("torchvision") and any(v for k, v in rates.items() if k != "torchvision"):
        say(side="ratio", **{f"{k}_over_torchvision": round(v / rates["torchvision"], 2)
                             for k, v in rates.items() if k != "torchvision" and v},
            workers=a.workers, size=a.size, page_cache="warm")
    if not a.keep and os.path.exists(a.out):
        os.remove(a.out)


if __name__ == "__main__":
    main()
