"""The DALI TF plugin handoff: DALI's batches become TF's tensors with no Python per batch.

The batches come out of `nvidia.dali.plugin.tf.experimental.DALIDatasetWithInputs`.
Where that dataset is placed is the whole design (docs/handoff.md has the
sources):

- `Handoff.PLUGIN` (the default on a GPU): the DALI dataset is placed on the
  host (`/cpu:0`). DALI still decodes and resizes on its GPU (`device_id`),
  and its graph ends with `.cpu()`, a GPU-to-host copy that DALI documents for
  its default executor (`exec_dynamic`). The plugin checks that every output's
  device matches the dataset's placement (`CheckOutputDevices` in the plugin's
  `dali_dataset_op.cc`), so both are the host. Every tf.data op after it is an
  ordinary CPU op: `map`, `cache`, `shuffle`, `take`, `zip`, `repeat`... all
  compose, the cardinality is asserted in the graph (`assert_cardinality`, a
  CPU op) and survives them, and Keras copies each batch to the GPU as it does
  for its own dataset.
- `Handoff.PLUGIN_GPU`: the DALI dataset is placed on DALI's GPU and its
  batches stay there (no host copy). DALI's documentation: "Most TensorFlow
  Datasets have only CPU variant" and a round trip to the CPU is discouraged;
  TF registers GPU kernels for few dataset ops (`prefetch`, `with_options`).
  So this dataset is for consuming as returned (`fit`, `evaluate`, `predict`,
  `iter`); the other transformations raise a `ValueError` that says so. Its
  cardinality is declared at the Python level (`cardinality()`), since
  `assert_cardinality` has no GPU kernel.

Common to both:
- Input: one `tf.data` generator per iterator over a new `FeedEpoch` (order,
  shard, read-ahead, byte checks, exactly as the other handoff), on the host
  (the plugin takes CPU inputs; for `PLUGIN_GPU` it is copied to the GPU with
  `copy_to_device`, the plugin's own rule). A chunk is one dense uint8 batch:
  each row is an 8-byte header (the file's length and its label, int32) and
  the file's bytes, padded to the chunk's longest file.
- DALI: the header is split off (`fn.reinterpret`), the file sliced to its
  length, then `image_graph` (decode, colour, crop/pad, resize). Labels leave
  DALI too (one-hot or binary made there).
- Finite epochs: the input ends, so the DALI dataset ends; the partial last
  batch is kept. Every iterator builds a new DALI pipeline (the plugin's rule).

Bad files: the feed's byte checks leave most out before DALI sees them. A file
that passes them and still fails DALI's decode ends the iterator: the plugin
cannot recover a pipeline mid-epoch (measured on the CPU: the error names only
"sample #k", and `ignore_errors()` after the plugin loops forever on "All
pending outputs were already popped"). Iterated in Python, the returned
dataset turns the error into one that names the file (the positions of the
last chunks handed to DALI are kept; the suspects are read again and decoded
one by one). With `on_error="skip"` the file is recorded in
`ds.loader.skipped` and left out of every later epoch; the epoch it
broke still ends with the error. Inside `model.fit` (a `tf.function`), or
after a transformation, DALI's own error is raised. With the GPU-ready cache's
raw entries nothing is decoded, so nothing can fail there.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time

import numpy as np

from dali_loader import tf_internals
from dali_loader.decode.dali_batches import DaliBatches
from dali_loader.decode.dali_graph import (
    Input,
    default_num_threads,
    image_graph,
    make_pipeline,
    probe_decode,
)
from dali_loader.decode.spec import ImageSpec
from dali_loader.errors import BadFileError, CorruptImageError
from dali_loader.feed.epochs import Chunk
from dali_loader.lazy import import_dali, import_dali_tf
from dali_loader.plan import HANDOFFS, Handoff  # noqa: F401 - the handoffs are the plan's
from dali_loader.tf_internals import Internal
from dali_loader.tfdata.weak import weakly

logger = logging.getLogger(__name__)

INPUT = "rows"  # the external_source the input dataset feeds
HEADER = 8  # bytes before each file in a row: int32 length, int32 label
_TRACKED_CHUNKS = 4  # chunks per iteration kept (positions only) to name a culprit
_TRACKED_ITERATIONS = 16
_PREFETCH = 2  # DALI's prefetch queue depth

# Dataset transformations a GPU-placed DALI dataset may be followed by: TF
# registers GPU kernels for their ops (PrefetchDataset, OptionsDataset;
# tests/test_handoff.py checks this against TF's kernel registry).
GPU_TRANSFORMATIONS = frozenset({"prefetch", "with_options"})


def placement(handoff: Handoff, gpu: bool, device_id: int) -> str:
    """The TF device the DALI dataset is placed on: the GPU only for `PLUGIN_GPU`."""
    return f"/gpu:{device_id}" if gpu and handoff is Handoff.PLUGIN_GPU else "/cpu:0"


def pack_rows(items: list[bytes], labels: np.ndarray | None) -> np.ndarray:
    """One dense uint8 batch: per file, its length and label (int32, little-endian),
    then its bytes, zero-padded to the longest file of the batch."""
    n = len(items)
    sizes = np.fromiter(map(len, items), np.int64, n)
    rows = np.zeros((n, HEADER + int(sizes.max())), np.uint8)
    head = np.zeros((n, 2), "<i4")
    head[:, 0] = sizes
    if labels is not None:
        head[:, 1] = labels
    rows[:, :HEADER] = head.view(np.uint8)
    for k, data in enumerate(items):
        rows[k, HEADER:HEADER + len(data)] = np.frombuffer(data, np.uint8)
    return rows


def plugin_graph(dali, rows, spec: ImageSpec, gpu: bool, label_mode: str | None,
                 num_classes: int, input: Input = Input.FILES, on_gpu: bool = False,
                 png_native: bool = False, max_pixels: int | None = None):
    """Rows in (`pack_rows`), images or `(images, labels)` out. DALI computes on
    the GPU with `gpu`; the outputs are on the GPU with `on_gpu`, else on the
    host (a GPU graph then ends with `.cpu()`). `input`: what the rows hold.
    `png_native`, `max_pixels`: PNGs by the native operator (`image_graph`)."""
    fn, t = dali.fn, dali.types
    head = fn.reinterpret(fn.slice(rows, start=[0], shape=[HEADER], axes=[0]), dtype=t.INT32)
    encoded = fn.slice(rows, start=[HEADER], shape=head[0:1], axes=[0])
    images = image_graph(dali, encoded, spec=spec, gpu=gpu, input=input,
                         png_native=png_native, max_pixels=max_pixels)
    if png_native:
        images = images[0]  # the operator's `ok` flags are not counted on this handoff
    if gpu and not on_gpu:
        images = images.cpu()  # GPU-to-host copy: DALI's default executor (exec_dynamic)
    if label_mode is None:
        return images
    label = head[1]
    if label_mode == "categorical":
        label = fn.one_hot(label, num_classes=num_classes, dtype=t.FLOAT)
    elif label_mode == "binary":
        label = fn.reshape(fn.cast(label, dtype=t.FLOAT), shape=[1])
    return images, (label.gpu() if on_gpu else label)


def build_plugin_pipeline(spec: ImageSpec, batch_size: int, *, gpu: bool, device_id: int | None,
                          num_threads: int | None, label_mode: str | None, num_classes: int,
                          input: Input = Input.FILES, on_gpu: bool = False,
                          png_native: bool = False, max_pixels: int | None = None):
    """The (unbuilt) DALI pipeline the plugin serializes: `plugin_graph` on an input."""
    dali = import_dali()

    def graph():
        rows = dali.fn.external_source(name=INPUT, dtype=dali.types.UINT8, ndim=1, batch=True)
        return plugin_graph(dali, rows, spec, gpu, label_mode, num_classes, input, on_gpu,
                            png_native, max_pixels)

    return make_pipeline(graph, spec, batch_size, gpu=gpu, device_id=device_id,
                         num_threads=num_threads, prefetch_queue_depth=_PREFETCH, input=input,
                         conditionals=png_native)


class _PluginEpochs:
    """What the input generator calls, once per iterator, and what names a culprit."""

    def __init__(self, batches: DaliBatches, which: tuple[int | None, int], labelled: bool):
        self.batches = batches
        self.which = which
        self.labelled = labelled
        self.undecodable: dict[int, str] = {}  # position -> reason (skip: left out)
        self.iterations = 0  # input generators started: one DALI pipeline built each
        self.epoch_setup_seconds: collections.deque[float] = collections.deque(maxlen=1000)
        self._recent: collections.deque[collections.deque[list[int]]] = collections.deque(
            maxlen=_TRACKED_ITERATIONS)
        self._lock = threading.Lock()

    def epoch(self):
        t0 = time.perf_counter()
        feed = self.batches.feed
        epoch = feed.epoch(*self.which)
        handed: collections.deque[list[int]] = collections.deque(maxlen=_TRACKED_CHUNKS)
        with self._lock:
            self.iterations += 1
            self._recent.append(handed)
        self.epoch_setup_seconds.append(time.perf_counter() - t0)
        try:
            while True:
                chunk = epoch.next_chunk(self.batches.batch_size)
                if chunk is None:
                    return
                chunk = self._leave_out_undecodable(epoch, chunk)
                if not chunk.items:
                    continue
                handed.append(list(chunk.positions))
                labels = epoch.labels(chunk.positions) if self.labelled else None
                yield pack_rows(chunk.items, labels)
        finally:
            epoch.close()

    def _leave_out_undecodable(self, epoch, chunk: Chunk) -> Chunk:
        if not self.undecodable:
            return chunk
        keep = [i for i, p in enumerate(chunk.positions) if p not in self.undecodable]
        for i in range(len(chunk.positions)):
            if i not in keep:
                pos = chunk.positions[i]
                epoch.errors(CorruptImageError(epoch.path(pos), self.undecodable[pos]))
        return Chunk([chunk.items[i] for i in keep], [chunk.positions[i] for i in keep])

    def name_culprit(self, err: Exception) -> CorruptImageError | None:
        """After DALI failed: the file it failed on, found by decoding the recent
        suspects one by one (the sample index DALI reports first); None if none fails."""
        found = re.search(r"sample #(\d+)", str(err))
        k = int(found.group(1)) if found else None
        with self._lock:
            chunks = [c for handed in reversed(self._recent) for c in reversed(handed)]
        first = [c[k] for c in chunks if k is not None and k < len(c)]
        rest = [p for c in chunks for p in c if p not in first]
        # Files already left out were not in the batch that failed (an earlier
        # iteration's chunks are among the suspects): naming one again would blame it
        # for another file's failure, which would then never be left out.
        left_out = set(self.undecodable)
        feed = self.batches.feed
        paths = feed.index.paths
        for pos in dict.fromkeys(first + rest):
            if pos in left_out:
                continue
            try:
                data = feed.items(paths[pos])
            except BadFileError as e:
                return e if isinstance(e, CorruptImageError) else None
            problem = probe_decode(data, self.batches.spec, self.batches.input,
                                   self.batches.png_native, self.batches.max_pixels)
            if problem:
                culprit = CorruptImageError(paths[pos], f"DALI's decoder failed on it ({problem})")
                if feed.on_error == "skip":
                    self.undecodable[pos] = culprit.reason
                    if feed.report.add(culprit):
                        logger.warning("Skipping %s from the next epoch on: %s [%s]",
                                       culprit.path, culprit.reason, culprit.kind)
                return culprit
        return None


def _refusal(name: str) -> str:
    return (f"`{name}()` cannot follow a dataset made with handoff=\"plugin-gpu\": its batches "
            "stay on the GPU, and TensorFlow has no GPU kernel for that dataset op (DALI's "
            "documentation: most TensorFlow datasets have only a CPU variant). Use the default "
            "handoff (None or \"plugin\": DALI still decodes and resizes on the GPU, and every "
            "tf.data transformation works), or consume this dataset as returned (fit, "
            f"evaluate, predict, iter). Received: handoff='plugin-gpu', then .{name}()")


# Public `tf.data.Dataset` methods that add a dataset op after this one.
_TRANSFORMATIONS = (
    "apply", "batch", "bucket_by_sequence_length", "cache", "concatenate", "enumerate", "filter",
    "flat_map", "group_by_window", "ignore_errors", "interleave", "map", "padded_batch",
    "ragged_batch", "rebatch", "rejection_resample", "repeat", "scan", "shard", "shuffle",
    "skip", "snapshot", "sparse_batch", "take", "take_while", "unbatch", "unique", "window",
)


class _ErrorNamer:
    """What the plugin dataset's eager iterators call on DALI's InternalError: the error
    again, naming the file (`_PluginEpochs.name_culprit`), or None. Holds the epochs,
    the input generator's (weak) target, as long as the dataset or an iterator lives."""

    def __init__(self, tf, epochs: _PluginEpochs):
        self.tf = tf
        self.epochs = epochs

    def __call__(self, err):
        culprit = self.epochs.name_culprit(err)
        if culprit is None:
            return None
        later = (" It is left out of the next epochs (on_error=\"skip\"); this epoch "
                 "ended: DALI's pipeline cannot go on after a decode failure."
                 if self.epochs.batches.feed.on_error == "skip" else "")
        return self.tf.errors.InternalError(None, None, f"{culprit}{later}\n{err.message}")


def plugin_dataset(tf, batches: DaliBatches, spec: ImageSpec, batch_size: int,
                   label_mode: str | None, num_classes: int, which: tuple[int | None, int],
                   cardinality: int | None, handoff: Handoff = Handoff.PLUGIN):
    """The DALI TF plugin's dataset over `batches`' feed: `(images, labels)` or
    images, `cardinality` batches (None: unknown), placed by `placement`."""
    dali_tf = import_dali_tf()
    gpu = batches.device == "gpu"
    device = placement(handoff, gpu, batches.device_id)
    on_gpu = device != "/cpu:0"
    epochs = _PluginEpochs(batches, which, label_mode is not None)
    with tf.device("/cpu:0"):  # the plugin takes its inputs from the host
        rows = tf.data.Dataset.from_generator(weakly(epochs, "epoch", lambda: iter(())),
                                              output_signature=tf.TensorSpec((None, None),
                                                                             tf.uint8))
    if on_gpu:  # the plugin's rule: the input on the dataset's device
        rows = rows.apply(tf.data.experimental.copy_to_device(device))
    pipe = build_plugin_pipeline(spec, batch_size, gpu=gpu, device_id=batches.device_id,
                                 num_threads=batches.num_threads, label_mode=label_mode,
                                 num_classes=num_classes, input=batches.input, on_gpu=on_gpu,
                                 png_native=batches.png_native, max_pixels=batches.max_pixels)
    img_dtype = tf.uint8 if spec.output_uint8 else tf.float32
    shapes = [(None, *spec.shape)]
    dtypes = [img_dtype]
    if label_mode is not None:
        shapes.append({"int": (None,), "categorical": (None, num_classes),
                       "binary": (None, 1)}[label_mode])
        dtypes.append(tf.int32 if label_mode == "int" else tf.float32)
    with tf.device(device):
        ds = dali_tf.experimental.DALIDatasetWithInputs(
            pipeline=pipe,
            input_datasets={INPUT: dali_tf.experimental.Input(rows, batch=True)},
            batch_size=batch_size,
            output_shapes=(tuple(shapes) if label_mode is not None
                           else tf.TensorShape(shapes[0])),
            output_dtypes=tuple(dtypes) if label_mode is not None else dtypes[0],
            num_threads=batches.num_threads or default_num_threads(),
            device_id=batches.device_id if gpu else None,
            exec_dynamic=True,
            prefetch_queue_depth=_PREFETCH,
        )
    namer = _ErrorNamer(tf, epochs)
    if on_gpu:
        why = tf_internals.why_off(tf, Internal.GPU_RESIDENT_DATASET)
        if why:
            raise RuntimeError(f"handoff='plugin-gpu' needs a TF internal that is off here "
                               f"({why}); use handoff='plugin' (DALI still decodes and "
                               "resizes on the GPU), or a TF from 2.16 to 2.21.")
        _, gpu_resident = tf_internals.plugin_dataset_classes(tf, _TRANSFORMATIONS, _refusal)
        return gpu_resident(ds, namer, cardinality, label_mode is None)
    if label_mode is None:
        ds = ds.map(lambda x: x)  # the plugin yields a 1-tuple
    if cardinality is not None:
        ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
    else:  # the plugin says infinite; a filter makes it unknown, as it is
        ds = ds.filter(lambda *_: True)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    if not tf_internals.on(tf, Internal.NAMED_DECODE_ERRORS):
        ds._dali_plugin_namer = namer  # DALI's own errors; the input's target held
        return ds
    naming, _ = tf_internals.plugin_dataset_classes(tf, _TRANSFORMATIONS, _refusal)
    return naming(ds, namer)
