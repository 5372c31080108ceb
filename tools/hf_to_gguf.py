#!/usr/bin/env python3
"""Runs llama.cpp's own `convert_hf_to_gguf.py` on a Hugging Face checkpoint.

    python tools/hf_to_gguf.py --llama-cpp DIR [--pre NAME] -- CHECKPOINT --outtype f32 --outfile OUT.gguf

DIR is a llama.cpp source tree holding convert_hf_to_gguf.py, its `conversion` package and gguf-py
(scripts/setup.sh --build-tools unpacks the one vendored by the llama-cpp-python source package
into .onebit/llama-convert). Everything after `--` goes to the converter unchanged.

--pre NAME: the converter names a BPE tokenizer's pre-tokenizer by the sha256 of the ids it gives
for a fixed text and refuses ids it has not seen. The NeuTTS-air tokenizer is Qwen2's plus the
NeuTTS tokens, which the converter knows as "qwen2" (checked on the workspace's reconstruction of
it; the real file cannot be fetched here); tools/hf_checkpoint.py's checkpoint has the same pre-tokenizer (Qwen2's
split regex, byte level) over a small synthetic vocabulary, so its ids, and hash, are its own.
With --pre the name is used when, and only when, the converter does not recognise the hash;
every tensor, hyperparameter and vocabulary entry is still written by the converter's code.

Needs torch, transformers, numpy and sentencepiece (scripts/setup.sh --build-tools).
"""

import argparse
import logging
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree")
    ap.add_argument("--pre", help="pre-tokenizer name for a hash the converter does not know")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the converter's arguments")
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    tree = os.path.abspath(args.llama_cpp)
    script = os.path.join(tree, "convert_hf_to_gguf.py")
    if not os.path.isfile(script):
        sys.exit(f"hf_to_gguf: {script} not found (scripts/setup.sh --build-tools unpacks it)")
    # The tree's gguf-py first: the converter and its gguf library are released together.
    sys.path[:0] = [tree, os.path.join(tree, "gguf-py")]

    import conversion.base as base  # noqa: E402  (from the llama.cpp tree)

    if args.pre:
        known = base.TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):
            try:
                return known(self, tokenizer)
            except NotImplementedError:
                logging.getLogger("hf_to_gguf").warning(
                    "pre-tokenizer hash not in this converter's list: using %r (--pre)", args.pre
                )
                return args.pre

        base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    import convert_hf_to_gguf  # noqa: E402

    sys.argv = [script, *rest]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
