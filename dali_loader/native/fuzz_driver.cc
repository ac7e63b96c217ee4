// Fuzz driver of the native core: built with the core under ASan + UBSan by
// `python -m dali_loader.native.build --sanitize` (-> _build/asan/fuzz_driver).
//
// stdin: records, each a little-endian uint32 length then that many bytes (a file).
// Each file is planned and decoded in 1, 3 and 4 channels into a buffer of exactly
// dl_png_output_size bytes (so any overrun is a heap-buffer-overflow), with
// max_pixels from argv[1] (default 1 << 28). A sanitizer finding aborts the process
// (-fno-sanitize-recover=all). With argv[2] == "-v", one line per file and mode:
// "ok <CRC-32 of the pixels, as zlib.crc32>" or "fallback <reason>".
// With argv[3] == "entry", each file is a cache entry (entry_core.h) instead, compact or
// raw: the shape its header claims read, then dl_entry_decode_as into a buffer of
// exactly that size; one line per file ("ok <CRC-32>" or "fallback <reason>").
// Last line: "files N ok K fallback F".

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include <string.h>

#include "entry_core.h"
#include "png_core.h"

static uint32_t crc32(const uint8_t* p, size_t n) {
  static uint32_t table[256];
  if (table[1] == 0) {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
  }
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

int main(int argc, char** argv) {
  const uint64_t max_pixels = argc > 1 ? strtoull(argv[1], nullptr, 10) : (1ull << 28);
  const bool verbose = argc > 2 && argv[2][0] == '-' && argv[2][1] == 'v';
  const bool entries = argc > 3 && strcmp(argv[3], "entry") == 0;
  std::vector<uint8_t> data;
  uint64_t files = 0, ok = 0, fallback = 0;
  for (;;) {
    uint8_t len_bytes[4];
    if (fread(len_bytes, 1, 4, stdin) != 4) break;
    const uint32_t n = len_bytes[0] | (len_bytes[1] << 8) | (len_bytes[2] << 16) |
                       (uint32_t{len_bytes[3]} << 24);
    // An exact-size heap copy: reads past the end are caught too.
    uint8_t* file = static_cast<uint8_t*>(malloc(n ? n : 1));
    if (file == nullptr || fread(file, 1, n, stdin) != n) {
      fprintf(stderr, "short record\n");
      return 2;
    }
    files++;
    if (entries) {
      // The shape the entry claims (a raw one's header; a compact one's, checked), then
      // dl_entry_decode_as into exactly that many bytes, as the TF op decodes it.
      const char* reason = nullptr;
      uint32_t h = 0, w = 0, c = 0;
      int rc = DL_ENTRY_BAD;
      if (n >= DL_RAW_ENTRY_HEADER && memcmp(file, "DLRW", 4) == 0) {
        memcpy(&h, file + 4, 4);  // little-endian hosts only, as the loader
        memcpy(&w, file + 8, 4);
        memcpy(&c, file + 12, 4);
        rc = uint64_t{h} * w <= max_pixels && c <= 4 ? DL_ENTRY_OK : DL_ENTRY_BAD;
        if (rc != DL_ENTRY_OK) {  // its claimed shape is not allocated: a 1-byte buffer
          uint8_t byte = 0;
          if (dl_entry_decode_as(file, n, max_pixels, h, w, c, &byte, 0, &reason) ==
              DL_ENTRY_OK) {
            fprintf(stderr, "a raw entry of %ux%ux%u decoded into no buffer\n", h, w, c);
            return 3;
          }
        }
      } else {
        dl_entry_info info;
        rc = dl_entry_info_of(file, n, max_pixels, &info, &reason);
        h = info.height, w = info.width, c = info.channels;
        // The GPU path's check (no frame headers) takes every entry this one takes, with
        // the same header; cut before its chunk table, it asks for the table.
        dl_entry_info table;
        const char* table_reason = nullptr;
        const int trc = dl_entry_table_of(file, n, n, max_pixels, &table, &table_reason);
        if (rc == DL_ENTRY_OK && (trc != DL_ENTRY_OK || memcmp(&table, &info, sizeof info))) {
          fprintf(stderr, "dl_entry_table_of refused an entry dl_entry_info_of took\n");
          return 5;
        }
        if (trc != DL_ENTRY_OK && table_reason == nullptr) {
          fprintf(stderr, "dl_entry_table_of refused without a reason\n");
          return 5;
        }
        if (trc == DL_ENTRY_OK && n > DL_ENTRY_FIXED_HEADER &&
            dl_entry_table_of(file, DL_ENTRY_FIXED_HEADER, n, max_pixels, &table,
                              &table_reason) == DL_ENTRY_OK) {
          fprintf(stderr, "dl_entry_table_of took an entry without its chunk table\n");
          return 5;
        }
        if (rc == DL_ENTRY_OK && uint64_t{w} * h > max_pixels) {
          fprintf(stderr, "an entry of %ux%u over max_pixels\n", w, h);
          return 3;
        }
      }
      // dl_entry_shape_of (the DALI operator's) agrees: the same shape where it takes
      // the entry; what it refuses never decodes below.
      uint32_t sh = 0, sw = 0, sc = 0;
      const char* shape_reason = nullptr;
      const bool shaped =
          dl_entry_shape_of(file, n, max_pixels, &sh, &sw, &sc, &shape_reason) == DL_ENTRY_OK;
      if (shaped && (rc != DL_ENTRY_OK || sh != h || sw != w || sc != c)) {
        fprintf(stderr, "dl_entry_shape_of took an entry the header check did not\n");
        return 5;
      }
      if (!shaped && shape_reason == nullptr) {
        fprintf(stderr, "dl_entry_shape_of refused without a reason\n");
        return 5;
      }
      uint32_t hash = 0;
      if (rc == DL_ENTRY_OK) {
        const size_t size = size_t{h} * w * c;
        uint8_t* out = static_cast<uint8_t*>(malloc(size ? size : 1));
        rc = dl_entry_decode_as(file, n, max_pixels, h, w, c, out, size, &reason);
        if (rc == DL_ENTRY_OK) hash = crc32(out, size);
        free(out);
        if (rc == DL_ENTRY_OK && !shaped) {
          fprintf(stderr, "an entry dl_entry_shape_of refused decoded\n");
          return 5;
        }
        if (rc != DL_ENTRY_OK && shaped && memcmp(file, "DLRW", 4) == 0) {  // n >= 16: shaped
          fprintf(stderr, "a raw entry dl_entry_shape_of took was refused (%s)\n", reason);
          return 5;
        }
      }
      if (rc == DL_ENTRY_OK) {
        ok++;
      } else if (reason == nullptr) {
        fprintf(stderr, "a refused entry without a reason\n");
        return 4;
      } else {
        fallback++;
      }
      if (verbose) {
        if (rc == DL_ENTRY_OK) {
          printf("ok %08x\n", hash);
        } else {
          printf("fallback %s\n", reason);
        }
      }
      free(file);
      continue;
    }
    for (int channels : {1, 3, 4}) {
      dl_png_plan plan;
      const char* reason = nullptr;
      int rc = dl_png_plan_decode(file, n, channels, max_pixels, &plan, &reason);
      uint32_t hash = 0;
      if (rc == DL_PNG_OK) {
        const size_t size = dl_png_output_size(&plan);
        if (uint64_t{plan.width} * plan.height > max_pixels) {
          fprintf(stderr, "planned %ux%u over max_pixels\n", plan.width, plan.height);
          return 3;
        }
        uint8_t* out = static_cast<uint8_t*>(malloc(size));
        rc = dl_png_decode_into(file, n, &plan, out, size, &reason);
        if (rc == DL_PNG_OK) {
          hash = crc32(out, size);
        }
        free(out);
      }
      if (rc == DL_PNG_OK) {
        ok++;
      } else {
        fallback++;
        if (reason == nullptr) {
          fprintf(stderr, "a fallback without a reason\n");
          return 4;
        }
      }
      if (verbose) {
        if (rc == DL_PNG_OK) {
          printf("ok %08x\n", hash);
        } else {
          printf("fallback %s\n", reason);
        }
      }
    }
    free(file);
  }
  printf("files %llu ok %llu fallback %llu\n", static_cast<unsigned long long>(files),
         static_cast<unsigned long long>(ok), static_cast<unsigned long long>(fallback));
  return 0;
}
