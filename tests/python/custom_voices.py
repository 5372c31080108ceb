#!/usr/bin/env python3
"""OpenAI's custom-voice API with the official Python SDK against a running `onebit-tts serve`.

    python tests/python/custom_voices.py --base-url http://127.0.0.1:PORT/v1 --state FILE \
        --phase create|restarted

tests/openai_sdk.rs starts the server on the tiny package (whose codec names a tiny encoder) with
a fresh voice store and `--max-upload-mb 1`, runs the `create` phase, restarts the server on the
same store and runs the `restarted` phase.

create: `client.audio.voice_consents.create` (a WAV recording) and its list / retrieve / update;
`client.audio.voices.create` with the transcript as an extra form field (`extra_body`), then
speech with the new voice by id (`voice={"id": ...}`) and by name, byte-identical for one seed;
the refusals: no transcript, an empty one, not audio, a file over the limit (413), a sample too
long, a name taken (409), an unknown consent, a prompt-made voice; deleting a shipped voice (403);
a second voice made and deleted (then refused in speech). Writes the voice's id and the consent's
to FILE.

restarted (the server now also maps the alias narrator to the voice): the voice and consent
from FILE are still there, the voice speaks, by the alias too, and cannot be deleted while the
alias names it.

Prints one line per check, then "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import io
import json
import math
import os
import sys
import wave

import openai
from openai import OpenAI

from harness import Cases  # tests/python, this script's folder

TRANSCRIPT = "A tone that sweeps up and down, for the test."


def wav_bytes(seconds, rate=16_000, freq=220.0):
    """A mono 16-bit WAV of a sweeping tone with a little deterministic noise."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        state = 12345
        frames = bytearray()
        for i in range(int(seconds * rate)):
            t = i / rate
            state = (state * 1103515245 + 12345) & 0x7FFFFFFF
            noise = (state / 0x7FFFFFFF - 0.5) * 0.1
            x = 0.4 * math.sin(2 * math.pi * (freq + 200 * math.sin(t)) * t) + noise
            frames += int(max(-1, min(1, x)) * 32767).to_bytes(2, "little", signed=True)
        w.writeframes(bytes(frames))
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--phase", choices=["create", "restarted"], required=True)
    args = ap.parse_args()
    key = os.environ.get("OPENAI_API_KEY") or "unused"
    client = OpenAI(base_url=args.base_url, api_key=key, max_retries=0, timeout=120)
    cases = Cases()
    check = cases.check

    def speak(voice, seed=7):
        return client.audio.speech.create(
            model="tts-1", voice=voice, input="Hello there.", response_format="wav",
            extra_body={"seed": seed}).content

    def valid_wav(data):
        with wave.open(io.BytesIO(data)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24_000, 1, 2)
            assert w.getnframes() > 0 and w.getnframes() % 480 == 0, w.getnframes()
            return w.getnframes()

    def refused(error_type, status, param, code, **kwargs):
        try:
            client.audio.voices.create(**kwargs)
        except error_type as e:
            assert e.status_code == status, e.status_code
            err = e.body if isinstance(e.body, dict) else {}
            assert err.get("param") == param and err.get("code") == code, e.body
            return f"{status} {code}: {err.get('message')}"
        raise AssertionError(f"not refused: {kwargs.get('name')}")

    state = {}
    sample = wav_bytes(2.0)

    if args.phase == "create":
        def consent():
            c = client.audio.voice_consents.create(
                name="Ana (test)", language="en-US",
                recording=("consent.wav", wav_bytes(1.5, freq=330.0), "audio/wav"))
            assert c.object == "audio.voice_consent" and c.id.startswith("cons_"), c
            assert (c.name, c.language) == ("Ana (test)", "en-US"), c
            state["consent"] = c.id
            listed = client.audio.voice_consents.list(limit=10)
            assert [x.id for x in listed.data] == [c.id], listed
            got = client.audio.voice_consents.retrieve(c.id)
            assert got.id == c.id and got.created_at == c.created_at, got
            renamed = client.audio.voice_consents.update(c.id, name="Ana M.")
            assert renamed.name == "Ana M." == client.audio.voice_consents.retrieve(c.id).name
            return c.id

        def create():
            v = client.audio.voices.create(
                name="ana", consent=state["consent"],
                audio_sample=("ana.wav", sample, "audio/wav"),
                extra_body={"transcript": TRANSCRIPT})
            assert v.object == "audio.voice" and v.id.startswith("voice_"), v
            assert (v.name, v.type) == ("ana", "audio_sample"), v
            state["voice"] = v.id
            listed = client.get("/audio/voices", cast_to=object)
            assert v.id in [x["id"] for x in listed["data"]], listed["data"]
            assert listed["cloning"]["available"] is True, listed["cloning"]
            return v.id

        def speaks():
            by_id = speak({"id": state["voice"]})
            by_name = speak("ana")
            n = valid_wav(by_id)
            assert by_id == by_name, "the id and the name are the same voice"
            return f"{n} samples"

        def missing_transcript():
            return refused(openai.BadRequestError, 400, "transcript", "missing_required_parameter",
                           name="bob", consent=state["consent"],
                           audio_sample=("bob.wav", sample, "audio/wav"))

        def empty_transcript():
            return refused(openai.BadRequestError, 400, "transcript", "empty_transcript",
                           name="bob", consent=state["consent"],
                           audio_sample=("bob.wav", sample, "audio/wav"),
                           extra_body={"transcript": "  "})

        def not_audio():
            return refused(openai.BadRequestError, 400, "audio_sample", "invalid_audio",
                           name="bob", consent=state["consent"],
                           audio_sample=("bob.wav", b"this is not audio at all" * 100, "audio/wav"),
                           extra_body={"transcript": TRANSCRIPT})

        def too_big():
            big = wav_bytes(40.0)  # 1.28 MB: over the server's --max-upload-mb 1
            return refused(openai.APIStatusError, 413, "audio_sample", "file_too_large",
                           name="bob", consent=state["consent"],
                           audio_sample=("bob.wav", big, "audio/wav"),
                           extra_body={"transcript": TRANSCRIPT})

        def too_long():
            long = wav_bytes(31.0, rate=8_000)  # 31 s in 0.5 MB
            return refused(openai.BadRequestError, 400, "audio_sample", "audio_too_long",
                           name="bob", consent=state["consent"],
                           audio_sample=("bob.wav", long, "audio/wav"),
                           extra_body={"transcript": TRANSCRIPT})

        def too_short():
            return refused(openai.BadRequestError, 400, "audio_sample", "audio_too_short",
                           name="bob", consent=state["consent"],
                           audio_sample=("bob.wav", wav_bytes(0.5), "audio/wav"),
                           extra_body={"transcript": TRANSCRIPT})

        def name_taken():
            return refused(openai.ConflictError, 409, "name", "voice_exists",
                           name="jo", consent=state["consent"],
                           audio_sample=("jo.wav", sample, "audio/wav"),
                           extra_body={"transcript": TRANSCRIPT})

        def alias_or_id_names():
            alias = refused(openai.ConflictError, 409, "name", "voice_exists",
                            name="alloy", consent=state["consent"],
                            audio_sample=("a.wav", sample, "audio/wav"),
                            extra_body={"transcript": TRANSCRIPT})
            refused(openai.BadRequestError, 400, "name", "invalid_value",
                    name=state["voice"], consent=state["consent"],
                    audio_sample=("a.wav", sample, "audio/wav"),
                    extra_body={"transcript": TRANSCRIPT})
            return alias

        def long_transcript():
            return refused(openai.BadRequestError, 400, "transcript", "transcript_too_long",
                           name="bob", consent=state["consent"],
                           audio_sample=("bob.wav", sample, "audio/wav"),
                           extra_body={"transcript": "word " * 2000})

        def unknown_consent():
            return refused(openai.BadRequestError, 400, "consent", "consent_not_found",
                           name="bob", consent="cons_0123456789abcdef",
                           audio_sample=("bob.wav", sample, "audio/wav"),
                           extra_body={"transcript": TRANSCRIPT})

        def prompt_voice():
            return refused(openai.BadRequestError, 400, "type", "invalid_value",
                           name="bob", type="prompt", prompt="a warm voice")

        def shipped_stays():
            try:
                client.audio.voices.delete("test")
            except openai.PermissionDeniedError as e:
                assert e.body.get("code") == "voice_not_removable", e.body
                return e.body.get("message")
            raise AssertionError("a shipped voice was deleted")

        def delete_one():
            v = client.audio.voices.create(
                name="gone", consent=state["consent"],
                audio_sample=("gone.wav", wav_bytes(1.5, freq=150.0), "audio/wav"),
                extra_body={"transcript": TRANSCRIPT, "language": "de-DE"})
            assert client.get(f"/audio/voices/{v.id}", cast_to=object)["language"] == "de"
            valid_wav(speak({"id": v.id}))
            d = client.audio.voices.delete(v.id)
            assert (d.id, d.deleted, d.object) == (v.id, True, "audio.voice.deleted"), d
            try:
                speak({"id": v.id})
            except openai.BadRequestError as e:
                assert e.body.get("code") == "unknown_voice", e.body
                return "deleted, then refused in speech"
            raise AssertionError("a deleted voice still speaks")

        check("voice_consents.create / list / retrieve / update", consent)
        check("voices.create with the transcript as an extra form field", create)
        check("the new voice speaks by id and by name, identically", speaks)
        check("no transcript: 400 naming it", missing_transcript)
        check("an empty transcript: 400", empty_transcript)
        check("not audio: 400", not_audio)
        check("over the upload limit: 413", too_big)
        check("a sample too long: 400", too_long)
        check("a sample too short: 400", too_short)
        check("a taken name: 409", name_taken)
        check("an alias's name (alloy) or a voice id as a name: 409 / 400", alias_or_id_names)
        check("a transcript over max_input_chars: 400", long_transcript)
        check("an unknown consent: 400", unknown_consent)
        check("a prompt-made voice: 400", prompt_voice)
        check("a shipped voice cannot be deleted: 403", shipped_stays)
        check("voices.delete removes a voice at once", delete_one)
        with open(args.state, "w") as f:
            json.dump(state, f)
    else:
        with open(args.state) as f:
            state = json.load(f)

        def still_there():
            c = client.audio.voice_consents.retrieve(state["consent"])
            assert c.name == "Ana M.", c
            v = client.get(f"/audio/voices/{state['voice']}", cast_to=object)
            assert v["name"] == "ana" and v["consent"] == state["consent"], v
            return f"{v['id']}, {v['reference_seconds']:.2f} s"

        def speaks_again():
            return f"{valid_wav(speak({'id': state['voice']}))} samples"

        def aliased():
            # The restarted server maps the alias narrator to the cloned voice.
            assert speak("narrator") == speak({"id": state["voice"]})
            try:
                client.audio.voices.delete(state["voice"])
            except openai.ConflictError as e:
                assert e.body.get("code") == "voice_aliased", e.body
                return e.body.get("message")
            raise AssertionError("an aliased voice was deleted")

        check("the voice and its consent survive a restart", still_there)
        check("the voice speaks after the restart", speaks_again)
        check("an alias names the cloned voice, which then cannot be deleted: 409", aliased)

    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
