"""Which path runs: `resolve(options, environment) -> Plan`, in one place.

A newcomer's question "which path runs for these options, and why?" is
answered here and nowhere else. `Options` holds what the caller passed (the
loader's keyword options, unvalidated); `Environment` holds what the machine
and the source are (probed once, in `probes`, or injected by a test);
`resolve` runs `RULES`, one ordered list, each rule a default, a check or a
choice, and returns a frozen `Plan`: the engine, the device, the item reader,
DALI's input, the PNG decoder per epoch and per cache fill, the cache form,
the handoff and the checks. Every refusal is a `ValueError` (an `ImportError`
for a decoder that is not built) ending in `Received: name=value`.

`make_loader`, `to_tf_dataset`, `api`, `bench`, `diagnose` and `cache` read
the plan; none of them decides again. `dali-loader diagnose` prints it.

The rules that read the source (its kind, whether it holds JPEGs) come last
and refuse nothing: `check(options, environment)` runs the others, so every
refusal comes before a folder or bucket is listed (as Keras checks its
arguments first), and `resolve` runs them all once the source is listed.

This module imports neither TensorFlow nor DALI (nor any module that does).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from dali_loader.args import positive_int
# The default pixel limit (2**30: why, in formats.limits) and the cache's pixel forms
# are formats; the plan names them.
from dali_loader.formats.limits import DEFAULT_MAX_PIXELS
from dali_loader.formats.ready import ReadyForm
from dali_loader.storage.manifest import check_manifest_mode
from dali_loader.storage.source import SourceKind


# -- the vocabulary: what a plan names ------------------------------------------------


class Engine(str, enum.Enum):
    """What decodes and resizes each epoch."""

    TF_KERNELS = "tf-kernels"  # TF's own ops in tf.data's graph (the CPU default)
    DALI = "dali"  # a DALI pipeline (the GPU default, or decoder="dali")
    SERVICE = "service"  # TF's ops on the tf.data service's CPU workers


class Device(str, enum.Enum):
    """Where DALI decodes and resizes (TF's kernels always run on the CPU)."""

    CPU = "cpu"
    GPU = "gpu"


class Output(str, enum.Enum):
    """What the caller gets: a tf.data.Dataset, or numpy batches (`api.open_loader`)."""

    TF_DATA = "tf.data"
    NUMPY = "numpy"


class ItemReader(str, enum.Enum):
    """What the feed hands the decoder for each file (`feed.items`, `feed.ready`)."""

    PATHS = "paths"  # the local path: TF reads the file (a local disk)
    RAW_BYTES = "raw-bytes"  # the bytes, header size checked (FUSE/NFS)
    PINNED_OR_BYTES = "pinned-or-bytes"  # a pinned cache entry, else bytes (URLs)
    CHECKED_BYTES = "checked-bytes"  # bytes that passed the byte checks (DALI's decoder)
    RAW_OR_CHECKED = "raw-or-checked"  # PNGs as raw pixel entries (Wuffs), others checked
    READY_BYTES = "ready-bytes"  # GPU-ready cache entries as bytes (DALI)
    READY_PINNED = "ready-pinned"  # GPU-ready cache entries, open, read by the batch (TF's kernels)
    WORKERS = "workers"  # the tf.data service's workers read the files themselves


class DaliInput(enum.Enum):
    """What the DALI graph's encoded input holds (`decode.dali_graph.Input`)."""

    FILES = "files"  # the dataset's files as they are (PNG, JPEG, ...)
    READY_RAW = "ready-raw"  # GPU-ready cache entries: the pixels Keras decodes, uncompressed
    # GPU-ready cache entries: the pixels Keras decodes in compact entries (formats.compact),
    # decoded by the native core's DALI operator.
    READY_COMPACT = "ready-compact"
    # The same entries copied to the GPU and decoded there (nvCOMP's batched Zstd, a
    # kernel: `entry_decoder="gpu"`, `native/dali_entry_gpu_op.cu`).
    READY_COMPACT_GPU = "ready-compact-gpu"
    # The files, each PNG already decoded into a raw entry (`png_stage`, Keras's
    # pixels): raw entries are reshaped, the other files decoded on the CPU (a
    # per-sample branch), then copied to the GPU.
    FILES_OR_RAW = "files-or-raw"


class PngDecoder(str, enum.Enum):
    """Who decodes PNG files."""

    # Wuffs, TF's pixels: the native core as a TF op on the TF path (`tf_png`), as a
    # DALI operator (`dali_png`), or on the feed's threads (the core through ctypes,
    # else pywuffs) on the DALI path and for GPU-ready fills
    WUFFS = "wuffs"
    LIBPNG = "libpng"  # TF's decode_png on the TF path, nvImageCodec inside DALI


class PngWhere(str, enum.Enum):
    """Where the PNG decoder of each epoch (or of the GPU-ready cache's fills) runs."""

    TF_OP = "tf-op"  # the native core as a TF op in tf.data's graph
    DALI_OP = "dali-op"  # the native core as a DALI operator in DALI's graph
    TF = "tf"  # TF's decode_png in tf.data's graph
    FEED = "feed"  # Wuffs on the feed's threads (the core through ctypes, else pywuffs)
    DALI = "dali"  # DALI's decoder (nvImageCodec)
    NONE = "none"  # GPU-ready cache entries: no PNG decoded in a cached epoch


class Handoff(str, enum.Enum):
    """How DALI's batches reach TF."""

    GENERATOR = "generator"  # to the host, one `from_generator` call per batch
    PLUGIN = "plugin"  # the DALI TF plugin, placed on the host: composes with every tf.data op
    PLUGIN_GPU = "plugin-gpu"  # the DALI TF plugin, placed on the GPU: consumed as returned

    @property
    def plugin(self) -> bool:
        return self is not Handoff.GENERATOR


class EntryDecoder(str, enum.Enum):
    """Who decodes the GPU-ready cache's compact entries each epoch."""

    # The native core on TF's CPU threads (the TF op) or DALI's (its CPU operator).
    CPU = "cpu"
    # nvCOMP's batched Zstd and an unfilter kernel on DALI's GPU (built on nvCOMP's and
    # DALI's documented APIs; not run in this project: the plan takes it when asked).
    GPU = "gpu"


class Graph(str, enum.Enum):
    """How the TF path's graph decodes and batches files (`tfdata.tf_path`)."""

    # TF's one `map_and_batch` op, as Keras's own pipeline runs after grappler: less CPU
    # per image; a failing file drops its batch, which the audit decodes again; pads
    # keep the end marker alone in its batch (each costs about a decode of zeros).
    FUSED = "fused"
    # The decode as a map, `ignore_errors()` per file, then the batch: no pads.
    PER_FILE = "per-file"


class PngBinding(str, enum.Enum):
    """How Wuffs is reached on the feed's threads (the DALI path, the cache's fills)."""

    NATIVE_CORE = "native-core"  # the native core (libdlpng) through ctypes, GIL released
    PYWUFFS = "pywuffs"  # Wuffs' Python bindings (`decode.png_cpu`)


class BigPngs(str, enum.Enum):
    """Where DALI's epochs decode the PNGs over `formats.limits.BIG_PNG_PIXELS`."""

    TF_BEFORE_DALI = "tf-before-dali"  # on the CPU: TF as the batch enters DALI (`HostPixels`)
    DALI = "dali"  # with the rest (on a GPU: a branch would hold the `mixed` decoder)


class Check(str, enum.Enum):
    """What guards the decoders against a bad file (docs/architecture.md)."""

    PIXEL_LIMIT = "pixel-limit"  # the header's pixels against max_pixels, before a decode
    BYTES = "bytes"  # content sniff, PNG chunk/CRC walk, nvImageCodec's header parse
    FEED_DECODE = "feed-decode"  # decoded on the feed's threads: a failure is on_error at once
    AUDIT = "audit"  # every file TF's decoder drops is named, each iteration
    CARDINALITY = "cardinality"  # every file comes (on_error="raise"): the size is asserted


DEVICES = (None, "auto", "cpu", "gpu")
DECODERS = (None, "dali", "tf")
ON_ERROR = ("raise", "skip")
PNG_DECODERS = (None, *(d.value for d in PngDecoder))
GPU_READY_VALUES = (None, False, True, "compact", "raw")
HANDOFFS = (None, *(h.value for h in Handoff))
# The TF path's decode calls in flight per core by default (`_decode_calls`).
CALLS_PER_CORE = 2
# The fused graph where its pads are at most this share of an epoch's files (`_graph`).
FUSED_MAX_PAD_SHARE = 0.25
_ADDRESS = re.compile(r"^grpc://(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")



# -- what resolve reads ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """The loader's keyword options as the caller passed them (`resolve` checks them).

    `batch_size`, `shuffle` and `seed` are Keras's arguments, read by the rules
    that combine them with a loader option; `output` is the entry point's. In a
    dataset's plan they are what runs: the seed drawn when none was passed, and
    `shuffle=False` for a validation subset (`build.plan_for`)."""

    device: str | None = None
    decoder: str | None = None
    png_decoder: str | PngDecoder | None = None
    gpu_ready: bool | str | ReadyForm | None = None
    entry_decoder: str | EntryDecoder | None = None
    handoff: str | Handoff | None = None
    service: str | None = None
    on_error: str = "raise"
    num_threads: int | None = None
    max_in_flight: int = 64
    cache_max_bytes: int | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    manifest: str = "use"
    input_context: Any = None
    batch_size: int | None = 32
    shuffle: bool = True
    seed: int | None = None
    output: Output = Output.TF_DATA


class Environment:
    """The facts about this machine and the source that the rules read.

    Each fact is a value, or a function of no arguments called on first read
    (`probes.environment` passes the real probes, so a fact no rule reads is
    never probed: the CPU default never imports DALI). A test injects values:
    `Environment(tf_gpus=0, dali_gpus=0, ...)`; reading a fact it did not give
    raises, so a test also shows which facts a combination reads.

    Facts:
        tf_gpus: GPUs TensorFlow sees.
        dali_gpus: CUDA devices DALI sees.
        tf_png_op: the native PNG core's TF op is built and loads.
        dali_png_op: the native PNG core's DALI operator is built and loads.
        dali_entry_gpu_op: the compact entries' GPU decode (a DALI GPU operator) is
            built and loads.
        wuffs: Wuffs decodes on the feed's threads (the native core, or pywuffs).
        png_core: the native PNG core itself (libdlpng) is built and loads.
        dali_tf_plugin: DALI's TF plugin (`nvidia.dali.plugin.tf`) imports.
        cores: CPU cores available to this process.
        source_kind: a `SourceKind` (after listing).
        files: the files the index lists (after listing; before sharding).
        has_jpegs: the index names a .jpg/.jpeg file (after listing).
        has_pngs: the index names a .png file (after listing).
    """

    FACTS = ("tf_gpus", "dali_gpus", "tf_png_op", "dali_png_op", "dali_entry_gpu_op", "wuffs",
             "png_core", "dali_tf_plugin", "cores", "source_kind", "files", "has_jpegs",
             "has_pngs")
    SOURCE_FACTS = ("source_kind", "files", "has_jpegs", "has_pngs")

    tf_gpus: int
    dali_gpus: int
    tf_png_op: bool
    dali_png_op: bool
    dali_entry_gpu_op: bool
    wuffs: bool
    png_core: bool
    dali_tf_plugin: bool
    cores: int
    source_kind: SourceKind
    files: int
    has_jpegs: bool
    has_pngs: bool

    def __init__(self, **facts: Any):
        unknown = set(facts) - set(self.FACTS)
        if unknown:
            raise TypeError(f"Unknown environment facts {sorted(unknown)}; the facts are "
                            f"{self.FACTS}. Received: {sorted(facts)}")
        self._given = dict(facts)
        self._known: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.FACTS:
            raise AttributeError(name)
        if name not in self._known:
            if name not in self._given:
                raise LookupError(f"The environment has no fact {name!r} (it was not probed "
                                  "or given).")
            value = self._given[name]
            self._known[name] = value() if callable(value) else value
        return self._known[name]

    def with_source(self, kind: SourceKind, paths: Sequence[str]) -> Environment:
        """This environment (its facts read so far kept) plus the source's facts: its
        kind, and the formats its index's `paths` name (each read when a rule asks)."""
        env = Environment(**{**self._given, "source_kind": kind, "files": len(paths),
                             "has_jpegs": lambda: has_jpegs(paths),
                             "has_pngs": lambda: has_pngs(paths)})
        env._known.update({k: v for k, v in self._known.items() if k not in self.SOURCE_FACTS})
        return env

    def read(self) -> dict[str, Any]:
        """The facts read so far, in `FACTS` order (what `diagnose` prints)."""
        return {k: self._known[k] for k in self.FACTS if k in self._known}

    def __repr__(self) -> str:
        return f"Environment({', '.join(f'{k}={v!r}' for k, v in self.read().items())})"


def has_jpegs(paths) -> bool:
    """Whether any path is named as a JPEG (what nvJPEG would decode on a GPU)."""
    return any(p.lower().endswith((".jpg", ".jpeg")) for p in paths)


def has_pngs(paths) -> bool:
    """Whether any path is named as a PNG: what a native PNG decoder in the graph is
    for. A folder with none gets a graph without it (issue 29; `_png_epoch`): every
    file would pass the op and its branch only to reach the other decoder. A PNG
    named otherwise is still decoded, by TF's or DALI's decoder, to the same pixels."""
    return any(p.lower().endswith(".png") for p in paths)


# -- what resolve returns -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which path runs for given options on this machine and source (`resolve`).

    Attributes:
        options: The options resolved.
        engine: What decodes and resizes each epoch.
        device: Where (DALI's device; TF's kernels run on the CPU).
        device_id: The GPU of this input pipeline (0 on the CPU).
        shard: `(pipeline, pipelines)` of `input_context`, else (0, 1).
        output: A tf.data.Dataset or numpy batches.
        item_reader: What the feed hands the decoder per file.
        dali_input: What DALI's graph reads (None off the DALI engine).
        png_epoch: Who decodes each epoch's PNGs (None: the GPU-ready cache's
            entries, nothing decoded).
        png_where: Where `png_epoch` runs.
        png_fill: With the GPU-ready cache, who decodes the PNGs a fill reads.
        fill_where: Where `png_fill` runs (None without the cache): the native
            core's TF op in the graph (it also writes the compact entries), or the
            feed's threads.
        entry_decode: Who decodes the cache's compact entries each epoch (None
            without compact entries): the native core on the CPU, or nvCOMP on
            DALI's GPU (`entry_decoder="gpu"`).
        png_binding: How Wuffs is reached where the feed's threads decode (None
            where they do not).
        big_pngs: Where DALI's epochs decode PNGs over `BIG_PNG_PIXELS` (None off
            DALI's files).
        cache_form: The GPU-ready cache's form, or None (no cache).
        handoff: How DALI's batches reach TF (None off DALI, or for numpy).
        graph: How the TF path's graph decodes and batches files (None off it).
        decode_calls: Decodes in flight: TF's parallel calls on the TF path,
            DALI's CPU threads, the feed's Wuffs decodes and the cache's fills;
            on the service's workers, where None is AUTOTUNE.
        checks: What guards the decoders against a bad file.
        service_address: `(host, port)` of the tf.data service's dispatcher.
        notes: What to say once (a slower fallback, an unverified path).
        why: Each field the rules set -> the rule that set it, in words.
        facts: The environment's facts the rules read, and their values.
    """

    options: Options
    engine: Engine
    device: Device
    device_id: int
    shard: tuple[int, int]
    output: Output
    item_reader: ItemReader | None
    dali_input: DaliInput | None
    png_epoch: PngDecoder | None
    png_where: PngWhere | None
    png_fill: PngDecoder | None
    cache_form: ReadyForm | None
    handoff: Handoff | None
    checks: tuple[Check, ...]
    graph: Graph | None = None
    fill_where: PngWhere | None = None
    entry_decode: EntryDecoder | None = None
    decode_calls: int | None = None
    png_binding: PngBinding | None = None
    big_pngs: BigPngs | None = None
    service_address: tuple[str, int] | None = None
    notes: tuple[str, ...] = ()
    why: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def feed_pixels(self) -> bool:
        """Whether the feed's threads decode with Wuffs (`png_stage.KerasPixels`):
        each epoch's PNGs on the DALI path, or the GPU-ready cache's fills."""
        return self.png_where is PngWhere.FEED or self.png_fill is PngDecoder.WUFFS

    @property
    def png_decoder(self) -> PngDecoder | None:
        """The PNG decoder that runs: each epoch's, or with the cache its fills'."""
        return self.png_epoch if self.cache_form is None else self.png_fill

    def describe_png(self) -> str:
        """One line: e.g. "wuffs (native core, TF op in the graph)"."""
        where = {PngWhere.TF_OP: "native core, TF op in the graph",
                 PngWhere.DALI_OP: "native core, DALI operator in the graph",
                 PngWhere.TF: "TF's decode_png", PngWhere.FEED: "on the feed's threads",
                 PngWhere.DALI: "DALI's decoder"}
        # A resolved plan sets png_where, png_fill with the cache (NONE), else png_epoch.
        if self.png_where is PngWhere.NONE:
            return (f"{self.png_fill.value} (GPU-ready cache fills, "  # type: ignore[union-attr]
                    f"{where[self.fill_where]}; epochs decode no PNG)")  # type: ignore[index]
        return f"{self.png_epoch.value} ({where[self.png_where]})"  # type: ignore[union-attr,index]

    def rows(self) -> list[tuple[str, str, str]]:
        """`(field, value, why)` for each decision, in the order the rules take them."""
        out = []
        for name in ("engine", "device", "device_id", "shard", "service_address",
                     "cache_form", "png_fill", "fill_where", "entry_decode", "handoff",
                     "item_reader", "dali_input",
                     "png_epoch", "png_where", "png_binding", "big_pngs", "graph",
                     "decode_calls", "checks"):
            out.append((name, _show(getattr(self, name)), self.why.get(name, "")))
        return out

    def format(self) -> str:
        """The plan as a few aligned lines (what `dali-loader diagnose` prints)."""
        rows = self.rows()
        w = max(len(n) for n, _, _ in rows)
        v = max(len(x) for _, x, _ in rows)
        lines = [f"  {n:<{w}}  {x:<{v}}  {why}".rstrip() for n, x, why in rows]
        lines.append("  facts: " + ", ".join(f"{k}={_show(v)}" for k, v in self.facts.items()))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _show(v: Any) -> str:
    """A plan's value as printed: an enum's value, "-" for None."""
    if isinstance(v, enum.Enum):
        return str(v.value)
    if isinstance(v, tuple) and v and isinstance(v[0], enum.Enum):
        return ", ".join(str(x.value) for x in v)
    return "-" if v is None else str(v)


# -- the rules ------------------------------------------------------------------------


class _Draft:
    """What the rules read and write while `resolve` runs: the options (`o`),
    the environment (`env`) and the plan's fields set so far."""

    def __init__(self, options: Options, env: Environment):
        self.o = options
        self.env = env
        self.fields: dict[str, Any] = {}
        self.why: dict[str, str] = {}
        self.notes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["fields"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclasses.dataclass(frozen=True)
class Rule:
    """One step of `resolve`: sets the plan's field `sets` to what `decide`
    returns (a check sets nothing: `sets` is None), or refuses.

    Attributes:
        sets: The field it decides (or fields: `decide` returns a tuple), or None
            for a check.
        says: The rule in words (the `why` of its field).
        decide: `(draft) -> value`; raises to refuse.
        source: Reads the source's facts (runs after listing; refuses nothing).
    """

    sets: str | tuple[str, ...] | None
    says: str
    decide: Callable[[_Draft], Any]
    source: bool = False


class Because(NamedTuple):
    """A rule's value and why it was chosen (the plan's `why` for its field;
    without one, the rule's `says`)."""

    value: Any
    why: str


def check_on_error(on_error: str) -> str:
    """Validates an `on_error` value."""
    if on_error not in ON_ERROR:
        raise ValueError(f'`on_error` must be "raise" or "skip". Received: on_error={on_error}')
    return on_error


def _num_threads(d: _Draft) -> None:
    positive_int("num_threads", d.o.num_threads, allow_none=True)


def _max_in_flight(d: _Draft) -> None:
    positive_int("max_in_flight", d.o.max_in_flight)


def _cache_max_bytes(d: _Draft) -> None:
    value = d.o.cache_max_bytes
    if value is not None and value <= 0:
        raise ValueError(
            f"`cache_max_bytes` must be positive or None. Received: cache_max_bytes={value}")


def check_max_pixels(max_pixels: int | None) -> int | None:
    """Validates a `max_pixels` value: a positive int, or None (no limit)."""
    if max_pixels is not None and (isinstance(max_pixels, bool) or not isinstance(
            max_pixels, int) or max_pixels <= 0):
        raise ValueError("`max_pixels` must be a positive integer or None. "
                         f"Received: max_pixels={max_pixels!r}")
    return max_pixels


def _device_value(d: _Draft) -> None:
    if d.o.device not in DEVICES:
        raise ValueError(
            f'`device` must be None (auto), "cpu" or "gpu". Received: device={d.o.device}')


def _decoder_value(d: _Draft) -> None:
    if d.o.decoder not in DECODERS:
        raise ValueError(
            f'`decoder` must be None, "dali" or "tf". Received: decoder={d.o.decoder}')


def _png_decoder_value(d: _Draft) -> PngDecoder | None:
    value = d.o.png_decoder
    if value == "gpu":
        raise ValueError('png_decoder="gpu" (the batched GPU PNG decoder) left the package: it '
                         "decoded fewer images per second than 16 CPU cores at batches of 64-256 "
                         "and is kept as an experiment in experimental/png_gpu (docs/png_gpu.md). "
                         'Pass png_decoder=None (the native decoder where it is built) or "libpng". '
                         "Received: png_decoder='gpu'")
    if value not in PNG_DECODERS and not isinstance(value, PngDecoder):
        raise ValueError('`png_decoder` must be None (the native decoder where it is built, '
                         'else libpng), "wuffs" or "libpng". '
                         f"Received: png_decoder={value!r}")
    return None if value is None else PngDecoder(value)


def _gpu_ready_value(d: _Draft) -> ReadyForm | None:
    value = d.o.gpu_ready
    if isinstance(value, ReadyForm):
        return value
    if value == "tiff":
        raise ValueError(
            'gpu_ready="tiff" was retired: compact entries (gpu_ready=True) are smaller (1.05x '
            "the PNGs' bytes against 1.13x) and decode faster, on the CPU and on a GPU "
            "(docs/gpu_ready.md). Use gpu_ready=True. Received: gpu_ready='tiff'")
    if value not in GPU_READY_VALUES or (value is not None and not isinstance(
            value, (bool, str))):
        raise ValueError('`gpu_ready` must be None, False, True, "compact" or "raw". '
                         f"Received: gpu_ready={value!r}")
    if value is None or value is False:
        return None
    return ReadyForm.RAW if value == "raw" else ReadyForm.COMPACT


def _handoff_value(d: _Draft) -> Handoff | None:
    value = d.o.handoff
    if value is None or isinstance(value, Handoff):
        return value
    try:
        return Handoff(value)
    except ValueError:
        raise ValueError('`handoff` must be None, "generator", "plugin" or "plugin-gpu". '
                         f"Received: handoff={value!r}") from None


def shard_of(input_context: Any) -> tuple[int, int]:
    """`(pipeline id, pipelines)` of a `tf.distribute.InputContext`, or (0, 1)."""
    if input_context is None:
        return (0, 1)
    try:
        shard = (int(input_context.input_pipeline_id), int(input_context.num_input_pipelines))
    except AttributeError:
        raise ValueError(
            "`input_context` must be the tf.distribute.InputContext passed to the "
            "function given to strategy.distribute_datasets_from_function. "
            f"Received: input_context={input_context!r}"
        ) from None
    if not 0 <= shard[0] < shard[1]:
        raise ValueError(f"Invalid input pipeline {shard[0]} of {shard[1]}. "
                         f"Received: input_context={input_context!r}")
    return shard


def shard_size(n: int, batch_size: int, shard: int, num_shards: int) -> int:
    """Files pipeline `shard` of `num_shards` reads per epoch: every `num_shards`-th
    batch from its own on (`feed.order.shard_of`)."""
    full, last = divmod(n, batch_size)
    batches = full + (last > 0)
    mine = len(range(shard, batches, num_shards))
    has_last = last > 0 and (batches - 1) % num_shards == shard
    return mine * batch_size - (batch_size - last if has_last else 0)


def parse_service(service: Any) -> tuple[str, int]:
    """`(host, port)` of a `"grpc://host:port"` dispatcher address; ValueError otherwise."""
    m = _ADDRESS.match(service) if isinstance(service, str) else None
    if not m or not 0 < int(m.group("port")) < 65536:
        raise ValueError(
            '`service` must be a tf.data service dispatcher address, "grpc://host:port" '
            "(start one with `dali-loader serve dispatcher --port P`), or None. "
            f"Received: service={service!r}")
    return m.group("host").strip("[]"), int(m.group("port"))


def _service(d: _Draft) -> tuple[str, int] | None:
    """With a service the workers decode with TF's kernels on their CPUs, so
    DALI (`decoder="dali"`, `device="gpu"`, `handoff`: DALIDataset refuses split
    providers) and the GPU-ready cache cannot join it; nor can `input_context`
    (one trainer reads each epoch: docs/service.md)."""
    o = d.o
    if o.service is None:
        return None
    address = parse_service(o.service)
    refused = {"decoder": (o.decoder, ("tf", None)), "device": (o.device, ("cpu", None)),
               "handoff": (o.handoff, (None,)), "gpu_ready": (o.gpu_ready, (None, False)),
               "input_context": (o.input_context, (None,))}
    for name, (value, allowed) in refused.items():
        if value not in allowed:
            raise ValueError(
                f"`service` runs the TF-kernel graph on the tf.data service's CPU workers; it "
                f"cannot be combined with {name}={value!r} (allowed with service: "
                f"{' or '.join(repr(a) for a in allowed)}). Received: service={o.service!r}, "
                f"{name}={value!r}")
    if d.png_asked not in (None, PngDecoder.LIBPNG):
        raise ValueError(
            "The tf.data service's workers run a pure TF graph: PNGs are decoded by TF's "
            'libpng there. Pass png_decoder=None (or "libpng") with `service`. '
            f"Received: png_decoder={o.png_decoder!r}, service={o.service!r}")
    return address


def _seed_for_shards(d: _Draft) -> None:
    if d.shard[1] > 1 and d.o.shuffle and d.o.seed is None:
        raise ValueError(
            "With `input_context` and shuffling, every input pipeline must use the same "
            "`seed`, so that they shuffle alike and read disjoint shards. Pass `seed`. "
            f"Received: seed=None, input_context={d.o.input_context!r}")


def _device(d: _Draft) -> Because:
    asked, env = d.o.device, d.env
    if d.address is not None:
        return Because(Device.CPU, "service=: the workers decode on their CPUs")
    if asked == "cpu":
        return Because(Device.CPU, 'device="cpu"')
    if asked is None and d.o.decoder == "tf":
        return Because(Device.CPU, 'decoder="tf": TF\'s kernels, on the CPU')
    if d.o.output is Output.TF_DATA and env.tf_gpus == 0:
        if asked == "gpu":
            raise ValueError(
                'device="gpu" was requested but TensorFlow sees no GPU. Install TensorFlow '
                "with CUDA (pip install 'tensorflow[and-cuda]') or use device=None. "
                "Received: device='gpu'")
        return Because(Device.CPU, "TensorFlow sees no GPU")
    if env.dali_gpus == 0:
        if asked == "gpu":
            raise ValueError(
                'device="gpu" was requested but DALI sees no CUDA GPU. Use device=None '
                "to pick the CPU automatically, or check the driver and CUDA_VISIBLE_DEVICES. "
                "Received: device='gpu'")
        return Because(Device.CPU, "DALI sees no GPU")
    if asked == "gpu":
        return Because(Device.GPU, 'device="gpu"')
    seen = "DALI" if d.o.output is Output.NUMPY else "TF and DALI"
    return Because(Device.GPU, f"device=None and {seen} see a GPU")


def _tf_decoder_on_gpu(d: _Draft) -> None:
    if d.o.decoder == "tf" and d.device is Device.GPU:
        raise ValueError(
            'decoder="tf" decodes on the CPU; it cannot be combined with device="gpu" '
            "(device=None or \"cpu\" runs it). "
            f"Received: decoder={d.o.decoder!r}, device={d.o.device!r}")


def _engine(d: _Draft) -> Because:
    """The one place `decoder == "dali" or device == "gpu"` is written."""
    if d.address is not None:
        return Because(Engine.SERVICE, "service=")
    if d.o.output is Output.NUMPY:
        return Because(Engine.DALI, "numpy batches (api.open_loader): DALI")
    if d.o.decoder == "dali":
        return Because(Engine.DALI, 'decoder="dali"')
    if d.device is Device.GPU:
        return Because(Engine.DALI, "the GPU: DALI decodes and resizes there")
    return Because(Engine.TF_KERNELS, "the CPU: TF's kernels (bit-identical to Keras, faster "
                                      "than DALI's there)")


def _compact_built(d: _Draft) -> None:
    """Compact entries are decoded by the native core's op on the engine's path."""
    if d.cache_form is not ReadyForm.COMPACT or d.engine is Engine.SERVICE:
        return
    tf_path = d.engine is Engine.TF_KERNELS
    if not (d.env.tf_png_op if tf_path else d.env.dali_png_op):
        step = "build_tf" if tf_path else "build_dali"
        raise ImportError(
            "gpu_ready=True stores compact entries, which the native core's "
            f"{'TF op' if tf_path else 'DALI operator'} decodes; it is not available here. "
            f"Build it with: python -m dali_loader.native.{step} (part of `make install`), or "
            f'keep uncompressed entries with gpu_ready="raw". Received: gpu_ready={d.o.gpu_ready!r}')


_WUFFS_MISSING = ("the native PNG core (`make install`: python -m dali_loader.native.build) or "
                  "Wuffs' Python bindings (pip install pywuffs==2.0.1)")


def _wuffs_built(d: _Draft) -> None:
    """png_decoder="wuffs" needs its decoder built where it runs."""
    if d.png_asked is not PngDecoder.WUFFS:
        return
    if d.engine is Engine.TF_KERNELS and d.cache_form is None:
        if not d.env.tf_png_op:
            raise ImportError(
                'png_decoder="wuffs" on the CPU default decodes PNGs with the native core\'s '
                "TF op, which is not available; build it with: python -m "
                "dali_loader.native.build_tf (part of `make install`). "
                "Received: png_decoder='wuffs'")
    elif not d.env.wuffs:
        raise ImportError(f'png_decoder="wuffs" needs {_WUFFS_MISSING}. '
                          "Received: png_decoder='wuffs'")


def _png_fill(d: _Draft) -> Because | None:
    if d.cache_form is None:
        return None
    if d.png_asked is not None:
        return Because(d.png_asked, f"png_decoder={d.png_asked.value!r}")
    if d.env.wuffs:
        return Because(PngDecoder.WUFFS, "png_decoder=None: Wuffs, installed here")
    d.notes.append("The fast PNG decoder (Wuffs) is not installed: the GPU-ready cache is "
                   f"filled with libpng, about 0.7x as fast; `make install` builds {_WUFFS_MISSING}.")
    return Because(PngDecoder.LIBPNG, "png_decoder=None: Wuffs is not installed")


def _fill_where(d: _Draft) -> Because | None:
    if d.cache_form is None:
        return None
    if d.png_fill is PngDecoder.LIBPNG:
        return Because(PngWhere.FEED, "libpng (TF's decoder, eagerly) on the feed's threads")
    if d.engine is Engine.TF_KERNELS and d.cache_form is ReadyForm.COMPACT:  # the op is built
        return Because(PngWhere.TF_OP, "compact entries on TF's kernels: the native op decodes "
                       "a batch's new PNGs and writes their entries, in the graph")
    return Because(PngWhere.FEED, "Wuffs on the feed's threads")


def _entry_decode(d: _Draft) -> Because | None:
    """The CPU core unless `entry_decoder="gpu"` asks for the GPU decode: built on
    nvCOMP's and DALI's documented APIs, compiled where nvcc is, never run here, so
    never a default (docs/gpu_ready.md, "The GPU decode")."""
    asked = d.o.entry_decoder
    if asked is not None and asked not in ("cpu", "gpu"):  # EntryDecoder is a str enum
        raise ValueError('`entry_decoder` must be None (the native core on the CPU), "cpu" '
                         f'or "gpu". Received: entry_decoder={asked!r}')
    asked = None if asked is None else EntryDecoder(asked)
    if asked is EntryDecoder.GPU:
        if d.cache_form is not ReadyForm.COMPACT:
            raise ValueError('entry_decoder="gpu" decodes the compact entries of '
                             'gpu_ready=True (or "compact"). Received: entry_decoder=\'gpu\', '
                             f"gpu_ready={d.o.gpu_ready!r}")
        if d.engine is not Engine.DALI or d.device is not Device.GPU:
            raise ValueError('entry_decoder="gpu" decodes on DALI\'s GPU: it needs a GPU that '
                             'TF and DALI see (device=None or "gpu"). Received: '
                             f"entry_decoder='gpu', device={d.device.value!r}")
        if not d.env.dali_entry_gpu_op:
            raise ImportError('entry_decoder="gpu" needs the GPU decode built: python -m '
                              "dali_loader.native.build_gpu (nvcc and nvCOMP's headers; part "
                              "of `make install` where they are). Received: entry_decoder='gpu'")
        d.notes.append('The compact entries are decoded on the GPU (entry_decoder="gpu"): nvCOMP '
                       "and DALI's documented APIs, not yet run on a GPU in this project "
                       "(device_checks/compact_gpu_check checks its core).")
        return Because(EntryDecoder.GPU, 'entry_decoder="gpu": nvCOMP\'s batched Zstd and a '
                       "kernel on DALI's GPU")
    if d.cache_form is not ReadyForm.COMPACT:
        return None
    return Because(EntryDecoder.CPU, f"entry_decoder={None if asked is None else 'cpu'!r}: "
                   "the native core on the CPU (measured; the GPU decode is asked for)")


def _handoff(d: _Draft) -> Handoff | Because | None:
    """The handoff for DALI's batches. None picks the host-placed plugin on the
    GPU when it holds every guarantee of the options: batched, and
    `on_error="raise"` or the GPU-ready cache (its entries were decoded by TF
    first, so a file DALI cannot decode never reaches DALI). `PLUGIN_GPU` is
    never picked: it is asked for."""
    asked, o = d.handoff_asked, d.o
    if asked is None:
        if d.engine is not Engine.DALI or o.output is not Output.TF_DATA:
            return None
        if d.device is not Device.GPU:
            return Because(Handoff.GENERATOR, "handoff=None on the CPU")
        if o.batch_size is None:
            return Because(Handoff.GENERATOR, "handoff=None, batch_size=None")
        if o.on_error != "raise" and d.cache_form is None:
            return Because(Handoff.GENERATOR, 'handoff=None, on_error="skip" without gpu_ready '
                                              "(a bad file would end a plugin epoch)")
        if not d.env.dali_tf_plugin:
            d.notes.append("DALI's TF plugin (nvidia.dali.plugin.tf) does not import: DALI's "
                           'batches reach TF through from_generator (handoff="generator").')
            return Because(Handoff.GENERATOR, "handoff=None: DALI's TF plugin does not import")
        return Because(Handoff.PLUGIN, "handoff=None on a GPU, batched, every file decodable")
    if asked.plugin and o.batch_size is None:
        raise ValueError(f'handoff="{asked.value}" needs batches (DALI makes them). '
                         f"Received: handoff={asked.value!r}, batch_size=None")
    if asked is Handoff.PLUGIN_GPU and d.device is not Device.GPU:
        raise ValueError('handoff="plugin-gpu" keeps DALI\'s batches on the GPU; it needs '
                         'device="gpu" (or None on a machine where TF and DALI see a GPU). '
                         f"Received: handoff={asked.value!r}, device={d.device.value!r}")
    if asked.plugin and d.engine is not Engine.DALI:
        raise ValueError(
            f'handoff="{asked.value}" hands over DALI\'s batches; on the CPU it needs '
            f'decoder="dali". Received: handoff={asked.value!r}, device={d.device.value!r}, '
            f"decoder={o.decoder!r}")
    if d.engine is not Engine.DALI:
        return Because(None, f"handoff={asked.value!r}: no DALI batches to hand over")
    return Because(asked, f"handoff={asked.value!r}")


def _device_id(d: _Draft) -> Because:
    if d.device is not Device.GPU:
        return Because(0, "the CPU")
    gpus = d.env.dali_gpus
    return Because(d.shard[0] % max(1, gpus),
                   f"input pipeline {d.shard[0]} of {d.shard[1]} on DALI's {gpus} GPU(s)")


def _gpu_with_jpegs(d: _Draft) -> bool:
    """On a GPU a folder with JPEGs keeps DALI's decoder for every file: nvJPEG
    decodes them there, which a per-sample branch (CPU operators only) would not."""
    return d.device is Device.GPU and d.engine is Engine.DALI and d.env.has_jpegs


def _png_epoch(d: _Draft) -> Because:
    asked, env = d.png_asked, d.env
    named = f"png_decoder={None if asked is None else asked.value!r}"
    if d.cache_form is not None:
        return Because((None, PngWhere.NONE), "gpu_ready: a cached epoch decodes no PNG")
    if d.engine is Engine.SERVICE:
        return Because((PngDecoder.LIBPNG, PngWhere.TF), "service=: the workers run TF's graph")
    if d.engine is Engine.TF_KERNELS or (d.engine is Engine.DALI and asked is None):
        if not env.has_pngs:  # no branch per file for PNGs that are not there
            return Because((PngDecoder.LIBPNG, PngWhere.TF if d.engine is Engine.TF_KERNELS
                            else PngWhere.DALI),
                           f"{named}, but no file is named .png: every file to "
                           f"{'TF' if d.engine is Engine.TF_KERNELS else 'DALI'}'s decoder "
                           "(a PNG named otherwise too)")
    if d.engine is Engine.TF_KERNELS:
        if asked is PngDecoder.LIBPNG:
            return Because((PngDecoder.LIBPNG, PngWhere.TF), named)
        if asked is PngDecoder.WUFFS:
            return Because((PngDecoder.WUFFS, PngWhere.TF_OP), named)
        if env.tf_png_op:
            return Because((PngDecoder.WUFFS, PngWhere.TF_OP), f"{named}: the TF op is built")
        d.notes.append("The native PNG decoder's TF op is not available: PNGs are decoded "
                       "with TF's libpng, slower. `make install` builds it (python -m "
                       "dali_loader.native.build_tf).")
        return Because((PngDecoder.LIBPNG, PngWhere.TF), f"{named}: the TF op is not built")
    if _gpu_with_jpegs(d) and asked is not PngDecoder.LIBPNG:
        return Because((PngDecoder.LIBPNG, PngWhere.DALI),
                       f"{named}, on a GPU with JPEGs: DALI's mixed decoder takes every file")
    if asked is PngDecoder.WUFFS:
        return Because((PngDecoder.WUFFS, PngWhere.FEED), named)
    if asked is None and env.dali_png_op:
        return Because((PngDecoder.WUFFS, PngWhere.DALI_OP), f"{named}: the DALI op is built")
    if asked is None:
        return Because((PngDecoder.LIBPNG, PngWhere.DALI), f"{named}: the DALI op is not built")
    return Because((PngDecoder.LIBPNG, PngWhere.DALI), named)


def _item_reader(d: _Draft) -> ItemReader | Because:
    if d.engine is Engine.SERVICE:
        return ItemReader.WORKERS
    if d.engine is Engine.TF_KERNELS:
        if d.cache_form is not None:  # read whole batches into one buffer (compact: for the op)
            return ItemReader.READY_PINNED
        kind = d.env.source_kind
        return Because({SourceKind.LOCAL_DISK: ItemReader.PATHS,
                        SourceKind.NETWORK_FS: ItemReader.RAW_BYTES,
                        SourceKind.REMOTE: ItemReader.PINNED_OR_BYTES}[kind],
                       f"TF's kernels, a {kind.value} source")
    if d.cache_form is not None:
        return ItemReader.READY_BYTES
    if d.png_where is PngWhere.FEED:
        return ItemReader.RAW_OR_CHECKED
    return ItemReader.CHECKED_BYTES


def _dali_input(d: _Draft) -> DaliInput | None:
    if d.engine is not Engine.DALI:
        return None
    if d.cache_form is not None:
        if d.entry_decode is EntryDecoder.GPU:
            return DaliInput.READY_COMPACT_GPU
        return {ReadyForm.RAW: DaliInput.READY_RAW,
                ReadyForm.COMPACT: DaliInput.READY_COMPACT}[d.cache_form]
    return DaliInput.FILES_OR_RAW if d.png_where is PngWhere.FEED else DaliInput.FILES


def _graph(d: _Draft) -> Because | None:
    """The fused graph unless its pads would be over a quarter of the epoch's files.

    The fusion saves CPU on every image (2-6% measured on photos; on 512 tiny PNGs
    the fused graph ran 14% faster); the pads, up to a batch less one per epoch, each
    cost about a decode (70 µs each at 244x244: docs/benchmarks.md, issue 29). Issue
    29 fused from 4 batches; issue 37 measured whole batches (no pads) gaining too."""
    if d.engine is not Engine.TF_KERNELS or d.item_reader not in _FILE_READERS:
        return None
    batch = d.o.batch_size or 32
    files = shard_size(d.env.files, batch, *d.shard)
    pads = -files % batch
    said = f"{files} files per epoch in batches of {batch}: {pads} pads"
    if files and pads <= FUSED_MAX_PAD_SHARE * files:
        return Because(Graph.FUSED, f"{said}, at most a quarter of the files")
    return Because(Graph.PER_FILE, f"{said}, over a quarter of the files")


def _decode_calls(d: _Draft) -> Because | None:
    """Decodes in flight: `num_threads`, else on TF's kernels `CALLS_PER_CORE` per core
    for files (TF's threads, one per core, run them; each call writes its image into
    the batch) and one per core for the cache's batches of entries; DALI's threads
    (and the feed's Wuffs decodes, the cache's fills) one per core."""
    if d.engine is Engine.SERVICE:
        kind = d.env.source_kind
        if kind is not SourceKind.LOCAL_DISK:  # reads wait on latency
            return Because(d.o.max_in_flight, f"the workers' reads of a {kind.value} source: "
                                              f"max_in_flight={d.o.max_in_flight}")
        return Because(d.o.num_threads, f"num_threads={d.o.num_threads} (None: AUTOTUNE, "
                                        "each worker's cores)")
    if d.o.num_threads:
        return Because(d.o.num_threads, f"num_threads={d.o.num_threads}")
    cores = d.env.cores
    if d.engine is Engine.DALI:
        return Because(cores, f"num_threads=None: DALI's CPU threads, one per core, {cores}")
    if d.cache_form is not None:  # whole batches of entries per call
        return Because(cores, f"num_threads=None, the cache's batches: one per core, {cores}")
    return Because(CALLS_PER_CORE * cores, f"num_threads=None: {CALLS_PER_CORE} per core, "
                                           f"{cores} core(s)")


def _png_binding(d: _Draft) -> Because | None:
    if not (d.png_where is PngWhere.FEED or d.png_fill is PngDecoder.WUFFS):
        return None
    if d.env.png_core:
        return Because(PngBinding.NATIVE_CORE, "the native core is built")
    return Because(PngBinding.PYWUFFS, "the native core is not built: pywuffs")


def _big_pngs(d: _Draft) -> Because | None:
    if d.engine is not Engine.DALI or d.dali_input not in (DaliInput.FILES,
                                                           DaliInput.FILES_OR_RAW):
        return None
    if d.device is Device.CPU:
        return Because(BigPngs.TF_BEFORE_DALI, "on the CPU: TF decodes them as their batch "
                                               "enters DALI (its decoder's memory)")
    return Because(BigPngs.DALI, "on a GPU: a branch would hold the mixed decoder, which "
                                 "DALI's conditionals do not document")


_FILE_READERS = (ItemReader.PATHS, ItemReader.RAW_BYTES, ItemReader.PINNED_OR_BYTES)


def _checks(d: _Draft) -> tuple[Check, ...]:
    if d.engine is Engine.SERVICE:  # the trainer's tally names every file a worker failed
        return (Check.AUDIT,)
    out = []
    if d.o.max_pixels is not None:
        out.append(Check.PIXEL_LIMIT)
    if d.item_reader in (ItemReader.CHECKED_BYTES, ItemReader.RAW_OR_CHECKED):
        out.append(Check.BYTES)
    if d.png_where is PngWhere.FEED or d.cache_form is not None:
        out.append(Check.FEED_DECODE)
    if d.engine is Engine.TF_KERNELS and d.cache_form is None:
        out.append(Check.AUDIT)
    if d.o.on_error == "raise" and d.o.output is Output.TF_DATA:
        out.append(Check.CARDINALITY)
    return tuple(out)


def _set(field: str | tuple[str, ...], fn: Callable[[_Draft], Any], says: str, source: bool = False) -> Rule:
    return Rule(field, says, fn, source)


def _check(fn: Callable[[_Draft], Any], says: str) -> Rule:
    return Rule(None, says, fn)


# Every default and every cross-option rule, in the order they run. A rule reads
# the options, the environment and the fields of the rules before it.
RULES: tuple[Rule, ...] = (
    _check(lambda d: check_on_error(d.o.on_error), 'on_error is "raise" or "skip"'),
    _check(_num_threads, "num_threads is a positive integer or None (the cores available)"),
    _check(_max_in_flight, "max_in_flight is a positive integer"),
    _check(_cache_max_bytes, "cache_max_bytes is positive or None (half the free disk)"),
    _check(lambda d: check_max_pixels(d.o.max_pixels), "max_pixels is a positive int or None"),
    _check(lambda d: check_manifest_mode(d.o.manifest), 'manifest is "use", "refresh" or "off"'),
    _check(_device_value, 'device is None (auto), "cpu" or "gpu"'),
    _check(_decoder_value, 'decoder is None, "dali" or "tf"'),
    _set("png_asked", _png_decoder_value, 'png_decoder is None, "wuffs" or "libpng"'),
    _set("cache_form", _gpu_ready_value,
         'gpu_ready: None/False no cache; True/"compact" compact entries; "raw" raw '
         'entries'),
    _set("handoff_asked", _handoff_value, 'handoff is None, "generator", "plugin" or "plugin-gpu"'),
    _set("shard", lambda d: Because(shard_of(d.o.input_context), "no input_context"
                                    if d.o.input_context is None else "input_context"),
         "input_context: this pipeline's shard of each epoch, else (0, 1)"),
    _set("address", _service, "service: TF's kernels on its CPU workers; the CPU options only"),
    _check(_seed_for_shards, "sharded and shuffled: every pipeline passes the same seed"),
    _set("device", _device, 'device None: the GPU when TF and DALI both see one, else the CPU'),
    _check(_tf_decoder_on_gpu, 'decoder="tf" decodes on the CPU: not with device="gpu"'),
    _set("engine", _engine,
         'DALI for decoder="dali" or a GPU (or numpy batches); the service with service=; '
         "else TF's kernels"),
    _check(_compact_built, "compact entries need the native core's op on the engine's path"),
    _check(_wuffs_built, 'png_decoder="wuffs" needs its decoder built where it runs'),
    _set("png_fill", _png_fill,
         "cache fills: png_decoder as asked; None is Wuffs where installed, else libpng"),
    _set("fill_where", _fill_where, "where the cache's fills decode"),
    _set("entry_decode", _entry_decode, 'compact entries: the native core on the CPU; nvCOMP '
         'on DALI\'s GPU with entry_decoder="gpu"'),
    _set("handoff", _handoff,
         'DALI to tf.data: None is "plugin" on a GPU with batches and on_error="raise" or '
         'gpu_ready (where the plugin imports), else "generator"'),
    _set("device_id", _device_id, "on a GPU: the input pipeline's id modulo DALI's GPUs"),
    # The source's rules: after listing; they refuse nothing.
    _set(("png_epoch", "png_where"), _png_epoch,
         "each epoch's PNGs: TF path: the native TF op where built (else libpng); DALI: the "
         "native DALI op where built, Wuffs on the feed's threads, or DALI's decoder (every "
         "file on a GPU with JPEGs); the cache's entries: none", source=True),
    _set("item_reader", _item_reader,
         "TF path: paths on a local disk, bytes on FUSE/NFS, pinned entries for URLs; DALI: "
         "checked bytes (PNGs as raw pixels with Wuffs on the feed); the cache's entries",
         source=True),
    _set("dali_input", _dali_input,
         "DALI reads the files, files with raw PNG pixels, or the cache's entries",
         source=True),
    _set("png_binding", _png_binding, "Wuffs on the feed's threads: the native core where "
         "built, else pywuffs", source=True),
    _set("big_pngs", _big_pngs, "DALI's files on the CPU: big PNGs by TF before DALI",
         source=True),
    _set("graph", _graph, "TF's kernels over files: fused unless its pads would be over a "
         "quarter of the epoch's files", source=True),
    _set("decode_calls", _decode_calls, "num_threads, else per core: TF's kernels 2 (files) "
         "or 1 (the cache's batches), DALI 1; the service's reads of slow storage: max_in_flight",
         source=True),
    _set("checks", _checks, "what guards the decoders, by item reader and on_error",
         source=True),
)


def _run(options: Options, env: Environment, source: bool) -> _Draft:
    d = _Draft(options, env)
    for rule in RULES:
        if rule.source and not source:
            continue
        value = rule.decide(d)
        if rule.sets is None:
            continue
        why = "" if value is None else rule.says
        if isinstance(value, Because):
            value, why = value
        names, values = ((rule.sets, value) if isinstance(rule.sets, tuple)
                         else ((rule.sets,), (value,)))
        for name, v in zip(names, values):
            d.fields[name] = v
            d.why[name] = why
    return d


def check(options: Options, env: Environment) -> None:
    """Runs every rule that refuses (all but the source's), reading only the
    machine's facts: the refusals come before the source is listed."""
    _run(options, env, source=False)


def resolve(options: Options, env: Environment) -> Plan:
    """The plan for `options` on `env` (its machine and source facts).

    Raises:
        ValueError: an option's value, or a combination, that cannot be served
            (the message ends in `Received: name=value`).
        ImportError: png_decoder="wuffs" where its decoder is not built.
    """
    d = _run(options, env, source=True)
    why = dict(d.why)
    for field in ("png_asked", "handoff_asked"):
        why.pop(field)
    why["service_address"] = why.pop("address")
    return Plan(options=options, engine=d.engine, device=d.device, device_id=d.device_id,
                shard=d.shard, output=options.output, item_reader=d.item_reader,
                dali_input=d.dali_input, png_epoch=d.png_epoch, png_where=d.png_where,
                png_fill=d.png_fill, fill_where=d.fill_where, entry_decode=d.entry_decode,
                cache_form=d.cache_form,
                handoff=d.handoff,
                checks=d.checks, graph=d.graph, decode_calls=d.decode_calls,
                png_binding=d.png_binding, big_pngs=d.big_pngs, service_address=d.address,
                notes=tuple(d.notes), why=why,
                facts=env.read())
