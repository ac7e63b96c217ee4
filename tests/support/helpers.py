"""Small helpers the tests share (pytest's fixtures live in tests/conftest.py)."""

from __future__ import annotations

import pathlib
import time

import numpy as np

from support import REPO  # noqa: F401 (imported from here by the tests)


def _photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth, noisy, photo-like RGB image."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack(
        [
            127 + 100 * np.sin(x / rng.uniform(5, 30) + rng.uniform(0, 6)),
            127 + 100 * np.cos(y / rng.uniform(5, 30) + rng.uniform(0, 6)),
            127 + 100 * np.sin((x + y) / rng.uniform(5, 30)),
        ],
        -1,
    )
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def save(path: pathlib.Path, arr: np.ndarray, fmt: str = "PNG") -> pathlib.Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, format=fmt)
    return path


def valid_pngs(folder: pathlib.Path) -> list[pathlib.Path]:
    """The valid PNGs of `folder` (names not starting with "x"), sorted."""
    return sorted(p for p in folder.glob("*.png") if not p.name.startswith("x"))


def corrupt_pngs(folder: pathlib.Path) -> list[pathlib.Path]:
    """The corrupt PNGs of `folder` (names starting with "x"), sorted."""
    return sorted(folder.glob("x*.png"))


def wait_for(cond, timeout: float = 5.0, step: float = 0.005) -> None:
    """Polls `cond()` until true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)


def batch_counter(counts: list[int]):
    """A Keras callback that appends each epoch's number of training batches to `counts`."""
    import keras

    class Count(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.n = 0

        def on_train_batch_end(self, batch, logs=None):
            self.n += 1

        def on_epoch_end(self, epoch, logs=None):
            counts.append(self.n)

    return Count()


def run_fit_script(code: str, allocator: str | None) -> None:
    """Runs `code` in a fresh Python (with `TF_GPU_ALLOCATOR=allocator` when given);
    fails unless it prints "fit-ok"."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    if allocator:
        env["TF_GPU_ALLOCATOR"] = allocator
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert "fit-ok" in out.stdout, out.stderr[-3000:]


def choose_cuda_simulator() -> None:
    """Makes numba-cuda's simulator the `numba.cuda` of this process (CPU-only runs of the
    batched PNG decoder's kernels), if numba.cuda was not imported yet. The simulator is
    chosen when numba.cuda is first imported (only the GPU PNG decoder's test modules
    import numba, all through this helper); NUMBA_ENABLE_CUDASIM is removed again so
    that no later test or subprocess sees it.
    Tests check `numba.cuda.jit.__module__` and skip when it is not the simulator."""
    import os
    import sys

    if "numba.cuda" in sys.modules:
        return
    before = os.environ.get("NUMBA_ENABLE_CUDASIM")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        pass  # the tests' importorskip reports it
    finally:
        if before is None:
            del os.environ["NUMBA_ENABLE_CUDASIM"]
        else:
            os.environ["NUMBA_ENABLE_CUDASIM"] = before


def _locked_shared_array(lock):
    """numba-cuda's `FakeCUDAShared.array` (simulator/kernelapi.py) under `lock`.

    The simulator runs a block's threads as Python threads, and the first of them to reach
    `cuda.shared.array(...)` at a given line allocates the block's array in a dict keyed by
    (file, line); unlocked, two threads can both miss, and each gets its own "shared"
    array (issue 30: 4 wrong Adler-32 sums in 400 launches with 2 busy threads; 0 with a
    lock). The body is numba-cuda's own, with the caller found from this frame."""
    import sys
    import traceback

    import numpy as np
    from numba.core import types
    from numba.np import numpy_support

    def array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        if shape == 0:
            count = self._dynshared_size // dtype.itemsize
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        stack = traceback.extract_stack(sys._getframe())
        caller = stack[-2][0:2]
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = np.empty(shape, dtype)
                self._allocations[caller] = res
        return res

    return array


def fast_simulator():
    """A generator for a module fixture: fails unless numba.cuda is the simulator; makes
    the simulator's shared arrays thread-safe (`_locked_shared_array`), and shortens the
    GIL switch interval meanwhile (the simulator's block manager polls its threads under
    the GIL: each syncthreads then costs microseconds, not milliseconds)."""
    import sys
    import threading

    import pytest
    from numba import cuda

    if not cuda.jit.__module__.startswith("numba.cuda.simulator"):
        # A harness fault, not an optional extra: these tests would silently not run.
        pytest.fail("numba.cuda was imported before NUMBA_ENABLE_CUDASIM=1 could be set: "
                    "something imported numba.cuda before tests/support/helpers.choose_cuda_simulator "
                    "ran (import it only through that helper).", pytrace=False)
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    original = shared.__dict__["array"]
    shared.array = _locked_shared_array(threading.Lock())
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        yield
    finally:
        sys.setswitchinterval(old)
        shared.array = original


def tf_outcome(data: bytes, channels: int):
    """`tf.io.decode_png`'s pixels (numpy), or None when TF rejects the file."""
    import tensorflow as tf

    try:
        return tf.io.decode_png(data, channels=channels).numpy()
    except (tf.errors.OpError, ValueError):
        return None


def png_outcome(decode, data: bytes, channels: int) -> str:
    """How a fast PNG decoder `decode(data, channels)` (pixels or a `Fallback`) compares
    with `tf.io.decode_png`: "fast" (TF's pixels), "fallback" (left to TF),
    "fallback-rejected" (left to TF, which rejects it), or what went wrong."""
    import numpy as np

    from dali_loader.decode.png_cpu import Fallback

    ref = tf_outcome(data, channels)
    got = decode(data, channels)
    if isinstance(got, Fallback):
        return "fallback" if ref is not None else "fallback-rejected"
    if ref is None:
        return "IT DECODES A FILE TF REJECTS"
    if ref.shape != got.shape or ref.dtype != got.dtype or not np.array_equal(ref, got):
        return "PIXELS DIFFER"
    return "fast"


def refuses_flipped_idats(decode) -> int:
    """Flips bits in a photo PNG's compressed IDAT bytes (chunk CRC fixed: only zlib's
    Adler-32 or the Deflate stream can see it), 200 seeds; asserts `decode` falls back
    (a `Fallback`) on every file TF refuses, and returns how many TF refused."""
    import numpy as np

    from dali_loader.decode.png_cpu import Fallback
    from support.mutate import mutate
    from support.pngs import encode_png, photo

    good = encode_png(photo(np.random.default_rng(3), 40, 40), (4,))
    refused = 0
    for i in range(200):
        bad = mutate(good, "idat_flip", np.random.default_rng(i))
        if tf_outcome(bad, 3) is None:
            refused += 1
            assert isinstance(decode(bad, 3), Fallback), i
    return refused


def all_rows(ds):
    """A labelled dataset's images and labels, every batch concatenated (numpy)."""
    import numpy as np

    xs, ys = [], []
    for x, y in ds:
        xs.append(x.numpy())
        ys.append(y.numpy())
    return np.concatenate(xs), np.concatenate(ys)


def collected(cond):
    """`cond` as a `wait_for` condition that runs the garbage collector before each look:
    an object is released once no thread still holds it (a read-ahead thread finishing
    its read, TF's thread running an iterator's finalize), which a single `gc.collect()`
    right after `del` can run before."""
    import gc

    def check() -> bool:
        gc.collect()
        return cond()

    return check


def on_a_gpu(**facts):
    """An injected environment (`plan.Environment`) of a machine where TF and DALI see a
    GPU and every native decoder and DALI's TF plugin are built: a local folder without
    JPEGs, with PNGs, unless `facts` say otherwise. For plans of the GPU path on any machine."""
    from dali_loader.plan import Environment
    from dali_loader.storage.source import SourceKind

    return Environment(**{"tf_gpus": 1, "dali_gpus": 1, "tf_png_op": True, "dali_png_op": True,
                          "wuffs": True, "png_core": True, "dali_tf_plugin": True, "cores": 16,
                          "source_kind": SourceKind.LOCAL_DISK, "files": 1000,
                          "has_jpegs": False, "has_pngs": True, **facts})


def gpu_handoff(**options):
    """The handoff the plan picks for `options` on a GPU (`on_a_gpu`)."""
    from dali_loader.plan import Options, resolve

    return resolve(Options(**options), on_a_gpu()).handoff


def sanitizer_driver():
    """The native core's ASan + UBSan fuzz driver (`build.sanitizer_driver`), built if
    needed; skips the test where no compiler is installed or it does not build."""
    import shutil

    import pytest

    if not (shutil.which("g++") and shutil.which("gcc")):
        pytest.skip("no C/C++ compiler (g++, gcc) to build the sanitizer driver")
    from dali_loader.native import build

    try:
        return build.sanitizer_driver()
    except (RuntimeError, FileNotFoundError) as e:
        pytest.skip(f"the sanitizer driver does not build here: {e}")
