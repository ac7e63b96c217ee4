"""Where the DALI TF plugin's dataset is placed, checked on the CPU through the
graph a GPU would run (docs/handoff.md).

No machine here runs TF + DALI on a GPU, so the TF graph of the GPU path is built
in graph mode with the GPU's device strings and checked against TensorFlow's own
kernel registry (the pip wheel registers its GPU kernels even on a CPU-only
machine): a GPU-placed DALI dataset may only be followed by dataset ops that TF
registers for the GPU. The DALI pipeline inside is built for the CPU (a GPU
pipeline cannot be serialized without CUDA); the TF side is the GPU path's.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from tensorflow.python.framework import kernels  # noqa: E402

from dali_loader.api import open_index  # noqa: E402
from dali_loader.decode.spec import ImageSpec  # noqa: E402
from dali_loader.tfdata import dali_plugin  # noqa: E402
from dali_loader.plan import Handoff, Options, resolve  # noqa: E402
from dali_loader.tfdata.dali_plugin import _TRANSFORMATIONS, GPU_TRANSFORMATIONS  # noqa: E402
from dali_loader.tfdata.dataset import make_loader, to_tf_dataset  # noqa: E402
from support.helpers import gpu_handoff, on_a_gpu  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

SPEC = ImageSpec(8, 8)


def has_gpu_kernel(op_type: str) -> bool:
    return any(k.device_type == "GPU"
               for k in kernels.get_registered_kernels_for_op(op_type).kernel)


def ops_after_dali(graph) -> tuple[list[str], list[tuple[str, str]]]:
    """The DALI dataset ops' devices, and every dataset op downstream of them (type, device)."""
    dali = [op for op in graph.get_operations() if op.type == "DALIDataset"]
    assert len(dali) == 1
    seen, todo, after = set(), list(dali[0].outputs), []
    while todo:
        t = todo.pop()
        for op in t.consumers():
            if op.name in seen:
                continue
            seen.add(op.name)
            after.append((op.type, op.device))
            todo += [o for o in op.outputs if o.dtype == tf.variant]
    return [op.device for op in dali], after


def gpu_incompatible(graph) -> list[str]:
    """Dataset ops that follow a GPU-placed DALI dataset but have no GPU kernel:
    each would either fail to place, or make TF copy the dataset variant across
    devices, which it cannot ("No unary variant device copy function found")."""
    (device,), after = ops_after_dali(graph)
    if "GPU" not in device.upper():
        return []
    return sorted({t for t, _ in after if not has_gpu_kernel(t)})


@pytest.fixture
def gpu_graph(id_tree, monkeypatch):
    """Builds `to_tf_dataset` as on a GPU (device="gpu", device_id 0), in a graph."""
    original = dali_plugin.build_plugin_pipeline

    def cpu_pipeline(*args, **kw):  # the DALI side only: serializing a GPU one needs CUDA
        return original(*args, **{**kw, "gpu": False, "on_gpu": False})

    monkeypatch.setattr(dali_plugin, "build_plugin_pipeline", cpu_pipeline)
    source, index = open_index(str(id_tree), shuffle=False, seed=1)

    def build(handoff, chain=lambda ds: ds):
        graph = tf.Graph()
        with graph.as_default():
            plan = resolve(Options(device="gpu", handoff=handoff, num_threads=1, batch_size=4),
                           on_a_gpu())
            loader = make_loader(source, index, SPEC, plan, batch_size=4, shuffle=False, seed=1)
            ds = to_tf_dataset(loader, SPEC, 4, "int", 2)
            chain(ds)
        return graph, ds

    yield build
    source.close()


def keras_tutorial_chain(ds):
    """What Keras tutorials put after image_dataset_from_directory (fit itself adds
    OptionsDataset and the iterator ops, all registered for the GPU)."""
    aug = ds.map(lambda x, y: (tf.image.flip_left_right(x), y),
                 num_parallel_calls=tf.data.AUTOTUNE)
    return (aug.cache().shuffle(16).prefetch(tf.data.AUTOTUNE),
            ds.take(1), ds.unbatch().batch(3), ds.repeat(), tf.data.Dataset.zip((ds, ds)))


def test_default_on_a_gpu_composes_with_every_tf_data_op(gpu_graph):
    """The default GPU handoff places the DALI dataset (and its input) on the host:
    nothing after it needs a GPU kernel, and the cardinality op is in the graph."""
    graph, _ = gpu_graph(None, keras_tutorial_chain)
    (dali_device,), after = ops_after_dali(graph)
    assert dali_device == "/device:CPU:0"
    types = {t for t, _ in after}
    assert {"AssertCardinalityDataset", "MapDataset", "CacheDataset", "ShuffleDataset",
            "TakeDataset", "RepeatDataset", "ZipDataset"} <= types
    assert not gpu_incompatible(graph)
    assert not [op for op in graph.get_operations() if "GPU" in op.device.upper()]


def test_the_check_fails_on_a_gpu_placed_dali_dataset_followed_by_map(gpu_graph):
    """The previous default (the DALI dataset on the GPU) under a tutorial's
    `map`: the check names the ops TF has no GPU kernel for."""
    graph, _ = gpu_graph(
        "plugin-gpu", lambda ds: tf.data.Dataset.map(ds, lambda x, y: (x, y)).prefetch(2))
    (dali_device,), _ = ops_after_dali(graph)
    assert dali_device == "/device:GPU:0"
    assert gpu_incompatible(graph) == ["MapDataset"]


def test_plugin_gpu_allows_only_ops_with_gpu_kernels(gpu_graph):
    graph, ds = gpu_graph("plugin-gpu", lambda ds: ds.with_options(tf.data.Options()).prefetch(2))
    assert not gpu_incompatible(graph)
    # Its input is copied to the GPU, the plugin's rule for a GPU-placed dataset.
    gen = [op for op in graph.get_operations() if op.type == "GeneratorDataset"]
    assert [op.device for op in gen] == ["/device:GPU:0"]
    assert {"PrefetchDataset": True, "OptionsDataset": True} == {
        t: has_gpu_kernel(t) for t in ("PrefetchDataset", "OptionsDataset")}
    assert GPU_TRANSFORMATIONS == {"prefetch", "with_options"}
    assert int(ds.cardinality()) == 6  # 23 files, batches of 4: declared in Python
    for name in _TRANSFORMATIONS:
        with pytest.raises(ValueError, match=rf"`{name}\(\)` cannot follow .*plugin-gpu"):
            getattr(ds, name)(lambda *a: a)


@pytest.mark.parametrize("op_type", ["MapDataset", "ParallelMapDatasetV2", "CacheDataset",
                                     "ShuffleDataset", "TakeDataset", "BatchDatasetV2",
                                     "AssertCardinalityDataset", "RepeatDataset", "ZipDataset"])
def test_tf_registers_no_gpu_kernel_for_the_refused_ops(op_type):
    """Why plugin-gpu refuses them (and why the default is on the host): TF's registry."""
    assert not has_gpu_kernel(op_type)


def test_resolution_never_picks_the_gpu_resident_plugin():
    assert gpu_handoff(on_error="raise") is Handoff.PLUGIN
    assert gpu_handoff(on_error="skip", gpu_ready=True) is Handoff.PLUGIN
    assert gpu_handoff(on_error="skip") is Handoff.GENERATOR
    assert gpu_handoff(device="cpu", decoder="dali") is Handoff.GENERATOR
    assert gpu_handoff(handoff="plugin-gpu") is Handoff.PLUGIN_GPU


def test_plugin_gpu_needs_a_gpu(id_tree):
    with pytest.raises(ValueError, match="plugin-gpu.*needs device=\"gpu\".*Received: "
                                         "handoff='plugin-gpu', device='cpu'"):
        ours(str(id_tree), decoder="dali", handoff="plugin-gpu")
    with pytest.raises(ValueError, match="Received: handoff='nope'"):
        ours(str(id_tree), decoder="dali", handoff="nope")
