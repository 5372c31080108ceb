#!/usr/bin/env python3
"""A tiny random NeuTTS-air-shaped Hugging Face checkpoint, and its logits, for testing
`models build` with the real tools.

    python tools/hf_checkpoint.py --out DIR
        writes DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}:
        a Qwen2ForCausalLM with random weights (fixed seed) saved by transformers, with the
        NeuTTS-air tokenizer layout at the real ids (151,643 base tokens, the specials,
        <|SPEECH_GENERATION_END|> = 151670, <|speech_0..65535|> = 151671..217206) and the real
        vocabulary width 217,652. This is what onnxruntime-genai's builder and llama.cpp's
        converter take as input, so what they make of it is the real tools' output.

    python tools/hf_checkpoint.py --logits DIR --ids IDS.json --out LOGITS.f32
        transformers' float32 logits (the reference) for the sequence in IDS.json
        ({"prompt": [...], "next": [...]}): the prefill's last position, then one row per id of
        "next" fed one at a time through the KV cache, as an engine decodes. Raw little-endian
        float32, rows of vocab_size.

Needs torch and transformers (scripts/setup.sh --build-tools).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_models  # noqa: E402  (the tokenizer layout, shared with the generated packages)

SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, context=4096)
VOCAB = gen_models.REAL["vocab_size"]
SEED = 1234


def write_checkpoint(out):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    os.makedirs(out, exist_ok=True)
    tok, ids = gen_models.build_tokenizer(gen_models.REAL["base_vocab"], gen_models.TINY["merges"])
    assert ids["speech_end"] == 151670 and ids["speech_first"] == 151671, ids
    gen_models.write_json(os.path.join(out, "tokenizer.json"), tok, indent=None)
    gen_models.write_json(
        os.path.join(out, "tokenizer_config.json"),
        gen_models.tokenizer_config({"context": SHAPE["context"]}),
    )
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=SHAPE["hidden"],
        intermediate_size=SHAPE["intermediate"],
        num_hidden_layers=SHAPE["layers"],
        num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["kv_heads"],
        max_position_embeddings=SHAPE["context"],
        rope_theta=gen_models.ROPE_THETA,
        rms_norm_eps=gen_models.RMS_EPS,
        tie_word_embeddings=False,
        bos_token_id=ids["endoftext"],
        eos_token_id=ids["im_end"],
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).eval()
    # Larger than the initialiser's 0.02 so the layers matter and the logits spread: a parity
    # check on near-constant logits would prove little.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.3 if "embed" in name or "lm_head" in name else 0.15)
    model.save_pretrained(out, safe_serialization=True)
    # The vendor's config says which prompt format the model takes.
    path = os.path.join(out, "config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["neuphonic"] = {"input_format": "phonemes"}
    gen_models.write_json(path, cfg)


def reference_logits(ckpt, ids_path, out):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    with open(ids_path, encoding="utf-8") as f:
        seq = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        o = model(torch.tensor([seq["prompt"]]), use_cache=True)
        rows.append(o.logits[0, -1].numpy())
        past = o.past_key_values
        for t in seq["next"]:
            o = model(torch.tensor([[t]]), past_key_values=past, use_cache=True)
            rows.append(o.logits[0, -1].numpy())
            past = o.past_key_values
    np.stack(rows).astype("<f4").tofile(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--logits", metavar="CHECKPOINT", help="compute reference logits")
    ap.add_argument("--ids", help="IDS.json for --logits")
    a = ap.parse_args()
    if a.logits:
        reference_logits(a.logits, a.ids, a.out)
    else:
        write_checkpoint(a.out)


if __name__ == "__main__":
    main()
