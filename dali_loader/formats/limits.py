"""The pixel limits, named in one place: each is a decision of one consumer, and why it exists.

A limit is read from an image's header (`sniff.image_size`), before any decoder
allocates the pixels it claims. Which consumer applies which limit, and what it
does with a file over it, is the consumer's (named beside each).
"""

from __future__ import annotations

import functools
import os

# The default `max_pixels=`: 2**30 pixels (32768 x 32768; 4 GiB decoded as RGBA).
# Keras decodes whatever fits in memory, so the default sits well above real
# images (a 20000 x 20000 photo is 0.4 * 2**30) and about 6x Pillow's bomb
# limit (178956970), yet refuses a header that claims billions of pixels
# before a decoder tries to allocate them. Refused as a bad file naming it
# (`feed.checks.size_problem`); `plan.Options.max_pixels` takes its default here.
DEFAULT_MAX_PIXELS = 1 << 30

# The native PNG core's envelope, 2**28 pixels (16384 x 16384): larger PNGs go to
# TF's (or DALI's) decoder, which decodes or refuses them as Keras would, before
# the core sizes any allocation from the header. The same default in the TF op's
# and the DALI operator's attribute, and in pywuffs' front end (`decode.png_cpu`).
# TF itself refuses PNGs and JPEGs of 2**29 pixels or more, on every read.
CORE_MAX_PIXELS = 1 << 28

# Compact GPU-ready cache entries (`formats.compact`, `native/entry_core.h`): the
# core refuses an entry whose header claims more pixels, before the caller sizes
# any allocation from it (a small hostile entry can claim a huge image: zstd
# frames of zeros are tiny). The default `max_pixels`: every entry the loader
# writes is of an image it accepted (TF refuses PNGs of 2**29 pixels or more).
ENTRY_MAX_PIXELS = DEFAULT_MAX_PIXELS

# Wuffs' own limit on a side: below 2**20. A larger side goes to TF's decoder.
WUFFS_SIDE_LIMIT = 1 << 20

# PNGs above this many pixels (about 8200 x 8200) are not decoded on the feed's
# threads: decoded pixels wait in the read-ahead window, where a few such images
# would take GBs, and a raw entry is more copies of them (the decoder's, the
# entry, DALI's). On the DALI path they stay checked bytes: on the CPU, TF decodes
# them as their batch enters DALI (one copy); on a GPU, DALI's decoder does
# (`decode.png_stage.big_png`).
BIG_PNG_PIXELS = 1 << 26


@functools.cache
def physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the OS does not say: no
    decoder gets an image whose decoded pixels would not fit in it (DALI's
    decoder would fail inside its pipeline: `feed.checks.decoder_header_problem`)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return None
