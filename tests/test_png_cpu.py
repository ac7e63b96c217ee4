"""The fast CPU PNG decoder (Wuffs): TF's outcome for every file, on PngSuite, photos with
every filter type and a seeded mutation corpus, in the three colour modes."""

from __future__ import annotations

import collections
import io

import numpy as np
import pytest

from dali_loader.decode import png_cpu
from dali_loader.decode.png_cpu import Fallback, decode_png, grey_from_rgb
from dali_loader.decode.png_stage import KerasPixels
from dali_loader.errors import CorruptImageError
from support.mutate import MUTATIONS, corpus
from support.pngs import encode_png, photo, photo_png
from support.helpers import png_outcome, refuses_flipped_idats

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.skipif(not png_cpu.available(), reason="pywuffs is not installed")

MODES = (1, 3, 4)


def compare(data: bytes, channels: int) -> str:
    """'fast' (TF's pixels), 'fallback' (left to TF), 'fallback-rejected' (left to TF,
    which rejects it), or what went wrong."""
    return png_outcome(decode_png, data, channels)


def test_every_corpus_file_every_mode(pngs):
    """Every file of `pngs` (the generated corpus; PngSuite's too where present), in every
    mode: Wuffs gives TF's pixels, or steps aside (and TF decodes or rejects the file)."""
    from support.helpers import corrupt_pngs, valid_pngs

    outcomes = collections.Counter()
    wrong = []
    for path in sorted(pngs.glob("*.png")):
        data = path.read_bytes()
        for c in MODES:
            o = compare(data, c)
            outcomes[o] += 1
            if o not in ("fast", "fallback", "fallback-rejected"):
                wrong.append((path.name, c, o))
    assert not wrong, wrong
    # The decoder takes most files (every colour type, bit depth and interlacing);
    # the ones it leaves are tRNS colour keys and gamma-converted greys.
    assert outcomes["fast"] >= 0.75 * 3 * len(valid_pngs(pngs)), outcomes
    assert outcomes["fallback-rejected"] == 3 * len(corrupt_pngs(pngs)), outcomes  # the x* files


def _bases() -> list[bytes]:
    """Small PNGs of every 8-bit colour type with all five filter types, a palette
    with and without tRNS, and Pillow photos (its own filter choice): the mutation
    corpus's bases, shared with the native core's tests and fuzzing."""
    from support.fuzz_png import mutation_bases

    return mutation_bases()


@pytest.mark.parametrize("filters", [(0,), (1,), (2,), (3,), (4,), (0, 1, 2, 3, 4)])
@pytest.mark.parametrize("c", [1, 3, 4])
def test_photos_every_filter_type(filters, c):
    data = photo_png(filters, c)
    for mode in MODES:
        assert compare(data, mode) == "fast", (filters, c, mode)


def test_bases_decode_fast_or_fall_back_exactly():
    for i, data in enumerate(_bases()):
        for c in MODES:
            assert compare(data, c) in ("fast", "fallback"), (i, c)
    # The photo-like ones are the fast path's, in every mode.
    assert all(compare(_bases()[1], c) == "fast" for c in MODES)


def test_mutation_corpus_outcome_equals_tf():
    """3,000 damaged files x 3 colour modes: the same pixels as TF, or left to TF."""
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    wrong = []
    for name, data in corpus(_bases(), 3000, seed=21):
        how = name.split("_", 1)[1][:-4]
        for c in MODES:
            o = compare(data, c)
            outcomes[how][o] += 1
            if o not in ("fast", "fallback", "fallback-rejected"):
                wrong.append((name, c, o))
    assert not wrong, wrong[:20]
    assert set(outcomes) == set(MUTATIONS)
    # The corpus exercises both sides: files TF still decodes (trailing bytes,
    # dropped ancillary chunks...) that the fast path takes, and files TF rejects.
    total = sum(outcomes.values(), collections.Counter())
    assert total["fast"] > 500 and total["fallback-rejected"] > 3000, dict(total)
    # Checksums are on: no IDAT flip with a fixed CRC is decoded by Wuffs where TF refuses.
    assert outcomes["idat_flip"]["fallback-rejected"] > 500


def test_checksums_are_on():
    """A flipped bit in a compressed IDAT byte, the chunk CRC fixed: Wuffs must not
    hand back pixels (its aux API ignores PNG checksums unless told otherwise)."""
    assert refuses_flipped_idats(decode_png) > 100


def test_rgba_alpha_of_low_bit_depth_files_is_tfs(pngs):
    """TF's RGBA of a 1/2/4-bit grey or palette file without tRNS: alpha (1 << depth) - 1."""
    for kind, alpha in (("g01", 1), ("g02", 3), ("g04", 15), ("p01", 1), ("p04", 15),
                        ("g08", 255)):
        name = f"{kind}_i0_plain_13x11.png"
        got = decode_png((pngs / name).read_bytes(), 4)
        assert not isinstance(got, Fallback), name
        assert (got[:, :, 3] == alpha).all(), name


def test_keras_pixels_is_decode_image_or_names_the_file():
    """The stage: PNGs by Wuffs, the rest by TF; a file TF rejects is named."""
    from PIL import Image

    rng = np.random.default_rng(5)
    px = photo(rng, 30, 40)
    jpeg = io.BytesIO()
    Image.fromarray(px).save(jpeg, format="JPEG")
    tally = collections.Counter()

    class Tally:
        def add(self, what, n=1):
            tally[what] += n

    stage = KerasPixels(3, num_threads=2)
    good = encode_png(px, (4,))
    for data in (good, jpeg.getvalue(), encode_png(px, (4,), trns=b"\x00\x01\x00\x02\x00\x03")):
        ref = tf.image.decode_image(data, channels=3, expand_animations=False).numpy()
        np.testing.assert_array_equal(stage(data, "x", Tally()), ref)
    assert tally == {"png_fast": 1, "png_fallbacks": 1}
    with pytest.raises(CorruptImageError, match="broken.png"):
        stage(good[:-20], "broken.png", Tally())


def test_grey_weights_exact_for_every_colour():
    """The float32 grey conversion equals libpng's integer one on all 2**24 colours."""
    cube = np.stack(np.meshgrid(*[np.arange(256, dtype=np.uint32)] * 3, indexing="ij"), -1)
    cube = cube.reshape(4096, 4096, 3)
    want = (cube[:, :, 0] * 9797 + cube[:, :, 1] * 19234 + cube[:, :, 2] * 3737) >> 15
    np.testing.assert_array_equal(grey_from_rgb(cube.astype(np.uint8))[:, :, 0], want)
