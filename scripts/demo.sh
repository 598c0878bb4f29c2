#!/usr/bin/env bash
# From a fresh machine: installs what is missing, builds, and synthesizes a sentence to hello.wav
# with a GStreamer pipeline of Gepard's elements.
#
#   ./scripts/demo.sh                 # the default voice in models/voice where there is one, else
#                                     # an untrained test model it generates (it does not speak)
#   ./scripts/demo.sh MODEL [TEXT]    # a model directory or a Hugging Face repo id in the local cache
set -euo pipefail
. "$(dirname "$0")/lib.sh"

install_system_packages
build

model=${1:-}
text=${2:-"Hello there! Gepard turns text into speech, one frame at a time."}
if [ -z "$model" ] && [ -f "$GEPARD_ROOT/models/voice/config.json" ]; then
  model="$GEPARD_ROOT/models/voice"
elif [ -z "$model" ]; then
  model="$GEPARD_ROOT/demo-model"
  rm -rf "$model"
  "$GEPARD_BUILD/tools/gepard-make-test-model" --preset tiny --seed 1 "$model"
fi

log "the model"
"$GEPARD_BUILD/tools/gepard-inspect" model "$model" --text "$text"

log "synthesizing to hello.wav"
export GST_PLUGIN_PATH="$GEPARD_BUILD/gst-plugins"
start=$(date +%s.%N)
gst-launch-1.0 -q \
  gepardtextsrc text="$text" ! gepardlm model="$model" device=cpu max-frames=150 \
  ! gepardcodec model="$model" ! audioconvert ! audio/x-raw,format=S16LE ! wavenc \
  ! filesink location=hello.wav
end=$(date +%s.%N)
seconds=$(python3 -c "import wave; w = wave.open('hello.wav'); print(f'{w.getnframes() / w.getframerate():.2f}')")
echo "wrote hello.wav: $seconds s of 22.05 kHz audio in $(python3 -c "print(f'{$end - $start:.2f}')") s"
about=$("$GEPARD_BUILD/tools/gepard-inspect" model "$model")
if grep -q "UNTRAINED TEST MODEL" <<<"$about"; then
  echo "NOTE: $model is an untrained test model with random weights: hello.wav is noise, not speech."
fi
