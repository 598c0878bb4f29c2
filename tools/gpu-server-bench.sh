#!/usr/bin/env bash
# gepard-server against its PyTorch peer (tools/peer/) on one GPU host, through the same WebSocket
# client (gepard-bench server), at each concurrency level: per stream time to first audio byte and
# RTF, p50/p90/p99, aggregate real time, and the Gepard/peer ratio, as one markdown table.
#
#   tools/gpu-server-prefix.sh pack      here, once per build (carried in device-prefix/)
#   tools/gpu-server-bench.sh            there; OUT (default build/gpu-server-bench) gets the logs
#
# Every stream sends a turn of SENTENCES messages (continue true, then false) with lengths forced
# to FRAMES frames per sentence and the stop head ignored. The peer generates a context's text as
# one utterance, so it gets the same audio per stream as one message of FRAMES × SENTENCES frames.
# Settings: GEPARD_BENCH_CONCURRENCY (1,32,128,256,512,1024), GEPARD_BENCH_FRAMES (200),
# GEPARD_BENCH_SENTENCES (3), GEPARD_BENCH_PRESET (gepard-1.0), GEPARD_BENCH_DEVICE (cuda),
# GEPARD_BENCH_PEER_CONCURRENCY (the same levels), GEPARD_BENCH_PEER=0 skips the peer,
# GEPARD_BENCH_GEPARD=0 skips gepard-server. Each level is its own client run, so the levels that
# finished keep their lines in OUT when a run is cut short. With several GPUs in
# TTS_GPU_DEVICE_IDS (one engine each), gepard-server's /metrics is sampled during each level and
# OUT/devices.md gives each device's mean and largest batch: how the streams were spread.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

prefix=${GEPARD_PREFIX:-$PWD/device-prefix}
out=${OUT:-$PWD/build/gpu-server-bench}
levels=${GEPARD_BENCH_CONCURRENCY:-1,32,128,256,512,1024}
peer_levels=${GEPARD_BENCH_PEER_CONCURRENCY:-$levels}
frames=${GEPARD_BENCH_FRAMES:-200}
sentences=${GEPARD_BENCH_SENTENCES:-3}
preset=${GEPARD_BENCH_PRESET:-gepard-1.0}
device=${GEPARD_BENCH_DEVICE:-cuda}
work=${TMPDIR:-/tmp}/gepard-server-bench
mkdir -p "$out" "$work"
exec > >(tee "$out/gpu-server-bench.log") 2>&1

eval "$(tools/gpu-server-prefix.sh env)"
# Python packages the host lacks (websockets for the peer), carried as unpacked wheels
[ -d "$prefix/server/python" ] && export PYTHONPATH=$prefix/server/python${PYTHONPATH:+:$PYTHONPATH}
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
max_c=$(tr ',' '\n' <<<"$levels,$peer_levels" | sort -n | tail -1)

step() { echo; echo "=== $* ($(date -u +%T))"; }

# runs the client once per level: bench_levels LEVELS RESULT_FILE FRAMES SENTENCES [SAMPLES]
# SAMPLES: where to record each device's batch size (gepard-server's /metrics) twice a second
bench_levels() {
  local c sampler
  for c in ${1//,/ }; do
    if [ -n "${5:-}" ]; then
      python3 - "$url" "$c" >>"$5" <<'EOF' &
import sys, time, urllib.request
url, level = sys.argv[1], sys.argv[2]
while True:
    try:
        text = urllib.request.urlopen(url + "metrics").read().decode()
    except OSError:
        break
    for line in text.splitlines():
        if line.startswith("gepard_device_batch_size{"):
            device = line.split('"')[1]
            print(level, device, line.rsplit(" ", 1)[1], flush=True)
    time.sleep(0.5)
EOF
      sampler=$!
    fi
    gepard-bench server "$url" --concurrency "$c" --frames "$3" --sentences "$4" \
      --sample-rate 22050 | tee -a "$2"
    [ -n "${5:-}" ] && kill "$sampler" 2>/dev/null
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      echo "the server exited during the level of C = $c, with status $? (over 128: signal)"
      return 1
    fi
  done
}

# starts a server command in the background; sets pid and url once it listens
start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  pid=$!
  url=""
  for _ in $(seq 600); do
    url=$(sed -n 's|.*listening on \(http://[^/]*/\).*|\1|p' "$log" | head -1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if [ -z "$url" ]; then
    cat "$log"
    return 1
  fi
  python3 - "$url" <<'EOF'
import sys, time, urllib.error, urllib.request
for _ in range(1500):  # until the model has loaded
    try:
        urllib.request.urlopen(sys.argv[1] + "health")
        sys.exit(0)
    except urllib.error.HTTPError as error:
        if error.code != 503:
            sys.exit(0)  # a server without /health (the peer) is ready once it listens
        time.sleep(0.2)
sys.exit(1)
EOF
}

step host
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
git log -1 --format='commit %h %cs' 2>/dev/null || true

step "model: $preset, random weights"
rm -rf "$work/model"
gepard-make-test-model -p "$preset" "$work/model" >/dev/null

if [ "${GEPARD_BENCH_GEPARD:-1}" != 0 ]; then
  step "gepard-server"
  start "$out/gepard-server.log" gepard-server --model "$work/model" --port 0 --host 127.0.0.1 \
    --device "$device" --max-contexts $((max_c * 2)) --max-frames 0 || exit 1
  rm -f "$out/devices.txt"
  bench_levels "$levels" "$out/gepard.txt" "$frames" "$sentences" "$out/devices.txt"
  kill "$pid"
  wait "$pid" 2>/dev/null
  python3 - "$out/devices.txt" <<'EOF' | tee "$out/devices.md"
import collections, sys
sizes = collections.defaultdict(list)
for line in open(sys.argv[1]):
    level, device, size = line.split()
    if float(size) > 0:
        sizes[int(level), device].append(float(size))
print("| C | device | mean batch (busy samples) | largest |")
print("|---:|---|---:|---:|")
for (level, device), values in sorted(sizes.items()):
    print(f"| {level} | {device} | {sum(values) / len(values):.0f} | {max(values):.0f} |")
EOF
fi

if [ "${GEPARD_BENCH_PEER:-1}" != 0 ]; then
  step "PyTorch peer"
  start "$out/peer.log" python3 tools/peer/gepard_peer.py --model "$work/model" --port 0 \
    --device "$device" --max-batch "$max_c" --max-len $((frames * sentences + 512)) || exit 1
  bench_levels "$peer_levels" "$out/peer.txt" $((frames * sentences)) 1
  kill "$pid"
  wait "$pid" 2>/dev/null
fi

step "table"
python3 - "$out" <<'EOF' | tee "$out/table.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def levels(name):
    path = out / name
    if not path.exists():
        return {}
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.startswith("{")]
    return {r["concurrency"]: r for r in rows}
gepard, peer = levels("gepard.txt"), levels("peer.txt")
print("| C | Gepard TTFA p50 | p90 | p99 | RTF p50 | p99 | aggregate | errors "
      "| peer TTFA p50 | RTF p50 | aggregate | errors | Gepard/peer |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in sorted(gepard):
    g, p = gepard[c], peer.get(c)
    cells = [str(c), f"{g['ttfa_ms']['p50']:.0f} ms", f"{g['ttfa_ms']['p90']:.0f} ms",
             f"{g['ttfa_ms']['p99']:.0f} ms", f"{g['rtf']['p50']:.3f}", f"{g['rtf']['p99']:.3f}",
             f"{g['aggregate']:.0f}×", str(g["errors"])]
    if p:
        cells += [f"{p['ttfa_ms']['p50']:.0f} ms", f"{p['rtf']['p50']:.3f}", f"{p['aggregate']:.0f}×",
                  str(p["errors"]), f"{g['aggregate'] / p['aggregate']:.1f}"]
    else:
        cells += ["–"] * 5
    print("| " + " | ".join(cells) + " |")
EOF
