#!/usr/bin/env bash
# espeak-ng (and the fortunes and dictionary text files) for a GPU host without them or a network.
#
#   tools/voice/espeak-prefix.sh pack    here (Debian bookworm): downloads the .debs into
#                                        $GEPARD_PREFIX/espeak/debs
#   tools/voice/espeak-prefix.sh env     there: unpacks them once with dpkg -x and prints the
#                                        exports: eval "$(tools/voice/espeak-prefix.sh env)"
#
# `pack` takes espeak-ng, espeak-ng-data (its English dictionary alone, as a tarball), and the
# packages of every shared library espeak-ng and libespeak-ng load (ldd, then dpkg -S: libpcaudio0,
# libsonic0, libasound2, libpulse0, libsndfile1 and its codecs, …), plus fortunes-min, fortunes and
# wamerican for tools/voice/corpus.py.
# espeak-ng must be installed here for ldd to see what it loads (scripts/lib.sh installs it). `env`
# links into one directory only the libraries the host's loader does not already find
# (ldconfig -p), so the host's own are kept wherever it has them; PulseAudio's private library
# stays in its pulseaudio/ sub-directory, which goes on LD_LIBRARY_PATH too. It exports PATH
# (espeak-ng), LD_LIBRARY_PATH, ESPEAK_DATA_PATH (the directory holding espeak-ng-data, which
# espeak-ng reads itself and tools/voice/speech.py passes as --path), FORTUNES_DIR and WORDS_FILE
# (for corpus.py --fortunes-dir and --words-file).
#
# GEPARD_PREFIX defaults to device-prefix (git-ignored), which the GPU tool carries.
set -euo pipefail
cd "$(dirname "$0")/../.."

prefix=${GEPARD_PREFIX:-$PWD/device-prefix}
pack=$prefix/espeak
arch=x86_64-linux-gnu

pack() {
  local espeak
  espeak=$(command -v espeak-ng) || {
    echo "espeak-prefix: install espeak-ng here first (apt-get install espeak-ng)" >&2
    return 1
  }
  rm -rf "$pack"
  mkdir -p "$pack/debs"
  local files=("$espeak" "/usr/lib/$arch/libespeak-ng.so.1")
  files+=("/usr/lib/$arch"/pulseaudio/libpulsecommon-*.so)
  local packages
  packages=$(
    {
      for f in "${files[@]}"; do
        ldd "$f" | awk '$3 ~ /^\// {print $3}'
        echo "$f"
      done
    } | sort -u | while read -r lib; do
      dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
    done | cut -d: -f1 | sort -u | grep -v -x -E 'libc6|libgcc-s1|libstdc\+\+6|zlib1g'
  )
  packages="$packages espeak-ng espeak-ng-data fortunes-min fortunes wamerican"
  packages=$(echo $packages | tr ' ' '\n' | sort -u)
  (cd "$pack/debs" && apt-get download $packages >/dev/null)
  # of espeak-ng-data only what English voices read: its 111 other languages' dictionaries are 3.7
  # of the 11 MB a call would carry
  local data
  data=$(mktemp -d)
  dpkg -x "$pack"/debs/espeak-ng-data_*.deb "$data"
  find "$data" -name '*_dict' ! -name en_dict -delete
  rm -rf "${data:?}/usr/share"
  tar -C "$data" -czf "$pack/debs/espeak-ng-data-en.tar.gz" .
  rm -rf "$data" "$pack"/debs/espeak-ng-data_*.deb
  echo "packed into $pack: $(echo $packages | wc -w) packages, $(du -sh "$pack" | cut -f1)"
  echo $packages
}

environment() {
  local root=$pack/root lib=$pack/lib
  if [ ! -d "$pack/debs" ]; then
    echo "espeak-prefix: $pack/debs is missing; run 'pack' on a Debian machine first" >&2
    return 1
  fi
  if [ ! -f "$root/.unpacked" ]; then
    rm -rf "$root" "$lib"
    mkdir -p "$root" "$lib"
    for deb in "$pack"/debs/*.deb; do dpkg -x "$deb" "$root"; done
    for tarball in "$pack"/debs/*.tar.gz; do tar -xzf "$tarball" -C "$root"; done
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
export PATH=$root/usr/bin:\$PATH
export LD_LIBRARY_PATH=$lib:$root/usr/lib/$arch/pulseaudio\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export ESPEAK_DATA_PATH=$root/usr/lib/$arch
export FORTUNES_DIR=$root/usr/share/games/fortunes
export WORDS_FILE=$root/usr/share/dict/american-english
EOF
}

case ${1:-} in
  pack) pack ;;
  env) environment ;;
  *)
    echo "usage: $0 pack|env" >&2
    exit 2
    ;;
esac
