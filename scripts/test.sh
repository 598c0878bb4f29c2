#!/usr/bin/env bash
# Installs what is missing, builds, runs every test, and ends with "N passed, N failed[, N skipped]".
#
# After the ordinary tests, the C tests run again in a build with AddressSanitizer and
# UndefinedBehaviorSanitizer (leaks checked), and every fuzz target runs for a bounded time in a
# clang build. Environment:
#   GEPARD_ASAN=0              skip the sanitizer run (build dir: GEPARD_ASAN_BUILD, default build-asan)
#   GEPARD_FUZZ_SECONDS=N      time per fuzz target (default 40; 0 skips fuzzing)
#   GEPARD_FUZZ_JOBS=N         fuzz targets run at once (default: the number of CPUs)
#   GEPARD_FUZZ_BUILD          the clang build dir (default build-fuzz)
#   GEPARD_SOAK_SECONDS=N      length of the server's load and soak test (default 150)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

GEPARD_ASAN_BUILD=${GEPARD_ASAN_BUILD:-$GEPARD_ROOT/build-asan}
GEPARD_FUZZ_BUILD=${GEPARD_FUZZ_BUILD:-$GEPARD_ROOT/build-fuzz}
export GEPARD_FUZZ_SECONDS=${GEPARD_FUZZ_SECONDS:-40}

# Configures (once) and builds a second build dir: build_variant DIR NINJA_TARGET MESON_OPTION...
# (an empty target builds everything); CC in the environment picks the compiler at configure time.
build_variant() {
  local dir=$1 target=$2
  shift 2
  local opts=("$@")
  [ "${CI:-}" = true ] && opts+=(--werror)
  if [ ! -f "$dir/build.ninja" ]; then
    log "configuring $dir"
    meson setup "$dir" "$GEPARD_ROOT" "${opts[@]}" >/dev/null
  fi
  log "building $dir"
  ninja -C "$dir" ${target:+"$target"} >/dev/null
}

# The tests under ASan + UBSan, leaks checked (tests/lsan.supp lists what GLib leaks on purpose).
# GStreamer scans plugins in the test process itself rather than in gst-plugin-scanner, which is
# not sanitized, so the scan of the sanitized plugin is checked too. The tests also start
# gst-launch-1.0 and gst-inspect-1.0, which load that plugin: a sanitized library can only be
# loaded into a process that has the ASan runtime first, so those two are reached through a PATH
# entry that preloads it. Nothing else gets the runtime preloaded: the tools and examples the tests
# start are sanitized themselves, and system programs such as PostgreSQL's stay as they are.
run_asan_tests() {
  local libasan shims=$GEPARD_ASAN_BUILD/asan-shims
  libasan=$(readlink -f "$(gcc -print-file-name=libasan.so)") # the build is gcc's, so is its runtime
  rm -rf "$shims"
  mkdir -p "$shims"
  for tool in gst-launch-1.0 gst-inspect-1.0; do
    printf '#!/bin/sh\nLD_PRELOAD=%s exec %s "$@"\n' "$libasan" "$(command -v "$tool")" >"$shims/$tool"
    chmod +x "$shims/$tool"
  done
  rm -f "$GEPARD_ASAN_BUILD"/meson-logs/testlog.json
  PATH="$shims:$PATH" \
    ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=0 \
    LSAN_OPTIONS="suppressions=$GEPARD_ROOT/tests/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    GST_REGISTRY_FORK=no \
    meson test -C "$GEPARD_ASAN_BUILD" --print-errorlogs --num-processes 2 --timeout-multiplier 2
}

install_system_packages
install_python_packages
build

status=0
summary=()
log "C tests (meson test)"
meson test -C "$GEPARD_BUILD" --print-errorlogs --num-processes 2 || status=1

log "Python tests (pytest)"
GEPARD_BUILD_DIR="$GEPARD_BUILD" GEPARD_SOURCE_DIR="$GEPARD_ROOT" \
  "$GEPARD_VENV/bin/python" -m pytest -q "$GEPARD_ROOT/tests/python" \
  --junitxml="$GEPARD_BUILD/pytest.xml" -p no:cacheprovider || status=1

if [ "${GEPARD_ASAN:-1}" != 0 ]; then
  log "C tests under AddressSanitizer + UndefinedBehaviorSanitizer"
  CC=gcc build_variant "$GEPARD_ASAN_BUILD" "" -Db_sanitize=address,undefined -Db_lundef=false
  run_asan_tests || status=1
  summary+=(--meson "asan=$GEPARD_ASAN_BUILD/meson-logs/testlog.json")
fi

if [ "$GEPARD_FUZZ_SECONDS" != 0 ]; then
  log "fuzzing (${GEPARD_FUZZ_SECONDS}s per target)"
  CC=clang build_variant "$GEPARD_FUZZ_BUILD" fuzzers -Dfuzzing=true
  "$GEPARD_ROOT/tests/fuzz/run.sh" "$GEPARD_FUZZ_BUILD" || status=1
  summary+=(--fuzz "$GEPARD_FUZZ_BUILD/fuzz-results")
fi

"$GEPARD_VENV/bin/python" "$GEPARD_ROOT/scripts/summarize-tests.py" \
  "$GEPARD_BUILD/meson-logs/testlog.json" "$GEPARD_BUILD/pytest.xml" "${summary[@]}" || status=1
exit $status
