"""The vendor's own whole streaming pipeline, for comparing onebit-tts's streaming numbers with it.

`onebit-tts bench --peers` (without --engine-only) runs it after its own runs, once per voice, on
the same texts, voice, GGUF (--llama-gguf), codec (the package's codec/model.onnx), temperature,
runs and threads, with each case's --max-codes set to the codes ours made. Setup, once
(scripts/setup-llama-peer.sh first, which it runs: .onebit/llama/venv with llama-cpp-python built
from source; then .onebit/neutts-peer/venv for the vendor package, no torch, the llama venv's
packages through a .pth):

    scripts/setup-neutts-peer.sh

    .onebit/neutts-peer/venv/bin/python benches/peers/neutts_stream.py \
        [--gguf models/real-shape-q4-gguf/model-q4_0.gguf] [--codec models/real-shape/codec/model.onnx] \
        [--voice voices/test.json] [--language en-us] [--threads 2] \
        [--max-codes 120 | --max-codes short=120,medium=118,long=120] [--warmup 1] [--runs 3] \
        [--temperature 0] [--top-k 50] [--cases short,medium,long] [--dry-run]

--dry-run checks the arguments, the files and the cases, prints the plan as one JSON line (what
the bench's test compares with the command line it builds) and loads nothing.

stdout: one JSON line per case (short / medium / long, the texts of src/bench/mod.rs TEXTS):
prompt_tokens, max_codes, codes, last_codes (the speech codes of the last measured run, in order,
as its text names them), chunks, and per measured run first_audio_ms, wall_s, audio_s, rtf, stall_ms
(with their median / min / max), first_code_ms (call to the backbone's first streamed token:
phonemes, tokenizing, prefill, one step) and codec_ms (the vendor's decode_code calls, timed
around them, with their count and frames), the load average before and after, and the settings.
Everything else (the vendor's own prints) goes to stderr.

What runs is the PyPI package `neutts` 1.4.1 as installed: `NeuTTS.__init__` with a local GGUF
(its `_load_backbone` -> `llama_cpp.Llama(model_path=...)`, its own llama.cpp settings: n_ctx 2048,
n_batch = n_ubatch = 512, use_mlock, CPU), a local ONNX decoder (`_load_codec` ->
`neucodec.NeuCodecOnnxDecoder(path)`), its espeak-ng phonemizer (the library and data bundled in
the wheel, language en-us), then `NeuTTS.infer_stream` -> `_infer_stream_ggml`, timed from the call
to each yielded chunk. Nothing is downloaded: both repos are local paths, which its loaders open
directly. The streaming code itself (prompt, 25-code chunks with 5 of look-ahead, 50 of look-back,
1 of overlap, its overlap-add) is not touched. Where this run differs from a stock install:

- Module stubs, no torch: neutts.py imports torch, librosa, transformers and neucodec at module
  level, but its GGUF + ONNX streaming path uses none of them (torch only for the `torch.Tensor`
  annotation; librosa for encode_reference; transformers for the non-GGUF backbone). Where one is
  not installed, a stub module stands in; `neucodec.NeuCodecOnnxDecoder` is then a copy of
  neucodec 0.0.6's class (the same ONNX Runtime session options, ORT_ENABLE_ALL and the default
  thread pool, and the same session.run / astype(float32)), without its hub mixin.
- No watermark: the vendor applies resemble-perth's watermark to every chunk when that package
  imports; it needs torch, so here `_load_watermarker` warns and returns None (as it does in any
  install without it). The vendor's own default would therefore cost more than measured here.
- Threads: the vendor sets n_threads = os.cpu_count() // 2 (1 on a 2-vCPU machine) and
  n_threads_batch = os.cpu_count(); --threads N (default 2) replaces the former through
  neutts.neutts._n_perf_cores; --threads 0 keeps the vendor's.
- Exactly --max-codes codes: the backbone object the vendor calls is wrapped so each generation
  call gets max_tokens = the case's --max-codes (the vendor passes 2048) and a logits processor that leaves
  only the 65536 <|speech_N|> ids (so the end token and text tokens cannot be chosen; random
  weights need not emit the end token), as onebit-tts's bench does. The processor runs in
  llama-cpp-python's Python custom sampler (a numpy slice per token, included in the times).
- Speech tokens as text: the vendor finds codes by reading <|speech_N|> in the generated text.
  If the GGUF types them CONTROL (onebit's converter follows tokenizer.json's "special": true),
  llama.cpp renders them as "" and the vendor would decode no codes; then the Llama object's
  detokenize is given special=True (the text a USER_DEFINED type would give). Reported as
  settings.speech_tokens_rendered.
- Observation only: the codec object is wrapped to time its decode_code calls, and the backbone
  wrapper notes when the first token streams out (perf_counter reads; no change to the path).
- The prompt's KV between runs (--prompt-cache): the vendor resets the llama context before every
  call ("a full re-prefill keeps repeated calls bit-identical": llama-cpp-python would otherwise
  reuse the longest prefix the prompt shares with the previous call), so each run prefills its
  whole prompt ("none", the default: its own behaviour). "voice" gives each run the voice's part
  of the prompt, as onebit-tts's voice-prefix cache does: the context is reset and the prompt's
  tokens before the text (the longest prefix it shares with the same voice's prompts for two
  other texts) are evaluated unmeasured before the run, and the vendor's reset inside the run is
  skipped, so llama-cpp-python's prefix match starts the run after them.
- Sampling: --temperature 0 (default) is greedy through the vendor's own `temperature` argument
  (llama-cpp-python's greedy sampler); --temperature 1 --top-k 50 is the vendor's default
  (seeded with --seed through the vendor's constructor).

Stall: a listener who starts playing at the first chunk and, whenever the audio runs out, waits for
the next: the sum of those waits (0 = never interrupted), as onebit-tts's bench counts it.
"""
import argparse
import contextlib
import importlib.util
import json
import os
import re
import statistics
import sys
import time
import types

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPEECH = re.compile(r"<\|speech_(\d+)\|>")


def _install_stubs():
    """Stand-ins for modules neutts imports at module level but its GGUF+ONNX path never uses."""
    stubbed = []
    if importlib.util.find_spec("torch") is None:
        torch = types.ModuleType("torch")

        class Tensor:  # only in annotations (np.ndarray | torch.Tensor)
            pass

        def _absent(*_a, **_k):
            raise RuntimeError("torch is stubbed: this path should not need it")

        torch.Tensor = Tensor
        torch.device = _absent
        torch.empty = _absent
        torch.manual_seed = _absent
        torch.tensor = _absent
        torch.from_numpy = _absent
        torch.no_grad = _absent
        torch.bfloat16 = None
        sys.modules["torch"] = torch
        stubbed.append("torch")
    if importlib.util.find_spec("librosa") is None:
        sys.modules["librosa"] = types.ModuleType("librosa")
        stubbed.append("librosa")
    if importlib.util.find_spec("transformers") is None:
        tr = types.ModuleType("transformers")

        class _Absent:
            @classmethod
            def from_pretrained(cls, *_a, **_k):
                raise RuntimeError("transformers is stubbed: only a GGUF backbone is supported here")

        tr.AutoTokenizer = _Absent
        tr.AutoModelForCausalLM = _Absent
        sys.modules["transformers"] = tr
        stubbed.append("transformers")
    try:
        import neucodec  # noqa: F401  (the real one, if it imports)
    except Exception:
        nc = types.ModuleType("neucodec")

        class _AbsentCodec:
            @classmethod
            def from_pretrained(cls, *_a, **_k):
                raise RuntimeError("neucodec is stubbed: only a local .onnx decoder is supported here")

        class NeuCodecOnnxDecoder:
            """neucodec 0.0.6's NeuCodecOnnxDecoder (__init__, decode_code), minus the hub mixin."""

            def __init__(self, onnx_path):
                import onnxruntime

                so = onnxruntime.SessionOptions()
                so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
                self.session = onnxruntime.InferenceSession(onnx_path, sess_options=so)
                self.sample_rate = 24_000

            @classmethod
            def from_pretrained(cls, *_a, **_k):
                raise RuntimeError("neucodec is stubbed: no downloads; pass a local .onnx path")

            def decode_code(self, codes):
                if not isinstance(codes, np.ndarray):
                    raise ValueError("`Codes` should be an np.array.")
                if not len(codes.shape) == 3 or codes.shape[1] != 1:
                    raise ValueError("`Codes` should be of shape [B, 1, F].")
                return self.session.run(None, {"codes": codes})[0].astype(np.float32)

        nc.NeuCodec = _AbsentCodec
        nc.DistillNeuCodec = _AbsentCodec
        nc.NeuCodecOnnxDecoder = NeuCodecOnnxDecoder
        sys.modules["neucodec"] = nc
        stubbed.append("neucodec")
    return stubbed


class CappedBackbone:
    """The vendor's llama_cpp.Llama with each generation call capped at `cap` tokens, all of them
    speech ids; every other attribute (reset, tokenize, metadata, ...) is the Llama's own."""

    def __init__(self, llm, cap, first, count):
        from llama_cpp import LogitsProcessorList

        self._llm = llm
        self.cap = cap
        lo, hi = first, first + count

        def speech_only(_input_ids, scores):
            scores[:lo] = -np.inf
            scores[hi:] = -np.inf
            return scores

        self._procs = LogitsProcessorList([speech_only])
        self.code_list = []
        self.first_item_at = None
        self.keep_context = False

    def reset(self):
        # --prompt-cache voice: the context holds the voice's part, evaluated before the run.
        if not self.keep_context:
            self._llm.reset()

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def __call__(self, prompt, **kw):
        kw["max_tokens"] = self.cap
        kw["logits_processor"] = self._procs
        self.code_list = []
        self.first_item_at = None
        out = self._llm(prompt, **kw)
        if not kw.get("stream"):
            return out
        return self._count(out)

    def _count(self, items):
        for item in items:
            if self.first_item_at is None:
                self.first_item_at = time.perf_counter()
            self.code_list.extend(int(n) for n in SPEECH.findall(item["choices"][0]["text"]))
            yield item


class TimedCodec:
    """The vendor's codec object, its decode_code calls timed (observation only)."""

    def __init__(self, codec):
        self._codec = codec
        self.reset()

    def reset(self):
        self.seconds, self.calls, self.frames = 0.0, 0, 0

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def decode_code(self, codes):
        t = time.perf_counter()
        try:
            return self._codec.decode_code(codes)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1
            self.frames += int(codes.shape[-1])


def bench_texts(path):
    src = open(path, encoding="utf-8").read()
    block = src[src.index("pub const TEXTS"):]
    block = block[: block.index("];")]
    return re.findall(r'\(\s*"([^"]+)",\s*"((?:[^"\\]|\\.)*)",?\s*\)', block)


def max_codes_of(spec, cases):
    """--max-codes: N for every case, CASE=N for one (a bare N then covers the others)."""
    default, per = None, {}
    for item in filter(None, spec.split(",")):
        case, _, n = item.rpartition("=")
        try:
            n = int(n)
        except ValueError:
            raise SystemExit("--max-codes %r: %r is not a count" % (spec, item))
        if n < 1:
            raise SystemExit("--max-codes %r: %r asks for no codes" % (spec, item))
        if not case:
            default = n
        elif case in cases:
            per[case] = n
        else:
            raise SystemExit("--max-codes %r: %r is not one of the cases run (%s)" % (spec, case, ", ".join(cases)))
    caps = {c: per.get(c, default) for c in cases}
    missing = [c for c, n in caps.items() if n is None]
    if missing:
        raise SystemExit("--max-codes %r gives no count for %s" % (spec, ", ".join(missing)))
    return caps


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models/real-shape-q4-gguf/model-q4_0.gguf"))
    ap.add_argument("--codec", default=os.path.join(ROOT, "models/real-shape/codec/model.onnx"))
    ap.add_argument("--voice", default=os.path.join(ROOT, "voices/test.json"))
    ap.add_argument("--texts-from", default=os.path.join(ROOT, "src/bench/mod.rs"))
    ap.add_argument("--cases", default="short,medium,long")
    ap.add_argument("--language", default="en-us")
    ap.add_argument("--threads", type=int, default=2,
                    help="backbone decode threads (0: the vendor's os.cpu_count() // 2)")
    ap.add_argument("--max-codes", default="120",
                    help="codes per case: N for all, or CASE=N,... (a bare N for the cases not named)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs per case")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; the vendor's default is 1.0")
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-cache", choices=("none", "voice"), default="none",
                    help="what each run finds in the context (see the docstring)")
    ap.add_argument("--dry-run", action="store_true", help="check the arguments, print the plan, load nothing")
    args = ap.parse_args()

    for p in (args.gguf, args.codec, args.voice):
        if not os.path.isfile(p):
            raise SystemExit("no such file: %s" % p)
    texts = dict(bench_texts(args.texts_from))
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in texts:
            raise SystemExit("no case %r in %s (has %s)" % (c, args.texts_from, ", ".join(texts)))
    caps = max_codes_of(args.max_codes, cases)
    voice = json.load(open(args.voice, encoding="utf-8"))
    ref_codes, ref_text = [int(c) for c in voice["codes"]], voice["transcript"]
    if args.dry_run:
        plan = {"dry_run": True, "gguf": args.gguf, "codec": args.codec, "voice": args.voice,
                "reference_codes": len(ref_codes), "language": args.language, "threads": args.threads,
                "warmup": args.warmup, "runs": args.runs, "temperature": args.temperature,
                "top_k": args.top_k, "seed": args.seed, "prompt_cache": args.prompt_cache,
                "cases": [{"case": c, "text": texts[c], "max_codes": caps[c]} for c in cases]}
        print(json.dumps(plan))
        return

    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # the vendor prints progress to stdout
        stubbed = _install_stubs()
        import llama_cpp
        import neutts
        import neutts.neutts as nt
        import onnxruntime

        if args.threads > 0:
            nt._n_perf_cores = lambda: args.threads
        t = time.perf_counter()
        tts = nt.NeuTTS(backbone_repo=args.gguf, backbone_device="cpu", codec_repo=args.codec,
                        codec_device="cpu", language=args.language, seed=args.seed)
        load_s = time.perf_counter() - t
        llm = tts.backbone
        if not tts._is_quantized_model or not tts._is_onnx_codec:
            raise SystemExit("expected the GGUF backbone and the ONNX codec")
        first = llm.tokenize(b"<|speech_0|>", add_bos=False, special=True)
        last = llm.tokenize(b"<|speech_65535|>", add_bos=False, special=True)
        if len(first) != 1 or len(last) != 1 or last[0] - first[0] != 65535:
            raise SystemExit("the GGUF has no contiguous <|speech_0..65535|> block")
        rendered = "as text"
        if llm.detokenize(first) != b"<|speech_0|>":
            rendered = "special=True (the GGUF types them CONTROL)"
            plain = type(llm).detokenize
            llm.detokenize = lambda tokens, prev_tokens=None, special=False: plain(
                llm, tokens, prev_tokens=prev_tokens, special=True)
            if llm.detokenize(first) != b"<|speech_0|>":
                raise SystemExit("cannot render <|speech_0|> as text")
        tts.backbone = CappedBackbone(llm, None, first[0], 65536)  # its cap: per case, below
        tts.codec = TimedCodec(tts.codec)

    settings = {
        "neutts": getattr(neutts, "__version__", None) or _dist_version("neutts"),
        "llama_cpp_python": llama_cpp.__version__, "onnxruntime": onnxruntime.__version__,
        "gguf": os.path.relpath(args.gguf, ROOT), "codec": os.path.relpath(args.codec, ROOT),
        "voice": os.path.relpath(args.voice, ROOT), "input_format": tts.input_format,
        "n_threads": llm.context_params.n_threads, "n_threads_batch": llm.context_params.n_threads_batch,
        "n_ctx": llm.n_ctx(), "n_batch": llm.n_batch,
        "max_codes": caps, "speech_only": True, "speech_tokens_rendered": rendered,
        "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed,
        "chunk": [tts.streaming_frames_per_chunk, tts.streaming_lookforward,
                  tts.streaming_lookback, tts.streaming_overlap_frames],
        "watermark": tts.watermarker is not None, "stubbed": stubbed,
        "warmup": args.warmup, "runs": args.runs, "load_s": round(load_s, 3),
        "prompt_cache": args.prompt_cache,
        "cpus": os.cpu_count(),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
    }
    sr = tts.sample_rate

    for case in cases:
        text = texts[case]
        tts.backbone.cap = caps[case]
        with contextlib.redirect_stdout(sys.stderr):
            prompt = tts._ggml_prompt(ref_codes, ref_text, text, None)
        prompt_tokens = len(llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))
        # As llama-cpp-python's create_completion tokenizes a prompt.
        tokens = llm.tokenize(prompt.encode("utf-8"), special=True)
        voice_part = tokens
        for other in ("A.", "Zz."):
            with contextlib.redirect_stdout(sys.stderr):
                o = llm.tokenize(tts._ggml_prompt(ref_codes, ref_text, other, None).encode("utf-8"),
                                 special=True)
            n = 0
            while n < min(len(voice_part), len(o)) and voice_part[n] == o[n]:
                n += 1
            voice_part = voice_part[:n]
        load_before = os.getloadavg()
        runs = []
        for r in range(args.warmup + args.runs):
            arrivals = []
            tts.codec.reset()
            tts.backbone.keep_context = args.prompt_cache == "voice" and bool(voice_part)
            if tts.backbone.keep_context:
                llm.reset()
                llm.eval(voice_part)
            with contextlib.redirect_stdout(sys.stderr):
                t0 = time.perf_counter()
                for chunk in tts.infer_stream(text, ref_codes, ref_text, temperature=args.temperature,
                                              top_k=args.top_k):
                    arrivals.append((time.perf_counter() - t0, len(chunk)))
                wall = time.perf_counter() - t0
            if r < args.warmup:
                continue
            samples = sum(n for _, n in arrivals)
            audio_s = samples / sr
            # the listener: playing from the first chunk on, waiting whenever the audio runs out
            stall, had = 0.0, 0.0
            first_t = arrivals[0][0] if arrivals else float("nan")
            for t, n in arrivals:
                stall += max(0.0, (t - first_t) - stall - had)
                had += n / sr
            runs.append({"first_audio_ms": first_t * 1000, "wall_s": wall, "audio_s": audio_s,
                         "rtf": wall / audio_s if audio_s else float("inf"), "stall_ms": stall * 1000,
                         "first_code_ms": (tts.backbone.first_item_at - t0) * 1000,
                         "codec_ms": tts.codec.seconds * 1000, "codec_calls": tts.codec.calls,
                         "codec_frames": tts.codec.frames,
                         "codes": len(tts.backbone.code_list), "code_list": list(tts.backbone.code_list),
                         "chunks": len(arrivals),
                         "chunk_ms": [round(t * 1000, 1) for t, _ in arrivals],
                         "chunk_samples": [n for _, n in arrivals]})
        line = {"case": case, "text": text, "prompt_tokens": prompt_tokens,
                "voice_tokens": len(voice_part) if args.prompt_cache == "voice" else 0,
                "max_codes": caps[case],
                "codes": runs[-1]["codes"], "last_codes": runs[-1]["code_list"],
                "chunks": runs[-1]["chunks"],
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()]}
        for k in ("first_audio_ms", "wall_s", "audio_s", "rtf", "stall_ms", "first_code_ms", "codec_ms"):
            line[k] = stats([r[k] for r in runs])
        line["runs"] = runs
        line["settings"] = settings
        out.write(json.dumps(line) + "\n")
        out.flush()


def _dist_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
