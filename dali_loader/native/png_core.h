/* dali-loader's native PNG decode core: Wuffs behind the front end of
 * dali_loader/decode/png_cpu.py, with exactly tf.io.decode_png's outcome for
 * every file it takes, decoding into memory the caller owns.
 *
 * One core, three callers: the TF op (tf_png_op.cc), the DALI CPU operator
 * (dali_png_op.cc) and a C ABI for Python (ctypes) on the GPU-ready fill, diagnose
 * and bench. No allocation per image beyond one reused work buffer per thread.
 */
#ifndef DALI_LOADER_NATIVE_PNG_CORE_H_
#define DALI_LOADER_NATIVE_PNG_CORE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DL_PNG_OK = 0, DL_PNG_FALLBACK = 1 };

/* What the front end read and decided for one file. */
typedef struct {
  uint32_t width;
  uint32_t height;
  uint32_t channels;     /* the output's channels: 1, 3 or 4 */
  uint32_t depth;        /* IHDR bit depth */
  uint32_t color_type;   /* IHDR colour type */
  uint32_t interlace;    /* IHDR interlace method */
  uint32_t wuffs_format; /* internal: the pixel format Wuffs decodes to */
  uint32_t step;         /* internal: the post-step (png_cpu.plan's) */
} dl_png_plan;

/* Walks the chunks and plans a decode to `channels` (1, 3 or 4).
 * DL_PNG_OK: the core decodes it into dl_png_output_size(plan) bytes.
 * DL_PNG_FALLBACK: the file goes to TF's (or DALI's) decoder; *reason says why
 * (a static string). An image over `max_pixels` falls back before any
 * allocation is sized from its header; 0 means 1 << 28 (png_cpu.MAX_PIXELS). */
int dl_png_plan_decode(const uint8_t* data, size_t size, int channels,
                       uint64_t max_pixels, dl_png_plan* plan, const char** reason);

/* height * width * channels. */
size_t dl_png_output_size(const dl_png_plan* plan);

/* Decodes as planned into `out` (caller-owned, at least dl_png_output_size bytes),
 * HxWxC uint8, TF's pixels. DL_PNG_OK, or DL_PNG_FALLBACK with *reason
 * (Wuffs refused the data: a checksum, a short stream...): `out` is then
 * unspecified and the file goes to TF's decoder. Thread-safe. */
int dl_png_decode_into(const uint8_t* data, size_t size, const dl_png_plan* plan,
                       uint8_t* out, size_t out_size, const char** reason);

/* What the core has allocated and probed so far in this process (for tests and
 * diagnose): `buffers`, the per-thread work and staging buffers' mallocs (each
 * thread's grow once to its largest image, never per image); `cpu_probes`, the x86
 * feature probes Wuffs ran (CPUID; wuffs_impl.c: once per feature per process). */
typedef struct {
  uint64_t buffers;
  uint64_t cpu_probes;
} dl_png_counts;

void dl_png_get_counts(dl_png_counts* counts);

#ifdef __cplusplus
}
#endif

#endif /* DALI_LOADER_NATIVE_PNG_CORE_H_ */
