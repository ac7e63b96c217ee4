"""TensorFlow's private APIs, in one place: each use named, with its measured reason,
behind one version gate, and with a public fallback.

Built the way NVIDIA DALI's TF plugin gates TF's internals (`nvidia/dali/plugin/tf.py`:
`dataset_compatible_tensorflow()` compares `tf.__version__`, and only then are
`tensorflow.python.data.ops.dataset_ops` and `structure` imported and `DALIDataset`
subclassed from them; otherwise a class that says the version is unsupported). Here:

- **The gate** (`gate`): TF's version within `CHECKED` (the versions the TF-path tests
  ran on with these internals: 2.16 to 2.21, docs/development.md "Older TensorFlow"),
  and every private symbol below imported (`_private`: all in that one function).
- **The switch**: `DALI_LOADER_TF_INTERNALS=0` turns every one off (public tf.data only);
  `=1` turns them on outside `CHECKED` too (to try a new TF; each probe still applies);
  unset: on within `CHECKED`. `DALI_LOADER_SINGLE_DEVICE_MAPS=0` turns
  `SINGLE_DEVICE_FUNCTIONS` alone off (docs/parity.md: for a user who turns tf.data's
  `experimental_slack` on, which refuses such functions). `DALI_LOADER_TF_INTERNALS_OFF`
  names internals to turn off one by one (`SWITCH_MERGE,GENERATOR_OP`): how each one's
  gain is measured against its fallback (docs/benchmarks.md, "The TF internals, each off").
- **Each use** is an `Internal`, with what it uses, its measured gain and the docs
  section that has the measurement, and its fallback. `status(tf)` says which are on,
  for `dali-loader diagnose` and the plan.

Where one is off, its fallback runs: the same files once per epoch, the same pixels and
labels (tests/test_tf_internals.py runs the TF path both ways). The issue's rule (issue
39): a private API stays only where it buys at least 5%, measured.

TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

ENV = "DALI_LOADER_TF_INTERNALS"  # "0": public tf.data only; "1": on outside CHECKED too
SINGLE_DEVICE_ENV = "DALI_LOADER_SINGLE_DEVICE_MAPS"  # "0": SINGLE_DEVICE_FUNCTIONS off
OFF_ENV = "DALI_LOADER_TF_INTERNALS_OFF"  # comma-separated `Internal` names, each off
# The TF versions (major, minor) the TF-path tests ran on with these internals on:
# 2.16.2 (`make test-tf-floor`, in CI) and 2.21 (`make test`); 2.17.1 by hand
# (docs/development.md, "Older TensorFlow").
CHECKED = ((2, 16), (2, 21))


@dataclasses.dataclass(frozen=True)
class Reason:
    uses: str  # TF's private API
    gain: str  # what it buys, measured
    docs: str  # where the measurement is
    fallback: str  # what runs where it is off


class Internal(enum.Enum):
    """The TF internals the loader uses, each with its reason."""

    GENERATOR_OP = Reason(
        uses="from_generator_op._GeneratorDataset: TF's GeneratorDataset op driven directly",
        gain="a 16-file epoch 41.8 -> 29.3 ms best (-30%): no flat_map, no per-element "
             "wrapper",
        docs="docs/benchmarks.md, 'Under load, before the merge' (Where the per-iteration "
             "time goes)",
        fallback="tf.data.Dataset.from_generator")
    SINGLE_DEVICE_FUNCTIONS = Reason(
        uses="experimental_ints_on_device on every tf.data function (StructuredFunctionWrapper"
             "'s defun_kwargs; UnaryDataset, _MapAndBatchDataset and _GeneratorDataset "
             "subclassed over gen_dataset_ops, _variant_tensor)",
        gain="iter() CPU 10.4 -> 1.4 ms best; a 16-file epoch 17.2 -> 7.5 ms best (-56%)",
        docs="docs/benchmarks.md, 'Single-device functions and the graph by folder size'",
        fallback="Dataset.map and tf.data.experimental.map_and_batch (multi-device functions)")
    SWITCH_MERGE = Reason(
        uses="tf.raw_ops.Switch and Merge (what tf.cond is lowered to)",
        gain="CPU per image about 7% lower on 512-file folders of tiny PNGs (the op's fallback "
             "branch runs per image): 0.92x Keras's on average with it, 0.98x without, png8 "
             "512 1.01-1.06x against 1.10-1.14x (issue 37's bar is 1.1x); no difference "
             "measured on 16-file folders",
        docs="docs/benchmarks.md, 'The TF internals, each off (issue 39)'",
        fallback="tf.cond")
    POOLED_BUFFERS = Reason(
        uses="tf.raw_ops.Empty(...)._numpy(): a writable view of TF's CPU allocator's memory",
        gain="the GPU-ready fill 184.2 vs 153.4 img/s best (1.20x), 225 vs 353 minor faults "
             "per image; one 20000x20000 PNG among small ones: peak RSS 1.82 GiB (5.14 before)",
        docs="docs/png_cpu.md, 'Measured (the core alone, and the GPU-ready fill)'; "
             "docs/gpu_ready.md, 'Using it' (Big images)",
        fallback="numpy memory (64-byte aligned where TF shares it)")
    NAMED_DECODE_ERRORS = Reason(
        uses="iterator_ops.OwnedIterator._next_internal overridden; "
             "UnaryUnchangedStructureDataset over the same _variant_tensor",
        gain="no speed: the plugin handoff's eager iterator names the file DALI failed on "
             "(and on_error='skip' leaves it out of the next epochs)",
        docs="docs/handoff.md, 'Bad files and the handoffs'",
        fallback="DALI's own error, as inside model.fit")
    GPU_RESIDENT_DATASET = Reason(
        uses="UnaryUnchangedStructureDataset over the DALI dataset's _variant_tensor: its "
             "element_spec and cardinality declared, transformations without a GPU kernel "
             "refused",
        gain="no speed: handoff='plugin-gpu' (the batches stay on the GPU)",
        docs="docs/handoff.md, '`plugin-gpu`: when to use it, and its limits'",
        fallback="none: handoff='plugin-gpu' raises, saying why")


_imported: dict[str, object] = {}  # "mods": the namespace, or "error": why not


def _private() -> SimpleNamespace | None:
    """Every private TF symbol the loader uses, imported here and nowhere else
    (None where one is missing: `gate` says which)."""
    if "mods" in _imported or "error" in _imported:
        return _imported.get("mods")  # type: ignore[return-value]
    try:
        from tensorflow.python.data.experimental.ops import batching
        from tensorflow.python.data.ops import dataset_ops, iterator_ops, structured_function
        from tensorflow.python.data.ops.from_generator_op import _GeneratorDataset
        from tensorflow.python.data.util import nest, structure
        from tensorflow.python.eager import context
        from tensorflow.python.framework import dtypes, ops
        from tensorflow.python.ops import gen_dataset_ops, gen_experimental_dataset_ops

        mods = SimpleNamespace(
            GeneratorDataset=_GeneratorDataset,
            UnaryDataset=dataset_ops.UnaryDataset,
            UnaryUnchangedStructureDataset=dataset_ops.UnaryUnchangedStructureDataset,
            MapAndBatchDataset=batching._MapAndBatchDataset,
            OwnedIterator=iterator_ops.OwnedIterator,
            FunctionWrapper=structured_function.StructuredFunctionWrapper,
            nest=nest, structure=structure, context=context, dtypes=dtypes, ops=ops,
            gen_dataset_ops=gen_dataset_ops,
            gen_experimental_dataset_ops=gen_experimental_dataset_ops)
        for module, needed in ((gen_dataset_ops, "map_dataset"),
                               (gen_dataset_ops, "parallel_map_dataset_v2"),
                               (gen_dataset_ops, "generator_dataset"),
                               (gen_experimental_dataset_ops, "map_and_batch_dataset")):
            getattr(module, needed)
    except (ImportError, AttributeError) as err:
        _imported["error"] = f"{type(err).__name__}: {err}"
        return None
    _imported["mods"] = mods
    return mods


def _version(tf) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", getattr(tf, "__version__", ""))
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def gate(tf) -> str | None:
    """Why every internal is off here (the switch, TF's version, an import), or None."""
    switch = os.environ.get(ENV, "").strip()
    if switch == "0":
        return f"{ENV}=0"
    (lo, hi), version = CHECKED, _version(tf)
    if switch != "1" and not lo <= version <= hi:
        return (f"TF {tf.__version__} is outside the versions checked, "
                f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]} ({ENV}=1 tries them)")
    if _private() is None:
        return f"TF's private modules did not import ({_imported['error']})"
    return None


def why_off(tf, internal: Internal) -> str | None:
    """Why `internal` is off here, or None where it is on."""
    closed = gate(tf)
    if closed:
        return closed
    if (internal is Internal.SINGLE_DEVICE_FUNCTIONS
            and os.environ.get(SINGLE_DEVICE_ENV, "").strip() == "0"):
        return f"{SINGLE_DEVICE_ENV}=0"
    named = {n.strip().upper() for n in os.environ.get(OFF_ENV, "").split(",") if n.strip()}
    unknown = named - {i.name for i in Internal}
    if unknown:
        raise ValueError(f"{OFF_ENV} names internals that do not exist: {sorted(unknown)}; "
                         f"they are {[i.name for i in Internal]}. "
                         f"Received: {OFF_ENV}={os.environ.get(OFF_ENV)!r}")
    if internal.name in named:
        return f"{OFF_ENV} names it"
    return None


_answers: dict[tuple, bool] = {}  # `on`'s answers, by everything they depend on


def on(tf, internal: Internal) -> bool:
    """Whether `internal` is on here (`why_off` is None), kept per switch setting and TF:
    it is asked per image on the feed's Wuffs path (`pooled_empty`)."""
    env = os.environ
    key = (internal, env.get(ENV), env.get(SINGLE_DEVICE_ENV), env.get(OFF_ENV),
           getattr(tf, "__version__", ""), CHECKED, "error" in _imported)
    answer = _answers.get(key)
    if answer is None:
        answer = _answers[key] = why_off(tf, internal) is None
    return answer


_probes: dict[str, bool] = {}  # each probe's answer, once per process


def probed(name: str, attempt: Callable[[], bool]) -> bool:
    """Whether this TF takes what `attempt` tries (`attempt()`'s answer, False where it
    raises: a TF that refuses it), asked once per process and kept under `name`."""
    if name not in _probes:
        try:
            _probes[name] = bool(attempt())
        except Exception:  # noqa: BLE001 - a TF that refuses it: the fallback instead
            _probes[name] = False
    return _probes[name]


def status(tf) -> dict[str, str]:
    """Each internal's name -> "on: <gain> (<docs>)" or "off: <why>; <fallback>"."""
    out = {}
    for internal in Internal:
        why, r = why_off(tf, internal), internal.value
        out[internal.name] = (f"on: {r.gain} ({r.docs})" if why is None
                              else f"off: {why}; {r.fallback}")
    return out


def summary(tf) -> tuple[str, str]:
    """`(value, why)` for `dali-loader diagnose`'s plan: how many internals are on, and
    each one's name, on or off with why (their gains: `status`, and `Internal`)."""
    closed = gate(tf)
    if closed:
        return f"0 of {len(Internal)} on (TF {tf.__version__})", f"off: all ({closed})"
    on_, off = [], []
    for internal in Internal:
        why = why_off(tf, internal)
        (on_ if why is None else off).append(internal.name if why is None
                                             else f"{internal.name} ({why})")
    value = f"{len(on_)} of {len(Internal)} on (TF {tf.__version__})"
    return value, "; ".join(([f"on: {', '.join(on_)}"] if on_ else [])
                            + ([f"off: {', '.join(off)}"] if off else []))


# --- SWITCH_MERGE -----------------------------------------------------------------------

def either(tf, pred, then: Callable, otherwise: Callable, *args):
    """`then(*args)` where `pred`, else `otherwise(*args)`; only the branch taken
    runs. `SWITCH_MERGE`: TF's `Switch` and `Merge` ops, which `tf.cond` is lowered to: a
    `tf.cond` in a tf.data function instantiates its two branches as functions of
    their own (about 3 ms for the decode's and 10 ms for the audit's per `iter()` when
    measured with multi-device functions; with single-device ones what remains is
    per image: about 7% of the CPU per tiny PNG, `Internal.SWITCH_MERGE`). Off:
    `tf.cond`. A branch's result must depend on its inputs. Not for a branch holding a
    `tf.numpy_function` in a plain (multi-device) map: tried for the compact cache's
    refill (then tfdata/ready_path.py, now compact_path.py; 2026-12-06), TF failed the batch with "No return value
    for index 0"; that map keeps `tf.cond`."""
    if not on(tf, Internal.SWITCH_MERGE):
        return tf.cond(pred, lambda: then(*args), lambda: otherwise(*args))
    otherwise_args, then_args = zip(*(tf.raw_ops.Switch(data=a, pred=pred) for a in args))
    out, _ = tf.raw_ops.Merge(inputs=[otherwise(*otherwise_args), then(*then_args)])
    return out


# --- POOLED_BUFFERS ---------------------------------------------------------------------

def pooled_empty(tf, nbytes: int, align: int = 1) -> np.ndarray | None:
    """A writable 1-D uint8 buffer of `nbytes` from TF's own CPU allocator, which pools
    what it frees (oneDNN's): a batch or an image reuses the memory TF freed (after a
    decode) instead of fresh pages. None where `POOLED_BUFFERS` is off, or the view is
    not writable or not `align`-byte aligned: the caller takes numpy's."""
    if not on(tf, Internal.POOLED_BUFFERS):
        return None
    try:
        out = tf.raw_ops.Empty(shape=[nbytes], dtype=tf.uint8, init=False)._numpy()
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - a future TF
        return None
    if out.flags.writeable and out.ctypes.data % align == 0:
        return out  # its base holds TF's buffer
    return None  # pragma: no cover - a future TF


# --- SINGLE_DEVICE_FUNCTIONS and GENERATOR_OP: the dataset classes ----------------------

# A tf.data function with this attribute is instantiated for each iterator as a
# single-device function ("Disabling multi-device execution for a function that uses the
# experimental_ints_on_device attribute", tensorflow/core/data/captured_function.cc),
# without grappler's pass over it. On a CPU, where every tf.data function runs, it changes
# nothing else.
_SINGLE_DEVICE = {"experimental_ints_on_device": True}
_classes: dict[str, type] = {}


def has_single_device_attribute(function) -> bool:
    """Whether a traced tf.data function (`StructuredFunctionWrapper.function`) carries it."""
    return bool(function.function_def.attr["experimental_ints_on_device"].b)


def _wrap(p: SimpleNamespace, fn: Callable, name: str, single: bool, **kw):
    return p.FunctionWrapper(fn, name, defun_kwargs=dict(_SINGLE_DEVICE) if single else None,
                             **kw)


def _dataset_classes() -> dict[str, type]:
    """The dataset classes over TF's private ones, built on first use (after `gate`)."""
    if _classes:
        return _classes
    p = _private()

    class Map(p.UnaryDataset):
        """`Dataset.map(fn, num_parallel_calls=calls, deterministic=True)` (sequential
        where `calls` is None), with `fn` single-device."""

        def __init__(self, input_dataset, fn: Callable, calls: int | None):
            self._input_dataset = input_dataset
            self._name = None
            self._map_func = _wrap(p, fn, "Dataset.map()", True, dataset=input_dataset)
            func = self._map_func.function
            if calls is None:
                variant = p.gen_dataset_ops.map_dataset(
                    input_dataset._variant_tensor, func.captured_inputs, f=func,
                    use_inter_op_parallelism=True, preserve_cardinality=True,
                    **self._common_args)
            else:
                self._num_parallel_calls = p.ops.convert_to_tensor(calls, p.dtypes.int64)
                variant = p.gen_dataset_ops.parallel_map_dataset_v2(
                    input_dataset._variant_tensor, func.captured_inputs, f=func,
                    num_parallel_calls=self._num_parallel_calls,
                    deterministic="true", use_inter_op_parallelism=True,
                    preserve_cardinality=True, **self._common_args)
            super().__init__(input_dataset, variant)

        def _functions(self):
            return [self._map_func]

        @property
        def element_spec(self):
            return self._map_func.output_structure

    class MapAndBatch(p.MapAndBatchDataset):
        """`tf.data.experimental.map_and_batch(fn, batch, calls)`, `fn` single-device."""

        def __init__(self, input_dataset, fn: Callable, batch: int, calls: int):
            self._input_dataset = input_dataset
            self._map_func = _wrap(p, fn, "tf.data.experimental.map_and_batch()", True,
                                   dataset=input_dataset)
            self._element_spec = p.nest.map_structure(lambda spec: spec._batch(None),
                                                      self._map_func.output_structure)
            func = self._map_func.function
            self._num_parallel_calls_t = p.ops.convert_to_tensor(calls, p.dtypes.int64)
            variant = p.gen_experimental_dataset_ops.map_and_batch_dataset(
                input_dataset._variant_tensor, func.captured_inputs, f=func,
                batch_size=p.ops.convert_to_tensor(batch, p.dtypes.int64),
                num_parallel_calls=self._num_parallel_calls_t,
                drop_remainder=p.ops.convert_to_tensor(False, p.dtypes.bool),
                preserve_cardinality=True, **self._flat_structure)
            p.UnaryDataset.__init__(self, input_dataset, variant)

    class Generator(p.GeneratorDataset):
        """`_GeneratorDataset.__init__` (its state an int64 from `init`), with `init`
        and `finalize` single-device where `ends`, and `next_` where `every`."""

        def __init__(self, tf, init, next_, finalize, output_signature, ends: bool,
                     every: bool):
            self._init_args = tf.constant(0, tf.int64)
            self._init_structure = p.structure.type_spec_from_value(self._init_args)
            self._output_signature = output_signature
            self._name = None
            name = self._transformation_name()
            self._init_func = _wrap(p, init, name, ends, input_structure=self._init_structure)
            state = self._init_func.output_structure
            self._next_func = _wrap(p, next_, name, every, input_structure=state)
            self._finalize_func = _wrap(p, finalize, name, ends, input_structure=state)
            variant = p.gen_dataset_ops.generator_dataset(
                p.structure.to_tensor_list(self._init_structure, self._init_args)
                + self._init_func.function.captured_inputs,
                self._next_func.function.captured_inputs,
                self._finalize_func.function.captured_inputs,
                init_func=self._init_func.function, next_func=self._next_func.function,
                finalize_func=self._finalize_func.function, **self._common_args)
            # DatasetSource's: `_GeneratorDataset.__init__` wraps its functions itself,
            # without `defun_kwargs`.
            super(p.GeneratorDataset, self).__init__(variant)

    _classes.update(Map=Map, MapAndBatch=MapAndBatch, Generator=Generator)
    return _classes


def single_device_map(tf, ds, fn: Callable, calls: int | None):
    """`ds.map(fn)` in order, `calls` at a time (None: one by one), `fn` a single-device
    function (`SINGLE_DEVICE_FUNCTIONS`, which the caller checked is on)."""
    return _dataset_classes()["Map"](ds, fn, calls)


def single_device_map_and_batch(tf, ds, fn: Callable, batch: int, calls: int):
    """`tf.data.experimental.map_and_batch(fn, batch, calls)`, `fn` single-device."""
    return _dataset_classes()["MapAndBatch"](ds, fn, batch, calls)


def generator_dataset(tf, init, next_, finalize, signature, *, ends: bool, every: bool):
    """TF's `GeneratorDataset` op over `init(0) -> state`, `next_(state)`,
    `finalize(state)` (`GENERATOR_OP`, which the caller checked is on); `init` and
    `finalize` single-device where `ends`, `next_` where `every`."""
    if not ends and not every:
        return _private().GeneratorDataset(tf.constant(0, tf.int64), init, next_, finalize,
                                           output_signature=signature)
    return _dataset_classes()["Generator"](tf, init, next_, finalize, signature, ends, every)


def generator_class():
    """TF's own `_GeneratorDataset` (tests)."""
    return _private().GeneratorDataset


# --- NAMED_DECODE_ERRORS and GPU_RESIDENT_DATASET: the plugin handoff's datasets --------

_plugin_classes: dict[str, tuple[type, type]] = {}


def _refused(name: str, message: Callable[[str], str]):
    def refuse(self, *args, **kwargs):
        raise ValueError(message(name))
    refuse.__name__ = name
    return refuse


def plugin_dataset_classes(tf, refused: tuple[str, ...], refusal: Callable[[str], str]
                           ) -> tuple[type, type]:
    """`(NamingDataset, GpuResidentDataset)` over TF's private classes, made once.

    `NamingDataset(ds, name_error)`: `ds` as is (the same variant tensor, no op added),
    whose eager iterators pass a `tf.errors.InternalError` to `name_error(err)` and raise
    what it returns instead (None: the error as is). `GpuResidentDataset(ds, name_error,
    cardinality, unwrap)`: that, with `cardinality` declared (None: unknown), its one
    tensor alone where `unwrap`, and each method in `refused` raising
    `ValueError(refusal(name))`."""
    if "classes" in _plugin_classes:
        return _plugin_classes["classes"]
    p = _private()

    class NamingIterator(p.OwnedIterator):
        """Eager `next()` that lets `name_error` replace TF's InternalError."""

        def __init__(self, dataset, name_error: Callable):
            self._name_error = name_error  # keeps the input generator's target alive
            super().__init__(dataset)

        def _next_internal(self):
            if not p.context.executing_eagerly():
                return super()._next_internal()
            try:
                return super()._next_internal()
            except tf.errors.InternalError as err:
                named = self._name_error(err)
                if named is None:
                    raise
                raise named from err

    class NamingDataset(p.UnaryUnchangedStructureDataset):
        def __init__(self, input_dataset, name_error: Callable):
            self._name_error = name_error
            super().__init__(input_dataset, input_dataset._variant_tensor)

        def __iter__(self):
            if p.context.executing_eagerly():
                with tf.device(self._variant_tensor.device):
                    return NamingIterator(self, self._name_error)
            return super().__iter__()

    class GpuResidentDataset(NamingDataset):
        def __init__(self, dali_dataset, name_error: Callable, cardinality: int | None,
                     unwrap: bool):
            self._known_cardinality = cardinality
            self._unwrap = unwrap
            super().__init__(dali_dataset, name_error)

        @property
        def element_spec(self):
            # The plugin always yields a tuple; `unwrap`: its one tensor alone (the same
            # flat components: no op needed).
            spec = self._input_dataset.element_spec
            return spec[0] if self._unwrap else spec

        def cardinality(self):
            if self._known_cardinality is None:
                return tf.constant(tf.data.UNKNOWN_CARDINALITY, tf.int64)
            return tf.constant(self._known_cardinality, tf.int64)

    for name in refused:
        setattr(GpuResidentDataset, name, _refused(name, refusal))
    _plugin_classes["classes"] = (NamingDataset, GpuResidentDataset)
    return _plugin_classes["classes"]
