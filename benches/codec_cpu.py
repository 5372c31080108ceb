#!/usr/bin/env python3
"""Cost of one NeuCodec decoder run alone: wall and CPU time per window of F frames.

    .onebit/venv/bin/python benches/codec_cpu.py models/real-shape/codec/model.onnx [--frames 71,81,120]
                                                  [--threads 1,2] [--runs 5]

ONNX Runtime CPU, one session per thread count (spinning off, so CPU time is the work done), one
warm-up run per window size, random codes, median of --runs. 81 frames is the streaming decoder's
window (50 lookback + 25 + 5 lookahead + 1 overlap); 71 the tail after 120 codes. CPU time is
much less inflated than wall time when other processes share the cores.
"""
import argparse
import resource
import time

import numpy as np
import onnxruntime as ort


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--frames", default="71,81,120")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    for th in (int(t) for t in a.threads.split(",")):
        so = ort.SessionOptions()
        so.intra_op_num_threads = th
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        s = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
        r = np.random.RandomState(0)
        for f in (int(x) for x in a.frames.split(",")):
            codes = r.randint(0, 65536, (1, 1, f)).astype(np.int32)
            s.run(None, {"codes": codes})
            wall, cpu = [], []
            for _ in range(a.runs):
                t, c = time.perf_counter(), cpu_s()
                s.run(None, {"codes": codes})
                wall.append(time.perf_counter() - t)
                cpu.append(cpu_s() - c)
            print("threads %d  frames %3d  wall %4.0f ms (min %4.0f)  cpu %4.0f ms  %.2f ms cpu/frame" % (
                th, f, 1e3 * np.median(wall), 1e3 * min(wall), 1e3 * np.median(cpu), 1e3 * np.median(cpu) / f))


if __name__ == "__main__":
    main()
