"""llama.cpp's own decode loop on the same prompts, for `onebit-tts bench --peers`.

stdin: {"model": GGUF, "prompts": [[ids...]...], "new_tokens": N, "runs": R, "threads": T (optional)}
stdout: {"version": ..., "settings": {...}, "results": [{"prompt_tokens", "prefill_s": [...],
         "decode_tok_per_s": [...], "tokens": [...]}]}
Runs in the venv of scripts/setup-llama-peer.sh (llama-cpp-python built from source there; its
low-level bindings of llama.h, so the prompt ids are fed as they are, no tokenizer involved).
Greedy over the whole vocabulary, exactly N new tokens (the loop ignores end tokens), one warm-up
run per prompt and a fresh context for every run, as benches/peers/oga_bench.py does. Prefill =
one llama_decode of the whole prompt (n_batch = prompt length, llama.cpp's default n_ubatch);
decode = the N greedy choices and the N - 1 single-token llama_decode calls between them. Threads
default to the physical cores (llama.cpp's own default); flash attention is llama.cpp's default
(auto). "tokens" holds the new ids of the last run (for the greedy-agreement check).
"""
import ctypes
import json
import os
import sys
import time

import numpy as np

import llama_cpp as L


def physical_cores():
    cores = set()
    try:
        phys = core = None
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "physical id":
                    phys = v.strip()
                elif k == "core id":
                    core = v.strip()
                elif not k and core is not None:
                    cores.add((phys, core))
                    phys = core = None
        if core is not None:
            cores.add((phys, core))
    except OSError:
        pass
    n = len(cores) or os.cpu_count() or 1
    try:
        n = min(n, len(os.sched_getaffinity(0)))
    except AttributeError:
        pass
    return max(1, n)


@L.llama_log_callback
def _log(level, text, _user):
    # errors only (GGML_LOG_LEVEL_ERROR = 4); stdout carries the JSON
    if level == 4 and text:
        sys.stderr.write(text.decode("utf-8", "replace"))


def main():
    req = json.load(sys.stdin)
    if not os.environ.get("ONEBIT_LLAMA_LOG"):
        L.llama_log_set(_log, ctypes.c_void_p(0))
    L.llama_backend_init()
    threads = int(req.get("threads") or physical_cores())
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(req["model"].encode(), mp)
    if not model:
        raise SystemExit("llama.cpp could not load %s" % req["model"])
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    n = req["new_tokens"]
    if n < 1:
        raise SystemExit("new_tokens must be at least 1")
    results = []
    for prompt in req["prompts"]:
        pre, dec, last = [], [], []
        ids = (L.llama_token * len(prompt))(*prompt)
        one = (L.llama_token * 1)()
        for r in range(req["runs"] + 1):
            cp = L.llama_context_default_params()
            cp.n_ctx = len(prompt) + n
            cp.n_batch = len(prompt)
            cp.n_threads = threads
            cp.n_threads_batch = threads
            cp.no_perf = True
            ctx = L.llama_init_from_model(model, cp)
            if not ctx:
                raise SystemExit("llama.cpp could not make a context of %d tokens" % cp.n_ctx)
            try:
                t0 = time.perf_counter()
                if L.llama_decode(ctx, L.llama_batch_get_one(ids, len(prompt))) != 0:
                    raise SystemExit("llama_decode failed on the %d-token prompt" % len(prompt))
                L.llama_synchronize(ctx)
                t1 = time.perf_counter()
                made = []
                while True:
                    logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
                    tok = int(np.argmax(logits))
                    made.append(tok)
                    if len(made) == n:
                        break
                    one[0] = tok
                    if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                        raise SystemExit("llama_decode failed at step %d" % len(made))
                t2 = time.perf_counter()
            finally:
                L.llama_free(ctx)
            if r == 0:
                continue
            pre.append(t1 - t0)
            # The first token comes from the prefill's logits; the loop runs the model n-1 times.
            dec.append((len(made) - 1) / (t2 - t1))
            last = made
        results.append({"prompt_tokens": len(prompt), "prefill_s": pre, "decode_tok_per_s": dec, "tokens": last})
    L.llama_model_free(model)
    settings = {"threads": threads, "n_ubatch": int(L.llama_context_default_params().n_ubatch),
                "flash_attn": "auto", "greedy": "full vocabulary",
                "system_info": L.llama_print_system_info().decode().strip()}
    json.dump({"version": "llama-cpp-python %s" % L.__version__, "settings": settings, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
