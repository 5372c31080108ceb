#!/usr/bin/env python3
"""Where a decode step of the backbone goes on the CPU, and whether codec windows between steps
slow the steps. Used for docs/performance.md, "Whole streaming synthesis on 2 cores" (issue 41).

    .onebit/venv/bin/python benches/decode_step.py models/real-shape-opt [--threads 2]

1. The package's int4 weights: the bytes of MatMulNBits weights and scales one step reads.
2. ONNX Runtime's profiler over 40 steps at ~150 positions (a shared KV buffer bound in place, as
   the engine does): kernel time per step by operator, and the lm_head's.
3. Steps alone against steps with one 81-frame window of the package's NeuCodec decoder (its own
   session, same thread count) before every 25th step, all in this one thread, 3 alternating
   passes: the mean step, and the mean of the 3 steps right after a window against the others.
   A step slowed by the window's weights pushing the backbone's out of the caches would show
   in the first.

benches/membw.c gives the machine's read bandwidth to set the bytes against.
"""
import argparse, json, os, tempfile, time

import numpy as np
import onnx
import onnxruntime as ort

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--past", type=int, default=150)
args = ap.parse_args()

cfg = json.load(open(os.path.join(args.model, "genai_config.json")))["model"]["decoder"]
path = os.path.join(args.model, cfg["filename"])
L, kvh, hd = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_size"]

m = onnx.load(path, load_external_data=False)
init = {i.name: i for i in m.graph.initializer}
nbytes = 0
for node in m.graph.node:
    if node.op_type == "MatMulNBits":
        for name in node.input[1:]:
            if name in init:
                t = init[name]
                nbytes += int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
print(f"int4 weights, scales (and zero points) read per step: {nbytes / 2**20:.1f} MiB")


def session(file, profile=False):
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.force_spinning_stop", "1")
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "step")
    return ort.InferenceSession(file, so, providers=["CPUExecutionProvider"])


kv = [{k: ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kvh, args.past + 256, hd), np.float32))
       for k in ("key", "value")} for _ in range(L)]


def step(s, t):
    io = s.io_binding()
    io.bind_cpu_input("input_ids", np.full((1, 1), 160000 + t, np.int64))
    io.bind_cpu_input("attention_mask", np.ones((1, args.past + t + 1), np.int64))
    for l in range(L):
        for k in ("key", "value"):
            io.bind_ortvalue_input(f"past_key_values.{l}.{k}", kv[l][k])
            io.bind_ortvalue_output(f"present.{l}.{k}", kv[l][k])
    io.bind_output("logits")
    w = time.perf_counter()
    s.run_with_iobinding(io)
    return time.perf_counter() - w


s = session(path, profile=True)
walls = [step(s, t) for t in range(40)]
events = json.load(open(s.end_profiling()))
# The first 5 runs warm up (as in the wall-time median): their kernels are left out.
starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
runs, warm_from = len(starts) - 5, starts[5]
ops, head = {}, 0.0
for e in events:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= warm_from:
        op = e["args"].get("op_name")
        ops[op] = ops.get(op, 0) + e["dur"]
        if "lm_head" in e["name"]:
            head += e["dur"]
total = sum(ops.values())
print(f"profiled: {runs} steps, median wall {np.median(walls[5:]) * 1e3:.2f} ms, kernels {total / runs / 1e3:.2f} ms a step")
for op, d in sorted(ops.items(), key=lambda x: -x[1])[:6]:
    print(f"  {op:34s} {d / runs / 1e3:6.2f} ms  {100 * d / total:4.1f}%")
print(f"  of MatMulNBits, the lm_head       {head / runs / 1e3:6.2f} ms")

s = session(path)
codec_dir = os.path.join(args.model, "codec")
codec_json = os.path.join(codec_dir, "codec.json")
decoder = json.load(open(codec_json)).get("decoder", "model.onnx") if os.path.exists(codec_json) else "model.onnx"
codec = session(os.path.join(codec_dir, decoder))
codes = np.random.RandomState(0).randint(0, 65536, (1, 1, 81)).astype(np.int32)
for t in range(5):
    step(s, t)
codec.run(None, {"codes": codes})
print("100 steps each, a codec window before every 25th in the second row of a pass:")
for _ in range(3):
    for with_codec in (False, True):
        ts, windows = [], []
        for t in range(100):
            if with_codec and t % 25 == 0:
                w = time.perf_counter()
                codec.run(None, {"codes": codes})
                windows.append(time.perf_counter() - w)
            ts.append(step(s, t))
        ts = np.array(ts) * 1e3
        after = np.array([t % 25 < 3 for t in range(100)])
        print(f"  {'with windows' if with_codec else 'alone':12s} step {ts.mean():6.2f} ms;"
              f" 3 after a window {ts[after].mean():6.2f}, the others {ts[~after].mean():6.2f}"
              + (f"; window {np.mean(windows) * 1e3:.0f} ms" if windows else ""), flush=True)
