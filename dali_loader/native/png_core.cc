// dali-loader's native PNG decode core (issue 27): the front end of
// dali_loader/decode/png_cpu.py in C++, and Wuffs' PNG decoder with its
// checksums on, decoding into memory the caller owns.
//
// Every rule here mirrors png_cpu.py (read_header, plan, decode_png); the tests
// (tests/test_png_native.py) check both give exactly tf.io.decode_png's outcome.
// Per thread: one Wuffs PNG decoder object and two grow-only buffers (Wuffs'
// work buffer, and the staging pixels of the post-steps that change the channel
// count), so a decode allocates nothing once a thread has seen its largest image.
// Wuffs itself is compiled in another object (build.py), with the same
// WUFFS_CONFIG__MODULES; this file includes only its declarations.

#include "png_core.h"

#include <stdlib.h>
#include <string.h>

#include "wuffs-unsupported-snapshot.c"

#define DL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr uint32_t kGrey = 0, kRgb = 2, kPalette = 3, kGreyAlpha = 4, kRgba = 6;
constexpr uint64_t kDefaultMaxPixels = 1ull << 28;  // png_cpu.MAX_PIXELS
constexpr uint32_t kGammaOne = 100000, kGammaSlack = 5000;
// Per-thread buffers bigger than this are freed after the image that needed them.
constexpr size_t kRetainBytes = size_t{96} << 20;

// Post-steps (png_cpu.plan's): how Wuffs' pixels become TF's `channels`.
enum Step : uint32_t {
  kAsDecoded = 0,     // Wuffs' format is the output
  kRgbOfRgba = 1,     // decode RGBA, keep RGB (TF drops alpha; Wuffs' RGB composites)
  kGreyOfRgb = 2,     // libpng's (9797 R + 19234 G + 3737 B) >> 15
  kFirstChannel = 3,  // a grey file's grey
  kLowDepthAlpha = 4, // RGBA of a 1/2/4-bit file without tRNS: alpha (1 << depth) - 1
};

inline uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

inline uint32_t fourcc(const char* s) { return be32(reinterpret_cast<const uint8_t*>(s)); }

// dl_png_get_counts' `buffers`.
uint64_t g_buffer_mallocs = 0;

// A grow-only buffer of uninitialised bytes.
struct Buffer {
  uint8_t* ptr = nullptr;
  size_t cap = 0;
  ~Buffer() { free(ptr); }
  uint8_t* get(size_t n) {
    if (n > cap) {
      free(ptr);
      ptr = static_cast<uint8_t*>(malloc(n ? n : 1));
      cap = ptr ? n : 0;
      __atomic_add_fetch(&g_buffer_mallocs, 1, __ATOMIC_RELAXED);
    }
    return ptr;
  }
  void trim() {
    if (cap > kRetainBytes) {
      free(ptr);
      ptr = nullptr;
      cap = 0;
    }
  }
};

// One per thread: Wuffs' decoders are not thread-safe.
// Wuffs' structs are heap-allocated at their real size (sizeof__*): without
// WUFFS_IMPLEMENTATION, its header pads them to keep them off the stack.
struct ThreadState {
  wuffs_png__decoder* dec = nullptr;
  wuffs_crc32__ieee_hasher* crc = nullptr;
  Buffer work, stage;
  ~ThreadState() {
    free(dec);
    free(crc);
  }
};

thread_local ThreadState t_state;

// CRC-32 of p[0:n] (Wuffs' SIMD hasher); false when out of memory.
bool crc32(const uint8_t* p, size_t n, uint32_t* crc) {
  ThreadState& st = t_state;
  if (st.crc == nullptr) {
    st.crc = static_cast<wuffs_crc32__ieee_hasher*>(malloc(sizeof__wuffs_crc32__ieee_hasher()));
    if (st.crc == nullptr) return false;
  }
  if (wuffs_crc32__ieee_hasher__initialize(st.crc, sizeof__wuffs_crc32__ieee_hasher(),
                                           WUFFS_VERSION, WUFFS_INITIALIZE__DEFAULT_OPTIONS).repr) {
    return false;
  }
  *crc = wuffs_crc32__ieee_hasher__update_u32(
      st.crc, wuffs_base__make_slice_u8(const_cast<uint8_t*>(p), n));
  return true;
}

// Whether p[0:n]'s CRC-32 is the big-endian uint32 at `want`.
bool crc_ok(const uint8_t* p, size_t n, const uint8_t* want) {
  uint32_t crc = 0;
  return crc32(p, n, &crc) && crc == be32(want);
}

bool depth_ok(uint32_t color, uint32_t depth) {
  switch (color) {
    case kGrey: return depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16;
    case kPalette: return depth == 1 || depth == 2 || depth == 4 || depth == 8;
    case kRgb: case kGreyAlpha: case kRgba: return depth == 8 || depth == 16;
    default: return false;
  }
}

// Chunks libpng reads the same way whatever Wuffs does with them (png_cpu._ANCILLARY).
bool ancillary(uint32_t kind) {
  static const char* const kNames[] = {"tRNS", "gAMA", "cHRM", "sRGB", "iCCP", "sBIT", "bKGD",
                                       "hIST", "pHYs", "sPLT", "tIME", "tEXt", "zTXt", "iTXt",
                                       "eXIf", "oFFs", "pCAL", "sCAL", "sTER"};
  for (const char* name : kNames) {
    if (kind == fourcc(name)) return true;
  }
  return false;
}

struct Header {
  uint32_t width, height, depth, color, interlace;
  bool trns, gamma_significant;
};

// png_cpu.read_header: IHDR first, known chunks only, every non-IDAT CRC checked,
// IEND last with nothing but trailing bytes after it. nullptr, or why not.
const char* read_header(const uint8_t* d, size_t n, uint64_t max_pixels, Header* h) {
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (d == nullptr || n < 45 || memcmp(d, kSig, 8) != 0) return "not a PNG, or too short";
  if (be32(d + 12) != fourcc("IHDR") || be32(d + 8) != 13 || !crc_ok(d + 12, 17, d + 29)) {
    return "IHDR missing or damaged";
  }
  h->width = be32(d + 16);
  h->height = be32(d + 20);
  h->depth = d[24];
  h->color = d[25];
  h->interlace = d[28];
  if (!depth_ok(h->color, h->depth) || d[26] || d[27] || h->interlace > 1 || h->width == 0 ||
      h->width >= (1u << 20) || h->height == 0 || h->height >= (1u << 20)) {
    return "IHDR out of range";
  }
  if (uint64_t{h->width} * h->height > max_pixels) return "larger than the fast decoder takes";
  // Adam7 one row high: its last pass with pixels is not the 7th, and Wuffs stops reading
  // the zlib stream once that pass is full, so a stream that goes on (more data, no end,
  // no Adler-32) would be decoded where libpng refuses it. libpng decides these.
  if (h->interlace && h->height == 1) return "an interlaced image one row high";
  h->trns = h->gamma_significant = false;
  bool seen_idat = false, idat_done = false, plte = false;
  size_t pos = 33;
  for (;;) {
    if (n - pos < 12) return "no IEND chunk";  // pos <= n always holds here
    const uint32_t length = be32(d + pos), kind = be32(d + pos + 4);
    if (length > 0x7FFFFFFFu || n - pos - 12 < length) return "a chunk runs past the end";
    const size_t end = pos + 12 + length;
    if (kind == fourcc("IDAT")) {
      if (idat_done) return "IDAT chunks are not consecutive";
      seen_idat = true;
    } else {
      if (seen_idat) idat_done = true;
      if (!crc_ok(d + pos + 4, length + 4, d + end - 4)) return "CRC mismatch in a chunk";
      if (kind == fourcc("IEND")) {
        return seen_idat && length == 0 ? nullptr : "IEND misplaced";
      }
      if (kind == fourcc("PLTE")) {
        if (plte || seen_idat || length % 3 || length == 0 || length > 768) {
          return "PLTE misplaced or malformed";
        }
        plte = true;
      } else if (ancillary(kind)) {
        if (seen_idat) return "an ancillary chunk after IDAT";
        if (kind == fourcc("tRNS")) {
          h->trns = true;
        } else if (kind == fourcc("gAMA")) {
          if (length != 4) {
            h->gamma_significant = true;
          } else {
            const uint32_t g = be32(d + pos + 8);
            const uint32_t off = g > kGammaOne ? g - kGammaOne : kGammaOne - g;
            if (off > kGammaSlack) h->gamma_significant = true;
          }
        } else if (kind == fourcc("sRGB") || kind == fourcc("iCCP")) {
          h->gamma_significant = true;
        }
      } else {
        return "a chunk that is left to libpng";
      }
    }
    pos = end;
  }
}

// png_cpu.plan: (Wuffs pixel format, post-step), or why not.
const char* plan_steps(const Header& h, int channels, uint32_t* fmt, uint32_t* step) {
  const bool colour = h.color == kRgb || h.color == kRgba || h.color == kPalette;
  const bool alpha = h.color == kGreyAlpha || h.color == kRgba || h.trns;
  constexpr uint32_t kRGB = WUFFS_BASE__PIXEL_FORMAT__RGB;
  constexpr uint32_t kRGBA = WUFFS_BASE__PIXEL_FORMAT__RGBA_NONPREMUL;
  if (h.trns && (h.color == kGrey || h.color == kRgb)) return "a tRNS colour key";
  switch (channels) {
    case 4:
      // Low depth without tRNS: Wuffs' RGBA (alpha 255) into the output, then TF's alpha.
      *fmt = kRGBA;
      *step = h.depth < 8 && !h.trns ? kLowDepthAlpha : kAsDecoded;
      return nullptr;
    case 3:
      *fmt = alpha ? kRGBA : kRGB;
      *step = alpha ? kRgbOfRgba : kAsDecoded;
      return nullptr;
    case 1:
      *fmt = alpha ? kRGBA : kRGB;
      if (!colour) {
        *step = kFirstChannel;
        return nullptr;
      }
      if (h.gamma_significant || h.depth == 16) {
        return "libpng converts this file to grey through gamma";
      }
      *step = kGreyOfRgb;
      return nullptr;
    default:
      return "channels must be 1, 3 or 4";
  }
}

uint32_t bytes_per_pixel(uint32_t fmt) {
  return fmt == WUFFS_BASE__PIXEL_FORMAT__RGB ? 3 : 4;
}

void post_step(uint32_t step, uint32_t depth, const uint8_t* src, uint32_t sbpp, uint8_t* out,
               size_t pixels) {
  switch (step) {
    case kRgbOfRgba:
      for (size_t i = 0; i < pixels; i++, src += 4, out += 3) {
        out[0] = src[0];
        out[1] = src[1];
        out[2] = src[2];
      }
      break;
    case kGreyOfRgb:
      for (size_t i = 0; i < pixels; i++, src += sbpp) {
        out[i] = static_cast<uint8_t>((9797u * src[0] + 19234u * src[1] + 3737u * src[2]) >> 15);
      }
      break;
    case kFirstChannel:
      for (size_t i = 0; i < pixels; i++, src += sbpp) out[i] = src[0];
      break;
    case kLowDepthAlpha: {  // in place: src == out, RGBA
      const uint8_t a = static_cast<uint8_t>((1u << depth) - 1);
      for (size_t i = 0; i < pixels; i++) out[4 * i + 3] = a;
      break;
    }
    default:
      break;
  }
}

}  // namespace

// wuffs_impl.c's count of the CPU probes run.
extern "C" uint64_t dl_wuffs_cpu_probes(void);

DL_EXPORT void dl_png_get_counts(dl_png_counts* counts) {
  if (counts == nullptr) return;
  counts->buffers = __atomic_load_n(&g_buffer_mallocs, __ATOMIC_RELAXED);
  counts->cpu_probes = dl_wuffs_cpu_probes();
}

DL_EXPORT int dl_png_plan_decode(const uint8_t* data, size_t size, int channels,
                                 uint64_t max_pixels, dl_png_plan* plan, const char** reason) {
  const char* why = nullptr;
  Header h;
  uint32_t fmt = 0, step = 0;
  if (plan == nullptr) {
    why = "no plan to fill";
  } else if (channels != 1 && channels != 3 && channels != 4) {
    why = "channels must be 1, 3 or 4";
  } else {
    why = read_header(data, size, max_pixels ? max_pixels : kDefaultMaxPixels, &h);
    if (why == nullptr) why = plan_steps(h, channels, &fmt, &step);
  }
  if (why != nullptr) {
    if (plan != nullptr) memset(plan, 0, sizeof *plan);
    if (reason != nullptr) *reason = why;
    return DL_PNG_FALLBACK;
  }
  plan->width = h.width;
  plan->height = h.height;
  plan->channels = static_cast<uint32_t>(channels);
  plan->depth = h.depth;
  plan->color_type = h.color;
  plan->interlace = h.interlace;
  plan->wuffs_format = fmt;
  plan->step = step;
  if (reason != nullptr) *reason = nullptr;
  return DL_PNG_OK;
}

DL_EXPORT size_t dl_png_output_size(const dl_png_plan* plan) {
  if (plan == nullptr) return 0;
  return size_t{plan->height} * plan->width * plan->channels;
}

DL_EXPORT int dl_png_decode_into(const uint8_t* data, size_t size, const dl_png_plan* plan,
                                 uint8_t* out, size_t out_size, const char** reason) {
  const char* why = nullptr;
  ThreadState& st = t_state;
  wuffs_png__decoder* dec = nullptr;
  wuffs_base__io_buffer src;
  wuffs_base__image_config ic;
  wuffs_base__pixel_config pc;
  wuffs_base__pixel_buffer pb;
  wuffs_base__status s;
  uint8_t* dst = nullptr;
  uint8_t* work = nullptr;
  uint64_t work_len = 0;
  size_t pixels = 0, dst_len = 0;
  uint32_t bpp = 0;
  bool direct = false;

  if (plan == nullptr || data == nullptr || out == nullptr || plan->width == 0 ||
      plan->height == 0 || plan->width >= (1u << 20) || plan->height >= (1u << 20) ||
      plan->step > kLowDepthAlpha ||
      (plan->wuffs_format != WUFFS_BASE__PIXEL_FORMAT__RGB &&
       plan->wuffs_format != WUFFS_BASE__PIXEL_FORMAT__RGBA_NONPREMUL)) {
    why = "not a plan from dl_png_plan_decode";
    goto fail;
  }
  if (out_size < dl_png_output_size(plan)) {
    why = "the output buffer is smaller than dl_png_output_size";
    goto fail;
  }
  if (st.dec == nullptr) {
    st.dec = static_cast<wuffs_png__decoder*>(malloc(sizeof__wuffs_png__decoder()));
    if (st.dec == nullptr) {
      why = "out of memory";
      goto fail;
    }
  }
  dec = st.dec;
  s = wuffs_png__decoder__initialize(dec, sizeof__wuffs_png__decoder(), WUFFS_VERSION,
                                     WUFFS_INITIALIZE__DEFAULT_OPTIONS);
  if (s.repr) goto wuffs_fail;
  // TF's libpng checks every IDAT CRC-32 and the zlib Adler-32.
  s = wuffs_png__decoder__set_quirk(dec, WUFFS_BASE__QUIRK_IGNORE_CHECKSUM, 0);
  if (s.repr) goto wuffs_fail;

  src = wuffs_base__ptr_u8__reader(const_cast<uint8_t*>(data), size, true);
  ic = wuffs_base__null_image_config();
  s = wuffs_png__decoder__decode_image_config(dec, &ic, &src);
  if (s.repr) goto wuffs_fail;
  if (wuffs_base__pixel_config__width(&ic.pixcfg) != plan->width ||
      wuffs_base__pixel_config__height(&ic.pixcfg) != plan->height) {
    why = "Wuffs decoded another size";
    goto fail;
  }

  pixels = size_t{plan->width} * plan->height;
  bpp = bytes_per_pixel(plan->wuffs_format);
  dst_len = pixels * bpp;
  // The formats that are the output's own decode straight into it.
  direct = plan->step == kAsDecoded || plan->step == kLowDepthAlpha;
  if (direct) {
    dst = out;
  } else if ((dst = st.stage.get(dst_len)) == nullptr) {
    why = "out of memory";
    goto fail;
  }
  pc = wuffs_base__null_pixel_config();
  wuffs_base__pixel_config__set(&pc, plan->wuffs_format, WUFFS_BASE__PIXEL_SUBSAMPLING__NONE,
                                plan->width, plan->height);
  s = wuffs_base__pixel_buffer__set_from_slice(&pb, &pc, wuffs_base__make_slice_u8(dst, dst_len));
  if (s.repr) goto wuffs_fail;

  work_len = wuffs_png__decoder__workbuf_len(dec).max_incl;
  // Wuffs' work buffer holds the filtered rows: (1 + w * bytes per pixel) h bytes, at
  // most 8 per pixel; Adam7's passes add a filter byte and a rounded byte per pass row.
  if (work_len > (uint64_t{plan->width} * 8 + 4) * plan->height + 64) {
    why = "Wuffs asked for a larger work buffer than the header allows";
    goto fail;
  }
  if ((work = st.work.get(static_cast<size_t>(work_len))) == nullptr) {
    why = "out of memory";
    goto fail;
  }
  s = wuffs_png__decoder__decode_frame_config(dec, nullptr, &src);
  if (s.repr) goto wuffs_fail;
  s = wuffs_png__decoder__decode_frame(dec, &pb, &src, WUFFS_BASE__PIXEL_BLEND__SRC,
                                       wuffs_base__make_slice_u8(work, work_len), nullptr);
  if (s.repr) goto wuffs_fail;

  post_step(plan->step, plan->depth, dst, bpp, out, pixels);
  st.work.trim();
  st.stage.trim();
  if (reason != nullptr) *reason = nullptr;
  return DL_PNG_OK;

wuffs_fail:
  // Wuffs' status strings are static.
  why = s.repr ? wuffs_base__status__message(&s) : "Wuffs failed";
fail:
  st.work.trim();
  st.stage.trim();
  if (reason != nullptr) *reason = why;
  return DL_PNG_FALLBACK;
}
