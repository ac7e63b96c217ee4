/* A STAND-IN for png_core.cc (branch `native`), for the DALI operator's plumbing
 * until the core lands: it takes only 8-bit, non-interlaced PNGs whose colour type
 * is the output's (grey -> 1, RGB -> 3, RGBA -> 4) and have no tRNS, gAMA, sRGB,
 * iCCP or cHRM chunk (so no conversion), decodes them with libpng's simplified API,
 * and leaves every other file (DL_PNG_FALLBACK). Deleted when `native` is merged. */
#include <png.h>
#include <string.h>

#include "dali_loader/native/png_core.h"

static uint32_t be32(const uint8_t* p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

int dl_png_plan_decode(const uint8_t* data, size_t size, int channels, uint64_t max_pixels,
                       dl_png_plan* plan, const char** reason) {
  static const uint8_t sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
  *reason = "stub: not taken";
  if (size < 33 || memcmp(data, sig, 8) != 0 || memcmp(data + 12, "IHDR", 4) != 0)
    return DL_PNG_FALLBACK;
  memset(plan, 0, sizeof(*plan));
  plan->width = be32(data + 16);
  plan->height = be32(data + 20);
  plan->depth = data[24];
  plan->color_type = data[25];
  plan->interlace = data[28];
  plan->channels = (uint32_t)channels;
  static const int want[5] = {-1, 0, -1, 2, 6};
  if (plan->depth != 8 || plan->interlace != 0 || (int)plan->color_type != want[channels] ||
      plan->width == 0 || plan->height == 0 ||
      (uint64_t)plan->width * plan->height > max_pixels)
    return DL_PNG_FALLBACK;
  size_t pos = 8;
  while (pos + 12 <= size) {  /* no chunk that would ask for a conversion */
    uint32_t len = be32(data + pos);
    const uint8_t* type = data + pos + 4;
    if (!memcmp(type, "tRNS", 4) || !memcmp(type, "gAMA", 4) || !memcmp(type, "sRGB", 4) ||
        !memcmp(type, "iCCP", 4) || !memcmp(type, "cHRM", 4) || !memcmp(type, "sBIT", 4))
      return DL_PNG_FALLBACK;
    if (len > size - pos - 12) return DL_PNG_FALLBACK;
    if (!memcmp(type, "IEND", 4)) {
      if (len != 0 || pos + 12 != size) return DL_PNG_FALLBACK;
      break;
    }
    pos += 12 + (size_t)len;
  }
  if (pos + 12 != size) return DL_PNG_FALLBACK; /* no IEND, or bytes after it */
  *reason = NULL;
  return DL_PNG_OK;
}

size_t dl_png_output_size(const dl_png_plan* plan) {
  return (size_t)plan->height * plan->width * plan->channels;
}

int dl_png_decode_into(const uint8_t* data, size_t size, const dl_png_plan* plan, uint8_t* out,
                       size_t out_size, const char** reason) {
  png_image image;
  memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  *reason = "stub: libpng refused the data";
  if (!png_image_begin_read_from_memory(&image, data, size)) return DL_PNG_FALLBACK;
  image.format = plan->channels == 1 ? PNG_FORMAT_GRAY
                 : plan->channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  if (image.width != plan->width || image.height != plan->height ||
      out_size < dl_png_output_size(plan) ||
      !png_image_finish_read(&image, NULL, out, 0, NULL)) {
    png_image_free(&image);
    return DL_PNG_FALLBACK;
  }
  *reason = NULL;
  return DL_PNG_OK;
}
