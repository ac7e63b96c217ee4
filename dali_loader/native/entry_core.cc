// Compact GPU-ready cache entries (issue 38): the layout is in entry_core.h;
// dali_loader/formats/compact.py is the numpy reference of the same format.
//
// zstd comes from the single-file amalgamation of the `zstandard` sdist, compiled
// into the core by build.py with its symbols hidden (no clash with another libzstd
// in the process); Wuffs' SIMD CRC-32 checks the pixels.

#include "entry_core.h"

#include <stdlib.h>
#include <string.h>

#include "wuffs-unsupported-snapshot.c"
#include "zstd.h"

#define DL_EXPORT extern "C" __attribute__((visibility("default")))

// png_core.cc's CRC-32 (one hasher per thread for the whole core).
extern "C" bool dl_crc32_of(const uint8_t* p, size_t n, uint32_t* out);

namespace {

constexpr uint64_t kDefaultMaxPixels = 1ull << 30;  // formats.limits.ENTRY_MAX_PIXELS
constexpr uint32_t kMinChunk = 64, kMaxChunk = 1u << 30;
constexpr uint8_t kMagic[4] = {'D', 'L', 'Z', '1'};
constexpr uint8_t kVersion = 1;

inline uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

inline void put32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

struct ThreadState {
  ZSTD_DCtx* dctx = nullptr;
  ZSTD_CCtx* cctx = nullptr;
  uint8_t* stage = nullptr;
  size_t stage_cap = 0;
  ~ThreadState() {
    ZSTD_freeDCtx(dctx);
    ZSTD_freeCCtx(cctx);
    free(stage);
  }
  uint8_t* get_stage(size_t n) {
    if (n > stage_cap) {
      free(stage);
      stage = static_cast<uint8_t*>(malloc(n));
      stage_cap = stage ? n : 0;
    }
    return stage;
  }
};

thread_local ThreadState t_state;

// CRC-32 (zlib's) of p[0:n] (png_core.cc's, Wuffs' SIMD hasher); false when out of memory.
bool crc32_of(const uint8_t* p, size_t n, uint32_t* out) { return dl_crc32_of(p, n, out); }

// dst[k] += src[k] for k < n; dst and src do not overlap (the callers ensure it).
inline void add_into(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t n) {
  for (size_t k = 0; k < n; k++) dst[k] = static_cast<uint8_t>(dst[k] + src[k]);
}

// Un-filters out[a:b) in place; out[0:a) is already un-filtered.
void unfilter(uint32_t filter, uint8_t* out, size_t a, size_t b, size_t row, size_t channels) {
  if (filter == DL_FILTER_UP) {
    // out[i] += out[i - row] for i >= row, in pieces of at most one row (no overlap).
    for (size_t i = a > row ? a : row; i < b;) {
      const size_t n = b - i < row ? b - i : row;
      add_into(out + i, out + i - row, n);
      i += n;
    }
  } else if (filter == DL_FILTER_SUB) {
    // out[i] += out[i - channels] where i is at least one pixel into its row.
    for (size_t i = a; i < b;) {
      const size_t x = i % row;
      const size_t row_end = i - x + row < b ? i - x + row : b;
      if (x < channels) {
        i += channels - x < row_end - i ? channels - x : row_end - i;
        continue;
      }
      for (; i < row_end; i++) out[i] = static_cast<uint8_t>(out[i] + out[i - channels]);
    }
  }
}

// The filtered bytes p'[a:b) of the pixels p, into dst.
// dst[k] = x[k] - y[k] for k < n (mod 256): vectorised; dst overlaps neither source.
inline void diff_into(uint8_t* __restrict dst, const uint8_t* x, const uint8_t* y, size_t n) {
  for (size_t k = 0; k < n; k++) dst[k] = static_cast<uint8_t>(x[k] - y[k]);
}

// Filters p[a:b) into dst[0:b-a): "Up" subtracts the byte one row above (none in the
// first row), "Sub" the byte one pixel to the left (none in a row's first pixel).
void filter_range(uint32_t filter, const uint8_t* p, size_t a, size_t b, size_t row,
                  size_t channels, uint8_t* dst) {
  if (filter == DL_FILTER_UP) {
    const size_t head = a < row ? (b < row ? b : row) - a : 0;  // first-row bytes: as they are
    memcpy(dst, p + a, head);
    if (a + head < b) diff_into(dst + head, p + a + head, p + a + head - row, b - a - head);
  } else if (filter == DL_FILTER_SUB) {
    for (size_t i = a; i < b;) {
      const size_t start = i - i % row;  // the row's first byte
      const size_t end = start + row < b ? start + row : b;
      const size_t lead = start + channels < end ? start + channels : end;  // its first pixel
      if (i < lead) {
        memcpy(dst + (i - a), p + i, lead - i);
        i = lead;
      }
      if (i < end) diff_into(dst + (i - a), p + i, p + i - channels, end - i);
      i = end;
    }
  } else {
    memcpy(dst, p + a, b - a);
  }
}

bool shape_ok(uint32_t h, uint32_t w, uint32_t c) {
  return h > 0 && w > 0 && h < (1u << 20) && w < (1u << 20) && (c == 1 || c == 3 || c == 4);
}

// The header and chunk table of an entry of `n` bytes, of which d[0:avail) is at hand
// (avail <= n); with `frames` (then avail == n) each chunk's zstd frame header too.
const char* read_table(const uint8_t* d, size_t avail, size_t n, uint64_t max_pixels,
                       dl_entry_info* info, bool frames) {
  if (d == nullptr || avail > n || avail < DL_ENTRY_FIXED_HEADER || memcmp(d, kMagic, 4) != 0) {
    return "not a compact entry (no DLZ1 magic), or too short";
  }
  if (d[4] != kVersion) return "an entry version this build does not read";
  info->filter = d[5];
  info->codec = d[6];
  if (info->filter > DL_FILTER_SUB || info->codec != DL_CODEC_ZSTD || d[7] != 0) {
    return "an unknown filter or codec";
  }
  info->height = le32(d + 8);
  info->width = le32(d + 12);
  info->channels = le32(d + 16);
  info->chunk_bytes = le32(d + 20);
  info->chunks = le32(d + 24);
  info->crc32 = le32(d + 28);
  if (!shape_ok(info->height, info->width, info->channels)) return "a shape out of range";
  if (uint64_t{info->height} * info->width > (max_pixels ? max_pixels : kDefaultMaxPixels)) {
    return "more pixels than max_pixels";
  }
  if (info->chunk_bytes < kMinChunk || info->chunk_bytes > kMaxChunk) {
    return "a chunk size out of range";
  }
  const uint64_t total = uint64_t{info->height} * info->width * info->channels;
  if (info->chunks != (total + info->chunk_bytes - 1) / info->chunk_bytes) {
    return "a chunk count that does not match the shape";
  }
  const uint64_t header = DL_ENTRY_FIXED_HEADER + 4ull * info->chunks;
  if (n < header) return "cut short in its chunk table";
  if (avail < header) return "its chunk table is not at hand";
  uint64_t sum = 0;
  const uint8_t* src = d + header;
  for (uint32_t k = 0; k < info->chunks; k++) {
    const uint32_t csize = le32(d + DL_ENTRY_FIXED_HEADER + 4 * k);
    if (csize == 0 || csize > n - header - sum) return "a chunk runs past the end";
    const uint64_t want = k + 1 < info->chunks ? info->chunk_bytes
                                               : total - uint64_t{info->chunk_bytes} * k;
    if (frames && ZSTD_getFrameContentSize(src, csize) != want) {
      return "a chunk's zstd frame does not hold its bytes";
    }
    if (frames && ZSTD_findFrameCompressedSize(src, csize) != csize) {
      return "a chunk is not exactly one zstd frame";
    }
    sum += csize;
    src += csize;
  }
  if (sum != n - header) return "bytes after the last chunk";
  return nullptr;
}

const char* read_info(const uint8_t* d, size_t n, uint64_t max_pixels, dl_entry_info* info) {
  return read_table(d, n, n, max_pixels, info, true);
}

}  // namespace

DL_EXPORT uint32_t dl_crc32(const uint8_t* p, size_t n) {
  uint32_t crc = 0;
  return crc32_of(p, n, &crc) ? crc : 0;
}

DL_EXPORT int64_t dl_zstd_decompress_frame(const uint8_t* src, size_t n, uint8_t* dst,
                                           size_t cap) {
  ThreadState& st = t_state;
  if (src == nullptr || dst == nullptr || ZSTD_findFrameCompressedSize(src, n) != n) return -1;
  if (st.dctx == nullptr && (st.dctx = ZSTD_createDCtx()) == nullptr) return -1;
  const size_t got = ZSTD_decompressDCtx(st.dctx, dst, cap, src, n);
  return ZSTD_isError(got) ? -1 : static_cast<int64_t>(got);
}

DL_EXPORT int dl_entry_info_of(const uint8_t* data, size_t size, uint64_t max_pixels,
                               dl_entry_info* info, const char** reason) {
  dl_entry_info local;
  const char* why = read_info(data, size, max_pixels, info ? info : &local);
  if (reason != nullptr) *reason = why;
  if (why != nullptr && info != nullptr) memset(info, 0, sizeof *info);
  return why ? DL_ENTRY_BAD : DL_ENTRY_OK;
}

DL_EXPORT int dl_entry_decode_into(const uint8_t* data, size_t size, uint64_t max_pixels,
                                   uint8_t* out, size_t out_size, const char** reason) {
  dl_entry_info info;
  const char* why = read_info(data, size, max_pixels, &info);
  ThreadState& st = t_state;
  if (why == nullptr) {
    const size_t total = size_t{info.height} * info.width * info.channels;
    const size_t row = size_t{info.width} * info.channels;
    if (out == nullptr || out_size < total) {
      why = "the output buffer is smaller than the entry's pixels";
    } else if (st.dctx == nullptr && (st.dctx = ZSTD_createDCtx()) == nullptr) {
      why = "out of memory";
    } else {
      const uint8_t* src = data + DL_ENTRY_FIXED_HEADER + 4 * size_t{info.chunks};
      size_t at = 0;
      for (uint32_t k = 0; k < info.chunks && why == nullptr; k++) {
        const size_t csize = le32(data + DL_ENTRY_FIXED_HEADER + 4 * size_t{k});
        const size_t want = total - at < info.chunk_bytes ? total - at : info.chunk_bytes;
        const size_t got = ZSTD_decompressDCtx(st.dctx, out + at, want, src, csize);
        if (ZSTD_isError(got) || got != want) {
          why = "a chunk does not decompress to its bytes";
          break;
        }
        unfilter(info.filter, out, at, at + want, row, info.channels);
        at += want;
        src += csize;
      }
      uint32_t crc = 0;
      if (why == nullptr && (!crc32_of(out, total, &crc) || crc != info.crc32)) {
        why = "the pixels' CRC-32 does not match the entry's";
      }
    }
  }
  if (reason != nullptr) *reason = why;
  return why ? DL_ENTRY_BAD : DL_ENTRY_OK;
}

DL_EXPORT int dl_entry_table_of(const uint8_t* head, size_t head_size, size_t entry_size,
                                uint64_t max_pixels, dl_entry_info* info, const char** reason) {
  dl_entry_info got;
  const char* why = info == nullptr ? "bad arguments"
                                    : read_table(head, head_size, entry_size, max_pixels, &got,
                                                 false);
  if (why == nullptr) *info = got;
  if (reason != nullptr) *reason = why;
  return why ? DL_ENTRY_BAD : DL_ENTRY_OK;
}

DL_EXPORT int dl_entry_shape_of(const uint8_t* data, size_t size, uint64_t max_pixels,
                                uint32_t* height, uint32_t* width, uint32_t* channels,
                                const char** reason) {
  const char* why = nullptr;
  uint32_t h = 0, w = 0, c = 0;
  if (data == nullptr || height == nullptr || width == nullptr || channels == nullptr) {
    why = "bad arguments";
  } else if (size >= DL_RAW_ENTRY_HEADER && memcmp(data, "DLRW", 4) == 0) {
    h = le32(data + 4);
    w = le32(data + 8);
    c = le32(data + 12);
    if (!shape_ok(h, w, c)) {
      why = "a raw entry whose header says no image shape";
    } else if (uint64_t{h} * w > (max_pixels ? max_pixels : kDefaultMaxPixels)) {
      why = "a raw entry over max_pixels";
    } else if (size - DL_RAW_ENTRY_HEADER != uint64_t{h} * w * c) {
      why = "a raw entry whose size does not match its shape";
    }
  } else {
    dl_entry_info info;
    why = read_info(data, size, max_pixels, &info);
    h = info.height, w = info.width, c = info.channels;
  }
  if (why == nullptr) *height = h, *width = w, *channels = c;
  if (reason != nullptr) *reason = why;
  return why ? DL_ENTRY_BAD : DL_ENTRY_OK;
}

DL_EXPORT int dl_entry_decode_as(const uint8_t* data, size_t size, uint64_t max_pixels,
                                 uint32_t height, uint32_t width, uint32_t channels,
                                 uint8_t* out, size_t out_size, const char** reason) {
  const char* why = nullptr;
  const uint64_t total = uint64_t{height} * width * channels;
  if (data == nullptr || out == nullptr || !shape_ok(height, width, channels) ||
      out_size < total) {
    why = "bad arguments (the shape, or an output buffer smaller than its pixels)";
  } else if (size >= DL_RAW_ENTRY_HEADER && memcmp(data, "DLRW", 4) == 0) {
    if (le32(data + 4) != height || le32(data + 8) != width || le32(data + 12) != channels) {
      why = "a raw entry of another shape";
    } else if (size - DL_RAW_ENTRY_HEADER != total) {
      why = "a raw entry whose size does not match its shape";
    } else {
      memcpy(out, data + DL_RAW_ENTRY_HEADER, total);
    }
  } else {
    dl_entry_info info;
    why = read_info(data, size, max_pixels, &info);
    if (why == nullptr &&
        (info.height != height || info.width != width || info.channels != channels)) {
      why = "an entry of another shape";
    }
    if (why == nullptr) {
      return dl_entry_decode_into(data, size, max_pixels, out, out_size, reason);
    }
  }
  if (reason != nullptr) *reason = why;
  return why ? DL_ENTRY_BAD : DL_ENTRY_OK;
}

DL_EXPORT size_t dl_entry_encode_bound(uint32_t height, uint32_t width, uint32_t channels,
                                       uint32_t chunk_bytes) {
  if (!shape_ok(height, width, channels) || chunk_bytes < kMinChunk || chunk_bytes > kMaxChunk) {
    return 0;
  }
  const uint64_t total = uint64_t{height} * width * channels;
  const uint64_t chunks = (total + chunk_bytes - 1) / chunk_bytes;
  const uint64_t last = total - (chunks - 1) * chunk_bytes;
  return DL_ENTRY_FIXED_HEADER + 4 * chunks +
         (chunks - 1) * ZSTD_compressBound(chunk_bytes) + ZSTD_compressBound(last);
}

DL_EXPORT int dl_entry_encode(const uint8_t* pixels, uint32_t height, uint32_t width,
                              uint32_t channels, uint32_t filter, int level,
                              uint32_t chunk_bytes, uint8_t* out, size_t out_cap,
                              size_t* out_size, const char** reason) {
  const char* why = nullptr;
  ThreadState& st = t_state;
  const size_t bound = dl_entry_encode_bound(height, width, channels, chunk_bytes);
  const size_t total = size_t{height} * width * channels;
  const size_t row = size_t{width} * channels;
  const size_t chunks = bound ? (total + chunk_bytes - 1) / chunk_bytes : 0;
  uint32_t crc = 0;
  uint8_t* stage = nullptr;
  if (pixels == nullptr || out == nullptr || out_size == nullptr || bound == 0 ||
      filter > DL_FILTER_SUB || level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) {
    why = "bad arguments (shape, filter, level or chunk size)";
  } else if (out_cap < bound) {
    why = "the output buffer is smaller than dl_entry_encode_bound";
  } else if ((st.cctx == nullptr && (st.cctx = ZSTD_createCCtx()) == nullptr) ||
             (stage = st.get_stage(chunk_bytes)) == nullptr || !crc32_of(pixels, total, &crc)) {
    why = "out of memory";
  } else {
    memcpy(out, kMagic, 4);
    out[4] = kVersion;
    out[5] = static_cast<uint8_t>(filter);
    out[6] = DL_CODEC_ZSTD;
    out[7] = 0;
    put32(out + 8, height);
    put32(out + 12, width);
    put32(out + 16, channels);
    put32(out + 20, chunk_bytes);
    put32(out + 24, static_cast<uint32_t>(chunks));
    put32(out + 28, crc);
    size_t at = DL_ENTRY_FIXED_HEADER + 4 * chunks;
    for (size_t k = 0; k < chunks; k++) {
      const size_t a = k * chunk_bytes, b = a + chunk_bytes < total ? a + chunk_bytes : total;
      filter_range(filter, pixels, a, b, row, channels, stage);
      const size_t n = ZSTD_compressCCtx(st.cctx, out + at, out_cap - at, stage, b - a, level);
      if (ZSTD_isError(n)) {
        why = "zstd failed to compress a chunk";
        break;
      }
      put32(out + DL_ENTRY_FIXED_HEADER + 4 * k, static_cast<uint32_t>(n));
      at += n;
    }
    if (why == nullptr) *out_size = at;
  }
  if (reason != nullptr) *reason = why;
  return why ? DL_ENTRY_BAD : DL_ENTRY_OK;
}
