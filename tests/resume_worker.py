"""One training process of tests/test_resume.py (not a test module).

    python tests/resume_worker.py ID_TREE BACKUP_DIR LOG [SLEEP_S]

Trains a tiny model with `fit_resumable` over the `id_tree` fixture (file id =
red channel / 10), 3 epochs of 6 steps (batch 4), a checkpoint every 2 steps.
Each finished training step appends a JSON line `{"epoch", "ids"}` to LOG (the
files that step trained on); the first line is `{"restored": [epoch, step]}`.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


def main(id_tree: str, backup_dir: str, log_path: str, sleep_s: float) -> None:
    import keras

    from tf_adapter import fit_resumable, image_dataset_from_directory
    from tf_adapter.resume import ResumableCheckpoint

    ds = image_dataset_from_directory(id_tree, image_size=(8, 8), batch_size=4, seed=3,
                                      verbose=False)
    log = open(log_path, "a", buffering=1)
    seen = []

    class Recording(keras.Sequential):
        def train_step(self, data):
            x, _ = data
            seen.append([int(round(float(v) / 10)) for v in x.numpy()[:, 0, 0, 0]])
            return super().train_step(data)

    class Log(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):  # the step is done: its files are used
            log.write(json.dumps({"epoch": self.epoch, "ids": seen[-1]}) + "\n")
            time.sleep(sleep_s)

    keras.utils.set_random_seed(0)  # the same initial weights in every run
    model = Recording([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    restored = ResumableCheckpoint(backup_dir, 2).restore(model)
    log.write(json.dumps({"restored": list(restored)}) + "\n")
    fit_resumable(model, ds, epochs=3, backup_dir=backup_dir, save_freq=2, callbacks=[Log()],
                  verbose=0)
    weights = [w.tolist() for w in model.get_weights()]
    log.write(json.dumps({"done": True, "weights": weights}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
