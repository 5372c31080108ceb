"""onnxruntime-genai's own generation loop on the same prompts, for `onebit-tts bench --peers`.

stdin: {"model": DIR, "prompts": [[ids...]...], "new_tokens": N, "runs": R}
stdout: {"version": ..., "results": [{"prompt_tokens", "prefill_s": [...], "decode_tok_per_s": [...],
         "tokens": [new ids of the last run]}]}
Greedy, exactly N new tokens (min_length = max_length = prompt + N, so no eos ends a run early),
one warm-up run per prompt, as the Rust side does.
"""
import json
import sys
import time

import onnxruntime_genai as og


def main():
    req = json.load(sys.stdin)
    config = og.Config(req["model"])
    config.clear_providers()
    model = og.Model(config)
    n = req["new_tokens"]
    results = []
    for prompt in req["prompts"]:
        pre, dec, last = [], [], []
        for r in range(req["runs"] + 1):
            params = og.GeneratorParams(model)
            total = len(prompt) + n
            params.set_search_options(do_sample=False, max_length=total, min_length=total)
            gen = og.Generator(model, params)
            t0 = time.perf_counter()
            gen.append_tokens(prompt)
            t1 = time.perf_counter()
            made = 0
            while not gen.is_done() and made < n:
                gen.generate_next_token()
                made += 1
            t2 = time.perf_counter()
            seq = gen.get_sequence(0)
            del gen
            if r == 0:
                continue
            pre.append(t1 - t0)
            # The first token comes from the prefill's logits; the loop runs the model made-1 times.
            dec.append((made - 1) / (t2 - t1))
            last = [int(t) for t in seq[len(prompt):]]
        results.append({"prompt_tokens": len(prompt), "prefill_s": pre, "decode_tok_per_s": dec, "tokens": last})
    json.dump({"version": getattr(og, "__version__", "?"), "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
