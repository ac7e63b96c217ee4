"""Does nvImageCodec decode the GPU-ready cache's TIFFs on the GPU, bit-exactly? (run ON THE DEVICE)

Reads what `prepare.py` wrote (`build/gpu_ready_check/`: TIFFs of Keras's decoded pixels made
by `ready_forms.encode_tiff`, the reference pixels or their SHA-256, `manifest.json`) and, with
nvImageCodec from the carried wheels (`.whl/`, installed into /tmp/site):

1. environment: Python, numpy, nvidia-smi (GPU, driver), the driver's CUDA version, torch and
   its CUDA, CuPy, nvImageCodec and the CUDA it was built for;
2. exactness on the GPU: a Decoder restricted to `Backend(BackendKind.GPU_ONLY)` (nvImageCodec's
   nvTIFF extension; nvTIFF inflates Deflate strips with nvCOMP) decodes every TIFF in
   batches, twice: "unchanged" (colour spec and sample format unchanged: the file's own
   channels) and "dali" (the sample formats DALI maps the loader's output types to: GRAY ->
   P_Y, RGB -> I_RGB, ANY_DATA -> I_UNCHANGED). Each image must come back in device memory,
   then is copied to the host and compared with the reference, bit-exactly. A file the GPU
   backend refuses (None) or that differs is a FAILURE, listed by name;
3. the same with a CPU_ONLY Decoder (nvImageCodec's libtiff extension), for information only;
4. timing: batched decode of the photo TIFFs (500x375 RGB), batch 128 and 512 (distinct
   photos repeated), from in-memory bytes to pixels in GPU memory, warm-up then timed rounds,
   the CUDA stream synchronised before the clock stops; and the CPU backend at batch 128;
5. which nvImageCodec/nvTIFF/nvCOMP/nvJPEG libraries the process loaded (/proc/self/maps).

Every phase has a time budget (the whole check: --budget-s, default 270 s). Results:
`$OUT/gpu_ready_check.json` and `$OUT/gpu_ready_check.log` (with --out or $OUT), a summary on
stdout; exit 0 when every TIFF decoded exactly on the GPU, 1 on any failure, 2 when the check
could not run (no GPU, nvImageCodec missing, driver too old for the wheels).

`--dry-run` (no GPU): checks the data, references and manifest, and runs the same comparison,
timing and JSON code with a CPU decoder: tifffile (the default; every file must match) or
nvImageCodec's CPU backend (`--dry-run-decoder nvimgcodec-cpu`, where the wheels import).

Needs only numpy (+ cupy or torch on the device to synchronise and to read versions).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_DATA = os.path.join(REPO, "build", "gpu_ready_check")

# Seconds per phase; the whole run is also capped by --budget-s.
BUDGETS = {"env": 45, "load": 20, "exact_gpu": 80, "exact_cpu": 30, "time_gpu": 70,
           "time_cpu": 30}
EXACT_BATCH = 64

import numpy as np  # noqa: E402  (after the constants: the module's one hard dependency)


class Log:
    """Prints and appends to $OUT/gpu_ready_check.log as it goes (a timeout keeps the start)."""

    def __init__(self, out_dir: str | None):
        self.f = open(os.path.join(out_dir, "gpu_ready_check.log"), "w") if out_dir else None

    def __call__(self, *a) -> None:
        line = " ".join(str(x) for x in a)
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()


class Budget:
    def __init__(self, total_s: float):
        self.t0 = time.monotonic()
        self.end = self.t0 + total_s

    def phase(self, name: str) -> float:
        """The deadline of phase `name`: its own budget, within the whole run's."""
        return min(time.monotonic() + BUDGETS[name], self.end)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------------------------------
# Environment


def run_cmd(cmd: list[str], timeout: float) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"<{type(e).__name__}: {e}>"


def driver_cuda_version() -> int | None:
    """cuDriverGetVersion from libcuda.so.1 (e.g. 12080, 13000), None without a driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    return v.value


TORCH_PROBE = (
    "import json,torch;print(json.dumps({'torch':torch.__version__,'torch_cuda':torch.version.cuda,"
    "'cuda_available':torch.cuda.is_available(),'device':torch.cuda.get_device_name(0) "
    "if torch.cuda.is_available() else None}))"
)


def start_torch_probe() -> subprocess.Popen | None:
    """torch's versions, read in a subprocess (its import takes seconds; runs alongside)."""
    try:
        return subprocess.Popen([sys.executable, "-c", TORCH_PROBE], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError:
        return None


def finish_torch_probe(p: subprocess.Popen | None, timeout: float) -> dict:
    if p is None:
        return {"torch": None}
    try:
        out, err = p.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"torch": "<probe timed out>"}
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"torch": None, "torch_error": (err or out).strip().splitlines()[-1:]}


def loaded_libraries() -> list[str]:
    keys = ("nvimgcodec", "nvtiff", "nvcomp", "nvjpeg", "libcuda.so", "libcudart", "libtiff")
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if any(k in os.path.basename(p) for k in keys))


# ---------------------------------------------------------------------------------------
# Data


def load_data(data_dir: str, log) -> tuple[dict, dict[str, bytes], dict, list[str]]:
    """The manifest, the TIFF bytes (SHA-256-checked), the full references; problems found."""
    problems = []
    manifest = json.load(open(os.path.join(data_dir, "manifest.json")))
    blobs = {}
    for f in manifest["files"]:
        p = os.path.join(data_dir, f["path"])
        try:
            b = open(p, "rb").read()
        except OSError as e:
            problems.append(f"{f['path']}: unreadable ({e})")
            continue
        if len(b) != f["tiff_bytes"] or sha256(b) != f["tiff_sha256"]:
            problems.append(f"{f['path']}: TIFF bytes differ from the manifest")
        blobs[f["path"]] = b
    refs = {}
    with np.load(os.path.join(data_dir, "refs.npz")) as z:
        keys = set(z.files)
        for f in manifest["files"]:
            k = f["ref_key"]
            if k is None:
                continue
            if k not in keys:
                problems.append(f"{f['path']}: reference {k} missing from refs.npz")
                continue
            a = z[k]
            if (list(a.shape) != f["shape"] or a.dtype != np.uint8
                    or sha256(np.ascontiguousarray(a).tobytes()) != f["ref_sha256"]):
                problems.append(f"{f['path']}: reference in refs.npz differs from the manifest")
            refs[f["path"]] = a
    missing = [p for p in manifest["timing_files"] if p not in blobs]
    if missing:
        problems.append(f"timing files missing: {missing[:5]}")
    groups = {}
    for f in manifest["files"]:
        groups[f"{f['group']}/c{f['channels']}"] = groups.get(f"{f['group']}/c{f['channels']}", 0) + 1
    log(f"data: {len(blobs)} TIFFs ({sum(map(len, blobs.values())) / 2**20:.1f} MiB), "
        f"{len(refs)} full references, SHA-256 for all; groups {groups}")
    return manifest, blobs, refs, problems


def compare(f: dict, out: np.ndarray | None, refs: dict) -> dict | None:
    """None when `out` is Keras's pixels for file `f` bit for bit, else what differs."""
    if out is None:
        return {"file": f["path"], "why": "refused (decoder returned None)"}
    h, w, c = f["shape"]
    if out.ndim == 3 and out.shape == (c, h, w) and c == 1:  # planar P_Y of a grey image
        out = out.reshape(h, w, 1)
    if out.ndim == 2:
        out = out[:, :, None]
    if tuple(out.shape) != (h, w, c) or out.dtype != np.uint8:
        return {"file": f["path"], "why": f"shape/dtype {tuple(out.shape)} {out.dtype}, "
                                          f"expected {(h, w, c)} uint8"}
    out = np.ascontiguousarray(out)
    if sha256(out.tobytes()) == f["ref_sha256"]:
        return None
    d = {"file": f["path"], "why": "pixels differ"}
    ref = refs.get(f["path"])
    if ref is not None:
        diff = np.abs(out.astype(np.int16) - ref.astype(np.int16))
        d.update(max_abs_diff=int(diff.max()), differing_values=int((diff > 0).sum()),
                 per_channel_max=[int(diff[..., k].max()) for k in range(c)])
    return d


# ---------------------------------------------------------------------------------------
# Decoders


class Sync:
    """Synchronises the device (CuPy, else torch); a no-op on the CPU."""

    def __init__(self, gpu: bool):
        self.stream_ptr, self.fn, self.name = 0, (lambda: None), "none"
        if not gpu:
            return
        try:
            import cupy as cp

            self.stream = cp.cuda.Stream(non_blocking=True)
            self.stream_ptr = self.stream.ptr

            def fn():
                self.stream.synchronize()
                cp.cuda.runtime.deviceSynchronize()

            self.fn, self.name = fn, f"cupy {cp.__version__} (stream + device)"
            return
        except Exception:  # noqa: BLE001 - fall back to torch
            pass
        try:
            import torch

            self.stream = torch.cuda.Stream()
            self.stream_ptr = self.stream.cuda_stream

            def fn():
                self.stream.synchronize()
                torch.cuda.synchronize()

            self.fn, self.name = fn, f"torch {torch.__version__} (stream + device)"
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"neither CuPy nor torch can synchronise the GPU: {e}") from e

    def __call__(self):
        self.fn()


class NvDecoder:
    """nvImageCodec Decoder restricted to one backend kind."""

    def __init__(self, nvimgcodec, kind: str, sync: Sync, threads: int = 0):
        self.n = nvimgcodec
        self.kind = kind
        self.gpu = kind != "CPU_ONLY"
        self.sync = sync
        backend = nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind))
        kw = {} if self.gpu else {"device_id": nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY}
        self.dec = nvimgcodec.Decoder(backends=[backend], max_num_cpu_threads=threads, **kw)
        n = nvimgcodec
        unchanged = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.UNCHANGED,
                                   allow_any_depth=False, sample_format=n.SampleFormat.I_UNCHANGED)
        self.params = {
            "unchanged": {1: unchanged, 3: unchanged, 4: unchanged},
            # The sample formats DALI maps its output types to (GRAY, RGB, ANY_DATA).
            "dali": {1: n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.GRAY,
                                       allow_any_depth=False, sample_format=n.SampleFormat.P_Y),
                     3: n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                                       allow_any_depth=False, sample_format=n.SampleFormat.I_RGB),
                     4: unchanged},
        }
        self.wrong_memory = []

    def decode(self, blobs: list[bytes], mode: str, channels: int):
        streams = [self.n.CodeStream(b) for b in blobs]
        return self.dec.decode(streams, params=self.params[mode][channels],
                               cuda_stream=self.sync.stream_ptr)

    def to_host(self, images, names) -> list[np.ndarray | None]:
        self.sync()
        want = self.n.ImageBufferKind.STRIDED_DEVICE if self.gpu else self.n.ImageBufferKind.STRIDED_HOST
        out = []
        for img, name in zip(images, names):
            if img is None:
                out.append(None)
                continue
            if img.buffer_kind != want:
                self.wrong_memory.append(f"{name}: {img.buffer_kind}")
            host = img.cpu() if self.gpu else img
            out.append(np.array(host, copy=True))
        return out


class TiffFileDecoder:
    """The dry-run's decoder: tifffile on the CPU (what prepare.py checked with)."""

    kind = "tifffile (dry run)"
    gpu = False

    def __init__(self):
        import tifffile

        self.tifffile = tifffile
        self.wrong_memory = []

    def decode(self, blobs, mode, channels):
        return [self.tifffile.imread(io.BytesIO(b)) for b in blobs]

    def to_host(self, images, names):
        return [a if a.ndim == 3 else a[:, :, None] for a in images]


# ---------------------------------------------------------------------------------------
# Phases


def exactness(dec, manifest, blobs, refs, modes, deadline, log) -> dict:
    """Decodes every TIFF in each mode, in batches of one channel count; compares."""
    res = {"decoder": dec.kind, "modes": {}}
    files = [f for f in manifest["files"] if f["path"] in blobs]
    for mode in modes:
        failures, checked, unchecked, t0 = [], 0, 0, time.monotonic()
        for c in (1, 3, 4):
            group = [f for f in files if f["channels"] == c]
            for i in range(0, len(group), EXACT_BATCH):
                batch = group[i:i + EXACT_BATCH]
                if time.monotonic() > deadline:
                    unchecked += len(batch)
                    continue
                try:
                    imgs = dec.decode([blobs[f["path"]] for f in batch], mode, c)
                    outs = dec.to_host(imgs, [f["path"] for f in batch])
                except Exception as e:  # noqa: BLE001 - a raising batch fails its files
                    log(f"  {mode} c{c}: batch raised {type(e).__name__}: {e}")
                    failures += [{"file": f["path"], "why": f"raised {type(e).__name__}: {e}"}
                                 for f in batch]
                    checked += len(batch)
                    continue
                for f, o in zip(batch, outs):
                    d = compare(f, o, refs)
                    if d:
                        failures.append(d)
                checked += len(batch)
        refused = [d["file"] for d in failures if d["why"].startswith("refused")]
        differ = [d for d in failures if not d["why"].startswith("refused")]
        res["modes"][mode] = {"files": len(files), "checked": checked, "unchecked": unchecked,
                              "exact": checked - len(failures), "refused": refused,
                              "not_exact": differ, "seconds": round(time.monotonic() - t0, 2)}
        by_group = {}
        for d in failures:
            g = d["file"].rsplit("/", 1)[0]
            by_group[g] = by_group.get(g, 0) + 1
        log(f"  {dec.kind} [{mode}]: {checked - len(failures)}/{len(files)} exact"
            + (f", {len(refused)} refused" if refused else "")
            + (f", {len(differ)} differ" if differ else "")
            + (f", {unchecked} NOT CHECKED (time budget)" if unchecked else "")
            + (f"; failures by folder {by_group}" if by_group else ""))
        for d in failures[:12]:
            log(f"    {d['file']}: {d['why']}"
                + (f" (max abs diff {d['max_abs_diff']}, {d['differing_values']} values, "
                   f"per channel {d['per_channel_max']})" if "max_abs_diff" in d else ""))
        if len(failures) > 12:
            log(f"    ... {len(failures) - 12} more in the JSON")
    if dec.wrong_memory:
        res["wrong_memory_count"] = len(dec.wrong_memory)
        res["wrong_memory"] = dec.wrong_memory[:50]
        log(f"  {len(dec.wrong_memory)} images not in the expected memory: {dec.wrong_memory[:3]}")
    return res


def timing(dec, blobs_list, batch, rounds, warmup, deadline, log, label) -> dict:
    """images/s of decode(batch of in-memory TIFFs) -> pixels where the decoder puts them."""
    batch_blobs = [blobs_list[i % len(blobs_list)] for i in range(batch)]
    px = sum(375 * 500 * 3 for _ in batch_blobs)  # photos: 375x500x3
    times, first = [], None
    for r in range(warmup + rounds):
        if time.monotonic() > deadline and r > warmup:
            break
        t = time.perf_counter()
        imgs = dec.decode(batch_blobs, "unchanged", 3)
        if getattr(dec, "sync", None):
            dec.sync()
        dt = time.perf_counter() - t
        none = sum(i is None for i in imgs)
        del imgs
        if none:
            return {"batch": batch, "error": f"{none} of {batch} not decoded"}
        if r == 0:
            first = dt
        if r >= warmup:
            times.append(dt)
    if not times:
        return {"batch": batch, "error": "no timed round within the budget", "first_s": first}
    best, med = min(times), sorted(times)[len(times) // 2]
    row = {"batch": batch, "distinct": len(blobs_list), "rounds": len(times),
           "first_batch_s": round(first, 4), "round_s": [round(t, 5) for t in times],
           "images_per_s_best": round(batch / best, 1), "images_per_s_median": round(batch / med, 1),
           "output_GB_per_s_best": round(px / best / 1e9, 3)}
    log(f"  {label} batch {batch}: {row['images_per_s_best']:.0f} img/s best, "
        f"{row['images_per_s_median']:.0f} median ({len(times)} rounds; first batch "
        f"{first * 1e3:.0f} ms; {row['output_GB_per_s_best']} GB/s of pixels)")
    return row


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--out", default=os.environ.get("OUT") or None,
                    help="folder for gpu_ready_check.json/.log (default: $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: CPU decoder, same checks")
    ap.add_argument("--dry-run-decoder", choices=("tifffile", "nvimgcodec-cpu"), default="tifffile")
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--batches", default="128,512")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cpu-batch", type=int, default=128)
    args = ap.parse_args(argv)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    log = Log(args.out)
    budget = Budget(args.budget_s)
    result: dict = {"dry_run": args.dry_run, "failures": [], "phases": {}}
    json_path = os.path.join(args.out, "gpu_ready_check.json") if args.out else None

    def save():
        result["elapsed_s"] = round(budget.elapsed(), 1)
        if json_path:
            with open(json_path + ".part", "w") as f:
                json.dump(result, f, indent=1, default=str)
            os.replace(json_path + ".part", json_path)

    def fail(msg: str):
        result["failures"].append(msg)
        log("FAILURE: " + msg)

    def finish(code: int) -> int:
        result["exit_code"] = code
        result["verdict"] = ("DRY RUN passed" if args.dry_run else "GPU decode verified") \
            if code == 0 else ("could not run" if code == 2 else "FAILED")
        save()
        log(f"== {result['verdict']} (exit {code}) in {budget.elapsed():.0f} s"
            + (f"; JSON {json_path}" if json_path else ""))
        for m in result["failures"]:
            log("  - " + m)
        return code

    # -- 1. environment
    log("== environment" + (" (dry run: no GPU used)" if args.dry_run else ""))
    env = {"python": sys.version.split()[0], "numpy": np.__version__, "platform": platform.platform(),
           "cpus": os.cpu_count()}
    probe = None if args.dry_run else start_torch_probe()
    smi = run_cmd(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                   "--format=csv,noheader"], 20)
    env["nvidia_smi"] = smi
    env["driver_cuda"] = driver_cuda_version()
    try:
        import cupy

        env["cupy"] = cupy.__version__
    except Exception as e:  # noqa: BLE001
        env["cupy"] = f"<{type(e).__name__}>"
    nvimgcodec = None
    want_nv = not args.dry_run or args.dry_run_decoder == "nvimgcodec-cpu"
    if want_nv:
        try:
            from nvidia import nvimgcodec

            env["nvimgcodec"] = nvimgcodec.__version__
            env["nvimgcodec_cuda"] = int(nvimgcodec.__cuda_version__)
            env["nvimgcodec_path"] = os.path.dirname(nvimgcodec.__file__)
        except Exception as e:  # noqa: BLE001
            env["nvimgcodec"] = f"<{type(e).__name__}: {e}>"
    result["env"] = env
    log(f"  python {env['python']}, numpy {env['numpy']}, {env['cpus']} CPUs, cupy {env['cupy']}")
    log(f"  nvidia-smi: {smi}")
    log(f"  driver CUDA version: {env['driver_cuda']}; nvimgcodec: {env.get('nvimgcodec')} "
        f"(built for CUDA {env.get('nvimgcodec_cuda')})")
    save()
    if want_nv and nvimgcodec is None:
        fail(f"nvidia.nvimgcodec does not import: {env['nvimgcodec']}")
        return finish(2)
    if not args.dry_run:
        dc, nc = env["driver_cuda"], env.get("nvimgcodec_cuda")
        if dc is None:
            fail("no CUDA driver (libcuda.so.1 / cuDriverGetVersion) on this machine")
            return finish(2)
        if nc and dc // 1000 < nc // 1000:
            fail(f"the driver supports CUDA {dc // 1000}.{dc % 1000 // 10}, the carried wheels are "
                 f"for CUDA {nc // 1000}: run `prepare.py --cuda {dc // 1000}` and call again")
            return finish(2)

    # -- 2. data
    t = time.monotonic()
    try:
        manifest, blobs, refs, problems = load_data(args.data, log)
    except Exception as e:  # noqa: BLE001
        fail(f"data unreadable in {args.data}: {type(e).__name__}: {e}")
        return finish(2)
    for p in problems:
        fail(p)
    result["data"] = {"dir": args.data, "files": len(manifest["files"]), "full_refs": len(refs),
                      "wheels": [f"{w['name']}=={w['version']}" for w in manifest["wheels"]["wheels"]],
                      "wheels_slimmed": manifest["wheels"]["slimmed"], "encode": manifest["encode"],
                      "reference": manifest["reference"], "prepared": manifest["created"]}
    result["phases"]["load"] = round(time.monotonic() - t, 2)
    save()
    if problems:
        return finish(1)

    photos = [blobs[p] for p in manifest["timing_files"]]
    batches = [int(b) for b in args.batches.split(",") if b.strip()]

    # -- 3. exactness and timing
    if args.dry_run:
        log(f"== exactness, dry run with {args.dry_run_decoder} on the CPU")
        dec = TiffFileDecoder() if args.dry_run_decoder == "tifffile" else \
            NvDecoder(nvimgcodec, "CPU_ONLY", Sync(False), threads=os.cpu_count() or 1)
        ex = exactness(dec, manifest, blobs, refs, ["unchanged", "dali"] if nvimgcodec else
                       ["unchanged"], budget.phase("exact_gpu"), log)
        result["exact_dry_run"] = ex
        save()
        for mode, m in ex["modes"].items():
            bad = len(m["refused"]) + len(m["not_exact"]) + m["unchecked"]
            if bad and args.dry_run_decoder == "tifffile":
                fail(f"dry run [{mode}]: {bad} of {m['files']} TIFFs not decoded exactly by tifffile")
        log("== timing, dry run (CPU decoder; the numbers are not the GPU's)")
        deadline = budget.phase("time_cpu")
        result["timing_dry_run"] = [timing(dec, photos, b, 2, 1, deadline, log, dec.kind)
                                    for b in batches[:1]]
        save()
        result["loaded_libraries"] = loaded_libraries()
        return finish(1 if result["failures"] else 0)

    log("== exactness on the GPU (Backend GPU_ONLY: nvTIFF + nvCOMP)")
    try:
        sync = Sync(True)
        result["env"]["sync"] = sync.name
        gdec = NvDecoder(nvimgcodec, "GPU_ONLY", sync)
    except Exception as e:  # noqa: BLE001
        fail(f"no GPU decoder: {type(e).__name__}: {e}")
        log(traceback.format_exc())
        return finish(2)
    ex = exactness(gdec, manifest, blobs, refs, ["unchanged", "dali"], budget.phase("exact_gpu"), log)
    result["exact_gpu"] = ex
    for mode, m in ex["modes"].items():
        if m["refused"]:
            fail(f"GPU [{mode}]: {len(m['refused'])} TIFFs refused by the GPU backend: "
                 f"{m['refused'][:20]}{' ...' if len(m['refused']) > 20 else ''}")
        if m["not_exact"]:
            names = [d["file"] for d in m["not_exact"]]
            fail(f"GPU [{mode}]: {len(names)} TIFFs not bit-exact: {names[:20]}"
                 f"{' ...' if len(names) > 20 else ''}")
        if m["unchecked"]:
            fail(f"GPU [{mode}]: {m['unchecked']} TIFFs not checked within the time budget")
    if ex.get("wrong_memory"):
        fail(f"GPU: {ex['wrong_memory_count']} decoded images not in device memory")
    result["loaded_libraries_after_gpu_decode"] = loaded_libraries()
    log("  libraries loaded: " + ", ".join(os.path.basename(p)
                                           for p in result["loaded_libraries_after_gpu_decode"]))
    if not any("nvcomp" in p for p in result["loaded_libraries_after_gpu_decode"]):
        log("  NOTE: libnvcomp is not loaded: nvTIFF did not inflate with nvCOMP")
    save()

    log("== exactness with the CPU backend (libtiff extension; information only)")
    try:
        cdec = NvDecoder(nvimgcodec, "CPU_ONLY", Sync(False), threads=os.cpu_count() or 1)
        result["exact_cpu"] = exactness(cdec, manifest, blobs, refs, ["unchanged"],
                                        budget.phase("exact_cpu"), log)
    except Exception as e:  # noqa: BLE001
        cdec = None
        result["exact_cpu"] = {"error": f"{type(e).__name__}: {e}"}
        log(f"  CPU backend unavailable: {type(e).__name__}: {e}")
    save()

    log(f"== timing: {len(photos)} distinct 500x375 RGB photo TIFFs, repeated to the batch")
    result["timing_gpu"] = []
    for b in batches:
        deadline = min(budget.phase("time_gpu"), time.monotonic() + BUDGETS["time_gpu"] / len(batches))
        try:
            result["timing_gpu"].append(timing(gdec, photos, b, args.rounds, args.warmup, deadline,
                                               log, "GPU_ONLY"))
        except Exception as e:  # noqa: BLE001
            result["timing_gpu"].append({"batch": b, "error": f"{type(e).__name__}: {e}"})
            log(f"  GPU batch {b}: {type(e).__name__}: {e}")
        save()
    for row in result["timing_gpu"]:
        if "error" in row:
            fail(f"GPU timing batch {row['batch']}: {row['error']}")
    if cdec is not None:
        try:
            result["timing_cpu"] = [timing(cdec, photos, args.cpu_batch, 3, 1,
                                           budget.phase("time_cpu"), log,
                                           f"CPU_ONLY ({os.cpu_count()} threads)")]
        except Exception as e:  # noqa: BLE001
            result["timing_cpu"] = [{"error": f"{type(e).__name__}: {e}"}]
    torch_info = finish_torch_probe(probe, max(1.0, min(30.0, budget.end - time.monotonic() - 5)))
    result["env"].update(torch_info)
    log(f"  torch: {torch_info.get('torch')} (CUDA {torch_info.get('torch_cuda')}, "
        f"device {torch_info.get('device')})")
    result["loaded_libraries"] = loaded_libraries()
    return finish(1 if result["failures"] else 0)


if __name__ == "__main__":
    sys.exit(main())
