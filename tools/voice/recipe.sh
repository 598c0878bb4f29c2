#!/usr/bin/env bash
# The default voice's whole recipe as one resumable command for a GPU host:
#
#   tools/voice/recipe.sh RUN [MINUTES]
#
# RUN holds what must outlive a machine: codec.ckpt, codec.nemo, tokenizer.json, the LM run in
# RUN/lm/ (checkpoint shards, train.log), model/ and recipe.log. The data (corpus, espeak-ng speech,
# codes) are deterministic and are regenerated under VOICE_WORK (default /tmp/voice) when missing.
# Stages:
#
#   corpus → speech → codec training, encoder and decoder, for CODEC_ENCODER_MINUTES → codes →
#   tokenizer → the LM's training and the codec decoder's, side by side on the GPU → exports
#
# The codec's encoder is frozen once the codes are taken, so the codes the LM learns from stay the
# codec's own while its decoder trains on, from those codes (codec.py train --codes). Each stage already done is skipped. The command stops
# itself after MINUTES (default 23; fractions allowed) with every checkpoint saved: the last
# RECIPE_RESERVE_S seconds (120) are kept for saving and exporting. Running it again (on a fresh
# machine, RUN carried back) continues. It prints "recipe: finished" once both trainings are done.
#
# The codec of the default voice ships as models/voice/codec.nemo (its encoder is what the LM's codes
# come from): `mkdir -p RUN && cp models/voice/codec.nemo RUN/` before the first call skips the
# codec's stages, and the recipe goes from the data to the codes and the LM.
#
# On a lent GPU machine that is lost between calls, RUN travels back and forth (16 MB for
# codec.ckpt, 12.4 MB once its encoder is frozen; 6 bytes per LM parameter for RUN/lm/checkpoint,
# 46 MB at the default size, or 2 bytes, 15 MB, once `lm.py slim RUN/lm OUT` has dropped its AdamW
# moments; beside 7.3 MB of espeak-ng packages). Once the codec has finished, codec.nemo (8 MB) is
# all the LM's stage needs of it, and codec.ckpt may stay behind. tools/voice/gpu-recipe.sh runs
# this recipe detached on such a machine and brings its LM runs back slimmed after every call.
#
# Lengths are planned in minutes of training time on the machine at hand (the learning-rate
# schedules run over them): CODEC_MINUTES (18) in all for the codec, of which the first
# CODEC_ENCODER_MINUTES (6) train the encoder too, and LM_MINUTES (12; 0: no LM, for a session
# that trains the codec's decoder alone, CODEC_TUNE_MINUTES below). Also: CODEC_ARGS, LM_ARGS
# (the LM's options, after LM_DEFAULTS, default "--lr 2e-3 --warmup 300 --own-frames 0.4
# --frame-blank 0.3 --text-dropout 0.15": 40 % of the frames it reads are its own predictions, 30 %
# are hidden from it, so that what they held must come from the text, and 15 % of the examples
# read the empty text, for text-CFG; a later option wins), LM_COMPILE (--compile where nvidia-smi
# lists a GPU, else nothing: lm.py's torch.compile of the backbone's layers, ~1.3 minutes to
# compile on an H100 at any depth, less with an LM run's compile-cache from that kind of GPU; the
# backbone compiled as one graph trained at 1.8× the frames per second of eager on an H200; set it
# empty to train eager), LM_BATCH (the LM's batch options, default "--max-tokens 96000
# --max-batch 384": on a GPU the small LM is bound by the host's work per step, an H200 ~10 % busy
# at lm.py's own defaults), SPEECH_LIMIT (synthesize only that many train sentences: for a quick
# trial).
# espeak-ng, the fortunes and the dictionary come from tools/voice/espeak-prefix.sh where the host
# lacks them. CORPUS_ARGS: corpus.py's options (default "--size 90000 --word-lists 30000": 14200
# fortunes, 45800 generated, 30000 word lists. On corpus.py's own 30000 sentences an LM of 15
# minutes on an H100 read each utterance 50 times, and the wide shape's validation CE rose after
# its 25th pass); CORPUS_SEED (1): the corpus's seed, which draws the generated sentences and the
# word lists (the fortunes and the held-out vocabulary stay): an LM resumed on another seed reads
# sentences it has not read before, none of them held out; on an H100 the speech takes ~1.2 s and
# the encoding ~2.2 s per thousand sentences;
# TOKENIZER_ARGS: tokenizer.py's (e.g. "--vocab-size 512"). LM_VARIANTS="NAME:OPTIONS;…": more
# LMs trained side by side with the main one on the same codes and tokenizer (one small LM keeps
# an H200 10–40 % busy), each with LM_ARGS and then its own OPTIONS, in RUN/lm-NAME, exported to
# RUN/model-NAME once finished: variants to compare by their validation lines (valid_ce against
# valid_ce_other_text: how much the text matters) and intelligibility.py. CODEC_TUNE_MINUTES (0:
# off): once the codec is finished, its decoder is tuned beside the LMs for that many minutes in all
# (a run that resumes across recipes, RUN/codec-tuned.ckpt) on the codes of this speech, its encoder,
# hence every code, kept as it was, and exported to RUN/codec-tuned.nemo at the end: a decoder
# trained on other speakers heard by more (options: CODEC_TUNE_ARGS, default "--batch 128 --lr 2e-4
# --warmup 200"). CODEC_TUNE_VARIANTS="NAME:OPTIONS;…": more such tunings side by side, each with
# CODEC_TUNE_ARGS and then its own OPTIONS, in RUN/codec-tuned-NAME.ckpt, exported to
# RUN/codec-tuned-NAME.nemo (say "adv:--adversarial-weight 0.1" beside the plain losses).
set -euo pipefail
cd "$(dirname "$0")/../.."

run=${1:?usage: tools/voice/recipe.sh RUN [MINUTES]}
minutes=${2:-23}
work=${VOICE_WORK:-/tmp/voice}
deadline=$(($(date +%s) + $(awk -v m="$minutes" 'BEGIN { print int(m * 60) }')))
reserve=${RECIPE_RESERVE_S:-120}
mkdir -p "$run" "$work"
exec > >(tee -a "$run/recipe.log") 2>&1
export PYTHONUNBUFFERED=1

stage() { echo "=== recipe: $* ($(date -u +%T))"; }
# seconds left before the deadline, less the reserve for what follows a training stage (saving,
# exports); in_minutes turns them into a --time-limit
left() { echo $((deadline - $(date +%s) - reserve)); }
in_minutes() { awk -v s="$1" 'BEGIN { printf "%.2f", s / 60 }'; }

if ! command -v espeak-ng >/dev/null || [ ! -d /usr/share/games/fortunes ] \
  || [ ! -f /usr/share/dict/american-english ]; then
  eval "$(tools/voice/espeak-prefix.sh env)"
fi
fortunes=${FORTUNES_DIR:-/usr/share/games/fortunes}
words=${WORDS_FILE:-/usr/share/dict/american-english}

corpus_seed=${CORPUS_SEED:-1}
if [ -s "$work/corpus/train.jsonl" ] && [ "$(cat "$work/corpus/seed" 2>/dev/null)" != "$corpus_seed" ]; then
  echo "recipe: the corpus in $work/corpus has another seed than $corpus_seed: its data are made again"
  rm -rf "$work/corpus" "$work/data"
fi
if [ ! -s "$work/corpus/train.jsonl" ]; then
  stage corpus
  # shellcheck disable=SC2086
  python3 tools/voice/corpus.py "$work/corpus" --fortunes-dir "$fortunes" --words-file "$words" \
    --seed "$corpus_seed" ${CORPUS_ARGS---size 90000 --word-lists 30000}
  echo "$corpus_seed" >"$work/corpus/seed"
fi
if [ ! -s "$work/data/speech/index.jsonl" ]; then
  stage speech
  python3 tools/voice/speech.py "$work/corpus" "$work/data" ${ESPEAK_DATA_PATH:+--espeak-data "$ESPEAK_DATA_PATH"} \
    ${SPEECH_LIMIT:+--limit "$SPEECH_LIMIT"}
fi

codec_minutes=${CODEC_MINUTES:-18}
encoder_minutes=${CODEC_ENCODER_MINUTES:-6}
lm_minutes=${LM_MINUTES:-12}

# codec_reached MIN: the codec has trained MIN minutes in all; codec_finished: to the plan's end.
# A RUN with codec.nemo and no codec.ckpt holds a finished codec (the checkpoint left behind to
# carry the LM's instead: see below).
# ckpt_test CKPT EXPR: codec checkpoint CKPT exists and EXPR holds of its trained_s and finished
ckpt_test() {
  [ -s "$1" ] && python3 -c 'import sys, torch
ckpt = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
sys.exit(0 if eval(sys.argv[2], {}, {k: ckpt.get(k) for k in ("trained_s", "finished")}) else 1)' "$1" "$2"
}
codec_ckpt_test() {
  if [ ! -e "$run/codec.ckpt" ] && [ -s "$run/codec.nemo" ]; then
    return 0
  fi
  ckpt_test "$run/codec.ckpt" "$1"
}
codec_reached() { codec_ckpt_test "trained_s >= $1 * 60"; }
codec_finished() { codec_ckpt_test "finished"; }
codec_train() {
  # shellcheck disable=SC2086
  python3 tools/voice/codec.py train "$work/data" --ckpt "$run/codec.ckpt" --resume \
    --minutes "$codec_minutes" --freeze-encoder-after "$encoder_minutes" ${CODEC_ARGS:-} "$@"
}
lm_batch=${LM_BATCH-"--max-tokens 96000 --max-batch 384"}
# the LMs' batches change shape from step to step and several LMs may share one GPU: memory grown
# in segments serves every shape, where blocks cached per shape add up (an LM at 96000 tokens needs
# ~19 GB and was seen holding 30 GB)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
lm_defaults=${LM_DEFAULTS-"--lr 2e-3 --warmup 300 --own-frames 0.4 --frame-blank 0.3 --text-dropout 0.15"}
if [ -z "${LM_COMPILE+set}" ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  LM_COMPILE=--compile
fi
lm_defaults="$lm_defaults ${LM_COMPILE:-}"
lm_train() {
  # shellcheck disable=SC2086
  python3 tools/voice/lm.py train --data "$work/data/codes.pt" --run "$run/lm" --tokenizer "$run/tokenizer.json" \
    --resume --minutes "$lm_minutes" $lm_batch $lm_defaults ${LM_ARGS:-} "$@"
}

if ! codec_reached "$encoder_minutes"; then
  budget=$(left)
  if [ "$budget" -lt 30 ]; then
    echo "recipe: out of time before the codec; run again"
    exit 0
  fi
  stage "codec training, encoder and decoder, to $encoder_minutes min; at most $(in_minutes "$budget") min now"
  codec_train --until-minutes "$encoder_minutes" --time-limit "$(in_minutes "$budget")"
  rm -f "$work/data/codes.pt"
  if ! codec_reached "$encoder_minutes"; then
    echo "recipe: stopped in the codec's training; run again"
    exit 0
  fi
fi
if [ ! -s "$work/data/codes.pt" ]; then
  stage "encode (the encoder is frozen from here on)"
  codec_source=$run/codec.ckpt
  [ -s "$codec_source" ] || codec_source=$run/codec.nemo
  python3 tools/voice/codec.py encode "$codec_source" "$work/data"
fi
if [ ! -s "$run/tokenizer.json" ]; then
  stage tokenizer
  # shellcheck disable=SC2086
  python3 tools/voice/tokenizer.py "$work/corpus" --output "$run/tokenizer.json" ${TOKENIZER_ARGS:-}
fi

lm_wanted() { awk -v m="$lm_minutes" 'BEGIN { exit !(m > 0) }'; }
lm_done() { [ -s "$work/lm-train.out" ] && grep -q '^finished' "$work/lm-train.out"; }
tune_minutes=${CODEC_TUNE_MINUTES:-0}
tune_args=${CODEC_TUNE_ARGS-"--batch 128 --lr 2e-4 --warmup 200"}
tune_wanted() { awk -v m="$tune_minutes" 'BEGIN { exit !(m > 0) }'; }
# the decoder's tunings, each NAME:OPTIONS: the main one (codec-tuned) and CODEC_TUNE_VARIANTS'
tunes=("codec-tuned:")
IFS=';' read -ra tune_variants <<<"${CODEC_TUNE_VARIANTS:-}"
for variant in "${tune_variants[@]}"; do
  [ -n "${variant%%:*}" ] && tunes+=("codec-tuned-$variant")
done
tune_finished() { ckpt_test "$run/$1.ckpt" finished; }
tunes_finished() {
  local tune
  for tune in "${tunes[@]}"; do
    tune_finished "${tune%%:*}" || return 1
  done
}
budget=$(left)
if [ "$budget" -lt 30 ]; then
  echo "recipe: out of time before the LM; run again"
  exit 0
fi
if lm_wanted; then
  stage "LM training to $lm_minutes min and the codec decoder's to $codec_minutes min, at most $(in_minutes "$budget") min now"
else
  stage "no LM (LM_MINUTES=0); the codec decoder's training to $codec_minutes min, at most $(in_minutes "$budget") min now"
fi
codec_pid=
if ! codec_finished; then
  codec_train --time-limit "$(in_minutes "$budget")" --codes "$work/data/codes.pt" >"$work/codec-train.out" 2>&1 &
  codec_pid=$!
fi
tune_names=()
tune_pids=()
if tune_wanted && codec_finished && [ -s "$run/codec.nemo" ]; then
  for tune in "${tunes[@]}"; do
    name=${tune%%:*}
    tune_finished "$name" && continue
    # shellcheck disable=SC2086 # the options, one word each
    python3 tools/voice/codec.py train "$work/data" --ckpt "$run/$name.ckpt" --resume --init "$run/codec.nemo" \
      --minutes "$tune_minutes" --freeze-encoder-after 0 --codes "$work/data/codes.pt" \
      --time-limit "$(in_minutes "$budget")" $tune_args ${tune#*:} \
      >"$work/$name.out" 2>&1 &
    tune_names+=("$name")
    tune_pids+=($!)
  done
fi
variant_names=()
variant_options=()
variant_pids=()
IFS=';' read -ra variants <<<"${LM_VARIANTS:-}"
for variant in "${variants[@]}"; do
  name=${variant%%:*}
  options=${variant#*:}
  [ -n "$name" ] || continue
  [ -s "$work/lm-$name.out" ] && grep -q '^finished' "$work/lm-$name.out" && continue
  variant_names+=("$name")
  variant_options+=("$options")
  # shellcheck disable=SC2086 # the variant's options, one word each
  lm_train --time-limit "$(in_minutes "$budget")" --run "$run/lm-$name" $options \
    >"$work/lm-$name.out" 2>&1 &
  variant_pids+=($!)
done
rm -f "$work/lm-train.out"
if lm_wanted; then
  lm_train --time-limit "$(in_minutes "$budget")" | tee "$work/lm-train.out"
fi
for i in "${!variant_pids[@]}"; do
  name=${variant_names[$i]}
  wait "${variant_pids[$i]}" || echo "recipe: LM variant $name failed"
  echo "recipe: LM variant $name (${variant_options[$i]}):"
  { grep valid_ce "$work/lm-$name.out" | tail -n 2; tail -n 1 "$work/lm-$name.out"; } || true
  if grep -q '^finished' "$work/lm-$name.out"; then
    rm -rf "$run/model-$name"
    python3 tools/voice/lm.py export "$run/lm-$name" "$run/model-$name"
  fi
done
for i in "${!tune_pids[@]}"; do
  name=${tune_names[$i]}
  wait "${tune_pids[$i]}" || echo "recipe: the codec's decoder tuning $name failed"
  grep -v '^step .* steps/s)$' "$work/$name.out" | tail -n 5 || true
done
evaluated_before=
for tune in "${tunes[@]}"; do
  name=${tune%%:*}
  if tune_finished "$name" && [ ! -s "$run/$name.nemo" ]; then
    stage "$name: eval (the held-out speaker; the codec before, once, then after) and export"
    if [ -z "$evaluated_before" ]; then
      python3 tools/voice/codec.py eval "$run/codec.nemo" "$work/data" --limit 48
      evaluated_before=1
    fi
    python3 tools/voice/codec.py eval "$run/$name.ckpt" "$work/data" --limit 48
    python3 tools/voice/codec.py export "$run/$name.ckpt" "$run/$name.nemo"
  fi
done
if [ -n "$codec_pid" ]; then
  wait "$codec_pid" || { cat "$work/codec-train.out"; exit 1; }
  grep -v '^step .* steps/s)$' "$work/codec-train.out" || true
  tail -n 3 "$work/codec-train.out"
  rm -f "$run/codec.nemo"
fi

if codec_finished && [ ! -s "$run/codec.nemo" ]; then
  stage "codec eval and export"
  python3 tools/voice/codec.py eval "$run/codec.ckpt" "$work/data" --limit 48
  python3 tools/voice/codec.py eval "$run/codec.ckpt" "$work/data" --split train --limit 48
  python3 tools/voice/codec.py export "$run/codec.ckpt" "$run/codec.nemo"
fi
if lm_done; then
  stage "LM export"
  rm -rf "$run/model"
  python3 tools/voice/lm.py export "$run/lm" "$run/model"
fi
if { lm_done || ! lm_wanted; } && [ -s "$run/codec.nemo" ] && { tunes_finished || ! tune_wanted; }; then
  echo "recipe: finished"
else
  echo "recipe: stopped in the trainings; run again"
fi
