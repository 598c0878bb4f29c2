#!/usr/bin/env bash
# Runs the libFuzzer targets of a -Dfuzzing=true build for a bounded time each, starting from the
# seed corpora in tests/fuzz-corpus/<target>, and writes one JSON result per target into
# BUILD_DIR/fuzz-results (read by scripts/summarize-tests.py).
#
#   tests/fuzz/run.sh BUILD_DIR [TARGET...]      (default: every target that was built)
#
# A target is fuzz-<name> for each seed corpus tests/fuzz-corpus/<name>: the model-file parsers
# (json, nemo, pickle, safetensors, tokenizer, tokenize, yaml) and gepard-server's parsers of what
# clients send (tts-body: POST /tts/bytes and /tts/sse bodies; ws-message: WebSocket messages;
# clone-form: the multipart form of POST /voices/clone). Inputs named crash-* in a seed corpus are
# past findings, kept so that every run checks them again.
#
# GEPARD_FUZZ_SECONDS  time per target (default 40)
# GEPARD_FUZZ_JOBS     targets fuzzed at once (default: the number of CPUs)
#
# New inputs libFuzzer finds go to BUILD_DIR/fuzz-work/<target>/corpus, never into the seed
# corpus, and are kept for the next run in the same build dir; a crashing input is kept in
# BUILD_DIR/fuzz-work/<target>/ and named in the result.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: $0 BUILD_DIR [TARGET...]}" && pwd)
shift
seconds=${GEPARD_FUZZ_SECONDS:-40}
jobs=${GEPARD_FUZZ_JOBS:-$(nproc)}
results=$build/fuzz-results

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for seeds in "$root"/tests/fuzz-corpus/*/; do
    t=fuzz-$(basename "$seeds")
    [ -x "$build/tests/fuzz/$t" ] && targets+=("$t")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz targets in $build (configure it with CC=clang -Dfuzzing=true, then ninja fuzzers)" >&2
  exit 1
fi

rm -rf "$results"
mkdir -p "$results"

# halt_on_error: UBSan findings stop the run like ASan's; leaks are checked after every input
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

fuzz_one() {
  local t=$1
  local work=$build/fuzz-work/$t
  local log=$work/log
  local start end rc execs units artifact ok

  rm -f "$log" "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*
  mkdir -p "$work/corpus"
  start=$(date +%s)
  # -timeout: one input running for 10 s is a finding (hostile input must not stall a worker);
  # -rss_limit_mb: the parsers cap what they allocate, far below this
  "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/" \
    "$work/corpus" "$root/tests/fuzz-corpus/${t#fuzz-}" >"$log" 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  units=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -n 1)
  artifact=$(find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
    -o -name 'timeout-*' -o -name 'oom-*' -o -name 'slow-unit-*' \) | head -n 1)
  ok=true
  [ "$rc" -eq 0 ] && [ -z "$artifact" ] || ok=false
  printf '{"name": "%s", "ok": %s, "execs": %s, "seconds": %s, "new_units": %s, "artifact": "%s", "log": "%s"}\n' \
    "$t" "$ok" "${execs:-0}" "$((end - start))" "${units:-0}" "$artifact" "$log" >"$results/$t.json"
  if [ "$ok" = true ]; then
    printf '%-18s ok    %10s inputs in %ss\n' "$t" "${execs:-0}" "$((end - start))"
  else
    printf '%-18s FAIL  (exit %s) %s\n' "$t" "$rc" "${artifact:-no input kept}"
    tail -n 60 "$log"
    [ -n "$artifact" ] && echo "reproduce: $build/tests/fuzz/$t $artifact"
  fi
}

running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait

status=0
for t in "${targets[@]}"; do
  grep -q '"ok": true' "$results/$t.json" 2>/dev/null || status=1
done
exit $status
