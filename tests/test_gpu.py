"""The GPU path: chosen automatically, same outputs as the CPU path.

Runs only where TensorFlow and DALI both see a CUDA GPU (`make gpu-check`);
skipped cleanly elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from dali_loader.decode.devices import dali_gpu_count  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not tf.config.list_physical_devices("GPU") or dali_gpu_count() == 0,
        reason="needs a CUDA GPU visible to both TensorFlow and DALI",
    ),
]

from tf_adapter import image_dataset_from_directory as ours  # noqa: E402


def test_auto_device_is_gpu(photo_tree):
    ds = ours(str(photo_tree), image_size=(32, 32))
    assert ds._dali_loader.device == "gpu"


@pytest.mark.parametrize("kw", [{}, {"color_mode": "grayscale"}, {"crop_to_aspect_ratio": True},
                                {"pad_to_aspect_ratio": True}, {"color_mode": "rgba"}], ids=str)
def test_gpu_matches_cpu(photo_tree, kw):
    args = dict(image_size=(48, 64), shuffle=False, batch_size=8, **kw)
    cpu = np.concatenate([x.numpy() for x, _ in ours(str(photo_tree), device="cpu", **args)])
    gpu = np.concatenate([x.numpy() for x, _ in ours(str(photo_tree), device="gpu", **args)])
    assert cpu.shape == gpu.shape
    assert np.abs(cpu - gpu).mean() < 0.5


@pytest.mark.parametrize("allocator", ["", "cuda_malloc_async"])
def test_fit_on_gpu_shares_memory_with_dali(photo_tree, allocator):
    code = f"""
import numpy as np, keras
from tf_adapter import image_dataset_from_directory
ds = image_dataset_from_directory({str(photo_tree)!r}, image_size=(64, 64), batch_size=8)
assert ds._dali_loader.device == "gpu"
m = keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Conv2D(8, 3),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
h = m.fit(ds, epochs=2, verbose=0)
assert np.isfinite(h.history["loss"]).all()
print("fit-ok")
"""
    env = dict(os.environ)
    if allocator:
        env["TF_GPU_ALLOCATOR"] = allocator
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert "fit-ok" in out.stdout, out.stderr[-3000:]
