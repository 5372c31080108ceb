#!/usr/bin/env bash
# Generates the test model packages (deterministic; ignored by git) with tools/gen_models.py:
#   models/tiny           chain variant: greedy decoding follows a known code sequence, then ends;
#                         its codec/ also holds a tiny NeuCodec-encoder-shaped encoder.onnx
#   models/tiny-textbias  the raw argmax is a text token at every step (sampler constraint tests)
#   models/tiny-random    strong random weights (token-for-token parity with onnxruntime-genai)
# and the test voice voices/test.json.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.onebit/venv/bin/python"
[ -x "$py" ] || { echo "run scripts/setup.sh first" >&2; exit 1; }
cd "$root"
"$py" tools/gen_models.py --out models/tiny --variant chain --voice-out voices/test.json \
  --encoder-out models/tiny/codec/encoder.onnx
"$py" tools/gen_models.py --out models/tiny-textbias --variant textbias
"$py" tools/gen_models.py --out models/tiny-random --variant random
