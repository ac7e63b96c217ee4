#!/usr/bin/env bash
# The GPU PNG decoder's device check, as the device tool runs it (README.md in this folder):
#
#   run(command="bash experimental/png_gpu_check/run_on_device.sh",
#       carry=["build/png_gpu_check"], timeout_s=330)
#
# after `.venv/bin/python experimental/png_gpu_check/prepare.py` here. Installs the carried
# nvCOMP wheels into /tmp/site (no index, no dependencies) and runs device_check.py under
# a 285 s timeout; its JSON lands in $OUT. Exit: device_check.py's (0 exact, 1 mismatch,
# 2 could not run), 124 on the timeout. Extra arguments go to device_check.py
# (--dry-run: no GPU, numba-cuda's simulator, zlib only).
set -uo pipefail
cd "$(dirname "$0")/../.." && : "${PY:=python3}" "${SITE:=/tmp/site}" "${OUT:=$(mktemp -d)}"
mkdir -p "$OUT" && export PYTHONUNBUFFERED=1 OUT
echo "png_gpu_check: $($PY --version 2>&1) at $(command -v "$PY"); OUT=$OUT"
if ! ls build/png_gpu_check/whl/*.whl >/dev/null 2>&1 || [ ! -f build/png_gpu_check/data/manifest.json ]; then
  echo "missing build/png_gpu_check/: run prepare.py and carry it"; exit 2
fi
if ! timeout -k 5 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" build/png_gpu_check/whl/*.whl >"$OUT/pip.log" 2>&1; then
  echo "pip install of the carried wheels failed:"; tail -n 20 "$OUT/pip.log"; exit 2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# nvidia.nvcomp loads libnvcomp.so.6 through nvidia.libnvcomp; the path is a fallback.
export LD_LIBRARY_PATH="$SITE/nvidia/libnvcomp/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rc=0
if [ "${1:-}" = "--phases" ]; then  # where a batch's time goes (phases.py), not the check
  timeout -k 10 285 "$PY" experimental/png_gpu_check/phases.py || rc=$?
else
  timeout -k 10 285 "$PY" experimental/png_gpu_check/device_check.py --out "$OUT" "$@" || rc=$?
fi
[ "$rc" -eq 124 ] && echo "!! device_check.py ran out of its 285 s (the JSON holds the phases done)"
exit "$rc"
