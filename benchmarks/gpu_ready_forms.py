"""Lossless forms for the GPU-ready cache, side by side: size, encode and decode speed, exactness.

Over the same photo-like ~500x375 sample PNGs (`dali_loader.tools.sample`), one run, each
candidate form of Keras's decoded pixels (`tf.io.decode_image(png, channels=3,
expand_animations=False)`) is measured for

- bytes / the PNG's bytes (sums over the images),
- encode ms per image on one thread,
- decode images/s on all cores, over in-memory bytes (no file reads):
  TIFF and JPEG 2000 with DALI's CPU decoder (`fn.decoders.image(device="cpu")`, fed by
  `fn.external_source`, batch 32, `num_threads` = cores, the loader's decoder options);
  RAW with TF's kernels as the loader uses them (`tf_kernels.raw_pixels`: `decode_raw` and
  a reshape from the 16-byte header, in a tf.data map with `num_parallel_calls` = cores), and
  with numpy (`ready_forms.decode_raw` plus a copy, a thread pool of cores); RAW+zlib with
  TF's `decode_compressed`; the PNGs themselves with TF's `decode_png` in the same tf.data
  setup (the PNG decode-only bound) and with DALI's CPU decoder,
- exactness: the largest absolute difference of the decoded pixels from Keras's (0 = exact).

Rates are the best of `--rounds` rounds; in each round every decoder in turn repeats passes
over the images until `--min-seconds` have gone by (interleaved, so that load from elsewhere
on a shared machine hits all decoders alike). Then TIFF (level 6, 64 KB strips,
`ready_forms.encode_tiff`) is checked on every valid PngSuite file (names not starting with
"x") in Keras's three colour modes (channels 1, 3, 4) through DALI's CPU decoder (GRAY, RGB,
ANY_DATA, as the loader does).

    .venv/bin/python benchmarks/gpu_ready_forms.py [--num-images 64] [--threads N]
        [--pngsuite DIR] [--json F]

CPU only; whether DALI's `mixed` decoder decodes these TIFFs on a GPU is not measured here
(docs/gpu_ready.md).
"""

from __future__ import annotations

import io
import os
import platform
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import harness
from dali_loader.formats import ready as ready_forms

KB = 1024
DALI_BATCH = 32


# ----------------------------------------------------------------------------- encoders

def tiff_encoder(level: int, strip_bytes: int, predictor: bool = True):
    """An encoder of HxWxC pixels to TIFF (Adobe Deflate `level`, strips of ~`strip_bytes`)."""
    if predictor:
        return lambda px: ready_forms.encode_tiff(px, level=level, strip_bytes=strip_bytes)

    def enc(px: np.ndarray) -> bytes:  # ready_forms.encode_tiff without the predictor
        import tifffile

        h, w, c = px.shape
        out = io.BytesIO()
        tifffile.imwrite(
            out, px if c != 1 else px[:, :, 0],
            photometric="rgb" if c != 1 else "minisblack",
            compression="adobe_deflate", compressionargs={"level": level}, predictor=False,
            rowsperstrip=max(1, strip_bytes // (w * c)), metadata=None,
            **({"extrasamples": ["unassalpha"]} if c == 4 else {}),
        )
        return out.getvalue()

    return enc


def jpeg2000_lossless(px: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(px[:, :, 0] if px.shape[2] == 1 else px).save(
        out, format="JPEG2000", irreversible=False)
    return out.getvalue()


def raw_zlib1(px: np.ndarray) -> bytes:
    return zlib.compress(ready_forms.encode_raw(px), 1)


# ----------------------------------------------------------------------------- timing

def timed_rate(run_pass, images_per_pass: int, min_seconds: float) -> float:
    """images/s of `run_pass` repeated for >= `min_seconds`."""
    n, t0 = 0, time.perf_counter()
    while True:
        run_pass()
        n += images_per_pass
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            return n / dt


def max_abs_diff(outs: list[np.ndarray], refs: list[np.ndarray]) -> int:
    """Largest |out - ref| over the images; 255 for a shape mismatch (never exact)."""
    worst = 0
    for o, r in zip(outs, refs, strict=True):
        if o.shape != r.shape:
            return 255
        worst = max(worst, int(np.abs(o.astype(np.int16) - r.astype(np.int16)).max()))
    return worst


class Dali:
    """DALI's CPU decoder over in-memory encoded images, batch 32, `threads` threads."""

    def __init__(self, blobs: list[bytes], output_type: str, threads: int):
        from nvidia.dali import fn, pipeline_def, types

        from dali_loader.decode.dali_graph import _decode
        import nvidia.dali as dali

        arrays = [np.frombuffer(b, np.uint8) for b in blobs]
        self.batches = [arrays[i:i + DALI_BATCH] for i in range(0, len(arrays), DALI_BATCH)]
        self._next = 0

        def source():
            b = self.batches[self._next % len(self.batches)]
            self._next += 1
            return b

        @pipeline_def(batch_size=DALI_BATCH, num_threads=threads, device_id=None,
                      prefetch_queue_depth=2)
        def pipe():
            enc = fn.external_source(source=source, batch=True, no_copy=False)
            # The loader's decoder options (adjust_orientation=False, use_fast_idct=True).
            return _decode(dali, enc, gpu=False, output_type=getattr(types, output_type))

        self.pipe = pipe()
        self.pipe.build()

    def outputs(self) -> list[np.ndarray]:
        """One pass over the images, in order (fresh: the pipeline has just been built)."""
        out = []
        for _ in self.batches:
            (tl,) = self.pipe.run()
            out.extend(np.array(tl.at(i)) for i in range(len(tl)))
        return out

    def run_pass(self) -> None:
        for _ in self.batches:
            self.pipe.run()


def tf_decoder(tf, blobs, fn, threads, reps):
    """`fn` (scalar tf.string -> HxWxC) in a tf.data map over `blobs`, `threads` at once:
    (a pass of `reps` x the images, images per pass, the pixels of one pass)."""
    ds = tf.data.Dataset.from_tensor_slices(blobs).map(fn, num_parallel_calls=threads)
    # The map's output (the pixels) is a function output, so it is computed; the reduce
    # only reads its shape. All of it runs in TF's runtime, no per-image Python.
    reduce = tf.function(lambda: ds.repeat(reps).reduce(
        tf.constant(0, tf.int64), lambda acc, x: acc + tf.cast(tf.shape(x)[0], tf.int64)))
    return (lambda: reduce()), len(blobs) * reps, [x.numpy() for x in ds]


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, num_images=64, rounds=5, json_out=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="decode threads (default: all cores)")
    ap.add_argument("--pngsuite", default=os.path.join(harness.ROOT, "..", "shared", "pngsuite"),
                    help="PngSuite folder for the TIFF exactness check ('' to skip)")
    ap.add_argument("--min-seconds", type=float, default=0.5, help="per timed round")
    args = ap.parse_args(argv)
    if args.num_images < 1 or args.threads < 1 or args.rounds < 1:
        ap.error("--num-images, --threads and --rounds must be >= 1")
    cmd = harness.command_line(__file__, argv)[2:]

    import tensorflow as tf
    import nvidia.dali as dali

    from dali_loader.decode.tf_kernels import raw_pixels

    t_start = time.perf_counter()
    threads = args.threads
    reps = max(1, -(-256 // args.num_images))  # tf.data passes of >= 256 images
    with harness.sample_data(None, args.num_images, "gpu-ready-forms-") as tmp:
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs
                       if f.endswith(".png"))
        pngs = [open(f, "rb").read() for f in files]
    refs = [tf.io.decode_image(b, channels=3, expand_animations=False).numpy() for b in pngs]
    png_bytes = sum(map(len, pngs))
    h, w, _ = refs[0].shape
    print(f"{len(pngs)} sample PNGs, {h}x{w} (first), {png_bytes / len(pngs) / KB:.0f} KB each "
          f"on average; {threads} threads; TF {tf.__version__}, DALI {dali.__version__}",
          flush=True)

    # Phase 1: encode every candidate (one thread, timed), build its decoder, check its
    # pixels. Phase 2 times the decoders in interleaved rounds (every decoder once per
    # round), so that load from elsewhere on a shared machine hits them all alike.
    rows: list[dict] = []
    timers = []

    def add(form, decoder, nbytes, enc_ms, diff, run_pass, per_pass):
        rows.append(dict(form=form, decoder=decoder, bytes_ratio=nbytes / png_bytes,
                         encode_ms=enc_ms, max_abs_diff=diff, rates=[]))
        timers.append((run_pass, per_pass))
        enc = "-" if enc_ms is None else f"{enc_ms:.1f}"
        print(f"  {form:<30} {decoder:<34} x{rows[-1]['bytes_ratio']:.3f}  "
              f"enc {enc:>5} ms  diff {diff}", flush=True)

    def encode_all(enc):
        t0 = time.perf_counter()
        blobs = [enc(px) for px in refs]
        return blobs, (time.perf_counter() - t0) * 1e3 / len(refs)

    def add_tf(form, decoder, blobs, enc_ms, fn):
        run_pass, per_pass, outs = tf_decoder(tf, blobs, fn, threads, reps)
        add(form, decoder, sum(map(len, blobs)), enc_ms, max_abs_diff(outs, refs),
            run_pass, per_pass)

    def add_dali(form, blobs, enc_ms):
        d = Dali(blobs, "RGB", threads)
        add(form, "DALI CPU", sum(map(len, blobs)), enc_ms, max_abs_diff(d.outputs(), refs),
            d.run_pass, len(blobs))

    # PNG itself: the TF decode-only bound, and DALI's CPU decode.
    add_tf("PNG (source)", "TF decode_png (decode-only bound)", pngs, None,
           lambda b: tf.io.decode_png(b, channels=3))
    add_dali("PNG (source)", pngs, None)

    # TIFF and JPEG 2000 forms through DALI's CPU decoder.
    dali_forms = [
        ("TIFF deflate+pred2 L1 16K", tiff_encoder(1, 16 * KB)),
        ("TIFF deflate+pred2 L1 64K", tiff_encoder(1, 64 * KB)),
        ("TIFF deflate+pred2 L1 256K", tiff_encoder(1, 256 * KB)),
        ("TIFF deflate+pred2 L6 16K", tiff_encoder(6, 16 * KB)),
        ("TIFF deflate+pred2 L6 64K", tiff_encoder(6, 64 * KB)),
        ("TIFF deflate+pred2 L6 256K", tiff_encoder(6, 256 * KB)),
        ("TIFF deflate L6 64K, no predictor", tiff_encoder(6, 64 * KB, predictor=False)),
        ("JPEG 2000 lossless", jpeg2000_lossless),
    ]
    for name, enc in dali_forms:
        add_dali(name, *encode_all(enc))

    # RAW: TF's kernels (the loader's raw_pixels), numpy; RAW+zlib L1 for reference.
    raw, raw_ms = encode_all(ready_forms.encode_raw)
    add_tf("RAW", "TF decode_raw+reshape", raw, raw_ms, lambda b: raw_pixels(b, tf))
    pool = ThreadPoolExecutor(max_workers=threads)

    def np_pass():
        return list(pool.map(lambda b: ready_forms.decode_raw(b).copy(), raw))

    add("RAW", "numpy frombuffer+copy", sum(map(len, raw)), raw_ms,
        max_abs_diff(np_pass(), refs), np_pass, len(raw))
    add_tf("RAW + zlib L1 (reference)", "TF decode_compressed+decode_raw",
           *encode_all(raw_zlib1),
           lambda b: raw_pixels(tf.io.decode_compressed(b, "ZLIB"), tf))

    print(f"timing: {args.rounds} interleaved rounds of >= {args.min_seconds} s per decoder",
          flush=True)
    for run_pass, _ in timers:  # warm-up
        run_pass()
    for _ in range(args.rounds):
        for row, (run_pass, per_pass) in zip(rows, timers):
            row["rates"].append(timed_rate(run_pass, per_pass, args.min_seconds))
    pool.shutdown()
    for row in rows:
        row["decode_images_per_s"] = max(row["rates"])
        row["median_images_per_s"] = float(np.median(row["rates"]))
    png_tf_rate, png_dali_rate = (r["decode_images_per_s"] for r in rows[:2])
    raw_tf_rate = next(r["decode_images_per_s"] for r in rows
                       if r["decoder"] == "TF decode_raw+reshape")

    # PngSuite: TIFF L6 64K in every colour mode through DALI's CPU decoder.
    suite = None
    if args.pngsuite and os.path.isdir(args.pngsuite):
        names = sorted(f for f in os.listdir(args.pngsuite)
                       if f.endswith(".png") and not f.startswith("x"))
        suite = {"files": len(names), "modes": {}}
        for channels, otype in ((1, "GRAY"), (3, "RGB"), (4, "ANY_DATA")):
            px, bad = [], []
            for n in names:
                data = open(os.path.join(args.pngsuite, n), "rb").read()
                px.append(tf.io.decode_image(data, channels=channels,
                                             expand_animations=False).numpy())
            tiffs = [ready_forms.encode_tiff(p, level=6, strip_bytes=64 * KB) for p in px]
            outs = Dali(tiffs, otype, threads).outputs()
            for n, o, r in zip(names, outs, px, strict=True):
                if o.shape != r.shape or not np.array_equal(o, r):
                    bad.append(n)
            suite["modes"][str(channels)] = {"output_type": otype, "exact": len(names) - len(bad),
                                             "total": len(names), "not_exact": bad}
            print(f"  PngSuite TIFF L6 64K, channels={channels} ({otype}): "
                  f"{len(names) - len(bad)}/{len(names)} exact"
                  + (f"; not exact: {bad}" if bad else ""), flush=True)
    elif args.pngsuite:
        print(f"  PngSuite folder {args.pngsuite} not found: exactness check skipped")

    # ------------------------------------------------------------------ report
    print(f"\nCommand: {cmd}\n")
    print("| form | decoder (all cores) | bytes ÷ PNG | encode ms/img (1 thread) "
          f"| decode img/s, best of {args.rounds} (median) | max abs diff |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        enc = "—" if r["encode_ms"] is None else f"{r['encode_ms']:.1f}"
        print(f"| {r['form']} | {r['decoder']} | {r['bytes_ratio']:.3f} | {enc} "
              f"| {r['decode_images_per_s']:.0f} ({r['median_images_per_s']:.0f}) "
              f"| {r['max_abs_diff']} |")
    by = {r["form"]: r for r in rows if r["decoder"] == "DALI CPU"}
    tiff6 = by["TIFF deflate+pred2 L6 64K"]["decode_images_per_s"]
    ratios = {
        "tiff_l6_64k_dali_over_png_tf": tiff6 / png_tf_rate,
        "tiff_l6_64k_dali_over_png_dali": tiff6 / png_dali_rate,
        "raw_tf_over_png_tf": raw_tf_rate / png_tf_rate,
        "png_dali_over_png_tf": png_dali_rate / png_tf_rate,
    }
    print("\nRatios:")
    labels = {
        "tiff_l6_64k_dali_over_png_tf": "TIFF L6 64K (DALI CPU) / PNG (TF decode_png)",
        "tiff_l6_64k_dali_over_png_dali": "TIFF L6 64K (DALI CPU) / PNG (DALI CPU)",
        "raw_tf_over_png_tf": "RAW (TF kernels) / PNG (TF decode_png)",
        "png_dali_over_png_tf": "PNG: DALI CPU / TF decode_png",
    }
    for key, label in labels.items():
        print(f"  {label:<46} {ratios[key]:.2f}x")
    qualified = [r for r in rows if r["form"].startswith("TIFF") and r["max_abs_diff"] == 0
                 and r["bytes_ratio"] <= 1.2]
    if qualified:
        top = max(qualified, key=lambda r: r["decode_images_per_s"])
        print(f"  Fastest exact TIFF within 1.2x the PNG's bytes (DALI CPU): {top['form']} "
              f"({top['decode_images_per_s']:.0f} img/s, x{top['bytes_ratio']:.3f})")
    elapsed = time.perf_counter() - t_start
    print(f"\n{elapsed:.0f} s")

    harness.write_json(args.json, dict(
        command=cmd, num_images=len(pngs), image_hw=[h, w],
        png_kb_per_image=png_bytes / len(pngs) / KB, threads=threads, cpu_count=os.cpu_count(),
        machine=platform.machine(), tensorflow=tf.__version__, dali=dali.__version__,
        rounds=args.rounds, min_seconds=args.min_seconds, rows=rows, ratios=ratios,
        pngsuite=suite, seconds=elapsed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
