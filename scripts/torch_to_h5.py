#!/usr/bin/env python3
"""A PyTorch state_dict (.pth/.pt) as an HDF5 file dptrain's model.init reads.

    python3 scripts/torch_to_h5.py IN.pth OUT.h5

IN holds a state_dict (torch.save(model.state_dict(), IN)), a whole module, or a dict with the
state_dict under "state_dict", "model" or "model_state_dict" (training-loop checkpoints); a
"module." prefix (DistributedDataParallel) is dropped. OUT gets one dataset per tensor under
/model, in the checkpoint layout of docs/formats.md: a preset's tensors under their torchvision
key (/model/layer1.0.bn1.running_mean), a layer list's under /model/<layer>/<leaf> (conv0/weight,
fc1/bias: the keys of a module whose children are named as dptrain names its layers). Floating
point tensors are stored as float32, integer ones (num_batches_tracked) as int64. OUT is written
under a temporary name and renamed, so an interrupted run leaves no file that looks complete.
dptrain checks every tensor's name and shape against model.layers when it starts
(docs/models.md, Fine-tuning). Needs torch, h5py and NumPy. Exit 0 written, 2 bad input.
"""
import os
import re
import sys

LAYER_KEY = re.compile(r"^(fc|conv|bn)\d+\.(weight|bias|running_mean|running_var|num_batches_tracked)$")


def fail(msg):
    print(f"torch_to_h5: {msg}", file=sys.stderr)
    sys.exit(2)


def load_state_dict(path, torch):
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # torch before 1.13 has no weights_only
        obj = torch.load(path, map_location="cpu")
    except Exception as e:  # a whole pickled module needs the full unpickler
        try:
            obj = torch.load(path, map_location="cpu")
        except Exception:
            fail(f"{path}: cannot load with torch.load ({e})")
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, dict):
        for k in ("state_dict", "model", "model_state_dict"):
            if isinstance(obj.get(k), dict):
                obj = obj[k]
                break
    if not isinstance(obj, dict) or not obj:
        fail(f"{path}: holds no state_dict (a dict of tensors)")
    out = {}
    for k, v in obj.items():
        if not torch.is_tensor(v):
            fail(f"{path}: entry {k!r} is a {type(v).__name__}, not a tensor")
        out[k[len("module."):] if k.startswith("module.") else k] = v
    return out


def main(argv):
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if len(argv) == 2 else 2
    try:
        import h5py
        import numpy as np
        import torch
    except ImportError as e:
        fail(f"needs torch, h5py and numpy ({e}); Debian: apt-get install python3-torch python3-h5py")
    src, dst = argv[1], argv[2]
    sd = load_state_dict(src, torch)
    layer_list = all(LAYER_KEY.match(k) for k in sd)
    tmp = os.path.join(os.path.dirname(os.path.abspath(dst)), "." + os.path.basename(dst) + f".tmp.{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            g = f.create_group("model")
            for k, v in sd.items():
                a = v.detach().cpu()
                a = a.to(torch.int64) if not a.is_floating_point() else a.to(torch.float32)
                name = k.replace(".", "/", 1) if layer_list else k
                g.create_dataset(name, data=a.numpy())
            f.attrs["source"] = os.path.basename(src)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    print(f"torch_to_h5: {len(sd)} tensors from {src} -> {dst}"
          f" ({'layer list names' if layer_list else 'state_dict keys'} under /model)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
