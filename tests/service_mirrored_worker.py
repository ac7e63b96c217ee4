"""One trainer process of test_service.py's tf.distribute test (not a test module).

    python tests/service_mirrored_worker.py grpc://127.0.0.1:PORT TREE OUT.json

MirroredStrategy over 2 logical CPU devices: `model.fit` for 2 epochs on
`image_dataset_from_directory(..., service=...)` (Keras splits each global batch
over the 2 replicas); OUT.json gets the trainer's per-epoch tally.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


def main(target: str, tree: str, out: str) -> None:
    from support.cluster import strategy as make_strategy

    strategy, _ = make_strategy("mirrored")
    import keras

    from tf_adapter import image_dataset_from_directory

    ds = image_dataset_from_directory(tree, image_size=(24, 32), batch_size=8, seed=4,
                                      service=target, verbose=False)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((24, 32, 3)), keras.layers.Rescaling(1 / 255),
                                  keras.layers.Flatten(), keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds, epochs=2, verbose=0)
    with open(out, "w") as f:
        json.dump({"replicas": strategy.num_replicas_in_sync, "loss": history.history["loss"],
                   "epochs": [dataclasses.asdict(e) for e in ds.tally.epochs()],
                   "files": len(ds.file_paths)}, f)


if __name__ == "__main__":
    from support.cluster import run_and_exit

    run_and_exit(main, *sys.argv[1:4])
