"""The compact entries' GPU decode (issue 38, item 4; `native/entry_gpu.cu`,
`native/dali_entry_gpu_op.cu`): built where nvcc and nvCOMP are, never run on a GPU in
this project. Here: what runs on the host (each entry's shape from its head, the chunk
table checked without the frames, a bad batch refused before any GPU work, no GPU: a
clear error); with a GPU (marked `gpu`): the DALI path's pixels equal the CPU core's."""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest

from dali_loader.formats import compact
from dali_loader.formats.ready import ReadyForm, encode
from dali_loader.native import BUILD_DIR

LIBRARY = BUILD_DIR / "libdlentry_gpu.so"
HEAD = 4096  # entry_gpu.h's DL_GPU_HEAD

needs_build = pytest.mark.skipif(
    not LIBRARY.exists(),
    reason=f"{LIBRARY} is not built (python -m dali_loader.native.build_gpu: nvcc and nvCOMP)")


class Item(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("size", ctypes.c_size_t),
                ("head", ctypes.c_void_p), ("head_size", ctypes.c_size_t),
                ("out", ctypes.c_void_p), ("out_size", ctypes.c_size_t)]


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(str(LIBRARY))
    u32 = ctypes.POINTER(ctypes.c_uint32)
    reason = ctypes.POINTER(ctypes.c_char_p)
    lib.dl_entry_gpu_need_head.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.dl_entry_gpu_need_head.restype = ctypes.c_size_t
    lib.dl_entry_gpu_shape.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                       ctypes.c_uint64, u32, u32, u32, reason]
    lib.dl_entry_gpu_decode.argtypes = [ctypes.POINTER(Item), ctypes.c_int, ctypes.c_uint64,
                                        ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), reason]
    return lib


def shape_of(lib, entry: bytes, head_size: int | None = None):
    """(shape, None) or (None, reason) from the entry's first `head_size` bytes."""
    head = entry[:min(len(entry), HEAD) if head_size is None else head_size]
    h, w, c, why = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_char_p()
    rc = lib.dl_entry_gpu_shape(head, len(head), len(entry), 0, ctypes.byref(h), ctypes.byref(w),
                                ctypes.byref(c), ctypes.byref(why))
    return ((h.value, w.value, c.value), None) if rc == 0 else (None, why.value.decode())


def photo(seed: int, h: int, w: int, c: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), np.uint8)


@needs_build
def test_shapes_come_from_the_head_of_either_form(lib):
    """A compact entry's shape from its header and chunk table (the frames stay on the
    device: not read), a raw one's from its 16 bytes and exact size; a long chunk table
    asks for more head."""
    px = photo(0, 37, 50)
    small = bytes(compact.encode(px))
    assert shape_of(lib, small) == ((37, 50, 3), None)
    raw = encode(px, ReadyForm.RAW)
    assert shape_of(lib, bytes(raw)) == ((37, 50, 3), None)
    many = bytes(compact.encode(photo(1, 100, 100), chunk_bytes=64))  # 469 chunks
    table = compact.FIXED_HEADER + 4 * 469
    assert lib.dl_entry_gpu_need_head(many[:64], 64, len(many)) == table
    assert shape_of(lib, many, 64) == (None, "its chunk table is not at hand")
    assert shape_of(lib, many, table) == ((100, 100, 3), None)
    assert lib.dl_entry_gpu_need_head(raw[:16], 16, len(raw)) == 16


@needs_build
@pytest.mark.parametrize("damage, says", [
    (lambda e: b"XLZ1" + e[4:], "not a compact entry"),
    (lambda e: e[:-1], "past the end"),
    (lambda e: e + b"\0", "bytes after the last chunk"),
    (lambda e: e[:8] + (2**20).to_bytes(4, "little") + e[12:], "a shape out of range"),
    (lambda e: e[:24] + (99).to_bytes(4, "little") + e[28:], "chunk count"),
    (lambda e: b"DLRW" + (5).to_bytes(4, "little") * 2 + (3).to_bytes(4, "little") + b"\0" * 74,
     "size does not match"),
])
def test_damaged_heads_are_refused_with_a_reason(lib, damage, says):
    entry = bytes(compact.encode(photo(2, 40, 60)))
    shape, why = shape_of(lib, damage(entry))
    assert shape is None and says in why


@needs_build
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU may be here")
def test_a_bad_batch_is_refused_before_the_gpu_and_no_gpu_is_an_error(lib):
    """Item 1 damaged: refused, naming it, before any GPU work; a sound batch on a
    machine without a GPU: a CUDA error in words (never a crash)."""
    good = bytes(compact.encode(photo(3, 20, 30)))
    bad = b"XLZ1" + good[4:]
    fake = 4096  # device addresses never touched: the host checks or CUDA refuse first
    items = (Item * 2)(*[Item(fake, len(e), ctypes.cast(ctypes.c_char_p(e), ctypes.c_void_p),
                              min(len(e), HEAD), fake, 20 * 30 * 3) for e in (good, bad)])
    keep = (good, bad)  # the heads' buffers live through the calls
    which, why = ctypes.c_int(), ctypes.c_char_p()
    assert lib.dl_entry_gpu_decode(items, 2, 0, None, ctypes.byref(which), ctypes.byref(why)) == 1
    assert which.value == 1 and "not a compact entry" in why.value.decode()
    assert lib.dl_entry_gpu_decode(items, 1, 0, None, ctypes.byref(which), ctypes.byref(why)) == 1
    assert which.value == -1 and "failed" in why.value.decode(), why.value
    del keep


@pytest.mark.gpu
def test_gpu_decode_matches_the_cpu_core_on_the_dali_path(photo_tree, tmp_path):
    """entry_decoder="gpu" on a GPU: the DALI path's output equals the CPU core's
    (the same entries, the same resize on the GPU), in the filling and a cached epoch."""
    tf = pytest.importorskip("tensorflow")
    from dali_loader.decode.devices import dali_gpu_count
    from dali_loader.plan import EntryDecoder
    from tf_adapter import image_dataset_from_directory as ours

    if not tf.config.list_physical_devices("GPU") or dali_gpu_count() == 0:
        pytest.skip("needs a CUDA GPU visible to both TensorFlow and DALI")
    kw = dict(image_size=(48, 64), shuffle=False, batch_size=8, gpu_ready=True,
              cache_dir=str(tmp_path / "cache"))
    cpu = ours(str(photo_tree), **kw)
    ref = np.concatenate([x.numpy() for x, _ in cpu])
    gpu = ours(str(photo_tree), entry_decoder="gpu", **kw)
    assert gpu.loader.plan.entry_decode is EntryDecoder.GPU
    for _ in range(2):
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in gpu]), ref)
    assert os.path.isdir(tmp_path / "cache")


def test_a_failed_gpu_build_never_fails_make_install(tmp_path, monkeypatch):
    """`build_gpu --if-possible` (make install, pip): a compiler that fails is a warning,
    exit 0, and a stale operator from an earlier build is removed (never loaded); without
    the flag the same failure is exit 1. Runs without a GPU or nvcc (a stand-in fails)."""
    pytest.importorskip("nvidia.dali")
    from dali_loader.native import build_gpu

    try:
        build_gpu.nvcomp_dirs()
    except build_gpu.Unavailable as e:
        pytest.skip(str(e))
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'nvcc: this compiler fails' >&2\nexit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(build_gpu, "CORE_LIBRARY", str(tmp_path / "libdlentry_gpu.so"))
    stale = tmp_path / "dl_dali_entry_gpu.so"
    monkeypatch.setattr(build_gpu, "OP_LIBRARY", str(stale))
    stale.write_bytes(b"an earlier build")
    assert build_gpu.main([]) == 1
    assert stale.exists()
    assert build_gpu.main(["--if-possible"]) == 0
    assert not stale.exists()
