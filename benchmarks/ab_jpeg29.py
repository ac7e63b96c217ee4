"""In one process, alternating epochs: Keras, this branch's CPU default ("after"), and the
same loader with branch jpeg29's three changes undone in place ("before": the PNG op on
every file, TF's own generator functions, one decode call per core). Per loader: best and
median img/s over whole epochs, CPU ms per image (process time), context switches per
image, and the best first batch of a fresh iterator (docs/benchmarks.md, issue 29).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/ab_jpeg29.py /work/b29/jpeg512 12

Prints one markdown row per loader: best img/s, median img/s, best / Keras's best, median
CPU ms per image, median context switches per image, best first batch (ms).
"""

from __future__ import annotations

import os
import resource
import statistics as st
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_vs_keras import time_first  # noqa: E402  (the issue's benchmark's first batch)

KW = dict(image_size=(244, 244), batch_size=128, seed=1, verbose=False)


def before(ours, root: str):
    """This loader with the branch's three changes undone while it is built."""
    import dali_loader.plan as plan
    import dali_loader.tfdata.generators as gens
    import dali_loader.tfdata.tf_path as tfp

    saved = (plan.has_pngs, dict(gens._single_device), tfp.CALLS_PER_CORE)
    plan.has_pngs = lambda paths: True
    gens._single_device.clear()
    gens._single_device["ok"] = False
    tfp.CALLS_PER_CORE = 1
    try:
        return ours(root, **KW)
    finally:
        plan.has_pngs = saved[0]
        gens._single_device.clear()
        gens._single_device.update(saved[1])
        tfp.CALLS_PER_CORE = saved[2]


def epoch(ds) -> tuple[float, float, float]:
    """img/s, CPU ms per image, context switches per image over one whole epoch."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c, t, n = time.process_time(), time.perf_counter(), 0
    for x, _ in ds:
        n += int(x.shape[0])
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    switches = r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw
    return n / wall, cpu / n * 1e3, switches / n


def main(argv: list[str]) -> int:
    import keras

    from tf_adapter import image_dataset_from_directory as ours

    root, rounds = argv[0], int(argv[1])
    loaders = {"keras": keras.utils.image_dataset_from_directory(root, **KW),
               "before": before(ours, root), "after": ours(root, **KW)}
    for ds in loaders.values():  # warm-up
        epoch(ds)
    runs = {k: [] for k in loaders}
    firsts = {k: [] for k in loaders}
    for _ in range(rounds):
        for k, ds in loaders.items():
            runs[k].append(epoch(ds))
        for k, ds in loaders.items():
            firsts[k].append(time_first(ds) * 1e3)
    keras_best = max(r[0] for r in runs["keras"])
    for k, v in runs.items():
        ips = [r[0] for r in v]
        print(f"| {k} | {max(ips):,.0f} | {st.median(ips):,.0f} | {max(ips) / keras_best:.2f}x "
              f"| {st.median(r[1] for r in v):.2f} | {st.median(r[2] for r in v):.1f} "
              f"| {min(firsts[k]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
