"""Greedy generation with onnxruntime-genai (the reference loop) for parity tests.

Reads a JSON request on stdin: {"model": DIR, "prompts": [[ids...], ...], "max_new": N,
"stop_ids": [ids...], "share_buffer": bool}. Writes {"version": ..., "outputs": [[ids...], ...]}:
each output is the generated ids up to and including the first stop id (the end token added as an
eos, as the vendor does), or max_new ids.
"""
import json
import os
import shutil
import sys
import tempfile

import onnxruntime_genai as og


def main():
    req = json.load(sys.stdin)
    model_dir = req["model"]
    tmp = None
    if req.get("share_buffer") is not None:
        # Flip search.past_present_share_buffer in a copy; the package itself stays untouched.
        tmp = tempfile.mkdtemp(prefix="oga-")
        for name in os.listdir(model_dir):
            src = os.path.join(model_dir, name)
            if os.path.isfile(src):
                # Hard links keep external data inside the model directory (ORT refuses
                # data that resolves outside it); copy where links are not possible.
                try:
                    os.link(src, os.path.join(tmp, name))
                except OSError:
                    shutil.copy(src, os.path.join(tmp, name))
        with open(os.path.join(model_dir, "genai_config.json")) as f:
            cfg = json.load(f)
        cfg["search"]["past_present_share_buffer"] = bool(req["share_buffer"])
        os.unlink(os.path.join(tmp, "genai_config.json"))
        with open(os.path.join(tmp, "genai_config.json"), "w") as f:
            json.dump(cfg, f)
        model_dir = tmp
    try:
        config = og.Config(model_dir)
        config.clear_providers()
        model = og.Model(config)
        stops = set(req["stop_ids"])
        outputs = []
        for prompt in req["prompts"]:
            params = og.GeneratorParams(model)
            params.set_search_options(
                do_sample=False, max_length=len(prompt) + req["max_new"], min_length=0
            )
            gen = og.Generator(model, params)
            gen.append_tokens(prompt)
            out = []
            while not gen.is_done() and len(out) < req["max_new"]:
                gen.generate_next_token()
                tok = int(gen.get_next_tokens()[0])
                out.append(tok)
                if tok in stops:
                    break
            outputs.append(out)
            del gen
        json.dump({"version": getattr(og, "__version__", "?"), "outputs": outputs}, sys.stdout)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
