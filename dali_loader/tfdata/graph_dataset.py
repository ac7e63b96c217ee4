"""A dataset with no Python in its element path: a graph a tf.data service worker can run.

The index is three constant tensors (paths, labels) and each epoch's order is
`stateless_shuffle(range(n), seed=(seed, key))`, where `key` is the next value
of `Dataset.random(seed, rerandomize_each_iteration=True)`: each `iter()` of
the dataset is the next epoch (the same sequence for the same `seed`), as
Keras's `shuffle(reshuffle_each_iteration=True)` does. The element path has ONE
source, the epoch's order (`from_tensor_slices`), so dynamic sharding splits
positions, and a file's path and label are gathered from the same position:
an image cannot meet another file's label (zipping a paths source and a labels
source can, under `distributed_epoch`; issue 18).

Worker side (`worker_dataset`): read, decode and resize with the ops of
Keras's loader (`decode.tf_kernels.decode_like_keras`, bit-exact), one guarded
step per file, the plan's `decode_calls` at once (`max_in_flight` for remote or
FUSE/network files, whose reads wait on latency, else `num_threads`, by default
AUTOTUNE: each worker's cores); batch into transfer batches. A file that fails to read or decode
becomes a zero image flagged `ok=False` (one element per position, always),
never an error in the worker: the trainer decides (`on_error`).

Trainer side (`graph_dataset`): each batch is recorded in an `EpochTally`
(one Python call per batch, on the trainer only: what arrived, exactly once or
not; a bad file raises naming it, or is skipped and counted), bad rows
dropped, labels in Keras's `label_mode`, then `rebatch(batch_size)`: Keras's batches, one partial batch at the
end, whatever transfer batches the workers sent.
"""

from __future__ import annotations

import math
import os

from dali_loader.decode.spec import ImageSpec
from dali_loader.decode.tf_kernels import decode_like_keras, labels_like_keras
from dali_loader.index import Index
from dali_loader.lazy import import_tf
from dali_loader.tfdata.epoch_tally import EpochTally

TRANSFER_BATCH = 32  # elements per worker batch when the dataset is unbatched (batch_size=None)


def epoch_keys(tf, seed: int):
    """One int64 per iteration, a new one each `iter()`, the same sequence for a `seed`."""
    return tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)


def worker_dataset(tf, paths, labels, key, spec: ImageSpec, *, seed: int, shuffle: bool,
                   transfer_batch: int, parallel: int | None):
    """One epoch's elements, in transfer batches of `(images, labels, positions, ok)`.

    Pure TensorFlow ops (no Python), so the tf.data service can run it. `paths`
    and `labels` are constant tensors; `key` the epoch's key. Each position p
    becomes two elements, "load p" and "end of p"; a parallel map (`parallel`
    at once, None: AUTOTUNE, i.e. each worker's cores; order kept) reads and
    decodes the first and passes the second; `ignore_errors` drops a load that
    failed; a scan then turns an "end of p" not preceded by p's image into a
    zero image flagged `ok=False`. One element per position, whatever happens
    to the file, at the cost of a plain parallel map.
    """
    n = int(paths.shape[0])
    order = tf.range(n, dtype=tf.int32)
    if shuffle:
        order = tf.random.experimental.stateless_shuffle(
            order, seed=tf.stack([tf.constant(seed, tf.int64), tf.cast(key, tf.int64)]))
    dtype = tf.function(lambda d: decode_like_keras(d, spec, tf)).get_concrete_function(
        tf.TensorSpec((), tf.string)).structured_outputs.dtype  # float32; uint8 for "nearest"
    empty = (0,) * (len(spec.shape) - 1) + (spec.channels,)
    if spec.channels_first:
        empty = (spec.channels,) + (0,) * (len(spec.shape) - 1)

    def load_or_pass(pos, is_end):
        def load():
            return decode_like_keras(tf.io.read_file(tf.gather(paths, pos)), spec, tf)
        img = tf.cond(is_end, lambda: tf.zeros(empty, dtype), load)
        return tf.ensure_shape(img, [None] * len(spec.shape)), pos, is_end

    def pair_up(last_loaded, element):
        img, pos, is_end = element
        bad = tf.logical_and(is_end, tf.not_equal(last_loaded, pos))
        out = tf.cond(bad, lambda: tf.zeros(spec.shape, dtype), lambda: img)
        keep = tf.logical_or(bad, tf.logical_not(is_end))
        return (tf.where(is_end, last_loaded, pos),
                (out, tf.gather(labels, pos), pos, tf.logical_not(bad), keep))

    ds = tf.data.Dataset.from_tensor_slices(order)
    ds = ds.flat_map(lambda p: tf.data.Dataset.from_tensor_slices(
        (tf.stack([p, p]), tf.constant([False, True]))))
    ds = ds.map(load_or_pass, num_parallel_calls=parallel or tf.data.AUTOTUNE,
                deterministic=True).ignore_errors(log_warning=True)
    ds = ds.scan(tf.constant(-1, tf.int32), pair_up)
    ds = ds.filter(lambda img, label, pos, ok, keep: keep)
    ds = ds.map(lambda img, label, pos, ok, keep: (tf.ensure_shape(img, spec.shape), label, pos, ok))
    return ds.batch(transfer_batch)


def graph_dataset(index: Index, spec: ImageSpec, batch_size: int | None, label_mode: str | None,
                  num_classes: int, *, seed: int, shuffle: bool, on_error: str,
                  parallel: int | None = None, distribute=None):
    """Keras's dataset from a graph with no Python in its element path.

    Args:
        parallel: Reads and decodes in flight: the plan's `decode_calls`
            (`max_in_flight` where reads wait on latency), None: AUTOTUNE.
        distribute: None (the graph runs in this process) or a function
            `dataset -> dataset` run on each epoch's worker dataset (the
            tf.data service: `tfdata.service.distributor`).

    Returns:
        A `tf.data.Dataset` with `.tally` (an `EpochTally`: per epoch, files
        delivered, skipped, missing, repeated). Cardinality: Keras's
        (`ceil(files / batch_size)`) with `on_error="raise"`, where a short
        epoch is an error; unknown with `"skip"`.
    """
    tf = import_tf()
    n = len(index)
    paths = tf.constant([os.fsencode(p) for p in index.paths], tf.string)  # any name
    label_values = index.labels if index.labels is not None else [0] * n
    labels = tf.constant(label_values, tf.int32, shape=(n,))
    tally = EpochTally(list(index.paths), on_error)
    transfer = batch_size or TRANSFER_BATCH

    def epoch(key):
        ds = worker_dataset(tf, paths, labels, key, spec, seed=seed, shuffle=shuffle,
                            transfer_batch=transfer, parallel=parallel)
        if distribute is not None:
            ds = distribute(ds)
        return ds.map(lambda x, y, pos, ok: (x, y, pos, ok, key))

    def check(x, y, pos, ok, key):
        seen = tf.numpy_function(tally.record, [key, pos, ok], tf.int64, stateful=True)
        with tf.control_dependencies([seen]):
            keep = tf.identity(ok)
        x, y = tf.boolean_mask(x, keep), tf.boolean_mask(y, keep)
        # Keras's label modes, row by row (before the rebatch)
        return labels_like_keras(tf, label_mode, num_classes, x, y)

    ds = epoch_keys(tf, seed).flat_map(epoch).map(check)
    ds = ds.rebatch(batch_size) if batch_size else ds.unbatch()
    if on_error == "raise":
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            math.ceil(n / batch_size) if batch_size else n))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds.tally = tally
    return ds
