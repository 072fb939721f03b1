#!/usr/bin/python3
"""Reads the sample checkpoint test_ckpt leaves behind with h5py, an independent reader, and
checks the DESIGN.md contract: string attributes read as str, weights are (out, in) float32 like
torch.nn.Linear.weight, values match the generator in test_ckpt.cpp, and the stored CRC32 matches
one recomputed from the documented recipe. Writes nothing."""
import struct
import sys
import zlib

import h5py
import numpy as np


def pattern(name, n):
    # Same formula as test_ckpt.cpp: exactly representable in float32.
    salt = zlib.crc32(name.encode()) % 1001
    k = np.arange(n, dtype=np.int64)
    return (((k * 7 + salt) % 1001) - 500).astype(np.float32) / np.float32(256.0)


def checksum(f):
    names = []
    for top in ("model", "optimizer"):
        if top in f:
            f[top].visititems(lambda n, o, t=top: names.append(t + "/" + n)
                              if isinstance(o, h5py.Dataset) else None)
    crc = 0
    for name in sorted(names, key=lambda s: s.encode()):
        d = f[name]
        crc = zlib.crc32(name.encode() + b"\0", crc)
        crc = zlib.crc32(struct.pack("<q", d.ndim), crc)
        crc = zlib.crc32(struct.pack("<%dq" % d.ndim, *d.shape), crc)
        crc = zlib.crc32(np.ascontiguousarray(d[()], dtype="<f4").tobytes(), crc)
    return crc, names


def main(path):
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert isinstance(a["format"], str) and a["format"] == "dptrain-checkpoint", a["format"]
        assert int(a["version"]) == 1
        assert isinstance(a["config"], str) and "[model]" in a["config"]
        assert isinstance(a["optimizer"], str) and a["optimizer"] == "adam"
        assert int(a["step"]) == 7 and int(a["world_size"]) == 4
        assert int(a["seed"]) == 0xFEDCBA9876543210, hex(int(a["seed"]))
        layers = [int(x) for x in a["layers"]]
        assert layers == [5, 4, 3], layers
        for i in range(len(layers) - 1):
            for group in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq"):
                w = f["%s/fc%d/weight" % (group, i)]
                b = f["%s/fc%d/bias" % (group, i)]
                assert w.dtype == np.float32 and w.shape == (layers[i + 1], layers[i]), w
                assert b.dtype == np.float32 and b.shape == (layers[i + 1],), b
                want = pattern(w.name[1:], w.size).reshape(w.shape)  # row-major (out, in)
                assert np.array_equal(w[()], want), w.name
                assert np.array_equal(b[()], pattern(b.name[1:], b.size)), b.name
        crc, names = checksum(f)
        assert len(names) == 12, names
        assert crc == int(a["checksum_crc32"]), (crc, int(a["checksum_crc32"]))
    print("ok: %s read by h5py %s, %d tensors, crc32 %08x" % (path, h5py.__version__, len(names), crc))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ckpt_h5py_check.py <checkpoint.h5>")
    main(sys.argv[1])
