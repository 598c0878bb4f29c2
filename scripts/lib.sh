# Shared by scripts/test.sh and scripts/demo.sh: install what is missing, build.
# Sourced, not run.

GEPARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GEPARD_BUILD=${GEPARD_BUILD:-$GEPARD_ROOT/build}
GEPARD_VENV=${GEPARD_VENV:-$GEPARD_ROOT/.venv}

# Debian bookworm packages the build and the tests need.
GEPARD_APT_PACKAGES=(
  build-essential meson ninja-build pkg-config clang-format
  clang libclang-rt-14-dev # libFuzzer and the sanitizer runtimes, for tests/fuzz
  libglib2.0-dev libjson-glib-dev libsamplerate0-dev libopenblas-dev
  libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libgstreamer-plugins-bad1.0-dev
  gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good
  libsoup-3.0-dev libpq-dev postgresql openssl
  chromium chromium-driver # headless browser for the playground page's test
  espeak-ng fortunes-min fortunes wamerican # speech and text of the default voice's recipe (tools/voice/)
  pocketsphinx pocketsphinx-en-us # recognizes the default voice in its intelligibility test
  python3 python3-venv python3-pip
)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

install_system_packages() {
  local missing=()
  for p in "${GEPARD_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

install_python_packages() {
  if [ ! -x "$GEPARD_VENV/bin/python" ]; then
    log "creating $GEPARD_VENV"
    python3 -m venv "$GEPARD_VENV"
  fi
  # the test packages, plus torch and transformers for the reference implementations the parity
  # tests compare against (large: a few GB on first install, cached by pip afterwards)
  local stamp="$GEPARD_VENV/.requirements"
  local wanted
  wanted=$(cat "$GEPARD_ROOT/tests/requirements.txt" "$GEPARD_ROOT/tests/requirements-torch.txt")
  if [ "$wanted" != "$(cat "$stamp" 2>/dev/null)" ]; then
    log "installing Python test packages (torch and transformers included)"
    # they take about 7 GB once installed, and pip unpacks them in the temporary folder first
    local free_kb
    free_kb=$(df -Pk "$GEPARD_VENV" | awk 'NR == 2 { print $4 }')
    if [ "${free_kb:-0}" -lt $((8 * 1024 * 1024)) ]; then
      log "warning: $((free_kb / 1024 / 1024)) GB free where $GEPARD_VENV is; the install needs about 8 GB"
    fi
    "$GEPARD_VENV/bin/pip" install -q --disable-pip-version-check \
      -r "$GEPARD_ROOT/tests/requirements-torch.txt"
    printf '%s' "$wanted" >"$stamp"
  fi
}

build() {
  local opts=()
  # CI builds treat every warning as an error
  [ "${CI:-}" = true ] && opts+=(--werror)
  if [ ! -f "$GEPARD_BUILD/build.ninja" ]; then
    log "configuring $GEPARD_BUILD"
    meson setup "$GEPARD_BUILD" "$GEPARD_ROOT" "${opts[@]}" >/dev/null
  fi
  log "building"
  ninja -C "$GEPARD_BUILD" >/dev/null
}
