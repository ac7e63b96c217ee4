"""Host-side costs of the batched PNG decoder, and libpng's grey weights (run HERE).

Prints, per 500x375 photo PNG (the device check's `make_photo`, one thread): the host parse
(`decoder.plan`: chunks, CRCs), the packing (`pack.pack`), zlib's inflate alone and
`tf.io.decode_png`; then how many of 262,144 random RGB pixels `tf.io.decode_png(channels=1)`
gives differently from (9797, 19234, 3737) >> 15 (libpng's truncated weights, the kernel's)
and from (9798, 19235, 3735) (the rounded ones).

    .venv/bin/python experimental/png_gpu_check/host_costs.py [--photos 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE)),
                os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests")]  # support.pngs

import numpy as np  # noqa: E402

from experimental.png_gpu.decoder import plan  # noqa: E402
from experimental.png_gpu.pack import pack  # noqa: E402
from dali_loader.lazy import import_tf  # noqa: E402
from support.pngs import encode_png  # noqa: E402
from device_check import make_photo  # noqa: E402


def per_image_ms(f, n: int) -> float:
    f()
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", type=int, default=64)
    n = ap.parse_args().photos
    tf = import_tf()
    blobs = [make_photo(i, (375, 500))[0] for i in range(n)]
    plans = plan(blobs, 3)
    print(f"{n} photos, {np.mean([len(b) for b in blobs]) / 1e3:.0f} KB PNG each; ms per image:")
    print(f"  parse (plan) {per_image_ms(lambda: plan(blobs, 3), n):.3f}")
    print(f"  pack         {per_image_ms(lambda: pack(plans, 3), n):.3f}")
    print(f"  zlib inflate {per_image_ms(lambda: [zlib.decompress(bytes(p.deflate), -15) for p in plans], n):.3f}")
    print(f"  tf.io.decode_png {per_image_ms(lambda: [tf.io.decode_png(b, channels=3) for b in blobs], n):.3f}")
    rgb = np.random.default_rng(0).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    grey = tf.io.decode_png(encode_png(rgb, (0,)), channels=1).numpy()[..., 0].astype(np.int64)
    x = rgb.astype(np.int64)
    same = (x[..., 0] == x[..., 1]) & (x[..., 1] == x[..., 2])
    for w in ((9797, 19234, 3737), (9798, 19235, 3735)):
        mine = np.where(same, x[..., 0], (w[0] * x[..., 0] + w[1] * x[..., 1] + w[2] * x[..., 2]) >> 15)
        print(f"  grey weights {w}: {int((mine != grey).sum())} of {grey.size} pixels differ from TF")


if __name__ == "__main__":
    main()
