"""Tools around the library, never imported by it: the `dali-loader` CLI (`cli`, `cmd_*`),
`bench`, `diagnose`, the tf.data `baselines` they compare against, and `sample` data."""
