#!/usr/bin/env bash
# gepard-server on a GPU host that has CUDA but none of the server's other libraries (GStreamer,
# libsoup, json-glib, libpq, …) and no network.
#
#   tools/gpu-server-prefix.sh pack          here, after a build: fills $GEPARD_PREFIX/server
#   tools/gpu-server-prefix.sh env           there: prints the environment to run from it
#   tools/gpu-server-prefix.sh smoke         there: a server on a tiny test model, one synthesis
#                                            checked (length, level, no NaN, no clipping runs),
#                                            then gepard-bench server at C = 1 and 8
#
# `pack` copies the project's binaries (GEPARD_BUILD_DIR, default build), the websockets package
# for the PyTorch peer (tools/peer/, unpacked for PYTHONPATH), and downloads, with
# apt-get, the Debian packages holding every shared library they and the GStreamer plugins the
# server's pipelines use load, found with ldd and dpkg -S: only what the binaries really load, not
# the packages' whole dependency trees. `env` unpacks them once with dpkg -x and links into one
# directory only the libraries the host's loader does not already find (ldconfig -p), so host
# libraries are kept wherever it has them. PostgreSQL is not carried: without it the server serves
# its built-in voices and says that cloning is unavailable.
#
# GEPARD_PREFIX defaults to device-prefix (git-ignored), which the GPU tool carries.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${GEPARD_PREFIX:-$PWD/device-prefix}
pack=$prefix/server
arch=x86_64-linux-gnu

# the GStreamer plugins the server's pipelines (pipelines/tts-stream*.txt) need beside Gepard's
plugins=(coreelements audioconvert audioresample app)

pack() {
  local build=${GEPARD_BUILD_DIR:-build}
  local bins=(server/gepard-server gst-plugins/libgstgepard.so gepard-core/libgepard.so
    tools/gepard-bench tools/gepard-make-test-model)
  rm -rf "$pack"
  mkdir -p "$pack/debs" "$pack/build"
  for bin in "${bins[@]}"; do
    install -D "$build/$bin" "$pack/build/$bin"
  done
  [ -f "$build/kernels/libgepard-cuda.so" ] && install -D "$build/kernels/libgepard-cuda.so" \
    "$pack/build/kernels/libgepard-cuda.so"
  cp -r pipelines "$pack/pipelines"

  local files=("${bins[@]/#/$build/}")
  files+=("/usr/lib/$arch/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner")
  for plugin in "${plugins[@]}"; do files+=("/usr/lib/$arch/gstreamer-1.0/libgst$plugin.so"); done
  # the packages of the libraries they load and of the plugins themselves
  local packages
  packages=$(
    {
      for f in "${files[@]}"; do
        ldd "$f" | awk '$3 ~ /^\// {print $3}'
        case $f in /usr/*) echo "$f" ;; esac
      done
    } | sort -u | while read -r lib; do
      dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
    done | cut -d: -f1 | sort -u | grep -v -x -E 'libc6|libgcc-s1|libstdc\+\+6|zlib1g'
  )
  (cd "$pack/debs" && apt-get download $packages >/dev/null)
  # the peer server's one package the host's Python lacks, unpacked for PYTHONPATH
  local python=${GEPARD_VENV:-$PWD/.venv}/bin/python
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$pack/wheels" "$(grep -i '^websockets==' tests/requirements.txt)"
  for wheel in "$pack"/wheels/*.whl; do "$python" -m zipfile -e "$wheel" "$pack/python"; done
  rm -rf "$pack/wheels"
  echo "packed into $pack: $(echo $packages | wc -w) packages, $(du -sh "$pack" | cut -f1)"
  echo "$packages" | tr '\n' ' '
  echo
}

environment() {
  local root=$pack/root lib=$pack/lib
  if [ ! -f "$root/.unpacked" ]; then
    rm -rf "$root" "$lib"
    mkdir -p "$root" "$lib"
    for deb in "$pack"/debs/*.deb; do dpkg -x "$deb" "$root"; done
    # link the libraries the host lacks; keep the host's own wherever it has them
    local have
    have=$(ldconfig -p | awk '{print $1}' | sort -u)
    find "$root/usr/lib/$arch" "$root/lib/$arch" -maxdepth 1 -name 'lib*.so.*' 2>/dev/null \
      | while read -r so; do
        name=$(basename "$so")
        grep -q -x -F "$name" <<<"$have" || ln -sf "$so" "$lib/$name"
      done
    touch "$root/.unpacked"
  fi
  cat <<EOF
export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export GST_PLUGIN_SYSTEM_PATH_1_0=$root/usr/lib/$arch/gstreamer-1.0
export GST_PLUGIN_SCANNER_1_0=$root/usr/lib/$arch/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner
export GST_PLUGIN_PATH_1_0=$pack/build/gst-plugins
export GST_REGISTRY_1_0=$pack/registry.bin
export GEPARD_BACKEND_DIR=$pack/build/kernels
export TTS_PIPELINE_DIR=$pack/pipelines
export PATH=$pack/build/server:$pack/build/tools:\$PATH
EOF
}

smoke() {
  eval "$(environment)"
  local work=${TMPDIR:-/tmp}/gepard-smoke
  rm -rf "$work"
  mkdir -p "$work"
  gepard-make-test-model -p tiny "$work/model" >/dev/null
  # the untrained model never stops by itself: cap each sentence
  TTS_DATA_DIR=$work/data gepard-server --model "$work/model" --port 0 --host 127.0.0.1 \
    --max-frames 120 >"$work/server.log" 2>&1 &
  server_pid=$!
  trap 'kill $server_pid 2>/dev/null || true' EXIT
  local port=""
  for _ in $(seq 100); do
    port=$(sed -n 's|.*listening on http://[^/]*:\([0-9]*\)/.*|\1|p' "$work/server.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.2
  done
  if [ -z "$port" ]; then
    cat "$work/server.log"
    return 1
  fi
  python3 - "$port" <<'EOF'
import json, struct, sys, time, urllib.error, urllib.request
port = int(sys.argv[1])
for _ in range(300):  # until the model has loaded
    try:
        health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/health"))
        break
    except urllib.error.HTTPError:
        time.sleep(0.2)
print("health:", json.dumps(health)[:300])
body = {"model_id": "sonic-3", "transcript": "Hello from the GPU host. This is a smoke test.",
        "voice": {"mode": "id", "id": "default"},
        "output_format": {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 22050}}
request = urllib.request.Request(f"http://127.0.0.1:{port}/tts/bytes", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Cartesia-Version": "2026-03-01"})
pcm = urllib.request.urlopen(request).read()
samples = struct.unpack(f"<{len(pcm) // 4}f", pcm)
n = len(samples)
nan = sum(1 for x in samples if x != x)
rms = (sum(x * x for x in samples if x == x) / max(n, 1)) ** 0.5
run = longest = 0
for x in samples:
    run = run + 1 if abs(x) >= 0.999 else 0
    longest = max(longest, run)
print(f"audio: {n} samples = {n / 22050:.2f} s ({n / 1024:.1f} frames), RMS {rms:.4f}, "
      f"NaN {nan}, longest clipped run {longest}")
ok = n > 0 and n % 1024 == 0 and nan == 0 and rms > 1e-4 and longest < 64
print("smoke:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
  gepard-bench server "http://127.0.0.1:$port" --concurrency 1,8 --frames 20 --sentences 2
}

case ${1:-} in
  pack) pack ;;
  env) environment ;;
  smoke) smoke ;;
  *)
    echo "usage: $0 pack|env|smoke" >&2
    exit 2
    ;;
esac
