#!/usr/bin/env python3
"""Where a batched decode step's time goes: ONNX Runtime's own profiler on one package's decoder,
decode steps at batch 1, 2, 4 and 8 with every sequence at the same past length, time per operator
type. Used for docs/performance.md, "Concurrent requests".

    .onebit/venv/bin/python benches/batching/step_profile.py models/real-shape-opt [--past 320]
"""
import argparse, collections, glob, json, os, sys, tempfile, time

import numpy as np
import onnxruntime as ort

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--past", type=int, default=320)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

cfg = json.load(open(os.path.join(args.model, "genai_config.json")))["model"]["decoder"]
L, kvh, hd = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_size"]
cap = args.past + args.steps + 8


def session(profile_dir=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    if profile_dir:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "step")
    return ort.InferenceSession(os.path.join(args.model, cfg["filename"]), so,
                                providers=["CPUExecutionProvider"])


def steps(s, B, n):
    kv = [{k: np.random.RandomState(l).standard_normal((B, kvh, cap, hd)).astype(np.float32) * 0.1
           for k in ("key", "value")} for l in range(L)]
    times = []
    for t in range(n):
        past = args.past + t
        io = s.io_binding()
        io.bind_cpu_input("input_ids", np.full((B, 1), 1000 + t, np.int64))
        io.bind_cpu_input("attention_mask", np.ones((B, past + 1), np.int64))
        for l in range(L):
            for k in ("key", "value"):
                v = ort.OrtValue.ortvalue_from_numpy(kv[l][k])
                io.bind_ortvalue_input(f"past_key_values.{l}.{k}", v)
                io.bind_ortvalue_output(f"present.{l}.{k}", v)
        io.bind_output("logits")
        a = time.perf_counter()
        s.run_with_iobinding(io)
        times.append(time.perf_counter() - a)
    return times


print(f"{args.model}: {L} layers, past {args.past}, {args.threads} threads")
plain = session()
for B in (1, 2, 4, 8):
    t = sorted(steps(plain, B, args.steps)[2:])
    med = t[len(t) // 2] * 1e3
    print(f"batch {B}: step {med:.1f} ms, {B / med * 1e3:.1f} codes/s together, "
          f"{1e3 / med:.1f} per stream")

with tempfile.TemporaryDirectory() as d:
    rows = {}
    for B in (1, 2, 4):
        s = session(d)
        steps(s, B, args.steps)
        path = s.end_profiling()
        by = collections.Counter()
        runs = 0
        for e in json.load(open(path)):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by[e["args"]["op_name"]] += e["dur"]
            if e.get("name") == "model_run":
                runs += 1
        rows[B] = {op: us / max(runs, 1) / 1e3 for op, us in by.items()}
    ops = sorted(rows[1], key=lambda o: -rows[4].get(o, 0))
    print("\nms per step by operator type (ONNX Runtime profiler, mean over the steps)")
    print(f"{'op':<36}" + "".join(f"{'batch ' + str(b):>10}" for b in rows))
    for op in ops:
        print(f"{op:<36}" + "".join(f"{rows[b].get(op, 0):>10.2f}" for b in rows))
    print(f"{'total':<36}" + "".join(f"{sum(rows[b].values()):>10.2f}" for b in rows))
