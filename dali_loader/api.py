"""The TF-free entry points: a folder, FUSE path or URL in; a loader or a dataset out."""

from __future__ import annotations

import numpy as np

from dali_loader import probes
from dali_loader.args import positive_int
from dali_loader.decode.dali_batches import DaliBatches
from dali_loader.decode.spec import ImageSpec, channels_for
from dali_loader.index import Index, build_index
from dali_loader.plan import Options, Output, check, resolve
from dali_loader.storage.source import Source, open_source
from dali_loader.tfdata.dataset import make_loader


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
    env = probes.environment()
    check(options, env)
    if seed is None:
        seed = int(np.random.randint(1e6))
    src, index = open_index(
        source, labels=labels, class_names=class_names, shuffle=shuffle, seed=seed,
        follow_links=follow_links, cache_dir=cache_dir, cache_max_bytes=cache_max_bytes,
        max_in_flight=max_in_flight,
    )
    spec = ImageSpec(int(image_size[0]), int(image_size[1]), channels, interpolation,
                     crop_to_aspect_ratio, pad_to_aspect_ratio)
    plan = resolve(options, env.with_source(src.kind, index.paths))
    probes.say_notes(plan)
    try:
        return make_loader(src, index, spec, plan, batch_size=batch_size, shuffle=shuffle,
                           seed=seed)
    except BaseException:
        src.close()
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
):
    """The dataset `image_dataset_from_directory` builds, for the tools to time.

    RGB, bilinear, integer labels, no split. `device=None` is the GPU when TF
    and DALI see one; the CPU decodes with TF's kernels unless `decoder="dali"`.
    `gpu_ready=True` reads through the GPU-ready cache in `cache_dir` (bounded
    by `cache_max_bytes`): each file is decoded on the CPU once, when its entry
    is filled; `ds.loader.epoch_stats` counts the CPU decodes per epoch.
    `png_decoder` picks who decodes PNGs (`ds.loader.plan` names the one that
    runs: `plan.resolve`). Every option is checked before `source` is listed.
    """
    from dali_loader.tfdata.dataset import to_tf_dataset

    options = Options(device=device, decoder=decoder, max_in_flight=max_in_flight,
                      cache_max_bytes=cache_max_bytes, gpu_ready=gpu_ready,
                      png_decoder=png_decoder, batch_size=batch_size, shuffle=shuffle, seed=seed)
    env = probes.environment()
    check(options, env)
    src, index = open_index(source, shuffle=shuffle, seed=seed, cache_dir=cache_dir,
                            cache_max_bytes=cache_max_bytes, max_in_flight=max_in_flight)
    spec = ImageSpec(int(image_size[0]), int(image_size[1]))
    try:
        plan = resolve(options, env.with_source(src.kind, index.paths))
        probes.say_notes(plan)
        probes.share_gpu(plan)
        loader = make_loader(src, index, spec, plan, batch_size=batch_size, shuffle=shuffle,
                             seed=seed)
    except BaseException:
        src.close()
        raise
    return to_tf_dataset(loader, spec, batch_size, "int", len(index.class_names or []))
