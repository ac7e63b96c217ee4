"""Storage: local folders, FUSE mounts and URLs (gs:// and fsspec), and the verified disk cache.

`source.open_source` lists a root and returns a `Source` that reads files;
`remote`, `gcs`, `fsspec_backend` and `cache` sit behind it for URLs.
"""
