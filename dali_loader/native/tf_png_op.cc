// DaliLoaderDecodePng: dali-loader's native PNG core (png_core.h) as a TF op.
// DaliLoaderDecodeEntries: a batch of GPU-ready cache entries, compact ones (entry_core.h)
// decoded by the same core, raw ones (a freshly filled image's pixels) copied, into one
// flat pixel buffer (see its Doc below).
//
// contents (a scalar string) -> image (uint8 [H, W, channels]), ok (bool).
// ok: the core decoded the file, and `image` holds exactly tf.io.decode_png's
// pixels. Not ok (not a PNG, a file the core leaves to libpng, a corrupt one,
// over `max_pixels`): `image` is an empty [0, 0, channels] tensor and the caller
// decodes the file with TF's own decoder (dali_loader/decode/tf_png.py), which
// gives TF's outcome and TF's error. The op itself never fails on bad bytes.
//
// CPU only, stateless. The output is allocated through TF's allocator once the
// header's plan is known, and decoded into in place: no other allocation per
// image here (the core reuses one work buffer per thread).

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

#include "entry_core.h"
#include "png_core.h"

namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::tstring;
namespace shape_inference = ::tensorflow::shape_inference;

REGISTER_OP("DaliLoaderDecodePng")
    .Input("contents: string")
    .Attr("channels: int = 3")
    .Attr("max_pixels: int = 268435456")
    .Output("image: uint8")
    .Output("ok: bool")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      int64_t channels;
      TF_RETURN_IF_ERROR(c->GetAttr("channels", &channels));
      c->set_output(0, c->MakeShape({c->UnknownDim(), c->UnknownDim(), c->MakeDim(channels)}));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Decodes a PNG with dali-loader's native core, exactly as tf.io.decode_png does,
or says it did not (ok=false, an empty [0, 0, channels] image): the caller then
decodes the file with TF's decoder.
)doc");

// The `max_pixels` attribute of both ops, which must be positive.
bool MaxPixels(OpKernelConstruction* context, uint64_t* out) {
  int64_t max_pixels = 0;
  absl::Status status = context->GetAttr("max_pixels", &max_pixels);
  if (status.ok() && max_pixels <= 0) {
    status = absl::InvalidArgumentError(
        absl::StrCat("max_pixels must be positive. Received: max_pixels=", max_pixels));
  }
  if (!status.ok()) {
    context->CtxFailure(__FILE__, __LINE__, status);
    return false;
  }
  *out = static_cast<uint64_t>(max_pixels);
  return true;
}

class DaliLoaderDecodePngOp : public OpKernel {
 public:
  explicit DaliLoaderDecodePngOp(OpKernelConstruction* context) : OpKernel(context) {
    int64_t channels;
    OP_REQUIRES_OK(context, context->GetAttr("channels", &channels));
    OP_REQUIRES(context, channels == 1 || channels == 3 || channels == 4,
                absl::InvalidArgumentError(absl::StrCat("channels must be 1, 3 or 4. Received: channels=",
                                        channels)));
    channels_ = static_cast<int>(channels);
    MaxPixels(context, &max_pixels_);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    OP_REQUIRES(context, TensorShapeUtils::IsScalar(input.shape()),
                absl::InvalidArgumentError(absl::StrCat("contents must be a scalar. Received shape: ",
                                        input.shape().DebugString())));
    const tstring& contents = input.scalar<tstring>()();
    const auto* data = reinterpret_cast<const uint8_t*>(contents.data());
    const size_t size = contents.size();

    Tensor* ok = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({}), &ok));
    ok->scalar<bool>()() = false;

    dl_png_plan plan;
    const char* reason = nullptr;
    if (dl_png_plan_decode(data, size, channels_, max_pixels_, &plan, &reason) == DL_PNG_OK &&
        static_cast<int>(plan.channels) == channels_) {
      // Planned: allocate the pixels through TF and decode into them. A file
      // Wuffs then refuses (a checksum, a short stream) leaves them unused.
      Tensor image;
      const TensorShape shape({static_cast<int64_t>(plan.height),
                               static_cast<int64_t>(plan.width),
                               static_cast<int64_t>(channels_)});
      OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_UINT8, shape, &image));
      const size_t out_size = static_cast<size_t>(image.NumElements());
      if (out_size == dl_png_output_size(&plan) &&
          dl_png_decode_into(data, size, &plan, image.flat<uint8_t>().data(), out_size,
                             &reason) == DL_PNG_OK) {
        context->set_output(0, image);
        ok->scalar<bool>()() = true;
        return;
      }
    }
    Tensor* empty = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({0, 0, static_cast<int64_t>(channels_)}), &empty));
  }

 private:
  int channels_ = 3;
  uint64_t max_pixels_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("DaliLoaderDecodePng").Device(DEVICE_CPU), DaliLoaderDecodePngOp);

REGISTER_OP("DaliLoaderDecodeEntries")
    .Input("entries: uint8")
    .Input("bounds: int64")
    .Input("offsets: int64")
    .Input("shapes: int32")
    .Input("total: int64")
    .Input("spread: int32")
    .Attr("max_pixels: int = 1073741824")
    .Attr("channels: int = 3")
    .Attr("filter: int = 1")
    .Attr("level: int = 1")
    .Attr("chunk_bytes: int = 65536")
    .Output("pixels: uint8")
    .Output("ok: bool")
    .Output("filled: uint8")
    .Output("filled_at: int64")
    .Output("filled_size: int64")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 0, &unused));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->Dim(c->input(2), 0)));
      c->set_output(2, c->Vector(c->UnknownDim()));
      c->set_output(3, c->Vector(c->Dim(c->input(2), 0)));
      c->set_output(4, c->Vector(c->Dim(c->input(2), 0)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Decodes n GPU-ready cache entries with dali-loader's native core.
Entry i is entries[bounds[i]:bounds[i+1]]; its header must say shapes[i] (HxWxC);
its pixels go to pixels[offsets[i]:offsets[i] + H*W*C] of a [total] uint8 output.
A compact entry ("DLZ1") is decoded; a raw one ("DLRW", its 16-byte header, then
exactly H*W*C bytes) is copied. A PNG (a file to fill the cache from) is decoded
by the core to `channels`, exactly as tf.io.decode_png, and written as a compact
entry (`filter`, `level`, `chunk_bytes`) into filled[filled_at[i]:filled_at[i] +
filled_size[i]] (size 0 for every other item, or where the entry could not be
written; `filled` is one flat buffer, in TF's pooled memory, with room for each
PNG's entry at its encode bound; the bytes past each entry's size are not written:
read only the entries). ok[i]: the item passed every check
(bounds, chunk table, zstd frames, the pixels' CRC-32; a raw entry's header and
size; a PNG the core decodes, of shapes[i]); where not, its pixels are zeros and
the caller replaces them (a PNG the core leaves to libpng, or a corrupt one).
spread > 1 splits the items over that many intra-op threads, raising the calling
thread's limit (tf.data's is one) while the op runs: for a batch that runs alone.
)doc");

// Decodes a PNG of shape (h, w, c) with the core into out[0:nbytes]; false when the
// core leaves it to libpng, refuses it, or it is not of that shape.
bool DecodePngAs(const uint8_t* data, size_t size, int64_t h, int64_t w, int64_t c,
                 uint64_t max_pixels, uint8_t* out, size_t nbytes) {
  dl_png_plan plan;
  const char* reason = nullptr;
  return dl_png_plan_decode(data, size, static_cast<int>(c), max_pixels, &plan, &reason) ==
             DL_PNG_OK &&
         plan.height == h && plan.width == w && plan.channels == c &&
         dl_png_output_size(&plan) == nbytes &&
         dl_png_decode_into(data, size, &plan, out, nbytes, &reason) == DL_PNG_OK;
}

// Writes HxWxC pixels as a compact entry into out[0:cap); its size, or 0 when it cannot.
int64_t EncodeEntry(const uint8_t* pixels, int64_t h, int64_t w, int64_t c, int filter,
                    int level, int chunk_bytes, uint8_t* out, size_t cap) {
  size_t size = 0;
  const char* reason = nullptr;
  return dl_entry_encode(pixels, h, w, c, filter, level, chunk_bytes, out, cap, &size,
                         &reason) == DL_ENTRY_OK
             ? static_cast<int64_t>(size)
             : 0;
}

bool IsPng(const uint8_t* data, size_t size) {
  return size >= 8 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
}

class DaliLoaderDecodeEntriesOp : public OpKernel {
 public:
  explicit DaliLoaderDecodeEntriesOp(OpKernelConstruction* context) : OpKernel(context) {
    MaxPixels(context, &max_pixels_);
    int64_t channels, filter, level, chunk_bytes;
    OP_REQUIRES_OK(context, context->GetAttr("channels", &channels));
    OP_REQUIRES_OK(context, context->GetAttr("filter", &filter));
    OP_REQUIRES_OK(context, context->GetAttr("level", &level));
    OP_REQUIRES_OK(context, context->GetAttr("chunk_bytes", &chunk_bytes));
    OP_REQUIRES(context, (channels == 1 || channels == 3 || channels == 4) &&
                             filter >= DL_FILTER_NONE && filter <= DL_FILTER_SUB &&
                             level >= -7 && level <= 22 && chunk_bytes >= 64 &&
                             chunk_bytes <= (1 << 30),
                absl::InvalidArgumentError(absl::StrCat(
                    "channels must be 1, 3 or 4, filter 0..2, level -7..22, chunk_bytes "
                    "64..2**30. Received: channels=", channels, ", filter=", filter,
                    ", level=", level, ", chunk_bytes=", chunk_bytes)));
    channels_ = channels;
    filter_ = static_cast<int>(filter);
    level_ = static_cast<int>(level);
    chunk_bytes_ = static_cast<int>(chunk_bytes);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& entries = context->input(0);
    const Tensor& bounds = context->input(1);
    const Tensor& offsets = context->input(2);
    const Tensor& shapes = context->input(3);
    const Tensor& total_t = context->input(4);
    const Tensor& spread_t = context->input(5);
    OP_REQUIRES(context, TensorShapeUtils::IsScalar(spread_t.shape()),
                absl::InvalidArgumentError(absl::StrCat("spread must be a scalar. Received: ",
                                                        spread_t.shape().DebugString())));
    const int spread = std::max<int32_t>(1, spread_t.scalar<int32_t>()());
    const int64_t n = offsets.NumElements();
    OP_REQUIRES(context, bounds.NumElements() == n + 1 && shapes.dim_size(0) == n &&
                             shapes.dim_size(1) == 3 && TensorShapeUtils::IsScalar(total_t.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "bounds must hold n + 1 values and shapes n x 3 for n offsets. Received: n=",
                    n, ", bounds ", bounds.shape().DebugString(), ", shapes ",
                    shapes.shape().DebugString())));
    const int64_t total = total_t.scalar<int64_t>()();
    const int64_t size = entries.NumElements();
    auto b = bounds.flat<int64_t>();
    auto o = offsets.flat<int64_t>();
    auto s = shapes.matrix<int32_t>();
    OP_REQUIRES(context, total >= 0, absl::InvalidArgumentError(absl::StrCat(
                                         "total must be >= 0. Received: total=", total)));
    // Every range in bounds before a byte is read or written.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t h = s(i, 0), w = s(i, 1), c = s(i, 2);
      const bool shape_ok = h > 0 && w > 0 && (c == 1 || c == 3 || c == 4) &&
                            h < (1 << 20) && w < (1 << 20);
      OP_REQUIRES(context,
                  b(i) >= 0 && b(i) <= b(i + 1) && b(i + 1) <= size && shape_ok && o(i) >= 0 &&
                      o(i) <= total && h * w * c <= total - o(i),
                  absl::InvalidArgumentError(absl::StrCat(
                      "entry ", i, " lies outside the batch's buffers. Received: bounds ", b(i),
                      "..", b(i + 1), " of ", size, ", offset ", o(i), ", shape ", h, "x", w,
                      "x", c, ", total ", total)));
    }
    Tensor* pixels = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({total}), &pixels));
    Tensor* ok = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({n}), &ok));
    const uint8_t* in = entries.flat<uint8_t>().data();
    // Room for each PNG's entry at its encode bound, in one buffer from TF's allocator
    // (pooled: no fresh pages per batch, and a zero-copy view in the store's numpy_function).
    Tensor* filled_at = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(3, TensorShape({n}), &filled_at));
    Tensor* filled_size = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(4, TensorShape({n}), &filled_size));
    auto at = filled_at->flat<int64_t>();
    auto sizes = filled_size->flat<int64_t>();
    int64_t room = 0;
    for (int64_t i = 0; i < n; ++i) {
      at(i) = room;
      sizes(i) = 0;
      if (s(i, 2) == channels_ && IsPng(in + b(i), static_cast<size_t>(b(i + 1) - b(i)))) {
        room += static_cast<int64_t>(dl_entry_encode_bound(s(i, 0), s(i, 1), s(i, 2),
                                                           chunk_bytes_));
      }
    }
    Tensor* filled = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({room}), &filled));
    uint8_t* fills = filled->flat<uint8_t>().data();
    uint8_t* out = pixels->flat<uint8_t>().data();
    bool* good = ok->flat<bool>().data();
    const uint64_t limit = max_pixels_;
    auto work = [&](int64_t start, int64_t end) {
      for (int64_t i = start; i < end; ++i) {
        const size_t nbytes = static_cast<size_t>(s(i, 0)) * s(i, 1) * s(i, 2);
        const uint8_t* entry = in + b(i);
        const size_t entry_size = static_cast<size_t>(b(i + 1) - b(i));
        bool done;
        if (IsPng(entry, entry_size)) {
          done = s(i, 2) == channels_ && DecodePngAs(entry, entry_size, s(i, 0), s(i, 1),
                                                     s(i, 2), limit, out + o(i), nbytes);
          const int64_t cap = (i + 1 < n ? at(i + 1) : room) - at(i);
          if (done && cap > 0) {
            sizes(i) = EncodeEntry(out + o(i), s(i, 0), s(i, 1), s(i, 2), filter_, level_,
                                   chunk_bytes_, fills + at(i), static_cast<size_t>(cap));
          }
        } else {  // a compact entry decoded, a raw one copied (entry_core.h)
          const char* reason = nullptr;
          done = dl_entry_decode_as(entry, entry_size, limit, s(i, 0), s(i, 1), s(i, 2),
                                    out + o(i), nbytes, &reason) == DL_ENTRY_OK;
        }
        if (!done) memset(out + o(i), 0, nbytes);
        good[i] = done;
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    // About 0.5 ms per 500x375 photo entry (a PNG to fill: about 3.5 ms): one item per
    // shard for large images. Shard() obeys the thread's limit (work_sharder.h), which
    // `spread` raises for this call only.
    const int64_t cost = n ? std::max<int64_t>(1000, total / n) : 1;
    if (spread > 1) {
      ::tensorflow::ScopedPerThreadMaxParallelism scoped(spread);
      ::tensorflow::Shard(std::min(spread, threads->num_threads), threads->workers, n, cost,
                          work);
    } else {
      ::tensorflow::Shard(threads->num_threads, threads->workers, n, cost, work);
    }
  }

 private:
  uint64_t max_pixels_ = 0;
  int64_t channels_ = 3;
  int filter_ = DL_FILTER_UP;
  int level_ = 1;
  int chunk_bytes_ = 65536;
};

REGISTER_KERNEL_BUILDER(Name("DaliLoaderDecodeEntries").Device(DEVICE_CPU),
                        DaliLoaderDecodeEntriesOp);

}  // namespace
