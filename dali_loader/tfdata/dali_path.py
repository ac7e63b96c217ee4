"""The DALI path's generator handoff: DALI's batches reach TF through `from_generator`.

`DaliBatches` (`decode.dali_batches`) decodes and resizes; each TF iterator runs
its own epoch of it, one Python call per batch. The plugin handoffs are
`dali_plugin`'s. TensorFlow is passed in (imported lazily by the caller).
"""

from __future__ import annotations

import numpy as np

from dali_loader.decode.dali_batches import DaliBatches
from dali_loader.decode.spec import ImageSpec
from dali_loader.tfdata.weak import weakly as _weakly


class _DaliEpochs:
    """What the DALI path's generator calls, once per iterator."""

    def __init__(self, batches: DaliBatches, which: tuple[int | None, int]):
        self.batches = batches
        self.which = which

    def epoch(self):
        for x, y in self.batches.epoch(*self.which):
            yield x, (np.zeros(len(x), np.int32) if y is None else y)


def dali_dataset(tf, batches: DaliBatches, spec: ImageSpec, batch_size: int | None,
                 which: tuple[int | None, int]):
    img_dtype = tf.uint8 if spec.output_uint8 else tf.float32
    epochs = _DaliEpochs(batches, which)
    sig = (tf.TensorSpec((None, *spec.shape), img_dtype), tf.TensorSpec((None,), tf.int32))
    # TF calls the generator once per iterator: one independent epoch each.
    ds = tf.data.Dataset.from_generator(_weakly(epochs, "epoch", lambda: iter(())),
                                        output_signature=sig)
    ds._dali_epochs = epochs  # held by every dataset and iterator derived from it
    return ds.unbatch() if batch_size is None else ds
