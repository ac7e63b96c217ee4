"""tf.data output: a finite, Keras-shaped `tf.data.Dataset` over a loader.

The wiring: `make_loader` builds what a dataset iterates as the plan says (a
`Feed` or `DaliBatches`), `ready_cache` the GPU-ready cache, and `to_tf_dataset`
hands the loader to its path's module, then adds Keras's labels, the
cardinality and the handle (`ds.loader`):
- TensorFlow's own kernels over files (the CPU default; Keras's pixels, every
  file TF's decoder drops named by the audit): `tf_path`;
- TensorFlow's kernels over pixels (the GPU-ready cache's raw entries, or files
  the feed decoded): `ready_path`; over the cache's compact entries, decoded by
  the native op (which also fills the cache): `compact_path`;
- DALI (`DaliBatches`, the GPU path; with `gpu_ready` it reads the cache's
  entries too): batches reach TF through the DALI TF plugin (`dali_plugin`), or
  through `from_generator`, one Python call per batch (`dali_path`), as the
  plan's `Handoff` says.
Each iteration of the dataset is an independent epoch (TF calls the generator
once per iterator). TensorFlow is imported lazily.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dali_loader import probes
from dali_loader.decode.dali_batches import DaliBatches
from dali_loader.decode.png_stage import KerasPixels, RawOrCheckedItems
from dali_loader.decode.spec import ImageSpec
from dali_loader.formats.ready import ReadyForm
from dali_loader.decode.tf_kernels import labels_like_keras, pixels_like_keras
from dali_loader.errors import CorruptImageError
from dali_loader.feed.checks import size_problem
from dali_loader.feed.epochs import Feed
from dali_loader.feed.items import CheckedBytes, Paths, PinnedOrBytes, RawBytes
from dali_loader.feed.ready import ReadyBytes, ReadyCache, ReadyPinned
from dali_loader.index import Index
from dali_loader.lazy import import_tf
from dali_loader.plan import (
    DEFAULT_MAX_PIXELS,
    BigPngs,
    Engine,
    ItemReader,
    Options,
    Plan,
    PngBinding,
    PngWhere,
    resolve,
)
from dali_loader.storage.source import Source
from dali_loader.tfdata.compact_path import compact_dataset
from dali_loader.tfdata.dali_path import dali_dataset
from dali_loader.tfdata.dali_plugin import plugin_dataset
from dali_loader.tfdata.handle import LoaderHandle
from dali_loader.tfdata.ready_path import pooled_empty, ready_dataset
from dali_loader.tfdata.tf_path import TF_CHUNK, TF_LOCAL_CHUNK, tf_kernel_dataset


def make_loader(source: Source, index: Index, spec: ImageSpec, plan: Plan | None = None, *,
                batch_size: int, shuffle: bool, seed: int, **options) -> DaliBatches | Feed:
    """What a dataset iterates, built as `plan` says (`dali_loader.plan`): a
    `DaliBatches` for the DALI engine, else a `Feed` for TF's kernels, reading
    with the plan's item reader (on a local disk TF reads the files; FUSE/NFS
    mounts and URLs keep the feed's read-ahead), the GPU-ready cache in the
    plan's form (filled by Wuffs on the feed's threads or by TF's decoder), and
    the plan's PNG decoder. The result carries the plan (`.plan`).

    Without a `plan`, `options` (`plan.Options` fields, e.g. `device="cpu"`,
    `png_decoder="wuffs"`) are resolved here against this machine
    (`probes.environment`) and `source`."""
    if plan is None:
        plan = resolve(Options(batch_size=batch_size, **options),
                       probes.environment(source.kind, index.paths))
    elif options:
        raise TypeError(f"make_loader takes a plan or options, not both. Received: {sorted(options)}")
    o = plan.options
    kw = dict(shuffle=shuffle, seed=seed, on_error=o.on_error, max_in_flight=o.max_in_flight,
              source=source, batch_size=batch_size, shard=plan.shard)
    # Wuffs on the feed's threads: the DALI path's raw PNG entries, GPU-ready fills.
    pixels = (KerasPixels(spec.channels, plan.decode_calls, o.max_pixels,
                          native=plan.png_binding is PngBinding.NATIVE_CORE)
              if plan.feed_pixels else None)
    if plan.cache_form is not None:
        ready = ready_cache(source, plan.cache_form, spec.channels, pixels, o.max_pixels)
    reader = plan.item_reader
    if plan.engine is Engine.DALI:
        dali = dict(device=plan.device.value, num_threads=plan.decode_calls,
                    device_id=plan.device_id, input=plan.dali_input)
        if reader is ItemReader.READY_BYTES:
            items = ReadyBytes(ready, index.paths)
        elif reader is ItemReader.RAW_OR_CHECKED:
            items = RawOrCheckedItems(source, pixels)
        else:
            items = CheckedBytes(source, rgba=spec.channels == 4, max_pixels=o.max_pixels)
        feed = Feed(index, items, chunk_size=batch_size, **kw)
        loader = DaliBatches(feed, spec, png_native=plan.png_where is PngWhere.DALI_OP,
                             max_pixels=o.max_pixels,
                             host_pixels=plan.big_pngs is BigPngs.TF_BEFORE_DALI, **dali)
    elif reader is ItemReader.READY_PINNED:  # whole batches of entries, read into one buffer
        items = ReadyPinned(ready, index.paths, png_fills=plan.fill_where is PngWhere.TF_OP,
                            max_pixels=o.max_pixels)
        loader = Feed(index, items, chunk_size=batch_size, **kw)
    elif reader is ItemReader.PATHS:  # no reads to wait for: large chunks (after a small one)
        loader = Feed(index, Paths(index.paths, o.max_pixels), chunk_size=TF_LOCAL_CHUNK, **kw)
    else:
        # TF batches again after decoding: small chunks let decoding start on the
        # first files of an epoch instead of waiting for a whole batch.
        items = {ItemReader.RAW_BYTES: RawBytes, ItemReader.PINNED_OR_BYTES: PinnedOrBytes}[reader]
        loader = Feed(index, items(source, o.max_pixels), chunk_size=min(batch_size, TF_CHUNK),
                      **kw)
    loader.plan = plan
    return loader


def ready_cache(source: Source, form: ReadyForm, channels: int,
                pixels: KerasPixels | None = None,
                max_pixels: int | None = DEFAULT_MAX_PIXELS) -> ReadyCache:
    """The GPU-ready cache of `source` in `form`, filled by `pixels` (PNGs by
    Wuffs) or else TF's decoder."""
    decode = (functools.partial(_keras_pixels, channels, max_pixels) if pixels is None
              else pixels)
    # Raw entries are read into TF's pooled memory (a large image's pixels reuse what TF
    # freed after decoding it); compact entries are small bytes, read as they are.
    alloc = None if form is ReadyForm.COMPACT else functools.partial(pooled_empty, import_tf())
    return ReadyCache(source, form, channels, decode, alloc=alloc)


def _keras_pixels(channels: int, max_pixels: int | None, data: bytes, path: str) -> np.ndarray:
    """The GPU-ready cache's decoder: TF's, eagerly, on a read-ahead thread
    (after the header's size check)."""
    problem = size_problem(data, max_pixels)
    if problem:
        raise CorruptImageError(path, problem)
    return pixels_like_keras(data, path, channels, import_tf())


def to_tf_dataset(loader: DaliBatches | Feed, spec: ImageSpec, batch_size: int | None,
                  label_mode: str | None, num_classes: int, *, epoch: int | None = None,
                  start_step: int = 0, attributes: dict[str, Any] | None = None):
    """Wraps a loader (`make_loader`'s) as a finite, batched tf.data.Dataset like Keras's.

    Args:
        loader: `DaliBatches` (DALI decodes) or a `Feed` (TF's kernels decode),
            with its plan (`loader.plan`: the handoff, TF's parallel decodes).
        spec: The output image spec.
        batch_size: Images per batch, or None for single images.
        label_mode: "int", "categorical", "binary" or None.
        num_classes: For "categorical".
        epoch: None: each iteration is the next epoch. An int: every iteration
            is that epoch, from its batch `start_step` on (the rest of an
            interrupted epoch; see `ds.loader.resume_at`).
        start_step: With `epoch`, the first batch.
        attributes: Set on the dataset, and on every one `resume_at` returns
            (e.g. Keras's `class_names` and `file_paths`).

    The dataset's public handle is `ds.loader` (`tfdata.handle.LoaderHandle`:
    the plan, stats, seek/resume, close); `ds.close()`, `ds.seek(e)` and
    `ds.resume_at(e, k)` are its methods. The cardinality is asserted when
    `on_error="raise"` (no file is left out) and, when sharded, every input
    pipeline reads as many batches.
    """
    tf = import_tf()
    plan: Plan = loader.plan
    calls = plan.decode_calls  # TF's parallel decodes (num_threads, or by the cores)
    which = (epoch, start_step)
    audits = None
    if plan.handoff is not None and plan.handoff.plugin:
        ds = plugin_dataset(tf, loader, spec, batch_size, label_mode, num_classes, which,
                            _cardinality(loader.feed, batch_size, epoch, start_step), plan.handoff)
    else:
        labelled = functools.partial(labels_like_keras, tf, label_mode, num_classes)
        if plan.engine is Engine.DALI:
            ds = dali_dataset(tf, loader, spec, batch_size, which)
            feed = loader.feed
        elif plan.item_reader is ItemReader.READY_PINNED:
            path = compact_dataset if plan.cache_form is ReadyForm.COMPACT else ready_dataset
            ds = path(tf, loader, spec, batch_size, calls, which)
            feed = loader
        else:  # Keras's labels made in the audit's own map: one function fewer per iterator
            ds, audits = tf_kernel_dataset(tf, loader, spec, batch_size, which,
                                           labelled)
            feed = loader
            labelled = None
        if labelled is not None and label_mode != "int":
            plain = tf.autograph.experimental.do_not_convert  # see tf_path.tf_kernel_dataset
            ds = ds.map(plain(labelled))
        size = _cardinality(feed, batch_size, epoch, start_step)
        if size is not None:
            ds = ds.apply(tf.data.experimental.assert_cardinality(size))
        ds = ds.prefetch(tf.data.AUTOTUNE)
    handle = LoaderHandle(loader, plan, functools.partial(
        _resume_at, loader, spec, batch_size, label_mode, num_classes, attributes), audits)
    ds.loader = handle
    ds.close, ds.seek, ds.resume_at = handle.close, handle.seek, handle.resume_at
    for name, value in (attributes or {}).items():
        setattr(ds, name, value)
    return ds


def _cardinality(feed: Feed, batch_size: int | None, epoch: int | None,
                 start_step: int) -> int | None:
    """The batches of an iteration, when every one of them is known to come (None if not).

    Known when `on_error="raise"` (no file is left out). Sharded with uneven batch
    counts, it stays unknown: each worker's tf.distribute would take its own
    pipeline's count as the steps per epoch, and workers running different step
    counts deadlock their collectives. Unknown, tf.distribute runs every replica
    until all are exhausted (an empty batch for a replica that has none).
    """
    if epoch is not None:  # validated now, not at the first batch
        feed.check_start_step(start_step)
    if feed.on_error != "raise" or not feed.shards_even:
        return None
    size = -(-feed.num_files // batch_size) if batch_size else feed.num_files
    return size - (start_step if batch_size else min(size, start_step * feed.batch_size))


def _resume_at(loader, spec, batch_size, label_mode, num_classes, attributes,
               epoch: int, step: int):
    """The dataset of epoch `epoch` from batch `step` on (every iteration of it)."""
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"`epoch` must be a non-negative integer. Received: epoch={epoch!r}")
    return to_tf_dataset(loader, spec, batch_size, label_mode, num_classes, epoch=epoch,
                         start_step=step, attributes=attributes)
