#!/usr/bin/env python3
"""data.read = stream holds a bounded number of micro-batches, not the file: peak resident
memory (ru_maxrss of the dptrain process, one CPU rank) training a 300 MB uint8 file for 20
steps, against the same run on a 3 MB file (the baseline: libraries, model, test set):
  - stream: at most 48 MiB above the baseline (the bound it states: (stream_batches + 2) x
    batch x row = 10 x 32 x 30,000 bytes = 9.2 MiB, plus allocator slack);
  - all: at least 250 MiB above it (the file itself), so the check can fail;
  - shard: an epoch's rows for this rank (all of them on one rank): also >= 250 MiB.
Exits 77 (skip) without h5py or numpy.
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
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
                "--train.batch_per_rank", "32", "--train.steps", "20", "--data.stream_batches", "8"]
        rss = {}
        rss["baseline"] = peak_mib(base + ["--data.train", small, "--data.read", "all"])
        for mode in ("stream", "all", "shard"):
            rss[mode] = peak_mib(base + ["--data.train", big, "--data.read", mode])
        for k, v in rss.items():
            print(f"{k}: peak resident {v:.1f} MiB ({v - rss['baseline']:+.1f} MiB over the baseline)")
    failures = []
    if rss["stream"] - rss["baseline"] > 48:
        failures.append(f"stream holds {rss['stream'] - rss['baseline']:.1f} MiB over the baseline (> 48)")
    for mode in ("all", "shard"):
        if rss[mode] - rss["baseline"] < 250:
            failures.append(f"{mode} holds only {rss[mode] - rss['baseline']:.1f} MiB over the baseline (< 250): "
                            "the check has no teeth")
    for f in failures:
        print("FAIL:", f)
    print("stream_memory_check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
