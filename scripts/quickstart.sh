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
bash scripts/setup.sh --release-build
cargo build --release --locked
bin=target/release/onebit-tts
# The model: the real one `models setup` keeps or pulls (`say`'s default model finds it), else
# the generated test package.
setup_args=()
[ "${ONEBIT_PULL:-1}" = 0 ] && setup_args=(--no-pull)
echo "== the real model: $bin models setup ${setup_args[*]}"
if "$bin" models setup "${setup_args[@]}"; then
  model_args=()
  note="the real NeuTTS-air package above"
else
  echo "== using the test package instead (the error above says why)" >&2
  # onebit_weights.json: a package generated before it existed does not say it speaks no words.
  [ -f models/tiny/genai_config.json ] && [ -f models/tiny/onebit_weights.json ] ||
    bash scripts/gen-test-models.sh
  model_args=(--model models/tiny)
  note="generated TEST package models/tiny: random weights, it speaks no words"
fi
voice="${VOICE:-dave}"
out="${OUT:-$root/out.wav}"
echo "== say on $note"
"$bin" say "${model_args[@]}" --voice "$voice" -o "$out" \
  "${TEXT:-Hello from onebit-tts. This sentence runs through the whole pipeline.}"
echo "== audio written to $out"
