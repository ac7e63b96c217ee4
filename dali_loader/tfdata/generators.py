"""One Python generator per TF iterator, driven by TF's `GeneratorDataset` op.

`per_iterator_dataset(tf, Generators(make), signature)` is a dataset whose every
iterator runs its own `make()` generator: one `numpy_function` opens it, one per
element, one closes it (also when an iterator is abandoned), with `init` and
`finalize` as single-device functions where this TF takes them, and `next` too
where it takes those of several outputs (`single_device`). The TF path over
files (`tf_path`) runs on it. TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator

import numpy as np

from dali_loader.exiting import stoppable
from dali_loader.tfdata.single_device import SINGLE_DEVICE, guarded
from dali_loader.tfdata.single_device import supported as _multi_output_supported
from dali_loader.tfdata.weak import weakly as _weakly


def _strings(values) -> np.ndarray:
    """A list of bytes as an object array: TF's string tensor, each value whole
    (a fixed-width `S` array would drop trailing NUL bytes)."""
    out = np.empty(len(values), object)
    out[:] = values
    return out


class Generators:
    """One Python generator per TF iterator, opened, stepped and closed by TF's
    `GeneratorDataset` op (`per_iterator_dataset`)."""

    def __init__(self, make: Callable[[], Iterator[tuple]]):
        self._make = make
        self._ids = itertools.count()
        self._open: dict[int, Iterator[tuple]] = {}
        self._lock = threading.Lock()

    def open(self) -> np.int64:
        gen = stoppable(iter(self._make()))
        with self._lock:
            gid = next(self._ids)
            self._open[gid] = gen
        return np.int64(gid)

    def next(self, gid: np.int64) -> tuple:
        gen = self._open.get(int(gid))
        if gen is None:  # closed (at exit): the iteration ends
            raise StopIteration
        return tuple(_strings(v) if isinstance(v, list) else v for v in next(gen))

    def close(self, gid: np.int64) -> np.int64:
        with self._lock:
            gen = self._open.pop(int(gid), None)
        if gen is not None:
            gen.close()
        return np.int64(0)


def _end(*_) -> tuple:
    raise StopIteration


def per_iterator_dataset(tf, generators: Generators, signature: tuple):
    """A dataset whose every iterator runs its own `generators` generator.

    `from_generator` does the same through a `flat_map` and a per-element
    wrapper that checks and converts each value; this drives TF's
    `GeneratorDataset` op directly (one `numpy_function` to open, one per
    element, one to close, also when an iterator is abandoned). Measured on a
    16-file folder: an epoch's best 41.8 -> 29.3 ms, Keras's 14.5-16.7
    (docs/benchmarks.md, issue 29).
    Falls back to `from_generator` where the op's Python class is gone."""
    types = tuple(s.dtype for s in signature)
    open_ = _weakly(generators, "open", lambda: np.int64(-1))
    step = _weakly(generators, "next", _end)
    close = _weakly(generators, "close", lambda gid: np.int64(0))
    try:
        from tensorflow.python.data.ops.from_generator_op import _GeneratorDataset
    except ImportError:  # pragma: no cover - a future TF
        def gen():
            gid = open_()
            try:
                while True:
                    yield step(gid)
            except StopIteration:
                return
            finally:
                close(gid)
        return tf.data.Dataset.from_generator(gen, output_signature=signature)
    plain = tf.autograph.experimental.do_not_convert

    def init(_):
        return tf.numpy_function(open_, [], tf.int64, stateful=True)

    def next_(gid):
        out = tf.numpy_function(step, [gid], types, stateful=True)
        for t, s in zip(out, signature):
            t.set_shape(s.shape)
        return tuple(out)

    def finalize(gid):
        return tf.numpy_function(close, [gid], tf.int64, stateful=True)

    single = _single_device_class(tf)
    if single is not None:
        every = len(signature) == 1 or _multi_output_supported(tf)
        ds = single(plain(init), plain(next_), plain(finalize), signature, every)
        return guarded(tf, ds) if every else ds
    return _GeneratorDataset(tf.constant(0, tf.int64), plain(init), plain(next_),
                             plain(finalize), output_signature=signature)


# A tf.data function with this attribute is instantiated for each iterator as a
# single-device function, without grappler's pass over it: about 2.5 ms of CPU less
# per function and iterator here (issue 29; TF's multi-device iterator sets it on its
# own generator's functions). One of several outputs needs `inject_prefetch` off
# (`single_device`); `init` and `finalize` have one output (an int64) each.
_single_device: dict[str, type | None] = {}  # the class, or None: probed once


def _single_device_class(tf) -> type | None:
    """TF's `_GeneratorDataset` with `init` and `finalize` as single-device
    functions (and `next` where asked), or None where this TF lacks or refuses
    it (probed once per process on a two-element generator: the fallback is TF's
    own class)."""
    if "cls" in _single_device:
        return _single_device["cls"]
    plain = tf.autograph.experimental.do_not_convert
    items = [np.arange(2, dtype=np.int64)]

    def step(_gid):
        if not items:
            raise StopIteration
        return items.pop()

    def next_(gid):
        out = tf.numpy_function(step, [gid], tf.int64, stateful=True)
        out.set_shape((None,))
        return out

    try:
        cls = _make_single_device_class(tf)
        probe = cls(plain(lambda _: tf.constant(0, tf.int64)), plain(next_),
                    plain(lambda gid: gid), tf.TensorSpec((None,), tf.int64), False)
        if [int(v) for v in probe.unbatch()] != [0, 1]:
            cls = None
    except Exception:  # noqa: BLE001 - a TF that refuses it: its own class instead
        cls = None
    _single_device["cls"] = cls
    return cls


def _make_single_device_class(tf) -> type:
    from tensorflow.python.data.ops import structured_function
    from tensorflow.python.data.ops.from_generator_op import _GeneratorDataset
    from tensorflow.python.data.util import structure
    from tensorflow.python.ops import gen_dataset_ops

    class SingleDeviceEnds(_GeneratorDataset):
        """`_GeneratorDataset.__init__`, with `defun_kwargs` for `init` and
        `finalize`, and for `next_` where `every`."""

        def __init__(self, init, next_, finalize, output_signature, every: bool):
            self._init_args = tf.constant(0, tf.int64)
            self._init_structure = structure.type_spec_from_value(self._init_args)
            self._output_signature = output_signature
            self._name = None
            name = self._transformation_name()
            wrap = structured_function.StructuredFunctionWrapper
            self._init_func = wrap(init, name, input_structure=self._init_structure,
                                   defun_kwargs=dict(SINGLE_DEVICE))
            state = self._init_func.output_structure
            self._next_func = wrap(next_, name, input_structure=state,
                                   defun_kwargs=dict(SINGLE_DEVICE) if every else None)
            self._finalize_func = wrap(finalize, name, input_structure=state,
                                       defun_kwargs=dict(SINGLE_DEVICE))
            variant = gen_dataset_ops.generator_dataset(
                structure.to_tensor_list(self._init_structure, self._init_args)
                + self._init_func.function.captured_inputs,
                self._next_func.function.captured_inputs,
                self._finalize_func.function.captured_inputs,
                init_func=self._init_func.function, next_func=self._next_func.function,
                finalize_func=self._finalize_func.function, **self._common_args)
            super(_GeneratorDataset, self).__init__(variant)  # DatasetSource's

    return SingleDeviceEnds
