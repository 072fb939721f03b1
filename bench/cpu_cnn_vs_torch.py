#!/usr/bin/python3
"""dptrain (2 CPU ranks) vs PyTorch on inputs/cnn.ini's convolutional network, side by side.

The requirement this checks: on this 2-core machine, inputs/cnn.ini's network
(conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(256) relu
dropout(0.25) linear(10); Nesterov SGD lr 0.05 momentum 0.9 weight decay 5e-4; global batch
128) trained by `mpirun -np 2 ./dptrain --config inputs/cnn.ini` reaches >= 1.0x the samples/s
of Debian's python3-torch 1.13 (convolutions through oneDNN) training the same network with the
same optimizer and batch on the same cores, like for like.

Like for like: both sides without augmentation (torch has no crop/flip here; dptrain's is
measured as a diagnostic), both with dropout, Fashion-MNIST in memory as floats, an epoch
permutation and an index gather per step. Threads as in bench/cpu_vs_torch.py: torch with
torch.set_num_threads(t) for t = 1, 2, each with the environment as is and with
OPENBLAS_NUM_THREADS=t (OpenBLAS keeps its own pool otherwise), in NCHW and in channels_last;
the best torch variant is the baseline. Every configuration runs --reps times, interleaved, and
the steady state excludes the first --warm steps (torch) or the first logged interval (dptrain).

Writes bench/results/<date -u +%F>-<N>core-cnn-vs-pytorch.{json,md} (N = the machine's CPUs) and
prints a fixed-width table.
With --model resnet, a small residual network with batch norm instead (RESNET_LIST below), the
same optimizer and batch; written as <date>-<N>core-resnet-vs-pytorch.{json,md}.
Usage: /usr/bin/python3 bench/cpu_cnn_vs_torch.py [--model cnn|resnet] [--reps 3] [--steps 600] [--quick]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_vs_torch import (BLAS_ENV, ROOT, env_without, load_fashion, loadavg, machine_info, sh, summarize,  # noqa: E402
                          time_training, versions)

B = 128  # inputs/cnn.ini: 64 per rank x 2 ranks

# --model resnet: a small residual network with batch norm (a stem, an identity block, a
# projection block, global average pooling), inputs/cnn.ini's optimizer and batch otherwise.
RESNET_LIST = ("conv(32,3,pad=1,bias=false) bn relu "
               "res(conv(32,3,pad=1,bias=false) bn relu conv(32,3,pad=1,bias=false) bn) relu maxpool(2) "
               "res(conv(64,3,pad=1,bias=false) bn relu conv(64,3,pad=1,bias=false) bn | conv(64,1,bias=false) bn) "
               "relu maxpool(2) avgpool(global) flatten linear(10)")


def torch_model(kind):
    import torch.nn as nn
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, 256), nn.ReLU(), nn.Dropout(0.25), nn.Linear(256, 10))

    class Block(nn.Module):  # RESNET_LIST's res(...): body(x) + shortcut(x)
        def __init__(self, cin, cout):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                      nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout))
            self.short = nn.Identity() if cin == cout else nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False),
                                                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            return self.body(x) + self.short(x)

    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         Block(32, 32), nn.ReLU(), nn.MaxPool2d(2), Block(32, 64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def torch_worker(threads, steps, warm, time_cap, data, channels_last, kind):
    """Runs in a child process: prints one JSON line with the steady-state samples/s."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(1)
    x, y = load_fashion(data, (1, 28, 28))
    model = torch_model(kind)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    r = time_training(model, opt, x, y, B, steps, warm, time_cap, batch=lambda xb: xb.contiguous(memory_format=fmt))
    r["mkldnn"] = torch.backends.mkldnn.is_available()
    print(json.dumps(r))


def dptrain_rate(a, tmp, n, extra, env):
    metrics = os.path.join(tmp, f"m{n}.jsonl")
    if a.model == "resnet":
        extra = ["--model.layers", RESNET_LIST] + extra
    cmd = [shutil.which("mpirun"), "-np", "2", os.path.join(ROOT, "dptrain"), "--config", "inputs/cnn.ini",
           "--train.steps", str(a.steps), "--checkpoint.dir", "", "--checkpoint.every_steps", "0", "--data.test", "",
           "--log.every_steps", str(a.log_every), "--log.progress", "false", "--log.metrics", metrics] + extra
    r = sh(cmd, cwd=ROOT, env=env)
    if r.returncode != 0:
        raise SystemExit(f"dptrain failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
    rows = [json.loads(l) for l in open(metrics) if l.strip() and "eval" not in l and "\"step\"" in l]
    first, last = rows[0], rows[-1]
    rate = (last["step"] - first["step"]) * B / (last["time_s"] - first["time_s"])
    describe = next((l.split("rank 0:", 1)[1].strip() for l in r.stdout.splitlines()
                     if "rank 0:" in l and "OpenBLAS" in l), "")
    return rate, " ".join(cmd).replace(metrics, "<tmp>/metrics.jsonl").replace(ROOT + "/", "./"), describe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600, help="steps per throughput run")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--warm", type=int, default=50, help="torch: untimed first steps")
    ap.add_argument("--torch-time-cap", type=float, default=30.0)
    ap.add_argument("--quick", action="store_true", help="1 rep, 200 steps: a smoke test")
    ap.add_argument("--max-load", type=float, default=0.5)
    ap.add_argument("--wait-s", type=float, default=120)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--model", choices=("cnn", "resnet"), default="cnn",
                    help="cnn: inputs/cnn.ini's network; resnet: a small residual network with batch norm")
    ap.add_argument("--torch-worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--time-cap", type=float, default=30.0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker is not None:
        torch_worker(a.torch_worker, a.steps, a.warm, a.time_cap, os.path.join(ROOT, "data", "fashion-mnist-train.h5"),
                     a.channels_last, a.model)
        return 0
    if a.quick:
        a.reps, a.steps, a.log_every, a.warm = 1, 200, 50, 20
    for p in ("dptrain", "data/fashion-mnist-train.h5", "inputs/cnn.ini"):
        if not os.path.exists(os.path.join(ROOT, p)):
            sys.exit(f"missing {p} (build dptrain; ./dpdata fashion-mnist --out-dir data)")

    t_wait = time.time()
    while loadavg()[0] > a.max_load and time.time() - t_wait < a.wait_s:
        time.sleep(5)
    load_before = loadavg()
    print(f"load average before: {load_before} (waited {time.time() - t_wait:.0f} s for < {a.max_load})", flush=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    blas_set = [n for n in BLAS_ENV if n in os.environ]
    ours = [("dptrain 2 ranks (no augmentation)", ["--data.augment", "none"]),
            ("dptrain 2 ranks, inputs/cnn.ini as is (flips)", []),
            ("dptrain 2 ranks, no communication (no augmentation)",
             ["--data.augment", "none", "--train.sync", "parameters", "--train.average_every", "1000000000"])]
    if a.model == "resnet":  # the augmentation diagnostic is inputs/cnn.ini's own
        ours = [ours[0], ours[2]]
    peers = []
    for t in (1, 2):
        for cl in (False, True):
            tag = f"torch t={t}{' channels_last' if cl else ''}"
            peers.append((tag, t, cl, dict(os.environ), "env as is"))
            pinned = dict(env_without(blas_set), OPENBLAS_NUM_THREADS=str(t))
            peers.append((f"{tag}, OPENBLAS_NUM_THREADS={t}", t, cl, pinned, f"OPENBLAS_NUM_THREADS={t}"))
    rates = {name: [] for name, _ in ours}
    rates.update({p[0]: [] for p in peers})
    cmds, extra, describe = {}, {}, ""
    tmp = tempfile.mkdtemp(prefix="dpt-cnn-bench-")
    n = 0
    try:
        for rep in range(a.reps):
            for name, args in ours:
                n += 1
                r, cmd, d = dptrain_rate(a, tmp, n, args, env)
                describe = describe or d
                rates[name].append(r)
                cmds[name] = cmd
                print(f"rep {rep + 1}: {name} {r:,.0f} samples/s", flush=True)
            for name, t, cl, penv, note in peers:
                cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--torch-worker", str(t), "--steps", str(a.steps),
                       "--warm", str(a.warm), "--time-cap", str(a.torch_time_cap), "--model", a.model] + \
                    (["--channels-last"] if cl else [])
                r = sh(cmd, cwd=ROOT, env=penv)
                if r.returncode != 0:
                    raise SystemExit(f"torch worker failed: {' '.join(cmd)}\n{r.stdout[-3000:]}")
                res = json.loads(r.stdout.strip().splitlines()[-1])
                rates[name].append(res["samples_per_s"])
                extra.setdefault(name, []).append(res)
                cmds[name] = (f"OPENBLAS_NUM_THREADS={t} " if note != "env as is" else "") + \
                    " ".join(cmd[1:]).replace(os.path.abspath(__file__), "bench/cpu_cnn_vs_torch.py")
                print(f"rep {rep + 1}: {name} {res['samples_per_s']:,.0f} samples/s "
                      f"({res['timed_steps']} timed steps, {res['cores_busy']:.2f} cores busy)", flush=True)
        load_after = loadavg()
        info = machine_info()
        vers = versions(describe)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    records = []
    for name, vals in rates.items():
        rec = {"name": name, "kind": "torch" if name.startswith("torch") else "dptrain", "unit": "samples/s",
               **summarize(vals), "command": cmds[name]}
        if name in extra:
            rec["cores_busy"] = [x["cores_busy"] for x in extra[name]]
            rec["timed_steps"] = [x["timed_steps"] for x in extra[name]]
        records.append(rec)
    torch_recs = [r for r in records if r["kind"] == "torch"]
    best = max(torch_recs, key=lambda r: r["median"])
    head = records[0]
    ratio = head["median"] / best["median"]
    verdict = {"ratio_dptrain_over_best_torch": ratio, "best_torch": best["name"],
               "throughput_requirement_1.0x": "PASS" if ratio >= 1.0 else "FAIL"}
    if a.model == "cnn":
        verdict["ratio_with_augmentation"] = records[1]["median"] / best["median"]
    hdr = f"{'measurement':<58} {'median':>9} {'min':>9} {'max':>9} {'spread':>7}"
    lines = [hdr, f"{'':<58} {'samples/s':>9} {'':>9} {'':>9} {'%':>7}", "-" * len(hdr)]
    for r in records:
        lines.append(f"{r['name']:<58} {r['median']:>9,.0f} {r['min']:>9,.0f} {r['max']:>9,.0f} {r['spread_pct']:>7.1f}")
    lines += ["-" * len(hdr),
              f"dptrain / best torch ({best['name']}): {ratio:.2f}x (requirement >= 1.0x: "
              f"{verdict['throughput_requirement_1.0x']})" +
              (f"; with dptrain's augmentation on: {verdict['ratio_with_augmentation']:.2f}x" if a.model == "cnn" else ""),
              f"load average before {load_before}, after {load_after}"]
    table = "\n".join(lines)
    print("\n" + table)
    if a.no_write:
        return 0
    date = sh(["date", "-u", "+%F"]).stdout.strip()
    cmdline = ("/usr/bin/python3 bench/cpu_cnn_vs_torch.py " + " ".join(sys.argv[1:])).strip()
    doc = {"benchmark": "cpu_cnn_vs_torch", "date": date,
           "utc_time": datetime.datetime.utcnow().isoformat(timespec="seconds"), "command": cmdline,
           "machine": info, "versions": vers, "load_average_before": load_before, "load_average_after": load_after,
           "settings": {"steps": a.steps, "log_every": a.log_every, "torch_warm": a.warm, "reps": a.reps,
                        "global_batch": B, "model": "inputs/cnn.ini" if a.model == "cnn" else RESNET_LIST,
                        "optimizer": "nesterov lr 0.05 momentum 0.9 weight_decay 5e-4"},
           "records": records, "verdict": verdict}
    os.makedirs(a.out_dir, exist_ok=True)
    stem = os.path.join(a.out_dir, f"{date}-{os.cpu_count()}core-{a.model}-vs-pytorch")
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    what = "inputs/cnn.ini" if a.model == "cnn" else "a small residual network with batch norm"
    md = [f"# {os.cpu_count()}-core CPU, {date}: {what} on 2 CPU ranks against PyTorch (bench/cpu_cnn_vs_torch.py)", "",
          *([] if a.model == "cnn" else [f"- model: `{RESNET_LIST}` on 1x28x28 (PyTorch: the same as "
                                         "nn.Sequential with BatchNorm2d and a block module; bench/cpu_cnn_vs_torch.py)"]),
          f"- machine: {info.get('Model name', '?')}, {info.get('CPU(s)', '?')} CPUs, "
          f"{info.get('Hypervisor vendor', 'bare metal')} guest",
          f"- command: `{cmdline}`",
          f"- dptrain: commit {vers.get('dptrain_commit')} ({vers.get('dptrain_worktree')} tracked files); {describe}",
          f"- torch {vers.get('torch')} (python3-torch {vers.get('deb:python3-torch', '?')}), OpenBLAS "
          f"{vers.get('deb:libopenblas0-pthread', '?')}, {vers.get('mpirun')}",
          f"- load average (1/5/15 min) before {load_before}, after {load_after}",
          f"- {a.reps} interleaved repetitions; {a.steps} steps per run, the first {a.log_every} (dptrain) / "
          f"{a.warm} (torch) excluded; global batch {B}", "", "```", table, "```", "",
          "Headline command: `" + head["command"] + "`", ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md))
    print(f"\nwrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
