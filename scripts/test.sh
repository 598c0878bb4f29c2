#!/usr/bin/env bash
# Installs what is missing, builds, runs every test, and ends with "N passed, N failed[, N skipped]".
set -euo pipefail
. "$(dirname "$0")/lib.sh"

install_system_packages
install_python_packages
build

status=0
log "C tests (meson test)"
meson test -C "$GEPARD_BUILD" --print-errorlogs --num-processes 2 || status=1

log "Python tests (pytest)"
GEPARD_BUILD_DIR="$GEPARD_BUILD" GEPARD_SOURCE_DIR="$GEPARD_ROOT" \
  "$GEPARD_VENV/bin/python" -m pytest -q "$GEPARD_ROOT/tests/python" \
  --junitxml="$GEPARD_BUILD/pytest.xml" -p no:cacheprovider || status=1

"$GEPARD_VENV/bin/python" "$GEPARD_ROOT/scripts/summarize-tests.py" \
  "$GEPARD_BUILD/meson-logs/testlog.json" "$GEPARD_BUILD/pytest.xml" || status=1
exit $status
