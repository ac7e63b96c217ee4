// dali-loader's native PNG decoder as a DALI CPU operator (issue 27, the DALI path).
//
// fn.dali_loader.png_decode(encoded, channels=C, max_pixels=N) -> (pixels, ok)
//   (max_pixels: positive, default 2^28; a larger image is left, before any allocation)
//   encoded: 1-D uint8 per sample (a file's bytes, as external_source gives them).
//   pixels:  HWC uint8 with C channels: exactly tf.io.decode_png(channels=C)'s pixels
//            where ok; an empty [0, 0, C] sample where not.
//   ok:      a bool scalar per sample: false where the core steps aside (not a PNG,
//            a case it leaves to libpng, a file Wuffs refused). The graph then
//            decodes that sample with DALI's own decoder (dali_loader/decode/dali_graph.py).
//
// The core (png_core.h) plans each sample on the executor's thread in SetupImpl,
// which sizes the output, and decodes into DALI's output buffer on DALI's thread
// pool in RunImpl: no Python, no allocation per image beyond the core's per-thread
// work buffer. Built by dali_loader/native/build_dali.py against the installed DALI.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dali/pipeline/operator/operator.h"
#include "dali_loader/native/entry_core.h"
#include "dali_loader/native/png_core.h"

namespace dali_loader {

class PngDecode : public ::dali::Operator<::dali::CPUBackend> {
 public:
  explicit PngDecode(const ::dali::OpSpec &spec)
      : ::dali::Operator<::dali::CPUBackend>(spec),
        channels_(spec.GetArgument<int>("channels")),
        max_pixels_(spec.GetArgument<int64_t>("max_pixels")) {
    DALI_ENFORCE(channels_ == 1 || channels_ == 3 || channels_ == 4,
                 ::dali::make_string("`channels` must be 1, 3 or 4. Received: channels=",
                                     channels_));
    DALI_ENFORCE(max_pixels_ > 0,
                 ::dali::make_string("`max_pixels` must be positive. Received: max_pixels=",
                                     max_pixels_));
  }

  PngDecode(const PngDecode &) = delete;
  PngDecode &operator=(const PngDecode &) = delete;

 protected:
  // A sample the core leaves after planning it is resized to [0, 0, C] in RunImpl,
  // which a contiguous batch cannot do in place.
  bool HasContiguousOutputs() const override { return false; }

  bool SetupImpl(std::vector<::dali::OutputDesc> &output_desc,
                 const ::dali::Workspace &ws) override {
    const auto &input = ws.Input<::dali::CPUBackend>(0);
    DALI_ENFORCE(input.type() == DALI_UINT8,
                 ::dali::make_string("dali_loader.png_decode takes the files' bytes as uint8. "
                                     "Received: type=", input.type()));
    const int n = input.num_samples();
    const uint64_t limit = static_cast<uint64_t>(max_pixels_);
    plans_.resize(n);
    status_.assign(n, DL_PNG_FALLBACK);
    ::dali::TensorListShape<3> pixels_shape(n);
    for (int i = 0; i < n; ++i) {
      const auto sample_shape = input.tensor_shape(i);
      DALI_ENFORCE(sample_shape.sample_dim() == 1,
                   ::dali::make_string("dali_loader.png_decode takes 1-D samples (a file's "
                                       "bytes). Received: shape=", sample_shape));
      const auto *data = static_cast<const uint8_t *>(input.raw_tensor(i));
      const char *reason = nullptr;
      std::memset(&plans_[i], 0, sizeof(dl_png_plan));
      status_[i] = dl_png_plan_decode(data, static_cast<size_t>(sample_shape[0]), channels_,
                                      limit, &plans_[i], &reason);
      if (status_[i] == DL_PNG_OK && plans_[i].channels != static_cast<uint32_t>(channels_))
        status_[i] = DL_PNG_FALLBACK;  // never expected: the plan is for `channels_`
      if (status_[i] == DL_PNG_OK)
        pixels_shape.set_tensor_shape(
            i, ::dali::TensorShape<3>(plans_[i].height, plans_[i].width, channels_));
      else
        pixels_shape.set_tensor_shape(i, ::dali::TensorShape<3>(0, 0, channels_));
    }
    output_desc.resize(2);
    output_desc[0].shape = pixels_shape;
    output_desc[0].type = DALI_UINT8;
    output_desc[1].shape = ::dali::uniform_list_shape<0>(n, ::dali::TensorShape<0>());
    output_desc[1].type = DALI_BOOL;
    return true;
  }

  void RunImpl(::dali::Workspace &ws) override {
    const auto &input = ws.Input<::dali::CPUBackend>(0);
    auto &pixels = ws.Output<::dali::CPUBackend>(0);
    auto &ok = ws.Output<::dali::CPUBackend>(1);
    pixels.SetLayout("HWC");
    auto &pool = ws.GetThreadPool();
    const int n = input.num_samples();
    for (int i = 0; i < n; ++i) {
      if (status_[i] != DL_PNG_OK)
        continue;
      const size_t out_size = dl_png_output_size(&plans_[i]);
      pool.AddWork(
          [&, i, out_size](int) {
            const char *reason = nullptr;
            status_[i] = dl_png_decode_into(
                static_cast<const uint8_t *>(input.raw_tensor(i)),
                static_cast<size_t>(input.tensor_shape(i)[0]), &plans_[i],
                static_cast<uint8_t *>(pixels.raw_mutable_tensor(i)), out_size, &reason);
          },
          static_cast<int64_t>(out_size));
    }
    pool.RunAll();
    for (int i = 0; i < n; ++i) {
      const bool decoded = status_[i] == DL_PNG_OK;
      *static_cast<bool *>(ok.raw_mutable_tensor(i)) = decoded;
      if (!decoded && pixels.tensor_shape(i).num_elements() != 0)  // Wuffs refused the data
        pixels.ResizeSample(i, ::dali::TensorShape<3>(0, 0, channels_));
    }
  }

 private:
  int channels_;
  int64_t max_pixels_;
  std::vector<dl_png_plan> plans_;
  std::vector<int> status_;
};

// fn.dali_loader.entry_decode(entries, max_pixels=N) -> pixels
//   entries: 1-D uint8 per sample, a compact GPU-ready cache entry (entry_core.h).
//   pixels:  HWC uint8, the entry's pixels (Keras's, as the cache stored them).
// Headers are read and checked in SetupImpl (which sizes the output), the entries
// decoded into DALI's output buffer on DALI's thread pool in RunImpl. An entry the
// core refuses (torn, truncated, bit-flipped, not an entry) fails the batch with its
// reason: the feed checks each entry's header before it reaches DALI and refills a
// bad one, so only damage inside the compressed pixels gets here.
class EntryDecode : public ::dali::Operator<::dali::CPUBackend> {
 public:
  explicit EntryDecode(const ::dali::OpSpec &spec)
      : ::dali::Operator<::dali::CPUBackend>(spec),
        max_pixels_(spec.GetArgument<int64_t>("max_pixels")) {
    DALI_ENFORCE(max_pixels_ > 0,
                 ::dali::make_string("`max_pixels` must be positive. Received: max_pixels=",
                                     max_pixels_));
  }

  EntryDecode(const EntryDecode &) = delete;
  EntryDecode &operator=(const EntryDecode &) = delete;

 protected:
  bool SetupImpl(std::vector<::dali::OutputDesc> &output_desc,
                 const ::dali::Workspace &ws) override {
    const auto &input = ws.Input<::dali::CPUBackend>(0);
    DALI_ENFORCE(input.type() == DALI_UINT8,
                 ::dali::make_string("dali_loader.entry_decode takes the entries' bytes as "
                                     "uint8. Received: type=", input.type()));
    const int n = input.num_samples();
    ::dali::TensorListShape<3> shape(n);
    for (int i = 0; i < n; ++i) {
      const auto sample_shape = input.tensor_shape(i);
      DALI_ENFORCE(sample_shape.sample_dim() == 1,
                   ::dali::make_string("dali_loader.entry_decode takes 1-D samples. Received: "
                                       "shape=", sample_shape));
      uint32_t h = 0, w = 0, c = 0;
      const char *reason = nullptr;
      DALI_ENFORCE(dl_entry_shape_of(static_cast<const uint8_t *>(input.raw_tensor(i)),
                                     static_cast<size_t>(sample_shape[0]),
                                     static_cast<uint64_t>(max_pixels_), &h, &w, &c,
                                     &reason) == DL_ENTRY_OK,
                   ::dali::make_string("A GPU-ready cache entry is damaged (", reason,
                                       "). Delete the cache folder's entries or fill them again "
                                       "(dali-loader prefetch --gpu-ready). Received: sample ", i,
                                       " of ", sample_shape[0], " bytes"));
      shape.set_tensor_shape(i, ::dali::TensorShape<3>(h, w, c));
    }
    output_desc.resize(1);
    output_desc[0].shape = shape;
    output_desc[0].type = DALI_UINT8;
    return true;
  }

  void RunImpl(::dali::Workspace &ws) override {
    const auto &input = ws.Input<::dali::CPUBackend>(0);
    auto &pixels = ws.Output<::dali::CPUBackend>(0);
    pixels.SetLayout("HWC");
    auto &pool = ws.GetThreadPool();
    const int n = input.num_samples();
    reasons_.assign(n, nullptr);
    for (int i = 0; i < n; ++i) {
      const size_t out_size = pixels.tensor_shape(i).num_elements();
      pool.AddWork(
          [&, i, out_size](int) {
            const char *reason = nullptr;
            const auto hwc = pixels.tensor_shape(i);
            if (dl_entry_decode_as(static_cast<const uint8_t *>(input.raw_tensor(i)),
                                   static_cast<size_t>(input.tensor_shape(i)[0]),
                                   static_cast<uint64_t>(max_pixels_),
                                   static_cast<uint32_t>(hwc[0]), static_cast<uint32_t>(hwc[1]),
                                   static_cast<uint32_t>(hwc[2]),
                                   static_cast<uint8_t *>(pixels.raw_mutable_tensor(i)),
                                   out_size, &reason) != DL_ENTRY_OK)
              reasons_[i] = reason ? reason : "refused";
          },
          static_cast<int64_t>(out_size));
    }
    pool.RunAll();
    for (int i = 0; i < n; ++i) {
      DALI_ENFORCE(reasons_[i] == nullptr,
                   ::dali::make_string("A GPU-ready cache entry is damaged (", reasons_[i],
                                       "). Delete the cache folder's entries or fill them again "
                                       "(dali-loader prefetch --gpu-ready). Received: sample ", i));
    }
  }

 private:
  int64_t max_pixels_;
  std::vector<const char *> reasons_;
};

}  // namespace dali_loader

DALI_REGISTER_OPERATOR(dali_loader__EntryDecode, ::dali_loader::EntryDecode, ::dali::CPU);

DALI_SCHEMA(dali_loader__EntryDecode)
    .DocStr(R"(Decodes dali-loader's GPU-ready cache entries into HWC uint8 pixels with
the native core: a compact entry (delta-filtered pixels in zstd chunks, with a CRC-32)
decoded, a raw one (its 16-byte header, then exactly the pixels: a fill's pixels
handed over as they are) copied. A damaged entry fails the batch, naming why.)")
    .NumInput(1)
    .NumOutput(1)
    .AddOptionalArg("max_pixels", "Refuse entries whose header claims more pixels.",
                    int64_t{1} << 30);

DALI_REGISTER_OPERATOR(dali_loader__PngDecode, ::dali_loader::PngDecode, ::dali::CPU);

DALI_SCHEMA(dali_loader__PngDecode)
    .DocStr(R"(Decodes PNGs with dali-loader's native core (Wuffs, exactly
tf.io.decode_png's pixels). Returns (pixels, ok): HWC uint8 pixels with `channels`
channels, and a bool scalar per sample, false where the core left the sample (not a
PNG, a case it leaves to libpng, or data Wuffs refused); such a sample's pixels are
empty ([0, 0, channels]) and it is for another decoder.)")
    .NumInput(1)
    .NumOutput(2)
    .AddArg("channels", "Output channels: 1, 3 or 4 (like tf.io.decode_png).", DALI_INT32)
    .AddOptionalArg("max_pixels",
                    "Leave images whose header claims more pixels (the core's envelope, "
                    "and the TF op's default: 2^28).",
                    int64_t{1} << 28);
