#!/usr/bin/env bash
# Imports the vendor's reference voices shipped in samples/ (dave, jo, greta, juliette, mateo:
# NAME.pt codes + NAME.txt transcripts from the neuphonic/neutts repository, see
# samples/README.md) into voices/NAME.json with the project's own importer. voices/ holds the
# result, committed; this script is how it was made, and how to make it again (--force).
#   language: the vendor's README lists greta as German, juliette as French, mateo as Spanish;
#             dave and jo are English.
#   licence:  samples/LICENSE, the NeuTTS Open License v1.0. The voice files are a format
#             conversion of the .pt files, and their `source` says so (the licence's 4(b)).
# The CLI is `cargo run --release`, or $ONEBIT_TTS when set (a built onebit-tts binary).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! grep -q "NeuTTS Open License v1.0" samples/LICENSE 2>/dev/null; then
  echo "import-samples: samples/LICENSE is missing or not the NeuTTS Open License v1.0" >&2
  exit 1
fi
if [ -n "${ONEBIT_TTS:-}" ]; then
  tts=("$ONEBIT_TTS")
else
  tts=(cargo run --quiet --release --)
fi
"${tts[@]}" voices import samples \
  --lang en-us --lang greta=de --lang juliette=fr-fr --lang mateo=es \
  --source "neuphonic/neutts repository, samples/ at commit 857bec0 (copied to samples/); converted from the .pt codes by onebit-tts voices import" \
  --license "NeuTTS Open License v1.0 (samples/LICENSE)" \
  --dir voices "$@"
