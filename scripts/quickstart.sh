#!/usr/bin/env bash
# The main job on a fresh machine: install the runtime pieces, build, and speak one sentence
# with the vendor's voice dave (shipped in voices/; VOICE=NAME for another).
# Uses a real package when one is there (models/neutts-air, models/neutts-air-q4 or -q8), else
# pulls the vendor's Q4 GGUF build from the Hugging Face Hub (`models pull neutts-air-q4`;
# ONEBIT_PULL=0 skips it), else generates the tiny test package (random weights: it produces
# sound-like audio but speaks no words, and never draws its end token, so the sentence ends at
# its code budget with a warning).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cargo build --release --locked
bin=target/release/onebit-tts
model=""
for m in models/neutts-air models/neutts-air-q4 models/neutts-air-q8; do
  if [ -f "$m/genai_config.json" ] || compgen -G "$m/*.gguf" >/dev/null; then
    model="$m"
    note="real NeuTTS-air package"
    break
  fi
done
if [ -z "$model" ] && [ "${ONEBIT_PULL:-1}" != 0 ]; then
  echo "== pulling the real model: $bin models pull neutts-air-q4"
  if "$bin" models pull neutts-air-q4; then
    model=models/neutts-air-q4
    note="real NeuTTS-air, the vendor's Q4 GGUF build on llama.cpp"
  else
    echo "== could not pull it (the line above says why); using the test package instead." >&2
    echo "   Where the hub is reachable (or HF_ENDPOINT names a mirror): $bin models pull neutts-air-q4" >&2
  fi
fi
if [ -z "$model" ]; then
  [ -f models/tiny/genai_config.json ] || bash scripts/gen-test-models.sh
  model=models/tiny
  note="generated TEST package: random weights, it speaks no words"
fi
voice="${VOICE:-dave}"
out="${OUT:-$root/out.wav}"
echo "== say on $model ($note)"
"$bin" say --model "$model" --voice "$voice" -o "$out" \
  "${TEXT:-Hello from onebit-tts. This sentence runs through the whole pipeline.}"
echo "== audio written to $out"
