#!/usr/bin/env bash
# Imports the four reference voices the PyPI `neutts` 1.4.1 wheel carries in neutts/samples
# (emily, paul, sophie, steven) into voices/, from the copy scripts/setup.sh unpacks into
# .onebit/neutts/samples/.
#   language: en-us. The wheel's README (dist-info/METADATA, "Example Reference Files") lists all
#             four under "English" (they are the NeuTTS-2E speakers, "a fixed-speaker emotional
#             English model", and "work as ordinary cloning references for the other models").
#   licence:  the wheel's neutts-1.4.1.dist-info/licenses/LICENSE, the NeuTTS Open License v1.0
#             (setup.sh keeps it as .onebit/neutts/licenses/LICENSE; METADATA has no License field).
# Idempotent: once all four voices exist it only checks; ONEBIT_FORCE=1 imports again.
# The CLI is `cargo run --release`, or $ONEBIT_TTS when set (a built onebit-tts binary).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

samples=.onebit/neutts/samples
licence=.onebit/neutts/licenses/LICENSE
names=(emily paul sophie steven)

for n in "${names[@]}"; do
  for ext in pt txt; do
    if [ ! -f "$samples/$n.$ext" ]; then
      echo "import-neutts-voices: $samples/$n.$ext is missing; run scripts/setup.sh first" >&2
      exit 1
    fi
  done
done
# The licence recorded in the voice files must be the one the wheel ships.
if ! grep -q "NeuTTS Open License v1.0" "$licence" 2>/dev/null; then
  echo "import-neutts-voices: $licence is missing or is no longer the NeuTTS Open License v1.0;" \
    "check the wheel's licence before importing" >&2
  exit 1
fi

missing=()
for n in "${names[@]}"; do
  [ -f "voices/$n.json" ] || missing+=("$n")
done
if [ ${#missing[@]} -eq 0 ] && [ "${ONEBIT_FORCE:-0}" != 1 ]; then
  echo "import-neutts-voices: voices/{emily,paul,sophie,steven}.json already imported"
  exit 0
fi

if [ -n "${ONEBIT_TTS:-}" ]; then
  tts=("$ONEBIT_TTS")
else
  tts=(cargo run --quiet --release --)
fi
# --force: these four files are derived from the wheel; a partial earlier import is replaced.
"${tts[@]}" voices import "$samples" \
  --lang en-us \
  --source "neutts 1.4.1 wheel (PyPI), neutts/samples" \
  --license "NeuTTS Open License v1.0" \
  --force
echo "import-neutts-voices: imported ${names[*]} into voices/"
