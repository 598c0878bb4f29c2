#!/usr/bin/env bash
# From a fresh machine: installs what is missing, builds, and shows what Gepard loads from a model.
#
#   ./scripts/demo.sh                 # generates an untrained test model and inspects it
#   ./scripts/demo.sh MODEL [TEXT]    # a model directory or a Hugging Face repo id in the local cache
set -euo pipefail
. "$(dirname "$0")/lib.sh"

install_system_packages
build

model=${1:-}
text=${2:-"Hello there! Gepard turns 42 sentences into speech, one frame at a time."}
if [ -z "$model" ]; then
  model="$GEPARD_ROOT/demo-model"
  log "writing an untrained test model to $model (random weights: it does not speak)"
  rm -rf "$model"
  "$GEPARD_BUILD/tools/gepard-make-test-model" --preset tiny --seed 1 "$model"
fi

log "what Gepard loads from $model"
"$GEPARD_BUILD/tools/gepard-inspect" model "$model" --text "$text"
