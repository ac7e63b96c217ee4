"""The generated PNG corpus is what it says: TF decodes every valid file, rejects every
corrupt one, and an Adam7 file decodes to its non-interlaced twin's pixels."""

from __future__ import annotations

import pytest

from support import png_corpus


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def test_every_combination_is_there():
    names = png_corpus.valid_corpus()
    for code, depths in (("g", (1, 2, 4, 8, 16)), ("c", (8, 16)), ("p", (1, 2, 4, 8)),
                         ("a", (8, 16)), ("r", (8, 16))):
        for depth in depths:
            for interlace in (0, 1):
                for variant in ("plain", "gamma45", "gamma100", "srgb", "iccp", "idats",
                                "ancillary"):
                    assert f"{code}{depth:02d}_i{interlace}_{variant}_13x11.png" in names
    assert sum("_trns_" in n for n in names) == (5 + 2 + 4) * 2 * 3
    assert not any(n.startswith("x") for n in names)
    assert all(n.startswith("x") for n in png_corpus.corrupt_corpus())


def test_tf_decodes_valid_files_and_adam7_matches(tf):
    files = png_corpus.valid_corpus()
    for name, data in files.items():
        img = tf.io.decode_png(data, channels=4, dtype=tf.uint16).numpy()
        w, h = map(int, name[:-4].rsplit("_", 1)[1].split("x"))
        assert img.shape == (h, w, 4), name
        if "_i1_" in name:
            flat = tf.io.decode_png(files[name.replace("_i1_", "_i0_")], channels=4,
                                    dtype=tf.uint16).numpy()
            assert (img == flat).all(), name


def test_tf_rejects_every_corrupt_file(tf):
    for name, data in png_corpus.corrupt_corpus().items():
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
            tf.io.decode_png(data, channels=3).numpy()
            pytest.fail(f"TF decoded {name}")


def test_deterministic():
    assert png_corpus.corpus(3) == png_corpus.corpus(3)
    assert png_corpus.corpus(3) != png_corpus.corpus(4)
