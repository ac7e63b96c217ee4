"""Small helpers the tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import time


def wait_for(cond, timeout: float = 5.0, step: float = 0.005) -> None:
    """Polls `cond()` until true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)


def batch_counter(counts: list[int]):
    """A Keras callback that appends each epoch's number of training batches to `counts`."""
    import keras

    class Count(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.n = 0

        def on_train_batch_end(self, batch, logs=None):
            self.n += 1

        def on_epoch_end(self, epoch, logs=None):
            counts.append(self.n)

    return Count()


def run_fit_script(code: str, allocator: str | None) -> None:
    """Runs `code` in a fresh Python (with `TF_GPU_ALLOCATOR=allocator` when given);
    fails unless it prints "fit-ok"."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    if allocator:
        env["TF_GPU_ALLOCATOR"] = allocator
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert "fit-ok" in out.stdout, out.stderr[-3000:]
