#!/usr/bin/python3
"""Image trees for the `dpdata images` tests (tests/test_images.cpp, images_torchvision_check.py).

    /usr/bin/python3 tests/images_tree.py good DIR      every PNG and JPEG kind, nested folders
    /usr/bin/python3 tests/images_tree.py bad DIR       every bad-file kind next to a few good files
    /usr/bin/python3 tests/images_tree.py count DIR N   N 500x375 JPEGs in 4 classes (about 110 KB each)
    /usr/bin/python3 tests/images_tree.py strata DIR    classes of 10, 5, 1 and 2 small PNGs

Needs PIL (python3-pil) and numpy. Pixels come from a seeded generator, so a tree is the same
on every run.
"""
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

RNG = np.random.default_rng(7)


def photo(w, h, seed=0):
    """Smooth gradients plus noise: compresses like a photo (500x375 at quality 90: ~110 KB)."""
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x / w * 255, y / h * 255, (x + y) / (w + h) * 255], axis=2)
    base += 40 * np.sin(x[..., None] / (7 + seed % 5) + np.arange(3)) + r.normal(0, 18, (h, w, 3))
    return np.clip(base, 0, 255).astype(np.uint8)


def png_raw(path, w, h, color_type, depth, rows, interlace=False):
    """A PNG written by hand, for what PIL cannot write (16-bit RGB, Adam7 interlacing)."""
    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xffffffff)
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    bpp = ch * depth // 8
    raw = b""
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    for x0, y0, dx, dy in (passes if interlace else [(0, 0, 1, 1)]):
        for y in range(y0, h, dy):
            if x0 >= w or not rows[y]:
                continue
            line = b"".join(rows[y][x * bpp:(x + 1) * bpp] for x in range(x0, w, dx))
            raw += b"\0" + line
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1 if interlace else 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def save(img, path, **kw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img.save(path, **kw)


def make_good(d):
    """Every kind a photo folder holds; classes and nesting chosen for the ordering rules."""
    rgb = photo(61, 47, 1)
    save(Image.fromarray(rgb), f"{d}/Zebra/rgb.png")                       # 'Z' sorts before 'a'
    save(Image.fromarray(photo(500, 375, 2)), f"{d}/Zebra/photo.jpg", quality=90)
    save(Image.fromarray(photo(32, 32, 3)), f"{d}/Zebra/same_size.PNG")    # already S x S at --size 32
    save(Image.fromarray(photo(40, 90, 4)).convert("L"), f"{d}/cat/gray.png")
    save(Image.fromarray(photo(40, 90, 5)).convert("L"), f"{d}/cat/gray.jpeg", quality=92)
    rgba = np.dstack([photo(50, 40, 6), RNG.integers(0, 256, (40, 50), dtype=np.uint8)])
    save(Image.fromarray(rgba, "RGBA"), f"{d}/cat/rgba.png")
    save(Image.fromarray(photo(45, 37, 7)).convert("LA"), f"{d}/cat/gray_alpha.png")
    pal = Image.fromarray(photo(48, 36, 8)).convert("P", palette=Image.ADAPTIVE, colors=37)
    pal.info["transparency"] = 3
    save(pal, f"{d}/cat/palette.png", transparency=3)
    save(Image.fromarray(photo(33, 35, 9)).convert("1"), f"{d}/cat/bits1.png")
    rows16 = photo(39, 41, 10).astype(">u2") * 257 + RNG.integers(0, 256, (41, 39, 3)).astype(">u2")
    png_raw(f"{d}/cat/rgb16.png", 39, 41, 2, 16, [r.tobytes() for r in rows16])
    png_raw(f"{d}/cat/interlaced.png", 37, 43, 2, 8, [r.tobytes() for r in photo(37, 43, 11)], interlace=True)
    cmyk = Image.fromarray(photo(64, 48, 12)).convert("CMYK")
    save(cmyk, f"{d}/dog/cmyk.jpg", quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show
    save(Image.fromarray(photo(80, 40, 13)), f"{d}/dog/exif6.jpg", quality=95, exif=exif.tobytes())
    save(Image.fromarray(photo(70, 52, 14)), f"{d}/dog/nested/deeper/n1.png")
    save(Image.fromarray(photo(52, 70, 15)), f"{d}/dog/nested b/n2.png")   # ' ' sorts before '/'
    save(Image.fromarray(photo(44, 44, 16)), f"{d}/dog/nested/n0.png")
    save(Image.fromarray(photo(36, 50, 17)), f"{d}/dog/a.jpg", quality=90)
    with open(f"{d}/dog/notes.txt", "w") as f:
        f.write("not an image\n")
    save(Image.fromarray(photo(30, 30, 18)), os.fsdecode(os.fsencode(f"{d}/dog/") + b"caf\xe9.png"))


def make_gray16(path):
    """16-bit gray: PIL opens it as mode I and clips on convert('RGB'); dpdata takes the high byte."""
    v = (np.arange(35 * 29, dtype=np.uint32).reshape(29, 35) * 77) % 65536
    png_raw(path, 35, 29, 0, 16, [r.astype(">u2").tobytes() for r in v])
    return v


def make_bad(d):
    """Good files (listed in expected.txt: path TAB label) among every kind of bad one."""
    save(Image.fromarray(photo(40, 30, 20)), f"{d}/Apple/a.png")
    save(Image.fromarray(photo(60, 45, 21)), f"{d}/Apple/b.jpg", quality=90)
    save(Image.fromarray(photo(40, 30, 22)), f"{d}/bad/ok.png")
    save(Image.fromarray(photo(40, 30, 23)), f"{d}/bad/locked.png")
    os.chmod(f"{d}/bad/locked.png", 0)
    save(Image.fromarray(photo(300, 200, 24)), f"{d}/bad/full.jpg", quality=90)
    data = open(f"{d}/bad/full.jpg", "rb").read()
    os.remove(f"{d}/bad/full.jpg")
    open(f"{d}/bad/trunc.jpg", "wb").write(data[:len(data) // 2])
    open(f"{d}/bad/zero.png", "wb").close()
    open(f"{d}/bad/corrupt.jpg", "wb").write(b"\xff\xd8\xff\xe0" + bytes(RNG.integers(0, 256, 3000, dtype=np.uint8)))
    save(Image.fromarray(photo(20, 20, 25)), f"{d}/bad/crc.png")
    png = bytearray(open(f"{d}/bad/crc.png", "rb").read())
    png[20] ^= 0xff  # inside IHDR: its CRC no longer matches
    open(f"{d}/bad/crc.png", "wb").write(png)
    open(f"{d}/bad/text.jpg", "w").write("this is not a picture\n")
    png_raw(f"{d}/bad/bomb.png", 30000, 30000, 0, 8, [b""] * 30000)  # 900 M pixels claimed, 30 KB of data
    open(f"{d}/bad/notes.txt", "w").write("ignored\n")
    os.makedirs(f"{d}/empty")
    save(Image.fromarray(photo(30, 30, 26)), os.fsdecode(os.fsencode(f"{d}/zoo/") + b"caf\xe9.png"))
    save(Image.fromarray(photo(30, 30, 27)), f"{d}/zoo/x.png")
    save(Image.fromarray(photo(30, 30, 28)), f"{d}/zoo/sub/y.png")
    os.symlink("..", f"{d}/zoo/sub/loop")
    save(Image.fromarray(photo(30, 30, 29)), f"{d}/stray.png")


def make_count(d, n):
    for i in range(n):
        save(Image.fromarray(photo(500, 375, i % 50)), f"{d}/c{i % 4}/img{i:05d}.jpg", quality=90)


def make_strata(d):
    for c, n in (("a", 10), ("b", 5), ("c", 1), ("d", 2)):
        for i in range(n):
            save(Image.fromarray(photo(20, 20, i)), f"{d}/{c}/{i:02d}.png")


if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if kind == "good":
        make_good(out)
    elif kind == "bad":
        make_bad(out)
    elif kind == "count":
        make_count(out, int(sys.argv[3]))
    elif kind == "strata":
        make_strata(out)
    else:
        sys.exit(f"unknown kind {kind}")
