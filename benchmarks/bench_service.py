"""tf.data service row: the same epoch in-process and through a loopback dispatcher.

One run, one data set, the same graph (`dali_loader.tfdata.graph_dataset`), with
Keras's own dataset as the baseline:

  0. Keras             `keras.utils.image_dataset_from_directory`, in the trainer
  1. in-process        the graph dataset in the trainer (no service)
  2. service, 1 worker  `image_dataset_from_directory(..., service=...)`, 1 worker process
  3. service, 2 workers the same, 2 worker processes
  4. 2 workers, no compression  as 3 with `compression=None` (snappy off)

All services are up at once; each set-up gets 1 warm-up epoch, then the set-ups
take turns for `--epochs` rounds (one epoch each per round: the shared machine's
noise falls on all of them alike), input only (no model step). Per set-up:
images/s (best epoch and median), the time to the first batch, the trainer's CPU per image
(this process's CPU time), the workers' CPU per image (their
/proc/PID/stat), and the trainer's per-epoch tally (files delivered, missing,
repeated). Before that, bytes per image on the wire, measured on the worker
graph's own transfer batches: raw, and after the service's snappy compression
(`compression="AUTO"`: TF's own `compress` op, serialised), against two
alternatives (the PNG file; uint8 pixels before the resize). On a 2-core
machine the trainer and every worker share the same 2 cores: more workers
cannot be faster here; the printed scaling model says what they give on
machines of their own.

    .venv/bin/python benchmarks/bench_service.py [--data DIR] [--num-images 256] [--epochs 3]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

import harness

BATCH = 32
IMAGE_SIZE = (256, 256)  # Keras's default
SEED = 0


def wire_bytes(tf, index, spec, samples: int) -> dict:
    """Bytes per image: the PNG, the transfer batch raw and snappy-compressed, and uint8
    pixels before the resize (raw and compressed), over the first `samples` images."""
    from tensorflow.python.data.experimental.ops import compression_ops

    from dali_loader.tfdata.graph_dataset import worker_dataset

    n = min(samples, len(index))
    paths = tf.constant(index.paths[:n])
    labels = tf.constant(index.labels[:n], tf.int32)
    ds = worker_dataset(tf, paths, labels, tf.constant(0, tf.int64), spec, seed=SEED,
                        shuffle=False, transfer_batch=BATCH, parallel=None)
    raw = snappy = 0
    for batch in ds:
        raw += sum(t.numpy().nbytes for t in batch)
        snappy += len(tf.io.serialize_tensor(compression_ops.compress(batch)).numpy())
    png = sum(os.path.getsize(p) for p in index.paths[:n])
    u8 = u8_snappy = 0
    for p in index.paths[:n]:
        img = tf.image.decode_image(tf.io.read_file(p), channels=3, expand_animations=False)
        u8 += img.numpy().nbytes
        u8_snappy += len(tf.io.serialize_tensor(compression_ops.compress((img,))).numpy())
    graph = tf.raw_ops.DatasetToGraphV2(input_dataset=worker_dataset(
        tf, tf.constant(index.paths), tf.constant(index.labels, tf.int32),
        tf.constant(1, tf.int64), spec, seed=SEED, shuffle=True, transfer_batch=BATCH,
        parallel=None)._variant_tensor)
    return {"images": n, "png": png / n, "raw": raw / n, "snappy": snappy / n,
            "uint8": u8 / n, "uint8_snappy": u8_snappy / n,
            "graph_bytes": len(graph.numpy()), "files": len(index)}


class _NoTally:
    """Keras's dataset has no tally: its row shows '-'."""

    @staticmethod
    def epochs():
        return []


class Setup:
    """One row: a dataset, the worker processes it reads from, its epochs' figures."""

    def __init__(self, name: str, ds, worker_pids=lambda: []):
        self.name, self.ds, self.worker_pids = name, ds, worker_pids
        self.rates, self.trainer_ms, self.worker_ms, self.firsts = [], [], [], []

    def epoch(self, timed: bool = True) -> None:
        pids = self.worker_pids()
        w0 = harness.cpu_seconds(pids)
        e = harness.epoch(self.ds, self.name)
        w1 = harness.cpu_seconds(pids)
        if timed:
            self.rates.append(e.img_s)
            self.firsts.append(e.first_batch_s)
            self.trainer_ms.append(e.cpu_ms)
            self.worker_ms.append(1000 * (w1 - w0) / e.images)

    def row(self) -> dict:
        tallies = getattr(self.ds, "tally", _NoTally).epochs()
        return {"name": self.name, "best": max(self.rates),
                "median": statistics.median(self.rates), "first_s": statistics.median(self.firsts),
                "trainer_ms": statistics.median(self.trainer_ms),
                "worker_ms": statistics.median(self.worker_ms) if self.worker_pids() else None,
                "once": f"{sum(t.exactly_once for t in tallies)}/{len(tallies)}" if tallies else "-",
                "missing": sum(t.missing for t in tallies),
                "repeated": sum(t.repeated for t in tallies)}


def main(argv: list[str] | None = None) -> int:
    args = harness.parser(__doc__, data=True, num_images=256, epochs=3).parse_args(argv)

    import tensorflow as tf

    from dali_loader.api import open_index
    from dali_loader.decode.spec import ImageSpec
    from support.service_cluster import LoopbackService
    from dali_loader.tfdata.service import distributor
    from dali_loader.tfdata.graph_dataset import graph_dataset
    from tf_adapter import image_dataset_from_directory

    print(harness.command_line(__file__, argv))
    print(f"cores: {os.cpu_count()}, batch {BATCH}, image_size {IMAGE_SIZE}, float32 output, "
          f"1 warm-up + {args.epochs} timed epochs per set-up, alternating, input only (no model step); "
          "CPU per image: medians")
    with harness.sample_data(args.data, args.num_images, "dali-service-") as data, \
            tempfile.TemporaryDirectory(prefix="dali-service-runs-") as tmp:
        _, index = open_index(data, shuffle=False)
        spec = ImageSpec(*IMAGE_SIZE)

        w = wire_bytes(tf, index, spec, samples=64)
        print(f"\nBytes per image (mean of the first {w['images']} images):\n")
        print("| what crosses the network | bytes/image | vs float32 raw |")
        print("|---|---:|---:|")
        for label, key in [("float32 256x256x3 + label, raw (compression=None)", "raw"),
                           ("the same, snappy (compression=\"AUTO\", the default)", "snappy"),
                           ("uint8 pixels before the resize, raw (not offered: see docs)", "uint8"),
                           ("uint8 pixels before the resize, snappy", "uint8_snappy"),
                           ("the PNG file itself (what a worker reads)", "png")]:
            print(f"| {label} | {w[key]:,.0f} | {w[key] / w['raw']:.2f}x |")
        print(f"\nRegistered graph per epoch (paths, labels, the epoch's order): "
              f"{w['graph_bytes']:,} bytes for {w['files']} files "
              f"({w['graph_bytes'] / w['files']:.0f} bytes/file)")

        import keras

        with LoopbackService(1, os.path.join(tmp, "one")) as one, \
                LoopbackService(2, os.path.join(tmp, "two")) as two:
            setups = [
                Setup("Keras (baseline, in-process)", keras.utils.image_dataset_from_directory(
                    data, image_size=IMAGE_SIZE, batch_size=BATCH, seed=SEED, verbose=False)),
                Setup("in-process (no service)", graph_dataset(
                    index, spec, BATCH, "int", len(index.class_names), seed=SEED, shuffle=True,
                    on_error="raise", parallel=None))]
            for svc in (one, two):
                n = len(svc.workers)
                setups.append(Setup(f"service, {n} worker{'s' * (n > 1)}",
                                    image_dataset_from_directory(
                                        data, image_size=IMAGE_SIZE, batch_size=BATCH, seed=SEED,
                                        service=svc.target, verbose=False), svc.worker_pids))
            setups.append(Setup("service, 2 workers, compression=None", graph_dataset(
                index, spec, BATCH, "int", len(index.class_names), seed=SEED, shuffle=True,
                on_error="raise", parallel=None,
                distribute=distributor(two.target, compression=None)), two.worker_pids))
            for s in setups:  # warm-up
                s.epoch(timed=False)
            for _ in range(args.epochs):  # alternating: every set-up sees the same noise
                for s in setups:
                    s.epoch()
            rows = [s.row() for s in setups]
            codes = one.close() + two.close()  # 1: a worker's stop outlasted --stop-timeout
            assert set(codes) <= {0, 1}, codes

    base = rows[0]["best"]  # Keras
    print("\n| set-up | images/s best (median) | vs Keras | first batch s (median) | "
          "trainer CPU ms/image | workers' CPU ms/image | exactly once (epochs) | missing / repeated |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        wm = "-" if r["worker_ms"] is None else f"{r['worker_ms']:.1f}"
        print(f"| {r['name']} | {r['best']:.0f} ({r['median']:.0f}) | {r['best'] / base:.2f}x | "
              f"{r['first_s']:.2f} | {r['trainer_ms']:.2f} | {wm} | {r['once']} | {r['missing']} / {r['repeated']} |")
    decode_ms = rows[1]["trainer_ms"]
    served = rows[3]
    print(f"\nOn {os.cpu_count()} cores the trainer and the workers share the same cores: more "
          "workers cannot be faster here (the rows above measure overheads and exactness, not "
          "scaling).")
    print(f"Scaling model (workers on machines of their own): images/s = min(W x C x 1000 / "
          f"{served['worker_ms'] or decode_ms:.1f} [workers' CPU ms/image, measured], "
          f"trainer cores x 1000 / {served['trainer_ms']:.2f} [trainer CPU ms/image], "
          f"NIC bytes/s / {w['snappy']:,.0f} [bytes/image, snappy]).")
    for vms, cores in [(4, 8), (8, 16)]:
        dec = vms * cores * 1000 / (served["worker_ms"] or decode_ms)
        nic = 100e9 / 8 / w["snappy"]
        print(f"  {vms} worker VMs x {cores} vCPUs: decode {dec:,.0f} images/s; a 100 Gbit/s "
              f"trainer NIC {nic:,.0f} images/s (snappy), {100e9 / 8 / w['raw']:,.0f} (raw)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
