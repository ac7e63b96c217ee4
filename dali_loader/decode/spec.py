"""What one output image looks like: Keras's size, colour mode, interpolation and layout."""

from __future__ import annotations

import dataclasses

INTERPOLATIONS = (
    "bilinear",
    "nearest",
    "bicubic",
    "area",
    "lanczos3",
    "lanczos5",
    "gaussian",
    "mitchellcubic",
)


COLOR_MODES = {"rgb": 3, "rgba": 4, "grayscale": 1}


def channels_for(color_mode: str) -> int:
    """Channels of a Keras `color_mode`, with Keras's error for any other value."""
    channels = COLOR_MODES.get(color_mode)
    if channels is None:
        raise ValueError(
            '`color_mode` must be one of {"rgb", "rgba", "grayscale"}. '
            f"Received: color_mode={color_mode}"
        )
    return channels


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """What one output image looks like.

    Attributes:
        height: Output height.
        width: Output width.
        channels: 1 (grayscale), 3 (rgb) or 4 (rgba).
        interpolation: A Keras interpolation name.
        crop_to_aspect_ratio: Keras's `smart_resize` centre crop first.
        pad_to_aspect_ratio: `tf.image.resize_with_pad` instead of a stretch.
        channels_first: Output CHW instead of HWC.
    """

    height: int
    width: int
    channels: int = 3
    interpolation: str = "bilinear"
    crop_to_aspect_ratio: bool = False
    pad_to_aspect_ratio: bool = False
    channels_first: bool = False

    @property
    def output_uint8(self) -> bool:
        """Keras returns uint8 images for nearest (tf.image.resize keeps the dtype)."""
        return self.interpolation == "nearest"

    @property
    def shape(self) -> tuple[int, int, int]:
        """The per-image output shape."""
        if self.channels_first:
            return (self.channels, self.height, self.width)
        return (self.height, self.width, self.channels)
