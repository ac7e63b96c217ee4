"""The DALI path's PNG decoder: the native core's DALI operator against DALI's own (libpng).

In one process, over the same photo-like 500x375 PNGs (the sample dataset), alternating
round by round:

1. The decode stage alone, in-memory bytes to RGB pixels in a CPU DALI pipeline, batch
   128, 1 and 2 DALI threads: `fn.decoders.image` (nvImageCodec's libpng, what the DALI
   path ran before) and `fn.dali_loader.png_decode` (the core). On a GPU host the resize
   leaves the CPU, so this is the gain that counts there.
2. Epochs of `image_dataset_from_directory(decoder="dali")` at 244x244, batch 128, on a
   local folder: `png_decoder="libpng"` (DALI's decoder), the default (the operator), and
   `png_decoder="wuffs"` (the other design: Wuffs through pywuffs on the feed's threads,
   each PNG entering DALI as raw pixels). DALI's CPU resize is in this figure.

On a shared machine the rate of one epoch swings with the other processes' load; the CPU
time per image (all threads of this process) barely does. So the report gives both, and
the median of the per-round ratios (each round's epochs run back to back).

Each malloc setting runs in its own process: glibc's default, and `GLIBC_TUNABLES` that
keep freed memory in the process (this VM charges for fresh memory; docs/gpu_ready.md).
Prints the best and the range over the rounds, CPU ms per image (all threads, lowest),
and the ratios.

    .venv/bin/python benchmarks/bench_dali_png.py [--num-images 1024] [--rounds 5]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import harness

STAGE = ("dali-libpng", "native-op")
EPOCHS = ("libpng", "native", "wuffs")
BATCH = 128


def stage_pipeline(blobs: list, which: str, threads: int):
    """A CPU pipeline decoding `blobs` (a list of uint8 arrays) batch by batch, no resize."""
    from dali_loader.decode import dali_png
    from dali_loader.lazy import import_dali

    dali = import_dali()
    batches = [blobs[i:i + BATCH] for i in range(0, len(blobs), BATCH)]
    state = {"i": 0}

    def source():
        b = batches[state["i"] % len(batches)]
        state["i"] += 1
        return b

    @dali.pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None,
                       prefetch_queue_depth=2, exec_dynamic=True)
    def pipe():
        enc = dali.fn.external_source(source=source, batch=True, dtype=dali.types.UINT8)
        if which == "native-op":
            px, ok = dali_png.png_decode(dali, enc, 3, 1 << 30)
            return px, ok
        return dali.fn.decoders.image(enc, device="cpu", output_type=dali.types.RGB,
                                      adjust_orientation=False)

    p = pipe()
    p.build()
    return p, len(batches)


def stage_rate(pipe, n_batches: int, n_images: int) -> tuple[float, float]:
    """(images/s, CPU ms per image) of one pass over the data."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n_batches):
        out = pipe.run()
        if len(out) == 2:  # the operator: every image must have been its
            assert all(bool(out[1].as_array()[k]) for k in range(len(out[1])))
    return n_images / (time.perf_counter() - t0), 1e3 * (time.process_time() - c0) / n_images


def make_dataset(data: str, which: str):
    from tf_adapter import image_dataset_from_directory

    return image_dataset_from_directory(data, batch_size=BATCH, image_size=(244, 244),
                                        shuffle=True, seed=1, verbose=False, decoder="dali",
                                        png_decoder=None if which == "native" else which)


def run_one(data: str, rounds: int, stage: bool = True) -> dict:
    import numpy as np

    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs)
    blobs = [np.fromfile(p, np.uint8) for p in paths]
    n_full = len(blobs) - len(blobs) % BATCH  # whole batches only
    if stage and not n_full:
        raise ValueError(f"The decode stage runs whole batches of {BATCH}: pass --num-images "
                         f"{BATCH} or more, or --no-stage. Received: {len(blobs)} files in {data}")
    blobs = blobs[:n_full]
    out: dict = {"stage": {f"{k}-{t}": [] for k in STAGE for t in (1, 2)},
                 "epochs": {k: [] for k in EPOCHS}, "cpu_ms": {}, "png_native": []}
    for k in list(out["stage"]) + list(EPOCHS):
        out["cpu_ms"][k] = []
    pipes = ({f"{k}-{t}": stage_pipeline(blobs, k, t) for k in STAGE for t in (1, 2)}
             if stage else {})
    for p, _ in pipes.values():  # warm up
        p.run()
    datasets = {k: make_dataset(data, k) for k in EPOCHS}
    assert datasets["native"].loader.engine.png_native, "the operator is not built"
    assert not datasets["libpng"].loader.engine.png_native
    assert not datasets["wuffs"].loader.engine.png_native
    for ds in datasets.values():  # warm up: tracing, pools, page cache
        harness.timed_epoch("warm-up", ds, 0.0, max_batches=1)
    for r in range(rounds):
        for k, (p, n) in pipes.items():
            rate, cpu = stage_rate(p, n, n_full)
            out["stage"][k].append(rate)
            out["cpu_ms"][k].append(cpu)
        for k in EPOCHS:
            e = harness.epoch(datasets[k], k)
            out["epochs"][k].append(e.img_s)
            out["cpu_ms"][k].append(e.cpu_ms)
        out["png_native"].append(datasets["native"].loader.epoch_stats[-1]
                                 .get("png_native", 0))
        print(f"  round {r + 1}: " + ", ".join(
            f"{k} {v[-1]:.0f} img/s {out['cpu_ms'][k][-1]:.2f} ms"
            for d in (out["stage"], out["epochs"]) for k, v in d.items() if v)
            + f"; PNGs by the operator {out['png_native'][-1]}", flush=True)
    return out


def report(name: str, res: dict) -> None:
    st, ep, cpu = res["stage"], res["epochs"], res["cpu_ms"]
    span, median = harness.span, statistics.median

    print(f"\n## {name}: images/s, best (range) of {len(ep['libpng'])} alternating rounds; "
          "CPU ms per image (all threads), lowest")
    for t in (1, 2) if st["native-op-1"] else ():
        lib, nat = st[f"dali-libpng-{t}"], st[f"native-op-{t}"]
        ratios = [a / b for a, b in zip(nat, lib)]
        print(f"  decode stage, {t} DALI thread(s): DALI's libpng {span(lib)} img/s "
              f"{min(cpu[f'dali-libpng-{t}']):.2f} ms  operator {span(nat)} img/s "
              f"{min(cpu[f'native-op-{t}']):.2f} ms  best/best {max(nat) / max(lib):.2f}x, "
              f"per round {min(ratios):.2f}-{max(ratios):.2f}x (median {median(ratios):.2f}x); "
              f"CPU {min(cpu[f'dali-libpng-{t}']) / min(cpu[f'native-op-{t}']):.2f}x less")
    for k in EPOCHS:
        print(f"  decoder='dali', {k:<7} {span(ep[k])} img/s  {min(cpu[k]):6.2f} ms")
    for k in ("native", "wuffs"):
        ratios = [a / b for a, b in zip(ep[k], ep["libpng"])]
        print(f"  decoder='dali': {k} / DALI's libpng, best/best "
              f"{max(ep[k]) / max(ep['libpng']):.2f}x, per round "
              f"{min(ratios):.2f}-{max(ratios):.2f}x (median {median(ratios):.2f}x); CPU per "
              f"image {min(cpu['libpng']) / min(cpu[k]):.2f}x less")
    print(f"  PNGs by the operator per epoch: {sorted(set(res['png_native']))}")


def main(argv: list[str] | None = None) -> int:
    return harness.ab_main(
        __file__, __doc__,
        lambda args: run_one(args.data, args.rounds, stage=not args.no_stage),
        report, argv,
        add_args=lambda ap: ap.add_argument("--no-stage", action="store_true",
                                            help="epochs only"),
        child_args=lambda args: ["--no-stage"] if args.no_stage else [])


if __name__ == "__main__":
    sys.exit(main())
