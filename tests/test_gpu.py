"""The GPU path: chosen automatically, same outputs as the CPU path.

The GPU tests run only where TensorFlow and DALI both see a CUDA GPU
(`make gpu-check-tf`) and are skipped cleanly elsewhere. The calibration test at the
end runs on the CPU: it checks that the JPEG tolerance used on the GPU is one a
missing fancy upsampling or an EXIF rotation would break.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from dali_loader.decode.devices import dali_gpu_count  # noqa: E402

needs_gpu = pytest.mark.skipif(
    not tf.config.list_physical_devices("GPU") or dali_gpu_count() == 0,
    reason="needs a CUDA GPU visible to both TensorFlow and DALI",
)

from support.helpers import run_fit_script  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

# JPEG, GPU vs CPU: mean absolute difference (0-255) allowed per image.
#
# The CPU path decodes with TF's libjpeg-turbo: fast integer IDCT, fancy (interpolated)
# chroma upsampling, EXIF orientation ignored. The GPU path decodes with nvJPEG
# (`mixed`), asked for fancy upsampling and no EXIF rotation; its IDCT and colour
# conversion are its own. Measured on the CPU on the images below (test at the end):
# another IDCT (libjpeg's accurate one, fancy on) moves them by about 1.1 levels; the
# same decode without fancy upsampling (what nvJPEG does by default: chroma replicated)
# by 8-14 levels at these sizes, and an EXIF rotation by 70+ levels. 3 levels lets the
# IDCT difference through and catches both bugs with a wide margin.
JPEG_TOLERANCE = 3.0
JPEG_SIZE = (96, 144)  # source size of the test JPEGs (non-square, so a rotation shows)
JPEG_OUTPUT_SIZES = [JPEG_SIZE, (48, 64)]  # decode differences unscaled, and downscaled


def chroma_photo(rng: np.random.Generator, h: int, w: int, cell: int = 5) -> np.ndarray:
    """A photo-like image with half its 5x5 cells in saturated colours: chroma edges
    that 4:2:0 subsampling blurs, where fancy and plain upsampling differ most."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([127 + 100 * np.sin(x / rng.uniform(5, 30)),
                     127 + 100 * np.cos(y / rng.uniform(5, 30)),
                     127 + 100 * np.sin((x + y) / rng.uniform(5, 30))], -1)
    base = np.clip(base + rng.normal(0, 6, base.shape), 0, 255)
    palette = np.array([[230, 20, 20], [20, 200, 30], [30, 40, 230],
                        [240, 220, 30], [200, 30, 200], [20, 210, 210]], np.float32)
    cells = ((h + cell - 1) // cell, (w + cell - 1) // cell)
    blocks = palette[rng.integers(0, len(palette), cells)]
    mask = rng.random(cells) < 0.5
    up = lambda a: a.repeat(cell, 0).repeat(cell, 1)[:h, :w]  # noqa: E731
    return np.where(up(mask)[..., None], up(blocks), base).astype(np.uint8)


# EXIF orientation per file: 6 and 8 rotate by 90 degrees, 3 by 180, 1 is the
# identity, None has no EXIF block at all.
JPEG_ORIENTATIONS = [6, 6, 8, 3, 1, None, None]


@pytest.fixture(scope="module")
def jpeg_tree(tmp_path_factory):
    """4:2:0 JPEGs (quality 90) with and without an EXIF orientation tag, 2 classes."""
    from PIL import Image, JpegImagePlugin

    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(7)
    for i, orientation in enumerate(JPEG_ORIENTATIONS):
        exif = Image.Exif()
        if orientation is not None:
            exif[0x0112] = orientation
        path = root / f"class_{i % 2}" / f"{i:02d}_orientation_{orientation}.jpg"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(chroma_photo(rng, *JPEG_SIZE)).save(
            path, "JPEG", quality=90, subsampling=2, exif=exif.tobytes())
        with Image.open(path) as im:
            assert JpegImagePlugin.get_sampling(im) == 2  # 4:2:0
            assert im.getexif().get(0x0112) == orientation
    return root


def _cpu_and_gpu(directory, **kw):
    args = dict(shuffle=False, batch_size=8, **kw)
    cpu = np.concatenate([x.numpy() for x, _ in ours(str(directory), device="cpu", **args)])
    gpu = np.concatenate([x.numpy() for x, _ in ours(str(directory), device="gpu", **args)])
    assert cpu.shape == gpu.shape and cpu.dtype == gpu.dtype
    return cpu.astype(np.float64), gpu.astype(np.float64)


@pytest.mark.gpu
@needs_gpu
def test_auto_device_is_gpu(photo_tree):
    ds = ours(str(photo_tree), image_size=(32, 32))
    assert ds.loader.device == "gpu"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kw", [{}, {"color_mode": "grayscale"}, {"crop_to_aspect_ratio": True},
                                {"pad_to_aspect_ratio": True}, {"color_mode": "rgba"}], ids=str)
def test_gpu_matches_cpu(photo_tree, kw):
    # PNGs: decoded on the CPU on both paths (nvImageCodec has no GPU PNG decoder),
    # resized on the GPU: the same pixels up to float rounding.
    cpu, gpu = _cpu_and_gpu(photo_tree, image_size=(48, 64), **kw)
    assert np.abs(cpu - gpu).mean() < 0.5


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("size", JPEG_OUTPUT_SIZES, ids=str)
@pytest.mark.parametrize("kw", [{}, {"color_mode": "grayscale"}, {"crop_to_aspect_ratio": True}],
                         ids=str)
def test_gpu_matches_cpu_on_jpeg_420_with_and_without_exif(jpeg_tree, kw, size):
    cpu, gpu = _cpu_and_gpu(jpeg_tree, image_size=size, **kw)
    assert len(cpu) == len(JPEG_ORIENTATIONS)
    per_image = np.abs(cpu - gpu).reshape(len(cpu), -1).mean(1)
    print(f"{kw} {size}: GPU vs CPU mean abs difference per image {per_image.round(2)}")
    assert (per_image < JPEG_TOLERANCE).all(), per_image


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("allocator", ["", "cuda_malloc_async"])
def test_fit_on_gpu_shares_memory_with_dali(photo_tree, allocator):
    code = f"""
import numpy as np, keras
from tf_adapter import image_dataset_from_directory
ds = image_dataset_from_directory({str(photo_tree)!r}, image_size=(64, 64), batch_size=8)
assert ds.loader.device == "gpu"
m = keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Conv2D(8, 3),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
h = m.fit(ds, epochs=2, verbose=0)
assert np.isfinite(h.history["loss"]).all()
print("fit-ok")
"""
    run_fit_script(code, allocator)


@pytest.mark.parametrize("size", JPEG_OUTPUT_SIZES, ids=str)
def test_jpeg_tolerance_catches_plain_upsampling_and_rotation(jpeg_tree, size):
    """CPU calibration of JPEG_TOLERANCE with TF's own decoder options as stand-ins:
    `dct_method="INTEGER_ACCURATE"` for a decoder with another IDCT, and
    `fancy_upscaling=False` for nvJPEG's default chroma upsampling."""
    def load(path, rotate=False, **decode_kw):
        img = tf.io.decode_jpeg(tf.io.read_file(str(path)), channels=3, **decode_kw)
        if rotate:
            img = tf.image.rot90(img, k=3)  # EXIF 6: 90 degrees clockwise
        return tf.image.resize(img, size).numpy()

    def diff(a, b):
        return float(np.abs(a - b).mean())

    paths = sorted(jpeg_tree.glob("*/*.jpg"))
    assert len(paths) == len(JPEG_ORIENTATIONS)
    for path in paths:
        ref = load(path)  # what Keras and the CPU path give
        other_idct = diff(load(path, dct_method="INTEGER_ACCURATE"), ref)
        plain = diff(load(path, dct_method="INTEGER_ACCURATE", fancy_upscaling=False), ref)
        rotated = diff(load(path, rotate=True), ref)
        print(f"{path.name} {size}: other IDCT {other_idct:.2f}, no fancy upsampling "
              f"{plain:.2f}, rotated {rotated:.1f}")
        assert other_idct < JPEG_TOLERANCE / 2
        assert plain > 2 * JPEG_TOLERANCE
        assert rotated > 10 * JPEG_TOLERANCE
