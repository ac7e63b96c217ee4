"""Formats: reading and writing bytes, with no policy and no I/O beyond a file's head.

The bottom layer under `storage/`, `feed/` and `decode/`; it imports nothing of
theirs (nor of `plan`, `tfdata` or the tools):

- `limits`: every pixel limit, named once, each with why it exists;
- `sniff`: what a file is by its magic bytes, and the image size its header claims;
- `png`: the one PNG chunk reader: signature, constants, depth tables, IHDR,
  chunk iteration, CRC, and `Fallback` (a file a decoder leaves to another);
- `ready`: the GPU-ready cache's pixel forms (compact, raw);
- `compact`: the compact entry form (delta-filtered zstd chunks), written and read
  by the native core through ctypes, with a numpy reference decode;
- `cache_entry`: the disk cache's entry header (magic, length, JSON fields).

What a consumer accepts, what falls back and which error it raises stays with
the consumer (`feed.checks`, `decode.png_cpu`,
`storage.cache`): only the reading is here.
"""
