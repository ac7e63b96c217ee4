// DaliLoaderDecodePng: dali-loader's native PNG core (png_core.h) as a TF op.
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

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

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

class DaliLoaderDecodePngOp : public OpKernel {
 public:
  explicit DaliLoaderDecodePngOp(OpKernelConstruction* context) : OpKernel(context) {
    int64_t channels;
    OP_REQUIRES_OK(context, context->GetAttr("channels", &channels));
    OP_REQUIRES(context, channels == 1 || channels == 3 || channels == 4,
                absl::InvalidArgumentError(absl::StrCat("channels must be 1, 3 or 4. Received: channels=",
                                        channels)));
    channels_ = static_cast<int>(channels);
    int64_t max_pixels;
    OP_REQUIRES_OK(context, context->GetAttr("max_pixels", &max_pixels));
    OP_REQUIRES(context, max_pixels > 0,
                absl::InvalidArgumentError(absl::StrCat("max_pixels must be positive. Received: max_pixels=",
                                        max_pixels)));
    max_pixels_ = static_cast<uint64_t>(max_pixels);
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

}  // namespace
