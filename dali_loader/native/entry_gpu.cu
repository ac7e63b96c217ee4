// Compact GPU-ready cache entries decoded on a GPU (entry_gpu.h says what and on which
// documented behaviour). One batch, on the caller's stream:
//   1. on the host, every entry's header and chunk table (entry_core: dl_entry_table_of)
//      becomes one row per chunk: where its zstd frame lies in device memory, its
//      filtered size, and where it lands in its image (chunk k at k * chunk_bytes);
//   2. a gather kernel copies every frame to an offset nvCOMP's input alignment allows
//      (an entry packs its frames back to back);
//   3. nvcompBatchedZstdDecompressAsync decodes every chunk of the batch in one call,
//      into a staging buffer laid out for nvCOMP's output alignment (an image in a
//      caller's batch may start anywhere);
//   4. a kernel undoes the filter from the staging buffer into the caller's images
//      ("Up": a running sum down each byte column, one thread per column; "Sub": along
//      each row; none: a copy);
//   5. nvcompBatchedCRC32Async checks each image against its header's CRC-32;
//   6. the per-chunk statuses and sizes and the CRCs come back to the host: any
//      mismatch fails the batch, naming the entry (never wrong pixels).
// Raw entries (a fill's pixels handed over) are copied device to device.

#include <cuda_runtime.h>
#include <nvcomp/crc32.h>
#include <nvcomp/zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "entry_core.h"
#include "entry_gpu.h"

#define DL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string t_message;

struct Image {
  const uint8_t* src;  // the filtered bytes (staging)
  uint8_t* p;          // the caller's pixels
  uint32_t h, row, c, filter;
};

inline uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

inline size_t round_up(size_t v, size_t a) { return a > 1 ? (v + a - 1) / a * a : v; }

// Element j of an array of T that starts at `base` (bytes copied back from the device).
template <typename T>
T At(const uint8_t* base, size_t j) {
  T v;
  memcpy(&v, base + j * sizeof(T), sizeof v);
  return v;
}

// Copies chunk j (one block each) from src[j] to dst[j]: bytes[j] bytes.
__global__ void Gather(const uint8_t* const* src, uint8_t* const* dst, const size_t* bytes,
                       size_t n) {
  for (size_t j = blockIdx.x; j < n; j += gridDim.x) {
    const uint8_t* s = src[j];
    uint8_t* d = dst[j];
    for (size_t k = threadIdx.x; k < bytes[j]; k += blockDim.x) d[k] = s[k];
  }
}

// Undoes each image's filter from its staging bytes into its pixels; image
// blockIdx.y + first.
__global__ void Unfilter(const Image* images, int first) {
  const Image im = images[first + blockIdx.y];
  const uint32_t step = gridDim.x * blockDim.x;
  if (im.filter == DL_FILTER_SUB) {  // along each row: one thread per row
    for (uint32_t r = blockIdx.x * blockDim.x + threadIdx.x; r < im.h; r += step) {
      const uint8_t* s = im.src + size_t{r} * im.row;
      uint8_t* q = im.p + size_t{r} * im.row;
      for (uint32_t j = 0; j < im.row; ++j) {
        q[j] = static_cast<uint8_t>(j < im.c ? s[j] : s[j] + q[j - im.c]);
      }
    }
    return;
  }
  // Up (a running sum down each byte column) or none (a copy): one thread per column.
  const bool up = im.filter == DL_FILTER_UP;
  for (uint32_t x = blockIdx.x * blockDim.x + threadIdx.x; x < im.row; x += step) {
    uint8_t acc = 0;
    for (uint32_t r = 0; r < im.h; ++r) {
      const size_t at = size_t{r} * im.row + x;
      acc = static_cast<uint8_t>(up ? acc + im.src[at] : im.src[at]);
      im.p[at] = acc;
    }
  }
}

// One batch's device memory, freed on the stream whatever happens.
struct Scratch {
  cudaStream_t stream;
  void* blob = nullptr;
  void* temp = nullptr;
  ~Scratch() {
    if (temp != nullptr) cudaFreeAsync(temp, stream);
    if (blob != nullptr) cudaFreeAsync(blob, stream);
  }
};

int Fail(const char* why, const char** reason) {
  if (reason != nullptr) *reason = why;
  return DL_ENTRY_BAD;
}

int CudaFail(cudaError_t e, const char* what, const char** reason) {
  t_message = std::string(what) + " failed: " + cudaGetErrorString(e);
  return Fail(t_message.c_str(), reason);
}

int NvcompFail(nvcompStatus_t s, const char* what, const char** reason) {
  t_message = std::string(what) + " failed: nvcompStatus_t " + std::to_string(int(s));
  return Fail(t_message.c_str(), reason);
}

}  // namespace

DL_EXPORT size_t dl_entry_gpu_need_head(const uint8_t* head, size_t head_size,
                                        size_t entry_size) {
  if (head == nullptr || head_size < DL_ENTRY_FIXED_HEADER || memcmp(head, "DLZ1", 4) != 0) {
    return head_size;
  }
  const size_t table = DL_ENTRY_FIXED_HEADER + 4 * size_t{le32(head + 24)};
  return std::max(head_size, std::min(entry_size, table));
}

DL_EXPORT int dl_entry_gpu_shape(const uint8_t* head, size_t head_size, size_t entry_size,
                                 uint64_t max_pixels, uint32_t* height, uint32_t* width,
                                 uint32_t* channels, const char** reason) {
  if (head == nullptr || height == nullptr || width == nullptr || channels == nullptr ||
      head_size > entry_size) {
    return Fail("bad arguments", reason);
  }
  if (head_size >= DL_RAW_ENTRY_HEADER && memcmp(head, "DLRW", 4) == 0) {
    // Reads the 16 header bytes only; the size check is against entry_size.
    return dl_entry_shape_of(head, entry_size, max_pixels, height, width, channels, reason);
  }
  dl_entry_info info;
  if (dl_entry_table_of(head, head_size, entry_size, max_pixels, &info, reason) != DL_ENTRY_OK) {
    return DL_ENTRY_BAD;
  }
  *height = info.height, *width = info.width, *channels = info.channels;
  if (reason != nullptr) *reason = nullptr;
  return DL_ENTRY_OK;
}

DL_EXPORT int dl_entry_gpu_decode(const dl_gpu_entry* items, int n, uint64_t max_pixels,
                                  void* stream_handle, int* bad, const char** reason) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  int unused = -1;
  if (bad == nullptr) bad = &unused;
  *bad = -1;
  if (n < 0 || (n > 0 && items == nullptr)) return Fail("bad arguments", reason);

  const nvcompBatchedZstdDecompressOpts_t zopts = nvcompBatchedZstdDecompressDefaultOpts;
  nvcompAlignmentRequirements_t align{1, 1, 1};
  nvcompStatus_t st = nvcompBatchedZstdDecompressGetRequiredAlignments(zopts, &align);
  if (st != nvcompSuccess) return NvcompFail(st, "nvcompBatchedZstdDecompressGetRequiredAlignments", reason);

  // 1. The batch's rows, on the host.
  std::vector<const uint8_t*> src;           // each chunk's frame, where its entry has it
  std::vector<size_t> comp_bytes, out_bytes;  // its frame's size, its filtered bytes
  std::vector<uint8_t*> out_at;              // where it lands
  std::vector<size_t> stage_at;              // its offset in the aligned stage
  std::vector<int> chunk_item;
  std::vector<Image> images;
  std::vector<uint32_t> want_crc;
  std::vector<int> image_item;
  size_t stage_bytes = 0, max_chunk = 0, total_out = 0, max_image = 0;
  for (int i = 0; i < n; ++i) {
    const dl_gpu_entry& it = items[i];
    uint32_t h = 0, w = 0, c = 0;
    const char* why = nullptr;
    if (it.entry == nullptr || it.out == nullptr ||
        dl_entry_gpu_shape(it.head, it.head_size, it.size, max_pixels, &h, &w, &c, &why) !=
            DL_ENTRY_OK) {
      *bad = i;
      return Fail(why != nullptr ? why : "bad arguments", reason);
    }
    const size_t total = size_t{h} * w * c;
    if (it.out_size < total) {
      *bad = i;
      return Fail("an output smaller than the entry's pixels", reason);
    }
    if (memcmp(it.head, "DLRW", 4) == 0) {  // a raw entry: its pixels as they are
      const cudaError_t e = cudaMemcpyAsync(it.out, it.entry + DL_RAW_ENTRY_HEADER, total,
                                            cudaMemcpyDeviceToDevice, stream);
      if (e != cudaSuccess) return CudaFail(e, "cudaMemcpyAsync (a raw entry)", reason);
      continue;
    }
    dl_entry_info info;
    dl_entry_table_of(it.head, it.head_size, it.size, max_pixels, &info, nullptr);
    if (info.chunk_bytes % align.output != 0) {
      *bad = i;
      return Fail("chunks whose size nvCOMP's output alignment does not allow", reason);
    }
    const size_t image_at = round_up(total_out, std::max<size_t>(align.output, 256));
    size_t at = DL_ENTRY_FIXED_HEADER + 4 * size_t{info.chunks};
    for (uint32_t k = 0; k < info.chunks; ++k) {
      const size_t csize = le32(it.head + DL_ENTRY_FIXED_HEADER + 4 * size_t{k});
      const size_t filtered =
          k + 1 < info.chunks ? info.chunk_bytes : total - size_t{info.chunk_bytes} * k;
      src.push_back(it.entry + at);
      comp_bytes.push_back(csize);
      out_bytes.push_back(filtered);
      out_at.push_back(reinterpret_cast<uint8_t*>(image_at + size_t{info.chunk_bytes} * k));
      stage_at.push_back(stage_bytes);
      chunk_item.push_back(i);
      stage_bytes = round_up(stage_bytes + csize, std::max<size_t>(align.input, 16));
      max_chunk = std::max(max_chunk, filtered);
      at += csize;
    }
    // `src` and `out_at` hold offsets in the staging buffer until its address is known.
    images.push_back({reinterpret_cast<const uint8_t*>(image_at), it.out, h, w * c, c,
                      info.filter});
    want_crc.push_back(info.crc32);
    image_item.push_back(i);
    total_out = image_at + total;
    max_image = std::max(max_image, total);
  }
  const size_t chunks = src.size(), m = images.size();
  if (chunks == 0) {  // raw entries only
    const cudaError_t e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? DL_ENTRY_OK : CudaFail(e, "cudaStreamSynchronize", reason);
  }

  // The device blob: [filtered bytes][frames][rows in][results out], aligned.
  const size_t frames_at = round_up(total_out, 256);
  size_t off = round_up(frames_at + stage_bytes, 256);
  const size_t in_at = off;
  auto place = [&off](size_t bytes) {
    const size_t at = off;
    off = round_up(off + bytes, 16);
    return at;
  };
  const size_t src_at = place(chunks * sizeof(void*)), dst_at = place(chunks * sizeof(void*));
  const size_t cbytes_at = place(chunks * sizeof(size_t));
  const size_t obytes_at = place(chunks * sizeof(size_t));
  const size_t outp_at = place(chunks * sizeof(void*));
  const size_t img_at = place(m * sizeof(Image));
  const size_t crcp_at = place(m * sizeof(void*)), crcb_at = place(m * sizeof(size_t));
  const size_t in_end = off;
  const size_t actual_at = place(chunks * sizeof(size_t));
  const size_t status_at = place(chunks * sizeof(nvcompStatus_t));
  const size_t crc_at = place(m * sizeof(uint32_t));
  const size_t crcst_at = place(m * sizeof(nvcompStatus_t));
  const size_t blob_bytes = off;

  Scratch scratch{stream};
  cudaError_t e = cudaMallocAsync(&scratch.blob, blob_bytes, stream);
  if (e != cudaSuccess) return CudaFail(e, "cudaMallocAsync (the batch's rows)", reason);
  uint8_t* blob = static_cast<uint8_t*>(scratch.blob);

  std::vector<uint8_t> rows(in_end - in_at);
  auto put = [&](size_t at, const void* data, size_t bytes) {
    if (bytes != 0) memcpy(rows.data() + (at - in_at), data, bytes);
  };
  std::vector<uint8_t*> dst(chunks);
  for (size_t j = 0; j < chunks; ++j) {
    dst[j] = blob + frames_at + stage_at[j];
    out_at[j] = blob + reinterpret_cast<uintptr_t>(out_at[j]);  // offset -> address
  }
  std::vector<void*> crc_ptrs(m);
  std::vector<size_t> crc_bytes(m);
  for (size_t k = 0; k < m; ++k) {
    images[k].src = blob + reinterpret_cast<uintptr_t>(images[k].src);
    crc_ptrs[k] = images[k].p;
    crc_bytes[k] = size_t{images[k].h} * images[k].row;
  }
  put(src_at, src.data(), chunks * sizeof(void*));
  put(dst_at, dst.data(), chunks * sizeof(void*));
  put(cbytes_at, comp_bytes.data(), chunks * sizeof(size_t));
  put(obytes_at, out_bytes.data(), chunks * sizeof(size_t));
  put(outp_at, out_at.data(), chunks * sizeof(void*));
  put(img_at, images.data(), m * sizeof(Image));
  put(crcp_at, crc_ptrs.data(), m * sizeof(void*));
  put(crcb_at, crc_bytes.data(), m * sizeof(size_t));
  // From pageable memory: returns once `rows` is staged (it may then go).
  e = cudaMemcpyAsync(blob + in_at, rows.data(), rows.size(), cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return CudaFail(e, "cudaMemcpyAsync (the batch's rows)", reason);

  // 2. The frames, aligned.
  Gather<<<static_cast<unsigned>(std::min<size_t>(chunks, 65535)), 256, 0, stream>>>(
      reinterpret_cast<const uint8_t* const*>(blob + src_at),
      reinterpret_cast<uint8_t* const*>(blob + dst_at),
      reinterpret_cast<const size_t*>(blob + cbytes_at), chunks);
  if ((e = cudaGetLastError()) != cudaSuccess) return CudaFail(e, "the gather kernel", reason);

  // 3. Every chunk of the batch in one call.
  size_t temp_bytes = 0;
  st = nvcompBatchedZstdDecompressGetTempSizeAsync(chunks, max_chunk, zopts, &temp_bytes,
                                                   total_out);
  if (st != nvcompSuccess) return NvcompFail(st, "nvcompBatchedZstdDecompressGetTempSizeAsync", reason);
  if (temp_bytes != 0) {
    e = cudaMallocAsync(&scratch.temp, round_up(temp_bytes, align.temp), stream);
    if (e != cudaSuccess) return CudaFail(e, "cudaMallocAsync (nvCOMP's temp)", reason);
  }
  st = nvcompBatchedZstdDecompressAsync(
      reinterpret_cast<const void* const*>(blob + dst_at),
      reinterpret_cast<const size_t*>(blob + cbytes_at),
      reinterpret_cast<const size_t*>(blob + obytes_at),
      reinterpret_cast<size_t*>(blob + actual_at), chunks, scratch.temp, temp_bytes,
      reinterpret_cast<void* const*>(blob + outp_at), zopts,
      reinterpret_cast<nvcompStatus_t*>(blob + status_at), stream);
  if (st != nvcompSuccess) return NvcompFail(st, "nvcompBatchedZstdDecompressAsync", reason);

  // 4. The filter undone, up to 65,535 images per launch (the grid's y limit).
  uint32_t widest = 0;
  for (const Image& im : images) widest = std::max(widest, std::max(im.row, im.h));
  const unsigned gx = static_cast<unsigned>(std::min<uint32_t>((widest + 255) / 256, 1024));
  for (size_t first = 0; first < m; first += 65535) {
    const unsigned gy = static_cast<unsigned>(std::min<size_t>(m - first, 65535));
    Unfilter<<<dim3(gx, gy), 256, 0, stream>>>(reinterpret_cast<const Image*>(blob + img_at),
                                                static_cast<int>(first));
  }
  if ((e = cudaGetLastError()) != cudaSuccess) return CudaFail(e, "the unfilter kernel", reason);

  // 5. Each image's CRC-32 (zlib's: nvCOMP's CRC-32/PKZIP preset).
  nvcompBatchedCRC32Opts_t copts;
  memset(&copts, 0, sizeof copts);
  copts.spec = nvcompCRC32;
  st = nvcompBatchedCRC32GetHeuristicConf(nvcompCRC32IgnoredInputChunkBytes, m,
                                          &copts.kernel_conf, max_image, stream);
  if (st != nvcompSuccess) return NvcompFail(st, "nvcompBatchedCRC32GetHeuristicConf", reason);
  st = nvcompBatchedCRC32Async(reinterpret_cast<const void* const*>(blob + crcp_at),
                               reinterpret_cast<const size_t*>(blob + crcb_at), m,
                               reinterpret_cast<uint32_t*>(blob + crc_at), copts,
                               nvcompCRC32OnlySegment,
                               reinterpret_cast<nvcompStatus_t*>(blob + crcst_at), stream);
  if (st != nvcompSuccess) return NvcompFail(st, "nvcompBatchedCRC32Async", reason);

  // 6. The verdicts.
  std::vector<uint8_t> back(blob_bytes - in_end);
  e = cudaMemcpyAsync(back.data(), blob + in_end, back.size(), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return CudaFail(e, "copying the batch's statuses back", reason);
  auto got = [&](size_t at) { return back.data() + (at - in_end); };
  for (size_t j = 0; j < chunks; ++j) {  // every chunk decoded to its own size
    if (At<nvcompStatus_t>(got(status_at), j) != nvcompSuccess ||
        At<size_t>(got(actual_at), j) != out_bytes[j]) {
      *bad = chunk_item[j];
      return Fail("a chunk nvCOMP's Zstd could not decode to its size", reason);
    }
  }
  for (size_t k = 0; k < m; ++k) {  // every image's pixels are the header's
    if (At<nvcompStatus_t>(got(crcst_at), k) != nvcompSuccess ||
        At<uint32_t>(got(crc_at), k) != want_crc[k]) {
      *bad = image_item[k];
      return Fail("pixels whose CRC-32 differs from the header's", reason);
    }
  }
  if (reason != nullptr) *reason = nullptr;
  return DL_ENTRY_OK;
}
