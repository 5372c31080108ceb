#!/usr/bin/env python3
"""Codec batch scaling for docs/performance.md, "Concurrent requests": one streaming window of the
NeuCodec decoder for B streams, as B runs and as one run of batch B.

    .onebit/venv/bin/python benches/batching/codec_batch.py models/real-shape/codec/model.onnx
"""
# Codec batch scaling: one streaming window (lookback 50 + 25 + lookforward 5 = 80 codes) decoded
# for B streams as B separate runs versus one run of batch B, real-shape NeuCodec decoder.
import sys, time, numpy as np, onnxruntime as ort
path = sys.argv[1]
so = ort.SessionOptions(); so.intra_op_num_threads = 2
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
name = s.get_inputs()[0].name
F = 80
rng = np.random.RandomState(0)
def t(fn, n=5):
    fn(); xs = []
    for _ in range(n):
        a = time.perf_counter(); fn(); xs.append(time.perf_counter() - a)
    return sorted(xs)[len(xs)//2]
for B in (1, 2, 4):
    codes = rng.randint(0, 65536, (B, 1, F)).astype(np.int32)
    sep = t(lambda: [s.run(None, {name: codes[i:i+1]}) for i in range(B)])
    one = t(lambda: s.run(None, {name: codes}))
    print(f"B={B}: {B} runs {sep*1e3:.0f} ms, one batched run {one*1e3:.0f} ms ({sep/one:.2f}x)")
