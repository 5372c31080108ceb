#!/usr/bin/env python3
"""Convert an onnxruntime-genai Qwen2 int4 package to a Q4_0 GGUF for llama.cpp.

    python tools/onnx_to_gguf.py PACKAGE_DIR [--out FILE] [--token-embd q4_0|q8_0|f16|f32] [--weights q4_0|f32]
                                 [--neuphonic]

Reads the package as onnxruntime-genai's model builder writes it for int4 CPU (and as
tools/gen_models.py generates it): model.onnx (+ external data), config.json (HF),
genai_config.json, tokenizer.json, tokenizer_config.json. Writes a `qwen2` GGUF (default
PACKAGE_DIR-q4_0.gguf, beside the package so the package's own size is unchanged):

- every MatMulNBits weight (q/k/v split out of the packed qkv_proj, o_proj, gate/up/down, lm_head)
  as Q4_0 **from its own int4 blocks**: MatMulNBits with bits 4, block 32 and no zero points
  stores q in 0..15 meaning (q - 8) * scale, which is Q4_0's (q - 8) * d; only the nibble order
  within a block changes (MatMulNBits: elements 2i / 2i+1 in byte i; Q4_0: elements j / j+16 in
  byte j) and the float32 scale becomes Q4_0's float16 d. Nothing is re-quantised.
- the float32 embedding as Q4_0 by gguf.quants (a numpy port of ggml's quantize_row_q4_0_ref,
  the routine `llama-quantize --pure Q4_0` runs on token_embd when no imatrix is given);
  `--token-embd` picks another type, e.g. to see what the embedding's rounding costs.
- norms and biases as float32.
- tokenizer metadata: gpt2 BPE tokens, merges and token types from tokenizer.json (added special
  tokens are CONTROL, rows past the tokenizer's last id are [PADn] UNUSED, as
  convert_hf_to_gguf.py writes them), pre-tokenizer qwen2, bos/eos/pad from the configs.
- with --neuphonic, config.json's neuphonic section as the metadata the vendor's neutts reads
  from its GGUFs: neuphonic.input_format (a string) and neuphonic.supported_emotions (an array
  of strings), so a package of the GGUF alone says what NeuTTS-2E's GGUF builds say.

This is what `llama-quantize --pure Q4_0` would make of the same weights (without --pure,
llama-quantize would write output.weight as Q6_K): all 2-D weights Q4_0.
Refuses packages it cannot convert exactly: zero points other than 8, other bit widths or block
sizes, a speech-only lm_head (`models optimize`: convert the source package instead).
Needs numpy, onnx, gguf (scripts/setup.sh installs them into .onebit/venv).
"""

import argparse
import json
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

import gguf

QK = 32  # Q4_0 block (and the only MatMulNBits block size converted)
Q4_0 = gguf.GGMLQuantizationType.Q4_0
EMBD_TYPES = {
    "q4_0": Q4_0,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "f16": gguf.GGMLQuantizationType.F16,
    "f32": gguf.GGMLQuantizationType.F32,
}


class ConvertError(Exception):
    pass


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def tname(kind, bid=None):
    n = gguf.TENSOR_NAMES[kind]
    return (n.format(bid=bid) if bid is not None else n) + ".weight"


def tbias(kind, bid):
    return gguf.TENSOR_NAMES[kind].format(bid=bid) + ".bias"


def helper_dtype(data_type):
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))


class Onnx:
    """The decoder graph: initializers (loaded on demand, external data included) and nodes."""

    def __init__(self, path):
        self.dir = os.path.dirname(os.path.abspath(path))
        self.model = onnx.load(path, load_external_data=False)
        g = self.model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.nodes = list(g.node)
        self.producer = {o: n for n in self.nodes for o in n.output if o}

    def has(self, name):
        return name in self.inits

    def array(self, name):
        if name not in self.inits:
            raise ConvertError("the graph has no initializer %s" % name)
        t = self.inits[name]
        if t.data_location != onnx.TensorProto.EXTERNAL:
            return numpy_helper.to_array(t)
        # Read external data here: onnx's loader refuses a data file with several hard links,
        # and `models optimize` hard-links the source package's data file into its output.
        info = {e.key: e.value for e in t.external_data}
        path = os.path.join(self.dir, info["location"])
        dtype = helper_dtype(t.data_type)
        count = int(np.prod(t.dims, dtype=np.int64))
        if "length" in info and int(info["length"]) != count * dtype.itemsize:
            raise ConvertError("%s: external length %s, expected %d bytes" % (name, info["length"], count * dtype.itemsize))
        arr = np.fromfile(path, dtype=dtype, count=count, offset=int(info.get("offset", 0)))
        if arr.size != count:
            raise ConvertError("%s: %s ends early" % (name, path))
        return arr.reshape(tuple(t.dims))

    def node_using(self, init_name, op):
        for n in self.nodes:
            if n.op_type == op and init_name in n.input:
                return n
        raise ConvertError("no %s node reads %s" % (op, init_name))

    def computed(self, name):
        """A tensor the graph computes from initializers alone (the tiny package's embedding is
        a constant subgraph): run just that subgraph with onnxruntime."""
        need, todo, seen = [], [name], set()
        while todo:
            t = todo.pop()
            if t in seen or t in self.inits or not t:
                continue
            seen.add(t)
            n = self.producer.get(t)
            if n is None:
                raise ConvertError("%s is neither an initializer nor computed from initializers" % t)
            need.append(n)
            todo.extend(n.input)
        order = [n for n in self.nodes if any(n is m for m in need)]
        used = {i for n in order for i in n.input}
        inits = [self.inits[i] for i in sorted(used) if i in self.inits]
        for t in inits:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                raise ConvertError("%s: constant subgraph with external data is not supported" % name)
        out = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        graph = onnx.helper.make_graph(order, "sub", [], [out], initializer=inits)
        m = onnx.helper.make_model(graph, opset_imports=list(self.model.opset_import))
        m.ir_version = self.model.ir_version
        import onnxruntime as ort

        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run([name], {})[0]

    def tensor(self, name):
        return self.array(name) if self.has(name) else self.computed(name)


def matmul_nbits_q4_0(g, prefix):
    """MatMulNBits `prefix`.MatMul.weight_Q4 -> (Q4_0 bytes [N, K/32*18], N, K, q [N,K/32,32], scales)."""
    wname = prefix + ".MatMul.weight_Q4"
    node = g.node_using(wname, "MatMulNBits")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    k, n = int(attrs["K"]), int(attrs["N"])
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 0))
    if bits != 4 or block != QK:
        raise ConvertError("%s: bits %d block_size %d; only 4-bit blocks of 32 map onto Q4_0" % (node.name, bits, block))
    if len(node.input) > 3 and node.input[3]:
        zp = g.array(node.input[3])
        packed_zp = zp.dtype == np.uint8 and zp.size * 2 >= n * (k // QK)
        vals = np.concatenate([zp & 0x0F, zp >> 4]) if packed_zp else zp
        if not np.all(vals.astype(np.int64) == 8):
            raise ConvertError("%s: zero points other than 8 (asymmetric int4) have no Q4_0 form" % node.name)
    for extra in node.input[4:]:
        if extra:
            raise ConvertError("%s: g_idx/bias inputs are not supported" % node.name)
    nb = k // QK
    packed = g.array(wname).reshape(n, nb, QK // 2)
    scales = g.array(node.input[2]).astype(np.float32).reshape(n, nb)
    q = np.empty((n, nb, QK), dtype=np.uint8)
    q[:, :, 0::2] = packed & 0x0F
    q[:, :, 1::2] = packed >> 4
    return q, scales, n, k


def q4_0_bytes(q, scales):
    """q [N, nb, 32] in 0..15 and scales [N, nb] -> ggml block_q4_0 rows [N, nb*18]."""
    n, nb, _ = q.shape
    d = scales.astype(np.float16).reshape(n, nb, 1).view(np.uint8)
    qs = q[:, :, : QK // 2] | (q[:, :, QK // 2:] << np.uint8(4))
    return np.concatenate([d, qs], axis=2).reshape(n, nb * (2 + QK // 2))


def quantize_rows(w, qtype, chunk=16384):
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return gguf.quants.quantize(w, qtype)
    parts = [gguf.quants.quantize(np.ascontiguousarray(w[s:s + chunk], dtype=np.float32), qtype)
             for s in range(0, w.shape[0], chunk)]
    return np.concatenate(parts, axis=0)


def tokenizer_meta(pkg, n_vocab):
    tok = load_json(os.path.join(pkg, "tokenizer.json"))
    model = tok["model"]
    if model.get("type") != "BPE":
        raise ConvertError("tokenizer.json: model type %r, only BPE is converted" % model.get("type"))
    text = {}
    types = {}
    for t, i in model["vocab"].items():
        text[i], types[i] = t, gguf.TokenType.NORMAL
    for a in tok.get("added_tokens", []):
        text[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    if max(text) >= n_vocab:
        raise ConvertError("tokenizer.json has id %d but the embedding has %d rows" % (max(text), n_vocab))
    tokens, ttypes = [], []
    for i in range(n_vocab):
        if i in text:
            tokens.append(text[i])
            ttypes.append(types[i])
        else:
            tokens.append("[PAD%d]" % i)
            ttypes.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    ids = {t: i for i, t in text.items()}
    return tokens, ttypes, merges, ids


def special_ids(pkg, ids):
    genai = load_json(os.path.join(pkg, "genai_config.json"))["model"]
    tcfg_path = os.path.join(pkg, "tokenizer_config.json")
    tcfg = load_json(tcfg_path) if os.path.exists(tcfg_path) else {}

    def tok_id(v):
        if isinstance(v, dict):
            v = v.get("content")
        return ids.get(v) if isinstance(v, str) else None

    eos = tok_id(tcfg.get("eos_token"))
    if eos is None:
        e = genai.get("eos_token_id")
        eos = e[0] if isinstance(e, list) else e
    bos = tok_id(tcfg.get("bos_token"))
    if bos is None:
        bos = genai.get("bos_token_id")
    pad = tok_id(tcfg.get("pad_token"))
    if pad is None:
        pad = genai.get("pad_token_id")
    return bos, eos, pad, bool(tcfg.get("add_bos_token", False))


def convert(pkg, out, embd="q4_0", log=print, weights="q4_0", neuphonic=False):
    pkg = os.path.abspath(pkg)
    genai = load_json(os.path.join(pkg, "genai_config.json"))["model"]
    cfg = load_json(os.path.join(pkg, "config.json"))
    if genai.get("type") != "qwen2" and cfg.get("model_type") != "qwen2":
        raise ConvertError("%s: not a qwen2 package (type %r)" % (pkg, genai.get("type")))
    logits_json = os.path.join(pkg, "onebit_logits.json")
    if os.path.exists(logits_json) and load_json(logits_json).get("speech_head"):
        raise ConvertError("%s has a speech-only lm_head (models optimize); convert its source package" % pkg)
    dec = genai["decoder"]
    g = Onnx(os.path.join(pkg, dec.get("filename", "model.onnx")))
    nl, nh, nkv = dec["num_hidden_layers"], dec["num_attention_heads"], dec["num_key_value_heads"]
    hd, hidden = dec["head_size"], dec["hidden_size"]
    if cfg.get("tie_word_embeddings"):
        raise ConvertError("tied embeddings are not converted")

    tmp = out + ".partial"  # renamed to `out` when complete
    w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN2])
    w.add_name(os.path.basename(pkg.rstrip("/")))
    w.add_string("general.source.url", "onnx:" + pkg)
    w.add_context_length(int(cfg.get("max_position_embeddings", genai["context_length"])))
    w.add_embedding_length(hidden)
    w.add_block_count(nl)
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if weights == "f32" else gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # --- embedding
    table = g.tensor("model.embed_tokens.weight").astype(np.float32, copy=False)
    n_vocab = table.shape[0]
    if table.shape[1] != hidden or n_vocab != genai["vocab_size"]:
        raise ConvertError("embedding %s, expected [%d, %d]" % (table.shape, genai["vocab_size"], hidden))
    et = EMBD_TYPES[embd]
    w.add_tensor(tname(gguf.MODEL_TENSOR.TOKEN_EMBD), quantize_rows(table, et), raw_dtype=et)
    del table

    stats = {"rel": 0.0, "tiny": 0, "blocks": 0}

    def add_q(name, q, s):
        if weights == "f32":
            # (q - 8) * scale in float32 is exactly the weight MatMulNBits computes with
            n, nb, _ = q.shape
            w.add_tensor(name, ((q.astype(np.float32) - 8.0) * s[:, :, None]).reshape(n, nb * QK))
            return
        # float16 d: relative change <= 2^-11 in float16's normal range; scales below it (2^-14)
        # lose bits or flush to 0 (counted; such blocks hold values below 1e-4 anyway)
        d16 = s.astype(np.float16).astype(np.float32)
        normal = np.abs(s) >= 2.0 ** -14
        if np.any(normal):
            stats["rel"] = max(stats["rel"], float(np.max(np.abs(d16[normal] - s[normal]) / np.abs(s[normal]))))
        stats["tiny"] += int(np.count_nonzero((s != 0) & ~normal))
        stats["blocks"] += s.size
        w.add_tensor(name, q4_0_bytes(q, s), raw_dtype=Q4_0)

    def add_f32(name, arr):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    # --- layers
    for l in range(nl):
        p = "model.layers.%d" % l
        add_f32(tname(gguf.MODEL_TENSOR.ATTN_NORM, l), g.array(p + ".input_layernorm.weight"))
        nq, nk = nh * hd, nkv * hd
        if g.has(p + ".attn.qkv_proj.MatMul.weight_Q4"):
            q, s, n, k = matmul_nbits_q4_0(g, p + ".attn.qkv_proj")
            if n != nq + 2 * nk or k != hidden:
                raise ConvertError("%s.attn.qkv_proj: N %d K %d, expected %d x %d" % (p, n, k, nq + 2 * nk, hidden))
            rows = {"q": slice(0, nq), "k": slice(nq, nq + nk), "v": slice(nq + nk, nq + 2 * nk)}
            bias = g.array(p + ".attn.qkv_proj.Add.bias") if g.has(p + ".attn.qkv_proj.Add.bias") else None
            parts = {x: (q[r], s[r], None if bias is None else bias[r]) for x, r in rows.items()}
        else:
            parts = {}
            for x in "qkv":
                q, s, n, k = matmul_nbits_q4_0(g, "%s.attn.%s_proj" % (p, x))
                b = "%s.attn.%s_proj.Add.bias" % (p, x)
                parts[x] = (q, s, g.array(b) if g.has(b) else None)
        kinds = {"q": gguf.MODEL_TENSOR.ATTN_Q, "k": gguf.MODEL_TENSOR.ATTN_K, "v": gguf.MODEL_TENSOR.ATTN_V}
        for x in "qkv":
            q, s, b = parts[x]
            add_q(tname(kinds[x], l), q, s)
            if b is None:
                raise ConvertError("%s: no %s bias (qwen2 has q/k/v biases)" % (p, x))
            add_f32(tbias(kinds[x], l), b)
        q, s, _, _ = matmul_nbits_q4_0(g, p + ".attn.o_proj")
        add_q(tname(gguf.MODEL_TENSOR.ATTN_OUT, l), q, s)
        add_f32(tname(gguf.MODEL_TENSOR.FFN_NORM, l), g.array(p + ".post_attention_layernorm.weight"))
        for proj, kind in (("gate_proj", gguf.MODEL_TENSOR.FFN_GATE), ("up_proj", gguf.MODEL_TENSOR.FFN_UP),
                           ("down_proj", gguf.MODEL_TENSOR.FFN_DOWN)):
            q, s, _, _ = matmul_nbits_q4_0(g, "%s.mlp.%s" % (p, proj))
            add_q(tname(kind, l), q, s)

    add_f32(tname(gguf.MODEL_TENSOR.OUTPUT_NORM), g.array("model.layers.%d.final_norm_layernorm.weight" % nl))
    q, s, n, k = matmul_nbits_q4_0(g, "lm_head")
    if n != n_vocab:
        raise ConvertError("lm_head has %d rows, the vocabulary %d (a speech-only head?)" % (n, n_vocab))
    add_q(tname(gguf.MODEL_TENSOR.OUTPUT), q, s)
    del q, s

    # --- tokenizer
    tokens, ttypes, merges, ids = tokenizer_meta(pkg, n_vocab)
    bos, eos, pad, add_bos = special_ids(pkg, ids)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos is not None:
        w.add_eos_token_id(int(eos))
    if pad is not None:
        w.add_pad_token_id(int(pad))
    w.add_add_bos_token(add_bos)
    if neuphonic:
        section = cfg.get("neuphonic") or {}
        if "input_format" in section:
            w.add_string("neuphonic.input_format", section["input_format"])
        if "supported_emotions" in section:
            w.add_array("neuphonic.supported_emotions", [str(e) for e in section["supported_emotions"]])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    if weights == "f32":
        log("wrote %s: qwen2, %d layers, vocab %d, token_embd %s, other 2-D weights float32 (the int4 blocks "
            "dequantised exactly), %.1f MiB" % (out, nl, n_vocab, embd.upper(), os.path.getsize(out) / 2**20))
        return stats
    log("wrote %s: qwen2, %d layers, vocab %d, token_embd %s, other 2-D weights Q4_0 from the int4 blocks "
        "(float16 scales: largest relative change %.1e; %d of %d blocks with a nonzero scale below 2^-14), %.1f MiB"
        % (out, nl, n_vocab, embd.upper(), stats["rel"], stats["tiny"], stats["blocks"], os.path.getsize(out) / 2**20))
    return stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", help="onnxruntime-genai package directory (model.onnx, configs, tokenizer.json)")
    ap.add_argument("--out", help="GGUF to write (default: PACKAGE-q4_0.gguf beside the package)")
    ap.add_argument("--token-embd", choices=sorted(EMBD_TYPES), default="q4_0",
                    help="type of token_embd (default q4_0, as llama-quantize --pure Q4_0)")
    ap.add_argument("--weights", choices=["q4_0", "f32"], default="q4_0",
                    help="type of the other 2-D weights: q4_0 (default, the int4 blocks as they are) or f32 "
                         "(dequantised exactly; with --token-embd f32 a GGUF whose logits follow the ONNX "
                         "package's up to float rounding, for parity tests)")
    ap.add_argument("--neuphonic", action="store_true",
                    help="write config.json's neuphonic section as GGUF metadata (neuphonic.input_format, "
                         "neuphonic.supported_emotions), as the vendor's neutts reads it")
    a = ap.parse_args(argv)
    base = os.path.abspath(a.package).rstrip("/")
    if a.weights == "f32":
        default = base + "-f32.gguf" if a.token_embd == "f32" else base + "-f32-embd-%s.gguf" % a.token_embd
    else:
        default = base + ("-q4_0.gguf" if a.token_embd == "q4_0" else "-q4_0-embd-%s.gguf" % a.token_embd)
    out = a.out or default
    try:
        convert(a.package, out, a.token_embd, weights=a.weights, neuphonic=a.neuphonic)
    except (ConvertError, FileNotFoundError, KeyError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
