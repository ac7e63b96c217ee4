"""The embedded sample dataset: photo-like PNGs in class subfolders.

Images are derived from pictures that ship inside matplotlib (``mpl-data/sample_data``):
Grace Hopper's portrait, two elevation maps rendered through colour maps, and a logo pasted on
the portrait. Each image is a random crop, flip, rescale and colour jitter of one source, with
mild sensor-like noise, so PNG sizes and decode cost resemble real ~500x375 photos (a few
hundred KB each). The output is fully determined by ``seed``.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence

import numpy as np

from dali_loader.args import positive_int

logger = logging.getLogger(__name__)

__all__ = ["make_sample_dataset", "source_images"]


def _require_pillow():
    try:
        from PIL import Image  # noqa: F401
    except ImportError as exc:  # pragma: no cover - environment dependent
        raise ImportError(
            "The sample dataset needs Pillow and matplotlib: `pip install pillow matplotlib`."
        ) from exc
    return Image


def source_images() -> list[np.ndarray]:
    """Returns the bundled source pictures as uint8 RGB arrays (H, W, 3).

    Raises:
        ImportError: when matplotlib or Pillow is missing.
    """
    Image = _require_pillow()
    try:
        import matplotlib
        import matplotlib.cbook as cbook
        from matplotlib import colormaps
    except ImportError as exc:  # pragma: no cover
        raise ImportError("The sample dataset needs matplotlib: `pip install matplotlib`.") from exc
    del matplotlib
    out: list[np.ndarray] = []
    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as im:
        hopper = np.asarray(im.convert("RGB"))
    out.append(hopper)

    def _cmap(field: np.ndarray, name: str, scale: int) -> np.ndarray:
        f = (field - field.min()) / max(float(np.ptp(field)), 1e-9)
        rgb = (colormaps[name](f)[..., :3] * 255).astype(np.uint8)
        h, w = rgb.shape[:2]
        return np.asarray(Image.fromarray(rgb).resize((w * scale, h * scale), Image.BICUBIC))

    dem = cbook.get_sample_data("jacksboro_fault_dem.npz")
    out.append(_cmap(np.asarray(dem["elevation"], dtype=np.float64), "gist_earth", 2))
    topo = cbook.get_sample_data("topobathy.npz")
    out.append(_cmap(np.asarray(topo["topo"], dtype=np.float64), "terrain", 6))

    # Logo pasted over the portrait: sharp edges and flat regions, like a photo of a sign.
    with Image.open(cbook.get_sample_data("logo2.png")) as logo:
        logo = logo.convert("RGBA")
        base = Image.fromarray(hopper).copy()
        base.paste(logo, (0, 200), logo)
    out.append(np.asarray(base.convert("RGB")))
    return out


def _make_one(
    src: np.ndarray, class_index: int, size: tuple[int, int], seed: int
) -> np.ndarray:
    """Makes one photo-like uint8 RGB image of ``size`` = (height, width)."""
    Image = _require_pillow()
    rng = np.random.default_rng(seed)
    h, w = size
    sh, sw = src.shape[:2]
    # Random crop covering 50-100% of the source, then rescale to the target size.
    frac = rng.uniform(0.5, 1.0)
    ch, cw = max(8, int(sh * frac)), max(8, int(sw * frac))
    y0 = int(rng.integers(0, sh - ch + 1))
    x0 = int(rng.integers(0, sw - cw + 1))
    crop = Image.fromarray(src[y0 : y0 + ch, x0 : x0 + cw])
    img = np.asarray(crop.resize((w, h), Image.BILINEAR), dtype=np.float32)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    # Colour jitter: a class-specific tint plus per-image gain, bias and channel gains.
    tint = np.array([np.cos(class_index * 2.1), np.cos(class_index * 2.1 + 2.1),
                     np.cos(class_index * 2.1 + 4.2)], dtype=np.float32) * 25.0
    gain = rng.uniform(0.8, 1.2) * rng.uniform(0.9, 1.1, size=3).astype(np.float32)
    img = img * gain + tint + rng.uniform(-15, 15)
    # Sensor-like noise keeps the PNG from compressing like a drawing.
    img += rng.normal(0.0, 4.0, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_sample_dataset(
    root: str | os.PathLike,
    num_images: int = 600,
    num_classes: int = 4,
    size: Sequence[int] = (375, 500),
    seed: int = 0,
    num_workers: int | None = None,
) -> str:
    """Writes ``num_images`` photo-like RGB PNGs into ``root/class_XX/`` folders.

    Args:
        root: output folder (created; existing files with the same names are overwritten).
        num_images: total number of images, spread round-robin over the classes.
        num_classes: number of class subfolders.
        size: (height, width) of every image.
        seed: makes the output deterministic.
        num_workers: encoder threads (default: all cores).

    Returns:
        ``root`` as a string.

    Raises:
        ValueError: on a non-positive count or size.
    """
    positive_int("num_images", num_images)
    positive_int("num_classes", num_classes)
    if len(size) != 2 or min(size) <= 0:
        raise ValueError(f"size must be (height, width) > 0. Received: size={size}")
    Image = _require_pillow()
    root = os.fspath(root)
    sources = source_images()
    for c in range(num_classes):
        os.makedirs(os.path.join(root, f"class_{c:02d}"), exist_ok=True)

    def work(i: int) -> None:
        c = i % num_classes
        src = sources[(c + (i // num_classes) % 2) % len(sources)]
        arr = _make_one(src, c, (int(size[0]), int(size[1])), seed * 1_000_003 + i)
        path = os.path.join(root, f"class_{c:02d}", f"img_{i:05d}.png")
        Image.fromarray(arr, "RGB").save(path, format="PNG")

    workers = num_workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(work, range(num_images)))
    logger.info("Wrote %d sample PNGs in %d classes to %s", num_images, num_classes, root)
    return root
