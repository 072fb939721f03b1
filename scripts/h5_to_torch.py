#!/usr/bin/env python3
"""A dptrain checkpoint's weights as a PyTorch state_dict.

    python3 scripts/h5_to_torch.py CKPT.h5 OUT.pth [--safetensors OUT.safetensors]

Every tensor under the checkpoint's /model group becomes a state_dict entry: a preset's under its
torchvision key (so torchvision.models.resnet18(num_classes=K), with conv1 and maxpool replaced
for stem=small as docs/models.md shows, loads it with strict=True), a layer list's
/model/<layer>/<leaf> as "<layer>.<leaf>" (conv0.weight, bn0.running_mean, fc1.bias). Float
tensors float32, num_batches_tracked int64 (0-d, as PyTorch keeps it). The optimizer state is
left out. --safetensors also writes the same tensors in that format (no Python package needed
to read it back into dptrain: model.init takes it). Needs torch, h5py and NumPy. Exit 0
written, 2 bad input.
"""
import json
import os
import struct
import sys


def fail(msg):
    print(f"h5_to_torch: {msg}", file=sys.stderr)
    sys.exit(2)


def read_model(path, h5py):
    sd = {}
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"{path}: cannot open as HDF5 ({e})")
    with f:
        if "model" not in f:
            fail(f"{path}: no /model group")

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                sd[name.replace("/", ".")] = obj[()]
        f["model"].visititems(visit)
    if not sd:
        fail(f"{path}: /model holds no tensors")
    return sd


def write_safetensors(path, sd, np):
    """The format's header: {name: {dtype, shape, data_offsets}} in JSON, 8-byte length first."""
    header, blobs, at = {}, [], 0
    for k, a in sd.items():
        a = np.ascontiguousarray(a)
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[k] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the format aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main(argv):
    args = argv[1:]
    st = None
    if "--safetensors" in args:
        i = args.index("--safetensors")
        if i + 1 >= len(args):
            fail("--safetensors needs a file name")
        st = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2 or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    try:
        import h5py
        import numpy as np
        import torch
    except ImportError as e:
        fail(f"needs torch, h5py and numpy ({e}); Debian: apt-get install python3-torch python3-h5py")
    sd = read_model(args[0], h5py)
    for k, a in sd.items():
        a = np.asarray(a)
        sd[k] = a.astype(np.int64) if a.dtype.kind in "iu" else a.astype(np.float32)
    tmp = os.path.join(os.path.dirname(os.path.abspath(args[1])), "." + os.path.basename(args[1]) + f".tmp.{os.getpid()}")
    torch.save({k: torch.from_numpy(np.array(a)) for k, a in sd.items()}, tmp)
    os.replace(tmp, args[1])
    if st:
        write_safetensors(st, sd, np)
    print(f"h5_to_torch: {len(sd)} tensors from {args[0]} -> {args[1]}" + (f" and {st}" if st else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
