/* dali-loader's GPU-ready cache entries decoded on a GPU (issue 38, item 4): compact
 * entries (entry_core.h) whose bytes already sit in device memory, decoded into device
 * memory with nvCOMP's batched Zstd (every chunk of a batch in one call), the row delta
 * undone by a kernel (one thread per byte column), and the pixels' CRC-32 checked with
 * nvCOMP's batched CRC32 (CRC-32/PKZIP: zlib's, which the header carries); raw entries
 * copied. Documented behaviour only:
 *   nvCOMP's C API, https://docs.nvidia.com/cuda/nvcomp/c_api.html (zstd.h, crc32.h: the
 *     batched decompression, its temp size and alignments, per-chunk statuses and sizes);
 *   the CUDA runtime's stream-ordered allocator and async copies,
 *     https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__MEMORY__POOLS.html.
 * Built by dali_loader/native/build_gpu.py where nvcc and nvCOMP's headers are found;
 * compiled in CI, never run there (no GPU): device_checks/compact_gpu_check runs it. */
#ifndef DALI_LOADER_NATIVE_ENTRY_GPU_H_
#define DALI_LOADER_NATIVE_ENTRY_GPU_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Head bytes a caller copies to the host first: a compact entry's header and a chunk
 * table of up to (DL_GPU_HEAD - 32) / 4 chunks (images up to about 66 MB); a larger
 * table is asked for again (dl_entry_gpu_need_head). */
enum { DL_GPU_HEAD = 4096 };

typedef struct {
  const uint8_t* entry; /* device: the entry's bytes */
  size_t size;          /* its length */
  const uint8_t* head;  /* host: its first head_size bytes */
  size_t head_size;
  uint8_t* out;         /* device: height * width * channels bytes */
  size_t out_size;
} dl_gpu_entry;

/* The head bytes entry `head` (of `entry_size` bytes) needs on the host: head_size when
 * they are at hand, more for a long chunk table (copy that many, then call again). */
size_t dl_entry_gpu_need_head(const uint8_t* head, size_t head_size, size_t entry_size);

/* The shape of an entry from its head (either form; compact: header and chunk table
 * checked, dl_entry_table_of). DL_ENTRY_OK or DL_ENTRY_BAD with *reason. */
int dl_entry_gpu_shape(const uint8_t* head, size_t head_size, size_t entry_size,
                       uint64_t max_pixels, uint32_t* height, uint32_t* width,
                       uint32_t* channels, const char** reason);

/* Decodes `n` entries on `stream` (a cudaStream_t) and waits for them: DL_ENTRY_OK with
 * every item's pixels in its `out`, or DL_ENTRY_BAD with *bad the first failing item
 * (-1: none in particular, a CUDA or nvCOMP failure) and *reason (static, or this
 * thread's last message). Thread-safe; allocates on the stream (cudaMallocAsync). */
int dl_entry_gpu_decode(const dl_gpu_entry* items, int n, uint64_t max_pixels, void* stream,
                        int* bad, const char** reason);

#ifdef __cplusplus
}
#endif

#endif /* DALI_LOADER_NATIVE_ENTRY_GPU_H_ */
