#!/usr/bin/env python3
"""`onebit-tts say --captions` read by the captions libraries people use: the SRT with `srt`
(3.5.3), the WebVTT with `webvtt-py` (0.6.0), each checked cue by cue against the JSON timing
document of the same request.

    cargo build
    .onebit/venv/bin/python tests/python/test_captions.py target/debug/onebit-tts models/tiny target/pytest-captions

The request is greedy (the generated package's chains are deterministic), so the three runs make
the same audio and the three files describe the same pieces. A library that is not installed is
a skip here and a failure in CI (scripts/setup.sh installs both).
"""

import html
import os
import shutil
import subprocess
import sys
import wave

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, load_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = Checks()

# Several pieces (a piece of the test voice holds about seven of these sentences), and characters
# that WebVTT must escape.
TEXT = "".join(
    "Sentence %d tells the story of a quiet valley, where the river runs slowly past old stone houses. " % i
    for i in range(20)
) + "Salt & pepper <fine> is served."

# Cue times are written to the millisecond.
MS = 0.0005


def say(binary, model, out, captions):
    cmd = [binary, "say", "-q", "--model", model, "--voice", "test", "--temperature", "0",
           "--no-normalize", "--captions", os.path.join(out, captions),
           "-o", os.path.join(out, "out.wav"), TEXT]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr))
    return os.path.join(out, captions)


def seconds(td):
    return td.total_seconds()


def vtt_seconds(clock):
    """`HH:MM:SS.mmm` as webvtt-py gives a cue's start and end."""
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def compare(name, cues, pieces):
    """cues: (start s, end s, text with lines joined by spaces) per cue."""
    CHECKS.check("%s: one cue per piece" % name, len(cues) == len(pieces),
                 "%d cues, %d pieces" % (len(cues), len(pieces)))
    for i, (cue, p) in enumerate(zip(cues, pieces)):
        start, end, text = cue
        CHECKS.check("%s cue %d: times are the piece's to the millisecond" % (name, i + 1),
                     abs(start - p["start"]) <= MS and abs(end - p["end"]) <= MS,
                     "cue %r..%r, piece %r..%r" % (start, end, p["start"], p["end"]))
        CHECKS.check("%s cue %d: text is the piece's" % (name, i + 1), text == p["text"],
                     "%r != %r" % (text, p["text"]))


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: test_captions.py ONEBIT_TTS_BINARY MODEL_DIR OUT_DIR")
    # The binary runs in the checkout (where voices/ is): paths given relative to here stay right.
    binary, model, out = (os.path.abspath(a) for a in sys.argv[1:])
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)

    doc = load_json(say(binary, model, out, "c.json"))
    pieces = doc["pieces"]
    CHECKS.check("json: several pieces", len(pieces) > 2, "%d" % len(pieces))
    CHECKS.check("json: word times are labelled estimates", doc["words_estimated"] is True)
    with wave.open(os.path.join(out, "out.wav")) as w:
        wav_s = w.getnframes() / w.getframerate()
    CHECKS.check("json: audio_seconds is the WAV's length and the last piece's end",
                 abs(wav_s - doc["audio_seconds"]) < 1e-9
                 and doc["audio_seconds"] == pieces[-1]["end"],
                 "wav %r, doc %r, last end %r" % (wav_s, doc["audio_seconds"], pieces[-1]["end"]))
    CHECKS.check("json: every piece lasts its codes x 20 ms",
                 all(abs(p["end"] - p["start"] - p["codes"] * 0.02) < 1e-9 for p in pieces))

    def with_srt():
        import srt
        with open(say(binary, model, out, "c.srt"), encoding="utf-8") as f:
            subs = list(srt.parse(f.read()))
        compare("srt", [(seconds(s.start), seconds(s.end), " ".join(s.content.split("\n")))
                        for s in subs], pieces)
        CHECKS.check("srt: cues numbered from 1", [s.index for s in subs]
                     == list(range(1, len(subs) + 1)))

    def with_vtt():
        import webvtt
        vtt = webvtt.read(say(binary, model, out, "c.vtt"))
        # webvtt-py gives the cue text as written (lines joined here): the entities are still
        # escaped.
        raw = [" ".join(c.text.split("\n")) for c in vtt.captions]
        CHECKS.check("vtt: &, < and > are escaped",
                     any("Salt &amp; pepper &lt;fine&gt;" in t for t in raw), repr(raw[-1:]))
        compare("vtt", [(vtt_seconds(c.start), vtt_seconds(c.end),
                         html.unescape(" ".join(c.text.split("\n")))) for c in vtt.captions],
                pieces)

    for name, module, fn in [("srt", "srt", with_srt), ("vtt", "webvtt", with_vtt)]:
        try:
            __import__(module)
        except ImportError:
            CHECKS.skip("%s: parsed with the %s package" % (name, module),
                        "python package %s not importable" % module)
            continue
        CHECKS.run_case("%s: parsed with the %s package" % (name, module), fn)

    print("captions: %d passed, %d failed" % (CHECKS.passed, CHECKS.failed))
    sys.exit(1 if CHECKS.failed else 0)


if __name__ == "__main__":
    main()
