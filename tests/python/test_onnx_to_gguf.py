#!/usr/bin/env python3
"""Checks tools/onnx_to_gguf.py on generated packages.

    python tests/python/test_onnx_to_gguf.py WORKDIR PACKAGE...

For each package (models/tiny, models/tiny-random from scripts/gen-test-models.sh) it writes the
GGUF into WORKDIR and checks, reading it back with gguf's reader and the ONNX with onnx alone:
- the tensor names, shapes and types llama.cpp's qwen2 loader asks for, and nothing else;
- every Q4_0 weight dequantises to the MatMulNBits weight of the ONNX exactly, with each block's
  float32 scale rounded to float16 (q/k/v: the rows of the packed qkv_proj, in that order);
- norms and biases bit-identical; token_embd within Q4_0's rounding of the ONNX embedding;
- hyper-parameters from config.json / genai_config.json, the tokenizer metadata from
  tokenizer.json (tokens, merges, token types, bos/eos/pad);
and, on a copy of the first package re-saved with external data and a plain float32 embedding
(the layout of the real-shape package; its data file given a second hard link, as `models
optimize` does), that token_embd is byte-identical to gguf's Q4_0 of that embedding, and that a
copy with asymmetric zero points is refused.
Prints "N passed, M failed" and exits non-zero on any failure. No pytest needed.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "onnx_to_gguf.py")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, load_json  # noqa: E402

CHECKS = Checks()
check = CHECKS.check
run_case = CHECKS.run_case


def convert(pkg, out, *extra):
    return subprocess.run([sys.executable, TOOL, pkg, "--out", out, *extra], capture_output=True, text=True)


# ---- the ONNX side, read without the converter's code -------------------------------------------

def onnx_inits(path):
    m = onnx.load(path, load_external_data=False)
    base = os.path.dirname(path)
    inits = {}
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            # by hand: onnx refuses a data file with several hard links
            info = {e.key: e.value for e in t.external_data}
            with open(os.path.join(base, info["location"]), "rb") as f:
                f.seek(int(info.get("offset", 0)))
                t.raw_data = f.read(int(info["length"]))
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
        inits[t.name] = numpy_helper.to_array(t)
    return m, inits


def embedding(model, inits):
    """model.embed_tokens.weight: the initializer, or the constant subgraph evaluated by onnx's
    reference evaluator (the converter uses onnxruntime)."""
    name = "model.embed_tokens.weight"
    if name in inits:
        return inits[name].astype(np.float32)
    producer = {o: n for n in model.graph.node for o in n.output}
    need, todo = set(), [name]
    while todo:
        t = todo.pop()
        if t in inits or t in need or not t:
            continue
        need.add(t)
        todo.extend(producer[t].input)
    nodes = [n for n in model.graph.node if any(o in need for o in n.output)]
    used = {i for n in nodes for i in n.input}
    g = onnx.helper.make_graph(nodes, "embed", [], [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)],
                               initializer=[t for t in model.graph.initializer if t.name in used])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 22)])
    return ReferenceEvaluator(m).run(None, {})[0].astype(np.float32)


def nbits_weight(inits, prefix, n, k, fp16_scales):
    """Dequantised MatMulNBits weight [N, K]: byte i of a block holds elements 2i (low nibble)
    and 2i+1 (high nibble), value (q - 8) * scale."""
    packed = inits[prefix + ".MatMul.weight_Q4"].reshape(n, k // 32, 16)
    scale = inits[prefix + ".MatMul.weight_scales"].astype(np.float32).reshape(n, k // 32)
    if fp16_scales:
        scale = scale.astype(np.float16).astype(np.float32)
    q = np.empty((n, k // 32, 32), np.float32)
    q[:, :, 0::2] = (packed & 15).astype(np.float32) - 8
    q[:, :, 1::2] = (packed >> 4).astype(np.float32) - 8
    return (q * scale[:, :, None]).reshape(n, k)


# ---- the GGUF side ------------------------------------------------------------------------------

def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [int(f.parts[i][0]) if f.parts[i].dtype.kind in "iu" else float(f.parts[i][0]) for i in f.data]
    v = f.parts[f.data[0]]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(v).decode("utf-8")
    return v[0].item()


def tensors(reader):
    return {t.name: t for t in reader.tensors}


def dequant(t):
    """[rows, cols] float32 in row-major numpy order (ggml's ne1 x ne0)."""
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    return a.reshape(int(t.shape[1]), int(t.shape[0])) if len(t.shape) == 2 else a.reshape(-1)


def expected_tensors(nl, hidden, inter, nh, nkv, hd, vocab):
    """Names and ggml shapes (ne0, ne1) llama.cpp's LLM_ARCH_QWEN2 loader creates
    (llama-model.cpp), written out here rather than taken from the converter."""
    e = {"token_embd.weight": (hidden, vocab), "output_norm.weight": (hidden,), "output.weight": (hidden, vocab)}
    for l in range(nl):
        b = "blk.%d." % l
        e.update({
            b + "attn_norm.weight": (hidden,),
            b + "attn_q.weight": (hidden, nh * hd), b + "attn_q.bias": (nh * hd,),
            b + "attn_k.weight": (hidden, nkv * hd), b + "attn_k.bias": (nkv * hd,),
            b + "attn_v.weight": (hidden, nkv * hd), b + "attn_v.bias": (nkv * hd,),
            b + "attn_output.weight": (nh * hd, hidden),
            b + "ffn_norm.weight": (hidden,),
            b + "ffn_gate.weight": (hidden, inter), b + "ffn_up.weight": (hidden, inter),
            b + "ffn_down.weight": (inter, hidden),
        })
    return e


def check_package(pkg, gguf_path, tag):
    cfg = load_json(os.path.join(pkg, "config.json"))
    genai = load_json(os.path.join(pkg, "genai_config.json"))["model"]
    tok = load_json(os.path.join(pkg, "tokenizer.json"))
    tcfg = load_json(os.path.join(pkg, "tokenizer_config.json"))
    d = genai["decoder"]
    nl, nh, nkv, hd, hidden = (d["num_hidden_layers"], d["num_attention_heads"], d["num_key_value_heads"],
                               d["head_size"], d["hidden_size"])
    inter, vocab = cfg["intermediate_size"], genai["vocab_size"]
    r = gguf.GGUFReader(gguf_path)
    T = tensors(r)
    model, inits = onnx_inits(os.path.join(pkg, "model.onnx"))

    check("%s: architecture qwen2" % tag, field(r, "general.architecture") == "qwen2")
    want_kv = {
        "qwen2.block_count": nl, "qwen2.embedding_length": hidden, "qwen2.feed_forward_length": inter,
        "qwen2.attention.head_count": nh, "qwen2.attention.head_count_kv": nkv,
        "qwen2.context_length": cfg["max_position_embeddings"],
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_0),
    }
    got_kv = {k: field(r, k) for k in want_kv}
    check("%s: hyper-parameters" % tag, got_kv == want_kv, "%s != %s" % (got_kv, want_kv))
    check("%s: rope base and rms eps" % tag,
          abs(field(r, "qwen2.rope.freq_base") - cfg["rope_theta"]) <= 1e-6 * cfg["rope_theta"]
          and abs(field(r, "qwen2.attention.layer_norm_rms_epsilon") - cfg["rms_norm_eps"]) < 1e-12)

    want = expected_tensors(nl, hidden, inter, nh, nkv, hd, vocab)
    got = {n: tuple(int(x) for x in t.shape) for n, t in T.items()}
    check("%s: tensor names and shapes as llama.cpp's qwen2 expects" % tag, got == want,
          "missing %s, extra %s, wrong shape %s" % (
              sorted(set(want) - set(got)), sorted(set(got) - set(want)),
              sorted(n for n in set(want) & set(got) if want[n] != got[n])))
    bad_types = [n for n, t in T.items()
                 if t.tensor_type != (gguf.GGMLQuantizationType.Q4_0 if len(t.shape) == 2 else gguf.GGMLQuantizationType.F32)]
    check("%s: 2-D weights Q4_0, the rest F32" % tag, not bad_types, str(bad_types))

    # weights: the same numbers as the ONNX up to float16 block scales
    mism = []
    for l in range(nl):
        p = "model.layers.%d" % l
        qkv = nbits_weight(inits, p + ".attn.qkv_proj", (nh + 2 * nkv) * hd, hidden, True)
        qkv32 = nbits_weight(inits, p + ".attn.qkv_proj", (nh + 2 * nkv) * hd, hidden, False)
        bias = inits[p + ".attn.qkv_proj.Add.bias"]
        rows = {"q": slice(0, nh * hd), "k": slice(nh * hd, (nh + nkv) * hd), "v": slice((nh + nkv) * hd, (nh + 2 * nkv) * hd)}
        pairs = [("blk.%d.attn_%s.weight" % (l, x), qkv[rs]) for x, rs in rows.items()]
        pairs += [("blk.%d.attn_output.weight" % l, nbits_weight(inits, p + ".attn.o_proj", hidden, nh * hd, True)),
                  ("blk.%d.ffn_gate.weight" % l, nbits_weight(inits, p + ".mlp.gate_proj", inter, hidden, True)),
                  ("blk.%d.ffn_up.weight" % l, nbits_weight(inits, p + ".mlp.up_proj", inter, hidden, True)),
                  ("blk.%d.ffn_down.weight" % l, nbits_weight(inits, p + ".mlp.down_proj", hidden, inter, True))]
        for name, ref in pairs:
            if not np.array_equal(dequant(T[name]), ref):
                mism.append(name)
        for x, rs in rows.items():
            if not np.array_equal(dequant(T["blk.%d.attn_%s.bias" % (l, x)]), bias[rs]):
                mism.append("blk.%d.attn_%s.bias" % (l, x))
            # and against the float32 scales: only float16 rounding apart
            g = dequant(T["blk.%d.attn_%s.weight" % (l, x)])
            if not np.allclose(g, qkv32[rs], rtol=2.0 ** -11, atol=0):
                mism.append("blk.%d.attn_%s.weight (vs float32 scales)" % (l, x))
        for name, init in (("attn_norm", ".input_layernorm.weight"), ("ffn_norm", ".post_attention_layernorm.weight")):
            if not np.array_equal(dequant(T["blk.%d.%s.weight" % (l, name)]), inits[p + init]):
                mism.append("blk.%d.%s.weight" % (l, name))
    if not np.array_equal(dequant(T["output_norm.weight"]), inits["model.layers.%d.final_norm_layernorm.weight" % nl]):
        mism.append("output_norm.weight")
    if not np.array_equal(dequant(T["output.weight"]), nbits_weight(inits, "lm_head", vocab, hidden, True)):
        mism.append("output.weight")
    check("%s: Q4_0 blocks dequantise to the MatMulNBits weights (float16 scales); norms, biases exact" % tag,
          not mism, str(mism))

    emb = embedding(model, inits)
    e = dequant(T["token_embd.weight"])
    blocks = emb.reshape(vocab, hidden // 32, 32)
    # |d| = max/8 per block: the clipped extreme is off by up to |d|, the rest by |d|/2, plus what
    # float16 d adds (up to 8|d|/2^11)
    dmax = np.abs(blocks).max(axis=2, keepdims=True) / 8.0
    err = np.abs(e.reshape(blocks.shape) - blocks)
    check("%s: token_embd within Q4_0 rounding of the ONNX embedding" % tag,
          bool(np.all(err <= dmax * (1 + 2.0 ** -7) + 1e-7)), "worst excess %g" % float(np.max(err - dmax)))

    # tokenizer
    text = {i: t for t, i in tok["model"]["vocab"].items()}
    special = set()
    for a in tok["added_tokens"]:
        text[a["id"]] = a["content"]
        if a["special"]:
            special.add(a["id"])
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    check("%s: tokenizer model gpt2, pre qwen2" % tag,
          field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "qwen2")
    check("%s: one token per embedding row" % tag, len(tokens) == vocab and len(types) == vocab)
    bad = [i for i in range(vocab) if tokens[i] != text.get(i, "[PAD%d]" % i)]
    check("%s: tokens as tokenizer.json" % tag, not bad, "first bad ids %s" % bad[:5])
    want_types = [int(gguf.TokenType.CONTROL) if i in special else int(gguf.TokenType.NORMAL) if i in text
                  else int(gguf.TokenType.UNUSED) for i in range(vocab)]
    check("%s: token types (added special CONTROL, padding UNUSED)" % tag, types == want_types)
    check("%s: merges as tokenizer.json" % tag, field(r, "tokenizer.ggml.merges") == tok["model"]["merges"])
    ids = {t: i for i, t in text.items()}
    got_ids = (field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id"),
               field(r, "tokenizer.ggml.padding_token_id"), field(r, "tokenizer.ggml.add_bos_token"))
    want_ids = (genai["bos_token_id"], ids[tcfg["eos_token"]], ids[tcfg["pad_token"]], False)
    check("%s: bos/eos/pad ids, no bos added" % tag, got_ids == want_ids, "%s != %s" % (got_ids, want_ids))
    return r, emb


def external_copy(pkg, dst, emb, zero_points=False):
    """pkg re-saved with a plain float32 embedding and every initializer in model.onnx.data."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(pkg, dst, ignore=shutil.ignore_patterns("model.onnx*", "codec"))
    m = onnx.load(os.path.join(pkg, "model.onnx"))
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    # drop the embedding's constant subgraph (nodes only it uses), keep a plain initializer
    need, todo = set(), ["model.embed_tokens.weight"]
    while todo:
        t = todo.pop()
        if t in producer and t not in need:
            need.add(t)
            todo.extend(producer[t].input)
    keep = [n for n in g.node if not any(o in need for o in n.output)]
    used = {i for n in keep for i in n.input}
    inits = [t for t in g.initializer if t.name in used]
    inits.append(numpy_helper.from_array(emb, "model.embed_tokens.weight"))
    if zero_points:
        n = next(n for n in keep if n.op_type == "MatMulNBits" and "o_proj" in n.name)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        cols = attrs["K"] // 32
        zp = np.full((attrs["N"], (cols + 1) // 2), 0x88, np.uint8)
        zp[0, 0] = 0x87  # one block with zero point 7
        inits.append(numpy_helper.from_array(zp, "o_proj_zero_points"))
        n.input.append("o_proj_zero_points")
    del g.node[:]
    g.node.extend(keep)
    del g.initializer[:]
    g.initializer.extend(inits)
    onnx.save(m, os.path.join(dst, "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=0)
    return dst


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    work = os.path.abspath(sys.argv[1])
    os.makedirs(work, exist_ok=True)
    first = None
    for pkg in sys.argv[2:]:
        pkg = os.path.abspath(pkg)
        tag = os.path.basename(pkg)
        out = os.path.join(work, tag + "-q4_0.gguf")
        p = convert(pkg, out)
        check("%s: converts" % tag, p.returncode == 0 and os.path.exists(out), p.stdout + p.stderr)
        if p.returncode != 0:
            continue
        res = {}

        def case():
            res["v"] = check_package(pkg, out, tag)[1]

        run_case("%s: checks" % tag, case)
        if first is None and "v" in res:
            first = (pkg, tag, res["v"])

    if first is not None:
        pkg, tag, emb = first

        def external():
            dst = external_copy(pkg, os.path.join(work, tag + "-external"), emb)
            # a second hard link to the data file, as `models optimize` makes (onnx's own loader
            # refuses such a file)
            os.link(os.path.join(dst, "model.onnx.data"), os.path.join(dst, "model.onnx.data.link"))
            out = os.path.join(work, tag + "-external-q4_0.gguf")
            p = convert(dst, out)
            check("%s external: converts (data file with two hard links)" % tag, p.returncode == 0, p.stdout + p.stderr)
            reader, _ = check_package(dst, out, tag + " external")
            t = tensors(reader)["token_embd.weight"]
            want = gguf.quants.quantize(emb, gguf.GGMLQuantizationType.Q4_0)
            check("%s external: token_embd is gguf's Q4_0 of the embedding, byte for byte" % tag,
                  np.array_equal(np.asarray(t.data).reshape(want.shape), want))
            out8 = os.path.join(work, tag + "-external-q8.gguf")
            p = convert(dst, out8, "--token-embd", "q8_0")
            t8 = tensors(gguf.GGUFReader(out8))["token_embd.weight"] if p.returncode == 0 else None
            check("%s external: --token-embd q8_0" % tag,
                  t8 is not None and t8.tensor_type == gguf.GGMLQuantizationType.Q8_0)

        def float32():
            # --weights f32: every MatMulNBits weight dequantised exactly (float32 scales kept)
            out = os.path.join(work, tag + "-f32.gguf")
            p = convert(pkg, out, "--weights", "f32", "--token-embd", "f32")
            check("%s: --weights f32 converts" % tag, p.returncode == 0, p.stdout + p.stderr)
            r = gguf.GGUFReader(out)
            T = tensors(r)
            _, inits = onnx_inits(os.path.join(pkg, "model.onnx"))
            d = load_json(os.path.join(pkg, "genai_config.json"))["model"]["decoder"]
            inter = load_json(os.path.join(pkg, "config.json"))["intermediate_size"]
            nl, nh, nkv, hd, hidden = (d["num_hidden_layers"], d["num_attention_heads"],
                                       d["num_key_value_heads"], d["head_size"], d["hidden_size"])
            check("%s f32: every tensor F32, file type ALL_F32" % tag,
                  all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in T.values())
                  and field(r, "general.file_type") == int(gguf.LlamaFileType.ALL_F32))
            mism = []
            for l in range(nl):
                p_ = "model.layers.%d" % l
                qkv = nbits_weight(inits, p_ + ".attn.qkv_proj", (nh + 2 * nkv) * hd, hidden, False)
                pairs = [("blk.%d.attn_q.weight" % l, qkv[:nh * hd]),
                         ("blk.%d.attn_k.weight" % l, qkv[nh * hd:(nh + nkv) * hd]),
                         ("blk.%d.attn_v.weight" % l, qkv[(nh + nkv) * hd:]),
                         ("blk.%d.attn_output.weight" % l, nbits_weight(inits, p_ + ".attn.o_proj", hidden, nh * hd, False)),
                         ("blk.%d.ffn_down.weight" % l, nbits_weight(inits, p_ + ".mlp.down_proj", hidden, inter, False))]
                mism += [n for n, ref in pairs if not np.array_equal(dequant(T[n]), ref)]
            check("%s f32: weights equal the int4 blocks dequantised in float32, exactly" % tag, not mism, str(mism))
            # the converter evaluates a computed embedding with onnxruntime, this test with onnx's
            # reference evaluator: their cos/sin agree to float32 rounding, not bit for bit
            got = dequant(T["token_embd.weight"])
            check("%s f32: token_embd is the embedding in float32" % tag,
                  got.shape == emb.shape and float(np.max(np.abs(got - emb))) <= 1e-6 * max(1.0, float(np.max(np.abs(emb)))),
                  "max diff %s" % (np.max(np.abs(got - emb)) if got.shape == emb.shape else (got.shape, emb.shape)))

        def zero_points():
            dst = external_copy(pkg, os.path.join(work, tag + "-zp"), emb, zero_points=True)
            out = os.path.join(work, tag + "-zp.gguf")
            p = convert(dst, out)
            check("%s: asymmetric zero points are refused" % tag,
                  p.returncode != 0 and "zero points" in p.stderr and not os.path.exists(out), p.stderr)

        run_case("%s external: checks" % tag, external)
        run_case("%s: zero points" % tag, zero_points)
        run_case("%s: float32 weights" % tag, float32)

    print("%d passed, %d failed" % (CHECKS.passed, CHECKS.failed))
    sys.exit(1 if CHECKS.failed else 0)


if __name__ == "__main__":
    main()
