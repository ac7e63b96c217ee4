"""The GPU-ready cache's pixel forms, under their old name: the codec is a format
(`formats.ready`). Kept for the importers in tfdata/ and the tests; new code
imports `dali_loader.formats.ready`."""

from dali_loader.formats.ready import (  # noqa: F401
    RAW_HEADER,
    RAW_MAGIC,
    STRIP_BYTES,
    TIFF_LEVEL,
    ReadyForm,
    decode,
    decode_raw,
    decode_tiff,
    encode,
    encode_parts,
    encode_raw,
    encode_tiff,
    join_parts,
    raw_header,
    raw_shape,
)
