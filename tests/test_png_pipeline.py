"""png_decoder="gpu" through `image_dataset_from_directory` without a GPU: the batched PNG
decoder's kernels under numba-cuda's simulator, zlib standing in for nvCOMP, its pixels
entering the DALI graph as `Input.PIXELS` (external_source on the CPU), resized there.

Keras's pixels up to DALI's resize rounding, labels aligned, every file once per epoch,
the per-epoch decode counts, a corrupt PNG under both `on_error` policies, and the
option's argument errors.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from support.helpers import choose_cuda_simulator, fast_simulator

choose_cuda_simulator()
pytest.importorskip("numba.cuda")

import keras  # noqa: E402

from support.helpers import _photo, save  # noqa: E402
from support.pngs import broken_streams, photo  # noqa: E402
from tf_adapter.dataset import image_dataset_from_directory as ours  # noqa: E402

KW = dict(image_size=(16, 20), batch_size=8, verbose=False)


@pytest.fixture(scope="module", autouse=True)
def simulator():
    yield from fast_simulator()


@pytest.fixture(scope="module")
def mixed_tree(id_tree, tmp_path_factory):
    """id_tree's 23 PNGs and one JPEG (class "odd")."""
    root = tmp_path_factory.mktemp("png_pipeline")
    shutil.copytree(id_tree, root, dirs_exist_ok=True)
    save(root / "odd" / "photo.jpg", _photo(np.random.default_rng(5), 40, 30), "JPEG")
    return root


@pytest.fixture(scope="module")
def corrupt_tree(id_tree, tmp_path_factory):
    """id_tree's PNGs and a CRC-valid PNG whose Deflate data is scrambled (class "even")."""
    root = tmp_path_factory.mktemp("png_pipeline_bad")
    shutil.copytree(id_tree, root, dirs_exist_ok=True)
    bad = broken_streams(photo(np.random.default_rng(1), 12, 10))["scrambled.png"]
    (root / "even" / "scrambled.png").write_bytes(bad)
    return root


def _keras(root, **kw):
    ds = keras.utils.image_dataset_from_directory(str(root), shuffle=False, **KW, **kw)
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys)


def _epoch(ds):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys)


def _match(got, ref):
    """For each image of `got`, the index of the reference image closest to it, and the distance."""
    d = np.abs(got[:, None] - ref[None]).reshape(len(got), len(ref), -1).max(-1)
    return d.argmin(1), d.min(1)


@pytest.mark.parametrize("color_mode", ["rgb", "grayscale"])
def test_keras_pixels_labels_and_counts(mixed_tree, color_mode):
    ref_x, ref_y = _keras(mixed_tree, color_mode=color_mode)
    ds = ours(str(mixed_tree), decoder="dali", png_decoder="gpu", shuffle=False,
              color_mode=color_mode, **KW)
    x, y = _epoch(ds)
    assert np.abs(x - ref_x).max() < 0.01  # DALI's resize: float rounding only
    np.testing.assert_array_equal(y, ref_y)
    loader = ds.loader
    assert [(s["epoch"], s["files"], s["gpu_png_decodes"], s["cpu_decodes"])
            for s in loader.epoch_stats] == [(0, 24, 23, 1)]


def test_two_shuffled_epochs_every_file_once_with_its_label(mixed_tree):
    ref_x, ref_y = _keras(mixed_tree)
    ds = ours(str(mixed_tree), decoder="dali", png_decoder="gpu", shuffle=True, seed=3, **KW)
    orders = []
    for _ in range(2):
        x, y = _epoch(ds)
        which, dist = _match(x, ref_x)
        assert dist.max() < 0.01
        assert sorted(which) == list(range(len(ref_x)))  # every file once
        np.testing.assert_array_equal(y, ref_y[which])
        orders.append(list(which))
    assert orders[0] != orders[1]  # a new order per epoch
    assert [(s["gpu_png_decodes"], s["cpu_decodes"]) for s in ds.loader.epoch_stats] \
        == [(23, 1), (23, 1)]


def test_two_iterators_at_once_each_get_every_file_once(mixed_tree):
    """Two epochs read at once from two threads: two DALI pipelines call the decoder at
    the same time. The simulator runs one kernel launch at a time per process (it swaps
    the kernel's globals for its fake `cuda` module), so the stage serialises its launches
    there; each epoch still gets every file once, with Keras's pixels and labels."""
    import threading

    ref_x, ref_y = _keras(mixed_tree)
    ds = ours(str(mixed_tree), decoder="dali", png_decoder="gpu", shuffle=True, seed=4, **KW)
    results: list = [None, None]
    errors: list = []
    start = threading.Barrier(2)

    def run(k: int) -> None:
        try:
            start.wait()
            results[k] = _epoch(ds)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    for x, y in results:
        which, dist = _match(x, ref_x)
        assert dist.max() < 0.01 and sorted(which) == list(range(len(ref_x)))
        np.testing.assert_array_equal(y, ref_y[which])
    assert sorted((s["gpu_png_decodes"], s["cpu_decodes"])
                  for s in ds.loader.epoch_stats) == [(23, 1), (23, 1)]


def test_corrupt_png_named_under_raise(corrupt_tree):
    ds = ours(str(corrupt_tree), decoder="dali", png_decoder="gpu", shuffle=False, **KW)
    with pytest.raises(Exception, match="scrambled.png"):
        for _ in ds:
            pass


def test_corrupt_png_skipped_and_recorded_labels_still_right(corrupt_tree, id_tree):
    ref_x, ref_y = _keras(id_tree)
    ds = ours(str(corrupt_tree), decoder="dali", png_decoder="gpu", shuffle=True, seed=1,
              on_error="skip", **KW)
    for _ in range(2):
        x, y = _epoch(ds)
        which, dist = _match(x, ref_x)
        assert dist.max() < 0.01 and sorted(which) == list(range(23))
        np.testing.assert_array_equal(y, ref_y[which])
    assert list(ds.loader.skipped) == [str(corrupt_tree / "even" / "scrambled.png")]
    # The corrupt file went to the CPU decoder (a Fallback), which rejected it.
    assert [(s["gpu_png_decodes"], s["cpu_decodes"]) for s in ds.loader.epoch_stats] \
        == [(23, 1), (23, 1)]


@pytest.mark.parametrize("kw,message", [
    (dict(png_decoder="cpu"), "png_decoder='cpu'"),
    (dict(png_decoder="gpu"), "decoder=None"),  # the CPU's TF kernels: no DALI graph
    (dict(png_decoder="gpu", decoder="tf"), "decoder='tf'"),
    (dict(png_decoder="gpu", decoder="dali", handoff="plugin"), "CPU inputs only"),
    (dict(png_decoder="gpu", decoder="dali", gpu_ready=True), "gpu_ready='compact-up-zstd1'"),
], ids=str)
def test_argument_errors(id_tree, kw, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        ours(str(id_tree), **KW, **kw)
    assert "Received:" in str(err.value)


def test_generator_handoff_is_picked_and_default_is_off(id_tree):
    from dali_loader.decode.dali_graph import Input
    from dali_loader.plan import Handoff
    from support.helpers import gpu_handoff

    # On a GPU None would pick the plugin; with the GPU PNG decoder, the generator.
    assert gpu_handoff(batch_size=8) is Handoff.PLUGIN
    assert gpu_handoff(batch_size=8, png_decoder="gpu") is Handoff.GENERATOR
    ds = ours(str(id_tree), decoder="dali", png_decoder="gpu", handoff="generator", **KW)
    assert ds.loader.engine.input is Input.PIXELS and ds.loader.engine.png.device == "cpu"
    off = ours(str(id_tree), decoder="dali", **KW)  # DALI decodes the files
    assert off.loader.engine.input is Input.FILES and off.loader.engine.png is None
    wuffs = ours(str(id_tree), decoder="dali", png_decoder="wuffs", **KW)  # PNGs before DALI
    assert wuffs.loader.engine.input is Input.FILES_OR_RAW and wuffs.loader.engine.png is None


def test_cpu_without_the_simulator_refused(monkeypatch):
    """On the CPU the kernels can only run under the simulator: anything else is refused."""
    from dali_loader.decode import png_batches

    monkeypatch.setattr(png_batches, "simulated", lambda: False)
    with pytest.raises(ValueError, match="NUMBA_ENABLE_CUDASIM=1.*Received: png_decoder='gpu'"):
        png_batches.PngBatches(3, device="cpu")
