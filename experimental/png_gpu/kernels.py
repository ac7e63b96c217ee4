"""The batched PNG decoder's CUDA kernels (numba-cuda), compiled on first use.

Three kernels, each over a whole batch (`PackedBatch` tables on the device):

- `adler32`: one block per image; the threads sum strided slices of the
  inflated stream (Adler-32 as two sums: A = 1 + sum d_i, B = n + sum (n - i) d_i,
  mod 65521), then reduce in shared memory.
- `unfilter`: one block per image, in place. Row r depends on row r - 1 (Up,
  Average, Paeth) and each byte on the pixel to its left (Sub, Average, Paeth),
  so a block takes a band of `blockDim` rows, one thread per row, and sweeps a
  wavefront: at step s, row t of the band reconstructs pixel s - t (its `bpp`
  bytes), after its left neighbour (step s - 1) and the row above's pixel
  (step s - 1, one thread lower), with `syncthreads` between steps.
  A band of T rows of width W takes W + T - 1 steps instead of T * W.
  A filter type above 4 marks the image bad.
- `expand`: a 2-D grid (x: pixels, y: images); each thread maps a pixel's
  bytes to the requested channels like libpng under `tf.io.decode_png`:
  palette lookup (tRNS alpha), tRNS colour key -> alpha 0, grey -> RGB,
  RGB -> grey with libpng's integer weights (9797, 19234, 3737) >> 15, equal
  samples kept, alpha stripped or added (255). A palette index at or above
  PLTE's entries marks the image bad (the CPU decoder decides).

Arithmetic is on `int` values (the simulator computes uint8 numpy scalars with
wrap-around otherwise); stores mask to a byte. Under NUMBA_ENABLE_CUDASIM=1
numba runs the same source on the CPU, which is how CI tests it.
"""

from __future__ import annotations

from experimental.png_gpu.pack import ADLER_THREADS, BAD_FILTER, BAD_INDEX
from experimental.png_gpu.lazy import import_numba_cuda

# A module global, so that the simulator swaps in its own `cuda` when it runs a kernel.
cuda = import_numba_cuda()
from numba import int64  # noqa: E402  (numba is there once numba.cuda imported)

ADLER_MOD = 65521


@cuda.jit
def adler32(buf, dst_off, dst_len, out):
    i = cuda.blockIdx.x
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    sa = cuda.shared.array(ADLER_THREADS, int64)
    sb = cuda.shared.array(ADLER_THREADS, int64)
    base = dst_off[i]
    n = dst_len[i]
    a = 0
    b = 0
    k = t
    while k < n:
        d = int(buf[base + k])
        a += d
        b += ((n - k) % ADLER_MOD) * d
        if b >= 1 << 60:
            b %= ADLER_MOD
        k += nt
    sa[t] = a % ADLER_MOD
    sb[t] = b % ADLER_MOD
    cuda.syncthreads()
    step = nt // 2
    while step > 0:
        if t < step:
            sa[t] = (sa[t] + sa[t + step]) % ADLER_MOD
            sb[t] = (sb[t] + sb[t + step]) % ADLER_MOD
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out[i] = ((sb[0] + n % ADLER_MOD) % ADLER_MOD) * 65536 + (1 + sa[0]) % ADLER_MOD


@cuda.jit
def unfilter(buf, dst_off, width, height, bpp, status):
    i = cuda.blockIdx.x
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    w = width[i]
    h = height[i]
    s_px = bpp[i]
    stride = 1 + w * s_px
    base = dst_off[i]
    left = cuda.local.array(4, int64)  # the pixel to the left, and the one above it
    diag = cuda.local.array(4, int64)
    band = 0
    while band < h:
        r = band + t
        ft = 0
        if r < h:
            ft = int(buf[base + r * stride])
            if ft > 4:
                status[i] = BAD_FILTER
                ft = 0
        for k in range(4):
            left[k] = 0
            diag[k] = 0
        row = base + r * stride + 1
        for step in range(w + nt - 1):
            px = step - t
            if r < h and px >= 0 and px < w and ft != 0:
                for k in range(s_px):
                    p = row + px * s_px + k
                    f = int(buf[p])
                    up = 0
                    if r > 0:
                        up = int(buf[p - stride])
                    a = left[k]
                    c = diag[k]
                    if ft == 1:
                        v = f + a
                    elif ft == 2:
                        v = f + up
                    elif ft == 3:
                        v = f + ((a + up) >> 1)
                    else:
                        pa = abs(up - c)
                        pb = abs(a - c)
                        pc = abs(a + up - 2 * c)
                        if pa <= pb and pa <= pc:
                            pred = a
                        elif pb <= pc:
                            pred = up
                        else:
                            pred = c
                        v = f + pred
                    v = v & 0xFF
                    buf[p] = v
                    left[k] = v
                    diag[k] = up
            cuda.syncthreads()
        band += nt


@cuda.jit
def expand(buf, dst_off, width, height, bpp, color_type, trns, palette, num_palette,
           out, out_off, channels, status):
    i = cuda.blockIdx.y
    w = width[i]
    n = w * height[i]
    s_px = bpp[i]
    ct = color_type[i]
    stride = 1 + w * s_px
    base = dst_off[i]
    obase = out_off[i]
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    nq = cuda.gridDim.x * cuda.blockDim.x
    while q < n:
        y = q // w
        x = q - y * w
        p = base + y * stride + 1 + x * s_px
        a = 255
        if ct == 3:
            idx = int(buf[p])
            if idx >= num_palette[i]:
                status[i] = BAD_INDEX
            r = int(palette[i, idx, 0])
            g = int(palette[i, idx, 1])
            b = int(palette[i, idx, 2])
            a = int(palette[i, idx, 3])
        elif ct == 2 or ct == 6:
            r = int(buf[p])
            g = int(buf[p + 1])
            b = int(buf[p + 2])
            if ct == 6:
                a = int(buf[p + 3])
            elif trns[i, 0] != 0 and r == trns[i, 1] and g == trns[i, 2] and b == trns[i, 3]:
                a = 0
        else:
            r = int(buf[p])
            g = r
            b = r
            if ct == 4:
                a = int(buf[p + 1])
            elif trns[i, 0] != 0 and r == trns[i, 1]:
                a = 0
        o = obase + q * channels
        if channels == 1:
            if r == g and g == b:
                out[o] = r
            else:
                out[o] = ((9797 * r + 19234 * g + 3737 * b) >> 15) & 0xFF
        else:
            out[o] = r
            out[o + 1] = g
            out[o + 2] = b
            if channels == 4:
                out[o + 3] = a
        q += nq
