"""tf.data maps whose functions TF instantiates as single-device functions.

Every iterator instantiates each function of its pipeline again. A function
TF treats as multi-device (the default) gets grappler's pass and a placement
each time: about 3-4 ms of CPU per function and `iter()` here (issue 29). TF's
tf.data runtime instantiates a function with TF's single-device attribute as a
single-device function instead: about 0.2 ms. The attribute and the classes that
set it are TF internals (`tf_internals.Internal.SINGLE_DEVICE_FUNCTIONS`, with its
measured gain); where that is off, these are TF's own maps.

One condition: TF's `inject_prefetch` and `slack` passes read such a function of
two or more outputs as a pipeline and refuse it ("Expected only one fetch
node"), so a pipeline with one turns `inject_prefetch` off (`no_function_passes`;
`slack` is off unless a user turns it on: then `DALI_LOADER_SINGLE_DEVICE_MAPS=0`,
docs/parity.md). `supported` probes this TF once; where it refuses, the maps are
TF's own. TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dali_loader import tf_internals
from dali_loader.tf_internals import Internal

ENV = tf_internals.SINGLE_DEVICE_ENV  # "0": TF's own (multi-device) functions


def no_function_passes(tf):
    """Options that keep TF's pipeline-only passes off the single-device functions."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return options


def guarded(tf, ds):
    """`ds` with `no_function_passes` where its maps are single-device (`supported`)."""
    return ds.with_options(no_function_passes(tf)) if supported(tf) else ds


def supported(tf) -> bool:
    """Whether this TF runs single-device maps of two outputs (probed once per
    process on a four-element dataset, with `no_function_passes`); not where the
    internal is off (`tf_internals`: its gate, `DALI_LOADER_TF_INTERNALS=0` or
    `DALI_LOADER_SINGLE_DEVICE_MAPS=0`)."""
    if not tf_internals.on(tf, Internal.SINGLE_DEVICE_FUNCTIONS):
        return False
    plain = tf.autograph.experimental.do_not_convert

    def twice(x):
        return x * 2, x + 1

    def attempt() -> bool:
        map_ = tf_internals.single_device_map
        ds = tf.data.Dataset.range(4)
        ds = tf_internals.single_device_map_and_batch(
            tf, map_(tf, ds, plain(twice), 2).map(lambda a, b: a + b), plain(twice), 3, 2)
        ds = map_(tf, ds, plain(lambda a, b: (a - b, b)), None).with_options(
            no_function_passes(tf))
        return [v[0].tolist() for v in ds.as_numpy_iterator()] == [[0, 3, 6], [9]]

    return tf_internals.probed("single-device maps of two outputs", attempt)


def map_(tf, ds, fn: Callable, calls: int | None = None):
    """`ds.map(fn)`, in order, `calls` at a time (None: one by one), `fn` single-device
    where `supported`. The caller applies `no_function_passes` to its pipeline."""
    if supported(tf):
        return tf_internals.single_device_map(tf, ds, fn, calls)
    if calls is None:
        return ds.map(fn)
    # In order whatever a user's `Options.deterministic` says (TF's documented rule).
    return ds.map(fn, num_parallel_calls=calls, deterministic=True)


def map_and_batch(tf, ds, fn: Callable, batch: int, calls: int):
    """`ds.map(fn).batch(batch)` as TF's one fused op, `fn` single-device where
    `supported`: batches in order, each of `batch` elements in a row (the last
    one shorter); a failing call fails its whole batch, whose bounds stay."""
    if supported(tf):
        return tf_internals.single_device_map_and_batch(tf, ds, fn, batch, calls)
    # The op is current; its public name is deprecated: TF's one log line about it dropped.
    quiet = _Dropping("map_and_batch")
    logger = tf.get_logger()
    logger.addFilter(quiet)
    try:
        return ds.apply(tf.data.experimental.map_and_batch(fn, batch, num_parallel_calls=calls))
    finally:
        logger.removeFilter(quiet)


class _Dropping(logging.Filter):
    """Drops the log records that mention `word`."""

    def __init__(self, word: str):
        super().__init__()
        self.word = word

    def filter(self, record: logging.LogRecord) -> bool:
        return self.word not in record.getMessage()
