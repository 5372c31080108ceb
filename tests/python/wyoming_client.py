#!/usr/bin/env python3
"""The `wyoming` package (Home Assistant's protocol library) as a client of `onebit-tts serve
--wyoming-uri`:

    python tests/python/wyoming_client.py --host 127.0.0.1 --port PORT

tests/openai_sdk.rs starts the server on the tiny package and runs this. Checks `describe` ->
`info` (one tts program, streaming supported, the installed voices with their languages);
`synthesize` -> `audio-start`, `audio-chunk`s of 16-bit mono PCM at 24 kHz in whole codes,
`audio-stop`; voices by name, by OpenAI alias and by language; the streaming form, where the
first sentence's audio arrives before the rest of the text is sent, Home Assistant's compatibility
`synthesize` inside the stream is ignored, and `synthesize-stopped` ends it; three clients at once;
and bad events (an unknown type, an unknown voice, a line that is not JSON, a chunk outside a
stream) answered with `error` events on a connection that goes on serving. Prints one line per
check, then "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import array
import asyncio
import math
import sys

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from harness import Cases  # tests/python, this script's folder

RATE = 24_000
SAMPLES_PER_CODE = 480
TIMEOUT = 120


async def next_event(client):
    event = await asyncio.wait_for(client.read_event(), TIMEOUT)
    assert event is not None, "the server closed the connection"
    return event


async def read_audio(client):
    """One audio-start .. audio-stop: the PCM bytes and the number of chunks."""
    event = await next_event(client)
    assert AudioStart.is_type(event.type), f"expected audio-start, got {event}"
    start = AudioStart.from_event(event)
    assert (start.rate, start.width, start.channels) == (RATE, 2, 1), start
    pcm = bytearray()
    chunks = 0
    while True:
        event = await next_event(client)
        if AudioStop.is_type(event.type):
            return bytes(pcm), chunks
        assert AudioChunk.is_type(event.type), f"expected audio-chunk, got {event}"
        chunk = AudioChunk.from_event(event)
        assert (chunk.rate, chunk.width, chunk.channels) == (RATE, 2, 1), chunk
        pcm += chunk.audio
        chunks += 1


def check_speech(pcm):
    assert len(pcm) % 2 == 0, len(pcm)
    samples = array.array("h", pcm)
    assert len(samples) > 0 and len(samples) % SAMPLES_PER_CODE == 0, len(samples)
    rms = math.sqrt(sum(s * s for s in samples) / len(samples))
    assert rms > 30, f"silent audio (rms {rms:.1f})"
    return len(samples)


async def connect(args):
    client = AsyncTcpClient(args.host, args.port)
    await client.connect()
    return client


async def main_async(args):
    cases = Cases()
    check = cases.check_async

    async def describe():
        client = await connect(args)
        await client.write_event(Describe().event())
        info = Info.from_event(await next_event(client))
        await client.disconnect()
        assert len(info.tts) == 1, info
        program = info.tts[0]
        assert program.name == "onebit-tts" and program.installed, program
        assert program.supports_synthesize_streaming, program
        voices = {v.name: v.languages for v in program.voices}
        assert voices.get("test") == ["en-us"], voices
        assert voices.get("greta") == ["de"], voices
        return ", ".join(sorted(voices))

    async def synthesize(voice, text="Hello world, this is a test."):
        client = await connect(args)
        await client.write_event(Synthesize(text=text, voice=voice).event())
        pcm, chunks = await read_audio(client)
        await client.disconnect()
        return f"{check_speech(pcm)} samples in {chunks} chunks"

    async def streaming():
        client = await connect(args)
        voice = SynthesizeVoice(name="test")
        await client.write_event(SynthesizeStart(voice=voice).event())
        await client.write_event(
            SynthesizeChunk(text="Hello there, this is the first sentence. And here").event()
        )
        # The first sentence is complete: its audio comes before the rest of the text is sent.
        first, _ = await read_audio(client)
        check_speech(first)
        await client.write_event(SynthesizeChunk(text=" comes the second one.").event())
        # Home Assistant also sends the whole text for servers that do not stream: ignored here.
        await client.write_event(
            Synthesize(
                text="Hello there, this is the first sentence. And here comes the second one.",
                voice=voice,
            ).event()
        )
        await client.write_event(SynthesizeStop().event())
        second, _ = await read_audio(client)
        check_speech(second)
        event = await next_event(client)
        assert SynthesizeStopped.is_type(event.type), f"expected synthesize-stopped, got {event}"
        await client.disconnect()
        return f"{len(first) // 2} + {len(second) // 2} samples, first before the rest was sent"

    async def three_at_once():
        texts = ["One client speaks.", "A second client speaks at the same time.", "And a third."]
        out = await asyncio.gather(
            *(synthesize(SynthesizeVoice(name="test"), text=t) for t in texts)
        )
        return "; ".join(out)

    async def bad_events():
        client = await connect(args)
        codes = []
        await client.write_event(Event(type="transcribe", data={}))
        err = Error.from_event(await next_event(client))
        codes.append(err.code)
        assert err.code == "unknown_event", err
        await client.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event())
        err = Error.from_event(await next_event(client))
        codes.append(err.code)
        assert err.code == "unknown_voice" and "nobody" in err.text, err
        await client.write_event(SynthesizeChunk(text="no stream").event())
        err = Error.from_event(await next_event(client))
        codes.append(err.code)
        assert err.code == "no_stream", err
        # A line that is not JSON: an error, and the next line is read as usual.
        client._writer.write(b"this is not json\n")
        await client._writer.drain()
        err = Error.from_event(await next_event(client))
        codes.append(err.code)
        assert err.code == "bad_event", err
        await client.write_event(Describe().event())
        event = await next_event(client)
        assert Info.is_type(event.type), event
        await client.disconnect()
        return ", ".join(codes) + ", then describe answered"

    await check("describe -> info", describe)
    await check("synthesize with a named voice", lambda: synthesize(SynthesizeVoice(name="test")))
    await check("synthesize with an OpenAI alias", lambda: synthesize(SynthesizeVoice(name="alloy")))
    await check(
        "synthesize by language",
        lambda: synthesize(SynthesizeVoice(language="de"), text="Guten Tag, wie geht es dir?"),
    )
    await check("synthesize without a voice", lambda: synthesize(None))
    await check("streaming synthesis speaks each sentence as it completes", streaming)
    await check("three clients at once", three_at_once)
    await check("bad events get error events and the connection goes on", bad_events)

    return cases.finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
