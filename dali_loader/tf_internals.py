"""TF graph ops that tf.data's public API does not offer, each with the reason it is used.

TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

from collections.abc import Callable


def either(tf, pred, then: Callable, otherwise: Callable, *args):
    """`then(*args)` where `pred`, else `otherwise(*args)`; only the branch taken
    runs. TF's `Switch` and `Merge` ops, which `tf.cond` is lowered to: a
    `tf.cond` in a tf.data function instantiates its two branches as functions of
    their own for every iterator (measured: about 3 ms for the decode's and 10 ms
    for the audit's, per `iter()`). A branch's result must depend on its inputs.
    Not for a branch holding a `tf.numpy_function` in a plain (multi-device) map: tried
    for the compact cache's refill (tfdata/ready_path.py, 2026-12-06), TF failed the
    batch with "No return value for index 0"; that map keeps `tf.cond`."""
    otherwise_args, then_args = zip(*(tf.raw_ops.Switch(data=a, pred=pred) for a in args))
    out, _ = tf.raw_ops.Merge(inputs=[otherwise(*otherwise_args), then(*then_args)])
    return out
