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
#   models/tiny-random-exact  models/tiny-random's weights with MatMulNBits computing in float32
#                         (accuracy level 0): the reference the llama engine's logits follow
#   models/tiny-nomask    the chain with no attention_mask input (a position_ids input instead):
#                         onnxruntime-genai feeds a mask only where the graph declares one
#   models/tiny-gguf      GGUF packages of models/tiny and models/tiny-random for --engine llama:
#   models/tiny-random-gguf  tools/onnx_to_gguf.py with every weight float32 (the int4 blocks
#                         dequantised exactly), beside the source's tokenizer, configs and codec
#   models/tiny-emotion   models/tiny-random's weights read as a BPE model with emotions
#                         (angry, happy, sad: config.json's neuphonic section and <|ANGRY|>-style
#                         tokens in reserved places), NeuTTS-2E's input: emotion tests
#   models/tiny-emotion-gguf  its float32 GGUF with the neuphonic metadata the vendor reads from
#                         GGUFs (--neuphonic) and no config.json: the GGUF alone says BPE
#   models/real-shape-q4-gguf  the real-shape backbone (Qwen2-0.5B / NeuTTS-air shape) with
#                         the random variant's weights (no chain to follow: every greedy choice
#                         comes from the whole network) as tools/onnx_to_gguf.py's Q4_0 GGUF, with
#                         the tiny codec: the llama engine against llama.cpp's own greedy loop
#                         for 128 steps. Its
#                         1.1 GB ONNX source is made and removed here (about a minute on 2 cores)
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
"$py" tools/gen_models.py --out models/tiny-random-exact --variant random --accuracy-level 0
"$py" tools/gen_models.py --out models/tiny-nomask --variant chain --mask-dtype none
for src in tiny tiny-random; do
  out="models/$src-gguf"
  rm -rf "$out.partial" && mkdir -p "$out.partial"
  "$py" tools/onnx_to_gguf.py "models/$src" --weights f32 --token-embd f32 --out "$out.partial/model-f32.gguf"
  cp "models/$src/tokenizer.json" "models/$src/tokenizer_config.json" "models/$src/config.json" \
    "models/$src/onebit_weights.json" "$out.partial/"
  cp -r "models/$src/codec" "$out.partial/codec"
  rm -rf "$out" && mv "$out.partial" "$out"
done
"$py" tools/gen_models.py --out models/tiny-emotion --variant random --input-format bpe \
  --emotions angry,happy,sad
out=models/tiny-emotion-gguf
rm -rf "$out.partial" && mkdir -p "$out.partial"
"$py" tools/onnx_to_gguf.py models/tiny-emotion --weights f32 --token-embd f32 --neuphonic \
  --out "$out.partial/model-f32.gguf"
cp models/tiny-emotion/tokenizer.json models/tiny-emotion/tokenizer_config.json \
  models/tiny-emotion/onebit_weights.json "$out.partial/"
cp -r models/tiny-emotion/codec "$out.partial/codec"
rm -rf "$out" && mv "$out.partial" "$out"
src=models/.real-shape-src
out=models/real-shape-q4-gguf
rm -rf "$src" "$out.partial" && mkdir -p "$out.partial"
"$py" tools/gen_models.py --out "$src" --real-shape --variant random --codec tiny
"$py" tools/onnx_to_gguf.py "$src" --out "$out.partial/model-q4_0.gguf"
cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$src/config.json" "$src/onebit_weights.json" \
  "$out.partial/"
cp -r "$src/codec" "$out.partial/codec"
rm -rf "$src" "$out" && mv "$out.partial" "$out"
