"""The TF-free entry points: a folder, FUSE path or URL in; a loader or a dataset out."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dali_loader import probes
from dali_loader.args import positive_int
from dali_loader.decode.dali_batches import DaliBatches
from dali_loader.decode.spec import ImageSpec, channels_for
from dali_loader.index import Index, build_index
from dali_loader.plan import Engine, Environment, Options, Output, Plan, check, resolve
from dali_loader.storage.source import Source, open_source
from dali_loader.tfdata.dataset import make_loader, to_tf_dataset


def open_index(
    source: str,
    *,
    labels="inferred",
    class_names: list[str] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    follow_links: bool = False,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
    max_in_flight: int = 64,
    require_files: bool = True,
    manifest: str = "use",
) -> tuple[Source, Index]:
    """Lists `source` once and indexes it with Keras's rules: `(Source, Index)`.

    `manifest`: for URLs, "use" (the listing manifest in the cache directory
    when there is one, else list and write it), "refresh" or "off"
    (`storage.manifest`).

    Raises:
        ValueError: no images under `source` (with `require_files`).
    """
    src = open_source(
        source, follow_links=follow_links, cache_dir=cache_dir,
        cache_max_bytes=cache_max_bytes, max_in_flight=max_in_flight,
        labels_inferred=labels == "inferred", manifest=manifest,
    )
    try:
        index = build_index(
            src.root, src.rel_files, src.subdirs, labels=labels, class_names=class_names,
            shuffle=shuffle, seed=seed, join=src.join,
        )
        if require_files and not len(index):
            raise ValueError(f"No images found in directory {source}.")
        src.forget_listing()
    except BaseException:
        src.close()
        raise
    return src, index



@dataclasses.dataclass(frozen=True)
class Listed:
    """A listed source and what its datasets are planned with (`open_listed`)."""

    source: Source
    index: Index
    options: Options  # as the caller passed them, the seed drawn when None
    env: Environment  # the machine's facts (the source's are added per dataset)


def open_listed(source: str, options: Options, **listing: Any) -> Listed:
    """Checks `options` (every refusal before listing, as Keras checks its arguments
    first), draws the seed when none was passed (as Keras does), then lists `source`
    once (`open_index`; `listing`: its labels, class_names, follow_links, cache_dir,
    require_files)."""
    env = probes.environment()
    check(options, env)
    if options.seed is None:
        options = dataclasses.replace(options, seed=int(np.random.randint(1e6)))
    src, index = open_index(
        source, shuffle=options.shuffle, seed=options.seed, max_in_flight=options.max_in_flight,
        cache_max_bytes=options.cache_max_bytes, manifest=options.manifest, **listing)
    return Listed(src, index, options, env)


def plan_for(listed: Listed, index: Index, shuffle: bool) -> Plan:
    """The plan of one dataset over `index` (the listing's, or a split of it): the
    options as they run (this dataset's `shuffle`, the drawn seed), its files."""
    plan = resolve(dataclasses.replace(listed.options, shuffle=shuffle),
                   listed.env.with_source(listed.source.kind, index.paths))
    probes.say_notes(plan)
    probes.share_gpu(plan)
    return plan


def build(listed: Listed, index: Index, spec: ImageSpec, *, shuffle: bool,
          label_mode: str | None = "int", num_classes: int = 0,
          attributes: dict[str, Any] | None = None):
    """The one sequence every entry point runs after listing: the plan of `index`,
    then what it says to build: numpy batches (`DaliBatches`), the tf.data service's
    dataset, or a loader wrapped as a Keras-shaped tf.data.Dataset."""
    plan = plan_for(listed, index, shuffle)
    o = plan.options
    if plan.engine is Engine.SERVICE:
        from dali_loader.tfdata.service import service_dataset

        ds = service_dataset(index, spec, o.batch_size, label_mode, num_classes, plan)
        for name, value in (attributes or {}).items():
            setattr(ds, name, value)
        return ds
    loader = make_loader(listed.source, index, spec, plan, batch_size=o.batch_size or 32,
                         shuffle=shuffle, seed=o.seed)
    if plan.output is Output.NUMPY:
        return loader
    return to_tf_dataset(loader, spec, o.batch_size, label_mode, num_classes,
                         attributes=attributes)

def open_loader(
    source: str,
    *,
    batch_size: int = 32,
    image_size: tuple[int, int] = (256, 256),
    color_mode: str = "rgb",
    interpolation: str = "bilinear",
    crop_to_aspect_ratio: bool = False,
    pad_to_aspect_ratio: bool = False,
    shuffle: bool = True,
    seed: int | None = None,
    labels="inferred",
    class_names: list[str] | None = None,
    follow_links: bool = False,
    device: str | None = None,
    num_threads: int | None = None,
    on_error: str = "raise",
    max_in_flight: int = 64,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
) -> DaliBatches:
    """Lists `source` (folder, FUSE path or URL) and returns its `DaliBatches`:
    each `iter()` is one epoch of `(images, labels)` numpy batches, decoded by DALI
    (`.plan` says how: the DALI engine, its device, the PNG decoder).

    The TF-free entry point; `tf_adapter.image_dataset_from_directory` is the
    Keras-exact one (argument checks, splits, label modes, tf.data output).
    """
    channels = channels_for(color_mode)
    positive_int("batch_size", batch_size)
    options = Options(device=device, num_threads=num_threads, on_error=on_error,
                      max_in_flight=max_in_flight, cache_max_bytes=cache_max_bytes,
                      batch_size=batch_size, shuffle=shuffle, seed=seed, output=Output.NUMPY)
    listed = open_listed(source, options, labels=labels, class_names=class_names,
                         follow_links=follow_links, cache_dir=cache_dir)
    spec = ImageSpec(int(image_size[0]), int(image_size[1]), channels, interpolation,
                     crop_to_aspect_ratio, pad_to_aspect_ratio)
    try:
        return build(listed, listed.index, spec, shuffle=shuffle)
    except BaseException:
        listed.source.close()
        raise

def open_dataset(
    source: str,
    *,
    batch_size: int = 32,
    image_size: tuple[int, int] = (256, 256),
    shuffle: bool = True,
    seed: int = 0,
    device: str | None = None,
    decoder: str | None = None,
    max_in_flight: int = 64,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
    gpu_ready: bool | str | None = None,
    png_decoder: str | None = None,
    entry_decoder: str | None = None,
):
    """The dataset `image_dataset_from_directory` builds, for the tools to time.

    RGB, bilinear, integer labels, no split. `device=None` is the GPU when TF
    and DALI see one; the CPU decodes with TF's kernels unless `decoder="dali"`.
    `gpu_ready=True` reads through the GPU-ready cache in `cache_dir` (bounded
    by `cache_max_bytes`): each file is decoded on the CPU once, when its entry
    is filled; `ds.loader.epoch_stats` counts the CPU decodes per epoch.
    `png_decoder` picks who decodes PNGs (`ds.loader.plan` names the one that
    runs: `plan.resolve`); `entry_decoder` who decodes the compact entries. Every
    option is checked before `source` is listed.
    """
    options = Options(device=device, decoder=decoder, max_in_flight=max_in_flight,
                      cache_max_bytes=cache_max_bytes, gpu_ready=gpu_ready,
                      entry_decoder=entry_decoder, png_decoder=png_decoder,
                      batch_size=batch_size, shuffle=shuffle, seed=seed)
    listed = open_listed(source, options, cache_dir=cache_dir)
    try:
        return build(listed, listed.index, ImageSpec(int(image_size[0]), int(image_size[1])),
                     shuffle=shuffle, num_classes=len(listed.index.class_names or []))
    except BaseException:
        listed.source.close()
        raise
