#!/usr/bin/env bash
# `make gpu-check`: the GPU tests and the benchmark on the GPU path, in at most ~8 minutes.
# Run on a machine where TensorFlow and DALI see a CUDA GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
$PY - <<'PY'
import tensorflow as tf
from dali_loader.loader import dali_gpu_count
print("TF GPUs:", tf.config.list_physical_devices("GPU"), "| DALI GPUs:", dali_gpu_count())
PY
echo "== gpu tests"
timeout 240 $PY -m pytest -q -m gpu tests/test_gpu.py -ra
echo "== benchmark (seed pipeline vs loader on CPU and GPU)"
timeout 240 $PY benchmarks/bench_local.py --num-images 1024 --rounds 2
