#!/usr/bin/env bash
# `make gpu-check`: the GPU tests, the local benchmark on the GPU path and the gs:// targets
# (issue 3) on the machine's cores, in at most ~8 minutes (each step has its own timeout).
# Run on a machine where TensorFlow and DALI see a CUDA GPU and `make install` can reach PyPI.
# With $OUT set (the device tool), every step's output and JSON numbers also land there.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
echo "logs and JSON in $OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
echo "cores: $(nproc)"
$PY - <<'PY'
import tensorflow as tf
from dali_loader.loader import dali_gpu_count
print("TF GPUs:", tf.config.list_physical_devices("GPU"), "| DALI GPUs:", dali_gpu_count())
PY
rc=0
echo "== gpu tests"
timeout 150 $PY -m pytest -q -m gpu tests/test_gpu.py -ra 2>&1 | tee "$OUT/gpu_tests.log" || rc=1
echo "== local benchmark (seed pipeline vs loader on CPU and GPU)"
timeout 150 $PY benchmarks/bench_local.py --num-images 1024 --rounds 2 --json "$OUT/bench_local.json" \
  2>&1 | tee "$OUT/bench_local.log" || rc=1
echo "== gs:// benchmark (issue 3's targets on this machine's cores)"
timeout 150 $PY benchmarks/bench_gcs_loader.py --num-images 384 --rounds 2 --cold-runs 2 --listing 0 \
  --json "$OUT/bench_gcs_loader.json" 2>&1 | tee "$OUT/bench_gcs_loader.log" || rc=1
exit $rc
