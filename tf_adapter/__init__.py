"""Keras-facing adapter: `from tf_adapter import image_dataset_from_directory`."""

from tf_adapter.dataset import image_dataset_from_directory

__all__ = ["image_dataset_from_directory"]
