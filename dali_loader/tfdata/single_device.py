"""tf.data maps whose functions TF instantiates as single-device functions.

Every iterator instantiates each function of its pipeline again. A function
TF treats as multi-device (the default) gets grappler's pass and a placement
each time: about 3-4 ms of CPU per function and `iter()` here (issue 29). With
the `experimental_ints_on_device` attribute, TF's tf.data runtime instantiates it
as a single-device function instead ("Disabling multi-device execution for a
function that uses the experimental_ints_on_device attribute",
tensorflow/core/data/captured_function.cc): about 0.2 ms. On a CPU, where every
tf.data function runs, the attribute changes nothing else.

One condition: TF's `inject_prefetch` and `slack` passes read such a function of
two or more outputs as a pipeline and refuse it ("Expected only one fetch
node"), so a pipeline with one turns `inject_prefetch` off (`no_function_passes`;
`slack` is off unless a user turns it on: then `DALI_LOADER_SINGLE_DEVICE_MAPS=0`,
docs/parity.md). `supported` probes this TF once; where it refuses, the maps are
TF's own. TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import os
from collections.abc import Callable

ENV = "DALI_LOADER_SINGLE_DEVICE_MAPS"  # "0": TF's own (multi-device) functions
SINGLE_DEVICE = {"experimental_ints_on_device": True}
_probed: dict[str, bool] = {}  # "ok": `supported`'s answer, once per process
_classes_built: list[tuple[type, type]] = []


def no_function_passes(tf):
    """Options that keep TF's pipeline-only passes off the single-device functions."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return options


def guarded(tf, ds):
    """`ds` with `no_function_passes` where its maps are single-device (`supported`)."""
    return ds.with_options(no_function_passes(tf)) if supported(tf) else ds


def _wrap(fn: Callable, name: str, ds):
    from tensorflow.python.data.ops import structured_function

    return structured_function.StructuredFunctionWrapper(
        fn, name, dataset=ds, defun_kwargs=dict(SINGLE_DEVICE))


def _classes():
    """The two dataset classes, built on first use (TF's modules imported lazily)."""
    if _classes_built:
        return _classes_built[0]
    from tensorflow.python.data.experimental.ops import batching
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.data.util import nest
    from tensorflow.python.framework import dtypes, ops
    from tensorflow.python.ops import gen_dataset_ops, gen_experimental_dataset_ops

    class Map(dataset_ops.UnaryDataset):
        """`Dataset.map(fn, num_parallel_calls=calls, deterministic=True)` (sequential
        where `calls` is None), with `fn` single-device."""

        def __init__(self, input_dataset, fn: Callable, calls: int | None):
            self._input_dataset = input_dataset
            self._name = None
            self._map_func = _wrap(fn, "Dataset.map()", input_dataset)
            func = self._map_func.function
            if calls is None:
                variant = gen_dataset_ops.map_dataset(
                    input_dataset._variant_tensor, func.captured_inputs, f=func,
                    use_inter_op_parallelism=True, preserve_cardinality=True,
                    **self._common_args)
            else:
                self._num_parallel_calls = ops.convert_to_tensor(calls, dtypes.int64)
                variant = gen_dataset_ops.parallel_map_dataset_v2(
                    input_dataset._variant_tensor, func.captured_inputs, f=func,
                    num_parallel_calls=self._num_parallel_calls,
                    deterministic="true", use_inter_op_parallelism=True,
                    preserve_cardinality=True, **self._common_args)
            super().__init__(input_dataset, variant)

        def _functions(self):
            return [self._map_func]

        @property
        def element_spec(self):
            return self._map_func.output_structure

    class MapAndBatch(batching._MapAndBatchDataset):
        """`tf.data.experimental.map_and_batch(fn, batch, calls)`, `fn` single-device."""

        def __init__(self, input_dataset, fn: Callable, batch: int, calls: int):
            self._input_dataset = input_dataset
            self._map_func = _wrap(fn, "tf.data.experimental.map_and_batch()", input_dataset)
            self._element_spec = nest.map_structure(lambda spec: spec._batch(None),
                                                    self._map_func.output_structure)
            func = self._map_func.function
            self._num_parallel_calls_t = ops.convert_to_tensor(calls, dtypes.int64)
            variant = gen_experimental_dataset_ops.map_and_batch_dataset(
                input_dataset._variant_tensor, func.captured_inputs, f=func,
                batch_size=ops.convert_to_tensor(batch, dtypes.int64),
                num_parallel_calls=self._num_parallel_calls_t,
                drop_remainder=ops.convert_to_tensor(False, dtypes.bool),
                preserve_cardinality=True, **self._flat_structure)
            dataset_ops.UnaryDataset.__init__(self, input_dataset, variant)

    _classes_built.append((Map, MapAndBatch))
    return Map, MapAndBatch


def supported(tf) -> bool:
    """Whether this TF runs single-device maps of two outputs (probed once per
    process on a four-element dataset, with `no_function_passes`); not where the
    environment's `DALI_LOADER_SINGLE_DEVICE_MAPS` is "0"."""
    if os.environ.get(ENV, "").strip() == "0":
        return False
    if "ok" in _probed:
        return _probed["ok"]
    plain = tf.autograph.experimental.do_not_convert

    def twice(x):
        return x * 2, x + 1

    try:
        Map, MapAndBatch = _classes()
        ds = tf.data.Dataset.range(4)
        ds = MapAndBatch(Map(ds, plain(twice), 2).map(lambda a, b: a + b), plain(twice), 3, 2)
        ds = Map(ds, plain(lambda a, b: (a - b, b)), None).with_options(no_function_passes(tf))
        ok = [v[0].tolist() for v in ds.as_numpy_iterator()] == [[0, 3, 6], [9]]
    except Exception:  # noqa: BLE001 - a TF that refuses it: TF's own maps instead
        ok = False
    _probed["ok"] = ok
    return ok


def map_(tf, ds, fn: Callable, calls: int | None = None):
    """`ds.map(fn)`, in order, `calls` at a time (None: one by one), `fn` single-device
    where `supported`. The caller applies `no_function_passes` to its pipeline."""
    if supported(tf):
        return _classes()[0](ds, fn, calls)
    if calls is None:
        return ds.map(fn)
    # In order whatever a user's `Options.deterministic` says (TF's documented rule).
    return ds.map(fn, num_parallel_calls=calls, deterministic=True)


def map_and_batch(tf, ds, fn: Callable, batch: int, calls: int):
    """`ds.map(fn).batch(batch)` as TF's one fused op, `fn` single-device where
    `supported`: batches in order, each of `batch` elements in a row (the last
    one shorter); a failing call fails its whole batch, whose bounds stay."""
    if supported(tf):
        return _classes()[1](ds, fn, batch, calls)
    from tensorflow.python.util import deprecation

    with deprecation.silence():  # the op is current; its public name is deprecated
        return ds.apply(tf.data.experimental.map_and_batch(fn, batch, num_parallel_calls=calls))
