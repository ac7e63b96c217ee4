"""The native PNG core alone, per core: CPU time and page faults per image, one thread.

Over 200 photo-like 500x375 PNGs (`support.pngs.photo` + `encode_png`, all five filter
types), decoded to RGB in memory, alternating in one process, round after round:

- ``tf``: eager ``tf.io.decode_png(data, channels=3)`` (libpng; what Keras runs);
- ``pywuffs``: ``png_cpu.decode_png`` (Wuffs through pywuffs behind the Python front end);
- ``native``: ``png_native.decode_png`` (the C++ core through ctypes, a fresh array each);
- ``native-into``: ``png_native.decode_png_into`` one reused buffer (what a pool gives).

CPU time is the threads' (``time.thread_time``, summed); page faults are the process's minor
faults (``ru_minflt``); images/s is wall-clock over all threads. Prints each round and the
best round per decoder (this VM's timings are noisy: compare best of rounds), and the ratio of
each to ``tf``.

    .venv/bin/python benchmarks/bench_png_core.py [--images 200] [--rounds 7] [--threads 1] \\
        [--filters 0,1,2,3,4]
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

import harness

def decoders(blobs: list[bytes]) -> dict:
    import tensorflow as tf

    from dali_loader.decode import png_cpu, png_native

    buf = np.empty(375 * 500 * 4, np.uint8)
    out = {"tf": lambda b: tf.io.decode_png(b, channels=3).numpy(),
           "native": lambda b: png_native.decode_png(b, 3),
           "native-into": lambda b: png_native.decode_png_into(b, png_native.plan_png(b, 3), buf)}
    if png_cpu.available():
        out["pywuffs"] = lambda b: png_cpu.decode_png(b, 3)
    return out


def one_round(fn, blobs: list[bytes], threads: int) -> tuple[float, float, float]:
    """(CPU ms per image summed over threads, minor page faults per image, images/s)."""
    cpu = [0.0] * threads

    def work(k: int) -> None:
        c0 = time.thread_time()
        for b in blobs[k::threads]:
            fn(b)
        cpu[k] = time.thread_time() - c0

    f0, t0 = harness.minor_faults(), time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    faults = harness.minor_faults() - f0
    return 1e3 * sum(cpu) / len(blobs), faults / len(blobs), len(blobs) / wall


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, rounds=7)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write-records", default=None, metavar="PATH",
                    help="write the PNGs as records for bench_png_core_c.cc and exit")
    ap.add_argument("--filters", default="0,1,2,3,4",
                    help="PNG row filters, in turn (4: Paeth rows only, like most encoders)")
    args = ap.parse_args(argv)
    from dali_loader.decode import png_native

    if not png_native.available():
        print(png_native.unavailable_reason())
        return 1
    blobs = harness.photo_pngs(args.images, tuple(int(f) for f in args.filters.split(",")))
    if args.write_records:
        import struct

        with open(args.write_records, "wb") as f:
            f.write(b"".join(struct.pack("<I", len(b)) + b for b in blobs))
        return 0
    raw = 375 * 500 * 3 * len(blobs)
    print(f"{len(blobs)} PNGs 500x375, compression {raw / sum(map(len, blobs)):.2f}x, "
          f"filters {args.filters}, {args.threads} thread(s), {args.rounds} rounds")
    fns = decoders(blobs)
    for fn in fns.values():  # warm up: TF's first call, the per-thread buffers
        for b in blobs[:4]:
            fn(b)
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in fns}
    for r in range(args.rounds):
        for name, fn in fns.items():
            rows[name].append(one_round(fn, blobs, args.threads))
        print(f"round {r}: " + ", ".join(f"{n} {v[-1][0]:.3f} ms {v[-1][1]:.0f} flt"
                                        for n, v in rows.items()))
    best = {n: (min(r[0] for r in v), min(r[1] for r in v), max(r[2] for r in v))
            for n, v in rows.items()}
    print("best of rounds (lowest CPU ms/image, lowest minor faults/image, CPU speed vs tf, "
          "highest images/s):")
    for n, (ms, flt, rate) in best.items():
        print(f"  {n:12s} {ms:7.3f} ms  {flt:7.1f} faults  {best['tf'][0] / ms:5.2f}x  "
              f"{rate:7.1f} img/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
