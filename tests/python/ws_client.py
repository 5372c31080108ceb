#!/usr/bin/env python3
"""The `websockets` package as a client of `onebit-tts serve`'s WebSocket route
(`GET /v1/audio/speech/stream`, docs/api.md "WebSocket"):

    python tests/python/ws_client.py --host 127.0.0.1 --port PORT --key KEY

tests/openai_sdk.rs starts the server on the tiny package (with an API key) and runs this.
Checks: a sentence written in 10 chunks, as a language model writes it, whose first sentence's
audio arrives before the last chunk is sent; every sentence's PCM is exactly its codes (480
samples of 16-bit mono each); `speech.done` then a normal close (1000); `input_text.flush`
speaks a sentence with no end mark; each sentence's `speech.timing` (its codes x 20 ms); WAV sessions give one complete WAV per sentence; and bad
messages end the session with an `error` event and the close code that names the fault (1007
not JSON or a bad field, 1008 an unknown type, 1003 a binary frame, 1009 text over the input
limit); no key is a 401 before the upgrade. Prints one line per check, then "N passed,
M failed"; exits non-zero on any failure.
"""

import argparse
import asyncio
import json
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from harness import Cases  # tests/python, this script's folder

BYTES_PER_CODE = 480 * 2
TIMEOUT = 120
TEXT = "The first sentence is here, spoken early. The second one follows it to the end."


def chunks(text, n):
    """`text` in `n` pieces of about equal length, as a model streams it."""
    step = -(-len(text) // n)
    return [text[i : i + step] for i in range(0, len(text), step)]


async def recv(ws):
    return await asyncio.wait_for(ws.recv(), TIMEOUT)


async def until_closed(ws):
    """Every message left, then the close code; raises if the server never closes."""
    messages = []
    try:
        while True:
            messages.append(await recv(ws))
    except ConnectionClosed:
        pass
    return messages, ws.close_code


def events(messages):
    return [json.loads(m) for m in messages if isinstance(m, str)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--key", required=True)
    args = p.parse_args()
    url = f"ws://{args.host}:{args.port}/v1/audio/speech/stream"
    auth = {"Authorization": f"Bearer {args.key}"}
    cases = Cases()

    async def streamed():
        pieces = chunks(TEXT, 10)
        assert len(pieces) == 10, pieces
        # The chunk in which the second sentence begins completes the first.
        second_starts = next(i for i, _ in enumerate(pieces) if "".join(pieces[: i + 1]).find(" The second") >= 0)
        async with connect(url, additional_headers=auth) as ws:
            await ws.send(json.dumps({"type": "session.update", "voice": "test", "seed": 3}))
            got = []
            for piece in pieces[: second_starts + 1]:
                await ws.send(json.dumps({"type": "input_text.append", "text": piece}))
            # The first sentence's audio, before the rest of the text is sent.
            while not any(isinstance(m, bytes) for m in got):
                got.append(await recv(ws))
            assert second_starts + 1 < len(pieces), "chunks were left to send"
            for piece in pieces[second_starts + 1 :]:
                await ws.send(json.dumps({"type": "input_text.append", "text": piece}))
            await ws.send(json.dumps({"type": "input_text.done"}))
            rest, code = await until_closed(ws)
        got += rest
        assert code == 1000, code
        evs = events(got)
        kinds = [e["type"] for e in evs]
        assert kinds == [
            "speech.sentence.start",
            "speech.timing",
            "speech.sentence.done",
            "speech.sentence.start",
            "speech.timing",
            "speech.sentence.done",
            "speech.done",
        ], kinds
        assert evs[0]["text"] == "The first sentence is here, spoken early.", evs[0]
        assert evs[3]["text"] == "The second one follows it to the end.", evs[3]
        # Each sentence's timing: one piece from 0, its codes x 20 ms, words estimated.
        for t, done in ((evs[1], evs[2]), (evs[4], evs[5])):
            piece = t["piece"]
            assert t["words_estimated"] is True, t
            assert piece["start"] == 0.0 and piece["codes"] == done["codes"], (t, done)
            assert abs(piece["end"] - done["codes"] * 0.02) < 1e-9, (t, done)
        # Each sentence's binary frames lie between its start and done, and are its codes.
        per = []
        for m in got:
            if isinstance(m, str) and json.loads(m)["type"] == "speech.sentence.start":
                per.append(0)
            elif isinstance(m, bytes):
                per[-1] += len(m)
        codes = [evs[2]["codes"], evs[5]["codes"]]
        assert per == [c * BYTES_PER_CODE for c in codes], (per, codes)
        assert all(c > 0 for c in codes), codes
        return f"first audio before chunk {second_starts + 2} of 10; codes {codes}"

    async def flushed_and_wav():
        async with connect(url, additional_headers=auth) as ws:
            await ws.send(json.dumps({"type": "session.update", "voice": "test", "response_format": "wav"}))
            await ws.send(json.dumps({"type": "input_text.append", "text": "no end mark here"}))
            await ws.send(json.dumps({"type": "input_text.flush"}))
            got = []
            while not (got and isinstance(got[-1], str) and json.loads(got[-1])["type"] == "speech.sentence.done"):
                got.append(await recv(ws))
            wav = b"".join(m for m in got if isinstance(m, bytes))
            assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE", wav[:12]
            await ws.send(json.dumps({"type": "input_text.done"}))
            rest, code = await until_closed(ws)
        assert code == 1000, code
        assert [e["type"] for e in events(rest)] == ["speech.done"], rest
        return f"{len(wav)} bytes of WAV"

    async def refused(messages, want_code, want_error):
        async with connect(url, additional_headers=auth) as ws:
            for m in messages:
                await ws.send(m)
            got, code = await until_closed(ws)
        evs = events(got)
        assert code == want_code, (code, evs)
        assert evs and evs[-1]["type"] == "error", evs
        assert evs[-1]["error"]["code"] == want_error, evs[-1]
        return f"close {code}: {evs[-1]['error']['message'][:60]}"

    async def no_key():
        try:
            async with connect(url):
                pass
        except InvalidStatus as e:
            assert e.response.status_code == 401, e.response.status_code
            return "401"
        raise AssertionError("the upgrade was accepted without a key")

    async def run():
        await cases.check_async("a sentence in 10 chunks is spoken as it completes", streamed)
        await cases.check_async("flush speaks a sentence without an end mark, WAV per sentence", flushed_and_wav)
        await cases.check_async("not JSON: 1007", lambda: refused(["{oops"], 1007, "invalid_json"))
        await cases.check_async(
            "an unknown type: 1008", lambda: refused([json.dumps({"type": "speak"})], 1008, "invalid_value")
        )
        await cases.check_async("a binary frame: 1003", lambda: refused([b"\x00\x01"], 1003, "invalid_type"))
        await cases.check_async(
            "a bad session field: 1007",
            lambda: refused([json.dumps({"type": "session.update", "voice": "test", "speed": 9})], 1007, "invalid_value"),
        )
        await cases.check_async(
            "text over the input limit: 1009",
            lambda: refused(
                [
                    json.dumps({"type": "session.update", "voice": "test"}),
                    json.dumps({"type": "input_text.append", "text": "a" * 5000}),
                ],
                1009,
                "input_too_long",
            ),
        )
        await cases.check_async("no key: 401 before the upgrade", no_key)

    asyncio.run(run())
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
