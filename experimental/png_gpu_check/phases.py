"""Where a batch's time goes in the batched GPU PNG decoder (docs/png_gpu.md, "Measured on
a GPU"): host parse (one thread and 16), pack, nvCOMP's inflate, and each kernel, with the
device synchronised after every phase. Runs on the device like `device_check.py`:

    bash experimental/png_gpu_check/run_on_device.sh --phases
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_check import log, make_photo  # noqa: E402  (also numba-cuda's numpy alias)

import numpy as np  # noqa: E402


def best(fn, rounds: int = 3) -> float:
    """The best wall time of `fn()` over `rounds` after one warm-up."""
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    from numba import cuda

    from experimental.png_gpu import Launch, NvcompInflate
    from experimental.png_gpu.decoder import plan
    from experimental.png_gpu.kernels import adler32, expand, unfilter
    from experimental.png_gpu.pack import pack
    import cupy as cp

    photos = [make_photo(i, (375, 500))[0] for i in range(256)]
    backend, launch, pool = NvcompInflate(), Launch(), ThreadPoolExecutor(os.cpu_count())
    rows = []
    for b in (64, 256, 1024):
        blobs = [photos[i % len(photos)] for i in range(b)]
        row = {"batch": b,
               "parse_1_thread_s": best(lambda: plan(blobs, 3, None)),
               "parse_pool_s": best(lambda: plan(blobs, 3, pool))}
        layouts = plan(blobs, 3, pool)
        row["pack_s"] = best(lambda: pack(layouts, 3, empty=backend.empty_host, executor=pool))
        batch = pack(layouts, 3, empty=backend.empty_host, executor=pool)
        row["inflate_s"] = best(lambda: backend.inflate(batch))
        inflated, _ = backend.inflate(batch)
        n, dev = len(batch), cp.asarray
        dst_off, dst_len = dev(batch.dst_off), dev(batch.dst_len)
        width, height, bpp = dev(batch.width), dev(batch.height), dev(batch.bpp)
        adler, status = cp.zeros(n, np.int64), cp.zeros(n, np.int32)
        out = cp.zeros(batch.out_total, np.uint8)

        def run(kernel):
            def go():
                kernel()
                cuda.synchronize()
            return go
        row["adler32_s"] = best(run(lambda: adler32[n, launch.adler_threads](
            inflated, dst_off, dst_len, adler)))
        fresh = inflated.copy()  # unfilter works in place: time it on fresh copies

        def unfilter_once():
            cp.copyto(fresh, inflated)
            cuda.synchronize()
            t = time.perf_counter()
            unfilter[n, launch.unfilter_threads](fresh, dst_off, width, height, bpp, status)
            cuda.synchronize()
            return time.perf_counter() - t
        unfilter_once()
        row["unfilter_s"] = min(unfilter_once() for _ in range(3))
        row["expand_s"] = best(run(lambda: expand[(launch.expand_blocks, n), launch.expand_threads](
            fresh, dst_off, width, height, bpp, dev(batch.color_type), dev(batch.trns),
            dev(batch.palette), dev(batch.num_palette), out, dev(batch.out_off), 3, status)))
        rows.append(row)
        log("  " + ", ".join(f"{k} {v * 1e3:.1f} ms" if k.endswith("_s") else f"{k} {v}"
                             for k, v in row.items()))
    with open(os.path.join(os.environ.get("OUT", "."), "png_gpu_phases.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
