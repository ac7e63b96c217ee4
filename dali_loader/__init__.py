"""dali-loader: keep the GPU fed from image folders on disk, FUSE or gs://.

The core, one job per module: `index` (files, labels, splits) -> `sources`,
`remote`, `cache` (bytes on local disk) -> `readahead`, `validate` -> `pipeline`
(the DALI graph) -> `loader` (epochs of batches, TF-free) -> `tfdata` (a
Keras-shaped tf.data.Dataset; TF's kernels decode on the CPU, DALI on the GPU).
`api` opens a source in one call; `cli` is the `dali-loader` command. The
Keras-facing function lives in `tf_adapter`, which this package never imports.
Heavy dependencies (DALI, TensorFlow, google-cloud-storage) load lazily.
"""

__version__ = "0.1.0"
