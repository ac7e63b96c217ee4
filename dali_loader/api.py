"""The TF-free entry point: a folder, FUSE path or URL in, a `BatchLoader` out."""

from __future__ import annotations

import numpy as np

from dali_loader.devices import resolve_device
from dali_loader.index import build_index
from dali_loader.loader import BatchLoader
from dali_loader.pipeline import ImageSpec
from dali_loader.sources import list_source


def open_index(
    source: str,
    *,
    labels: str | None = "inferred",
    class_names: list[str] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    follow_links: bool = False,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
    max_in_flight: int = 64,
):
    """Lists `source` once and indexes it with Keras's rules: `(listing, index)`.

    Raises:
        ValueError: no images under `source`.
    """
    listing = list_source(
        source, follow_links=follow_links, cache_dir=cache_dir,
        cache_max_bytes=cache_max_bytes, max_in_flight=max_in_flight,
        labels_inferred=labels == "inferred",
    )
    index = build_index(
        listing.root, listing.rel_files, listing.subdirs, labels=labels,
        class_names=class_names, shuffle=shuffle, seed=seed, join=listing.join,
    )
    if not len(index):
        raise ValueError(f"No images found in directory {source}.")
    return listing, index


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
    labels: str | None = "inferred",
    class_names: list[str] | None = None,
    follow_links: bool = False,
    device: str | None = None,
    num_threads: int | None = None,
    on_error: str = "raise",
    max_in_flight: int = 64,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
) -> BatchLoader:
    """Lists `source` (folder, FUSE path or URL) and returns its `BatchLoader`.

    The TF-free entry point; `tf_adapter.image_dataset_from_directory` is the
    Keras-exact one (argument checks, splits, label modes, tf.data output).
    """
    channels = {"rgb": 3, "rgba": 4, "grayscale": 1}.get(color_mode)
    if channels is None:
        raise ValueError(
            '`color_mode` must be one of {"rgb", "rgba", "grayscale"}. '
            f"Received: color_mode={color_mode}"
        )
    if seed is None:
        seed = int(np.random.randint(1e6))
    listing, index = open_index(
        source, labels=labels, class_names=class_names, shuffle=shuffle, seed=seed,
        follow_links=follow_links, cache_dir=cache_dir, cache_max_bytes=cache_max_bytes,
        max_in_flight=max_in_flight,
    )
    spec = ImageSpec(
        int(image_size[0]),
        int(image_size[1]),
        channels,
        interpolation,
        crop_to_aspect_ratio,
        pad_to_aspect_ratio,
    )
    return BatchLoader(
        index,
        spec,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        read_fn=listing.read,
        device=resolve_device(device),
        num_threads=num_threads,
        on_error=on_error,
        max_in_flight=max_in_flight,
    )


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
):
    """The loader as `image_dataset_from_directory` builds it, as a tf.data.Dataset.

    RGB, bilinear, integer labels, no split: what `bench` and `diagnose` time.
    `device=None` is the CPU unless DALI sees a GPU; the CPU decodes with TF's
    kernels unless `decoder="dali"` (see `dali_loader.tfdata`).
    """
    from dali_loader.tfdata import make_loader, to_tf_dataset

    listing, index = open_index(source, shuffle=shuffle, seed=seed, cache_dir=cache_dir,
                                max_in_flight=max_in_flight)
    spec = ImageSpec(int(image_size[0]), int(image_size[1]))
    loader = make_loader(listing, index, spec, batch_size=batch_size, shuffle=shuffle,
                         seed=seed, device=resolve_device(device), decoder=decoder,
                         max_in_flight=max_in_flight)
    return to_tf_dataset(loader, batch_size, "int", len(index.class_names or []), True)
