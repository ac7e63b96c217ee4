"""The DALI graph: encoded bytes in, Keras-shaped image batches out.

Decode, colour conversion, crop/pad to aspect ratio and resize, written so the
pixels match `tf.io.decode_image` + `tf.image.resize` (what Keras does) and the
integer crop/pad geometry is Keras's own arithmetic. On a GPU the decoder is
`mixed` (JPEG decodes on the GPU; PNG is decoded on the CPU by nvImageCodec and
uploaded) and resize runs on the GPU. With `png_native`, PNGs are decoded by the
native core's DALI CPU operator (`dali_png`) and the files it leaves by DALI's
decoder on the CPU, in a per-sample branch; on a GPU the pixels are then uploaded.
"""

from __future__ import annotations

import os
from typing import Any

from dali_loader.decode import dali_png
from dali_loader.formats.ready import RAW_HEADER, RAW_MAGIC, decode_raw
from dali_loader.decode.spec import ImageSpec
from dali_loader.lazy import import_dali
from dali_loader.plan import DaliInput


# What the graph's encoded input holds: named by the plan (`plan.DaliInput`).
Input = DaliInput


def _interp(dali, name: str) -> tuple[Any, bool]:
    """DALI's filter for a Keras interpolation. bilinear, nearest, bicubic and
    lanczos3 match TF's; the others are the closest DALI filter (the measured
    differences are in docs/parity.md)."""
    t = dali.types
    table = {
        "bilinear": (t.INTERP_LINEAR, False),
        "nearest": (t.INTERP_NN, False),
        "bicubic": (t.INTERP_CUBIC, False),
        "area": (t.INTERP_LINEAR, True),
        "lanczos3": (t.INTERP_LANCZOS3, False),
        "lanczos5": (t.INTERP_LANCZOS3, False),
        "gaussian": (t.INTERP_GAUSSIAN, False),
        "mitchellcubic": (t.INTERP_CUBIC, False),
    }
    return table[name]


def _to_gray(dali, rgb):
    """RGB -> 1 channel with libpng's integer weights (what TF's PNG decoder uses):
    0.299 and 0.587 truncated to 9797 and 19234 of 32768, blue the rest (3737),
    so a grey pixel (R == G == B) keeps its value, as in libpng."""
    fn, t = dali.fn, dali.types
    x = fn.cast(rgb, dtype=t.INT32)
    r = x[:, :, 0:1]
    g = x[:, :, 1:2]
    b = x[:, :, 2:3]
    return fn.cast((r * 9797 + g * 19234 + b * 3737) // 32768, dtype=t.UINT8)


def _to_rgba(dali, any_img):
    """Any decoded channel count -> RGBA, like `decode_png(channels=4)`."""
    fn, t = dali.fn, dali.types
    c = any_img.shape(dtype=t.INT32)[2]
    opaque = fn.cast(any_img[:, :, 0:1] * 0 + 255, dtype=t.UINT8)
    if c == 1:
        out = fn.cat(any_img, any_img, any_img, opaque, axis=2)
    elif c == 2:
        g = any_img[:, :, 0:1]
        out = fn.cat(g, g, g, any_img[:, :, 1:2], axis=2)
    elif c == 3:
        out = fn.cat(any_img, opaque, axis=2)
    else:
        out = any_img[:, :, 0:4]
    return out


def _crop_box(dali, img, th: int, tw: int):
    """Keras `smart_resize`'s centre crop: int32/float32 arithmetic, truncating."""
    fn, t, math = dali.fn, dali.types, dali.math
    sh = img.shape(dtype=t.INT32)
    h, w = sh[0], sh[1]
    f32 = t.FLOAT

    def trunc(x):
        return fn.cast(math.floor(x), dtype=t.INT32)

    ch = trunc(fn.cast(w * th, dtype=f32) / float(tw))
    ch = math.max(math.min(h, ch), 1)
    cw = trunc(fn.cast(h * tw, dtype=f32) / float(th))
    cw = math.max(math.min(w, cw), 1)
    y0 = trunc(fn.cast(h - ch, dtype=f32) / 2.0)
    x0 = trunc(fn.cast(w - cw, dtype=f32) / 2.0)
    return fn.slice(
        img, start=fn.stack(y0, x0), shape=fn.stack(ch, cw), axes=[0, 1],
        out_of_bounds_policy="error",
    )


def _pad_geometry(dali, img, th: int, tw: int):
    """`tf.image.resize_with_pad`'s float32 geometry: resized size and offsets."""
    fn, t, math = dali.fn, dali.types, dali.math
    sh = img.shape(dtype=t.FLOAT)
    h, w = sh[0], sh[1]
    ratio = math.max(w / float(tw), h / float(th))
    rh_f, rw_f = h / ratio, w / ratio
    rh, rw = math.floor(rh_f), math.floor(rw_f)
    ph = math.max(0.0, math.floor((float(th) - rh_f) / 2.0))
    pw = math.max(0.0, math.floor((float(tw) - rw_f) / 2.0))
    return fn.stack(rh, rw), fn.stack(ph, pw)


def _decode(dali, encoded, gpu: bool, output_type):
    """`fn.decoders.image` configured like TF's decoders.

    - `adjust_orientation=False`: TF (and so Keras) ignores the EXIF orientation
      tag; DALI would rotate/flip by it.
    - `use_fast_idct=True`: TF's `decode_jpeg` default is libjpeg's fast integer
      IDCT (JDCT_IFAST); with it DALI's CPU (libjpeg-turbo) decode of a JPEG is
      bit-identical to TF's. On the GPU it only affects JPEGs that nvJPEG hands
      back to the CPU.
    - `jpeg_fancy_upsampling=True` on the GPU: libjpeg (TF, and DALI's CPU
      decoder, which ignores the flag) interpolates subsampled chroma ("fancy
      upsampling"); nvJPEG by default replicates it, which differs at colour
      edges. The flag only matters for the `mixed` decoder.
    """
    kw = dict(output_type=output_type, adjust_orientation=False, use_fast_idct=True)
    if gpu:
        return dali.fn.decoders.image(encoded, device="mixed", jpeg_fancy_upsampling=True, **kw)
    return dali.fn.decoders.image(encoded, device="cpu", **kw)


def raw_pixels(dali, entry):
    """HWC uint8 pixels of `formats.ready.ReadyForm.RAW` entries (1-D uint8): the
    header's height, width and channels, the rest reshaped. Nothing is decoded."""
    fn, t = dali.fn, dali.types
    hwc = fn.cast(fn.reinterpret(fn.slice(entry, start=[4], shape=[12], axes=[0]),
                                 dtype=t.UINT32), dtype=t.INT32)
    size = hwc[0:1] * hwc[1:2] * hwc[2:3]
    pixels = fn.slice(entry, start=[RAW_HEADER], shape=size, axes=[0])
    return fn.reshape(pixels, shape=hwc, layout="HWC")


def _decode_file(dali, encoded, channels: int, gpu: bool):
    """A file's bytes -> HWC uint8 in `channels`, on the graph's device."""
    t = dali.types
    if channels == 4:
        img = _to_rgba(dali, _decode(dali, encoded, gpu=False, output_type=t.ANY_DATA))
        return img.gpu() if gpu else img
    img = _decode(dali, encoded, gpu=gpu, output_type=t.RGB)
    return _to_gray(dali, img) if channels == 1 else img


def _raw_on_device(dali, entry, gpu: bool):
    img = raw_pixels(dali, entry)
    return img.gpu() if gpu else img


def _is_raw(dali, encoded):
    """Per sample: whether the bytes start with `formats.ready.RAW_MAGIC` (no image
    format DALI decodes starts so)."""
    fn, t = dali.fn, dali.types
    head = fn.cast(fn.slice(encoded, start=[0], shape=[4], axes=[0],
                            out_of_bounds_policy="pad", fill_values=0), dtype=t.INT32)
    magic = [int(b) for b in RAW_MAGIC]
    return ((head[0] == magic[0]) & (head[1] == magic[1]) & (head[2] == magic[2])
            & (head[3] == magic[3]))


def _has_pixels(dali, pixels):
    """Per sample: whether the host-pixel input holds an image (else it is empty)."""
    return pixels.shape(dtype=dali.types.INT32)[0] > 0


def _native_or_decoded(dali, encoded, native, channels: int, gpu: bool):
    """Per sample: the native operator's pixels where it decoded the file, else DALI's
    decoder (every other format, and every PNG the core leaves, keeps DALI's outcome
    and errors); then the copy to the GPU. A per-sample branch of CPU operators only,
    as `Input.FILES_OR_RAW`'s (the documentation linked in `_input_pixels`)."""
    px, ok = native
    if ok:
        img = px
    else:
        img = _decode_file(dali, encoded, channels, gpu=False)
    if gpu:
        img = img.gpu()
    return img


def _input_pixels(dali, encoded, spec: ImageSpec, gpu: bool, input: Input, native=None):
    """HWC uint8 pixels of the graph's input, in the output's colour mode; `native`:
    the native PNG operator's `(pixels, ok)` on `encoded` (`Input.FILES` only)."""
    if native is not None:
        img = _native_or_decoded(dali, encoded, native, spec.channels, gpu)
    elif input is Input.READY_RAW:
        img = _raw_on_device(dali, encoded, gpu)
    elif input is Input.READY_COMPACT_GPU and gpu:
        # Compact entries copied to the GPU as they are (about the PNGs' bytes) and
        # decoded there: nvCOMP's batched Zstd, the unfilter kernel, the CRC-32 check.
        from dali_loader.decode.dali_png import entry_decode_gpu

        img = entry_decode_gpu(dali, encoded.gpu(), None)
    elif input in (Input.READY_COMPACT, Input.READY_COMPACT_GPU):
        # Compact entries: the native core's operator on DALI's CPU threads (also what
        # probes a GPU graph's entries on the CPU); its pixels then go to the device
        # as raw entries' do.
        from dali_loader.decode.dali_png import entry_decode

        img = entry_decode(dali, encoded, None)
        img = img.gpu() if gpu else img
    elif input is Input.FILES_OR_RAW:
        # A per-sample branch (enable_conditionals) of CPU operators only, then the
        # copy to the GPU: DALI's conditionals documentation shows CPU branches
        # (https://docs.nvidia.com/deeplearning/dali/user-guide/docs/examples/general/conditionals.html);
        # a `mixed` decoder inside one is not documented, so the loader does not put
        # this input on a GPU for folders with JPEGs (`tfdata.dataset.make_loader`).
        if _is_raw(dali, encoded):
            img = raw_pixels(dali, encoded)
        else:
            img = _decode_file(dali, encoded, spec.channels, gpu=False)
        if gpu:
            img = img.gpu()
    else:
        img = _decode_file(dali, encoded, spec.channels, gpu)
    return img


def image_graph(dali, encoded, spec: ImageSpec, gpu: bool, input: Input = Input.FILES,
                pixels=None, png_native: bool = False, max_pixels: int | None = None):
    """Builds decode -> colour -> crop/pad -> resize on DataNode `encoded`.

    GPU-ready cache entries already hold Keras's pixels in the output's colour
    mode: `Input.READY_COMPACT` entries are decoded by the native operator on the
    CPU and copied to the GPU; `Input.READY_RAW` entries are reshaped on the CPU and copied to the
    GPU (nothing is decoded).

    `pixels` (CPU graphs of `Input.FILES` or `Input.FILES_OR_RAW` only): a
    second input of HWC uint8 pixels decoded on the host, in the output's
    colour mode, one per sample; empty (0 rows) where the sample is in
    `encoded` instead. A per-sample branch of CPU operators picks one or the
    other; neither is copied (measured: `dali_batches.HostPixels`).

    `png_native` (`Input.FILES`): PNGs are decoded by the native core's DALI
    operator on DALI's CPU threads, up to `max_pixels` (capped at
    `dali_png.CORE_MAX_PIXELS`); the files it leaves by DALI's decoder, on the CPU
    (a per-sample branch; on a GPU the pixels are then copied there). Returns
    `(images, ok)` then: `ok` is the operator's per-sample flag (False for a host-
    pixel sample, whose encoded input is a placeholder).
    """
    native = None
    if png_native:
        if input is not Input.FILES:
            raise ValueError("The native PNG operator decodes the files (Input.FILES). "
                             f"Received: input={input}")
        native = tuple(dali_png.png_decode(dali, encoded, spec.channels, max_pixels))
    if pixels is not None:
        if gpu or input not in (Input.FILES, Input.FILES_OR_RAW):
            raise ValueError("Host-decoded `pixels` go with a CPU graph of Input.FILES or "
                             f"Input.FILES_OR_RAW. Received: gpu={gpu}, input={input}")
        if _has_pixels(dali, pixels):
            img = pixels
        else:
            img = _input_pixels(dali, encoded, spec, gpu, input, native)
    else:
        img = _input_pixels(dali, encoded, spec, gpu, input, native)
    img = _resized(dali, img, spec)
    return img if native is None else (img, native[1])


def _resized(dali, img, spec: ImageSpec):
    """HWC uint8 pixels cropped or padded to the aspect ratio, resized, transposed as `spec` asks."""
    fn, t = dali.fn, dali.types
    interp, antialias = _interp(dali, spec.interpolation)
    out_dtype = t.UINT8 if spec.output_uint8 else t.FLOAT
    th, tw = spec.height, spec.width
    resize_kw = dict(interp_type=interp, antialias=antialias, dtype=out_dtype)
    if spec.crop_to_aspect_ratio:
        img = _crop_box(dali, img, th, tw)
        img = fn.resize(img, size=(th, tw), **resize_kw)
    elif spec.pad_to_aspect_ratio:
        size, offset = _pad_geometry(dali, img, th, tw)
        img = fn.resize(img, size=size, **resize_kw)
        img = fn.slice(
            img,
            start=-fn.cast(offset, dtype=t.INT32),
            shape=[th, tw],
            axes=[0, 1],
            out_of_bounds_policy="pad",
            fill_values=0,
        )
    else:
        img = fn.resize(img, size=(th, tw), **resize_kw)
    if spec.channels_first:
        img = fn.transpose(img, perm=[2, 0, 1])
    return img


def default_num_threads() -> int:
    """DALI CPU threads: one per core available to this process."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def build_pipeline(
    source,
    spec: ImageSpec,
    batch_size: int,
    *,
    gpu: bool = False,
    device_id: int = 0,
    num_threads: int | None = None,
    prefetch_queue_depth: int = 2,
    seed: int = 0,
    input: Input = Input.FILES,
    host_pixels: bool = False,
    png_native: bool = False,
    max_pixels: int | None = None,
):
    """Builds and returns a DALI pipeline fed batch-wise by `source`.

    Args:
        source: An iterable of batches (lists of 1-D uint8 numpy arrays; for
            `Input.READY_RAW`, `raw_views` of the entries; for `Input.READY_COMPACT`,
            the entries' bytes, decoded by the native operator);
            raising StopIteration ends an epoch (`cycle="raise"`).
        spec: The output image spec.
        batch_size: The largest batch `source` yields.
        gpu: Decode with `mixed` and resize on the GPU.
        device_id: The CUDA device (with `gpu`).
        num_threads: DALI CPU threads (default: cores available).
        prefetch_queue_depth: Batches DALI works on ahead of the consumer.
        seed: DALI's seed (the graph has no random operators).
        input: What the batches hold (`Input`).
        host_pixels: (CPU, `Input.FILES` or `Input.FILES_OR_RAW`) `source` yields
            pairs of batches: the encoded batch and one of HWC pixels decoded on
            the host, empty for the samples in the first (`image_graph`'s
            `pixels`). Neither is copied into DALI: `source` holds both until
            their batch is out (DALI's `no_copy` rule).
        png_native: (`Input.FILES`) PNGs decoded by the native core's DALI
            operator, the rest by DALI's decoder (`image_graph`); the pipeline
            then has a second output, the operator's per-sample `ok` flag.
        max_pixels: With `png_native`, the operator leaves images whose header
            claims more pixels (None: the core's own 2^28, `dali_png.CORE_MAX_PIXELS`).
    """
    dali = import_dali()
    native_kw = dict(png_native=png_native, max_pixels=max_pixels)

    def graph():
        if host_pixels:
            enc, px = dali.fn.external_source(
                source=source, num_outputs=2, batch=True, dtype=[dali.types.UINT8] * 2,
                ndim=[1, 3], layout=["", "HWC"], no_copy=True, cycle="raise")
            return image_graph(dali, enc, spec, gpu, input, pixels=px, **native_kw)
        kw = {}
        if input is Input.READY_RAW:
            # HWC views of the entries' pixels (`raw_views`), held by `source` until
            # their batch is out: neither copied into DALI nor sliced there.
            kw = dict(ndim=3, layout="HWC", no_copy=True)
        enc = dali.fn.external_source(
            source=source, batch=True, dtype=dali.types.UINT8, cycle="raise", name="encoded", **kw
        )
        if input is Input.READY_RAW:
            return _resized(dali, enc.gpu() if gpu else enc, spec)  # decoded: no decode
        return image_graph(dali, enc, spec, gpu, input, **native_kw)

    pipe = make_pipeline(graph, spec, batch_size, gpu=gpu, device_id=device_id,
                         num_threads=num_threads, prefetch_queue_depth=prefetch_queue_depth,
                         input=input, seed=seed, conditionals=host_pixels or png_native)
    pipe.build()
    return pipe


def make_pipeline(graph, spec: ImageSpec, batch_size: int, *, gpu: bool, device_id: int | None,
                  num_threads: int | None, prefetch_queue_depth: int, input: Input,
                  seed: int = 0, conditionals: bool = False):
    """The (unbuilt) DALI pipeline of `graph()`, with the loader's settings;
    `conditionals`: the graph branches per sample whatever `input` is."""
    dali = import_dali()
    return dali.pipeline_def(
        graph,
        enable_conditionals=(conditionals or input is Input.FILES_OR_RAW
                             or (spec.channels == 4 and input is Input.FILES)),
        batch_size=batch_size,
        num_threads=num_threads or default_num_threads(),
        device_id=device_id if gpu else None,
        prefetch_queue_depth=prefetch_queue_depth,
        seed=seed,
        # The dynamic executor reference-counts output buffers: a numpy view
        # of a batch stays valid after the next run(), so no copy is needed.
        exec_dynamic=True,
    )()


_DALI_NOISE = ("Current pipeline object is no longer valid.", "Critical error in pipeline:",
               "encountered:")


def dali_reason(text: str) -> str:
    """What DALI's error text says went wrong, without its pipeline boilerplate
    (a `std::bad_alloc` reads "out of memory")."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if "encountered:" in lines:  # the reason follows the operator's traceback
        lines = lines[len(lines) - lines[::-1].index("encountered:"):]
    lines = [ln for ln in lines if ln and ln not in _DALI_NOISE]
    reason = " ".join(lines).rstrip(" :")[:300] or text.strip()[:300]
    if reason == "std::bad_alloc":
        return "out of memory (std::bad_alloc)"
    return reason


def raw_views(entries) -> list:
    """HWC numpy views of the pixels of raw entries (`ReadyForm.RAW`; no copy):
    what a pipeline built for `Input.READY_RAW` takes."""
    return [decode_raw(e) for e in entries]


def probe_decode(data, spec: ImageSpec, input: Input = Input.FILES,
                 png_native: bool = False, max_pixels: int | None = None) -> str | None:
    """Decodes one image alone on the CPU, with the epoch's graph (`png_native`: the
    native PNG operator first, as `build_pipeline`); returns DALI's error text, or None."""
    import numpy as np

    arr = raw_views([data])[0] if input is Input.READY_RAW else np.frombuffer(data, np.uint8)

    class _One:
        def __iter__(self):
            self.done = False
            return self

        def __next__(self):
            if self.done:
                raise StopIteration
            self.done = True
            return [arr]

    try:
        pipe = build_pipeline(_One(), spec, 1, gpu=False, num_threads=1, prefetch_queue_depth=1,
                              input=input, png_native=png_native, max_pixels=max_pixels)
        pipe.run()
    except StopIteration:
        return None
    except Exception as e:  # DALI raises RuntimeError/IndexError subclasses
        return dali_reason(str(e))
    finally:
        try:
            del pipe
        except UnboundLocalError:
            pass
    return None
