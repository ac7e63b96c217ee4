"""Resumable training: after a kill, the interrupted epoch goes on at the step it reached.

Keras's `BackupAndRestore` restores the weights and the epoch, then redoes the
unfinished epoch from its start, so the files of its first steps are trained on
twice. `ResumableCheckpoint` saves the weights with `(epoch, steps done)`
together (one directory, published by an atomic rename), and `fit_resumable`
restarts from there: the rest of the interrupted epoch (`ds.resume_at(e, k)`,
which reads none of the files before step k), then the later epochs, numbered
as they would have been (`ds.seek`), so each epoch keeps its order. Across the
killed run and the resumed one, every file of the interrupted epoch is trained
on exactly once: the steps after the last checkpoint are rolled back with the
weights and read again.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

from dali_loader.args import positive_int

try:  # a Keras callback when Keras is there; the module stays importable without it
    from keras.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover - tf_adapter needs Keras anyway
    _Callback = object

_LATEST = "latest"


class ResumableCheckpoint(_Callback):
    """Saves the weights (with the optimizer's) and `(epoch, steps done)` every
    `save_freq` steps of an epoch and at each epoch's end.

    Args:
        backup_dir: A folder for this run's checkpoints (one kept at a time).
        save_freq: Steps between checkpoints within an epoch.
    """

    def __init__(self, backup_dir: str, save_freq: int):
        super().__init__()
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = positive_int("save_freq", save_freq)
        self.step_offset = 0  # steps of the epoch done before this fit (a resumed epoch)
        self._epoch = 0

    # -- saving ---------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        done = self.step_offset + batch + 1
        if done % self.save_freq == 0:
            self.save(self._epoch, done)

    def on_epoch_end(self, epoch, logs=None):
        self.step_offset = 0
        self.save(epoch + 1, 0)

    def save(self, epoch: int, step: int) -> None:
        """Writes a checkpoint and publishes it atomically as the latest."""
        os.makedirs(self.backup_dir, exist_ok=True)
        name = f"ckpt-{epoch}-{step}-{uuid.uuid4().hex[:8]}"
        folder = os.path.join(self.backup_dir, name)
        os.makedirs(folder)
        self.model.save_weights(os.path.join(folder, "model.weights.h5"))
        with open(os.path.join(folder, "state.json"), "w") as f:
            json.dump({"epoch": epoch, "step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        tmp = os.path.join(self.backup_dir, f".{_LATEST}.{name}")
        with open(tmp, "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        previous = self._latest()
        os.replace(tmp, os.path.join(self.backup_dir, _LATEST))
        if previous and previous != name:
            shutil.rmtree(os.path.join(self.backup_dir, previous), ignore_errors=True)

    # -- restoring ------------------------------------------------------------
    def _latest(self) -> str | None:
        try:
            with open(os.path.join(self.backup_dir, _LATEST)) as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    def restore(self, model) -> tuple[int, int]:
        """Loads the latest checkpoint into `model`: `(epoch, steps done)`, or
        `(0, 0)` when there is none.

        Raises:
            ValueError: `model` is not built (give it an `Input`).
        """
        name = self._latest()
        if name is None:
            return 0, 0
        if not model.built:
            raise ValueError("To resume, the model must be built before training: give it a "
                             f"keras.Input or call it on a batch. Received: model={model.name}")
        folder = os.path.join(self.backup_dir, name)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)  # its weights are loaded too
        model.load_weights(os.path.join(folder, "model.weights.h5"))
        with open(os.path.join(folder, "state.json")) as f:
            state = json.load(f)
        return int(state["epoch"]), int(state["step"])

    def clear(self) -> None:
        """Removes the checkpoints (training finished)."""
        shutil.rmtree(self.backup_dir, ignore_errors=True)


def fit_resumable(model, dataset, *, epochs: int, backup_dir: str, save_freq: int,
                  callbacks=None, keep_backup: bool = False, **fit_kwargs) -> list:
    """`model.fit(dataset, epochs=epochs, ...)` that survives a kill.

    Run the same call again after a kill: it restores the weights and goes on
    at the step the last checkpoint reached, the interrupted epoch's files in
    their order, none twice. `dataset` is one returned by
    `image_dataset_from_directory` (its handle `dataset.loader` resumes and seeks).

    Returns:
        The `History` of each `fit` call made (two when resuming mid-epoch).
    """
    positive_int("epochs", epochs)
    if not hasattr(dataset, "loader"):
        raise ValueError("fit_resumable needs a dataset made by tf_adapter's "
                         f"image_dataset_from_directory. Received: dataset={dataset!r}")
    checkpoint = ResumableCheckpoint(backup_dir, save_freq)
    epoch, step = checkpoint.restore(model)
    if step >= dataset.loader.num_batches:  # killed just before the epoch's end
        epoch, step = epoch + 1, 0
    callbacks = [*(callbacks or []), checkpoint]
    histories = []
    if step:
        checkpoint.step_offset = step
        histories.append(model.fit(dataset.loader.resume_at(epoch, step), epochs=epoch + 1,
                                   initial_epoch=epoch, callbacks=callbacks, **fit_kwargs))
        epoch += 1
    if epoch < epochs:
        dataset.loader.seek(epoch)
        histories.append(model.fit(dataset, epochs=epochs, initial_epoch=epoch,
                                   callbacks=callbacks, **fit_kwargs))
    if not keep_backup:
        checkpoint.clear()
    return histories
