// GPU-ready cache entries decoded on a GPU, as a DALI GPU operator (issue 38, item 4).
//
// fn.dali_loader.entry_decode_gpu(entries, max_pixels=N) -> pixels, device="gpu"
//   entries: 1-D uint8 per sample in device memory (the cache's entries, `.gpu()`);
//   pixels:  HWC uint8 in device memory, the entry's pixels exactly (Keras's decode).
//
// Built only on documented behaviour: DALI's custom GPU operator
// (https://docs.nvidia.com/deeplearning/dali/user-guide/docs/examples/custom_operations/custom_operator/create_a_custom_operator.html:
// SetupImpl's return value says whether the executor allocates the outputs; false here,
// since the shapes are in the entries' headers, which sit in device memory: RunImpl copies
// each entry's head to the host on DALI's stream, sizes the output, then decodes with
// entry_gpu.h's core, nvCOMP's batched Zstd and CRC32 on that stream). The core waits
// for the batch (its statuses and CRCs decide whether the pixels are right), so the
// operator synchronises DALI's stream once per batch. Never run here (no GPU in this
// project's machines runs DALI): the plan uses it only when asked
// (`entry_decoder="gpu"`); device_checks/compact_gpu_check runs the core alone.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dali/pipeline/operator/operator.h"
#include "dali_loader/native/entry_core.h"
#include "dali_loader/native/entry_gpu.h"

namespace dali_loader {

class EntryDecodeGpu : public ::dali::Operator<::dali::GPUBackend> {
 public:
  explicit EntryDecodeGpu(const ::dali::OpSpec &spec)
      : ::dali::Operator<::dali::GPUBackend>(spec),
        max_pixels_(spec.GetArgument<int64_t>("max_pixels")) {
    DALI_ENFORCE(max_pixels_ > 0,
                 ::dali::make_string("`max_pixels` must be positive. Received: max_pixels=",
                                     max_pixels_));
  }

  ~EntryDecodeGpu() override {
    if (heads_ != nullptr) cudaFreeHost(heads_);
  }

  EntryDecodeGpu(const EntryDecodeGpu &) = delete;
  EntryDecodeGpu &operator=(const EntryDecodeGpu &) = delete;

 protected:
  bool SetupImpl(std::vector<::dali::OutputDesc> &output_desc,
                 const ::dali::Workspace &ws) override {
    return false;  // the shapes are in the entries' headers, on the device: RunImpl reads them
  }

  void RunImpl(::dali::Workspace &ws) override {
    const auto &input = ws.Input<::dali::GPUBackend>(0);
    DALI_ENFORCE(input.type() == DALI_UINT8,
                 ::dali::make_string("dali_loader.entry_decode_gpu takes the entries' bytes as "
                                     "uint8. Received: type=", input.type()));
    const int n = input.num_samples();
    cudaStream_t stream = ws.stream();
    std::vector<size_t> sizes(n), head_sizes(n);
    for (int i = 0; i < n; ++i) {
      const auto sample_shape = input.tensor_shape(i);
      DALI_ENFORCE(sample_shape.sample_dim() == 1,
                   ::dali::make_string("dali_loader.entry_decode_gpu takes 1-D samples. "
                                       "Received: shape=", sample_shape));
      sizes[i] = static_cast<size_t>(sample_shape[0]);
      head_sizes[i] = std::min<size_t>(sizes[i], DL_GPU_HEAD);
    }
    // Each entry's head (its header and, mostly, its whole chunk table), to the host.
    const size_t want = static_cast<size_t>(std::max(n, 1)) * DL_GPU_HEAD;
    if (want > heads_bytes_) {
      if (heads_ != nullptr) cudaFreeHost(heads_);
      heads_ = nullptr;
      heads_bytes_ = 0;
      CUDA_CALL(cudaMallocHost(reinterpret_cast<void **>(&heads_), want));
      heads_bytes_ = want;
    }
    for (int i = 0; i < n; ++i) {
      CUDA_CALL(cudaMemcpyAsync(heads_ + size_t{static_cast<size_t>(i)} * DL_GPU_HEAD,
                                input.raw_tensor(i), head_sizes[i], cudaMemcpyDeviceToHost,
                                stream));
    }
    CUDA_CALL(cudaStreamSynchronize(stream));
    std::vector<std::vector<uint8_t>> long_heads(n);
    std::vector<const uint8_t *> heads(n);
    for (int i = 0; i < n; ++i) {
      heads[i] = heads_ + size_t{static_cast<size_t>(i)} * DL_GPU_HEAD;
      const size_t need = dl_entry_gpu_need_head(heads[i], head_sizes[i], sizes[i]);
      if (need > head_sizes[i]) {  // a chunk table longer than DL_GPU_HEAD holds
        long_heads[i].resize(need);
        CUDA_CALL(cudaMemcpy(long_heads[i].data(), input.raw_tensor(i), need,
                             cudaMemcpyDeviceToHost));
        heads[i] = long_heads[i].data();
        head_sizes[i] = need;
      }
    }
    ::dali::TensorListShape<3> shape(n);
    for (int i = 0; i < n; ++i) {
      uint32_t h = 0, w = 0, c = 0;
      const char *reason = nullptr;
      DALI_ENFORCE(dl_entry_gpu_shape(heads[i], head_sizes[i], sizes[i],
                                      static_cast<uint64_t>(max_pixels_), &h, &w, &c,
                                      &reason) == DL_ENTRY_OK,
                   ::dali::make_string("A GPU-ready cache entry is damaged (", reason,
                                       "). Delete the cache folder's entries or fill them again "
                                       "(dali-loader prefetch --gpu-ready). Received: sample ", i,
                                       " of ", sizes[i], " bytes"));
      shape.set_tensor_shape(i, ::dali::TensorShape<3>(h, w, c));
    }
    auto &pixels = ws.Output<::dali::GPUBackend>(0);
    pixels.Resize(shape, DALI_UINT8);
    pixels.SetLayout("HWC");
    std::vector<dl_gpu_entry> items(n);
    for (int i = 0; i < n; ++i) {
      items[i] = {static_cast<const uint8_t *>(input.raw_tensor(i)), sizes[i], heads[i],
                  head_sizes[i], static_cast<uint8_t *>(pixels.raw_mutable_tensor(i)),
                  static_cast<size_t>(shape.tensor_size(i))};
    }
    int bad = -1;
    const char *reason = nullptr;
    DALI_ENFORCE(dl_entry_gpu_decode(items.data(), n, static_cast<uint64_t>(max_pixels_),
                                     stream, &bad, &reason) == DL_ENTRY_OK,
                 ::dali::make_string("A GPU-ready cache entry is damaged, or the GPU decode "
                                     "failed (", reason ? reason : "refused",
                                     "). Delete the cache folder's entries or fill them again "
                                     "(dali-loader prefetch --gpu-ready). Received: sample ",
                                     bad));
  }

 private:
  int64_t max_pixels_;
  uint8_t *heads_ = nullptr;  // pinned: n x DL_GPU_HEAD, kept from batch to batch
  size_t heads_bytes_ = 0;
};

}  // namespace dali_loader

DALI_REGISTER_OPERATOR(dali_loader__EntryDecodeGpu, ::dali_loader::EntryDecodeGpu, ::dali::GPU);

DALI_SCHEMA(dali_loader__EntryDecodeGpu)
    .DocStr(R"(Decodes dali-loader's GPU-ready cache entries, in device memory, into HWC
uint8 pixels in device memory: compact entries with nvCOMP's batched Zstd, the row
delta undone by a kernel and the pixels' CRC-32 checked (nvCOMP's batched CRC32); raw
entries copied. A damaged entry fails the batch, naming why.)")
    .NumInput(1)
    .NumOutput(1)
    .AddOptionalArg("max_pixels", "Refuse entries whose header claims more pixels.",
                    int64_t{1} << 30);
