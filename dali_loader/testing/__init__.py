"""Test support, never imported by the library: `fakegcs`, a GCS JSON-API server on
loopback with fault injection (the tests, benchmarks and demo start it)."""
