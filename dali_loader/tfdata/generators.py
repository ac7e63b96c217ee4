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

from dali_loader import tf_internals
from dali_loader.exiting import stoppable
from dali_loader.tf_internals import Internal
from dali_loader.tfdata.single_device import guarded
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
    element, one to close, also when an iterator is abandoned): a TF internal,
    `tf_internals.Internal.GENERATOR_OP`. Measured on a 16-file folder: an epoch's
    best 41.8 -> 29.3 ms, Keras's 14.5-16.7 (docs/benchmarks.md, issue 29).
    `from_generator` where that internal is off."""
    types = tuple(s.dtype for s in signature)
    open_ = _weakly(generators, "open", lambda: np.int64(-1))
    step = _weakly(generators, "next", _end)
    close = _weakly(generators, "close", lambda gid: np.int64(0))
    if not tf_internals.on(tf, Internal.GENERATOR_OP):
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

    ends = _single_device_ends(tf)
    every = ends and (len(signature) == 1 or _multi_output_supported(tf))
    ds = tf_internals.generator_dataset(tf, plain(init), plain(next_), plain(finalize),
                                        signature, ends=ends, every=every)
    return guarded(tf, ds) if every else ds


# Single-device `init` and `finalize` (`tf_internals.Internal.SINGLE_DEVICE_FUNCTIONS`):
# about 2.5 ms of CPU less per function and iterator here (issue 29; TF's multi-device
# iterator sets the attribute on its own generator's functions). `next` too where this TF
# takes single-device functions of several outputs (`single_device.supported`: they need
# `inject_prefetch` off); `init` and `finalize` have one output (an int64) each.


def _single_device_ends(tf) -> bool:
    """Whether the generator's `init` and `finalize` are single-device functions here:
    the internal on, and this TF taking them (`tf_internals.probed` once per process on a
    two-element generator; TF's own functions where it refuses)."""
    if not tf_internals.on(tf, Internal.SINGLE_DEVICE_FUNCTIONS):
        return False
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

    def attempt() -> bool:
        probe = tf_internals.generator_dataset(
            tf, plain(lambda _: tf.constant(0, tf.int64)), plain(next_),
            plain(lambda gid: gid), tf.TensorSpec((None,), tf.int64), ends=True, every=False)
        return [int(v) for v in probe.unbatch()] == [0, 1]

    return tf_internals.probed("single-device generator ends", attempt)
