"""Decoding: the output `spec`, the device choice (`devices`), the DALI graph
(`dali_graph`) and its epochs of batches (`dali_batches`), and TF's own kernels
(`tf_kernels`) as Keras uses them; `png_gpu`, batched PNG decoding on the GPU (nvCOMP +
numba-cuda kernels, off by default until a GPU run verifies it)."""
