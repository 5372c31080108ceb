#!/usr/bin/env python3
"""The official OpenAI Python SDK against a running `onebit-tts serve`.

    python tests/python/openai_client.py --base-url http://127.0.0.1:PORT/v1 \
        --expect-samples 57600 --out-dir DIR

tests/openai_sdk.rs starts the server on the tiny package and runs this. Greedy decoding
(`temperature: 0`, an extension sent with `extra_body`) makes the length known: every
non-streamed file must hold `--expect-samples` samples at 24 kHz. Covers
`client.audio.speech.create(...)` in every format (and the default, mp3),
`client.audio.speech.with_streaming_response.create(...)` streamed to a file, raw
(`stream_format="audio"`) and SSE (`stream_format="sse"`) streaming, `speed`, OpenAI's model and
voice names (`tts-1` with `alloy` speaks as the voice alloy maps to), `client.models.list()` /
`retrieve()` with NotFoundError for an unknown id, and the SDK's error types for a refused format
and an unknown voice.

Validation: wav with the `wave` module (rate, width, channels, frame count), pcm by length,
the compressed formats by magic bytes and a non-trivial size. Prints one line per check,
then "N passed, M failed"; exits non-zero on any failure. No pytest needed.
"""

import argparse
import base64
import json
import os
import sys
import wave

import openai
from openai import OpenAI

from harness import Cases  # tests/python, this script's folder

TEXT = "Hello world, this is a test."
RATE = 24_000
FORMATS = ("mp3", "opus", "flac", "wav", "pcm")
# 2.4 s of speech is far more than this in any of the compressed formats.
MIN_COMPRESSED_BYTES = 1_000


def magic_ok(fmt, data):
    if fmt == "mp3":
        # An ID3 tag or an MPEG audio frame sync.
        return data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0)
    if fmt == "opus":
        return data[:4] == b"OggS" and data[28:36] == b"OpusHead"
    if fmt == "flac":
        return data[:4] == b"fLaC"
    raise ValueError(fmt)


def wav_frames(path, streamed):
    """Frames of a 16-bit mono 24 kHz WAV. A streamed WAV's header says "unknown length"
    (0xFFFFFFFF), so its frames are counted by reading them."""
    with wave.open(path, "rb") as w:
        assert w.getnchannels() == 1, w.getnchannels()
        assert w.getsampwidth() == 2, w.getsampwidth()
        assert w.getframerate() == RATE, w.getframerate()
        if not streamed:
            return w.getnframes()
        return len(w.readframes(1 << 30)) // 2


def validate(path, fmt, samples, streamed=False, tolerance=0):
    with open(path, "rb") as f:
        data = f.read()
    if fmt == "wav":
        n = wav_frames(path, streamed)
        assert abs(n - samples) <= tolerance, f"wav: {n} frames, expected {samples}"
    elif fmt == "pcm":
        assert len(data) % 2 == 0, len(data)
        n = len(data) // 2
        assert abs(n - samples) <= tolerance, f"pcm: {n} samples, expected {samples}"
    else:
        assert magic_ok(fmt, data), f"{fmt}: bad magic {data[:40]!r}"
        assert len(data) >= MIN_COMPRESSED_BYTES, f"{fmt}: only {len(data)} bytes"
    return len(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8880/v1")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--voice", default="test")
    ap.add_argument("--expect-samples", type=int, required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    samples = args.expect_samples
    greedy = {"temperature": 0}
    # The server's key when it has one (OPENAI_API_KEY, as the SDK reads it), else any string.
    key = os.environ.get("OPENAI_API_KEY") or "unused"
    client = OpenAI(base_url=args.base_url, api_key=key, max_retries=0, timeout=120)
    cases = Cases()
    check = cases.check

    def out(name):
        return os.path.join(args.out_dir, name)

    def create(fmt):
        def run():
            kwargs = {} if fmt is None else {"response_format": fmt}
            r = client.audio.speech.create(
                model=args.model, voice=args.voice, input=TEXT, extra_body=greedy, **kwargs
            )
            f = fmt or "mp3"
            path = out(f"create-{fmt or 'default'}.{f}")
            r.write_to_file(path)
            return f"{validate(path, f, samples)} bytes"

        return run

    def streamed(fmt, stream_format=None):
        def run():
            kwargs = {} if stream_format is None else {"stream_format": stream_format}
            path = out(f"stream-{stream_format or 'file'}-{fmt}.{fmt}")
            with client.audio.speech.with_streaming_response.create(
                model=args.model,
                voice=args.voice,
                input=TEXT,
                response_format=fmt,
                extra_body=greedy,
                **kwargs,
            ) as r:
                assert r.status_code == 200, r.status_code
                r.stream_to_file(path)
            return f"{validate(path, fmt, samples, streamed=stream_format == 'audio')} bytes"

        return run

    def sse():
        audio = bytearray()
        deltas = 0
        done = None
        with client.audio.speech.with_streaming_response.create(
            model=args.model,
            voice=args.voice,
            input=TEXT,
            response_format="pcm",
            stream_format="sse",
            extra_body=greedy,
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream"), r.headers
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[len("data: ") :])
                if event["type"] == "speech.audio.delta":
                    audio += base64.b64decode(event["audio"])
                    deltas += 1
                elif event["type"] == "speech.audio.done":
                    done = event
                else:
                    raise AssertionError(f"unexpected event {event}")
        assert done is not None, "no speech.audio.done"
        assert deltas > 1, deltas
        assert len(audio) == 2 * samples, (len(audio), samples)
        usage = done["usage"]
        assert usage["output_tokens"] * 480 == samples, usage
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], usage
        return f"{deltas} deltas, {usage['output_tokens']} codes"

    def speed():
        r = client.audio.speech.create(
            model=args.model,
            voice=args.voice,
            input=TEXT,
            response_format="wav",
            speed=2.0,
            extra_body=greedy,
        )
        path = out("speed2.wav")
        r.write_to_file(path)
        validate(path, "wav", samples // 2, tolerance=samples // 50)

    def refused(kwargs, words):
        def run():
            try:
                client.audio.speech.create(
                    model=args.model, input=TEXT, **{"voice": args.voice, **kwargs}
                )
            except openai.BadRequestError as e:
                assert e.status_code == 400, e.status_code
                body = e.body if isinstance(e.body, dict) else {}
                msg = body.get("message", "")
                for w in words:
                    assert w in msg, (w, msg)
                return e.code
            raise AssertionError("expected a 400")

        return run

    for fmt in (None,) + FORMATS:
        check(f"speech.create response_format={fmt or 'default (mp3)'}", create(fmt))
    for fmt in FORMATS:
        check(f"with_streaming_response.create response_format={fmt}", streamed(fmt))
    for fmt in FORMATS:
        check(f"stream_format=audio response_format={fmt}", streamed(fmt, "audio"))
    check("stream_format=sse", sse)
    check("speed=2.0 halves the duration", speed)
    check(
        "response_format=aac is refused",
        refused({"response_format": "aac"}, ["aac", "mp3, opus, flac, wav, pcm"]),
    )
    check("an unknown voice is refused", refused({"voice": "nobody"}, ["nobody", "test"]))

    def openai_names():
        # A default OpenAI client's model and voice speak as the voice the name maps to.
        def wav(model, voice):
            r = client.audio.speech.create(
                model=model, voice=voice, input=TEXT, response_format="wav", extra_body=greedy
            )
            return r.read()

        alias = wav("tts-1", "alloy")
        assert alias == wav(args.model, "jo"), "alloy speaks as jo"
        assert alias[:4] == b"RIFF" and len(alias) > 44 + 2 * 480, len(alias)
        assert wav("gpt-4o-mini-tts", "onyx") == wav(args.model, "dave"), "onyx speaks as dave"
        return f"{len(alias)} bytes"

    def models():
        ids = [m.id for m in client.models.list()]
        for want in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", args.model):
            assert want in ids, (want, ids)
        m = client.models.retrieve("tts-1")
        assert m.id == "tts-1" and m.object == "model", m
        try:
            client.models.retrieve("whisper-1")
        except openai.NotFoundError as e:
            assert e.code == "model_not_found", e.code
            return ", ".join(ids)
        raise AssertionError("expected a 404")

    check("model tts-1 and voice alloy speak as the mapped voice", openai_names)
    check("models.list / models.retrieve, NotFoundError for an unknown id", models)

    def wrong_key():
        bad = OpenAI(base_url=args.base_url, api_key=key + "-wrong", max_retries=0, timeout=120)
        try:
            bad.audio.speech.create(model=args.model, input=TEXT, voice=args.voice)
        except openai.AuthenticationError as e:
            assert e.status_code == 401, e.status_code
            assert e.code == "invalid_api_key", e.code
            return "401 invalid_api_key"
        raise AssertionError("expected a 401")

    if os.environ.get("OPENAI_API_KEY"):
        check("a wrong API key gets AuthenticationError", wrong_key)

    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
