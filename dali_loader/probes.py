"""The environment `plan.resolve` reads, probed in one place: named capability probes.

Each probe answers one question about this machine, loading what it asks about
(TF, DALI, a native library) only when a rule reads its fact
(`plan.Environment` calls it on first read, once per environment). Tests do not
probe: they inject an `Environment` of values.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from dali_loader.plan import Environment, Plan
from dali_loader.storage.source import SourceKind

logger = logging.getLogger(__name__)


def tf_gpus() -> int:
    """GPUs TensorFlow sees (imports TF)."""
    from dali_loader.lazy import import_tf

    return len(import_tf().config.list_physical_devices("GPU"))


def dali_gpus() -> int:
    """CUDA devices DALI sees (0 without a GPU or driver)."""
    from dali_loader.decode.devices import dali_gpu_count

    return dali_gpu_count()


def tf_png_op() -> bool:
    """Whether the native PNG core's TF op is built and loads (imports TF)."""
    from dali_loader.decode import tf_png

    return tf_png.available()


def dali_png_op() -> bool:
    """Whether the native PNG core's DALI operator is built and loads (imports DALI)."""
    from dali_loader.decode import dali_png

    return dali_png.available()


def dali_entry_gpu_op() -> bool:
    """Whether the compact entries' GPU decode (a DALI GPU operator) is built and loads
    (imports DALI)."""
    from dali_loader.decode import dali_png

    return dali_png.gpu_available()


def wuffs() -> bool:
    """Whether Wuffs decodes on the feed's threads: the native core (ctypes) or pywuffs."""
    from dali_loader.decode.png_stage import wuffs_available

    return wuffs_available()


def png_core() -> bool:
    """Whether the native PNG core (libdlpng) itself is built and loads (ctypes)."""
    from dali_loader.decode import png_native

    return png_native.available()


def cores() -> int:
    """CPU cores available to this process."""
    from dali_loader.decode.dali_graph import default_num_threads

    return default_num_threads()


def dali_tf_plugin() -> bool:
    """Whether DALI's TF plugin imports (imports TF and DALI)."""
    from dali_loader.lazy import import_dali_tf

    try:
        import_dali_tf()
    except ImportError:
        return False
    return True


def source_kind(source: str) -> SourceKind:
    """Where `source`'s files live, before it is listed (`storage.source.kind_of`)."""
    from dali_loader.storage.source import kind_of

    return kind_of(source)


# The machine's facts, each answered by the probe of the same name in this module.
MACHINE_FACTS = ("tf_gpus", "dali_gpus", "tf_png_op", "dali_png_op", "dali_entry_gpu_op",
                 "wuffs", "png_core", "dali_tf_plugin", "cores")


def environment(source_kind: SourceKind | None = None,
                paths: Sequence[str] | None = None) -> Environment:
    """This machine's environment, each fact probed on first read (by this module's
    probe of its name); with the source's facts when `source_kind` and `paths`
    (the index's) are given."""
    env = Environment(**{name: globals()[name] for name in MACHINE_FACTS})
    if source_kind is not None:
        env = env.with_source(source_kind, paths if paths is not None else ())
    return env


_said: set[str] = set()
_said_lock = threading.Lock()


def say_notes(plan: Plan) -> None:
    """Logs each of the plan's notes once per process (a slower fallback, an
    unverified path)."""
    for note in plan.notes:
        with _said_lock:
            if note in _said:
                continue
            _said.add(note)
        logger.warning("%s", note)


def share_gpu(plan: Plan) -> None:
    """On a GPU with a tf.data output, lets TF and DALI share the card
    (`devices.share_gpu_with_dali`: TF memory growth)."""
    from dali_loader.plan import Device, Output

    if plan.device is Device.GPU and plan.output is Output.TF_DATA:
        from dali_loader.decode.devices import share_gpu_with_dali
        from dali_loader.lazy import import_tf

        tf = import_tf()
        share_gpu_with_dali(tf, tf.config.list_physical_devices("GPU"))
