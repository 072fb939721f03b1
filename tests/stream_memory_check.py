#!/usr/bin/env python3
"""data.read = stream holds a bounded number of micro-batches, not the file: peak resident
memory (ru_maxrss of the dptrain process, one CPU rank) training a 300 MB uint8 file for 310
steps of 32 rows (an epoch but its last 80 rows: a reader that kept what it read would show),
against the same run on a 3 MB file (the baseline: libraries, model, test set):
  - stream: at most 48 MiB above the baseline (the bound it states: (stream_batches + 2) x
    batch x row = 10 x 32 x 30,000 bytes = 9.2 MiB, plus allocator slack);
  - all: at least 250 MiB above it (the file itself), so the check can fail;
  - shard: an epoch's rows for this rank (all of them on one rank): also >= 250 MiB.
The same for rows stored as JPEGs (/jpeg + /jpeg_offsets, as `dpdata images --store jpeg`
writes them): 10,000 rows of 3 x 100 x 100 noise at quality 95, a file of over 100 MB whose
decoded rows are 300 MB. Streamed, the rank holds its coming micro-batches' bytes and pixels
(within 48 MiB of the baseline, which holding the file would exceed); all decodes every row
(>= 250 MiB over it).
On a machine of 2 or more cores, the JPEG stream's hint that the rank may decode on fewer than 4
cores (mpirun binds ranks): shown when the rank is pinned to one core (taskset -c 0), not when it
may use all of them (--bind-to none).
Exits 77 (skip) without h5py, numpy or PIL.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile

try:
    import io
    import h5py
    import numpy as np
    from PIL import Image
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)


def write(path, n, seed):
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("features", (n, 3, 100, 100), dtype="u1", chunks=(1, 3, 100, 100))
        for i in range(0, n, 500):
            m = min(500, n - i)
            d[i:i + m] = rng.integers(0, 256, (m, 3, 100, 100), dtype=np.uint8)
        d.attrs["scale"] = np.float32(1 / 255)
        f.create_dataset("labels", data=rng.integers(0, 10, n).astype(np.int32))
        f.attrs["num_classes"] = np.int32(10)


def write_jpeg(path, n, seed, distinct=250):
    """n rows stored as JPEGs: `distinct` noise images at quality 95, repeated in turn."""
    rng = np.random.default_rng(seed)
    enc = []
    for _ in range(distinct):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (100, 100, 3), dtype=np.uint8)).save(b, "JPEG", quality=95)
        enc.append(np.frombuffer(b.getvalue(), np.uint8))
    sizes = np.array([len(enc[i % distinct]) for i in range(n)], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("jpeg", (int(offsets[-1]),), dtype="u1", chunks=(1 << 20,))
        for i in range(0, n, 500):
            d[offsets[i]:offsets[min(i + 500, n)]] = np.concatenate([enc[r % distinct] for r in range(i, min(i + 500, n))])
        d.attrs["shape"] = np.array([3, 100, 100], np.int64)
        d.attrs["scale"] = np.float32(1 / 255)
        d.attrs["offset"] = np.float32(0)
        f.create_dataset("jpeg_offsets", data=offsets)
        f.create_dataset("labels", data=rng.integers(0, 10, n).astype(np.int32))
        f.attrs["num_classes"] = np.int32(10)
    return int(offsets[-1])


def peak_mib(cmd):
    """ru_maxrss of the largest process cmd runs, measured in a child of its own."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.stderr.write(r.stderr[-2000:] if r.returncode else '')\n")
    out = subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True, text=True)
    rc, kib = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}):\n{out.stderr}")
    return int(kib) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big, small = os.path.join(tmp, "big.h5"), os.path.join(tmp, "small.h5")
        write(big, 10000, 1)    # 300 MB
        write(small, 100, 2)    # 3 MB
        base = ["mpirun", "-np", "1", os.path.join(args.build, "dptrain"), "--config",
                os.path.join(args.root, "inputs", "cnn.ini"), "--device.type", "cpu", "--train.precision", "fp32", "--checkpoint.dir", "",
                "--log.metrics", "", "--data.test", "", "--model.layers", "maxpool(10) flatten linear(10)",
                "--train.batch_per_rank", "32", "--train.steps", "310", "--data.stream_batches", "8"]
        rss = {}
        rss["baseline"] = peak_mib(base + ["--data.train", small, "--data.read", "all"])
        for mode in ("stream", "all", "shard"):
            rss[mode] = peak_mib(base + ["--data.train", big, "--data.read", mode])
        jpeg = os.path.join(tmp, "jpeg.h5")
        jpeg_bytes = write_jpeg(jpeg, 10000, 3)
        print(f"JPEG file: {jpeg_bytes / 1e6:.1f} MB of JPEG bytes for 10,000 rows of 30,000 bytes")
        for mode in ("stream", "all"):
            rss["jpeg " + mode] = peak_mib(base + ["--data.train", jpeg, "--data.read", mode])
        hint = {}
        if os.cpu_count() and os.cpu_count() >= 2 and shutil.which("taskset"):
            short = [a if a != "310" else "3" for a in base]
            for pinned in (True, False):
                cmd = short[:3] + ["--bind-to", "none"] + (["taskset", "-c", "0"] if pinned else []) + short[3:]
                r = subprocess.run(cmd + ["--data.train", jpeg, "--data.read", "stream"], capture_output=True, text=True)
                if r.returncode:
                    raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
                hint[pinned] = "decoded on this rank's cores" in r.stdout + r.stderr
                print(f"{'pinned to core 0' if pinned else 'unbound'}: hint {'shown' if hint[pinned] else 'not shown'}")
        else:
            print("fewer than 2 cores or no taskset: the binding hint is not checked")
        for k, v in rss.items():
            print(f"{k}: peak resident {v:.1f} MiB ({v - rss['baseline']:+.1f} MiB over the baseline)")
    failures = []
    if jpeg_bytes < 100e6:
        failures.append(f"the JPEG file holds only {jpeg_bytes / 1e6:.1f} MB: the check has no teeth")
    for mode in ("stream", "jpeg stream"):
        if rss[mode] - rss["baseline"] > 48:
            failures.append(f"{mode} holds {rss[mode] - rss['baseline']:.1f} MiB over the baseline (> 48)")
    for mode in ("all", "shard", "jpeg all"):
        if rss[mode] - rss["baseline"] < 250:
            failures.append(f"{mode} holds only {rss[mode] - rss['baseline']:.1f} MiB over the baseline (< 250): "
                            "the check has no teeth")
    if hint and not hint[True]:
        failures.append("a JPEG stream on one of the node's cores gave no hint to unbind the rank")
    if hint and hint[False]:
        failures.append("a JPEG stream free to use every core was told it may run on fewer")
    for f in failures:
        print("FAIL:", f)
    print("stream_memory_check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
