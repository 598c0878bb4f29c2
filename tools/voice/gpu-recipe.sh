#!/usr/bin/env bash
# tools/voice/recipe.sh on a lent GPU host that may be lost between two calls, each call under
# ten minutes:
#
#   tools/voice/gpu-recipe.sh start MINUTES [SECONDS]   there, the first call on a machine: seeds
#                                                       RUN and starts recipe.sh RUN MINUTES
#                                                       detached (it outlives the call), then
#                                                       follows it
#   tools/voice/gpu-recipe.sh follow [SECONDS]          there, every later call, issued at once
#   tools/voice/gpu-recipe.sh unpack FILES              here, after each call: FILES holds what
#                                                       the call left in OUT
#
# Following prints the recipe's stages, the LMs' validation lines and their latest step lines for
# at most SECONDS (default 480; 420 after a start) or until the recipe has ended, then leaves a
# snapshot in OUT: every LM run of RUN slimmed (lm.py slim: its weights, step and data order,
# resumable; 15 MB at the default size), their tokenizer and the logs, as
# OUT/voice-run.tar.partNN of at most 15 MiB each. A machine lost mid-run so costs at most the
# minutes since the LMs' last checkpoint (saved every 3 minutes here).
#
# `unpack` puts the whole snapshot into device-prefix/voice-run (GPU_RECIPE_SNAPSHOT) and the
# main LM's run into models/voice-training/lm (GPU_RECIPE_SEED), which travels with every call:
# `start` seeds RUN with models/voice/codec.nemo (the codec's stages are skipped) and with the LM
# runs there, which the recipe resumes (the data are made again, from a corpus drawn for the step
# the main LM resumes at: CORPUS_SEED, unless given, is that step + 1). An LM so trains on from one
# machine to the next, and from one day to the next once models/voice-training is committed (give
# LM_MINUTES as the run's minutes in all). GPU_RECIPE_FORKS="NAME …" names variants of LM_VARIANTS
# that, where the seed holds no run of their own, start as copies of the main LM's run: each trains
# on from the same step and weights with its own options (--frame-blank 0.2, say), so one call
# compares them with the main LM at equal training. Each LM is exported here from its slimmed run:
# python3 tools/voice/lm.py export device-prefix/voice-run/lm MODEL_DIR. Every step brought back is
# also kept, in device-prefix/lm-steps/LM/STEP (GPU_RECIPE_STEPS), for the mean of several:
# python3 tools/voice/lm.py average device-prefix/lm-steps/lm/0* --out RUN. A tuning of the codec's
# decoder (CODEC_TUNE_MINUTES) comes back as codec-tuned.ckpt, which the seed keeps and the next
# start resumes, and once finished as codec-tuned.nemo alone (the seed's run is then dropped: a
# later start tunes anew); each of CODEC_TUNE_VARIANTS' as codec-tuned-NAME.ckpt and .nemo. A
# compiled LM keeps torch.compile's work for the host's kind of GPU in RUN/lm*/compile-cache
# (lm.py's CompileCache): the snapshot brings it back while it is small
# (GPU_RECIPE_COMPILE_CACHE_MB, default 20; the 171 MB of a 12-layer backbone compiled as one graph
# stayed there), `unpack` keeps it in device-prefix/compile-cache/LM (GPU_RECIPE_COMPILE_CACHE;
# git-ignored, not in the seed), and `start`, where that folder was carried too, puts it back into
# each LM's run, so a fresh machine of a kind seen before compiles little. The recipe's own settings
# (LM_MINUTES, LM_ARGS, LM_VARIANTS, CORPUS_ARGS, …) pass through the environment of `start`. Also:
# GPU_RECIPE_RUN (RUN, default /tmp/voice-run), VOICE_WORK (the data, default /tmp/voice), OUT
# (default build/gpu-recipe).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

run=${GPU_RECIPE_RUN:-/tmp/voice-run}
work=${VOICE_WORK:-/tmp/voice}
seed=${GPU_RECIPE_SEED:-$PWD/models/voice-training}
snapshot_dir=${GPU_RECIPE_SNAPSHOT:-$PWD/device-prefix/voice-run}
compile_cache=${GPU_RECIPE_COMPILE_CACHE:-$PWD/device-prefix/compile-cache}
steps_dir=${GPU_RECIPE_STEPS:-$PWD/device-prefix/lm-steps}
out=${OUT:-$PWD/build/gpu-recipe}
ended=$run.exit
export VOICE_WORK=$work PYTHONUNBUFFERED=1

# the optimizer step an LM run's checkpoint is at
step_of() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"])' "$1/checkpoint/state.json"
}

# the LM runs in directory $1: the main one (lm) and the variants (lm-NAME) that have a checkpoint
lm_runs() {
  local d
  for d in "$1"/lm "$1"/lm-*; do
    [ -f "$d/checkpoint/state.json" ] && echo "$d"
  done
}

# the compile cache kept for LM run $1 (if any) into its run: a fork has the main LM's already
use_compile_cache() {
  ls "$compile_cache/$1"/*.bin >/dev/null 2>&1 || return 0
  mkdir -p "$run/$1/compile-cache" && cp "$compile_cache/$1"/*.bin "$run/$1/compile-cache/" || return 1
  echo "gpu-recipe: $1 compiles with the cache of $(cd "$compile_cache/$1" && ls -- *.bin | tr '\n' ' ')"
}

running() { [ -e "$run.pid" ] && kill -0 "$(cat "$run.pid")" 2>/dev/null; }

start() {
  local minutes=${1:?usage: gpu-recipe.sh start MINUTES [SECONDS]}
  if running; then
    echo "gpu-recipe: a recipe is running already (pid $(cat "$run.pid")); follow it" >&2
    return 1
  fi
  local name
  for name in ${GPU_RECIPE_FORKS:-}; do
    case ";${LM_VARIANTS:-};" in
      *";$name:"*) ;;
      *)
        echo "gpu-recipe: GPU_RECIPE_FORKS names $name, which LM_VARIANTS does not" >&2
        return 1
        ;;
    esac
  done
  rm -rf "$run" "$ended" && mkdir -p "$run" "$out" || return 1
  cp models/voice/codec.nemo "$run/" || return 1
  local d runs
  mapfile -t runs < <(lm_runs "$seed")
  for d in "${runs[@]}"; do
    cp -r "$d" "$run/" || return 1
    echo "gpu-recipe: resuming $(basename "$d") at step $(step_of "$d")"
    use_compile_cache "$(basename "$d")" || return 1
  done
  [ -s "$run/lm/tokenizer.json" ] && cp "$run/lm/tokenizer.json" "$run/tokenizer.json"
  if [ -z "${CORPUS_SEED:-}" ] && [ -f "$run/lm/checkpoint/state.json" ]; then
    # sentences the LM has not read: the corpus is drawn anew for the step it resumes at
    CORPUS_SEED=$(($(step_of "$run/lm") + 1)) && export CORPUS_SEED
    echo "gpu-recipe: corpus seed $CORPUS_SEED"
  fi
  local ckpt
  for ckpt in "$seed"/codec-tuned*.ckpt; do
    [ -s "$ckpt" ] || continue
    cp "$ckpt" "$run/" || return 1
    echo "gpu-recipe: resuming the codec's decoder tuning $(basename "$ckpt" .ckpt)"
  done
  for name in ${GPU_RECIPE_FORKS:-}; do
    [ -d "$run/lm-$name" ] && continue
    if [ ! -f "$run/lm/checkpoint/state.json" ]; then
      echo "gpu-recipe: GPU_RECIPE_FORKS names $name, but there is no main LM run to start it from" >&2
      return 1
    fi
    cp -r "$run/lm" "$run/lm-$name" || return 1
    echo "gpu-recipe: $name starts from lm at step $(step_of "$run/lm")"
    use_compile_cache "lm-$name" || return 1
  done
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  # checkpoints often enough that a lost machine costs little (a later --save-every in LM_ARGS wins)
  export LM_ARGS="--save-every 3 ${LM_ARGS:-}"
  setsid nohup bash -c 'tools/voice/recipe.sh "$1" "$2"; echo $? >"$3"' _ "$run" "$minutes" "$ended" \
    >"$run.out" 2>&1 </dev/null &
  echo $! >"$run.pid"
  echo "gpu-recipe: started recipe.sh $run $minutes (pid $!)"
}

progress() {
  grep -h "^=== recipe\|^recipe:" "$run/recipe.log" 2>/dev/null | tail -n 3
  local f
  for f in "$work"/lm-*.out; do
    [ -s "$f" ] || continue
    echo "$(basename "$f" .out): $(grep valid_ce "$f" | tail -n 1 | sed 's/ frames_per_s.*valid_loss=[^ ]*//')"
    echo "$(basename "$f" .out): $(grep '^step' "$f" | tail -n 1)"
  done
}

snapshot() {
  local snap=$run.snapshot d name runs size
  rm -rf "$snap" && mkdir -p "$snap/logs" "$out" || return 1
  mapfile -t runs < <(lm_runs "$run")
  for d in "${runs[@]}"; do
    name=$(basename "$d")
    # a checkpoint being replaced is gone for an instant: try again
    for _ in 1 2 3; do
      python3 tools/voice/lm.py slim "$d" "$snap/$name" >/dev/null && break
      rm -rf "${snap:?}/$name"
      sleep 2
    done
    # each file is written by replacing: a copy is whole (one being written is *.partial)
    # only while small: what comes back from a call is limited (64 MiB), and the weights come first
    if ls "$d"/compile-cache/*.bin >/dev/null 2>&1; then
      size=$(du -sm "$d/compile-cache" | cut -f1)
      if [ "$size" -le "${GPU_RECIPE_COMPILE_CACHE_MB:-20}" ]; then
        mkdir -p "$snap/$name/compile-cache" && cp "$d"/compile-cache/*.bin "$snap/$name/compile-cache/"
      else
        echo "gpu-recipe: $name's compile cache (${size}M) stays there: too large to bring back"
      fi
    fi
  done
  cp "$run/recipe.log" "$work"/*.out "$snap/logs/" 2>/dev/null
  # each decoder tuning's run (written by replacing: a copy is whole), or once exported its codec
  # alone: two finished runs and their codecs would pass what a call brings back
  local ckpt
  for ckpt in "$run"/codec-tuned*.ckpt; do
    [ -s "$ckpt" ] || continue
    if [ -s "${ckpt%.ckpt}.nemo" ]; then
      cp "${ckpt%.ckpt}.nemo" "$snap/"
    else
      cp "$ckpt" "$snap/"
    fi
  done
  rm -f "$out"/voice-run.tar.part*
  tar -C "$snap" -cf - . | split -b 15M -d - "$out/voice-run.tar.part" || return 1
  echo "gpu-recipe: snapshot in $out: $(cd "$snap" && ls -d lm* codec-tuned* 2>/dev/null | tr '\n' ' ')($(du -sh "$snap" | cut -f1))"
}

follow() {
  local seconds=${1:-480}
  local end=$(($(date +%s) + seconds))
  if ! running && [ ! -e "$ended" ]; then
    # a machine given back between two calls comes back bare
    echo "gpu-recipe: no recipe was started on this machine (a fresh one?); unpack the last snapshot" \
      "here and start again" >&2
    return 1
  fi
  while running && [ ! -e "$ended" ] && [ "$(date +%s)" -lt "$end" ]; do
    sleep "${GPU_RECIPE_POLL_S:-30}"
    echo "--- $(date -u +%T)$(command -v nvidia-smi >/dev/null \
      && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader | sed 's/^/ GPU /')"
    progress
  done
  if [ -e "$ended" ]; then
    grep -v "^step=" "$run.out" | tail -n 20
    echo "gpu-recipe: the recipe ended, exit status $(cat "$ended")"
  elif ! running; then
    echo "gpu-recipe: the recipe stopped without an exit status (killed?); its log:"
    tail -n 20 "$run.out"
  fi
  snapshot
}

unpack() {
  local files=${1:?usage: gpu-recipe.sh unpack FILES}
  ls "$files"/voice-run.tar.part* >/dev/null || return 1
  rm -rf "$snapshot_dir" && mkdir -p "$snapshot_dir" || return 1
  cat "$files"/voice-run.tar.part* | tar -x -C "$snapshot_dir" || return 1
  local d runs name step kept at_step
  mapfile -t runs < <(lm_runs "$snapshot_dir")
  for d in "${runs[@]}"; do
    name=$(basename "$d") step=$(step_of "$d")
    echo "gpu-recipe: $name at step $step in $d"
    # every step brought back, kept for lm.py average
    at_step=$steps_dir/$name/$(printf %06d "$step")
    rm -rf "$at_step" && mkdir -p "$at_step" && cp -r "$d"/. "$at_step/" && rm -rf "$at_step/compile-cache" ||
      return 1
    if [ -d "$d/compile-cache" ]; then
      kept=$compile_cache/$name
      mkdir -p "$kept" && cp "$d"/compile-cache/*.bin "$kept/" || return 1
      echo "gpu-recipe: its compile cache is in $kept ($(du -sh "$d/compile-cache" | cut -f1); carry $compile_cache)"
    fi
  done
  if [ -f "$snapshot_dir/lm/checkpoint/state.json" ]; then
    rm -rf "$seed/lm" && mkdir -p "$seed" && cp -r "$snapshot_dir/lm" "$seed/" &&
      rm -rf "$seed/lm/compile-cache" || return 1
    echo "gpu-recipe: the next start resumes it from $seed/lm"
  fi
  local ckpt nemo
  for ckpt in "$snapshot_dir"/codec-tuned*.ckpt; do
    [ -s "$ckpt" ] || continue
    mkdir -p "$seed" && cp "$ckpt" "$seed/" || return 1
    echo "gpu-recipe: the codec's decoder tuning resumes from $seed/$(basename "$ckpt")"
  done
  for nemo in "$snapshot_dir"/codec-tuned*.nemo; do
    [ -s "$nemo" ] || continue
    # finished: a later start tunes anew (from models/voice/codec.nemo, which this may replace)
    rm -f "$seed/$(basename "$nemo" .nemo).ckpt"
    echo "gpu-recipe: the tuned codec: $nemo"
  done
}

case ${1:-} in
  start)
    start "${2:-}" && follow "${3:-420}"
    ;;
  follow) follow "${2:-480}" ;;
  unpack) unpack "${2:-}" ;;
  *)
    echo "usage: $0 start MINUTES [SECONDS] | follow [SECONDS] | unpack FILES" >&2
    exit 2
    ;;
esac
