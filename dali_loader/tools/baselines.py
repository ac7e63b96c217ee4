"""tf.data baselines the loader is compared against.

``seed_pipeline`` is the user's pipeline from the question, verbatim: ``list_files``, an unseeded
``shuffle``, the ``skip``/``take`` 80/20 split, the no-op ``interleave`` (each file becomes a
one-element dataset, so it adds nothing), ``map(process_path, AUTOTUNE)``, ``batch(128)`` and
``prefetch(AUTOTUNE)``. ``tf.io.read_file`` cannot reach a GCS emulator, so for ``gs://`` sources
the read step is a ``tf.py_function`` doing one google-cloud-storage GET per object, which is
what ``tf.io.read_file`` does on ``gs://`` (one request per object, one per parallel call).

``tuned_pipeline`` is best known tf.data practice: many reads in flight (a dedicated map with
``num_parallel_calls=64`` and a thread pool large enough to run them), a separate AUTOTUNE decode
map, ``deterministic=False`` and ``prefetch``.

TensorFlow is imported lazily; this module is importable without it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from dali_loader.args import positive_int
from dali_loader.lazy import import_tf
from dali_loader.storage.gcs import make_client
from dali_loader.storage.urls import parse_url

logger = logging.getLogger(__name__)

__all__ = ["seed_pipeline", "tuned_pipeline", "list_pngs", "infer_class_names", "gcs_client",
           "gcs_get"]


def _is_gcs(source: str) -> bool:
    return str(source).startswith("gs://")


def _split_gs(url: str) -> tuple[str, str]:
    """(bucket, prefix) of a ``gs://`` URL."""
    _, bucket, prefix = parse_url(url)
    return bucket, prefix


_local = threading.local()


def gcs_client():
    """Returns this thread's google-cloud-storage client (``storage.gcs.make_client``).

    One client per thread: a shared client's connection pool (10 connections) would throttle
    and churn under many concurrent GETs. A new ``STORAGE_EMULATOR_HOST`` gets a new client.
    """
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    cached = getattr(_local, "client", None)
    if cached is not None and cached[0] == emulator:
        return cached[1]
    client = make_client()
    _local.client = (emulator, client)
    return client


def gcs_get(url: str) -> bytes:
    """One GET of the object at ``gs://bucket/name`` on this thread's client."""
    bucket, name = _split_gs(url)
    return gcs_client().bucket(bucket).blob(name).download_as_bytes()


def list_pngs(source: str) -> list[str]:
    """Lists ``source/*/*.png`` (the seed's glob: one class level, lowercase ``.png``), sorted."""
    source = str(source)
    if _is_gcs(source):
        bucket, prefix = _split_gs(source)
        pre = f"{prefix}/" if prefix else ""
        names = [b.name for b in gcs_client().list_blobs(bucket, prefix=pre)]
        keep = [n for n in names if n.endswith(".png") and n[len(pre):].count("/") == 1]
        return sorted(f"gs://{bucket}/{n}" for n in keep)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"No such directory: {source}")
    out = []
    for cls in os.listdir(source):
        d = os.path.join(source, cls)
        if os.path.isdir(d):
            out += [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".png")]
    return sorted(out)


def _class_names(paths: Sequence[str]) -> list[str]:
    return sorted({p.rstrip("/").split("/")[-2] for p in paths})


def infer_class_names(source: str) -> list[str]:
    """Class names as the TF tutorial the seed follows computes them: sorted first-level folders."""
    return _class_names(list_pngs(source))


def _list_dataset(data_dir: str, class_names: Sequence[str] | None
                  ) -> tuple[str, list[str], Sequence[str]]:
    """(``data_dir`` without a trailing '/', its ``class/*.png`` files, the class names)."""
    data_dir = str(data_dir).rstrip("/")
    paths = list_pngs(data_dir)
    if not paths:
        raise ValueError(f"No .png files under {data_dir}/*/. Received: data_dir={data_dir!r}")
    return data_dir, paths, _class_names(paths) if class_names is None else class_names


def _gcs_read_fn():
    """A graph function reading one ``gs://`` URL with one GET (stands in for tf.io.read_file)."""
    tf = import_tf()

    def read(path):
        data = tf.py_function(lambda url: gcs_get(url.numpy().decode()), [path], tf.string)
        data.set_shape([])
        return data

    return read


def _read_fn(source: str):
    tf = import_tf()
    return _gcs_read_fn() if _is_gcs(source) else tf.io.read_file


def seed_pipeline(
    data_dir: str,
    class_names: Sequence[str] | None = None,
    batch_size: int = 128,
    image_size: Sequence[int] = (244, 244),
    validation_fraction: float = 0.2,
    shuffle_seed: int | None = None,
):
    """The question's pipeline, verbatim (``shuffle_seed=None`` keeps its unseeded split).

    Args:
        data_dir: local folder, FUSE path or ``gs://bucket/prefix`` holding ``class/*.png``.
        class_names: the class order; default: sorted first-level folder names.
        batch_size: the seed's ``batch(128)``.
        image_size: the seed's ``tf.image.resize(img, [244, 244])``.
        validation_fraction: the seed's ``val_size = int(image_count * 0.2)``.
        shuffle_seed: seed for the one-off file shuffle; ``None`` as in the question.

    Returns:
        ``(train_ds, val_ds)``: batches of float32 ``(N, H, W, 3)`` images and int64 labels.
    """
    positive_int("batch_size", batch_size)
    if len(image_size) != 2:
        raise ValueError(f"image_size must be (height, width). Received: image_size={image_size}")
    tf = import_tf()
    import numpy as np

    data_dir, listed, class_names = _list_dataset(data_dir, class_names)
    class_names = np.array(list(class_names))
    read_file = _read_fn(data_dir)
    size = [int(image_size[0]), int(image_size[1])]

    def get_label(file_path):
        parts = tf.strings.split(file_path, os.path.sep)
        one_hot = parts[-2] == class_names
        return tf.argmax(one_hot)

    def decode_img(img):
        img = tf.io.decode_image(img, channels=3, expand_animations=False)
        img = tf.image.resize(img, size)
        img = tf.cast(img, tf.float32)
        return img

    def process_path(file_path):
        label = get_label(file_path)
        img = read_file(file_path)
        img = decode_img(img)
        return img, label

    def configure_for_performance(ds):
        ds = ds.batch(batch_size)
        ds = ds.prefetch(buffer_size=tf.data.AUTOTUNE)
        return ds

    if _is_gcs(data_dir):  # tf.data.Dataset.list_files cannot reach an emulator
        files = tf.data.Dataset.from_tensor_slices(listed)
    else:
        files = tf.data.Dataset.list_files((data_dir + "/*/*.png"), shuffle=False)
    image_count = int(files.cardinality().numpy())
    files = files.shuffle(image_count, seed=shuffle_seed, reshuffle_each_iteration=False)

    val_size = int(image_count * validation_fraction)

    train_files = files.skip(val_size)
    val_files = files.take(val_size)

    train_ds = train_files.interleave(lambda x: tf.data.Dataset.from_tensor_slices([x]), cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    train_ds = train_ds.map(process_path, num_parallel_calls=tf.data.AUTOTUNE)

    val_ds = val_files.interleave(lambda x: tf.data.Dataset.from_tensor_slices([x]), cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    val_ds = val_ds.map(process_path, num_parallel_calls=tf.data.AUTOTUNE)

    train_ds = configure_for_performance(train_ds)
    val_ds = configure_for_performance(val_ds)
    return train_ds, val_ds


def tuned_pipeline(
    data_dir: str,
    class_names: Sequence[str] | None = None,
    batch_size: int = 128,
    image_size: Sequence[int] = (244, 244),
    read_parallelism: int = 64,
    shuffle: bool = True,
    seed: int | None = None,
):
    """Best known tf.data practice over the same files, all of them (no split).

    Reads run in their own map with ``read_parallelism`` calls in flight on a private thread pool
    big enough to hold them; decode+resize is a separate AUTOTUNE map; order is not preserved.

    Returns:
        A ``tf.data.Dataset`` of (float32 ``(N, H, W, 3)``, int32 ``(N,)``) batches.
    """
    positive_int("read_parallelism", read_parallelism)
    positive_int("batch_size", batch_size)
    tf = import_tf()
    data_dir, paths, class_names = _list_dataset(data_dir, class_names)
    index = {c: i for i, c in enumerate(class_names)}
    labels = [index[p.split("/")[-2]] for p in paths]
    read_file = _read_fn(data_dir)
    size = [int(image_size[0]), int(image_size[1])]

    def read(path, label):
        return read_file(path), label

    def decode(data, label):
        img = tf.io.decode_image(data, channels=3, expand_animations=False)
        img.set_shape([None, None, 3])
        return tf.image.resize(img, size), label

    ds = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
    if shuffle:
        ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    ds = ds.map(read, num_parallel_calls=read_parallelism, deterministic=False)
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = max(read_parallelism, os.cpu_count() or 1)
    opts.deterministic = False
    return ds.with_options(opts)
