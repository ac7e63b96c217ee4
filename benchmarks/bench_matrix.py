"""The performance matrix against `keras.utils.image_dataset_from_directory` (issue 37).

Every cell: one folder (image shape, format, colour type, file count, local disk or a FUSE
mount with 50 ms per open), Keras's function and this loader's (`tf_adapter`), the same
arguments, built in one process; after a warm-up epoch each, whole epochs alternate
(Keras, ours, Keras, ...) until each has run `--epochs` epochs and `--seconds` seconds (at
most 25 epochs). A cell reports, for each loader, the best epoch's img/s and the least
process CPU per image (all threads: user + system) over its epochs, and whether the first
batch of an unshuffled epoch is Keras's bit for bit.

    .venv/bin/python benchmarks/bench_matrix.py                 # the whole matrix (< 15 min)
    .venv/bin/python benchmarks/bench_matrix.py --only png32 png8 --counts 10000
    .venv/bin/python benchmarks/bench_matrix.py --quick         # one small cell per kind
    .venv/bin/python benchmarks/bench_matrix.py --only png32 --code ../before   # another build

Images are photo-like (`dali_loader.tools.sample`: crops of real pictures with sensor-like
noise) at each shape, written once under `--data` (default `out/matrix-data`, reused by
later runs). Up to 2,048 distinct files per kind; a larger count repeats them as hard
links under other names (the same bytes: the decode costs the same). Each kind runs in a
child process of its own. The table (markdown) goes to stdout, every epoch to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The loader timed: this checkout's, or another one's (`--code DIR`, e.g. a "before" build).
sys.path.insert(0, os.environ.get("BENCH_MATRIX_CODE") or ROOT)
sys.path.append(os.path.join(ROOT, "tests"))  # the slow FUSE mount (tests/support/slowfuse.py)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DISTINCT = 2048  # distinct files per kind; more are hard links to them
MAX_EPOCHS = 25
FUSE_DELAY = 0.05


@dataclasses.dataclass(frozen=True)
class Kind:
    """One image kind: its files and the arguments both loaders get."""

    name: str
    height: int
    width: int
    mode: str = "RGB"  # PIL mode of the files: RGB, L, P (palette), RGBA
    fmt: str = "png"
    counts: tuple[int, ...] = (16, 512, 10_000)
    color_modes: tuple[str, ...] = ("rgb",)
    fuse: bool = False  # one cell on a FUSE mount with 50 ms per open (the largest count)

    @property
    def image_size(self) -> tuple[int, int]:
        """Small images keep their size (as CIFAR and MNIST users do); others 244x244."""
        if max(self.height, self.width) <= 64:
            return (self.height, self.width)
        return (244, 244)

    @property
    def batch_size(self) -> int:
        return 256 if max(self.height, self.width) <= 64 else 128


KINDS = (
    Kind("png8", 8, 8, counts=(16, 512, 10_000, 100_000)),
    Kind("png28grey", 28, 28, "L", color_modes=("grayscale", "rgb")),
    Kind("png32", 32, 32, color_modes=("rgb", "grayscale")),
    Kind("png32fuse", 32, 32, counts=(512,), fuse=True),
    Kind("png64", 64, 64),
    Kind("png256", 256, 256, counts=(16, 512, 2_048)),
    Kind("palette256", 256, 256, "P", counts=(16, 512)),
    Kind("rgba256", 256, 256, "RGBA", counts=(16, 512), color_modes=("rgb", "rgba")),
    Kind("png500x375", 375, 500, counts=(16, 512), color_modes=("rgb", "grayscale")),
    Kind("png1500x1000", 1000, 1500, counts=(16, 128)),
    Kind("jpeg32", 32, 32, fmt="jpeg"),
    Kind("jpeg500x375", 375, 500, fmt="jpeg", counts=(16, 512)),
)


def _write_distinct(kind: Kind, folder: str, n: int) -> None:
    """`n` photo-like files of `kind` in 4 class folders (converted from the sample's RGB PNGs)."""
    from PIL import Image

    from dali_loader.tools.sample import make_sample_dataset

    make_sample_dataset(folder, num_images=n, num_classes=4, size=(kind.height, kind.width))
    if kind.mode == "RGB" and kind.fmt == "png":
        return
    for d, _, files in os.walk(folder):
        for f in files:
            if f.startswith("."):
                continue
            p = os.path.join(d, f)
            with Image.open(p) as im:
                im.load()
            if kind.fmt == "jpeg":
                im.save(p[:-4] + ".jpg", quality=90)
                os.remove(p)
                continue
            if kind.mode == "L":
                im = im.convert("L")
            elif kind.mode == "P":
                im = im.quantize(256)
            elif kind.mode == "RGBA":
                a = Image.linear_gradient("L").resize(im.size)
                im = im.convert("RGBA")
                im.putalpha(a)
            im.save(p)


def folder(kind: Kind, count: int, data: str) -> str:
    """The folder of `count` files of `kind` under `data`, written the first time."""
    out = os.path.join(data, f"{kind.name}-{count}")
    if os.path.isfile(os.path.join(out, ".done")):
        return out
    base = os.path.join(data, f"{kind.name}-distinct")
    if not os.path.isfile(os.path.join(base, ".done")):
        _write_distinct(kind, base, min(max(kind.counts), DISTINCT))
        open(os.path.join(base, ".done"), "w").close()
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(base) for f in fs
                   if not f.startswith("."))
    for i in range(count):
        src = files[i % len(files)]
        cls = os.path.basename(os.path.dirname(src))
        os.makedirs(os.path.join(out, cls), exist_ok=True)
        dst = os.path.join(out, cls, f"f{i:06d}{os.path.splitext(src)[1]}")
        if not os.path.exists(dst):
            os.link(src, dst)
    open(os.path.join(out, ".done"), "w").close()
    return out


def _epoch(ds) -> tuple[float, float, int]:
    """(wall s, process CPU s, images) of one whole epoch of `ds`."""
    c, t, n = time.process_time(), time.perf_counter(), 0
    for x, _ in ds:
        n += int(x.shape[0])
    return time.perf_counter() - t, time.process_time() - c, n


def run_cell(root: str, kind: Kind, color_mode: str, min_epochs: int, seconds: float) -> dict:
    """Both loaders over `root`, alternating epochs; the pixels of an unshuffled first batch."""
    import keras
    import numpy as np

    from tf_adapter import image_dataset_from_directory as ours

    kw = dict(image_size=kind.image_size, batch_size=kind.batch_size, color_mode=color_mode)
    loaders = {"keras": keras.utils.image_dataset_from_directory(root, seed=1, **kw),
               "ours": ours(root, seed=1, **kw)}
    first = [next(iter(f(root, shuffle=False, **kw)))[0].numpy()
             for f in (keras.utils.image_dataset_from_directory, ours)]
    same = first[0].shape == first[1].shape and bool(np.array_equal(first[0], first[1]))
    for ds in loaders.values():  # warm-up: graphs, thread pools, page cache
        _epoch(ds)
    epochs = {k: [] for k in loaders}
    spent = {k: 0.0 for k in loaders}
    while (any(len(v) < min_epochs or spent[k] < seconds for k, v in epochs.items())
           and all(len(v) < MAX_EPOCHS for v in epochs.values())):
        for k, ds in loaders.items():
            wall, cpu, n = _epoch(ds)
            epochs[k].append((wall, cpu, n))
            spent[k] += wall
    out = {"files": epochs["keras"][0][2], "pixels_identical": same, "epochs": epochs}
    for k, v in epochs.items():
        out[k] = {"img_s": max(n / w for w, _, n in v),
                  "cpu_ms": min(c / n for _, c, n in v) * 1e3,
                  "img_s_median": statistics.median(n / w for w, _, n in v),
                  "cpu_ms_median": statistics.median(c / n for _, c, n in v) * 1e3}
    return out


def child(kind: Kind, data: str, counts: list[int], min_epochs: int, seconds: float) -> None:
    """One kind's cells, each printed as a JSON line."""
    for count in counts:
        root = folder(kind, count, data)
        for cm in kind.color_modes:
            if kind.fuse:
                from support.slowfuse import SlowMount, fuse_problem

                if fuse_problem():
                    print(json.dumps({"kind": kind.name, "count": count, "color_mode": cm,
                                      "skipped": f"no FUSE mount: {fuse_problem()}"}), flush=True)
                    continue
                with tempfile.TemporaryDirectory() as tmp, \
                        SlowMount(root, os.path.join(tmp, "mnt"), delay=FUSE_DELAY) as m:
                    r = run_cell(m.mount, kind, cm, min_epochs, seconds)
            else:
                r = run_cell(root, kind, cm, min_epochs, seconds)
            print(json.dumps({"kind": kind.name, "count": count, "color_mode": cm, **r}),
                  flush=True)


def table(cells: list[dict]) -> str:
    """The markdown table: ours/Keras img/s (best epoch) and CPU per image (least), each
    with the medians' ratio beside it; `!` where a cell misses issue 37's bar (img/s
    under 0.95x Keras's, or CPU per image over 1.1x), on the best figures."""
    lines = ["| folder | files | color_mode | Keras img/s | ours img/s | img/s ratio (median) "
             "| Keras CPU ms/img | ours CPU ms/img | CPU ratio (median) | epochs | pixels |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in cells:
        k, o = c["keras"], c["ours"]
        rate, cpu = o["img_s"] / k["img_s"], o["cpu_ms"] / k["cpu_ms"]
        mid = ("", "")
        if "img_s_median" in o:
            mid = (f" ({o['img_s_median'] / k['img_s_median']:.2f}x)",
                   f" ({o['cpu_ms_median'] / k['cpu_ms_median']:.2f}x)")
        flag = lambda bad: " !" if bad else ""  # noqa: E731
        lines.append(
            f"| {c['kind']} | {c['count']:,} | {c['color_mode']} | {k['img_s']:,.0f} "
            f"| {o['img_s']:,.0f} | {rate:.2f}x{flag(rate < 0.95)}{mid[0]} | {k['cpu_ms']:.3f} "
            f"| {o['cpu_ms']:.3f} | {cpu:.2f}x{flag(cpu > 1.1)}{mid[1]} "
            f"| {len(c['epochs']['ours'])} | {'same' if c['pixels_identical'] else 'DIFFER'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", metavar="KIND", choices=[k.name for k in KINDS],
                   help="these kinds only")
    p.add_argument("--counts", nargs="+", type=int, help="these file counts only")
    p.add_argument("--quick", action="store_true", help="the smallest count of each kind, 2 epochs")
    p.add_argument("--epochs", type=int, default=3, help="at least this many epochs per loader")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="and at least this many seconds of epochs per loader")
    p.add_argument("--data", default=os.path.join(ROOT, "out", "matrix-data"),
                   help="where the folders are written (kept for later runs)")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "matrix.json"),
                   help="every cell's epochs, as JSON lines")
    p.add_argument("--code", help="time the loader of another checkout (its root folder, built)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    kinds = {k.name: k for k in KINDS}
    if a.quick:
        a.epochs, a.seconds = 2, 0.0
    if a.child:
        kind = kinds[a.child]
        counts = [c for c in kind.counts if not a.counts or c in a.counts]
        child(kind, a.data, counts[:1] if a.quick else counts, a.epochs, a.seconds)
        return 0
    if a.code:
        os.environ["BENCH_MATRIX_CODE"] = os.path.abspath(a.code)
    os.makedirs(a.data, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    cells, started, failed = [], time.time(), 0
    with open(a.out, "w") as log:
        for name in a.only or kinds:
            cmd = [sys.executable, __file__, "--child", name, "--data", a.data,
                   "--epochs", str(a.epochs), "--seconds", str(a.seconds)]
            cmd += ["--counts", *map(str, a.counts)] if a.counts else []
            cmd += ["--quick"] if a.quick else []
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                sys.stderr.write(r.stderr[-4000:])
                print(f"{name}: failed (exit {r.returncode})", file=sys.stderr)
                failed += 1
            for line in r.stdout.splitlines():
                if line.startswith("{"):
                    cell = json.loads(line)
                    log.write(line + "\n")
                    if "skipped" in cell:
                        print(f"{name}: skipped, {cell['skipped']}", file=sys.stderr)
                        continue
                    cells.append(cell)
                    print(f"{time.time() - started:6.0f} s  {name} {cell['count']:,} "
                          f"{cell['color_mode']}: ours/Keras "
                          f"{cell['ours']['img_s'] / cell['keras']['img_s']:.2f}x img/s, "
                          f"{cell['ours']['cpu_ms'] / cell['keras']['cpu_ms']:.2f}x CPU/img",
                          file=sys.stderr, flush=True)
    print(table(cells))
    print(f"\n{len(cells)} cells in {time.time() - started:.0f} s"
          + (f"; {failed} kinds failed (above)." if failed else "."))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
