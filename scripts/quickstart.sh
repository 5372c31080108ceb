#!/usr/bin/env bash
# The main job on a fresh machine: install the runtime pieces, build, and speak one sentence
# with the vendor's voice dave (shipped in voices/; VOICE=NAME for another).
# Uses models/neutts-air when a real package is there, else generates the tiny test package
# (random weights: it produces sound-like audio but speaks no words, and never draws its end
# token, so the sentence ends at its code budget with a warning).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cargo build --release --locked
if [ -f models/neutts-air/genai_config.json ]; then
  model=models/neutts-air
  note="real NeuTTS-air package"
else
  [ -f models/tiny/genai_config.json ] || bash scripts/gen-test-models.sh
  model=models/tiny
  note="generated TEST package: random weights, it speaks no words"
fi
voice="${VOICE:-dave}"
out="${OUT:-$root/out.wav}"
echo "== say on $model ($note)"
target/release/onebit-tts say --model "$model" --voice "$voice" -o "$out" \
  "${TEXT:-Hello from onebit-tts. This sentence runs through the whole pipeline.}"
echo "== audio written to $out"
