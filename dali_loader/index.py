"""The file index: which files, which labels, which split.

Pure functions that reproduce the discovery, labelling and splitting rules of
`keras.utils.image_dataset_from_directory` (Keras 3, `dataset_utils.py`), so that
a given `seed` selects exactly the same training and validation files. The same
rules apply to a local folder (walked with `os.walk`) and to an object-store
listing (relative names), so both index identically.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
from collections.abc import Iterable, Sequence

import numpy as np

logger = logging.getLogger(__name__)

ALLOWLIST_FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


@dataclasses.dataclass(frozen=True)
class Index:
    """An ordered list of files with their integer labels.

    Attributes:
        paths: File paths (local paths or URLs), in dataset order.
        labels: int32 array aligned with `paths`, or None when unlabelled.
        class_names: Class names in label order, or None when unlabelled.
    """

    paths: list[str]
    labels: np.ndarray | None
    class_names: list[str] | None

    def __len__(self) -> int:
        return len(self.paths)


def _sorted_walk_files(
    rel_files: Iterable[str], formats: Sequence[str]
) -> list[str]:
    """Orders '/'-separated relative names the way Keras walks a folder.

    Keras sorts the `os.walk` tuples by their root path, then the file names
    inside each root, and keeps names whose lowercase ends with an allowed
    extension.
    """
    by_root: dict[str, list[str]] = {}
    formats = tuple(formats)
    for rel in rel_files:
        root, _, name = rel.rpartition("/")  # posixpath.split, for names without empty segments
        if name.lower().endswith(formats):
            by_root.setdefault(root, []).append(name)
    ordered = []
    for root in sorted(by_root):
        for name in sorted(by_root[root]):
            ordered.append(posixpath.join(root, name) if root else name)
    return ordered


def build_index(
    root: str,
    rel_files: Iterable[str],
    subdirs: Iterable[str],
    labels: str | Sequence[int] | None = "inferred",
    class_names: Sequence[str] | None = None,
    formats: Sequence[str] = ALLOWLIST_FORMATS,
    shuffle: bool = True,
    seed: int | None = None,
    join=None,
) -> Index:
    """Indexes files with Keras's exact rules.

    Args:
        root: The folder or URL the relative names are under.
        rel_files: Every file under `root`, '/'-separated, relative to it.
        subdirs: The first-level sub-directory names of `root`.
        labels: "inferred", None, or a list of integer labels in file order.
        class_names: Explicit class order (only with `labels="inferred"`).
        formats: Allowed lowercase extensions.
        shuffle: Whether to shuffle globally with `seed` (Keras's RandomState).
        seed: Shuffle seed; a random one is drawn when None.
        join: Joins `root` and a relative name (default `os.path.join`).

    Returns:
        The `Index`, in Keras's order.
    """
    join = join or os.path.join
    rel_files = list(rel_files)
    if labels == "inferred":
        dirs = sorted(d.rstrip("/") for d in subdirs if not d.startswith("."))
        if class_names is not None:
            if not set(class_names).issubset(set(dirs)):
                raise ValueError(
                    "The `class_names` passed did not match the "
                    "names of the subdirectories of the target directory. "
                    f"Expected: {dirs} (or a subset of it), "
                    f"but received: class_names={class_names}"
                )
            dirs = list(class_names)
        by_class: dict[str, list[str]] = {d: [] for d in dirs}
        for rel in rel_files:
            head, sep, tail = rel.partition("/")
            if sep and head in by_class:
                by_class[head].append(tail)
        filenames, label_list = [], []
        for i, d in enumerate(dirs):
            names = _sorted_walk_files(by_class[d], formats)
            filenames += [f"{d}/{n}" for n in names]
            label_list += [i] * len(names)
        label_arr: np.ndarray | None = np.asarray(label_list, dtype="int32")
        names_out: list[str] | None = list(dirs)
    else:
        if class_names is not None:
            if labels is None:
                raise ValueError(
                    "When `labels=None` (no labels), argument `class_names` "
                    "cannot be specified."
                )
            raise ValueError(
                "When argument `labels` is specified, argument "
                "`class_names` cannot be specified (the `class_names` "
                "will be the sorted list of labels)."
            )
        filenames = _sorted_walk_files(rel_files, formats)
        if labels is None:
            label_arr, names_out = None, None
        else:
            if len(labels) != len(filenames):
                raise ValueError(
                    "Expected the lengths of `labels` to match the number "
                    "of files in the target directory. len(labels) is "
                    f"{len(labels)} while we found {len(filenames)} files "
                    f"in directory {root}."
                )
            label_arr = list(labels)
            names_out = [str(label) for label in sorted(set(labels))]
    if join in (posixpath.join, os.path.join) and os.sep == "/" and root:
        base = root if root.endswith("/") else root + "/"
        paths = [base + f for f in filenames]  # what join gives for these names, without a call each
    else:
        paths = [join(root, *f.split("/")) for f in filenames]
    if shuffle:
        if seed is None:
            seed = np.random.randint(1e6)
        np.random.RandomState(seed).shuffle(paths)
        if label_arr is not None:
            np.random.RandomState(seed).shuffle(label_arr)
    if label_arr is not None:
        label_arr = np.asarray(label_arr, dtype="int32")
    return Index(paths, label_arr, names_out)


def split(index: Index, validation_split: float | None, subset: str | None) -> Index:
    """Restricts an index to Keras's training or validation split."""
    if not validation_split:
        return index
    num_val = int(validation_split * len(index))
    # Python slicing exactly as Keras writes it: with num_val == 0 the training
    # split is empty ([:-0]) and the validation split is everything ([-0:]).
    if subset == "training":
        return Index(
            index.paths[:-num_val],
            None if index.labels is None else index.labels[:-num_val],
            index.class_names,
        )
    if subset == "validation":
        return Index(
            index.paths[-num_val:],
            None if index.labels is None else index.labels[-num_val:],
            index.class_names,
        )
    raise ValueError(
        '`subset` must be either "training" or "validation". '
        f"Received: subset={subset}"
    )
