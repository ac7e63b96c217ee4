"""Small images through the native PNG path (issue 37): what each decode costs beyond its
pixels, counted, not timed; and the graph that a folder of tiny PNGs gets by default is
Keras's output bit for bit.

- Wuffs' CPU-feature probes (CPUID, a trap into the hypervisor in a VM: about 0.1 ms
  per image when they ran for every decoder) run once per feature per process
  (`native/wuffs_impl.c`).
- The core's per-thread buffers grow to a thread's largest image, never per image.
- The TF op allocates its output once, through TF's allocator, and decodes into it: no
  second buffer and copy (TF's own allocator statistics, in a child process).
- A folder of tiny PNGs, default arguments: the plan's decoder is the native one, its op
  is in the graph, and every batch is Keras's.

Real TF and Keras; the op and the core as `make install` builds them.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from support.helpers import _photo, save
from dali_loader.decode import png_native, tf_png
from dali_loader.plan import PngDecoder
from tf_adapter import image_dataset_from_directory as ours

pytestmark = pytest.mark.skipif(
    not (png_native.available() and tf_png.available()),
    reason=f"the native core or its TF op is not built: {png_native.unavailable_reason()} "
           f"{tf_png.unavailable_reason()}")


def _png(px: np.ndarray, mode: str | None = None) -> bytes:
    im = Image.fromarray(px)
    if mode == "P":
        im = im.quantize(64)
    elif mode == "RGBA":
        im = im.convert("RGBA")
        im.putalpha(Image.linear_gradient("L").resize(im.size))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def test_cpu_probes_run_once_per_process():
    """Hundreds of decodes, from ctypes and through the TF op, probe the CPU at most
    once per feature (sse4.2, avx2, bmi2): before wuffs_impl.c, every decoder and
    hasher initialised probed again (about a dozen CPUIDs per image)."""
    rng = np.random.default_rng(1)
    files = [_png(_photo(rng, 8 + i % 5, 9)) for i in range(60)]
    for data in files:
        assert png_native.decode_png(data, 3).shape[2] == 3
    after_ctypes = png_native.counts()["cpu_probes"]
    assert 1 <= after_ctypes <= 3
    ds = tf.data.Dataset.from_tensor_slices(files).map(
        lambda d: tf.shape(tf_png.decode_png(d, 3)[0]), num_parallel_calls=4)
    assert [tuple(s) for s in ds.as_numpy_iterator()] == [
        (8 + i % 5, 9, 3) for i in range(60)]
    for data in files:
        png_native.decode_png(data, 1)
    assert png_native.counts()["cpu_probes"] <= 3


def test_core_buffers_grow_per_thread_not_per_image():
    """RGBA files decoded to RGB go through the staging buffer; 300 of them, the same
    size, on tf.data's threads: the core mallocs at most a work and a staging buffer
    per thread (a per-image allocation would count 300 or more)."""
    rng = np.random.default_rng(2)
    files = [_png(_photo(rng, 24, 24), "RGBA") for _ in range(300)]
    before = png_native.counts()["buffers"]
    ds = tf.data.Dataset.from_tensor_slices(files).map(
        lambda d: tf_png.decode_png(d, 3), num_parallel_calls=4)
    oks = [bool(ok) for _, ok in ds.as_numpy_iterator()]
    assert all(oks)
    grown = png_native.counts()["buffers"] - before
    threads = (os.cpu_count() or 1) + 8  # tf.data's pool, and any thread TF lends it
    assert grown <= 2 * threads, grown


_ALLOCATION_CHILD = textwrap.dedent("""
    import io, json, sys
    import numpy as np
    import tensorflow as tf
    from PIL import Image
    from dali_loader.decode import tf_png
    rng = np.random.default_rng(0)
    h, w = 192, 256
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), np.uint8)).save(buf, format="PNG")
    data = tf.constant(buf.getvalue())
    op = tf.function(lambda d: tf_png.decode_png(d, 3)[0])
    routed = tf.function(lambda d: tf_png.decode_image_like_keras(d, 3, tf))
    out = {}
    for name, fn in (("op", op), ("routed", routed)):
        fn(data)  # traced, kernels made
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        img = fn(data)
        info = tf.config.experimental.get_memory_info("CPU:0")
        assert tuple(img.shape) == (h, w, 3)
        out[name] = {"peak": info["peak"] - before, "kept": info["current"] - before}
        del img
    print(json.dumps({"nbytes": h * w * 3, **out}))
""")


def test_op_allocates_its_output_once():
    """Through TF's allocator (the BFC CPU allocator, which keeps statistics, in a child):
    while the op and the routed decode run, TF's memory peaks at the output's bytes plus
    bookkeeping, not twice them: the pixels are decoded into the output tensor, not
    into another buffer and copied (the core's staging buffer, malloc'd once per
    thread, is not used for RGB files)."""
    import json

    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", _ALLOCATION_CHILD], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    n = got["nbytes"]
    for name in ("op", "routed"):
        assert n <= got[name]["peak"] < 1.5 * n, (name, got)
        assert n <= got[name]["kept"] < 1.5 * n, (name, got)


def _tiny_tree(root, n: int, shape: tuple[int, int], modes: tuple[str | None, ...]) -> str:
    rng = np.random.default_rng(n)
    for i in range(n):
        px = _photo(rng, *shape)
        mode = modes[i % len(modes)]
        path = root / f"c{i % 3}" / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        if mode == "L":
            save(path, px[:, :, 0])
        else:
            path.write_bytes(_png(px, mode))
    return str(root)


@pytest.mark.parametrize("shape,files,color_mode", [
    ((8, 8), 160, "rgb"),  # 5 batches of 32: the fused graph
    ((32, 32), 40, "rgb"),  # 2 batches: the per-file graph
    ((28, 28), 160, "grayscale"),
    ((32, 32), 96, "rgba"),
])
def test_tiny_pngs_default_graph_is_native_and_keras_exact(tmp_path, shape, files, color_mode):
    """The graph a CIFAR- or MNIST-like folder gets with default arguments decodes with
    the native op (the plan says so, the op is in the graph) and gives Keras's batches,
    pixels and labels, bit for bit, in both graphs (fused from 4 batches)."""
    root = _tiny_tree(tmp_path, files, shape, (None, "L", "P", "RGBA"))
    kw = dict(image_size=shape, color_mode=color_mode, shuffle=False, verbose=False)
    ds = ours(root, **kw)
    assert ds.loader.plan.png_epoch is PngDecoder.WUFFS
    from test_tf_png_op import _serialized

    assert b"DaliLoaderDecodePng" in _serialized(ds)
    ref = keras.utils.image_dataset_from_directory(root, **kw)
    got = [(x.numpy(), y.numpy()) for x, y in ds]
    want = [(x.numpy(), y.numpy()) for x, y in ref]
    assert [x.shape for x, _ in got] == [x.shape for x, _ in want]
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gy, wy)
        np.testing.assert_array_equal(gx, wx)
