"""Prepares the GPU-ready cache's device check (run HERE, on the development machine).

Whether nvImageCodec's nvTIFF extension decodes the cache's TIFFs (`ready_forms.encode_tiff`:
Adobe Deflate, predictor 2, ~64 KB strips) on a GPU, bit-exactly, is checked by
`device_check.py` on a machine that has a GPU but no TensorFlow, DALI or package index. This
script makes everything that check needs, in two ignored paths that the device tool carries:

- `.whl/`: nvImageCodec's wheels for one CUDA major (default 13: nvidia-nvimgcodec-cu13,
  nvidia-nvtiff-cu13, nvidia-libnvcomp-cu13 and nvJPEG, which nvTIFF may load), downloaded
  once into `.cache/gpu_ready_check/wheels/` and copied SLIMMED: only the files a Python 3.12
  nvTIFF/libtiff decode loads are kept (the other CPython ABIs' modules, the other codecs'
  extensions, headers and tools are dropped; RECORD is rewritten). The full cu13 set is 57 MiB,
  the full cu12 set 79 MiB, over what one device call carries (64 MiB with the data).
- `build/gpu_ready_check/`: TIFFs made with `ready_forms.encode_tiff` of Keras's pixels
  (`tf.io.decode_image(png, channels=C, expand_animations=False)`) of
  (a) the project's sample photos (`dali_loader.tools.sample`, 500x375 RGB, C=3), a few of
      them also in C=1 and C=4 and as odd-sized crops (multi-strip grey and RGBA images);
  (b) every valid PngSuite file (names not starting with "x") in C = 1, 3 and 4;
  with `manifest.json` (per file: shape, SHA-256 of the TIFF and of the reference pixels) and
  `refs.npz` (the reference pixels themselves for PngSuite, the crops, one photo per extra
  colour mode and the first `--full-ref-photos` photos; the others are checked by their
  SHA-256, which is as exact, and keeps the carry small).

It checks here what it can: the wheel set's names, versions and dependencies, and that
every TIFF decodes (tifffile) to its reference. It prints the carried total and fails when it
is over 64 MiB.

    .venv/bin/python device_checks/gpu_ready_check/prepare.py [--cuda 13|12] [--photos 64]
        [--py-tags 312] [--full-wheels] [--force] [--print-device-call]
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

MiB = 1024 * 1024
CARRY_LIMIT = 64 * MiB  # what one device call carries: repo files + carried paths
WHEEL_SOFT_LIMIT = 45 * MiB  # leaves room for the data
WHL_DIR = os.path.join(REPO, ".whl")
ORIG_DIR = os.path.join(REPO, ".cache", "gpu_ready_check", "wheels")
DATA_DIR = os.path.join(REPO, "build", "gpu_ready_check")
CARRY = [".whl", "build/gpu_ready_check"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64"]

# The wheel sets. nvimgcodec 0.9.0.20 is the version DALI 2.4.0 depends on; its "nvtiff"
# extra asks for nvidia-nvtiff >= 0.8.0 and nvidia-libnvcomp >= 5, < 6 (so not nvCOMP 6).
# nvJPEG: libnvtiff names libnvjpeg (JPEG-compressed TIFFs); carried in case nvTIFF loads it
# on start-up (about 3 MB; whether it gets loaded is reported by the device check).
WHEEL_SETS = {
    13: [("nvidia-nvimgcodec-cu13", "0.9.0.20"), ("nvidia-nvtiff-cu13", "0.8.0.82"),
         ("nvidia-libnvcomp-cu13", "5.3.0.16"), ("nvidia-nvjpeg", "13.0.1.86")],
    12: [("nvidia-nvimgcodec-cu12", "0.9.0.20"), ("nvidia-nvtiff-cu12", "0.8.0.82"),
         ("nvidia-libnvcomp-cu12", "5.3.0.16"), ("nvidia-nvjpeg-cu12", "12.4.0.76")],
}
# Binaries kept in the slimmed wheels (every .py file, license and dist-info file is kept too).
KEEP_BINARIES = [
    r"nvidia/nvimgcodec/nvimgcodec_impl\.cpython-(?P<py>\d+)-x86_64-linux-gnu\.so",
    r"nvidia/nvimgcodec/libnvimgcodec\.so\.\d+",
    r"nvidia/nvimgcodec/extensions/libnvtiff_ext\.so[.\d]*",  # GPU: nvTIFF (+ nvCOMP)
    r"nvidia/nvimgcodec/extensions/libtiff_ext\.so[.\d]*",  # CPU backend, for comparison
    r"nvidia/nvtiff/lib/libnvtiff\.so[.\d]*",
    r"nvidia/libnvcomp/lib64/libnvcomp\.so[.\d]*",
    r"nvidia/(cu13/lib|nvjpeg/lib)/libnvjpeg\.so[.\d]*",
]
# Files that must be in the slimmed set (one pattern each), or the check cannot run.
ESSENTIAL = [r"nvimgcodec_impl\.cpython-{py}-", r"/libnvimgcodec\.so", r"/libnvtiff_ext\.so",
             r"/libtiff_ext\.so", r"/libnvtiff\.so", r"/libnvcomp\.so", r"/libnvjpeg\.so"]

N_EXTRA_MODE_PHOTOS = 4  # photos also written in C=1 and C=4
DEFAULT_FULL_REF_PHOTOS = 2


def log(*a) -> None:
    print(*a, flush=True)


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_stem(name: str) -> str:
    return name.replace("-", "_")


def find_wheel(folder: str, name: str, version: str) -> str | None:
    if not os.path.isdir(folder):
        return None
    pre = f"{wheel_stem(name)}-{version}-"
    hits = sorted(f for f in os.listdir(folder) if f.startswith(pre) and f.endswith(".whl"))
    return os.path.join(folder, hits[0]) if hits else None


def download(name: str, version: str) -> str:
    """The original wheel, from the cache or downloaded with pip (cp312, manylinux x86-64)."""
    have = find_wheel(ORIG_DIR, name, version)
    if have:
        return have
    os.makedirs(ORIG_DIR, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", ORIG_DIR]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd.append(f"{name}=={version}")
    log(f"  downloading {name}=={version}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    have = find_wheel(ORIG_DIR, name, version)
    if r.returncode != 0 or not have:
        err = "\n".join(line for line in (r.stderr or "").splitlines() if "is ignored" not in line)
        raise SystemExit(f"pip download {name}=={version} failed:\n{err}")
    return have


def metadata(whl: str) -> dict:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    md = {"Requires-Dist": []}
    for line in text.splitlines():
        if not line.strip():
            break  # the body starts
        k, _, v = line.partition(": ")
        if k == "Requires-Dist":
            md[k].append(v)
        elif k in ("Name", "Version"):
            md[k] = v
    return md


def check_dependencies(wheels: dict[str, str]) -> list[str]:
    """The set's dependency problems: a plain Requires-Dist, or one of nvimgcodec's "nvtiff"
    extra (the GPU TIFF decode), that the set does not satisfy."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    have = {canonicalize_name(n): metadata(p)["Version"] for n, p in wheels.items()}
    problems = []
    for n, p in wheels.items():
        for spec in metadata(p)["Requires-Dist"]:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": "nvtiff"}):
                continue  # another extra (nvjpeg2k, all, ...)
            v = have.get(canonicalize_name(req.name))
            if v is None:
                problems.append(f"{n} needs {spec}: not in the set")
            elif req.specifier and not req.specifier.contains(v, prereleases=True):
                problems.append(f"{n} needs {spec}: the set has {v}")
    return problems


def slim_wheel(src: str, dst_dir: str, py_tags: list[str], full: bool) -> dict:
    """Copies wheel `src` into `dst_dir`, keeping only the files KEEP_BINARIES names (for
    the CPython versions `py_tags`), .py files, licenses and dist-info; rewrites RECORD."""
    keep_bin = [re.compile(p + "$") for p in KEEP_BINARIES]
    dst = os.path.join(dst_dir, os.path.basename(src))
    kept, dropped = [], []
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        rows = []
        tmp = dst + ".part"
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in infos:
                n = info.filename
                if n == record_name or n.endswith("/"):
                    continue
                keep = full or ".dist-info/" in n or n.endswith(".py") \
                    or os.path.basename(n).upper().startswith(("LICENSE", "NOTICE"))
                if not keep:
                    for rx in keep_bin:
                        m = rx.match(n)
                        if m:
                            keep = "py" not in rx.groupindex or m.group("py") in py_tags
                            break
                if not keep:
                    dropped.append((n, info.file_size))
                    continue
                data = zin.read(info)
                zi = zipfile.ZipInfo(n, date_time=info.date_time)
                zi.external_attr = info.external_attr
                zi.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(zi, data, compresslevel=9)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                rows.append((n, "sha256=" + digest.decode(), str(len(data))))
                kept.append((n, len(data)))
            rows.append((record_name, "", ""))
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            zi = zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zout.writestr(zi, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp, dst)
    return {"file": os.path.basename(dst), "bytes": os.path.getsize(dst),
            "original_bytes": os.path.getsize(src), "original_sha256": sha256_file(src),
            "sha256": sha256_file(dst), "kept": [n for n, _ in kept],
            "dropped_files": len(dropped), "dropped_unpacked_bytes": sum(s for _, s in dropped)}


def prepare_wheels(cuda: int, py_tags: list[str], full: bool, force: bool) -> dict:
    """Fills `.whl/` with the slimmed set for `cuda` (other wheels there are removed)."""
    log(f"== wheels: CUDA {cuda} set, CPython {','.join(py_tags)}"
        + (", full (not slimmed)" if full else ", slimmed"))
    originals = {name: download(name, ver) for name, ver in WHEEL_SETS[cuda]}
    for name, ver in WHEEL_SETS[cuda]:
        md = metadata(originals[name])
        if md.get("Version") != ver:
            raise SystemExit(f"{originals[name]}: METADATA says version {md.get('Version')}, not {ver}")
    problems = check_dependencies(originals)
    if problems:
        raise SystemExit("wheel set incomplete:\n  " + "\n  ".join(problems))
    os.makedirs(WHL_DIR, exist_ok=True)
    state_path = os.path.join(os.path.dirname(ORIG_DIR), "slim.json")
    state = json.load(open(state_path)) if os.path.exists(state_path) else {}
    wanted = {os.path.basename(p) for p in originals.values()}
    for f in os.listdir(WHL_DIR):  # e.g. the other CUDA major's set
        if f not in wanted:
            log(f"  removing .whl/{f} (not in this set)")
            os.remove(os.path.join(WHL_DIR, f))
    infos = []
    for name, src in originals.items():
        base = os.path.basename(src)
        dst = os.path.join(WHL_DIR, base)
        st = state.get(base)
        recipe = {"py_tags": py_tags, "full": full, "original_sha256": sha256_file(src)}
        if (not force and st and os.path.exists(dst) and st.get("recipe") == recipe
                and sha256_file(dst) == st["info"]["sha256"]):
            info = st["info"]
            log(f"  .whl/{base}: present")
        else:
            info = slim_wheel(src, WHL_DIR, py_tags, full)
            state[base] = {"recipe": recipe, "info": info}
            log(f"  .whl/{base}: written")
        info = dict(info, name=name, version=metadata(src)["Version"],
                    requires=metadata(src)["Requires-Dist"])
        infos.append(info)
    json.dump(state, open(state_path, "w"), indent=1)
    kept_all = [n for i in infos for n in i["kept"]]
    for pat in ESSENTIAL:
        for py in py_tags if "{py}" in pat else [None]:
            rx = re.compile(pat.format(py=py))
            if not any(rx.search(n) for n in kept_all):
                raise SystemExit(f"slimmed wheel set lacks a file matching {rx.pattern!r}")
    for i in infos:
        log(f"  {i['name']}=={i['version']}: {i['bytes'] / MiB:.2f} MiB carried "
            f"(original {i['original_bytes'] / MiB:.2f} MiB; {i['dropped_files']} files dropped)")
    total = sum(i["bytes"] for i in infos)
    orig = sum(i["original_bytes"] for i in infos)
    log(f"  wheels: {total / MiB:.2f} MiB carried (the full set: {orig / MiB:.2f} MiB); "
        "dependencies of the set all present")
    if total > WHEEL_SOFT_LIMIT:
        log(f"  WARNING: over {WHEEL_SOFT_LIMIT / MiB:.0f} MiB of wheels")
    return {"cuda": cuda, "py_tags": py_tags, "slimmed": not full, "bytes": total,
            "original_bytes": orig, "wheels": infos}


# ---------------------------------------------------------------------------------------
# Data


def prepare_data(num_photos: int, full_ref_photos: int, pngsuite: str) -> dict:
    import numpy as np
    import tensorflow as tf
    import tifffile

    from dali_loader.formats import ready as ready_forms
    from dali_loader.tools.sample import make_sample_dataset

    log(f"== data: {num_photos} sample photos, PngSuite from {pngsuite}")
    if os.path.isdir(DATA_DIR):
        shutil.rmtree(DATA_DIR)
    os.makedirs(DATA_DIR)
    files: list[dict] = []
    refs: dict[str, np.ndarray] = {}

    def keras_decode(data: bytes, channels: int) -> np.ndarray:
        # What Keras's image_dataset_from_directory decodes (before its resize).
        return tf.io.decode_image(data, channels=channels, expand_animations=False).numpy()

    def add(rel: str, px: np.ndarray, group: str, source: str, full_ref: bool) -> None:
        px = np.ascontiguousarray(px)
        blob = ready_forms.encode_tiff(px)
        path = os.path.join(DATA_DIR, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(blob)
        # Checked here already: tifffile gives the reference back.
        back = ready_forms.decode_tiff(blob)
        if back.shape != px.shape or not np.array_equal(back, px):
            raise SystemExit(f"{rel}: tifffile does not give the reference back")
        with tifffile.TiffFile(io.BytesIO(blob)) as t:
            page = t.pages[0]
            strips = len(page.dataoffsets)
            tags = {"compression": int(page.compression), "predictor": int(page.predictor),
                    "rows_per_strip": int(page.rowsperstrip)}
        key = rel.replace("/", "__") if full_ref else None
        if key:
            refs[key] = px
        h, w, c = px.shape
        files.append({"path": rel, "group": group, "source": source, "channels": c,
                      "shape": [h, w, c], "tiff_bytes": len(blob), "tiff_sha256": sha256_bytes(blob),
                      "ref_sha256": sha256_bytes(px.tobytes()), "ref_key": key, "strips": strips,
                      **tags})

    # (a) photos: 500x375 RGB; a few also grey and RGBA (multi-strip C=1 and C=4), and crops
    # of odd sizes (rows per strip not dividing the height, odd row lengths).
    with tempfile.TemporaryDirectory() as tmp:
        make_sample_dataset(tmp, num_images=num_photos, seed=0)
        pngs = sorted(os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs
                      if f.endswith(".png"))
        blobs = [(os.path.basename(p), open(p, "rb").read()) for p in pngs]
    png_bytes = sum(len(b) for _, b in blobs)
    for i, (name, data) in enumerate(blobs):
        add(f"photo/c3/p{i:03d}.tif", keras_decode(data, 3), "photo", name, i < full_ref_photos)
    for c in (1, 4):
        for i, (name, data) in enumerate(blobs[:N_EXTRA_MODE_PHOTOS]):
            add(f"photo/c{c}/p{i:03d}.tif", keras_decode(data, c), "photo_mode", name, i == 0)
    for c in (1, 3, 4):
        for j, (name, data) in enumerate(blobs[:2]):
            px = keras_decode(data, c)
            crop = px[:257, :383] if j == 0 else px[3:372, 1:498]
            add(f"odd/c{c}/crop{j}.tif", crop, "odd", f"{name} cropped", True)

    # (b) every valid PngSuite file in Keras's three colour modes.
    suite_names = []
    if pngsuite and os.path.isdir(pngsuite):
        suite_names = sorted(f for f in os.listdir(pngsuite)
                             if f.endswith(".png") and not f.startswith("x"))
        for c in (1, 3, 4):
            for n in suite_names:
                data = open(os.path.join(pngsuite, n), "rb").read()
                add(f"pngsuite/c{c}/{n[:-4]}.tif", keras_decode(data, c), "pngsuite", n, True)
    else:
        raise SystemExit(f"PngSuite folder not found: {pngsuite!r}")

    np.savez_compressed(os.path.join(DATA_DIR, "refs.npz"), **refs)
    timing = [f["path"] for f in files if f["group"] == "photo"]
    groups = {}
    for f in files:
        g = groups.setdefault(f"{f['group']}/c{f['channels']}", {"files": 0, "tiff_bytes": 0})
        g["files"] += 1
        g["tiff_bytes"] += f["tiff_bytes"]
    for g, v in sorted(groups.items()):
        log(f"  {g}: {v['files']} TIFFs, {v['tiff_bytes'] / MiB:.2f} MiB")
    photo_tiff = sum(f["tiff_bytes"] for f in files if f["group"] == "photo")
    log(f"  photos: TIFF / PNG bytes = {photo_tiff / png_bytes:.3f}; "
        f"{len(refs)} full references in refs.npz "
        f"({os.path.getsize(os.path.join(DATA_DIR, 'refs.npz')) / MiB:.2f} MiB), "
        f"SHA-256 for all {len(files)}")
    log(f"  tifffile decodes all {len(files)} TIFFs to their references")
    return {
        "files": files, "timing_files": timing,
        "pngsuite": {"dir": os.path.relpath(pngsuite, REPO) if pngsuite.startswith(REPO) else pngsuite,
                     "files": len(suite_names)},
        "photos": {"count": num_photos, "png_bytes": png_bytes, "full_refs": full_ref_photos},
        "encode": {"function": "dali_loader.formats.ready.encode_tiff",
                   "level": ready_forms.TIFF_LEVEL, "strip_bytes": ready_forms.STRIP_BYTES},
        "reference": "tf.io.decode_image(png, channels=C, expand_animations=False)",
        "versions": {"tensorflow": tf.__version__, "tifffile": tifffile.__version__,
                     "numpy": np.__version__, "python": sys.version.split()[0]},
    }


def tree_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def repo_bytes() -> int:
    """Tracked plus untracked-not-ignored files: what the device tool copies besides `carry`."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True).stdout.decode()
    return sum(os.path.getsize(os.path.join(REPO, p)) for p in out.split("\0")
               if p and os.path.isfile(os.path.join(REPO, p)))


def device_call() -> str:
    return json.dumps({"command": "bash device_checks/gpu_ready_check/run_on_device.sh",
                       "carry": CARRY, "timeout_s": 330})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cuda", type=int, choices=sorted(WHEEL_SETS), default=13,
                    help="nvImageCodec wheels for this CUDA major (13 needs driver >= 580)")
    ap.add_argument("--photos", type=int, default=None,
                    help="distinct sample photos (default: 48 with --cuda 13, 16 with 12)")
    ap.add_argument("--full-ref-photos", type=int, default=DEFAULT_FULL_REF_PHOTOS,
                    help="photos whose reference pixels go into refs.npz (others: SHA-256)")
    ap.add_argument("--pngsuite", default=os.path.join(REPO, "..", "shared", "pngsuite"))
    ap.add_argument("--py-tags", default="312",
                    help="CPython versions whose nvimgcodec module to keep, e.g. 312 or 312,311")
    ap.add_argument("--full-wheels", action="store_true", help="do not slim the wheels")
    ap.add_argument("--force", action="store_true", help="rewrite the slimmed wheels")
    ap.add_argument("--skip-data", action="store_true", help="only the wheels")
    ap.add_argument("--print-device-call", action="store_true",
                    help="only print the device tool's call and exit")
    args = ap.parse_args(argv)
    if args.print_device_call:
        print(device_call())
        return 0
    photos = args.photos or (48 if args.cuda == 13 else 16)
    if photos < 1 or args.full_ref_photos < 0:
        ap.error("--photos must be >= 1 and --full-ref-photos >= 0")
    py_tags = [t.strip() for t in args.py_tags.split(",") if t.strip()]
    t0 = time.perf_counter()
    wheels = prepare_wheels(args.cuda, py_tags, args.full_wheels, args.force)
    data = None
    if not args.skip_data:
        data = prepare_data(photos, args.full_ref_photos, os.path.abspath(args.pngsuite))
    manifest_path = os.path.join(DATA_DIR, "manifest.json")
    if data is not None:
        manifest = {"format": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "command": " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
                    "wheels": wheels, **data}
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=1)
    elif os.path.exists(manifest_path):
        manifest = json.load(open(manifest_path))
        manifest["wheels"] = wheels
        json.dump(manifest, open(manifest_path, "w"), indent=1)

    w, d, r = tree_bytes(WHL_DIR), tree_bytes(DATA_DIR) if os.path.isdir(DATA_DIR) else 0, repo_bytes()
    total = w + d + r
    log("== carried by the device call")
    log(f"  .whl/ {w / MiB:.2f} MiB + build/gpu_ready_check/ {d / MiB:.2f} MiB "
        f"+ repository files {r / MiB:.2f} MiB = {total / MiB:.2f} MiB "
        f"(limit {CARRY_LIMIT / MiB:.0f} MiB)")
    log(f"  prepared in {time.perf_counter() - t0:.0f} s")
    if total > CARRY_LIMIT:
        log(f"FAILED: {total / MiB:.2f} MiB is over the {CARRY_LIMIT / MiB:.0f} MiB the device "
            "tool carries (fewer --photos?)")
        return 1
    log("== the device tool's call (run; no GPU needed here):")
    log("  " + device_call())
    return 0


if __name__ == "__main__":
    sys.exit(main())
