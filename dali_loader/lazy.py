"""Heavy dependencies, imported on first use, with an error that says what to install."""

from __future__ import annotations


def import_tf():
    """Imports TensorFlow."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(
            "tf.data output needs TensorFlow: pip install tensorflow==2.21.0 "
            "(or run `make install`)."
        ) from e
    return tf


def import_dali():
    """Imports NVIDIA DALI."""
    try:
        import nvidia.dali as dali
    except ImportError as e:
        raise ImportError(
            "Decoding with DALI needs NVIDIA DALI: pip install nvidia-dali-cuda120==2.4.0 "
            "(or run `make install`)."
        ) from e
    return dali


def import_gcs():
    """Imports `google.cloud.storage`."""
    try:
        from google.cloud import storage
    except ImportError as e:
        raise ImportError(
            "Reading gs:// URLs needs google-cloud-storage: pip install google-cloud-storage"
        ) from e
    return storage


def import_dali_tf():
    """Imports the DALI TensorFlow plugin (`nvidia.dali.plugin.tf`)."""
    import_tf()
    import_dali()
    try:
        import nvidia.dali.plugin.tf as dali_tf
    except ImportError as e:
        raise ImportError(
            'handoff="plugin" needs the DALI TensorFlow plugin, compiled against the installed '
            "TensorFlow: pip install --no-build-isolation nvidia-dali-tf-plugin-cuda120==2.4.0"
        ) from e
    return dali_tf
