#!/usr/bin/env bash
# The compact entries' GPU decode check, as the device tool runs it (README.md in this folder):
#
#   run(command="bash device_checks/compact_gpu_check/run_on_device.sh",
#       carry=["build/png_gpu_check", "dali_loader/native/_build/libdlpng.so"], timeout_s=330)
#
# after `.venv/bin/python experimental/png_gpu_check/prepare.py` (nvCOMP 6 wheels) and
# `python -m dali_loader.native.build` (libdlpng.so) here. Installs the carried nvCOMP wheels
# into /tmp/site and runs device_check.py under a 285 s timeout; its JSON lands in $OUT.
# Exit: device_check.py's (0 exact, 1 mismatch, 2 could not run), 124 on the timeout.
# Extra arguments go to device_check.py (--dry-run: no GPU). With --core it checks the
# loader's own GPU decode instead (libdlentry_gpu.so, nvCOMP's C API): no wheels; carry
#   ["build/entry_gpu_check", "dali_loader/native/_build/libdlpng.so",
#    "dali_loader/native/_build/libdlentry_gpu.so"]
# after `make gpu-check-compact-core` here (libnvcomp.so.5 copied into build/entry_gpu_check).
set -uo pipefail
cd "$(dirname "$0")/../.." && : "${PY:=python3}" "${SITE:=/tmp/site}" "${OUT:=$(mktemp -d)}"
mkdir -p "$OUT" && export PYTHONUNBUFFERED=1 OUT
echo "compact_gpu_check: $($PY --version 2>&1) at $(command -v "$PY"); OUT=$OUT"
if [ ! -f dali_loader/native/_build/libdlpng.so ]; then
  echo "missing dali_loader/native/_build/libdlpng.so: build it and carry it"; exit 2
fi
core=0
for a in "$@"; do [ "$a" = "--core" ] && core=1; done
if [ "$core" = 1 ]; then
  for f in dali_loader/native/_build/libdlentry_gpu.so build/entry_gpu_check/libnvcomp.so.5; do
    [ -f "$f" ] || { echo "missing $f: run make gpu-check-compact-core here and carry it"; exit 2; }
  done
  export LD_LIBRARY_PATH="$PWD/build/entry_gpu_check${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif ls build/png_gpu_check/whl/*.whl >/dev/null 2>&1; then
  if ! timeout -k 5 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$SITE" build/png_gpu_check/whl/*.whl >"$OUT/pip.log" 2>&1; then
    echo "pip install of the carried wheels failed:"; tail -n 20 "$OUT/pip.log"; exit 2
  fi
elif [ "${1:-}" != "--dry-run" ]; then
  echo "missing build/png_gpu_check/whl: run experimental/png_gpu_check/prepare.py and carry it"
  exit 2
fi
export PYTHONPATH="$SITE:$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"  # tests/: support.pngs
export LD_LIBRARY_PATH="$SITE/nvidia/libnvcomp/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rc=0
timeout -k 10 285 "$PY" device_checks/compact_gpu_check/device_check.py --out "$OUT" "$@" || rc=$?
[ "$rc" -eq 124 ] && echo "!! device_check.py ran out of its 285 s (the JSON holds the batches done)"
exit "$rc"
