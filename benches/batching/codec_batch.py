#!/usr/bin/env python3
"""Codec batch scaling for docs/performance.md, "Concurrent requests": one streaming window of the
NeuCodec decoder for B streams, as B runs and as one run of batch B.

    .onebit/venv/bin/python benches/batching/codec_batch.py models/real-shape/codec/model.onnx \
        [--threads 2] [--batches 1,2,4]
"""
# One streaming window (lookback 50 + 25 + lookforward 5 = 80 codes) decoded for B streams as B
# runs one after another (the scheduler's codec lock), as one run of batch B, and as B runs at
# once from B threads (no lock: the runs share the session's pool), with the session's intra-op threads as the server's
# codec session would have them (one per usable physical core: 2 on the 2-core machines, 16 on a
# 16-core one).
import argparse, time, concurrent.futures as cf, numpy as np, onnxruntime as ort
ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--batches", default="1,2,4")
a = ap.parse_args()
so = ort.SessionOptions(); so.intra_op_num_threads = a.threads
s = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
name = s.get_inputs()[0].name
F = 80
rng = np.random.RandomState(0)
def t(fn, n=5):
    fn(); xs = []
    for _ in range(n):
        a0 = time.perf_counter(); fn(); xs.append(time.perf_counter() - a0)
    return sorted(xs)[len(xs)//2]
print(f"onnxruntime {ort.__version__}, {a.threads} intra-op threads")
for B in (int(b) for b in a.batches.split(",")):
    codes = rng.randint(0, 65536, (B, 1, F)).astype(np.int32)
    sep = t(lambda: [s.run(None, {name: codes[i:i+1]}) for i in range(B)])
    one = t(lambda: s.run(None, {name: codes}))
    with cf.ThreadPoolExecutor(B) as pool:
        par = t(lambda: list(pool.map(lambda i: s.run(None, {name: codes[i:i+1]}), range(B))))
    print(f"B={B}: {B} runs one after another {sep*1e3:.0f} ms, one batched run {one*1e3:.0f} ms "
          f"({sep/one:.2f}x), {B} runs at once {par*1e3:.0f} ms ({sep/par:.2f}x)")
