#!/usr/bin/env bash
# The default voice's whole recipe as one resumable command for a GPU host:
#
#   tools/voice/recipe.sh RUN [MINUTES]
#
# RUN holds what must outlive a machine: codec.ckpt, codec.nemo, tokenizer.json, the LM run in
# RUN/lm/ (checkpoint shards, train.log) and recipe.log. The data (corpus, espeak-ng speech, codes)
# are deterministic and are regenerated under VOICE_WORK (default /tmp/voice) when missing. Stages:
#
#   corpus → speech → codec training to CODEC_STEPS → codec eval, export, encode → tokenizer →
#   LM training to LM_STEPS → LM export to RUN/model/
#
# Each stage that is already done is skipped. The command stops itself after MINUTES (default 23)
# with every checkpoint saved; running it again (on a fresh machine, RUN carried back) continues.
# It prints "recipe: finished" once both trainings reached their steps.
#
# espeak-ng and the fortunes come from tools/voice/espeak-prefix.sh where the host lacks them.
# Length of each training: CODEC_STEPS (12000) and LM_STEPS (8000) optimizer steps, or, with
# CODEC_MINUTES / LM_MINUTES, as many steps as fit that many minutes on this machine (measured on a
# first short run, inside the learning-rate warmup). The plan is kept in RUN/codec.steps and
# RUN/lm.steps, so a resumed run keeps its schedule. Also: CODEC_ARGS, LM_ARGS (extra options),
# SPEECH_LIMIT (synthesize only that many train sentences: for a quick trial).
set -euo pipefail
cd "$(dirname "$0")/../.."

run=${1:?usage: tools/voice/recipe.sh RUN [MINUTES]}
minutes=${2:-23}
work=${VOICE_WORK:-/tmp/voice}
deadline=$(($(date +%s) + ${minutes%.*} * 60))
mkdir -p "$run" "$work"
exec > >(tee -a "$run/recipe.log") 2>&1
export PYTHONUNBUFFERED=1

stage() { echo "=== recipe: $* ($(date -u +%T))"; }
# minutes left before the deadline, less a reserve for what follows the stage
left() { echo $(((deadline - $(date +%s)) / 60 - ${1:-0})); }

if ! command -v espeak-ng >/dev/null || [ ! -d /usr/share/games/fortunes ]; then
  eval "$(tools/voice/espeak-prefix.sh env)"
fi
fortunes=${FORTUNES_DIR:-/usr/share/games/fortunes}

if [ ! -s "$work/corpus/train.jsonl" ]; then
  stage corpus
  python3 tools/voice/corpus.py "$work/corpus" --fortunes-dir "$fortunes"
fi
if [ ! -s "$work/data/speech/index.jsonl" ]; then
  stage speech
  python3 tools/voice/speech.py "$work/corpus" "$work/data" ${ESPEAK_DATA_PATH:+--espeak-data "$ESPEAK_DATA_PATH"} \
    ${SPEECH_LIMIT:+--limit "$SPEECH_LIMIT"}
fi

# plan_steps NAME MINUTES DEFAULT PROBE_STEPS COMMAND…: prints the planned steps of training NAME,
# planned once (RUN/NAME.steps); with MINUTES, COMMAND --steps PROBE_STEPS runs first and times it
plan_steps() {
  local name=$1 minutes=$2 default=$3 probe=$4
  shift 4
  if [ ! -s "$run/$name.steps" ]; then
    if [ -n "$minutes" ]; then
      local t0 t
      t0=$(date +%s)
      "$@" --steps "$probe" >&2
      t=$(($(date +%s) - t0))
      echo $((probe * minutes * 60 / (t > 0 ? t : 1))) >"$run/$name.steps"
      echo "recipe: $name: $probe steps in $t s, planning $(cat "$run/$name.steps") steps for $minutes min" >&2
    else
      echo "$default" >"$run/$name.steps"
    fi
  fi
  cat "$run/$name.steps"
}

ckpt_step() {
  python3 -c 'import sys, torch; print(torch.load(sys.argv[1], map_location="cpu", weights_only=False)["step"])' "$1"
}
codec_train() {
  # shellcheck disable=SC2086
  python3 tools/voice/codec.py train "$work/data" --ckpt "$run/codec.ckpt" --resume ${CODEC_ARGS:-} "$@"
}
codec_steps=$(plan_steps codec "${CODEC_MINUTES:-}" "${CODEC_STEPS:-12000}" "${CODEC_PROBE_STEPS:-500}" codec_train --total-steps 100000)
codec_done() { [ -s "$run/codec.ckpt" ] && [ "$(ckpt_step "$run/codec.ckpt")" -ge "$codec_steps" ]; }

if ! codec_done; then
  budget=$(left 2)
  if [ "$budget" -lt 1 ]; then
    echo "recipe: out of time before the codec; run again"
    exit 0
  fi
  stage "codec training to step $codec_steps, at most $budget min"
  codec_train --steps "$codec_steps" --total-steps "$codec_steps" --time-limit "$budget"
  rm -f "$run/codec.nemo" "$work/data/codes.pt"
  if ! codec_done; then
    echo "recipe: stopped in the codec's training; run again"
    exit 0
  fi
fi

if [ ! -s "$run/codec.nemo" ]; then
  stage "codec eval and export"
  python3 tools/voice/codec.py eval "$run/codec.ckpt" "$work/data" --limit 48
  python3 tools/voice/codec.py eval "$run/codec.ckpt" "$work/data" --split train --limit 48
  python3 tools/voice/codec.py export "$run/codec.ckpt" "$run/codec.nemo"
fi
if [ ! -s "$work/data/codes.pt" ]; then
  stage encode
  python3 tools/voice/codec.py encode "$run/codec.nemo" "$work/data"
fi
if [ ! -s "$run/tokenizer.json" ]; then
  stage tokenizer
  python3 tools/voice/tokenizer.py "$work/corpus" --output "$run/tokenizer.json"
fi

lm_train() {
  # shellcheck disable=SC2086
  python3 tools/voice/lm.py train --data "$work/data/codes.pt" --run "$run/lm" --tokenizer "$run/tokenizer.json" \
    --resume ${LM_ARGS:-} "$@"
}
lm_steps=$(plan_steps lm "${LM_MINUTES:-}" "${LM_STEPS:-8000}" "${LM_PROBE_STEPS:-200}" lm_train)
budget=$(left 1)
if [ "$budget" -lt 1 ]; then
  echo "recipe: out of time before the LM; run again"
  exit 0
fi
stage "LM training to step $lm_steps, at most $budget min"
log=$work/lm-train.out
lm_train --steps "$lm_steps" --time-limit "$budget" | tee "$log"
if grep -q '^finished' "$log"; then
  stage "LM export"
  rm -rf "$run/model"
  python3 tools/voice/lm.py export "$run/lm" "$run/model"
  echo "recipe: finished"
else
  echo "recipe: stopped in the LM's training; run again"
fi
