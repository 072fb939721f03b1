#!/usr/bin/env python3
"""Kernel time by kernel name from Nsight Compute's raw CSV (`ncu --metrics gpu__time_duration.sum
--csv --page raw --log-file F.csv ...`): where a step's time goes when nsys is not installed.

Usage: python3 bench/ncu_summary.py F.csv [--last N] [--top K]
  --last N  only the last N kernels recorded (one step's, when the run ends with that step)
  --top K   rows to print (default 30)
Prints, per kernel name, the count, the total and mean duration (us) and the share of the total.
"""
import argparse
import collections
import csv
import sys


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    reader = csv.DictReader(lines)
    name_col = next((c for c in reader.fieldnames if c.strip() == "Kernel Name"), None)
    time_col = next((c for c in reader.fieldnames if c.strip().startswith("gpu__time_duration")), None)
    if not name_col or not time_col:
        sys.exit(f"{path}: no 'Kernel Name' or gpu__time_duration column in {reader.fieldnames}")
    unit = None
    for r in reader:
        v = r[time_col].replace(",", "")
        try:
            t = float(v)
        except ValueError:  # the units row
            unit = v
            continue
        yield r[name_col], t, unit


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--last", type=int, default=0)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    data = list(rows(a.csv))
    if a.last:
        data = data[-a.last:]
    if not data:
        sys.exit(f"{a.csv}: no kernels")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(data[-1][2] or "ns", 1e-3)
    total = collections.defaultdict(float)
    count = collections.Counter()
    for name, t, _ in data:
        total[name] += t * scale
        count[name] += 1
    grand = sum(total.values())
    print(f"{len(data)} kernels, {grand / 1e3:.3f} ms in all")
    print(f"{'share':>6} {'total us':>10} {'count':>6} {'mean us':>9}  kernel")
    for name, t in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{100 * t / grand:5.1f}% {t:10.1f} {count[name]:6d} {t / count[name]:9.2f}  {name[:110]}")


if __name__ == "__main__":
    main()
