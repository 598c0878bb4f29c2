#!/usr/bin/env bash
# The CUDA backend on a GPU host: gepard-cuda-check parity (CPU reference against the GPU, greedy
# and sampled generation in lockstep) on fresh random test models — the tiny preset and the
# gepard-1.0 shapes — a compute-sanitizer pass over a small run, then the decode step time for
# B = 1, 8, 64, 256 with and without CUDA graphs; the parity and the sanitizer with the few-row
# kernels never used and used up to 8 rows (GEPARD_CUDA_GEMV_ROWS=0, 8), and B = 1, 2, 4, 8 with
# each. `gpu-cuda-check.sh diag` instead runs the parity with the GEMMs summed without tensor
# cores, and profiles a batch-1 decode with ncu.
# `gpu-cuda-check.sh model DIR` runs the parity, the text-CFG check and the engine benchmark (LM and
# codec on the GPU) on one model directory, e.g. the default voice, instead of the random test
# models.
# `gpu-cuda-check.sh codec` checks the GPU's audio decoder against the CPU codec (tiny and
# published codec shapes, plain fp32 sums and each GEMM of GEPARD_CODEC_GEMMS: the own TF32 kernel,
# the own fp16 kernel, cuBLAS), runs compute-sanitizer over the fp16 kernel (the tools of
# GEPARD_CODEC_SANITIZERS, default memcheck racecheck), times the batched pass, profiles one pass
# over 256 streams (GEMM: GEPARD_CUDA_CODEC_GEMM; GEPARD_CODEC_PROFILE=0 skips it) and runs the
# engine benchmark end to end (LM and codec) on the gepard-1.0 shapes, with the codec pass beside
# the LM's steps (which run on while it does) and, for comparison, with each step waiting for the
# pass beside it and with the pass after each step (GEPARD_CODEC_ENGINE=0 skips them).
#
# The host needs no build tools: `gpu-cuda-check.sh pack`, run here after a build
# (GEPARD_BUILD_DIR, default build), copies the binaries to $GEPARD_PREFIX/build (default
# device-prefix/build: kernels/libgepard-cuda.so, gepard-core/libgepard.so, tools/gepard-bench,
# tools/gepard-make-test-model, tools/gepard-cuda-check, tests/test-backend) and downloads the
# Debian packages of the libraries they load into $GEPARD_PREFIX/debs (those they name
# themselves: GLib, json-glib, OpenBLAS, libsoup) and debs/fallback (what those load in turn);
# on the host the first are unpacked, the others only where the host lacks one of them. Logs go
# to $OUT (default build/gpu-cuda-check). The binaries are packed stripped. GEPARD_PACK_LEAN=1
# leaves out OpenBLAS and the fallback, which the lent hosts have had (2026-12: an H100 had
# OpenBLAS and what GLib and libsoup load, not GLib itself), so that the pack (7.8 MB) travels
# beside models/voice within what a call carries (64 MiB): enough for `gpu-cuda-check.sh model
# models/voice` there.
set -uo pipefail
cd "$(dirname "$0")/.."

prefix=${GEPARD_PREFIX:-$PWD/device-prefix}
bin=$prefix/build

if [ "${1:-}" = pack ]; then
  set -e
  build=${GEPARD_BUILD_DIR:-build}
  files=(kernels/libgepard-cuda.so gepard-core/libgepard.so tools/gepard-bench
    tools/gepard-make-test-model tools/gepard-cuda-check tests/test-backend)
  rm -rf "$bin" "$prefix/debs"
  mkdir -p "$prefix/debs"
  for f in "${files[@]}"; do
    install -D "$build/$f" "$bin/$f"
    strip --strip-unneeded "$bin/$f"
  done
  # the Debian package of each library path on standard input, the C and C++ runtimes left out
  packages_of() {
    while read -r lib; do
      dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
    done | cut -d: -f1 | sort -u | grep -v -x -E 'libc6|libgcc-s1|libstdc\+\+6|zlib1g' || true
  }
  paths=$(for f in "${files[@]}"; do ldd "$build/$f"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u)
  needed=$(for f in "${files[@]}"; do readelf -d "$build/$f"; done | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' \
    | sort -u)
  direct=$(awk 'NR == FNR { want[$1] = 1; next } ($1 in want) { print $2 }' <(echo "$needed") \
    <(echo "$paths") | packages_of)
  closure=$(awk '{ print $2 }' <<<"$paths" | packages_of)
  rest=$(comm -13 <(echo "$direct") <(echo "$closure"))
  if [ "${GEPARD_PACK_LEAN:-0}" = 1 ]; then
    direct=$(grep -v -x 'libopenblas0-pthread' <<<"$direct" || true)
    rest=
  fi
  # (apt's note that it downloads unsandboxed, as root, is left out)
  # shellcheck disable=SC2086 # one word per package
  (cd "$prefix/debs" && apt-get download $direct 2>&1 >/dev/null | grep -v unsandboxed) || true
  if [ -n "$rest" ]; then
    mkdir -p "$prefix/debs/fallback"
    # shellcheck disable=SC2086
    (cd "$prefix/debs/fallback" && apt-get download $rest 2>&1 >/dev/null | grep -v unsandboxed) || true
  fi
  for p in $direct; do ls "$prefix/debs/${p}_"*.deb >/dev/null; done
  for p in $rest; do ls "$prefix/debs/fallback/${p}_"*.deb >/dev/null; done
  echo "packed into $prefix: $(wc -w <<<"$direct") packages, $(wc -w <<<"$rest") fallback," \
    "$(du -sh "$prefix" | cut -f1)"
  exit 0
fi
out=${OUT:-$PWD/build/gpu-cuda-check}
models=${GEPARD_CHECK_MODELS:-/tmp/gepard-check-models}
libs=/tmp/gepard-check-libs
mkdir -p "$out" "$models" "$libs"
exec > >(tee "$out/gpu-cuda-check.log") 2>&1

step() { echo; echo "=== $* ($(date -u +%T))"; }

# kernel times by kernel name from an ncu CSV of gpu__time_duration.sum
kernel_times() {
  python3 - "$1" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
by = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("void ", "").split("(")[0]
    by[name][0] += 1
    by[name][1] += float(r["Metric Value"].replace(",", "")) / 1e6
total = sum(v[1] for v in by.values())
print(f"{len(rows)} kernels, {total:.3f} ms in all")
for name, (n, ms) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:28s} {n:5d} launches {ms:8.3f} ms {100 * ms / total:5.1f} %")
EOF
}

for deb in "$prefix"/debs/*.deb; do dpkg -x "$deb" "$libs"; done
export LD_LIBRARY_PATH=$libs/usr/lib/x86_64-linux-gnu:$libs/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# GLib's own dependencies, only where the host lacks them (its newer copies are kept otherwise)
if ldd "$bin/gepard-core/libgepard.so" "$bin/tools/gepard-bench" | grep -q "not found" \
  && [ -d "$prefix/debs/fallback" ]; then
  for deb in "$prefix"/debs/fallback/*.deb; do dpkg -x "$deb" "$libs/fallback"; done
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$libs/fallback/usr/lib/x86_64-linux-gnu:$libs/fallback/lib/x86_64-linux-gnu
fi
export GEPARD_BACKEND_DIR=$bin/kernels GEPARD_BUILD_DIR=$bin GEPARD_SOURCE_DIR=$PWD
# a fixed KV cache, so the check neither waits for nor holds most of the GPU's memory
export GEPARD_KV_CACHE_MIB=${GEPARD_KV_CACHE_MIB:-16384}

step host
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
ldd "$bin/gepard-core/libgepard.so" "$bin/tools/gepard-bench" | grep "not found" || echo "all libraries found"

step test-backend
timeout 60 "$bin/tests/test-backend" --tap

if [ "${1:-}" = diag ]; then
  # where the GPU's logits differ from the CPU's: the same parity with the GEMMs summed in plain
  # fp32 (no tensor cores), and the kernel times of a batch-1 decode
  for layers in 2 14; do
    timeout 150 "$bin/tools/gepard-make-test-model" -p gepard-1.0 --codec none \
      --layers "$layers" "$models/g1-$layers" >/dev/null
    step "parity, gepard-1.0 shapes, $layers layers, GEMMs in plain fp32"
    GEPARD_CUDA_GEMM_PEDANTIC=1 timeout 200 "$bin/tools/gepard-cuda-check" parity \
      "$models/g1-$layers" --batches 1,8 --frames 50
  done
  step "kernel times, batch 1, context 64 (the prefill, then 2 warm-up steps and 2 timed ones)"
  GEPARD_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --log-file "$out/ncu-b1.csv" \
    "$bin/tools/gepard-cuda-check" bench "$models/g1-14" --batches 1 --contexts 64 --steps 2 \
    >/dev/null
  kernel_times "$out/ncu-b1.csv"
  step "done"
  exit 0
fi

if [ "${1:-}" = model ]; then
  model=${2:?usage: gpu-cuda-check.sh model DIR}
  step "parity, $model"
  timeout 200 "$bin/tools/gepard-cuda-check" parity "$model" --batches 1,8 --frames 100
  echo "exit $?"
  step "text-CFG, $model"
  timeout 120 "$bin/tools/gepard-cuda-check" cfg "$model" --frames 100
  echo "exit $?"
  step "codec, $model"
  timeout 200 "$bin/tools/gepard-cuda-check" codec "$model" --frames 12 --batches 1,64,256
  echo "exit $?"
  step "engine end to end (LM + codec on the GPU), $model, 200 frames"
  timeout 300 "$bin/tools/gepard-bench" engine "$model" --device cuda \
    --concurrency "${GEPARD_ENGINE_CONCURRENCY:-1,1,8,64,256}" --frames 200
  echo "exit $?"
  step "done"
  exit 0
fi

if [ "${1:-}" = codec ]; then
  step "ceilings: copy bandwidth, bf16 and TF32 matrix products (PyTorch)"
  timeout 120 python3 - <<'EOF'
import torch
def timed(fn, reps=20):
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / 1e3
a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
t = timed(lambda: b.copy_(a))
print(f"device copy: {2 * a.numel() / t / 1e12:.2f} TB/s (read + write)")
for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "TF32")):
    torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.randn(8192, 8192, device="cuda", dtype=dtype); y = torch.randn_like(x)
    t = timed(lambda: x @ y, 10)
    print(f"{name} matrix product 8192^3: {2 * 8192 ** 3 / t / 1e12:.0f} TFLOP/s")
EOF
  gemms=${GEPARD_CODEC_GEMMS:-own fp16 cublas}
  step "tiny model with its codec"
  rm -rf "$models/tiny-codec"
  timeout 60 "$bin/tools/gepard-make-test-model" -p tiny "$models/tiny-codec" >/dev/null
  for gemm in $gemms; do
    step "codec parity, tiny, GEMMs: $gemm"
    GEPARD_CUDA_CODEC_GEMM=$gemm timeout 120 "$bin/tools/gepard-cuda-check" codec \
      "$models/tiny-codec" --frames 40 --batches 1,64
    echo "exit $?"
  done
  GEPARD_CUDA_CODEC_PEDANTIC=1 timeout 120 "$bin/tools/gepard-cuda-check" codec \
    "$models/tiny-codec" --frames 40 --batches 1
  echo "exit $?"
  if command -v compute-sanitizer >/dev/null; then
    for tool in ${GEPARD_CODEC_SANITIZERS:-memcheck racecheck}; do
      step "compute-sanitizer $tool, tiny codec, fp16 GEMMs"
      GEPARD_CUDA_CODEC_GEMM=fp16 GEPARD_CUDA_GRAPHS=0 timeout 200 compute-sanitizer --tool "$tool" \
        --print-limit 20 "$bin/tools/gepard-cuda-check" codec "$models/tiny-codec" --frames 3 \
        --batches 3,20 --steps 2
      echo "exit $?"
    done
  fi
  step "gepard-1.0 shapes with the published codec's shapes"
  timeout 200 "$bin/tools/gepard-make-test-model" -p gepard-1.0 "$models/g1-codec" >/dev/null
  for gemm in $gemms; do
    step "codec parity and pass time, published codec shapes, GEMMs: $gemm"
    GEPARD_CUDA_CODEC_GEMM=$gemm timeout 300 "$bin/tools/gepard-cuda-check" codec \
      "$models/g1-codec" --frames 12 --batches "${GEPARD_CODEC_BATCHES:-1,8,32,128,256,512,1024}" \
      --pass-frames "${GEPARD_CODEC_PASS_FRAMES:-1,2,8}"
    echo "exit $?"
  done
  GEPARD_CUDA_CODEC_PEDANTIC=1 timeout 200 "$bin/tools/gepard-cuda-check" codec \
    "$models/g1-codec" --frames 12 --batches 1
  echo "exit $?"
  if [ "${GEPARD_CODEC_PROFILE:-1}" = 0 ]; then
    step "done"
    exit 0
  fi
  step "kernel times of one codec pass over 256 streams"
  GEPARD_CUDA_CODEC_PROFILE=256 timeout 200 ncu --clock-control none --profile-from-start off \
    --metrics gpu__time_duration.sum --csv --print-units base --log-file "$out/ncu-codec.csv" \
    "$bin/tools/gepard-cuda-check" codec "$models/g1-codec" --frames 2 --batches 256 --steps 1 \
    >/dev/null
  kernel_times "$out/ncu-codec.csv"
  if [ "${GEPARD_CODEC_ENGINE:-1}" = 0 ]; then
    step "done"
    exit 0
  fi
  step "engine end to end (LM + codec on the GPU), gepard-1.0 shapes, 200 frames"
  # the GPU's memory in use, sampled while the benchmark runs
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 >"$out/memory.log" &
  sampler=$!
  timeout 400 "$bin/tools/gepard-bench" engine "$models/g1-codec" --device cuda \
    --concurrency "${GEPARD_ENGINE_CONCURRENCY:-1,1,8,32,128,256,512,1024}" --frames 200
  echo "exit $?"
  kill "$sampler" 2>/dev/null
  echo "GPU memory in use during the benchmark: at most $(sort -n "$out/memory.log" | tail -1) MiB"
  step "the same with each LM step waiting for the codec pass beside it (GEPARD_DECODE_LEAD=1)"
  GEPARD_DECODE_LEAD=1 timeout 300 "$bin/tools/gepard-bench" engine "$models/g1-codec" \
    --device cuda --concurrency "${GEPARD_ENGINE_LEAD1_CONCURRENCY:-1,1,8,256}" --frames 200
  echo "exit $?"
  step "the same with each codec pass after the LM step instead of beside it"
  GEPARD_DECODE_ALONGSIDE=0 timeout 300 "$bin/tools/gepard-bench" engine "$models/g1-codec" \
    --device cuda --concurrency "${GEPARD_ENGINE_SERIAL_CONCURRENCY:-1,1,256}" --frames 200
  echo "exit $?"
  step "done"
  exit 0
fi

step "tiny model"
rm -rf "$models/tiny"
timeout 60 "$bin/tools/gepard-make-test-model" -p tiny --codec none "$models/tiny" >/dev/null
step "text-CFG, tiny"
timeout 90 "$bin/tools/gepard-cuda-check" cfg "$models/tiny" --frames 50
echo "exit $?"
for rows in 0 8; do
  step "parity, tiny, GEPARD_CUDA_GEMV_ROWS=$rows"
  GEPARD_CUDA_GEMV_ROWS=$rows timeout 90 "$bin/tools/gepard-cuda-check" parity "$models/tiny" \
    --batches 1,8 --frames 50
  echo "exit $?"
  if command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck, tiny, GEPARD_CUDA_GEMV_ROWS=$rows"
    GEPARD_CUDA_GEMV_ROWS=$rows timeout 120 compute-sanitizer --tool memcheck --print-limit 20 \
      "$bin/tools/gepard-cuda-check" parity "$models/tiny" --batches 3 --frames 4
    echo "exit $?"
  fi
done

# gepard-1.0 shapes with 2 layers (the kernels at head_dim 256, little depth to amplify
# rounding differences) and with all 14
for layers in 2 14; do
  step "gepard-1.0 shapes, $layers layers"
  timeout 150 "$bin/tools/gepard-make-test-model" -p gepard-1.0 --codec none --layers "$layers" \
    "$models/g1-$layers" >/dev/null
  for rows in 0 8; do
    step "parity, gepard-1.0 shapes, $layers layers, GEPARD_CUDA_GEMV_ROWS=$rows"
    GEPARD_CUDA_GEMV_ROWS=$rows timeout 200 "$bin/tools/gepard-cuda-check" parity \
      "$models/g1-$layers" --batches 1,8 --frames 50
    echo "exit $?"
  done
done
step "decode step time, gepard-1.0 shapes"
timeout 200 "$bin/tools/gepard-cuda-check" bench "$models/g1-14" --batches 1,8,64,256 \
  --contexts 64,1024 --steps 20
echo "exit $?"
for rows in 0 8; do
  step "decode step time, gepard-1.0 shapes, GEPARD_CUDA_GEMV_ROWS=$rows"
  GEPARD_CUDA_GEMV_ROWS=$rows timeout 200 "$bin/tools/gepard-cuda-check" bench "$models/g1-14" \
    --batches 1,2,4,8 --contexts 64,1024 --steps 20
  echo "exit $?"
done
step "decode step time, gepard-1.0 shapes, without CUDA graphs"
GEPARD_CUDA_GRAPHS=0 timeout 200 "$bin/tools/gepard-cuda-check" bench "$models/g1-14" \
  --batches 1,8,64,256 --contexts 64,1024 --steps 20
echo "exit $?"
step "done"
