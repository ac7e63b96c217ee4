"""dali-loader: keep the GPU fed from image folders on disk, FUSE or gs://.

The TF-free core: `index` (files, labels, splits) -> `sources`/`remote`/`cache`
(bytes on local disk) -> `pipeline` (the DALI graph) -> `loader` (epochs of
numpy batches). The Keras-facing function lives in `tf_adapter`.
Heavy dependencies (DALI, TensorFlow, google-cloud-storage) load lazily.
"""

__version__ = "0.1.0"
