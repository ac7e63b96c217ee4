"""dali-loader: keep the GPU fed from image folders on disk, FUSE or gs://.

The library follows the data: `storage` (local folders, FUSE mounts, gs:// and
fsspec URLs through a verified disk cache) -> `index` (Keras's files, labels and
splits) -> `feed` (per-iteration order, read-ahead, byte checks, error policy)
-> `decode` (the DALI graph and its batches; TF's own kernels) -> `tfdata` (a
finite, Keras-shaped tf.data.Dataset). `api` opens a source in one call. The
Keras-facing function lives in `tf_adapter`, which this package never imports;
`tools` (the `dali-loader` CLI, bench, diagnose) sits beside it and is never
imported by the library; test support (a fake GCS server, PNG corpora) lives in
`tests/support/`, outside the package. Heavy dependencies
(DALI, TensorFlow, google-cloud-storage) load lazily (`lazy`).
"""

__version__ = "0.1.0"
