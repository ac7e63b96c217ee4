"""Measure each input stage on a sample of the data and name the one that bounds throughput.

Stages: listing; per-object reads at 1, 8, 32 and 128 requests in flight; PNG decode per core and
on all cores; resize; this loader end to end; and the consumer (a synthetic step standing in for
the GPU). :func:`verdict` is a pure function of those rates: the stage with the lowest images/s
bounds the pipeline. Reads are modelled at two concurrencies: ``cores`` in flight (what a tf.data
``map(..., AUTOTUNE)`` keeps, the seed's pipeline) and the loader's ``max_in_flight``.

Decode and resize are timed in a thread pool of one thread per core. PNG decode is timed twice:
with libpng (TensorFlow's ``tf.io.decode_image``, what a tf.data pipeline like the seed's runs;
Pillow when TF is not installed) and with Wuffs (the native core, ``png_native.decode_png``,
where it is built, else ``pywuffs``' ``png_cpu.decode_png``: exactly TF's pixels, the GIL
released while it decodes; the files it leaves to libpng, and non-PNG files, decoded by libpng
as the loader does). PNG is always decoded on the CPU, DALI's GPU decoder included. The
tf.data-style bounds use libpng; the loader's use the decoder it runs (``png_decoder``: by
default the native core where its TF op is built, else libpng).

When decode bounds the pipeline, a cached epoch of the GPU-ready cache (``gpu_ready=True``) is
timed too: the sample's raw-pixel entries (``formats.ready.encode_raw``, the TF path's form) read
back and resized with TF's kernels (``tf_kernels.decode_ready_like_keras``), on all cores. After
its first epoch the cache does no PNG decode; the advice compares the two rates.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from collections.abc import Callable, Sequence

from dali_loader import probes
from dali_loader.args import positive_int
from dali_loader.index import ALLOWLIST_FORMATS
from dali_loader.plan import Options, Plan, resolve
from dali_loader.storage.urls import parse_url
from dali_loader.tools.decoders import decoder_name, format_counts, sniff_format

logger = logging.getLogger(__name__)

__all__ = ["Measurements", "verdict", "run_diagnose", "format_report", "interp_rate",
           "list_objects_raw", "make_fetcher", "LEVELS"]

LEVELS = (1, 8, 32, 128)


@dataclasses.dataclass
class Measurements:
    """Measured rates (objects or images per second) of every stage."""

    source: str
    num_files: int
    listing_s: float
    cores: int
    sample: int
    mean_object_bytes: float
    latency_p50_s: float
    latency_p90_s: float
    fetch_rates: dict[int, float]  # in-flight requests -> objects/s
    decode_per_core: float
    decode_all_cores: float
    resize_per_core: float
    resize_all_cores: float
    batch_size: int
    step_time: float
    loader_in_flight: int = 64
    loader_rate: float | None = None
    loader_device: str | None = None
    loader_error: str | None = None
    # A cached epoch's decode+resize (GPU-ready cache, raw entries, TF's kernels) on all cores,
    # and the mean entry size; measured when decode bounds the pipeline (None: not measured).
    cached_all_cores: float | None = None
    cached_object_bytes: float | None = None
    cached_form: str = "compact"  # the entries the cached epoch was timed on
    # The PNG decoder this loader runs ("wuffs" or "libpng"; decode_* above are libpng's), the
    # option that picked it (None: the default, libpng), Wuffs' rates (None: not
    # installed), the sampled PNGs and how many of them Wuffs leaves to libpng.
    png_decoder: str = "libpng"
    png_decoder_option: str | None = None
    wuffs_per_core: float | None = None
    wuffs_all_cores: float | None = None
    sample_pngs: int | None = None
    png_fallbacks: int | None = None
    # The sampled files' formats (format -> count; None: not sampled) and, for a mix, the
    # decode rate of each format's files alone on all cores (TF's decoders: libpng for PNG).
    sample_formats: dict[str, int] | None = None
    decode_by_format: dict[str, float] | None = None
    # The loader's plan (`plan.resolve`): field -> {"value", "why"} (None: not resolved).
    plan: dict[str, dict[str, str]] | None = None


def has_pngs(m: Measurements) -> bool:
    """Whether PNGs were sampled (True when the formats are unknown)."""
    return m.sample_formats is None or "PNG" in m.sample_formats


def names(m: Measurements, png_decoder: str = "libpng") -> str:
    """The decoders that run for the sampled files, PNGs by ``png_decoder``."""
    return decoder_name(m.sample_formats, png_decoder)


def interp_rate(fetch_rates: dict[int, float], in_flight: float) -> float:
    """Objects/s at ``in_flight`` requests: linear between measured levels, clamped outside.

    Linear is Little's law below saturation (rate = in flight / latency) and a lower bound above.

    Raises:
        ValueError: when ``fetch_rates`` is empty or ``in_flight`` is not positive.
    """
    if not fetch_rates:
        raise ValueError(f"fetch_rates must not be empty. Received: fetch_rates={fetch_rates}")
    if in_flight <= 0:
        raise ValueError(f"in_flight must be positive. Received: in_flight={in_flight}")
    pts = sorted(fetch_rates.items())
    if in_flight <= pts[0][0]:
        return pts[0][1] * in_flight / pts[0][0]
    for (c0, r0), (c1, r1) in zip(pts, pts[1:]):
        if in_flight <= c1:
            t = (in_flight - c0) / (c1 - c0)
            return r0 + t * (r1 - r0)
    return pts[-1][1]


DECODER_NAMES = {"wuffs": "Wuffs", "libpng": "libpng"}


def _check_decoder(m: Measurements) -> None:
    if m.png_decoder not in DECODER_NAMES:
        raise ValueError('Measurements.png_decoder must be "wuffs" or "libpng". '
                         f"Received: png_decoder={m.png_decoder!r}")
    if m.png_decoder == "wuffs" and not m.wuffs_all_cores:
        raise ValueError('png_decoder="wuffs" needs its measured rate. '
                         f"Received: wuffs_all_cores={m.wuffs_all_cores!r}")


def _cpu_rate(m: Measurements, decoder: str = "libpng") -> float:
    """Decode+resize images/s on all cores with ``decoder`` ("libpng" or "wuffs")."""
    decode = m.wuffs_all_cores if decoder == "wuffs" else m.decode_all_cores
    # Decode and resize share the same cores: their per-image costs add up.
    return 1.0 / (1.0 / decode + 1.0 / m.resize_all_cores)


def _consumer_rate(m: Measurements) -> float:
    return m.batch_size / m.step_time if m.step_time > 0 else math.inf


def stage_rates(m: Measurements, in_flight: float, decoder: str = "libpng") -> dict[str, float]:
    """Images/s each stage could sustain alone, with reads at ``in_flight`` requests and PNGs
    decoded by ``decoder``."""
    return {"storage": interp_rate(m.fetch_rates, in_flight), "decode": _cpu_rate(m, decoder),
            "consumer": _consumer_rate(m)}


def _runs_why(m: Measurements) -> str:
    """Why the loader's decoder is the one that runs: "runs by default", "runs, png_decoder=..."."""
    if m.png_decoder_option is not None:
        return f'runs: png_decoder="{m.png_decoder_option}"'
    return "runs by default"


def _fmt_rate(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{x:,.0f} img/s"


def verdict(m: Measurements) -> dict[str, Any]:
    """Names the bottleneck and gives advice quoting the measured numbers. Pure function.

    ``bottleneck`` is for a tf.data pipeline like the seed's (about one read in flight per core,
    PNGs decoded by libpng); ``bottleneck_with_loader`` is for this loader (``loader_in_flight``
    reads in flight, PNGs decoded by ``m.png_decoder``). ``decode_bounds`` is decode+resize on
    all cores with each decoder (None: not measured).

    Raises:
        ValueError: when ``m.png_decoder`` is unknown, or "wuffs" without its measured rate.
    """
    _check_decoder(m)
    tfd = stage_rates(m, m.cores)
    ldr = stage_rates(m, m.loader_in_flight, m.png_decoder)
    bottleneck = min(tfd, key=tfd.get)
    bottleneck_loader = min(ldr, key=ldr.get)
    expected_tfdata = min(tfd.values())
    expected_loader = min(ldr.values())
    lat_ms = m.latency_p50_s * 1000
    cpu, cons = tfd["decode"], tfd["consumer"]
    step = (f"a {m.step_time * 1000:.0f} ms step per batch of {m.batch_size}"
            if m.step_time > 0 else "no step")
    advice: list[str] = []
    if bottleneck == "storage":
        advice.append(
            f"Storage: {lat_ms:.0f} ms per object; ~{m.cores} reads in flight under AUTOTUNE "
            f"(one per core) caps you at ~{tfd['storage']:,.0f} img/s, while decode+resize could "
            f"do {_fmt_rate(cpu)} and the consumer {_fmt_rate(cons)} ({step}).")
        advice.append(
            f"This loader keeps {m.loader_in_flight} reads in flight "
            f"(measured {ldr['storage']:,.0f} objects/s there): expect ~{expected_loader:,.0f} "
            f"img/s, bounded by {bottleneck_loader}; or prefetch to local disk first with "
            f"`dali-loader prefetch {m.source} --cache-dir DIR` (later epochs read the cache).")
    elif bottleneck == "decode":
        share = 100.0 * cpu / m.resize_all_cores
        advice.append(
            f"Decode: with {names(m)} (tf.data's decoders) decode runs at "
            f"{m.decode_per_core:,.0f} img/s per core, "
            f"{m.decode_all_cores:,.0f} img/s on all {m.cores} cores; with resize "
            f"({share:.0f}% of the CPU time) the CPU delivers ~{cpu:,.0f} img/s, below storage "
            f"({tfd['storage']:,.0f} objects/s) and the consumer ({_fmt_rate(cons)}, {step}).")
        if has_pngs(m):
            advice.append(
                "PNG is always decoded on the CPU (DALI's GPU decoder handles JPEG, not PNG): "
                "use every core (this loader's num_threads defaults to all), move the resize to "
                "the GPU (device='gpu'), store images pre-resized to image_size, or re-encode "
                f"to JPEG so the GPU decodes them. This loader: expect ~{expected_loader:,.0f} "
                "img/s.")
        else:
            advice.append(
                "On a GPU this loader decodes JPEG there (nvJPEG, device='gpu') and resizes "
                "there too; on the CPU use every core (num_threads defaults to all) or store "
                f"images pre-resized to image_size. This loader: expect ~{expected_loader:,.0f} "
                "img/s.")
    else:
        advice.append(
            f"Consumer: {step} is {_fmt_rate(cons)}; input could deliver "
            f"~{min(tfd['storage'], cpu):,.0f} img/s even at {m.cores} reads in flight, so the "
            "step is not waiting for input. Speed up the model (mixed precision, XLA, a larger "
            "batch) rather than the input pipeline.")
    if "decode" in (bottleneck, bottleneck_loader) and has_pngs(m):
        advice.append(_decoder_advice(m, ldr["decode"]))
    lifts = None
    if m.cached_all_cores is not None and "decode" in (bottleneck, bottleneck_loader):
        # The cache is the loader's: against the loader's decoder.
        lifts = m.cached_all_cores > ldr["decode"]
        advice.append(_cache_advice(m, ldr["decode"], cons, lifts))
    if m.loader_rate is not None:
        advice.append(f"Measured this loader end to end ({m.loader_device}, no step): "
                      f"{m.loader_rate:,.0f} img/s.")
    fin = lambda d: {k: (None if math.isinf(v) else v) for k, v in d.items()}  # noqa: E731
    return {"bottleneck": bottleneck, "stage_rates": fin(tfd),
            "bottleneck_with_loader": bottleneck_loader, "stage_rates_with_loader": fin(ldr),
            "expected_tfdata_img_s": expected_tfdata,
            "expected_loader_img_s": None if math.isinf(expected_loader) else expected_loader,
            "cache_lifts_decode": lifts, "png_decoder": m.png_decoder,
            "decode_bounds": {"libpng": cpu,
                              "wuffs": _cpu_rate(m, "wuffs") if m.wuffs_all_cores else None},
            "wuffs_vs_libpng": (m.wuffs_all_cores / m.decode_all_cores if m.wuffs_all_cores
                                else None),
            "advice": advice}


def _decoder_advice(m: Measurements, loader_cpu: float) -> str:
    """Which PNG decoder the loader runs, its bound, and the other one's."""
    if m.png_decoder == "wuffs":
        text = (f"This loader decodes PNGs with Wuffs ({_runs_why(m)}): "
                f"{m.wuffs_all_cores:,.0f} img/s on {m.cores} cores, "
                f"{m.wuffs_all_cores / m.decode_all_cores:.1f}x libpng; with resize "
                f"~{loader_cpu:,.0f} img/s")
        if m.png_fallbacks:
            text += (f"; it leaves {m.png_fallbacks} of the {m.sample_pngs} sampled PNGs to "
                     "libpng (decoded exactly as TF does, at libpng's speed)")
        return text + "."
    if m.wuffs_all_cores:
        return (f"This loader decodes PNGs with libpng ({_runs_why(m)}): Wuffs "
                f"(png_decoder=\"wuffs\"; the default for gpu_ready fills) decodes "
                f"{m.wuffs_all_cores:,.0f} img/s on {m.cores} cores "
                f"({m.wuffs_all_cores / m.decode_all_cores:.1f}x libpng; with resize "
                f"~{_cpu_rate(m, 'wuffs'):,.0f} img/s), with exactly TF's pixels"
                + ("" if m.png_decoder_option == "libpng" else
                   "; by default the loader runs it where its TF op is built "
                   "(`pip install --no-build-isolation`, or `make install` in a checkout, "
                   "builds it)") + " (docs/png_cpu.md).")
    return ("This loader decodes PNGs with libpng: Wuffs (exactly TF's pixels; the default for "
            "gpu_ready fills) is not built here; `pip install --no-build-isolation` (in a "
            "checkout, `make install`) builds the native PNG core "
            "(docs/png_cpu.md).")


def _cache_advice(m: Measurements, cpu: float, cons: float, lifts: bool) -> str:
    """The GPU-ready cache's sentence: a cached epoch's decode+resize rate against the PNG's."""
    cached = m.cached_all_cores
    size = ""
    if m.cached_object_bytes and m.mean_object_bytes:
        size = (f"; its {m.cached_form} entries take "
                f"{m.cached_object_bytes / m.mean_object_bytes:.1f}x "
                f"the source's bytes on local disk")
    if m.cached_object_bytes and m.num_files:
        size += (f", about {_fmt_bytes(m.cached_object_bytes * m.num_files)} for all "
                 f"{m.num_files:,} files (bound it with cache_max_bytes)")
    text = (f"The GPU-ready cache (gpu_ready=True, cache_dir=DIR; fill it ahead with "
            f"`dali-loader prefetch {m.source} --gpu-ready --cache-dir DIR`) removes the "
            f"decode from every epoch after the first, on the CPU and on the GPU path alike: "
            f"measured here {cached:,.0f} img/s for a cached epoch's decode+resize against "
            f"{cpu:,.0f} img/s with decode by {names(m, m.png_decoder)}, on "
            f"{m.cores} cores{size}.")
    if not lifts:
        return text + (" It would not lift the decode bound here (a cached epoch still "
                       "resizes every image, and that dominates): store images pre-resized "
                       "instead.")
    text += f" That lifts the decode bound {cached / cpu:.1f}x"
    if cons < cached:
        text += f"; the consumer ({_fmt_rate(cons)}) would then bound"
    return text + "."


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e3:,.0f} KB"


# ----------------------------------------------------------------------------- measuring
def list_objects_raw(source: str) -> list[tuple[str, int]]:
    """Lists image files (Keras's allowlist) under ``source`` as (path or gs:// URL, size)."""
    source = str(source).rstrip("/")
    if source.startswith("gs://"):
        from dali_loader.tools.baselines import gcs_client

        _, bucket, prefix = parse_url(source)
        blobs = gcs_client().list_blobs(bucket, prefix=f"{prefix}/" if prefix else "")
        return [(f"gs://{bucket}/{b.name}", int(b.size or 0)) for b in blobs
                if b.name.lower().endswith(ALLOWLIST_FORMATS)]
    if not os.path.isdir(source):
        raise FileNotFoundError(f"No such directory: {source}")
    out = []
    for dirpath, _, files in os.walk(source):
        for f in files:
            if f.lower().endswith(ALLOWLIST_FORMATS):
                p = os.path.join(dirpath, f)
                out.append((p, os.path.getsize(p)))
    return sorted(out)


def make_fetcher(source: str) -> Callable[[str], bytes]:
    """A thread-safe ``fetch(path_or_url) -> bytes``: one GET per object, or one file read."""
    if str(source).startswith("gs://"):
        from dali_loader.tools.baselines import gcs_get

        return gcs_get

    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()
    return read


def _fetch_level(fetch, items: Sequence[str], in_flight: int) -> tuple[float, list[float]]:
    """Objects/s with ``in_flight`` concurrent requests over ``items``; also each latency."""
    lat: list[float] = []

    def one(p: str) -> None:
        t = time.perf_counter()
        fetch(p)
        lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        list(pool.map(one, items))
    return len(items) / (time.perf_counter() - t0), lat


def _kernels(image_size: Sequence[int]):
    """(decode, resize) callables: TF's kernels (the loader's CPU path), else Pillow."""
    size = (int(image_size[0]), int(image_size[1]))
    try:
        import tensorflow as tf

        def decode(data: bytes):
            return tf.io.decode_image(data, channels=3, expand_animations=False)

        return decode, lambda im: tf.image.resize(im, size)
    except ImportError:
        from PIL import Image

        def decode_pil(data: bytes):
            im = Image.open(io.BytesIO(data)).convert("RGB")
            im.load()
            return im

        return decode_pil, lambda im: im.resize(size[::-1], Image.BILINEAR)


def _wuffs_png() -> Callable[[bytes, int], Any] | None:
    """Wuffs' ``decode_png(data, channels)`` as the loader runs it: the native core where it
    is built (``png_native``, what the TF op and the DALI operator run), else pywuffs
    (``png_cpu``); None when neither is here."""
    from dali_loader.decode import png_cpu, png_native

    if png_native.available():
        return png_native.decode_png
    return png_cpu.decode_png if png_cpu.available() else None


def _wuffs_kernel(libpng: Callable[[bytes], Any],
                  wuffs_png: Callable[[bytes, int], Any]) -> Callable[[bytes], Any]:
    """The loader's PNG decode with Wuffs (``png_stage.KerasPixels``' rule): a PNG by
    ``wuffs_png``, what it leaves (a ``Fallback``) and other files by ``libpng``."""
    from dali_loader.formats import png

    def decode(data: bytes):
        if data[:8] == png.SIGNATURE:
            px = wuffs_png(data, 3)
            if not isinstance(px, png.Fallback):
                return px
        return libpng(data)

    return decode


def _png_counts(blobs: Sequence[bytes], wuffs_png: Callable[[bytes, int], Any]
                ) -> tuple[int, int]:
    """(PNGs among ``blobs``, those Wuffs leaves to libpng)."""
    from dali_loader.formats import png

    pngs = [b for b in blobs if b[:8] == png.SIGNATURE]
    return len(pngs), sum(isinstance(wuffs_png(b, 3), png.Fallback) for b in pngs)


def _check_decoder_option(png_decoder: str | None) -> None:
    """diagnose times libpng and Wuffs: ``png_decoder`` is None, "wuffs" or "libpng"."""
    if png_decoder not in (None, "wuffs", "libpng"):
        raise ValueError('png_decoder must be None (the native decoder where it is built, else '
                         'libpng), "wuffs" or "libpng". '
                         f"Received: png_decoder={png_decoder!r}")


def loader_plan(source: str, paths: Sequence[str], *, device: str | None = None,
                png_decoder: str | None = None, batch_size: int = 32,
                max_in_flight: int = 64) -> Plan:
    """The plan of the loader `diagnose` times (`open_dataset`'s, on this machine and
    `source`, whose listed files are `paths`): which path runs, and why."""
    options = Options(device=device, png_decoder=png_decoder, batch_size=batch_size,
                      max_in_flight=max_in_flight, seed=0)
    return resolve(options, probes.environment(probes.source_kind(source), paths))


def plan_table(plan: Plan) -> dict[str, dict[str, str]]:
    """The plan for the report and the JSON: field -> {"value", "why"}, plus its notes."""
    out = {name: {"value": value, "why": why} for name, value, why in plan.rows()}
    out["facts"] = {"value": "", "why": ", ".join(f"{k}={getattr(v, 'value', v)}"
                                                   for k, v in plan.facts.items())}
    if plan.notes:
        out["notes"] = {"value": str(len(plan.notes)), "why": " | ".join(plan.notes)}
    try:
        import tensorflow as tf
    except ImportError:
        return out
    from dali_loader import tf_internals

    value, why = tf_internals.summary(tf)  # TF's private APIs in use (their gains: docs)
    out["tf_private"] = {"value": value, "why": why}
    return out


def _cached_kernel(image_size: Sequence[int]):
    """``(encode, read, form)``: a cached entry of decoded pixels in the form `gpu_ready=True`
    writes here, and what a cached epoch does with it on the TF path (a compact entry decoded
    by the native TF op, or raw pixels read back; then resized like Keras); None without TF."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    import numpy as np

    from dali_loader.decode import tf_png
    from dali_loader.decode.spec import ImageSpec
    from dali_loader.decode.tf_kernels import decode_ready_like_keras, resize_like_keras
    from dali_loader.formats import compact
    from dali_loader.formats.ready import encode_raw

    spec = ImageSpec(int(image_size[0]), int(image_size[1]))
    sig = [tf.TensorSpec((), tf.string)]
    if compact.available() and tf_png.available():
        def read_compact(data):
            flat = tf.io.decode_raw(data, tf.uint8)
            hwc = tf.cast(tf.bitcast(tf.reshape(flat[8:20], (3, 4)), tf.uint32), tf.int32)
            total = tf.reduce_prod(tf.cast(hwc, tf.int64))
            pixels, *_ = tf_png.decode_entries(flat, tf.stack([0, tf.size(flat, tf.int64)]),
                                              tf.zeros([1], tf.int64), hwc[None], total)
            img = tf.reshape(pixels, hwc)
            img.set_shape((None, None, spec.channels))
            return resize_like_keras(img, spec, tf)

        read = tf.function(read_compact, autograph=False, input_signature=sig)
        return (lambda pixels: bytes(compact.encode(np.asarray(pixels, np.uint8)))), read, \
            "compact"
    read = tf.function(lambda data: decode_ready_like_keras(data, spec, tf), autograph=False,
                       input_signature=sig)
    return (lambda pixels: encode_raw(np.asarray(pixels, np.uint8))), read, "raw-pixel"


def _timed_map(fn, items: Sequence, workers: int, budget_s: float) -> float:
    """Items/s of ``fn`` over ``items`` (repeated until ``budget_s``) with ``workers`` threads."""
    done, t0 = 0, time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while True:
            list(pool.map(fn, items))
            done += len(items)
            if time.perf_counter() - t0 >= budget_s:
                break
    return done / (time.perf_counter() - t0)


def _timed_alternating(fns: Sequence[Callable], items: Sequence, workers: int,
                       budget_s: float) -> list[float]:
    """Items/s of each of ``fns`` (``budget_s`` each): with several, in alternating halves
    (A B B A) and the better half of each, so that a busy machine's swings fall on both."""
    if len(fns) == 1:
        return [_timed_map(fns[0], items, workers, budget_s)]
    rates: list[list[float]] = [[] for _ in fns]
    for order in (range(len(fns)), reversed(range(len(fns)))):
        for i in order:
            rates[i].append(_timed_map(fns[i], items, workers, budget_s / 2))
    return [max(r) for r in rates]


def _measure_loader(source: str, batch_size: int, image_size: Sequence[int], max_batches: int,
                    max_in_flight: int, device: str | None, png_decoder: str | None = None
                    ) -> tuple[float | None, str | None, str | None]:
    """End-to-end images/s of this loader (cold cache for gs://), excluding the first batch."""
    try:
        from dali_loader.api import open_dataset
    except ImportError as exc:
        return None, None, f"loader unavailable: {exc}"
    with tempfile.TemporaryDirectory(prefix="dali-diag-cache-") as cache:
        try:  # the dataset image_dataset_from_directory builds
            dataset = open_dataset(source, batch_size=batch_size, image_size=tuple(image_size),
                                   shuffle=True, seed=0, device=device,
                                   max_in_flight=max_in_flight, cache_dir=cache,
                                   png_decoder=png_decoder)
        except Exception as exc:  # report, don't crash the diagnosis
            return None, None, f"{type(exc).__name__}: {exc}"
        loader = dataset.loader
        dev = loader.device
        try:
            for _ in dataset.take(2):  # warm-up: a process's first epoch runs slow
                pass
            n, t0, first = 0, None, 0
            for i, (images, _labels) in enumerate(dataset):
                if i == 0:
                    t0, first = time.perf_counter(), len(images)
                    continue
                n += len(images)
                if i >= max_batches:
                    break
            if t0 is None:
                return None, str(dev), "loader produced no batch"
            dt = time.perf_counter() - t0
            if n == 0:  # a single batch: fall back to counting it
                return None, str(dev), f"only one batch ({first} images); use a larger --sample"
            return n / dt, str(dev), None
        finally:
            loader.close()


def run_diagnose(source: str, *, step_time: float = 0.0, batch_size: int = 32,
                 image_size: Sequence[int] = (256, 256), sample: int = 64,
                 levels: Sequence[int] = LEVELS, measure_loader: bool = True,
                 loader_batches: int = 8, loader_in_flight: int = 64,
                 device: str | None = None, budget_s: float = 1.0,
                 seed: int = 0, png_decoder: str | None = None) -> Measurements:
    """Measures every stage on a random sample of ``source``.

    Args:
        source: a local folder, a FUSE mount or ``gs://bucket/prefix``.
        step_time: seconds per batch of the synthetic consumer step (0 = none).
        batch_size: the training batch size.
        image_size: (height, width) images are resized to.
        sample: number of objects to time reads, decode and resize on.
        levels: concurrencies (requests in flight) to time reads at.
        measure_loader: also run this loader end to end.
        loader_batches: batches to time the loader over.
        loader_in_flight: the loader's ``max_in_flight``.
        device: loader device (None = auto).
        budget_s: minimum seconds per decode/resize timing.
        seed: picks the sample.
        png_decoder: the loader's PNG decoder: None (its default: the native core's TF
            op where built, else libpng), "wuffs" or "libpng". Both are timed whenever Wuffs is installed; the loader's
            bounds use this one.

    Returns:
        The :class:`Measurements`.
    """
    if step_time < 0:
        raise ValueError(f"step_time must be >= 0. Received: step_time={step_time}")
    positive_int("batch_size", batch_size)
    positive_int("sample", sample)
    _check_decoder_option(png_decoder)
    if len(image_size) != 2 or min(image_size) <= 0:
        raise ValueError(f"image_size must be (height, width) > 0. Received: image_size={image_size}")
    cores = os.cpu_count() or 1
    t0 = time.perf_counter()
    files = list_objects_raw(source)
    listing_s = time.perf_counter() - t0
    if not files:
        raise ValueError(f"No images found in {source}. Received: source={source!r}")
    all_levels = sorted((set(levels) | {cores, loader_in_flight}) - {1})
    counts = [16] + [max(2 * c, 16) for c in all_levels]
    # Every level reads objects no earlier level read (while the listing lasts), so a FUSE or
    # page cache does not flatter the later levels.
    pool = [p for p, _ in random.Random(seed).sample(files, min(len(files), sum(counts) + 4))]
    cursor = 0

    def take(n: int) -> list[str]:
        nonlocal cursor
        out = [pool[(cursor + i) % len(pool)] for i in range(n)]
        cursor += n
        return out

    plan = loader_plan(source, [p for p, _ in files], device=device, png_decoder=png_decoder,
                       batch_size=batch_size, max_in_flight=loader_in_flight)
    runs = plan.png_decoder.value  # the PNG decoder the loader runs (its plan's)
    fetch = make_fetcher(source)
    logger.info("Listed %d files in %.2f s; timing reads on %d", len(files), listing_s, len(pool))
    for p in take(min(4, len(pool))):  # warm-up: connections, credentials
        fetch(p)
    rate1, lat = _fetch_level(fetch, take(16), 1)
    fetch_rates = {1: rate1}
    for c, n in zip(all_levels, counts[1:]):
        fetch_rates[c], _ = _fetch_level(fetch, take(n), c)
        logger.info("%d in flight: %.0f objects/s", c, fetch_rates[c])
    paths = pool[: min(sample, len(pool))]
    with ThreadPoolExecutor(max_workers=16) as pool_ex:
        blobs = list(pool_ex.map(fetch, paths))
    mean_bytes = statistics.fmean(len(b) for b in blobs)

    decode, resize = _kernels(image_size)
    decoders = [decode]
    formats = format_counts(blobs)
    pngs = fallbacks = None
    wuffs_png = _wuffs_png()
    if wuffs_png is not None:
        pngs, fallbacks = _png_counts(blobs, wuffs_png)  # also creates this thread's decoders
        if pngs:  # Wuffs only decodes PNGs: without any, it would time libpng again
            decoders.append(_wuffs_kernel(decode, wuffs_png))
    (decode_1, *wuffs_1), (decode_n, *wuffs_n) = (
        _timed_alternating(decoders, blobs, workers, budget_s) for workers in (1, cores))
    wuffs_1, wuffs_n = (wuffs_1 or [None])[0], (wuffs_n or [None])[0]
    if pngs == 0:  # nothing for Wuffs: with png_decoder="wuffs", TF's decoders run all
        wuffs_1, wuffs_n = decode_1, decode_n
    by_format = None
    if len(formats) > 1:  # a mix: each format's bound measured on its own files
        by_format = {f: _timed_map(decode, [b for b in blobs if sniff_format(b) == f], cores,
                                   budget_s / 2) for f in formats}
    images = [decode(b) for b in blobs]
    resize_1 = _timed_map(resize, images, 1, budget_s / 2)
    resize_n = _timed_map(resize, images, cores, budget_s / 2)
    logger.info("decode (libpng) %.0f/%.0f img/s, resize %.0f/%.0f img/s (1 core/all)",
                decode_1, decode_n, resize_1, resize_n)
    if wuffs_n is not None:
        logger.info("decode (Wuffs) %.0f/%.0f img/s (1 core/all); %d of %d PNGs left to libpng",
                    wuffs_1, wuffs_n, fallbacks, pngs)

    m = Measurements(source=str(source), num_files=len(files), listing_s=listing_s, cores=cores,
                     sample=len(paths), mean_object_bytes=mean_bytes,
                     latency_p50_s=statistics.median(lat),
                     latency_p90_s=sorted(lat)[int(0.9 * (len(lat) - 1))],
                     fetch_rates=fetch_rates, decode_per_core=decode_1, decode_all_cores=decode_n,
                     resize_per_core=resize_1, resize_all_cores=resize_n,
                     batch_size=batch_size, step_time=step_time,
                     loader_in_flight=loader_in_flight, png_decoder=runs,
                     png_decoder_option=png_decoder, wuffs_per_core=wuffs_1,
                     wuffs_all_cores=wuffs_n, sample_pngs=pngs, png_fallbacks=fallbacks,
                     sample_formats=formats, decode_by_format=by_format,
                     plan=plan_table(plan))
    v = verdict(m)
    if "decode" in (v["bottleneck"], v["bottleneck_with_loader"]):
        kernel = _cached_kernel(image_size)
        if kernel is not None:
            encode, read, m.cached_form = kernel
            entries = [encode(im) for im in images]
            read(entries[0])  # trace once, outside the timing
            m.cached_all_cores = _timed_map(read, entries, cores, budget_s / 2)
            m.cached_object_bytes = statistics.fmean(len(e) for e in entries)
            logger.info("cached epoch (GPU-ready cache, %s entries): %.0f img/s on all cores",
                        m.cached_form, m.cached_all_cores)
    if measure_loader:
        m.loader_rate, m.loader_device, m.loader_error = _measure_loader(
            source, batch_size, image_size, loader_batches, loader_in_flight, device, png_decoder)
    return m


def to_json(m: Measurements) -> dict[str, Any]:
    """One JSON-ready object: the measurements, the verdict and the advice."""
    d = dataclasses.asdict(m)
    d["fetch_rates"] = {str(k): v for k, v in m.fetch_rates.items()}
    d["consumer_img_s"] = None if m.step_time <= 0 else m.batch_size / m.step_time
    d.update(verdict(m))
    return d


def format_report(m: Measurements) -> str:
    """A short human-readable table plus the verdict and advice."""
    v = verdict(m)
    rows = [("listing", f"{m.num_files} files in {m.listing_s:.2f} s"),
            ("object latency", f"p50 {m.latency_p50_s * 1000:.1f} ms, p90 "
                               f"{m.latency_p90_s * 1000:.1f} ms, {m.mean_object_bytes / 1e3:.0f} KB")]
    for c, r in sorted(m.fetch_rates.items()):
        rows.append((f"reads, {c} in flight",
                     f"{r:,.0f} objects/s ({r * m.mean_object_bytes / 1e6:,.1f} MB/s)"))
    rows += [(f"decode, {names(m)}", f"{m.decode_per_core:,.0f} img/s per core, "
                                     f"{m.decode_all_cores:,.0f} img/s on {m.cores} cores"),
             *([("decode by format", ", ".join(
                 f"{f} {r:,.0f} img/s" for f, r in m.decode_by_format.items())
                 + f" on {m.cores} cores (each on its own files)")]
               if m.decode_by_format else []),
             *([("decode, Wuffs", _wuffs_row(m))] if has_pngs(m) else []),
             ("resize", f"{m.resize_per_core:,.0f} img/s per core, "
                        f"{m.resize_all_cores:,.0f} img/s on {m.cores} cores"),
             ("decode+resize", _bounds_row(m, v)),
             *([("cached decode+resize",
                 f"{m.cached_all_cores:,.0f} img/s on {m.cores} cores (GPU-ready cache, raw "
                 "entries" + (f" of {m.cached_object_bytes / 1e3:.0f} KB" if m.cached_object_bytes
                              else "") + "; no decode)")]
               if m.cached_all_cores is not None else []),
             ("loader end to end", f"{m.loader_rate:,.0f} img/s ({m.loader_device})"
              if m.loader_rate is not None else f"not measured ({m.loader_error or 'skipped'})"),
             ("consumer", _fmt_rate(_consumer_rate(m)) + (f" ({m.step_time:g} s/batch of "
                                                          f"{m.batch_size})" if m.step_time else
                                                          " (no step)"))]
    w = max(len(a) for a, _ in rows)
    lines = [f"dali-loader diagnose {m.source}", ""]
    lines += [f"  {a:<{w}}  {b}" for a, b in rows]
    bounds = lambda sr: ", ".join(f"{k} {_fmt_rate(x if x is not None else math.inf)}"  # noqa: E731
                                  for k, x in sr.items())
    name = names(m, m.png_decoder)
    lines += ["", f"  stage bounds (img/s), tf.data-style reads ({m.cores} in flight), "
                  f"{names(m)} decode: {bounds(v['stage_rates'])}",
              f"  with this loader ({m.loader_in_flight} in flight), {name} decode: "
              f"{bounds(v['stage_rates_with_loader'])}",
              "", f"bottleneck: {v['bottleneck']}  (with this loader: "
                  f"{v['bottleneck_with_loader']}; "
                  f"{'PNG decoder' if m.sample_formats is None else 'decoder'}: {name})", ""]
    lines += [f"- {a}" for a in v["advice"]]
    if m.plan:
        lines += ["", "plan (which path the loader runs, and why; dali_loader/plan.py):"]
        fields = [(k, d) for k, d in m.plan.items() if k not in ("notes", "facts")]
        kw = max(len(k) for k, _ in fields)
        vw = max(len(d["value"]) for _, d in fields)
        lines += [f"  {k:<{kw}}  {d['value']:<{vw}}  {d['why']}".rstrip() for k, d in fields]
        if "facts" in m.plan:
            lines.append(f"  facts read: {m.plan['facts']['why']}")
        if "notes" in m.plan:
            lines += [f"  note: {n}" for n in m.plan["notes"]["why"].split(" | ")]
    return "\n".join(lines)


def _wuffs_row(m: Measurements) -> str:
    """The report's Wuffs decode row: its rates and the sampled PNGs it leaves to libpng."""
    if m.wuffs_all_cores is None:
        return ("not built (`pip install --no-build-isolation` (in a checkout, `make install`) "
                "builds the native PNG core)")
    text = (f"{m.wuffs_per_core:,.0f} img/s per core, {m.wuffs_all_cores:,.0f} img/s on "
            f"{m.cores} cores")
    if m.sample_pngs is not None:
        text += f"; leaves {m.png_fallbacks or 0} of {m.sample_pngs} sampled PNGs to libpng"
    return text


def _bounds_row(m: Measurements, v: dict[str, Any]) -> str:
    """Both decoders' decode+resize bounds on all cores, and which one the loader runs."""
    b = v["decode_bounds"]
    tag = lambda d: f" ({_runs_why(m)})" if d == m.png_decoder and has_pngs(m) else ""  # noqa: E731
    text = f"{names(m)}{tag('libpng')}: {b['libpng']:,.0f} img/s"
    if b["wuffs"] is not None and has_pngs(m):
        text += (f"; {names(m, 'wuffs')}{tag('wuffs')}: {b['wuffs']:,.0f} img/s "
                 f"({b['wuffs'] / b['libpng']:.2f}x)")
    return text
