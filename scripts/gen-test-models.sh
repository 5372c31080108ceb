#!/usr/bin/env bash
# Generates the test model packages (deterministic; ignored by git) with tools/gen_models.py:
#   models/tiny           chain variant: greedy decoding follows a known code sequence, then ends;
#                         its codec/ also holds a tiny NeuCodec-encoder-shaped encoder.onnx
#   models/tiny-textbias  the raw argmax is a text token at every step (sampler constraint tests)
#   models/tiny-random    strong random weights (token-for-token parity with onnxruntime-genai)
#   models/tiny-static    the chain with a static KV cache of 512 positions (AMD's NPU package
#                         shape): room for the test voice's prompt and codes, overflowed by a
#                         long prompt
#   models/tiny-static-f16  the same with float16 KV and logits, last-position logits and an
#                         int32 attention mask
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
"$py" tools/gen_models.py --out models/tiny-static --variant chain --kv-len 512
"$py" tools/gen_models.py --out models/tiny-static-f16 --variant chain --kv-len 512 \
  --kv-dtype float16 --last-logits --mask-dtype int32
