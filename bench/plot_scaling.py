#!/usr/bin/python3
"""Draw bench-scaling's plots from its records.json (matplotlib).

    python3 bench/plot_scaling.py REPORT_DIR

bench-scaling runs this itself when python3 has matplotlib (Debian: python3-matplotlib) and
otherwise prints this command. Each plot is an SVG in REPORT_DIR, named as report.md shows it
(bench-scaling's plot_list: the two lists must agree; tests/test_bench.cpp checks they do).
Measured points are filled markers on solid lines; predicted ones are hollow markers on dashed
lines; runs that did not reach the target or diverged are marked at the top of the plot.
"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def rows(rec, table):
    return rec["tables"].get(table, {}).get("rows", [])


def groups(rs, key):
    out = {}
    for r in rs:
        out.setdefault(key(r), []).append(r)
    return out


def finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def line(ax, pts, label, dashed=False, hollow=False, marker="o"):
    pts = sorted((x, y) for x, y in pts if finite(x) and finite(y))
    if not pts:
        return
    xs, ys = zip(*pts)
    ax.plot(xs, ys, linestyle="--" if dashed else "-", marker=marker, label=label,
            markerfacecolor="none" if hollow else None)


def finish(fig, ax, path, title, xlabel, ylabel, logx=True, logy=False):
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    if logy:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def scaling(rec, out):
    sc = rows(rec, "scaling")
    if not sc:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (mode, model), rs in groups(sc, lambda r: (r["mode"], r["model"])).items():
        line(ax, [(r["ranks"], r["efficiency"]) for r in rs], f"{mode} {model}")
    for model, rs in groups(rows(rec, "predict"), lambda r: r["model"]).items():
        line(ax, [(r["ranks"], r["predicted_eff"]) for r in rs], f"predicted weak {model}", dashed=True, hollow=True)
    finish(fig, ax, os.path.join(out, "efficiency-vs-ranks.svg"), "Scaling efficiency vs ranks", "ranks",
           "efficiency = thr(n) / (n x thr(1))")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (mode, model), rs in groups(sc, lambda r: (r["mode"], r["model"])).items():
        line(ax, [(r["ranks"], r["samples_per_s"]) for r in rs], f"{mode} {model}")
    finish(fig, ax, os.path.join(out, "throughput-vs-ranks.svg"), "Throughput vs ranks", "ranks", "samples/s")


def grid(rec, out):
    g = rows(rec, "grid")
    if not g:
        return
    by_variant = groups(g, lambda r: r["variant"])
    # Epochs to target: the critical-batch curve; runs without a crossing marked at the top.
    fig, ax = plt.subplots(figsize=(9, 5))
    reached = [r["epochs_to_target"] for r in g if finite(r["epochs_to_target"])]
    top = max(reached) * 2 if reached else 1.0
    for v, rs in by_variant.items():
        line(ax, [(r["global_batch"], r["epochs_to_target"]) for r in rs], v, dashed=("warm-up" in v))
    for status, mk in (("not reached", "^"), ("diverged", "x")):
        miss = [r["global_batch"] for r in g if r["status"] == status]
        if miss:
            ax.scatter(miss, [top] * len(miss), marker=mk, color="black", label=f"{status} (any variant)")
    finish(fig, ax, os.path.join(out, "epochs-to-target-vs-batch.svg"),
           "Epochs to the target accuracy vs global batch", "global batch (samples)", "epochs to target", logy=True)
    fig, ax = plt.subplots(figsize=(9, 5))
    for v, rs in by_variant.items():
        line(ax, [(r["global_batch"], r["final_accuracy"]) for r in rs], v, dashed=("warm-up" in v))
    finish(fig, ax, os.path.join(out, "accuracy-vs-batch.svg"), "Final test accuracy vs global batch, per variant",
           "global batch (samples)", "test accuracy")
    fig, ax = plt.subplots(figsize=(9, 5))
    for v, rs in by_variant.items():
        if "warm-up" not in v:
            line(ax, [(r["global_batch"], r["samples_per_s"]) for r in rs], v)
    finish(fig, ax, os.path.join(out, "throughput-vs-batch.svg"), "Training throughput vs global batch",
           "global batch (samples)", "samples/s")


def tta(rec, out):
    t = rows(rec, "tta")
    if not t:
        return
    check = rows(rec, "check")
    by_variant = groups(t, lambda r: r["variant"])
    fig, ax = plt.subplots(figsize=(9, 5))
    for v, rs in by_variant.items():
        line(ax, [(r["ranks"], r["predicted_s"]) for r in rs], f"{v} (predicted)", dashed=True, hollow=True)
    meas = [(r["ranks"], r["measured_s"]) for r in check if finite(r["measured_s"])]
    if meas:
        ax.scatter(*zip(*meas), marker="o", s=60, color="black", zorder=5,
                   label=f"measured: {check[0]['variant']}, global batch {check[0]['global_batch']:.0f}")
    finish(fig, ax, os.path.join(out, "time-to-target-vs-ranks.svg"), "Time to the target accuracy vs ranks (GPUs)",
           "ranks", "seconds to target", logy=True)
    fig, ax = plt.subplots(figsize=(9, 5))
    n_max = max(r["ranks"] for r in t)
    ax.plot([1, n_max], [1, n_max], color="grey", linewidth=1, label="ideal")
    for v, rs in by_variant.items():
        line(ax, [(r["ranks"], r["speedup"]) for r in rs], f"{v} (predicted)", dashed=True, hollow=True)
    one = {(r["variant"], r["global_batch"]): r["measured_s"] for r in check if r["ranks"] == 1}
    pts = []
    for r in check:
        base = one.get((r["variant"], r["global_batch"]))
        if finite(base) and finite(r["measured_s"]) and r["measured_s"] > 0:
            pts.append((r["ranks"], base / r["measured_s"]))
    if pts:
        ax.scatter(*zip(*pts), marker="o", s=60, color="black", zorder=5,
                   label=f"measured: {check[0]['variant']}, global batch {check[0]['global_batch']:.0f}")
    finish(fig, ax, os.path.join(out, "tta-speedup-vs-ranks.svg"), "Time-to-target speed-up vs ranks (GPUs)",
           "ranks", "time on 1 rank / time on N", logy=True)


def comm(rec, out):
    ar = rows(rec, "allreduce")
    if ar:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for n, rs in groups(ar, lambda r: r["ranks"]).items():
            line(ax, [(r["bytes"], r["busbw_gbs"]) for r in rs], f"ranks {n:.0f}")
        finish(fig, ax, os.path.join(out, "busbw-vs-size.svg"), "Allreduce bus bandwidth vs message size",
               "message size (bytes)", "busbw (GB/s)")
    bk = rows(rec, "buckets")
    if bk:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for (m, n), rs in groups(bk, lambda r: (r["model"], r["ranks"])).items():
            line(ax, [(r["bucket_mb"], r["step_ms"]) for r in rs], f"{m}, {n:.0f} ranks")
        finish(fig, ax, os.path.join(out, "step-vs-bucket.svg"), "Step time vs gradient bucket size",
               "bucket size (MB)", "step (ms)")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    with open(os.path.join(out, "records.json")) as f:
        rec = json.load(f)
    for draw in (scaling, grid, tta, comm):
        draw(rec, out)
    print(f"plot_scaling: plots in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
