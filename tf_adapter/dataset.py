"""`image_dataset_from_directory`: Keras's function, with DALI underneath.

Same signature, defaults, argument errors, file discovery, class order,
labels, splits, messages, element_spec, `class_names` and `file_paths` as
`keras.utils.image_dataset_from_directory` (Keras 3); then keyword-only loader
options. Files come through a `dali_loader.BatchLoader` (index, read-ahead,
gs:// cache); DALI decodes and resizes on the GPU, TF's own kernels on the
CPU (`dali_loader.tfdata` says why), with one Python call per batch.
"""

from __future__ import annotations


from dali_loader.api import build, open_listed
from dali_loader.decode.spec import INTERPOLATIONS, ImageSpec, channels_for
from dali_loader.index import ALLOWLIST_FORMATS, split
from dali_loader.plan import DEFAULT_MAX_PIXELS, Options
from dali_loader.storage.manifest import describe_age


def _check_args(labels, label_mode, class_names, color_mode, image_size,
                interpolation, format, validation_split, subset, shuffle, seed):
    """Keras's argument checks, in Keras's order, with Keras's messages."""
    if labels not in ("inferred", None):
        if not isinstance(labels, (list, tuple)):
            raise ValueError(
                "`labels` argument should be a list/tuple of integer labels, "
                "of the same size as the number of image files in the target "
                "directory. If you wish to infer the labels from the "
                "subdirectory "
                'names in the target directory, pass `labels="inferred"`. '
                "If you wish to get a dataset that only contains images "
                f"(no labels), pass `labels=None`. Received: labels={labels}"
            )
        if class_names:
            raise ValueError(
                "You can only pass `class_names` if "
                f'`labels="inferred"`. Received: labels={labels}, and '
                f"class_names={class_names}"
            )
    if label_mode not in {"int", "categorical", "binary", None}:
        raise ValueError(
            '`label_mode` argument must be one of "int", '
            '"categorical", "binary", '
            f"or None. Received: label_mode={label_mode}"
        )
    channels = channels_for(color_mode)
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    elif not isinstance(image_size, (list, tuple)) or not len(image_size) == 2:
        raise ValueError(
            "Invalid `image_size` value. Expected a tuple of 2 integers. "
            f"Received: image_size={image_size}"
        )
    interpolation = interpolation.lower()
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            "Argument `interpolation` should be one of "
            f"{INTERPOLATIONS}. "
            f"Received: interpolation={interpolation}"
        )
    if format not in ("tf", "grain"):
        raise ValueError(
            '`format` should be either "tf" or "grain". '
            f"Received: format={format}"
        )
    if format == "grain":
        raise ValueError(
            'tf_adapter returns tf.data datasets only; format="grain" is not '
            'supported. Use format="tf". Received: format=grain'
        )
    if validation_split and not 0 < validation_split < 1:
        raise ValueError(
            "`validation_split` must be between 0 and 1, "
            f"received: {validation_split}"
        )
    if (validation_split or subset) and not (validation_split and subset):
        raise ValueError(
            "If `subset` is set, `validation_split` must be set, and inversely."
        )
    if subset not in ("training", "validation", "both", None):
        raise ValueError(
            '`subset` must be either "training", '
            f'"validation" or "both", received: {subset}'
        )
    if validation_split and shuffle and seed is None:
        raise ValueError(
            "If using `validation_split` and shuffling the data, you must "
            "provide a `seed` argument, to make sure that there is no "
            "overlap between the training and validation subset."
        )
    return channels, tuple(image_size), interpolation


def _data_format(data_format):
    if data_format is None:
        import keras

        data_format = keras.config.image_data_format()
    data_format = str(data_format).lower()
    if data_format not in {"channels_first", "channels_last"}:
        raise ValueError(
            "The `data_format` argument must be one of "
            "{'channels_first', 'channels_last'}. "
            f"Received: data_format={data_format}"
        )
    return data_format


def image_dataset_from_directory(
    directory,
    labels="inferred",
    label_mode="int",
    class_names=None,
    color_mode="rgb",
    batch_size=32,
    image_size=(256, 256),
    shuffle=True,
    seed=None,
    validation_split=None,
    subset=None,
    interpolation="bilinear",
    follow_links=False,
    crop_to_aspect_ratio=False,
    pad_to_aspect_ratio=False,
    data_format=None,
    format="tf",
    verbose=True,
    *,
    device=None,
    num_threads=None,
    on_error="raise",
    max_in_flight=64,
    cache_dir=None,
    cache_max_bytes=None,
    decoder=None,
    input_context=None,
    gpu_ready=None,
    entry_decoder=None,
    handoff=None,
    service=None,
    png_decoder=None,
    max_pixels=DEFAULT_MAX_PIXELS,
    manifest="use",
):
    """Generates a `tf.data.Dataset` from image files in a directory.

    Drop-in for `keras.utils.image_dataset_from_directory`: see its
    documentation for the positional arguments, which behave the same.
    `directory` may also be a FUSE mount or a `gs://bucket/prefix` URL.

    Args:
        device: None (GPU when both TF and DALI see one, else CPU), "cpu" or "gpu".
        num_threads: Decode threads: DALI's CPU threads, or TensorFlow's
            parallel decodes on the CPU path (default: cores available).
        on_error: "raise" (an exception naming the file) or "skip" (leave bad
            files out, log each; the dataset's cardinality is then unknown).
        max_in_flight: Reads in flight (remote requests or local file reads).
        cache_dir: Local cache folder for remote URLs (default under
            `~/.cache/dali-loader`).
        cache_max_bytes: Cache size bound, least recently used evicted first.
        decoder: None (DALI on the GPU; TensorFlow's own kernels on the CPU,
            where they are faster and bit-identical to Keras), "dali" or "tf".
        input_context: A `tf.distribute.InputContext` (inside
            `strategy.distribute_datasets_from_function`): this input pipeline
            reads only its own batches of each epoch (batch k goes to pipeline
            k mod num_input_pipelines), DALI on its own GPU. Pass the
            per-replica batch size as `batch_size`. The split is made before
            sharding; every file is read once per epoch across all pipelines.
        gpu_ready: Read through the GPU-ready cache (in `cache_dir`, bounded
            by `cache_max_bytes`): the first read of each image decodes it
            exactly as Keras does and stores its pixels; later epochs decode
            no PNG. None or False: off. True or "compact": compact entries
            (the pixels delta-filtered in zstd chunks, about the PNG's bytes,
            decoded by the native core's TF op or DALI operator). "raw": the
            pixels uncompressed (about 1.7x the PNG bytes; TF's kernels, or
            DALI on its device, only reshape and resize them).
        entry_decoder: Who decodes the compact entries each epoch: None or
            "cpu", the native core on TF's or DALI's CPU threads (measured);
            "gpu", on DALI's GPU with nvCOMP's batched Zstd and a kernel (on a
            GPU that TF and DALI see, once `python -m dali_loader.native.build_gpu`
            built it; built on nvCOMP's and DALI's documented APIs, not yet run
            on a GPU in this project: docs/gpu_ready.md).
        handoff: How DALI's batches reach TF: None (the plugin on the GPU with
            `on_error="raise"` or `gpu_ready`, else the generator), "plugin"
            (the DALI TF plugin on the host: DALI decodes and resizes on its
            device, then copies the batch to the host; every tf.data
            transformation works), "plugin-gpu" (the DALI TF plugin on the GPU:
            no host copy, but only consumed as returned; transformations other
            than prefetch and with_options raise) or "generator" (copied to the
            host, passed through `from_generator`). docs/handoff.md.
        service: A tf.data service dispatcher, "grpc://host:port": its CPU
            workers read and decode each epoch with TF's kernels, every file
            once across them (`distributed_epoch`), and this process reads the
            batches (docs/service.md). Combines with the CPU options only
            (decoder None or "tf"; not DALI, `gpu_ready`, `handoff` or
            `input_context`).
        png_decoder: Who decodes PNGs (`ds.loader.plan` says what runs).
            None: on the CPU default, the native core (Wuffs behind a front end
            that gives TF's outcome) as a TF op in tf.data's graph where `make
            install` built it (else TF's libpng, said once), with TF's decoder
            in the same graph for every file it leaves; on the DALI path the
            core as a DALI operator where built (else DALI's decoder); Wuffs for
            the GPU-ready cache's fills where installed; TF's libpng on the
            tf.data service's workers. "wuffs": the native op on
            the CPU default (an ImportError naming its build step when it is
            missing); on the DALI path Wuffs on the feed's threads, PNGs
            entering DALI as pixels, other files decoded by DALI. "libpng":
            TF's decoder, or DALI's, everywhere. ("gpu", the batched GPU PNG
            decoder, left the package: a ValueError names experimental/png_gpu;
            docs/png_gpu.md.) docs/png_cpu.md.
        max_pixels: Refuse an image whose header claims more pixels than
            this (2**30 by default: 32768x32768), as a bad file naming it,
            before any decoder allocates it; None: no limit.
        manifest: For URLs, the listing manifest in `cache_dir`: "use" (the
            default: start from the manifest when there is one, else list and
            write it; objects added since it was written are not seen),
            "refresh" (list again and rewrite it) or "off" (list, neither read
            nor write it). Objects deleted or rewritten since are caught when
            read (`on_error`). docs/gcs.md.

    Returns:
        A `tf.data.Dataset`, or a list of two for `subset="both"`, each with
        `.class_names` and `.file_paths`.
    """
    channels, image_size, interpolation = _check_args(
        labels, label_mode, class_names, color_mode, image_size, interpolation,
        format, validation_split, subset, shuffle, seed,
    )
    if labels is None or label_mode is None:
        labels = None
        label_mode = None
    options = Options(
        device=device, decoder=decoder, png_decoder=png_decoder, gpu_ready=gpu_ready,
        entry_decoder=entry_decoder, handoff=handoff, service=service, on_error=on_error, num_threads=num_threads,
        max_in_flight=max_in_flight, cache_max_bytes=cache_max_bytes, max_pixels=max_pixels,
        manifest=manifest, input_context=input_context, batch_size=batch_size,
        shuffle=shuffle, seed=seed)
    if pad_to_aspect_ratio and crop_to_aspect_ratio:
        raise ValueError(
            "Only one of `pad_to_aspect_ratio`, `crop_to_aspect_ratio`"
            " can be set to `True`."
        )
    # Every refusal of the loader's options before listing; the seed drawn as Keras does.
    listed = open_listed(str(directory), options, labels=labels, class_names=class_names,
                         follow_links=follow_links, cache_dir=cache_dir, require_files=False)
    index = listed.index
    if verbose:
        _say_found(listed)
    class_names = index.class_names
    if label_mode == "binary" and len(class_names) != 2:
        raise ValueError(
            'When passing `label_mode="binary"`, there must be exactly 2 '
            f"class_names. Received: class_names={class_names}"
        )
    data_format = _data_format(data_format)
    spec = ImageSpec(
        int(image_size[0]), int(image_size[1]), channels, interpolation,
        bool(crop_to_aspect_ratio), bool(pad_to_aspect_ratio),
        data_format == "channels_first",
    )
    num_classes = len(class_names) if class_names else 0

    def make(sub_index, sub_shuffle):
        return build(listed, sub_index, spec, shuffle=sub_shuffle, label_mode=label_mode,
                     num_classes=num_classes, attributes={"class_names": class_names,
                                                          "file_paths": list(sub_index.paths)})

    if subset == "both":  # both lines printed, then Keras's checks
        train, val = [_announce(index, validation_split, s) for s in ("training", "validation")]
        _some(train, "training ", directory), _some(val, "validation ", directory)
        return [make(train, shuffle), make(val, False)]
    return make(_some(_announce(index, validation_split, subset), "", directory), shuffle)


def _say_found(listed) -> None:
    """Keras's "Found N files ..." line, and where a manifest listed them."""
    index = listed.index
    if index.labels is None:
        print(f"Found {len(index)} files.")
    else:
        print(f"Found {len(index)} files belonging to {len(index.class_names)} classes.")
    created = getattr(listed.source.remote, "manifest_used", None)
    if created is not None:
        print(f"(Listed from the manifest written {describe_age(created)}; objects added since are "
              'not seen: pass manifest="refresh" to list again.)')


def _announce(index, validation_split, subset):
    """Splits like Keras, printing Keras's "Using N files for ..." line: its count, which
    is not the split's where none is for validation (Keras's `[:-0]`, `split`)."""
    if validation_split:
        num_val = int(validation_split * len(index))
        print(f"Using {len(index) - num_val if subset == 'training' else num_val} files for "
              f"{subset}.")
    return split(index, validation_split, subset)


def _some(sub, what: str, directory):
    """`sub`, unless it has no file: Keras's error ("No training images found ...")."""
    if not sub.paths:
        raise ValueError(f"No {what}images found in directory {directory}. "
                         f"Allowed formats: {ALLOWLIST_FORMATS}")
    return sub
