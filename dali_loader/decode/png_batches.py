"""The batched PNG decoder as a stage of the DALI path (`png_decoder="gpu"`).

Each chunk of checked file bytes becomes HWC uint8 pixels in the output's colour
mode, which enter the DALI graph as `Input.PIXELS` (no decode there; crop/pad and
resize only). The chunk's PNGs go through `png_gpu.decode_pngs` in one batch;
non-PNG files (JPEG, BMP) and every `Fallback` are decoded by TensorFlow on the
CPU (`cpu_fallback.finish`: libpng/libjpeg, as Keras). A file TF rejects goes to
the epoch's `on_error` handler: raised, or recorded and left out of the chunk
(its position too, so labels stay aligned).

On a GPU: nvCOMP inflates, the kernels run on the GPU and the pixels are CuPy
arrays (CPU-decoded ones uploaded), for `external_source(device="gpu")`. On the
CPU: the same kernels under numba-cuda's simulator (`NUMBA_ENABLE_CUDASIM=1`,
set before numba is first imported; slow, for tests), zlib for nvCOMP, numpy
pixels. Off by default: docs/png_gpu.md, "Into the pipeline".
"""

from __future__ import annotations

import threading

from dali_loader.decode.png_gpu import Fallback, Launch, ZlibInflate, decode_pngs
from dali_loader.decode.png_gpu.cpu_fallback import finish
from dali_loader.decode.png_gpu.decoder import simulated
from dali_loader.formats.sniff import sniff
from dali_loader.feed.epochs import Chunk, FeedEpoch
from dali_loader.lazy import import_cupy, import_numba_cuda

# Each simulated CUDA thread is a Python thread: small launches on the CPU.
SIMULATOR_LAUNCH = Launch(adler_threads=16, unfilter_threads=8, expand_threads=1,
                          expand_blocks=1)
# numba-cuda's simulator runs one kernel launch at a time per process (a launch swaps the
# kernel's module globals for its fake `cuda` module and back): two DALI pipelines (two
# epochs at once) decoding on the CPU take turns.
_SIMULATOR_LOCK = threading.Lock()



class PngBatches:
    """Chunks of checked file bytes in, `(chunk kept, pixels)` out.

    Args:
        channels: 1, 3 or 4 (the output's colour mode).
        device: "gpu" (nvCOMP, kernels on the GPU, CuPy pixels) or "cpu" (the
            kernels under numba-cuda's simulator, zlib, numpy pixels).
        device_id: The CUDA device, with "gpu".
        launch: Kernel launch sizes (default: `Launch()` on a GPU,
            `SIMULATOR_LAUNCH` on the CPU).

    Raises:
        ValueError: on the CPU when numba.cuda is not the simulator.
    """

    def __init__(self, channels: int, *, device: str, device_id: int = 0,
                 launch: Launch | None = None):
        if device not in ("cpu", "gpu"):
            raise ValueError(f'`device` must be "cpu" or "gpu". Received: device={device}')
        if device == "cpu" and not simulated():
            raise ValueError(
                'png_decoder="gpu" on the CPU runs the decoder\'s CUDA kernels under '
                "numba-cuda's simulator, which must be chosen before numba is first imported "
                "(NUMBA_ENABLE_CUDASIM=1; slow: for tests). Use png_decoder=None on the CPU. "
                f"Received: png_decoder='gpu', device={device!r}")
        self.channels = channels
        self.device = device
        self.device_id = device_id
        self.launch = launch or (Launch() if device == "gpu" else SIMULATOR_LAUNCH)
        self._backend = None

    def _inflate(self):
        if self._backend is None:
            if self.device == "gpu":
                from dali_loader.decode.png_gpu import NvcompInflate

                self._backend = NvcompInflate(self.device_id)
            else:
                self._backend = ZlibInflate()
        return self._backend

    def __call__(self, chunk: Chunk, epoch: FeedEpoch) -> tuple[Chunk, list]:
        """Decodes `chunk`; counts `gpu_png_decodes` and `cpu_decodes` (fallbacks and
        non-PNG files) into `epoch.tally`. Files TF rejects go to `epoch.errors`."""
        items = chunk.items
        results: list = [Fallback("not a PNG")] * len(items)
        png = [i for i, data in enumerate(items) if sniff(data) == "png"]
        if png:
            if self.device == "gpu":
                with import_numba_cuda().gpus[self.device_id], \
                        import_cupy().cuda.Device(self.device_id):
                    got = self._decode([items[i] for i in png])
            else:
                with _SIMULATOR_LOCK:
                    got = self._decode([items[i] for i in png])
            for i, r in zip(png, got):
                results[i] = r
        on_gpu = sum(not isinstance(r, Fallback) for r in results)
        epoch.tally.add("gpu_png_decodes", on_gpu)
        epoch.tally.add("cpu_decodes", len(items) - on_gpu)
        paths = [epoch.path(p) for p in chunk.positions]
        done = finish(results, items, paths, self.channels, epoch.errors)
        keep = [i for i, r in enumerate(done) if r is not None]
        pixels = [done[i] for i in keep]
        if self.device == "gpu":
            cp = import_cupy()
            with cp.cuda.Device(self.device_id):
                pixels = [cp.asarray(p) for p in pixels]  # CPU-decoded ones uploaded
                cp.cuda.get_current_stream().synchronize()  # ready before DALI reads them
        if len(keep) == len(items):
            return chunk, pixels
        return Chunk([items[i] for i in keep], [chunk.positions[i] for i in keep]), pixels

    def _decode(self, blobs: list[bytes]) -> list:
        return decode_pngs(blobs, self.channels, backend=self._inflate(), launch=self.launch)
