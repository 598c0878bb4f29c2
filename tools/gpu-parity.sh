#!/usr/bin/env bash
# LM parity on a GPU host: the C CPU backend (gepard-inspect lm/generate) against the PyTorch
# reference (tests/python/gepard_reference.py) running on CUDA when the host has it.
# Needs a built tree (build/, or GEPARD_BUILD_DIR) and python3 with torch + transformers 5.x
# (tests/requirements-torch.txt); no GStreamer. Extra arguments go to pytest (e.g. -k tiny).
# The log, with the error table, goes to $GEPARD_PARITY_LOG (default build/gpu-parity.log).
set -euo pipefail
cd "$(dirname "$0")/.."

build=$(cd "${GEPARD_BUILD_DIR:-build}" && pwd)
python=${PYTHON:-python3}
log=${GEPARD_PARITY_LOG:-$build/gpu-parity.log}

if command -v ninja >/dev/null 2>&1; then
  ninja -C "$build" tools/gepard-inspect tools/gepard-make-test-model \
    || echo "gpu-parity: ninja failed; testing the tools already in $build" >&2
fi
device=$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')

: >"$log"
: >"$log.table"
{
  echo "gpu-parity: $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?'), reference on $device"
  "$python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  [ "$device" = cuda ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
} 2>&1 | tee -a "$log"

set +e
GEPARD_BUILD_DIR="$build" GEPARD_SOURCE_DIR="$PWD" GEPARD_REF_DEVICE="$device" \
  GEPARD_PARITY_REPORT="$log.table" PYTHONUNBUFFERED=1 \
  "$python" -m pytest -s -v -p no:cacheprovider tests/python/test_lm_parity.py "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
echo "gpu-parity: pytest exit $status; log $log, error table $log.table" | tee -a "$log"
exit "$status"
