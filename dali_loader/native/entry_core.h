/* dali-loader's compact GPU-ready cache entries (issue 38): decoded pixels,
 * delta-filtered, in independent chunks of standard zstd frames, with a header
 * that says how to decode them and a CRC-32 of the pixels.
 *
 * Layout (little-endian; dali_loader/formats/compact.py writes and reads the same):
 *   0  "DLZ1"
 *   4  u8 version (1), u8 filter (0 none, 1 up: each row minus the row above,
 *      2 sub: each byte minus the byte one pixel to its left), u8 codec (1 zstd),
 *      u8 reserved (0)
 *   8  u32 height, 12 u32 width, 16 u32 channels (1, 3 or 4)
 *   20 u32 chunk_bytes: filtered bytes per chunk (the last chunk holds the rest)
 *   24 u32 chunks: ceil(height * width * channels / chunk_bytes)
 *   28 u32 CRC-32 (zlib's) of the HxWxC pixels
 *   32 chunks x u32: each chunk's compressed size
 *   then the chunks: each one zstd frame of its filtered bytes (any zstd decoder,
 *   nvCOMP's batched Zstd included, reads each alone).
 *
 * Everything is checked before a byte is written: sizes, bounds, each frame's
 * declared content size, one frame per chunk, and, after the decode, the CRC.
 * Thread-safe; one zstd context and CRC hasher per thread, reused.
 */
#ifndef DALI_LOADER_NATIVE_ENTRY_CORE_H_
#define DALI_LOADER_NATIVE_ENTRY_CORE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DL_ENTRY_OK = 0, DL_ENTRY_BAD = 1 };
enum { DL_FILTER_NONE = 0, DL_FILTER_UP = 1, DL_FILTER_SUB = 2 };
enum { DL_CODEC_ZSTD = 1 };
enum { DL_ENTRY_FIXED_HEADER = 32, DL_RAW_ENTRY_HEADER = 16 };

typedef struct {
  uint32_t height;
  uint32_t width;
  uint32_t channels;
  uint32_t filter;
  uint32_t codec;
  uint32_t chunk_bytes;
  uint32_t chunks;
  uint32_t crc32;
} dl_entry_info;

/* Reads and checks an entry's header and chunk table (and each chunk's zstd frame
 * header) without decompressing. DL_ENTRY_OK, or DL_ENTRY_BAD with *reason (a
 * static string). `max_pixels` 0 means 1 << 30 (formats.limits.ENTRY_MAX_PIXELS). */
int dl_entry_info_of(const uint8_t* data, size_t size, uint64_t max_pixels,
                     dl_entry_info* info, const char** reason);

/* Decodes an entry into `out` (caller-owned, at least height * width * channels
 * bytes): DL_ENTRY_OK with exactly the pixels written, or DL_ENTRY_BAD with
 * *reason (`out` then unspecified). */
int dl_entry_decode_into(const uint8_t* data, size_t size, uint64_t max_pixels,
                         uint8_t* out, size_t out_size, const char** reason);

/* dl_entry_info_of's checks of a compact entry of `entry_size` bytes whose first
 * `head_size` bytes are at `head` (its header and chunk table at least), without the
 * frames' own headers: for an entry whose payload lives elsewhere (a GPU's memory, where
 * nvCOMP's per-chunk statuses and the pixels' CRC-32 stand for them). */
int dl_entry_table_of(const uint8_t* head, size_t head_size, size_t entry_size,
                      uint64_t max_pixels, dl_entry_info* info, const char** reason);

/* The shape (height, width, channels) an entry of either form holds: a compact one's
 * checked header (dl_entry_info_of); a raw one's ("DLRW", then height, width, channels
 * as little-endian uint32, then exactly the pixels) once its shape is an image's, within
 * `max_pixels` (0: 1 << 30) and its size exact. DL_ENTRY_OK, or DL_ENTRY_BAD with
 * *reason (the outputs then untouched). The DALI operator sizes its output with it. */
int dl_entry_shape_of(const uint8_t* data, size_t size, uint64_t max_pixels, uint32_t* height,
                      uint32_t* width, uint32_t* channels, const char** reason);

/* Decodes an entry of either form that must hold height x width x channels pixels into
 * out[0:out_size] (at least that many bytes): a compact entry ("DLZ1") as
 * dl_entry_decode_into, once its header says that shape; a raw one (formats/ready.py:
 * "DLRW", then height, width, channels as little-endian uint32, then exactly the pixels)
 * copied, once its header says that shape and its size is exact. DL_ENTRY_OK with exactly
 * the pixels written, or DL_ENTRY_BAD with *reason. The TF op's per-entry decode. */
int dl_entry_decode_as(const uint8_t* data, size_t size, uint64_t max_pixels, uint32_t height,
                       uint32_t width, uint32_t channels, uint8_t* out, size_t out_size,
                       const char** reason);

/* The most bytes dl_entry_encode writes for these pixels (0: bad arguments). */
size_t dl_entry_encode_bound(uint32_t height, uint32_t width, uint32_t channels,
                             uint32_t chunk_bytes);

/* Writes HxWxC `pixels` as an entry into `out` (`out_cap` bytes, at least
 * dl_entry_encode_bound); *out_size its length. `level`: zstd's level. */
int dl_entry_encode(const uint8_t* pixels, uint32_t height, uint32_t width, uint32_t channels,
                    uint32_t filter, int level, uint32_t chunk_bytes, uint8_t* out,
                    size_t out_cap, size_t* out_size, const char** reason);

/* One zstd frame `src[0:n]` decompressed into dst[0:cap]: its length, or -1 when
 * it is not exactly one frame whose content fits (the numpy reference's zstd). */
int64_t dl_zstd_decompress_frame(const uint8_t* src, size_t n, uint8_t* dst, size_t cap);

/* CRC-32 (zlib's) of p[0:n]. */
uint32_t dl_crc32(const uint8_t* p, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* DALI_LOADER_NATIVE_ENTRY_CORE_H_ */
