"""Decoding: the output `spec`, the device choice (`devices`), the DALI graph
(`dali_graph`) and its epochs of batches (`dali_batches`), and TF's own kernels
(`tf_kernels`) as Keras uses them. (The batched GPU PNG decoder is an experiment outside
the package: experimental/png_gpu, docs/png_gpu.md.)"""
