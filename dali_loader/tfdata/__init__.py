"""The tf.data boundary: loaders as finite, Keras-shaped `tf.data.Dataset`s (`dataset`,
one module per path: `tf_path`, `ready_path`, `dali_path`, `dali_plugin`), and the audit
that names every file TF's decoder drops (`audit`)."""
