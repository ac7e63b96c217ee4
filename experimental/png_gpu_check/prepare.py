"""Prepares the GPU PNG decoder's device check (run HERE, on the development machine).

Writes `build/png_gpu_check/` (ignored; the device tool carries it):

- `whl/`: nvCOMP 6's Python API and library wheels (`nvidia-nvcomp-cu12` and
  `nvidia-libnvcomp-cu12` 6.0.0.12 by default), slimmed to what a CPython 3.12
  Deflate decode loads (the 3.12 extension module, `libnvcomp.so.6`, .py files,
  licenses, dist-info; no `nvlzcat`, `libnvcomp_cpu`, headers or other CPythons).
  The slimming is `gpu_ready_check/prepare.py`'s, with this set's file patterns.
  cu12 by default: a CUDA 12 build runs on CUDA 12 and 13 drivers alike (the
  driver is backward compatible), so it fits whatever the device has; `--cuda 13`
  carries the smaller cu13 set (needs a CUDA 13 driver, r580+).
- `data/`: every PngSuite file; `refs.npz` with libpng's pixels
  (`tf.io.decode_png(channels=C)`, C = 1, 3, 4) of every valid PngSuite file;
  `--real` real photo PNGs (`dali_loader.tools.sample`, 500x375, Pillow-encoded)
  with the SHA-256 of their libpng pixels in 3 modes (full pixels for the first 2);
  `manifest.json` (which files this machine's simulator run decodes on the batched
  path in each mode, so the device must agree).

The 2,000 timing photos are NOT carried: `device_check.py` generates them on the
device (numpy + zlib, `tests/support/pngs.py`), their source pixels being the
reference. Prints the carried total (limit 64 MiB) and the device tool's call.

    .venv/bin/python experimental/png_gpu_check/prepare.py [--cuda 12|13] [--real 24]
        [--print-device-call]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

MiB = 1024 * 1024
CARRY_LIMIT = 64 * MiB
OUT_DIR = os.path.join(REPO, "build", "png_gpu_check")
WHL_DIR = os.path.join(OUT_DIR, "whl")
DATA_DIR = os.path.join(OUT_DIR, "data")
CARRY = ["build/png_gpu_check"]
TIMEOUT_S = 330
NVCOMP_VERSION = "6.0.0.12"
WHEEL_SETS = {c: [(f"nvidia-nvcomp-cu{c}", NVCOMP_VERSION), (f"nvidia-libnvcomp-cu{c}", NVCOMP_VERSION)]
              for c in (12, 13)}
KEEP_BINARIES = [r"nvidia/nvcomp/nvcomp_impl\.cpython-(?P<py>\d+)-x86_64-linux-gnu\.so",
                 r"nvidia/libnvcomp/lib64/libnvcomp\.so[.\d]*"]
ESSENTIAL = [r"nvcomp_impl\.cpython-{py}-", r"/libnvcomp\.so\.6"]
MODES = (1, 3, 4)


def log(*a) -> None:
    print(*a, flush=True)


def _wheel_tools():
    """gpu_ready_check/prepare.py's download + slim, pointed at this check's set and folders."""
    spec = importlib.util.spec_from_file_location(
        "gpu_ready_prepare", os.path.join(REPO, "device_checks", "gpu_ready_check", "prepare.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.WHEEL_SETS, mod.KEEP_BINARIES, mod.ESSENTIAL = WHEEL_SETS, KEEP_BINARIES, ESSENTIAL
    mod.WHL_DIR = WHL_DIR
    mod.ORIG_DIR = os.path.join(REPO, ".cache", "png_gpu_check", "wheels")
    return mod


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def prepare_data(pngsuite: str, num_real: int, full_ref_real: int) -> dict:
    import numpy as np

    from dali_loader.lazy import import_tf
    from dali_loader.tools.sample import make_sample_dataset

    tf = import_tf()
    if os.path.isdir(DATA_DIR):
        shutil.rmtree(DATA_DIR)
    os.makedirs(os.path.join(DATA_DIR, "pngsuite"))
    os.makedirs(os.path.join(DATA_DIR, "real"))
    refs: dict[str, np.ndarray] = {}
    suite = sorted(f for f in os.listdir(pngsuite) if f.endswith(".png"))
    for f in suite:
        shutil.copy(os.path.join(pngsuite, f), os.path.join(DATA_DIR, "pngsuite", f))
        if not f.startswith("x"):
            data = open(os.path.join(pngsuite, f), "rb").read()
            for c in MODES:
                refs[f"pngsuite/{f}:{c}"] = tf.io.decode_png(data, channels=c).numpy()
    real = []
    with tempfile.TemporaryDirectory() as tmp:
        make_sample_dataset(tmp, num_images=num_real, num_classes=1, seed=17)
        paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs)
        for i, p in enumerate(paths):
            data = open(p, "rb").read()
            name = f"real/{i:03d}.png"
            open(os.path.join(DATA_DIR, name), "wb").write(data)
            entry = {"path": name, "png_bytes": len(data), "ref_sha256": {}}
            for c in MODES:
                px = tf.io.decode_png(data, channels=c).numpy()
                entry["ref_sha256"][str(c)] = sha256(px.tobytes())
                entry["shape"] = list(px.shape[:2])
                if i < full_ref_real:
                    refs[f"{name}:{c}"] = px
            real.append(entry)
    np.savez_compressed(os.path.join(DATA_DIR, "refs.npz"), **refs)
    log(f"  {len(suite)} PngSuite files, {len(real)} real PNGs "
        f"({sum(e['png_bytes'] for e in real) / MiB:.2f} MiB), {len(refs)} full references")
    return {"pngsuite": suite, "real": real,
            "reference": "tf.io.decode_png(data, channels=C) (libpng), TF " + tf.__version__}


def expected_batched(suite: list[str]) -> dict[str, list[str]]:
    """Per mode, the PngSuite files the host parse sends to the batched path (the
    device must decode exactly these there)."""
    from experimental.png_gpu.decoder import plan
    from experimental.png_gpu.parse import Fallback

    blobs = [open(os.path.join(DATA_DIR, "pngsuite", f), "rb").read() for f in suite]
    return {str(c): [f for f, p in zip(suite, plan(blobs, c)) if not isinstance(p, Fallback)]
            for c in MODES}


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def device_call() -> str:
    return json.dumps({"command": "bash experimental/png_gpu_check/run_on_device.sh",
                       "carry": CARRY, "timeout_s": TIMEOUT_S})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cuda", type=int, choices=(12, 13), default=12,
                    help="nvCOMP wheels for this CUDA major (12 runs on 12 and 13 drivers)")
    ap.add_argument("--real", type=int, default=24, help="real photo PNGs carried")
    ap.add_argument("--full-ref-real", type=int, default=2,
                    help="real PNGs whose full reference pixels are carried (others: SHA-256)")
    ap.add_argument("--print-device-call", action="store_true",
                    help="print the device tool's call, prepare nothing")
    ap.add_argument("--force", action="store_true", help="rewrite the slimmed wheels")
    ap.add_argument("--pngsuite", default=os.path.join(REPO, "..", "shared", "pngsuite"))
    args = ap.parse_args(argv)
    if args.print_device_call:
        return print(device_call()) or 0
    t0 = time.perf_counter()
    tools = _wheel_tools()
    wheels = tools.prepare_wheels(args.cuda, ["312"], False, args.force)
    log("== data")
    data = prepare_data(os.path.abspath(args.pngsuite), args.real, args.full_ref_real)
    manifest = {"format": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "wheels": wheels, "expected_batched": expected_batched(data["pngsuite"]), **data}
    json.dump(manifest, open(os.path.join(DATA_DIR, "manifest.json"), "w"), indent=1)
    parts = {"wheels": tree_bytes(WHL_DIR), "data": tree_bytes(DATA_DIR),
             "repository files": tools.repo_bytes()}
    total = sum(parts.values())
    log("== carried by the device call (build/png_gpu_check + the repository)")
    log("  " + " + ".join(f"{k} {v / MiB:.2f}" for k, v in parts.items())
        + f" = {total / MiB:.2f} MiB of {CARRY_LIMIT / MiB:.0f}; "
        f"prepared in {time.perf_counter() - t0:.0f} s")
    ok = total <= CARRY_LIMIT
    log("== the device tool's call (run):\n  " + device_call() if ok else
        "FAILED: over the limit (fewer --real, or --cuda 13)")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
