"""Does the batched PNG decoder decode on the GPU bit-exactly, and how fast? (run ON THE DEVICE)

Reads `build/png_gpu_check/data/` (written by `prepare.py`: PngSuite, real photo PNGs,
libpng's pixels or their SHA-256, `manifest.json`) and, with nvCOMP from the carried
wheels, numba-cuda and CuPy from the device:

1. env: Python, numpy, numba(-cuda), CuPy, nvCOMP, nvidia-smi, CPU cores;
2. photos: generates `--photos` 500x375 RGB photo PNGs (numpy + zlib level 6,
   `support.pngs`, seeded, every 5th image one filter type for all rows,
   the others a mix of all five), in a process pool; their source pixels are the reference;
3. exact: `decode_pngs` with `NvcompInflate` (and again with `ZlibInflate`, the CPU
   stand-in, feeding the same GPU kernels) on every PngSuite file in modes 1, 3, 4 (the
   batched set must be the manifest's; each batched image must equal libpng's pixels),
   the real PNGs (SHA-256 of libpng's pixels) and all photos (their sources);
   corrupt PngSuite files must all come back as `Fallback` (the dry run skips the
   real PNGs: 500x375 images take minutes each in the simulator);
4. time: images/s and GB/s (decoded pixels) of `decode_pngs` + synchronisation, from
   PNG bytes in host memory to pixels in GPU memory, batches 64..4096 (photos repeated),
   1 warm-up then `--rounds`; the host parse+pack time alone alongside;
5. cpu: the same photos decoded on all cores (a process pool; Pillow when installed,
   else zlib + a numba-compiled unfilter), images/s;
6. broken: CRC-valid files with scrambled Deflate data, a wrong Adler-32, too few rows
   or a bad filter type must all come back as `Fallback` (nvCOMP does not validate its
   input; last, so that a hang there loses no earlier phase).

Prints one table; writes `$OUT/png_gpu_check.json`. Exit 0: every batched image exact;
1: a mismatch (listed by name); 2: could not run. `--dry-run`: no GPU, numba-cuda's
simulator, zlib only, a small subset (what runs here in CI-like conditions).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]  # dali_loader, and the PNG makers (support)
DATA = os.path.join(REPO, "build", "png_gpu_check", "data")
MODES = (1, 3, 4)
PHOTO_HW = (375, 500)
# Worker processes start fresh: the parent holds a CUDA context by then, which a forked
# child must not inherit.
SPAWN = multiprocessing.get_context("spawn")

import numpy as np  # noqa: E402

# numba-cuda 0.x registers an overload for np.row_stack, which numpy 2.5 removed (seen on the
# device: AttributeError at the first kernel's compile). The alias is numpy's own definition.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack


def log(*a) -> None:
    print(*a, flush=True)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def make_photo(i: int, hw: tuple[int, int]) -> tuple[bytes, bytes]:
    """(PNG, source pixels) of photo `i`: seeded, filters varied per image."""
    from support.pngs import encode_png, photo

    px = photo(np.random.default_rng(1000 + i), *hw)
    filters = (i // 5 % 5,) if i % 5 == 0 else tuple(np.random.default_rng(i).integers(0, 5, 7))
    return encode_png(px, filters), px.tobytes()


def env_info() -> dict:
    info = {"python": sys.version.split()[0], "numpy": np.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform()}
    for mod in ("numba", "cupy", "torch", "PIL"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:  # reported, not fatal
            info[mod] = f"missing ({type(e).__name__})"
    try:
        from nvidia import nvcomp

        info["nvcomp"] = f"{nvcomp.__version__} (CUDA {nvcomp.__cuda_version__})"
    except Exception as e:
        info["nvcomp"] = f"missing ({e})"
    try:
        info["nvidia-smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:
        info["nvidia-smi"] = f"unavailable ({e})"
    return info


def compare(name: str, got, want_sha: str | None = None, want=None) -> str | None:
    """None when `got` equals the reference; else what differs."""
    arr = got if isinstance(got, np.ndarray) else got.get()
    if want is not None:
        if arr.shape != want.shape:
            return f"{name}: shape {arr.shape} != {want.shape}"
        if not np.array_equal(arr, want):
            d = np.abs(arr.astype(np.int16) - want.astype(np.int16))
            return f"{name}: {int((d > 0).sum())} values differ, max {int(d.max())}"
        return None
    if sha256(np.ascontiguousarray(arr).tobytes()) != want_sha:
        return f"{name}: pixels' SHA-256 differs from libpng's"
    return None


def check_exact(backend, launch, manifest, refs, photos, dry: bool) -> dict:
    from experimental.png_gpu import Fallback, PngDecodeStats, decode_pngs

    suite = manifest["pngsuite"]
    blobs = [open(os.path.join(DATA, "pngsuite", f), "rb").read() for f in suite]
    fails, counts = [], {}
    for c in MODES:
        stats = PngDecodeStats()
        got = decode_pngs(blobs, c, backend=backend, launch=launch, stats=stats)
        batched = [f for f, r in zip(suite, got) if not isinstance(r, Fallback)]
        if batched != manifest["expected_batched"][str(c)]:
            fails.append(f"mode {c}: batched set differs from the manifest's: "
                         f"{sorted(set(batched) ^ set(manifest['expected_batched'][str(c)]))}")
        for f, r in zip(suite, got):
            if isinstance(r, Fallback):
                continue
            e = compare(f"pngsuite/{f} C={c}", r, want=refs[f"pngsuite/{f}:{c}"])
            if e:
                fails.append(e)
        bad = [f for f, r in zip(suite, got) if f.startswith("x") and not isinstance(r, Fallback)]
        if bad:
            fails.append(f"corrupt files not sent to the CPU: {bad}")
        counts[f"pngsuite_C{c}"] = stats.as_dict()
    real = [] if dry else manifest["real"]  # 500x375: hours in the simulator
    rblobs = [open(os.path.join(DATA, e["path"]), "rb").read() for e in real]
    for c in MODES:
        got = decode_pngs(rblobs, c, backend=backend, launch=launch)
        n = 0
        for e, r in zip(real, got):
            if isinstance(r, Fallback):
                fails.append(f"{e['path']} C={c}: not batched ({r.reason})")
                continue
            n += 1
            key = f"{e['path']}:{c}"
            err = compare(f"{e['path']} C={c}", r, e["ref_sha256"][str(c)], refs.get(key))
            if err:
                fails.append(err)
        counts[f"real_C{c}"] = n
    step = 256
    n = 0
    for s in range(0, len(photos), step):
        part = photos[s:s + step]
        got = decode_pngs([p for p, _ in part], 3, backend=backend, launch=launch)
        for k, ((_, src), r) in enumerate(zip(part, got)):
            if isinstance(r, Fallback):
                fails.append(f"photo {s + k}: not batched ({r.reason})")
                continue
            n += 1
            err = compare(f"photo {s + k}", r, want=np.frombuffer(src, np.uint8).reshape(
                r.shape))
            if err:
                fails.append(err)
    counts["photos_exact"] = n
    return {"failures": fails, "counts": counts}


def check_broken(backend, launch, photos, hw) -> list[str]:
    """CRC-valid files with broken zlib streams: nvCOMP does not validate Deflate input, so
    the Adler-32/size/filter checks must send each to the CPU. Run last: if nvCOMP hung on
    one, the phases before are already in the JSON."""
    from experimental.png_gpu import Fallback, decode_pngs
    from support.pngs import broken_streams

    broken = broken_streams(np.frombuffer(photos[0][1], np.uint8).reshape(hw + (3,)))
    got = decode_pngs(list(broken.values()), 3, backend=backend, launch=launch)
    for k, r in zip(broken, got):
        log(f"  {k}: {r.reason if isinstance(r, Fallback) else 'BATCHED (wrong)'}")
    return [f"{k}: decoded on the batched path" for k, r in zip(broken, got)
            if not isinstance(r, Fallback)]


def sync() -> None:
    from numba import cuda

    cuda.synchronize()


def time_gpu(backend, launch, photos, batches, rounds, deadline, executor) -> list[dict]:
    from experimental.png_gpu import decode_pngs
    from experimental.png_gpu.decoder import plan
    from experimental.png_gpu.pack import pack

    rows = []
    for b in batches:
        if time.monotonic() > deadline:
            log(f"  (time budget spent; batch {b} and above not timed)")
            break
        blobs = [photos[i % len(photos)][0] for i in range(b)]
        out_bytes = sum(len(photos[i % len(photos)][1]) for i in range(b))
        png_bytes = sum(len(x) for x in blobs)
        times, host = [], []
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            res = decode_pngs(blobs, 3, backend=backend, launch=launch, executor=executor)
            sync()
            dt = time.perf_counter() - t0
            del res
            t0 = time.perf_counter()
            pack(plan(blobs, 3, executor), 3, empty=backend.empty_host, executor=executor)
            if r:
                times.append(dt)
                host.append(time.perf_counter() - t0)
        best, med = min(times), float(np.median(times))
        rows.append({"batch": b, "images_per_s_best": b / best, "images_per_s_median": b / med,
                     "gb_per_s_pixels": out_bytes / best / 1e9, "gb_per_s_png": png_bytes / best / 1e9,
                     "batch_latency_s": best, "host_parse_pack_s": min(host)})
        log(f"  batch {b:5d}: {b / best:9.0f} img/s (median {b / med:.0f}), "
            f"{out_bytes / best / 1e9:6.2f} GB/s pixels, batch {best * 1e3:8.1f} ms, "
            f"host parse+pack {min(host) * 1e3:7.1f} ms")
    return rows


def _cpu_decode_pil(png: bytes) -> int:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).nbytes


def _cpu_decode_zlib(png: bytes) -> int:
    from experimental.png_gpu.parse import parse_png

    p = parse_png(png)
    raw = np.frombuffer(zlib.decompress(bytes(p.deflate), -15), np.uint8).copy()
    _numba_unfilter()(raw, p.height, p.stride, p.bpp)
    return raw.size


_UNF = None


def _numba_unfilter():
    """A sequential unfilter compiled by numba for the CPU (the baseline without Pillow)."""
    global _UNF
    if _UNF is None:
        from numba import njit

        @njit(cache=False)
        def unf(buf, h, stride, bpp):
            for r in range(h):
                row = r * stride
                ft = buf[row]
                for x in range(stride - 1):
                    p = row + 1 + x
                    a = np.int32(buf[p - bpp]) if x >= bpp else 0
                    b = np.int32(buf[p - stride]) if r > 0 else 0
                    c = np.int32(buf[p - stride - bpp]) if (r > 0 and x >= bpp) else 0
                    if ft == 1:
                        v = a
                    elif ft == 2:
                        v = b
                    elif ft == 3:
                        v = (a + b) >> 1
                    elif ft == 4:
                        pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                        v = a if (pa <= pb and pa <= pc) else (b if pb <= pc else c)
                    else:
                        v = 0
                    buf[p] = (np.int32(buf[p]) + v) & 0xFF
        _UNF = unf
    return _UNF


def _cpu_chunk(args) -> int:
    kind, pngs = args
    f = _cpu_decode_pil if kind == "pillow" else _cpu_decode_zlib
    return sum(f(p) for p in pngs)


def time_cpu(photos, rounds: int) -> dict:
    try:
        import PIL  # noqa: F401

        kind = "pillow"
    except ImportError:
        kind = "zlib+numba"
    pngs = [p for p, _ in photos]
    workers = os.cpu_count() or 1
    chunks = [(kind, pngs[i::workers * 4]) for i in range(workers * 4)]
    with cf.ProcessPoolExecutor(workers, mp_context=SPAWN) as ex:
        list(ex.map(_cpu_chunk, [(kind, pngs[:workers])]))  # warm-up (numba compile per worker)
        list(ex.map(_cpu_chunk, [(kind, pngs[i:i + 1]) for i in range(workers * 2)]))
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            total = sum(ex.map(_cpu_chunk, chunks))
            times.append(time.perf_counter() - t0)
    best = min(times)
    row = {"decoder": kind, "workers": workers, "images": len(pngs),
           "images_per_s": len(pngs) / best, "gb_per_s_pixels": total / best / 1e9}
    log(f"  CPU ({kind}, {workers} processes): {row['images_per_s']:.0f} img/s, "
        f"{row['gb_per_s_pixels']:.2f} GB/s pixels")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--photos", type=int, default=2000)
    ap.add_argument("--batches", default="64,256,1024,4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=270)
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: numba-cuda's simulator, zlib, a small subset")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    if args.dry_run:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        sys.setswitchinterval(1e-4)
        args.photos, args.batches, args.rounds = 6, "2,4", 1
    out = args.out
    if out:
        os.makedirs(out, exist_ok=True)
    result = {"dry_run": args.dry_run, "phases": {}}

    def save():
        if out:
            json.dump(result, open(os.path.join(out, "png_gpu_check.json"), "w"), indent=1,
                      default=str)

    log("== env")
    result["env"] = env_info()
    for k, v in result["env"].items():
        log(f"  {k}: {v}")
    save()
    try:
        from numba import cuda

        from experimental.png_gpu import Launch, NvcompInflate, ZlibInflate

        if not args.dry_run and not cuda.is_available():
            log("!! numba.cuda sees no GPU")
            return 2
        manifest = json.load(open(os.path.join(DATA, "manifest.json")))
        refs = dict(np.load(os.path.join(DATA, "refs.npz")))
        if args.dry_run:
            launch = Launch(adler_threads=16, unfilter_threads=8, expand_threads=1,
                            expand_blocks=1)
            backends = {"zlib": ZlibInflate()}
            manifest["pngsuite"] = [f for f in manifest["pngsuite"]
                                    if f.startswith(("basn", "tbbn3", "tp0n", "x"))]
            manifest["expected_batched"] = {c: [f for f in v if f in manifest["pngsuite"]]
                                            for c, v in manifest["expected_batched"].items()}
        else:
            launch = Launch()
            backends = {"nvcomp": NvcompInflate(), "zlib": ZlibInflate()}
    except Exception:
        log("!! could not start:\n" + traceback.format_exc())
        result["error"] = traceback.format_exc()
        save()
        return 2

    hw = (24, 20) if args.dry_run else PHOTO_HW
    log(f"== photos: {args.photos} x {hw[1]}x{hw[0]} RGB PNGs (numpy + zlib)")
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(os.cpu_count(), mp_context=SPAWN) as ex:
        photos = list(ex.map(make_photo, range(args.photos), [hw] * args.photos, chunksize=16))
    result["phases"]["photos_s"] = time.perf_counter() - t0
    png_mb = sum(len(p) for p, _ in photos) / 1e6
    log(f"  {time.perf_counter() - t0:.1f} s; {png_mb:.1f} MB of PNG "
        f"({png_mb * 1e6 / max(1, sum(len(s) for _, s in photos)):.2f} of the pixels)")

    failures = []
    for name, backend in backends.items():
        log(f"== exact: inflate {name}, GPU kernels{' (simulated)' if args.dry_run else ''}")
        t0 = time.perf_counter()
        r = check_exact(backend, launch, manifest, refs, photos, args.dry_run)
        result["phases"][f"exact_{name}"] = dict(r, seconds=time.perf_counter() - t0)
        failures += [f"[{name}] {f}" for f in r["failures"]]
        log(f"  {len(r['failures'])} failures in {time.perf_counter() - t0:.1f} s; {r['counts']}")
        for f in r["failures"][:20]:
            log("  FAIL " + f)
        save()
    result["failures"] = failures

    log("== time: decode_pngs, PNG bytes in host memory -> RGB pixels in GPU memory")
    batches = [int(b) for b in args.batches.split(",")]
    timing_backend = backends.get("nvcomp", backends["zlib"])
    with cf.ThreadPoolExecutor(os.cpu_count()) as pool:  # host parse + pack threads
        result["gpu"] = time_gpu(timing_backend, launch, photos, batches, args.rounds,
                                 deadline - 40, pool)
    save()
    log("== cpu: the same photos on all cores")
    result["cpu"] = time_cpu(photos, args.rounds)
    log(f"== table ({hw[1]}x{hw[0]} RGB photo PNGs)")
    log(f"  {'decoder':28s} {'batch':>6s} {'img/s':>9s} {'GB/s px':>8s} {'x CPU':>6s}")
    cpu = result["cpu"]["images_per_s"]
    log(f"  {'CPU ' + result['cpu']['decoder'] + ' x' + str(result['cpu']['workers']):28s} "
        f"{'-':>6s} {cpu:9.0f} {result['cpu']['gb_per_s_pixels']:8.2f} {1:6.2f}")
    for row in result["gpu"]:
        log(f"  {'GPU ' + timing_backend.name + ' + kernels':28s} {row['batch']:6d} "
            f"{row['images_per_s_best']:9.0f} {row['gb_per_s_pixels']:8.2f} "
            f"{row['images_per_s_best'] / cpu:6.2f}")
    for name, backend in backends.items():
        log(f"== broken streams (CRC-valid), inflate {name}")
        save()
        bad = check_broken(backend, launch, photos, hw)
        result["phases"][f"broken_{name}"] = bad
        failures += [f"[{name}] {f}" for f in bad]
    result["failures"] = failures
    result["seconds"] = time.monotonic() - t_start
    save()
    if failures:
        log(f"FAILED: {len(failures)} mismatches (see png_gpu_check.json)")
        return 1
    log(f"PASSED: every batched image bit-exact ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
