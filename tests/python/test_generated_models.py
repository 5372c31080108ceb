#!/usr/bin/env python3
"""Checks the model packages that tools/gen_models.py writes.

    python tests/python/test_generated_models.py WORKDIR

Generates the three tiny variants (chain, random, textbias) and the test voice into
WORKDIR, then checks them with onnxruntime and onnxruntime-genai: I/O contract, greedy
chain rule, END / runner-up, text bias, KV-cache sensitivity, parity between an
ORT greedy loop and onnxruntime-genai (also with past_present_share_buffer=true),
codec shapes, tokenizer, and that a second run is byte-identical. Static packages (--kv-len,
float32 and float16 KV) declare the fixed length as numbers and decode the chain on one
fixed-size buffer, with onnxruntime and onnxruntime-genai. The real-shape NeuCodec
decoder (--codec real) is built narrow and shallow (its builder takes dims) and checked for
output length, FSQ digits, the irfft + overlap-add against numpy, bounds and determinism.
Prints "N passed, M failed" and exits non-zero on any failure. No pytest needed.
"""

import filecmp
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN = os.path.join(ROOT, "tools", "gen_models.py")
sys.path.insert(0, os.path.dirname(GEN))
import gen_models  # noqa: E402  (the real-shape codec builder, called at reduced dims)
VARIANTS = ("chain", "random", "textbias")
STEPS = 300

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, load_json  # noqa: E402

CHECKS = Checks()
check = CHECKS.check
run_case = CHECKS.run_case


def generate(out, variant, voice=None, extra=()):
    cmd = [sys.executable, GEN, "--out", out, "--variant", variant] + list(extra)
    if voice:
        cmd += ["--voice-out", voice]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


class Ort:
    """A plain greedy loop over the decoder, fed the way onnxruntime-genai feeds it."""

    def __init__(self, pkg):
        self.pkg = pkg
        self.cfg = load_json(os.path.join(pkg, "genai_config.json"))
        self.exp = load_json(os.path.join(pkg, "expect.json"))
        dec = self.cfg["model"]["decoder"]
        self.nl, self.kvh, self.hd = dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        self.s = ort.InferenceSession(os.path.join(pkg, "model.onnx"), so, providers=["CPUExecutionProvider"])
        self.out_names = [o.name for o in self.s.get_outputs()]

    def empty_past(self):
        return [np.zeros((1, self.kvh, 0, self.hd), np.float32) for _ in range(2 * self.nl)]

    def step(self, ids, past, total):
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        for l in range(self.nl):
            feeds["past_key_values.%d.key" % l] = past[2 * l]
            feeds["past_key_values.%d.value" % l] = past[2 * l + 1]
        o = dict(zip(self.out_names, self.s.run(None, feeds)))
        new = []
        for l in range(self.nl):
            new += [o["present.%d.key" % l], o["present.%d.value" % l]]
        return o["logits"][0, -1].copy(), new

    def greedy(self, prompt, steps, allowed=None, mask=(), stop_at_end=True, keep_logits=False):
        """Greedy decode. allowed: optional boolean mask of ids that may be chosen."""
        x, past = self.step(prompt, self.empty_past(), len(prompt))
        total = len(prompt)
        out, logits = [], []
        for _ in range(steps):
            y = x.copy()
            if allowed is not None:
                y[~allowed] = -np.inf
            for m in mask:
                y[m] = -np.inf
            if keep_logits:
                logits.append(x)
            t = int(np.argmax(y))
            out.append(t)
            if stop_at_end and t == self.exp["speech_end_id"]:
                break
            total += 1
            x, past = self.step([t], past, total)
        return (out, logits) if keep_logits else out


def chain_expect(exp, last_code, steps, end_masked=False):
    first, end, m1 = exp["speech_first_id"], exp["speech_end_id"], exp["end_after_code"]
    out, c = [], last_code
    while len(out) < steps:
        if c == m1 and not end_masked:
            out.append(end)
            break
        c = (c + 1) % 65536
        out.append(first + c)
    return out


def make_prompts(exp, seed):
    """Prompts of 50..1500 tokens: text ids, specials, a speech reference; last = speech code."""
    r = np.random.RandomState(seed)
    first = exp["speech_first_id"]
    prompts = []
    for n, last in ((50, 79), (400, 40000), (1500, 65500)):
        n_text = n // 3
        text = [int(t) for t in r.randint(0, exp["base_vocab_size"], n_text)]
        codes = [first + int(c) for c in r.randint(0, 65536, n - n_text - 6)]
        p = ([exp["im_start_id"]] + text[:5] + [exp["text_prompt_start_id"]] + text[5:]
             + [exp["text_prompt_end_id"], exp["speech_generation_start_id"], exp["im_end_id"],
                exp["speech_generation_start_id"]] + codes)
        p[-1] = first + last
        assert len(p) == n
        prompts.append((p, last))
    return prompts


def oga_greedy(og, model, prompt, steps, end_id, stop_at_end=True):
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + steps)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    out = []
    while not gen.is_done() and len(out) < steps:
        gen.generate_next_token()
        t = int(gen.get_next_tokens()[0])
        out.append(t)
        if stop_at_end and t == end_id:
            break
    return out


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    work = os.path.abspath(sys.argv[1])
    os.makedirs(work, exist_ok=True)
    pk = {v: os.path.join(work, v) for v in VARIANTS}
    voice_path = os.path.join(work, "voice.json")

    # ---- generation, timing, determinism
    t0 = time.time()
    for v in VARIANTS:
        generate(pk[v], v, voice_path if v == "chain" else None)
    dt = time.time() - t0
    print("generated %d tiny variants in %.1f s" % (len(VARIANTS), dt))
    check("generation of the tiny variants under 20 s", dt < 20, "%.1f s" % dt)

    def determinism():
        for v in VARIANTS:
            again = os.path.join(work, v + "_again")
            generate(again, v, os.path.join(work, "voice_again.json") if v == "chain" else None)
            cmp = filecmp.dircmp(pk[v], again)
            files = []
            for root, _, names in os.walk(pk[v]):
                files += [os.path.relpath(os.path.join(root, n), pk[v]) for n in names]
            same = all(filecmp.cmp(os.path.join(pk[v], f), os.path.join(again, f), shallow=False) for f in files)
            check("byte-identical rerun (%s, %d files)" % (v, len(files)), same and not cmp.left_only and not cmp.right_only)
            shutil.rmtree(again)
        check("byte-identical voice rerun",
              filecmp.cmp(voice_path, os.path.join(work, "voice_again.json"), shallow=False))
    run_case("determinism", determinism)

    def sizes():
        for v in VARIANTS:
            total = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(pk[v]) for n in ns)
            model = os.path.getsize(os.path.join(pk[v], "model.onnx"))
            check("%s: model.onnx small (%.1f MB), package %.1f MB" % (v, model / 1e6, total / 1e6), model < 6e6)
    run_case("sizes", sizes)

    # ---- configs
    def configs():
        for v in VARIANTS:
            cfg = load_json(os.path.join(pk[v], "genai_config.json"))
            exp = load_json(os.path.join(pk[v], "expect.json"))
            m = cfg["model"]
            dec = m["decoder"]
            ok = (m["type"] == "qwen2" and dec["filename"] == "model.onnx"
                  and m["eos_token_id"] == [exp["im_end_id"], exp["endoftext_id"]]
                  and exp["speech_end_id"] not in m["eos_token_id"]
                  and m["vocab_size"] == exp["vocab_size"] and m["vocab_size"] > exp["num_tokens"]
                  and m["vocab_size"] % 64 == 0
                  and dec["inputs"] == {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                        "past_key_names": "past_key_values.%d.key",
                                        "past_value_names": "past_key_values.%d.value"}
                  and dec["outputs"] == {"logits": "logits", "present_key_names": "present.%d.key",
                                         "present_value_names": "present.%d.value"}
                  and cfg["search"]["past_present_share_buffer"] is False
                  and cfg["search"]["do_sample"] is False and cfg["search"]["num_beams"] == 1)
            check("%s: genai_config.json contract" % v, ok, json.dumps(cfg)[:400])
            hf = load_json(os.path.join(pk[v], "config.json"))
            check("%s: config.json neuphonic.input_format" % v,
                  hf["model_type"] == "qwen2" and hf["neuphonic"]["input_format"] == "phonemes")
            cc = load_json(os.path.join(pk[v], "codec", "codec.json"))
            check("%s: codec.json" % v, cc == {"sample_rate": 24000, "hop_length": 480, "decoder": "model.onnx"})
            check("%s: speech ids contiguous after END" % v,
                  exp["speech_first_id"] == exp["speech_end_id"] + 1
                  and exp["speech_first_id"] + 65536 == exp["num_tokens"])
    run_case("configs", configs)

    # ---- a BPE model with emotions: the same ids and weights, emotion tokens in reserved places
    def emotions():
        out = os.path.join(work, "emotion")
        generate(out, "random", None, ["--input-format", "bpe", "--emotions", "angry,happy,sad"])
        check("emotions: model.onnx byte-identical to random's",
              filecmp.cmp(os.path.join(out, "model.onnx"), os.path.join(pk["random"], "model.onnx"),
                          shallow=False))
        hf = load_json(os.path.join(out, "config.json"))
        check("emotions: config.json neuphonic section",
              hf["neuphonic"] == {"input_format": "BPE", "supported_emotions": ["angry", "happy", "sad"]},
              json.dumps(hf["neuphonic"]))
        exp = load_json(os.path.join(out, "expect.json"))
        added = {t["id"]: t["content"] for t in load_json(os.path.join(out, "tokenizer.json"))["added_tokens"]}
        plain = {t["id"]: t["content"]
                 for t in load_json(os.path.join(pk["random"], "tokenizer.json"))["added_tokens"]}
        want = {i: "<|%s|>" % e.upper() for e, i in exp["emotion_ids"].items()}
        check("emotions: <|ANGRY|>, <|HAPPY|>, <|SAD|> take the first reserved ids, nothing else moves",
              sorted(want) == sorted(i for i in plain if plain[i].startswith("<|NEUTTS_RESERVED_"))[:3]
              and all(added[i] == want.get(i, plain[i]) for i in plain) and len(added) == len(plain),
              json.dumps(exp["emotion_ids"]))
        shutil.rmtree(out)
    run_case("emotions", emotions)

    # ---- tokenizer
    def tokenizer():
        exp = load_json(os.path.join(pk["chain"], "expect.json"))
        tj = load_json(os.path.join(pk["chain"], "tokenizer.json"))
        added = tj["added_tokens"]
        ok = (added[0]["content"] == "<|endoftext|>" and added[0]["id"] == exp["endoftext_id"]
              and all(a["special"] and not a["normalized"] for a in added)
              and [a["id"] for a in added] == list(range(exp["endoftext_id"], exp["num_tokens"]))
              and added[-1]["content"] == "<|speech_65535|>"
              and len(tj["model"]["vocab"]) == exp["base_vocab_size"])
        check("tokenizer.json layout", ok)
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            CHECKS.skip("tokenizers: the HF tokenizers load check", "python package tokenizers not importable")
            tokenizers = None
        if tokenizers is not None:
            tk = tokenizers.Tokenizer.from_file(os.path.join(pk["chain"], "tokenizer.json"))
            ids = tk.encode("<|speech_0|><|speech_65535|>", add_special_tokens=False).ids
            check("tokenizers: speech tokens encode", ids == [exp["speech_first_id"], exp["num_tokens"] - 1], str(ids))
            check("tokenizers: END id", tk.token_to_id("<|SPEECH_GENERATION_END|>") == exp["speech_end_id"])
            for s in ("Hello world, this is a test.", "həlˈoʊ wˈɜːld, ðɪs ɪz ɐ tˈɛst."):
                e = tk.encode(s, add_special_tokens=False)
                check("tokenizers: round trip %r (%d tokens)" % (s, len(e.ids)),
                      tk.decode(e.ids) == s and len(e.ids) < len(s.encode("utf-8")))
        import onnxruntime_genai as og
        model = og.Model(pk["chain"])
        otk = og.Tokenizer(model)
        ids = [int(i) for i in otk.encode("<|speech_0|><|speech_65535|>")]
        check("onnxruntime-genai tokenizer: speech tokens encode", ids == [exp["speech_first_id"], exp["num_tokens"] - 1], str(ids))
        s = "user: Convert the text to speech:<|TEXT_PROMPT_START|>ðə kwˈɪk bɹˈaʊn fˈɑːks<|TEXT_PROMPT_END|>"
        ids = [int(i) for i in otk.encode(s)]
        check("onnxruntime-genai tokenizer: specials inside text",
              exp["text_prompt_start_id"] in ids and exp["text_prompt_end_id"] in ids and max(ids) < exp["speech_first_id"])
        if tokenizers is not None:
            check("onnxruntime-genai tokenizer == tokenizers", ids == tk.encode(s, add_special_tokens=False).ids)
    run_case("tokenizer", tokenizer)

    # ---- ORT: I/O contract
    sessions = {}

    def ort_io():
        for v in VARIANTS:
            o = sessions[v] = Ort(pk[v])
            ins = {i.name: (i.type, i.shape) for i in o.s.get_inputs()}
            outs = {i.name: (i.type, i.shape) for i in o.s.get_outputs()}
            V = o.cfg["model"]["vocab_size"]
            ok = (ins["input_ids"] == ("tensor(int64)", ["batch_size", "sequence_length"])
                  and ins["attention_mask"] == ("tensor(int64)", ["batch_size", "total_sequence_length"])
                  and "position_ids" not in ins
                  and outs["logits"] == ("tensor(float)", ["batch_size", "sequence_length", V]))
            for l in range(o.nl):
                for k in ("key", "value"):
                    ok = ok and ins["past_key_values.%d.%s" % (l, k)][1][:3] == ["batch_size", o.kvh, "past_sequence_length"]
                    ok = ok and outs["present.%d.%s" % (l, k)][1][:3] == ["batch_size", o.kvh, "total_sequence_length"]
            check("%s: ORT loads, I/O names/shapes" % v, ok and len(ins) == 2 + 2 * o.nl, str(ins))
    run_case("ort io", ort_io)
    if len(sessions) != len(VARIANTS):
        return

    exp = sessions["chain"].exp
    first, end = exp["speech_first_id"], exp["speech_end_id"]
    V = sessions["chain"].cfg["model"]["vocab_size"]
    speech_or_end = np.zeros(V, dtype=bool)
    speech_or_end[first:first + 65536] = True
    speech_or_end[end] = True
    prompts = make_prompts(exp, 1)
    empty_ref = [exp["im_start_id"], 5, 6, 7, exp["text_prompt_end_id"], exp["speech_generation_start_id"]]
    ort_tokens = {}

    # ---- chain
    def chain():
        o = sessions["chain"]
        for p, last in prompts:
            out = o.greedy(p, STEPS)
            ort_tokens[("chain", len(p))] = out
            want = chain_expect(exp, last, STEPS)
            check("chain: %d-token prompt, last code %d -> %d tokens follow the rule" % (len(p), last, len(want)),
                  out == want, "got %s" % [t - first for t in out[:10]])
            if end in want:
                out2 = o.greedy(p, len(want) + 20, mask=(end,))
                check("chain: END masked -> runner-up speech_%d continues the chain" % (exp["end_after_code"] + 1),
                      out2 == chain_expect(exp, last, len(want) + 20, end_masked=True),
                      "got %s" % [t - first for t in out2[-25:]])
        out = o.greedy(empty_ref, STEPS)
        ort_tokens[("chain", "empty")] = out
        check("chain: after SPEECH_GENERATION_START -> speech_0 .. speech_%d, END" % exp["end_after_code"],
              out == chain_expect(exp, -1, STEPS))
        voice = load_json(voice_path)
        vp = empty_ref + [first + c for c in voice["codes"]]
        out = o.greedy(vp, STEPS)
        ort_tokens[("chain", "voice")] = out
        check("voice: %d codes, chain generates exactly 120 codes then END" % len(voice["codes"]),
              len(out) == 121 and out[-1] == end and all(first <= t < first + 65536 for t in out[:-1]),
              "len %d" % len(out))
        check("voice file format",
              voice["name"] == "test" and voice["language"] == "en-us" and 90 <= len(voice["codes"]) <= 110
              and voice["license"] == "CC0, generated" and voice["source"] == "generated by tools/gen_models.py")
    run_case("chain", chain)

    # ---- KV cache / attention sensitivity (chain and random)
    def sensitivity():
        for v in ("chain", "random"):
            o = sessions[v]
            p = prompts[1][0]
            full, _ = o.step(p, o.empty_past(), len(p))
            x, past = o.step(p[:-1], o.empty_past(), len(p) - 1)
            inc, _ = o.step(p[-1:], past, len(p))
            d_ok = float(np.abs(full - inc).max())
            check("%s: incremental decode == full prefill (max diff %.2e)" % (v, d_ok), d_ok < 2e-3)
            bad = [a.copy() for a in past]
            for a in bad:
                a[:, :, : a.shape[2] // 2] = a[:, :, a.shape[2] // 2: 2 * (a.shape[2] // 2)]  # corrupt history
            corrupt, _ = o.step(p[-1:], bad, len(p))
            d_bad = float(np.abs(corrupt - inc).max())
            check("%s: corrupted past changes logits (max diff %.3f > 1e-2)" % (v, d_bad), d_bad > 1e-2)
            short = past_trunc = [a[:, :, 1:] for a in past]
            trunc, _ = o.step(p[-1:], past_trunc, len(p) - 1)
            d_tr = float(np.abs(trunc - inc).max())
            check("%s: dropping one past position changes logits (%.3f > 1e-2)" % (v, d_tr), d_tr > 1e-2)
            del short
            shifted, _ = o.step(p[1:], o.empty_past(), len(p) - 1)
            d_pos = float(np.abs(shifted - full).max())
            check("%s: context changes logits (%.3f > 1e-2)" % (v, d_pos), d_pos > 1e-2)
    run_case("sensitivity", sensitivity)

    # ---- textbias
    def textbias():
        o = sessions["textbias"]
        e = o.exp
        for p, last in prompts[:2]:
            raw = o.greedy(p, 40, stop_at_end=False)
            check("textbias: full-vocab greedy argmax is a text id at every step",
                  all(t < e["base_vocab_size"] for t in raw), str(raw[:10]))
            out = o.greedy(p, STEPS, allowed=speech_or_end)
            ort_tokens[("textbias", len(p))] = out
            check("textbias: restricted to speech+END it follows the chain (%d tokens)" % len(out),
                  out == chain_expect(e, last, STEPS))
    run_case("textbias", textbias)

    # ---- random
    def random_variant():
        o = sessions["random"]
        for p, _ in prompts:
            out = o.greedy(p, STEPS, stop_at_end=False)
            ort_tokens[("random", len(p))] = out
            only_speech = all(first <= t < first + 65536 for t in out)
            check("random: %d-token prompt -> %d speech-only tokens, %d distinct" % (len(p), len(out), len(set(out))),
                  only_speech and len(out) == STEPS and len(set(out)) > 50)
    run_case("random", random_variant)

    # ---- onnxruntime-genai parity (plain and past_present_share_buffer=true)
    def oga():
        import onnxruntime_genai as og
        for share in (False, True):
            for v in VARIANTS:
                pkg = pk[v]
                if share:
                    pkg = os.path.join(work, v + "_share")
                    shutil.rmtree(pkg, ignore_errors=True)
                    shutil.copytree(pk[v], pkg)
                    cfgp = os.path.join(pkg, "genai_config.json")
                    cfg = load_json(cfgp)
                    cfg["search"]["past_present_share_buffer"] = True
                    cfg["search"]["max_length"] = 2048
                    with open(cfgp, "w") as f:
                        json.dump(cfg, f, indent=4)
                model = og.Model(pkg)
                tag = "%s%s" % (v, " share_buffer" if share else "")
                if v == "textbias":
                    p = prompts[0][0]
                    got = oga_greedy(og, model, p, 20, end, stop_at_end=False)
                    want = sessions[v].greedy(p, 20, stop_at_end=False)
                    check("oga %s: unconstrained greedy == ORT (text ids)" % tag, got == want, "%s vs %s" % (got[:5], want[:5]))
                    continue
                keys = [k for k in ort_tokens if k[0] == v]
                for k in keys:
                    if k[1] == "empty":
                        p = empty_ref
                    elif k[1] == "voice":
                        p = empty_ref + [first + c for c in load_json(voice_path)["codes"]]
                    else:
                        p = [pp for pp, _ in prompts if len(pp) == k[1]][0]
                    want = ort_tokens[k]
                    got = oga_greedy(og, model, p, STEPS, end, stop_at_end=(v != "random"))
                    diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                    check("oga %s: prompt %s -> %d tokens == ORT greedy" % (tag, k[1], len(got)),
                          got == want, "first difference at %s" % diff)
                del model
    run_case("oga", oga)

    # ---- static KV packages (AMD's NPU shape): fixed past length, float32 and float16
    STATIC_LEN = 512

    def static_kv():
        import onnxruntime_genai as og
        variants = {
            "float32": [],
            "float16": ["--kv-dtype", "float16", "--last-logits", "--mask-dtype", "int32"],
        }
        # A prompt of 81 tokens whose chain ends after 19 codes, and one that reaches the end of
        # the buffer first (its chain is 65,000 codes long).
        short = [exp["speech_generation_start_id"]] + [first + c for c in range(100, 181)]
        long = [exp["speech_generation_start_id"]] + [first + (c * 7) % 65536 for c in range(480)]
        for dtype, extra in variants.items():
            pkg = os.path.join(work, "static-" + dtype)
            generate(pkg, "chain", extra=["--kv-len", str(STATIC_LEN)] + extra)
            s = ort.InferenceSession(os.path.join(pkg, "model.onnx"), providers=["CPUExecutionProvider"])
            ins = {i.name: (i.type, i.shape) for i in s.get_inputs()}
            outs = {o.name: (o.type, o.shape) for o in s.get_outputs()}
            kv_type = "tensor(float16)" if dtype == "float16" else "tensor(float)"
            mask_type = "tensor(int32)" if dtype == "float16" else "tensor(int64)"
            ok = all(ins["past_key_values.%d.%s" % (l, k)] == (kv_type, [1, 2, STATIC_LEN, "kv_cache_dim"])
                     and outs["present.%d.%s" % (l, k)] == (kv_type, [1, 2, STATIC_LEN, "kv_cache_dim"])
                     for l in range(2) for k in ("key", "value"))
            ok = ok and ins["attention_mask"] == (mask_type, [1, "total_sequence_length"])
            logits = outs["logits"]
            ok = ok and logits == (kv_type, [1, 1 if dtype == "float16" else "sequence_length", V])
            cfg = load_json(os.path.join(pkg, "genai_config.json"))
            ok = ok and cfg["search"]["past_present_share_buffer"] is True
            check("static %s: past/present declared [1, 2, %d, D], mask %s, logits %s" % (
                dtype, STATIC_LEN, mask_type, logits), ok, str(ins))

            names = [o.name for o in s.get_outputs()]
            np_kv = np.float16 if dtype == "float16" else np.float32
            np_mask = np.int32 if dtype == "float16" else np.int64

            def greedy(prompt):
                """onnxruntime-genai's static feeding: one [1, 2, N, D] buffer per past input,
                attention_mask [1, total] of ones; stops at END or when the buffer is full."""
                past = [np.zeros((1, 2, STATIC_LEN, 16), np_kv) for _ in range(4)]
                ids, total, out = prompt, len(prompt), []
                while True:
                    f = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np_mask)}
                    for l in range(2):
                        f["past_key_values.%d.key" % l], f["past_key_values.%d.value" % l] = past[2 * l], past[2 * l + 1]
                    o = dict(zip(names, s.run(None, f)))
                    past = [o["present.%d.%s" % (l, k)] for l in range(2) for k in ("key", "value")]
                    t = int(np.argmax(o["logits"][0, -1]))
                    out.append(t)
                    if t == end or total == STATIC_LEN:
                        return out, past[0].shape
                    ids, total = [t], total + 1

            got, shape = greedy(short)
            check("static %s: short prompt follows the chain to END on a fixed buffer" % dtype,
                  got == chain_expect(exp, 180, 100) and shape == (1, 2, STATIC_LEN, 16), str(got[:5]))
            got, _ = greedy(long)
            want = chain_expect(exp, (479 * 7) % 65536, STATIC_LEN - len(long) + 1)
            check("static %s: long prompt decodes until the buffer is full (%d tokens)" % (dtype, len(want)),
                  got == want, str([t - first for t in got[:5]]))
            model = og.Model(pkg)
            got_oga = oga_greedy(og, model, short, 100, end)
            check("static %s: onnxruntime-genai (fixed kv-cache detected) == ORT" % dtype,
                  got_oga == chain_expect(exp, 180, 100), str(got_oga[:5]))
            del model
    run_case("static kv", static_kv)

    # ---- codec
    def codec():
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        s = ort.InferenceSession(os.path.join(pk["chain"], "codec", "model.onnx"), so, providers=["CPUExecutionProvider"])
        i, o = s.get_inputs()[0], s.get_outputs()[0]
        check("codec I/O", i.name == "codes" and i.type == "tensor(int32)" and o.name == "audio" and o.type == "tensor(float)")
        r = np.random.RandomState(3)
        for F in (1, 7, 30):
            codes = r.randint(0, 65536, (1, 1, F)).astype(np.int32)
            a = s.run(None, {"codes": codes})[0]
            ok = (a.shape == (1, 1, F * 480) and a.dtype == np.float32 and np.isfinite(a).all()
                  and np.abs(a).max() <= 0.5 and np.abs(a).max() > 0.05 and np.std(a) > 0.01)
            check("codec: %d frames -> %d samples" % (F, F * 480), ok, str(a.shape))
        codes = r.randint(0, 65536, (2, 1, 12)).astype(np.int32)
        a = s.run(None, {"codes": codes})[0]
        b = s.run(None, {"codes": codes[1:]})[0]
        check("codec: batch 2", a.shape == (2, 1, 12 * 480) and np.allclose(a[1], b[0], atol=1e-6))
        base = s.run(None, {"codes": codes[:1]})[0][0, 0].reshape(12, 480)
        c2 = codes[:1].copy()
        c2[0, 0, 6] = (c2[0, 0, 6] + 12345) % 65536
        mod = s.run(None, {"codes": c2})[0][0, 0].reshape(12, 480)
        changed = [bool(np.abs(mod[f] - base[f]).max() > 1e-6) for f in range(12)]
        check("codec: a code changes its own and neighbouring frames only (kernel 3)",
              changed == [f in (5, 6, 7) for f in range(12)], str(changed))
        d = s.run(None, {"codes": r.randint(0, 65536, (1, 1, 50)).astype(np.int32)})[0][0, 0]
        check("codec: continuous-ish (median |step| < 0.05)", float(np.median(np.abs(np.diff(d)))) < 0.05)
    run_case("codec", codec)

    # ---- real-shape NeuCodec decoder, built at reduced width and depth (full: tools/gen_models.py
    # --real-shape or --codec real, ~765 MB); the FSQ, rotary attention, ISTFT head and
    # overlap-add are the same nodes at any width.
    def neucodec():
        small = dict(vq_dim=96, hidden=64, depth=2, heads=4, head_dim=16, mlp=256)
        path = os.path.join(work, "neucodec_small.onnx")
        t0 = time.time()
        gen_models.build_neucodec(path, small)
        check("neucodec: reduced build under 5 s (%.1f s)" % (time.time() - t0), time.time() - t0 < 5)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        i, o = s.get_inputs()[0], s.get_outputs()[0]
        check("neucodec I/O", i.name == "codes" and i.type == "tensor(int32)" and i.shape == ["batch", 1, "frames"]
              and o.name == "audio" and o.type == "tensor(float)")
        r = np.random.RandomState(5)
        for F in (1, 7, 25, 81):
            a = s.run(None, {"codes": r.randint(0, 65536, (1, 1, F)).astype(np.int32)})[0]
            ok = (a.shape == (1, 1, F * 480) and a.dtype == np.float32 and np.isfinite(a).all()
                  and np.abs(a).max() <= 1.0 and np.std(a) > 0.02)
            check("neucodec: %d frames -> %d samples, finite, in [-1, 1]" % (F, F * 480), ok,
                  "%s max %.3g std %.3g" % (a.shape, np.abs(a).max(), np.std(a)))
        codes = r.randint(0, 65536, (2, 1, 12)).astype(np.int32)
        a = s.run(None, {"codes": codes})[0]
        b = s.run(None, {"codes": codes[1:]})[0]
        check("neucodec: batch 2", a.shape == (2, 1, 12 * 480) and np.allclose(a[1], b[0], atol=1e-5))
        c2 = codes[:1].copy()
        c2[0, 0, 6] = (c2[0, 0, 6] + 4 ** 7) % 65536  # the top FSQ digit only
        m = s.run(None, {"codes": c2})[0][0, 0].reshape(12, 480)
        check("neucodec: the top digit of one code changes its frame",
              np.abs(m[6] - a[0, 0].reshape(12, 480)[6]).max() > 1e-3)

        model = onnx.load(path)

        def sub(names, inp, out, feeds):
            """Runs the nodes whose names start with one of `names`, from tensor `inp` to `out`."""
            nodes = [n for n in model.graph.node if n.name.startswith(names)]
            used = {t for n in nodes for t in n.input}
            inits = [t for t in model.graph.initializer if t.name in used]
            gr = helper.make_graph(nodes, "sub", [helper.make_tensor_value_info(inp[0], inp[1], None)],
                                   [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None)], initializer=inits)
            mm = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
            mm.ir_version = 8
            return ort.InferenceSession(mm.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]

        # FSQ: code -> 8 base-4 digits d -> (d - 2) / 2
        cs = np.array([[[0, 1, 4, 65535, 12345, 4 ** 7, 40000]]], np.int32)
        q = sub(("/quantizer/",), ("codes", onnx.TensorProto.INT32), "/quantizer/Squeeze/output_0", {"codes": cs})
        digits = (cs[0, 0, :, None].astype(np.int64) // 4 ** np.arange(8)) % 4
        check("neucodec: FSQ digits", q.shape == (1, 7, 8) and np.array_equal(q[0], (digits - 2) / 2.0), str(q))

        # the ISTFT head from its spectrum input to audio against numpy's irfft + overlap-add
        n_fft, hop, bins = 1920, 480, 961
        w = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)

        def reference(spec):  # [F, n_fft + 2] float64 -> F * hop samples
            F = spec.shape[0]
            S = np.minimum(np.exp(spec[:, :bins]), 100.0) * np.exp(1j * spec[:, bins:])
            frames = np.fft.irfft(S, n=n_fft, axis=1) * w
            y, env = np.zeros((F + 3) * hop), np.zeros((F + 3) * hop)
            for f in range(F):
                y[f * hop:f * hop + n_fft] += frames[f]
                env[f * hop:f * hop + n_fft] += w ** 2
            pad = (n_fft - hop) // 2
            return y[pad:-pad] / env[pad:-pad]

        for F in (1, 2, 7, 25, 81):
            spec = np.concatenate([r.uniform(-2.0, 5.5, (F, bins)),  # above log(100): clipped
                                   r.uniform(-np.pi, np.pi, (F, bins))], axis=1).astype(np.float32)
            got = sub(("/head/istft",), (gen_models.NEUCODEC_SPEC, onnx.TensorProto.FLOAT), "audio",
                      {gen_models.NEUCODEC_SPEC: spec[None]})
            ref = reference(spec.astype(np.float64))
            err = float(np.abs(got[0, 0] - ref).max()) if got.shape == (1, 1, F * hop) else float("inf")
            check("neucodec: irfft + overlap-add = numpy's for %d frames (max err %.1e, peak %.2f)"
                  % (F, err, np.abs(ref).max()), err < 1e-4)

        again = os.path.join(work, "neucodec_small_again.onnx")
        gen_models.build_neucodec(again, small)
        check("neucodec: byte-identical rebuild", filecmp.cmp(path, again, shallow=False))
        for f in (path, again):
            os.remove(f)
    run_case("neucodec", neucodec)


if __name__ == "__main__":
    t = time.time()
    try:
        main()
    except SystemExit:
        raise
    except Exception:
        check("test script", False, traceback.format_exc())
    print("%d passed, %d failed (%.1f s)" % (CHECKS.passed, CHECKS.failed, time.time() - t))
    sys.exit(1 if CHECKS.failed else 0)
