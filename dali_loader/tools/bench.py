"""Side-by-side benchmark: the seed's tf.data pipeline, tuned tf.data and this loader.

Every pipeline feeds the same synthetic training step (``time.sleep(step_time)`` per batch, standing
in for the GPU: it takes wall time but no CPU). Pipelines run in alternating rounds in one process.
Per run we record images/s, step time (wall time per batch), the input-wait fraction (time spent
waiting for the next batch over total step time: the TF profiler's measure, >5% moderately and >20%
highly input-bound) and CPU utilisation (process CPU time over wall time x cores).

Each loader row (``loader-cpu``, ``loader-gpu``) has a ``-cached`` twin reading through the GPU-ready
cache (``gpu_ready=True``, its own cache folder). Its cache is filled by one untimed epoch before
the rounds, so its rounds time cached epochs; each round also times a filling epoch of the same row
in a fresh cache folder (``fill_img_s``: their median; ``fill_rounds_img_s``: each). Every row reports the CPU
decodes per epoch (the seed and tuned pipelines decode every image on the CPU; the loader rows count
them in ``epoch_stats``), and the cached rows the cache's bytes per image and against the source's.

Two rows run only when ``include`` (``--only``) names them: ``loader-dali`` (and its
``-cached`` twin), the loader decoding and resizing with DALI on the CPU (``decoder="dali"``,
the GPU path's graph), and ``decode-bound``, TF's ``decode_image`` alone over the files' bytes
held in memory, on all cores, no resize: what any loader that decodes them on the CPU can reach.

Every row names its PNG decoder (``png_decoder``): libpng for the seed and tuned pipelines
(``tf.io.decode_png``); for the loader rows the one the plan chose (by default the native
core where it is built, else libpng; a cached row's is the one that fills its cache). Given several decoders
(``png_decoder=["wuffs", "libpng"]``), each loader row runs once per decoder, named
``loader-cpu-wuffs``, ``loader-cpu-libpng`` (and their ``-cached`` twins).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import resource
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from collections.abc import Callable, Iterable, Sequence

from dali_loader import probes
from dali_loader.args import positive_int
from dali_loader.tools.decoders import PNG_DECODERS, decoder_name, format_counts

PNG_DECODER_CHOICES = ("wuffs", "libpng")
DECODER_NAMES = PNG_DECODERS

logger = logging.getLogger(__name__)

__all__ = ["RunStats", "timed_epoch", "input_bound_class", "summarize", "run_bench",
           "write_results", "plot_throughput", "write_tensorboard"]


@dataclasses.dataclass
class RunStats:
    """One pass of one pipeline."""

    pipeline: str
    round: int
    images: int
    batches: int
    wall_s: float
    wait_s: float
    cpu_s: float
    cores: int
    first_wait_s: float = 0.0  # the first batch: pipeline start-up, cold caches
    complete: bool = True  # the epoch ran to its end (not cut short by max_batches)
    cpu_decodes: int | None = None  # images decoded on the CPU in this (complete) epoch
    first_batch_s: float = 0.0  # from iter(data) to the first batch (first_wait_s and iter())

    @property
    def img_s(self) -> float:
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def step_ms(self) -> float:
        return 1000 * self.wall_s / self.batches if self.batches else 0.0

    @property
    def input_wait_pct(self) -> float:
        return 100 * self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steady_wait_pct(self) -> float:
        """Input wait after the first batch (start-up excluded)."""
        rest = self.wall_s - self.first_wait_s
        return 100 * (self.wait_s - self.first_wait_s) / rest if rest > 0 else 0.0

    @property
    def cpu_util_pct(self) -> float:
        return 100 * self.cpu_s / (self.wall_s * self.cores) if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(img_s=self.img_s, step_ms=self.step_ms, input_wait_pct=self.input_wait_pct,
                 steady_wait_pct=self.steady_wait_pct, cpu_util_pct=self.cpu_util_pct)
        return d


def input_bound_class(wait_pct: float) -> str:
    """The TF profiler's reading of the input-wait percentage."""
    if wait_pct > 20:
        return "highly input-bound"
    if wait_pct > 5:
        return "moderately input-bound"
    return "not input-bound"


def _cpu_time() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _num_images(batch: Any) -> int:
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(images.shape[0])


def timed_epoch(name: str, data: Iterable, step_time: float, max_batches: int | None = None,
                round_index: int = 0, on_batch: Callable[[], None] | None = None) -> RunStats:
    """Iterates ``data`` once with a synthetic ``step_time`` step after each batch.

    Args:
        name: the pipeline's label.
        data: an iterable of ``(images, labels)`` batches (tf.data or this loader).
        step_time: seconds slept per batch (the stand-in for the GPU step).
        max_batches: stop after this many batches (None = the whole epoch).
        round_index: recorded in the result.
        on_batch: called after each step (progress bars).
    """
    if step_time < 0:
        raise ValueError(f"step_time must be >= 0. Received: step_time={step_time}")
    cores = os.cpu_count() or 1
    images = batches = 0
    wait = first = first_batch = 0.0
    complete = False
    c0, t0 = _cpu_time(), time.perf_counter()
    it = iter(data)
    while max_batches is None or batches < max_batches:
        w0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            complete = True
            break
        waited = time.perf_counter() - w0
        wait += waited
        if batches == 0:
            first, first_batch = waited, time.perf_counter() - t0
        images += _num_images(batch)
        batches += 1
        if step_time:
            time.sleep(step_time)
        if on_batch:
            on_batch()
    wall = time.perf_counter() - t0
    return RunStats(name, round_index, images, batches, wall, wait, _cpu_time() - c0, cores,
                    first, complete, first_batch_s=first_batch)


def summarize(runs: Sequence[RunStats], extras: dict[str, dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:
    """Per pipeline: median over rounds, plus the first round (cold caches) separately.

    ``cpu_decodes_per_epoch`` is the most CPU decodes any complete round counted (None when no
    round counted them: cut short by ``max_batches``, or not known). ``extras`` adds fields per
    pipeline (the cached rows' ``fill_img_s`` and cache bytes).
    """
    out = []
    for name in dict.fromkeys(r.pipeline for r in runs):
        rs = sorted((r for r in runs if r.pipeline == name), key=lambda r: r.round)
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        wait = med(lambda r: r.input_wait_pct)
        decodes = [r.cpu_decodes for r in rs if r.complete and r.cpu_decodes is not None]
        row = {"pipeline": name, "rounds": len(rs), "images": rs[0].images,
               "img_s": med(lambda r: r.img_s), "first_round_img_s": rs[0].img_s,
               "step_ms": med(lambda r: r.step_ms), "input_wait_pct": wait,
               "steady_wait_pct": med(lambda r: r.steady_wait_pct),
               "first_batch_s": med(lambda r: r.first_wait_s),
               "cpu_util_pct": med(lambda r: r.cpu_util_pct),
               "input_bound": input_bound_class(wait),
               "cpu_decodes_per_epoch": max(decodes) if decodes else None}
        row.update((extras or {}).get(name, {}))
        out.append(row)
    return out


def _feed(loader: Any) -> Any:
    """The `Feed` of a loader (`DaliBatches` or a `Feed` itself)."""
    return getattr(loader, "feed", loader)


def _epoch_count(loader: Any) -> int:
    """Epochs the loader has finished (recorded in ``epoch_stats``)."""
    return len(loader.epoch_stats)


def new_cpu_decodes(loader: Any, before: int, wait_s: float = 2.0) -> int | None:
    """CPU decodes of the epoch that finished after ``before`` epochs were recorded.

    The epoch's tally is recorded when its last item is released, which may trail the last batch
    by a moment: polls up to ``wait_s``. None when no new epoch was recorded.
    """
    deadline = time.monotonic() + wait_s
    while True:
        stats = loader.epoch_stats
        if len(stats) > before:
            return int(stats[-1].get("cpu_decodes", 0))
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _cache_sizes(loader: Any) -> dict[str, Any]:
    """A cached loader's cache bytes: per image, and against the source files' bytes (local
    sizes, or gs:// listing sizes)."""
    feed = _feed(loader)
    paths = feed.index.paths
    source = feed.source
    entries = source.cache.stats().bytes  # the entries under v1/objects
    src_bytes = sum(source.size(p) for p in paths)
    return {"cache_bytes": entries, "source_bytes": src_bytes,
            "cache_bytes_per_image": entries / len(paths) if paths else None,
            "source_bytes_per_image": src_bytes / len(paths) if paths else None,
            "cache_bytes_vs_source": entries / src_bytes if src_bytes else None}


def png_decoder_list(png_decoder: str | Sequence[str] | None) -> list[str | None]:
    """The loader rows' PNG decoders: [None] (the default), or the distinct names given.

    Raises:
        ValueError: on a name other than "wuffs" or "libpng".
    """
    if png_decoder is None:
        return [None]
    names = [png_decoder] if isinstance(png_decoder, str) else list(png_decoder)
    bad = [n for n in names if n not in PNG_DECODER_CHOICES]
    if bad or not names:
        raise ValueError('png_decoder must be None (the plan\'s default), "wuffs", "libpng" '
                         f"or a list of them. Received: png_decoder={png_decoder!r}")
    return list(dict.fromkeys(names))


def _pipelines(source: str, batch_size: int, image_size: Sequence[int],
               cache_dir: str | None, include: Sequence[str] | None,
               ready_dir: Callable[[str], str] | None = None,
               png_decoder: str | Sequence[str] | None = None
               ) -> tuple[dict[str, Any], dict[str, str], list[Any], dict[str, str],
                          dict[str, Callable[[str], Any]]]:
    """Builds the pipelines; returns (name -> iterable, name -> skip reason, closers,
    name -> the PNG decoder it runs: "libpng", "wuffs", cached name -> a function that
    builds the same row over a given empty cache folder: its fills timed).

    ``ready_dir(dev)`` is the cache folder of the ``loader-{dev}-cached`` row (default: a
    subfolder of ``cache_dir``, which must then be given). With several ``png_decoder`` names
    each loader row runs once per decoder, its name suffixed (``loader-cpu-libpng``); ``include``
    matches either name.
    """
    from dali_loader.tools.baselines import seed_pipeline, tuned_pipeline

    decoders = png_decoder_list(png_decoder)
    pipes: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    closers: list[Any] = []
    used: dict[str, str] = {}
    fresh: dict[str, Callable[[str], Any]] = {}
    want = lambda n: include is None or n in include  # noqa: E731
    if want("seed"):
        pipes["seed"] = seed_pipeline(source, batch_size=batch_size, image_size=image_size)[0]
        used["seed"] = "libpng"  # tf.io.decode_png
    if want("tuned"):
        pipes["tuned"] = tuned_pipeline(source, batch_size=batch_size, image_size=image_size,
                                        seed=0)
        used["tuned"] = "libpng"
    if include is not None and "decode-bound" in include:
        pipes["decode-bound"] = decode_bound_dataset(source, batch_size)
        used["decode-bound"] = "libpng"  # tf.io.decode_image
    if ready_dir is None and cache_dir is not None:
        ready_dir = lambda dev: os.path.join(cache_dir, f"{dev}-cached")  # noqa: E731
    devices = ["cpu"] + (["gpu"] if probes.dali_gpus() > 0 else [])
    # loader-dali: the CPU with decoder="dali", only when named (it is not the default path).
    paths = devices[:1] + (["dali"] if any(n.startswith("loader-dali") for n in include or ())
                           else []) + devices[1:]
    for dev in paths:
        device, decoder = ("cpu", "dali") if dev == "dali" else (dev, None)
        for png in decoders:
            tag = f"{dev}-{png}" if len(decoders) > 1 else dev
            for base, ready in ((f"loader-{dev}", False), (f"loader-{dev}-cached", True)):
                name = base.replace(f"loader-{dev}", f"loader-{tag}")
                if not (want(name) or want(base) or want("loader")):
                    continue
                if ready and ready_dir is None:
                    skipped[name] = "no cache folder given"
                    continue
                try:
                    from dali_loader.api import open_dataset

                    # What image_dataset_from_directory builds: PNGs decoded by
                    # `png_decoder`, the resize by TF's kernels on the CPU, DALI on the
                    # GPU and in loader-dali; the loader does the I/O either way. Cached:
                    # through the GPU-ready cache, in its own folder.
                    where = (ready_dir(tag) if ready else
                             None if cache_dir is None else os.path.join(cache_dir, tag))

                    def build(where, device=device, decoder=decoder, ready=ready, png=png):
                        return open_dataset(source, batch_size=batch_size,
                                            image_size=tuple(image_size), shuffle=True, seed=0,
                                            device=device, decoder=decoder, cache_dir=where,
                                            gpu_ready=ready, png_decoder=png)

                    loader = build(where)
                    if ready:
                        fresh[name] = build
                    # The plan's PNG decoder (a cached row's: the one that fills its cache).
                    used[name] = loader.loader.plan.png_decoder.value
                except Exception as exc:  # a missing loader or device must not kill the others
                    used.pop(name, None)
                    skipped[name] = f"{type(exc).__name__}: {exc}"
                    logger.warning("Skipping %s: %s", name, skipped[name])
                    continue
                pipes[name] = loader
                closers.append(loader.loader)
    if "gpu" not in devices:
        for png in decoders:
            tag = f"gpu-{png}" if len(decoders) > 1 else "gpu"
            skipped[f"loader-{tag}"] = "no GPU visible"
            if want("loader-gpu-cached") or want(f"loader-{tag}-cached") or want("loader"):
                skipped[f"loader-{tag}-cached"] = "no GPU visible"
    return pipes, skipped, closers, used, fresh


def run_bench(source: str, *, step_time: float = 0.0, batch_size: int = 128,
              image_size: Sequence[int] = (244, 244), rounds: int = 2,
              max_batches: int | None = None, cache_dir: str | None = None,
              include: Sequence[str] | None = None, progress: bool = True,
              png_decoder: str | Sequence[str] | None = None) -> dict[str, Any]:
    """Runs every pipeline ``rounds`` times, alternating (order reversed on odd rounds).

    ``png_decoder``: the loader rows' PNG decoder (None: libpng, the loader's default),
    or several ("wuffs", "libpng"): each loader row once per decoder.

    Returns:
        A JSON-ready dict: settings, every run, the per-pipeline summary (with each row's
        ``png_decoder``) and skipped rows.
    """
    positive_int("rounds", rounds)
    positive_int("max_batches", max_batches, allow_none=True)
    png_decoder_list(png_decoder)  # checked before any pipeline is built
    tmps: list[tempfile.TemporaryDirectory] = []

    def temp_dir(prefix: str) -> str:
        tmps.append(tempfile.TemporaryDirectory(prefix=prefix))
        return tmps[-1].name

    if cache_dir is None and str(source).startswith("gs://"):
        cache_dir = temp_dir("dali-bench-cache-")
    ready_dir = ((lambda dev: temp_dir(f"dali-bench-ready-{dev}-")) if cache_dir is None else
                 (lambda dev: os.path.join(cache_dir, f"{dev}-cached")))
    runs: list[RunStats] = []
    extras: dict[str, dict[str, Any]] = {}
    closers: list[Any] = []
    try:
        pipes, skipped, closers, used, fresh = _pipelines(
            source, batch_size, image_size, cache_dir, include, ready_dir, png_decoder)
        fills: dict[str, list[float]] = {}
        formats = sample_formats(source)
        for name in pipes:
            extras[name] = {"png_decoder": used[name],
                            "decoder": decoder_name(formats, used[name])}
        for name in [n for n in pipes if n.endswith("-cached")]:
            try:
                extras[name].update(_fill(name, pipes[name], progress))
            except Exception as exc:  # a failed fill must not kill the other rows
                skipped[name] = f"filling its cache failed: {type(exc).__name__}: {exc}"
                logger.warning("Skipping %s: %s", name, skipped[name])
                loader = pipes.pop(name).loader
                extras.pop(name)
                loader.close()
                closers.remove(loader)
        for r in range(rounds):
            order = list(pipes) if r % 2 == 0 else list(pipes)[::-1]
            for name in order:
                bar = _bar(progress, f"round {r + 1}/{rounds} {name}", max_batches or
                           _safe_len(pipes[name]))
                loader = getattr(pipes[name], "loader", None)
                before = _epoch_count(loader) if loader is not None else 0
                stats = timed_epoch(name, pipes[name], step_time, max_batches, r,
                                    on_batch=bar.update if bar is not None else None)
                if bar is not None:
                    bar.close()
                if stats.complete:
                    # seed and tuned decode every image on the CPU; the loader counts its own.
                    stats.cpu_decodes = (stats.images if loader is None else
                                         new_cpu_decodes(loader, before))
                logger.info("round %d %-17s %7.1f img/s  wait %4.1f%%  cpu %3.0f%%", r + 1,
                            name, stats.img_s, stats.input_wait_pct, stats.cpu_util_pct)
                runs.append(stats)
                if name in fresh:
                    try:
                        fills.setdefault(name, []).append(
                            _fresh_fill(name, fresh[name], step_time, r, progress))
                    except Exception as exc:  # noqa: BLE001 - the timed rows stand without it
                        logger.warning("Could not time a fresh fill of %s: %s: %s", name,
                                       type(exc).__name__, exc)
        for name, rates in fills.items():
            if rates:
                extras[name].update(fill_img_s=statistics.median(rates),
                                    fill_rounds_img_s=rates)
        for name in [n for n in pipes if n.endswith("-cached")]:
            extras[name].update(_cache_sizes(pipes[name].loader.engine))
    finally:
        for c in closers:
            c.close()
        for t in tmps:
            t.cleanup()
    return {"source": str(source), "step_time": step_time, "batch_size": batch_size,
            "image_size": list(image_size), "rounds": rounds, "max_batches": max_batches,
            "png_decoder": png_decoder, "formats": formats,
            "cores": os.cpu_count() or 1, "gpu": probes.dali_gpus() > 0,
            "runs": [r.to_dict() for r in runs], "summary": summarize(runs, extras),
            "skipped": skipped}


def decode_bound_dataset(source: str, batch_size: int) -> Any:
    """The ``decode-bound`` row: ``tf.io.decode_image`` alone over every image's bytes, read
    into memory first (no read, no resize), in a parallel tf.data map on all cores; yields
    batches of shapes. Raises FileNotFoundError when ``source`` holds no image."""
    import tensorflow as tf

    from dali_loader.tools.diagnose import list_objects_raw, make_fetcher

    fetch = make_fetcher(source)
    with ThreadPoolExecutor(max_workers=16) as pool:
        blobs = list(pool.map(fetch, [p for p, _ in list_objects_raw(source)]))
    if not blobs:
        raise FileNotFoundError(f"No image files under {source}")
    return tf.data.Dataset.from_tensor_slices(blobs).map(
        lambda b: tf.shape(tf.io.decode_image(b, channels=3, expand_animations=False))[:1],
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).batch(batch_size).prefetch(2)


def sample_formats(source: str, sample: int = 32, seed: int = 0) -> dict[str, int] | None:
    """The formats of up to `sample` of `source`'s files (format -> count; None when they
    cannot be read): what the rows' decoders are named for."""
    from dali_loader.tools.diagnose import list_objects_raw, make_fetcher

    try:
        files = [p for p, _ in list_objects_raw(source)]
        picked = random.Random(seed).sample(files, min(sample, len(files)))
        fetch = make_fetcher(source)
        with ThreadPoolExecutor(max_workers=16) as pool:
            return format_counts(pool.map(fetch, picked))
    except Exception as exc:  # noqa: BLE001 - the names fall back to the PNG decoder's
        logger.warning("Could not sample the formats of %s: %s", source, exc)
        return None


def _fresh_fill(name: str, build: Callable[[str], Any], step_time: float, round_index: int,
                progress: bool) -> float:
    """A cached row's filling epoch, timed: the row built over a fresh, empty cache
    folder (removed after), its first epoch. Returns its images/s."""
    with tempfile.TemporaryDirectory(prefix="dali-bench-fill-") as folder:
        dataset = build(folder)
        try:
            bar = _bar(progress, f"round {round_index + 1} fill {name}", _safe_len(dataset))
            stats = timed_epoch(name, dataset, step_time, None, round_index,
                                on_batch=bar.update if bar is not None else None)
            if bar is not None:
                bar.close()
        finally:
            dataset.loader.close()
    logger.info("round %d %-17s %7.1f img/s  (filling a fresh cache)", round_index + 1, name,
                stats.img_s)
    return stats.img_s


def _fill(name: str, dataset: Any, progress: bool) -> dict[str, Any]:
    """One whole, untimed-by-the-rounds epoch of a cached row: fills its cache.

    Returns its ``fill_img_s`` (no step; the rounds' fresh fills replace it) and
    ``fill_cpu_decodes`` (the files it decoded).
    """
    loader = dataset.loader
    before = _epoch_count(loader)
    bar = _bar(progress, f"fill {name}", _safe_len(dataset))
    stats = timed_epoch(name, dataset, 0.0, None, -1,
                        on_batch=bar.update if bar is not None else None)
    if bar is not None:
        bar.close()
    decodes = new_cpu_decodes(loader, before)
    logger.info("fill    %-17s %7.1f img/s  %s CPU decodes", name, stats.img_s,
                "?" if decodes is None else decodes)
    return {"fill_img_s": stats.img_s, "fill_cpu_decodes": decodes}


def _safe_len(x: Any) -> int | None:
    try:
        n = len(x)
        return int(n) if n >= 0 else None
    except Exception:
        return None


def _bar(enabled: bool, desc: str, total: int | None):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="batch", leave=False, disable=None)  # off if no TTY


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    """``value`` formatted, or blank when missing."""
    return "" if value is None else f"{value:{spec}}{suffix}"


def results_markdown(res: dict[str, Any]) -> str:
    """The summary as a Markdown table."""
    lines = ["| pipeline | decoder | images/s | first round images/s | step time (ms) | "
             "input wait | reading | wait after 1st batch | 1st batch wait (s) | "
             "CPU utilisation | CPU decodes/epoch | cache KB/image | cache / source bytes |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for s in res["summary"]:
        per_image = s.get("cache_bytes_per_image")
        png = s.get("png_decoder")
        name = s.get("decoder") or (png and decoder_name(res.get("formats"), png)) or ""
        lines.append(f"| {s['pipeline']} | {name} | "
                     f"{s['img_s']:.1f} | {s['first_round_img_s']:.1f} | "
                     f"{s['step_ms']:.0f} | {s['input_wait_pct']:.1f}% | {s['input_bound']} | "
                     f"{s.get('steady_wait_pct', float('nan')):.1f}% | "
                     f"{s.get('first_batch_s', float('nan')):.2f} | {s['cpu_util_pct']:.0f}% | "
                     f"{_fmt(s.get('cpu_decodes_per_epoch'), '.0f')} | "
                     f"{_fmt(None if per_image is None else per_image / 1024, '.1f')} | "
                     f"{_fmt(s.get('cache_bytes_vs_source'), '.2f', 'x')} |")
    base = {s["pipeline"]: s["img_s"] for s in res["summary"]}
    note = (f"\n{res['cores']} cores, batch {res['batch_size']}, image size "
            f"{res['image_size'][0]}x{res['image_size'][1]}, synthetic step "
            f"{res['step_time']:g} s/batch, {res['rounds']} alternating rounds (median).")
    for name in base:
        if name.startswith("loader") and base.get("seed"):
            note += f" {name}/seed = {base[name] / base['seed']:.2f}x."
    for name in base:
        if name != "decode-bound" and base.get("decode-bound"):
            note += f" {name}/decode-bound = {base[name] / base['decode-bound']:.2f}."
    for s in res["summary"]:
        name = s["pipeline"]
        if not name.endswith("-cached"):
            continue
        plain = base.get(name[: -len("-cached")])
        if plain:
            note += f" {name}/{name[: -len('-cached')]} = {base[name] / plain:.2f}x."
        if s.get("fill_img_s") is not None:
            rounds = s.get("fill_rounds_img_s") or []
            note += (f" {name} times cached epochs: its cache was filled first by an untimed "
                     "epoch" + ("" if s.get("fill_cpu_decodes") is None else
                                f" ({s['fill_cpu_decodes']} CPU decodes)")
                     + f"; a filling epoch ran at {s['fill_img_s']:.1f} img/s ("
                     + (f"median of {len(rounds)}, one per round in a fresh cache folder"
                        if rounds else "that epoch")
                     + (f"; {s['fill_img_s'] / plain:.2f}x {name[: -len('-cached')]}"
                        if plain else "") + ").")
        if s.get("cache_bytes_per_image") is not None and s.get("source_bytes_per_image"):
            note += (f" Its cache holds {s['cache_bytes_per_image'] / 1024:.1f} KB per image "
                     f"against {s['source_bytes_per_image'] / 1024:.1f} KB per source file.")
    if any(s["pipeline"].startswith("loader-gpu") and s["pipeline"].endswith("-cached")
           for s in res["summary"]):
        note += (" loader-gpu-cached reads compact entries, decoded by the native operator on "
                 "DALI's CPU threads; PNGs are never decoded on the GPU.")
    decoders = {s["pipeline"]: s.get("png_decoder") for s in res["summary"]
                if s["pipeline"].startswith("loader") and s.get("png_decoder")}
    if decoders:
        asked = res.get("png_decoder")
        which = " and ".join(dict.fromkeys(DECODER_NAMES.get(d, d) for d in decoders.values()))
        if len(set(decoders.values())) > 1:
            which += ", as their PNG decoder column says"
        note += (" PNG decoder: seed and tuned decode with libpng (tf.io.decode_png); the loader "
                 "rows with " + which
                 + (" (png_decoder's default: the native decoder where built, else libpng, "
                    "each epoch; Wuffs for cache fills)"
                    if asked is None else
                    f" (--png-decoder {asked if isinstance(asked, str) else ' '.join(asked)})")
                 + "; a -cached row's decoder fills its cache.")
        for dev in ("cpu", "gpu"):
            w, lp = base.get(f"loader-{dev}-wuffs"), base.get(f"loader-{dev}-libpng")
            if w and lp:
                note += f" loader-{dev}-wuffs/loader-{dev}-libpng = {w / lp:.2f}x."
    if any("cpu_decodes_per_epoch" in s for s in res["summary"]):
        note += (" CPU decodes/epoch: images decoded on the CPU per timed epoch (seed and tuned "
                 "decode every image; blank: epochs cut short by --batches).")
    for name, why in res.get("skipped", {}).items():
        note += f" {name} not run: {why}."
    return "\n".join(lines) + "\n" + note + "\n"


def plot_throughput(res: dict[str, Any], path: str) -> str:
    """Writes a two-panel bar chart (images/s; input-wait % with the 5/20% lines) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = res["summary"]
    names = [s["pipeline"] for s in summ]
    colors = ["#9e9e9e" if n == "seed" else "#6c8ebf" if n == "tuned" else
              "#3d6b00" if n.endswith("-cached") else "#76b900" for n in names]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    y = range(len(names))
    a1.barh(y, [s["img_s"] for s in summ], color=colors)
    for i, s in enumerate(summ):
        a1.text(s["img_s"], i, f" {s['img_s']:.0f}", va="center")
    a1.set_yticks(list(y), names)
    a1.invert_yaxis()
    a1.set_xlabel("images/s (higher is better)")
    a1.set_xlim(0, max((s["img_s"] for s in summ), default=0) * 1.25 or 1)
    a1.set_title("Throughput")
    a2.barh(y, [s["input_wait_pct"] for s in summ], color=colors)
    for i, s in enumerate(summ):
        a2.text(s["input_wait_pct"], i, f" {s['input_wait_pct']:.0f}%", va="center")
    a2.axvline(5, ls="--", c="orange", lw=1)
    a2.axvline(20, ls="--", c="red", lw=1)
    a2.set_yticks(list(y), names)
    a2.invert_yaxis()
    a2.set_xlim(0, 105)
    a2.set_xlabel("% of step time waiting for input (lower is better)")
    a2.set_title("Input wait\n(dashed: >5% moderately, >20% highly input-bound)", fontsize=10)
    fig.suptitle(f"{res['source']}  |  batch {res['batch_size']}, step {res['step_time']:g} s, "
                 f"{res['cores']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_tensorboard(res: dict[str, Any], logdir: str) -> None:
    """Writes per-round scalars, one run directory per pipeline."""
    import tensorflow as tf

    def scalar(tag: str, value: float, step: int) -> None:
        try:
            tf.summary.scalar(tag, value, step=step)
        except Exception:  # TensorBoard not installed: write the same scalar summary by hand
            from tensorflow.core.framework import summary_pb2

            md = summary_pb2.SummaryMetadata()
            md.plugin_data.plugin_name = "scalars"
            md.data_class = summary_pb2.DATA_CLASS_SCALAR
            tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=md)

    for name in dict.fromkeys(r["pipeline"] for r in res["runs"]):
        writer = tf.summary.create_file_writer(os.path.join(logdir, name))
        with writer.as_default():
            for r in (r for r in res["runs"] if r["pipeline"] == name):
                for key in ("img_s", "step_ms", "input_wait_pct", "cpu_util_pct"):
                    scalar(f"input/{key}", r[key], r["round"])
        writer.flush()
        writer.close()


def write_results(res: dict[str, Any], out_dir: str, tensorboard: str | None = None
                  ) -> dict[str, str]:
    """Writes results.json, results.md and throughput.png to ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f) for k, f in
             (("json", "results.json"), ("md", "results.md"), ("png", "throughput.png"))}
    with open(paths["json"], "w") as f:
        json.dump(res, f, indent=2)
    with open(paths["md"], "w") as f:
        f.write(results_markdown(res))
    plot_throughput(res, paths["png"])
    if tensorboard:
        write_tensorboard(res, tensorboard)
        paths["tensorboard"] = tensorboard
    return paths
