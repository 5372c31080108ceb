#!/usr/bin/env python3
"""A tiny random NeuTTS-air-shaped Hugging Face checkpoint, and its logits, for testing
`models build` with the real tools.

    python tools/hf_checkpoint.py --out DIR [--arch qwen2|llama|qwen3] [--hidden N] [--chain]
        writes DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}:
        a Qwen2ForCausalLM (NeuTTS-air's architecture; --arch llama: a LlamaForCausalLM with tied
        embeddings, as NeuTTS-nano; --arch qwen3: a Qwen3ForCausalLM with per-head q/k norms and
        a head size other than hidden/heads, as NeuTTS-2E's family) with random weights (fixed seed) saved by transformers, with the
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

SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, context=4096)
VOCAB = gen_models.REAL["vocab_size"]
SEED = 1234


def write_checkpoint(out, arch="qwen2", hidden=SHAPE["hidden"], chain=False):
    import torch
    import transformers

    os.makedirs(out, exist_ok=True)
    tok, ids = gen_models.build_tokenizer(gen_models.REAL["base_vocab"], gen_models.TINY["merges"])
    assert ids["speech_end"] == 151670 and ids["speech_first"] == 151671, ids
    gen_models.write_json(os.path.join(out, "tokenizer.json"), tok, indent=None)
    gen_models.write_json(
        os.path.join(out, "tokenizer_config.json"),
        gen_models.tokenizer_config({"context": SHAPE["context"]}),
    )
    extra = {
        "qwen2": dict(tie_word_embeddings=False),
        "llama": dict(tie_word_embeddings=True, attention_bias=False, mlp_bias=False),
        "qwen3": dict(tie_word_embeddings=False, head_dim=32, attention_bias=False),
    }[arch]
    name = {"qwen2": "Qwen2", "llama": "Llama", "qwen3": "Qwen3"}[arch]
    config = getattr(transformers, f"{name}Config")(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=SHAPE["layers"],
        num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["kv_heads"],
        max_position_embeddings=SHAPE["context"],
        rope_theta=gen_models.ROPE_THETA,
        rms_norm_eps=gen_models.RMS_EPS,
        bos_token_id=ids["endoftext"],
        eos_token_id=ids["im_end"],
        torch_dtype="float32",
        **extra,
    )
    torch.manual_seed(SEED)
    model = getattr(transformers, f"{name}ForCausalLM")(config).eval()
    # Larger than the initialiser's 0.02 so the layers matter and the logits spread: a parity
    # check on near-constant logits would prove little.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                layer_std = 0.05 if chain else 0.15
                p.normal_(0.0, 0.3 if "embed" in name or "lm_head" in name else layer_std)
            elif arch == "qwen3" and ("q_norm" in name or "k_norm" in name):
                # Not all ones: a norm weight that is read from the wrong place must show.
                p.uniform_(0.5, 1.5)
        if chain:
            # The residual stream keeps the token's own embedding dominant (smaller layers),
            # and the head scores <|speech_{c+1}|> by the embedding of <|speech_c|>: greedy
            # decoding follows the codes with margins far above any rounding, while attention
            # and MLP still move every logit. (A tied head scores a code by itself: it repeats.)
            first, n = ids["speech_first"], gen_models.N_SPEECH
            if not config.tie_word_embeddings:
                emb = model.model.embed_tokens.weight[first:first + n]
                model.lm_head.weight[first:first + n] = torch.roll(emb, 1, dims=0)
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
    ap.add_argument("--arch", choices=["qwen2", "llama", "qwen3"], default="qwen2")
    ap.add_argument("--chain", action="store_true",
                    help="greedy decoding follows the codes with wide margins (see write_checkpoint)")
    ap.add_argument("--hidden", type=int, default=SHAPE["hidden"],
                    help="hidden size (256: rows llama.cpp's K-quants can hold)")
    a = ap.parse_args()
    if a.logits:
        reference_logits(a.logits, a.ids, a.out)
    else:
        write_checkpoint(a.out, a.arch, a.hidden, a.chain)


if __name__ == "__main__":
    main()
