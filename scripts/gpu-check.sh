#!/usr/bin/env bash
# The llama engine on a GPU, end to end: builds onebit-tts with the device's cargo feature, then
# checks on the generated GGUF test package that llama.cpp put the layers on that GPU (its own
# load report) and that greedy speech from it is byte-identical to the ort engine's on the ONNX
# source; with MODEL=DIR (a real or real-shape GGUF package) it also compares 128 greedy codes on
# the GPU with the same package on the CPU and benches the backbone on the GPU.
#
#   scripts/gpu-check.sh vulkan|cuda|rocm   exit 0: every check passed; 1: one failed; 2: cannot run
#
# For a Strix Halo owner (the Radeon 8060S iGPU through Mesa's RADV) `vulkan` is the device check
# to run; on a machine without a GPU, Mesa's software driver (lavapipe) runs it for correctness
# only (set GGML_VK_VISIBLE_DEVICES=0: ggml skips devices that call themselves CPUs; its speed
# means nothing).
#
# Needs: scripts/setup.sh and scripts/gen-test-models.sh run, and the device's build tools
# (docs/models.md, "GGUF on a GPU"): vulkan: the Vulkan loader and a driver, glslc, Vulkan headers
# 1.4 or newer (system, or VULKAN_SDK=DIR with DIR/include and DIR/lib); cuda: a CUDA toolkit 12
# or newer with its static libraries (nvcc on PATH or CUDACXX; CMAKE_CUDA_ARCHITECTURES=90-real and
# the like builds one architecture); rocm: HIP 6.1 or newer with hipBLAS and rocBLAS (ROCM_PATH or
# HIP_PATH, else /opt/rocm; Debian's packages: HIP_PATH=/usr HIPCXX=clang++-21, and
# CMAKE_HIP_ARCHITECTURES=gfx1151 for a Strix Halo). The GPU binary is kept as
# target/release/onebit-tts-DEVICE; target/release/onebit-tts is rebuilt without it afterwards.
# BIN=PATH skips both builds and checks that binary alone (a build made elsewhere; the CPU and ort
# runs use it too).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail=0
say_() { printf '%-5s %s\n' "$1" "$2"; }
# at_least A.B C.D: version A.B (numbers) is C.D or newer; false for anything else in A.B.
at_least() {
  [[ "$1" =~ ^[0-9]+\.[0-9]+$ ]] || return 1
  local a="${1%%.*}" b="${1#*.}" c="${2%%.*}" d="${2#*.}"
  ((a > c || (a == c && b >= d)))
}

device="${1:-}"
case "$device" in
  vulkan) feature=vulkan; backend=Vulkan ;;
  cuda) feature=llama-cuda; backend=CUDA ;;
  rocm) feature=rocm; backend=ROCm ;;
  *) echo "usage: scripts/gpu-check.sh vulkan|cuda|rocm" >&2; exit 2 ;;
esac
[ -d models/tiny-gguf ] || { say_ SKIP "models/tiny-gguf missing: run scripts/gen-test-models.sh"; exit 2; }

if [ -n "${BIN:-}" ]; then
  gpu="$BIN"
  cpu="$BIN"
else
  if [ "$device" = vulkan ]; then
    command -v glslc >/dev/null || { say_ SKIP "glslc not found (Debian: apt-get install glslc)"; exit 2; }
    hdr="${VULKAN_SDK:+$VULKAN_SDK/include/vulkan/vulkan_core.h}"
    hdr="${hdr:-/usr/include/vulkan/vulkan_core.h}"
    ver="$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$hdr" 2>/dev/null || true)"
    major="$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\),.*/\1.\2/p' "$hdr" 2>/dev/null || true)"
    if ! [[ "$ver" =~ ^[0-9]+$ ]] || ! at_least "$major" 1.4; then
      say_ SKIP "Vulkan headers ${major:-missing}.${ver:-} at $hdr; ggml's Vulkan backend needs 1.4 or newer (set VULKAN_SDK)"
      exit 2
    fi
    say_ INFO "Vulkan headers $major.$ver ($hdr)"
  fi
  if [ "$device" = cuda ]; then
    nvcc="$(command -v "${CUDACXX:-nvcc}" || true)"
    [ -n "$nvcc" ] || {
      say_ SKIP "nvcc not found (the CUDA toolkit: put its bin/ on PATH or set CUDACXX)"
      exit 2
    }
    ver="$({ "$nvcc" --version 2>/dev/null || true; } \
      | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')"
    # A floor, not a ceiling: 11.8 fails (the bundled llama.cpp calls cudaGridDependencySynchronize
    # when built for sm_90); 12.4 builds.
    if ! at_least "$ver" 12.0; then
      say_ SKIP "CUDA toolkit ${ver:-of unknown version} at $nvcc; the bundled llama.cpp needs 12+"
      exit 2
    fi
    # llama-cpp-sys-2 links cuBLAS statically on Linux: the toolkit's static libraries must be
    # there, in its own lib64, or in the multiarch directory where a distribution's nvcc is
    # /usr/bin's.
    top="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
    found=""
    for d in "$top/lib64" "$top/lib/$(uname -m)-linux-gnu"; do
      [ -f "$d/libcublas_static.a" ] && [ -f "$d/libculibos.a" ] && { found="$d"; break; }
    done
    [ -n "$found" ] || {
      say_ SKIP "libcublas_static.a and libculibos.a (static libraries) not found beside $nvcc"
      exit 2
    }
    say_ INFO "CUDA toolkit $ver ($nvcc; static cuBLAS in $found)"
    # llama-cpp-sys-2 links from ROOT/lib64 of CUDA_LIBRARY_PATH (beside /usr/local/cuda*, /opt/cuda
    # and the system's directories).
    if [ "${found##*/}" = lib64 ]; then
      export CUDA_LIBRARY_PATH="${CUDA_LIBRARY_PATH:-$(dirname "$found")}"
    fi
  fi
  if [ "$device" = rocm ]; then
    # Where llama-cpp-sys-2 looks: ROCM_PATH, else HIP_PATH, else /opt/rocm.
    rocm="${ROCM_PATH:-${HIP_PATH:-/opt/rocm}}"
    hv="$rocm/include/hip/hip_version.h"
    maj="$(sed -n 's/^#define HIP_VERSION_MAJOR \([0-9]*\)$/\1/p' "$hv" 2>/dev/null || true)"
    min="$(sed -n 's/^#define HIP_VERSION_MINOR \([0-9]*\)$/\1/p' "$hv" 2>/dev/null || true)"
    if ! at_least "$maj.$min" 6.1; then
      what="HIP $maj.$min"; [ -n "$maj" ] || what="no HIP version header"
      say_ SKIP "$what at $hv; ggml's HIP backend needs HIP 6.1 or newer"
      say_ SKIP "(ROCM_PATH=DIR for AMD's packages outside /opt/rocm; HIP_PATH=/usr for Debian's)"
      exit 2
    fi
    say_ INFO "HIP $maj.$min ($hv)"
  fi
  echo "building with --features $feature (minutes: llama.cpp's $backend backend)" >&2
  cargo build --release --locked --features "$feature" >&2
  cp target/release/onebit-tts "target/release/onebit-tts-$device"
  cargo build --release --locked >&2
  gpu="target/release/onebit-tts-$device"
  cpu=target/release/onebit-tts
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
text="Hello from the GPU check."
args=(--voice test --seed 7 --temperature 0)
if ! "$gpu" say --verbose --model models/tiny-gguf --device "$device" "${args[@]}" -o "$tmp/gpu.wav" "$text" \
    >"$tmp/gpu.log" 2>&1; then
  say_ FAIL "say --device $device: $(grep -m1 '^error' "$tmp/gpu.log" || tail -1 "$tmp/gpu.log")"
  exit 1
fi
line="$(grep -m1 -o 'llama.cpp .*' "$tmp/gpu.log" || true)"
# The evidence is a weight buffer on a device of that backend (llama.cpp's offload line repeats
# the request).
if printf '%s' "$line" | grep -Eq "weights in .*$backend[0-9]+ [0-9.]+ MiB"; then
  say_ PASS "llama.cpp reports: ${line#*; }"
else
  say_ FAIL "no weights on a $backend device in llama.cpp's report: ${line:-no engine line}"
  fail=1
fi
grep -q " on $device," "$tmp/gpu.log" && say_ PASS "say reports the device $device" \
  || { say_ FAIL "say did not report $device: $(grep -m1 '^wrote' "$tmp/gpu.log")"; fail=1; }
"$cpu" say -q --model models/tiny --engine ort "${args[@]}" -o "$tmp/ort.wav" "$text" 2>/dev/null
if cmp -s "$tmp/gpu.wav" "$tmp/ort.wav"; then
  say_ PASS "greedy audio on $device is byte-identical to --engine ort on the ONNX source"
else
  say_ FAIL "greedy audio on $device differs from --engine ort's"
  fail=1
fi
if [ -n "${MODEL:-}" ]; then
  # 128 greedy codes (the end token held off) on the GPU and on the CPU, same binary and package.
  long=(--voice test --seed 7 --temperature 0 --min-new-tokens 128 --max-new-tokens 128)
  "$gpu" say -q --model "$MODEL" --device "$device" "${long[@]}" --codes "$tmp/gpu.json" \
    -o "$tmp/m-gpu.wav" "$text"
  "$cpu" say -q --model "$MODEL" --engine llama --device cpu "${long[@]}" --codes "$tmp/cpu.json" \
    -o "$tmp/m-cpu.wav" "$text"
  python3 - "$tmp/gpu.json" "$tmp/cpu.json" "$device" <<'PY'
import json, sys
def codes(p):
    return [c for piece in json.load(open(p))["pieces"] for c in piece["codes"]]
g, c = codes(sys.argv[1]), codes(sys.argv[2])
same = next((i for i, (a, b) in enumerate(zip(g, c)) if a != b), min(len(g), len(c)))
print(f"INFO  {sys.argv[3]} and cpu: {same} of {len(g)}/{len(c)} greedy codes equal from the start")
PY
  "$gpu" bench --model "$MODEL" --device "$device" --engine-only --runs 3 --new-tokens 128
fi
exit "$fail"
