#!/usr/bin/env python3
"""CPU time of one decode step and of a 128-token prefill, for packages that differ in their int4
block size (or in anything else), one ONNX Runtime session each in this one process, passes
alternating so a busy spell hits all alike. CPU time (process_time) is the work done; with one
thread it is little moved by other processes. Used for docs/performance.md, "The int4
block size".

    .onebit/venv/bin/python benches/block_size.py [--threads 1] [--passes 3] \
        models/real-shape-opt models/real-shape-b128-opt
    .onebit/venv/bin/python benches/block_size.py --weight-error   # the rounding, no packages

--weight-error: the relative RMS error of tools/gen_models.py's int4 rounding (the one the
packages use) at blocks of 32, 64 and 128, on a 896 x 4864 matrix of Gaussian and of Student's t
(4 degrees of freedom: heavier tails, like trained weights' outliers) draws, seed 0.
"""
import argparse, json, os, sys, time

import numpy as np
import onnxruntime as ort

ap = argparse.ArgumentParser()
ap.add_argument("models", nargs="*")
ap.add_argument("--weight-error", action="store_true")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--passes", type=int, default=3)
ap.add_argument("--past", type=int, default=128)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--prefill", type=int, default=128)
args = ap.parse_args()
if not args.models and not args.weight_error:
    ap.error("give package directories, or --weight-error")


def weight_error():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import gen_models as g

    rng = np.random.default_rng(0)
    for name, w in [("gaussian", rng.standard_normal((896, 4864)).astype(np.float32)),
                    ("student-t df=4", rng.standard_t(4, (896, 4864)).astype(np.float32))]:
        errs = []
        for b in (32, 64, 128):
            g.BLOCK = b
            d = g.dequantize_rows(*g.quantize_rows(w))
            errs.append("block %d: %.4f" % (b, np.linalg.norm(d - w) / np.linalg.norm(w)))
        print("%s: relative RMS error %s" % (name, "; ".join(errs)))


def load(model):
    cfg = json.load(open(os.path.join(model, "genai_config.json")))["model"]["decoder"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    s = ort.InferenceSession(os.path.join(model, cfg["filename"]), so, providers=["CPUExecutionProvider"])
    return s, cfg


def decode(s, cfg):
    """Median CPU and wall ms of a step at `past` positions (a shared KV buffer, bound in place)."""
    L, kvh, hd = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_size"]
    cap = args.past + args.steps + 8
    kv = [{k: ort.OrtValue.ortvalue_from_numpy(
        np.random.RandomState(l).standard_normal((1, kvh, cap, hd)).astype(np.float32) * 0.1)
        for k in ("key", "value")} for l in range(L)]
    cpu, wall = [], []
    for t in range(args.steps):
        io = s.io_binding()
        io.bind_cpu_input("input_ids", np.full((1, 1), 160000 + t, np.int64))
        io.bind_cpu_input("attention_mask", np.ones((1, args.past + t + 1), np.int64))
        for l in range(L):
            for k in ("key", "value"):
                io.bind_ortvalue_input(f"past_key_values.{l}.{k}", kv[l][k])
                io.bind_ortvalue_output(f"present.{l}.{k}", kv[l][k])
        io.bind_output("logits")
        c, w = time.process_time(), time.perf_counter()
        s.run_with_iobinding(io)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return np.median(cpu[3:]) * 1e3, np.median(wall[3:]) * 1e3


def prefill(s, cfg):
    n = args.prefill
    feeds = {"input_ids": np.full((1, n), 1000, np.int64), "attention_mask": np.ones((1, n), np.int64)}
    for i in s.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, cfg["num_key_value_heads"], 0, cfg["head_size"]), np.float32)
    c, w = time.process_time(), time.perf_counter()
    s.run(["logits"], feeds)
    return (time.process_time() - c) * 1e3, (time.perf_counter() - w) * 1e3


if args.weight_error:
    weight_error()
sessions = {m: load(m) for m in args.models}
if sessions:
    print(f"{args.threads} threads; decode at {args.past} positions, prefill of {args.prefill} tokens")
for _ in range(args.passes):
    for m, (s, cfg) in sessions.items():
        d, p = decode(s, cfg), prefill(s, cfg)
        print(f"{os.path.basename(os.path.normpath(m)):24s} decode step cpu {d[0]:6.2f} ms wall {d[1]:6.2f} ms"
              f" | prefill cpu {p[0]:7.1f} ms wall {p[1]:7.1f} ms", flush=True)
