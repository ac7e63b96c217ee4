#!/usr/bin/env bash
# The GPU-ready cache's device check, as the device tool runs it (README.md in this folder):
#
#   run(command="bash device_checks/gpu_ready_check/run_on_device.sh",
#       carry=[".whl", "build/gpu_ready_check"], timeout_s=330)
#
# after `.venv/bin/python device_checks/gpu_ready_check/prepare.py` here. Installs the carried
# wheels into /tmp/site (no index, no dependencies) and runs device_check.py under a 285 s
# timeout; its JSON and log land in $OUT, nvImageCodec's own stderr in $OUT/stderr.log (its
# last lines are printed). Exit: device_check.py's (0 verified, 1 failures, 2 could not run),
# 124 on the timeout. Extra arguments go to device_check.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
echo "gpu_ready_check: $($PY --version 2>&1) at $(command -v "$PY"); OUT=$OUT"
if ! ls .whl/*.whl >/dev/null 2>&1 || [ ! -f build/gpu_ready_check/manifest.json ]; then
  echo "missing .whl/*.whl or build/gpu_ready_check/: run prepare.py and carry both"; exit 2
fi
if ! timeout -k 5 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl/*.whl >"$OUT/pip.log" 2>&1; then
  echo "pip install of the carried wheels failed:"; tail -n 20 "$OUT/pip.log"; exit 2
fi
echo "installed into $SITE: $(cd .whl && ls *.whl | tr '\n' ' ')"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
rc=0
timeout -k 10 285 "$PY" device_checks/gpu_ready_check/device_check.py --out "$OUT" "$@" \
  2>"$OUT/stderr.log" || rc=$?
[ "$rc" -eq 124 ] && echo "!! device_check.py ran out of its 285 s (the JSON holds the phases done)"
echo "-- stderr: $(wc -l <"$OUT/stderr.log") lines in $OUT/stderr.log; its commonest lines:"
sed -E 's/[0-9]+/N/g' "$OUT/stderr.log" | sort | uniq -c | sort -rn | head -n 12 | cut -c1-300
echo "-- its last 5 lines:"
tail -n 5 "$OUT/stderr.log" | cut -c1-300
exit "$rc"
