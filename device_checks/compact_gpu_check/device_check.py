"""Compact GPU-ready entries decoded on a GPU (issue 38): exact, and how fast?

Runs on the device (Python 3.12, numpy, CuPy; nvCOMP 6's Python API from the carried
wheels; the native core `libdlpng.so` carried from the build machine). It

1. makes `--images` seeded photo-like 500x375 RGB images (`testing.pngs.photo`), their
   compact entries (the native core, `formats.compact.encode`: row delta, zstd-1, 64 KiB
   chunks) and their PNGs (`testing.pngs.encode_png`);
2. decodes batches of entries on the GPU: every entry's chunks in one nvCOMP batched Zstd
   call (`Codec(algorithm="Zstd")`, the chunks carved out of one device buffer with
   `nvcomp.as_arrays`; https://docs.nvidia.com/cuda/nvcomp/py_api.html), then the row
   delta undone as a uint8 prefix sum down each column (`cupy.cumsum(axis=1)` over the
   batch's same-size images);
3. compares every pixel with the CPU decode (`compact.decode`, the native core) and the
   source pixels;
4. times batches of 64, 256 and 1,024 from entry bytes in pinned host memory to pixels in
   GPU memory (best of `--repeats`), against the native core's entry decode and its PNG
   decode on all cores (a thread pool: ctypes releases the GIL).

`--dry-run`: no GPU, zstd and the prefix sum on the CPU (numpy), the same plumbing. Writes
`$OUT/compact_gpu_check.json`. Exit 0: every pixel exact; 1: a mismatch; 2: could not run.
With `--core` (the loader's own GPU decode through ctypes, `CoreDecoder`) it also tries
nvCOMP's Gzip decompressor, NAIVE and LOOKAHEAD, on the same PNGs' deflate streams
(`lookahead_check`): exactness against zlib and img/s per batch (issue 38 item 4).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time

import numpy as np

from dali_loader.decode import png_native
from dali_loader.formats import compact
from support.pngs import encode_png, photo  # tests/support: run_on_device.sh adds tests/

BATCHES = (64, 256, 1024)


def make_data(n: int, seed: int = 38):
    """(pixels, entries, pngs) of `n` photo-like 500x375 images."""
    rng = np.random.default_rng(seed)
    base = [photo(rng, 375, 500) for _ in range(min(n, 32))]
    pixels = [np.ascontiguousarray(np.roll(base[i % len(base)], i // len(base), axis=1))
              for i in range(n)]
    entries = [bytes(compact.encode(p)) for p in pixels]
    pngs = [encode_png(p, (1, 2, 4)) for p in pixels]
    return pixels, entries, pngs


def chunk_table(entries: list[bytes]):
    """Every chunk of every entry: source offsets and sizes in the entries' concatenation,
    destination offsets and sizes in the pixels' concatenation, and each image's offset."""
    src_off, src_len, dst_off, dst_len, img_off = [], [], [], [], []
    at_src = at_dst = 0
    for e in entries:
        head = compact.read_header(e)
        sizes = np.frombuffer(e, "<u4", head.chunks, compact.FIXED_HEADER)
        pos = at_src + compact.FIXED_HEADER + 4 * head.chunks
        img_off.append(at_dst)
        for k, n in enumerate(sizes):
            src_off.append(pos)
            src_len.append(int(n))
            dst_off.append(at_dst + k * head.chunk_bytes)
            dst_len.append(min(head.chunk_bytes, head.nbytes - k * head.chunk_bytes))
            pos += int(n)
        at_src += len(e)
        at_dst += head.nbytes
    return src_off, src_len, dst_off, dst_len, img_off, at_dst


class GpuDecoder:
    """nvCOMP batched Zstd + a CuPy prefix sum; `--dry-run`: numpy and the core's zstd."""

    def __init__(self, dry: bool):
        self.dry = dry
        if not dry:
            import cupy
            import cupyx
            from nvidia import nvcomp

            self.cp, self.cupyx, self.nvcomp = cupy, cupyx, nvcomp
            self.stream = cupy.cuda.get_current_stream()
            self.codec = nvcomp.Codec(algorithm="Zstd", device_id=0,
                                      cuda_stream=self.stream.ptr)

    def host(self, entries: list[bytes]) -> np.ndarray:
        """The entries back to back in (pinned) host memory."""
        total = sum(map(len, entries))
        buf = (np.empty(total, np.uint8) if self.dry else
               self.cupyx.empty_pinned(total, np.uint8))
        at = 0
        for e in entries:
            buf[at:at + len(e)] = np.frombuffer(e, np.uint8)
            at += len(e)
        return buf

    def decode(self, host: np.ndarray, table, shape):
        """All images' pixels, (B, H, W*C) uint8, on the device (numpy in a dry run)."""
        src_off, src_len, dst_off, dst_len, img_off, total = table
        if self.dry:
            flat = np.empty(total, np.uint8)
            for s, n, d, m in zip(src_off, src_len, dst_off, dst_len):
                flat[d:d + m] = np.frombuffer(compact.zstd_frame(host[s:s + n], m), np.uint8)
            img = flat.reshape(len(img_off), shape[0], -1)
            return np.cumsum(img, axis=1, dtype=np.uint8)
        cp = self.cp
        src = cp.asarray(host)
        dst = cp.empty(total, cp.uint8)
        out = self.nvcomp.as_arrays(dst, dst_off, dst_len, cuda_stream=self.stream.ptr)
        self.codec.decode(self.nvcomp.as_arrays(src, src_off, src_len,
                                                cuda_stream=self.stream.ptr), out=out)
        got = np.array([int(x) for x in out.buffer_sizes], np.int64)
        if not np.array_equal(got, dst_len):
            raise RuntimeError(f"nvCOMP decoded {int((got != dst_len).sum())} chunks to other sizes")
        img = dst.reshape(len(img_off), shape[0], -1)
        out_img = cp.cumsum(img, axis=1, dtype=cp.uint8)
        cp.cuda.runtime.deviceSynchronize()
        return out_img

    def to_host(self, img) -> np.ndarray:
        return img if self.dry else self.cp.asnumpy(img)


class CoreDecoder(GpuDecoder):
    """The loader's own GPU decode (`native/entry_gpu.cu`, what `entry_decoder="gpu"` runs
    inside DALI) through ctypes: the entries copied to the device as they are, then
    `dl_entry_gpu_decode` (nvCOMP's batched Zstd and CRC32 via its C API, the unfilter
    kernel) on CuPy's stream. Needs `_build/libdlentry_gpu.so` and nvCOMP's
    `libnvcomp.so.5` on LD_LIBRARY_PATH (run_on_device.sh --core)."""

    HEAD = 4096  # entry_gpu.h's DL_GPU_HEAD

    def __init__(self):
        import ctypes

        import cupy
        import cupyx

        from dali_loader.native import BUILD_DIR

        class Item(ctypes.Structure):
            _fields_ = [("entry", ctypes.c_void_p), ("size", ctypes.c_size_t),
                        ("head", ctypes.c_void_p), ("head_size", ctypes.c_size_t),
                        ("out", ctypes.c_void_p), ("out_size", ctypes.c_size_t)]

        self.dry, self.cp, self.cupyx, self.ctypes, self.Item = False, cupy, cupyx, ctypes, Item
        self.stream = cupy.cuda.get_current_stream()
        self.lib = ctypes.CDLL(str(BUILD_DIR / "libdlentry_gpu.so"))
        self.lib.dl_entry_gpu_decode.argtypes = [
            ctypes.POINTER(Item), ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p)]

    def decode(self, host: np.ndarray, table, shape):
        """All images' pixels, (B, H, W*C) uint8, on the device: one copy of the entries
        to the device, then one `dl_entry_gpu_decode` (which waits for its batch)."""
        ct, cp = self.ctypes, self.cp
        _, _, _, _, img_off, total = table
        dev = cp.asarray(host)
        out = cp.empty(total, cp.uint8)
        starts = [0] + [img_off[k + 1] for k in range(len(img_off) - 1)]
        ends = starts[1:] + [total]
        items = (self.Item * len(img_off))()
        host_base = host.ctypes.data
        for k, (a, b) in enumerate(self.bounds):  # host()'s, for this batch
            items[k] = self.Item(dev.data.ptr + a, b - a, host_base + a, min(b - a, self.HEAD),
                                 out.data.ptr + starts[k], ends[k] - starts[k])
        bad, why = ct.c_int(), ct.c_char_p()
        if self.lib.dl_entry_gpu_decode(items, len(img_off), 0, self.stream.ptr,
                                        ct.byref(bad), ct.byref(why)):
            raise RuntimeError(f"dl_entry_gpu_decode refused item {bad.value}: "
                               f"{(why.value or b'').decode()}")
        return out.reshape(len(img_off), shape[0], -1)

    def host(self, entries: list[bytes]) -> np.ndarray:
        """The entries back to back in pinned host memory (their bounds kept)."""
        at, self.bounds = 0, []
        for e in entries:
            self.bounds.append((at, at + len(e)))
            at += len(e)
        return super().host(entries)


def png_as_gzip(png: bytes) -> tuple[bytes, bytes]:
    """A PNG's zlib stream (its IDATs) rewrapped as one gzip member (the same deflate
    bytes; a gzip header, the inflated bytes' CRC-32 and size), and those bytes."""
    import struct
    import zlib

    at, idat = 8, []
    while at < len(png):
        n, kind = struct.unpack(">I4s", png[at:at + 8])
        if kind == b"IDAT":
            idat.append(png[at + 8:at + 8 + n])
        at += 12 + n
    stream = b"".join(idat)
    raw = zlib.decompress(stream)
    gz = (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + stream[2:-4]
          + struct.pack("<II", zlib.crc32(raw), len(raw) & 0xFFFFFFFF))
    return gz, raw


def lookahead_check(pngs: list[bytes], batches, repeats: int) -> dict:
    """nvCOMP's Gzip decompressor, NAIVE and LOOKAHEAD (its C API through ctypes:
    nvcompBatchedGzipDecompressAsync, opts.algorithm; gzip.h), on real PNG streams: each
    PNG's one deflate stream as a gzip member, a batch per call. Every output against
    zlib's; img/s per batch and algorithm (inflate only: the PNG filters stay)."""
    import ctypes

    import cupy as cp

    lib = ctypes.CDLL("libnvcomp.so.5")

    class Opts(ctypes.Structure):  # nvcompBatchedGzipDecompressOpts_t
        _fields_ = [("backend", ctypes.c_int), ("algorithm", ctypes.c_int),
                    ("sort_before_hw_decompress", ctypes.c_int),
                    ("reserved", ctypes.c_char * 52)]

    sz, vp = ctypes.c_size_t, ctypes.c_void_p
    lib.nvcompBatchedGzipDecompressGetTempSizeAsync.argtypes = [
        sz, sz, Opts, ctypes.POINTER(sz), sz]
    lib.nvcompBatchedGzipDecompressAsync.argtypes = [vp, vp, vp, vp, sz, vp, sz, vp, Opts, vp, vp]
    members = [png_as_gzip(p) for p in pngs]
    out: dict = {}
    stream = cp.cuda.get_current_stream()
    for b in batches:
        if b > len(members):
            continue
        batch = members[:b]
        ins = [cp.asarray(np.frombuffer(g, np.uint8)) for g, _ in batch]
        outs = [cp.empty(len(r), cp.uint8) for _, r in batch]
        in_ptrs = cp.asarray([a.data.ptr for a in ins], cp.uint64)
        in_sizes = cp.asarray([a.size for a in ins], cp.uint64)
        out_ptrs = cp.asarray([a.data.ptr for a in outs], cp.uint64)
        out_sizes = cp.asarray([a.size for a in outs], cp.uint64)
        actual = cp.empty(b, cp.uint64)
        status = cp.empty(b, cp.int32)
        for name, algorithm in (("naive", 0), ("lookahead", 1)):
            opts = Opts(0, algorithm, 0)
            temp_bytes = sz(0)
            rc = lib.nvcompBatchedGzipDecompressGetTempSizeAsync(
                b, max(a.size for a in outs), opts, ctypes.byref(temp_bytes),
                sum(a.size for a in outs))
            if rc:
                out[f"{b}/{name}"] = {"error": f"GetTempSizeAsync: nvcompStatus_t {rc}"}
                continue
            temp = cp.empty(max(temp_bytes.value, 1), cp.uint8)
            times = []
            for _ in range(repeats + 1):  # the first: warm-up
                t0 = time.perf_counter()
                rc = lib.nvcompBatchedGzipDecompressAsync(
                    in_ptrs.data.ptr, in_sizes.data.ptr, out_sizes.data.ptr, actual.data.ptr, b,
                    temp.data.ptr, temp_bytes.value, out_ptrs.data.ptr, opts, status.data.ptr,
                    stream.ptr)
                stream.synchronize()
                times.append(time.perf_counter() - t0)
            exact = (rc == 0 and bool((status == 0).all()) and
                     bool((actual == out_sizes).all()) and
                     all(bytes(cp.asnumpy(o)) == r for o, (_, r) in zip(outs, batch)))
            out[f"{b}/{name}"] = {"exact": exact, "best_img_s": b / min(times[1:]),
                                  "median_s": float(np.median(times[1:]))}
    return out


def cpu_rate(fn, items, threads: int) -> float:
    """Images/s of `fn` over `items` on a pool of `threads` (best of 3)."""
    best = 0.0
    with cf.ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            t0 = time.perf_counter()
            list(pool.map(fn, items, chunksize=8))
            best = max(best, len(items) / (time.perf_counter() - t0))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--core", action="store_true",
                        help="decode with the loader's own GPU core (libdlentry_gpu.so, "
                             "nvCOMP's C API) instead of nvCOMP's Python API and CuPy")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    n = min(args.images, 64) if args.dry_run else args.images
    report: dict = {"images": n, "dry_run": args.dry_run, "core": args.core, "batches": {}}
    out_path = os.path.join(args.out, "compact_gpu_check_core.json" if args.core
                            else "compact_gpu_check.json")
    if not compact.available():
        print(f"the native core does not load: {compact.BUILD_HINT}")
        return 2
    try:
        gpu = CoreDecoder() if args.core else GpuDecoder(args.dry_run)
    except Exception as e:  # no driver, no nvCOMP, no CuPy
        print(f"could not start the GPU decoder: {e!r}")
        return 2
    t0 = time.perf_counter()
    pixels, entries, pngs = make_data(n)
    report["data_s"] = round(time.perf_counter() - t0, 1)
    report["entry_bytes_per_png_byte"] = sum(map(len, entries)) / sum(map(len, pngs))
    shape = pixels[0].shape
    # Exactness: every image, in batches of the largest size.
    bad = []
    size = max(b for b in BATCHES if b <= n) if n >= BATCHES[0] else n
    for k in range(0, n, size):
        batch = entries[k:k + size]
        got = gpu.to_host(gpu.decode(gpu.host(batch), chunk_table(batch), shape))
        for j, g in enumerate(got):
            want = compact.decode(batch[j])
            if not (np.array_equal(g.reshape(shape), want)
                    and np.array_equal(want, pixels[k + j])):
                bad.append(k + j)
    report["mismatches"] = bad
    threads = os.cpu_count() or 1
    report["cpu_threads"] = threads
    report["cpu_entry_img_s"] = cpu_rate(compact.decode, entries, threads)
    report["cpu_png_img_s"] = cpu_rate(lambda d: png_native.decode_png(d, 3), pngs, threads)
    for b in BATCHES:
        if b > n:
            continue
        batch = entries[:b]
        host, table = gpu.host(batch), chunk_table(batch)
        gpu.decode(host, table, shape)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            gpu.decode(host, table, shape)
            times.append(time.perf_counter() - t0)
        report["batches"][b] = {"best_img_s": b / min(times), "median_s": float(np.median(times))}
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    if args.core:  # nvCOMP's C library is at hand: its Gzip LOOKAHEAD on the PNGs too
        try:
            report["png_gzip_inflate"] = lookahead_check(pngs, BATCHES, args.repeats)
        except Exception as e:  # reported, never hiding the entries' result
            report["png_gzip_inflate"] = {"error": repr(e)}
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    print("PASSED: every pixel exact" if not bad else f"FAILED: {len(bad)} images differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
