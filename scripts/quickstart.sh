#!/usr/bin/env bash
# The main job on a fresh machine: install the runtime pieces, build, and speak one sentence
# with the vendor's voice dave (shipped in voices/; VOICE=NAME for another).
# `onebit-tts models setup` keeps a real package already there (models/neutts-air, -q4 or -q8),
# else pulls the vendor's Q4 GGUF build from the Hugging Face Hub (ONEBIT_PULL=0 skips it), and
# when it can do neither says what it could not reach and the commands that finish the job; then
# this speaks with the real model, or with the generated tiny test package (random weights: it
# produces sound-like audio but speaks no words, and never draws its end token, so the sentence
# ends at its code budget with a warning).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cargo build --release --locked
bin=target/release/onebit-tts
if [ "${ONEBIT_PULL:-1}" != 0 ]; then
  echo "== the real model: $bin models setup"
  "$bin" models setup || echo "== using the test package instead (the error above says why)" >&2
fi
model=""
for m in models/neutts-air models/neutts-air-q4 models/neutts-air-q8; do
  if [ -f "$m/genai_config.json" ] || compgen -G "$m/*.gguf" >/dev/null; then
    model="$m"
    note="real NeuTTS-air package"
    break
  fi
done
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
