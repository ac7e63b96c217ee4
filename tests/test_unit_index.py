"""build_index / split on synthetic listings: Keras's discovery, labels, shuffle and split rules."""

from __future__ import annotations

import posixpath

import numpy as np
import pytest

from dali_loader.index import ALLOWLIST_FORMATS, Index, build_index, split

JOIN = posixpath.join

FILES = [
    "dogs/b.png",
    "dogs/a.JPG",
    "dogs/zz/c.png",
    "dogs/sub-dir/e.png",  # '-' sorts before '/': root "sub-dir" before "zz"
    "dogs/notes.txt",
    "dogs/.hidden.png",  # hidden files are kept (Keras keeps them)
    "cats/x.Jpeg",
    "cats/y.gif",
    "cats/deep/er/z.bmp",
    "cats/deep/w.PNG",
    "cats/archive.tar",
    ".git/HEAD.png",
    ".hidden_class/h.png",
    "empty/readme.md",
    "top.png",
]
SUBDIRS = ["dogs", "cats", ".git", ".hidden_class", "empty"]


# Keras's order: classes sorted, then each os.walk root sorted, then its file names.
CLASS_ORDER = [
    "/root/cats/x.Jpeg",
    "/root/cats/y.gif",
    "/root/cats/deep/w.PNG",
    "/root/cats/deep/er/z.bmp",
    "/root/dogs/.hidden.png",
    "/root/dogs/a.JPG",
    "/root/dogs/b.png",
    "/root/dogs/sub-dir/e.png",
    "/root/dogs/zz/c.png",
]


def index(**kw) -> Index:
    kw.setdefault("shuffle", False)
    return build_index("/root", FILES, SUBDIRS, join=JOIN, **kw)


def test_allowlist():
    assert ALLOWLIST_FORMATS == (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def test_inferred_labels_keras_order():
    idx = index()
    assert idx.class_names == ["cats", "dogs", "empty"]  # sorted, hidden skipped
    assert idx.paths == CLASS_ORDER
    assert idx.labels.dtype == np.int32
    assert idx.labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert len(idx) == 9


def test_listing_order_does_not_matter():
    a = index()
    b = build_index("/root", reversed(FILES), reversed(SUBDIRS), join=JOIN, shuffle=False)
    assert a.paths == b.paths and a.labels.tolist() == b.labels.tolist()


def test_trailing_slash_subdirs_and_default_join():
    idx = build_index("root", ["a/1.png", "b/2.png"], ["a/", "b/"], shuffle=False)
    assert idx.class_names == ["a", "b"]
    assert idx.paths == ["root/a/1.png", "root/b/2.png"]  # os.path.join


def test_formats_are_matched_case_insensitively_and_can_be_narrowed():
    idx = index(formats=(".png",))
    assert [p.rsplit("/", 1)[-1] for p in idx.paths] == [
        "w.PNG", ".hidden.png", "b.png", "e.png", "c.png"]
    assert idx.class_names == ["cats", "dogs", "empty"]


def test_class_names_subset_and_order():
    idx = index(class_names=["dogs", "cats"])
    assert idx.class_names == ["dogs", "cats"]
    assert idx.paths[:5] == ["/root/dogs/.hidden.png", "/root/dogs/a.JPG", "/root/dogs/b.png",
                             "/root/dogs/sub-dir/e.png", "/root/dogs/zz/c.png"]
    assert idx.labels.tolist() == [0] * 5 + [1] * 4
    only = index(class_names=["empty"])
    assert only.paths == [] and only.labels.tolist() == [] and only.class_names == ["empty"]


def test_class_names_mismatch_message():
    with pytest.raises(ValueError) as ei:
        index(class_names=["cats", "birds"])
    assert str(ei.value) == (
        "The `class_names` passed did not match the names of the subdirectories of the "
        "target directory. Expected: ['cats', 'dogs', 'empty'] (or a subset of it), "
        "but received: class_names=['cats', 'birds']"
    )
    with pytest.raises(ValueError, match="did not match"):
        index(class_names=[".hidden_class"])  # hidden dirs are not classes


def test_labels_none_indexes_everything_below_root():
    idx = index(labels=None)
    assert idx.labels is None and idx.class_names is None
    assert idx.paths == ["/root/top.png", "/root/.git/HEAD.png", "/root/.hidden_class/h.png",
                         *CLASS_ORDER]


def test_explicit_labels():
    n = len(index(labels=None))
    labels = [5, 3, 3, 0, 5, 1, 1, 1, 0, 3, 5, 0]
    assert len(labels) == n
    idx = index(labels=labels)
    assert idx.labels.dtype == np.int32
    assert idx.labels.tolist() == labels
    assert idx.class_names == ["0", "1", "3", "5"]
    assert idx.paths == index(labels=None).paths


def test_explicit_labels_length_mismatch():
    with pytest.raises(ValueError) as ei:
        index(labels=[0, 1, 2])
    assert str(ei.value) == (
        "Expected the lengths of `labels` to match the number of files in the target "
        "directory. len(labels) is 3 while we found 12 files in directory /root."
    )


@pytest.mark.parametrize("labels", [None, [0] * 12])
def test_class_names_only_with_inferred_labels(labels):
    with pytest.raises(ValueError, match="`class_names` cannot be specified"):
        index(labels=labels, class_names=["cats"])


@pytest.mark.parametrize("seed", [0, 7, 1337])
def test_shuffle_is_keras_randomstate_permutation(seed):
    ordered = index()
    shuffled = index(shuffle=True, seed=seed)
    paths = list(ordered.paths)
    labels = np.asarray(ordered.labels, np.int32).copy()
    np.random.RandomState(seed).shuffle(paths)
    np.random.RandomState(seed).shuffle(labels)
    assert shuffled.paths == paths
    assert shuffled.labels.tolist() == labels.tolist()
    assert shuffled.paths != ordered.paths
    # Labels still follow their files.
    label_of = dict(zip(ordered.paths, ordered.labels.tolist()))
    assert [label_of[p] for p in shuffled.paths] == shuffled.labels.tolist()


def test_shuffle_explicit_labels_and_unlabelled():
    base = index(labels=None)
    labels = list(range(len(base)))
    idx = index(labels=labels, shuffle=True, seed=3)
    paths, exp = list(base.paths), list(labels)
    np.random.RandomState(3).shuffle(paths)
    np.random.RandomState(3).shuffle(exp)
    assert idx.paths == paths and idx.labels.tolist() == exp
    assert index(labels=None, shuffle=True, seed=3).paths == paths
    assert labels == list(range(len(base)))  # the caller's list is not shuffled in place


def test_shuffle_without_seed_is_still_a_permutation():
    idx = index(shuffle=True, seed=None)
    assert sorted(idx.paths) == sorted(index().paths)


# --- split ------------------------------------------------------------------------------


def ten() -> Index:
    return Index([f"f{i}" for i in range(10)], np.arange(10, dtype=np.int32), ["a"])


def test_split_sizes():
    idx = ten()
    tr = split(idx, 0.2, "training")
    va = split(idx, 0.2, "validation")
    assert tr.paths == [f"f{i}" for i in range(8)] and tr.labels.tolist() == list(range(8))
    assert va.paths == ["f8", "f9"] and va.labels.tolist() == [8, 9]
    assert tr.class_names == va.class_names == ["a"]
    assert len(split(idx, 0.25, "validation")) == 2  # int(2.5)
    assert len(split(idx, 0.99, "training")) == 1


def test_split_none_or_zero_returns_the_index():
    idx = ten()
    assert split(idx, None, None) is idx
    assert split(idx, 0.0, "training") is idx


def test_split_num_val_zero_keras_slicing_quirk():
    idx = ten()
    # int(0.05 * 10) == 0: Keras's [:-0] / [-0:] slicing.
    assert split(idx, 0.05, "training").paths == []
    assert split(idx, 0.05, "training").labels.tolist() == []
    assert split(idx, 0.05, "validation").paths == idx.paths


def test_split_unlabelled():
    idx = Index(["a", "b", "c", "d"], None, None)
    assert split(idx, 0.5, "training") == Index(["a", "b"], None, None)
    assert split(idx, 0.5, "validation") == Index(["c", "d"], None, None)


@pytest.mark.parametrize("subset", [None, "train", "both", "Training"])
def test_split_invalid_subset(subset):
    with pytest.raises(ValueError) as ei:
        split(ten(), 0.2, subset)
    assert str(ei.value) == ('`subset` must be either "training" or "validation". '
                             f"Received: subset={subset}")
