#!/usr/bin/env python3
"""The table of bench/gpu_run.sh's `images` and `images_acc` sections, read from their logs.

    python3 bench/images_summary.py OUT/images

Reads make.log (bench/make_image_set.py), import-rate.jsonl (bench/import_rate.py),
dptrain-metrics.jsonl (bench/images_r50.ini's run), bench-step.log (the same model's step on
resident synthetic data), torch.jsonl (bench/torch_imagefolder.py) and fmnist.jsonl
(bench/images_fmnist.py), whichever are there. dptrain's rate on the imported set is the
steady one: images between the first metrics record at or after step --skip (default 50: start-up,
cuDNN's tuning and the first batches excluded) and the last, over the time between them.
Prints the rows and one JSON line with the same figures.
"""
import argparse
import json
import os


def records(path):
    """JSON objects on the file's lines (anything before a line's first '{' dropped: log prefixes)."""
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        if "{" not in line:
            continue
        try:
            out.append(json.loads(line[line.find("{"):]))
        except ValueError:
            pass
    return out


def steady_rate(path, skip):
    rec = records(path)
    head = next((r for r in rec if "global_batch" in r), {})
    steps = [r for r in rec if "samples_per_s" in r and "step" in r and r["step"] >= skip]
    if len(steps) < 2 or "global_batch" not in head:
        return None
    a, b = steps[0], steps[-1]
    return (b["step"] - a["step"]) * head["global_batch"] / (b["time_s"] - a["time_s"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--skip", type=int, default=50)
    a = ap.parse_args()
    d = a.dir
    res = {}
    make = [r for r in records(os.path.join(d, "make.log")) if r.get("bench") == "make_image_set"]
    if make:
        m = make[-1]
        res["files"] = {k: m[k] for k in ("count", "classes", "mean_kb", "min_kb", "max_kb", "seconds")}
        print(f"files: {m['count']} JPEGs {m['width']}x{m['height']} in {m['classes']} classes, mean {m['mean_kb']} KB "
              f"({m['min_kb']}-{m['max_kb']}), written in {m['seconds']} s")
    imp = {r["side"]: r for r in records(os.path.join(d, "import-rate.jsonl")) if "side" in r}
    for side in ("dpdata", "dpdata-full", "torchvision"):
        r = imp.get(side)
        if r and "images_per_s" in r:
            res[f"import_{side}"] = r["images_per_s"]
            print(f"import to 256x256 uint8, {side:<11}: {r['images_per_s']:>9.0f} img/s ({r['images']} in {r['seconds']} s)")
        elif r:
            print(f"import, {side}: failed (rc {r.get('rc')}): {r.get('tail', '')[-200:]!r}")
    if "ratio" in imp:
        res["import_ratio"] = {k: v for k, v in imp["ratio"].items() if k.endswith("_over_torchvision")}
        print("import ratios to torchvision (page cache warm): " +
              ", ".join(f"{k.replace('_over_torchvision', '')} {v}" for k, v in res["import_ratio"].items()))
    rate = steady_rate(os.path.join(d, "dptrain-metrics.jsonl"), a.skip)
    step = [r for r in records(os.path.join(d, "bench-step.log")) if r.get("bench") == "step"]
    torch = {r["part"]: r for r in records(os.path.join(d, "torch.jsonl")) if "part" in r}
    # torch-warm.jsonl: the peer again with its files in the page cache (torch.jsonl's run read
    # them from the disk); the ratios take the faster fed rate.
    twarm = {r["part"]: r for r in records(os.path.join(d, "torch-warm.jsonl")) if "part" in r}
    cold = ", files from the disk" if twarm else ""
    stream = steady_rate(os.path.join(d, "dptrain-stream-metrics.jsonl"), a.skip)
    warm = steady_rate(os.path.join(d, "dptrain-stream-warm-metrics.jsonl"), a.skip)
    jcold = steady_rate(os.path.join(d, "dptrain-jpeg-stream-metrics.jsonl"), a.skip)
    jwarm = steady_rate(os.path.join(d, "dptrain-jpeg-stream-warm-metrics.jsonl"), a.skip)
    rows = [("dptrain, imported set resident, random_resized_crop,flip", rate),
            ("dptrain, imported set streamed from the disk (data.read = stream, page cache dropped)", stream),
            ("dptrain, imported set streamed, the file in the page cache", warm),
            ("dptrain, imported as JPEG (--store jpeg), streamed from the disk, page cache dropped", jcold),
            ("dptrain, imported as JPEG, streamed, the file in the page cache", jwarm),
            ("dptrain bench-step, synthetic resident", step[-1]["samples_per_s"] if step else None),
            (f"PyTorch loader alone ({torch.get('setup', {}).get('workers', '?')} workers){cold}",
             torch.get("loader", {}).get("images_per_s")),
            (f"PyTorch {torch.get('train', {}).get('mode', '')} step fed by the loader{cold}",
             torch.get("train", {}).get("images_per_s"))]
    if twarm:
        rows += [(f"PyTorch loader alone ({twarm.get('setup', {}).get('workers', '?')} workers), files in the page cache",
                  twarm.get("loader", {}).get("images_per_s")),
                 (f"PyTorch {twarm.get('train', {}).get('mode', '')} step fed by the loader, files in the page cache",
                  twarm.get("train", {}).get("images_per_s"))]
    rows += [(f"PyTorch {torch.get('synthetic', {}).get('mode', '')} step, synthetic resident",
              torch.get("synthetic", {}).get("images_per_s"))]
    print(f"{'ResNet-50 224x224 bf16 b256, one GPU':<84}{'img/s':>9}")
    for name, v in rows:
        print(f"{name:<84}{v:>9.0f}" if v else f"{name:<84}{'-':>9}")
    res["train"] = {name: v for name, v in rows}
    feds = [r.get("train", {}).get("images_per_s") for r in (torch, twarm)]
    fed = max((f for f in feds if f), default=None)
    if twarm and fed:
        res["torch_fed_used"] = "page cache" if fed == feds[1] else "disk"
        print(f"PyTorch fed by its loader, the faster run ({res['torch_fed_used']}): {fed:.0f} img/s")
    synth = step[-1]["samples_per_s"] if step else None
    for tag, v in (("resident", rate), ("stream", stream), ("stream_warm", warm), ("jpeg_stream", jcold), ("jpeg_stream_warm", jwarm)):
        if v and fed:
            res[f"dptrain_{tag}_over_torch_fed"] = round(v / fed, 2)
            print(f"dptrain on the imported set ({tag}) / PyTorch fed by its loader: {res[f'dptrain_{tag}_over_torch_fed']}")
        if v and synth:
            res[f"dptrain_{tag}_over_synthetic"] = round(v / synth, 3)
            print(f"dptrain on the imported set ({tag}) / dptrain synthetic resident: {res[f'dptrain_{tag}_over_synthetic']}")
    acc = [r for r in records(os.path.join(d, "fmnist.jsonl")) if r.get("step") == "result"]
    if acc:
        r = acc[-1]
        res["fmnist"] = r
        print(f"Fashion-MNIST through PNG files: test accuracy {r['png_accuracy']} (idx import {r['idx_accuracy']}), "
              f"{'meets' if r['png_meets_target'] else 'misses'} {r['target']}")
    print(json.dumps({"bench": "images_summary", **res}))


if __name__ == "__main__":
    main()
