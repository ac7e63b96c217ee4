"""Calling a dataset's Python target through a weak reference (TF keeps py_functions forever)."""

from __future__ import annotations

import weakref

from dali_loader.exiting import call_guarded


def weakly(obj, method: str, default):
    """`obj.method`, called through a weak reference (`default(*args)` once `obj` is gone).

    TF keeps every py_function of a tf.data pipeline alive for the life of the
    process (they are registered on the outermost graph, see `script_ops`), so
    a function that held the loader would keep its pools, cache pins and DALI
    pipelines forever. The dataset object holds the loader instead; every
    dataset derived from it, and every iterator, keeps it alive.

    Each call (and each step of a generator it returns) is counted as a call
    from TF in flight, and a generator ends when the interpreter exits
    (`dali_loader.exiting`).
    """
    ref = weakref.ref(obj)

    def call(*args):
        target = ref()
        return default(*args) if target is None else call_guarded(getattr(target, method), *args)

    return call
