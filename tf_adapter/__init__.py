"""Keras-facing adapter: `from tf_adapter import image_dataset_from_directory`."""

from tf_adapter.dataset import image_dataset_from_directory
from tf_adapter.resume import ResumableCheckpoint, fit_resumable

__all__ = ["image_dataset_from_directory", "ResumableCheckpoint", "fit_resumable"]
