#!/usr/bin/env python3
"""Kernel time by kernel name from Nsight Compute's raw CSV (`ncu --metrics gpu__time_duration.sum
--csv --page raw --log-file F.csv ...`): where a step's time goes when nsys is not installed.
With dram__bytes.sum among the metrics, also each kernel's DRAM traffic and its rate (GB/s).

Usage: python3 bench/ncu_summary.py F.csv [--last N] [--top K]
  --last N  only the last N kernels recorded (one step's, when the run ends with that step)
  --top K   rows to print (default 30)
Prints, per kernel name, the count, the total and mean duration (us) and the share of the total
(and the mean MB moved and the GB/s where the CSV has dram__bytes.sum).
"""
import argparse
import collections
import csv
import sys


def number(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def rows(path):
    """(name, duration, its unit, DRAM bytes or None) per kernel."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    reader = csv.DictReader(lines)
    name_col = next((c for c in reader.fieldnames if c.strip() == "Kernel Name"), None)
    def column(metric):  # the .sum column where ncu gave .avg/.max/.min/.sum, else the metric's own
        cols = [c for c in reader.fieldnames if c.strip().startswith(metric)]
        return next((c for c in cols if c.strip() == metric + ".sum"), cols[0] if cols else None)
    time_col = column("gpu__time_duration")
    byte_col = column("dram__bytes")
    if not name_col or not time_col:
        sys.exit(f"{path}: no 'Kernel Name' or gpu__time_duration column in {reader.fieldnames}")
    unit, bunit = None, None
    for r in reader:
        t = number(r[time_col])
        if t is None:  # the units row
            unit = r[time_col]
            bunit = r[byte_col] if byte_col else None
            continue
        b = number(r[byte_col]) if byte_col else None
        if b is not None:
            b *= {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(bunit or "byte", 1)
        yield r[name_col], t, unit, b


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
    moved = collections.defaultdict(float)
    count = collections.Counter()
    has_bytes = any(b is not None for *_, b in data)
    for name, t, _, b in data:
        total[name] += t * scale
        moved[name] += b or 0.0
        count[name] += 1
    grand = sum(total.values())
    print(f"{len(data)} kernels, {grand / 1e3:.3f} ms in all")
    extra = f" {'mean MB':>8} {'GB/s':>6}" if has_bytes else ""
    print(f"{'share':>6} {'total us':>10} {'count':>6} {'mean us':>9}{extra}  kernel")
    for name, t in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        extra = f" {moved[name] / count[name] / 1e6:8.1f} {moved[name] / (t * 1e3):6.0f}" if has_bytes else ""
        print(f"{100 * t / grand:5.1f}% {t:10.1f} {count[name]:6d} {t / count[name]:9.2f}{extra}  {name[:110]}")


if __name__ == "__main__":
    main()
