"""The tf.data boundary: loaders as finite, Keras-shaped `tf.data.Dataset`s (`dataset`),
and the audit that names every file TF's decoder drops (`audit`)."""
