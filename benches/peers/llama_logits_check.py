"""How close llama.cpp's logits on a converted GGUF are to ONNX Runtime's on the source package.

    .onebit/venv/bin/python benches/peers/llama_logits_check.py PACKAGE GGUF [--lens 16,128,512]

For deterministic prompts (a quarter text ids, then <|SPEECH_GENERATION_START|>-free speech ids)
it takes the last position's logits after the prompt from
  - ONNX Runtime on PACKAGE as it is (MatMulNBits accuracy_level as the builder wrote it: int8
    activations for level 4),
  - ONNX Runtime on PACKAGE with accuracy_level 0 (float activations): the reference,
  - llama.cpp on GGUF (run in .onebit/llama/venv, scripts/setup-llama-peer.sh),
and prints each one's relative L2 distance to the reference and whether the argmax agrees. A
wrong mapping of the weights (rotary style, head order, q/k/v split) shows as a distance near 1;
numerics (activation quantisation, float16 KV cache) as a few percent, like ORT's own int8 mode.
The real-shape package takes about 5 GB of memory (two sessions, full-width prefill logits).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LLAMA = r"""
import json, sys, numpy as np, llama_cpp as L
gguf, prompts, out = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
quiet = L.llama_log_callback(lambda *a: None)  # kept referenced while llama.cpp holds it
L.llama_log_set(quiet, None)
L.llama_backend_init()
m = L.llama_model_load_from_file(gguf.encode(), L.llama_model_default_params())
nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
rows = []
for p in prompts:
    cp = L.llama_context_default_params(); cp.n_ctx = len(p) + 8; cp.n_batch = len(p)
    ctx = L.llama_init_from_model(m, cp)
    ids = (L.llama_token * len(p))(*p)
    assert L.llama_decode(ctx, L.llama_batch_get_one(ids, len(p))) == 0
    rows.append(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(nv,)).copy())
    L.llama_free(ctx)
np.save(out, np.stack(rows))
"""


def prompts_for(pkg, lens):
    exp = json.load(open(os.path.join(pkg, "expect.json"))) if os.path.exists(os.path.join(pkg, "expect.json")) else {}
    base = exp.get("base_vocab_size", 256)
    first, count = exp.get("speech_first_id"), exp.get("speech_count", 65536)
    r = np.random.RandomState(7)
    out = []
    for n in lens:
        t = n // 4
        p = [int(x) for x in r.randint(0, base, t)]
        p += [int(first + x) for x in r.randint(0, count, n - t)] if first is not None else [int(x) for x in r.randint(0, base, n - t)]
        out.append(p)
    return out


def ort_logits(model, dec, prompts, data_dir=None):
    so = ort.SessionOptions()
    if data_dir:  # a graph given as bytes finds its external data here
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", data_dir)
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    rows = []
    for p in prompts:
        feeds = {"input_ids": np.array([p], np.int64), "attention_mask": np.ones((1, len(p)), np.int64)}
        for l in range(dec["num_hidden_layers"]):
            for k in ("key", "value"):
                feeds["past_key_values.%d.%s" % (l, k)] = np.zeros(
                    (1, dec["num_key_value_heads"], 0, dec["head_size"]), np.float32)
        rows.append(s.run(["logits"], feeds)[0][0, -1])
    return np.stack(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package")
    ap.add_argument("gguf")
    ap.add_argument("--lens", default="16,128,512")
    ap.add_argument("--python", default=os.path.join(ROOT, ".onebit", "llama", "venv", "bin", "python"),
                    help="python with llama_cpp (default: the one scripts/setup-llama-peer.sh makes)")
    a = ap.parse_args()
    lens = [int(x) for x in a.lens.split(",")]
    dec = json.load(open(os.path.join(a.package, "genai_config.json")))["model"]["decoder"]
    prompts = prompts_for(a.package, lens)
    path = os.path.join(a.package, dec.get("filename", "model.onnx"))
    asis = ort_logits(path, dec, prompts)
    m = onnx.load(path, load_external_data=False)
    for n in m.graph.node:
        for at in n.attribute:
            if n.op_type == "MatMulNBits" and at.name == "accuracy_level":
                at.i = 0
    ref = ort_logits(m.SerializeToString(), dec, prompts, os.path.dirname(os.path.abspath(path)))
    with tempfile.TemporaryDirectory() as tmp:
        pj, out = os.path.join(tmp, "prompts.json"), os.path.join(tmp, "llama.npy")
        json.dump(prompts, open(pj, "w"))
        subprocess.run([a.python, "-c", LLAMA, a.gguf, pj, out], check=True)
        llama = np.load(out)
    print("relative L2 distance of the last-position logits to ONNX Runtime with float activations")
    print("%7s  %22s  %22s" % ("prompt", "ORT as packaged", "llama.cpp " + os.path.basename(a.gguf)))
    for i, n in enumerate(lens):
        cells = []
        for x in (asis[i], llama[i]):
            d = np.linalg.norm(x - ref[i]) / np.linalg.norm(ref[i])
            cells.append("%.4f, argmax %s" % (d, "same" if x.argmax() == ref[i].argmax() else "differs"))
        print("%7d  %22s  %22s" % (n, cells[0], cells[1]))


if __name__ == "__main__":
    sys.exit(main())
