#!/usr/bin/env python3
"""Short summary tables of bench/gpu_run.sh's scale12 and one12 sections, read from the files
they leave under $OUT, with the targets of the scaling issue beside each figure. Prints what it
finds and says what is missing; never fails the call.

    python3 bench/gpu_summary.py scale12 $OUT
    python3 bench/gpu_summary.py one12 $OUT
    python3 bench/gpu_summary.py best-variant $OUT/s12-scaling N   # fastest weak variant on N ranks
"""
import glob
import json
import os
import re
import sys

MB64, MB256, GB1 = 67108864, 268435456, 1073741824


def jsonl(path, bench):
    """The {"bench": bench, ...} objects of a log (other lines ignored)."""
    out = []
    for f in sorted(glob.glob(path)):
        for line in open(f, errors="replace"):
            p = line.find('{"bench": "%s"' % bench)
            if p >= 0:
                try:
                    out.append(json.loads(line[p:]))
                except ValueError:
                    pass
    return out


def table(rows, head):
    """Fixed-width table: a header, then the rows (None shows as '-')."""
    def show(c):
        if c is None:
            return "-"
        if isinstance(c, str):
            return c
        if isinstance(c, int) and not isinstance(c, bool):
            return "%d" % c
        return "%.3f" % c if abs(c) < 1000 else "%.0f" % c
    cells = [[show(c) for c in r] for r in rows]
    w = [max(len(str(x)) for x in col) for col in zip(head, *cells)] if cells else [len(h) for h in head]
    for r in [head] + cells:
        print("  " + "  ".join(str(x).rjust(w[i]) if i else str(x).ljust(w[i]) for i, x in enumerate(r)))


def f3(x):
    return "-" if x is None else "%.3f" % x


def verdict(value, target, higher=True):
    if value is None:
        return "not measured"
    ok = value >= target if higher else value <= target
    return ("meets" if ok else "misses") + " target %s %g" % (">=" if higher else "<=", target)


def records(folder):
    """bench-scaling's records.json as {table name: [row dicts]} (either layout of `tables`)."""
    try:
        d = json.load(open(os.path.join(folder, "records.json")))
    except (OSError, ValueError) as e:
        print("  (no records.json in %s: %s)" % (folder, e), file=sys.stderr)
        return {}
    t = d.get("tables", {})
    if isinstance(t, list):
        return {x.get("name"): x.get("rows", []) for x in t}
    return {k: v.get("rows", []) if isinstance(v, dict) else v for k, v in t.items()}


def nccl_busbw(path):
    """{size: out-of-place busbw} of an nccl-tests log."""
    out = {}
    for line in open(path, errors="replace") if os.path.exists(path) else []:
        f = line.split()
        if len(f) >= 8 and f[0].isdigit() and re.match(r"^[0-9.]+$", f[7]):
            out[int(f[0])] = float(f[7])
    return out


def tests(path):
    if not os.path.exists(path):
        print("  tests: no log")
        return
    text = open(path, errors="replace").read()
    print("  tests: %d OK, %d FAILED, exit codes %s" % (
        len(re.findall(r"\[       OK \]", text)), len(re.findall(r"\[  FAILED  \] [A-Za-z]", text)),
        " ".join(re.findall(r"rc=(\d+)", text)) or "-"))


def scale12(out):
    print("# scale12 summary (%s)" % out)
    tests(os.path.join(out, "s12-tests.log"))
    rec = records(os.path.join(out, "s12-scaling"))
    print("\n  collectives: dptrain busbw against nccl-tests' (out of place), GB/s; target >= 95%")
    rows = []
    for coll, exe in (("allreduce", "all_reduce"), ("reduce_scatter", "reduce_scatter"), ("all_gather", "all_gather")):
        theirs = nccl_busbw(os.path.join(out, "s12-nccl-%s_perf.log" % exe))
        ours = {int(r["bytes"]): r["busbw_gbs"] for r in rec.get(coll, []) if r.get("busbw_gbs") is not None}
        wrong = sum(r.get("wrong") or 0 for r in rec.get(coll, []))
        for size in [s for s in (MB64, MB256, GB1) if s != MB64 or (s in ours and s in theirs)]:
            a, b = ours.get(size), theirs.get(size)
            rows.append([coll, "%d MB" % (size >> 20), a, b, 100 * a / b if a and b else None, wrong,
                         verdict(a / b if a and b else None, 0.95)])
    table(rows, ["collective", "size", "dptrain", "nccl-tests", "%", "#wrong", ""])

    sc = rec.get("scaling", [])
    print("\n  scaling (bench-scaling, dptrain's own loop): step ms, efficiency, exposed communication")
    rows = []
    for r in sc:
        rows.append([r.get("model"), r.get("mode"), r.get("variant"), r.get("ranks"), r.get("batch_per_rank"),
                     r.get("step_ms"), r.get("efficiency"), r.get("efficiency_vs_best1"), r.get("compute_max_ms"),
                     r.get("exposed_comm_ms")])
    table(rows, ["model", "mode", "variant", "n", "b/rank", "step", "eff", "eff/best1", "compute", "exp comm"])
    top = max([r.get("ranks") or 0 for r in sc] or [0])
    weak = {r["variant"]: r for r in sc if r.get("mode") == "weak" and r.get("ranks") == top}
    strong = {r["variant"]: r for r in sc if r.get("mode") == "strong" and r.get("ranks") == top}
    one = [r["step_ms"] for r in sc if r.get("mode") == "weak" and r.get("ranks") == 1 and r.get("step_ms")]
    print("\n  targets at n = %s:" % top)
    for v, t in (("sharded-bf16", 0.95), ("sharded-fp32", 0.92)):
        e = weak.get(v, {}).get("efficiency_vs_best1")
        print("    weak efficiency %s (vs fastest 1-GPU variant): %s, %s" % (v, f3(e), verdict(e, t)))
    best_strong = max([r.get("efficiency_vs_best1") or 0 for r in strong.values()] or [0]) or None
    print("    strong efficiency, best variant: %s, %s" % (f3(best_strong), verdict(best_strong, 0.90)))
    print("    1-GPU weak step, fastest variant: %s ms, %s" % (f3(min(one) if one else None),
                                                              verdict(min(one) if one else None, 2.28, False)))

    peer = rec.get("ddp_peer", [])
    print("\n  PyTorch DDP peer (strongest row per mode and n) against dptrain's fastest variant")
    rows = [[r.get("model"), r.get("mode"), r.get("ranks"), r.get("peer"), r.get("peer_step_ms"), r.get("peer_efficiency"),
             r.get("ours_variant"), r.get("ours_step_ms"), r.get("ratio")] for r in peer if r.get("strongest") == "*"]
    table(rows, ["model", "mode", "n", "PyTorch", "step", "eff", "dptrain", "step", "ours/peer"])
    for r in peer:
        if r.get("strongest") == "*" and r.get("mode") == "weak" and r.get("ranks") == top and top > 1:
            print("    2-GPU step vs PyTorch DDP's strongest: %s, %s" % (f3(r.get("ratio")), verdict(r.get("ratio"), 0.65, False)))
    errs = sorted({r.get("note") for r in peer if r.get("note")})
    for e in errs:
        print("    peer note: %s" % e)

    # The trainer's start-up lines on each rank's bytes (optimizer state per rank with sharding:
    # the target is total / N + padding, within 1%).
    log = os.path.join(out, "s12-scaling.log")
    mem = sorted({l.strip() for l in open(log, errors="replace") if l.startswith("memory")}) if os.path.exists(log) else []
    print("\n  memory lines of the trainer's start-up (distinct): %s" % ("none" if not mem else ""))
    for l in mem[:12]:
        print("    " + l)

    ctas = jsonl(os.path.join(out, "s12-ctas.log"), "step")
    if ctas:
        print("\n  comm.nccl_max_ctas sweep (bench-step on %d GPUs, %s, %s on the wire)" % (
            ctas[0]["ranks"], "sharded" if ctas[0].get("shard_optimizer") else "unsharded", ctas[0].get("grad_dtype")))
        table([[str(c.get("nccl_max_ctas")), c["ms_per_step"], c["ms_min"], c["ms_max"], c["model_tflops"]] for c in ctas],
              ["max CTAs", "step", "min", "max", "TFLOP/s"])


def one12(out):
    print("# one12 summary (%s)" % out)
    extra = os.environ.get("EXTRA_ENV", "").strip()
    ours = [dict(r, who="dptrain") for r in jsonl(os.path.join(out, "o12-step.log"), "step")]
    ours += [dict(r, who="dptrain " + (extra or "+ EXTRA_ENV")) for r in jsonl(os.path.join(out, "o12-step-extra.log"), "step")]
    torch_rows = jsonl(os.path.join(out, "o12-torch-*.jsonl"), "torch-step")
    targets = {"bf16": 620, "tf32": 330}
    precs = [p for p in ("bf16", "tf32", "fp32") if p in targets or any(r.get("precision") == p for r in ours + torch_rows)]
    for prec in precs:
        target = targets.get(prec)
        mine = [r for r in ours if r.get("precision") == prec]
        theirs = [r for r in torch_rows if r.get("precision") == prec]
        timed = [r for r in theirs if "ms_per_step" in r]
        best = min(timed, key=lambda r: r["ms_per_step"]) if timed else None
        print("\n  %s: model TFLOP/s (target %s), step ms; x faster = PyTorch's strongest step / ours" % (prec, target or "none"))
        rows = []
        for r in mine:
            rows.append([r["who"], r["ms_per_step"], r["model_tflops"], best["ms_per_step"] / r["ms_per_step"] if best else None,
                         verdict(r["model_tflops"], target) if target else ""])
        for r in theirs:
            rows.append(["torch " + r["mode"] + (" *" if r is best else ""), r.get("ms_per_step"), r.get("model_tflops"),
                         None, r.get("error", "")])
        table(rows, ["who", "step", "TFLOP/s", "x faster", ""])
    if not ours:
        print("  (no bench-step lines in o12-step.log)")


def best_variant(folder, n):
    """The variant with the shortest weak step on n ranks ("" when there is none)."""
    rows = [r for r in records(folder).get("scaling", [])
            if r.get("mode") == "weak" and r.get("ranks") == n and r.get("step_ms")]
    print(min(rows, key=lambda r: r["step_ms"])["variant"] if rows else "")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "best-variant":
        best_variant(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] not in ("scale12", "one12"):
        raise SystemExit(__doc__)
    try:
        {"scale12": scale12, "one12": one12}[sys.argv[1]](sys.argv[2])
    except Exception as e:  # a summary must not fail the call whose logs it reads
        print("summary failed: %s: %s" % (type(e).__name__, e))
