#!/usr/bin/env bash
# `make gpu-check-tf`: the GPU tests, the local benchmark on the GPU path and the gs:// targets
# (issue 3) on the machine's cores, in at most 10 minutes (each step has its own timeout:
# 60 + 300 + 120 + 120 s). Run on a machine where TensorFlow and DALI see a CUDA GPU and
# `make install` can reach PyPI. With $OUT set (the device tool), every step's output and
# JSON numbers also land there.
#
# It fails (exit 1) when TF or DALI sees no GPU, and when any step fails or runs out of
# time; the later steps still run, and the failed ones are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
echo "logs and JSON in $OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
echo "cores: $(nproc)"

# Stops the script here (set -e) when the environment cannot run the GPU steps: without
# a GPU the gpu tests would all skip and the check would pass without checking anything.
timeout -k 10 60 $PY - <<'PY'
import sys
import tensorflow as tf
from dali_loader.decode.devices import dali_gpu_count
tf_gpus, dali_gpus = tf.config.list_physical_devices("GPU"), dali_gpu_count()
print("TF GPUs:", tf_gpus, "| DALI GPUs:", dali_gpus)
if not tf_gpus or not dali_gpus:
    sys.exit("gpu-check-tf needs a CUDA GPU visible to both TensorFlow and DALI")
PY

failed=()
# step NAME SECONDS LOG CMD...: runs CMD under a timeout, its output also in $OUT/LOG;
# with pipefail a failure or timeout (124) of CMD, not tee's status, decides.
step() {
  local name=$1 seconds=$2 log=$3
  shift 3
  echo "== $name (at most ${seconds}s)"
  local rc=0
  timeout -k 10 "$seconds" "$@" 2>&1 | tee "$OUT/$log" || rc=$?
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "!! $name: timed out after ${seconds}s" || echo "!! $name: exit $rc"
    failed+=("$name (exit $rc)")
  fi
}

step "gpu tests" 180 gpu_tests.log \
  $PY -m pytest -q -m gpu tests/test_gpu.py tests/test_plugin.py tests/test_gpu_ready.py -ra
step "Keras scripts on every path (the GPU paths join on a GPU)" 120 keras_scripts.log \
  $PY -m pytest -q tests/test_keras_scripts.py -ra
step "local benchmark (seed pipeline vs loader on CPU and GPU)" 120 bench_local.log \
  $PY -m dali_loader.tools.cli bench "$(mktemp -d)/data" --sample 1024 --rounds 2 \
  --only seed loader-cpu loader-gpu loader-dali decode-bound --out "$OUT/bench_local"
step "gs:// benchmark (issue 3's targets on this machine's cores)" 120 bench_gcs_loader.log \
  $PY benchmarks/bench_gcs_loader.py --num-images 384 --rounds 2 --cold-runs 2 --listing 0 \
  --json "$OUT/bench_gcs_loader.json"

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "gpu-check: all steps passed"
