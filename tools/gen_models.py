#!/usr/bin/env python3
"""Generate a NeuTTS-air-shaped model package for tests and benchmarks.

Real NeuTTS weights cannot be downloaded here, so the project tests on a model it
makes itself. The model has the real I/O contract: the graph, genai_config.json,
tokenizer and codec are what onnxruntime-genai's model builder writes for a
Qwen2 int4 CPU export (builder 0.18: packed q/k/v MatMulNBits + bias Add,
GroupQueryAttention with rotary caches, SkipSimplifiedLayerNormalization, SiLU MLP,
MatMulNBits lm_head), with weights chosen so that greedy decoding is predictable.

    python tools/gen_models.py --out DIR [--variant chain|random|textbias]
                               [--real-shape] [--codec real|tiny] [--voice-out FILE]
                               [--encoder-out FILE] [--kv-len N] [--kv-dtype float32|float16]
                               [--last-logits] [--mask-dtype int64|int32]
                               [--input-format phonemes|bpe] [--emotions NAME,...]

--input-format bpe writes config.json's neuphonic.input_format "BPE" (NeuTTS-2E's text input);
--emotions names the emotions the model declares (config.json's neuphonic.supported_emotions)
and gives each its token, <|HAPPY|> for happy, in place of the first reserved tokens: every id,
and so every weight, stays what it is without them (the vendor's NeuTTS-2E puts the emotion's
token between the reference transcript and the text).

Static packages (--kv-len N), shaped like AMD's NPU packages: past_key_values.* and present.*
are declared [1, kv_heads, N, head_size] with numbers, batch 1, and genai_config.json asks for
past_present_share_buffer. GroupQueryAttention runs on that one buffer as it does on any shared
buffer: it writes the new K/V at position seqlens_k and attends to positions 0..seqlens_k only,
with attention_mask [1, total] of ones as onnxruntime-genai feeds it.
--kv-dtype float16 runs attention (and holds the KV cache) in float16 and returns float16
logits; --last-logits projects the last position only (logits [1, 1, V]); --mask-dtype int32
declares attention_mask int32.

Variants (see tools/README.md):
  chain     after <|speech_c|> the greedy next token is <|speech_{c+1}|> (mod 65536);
            after <|SPEECH_GENERATION_START|> it is <|speech_0|>; after <|speech_{M-1}|>
            it is <|SPEECH_GENERATION_END|>, with <|speech_M|> the runner-up.
            M - 1 is written to expect.json as end_after_code.
  textbias  chain, but a few text ids (and a padding id) beat every speech id in the raw
            full-vocabulary argmax; restricted to speech ids + END it is the chain.
  random    strong random attention/MLP, no chain; non-speech ids never win, END never wins.

Codec (codec/model.onnx, codes int32 [B,1,F] -> audio float32 [B,1,F*480]):
  tiny      a few-KB stand-in (Fourier codebook, one conv); the default without --real-shape.
  real      the NeuCodec decoder's assumed shape (FSQ, VocosBackbone, ISTFT head; ~190M random
            float32 parameters, 765 MB, ~30 s); the default with --real-shape.

Only the Python standard library, numpy and onnx are used. Output is byte-identical
on every run (fixed seeds, legacy numpy RandomState streams, no BLAS reductions).
"""

import argparse
import json
import math
import os
import re
import unicodedata
import zlib

import numpy as np
from onnx import TensorProto, helper

# ---------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------

N_SPEECH = 65536
CHAIN_M = 200  # chain variant: END is the greedy choice right after <|speech_{CHAIN_M-1}|>
VOICE_NEW_CODES = 120  # the test voice's last code is CHAIN_M - 1 - VOICE_NEW_CODES
VOICE_LEN = 100

TINY = dict(
    layers=2, hidden=64, heads=4, kv_heads=2, head_size=16, intermediate=128,
    context=4096, max_length=4096, merges=400, vocab_size=None,
    # layout of the residual stream: chain Fourier frequencies, content frequencies
    n_chain=16, n_content=15, external_data=False,
)
REAL = dict(
    layers=24, hidden=896, heads=14, kv_heads=2, head_size=64, intermediate=4864,
    context=32768, max_length=32768, base_vocab=151643, vocab_size=217652,
    n_chain=32, n_content=64, external_data=True,
)
ROPE_THETA = 1000000.0
RMS_EPS = 1e-6
BLOCK = 32  # MatMulNBits block_size (builder default)
ACCURACY_LEVEL = 4  # builder default for the CPU EP

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The same pattern for Python's re (\p{L} ~ [^\W\d_], \p{N} ~ \d); used only to learn merges.
PY_PATTERN = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\w]?[^\W\d_]+|\d| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

NEUTTS_NAMED = [
    "<|TEXT_REPLACE|>",
    "<|SPEECH_REPLACE|>",
    "<|TEXT_PROMPT_START|>",
    "<|TEXT_PROMPT_END|>",
    "<|SPEECH_GENERATION_START|>",
    "<|TEXT_UNDERSTANDING_START|>",
    "<|TEXT_UNDERSTANDING_END|>",
    "<|SPEECH_UNDERSTANDING_START|>",
    "<|SPEECH_UNDERSTANDING_END|>",
]
N_RESERVED = 15
# Emotion names whose tokens take the first reserved places (--emotions).
EMOTIONS = []

# Chain / content frequencies (integers; angle = 2*pi*f*k/65536, computed exactly mod 65536).
# Chosen once by a seeded search that minimised the largest side lobe of sum_j cos(2*pi*f_j*d/65536)
# over d = 1..65535 (tiny: 9.80 of 16; real: 14.65 of 32). Odd, so d = 32768 gives -n.
_CHAIN_SEEDS = {16: 35, 32: 8}

CORPUS = """\
The quick brown fox jumps over the lazy dog.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
Hello there! This is a small test of a text to speech system that runs on the computer.
Convert the text to speech, then play the audio through the speakers at twenty four kilohertz.
Peter Piper picked a peck of pickled peppers; how many pickled peppers did Peter Piper pick?
It was the best of times, it was the worst of times, it was the age of wisdom.
In the beginning the weather was cold and the wind was strong, but the sun came out later.
We will meet at the station at half past seven, if the train is on time.
Numbers like 1, 2, 3, 42 and 2024 should be read aloud as words by the speaker.
Good morning, good afternoon, and good night. Thank you very much for listening.
A voice is made of reference codes and the exact transcript that goes with them.
The model generates speech tokens one at a time until it decides that the speech has ended.
Streaming decoders emit audio in chunks with a little overlap between neighbouring chunks.
Would you like a cup of tea or coffee? I think I would rather have some water, thanks.
The children played in the garden while their parents talked about the weather.
Please speak clearly and slowly so that everyone in the room can understand you.
user: Convert the text to speech:
assistant:
ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ.
ʃiː sˈɛlz sˈiː ʃˈɛlz baɪ ðə sˈiː ʃˈɔːɹ, ænd ðə ʃˈɛlz ʃiː sˈɛlz ɑːɹ ʃˈʊɹli sˈiː ʃˈɛlz.
həlˈoʊ ðˈɛɹ! ðɪs ɪz ɐ smˈɔːl tˈɛst ʌv ɐ tˈɛkst tə spˈiːtʃ sˈɪstəm ðæt ɹˈʌnz ˌɑːn ðə kəmpjˈuːɾɚ.
kənvˈɜːt ðə tˈɛkst tə spˈiːtʃ, ðˈɛn plˈeɪ ðɪ ˈɔːdɪˌoʊ θɹuː ðə spˈiːkɚz æt twˈɛnti fˈɔːɹ kˈɪləhˌɜːts.
pˈiːɾɚ pˈaɪpɚ pˈɪkt ɐ pˈɛk ʌv pˈɪkəld pˈɛpɚz; hˌaʊ mˈɛni pˈɪkəld pˈɛpɚz dɪd pˈiːɾɚ pˈaɪpɚ pˈɪk?
ɪt wʌz ðə bˈɛst ʌv tˈaɪmz, ɪt wʌz ðə wˈɜːst ʌv tˈaɪmz, ɪt wʌz ðɪ ˈeɪdʒ ʌv wˈɪzdəm.
ɪnðə bɪɡˈɪnɪŋ ðə wˈɛðɚ wʌz kˈoʊld ænd ðə wˈɪnd wʌz stɹˈɔŋ, bˌʌt ðə sˈʌn kˈeɪm ˈaʊt lˈeɪɾɚ.
wiː wɪl mˈiːt æt ðə stˈeɪʃən æt hˈæf pˈæst sˈɛvən, ɪf ðə tɹˈeɪn ɪz ˌɑːn tˈaɪm.
ɡʊd mˈɔːɹnɪŋ, ɡʊd ˌæftɚnˈuːn, ænd ɡʊd nˈaɪt. θˈæŋk juː vˈɛɹi mˈʌtʃ fɔːɹ lˈɪsənɪŋ.
ɐ vˈɔɪs ɪz mˈeɪd ʌv ɹˈɛfɹəns kˈoʊdz ænd ðɪ ɛɡzˈækt tɹˈænskɹɪpt ðæt ɡˈoʊz wɪð ðˌɛm.
ðə mˈɑːdəl dʒˈɛnɚɹˌeɪts spˈiːtʃ tˈoʊkənz wˈʌn æɾɐ tˈaɪm ʌntˈɪl ɪt dɪsˈaɪdᵻz ðætðə spˈiːtʃ hɐz ˈɛndᵻd.
stɹˈiːmɪŋ dᵻkˈoʊdɚz ɪmˈɪt ˈɔːdɪˌoʊ ɪn tʃˈʌŋks wɪð ɐ lˈɪɾəl ˈoʊvɚlˌæp bᵻtwˌiːn nˈeɪbɚɹɪŋ tʃˈʌŋks.
wʊd juː lˈaɪk ɐ kˈʌp ʌv tˈiː ɔːɹ kˈɔfi? aɪ θˈɪŋk aɪ wʊd ɹˈæðɚ hæv sˌʌm wˈɔːɾɚ, θˈæŋks.
ðə tʃˈɪldɹən plˈeɪd ɪnðə ɡˈɑːɹdən wˈaɪl ðɛɹ pˈɛɹənts tˈɔːkt əbˌaʊt ðə wˈɛðɚ.
plˈiːz spˈiːk klˈɪɹli ænd slˈoʊli sˌoʊ ðæt ˈɛvɹɪwˌʌn ɪnðə ɹˈuːm kæn ˌʌndɚstˈænd juː.
ɐ nˈuːz ɹɪpˈɔːɹt, ɐ bˈʊk, ɐ tʃˈæptɚ, ɐ sˈɛntəns, ɐ wˈɜːd, ɐ fˈoʊniːm, ɐ sˈaʊnd.
ʒ ʒ ɬ ɾ ʔ ɲ ɣ χ ç ɕ ʑ ø œ ɯ ɤ ɒ ɨ ʉ ɵ ɘ ɞ ɶ y ʏ ɪ̃ ɛ̃ ɑ̃ ɔ̃ ŋ θ ð ʃ ʒ ɹ ə ɪ ʊ ʌ æ ɑ ɔ ɛ ɜ ˈ ˌ ː
"""


# ---------------------------------------------------------------------------------------
# Deterministic random numbers
# ---------------------------------------------------------------------------------------

def rs(*names):
    """A legacy RandomState (its streams are frozen across numpy versions) per named tensor."""
    key = "/".join(str(n) for n in names).encode()
    return np.random.RandomState(zlib.crc32(key) & 0x7FFFFFFF)


def chain_freqs(n):
    r = np.random.RandomState(_CHAIN_SEEDS[n])
    return r.choice(np.arange(1, 32768, 2), n, replace=False).astype(np.int64)


def content_freqs(n, exclude):
    r = rs("content_freqs", n)
    pool = np.setdiff1d(np.arange(1, 32768, dtype=np.int64), exclude)
    return r.choice(pool, n, replace=False).astype(np.int64)


def fourier(k, freqs):
    """cos/sin of 2*pi*(k*f mod 65536)/65536, exact phase; returns float32 [len(k), 2*len(freqs)]."""
    ph = (np.asarray(k, dtype=np.int64)[:, None] * freqs[None, :]) % N_SPEECH
    ang = ph.astype(np.float64) * (2.0 * math.pi / N_SPEECH)
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------

def bytes_to_unicode():
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def learn_bpe(n_new_tokens):
    """Tiny deterministic byte-level BPE on the built-in corpus.

    Returns (vocab list in id order, merges list of (left, right)). The first 256 entries
    are the GPT-2 byte symbols in the order GPT-2/Qwen use (printable bytes first)."""
    enc = bytes_to_unicode()
    vocab = [enc[b] for b in sorted(enc, key=lambda b: ord(enc[b]))]
    known = set(vocab)
    words = {}
    for line in CORPUS.splitlines(keepends=True):
        for piece in PY_PATTERN.findall(unicodedata.normalize("NFC", line)):
            sym = tuple(enc[b] for b in piece.encode("utf-8"))
            words[sym] = words.get(sym, 0) + 1
    words = [[list(w), c] for w, c in sorted(words.items())]
    merges = []
    added = 0
    while added < n_new_tokens:
        counts = {}
        for w, c in words:
            for i in range(len(w) - 1):
                p = (w[i], w[i + 1])
                counts[p] = counts.get(p, 0) + c
        if not counts:
            break
        best = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        tok = best[0] + best[1]
        if tok not in known:
            known.add(tok)
            vocab.append(tok)
            added += 1
        for wc in words:
            w = wc[0]
            i = 0
            out = []
            while i < len(w):
                if i + 1 < len(w) and w[i] == best[0] and w[i + 1] == best[1]:
                    out.append(tok)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            wc[0] = out
    return vocab, merges


def synthetic_fill(vocab, merges, target):
    """Extend a byte-level BPE to exactly `target` tokens with valid synthetic merges:
    byte+byte pairs first, then (token, byte) pairs, in id order."""
    known = set(vocab)
    byte_syms = vocab[:256]
    left_idx = 0
    while len(vocab) < target:
        left = vocab[left_idx]
        for right in byte_syms:
            if len(vocab) >= target:
                break
            tok = left + right
            if tok in known:
                continue
            known.add(tok)
            vocab.append(tok)
            merges.append((left, right))
        left_idx += 1
    return vocab, merges


def special_tokens():
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + NEUTTS_NAMED
    if len(EMOTIONS) > N_RESERVED:
        raise SystemExit("at most %d emotions" % N_RESERVED)
    names += ["<|%s|>" % e.upper() for e in EMOTIONS]
    names += ["<|NEUTTS_RESERVED_%d|>" % k for k in range(len(EMOTIONS), N_RESERVED)]
    names.append("<|SPEECH_GENERATION_END|>")
    return names


def build_tokenizer(base_vocab_size, n_learned):
    vocab, merges = learn_bpe(n_learned)
    if base_vocab_size is not None:
        if len(vocab) > base_vocab_size:
            raise SystemExit("learned vocabulary larger than the base size")
        vocab, merges = synthetic_fill(vocab, merges, base_vocab_size)
    base = len(vocab)
    names = special_tokens() + ["<|speech_%d|>" % i for i in range(N_SPEECH)]
    added = [
        {"id": base + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, c in enumerate(names)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
                dict(byte_level),
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(vocab)},
            "merges": ["%s %s" % m for m in merges],
        },
    }
    ids = {
        "base": base,
        "endoftext": base,
        "im_start": base + 1,
        "im_end": base + 2,
        "speech_generation_start": base + 3 + NEUTTS_NAMED.index("<|SPEECH_GENERATION_START|>"),
        "text_prompt_start": base + 3 + NEUTTS_NAMED.index("<|TEXT_PROMPT_START|>"),
        "text_prompt_end": base + 3 + NEUTTS_NAMED.index("<|TEXT_PROMPT_END|>"),
        "speech_end": base + len(special_tokens()) - 1,
        "speech_first": base + len(special_tokens()),
        "num_tokens": base + len(names),
        "merges": len(merges),
    }
    assert ids["speech_first"] - ids["speech_end"] == 1
    return tok, ids


# ---------------------------------------------------------------------------------------
# Int4 block quantisation (MatMulNBits layout, symmetric, no zero points -> zero point 8)
# ---------------------------------------------------------------------------------------

def quantize_rows(w):
    """w: float32 [N, K] (output rows). Returns (packed uint8 [N, K/32, 16], scales float32 [N, K/32]).

    Symmetric round-to-nearest like MLAS: the value of largest magnitude maps to -8."""
    n, k = w.shape
    nb = k // BLOCK
    b = w.reshape(n, nb, BLOCK).astype(np.float32)
    idx = np.abs(b).argmax(axis=2)
    signed_max = np.take_along_axis(b, idx[:, :, None], axis=2)[:, :, 0]
    scale = (signed_max / np.float32(-8.0)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1.0), scale)
    q = np.rint(b / safe[:, :, None])
    q = np.where(scale[:, :, None] == 0, 0, q)
    q = (np.clip(q, -8, 7) + 8).astype(np.uint8)
    packed = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
    return packed, scale


def dequantize_rows(packed, scale):
    lo = (packed & 0x0F).astype(np.float32) - 8
    hi = (packed >> 4).astype(np.float32) - 8
    q = np.empty(packed.shape[:2] + (BLOCK,), dtype=np.float32)
    q[:, :, 0::2] = lo
    q[:, :, 1::2] = hi
    return (q * scale[:, :, None]).reshape(packed.shape[0], -1)


class QMat:
    """A quantised [N, K] weight, built in row chunks to bound memory."""

    def __init__(self, n, k):
        self.n, self.k = n, k
        self.packed = np.zeros((n, k // BLOCK, BLOCK // 2), dtype=np.uint8)
        self.scales = np.zeros((n, k // BLOCK), dtype=np.float32)

    def set_rows(self, start, w):
        p, s = quantize_rows(np.ascontiguousarray(w, dtype=np.float32))
        self.packed[start:start + w.shape[0]] = p
        self.scales[start:start + w.shape[0]] = s


def qmat_from(w_out_in):
    m = QMat(*w_out_in.shape)
    m.set_rows(0, w_out_in)
    return m


# ---------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------

class Layout:
    """Which residual dimensions carry what.

    [0, 2*n_chain)                 chain Fourier features (cos block, sin block)
    const = 2*n_chain              a constant; attention/MLP never write it
    [const+1, hidden)              context dims: content features + what attention/MLP write"""

    def __init__(self, shape):
        self.h = shape["hidden"]
        self.n_chain = shape["n_chain"]
        self.n_content = shape["n_content"]
        self.fourier = np.arange(0, 2 * self.n_chain)
        self.const = 2 * self.n_chain
        self.ctx = np.arange(self.const + 1, self.h)
        assert 2 * self.n_content <= len(self.ctx)
        self.content = self.ctx[: 2 * self.n_content]
        self.f_chain = chain_freqs(self.n_chain)
        self.f_content = content_freqs(self.n_content, self.f_chain)
        self.freqs = np.concatenate([self.f_chain, self.f_content])
        # speech embedding row = feats[:, perm] * amp + bias, feats = [cos(all f) | sin(all f) | 0]
        nf = len(self.freqs)
        perm = np.full(self.h, 2 * nf, dtype=np.int64)  # index of the zero column
        amp = np.zeros(self.h, dtype=np.float32)
        for j in range(self.n_chain):
            perm[j], amp[j] = j, 1.0
            perm[self.n_chain + j], amp[self.n_chain + j] = nf + j, 1.0
        for j in range(self.n_content):
            perm[self.content[j]], amp[self.content[j]] = self.n_chain + j, 0.7
            perm[self.content[self.n_content + j]] = nf + self.n_chain + j
            amp[self.content[self.n_content + j]] = 0.7
        bias = np.zeros(self.h, dtype=np.float32)
        bias[self.const] = 2.0
        self.perm, self.amp, self.bias = perm, amp, bias

    def speech_embedding(self, codes):
        f = fourier(codes, self.freqs)
        f = np.concatenate([f, np.zeros((f.shape[0], 1), np.float32)], axis=1)
        return (f[:, self.perm] * self.amp[None, :] + self.bias[None, :]).astype(np.float32)

    def chain_row(self, codes):
        """lm_head Fourier part for speech ids `codes`: e(code - 1), unit amplitude."""
        return fourier((np.asarray(codes, dtype=np.int64) - 1) % N_SPEECH, self.f_chain)


def build_weights(shape, variant, ids):
    L = Layout(shape)
    H, I = shape["hidden"], shape["intermediate"]
    nh, nkv, hd = shape["heads"], shape["kv_heads"], shape["head_size"]
    V = shape["vocab_size"]
    n_special = len(special_tokens())
    base, first, end = ids["base"], ids["speech_first"], ids["speech_end"]
    sgs = ids["speech_generation_start"]
    strong = variant == "random"
    W = {"layout": L}

    # --- embedding: text/special rows, computed speech rows, padding rows
    r = rs(variant, "embed_prefix", H)
    prefix = (r.standard_normal((base + n_special, H)) * 0.5).astype(np.float32)
    prefix[:, L.const] = L.bias[L.const]
    # <|SPEECH_GENERATION_START|> carries e(-1) so the chain starts at speech_0
    prefix[sgs] = L.speech_embedding(np.array([N_SPEECH - 1]))[0]
    pad_rows = V - ids["num_tokens"]
    r = rs(variant, "embed_pad", H)
    pad = (r.standard_normal((pad_rows, H)) * 0.5).astype(np.float32)
    pad[:, L.const] = L.bias[L.const]
    W["embed_prefix"], W["embed_pad"] = prefix, pad

    # --- decoder layers
    layers = []
    write = L.ctx if not strong else np.setdiff1d(np.arange(H), [L.const])
    # Keep the residual writes of the whole stack about as large as the tiny model's, whatever
    # the width and depth: per layer ~ sqrt(tiny written dims / written dims) * sqrt(2 / layers).
    wscale = math.sqrt((63.0 if strong else 31.0) / len(write)) * math.sqrt(2.0 / shape["layers"])
    for l in range(shape["layers"]):
        r = rs(variant, "layer", l, H, I)
        d = {}
        d["ln1"] = (1.0 + 0.1 * r.standard_normal(H)).astype(np.float32)
        d["ln2"] = (1.0 + 0.1 * r.standard_normal(H)).astype(np.float32)
        sq = 0.177 * (64.0 / H) ** 0.5 * (1.6 if strong else 1.0)
        wq = r.standard_normal((nh * hd, H)) * sq
        wk = r.standard_normal((nkv * hd, H)) * sq
        wv = r.standard_normal((nkv * hd, H)) * (1.0 / H ** 0.5)
        d["qkv"] = qmat_from(np.concatenate([wq, wk, wv], axis=0).astype(np.float32))
        d["qkv_bias"] = (0.1 * r.standard_normal(nh * hd + 2 * nkv * hd)).astype(np.float32)
        wo = np.zeros((H, nh * hd), dtype=np.float32)
        wo[write] = r.standard_normal((len(write), nh * hd)) * ((1.2 if strong else 0.6) * wscale / (nh * hd) ** 0.5)
        d["o"] = qmat_from(wo)
        d["gate"] = qmat_from((r.standard_normal((I, H)) / H ** 0.5).astype(np.float32))
        d["up"] = qmat_from((r.standard_normal((I, H)) / H ** 0.5).astype(np.float32))
        wd = np.zeros((H, I), dtype=np.float32)
        wd[write] = r.standard_normal((len(write), I)) * ((2.0 if strong else 1.0) * wscale / I ** 0.5)
        d["down"] = qmat_from(wd)
        layers.append(d)
    W["layers"] = layers
    r = rs(variant, "final_norm", H)
    fn = (1.0 + 0.1 * r.standard_normal(H)).astype(np.float32)
    if not strong:
        fn[L.fourier] = 1.0
    fn[L.const] = 1.0
    W["final_norm"] = fn

    # --- lm_head [V, H]
    lm = QMat(V, H)
    neg = np.zeros((1, H), np.float32)
    neg[0, L.const] = -8.0  # non-speech rows: strongly negative, never the argmax
    chunk = 8192
    for s in range(0, base + n_special, chunk):
        e = min(base + n_special, s + chunk)
        lm.set_rows(s, np.repeat(neg, e - s, axis=0))
    for s in range(ids["num_tokens"], V, chunk):
        e = min(V, s + chunk)
        lm.set_rows(s, np.repeat(neg, e - s, axis=0))
    # chain: the context dims' share of a speech logit stays well inside the chain's margin
    # (|w_ctx| = 0.08 * sqrt(31) whatever the width); random: strong, all dims but the constant
    ctx_scale = 0.08 * math.sqrt(31.0 / len(L.ctx))
    for s in range(0, N_SPEECH, chunk):
        e = min(N_SPEECH, s + chunk)
        r = rs(variant, "lm_speech", s, H)
        rows = np.zeros((e - s, H), np.float32)
        if strong:
            cols = np.setdiff1d(np.arange(H), [L.const])
            rows[:, cols] = r.standard_normal((e - s, len(cols))) * (0.5 * math.sqrt(63.0 / len(cols)))
        else:
            rows[:, L.fourier] = L.chain_row(np.arange(s, e))
            rows[:, L.ctx] = r.standard_normal((e - s, len(L.ctx))) * ctx_scale
        lm.set_rows(first + s, rows)
    # END row
    if strong:
        # half of speech_0's row: below the max speech logit whenever that is positive
        lm.packed[end] = lm.packed[first]
        lm.scales[end] = lm.scales[first] * np.float32(0.5)
        W["end_after_code"] = None
    else:
        # END = 1.02 x speech_M's row (same int4 codes, scaled block scales): wins exactly where
        # speech_M would, and speech_M is then the runner-up.
        lm.packed[end] = lm.packed[first + CHAIN_M]
        lm.scales[end] = lm.scales[first + CHAIN_M] * np.float32(1.02)
        W["end_after_code"] = CHAIN_M - 1
    if variant == "textbias":
        # a few text ids (and one padding id) beat every speech id
        W["text_bias_ids"] = [ids["base"] // 2 + 7 * i for i in range(4)]
        r = rs(variant, "textbias", H)
        for i, tid in enumerate(W["text_bias_ids"]):
            row = np.zeros((1, H), np.float32)
            row[0, L.fourier] = 0.5 * r.standard_normal(len(L.fourier))
            row[0, L.const] = 60.0 * (1.0 - 0.02 * i)
            lm.set_rows(tid, row)
        W["text_bias_pad_id"] = V - 1
        row = np.zeros((1, H), np.float32)
        row[0, L.const] = 50.0
        lm.set_rows(V - 1, row)
    W["lm_head"] = lm

    # --- rotary caches (builder: float32, [cache_length, head_size/2])
    inv = (1.0 / (np.float32(ROPE_THETA) ** (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / np.float32(hd)))).astype(np.float32)
    t = np.arange(shape["context"], dtype=np.float32)
    freqs = np.outer(t, inv).astype(np.float32)
    W["cos_cache"] = np.cos(freqs.astype(np.float64)).astype(np.float32)
    W["sin_cache"] = np.sin(freqs.astype(np.float64)).astype(np.float32)
    return W


# ---------------------------------------------------------------------------------------
# ONNX graph (names and structure as onnxruntime-genai's builder emits them for qwen2 int4 CPU)
# ---------------------------------------------------------------------------------------

class Graph:
    def __init__(self, external_path=None):
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.ext_path = external_path
        self.ext_file = open(external_path, "wb") if external_path else None
        self.ext_off = 0

    def init(self, name, arr, dtype=None):
        arr = np.asarray(arr)
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray would turn scalars into [1])
        if dtype is None:
            dtype = helper.np_dtype_to_tensor_dtype(arr.dtype)
        t = TensorProto()
        t.name = name
        t.data_type = dtype
        t.dims.extend(arr.shape)
        raw = arr.tobytes()
        if self.ext_file is not None:
            align = 4096 if len(raw) >= (1 << 20) else 64
            pad = (-self.ext_off) % align
            if pad:
                self.ext_file.write(b"\0" * pad)
                self.ext_off += pad
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", os.path.basename(self.ext_path)), ("offset", str(self.ext_off)), ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            self.ext_file.write(raw)
            self.ext_off += len(raw)
        else:
            t.raw_data = raw
        self.inits.append(t)
        return name

    def node(self, op, name, inputs, outputs, domain="", **attrs):
        n = helper.make_node(op, inputs, outputs, name=name, domain=domain or None)
        for k, v in attrs.items():
            n.attribute.append(helper.make_attribute(k, v))
        self.nodes.append(n)
        return outputs[0] if outputs else None

    def const_i64(self, name, value, scalar=False):
        arr = np.array(value if scalar else [value], dtype=np.int64)
        t = helper.make_tensor(f"/model/constants/INT64/{name}", TensorProto.INT64, arr.shape, arr.tobytes(), raw=True)
        self.node("Constant", f"/model/constant_nodes/INT64/{name}", [], [t.name], value=t)
        return t.name

    def close(self):
        if self.ext_file is not None:
            self.ext_file.close()


def codes_range(g, out, prefix):
    """[65536, 1] int64 = 0..65535, made by Range + Unsqueeze (constant-folded by ORT)."""
    g.init(out + ".start", np.array(0, dtype=np.int64))
    g.init(out + ".limit", np.array(N_SPEECH, dtype=np.int64))
    g.init(out + ".delta", np.array(1, dtype=np.int64))
    g.init(out + ".axes", np.array([1], dtype=np.int64))
    g.node("Range", f"{prefix}/Range", [out + ".start", out + ".limit", out + ".delta"], [f"{prefix}/Range/output_0"])
    return g.node("Unsqueeze", f"{prefix}/Unsqueeze", [f"{prefix}/Range/output_0", out + ".axes"], [out])


def matmul_nbits(g, name, inp, wname, q, out):
    g.init(f"{wname}.MatMul.weight_Q4", q.packed, TensorProto.UINT8)
    g.init(f"{wname}.MatMul.weight_scales", q.scales)
    return g.node(
        "MatMulNBits", f"{name}/MatMul_Q4", [inp, f"{wname}.MatMul.weight_Q4", f"{wname}.MatMul.weight_scales"],
        [out], domain="com.microsoft", K=q.k, N=q.n, accuracy_level=ACCURACY_LEVEL, bits=4, block_size=BLOCK)


def build_decoder(shape, W, ids, path, external, kv_len=None, kv_dtype="float32", last_logits=False,
                  mask_dtype="int64"):
    """kv_len: a static past length (declared as a number) or None (symbolic); kv_dtype: the KV
    cache's and attention's element type (float16 also makes the logits float16)."""
    H, nl = shape["hidden"], shape["layers"]
    nh, nkv, hd = shape["heads"], shape["kv_heads"], shape["head_size"]
    V = shape["vocab_size"]
    L = W["layout"]
    g = Graph(path + ".data" if external else None)
    KV = TensorProto.FLOAT16 if kv_dtype == "float16" else TensorProto.FLOAT
    MASK = TensorProto.INT32 if mask_dtype == "int32" else TensorProto.INT64

    c1v = g.const_i64("[1]", 1)
    p = "/model/attn_mask_reformat/attn_mask_subgraph"
    if mask_dtype == "none":
        # No attention_mask (onnxruntime-genai feeds one only where declared): the positions say
        # how long the sequence is. position_ids [1, new] end at total - 1 (batch 1: a graph
        # without a mask cannot tell rows of different lengths apart).
        g.node("ReduceMax", f"{p}/ReduceMax", ["position_ids", c1v], [f"{p}/ReduceMax/output_0"], keepdims=0)
        seqlens_k = g.node("Cast", f"{p}/ReduceMax/Cast", [f"{p}/ReduceMax/output_0"],
                           [f"{p}/ReduceMax/Cast/output_0"], to=TensorProto.INT32)
        c0s = g.const_i64("0", 0, scalar=True)
        g.node("Gather", f"{p}/Gather", [f"{p}/ReduceMax/output_0", c0s], [f"{p}/Gather/output_0"], axis=0)
        g.node("Add", f"{p}/Add", [f"{p}/Gather/output_0", g.const_i64("1", 1, scalar=True)], [f"{p}/Add/output_0"])
        total_len = g.node("Cast", f"{p}/Add/Cast", [f"{p}/Add/output_0"], [f"{p}/Add/Cast/output_0"],
                           to=TensorProto.INT32)
        return build_rest(g, shape, W, ids, path, external, kv_len, kv_dtype, last_logits, mask_dtype,
                          seqlens_k, total_len)
    # attention mask -> seqlens_k (sum - 1, int32) and total_sequence_length (int32)
    g.node("ReduceSum", f"{p}/ReduceSum", ["attention_mask", c1v], [f"{p}/ReduceSum/output_0"], keepdims=0)
    one = c1v if MASK == TensorProto.INT64 else g.init("/model/constants/INT32/[1]", np.array([1], dtype=np.int32))
    g.node("Sub", f"{p}/Sub", [f"{p}/ReduceSum/output_0", one], [f"{p}/Sub/output_0"])
    seqlens_k = g.node("Cast", f"{p}/Sub/Cast", [f"{p}/Sub/output_0"], [f"{p}/Sub/Cast/output_0"], to=TensorProto.INT32)
    g.node("Shape", f"{p}/Shape", ["attention_mask"], [f"{p}/Shape/output_0"])
    c1s = g.const_i64("1", 1, scalar=True)
    g.node("Gather", f"{p}/Gather", [f"{p}/Shape/output_0", c1s], [f"{p}/Gather/output_0"], axis=0)
    total_len = g.node("Cast", f"{p}/Gather/Cast", [f"{p}/Gather/output_0"], [f"{p}/Gather/Cast/output_0"], to=TensorProto.INT32)
    return build_rest(g, shape, W, ids, path, external, kv_len, kv_dtype, last_logits, mask_dtype,
                      seqlens_k, total_len)


def build_rest(g, shape, W, ids, path, external, kv_len, kv_dtype, last_logits, mask_dtype,
               seqlens_k, total_len):
    """The decoder after its sequence-length inputs (seqlens_k, total_sequence_length)."""
    H, nl = shape["hidden"], shape["layers"]
    nh, nkv, hd = shape["heads"], shape["kv_heads"], shape["head_size"]
    V = shape["vocab_size"]
    L = W["layout"]
    KV = TensorProto.FLOAT16 if kv_dtype == "float16" else TensorProto.FLOAT
    MASK = TensorProto.INT32 if mask_dtype == "int32" else TensorProto.INT64

    # embedding table [V, H]
    if external:
        # real shape: a plain float32 initializer, as the builder writes it
        table = np.empty((V, H), dtype=np.float32)
        table[: W["embed_prefix"].shape[0]] = W["embed_prefix"]
        first = ids["speech_first"]
        for s in range(0, N_SPEECH, 8192):
            e = min(N_SPEECH, s + 8192)
            table[first + s:first + e] = L.speech_embedding(np.arange(s, e))
        table[ids["num_tokens"]:] = W["embed_pad"]
        g.init("model.embed_tokens.weight", table)
        del table
    else:
        # tiny: the 65,536 speech rows are computed by a constant subgraph (ORT folds it at load),
        # which keeps model.onnx a few MB; values equal Layout.speech_embedding.
        q = "/model/embed_tokens/speech_rows"
        codes_range(g, "model.embed_tokens.speech_codes", q)
        g.init("model.embed_tokens.speech_freqs", L.freqs[None, :].astype(np.int64))
        g.init("model.embed_tokens.speech_modulus", np.array(N_SPEECH, dtype=np.int64))
        g.init("model.embed_tokens.speech_radians", np.array(2.0 * math.pi / N_SPEECH, dtype=np.float32))
        g.init("model.embed_tokens.speech_zero", np.zeros((N_SPEECH, 1), dtype=np.float32))
        g.init("model.embed_tokens.speech_perm", L.perm)
        g.init("model.embed_tokens.speech_amp", L.amp)
        g.init("model.embed_tokens.speech_bias", L.bias)
        g.node("Mul", f"{q}/Mul", ["model.embed_tokens.speech_codes", "model.embed_tokens.speech_freqs"], [f"{q}/Mul/output_0"])
        g.node("Mod", f"{q}/Mod", [f"{q}/Mul/output_0", "model.embed_tokens.speech_modulus"], [f"{q}/Mod/output_0"], fmod=0)
        g.node("Cast", f"{q}/Cast", [f"{q}/Mod/output_0"], [f"{q}/Cast/output_0"], to=TensorProto.FLOAT)
        g.node("Mul", f"{q}/Angle", [f"{q}/Cast/output_0", "model.embed_tokens.speech_radians"], [f"{q}/Angle/output_0"])
        g.node("Cos", f"{q}/Cos", [f"{q}/Angle/output_0"], [f"{q}/Cos/output_0"])
        g.node("Sin", f"{q}/Sin", [f"{q}/Angle/output_0"], [f"{q}/Sin/output_0"])
        g.node("Concat", f"{q}/Concat", [f"{q}/Cos/output_0", f"{q}/Sin/output_0", "model.embed_tokens.speech_zero"], [f"{q}/Concat/output_0"], axis=1)
        g.node("Gather", f"{q}/Gather", [f"{q}/Concat/output_0", "model.embed_tokens.speech_perm"], [f"{q}/Gather/output_0"], axis=1)
        g.node("Mul", f"{q}/Scale", [f"{q}/Gather/output_0", "model.embed_tokens.speech_amp"], [f"{q}/Scale/output_0"])
        g.node("Add", f"{q}/Add", [f"{q}/Scale/output_0", "model.embed_tokens.speech_bias"], [f"{q}/Add/output_0"])
        g.init("model.embed_tokens.weight.text", W["embed_prefix"])
        g.init("model.embed_tokens.weight.padding", W["embed_pad"])
        g.node("Concat", "/model/embed_tokens/Concat",
               ["model.embed_tokens.weight.text", f"{q}/Add/output_0", "model.embed_tokens.weight.padding"],
               ["model.embed_tokens.weight"], axis=0)
    x = g.node("Gather", "/model/embed_tokens/Gather", ["model.embed_tokens.weight", "input_ids"], ["/model/embed_tokens/Gather/output_0"])
    g.init("cos_cache", W["cos_cache"].astype(np.float16 if KV == TensorProto.FLOAT16 else np.float32))
    g.init("sin_cache", W["sin_cache"].astype(np.float16 if KV == TensorProto.FLOAT16 else np.float32))

    residual = x
    ln_out = None
    prev_down = None
    for l in range(nl):
        d = W["layers"][l]
        b = f"/model/layers.{l}"
        wn = f"model.layers.{l}"
        g.init(f"{wn}.input_layernorm.weight", d["ln1"])
        if l == 0:
            ln_out = g.node("SimplifiedLayerNormalization", f"{b}/input_layernorm/LayerNorm",
                            [x, f"{wn}.input_layernorm.weight"], [f"{b}/input_layernorm/output_0"],
                            epsilon=RMS_EPS, axis=-1, stash_type=1)
        else:
            g.node("SkipSimplifiedLayerNormalization", f"{b}/input_layernorm/SkipLayerNorm",
                   [residual, prev_down, f"{wn}.input_layernorm.weight"],
                   [f"{b}/input_layernorm/output_0", "", "", f"{b}/input_layernorm/output_3"],
                   domain="com.microsoft", epsilon=RMS_EPS)
            ln_out = f"{b}/input_layernorm/output_0"
            residual = f"{b}/input_layernorm/output_3"
        qkv = matmul_nbits(g, f"{b}/attn/qkv_proj", ln_out, f"{wn}.attn.qkv_proj", d["qkv"], f"{b}/attn/qkv_proj/MatMul/output_0")
        g.init(f"{wn}.attn.qkv_proj.Add.bias", d["qkv_bias"])
        qkv = g.node("Add", f"{b}/attn/qkv_proj/Add", [qkv, f"{wn}.attn.qkv_proj.Add.bias"], [f"{b}/attn/qkv_proj/Add/output_0"])
        if KV == TensorProto.FLOAT16:
            qkv = g.node("Cast", f"{b}/attn/qkv_proj/Cast", [qkv], [f"{b}/attn/qkv_proj/Cast/output_0"], to=KV)
        attn = g.node(
            "GroupQueryAttention", f"{b}/attn/GroupQueryAttention",
            [qkv, "", "", f"past_key_values.{l}.key", f"past_key_values.{l}.value", seqlens_k, total_len,
             "cos_cache", "sin_cache", "", "", ""],
            [f"{b}/attn/GroupQueryAttention/output_0", f"present.{l}.key", f"present.{l}.value"],
            domain="com.microsoft", num_heads=nh, kv_num_heads=nkv, scale=float(1.0 / math.sqrt(hd)),
            local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=0)
        if KV == TensorProto.FLOAT16:
            attn = g.node("Cast", f"{b}/attn/Cast", [attn], [f"{b}/attn/Cast/output_0"], to=TensorProto.FLOAT)
        o = matmul_nbits(g, f"{b}/attn/o_proj", attn, f"{wn}.attn.o_proj", d["o"], f"{b}/attn/o_proj/MatMul/output_0")
        g.init(f"{wn}.post_attention_layernorm.weight", d["ln2"])
        g.node("SkipSimplifiedLayerNormalization", f"{b}/post_attention_layernorm/SkipLayerNorm",
               [residual, o, f"{wn}.post_attention_layernorm.weight"],
               [f"{b}/post_attention_layernorm/output_0", "", "", f"{b}/post_attention_layernorm/output_3"],
               domain="com.microsoft", epsilon=RMS_EPS)
        h2 = f"{b}/post_attention_layernorm/output_0"
        residual = f"{b}/post_attention_layernorm/output_3"
        gate = matmul_nbits(g, f"{b}/mlp/gate_proj", h2, f"{wn}.mlp.gate_proj", d["gate"], f"{b}/mlp/gate_proj/MatMul/output_0")
        up = matmul_nbits(g, f"{b}/mlp/up_proj", h2, f"{wn}.mlp.up_proj", d["up"], f"{b}/mlp/up_proj/MatMul/output_0")
        sig = g.node("Sigmoid", f"{b}/mlp/act_fn/Sigmoid", [gate], [f"{b}/mlp/act_fn/Sigmoid/output_0"])
        act = g.node("Mul", f"{b}/mlp/act_fn/Mul", [gate, sig], [f"{b}/mlp/act_fn/Mul/output_0"])
        mul = g.node("Mul", f"{b}/mlp/Mul", [act, up], [f"{b}/mlp/Mul/output_0"])
        prev_down = matmul_nbits(g, f"{b}/mlp/down_proj", mul, f"{wn}.mlp.down_proj", d["down"], f"{b}/mlp/down_proj/MatMul/output_0")

    b = f"/model/layers.{nl}"
    g.init(f"model.layers.{nl}.final_norm_layernorm.weight", W["final_norm"])
    final = g.node("SkipSimplifiedLayerNormalization", f"{b}/final_norm_layernorm/SkipLayerNorm",
                   [residual, prev_down, f"model.layers.{nl}.final_norm_layernorm.weight"],
                   [f"{b}/final_norm_layernorm/output_0"], domain="com.microsoft", epsilon=RMS_EPS)
    if last_logits:
        g.init("/lm_head/last/starts", np.array([-1], dtype=np.int64))
        g.init("/lm_head/last/ends", np.array([np.iinfo(np.int64).max], dtype=np.int64))
        g.init("/lm_head/last/axes", np.array([1], dtype=np.int64))
        final = g.node("Slice", "/lm_head/last/Slice",
                       [final, "/lm_head/last/starts", "/lm_head/last/ends", "/lm_head/last/axes"],
                       ["/lm_head/last/Slice/output_0"])
    LOGITS = KV  # a float16 export's logits are float16 too
    if LOGITS == TensorProto.FLOAT:
        matmul_nbits(g, "/lm_head", final, "lm_head", W["lm_head"], "logits")
    else:
        f32 = matmul_nbits(g, "/lm_head", final, "lm_head", W["lm_head"], "/lm_head/MatMul/output_0")
        g.node("Cast", "/lm_head/Cast", [f32], ["logits"], to=LOGITS)

    # Static packages (AMD's NPU shape): batch 1, past and present of the fixed length.
    batch = 1 if kv_len else "batch_size"
    past_len = kv_len or "past_sequence_length"
    present_len = kv_len or "total_sequence_length"
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, "sequence_length"]),
    ]
    if mask_dtype == "none":
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "sequence_length"]))
    else:
        inputs.append(helper.make_tensor_value_info("attention_mask", MASK, [batch, "total_sequence_length"]))
    outputs = [helper.make_tensor_value_info("logits", LOGITS, [batch, 1 if last_logits else "sequence_length", V])]
    for kind in ("key", "value"):
        for l in range(nl):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{l}.{kind}", KV, [batch, nkv, past_len, "kv_cache_dim"]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{l}.{kind}", KV, [batch, nkv, present_len, "kv_cache_dim"]))
    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs, initializer=g.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid("com.microsoft", 1)],
        producer_name="onebit-tts tools/gen_models.py", producer_version="1")
    model.ir_version = 10
    g.close()
    with open(path, "wb") as f:
        f.write(model.SerializeToString(deterministic=True))


# ---------------------------------------------------------------------------------------
# Codec (NeuCodec-shaped decoder)
# ---------------------------------------------------------------------------------------

HOP = 480
SAMPLE_RATE = 24000


CODES_IO = ("codes", TensorProto.INT32, "frames")
AUDIO_IO = ("audio", TensorProto.FLOAT, "samples")


def save_single_io(g, path, name, inp, out):
    """Writes g as an opset-17 model with one [batch, 1, n] input and one output, each given as
    (name, element type, name of the n dimension). The file is written anew, never through a hard
    link (`models optimize` links big files between packages)."""
    graph = helper.make_graph(
        g.nodes, name,
        [helper.make_tensor_value_info(inp[0], inp[1], ["batch", 1, inp[2]])],
        [helper.make_tensor_value_info(out[0], out[1], ["batch", 1, out[2]])],
        initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="onebit-tts tools/gen_models.py", producer_version="1")
    model.ir_version = 8
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(path):
        os.remove(path)
    with open(path, "wb") as f:
        f.write(model.SerializeToString(deterministic=True))


def build_codec(path):
    D, C = 16, 24
    r = rs("codec", D, C)
    freqs = r.choice(np.arange(1, 32768), D // 2, replace=False).astype(np.int64)
    conv_w = (r.standard_normal((C, D, 3)) * (0.6 / math.sqrt(3 * D))).astype(np.float32)
    conv_b = (0.1 * r.standard_normal(C)).astype(np.float32)
    # smooth per-frame basis: channel c is a tone of h_c * 50 Hz (whole cycles per frame)
    n = (np.arange(HOP, dtype=np.float64) + 0.5) / HOP
    harm = 1 + (np.arange(C) * 7) % 12
    phase = r.uniform(0, 2 * math.pi, C)
    proj = (np.sin(2 * math.pi * harm[:, None] * n[None, :] + phase[:, None]) * (0.9 / math.sqrt(C) * 2.0)).astype(np.float32)

    g = Graph()
    codes_range(g, "codebook.codes", "/codebook")
    g.init("codebook.freqs", freqs[None, :])
    g.init("codebook.modulus", np.array(N_SPEECH, dtype=np.int64))
    g.init("codebook.radians", np.array(2.0 * math.pi / N_SPEECH, dtype=np.float32))
    g.node("Mul", "/codebook/Mul", ["codebook.codes", "codebook.freqs"], ["/codebook/Mul/output_0"])
    g.node("Mod", "/codebook/Mod", ["/codebook/Mul/output_0", "codebook.modulus"], ["/codebook/Mod/output_0"], fmod=0)
    g.node("Cast", "/codebook/Cast", ["/codebook/Mod/output_0"], ["/codebook/Cast/output_0"], to=TensorProto.FLOAT)
    g.node("Mul", "/codebook/Angle", ["/codebook/Cast/output_0", "codebook.radians"], ["/codebook/Angle/output_0"])
    g.node("Cos", "/codebook/Cos", ["/codebook/Angle/output_0"], ["/codebook/Cos/output_0"])
    g.node("Sin", "/codebook/Sin", ["/codebook/Angle/output_0"], ["/codebook/Sin/output_0"])
    g.node("Concat", "/codebook/Concat", ["/codebook/Cos/output_0", "/codebook/Sin/output_0"], ["codebook.table"], axis=1)
    g.node("Gather", "/decoder/embed/Gather", ["codebook.table", "codes"], ["/decoder/embed/output_0"], axis=0)  # [B,1,F,D]
    g.init("decoder.squeeze_axes", np.array([1], dtype=np.int64))
    g.node("Squeeze", "/decoder/Squeeze", ["/decoder/embed/output_0", "decoder.squeeze_axes"], ["/decoder/Squeeze/output_0"])
    g.node("Transpose", "/decoder/Transpose", ["/decoder/Squeeze/output_0"], ["/decoder/Transpose/output_0"], perm=[0, 2, 1])
    g.init("decoder.conv.weight", conv_w)
    g.init("decoder.conv.bias", conv_b)
    g.node("Conv", "/decoder/conv/Conv", ["/decoder/Transpose/output_0", "decoder.conv.weight", "decoder.conv.bias"],
           ["/decoder/conv/output_0"], kernel_shape=[3], pads=[1, 1])
    g.node("Tanh", "/decoder/conv/Tanh", ["/decoder/conv/output_0"], ["/decoder/conv/Tanh/output_0"])
    g.node("Transpose", "/decoder/Transpose_1", ["/decoder/conv/Tanh/output_0"], ["/decoder/Transpose_1/output_0"], perm=[0, 2, 1])
    g.init("decoder.proj.weight", np.ascontiguousarray(proj))
    g.node("MatMul", "/decoder/proj/MatMul", ["/decoder/Transpose_1/output_0", "decoder.proj.weight"], ["/decoder/proj/output_0"])
    g.node("Tanh", "/decoder/out/Tanh", ["/decoder/proj/output_0"], ["/decoder/out/Tanh/output_0"])
    g.init("decoder.out.gain", np.array(0.5, dtype=np.float32))
    g.node("Mul", "/decoder/out/Mul", ["/decoder/out/Tanh/output_0", "decoder.out.gain"], ["/decoder/out/Mul/output_0"])
    g.init("decoder.out.shape", np.array([0, 1, -1], dtype=np.int64))
    g.node("Reshape", "/decoder/out/Reshape", ["/decoder/out/Mul/output_0", "decoder.out.shape"], ["audio"])
    save_single_io(g, path, "neucodec_decoder", CODES_IO, AUDIO_IO)


# ---------------------------------------------------------------------------------------
# Real-shape NeuCodec decoder (random weights)
# ---------------------------------------------------------------------------------------

# The decoder's assumed shape, from the public XCodec2 / NeuCodec descriptions (not from the
# vendor's ONNX, which cannot be downloaded here): FSQ codes (8 digits of 4 levels) -> project_out
# Linear(8, 2048) -> fc_post_a Linear(2048, 1024) -> VocosBackbone (embed Conv1d k7, 2 ResnetBlocks,
# 12 pre-RMSNorm transformer blocks with 16 rotary heads of 64, non-causal, SiLU MLP x4,
# 2 ResnetBlocks, LayerNorm) -> ISTFTHead (Linear to n_fft + 2, exp-magnitude clipped at 100 and
# phase, irfft with a periodic Hann window, overlap-add at the hop, divided by the window-square
# envelope, "same" padding). About 190M float32 parameters.
NEUCODEC = dict(
    fsq_digits=8, fsq_levels=4, vq_dim=2048, hidden=1024, depth=12, heads=16, head_dim=64,
    mlp=4096, resnets=2, groups=32, embed_kernel=7, n_fft=4 * HOP, hop=HOP, rope_base=10000.0,
    # ISTFT head: log-magnitude bias falls linearly from mag_log0 (natural log) at DC by mag_tilt
    # at Nyquist; weight std of the log-magnitude and phase columns (LayerNorm output is ~unit)
    mag_log0=2.5, mag_tilt=3.0, mag_std=0.3, phase_std=3.0,
)
NEUCODEC_EPS = 1e-6
# Name of the head's Linear output [B, F, n_fft + 2] (log-magnitudes, then phases): tests feed a
# spectrum there to check the irfft + overlap-add against numpy.
NEUCODEC_SPEC = "/head/out/Add/output_0"


def hann_periodic(n):
    return 0.5 - 0.5 * np.cos(2.0 * math.pi * np.arange(n, dtype=np.float64) / n)


def irfft_basis(n_fft):
    """[n_fft + 2, n_fft] float32: [Re; Im] of the n_fft/2 + 1 bins -> one Hann-windowed frame.

    Row k of the Re half is c_k cos(2 pi k n / N) / N * w[n], of the Im half -c_k sin(...) / N * w[n],
    with c_k = 1 at DC and Nyquist and 2 between, so [Re, Im] @ basis = irfft(Re + i Im, N) * w
    (like numpy's and torch's irfft, the imaginary parts of DC and Nyquist are ignored).
    """
    bins = n_fft // 2 + 1
    k = np.arange(bins, dtype=np.int64)[:, None]
    n = np.arange(n_fft, dtype=np.int64)[None, :]
    ang = ((k * n) % n_fft).astype(np.float64) * (2.0 * math.pi / n_fft)  # exact phase
    c = np.full((bins, 1), 2.0)
    c[0], c[-1] = 1.0, 1.0
    w = hann_periodic(n_fft)[None, :]
    re = c * np.cos(ang) / n_fft * w
    im = -c * np.sin(ang) / n_fft * w
    im[0], im[-1] = 0.0, 0.0
    return np.concatenate([re, im], axis=0).astype(np.float32)


def build_neucodec(path, dims=None):
    """A NeuCodec-decoder-shaped ONNX (opset 17) with random weights: codes int32 [B,1,F] ->
    audio float32 [B,1,F*hop]. `dims` overrides NEUCODEC (tests build it narrow and shallow)."""
    d = dict(NEUCODEC, **(dims or {}))
    D, H, hd, V = d["hidden"], d["heads"], d["head_dim"], d["vq_dim"]
    nq, lv, G = d["fsq_digits"], d["fsq_levels"], d["groups"]
    n_fft, hop = d["n_fft"], d["hop"]
    bins = n_fft // 2 + 1
    assert H * hd == D and D % G == 0 and n_fft == 4 * hop and lv ** nq == N_SPEECH
    g = Graph()

    def normal(name, shape, std, mean=0.0):
        # float32 straight from the legacy stream (byte-identical across numpy versions)
        a = rs("neucodec", name, *shape).standard_normal(shape)
        return g.init(name, (a * std + mean).astype(np.float32))

    def op(kind, name, inputs, **attrs):
        return g.node(kind, name, inputs, [name + "/output_0"], **attrs)

    def const(name, value, dtype=np.int64):
        return g.init(name, np.array(value, dtype=dtype))

    def linear(x, module, n_in, n_out, std, bias_std=None):
        p = "/" + module.replace(".", "/")
        w = normal(module + ".weight", (n_in, n_out), std)
        y = op("MatMul", p + "/MatMul", [x, w])
        if bias_std is not None:
            y = op("Add", p + "/Add", [y, normal(module + ".bias", (n_out,), bias_std)])
        return y

    def conv(x, module, k, std):
        p = "/" + module.replace(".", "/")
        w = normal(module + ".weight", (D, D, k), std)
        b = normal(module + ".bias", (D,), 0.02)
        return op("Conv", p + "/Conv", [x, w, b], kernel_shape=[k], pads=[k // 2, k // 2])

    def swish(x, p):
        return op("Mul", p + "/Mul", [x, op("Sigmoid", p + "/Sigmoid", [x])])

    def group_norm(x, module):
        # GroupNorm(G, D, eps 1e-6) as torch exports it at opset 17: InstanceNormalization over
        # [B, G, D/G * F], then the per-channel affine
        p = "/" + module.replace(".", "/")
        shape = op("Shape", p + "/Shape", [x])
        y = op("Reshape", p + "/Reshape", [x, const(module + ".groups_shape", [0, G, -1])])
        y = op("InstanceNormalization", p + "/InstanceNormalization",
               [y, const(module + ".ones", np.ones(G), np.float32), const(module + ".zeros", np.zeros(G), np.float32)],
               epsilon=NEUCODEC_EPS)
        y = op("Reshape", p + "/Reshape_1", [y, shape])
        y = op("Mul", p + "/Mul", [y, normal(module + ".weight", (D, 1), 0.1, 1.0)])
        return op("Add", p + "/Add", [y, normal(module + ".bias", (D, 1), 0.1)])

    def resnet(x, module):
        # h = conv2(swish(norm2(conv1(swish(norm1(x)))))); x + h   ([B, D, F])
        p = "/" + module.replace(".", "/")
        h = swish(group_norm(x, module + ".norm1"), p + "/act1")
        h = conv(h, module + ".conv1", 3, 1.0 / math.sqrt(3 * D))
        h = swish(group_norm(h, module + ".norm2"), p + "/act2")
        h = conv(h, module + ".conv2", 3, 0.5 / math.sqrt(3 * D))
        return op("Add", p + "/Add", [x, h])

    def rms_norm(x, module):
        return op("SimplifiedLayerNormalization", "/" + module.replace(".", "/") + "/LayerNorm",
                  [x, normal(module + ".weight", (D,), 0.1, 1.0)], epsilon=NEUCODEC_EPS, axis=-1, stash_type=1)

    def rotary(x, p, cos, sin):
        # rotate-half form of RoPE over the head dimension ([B, H, F, hd])
        half = hd // 2
        x1 = op("Slice", p + "/Slice", [x, const(p + ".zero", [0]), const(p + ".half", [half]), const(p + ".axis", [-1])])
        x2 = op("Slice", p + "/Slice_1", [x, p + ".half", const(p + ".end", [hd]), p + ".axis"])
        rot = op("Concat", p + "/Concat", [op("Neg", p + "/Neg", [x2]), x1], axis=-1)
        return op("Add", p + "/Add", [op("Mul", p + "/Mul", [x, cos]), op("Mul", p + "/Mul_1", [rot, sin])])

    def block(x, i, cos, sin):
        m = f"backbone.transformers.{i}"
        p = "/" + m.replace(".", "/")
        h = rms_norm(x, m + ".att_norm")
        qkv = linear(h, m + ".att.c_attn", D, 3 * D, 1.0 / math.sqrt(D))
        qkv = op("Reshape", p + "/att/Reshape", [qkv, const(m + ".att.qkv_shape", [0, 0, 3, H, hd])])
        qkv = op("Transpose", p + "/att/Transpose", [qkv], perm=[2, 0, 3, 1, 4])  # [3, B, H, F, hd]
        q, k, v = (g.node("Gather", f"{p}/att/Gather_{j}", [qkv, const(f"{m}.att.index_{j}", j)],
                          [f"{p}/att/Gather_{j}/output_0"], axis=0) for j in range(3))
        q = rotary(q, p + "/att/rotary_q", cos, sin)
        k = rotary(k, p + "/att/rotary_k", cos, sin)
        kt = op("Transpose", p + "/att/Transpose_1", [k], perm=[0, 1, 3, 2])
        s = op("MatMul", p + "/att/MatMul", [q, kt])
        s = op("Mul", p + "/att/Mul", [s, const(m + ".att.scale", 1.0 / math.sqrt(hd), np.float32)])
        a = op("Softmax", p + "/att/Softmax", [s], axis=-1)  # non-causal: every frame sees all
        a = op("MatMul", p + "/att/MatMul_1", [a, v])
        a = op("Transpose", p + "/att/Transpose_2", [a], perm=[0, 2, 1, 3])
        a = op("Reshape", p + "/att/Reshape_1", [a, const(m + ".att.out_shape", [0, 0, D])])
        a = linear(a, m + ".att.c_proj", D, D, 0.5 / math.sqrt(D))
        x = op("Add", p + "/Add", [x, a])
        h = rms_norm(x, m + ".ffn_norm")
        h = swish(linear(h, m + ".mlp.fc1", D, d["mlp"], 1.0 / math.sqrt(D)), p + "/mlp/act")
        h = linear(h, m + ".mlp.fc2", d["mlp"], D, 0.5 / math.sqrt(d["mlp"]))
        return op("Add", p + "/Add_1", [x, h])

    def overlap_add(frames, p):
        # frames [B, F, n_fft] -> [B, 1, F * hop]: frame f lands at f * hop of a (F + 3) * hop signal
        # (n_fft = 4 hops: quarter j of frame f goes to hop block f + j), then "same" padding trims
        # (n_fft - hop) / 2 from each end.
        q = op("Reshape", p + "/Reshape", [frames, const(p + ".quarters", [0, 0, 4, hop])])
        parts = [f"{p}/Split/output_{j}" for j in range(4)]
        g.node("Split", p + "/Split", [q, const(p + ".split", [1, 1, 1, 1])], parts, axis=2)
        shifted = [op("Pad", f"{p}/Pad_{j}", [parts[j], const(f"{p}.pads_{j}", [0, j, 0, 0, 0, 3 - j, 0, 0])])
                   for j in range(4)]
        y = op("Reshape", p + "/Reshape_1", [op("Sum", p + "/Sum", shifted), const(p + ".out_shape", [0, 1, -1])])
        trim = (n_fft - hop) // 2
        return op("Slice", p + "/Slice", [y, const(p + ".start", [trim]), const(p + ".end", [-trim]),
                                          const(p + ".axis", [2])])

    # FSQ: code -> 8 base-4 digits -> (digit - 2) / 2 (vector_quantize_pytorch's indices_to_codes)
    c = op("Cast", "/quantizer/Cast", ["codes"], to=TensorProto.INT64)
    c = op("Unsqueeze", "/quantizer/Unsqueeze", [c, const("quantizer.axes", [3])])  # [B, 1, F, 1]
    c = op("Div", "/quantizer/Div", [c, const("quantizer.basis", [lv ** j for j in range(nq)])])
    c = op("Mod", "/quantizer/Mod", [c, const("quantizer.levels", lv)], fmod=0)
    c = op("Cast", "/quantizer/Cast_1", [c], to=TensorProto.FLOAT)
    c = op("Sub", "/quantizer/Sub", [c, const("quantizer.half_width", lv // 2, np.float32)])
    c = op("Div", "/quantizer/Div_1", [c, "quantizer.half_width"])
    c = op("Squeeze", "/quantizer/Squeeze", [c, const("quantizer.squeeze_axes", [1])])  # [B, F, 8]
    # E[digit^2] = 0.375 for uniform digits
    x = linear(c, "quantizer.project_out", nq, V, 1.0 / math.sqrt(nq * 0.375), 0.0)
    x = linear(x, "fc_post_a", V, D, 1.0 / math.sqrt(V), 0.02)

    x = op("Transpose", "/backbone/Transpose", [x], perm=[0, 2, 1])  # [B, D, F]
    x = conv(x, "backbone.embed", d["embed_kernel"], 1.0 / math.sqrt(d["embed_kernel"] * D))
    for i in range(d["resnets"]):
        x = resnet(x, f"backbone.prior_net.{i}")
    x = op("Transpose", "/backbone/Transpose_1", [x], perm=[0, 2, 1])  # [B, F, D]

    # rotary angles for positions 0..F-1: [F, hd] (the same angle for both halves)
    f = op("Gather", "/backbone/rotary/Gather", [op("Shape", "/backbone/rotary/Shape", [x]),
                                                  const("backbone.rotary.index", 1)], axis=0)
    pos = op("Range", "/backbone/rotary/Range", [const("backbone.rotary.start", 0), f, const("backbone.rotary.delta", 1)])
    pos = op("Cast", "/backbone/rotary/Cast", [pos], to=TensorProto.FLOAT)
    pos = op("Unsqueeze", "/backbone/rotary/Unsqueeze", [pos, const("backbone.rotary.axes", [1])])
    inv = d["rope_base"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = op("Mul", "/backbone/rotary/Mul", [pos, const("backbone.rotary.inv_freq", np.concatenate([inv, inv])[None, :], np.float32)])
    cos = op("Cos", "/backbone/rotary/Cos", [ang])
    sin = op("Sin", "/backbone/rotary/Sin", [ang])
    for i in range(d["depth"]):
        x = block(x, i, cos, sin)

    x = op("Transpose", "/backbone/Transpose_2", [x], perm=[0, 2, 1])
    for i in range(d["resnets"]):
        x = resnet(x, f"backbone.post_net.{i}")
    x = op("Transpose", "/backbone/Transpose_3", [x], perm=[0, 2, 1])
    x = op("LayerNormalization", "/backbone/final_layer_norm/LayerNormalization",
           [x, const("backbone.final_layer_norm.weight", np.ones(D), np.float32),
            const("backbone.final_layer_norm.bias", np.zeros(D), np.float32)], axis=-1, epsilon=NEUCODEC_EPS)

    # ISTFT head. Weights: log-magnitude columns small, phase columns large (random phases);
    # biases: a falling log-magnitude tilt (output std ~0.1) and uniform phases.
    r = rs("neucodec", "head.out", D, n_fft + 2)
    w = np.concatenate([r.standard_normal((D, bins)) * (d["mag_std"] / math.sqrt(D)),
                        r.standard_normal((D, bins)) * (d["phase_std"] / math.sqrt(D))], axis=1)
    b = np.concatenate([d["mag_log0"] - d["mag_tilt"] * np.arange(bins) / (bins - 1),
                        r.uniform(-math.pi, math.pi, bins)])
    g.init("head.out.weight", w.astype(np.float32))
    g.init("head.out.bias", b.astype(np.float32))
    spec = op("Add", "/head/out/Add", [op("MatMul", "/head/out/MatMul", [x, "head.out.weight"]), "head.out.bias"])
    assert spec == NEUCODEC_SPEC
    p = "/head/istft"
    mag_log, phase = f"{p}/Split/output_0", f"{p}/Split/output_1"
    g.node("Split", p + "/Split", [spec, const("head.split", [bins, bins])], [mag_log, phase], axis=-1)
    mag = op("Clip", p + "/Clip", [op("Exp", p + "/Exp", [mag_log]), "", const("head.mag_max", 100.0, np.float32)])
    re = op("Mul", p + "/Mul", [mag, op("Cos", p + "/Cos", [phase])])
    im = op("Mul", p + "/Mul_1", [mag, op("Sin", p + "/Sin", [phase])])
    ri = op("Concat", p + "/Concat", [re, im], axis=-1)
    # irfft as one MatMul against the windowed cos/sin basis: ORT's CPU DFT op is ~3x slower here
    # (n_fft = 1920 is no power of two, and it needs the Hermitian half rebuilt first)
    frames = op("MatMul", p + "/irfft/MatMul", [ri, g.init("head.istft.basis", irfft_basis(n_fft))])
    y = overlap_add(frames, p + "/ola")
    # window-square envelope for this F: the same overlap-add of w^2 frames
    nf = op("Gather", p + "/envelope/Gather", [op("Shape", p + "/envelope/Shape", [frames]), const("head.envelope.index", [1])],
            axis=0)
    shape = op("Concat", p + "/envelope/Concat", [const("head.envelope.one", [1]), nf, const("head.envelope.n_fft", [n_fft])], axis=0)
    w2 = const("head.istft.window_sq", (hann_periodic(n_fft) ** 2)[None, None, :], np.float32)
    env = overlap_add(op("Expand", p + "/envelope/Expand", [w2, shape]), p + "/envelope/ola")
    g.node("Div", p + "/Div", [y, env], ["audio"])

    save_single_io(g, path, "neucodec_decoder", CODES_IO, AUDIO_IO)


ENC_RATE = 16000
ENC_HOP = 320  # 16 kHz / 50 codes per second
ENC_BITS = 16


def build_encoder(path):
    """A tiny NeuCodec-encoder-shaped model: audio float32 [B,1,T] at 16 kHz -> codes int32 [B,1,F].

    F = floor((T + 160) / 320), i.e. T / 320 rounded to the nearest frame (16000 samples -> 50).
    Each 320-sample frame is projected onto 16 fixed random vectors; code bit k is set when
    projection k is positive, so codes lie in 0..65535 and silence encodes to 0.
    """
    r = rs("encoder", ENC_HOP, ENC_BITS)
    proj = r.standard_normal((ENC_HOP, ENC_BITS)).astype(np.float32)
    weights = (2.0 ** np.arange(ENC_BITS)).astype(np.float32)[:, None]  # [16,1]
    g = Graph()
    g.init("encoder.pad", np.array([0, 0, 0, 0, 0, ENC_HOP // 2], dtype=np.int64))
    g.node("Pad", "/encoder/Pad", ["audio", "encoder.pad"], ["/encoder/Pad/output_0"], mode="constant")
    g.node("Shape", "/encoder/Shape", ["/encoder/Pad/output_0"], ["/encoder/Shape/output_0"])
    g.init("encoder.two", np.array([2], dtype=np.int64))
    g.node("Gather", "/encoder/Gather", ["/encoder/Shape/output_0", "encoder.two"], ["/encoder/samples"], axis=0)
    g.init("encoder.hop", np.array([ENC_HOP], dtype=np.int64))
    g.node("Div", "/encoder/Div", ["/encoder/samples", "encoder.hop"], ["/encoder/frames"])
    g.node("Mul", "/encoder/Mul", ["/encoder/frames", "encoder.hop"], ["/encoder/kept"])
    g.init("encoder.zero", np.array([0], dtype=np.int64))
    g.node("Slice", "/encoder/Slice", ["/encoder/Pad/output_0", "encoder.zero", "/encoder/kept", "encoder.two"],
           ["/encoder/Slice/output_0"])
    g.init("encoder.frame_shape", np.array([0, -1, ENC_HOP], dtype=np.int64))
    g.node("Reshape", "/encoder/Reshape", ["/encoder/Slice/output_0", "encoder.frame_shape"], ["/encoder/framed"])
    g.init("encoder.proj.weight", proj)
    g.node("MatMul", "/encoder/proj/MatMul", ["/encoder/framed", "encoder.proj.weight"], ["/encoder/proj/output_0"])
    g.init("encoder.threshold", np.array(0.0, dtype=np.float32))
    g.node("Greater", "/encoder/bits/Greater", ["/encoder/proj/output_0", "encoder.threshold"], ["/encoder/bits/bool"])
    g.node("Cast", "/encoder/bits/Cast", ["/encoder/bits/bool"], ["/encoder/bits/float"], to=TensorProto.FLOAT)
    g.init("encoder.bit_weights", weights)
    g.node("MatMul", "/encoder/bits/MatMul", ["/encoder/bits/float", "encoder.bit_weights"], ["/encoder/code_f"])
    g.node("Cast", "/encoder/Cast", ["/encoder/code_f"], ["/encoder/code_i"], to=TensorProto.INT32)
    g.init("encoder.out_shape", np.array([0, 1, -1], dtype=np.int64))
    g.node("Reshape", "/encoder/out/Reshape", ["/encoder/code_i", "encoder.out_shape"], ["codes"])
    save_single_io(g, path, "neucodec_encoder", AUDIO_IO, CODES_IO)


# ---------------------------------------------------------------------------------------
# Configs, voice, main
# ---------------------------------------------------------------------------------------

def genai_config(shape, ids, share_buffer=False):
    return {
        "model": {
            "bos_token_id": ids["endoftext"],
            "context_length": shape["context"],
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": shape["head_size"],
                "hidden_size": shape["hidden"],
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": shape["heads"],
                "num_hidden_layers": shape["layers"],
                "num_key_value_heads": shape["kv_heads"],
            },
            "eos_token_id": [ids["im_end"], ids["endoftext"]],
            "pad_token_id": ids["endoftext"],
            "type": "qwen2",
            "vocab_size": shape["vocab_size"],
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": shape["max_length"],
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": share_buffer,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }


def hf_config(shape, ids, input_format="phonemes"):
    neuphonic = {"input_format": input_format}
    if EMOTIONS:
        neuphonic["supported_emotions"] = list(EMOTIONS)
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": ids["endoftext"],
        "eos_token_id": ids["endoftext"],
        "hidden_act": "silu",
        "hidden_size": shape["hidden"],
        "intermediate_size": shape["intermediate"],
        "max_position_embeddings": shape["context"],
        "model_type": "qwen2",
        "neuphonic": neuphonic,
        "num_attention_heads": shape["heads"],
        "num_hidden_layers": shape["layers"],
        "num_key_value_heads": shape["kv_heads"],
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": shape["vocab_size"],
    }


def tokenizer_config(shape):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": shape["context"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def voice_codes():
    r = rs("voice")
    codes = [int(c) for c in r.randint(0, N_SPEECH, VOICE_LEN - 1)]
    codes.append(CHAIN_M - 1 - VOICE_NEW_CODES)
    return codes


def write_json(path, obj, indent=4):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")


def generate(out, variant="chain", real_shape=False, encoder=None, codec=None, kv_len=None,
             kv_dtype="float32", last_logits=False, mask_dtype="int64", input_format="phonemes"):
    """codec: "real" (the NeuCodec-shaped decoder, ~765 MB) or "tiny" (a few-KB stand-in); by
    default real with real_shape, tiny otherwise. kv_len, kv_dtype, last_logits, mask_dtype: see
    the module's docstring (static packages)."""
    shape = dict(REAL if real_shape else TINY)
    codec = codec or ("real" if real_shape else "tiny")
    os.makedirs(out, exist_ok=True)
    os.makedirs(os.path.join(out, "codec"), exist_ok=True)
    if real_shape:
        tok, ids = build_tokenizer(shape["base_vocab"], 400)
        assert ids["endoftext"] == 151643 and ids["speech_end"] == 151670 and ids["speech_first"] == 151671
    else:
        tok, ids = build_tokenizer(None, shape["merges"])
        shape["vocab_size"] = (ids["num_tokens"] + 63) // 64 * 64 + 64
    assert shape["vocab_size"] > ids["num_tokens"]
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    del tok
    write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config(shape), indent=2)
    # search.max_length stays the context: as in onnxruntime-genai, the graph's fixed length is
    # what bounds a static package.
    write_json(os.path.join(out, "genai_config.json"), genai_config(shape, ids, share_buffer=bool(kv_len)))
    write_json(os.path.join(out, "config.json"), hf_config(shape, ids, input_format), indent=2)

    W = build_weights(shape, variant, ids)
    data = os.path.join(out, "model.onnx.data")
    if os.path.exists(data):
        os.remove(data)
    build_decoder(shape, W, ids, os.path.join(out, "model.onnx"), shape["external_data"], kv_len, kv_dtype,
                  last_logits, mask_dtype)
    if codec == "real":
        build_neucodec(os.path.join(out, "codec", "model.onnx"))
    else:
        build_codec(os.path.join(out, "codec", "model.onnx"))
    codec_json = {"sample_rate": SAMPLE_RATE, "hop_length": HOP, "decoder": "model.onnx"}
    if encoder is not None:
        codec_json["encoder"] = encoder
    write_json(os.path.join(out, "codec", "codec.json"), codec_json, indent=2)

    expect = {
        "generator": "tools/gen_models.py",
        "variant": variant,
        "real_shape": real_shape,
        "codec": codec,
        "vocab_size": shape["vocab_size"],
        "num_tokens": ids["num_tokens"],
        "base_vocab_size": ids["base"],
        "endoftext_id": ids["endoftext"],
        "im_start_id": ids["im_start"],
        "im_end_id": ids["im_end"],
        "text_prompt_start_id": ids["text_prompt_start"],
        "text_prompt_end_id": ids["text_prompt_end"],
        "speech_generation_start_id": ids["speech_generation_start"],
        "speech_end_id": ids["speech_end"],
        "end_id": ids["speech_end"],
        "speech_first_id": ids["speech_first"],
        "speech_count": N_SPEECH,
        "kv_len": kv_len,
        "kv_dtype": kv_dtype,
        "last_logits": last_logits,
        "mask_dtype": mask_dtype,
    }
    if input_format != "phonemes" or EMOTIONS:
        expect["input_format"] = input_format
        expect["emotion_ids"] = {e: ids["base"] + 3 + len(NEUTTS_NAMED) + i for i, e in enumerate(EMOTIONS)}
    if variant in ("chain", "textbias"):
        expect["end_after_code"] = W["end_after_code"]
        expect["rule"] = ("after speech_c the greedy next is speech_(c+1 mod 65536); after "
                          "SPEECH_GENERATION_START it is speech_0; after speech_end_after_code it is END "
                          "and the runner-up is speech_(end_after_code+1)")
        expect["voice_last_code"] = CHAIN_M - 1 - VOICE_NEW_CODES
        expect["voice_new_codes"] = VOICE_NEW_CODES
        # greedy codes the chain generates after the --voice-out voice's codes (then END)
        expect["test_voice_greedy_codes"] = VOICE_NEW_CODES
    if variant == "textbias":
        expect["text_bias_ids"] = W["text_bias_ids"]
        expect["text_bias_pad_id"] = W["text_bias_pad_id"]
    write_json(os.path.join(out, "expect.json"), expect, indent=2)
    # The package's own word that its weights are random, which `say`, `serve` and `bench` pass on
    # to the user (src/package/mod.rs, WEIGHTS_MANIFEST).
    write_json(os.path.join(out, "onebit_weights.json"),
               {"random": True, "made_by": "tools/gen_models.py, a generated test package"})
    return expect


def write_voice(path):
    codes = voice_codes()
    voice = {
        "name": "test",
        "language": "en-us",
        "transcript": "This is a generated test voice.",
        "codes": codes,
        "source": "generated by tools/gen_models.py",
        "license": "CC0, generated",
    }
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    write_json(path, voice, indent=2)


def main(argv=None):
    global ACCURACY_LEVEL, BLOCK
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="output directory for the model package")
    ap.add_argument("--variant", choices=["chain", "random", "textbias"], default="chain")
    ap.add_argument("--real-shape", action="store_true",
                    help="Qwen2-0.5B / NeuTTS-air shape (about 1.1 GB, plus the 765 MB real-shape codec; for benchmarks, never commit)")
    ap.add_argument("--codec", choices=["real", "tiny"],
                    help="codec/model.onnx: real = NeuCodec-decoder shape, random weights (~190M parameters, "
                         "765 MB, ~30 s); tiny = a few-KB stand-in with the same I/O. Default: real with "
                         "--real-shape, tiny otherwise")
    ap.add_argument("--voice-out", help="also write the test voice JSON here")
    ap.add_argument("--encoder-out",
                    help="also write a tiny NeuCodec-encoder-shaped ONNX here (16 kHz float [B,1,T] -> "
                         "int32 codes [B,1,F], 320 samples per code); inside OUT/codec it is also "
                         "declared as the package's encoder in codec.json")
    ap.add_argument("--kv-len", type=int,
                    help="static KV cache: past_key_values.* and present.* declared [1, kv_heads, N, head_size] "
                         "with numbers (AMD's NPU package shape), past_present_share_buffer on")
    ap.add_argument("--kv-dtype", choices=["float32", "float16"], default="float32",
                    help="KV cache and attention element type; float16 also makes the logits float16")
    ap.add_argument("--last-logits", action="store_true",
                    help="project the last position only: logits [B, 1, V]")
    ap.add_argument("--mask-dtype", choices=["int64", "int32", "none"], default="int64",
                    help="attention_mask element type (none: no mask; a position_ids input instead)")
    ap.add_argument("--accuracy-level", type=int, choices=[0, 1, 2, 3, 4], default=ACCURACY_LEVEL,
                    help="MatMulNBits accuracy_level (default %d, the builder's CPU default: int8 "
                         "activations); 0 computes in float32, a reference for other engines' parity"
                         % ACCURACY_LEVEL)
    ap.add_argument("--block-size", type=int, choices=[16, 32, 64, 128, 256], default=BLOCK,
                    help="MatMulNBits block_size of the int4 weights (default %d, onnxruntime-genai's "
                         "builder's block_size default); it must divide every weight's input width"
                         % BLOCK)
    ap.add_argument("--input-format", choices=["phonemes", "bpe"], default="phonemes",
                    help="config.json's neuphonic.input_format (bpe: NeuTTS-2E's text input, "
                         "written \"BPE\" as the vendor writes it)")
    ap.add_argument("--emotions",
                    help="comma-separated emotions the model declares (neuphonic.supported_emotions), "
                         "each with its <|NAME|> token in place of a reserved token")
    a = ap.parse_args(argv)
    ACCURACY_LEVEL = a.accuracy_level
    EMOTIONS[:] = [e for e in (a.emotions or "").split(",") if e]
    BLOCK = a.block_size
    if a.kv_len is not None and a.kv_len < 2:
        ap.error("--kv-len must be at least 2")
    if not a.out and not a.voice_out and not a.encoder_out:
        ap.error("nothing to do: give --out, --voice-out and/or --encoder-out")
    if a.codec and not a.out:
        ap.error("--codec needs --out")
    encoder_in_package = None
    if a.out and a.encoder_out:
        codec_dir = os.path.abspath(os.path.join(a.out, "codec"))
        if os.path.dirname(os.path.abspath(a.encoder_out)) == codec_dir:
            encoder_in_package = os.path.basename(a.encoder_out)
    if a.out:
        shape = REAL if a.real_shape else TINY
        widths = {"hidden": shape["hidden"], "heads x head_size": shape["heads"] * shape["head_size"],
                  "intermediate": shape["intermediate"]}
        for name, k in widths.items():
            if k % BLOCK:
                ap.error("--block-size %d does not divide the %s shape's %s (%d); its int4 blocks "
                         "are not padded" % (BLOCK, "real" if a.real_shape else "tiny", name, k))
        e = generate(a.out, a.variant, a.real_shape, encoder_in_package, a.codec, a.kv_len, a.kv_dtype,
                     a.last_logits, a.mask_dtype, "BPE" if a.input_format == "bpe" else "phonemes")
        print("wrote %s: variant %s, codec %s, vocab_size %d, speech ids %d..%d, END %d%s" % (
            a.out, a.variant, e["codec"], e["vocab_size"], e["speech_first_id"], e["speech_first_id"] + N_SPEECH - 1,
            e["speech_end_id"], ", end_after_code %d" % e["end_after_code"] if "end_after_code" in e else ""))
    if a.voice_out:
        write_voice(a.voice_out)
        print("wrote %s" % a.voice_out)
    if a.encoder_out:
        build_encoder(a.encoder_out)
        print("wrote %s" % a.encoder_out)


if __name__ == "__main__":
    main()
