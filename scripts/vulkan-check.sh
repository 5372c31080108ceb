#!/usr/bin/env bash
# The llama engine on Vulkan, end to end: builds onebit-tts with `--features vulkan`, then checks
# on the generated GGUF test package that llama.cpp put the layers on a Vulkan GPU (its own load
# report) and that greedy speech from it is byte-identical to the ort engine's on the ONNX source.
# For a Strix Halo owner (the Radeon 8060S iGPU through Mesa's RADV) this is the device check to
# run; on a machine without a GPU, Mesa's software driver (lavapipe) runs it for correctness only
# (set GGML_VK_VISIBLE_DEVICES=0: ggml skips devices that call themselves CPUs). Speed on lavapipe
# means nothing; give MODEL=DIR (a real GGUF package) to also bench the backbone on a real GPU.
#
#   scripts/vulkan-check.sh            exit 0: every check passed; 1: one failed; 2: cannot run
#
# Needs: scripts/setup.sh and scripts/gen-test-models.sh run; the Vulkan loader and a driver
# (mesa-vulkan-drivers), glslc, and Vulkan headers 1.4 or newer (system, or VULKAN_SDK=DIR with
# DIR/include and DIR/lib; docs/models.md, "GGUF on a GPU"). The Vulkan binary is kept as
# target/release/onebit-tts-vulkan; target/release/onebit-tts is rebuilt without it afterwards.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail=0
say_() { printf '%-5s %s\n' "$1" "$2"; }

command -v glslc >/dev/null || { say_ SKIP "glslc not found (Debian: apt-get install glslc)"; exit 2; }
hdr="${VULKAN_SDK:+$VULKAN_SDK/include/vulkan/vulkan_core.h}"
hdr="${hdr:-/usr/include/vulkan/vulkan_core.h}"
ver="$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$hdr" 2>/dev/null || true)"
major="$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\),.*/\1.\2/p' "$hdr" 2>/dev/null || true)"
if ! [[ "$ver" =~ ^[0-9]+$ && "$major" =~ ^[0-9]+\.[0-9]+$ ]] || [ "${major%%.*}" -lt 1 ] \
    || { [ "${major%%.*}" = 1 ] && [ "${major#*.}" -lt 4 ]; }; then
  say_ SKIP "Vulkan headers ${major:-missing}.${ver:-} at $hdr; ggml's Vulkan backend needs 1.4 or newer (set VULKAN_SDK)"
  exit 2
fi
say_ INFO "Vulkan headers $major.$ver ($hdr)"
[ -d models/tiny-gguf ] || { say_ SKIP "models/tiny-gguf missing: run scripts/gen-test-models.sh"; exit 2; }

echo "building with --features vulkan (minutes: llama.cpp's Vulkan shaders and backend)" >&2
cargo build --release --locked --features vulkan >&2
cp target/release/onebit-tts target/release/onebit-tts-vulkan
cargo build --release --locked >&2
vk=target/release/onebit-tts-vulkan
ort=target/release/onebit-tts

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
text="Hello from the Vulkan check."
args=(--voice test --seed 7 --temperature 0)
if ! "$vk" say --verbose --model models/tiny-gguf --device vulkan "${args[@]}" -o "$tmp/vulkan.wav" "$text" \
    >"$tmp/vulkan.log" 2>&1; then
  say_ FAIL "say --device vulkan: $(grep -m1 '^error' "$tmp/vulkan.log" || tail -1 "$tmp/vulkan.log")"
  exit 1
fi
line="$(grep -m1 -o 'llama.cpp .*' "$tmp/vulkan.log" || true)"
# The evidence is a weight buffer on a Vulkan device (llama.cpp's offload line repeats the request).
if printf '%s' "$line" | grep -Eq 'weights in .*Vulkan[0-9]+ [0-9.]+ MiB'; then
  say_ PASS "llama.cpp reports: ${line#*; }"
else
  say_ FAIL "no weights on a Vulkan device in llama.cpp's report: ${line:-no engine line}"
  fail=1
fi
grep -q ' on vulkan,' "$tmp/vulkan.log" && say_ PASS "say reports the device vulkan" \
  || { say_ FAIL "say did not report vulkan: $(grep -m1 '^wrote' "$tmp/vulkan.log")"; fail=1; }
"$ort" say -q --model models/tiny --engine ort "${args[@]}" -o "$tmp/ort.wav" "$text" 2>/dev/null
if cmp -s "$tmp/vulkan.wav" "$tmp/ort.wav"; then
  say_ PASS "greedy audio on Vulkan is byte-identical to --engine ort on the ONNX source"
else
  say_ FAIL "greedy audio on Vulkan differs from --engine ort's"
  fail=1
fi
if [ -n "${MODEL:-}" ]; then
  "$vk" bench --model "$MODEL" --device vulkan --engine-only --runs 3 --new-tokens 128
fi
exit "$fail"
