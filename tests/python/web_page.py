#!/usr/bin/env python3
"""The server's web page (`GET /`) in a real headless browser: Chromium from the system packages
(`chromium-headless-shell`), driven through the DevTools protocol over a websocket
(`websocket-client`).

    python tests/python/web_page.py --url http://127.0.0.1:PORT/ --key KEY --chromium PATH

tests/openai_sdk.rs starts the server (with an API key) and runs this. The page loads without the
key, lists no voices until the key is entered, then lists them; "Speak" streams 16-bit PCM into
Web Audio as it arrives (first audio and codes/s shown), the player element gets the take as WAV
and plays it (its clock advances), the audio is not silent, and the download, asked as FLAC, is a
valid FLAC file; a voice cloned from the page (consent and sample picked as files) is listed,
selected and speaks; a wrong key shows the server's error. Prints one line per check, then
"N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import base64
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import wave

import websocket

from harness import Cases  # tests/python, this script's folder

TIMEOUT = 120


class Browser:
    def __init__(self, chromium, url):
        self.profile = tempfile.mkdtemp(prefix="onebit-chromium-")
        # Debian's /usr/bin/chromium-headless-shell is a shell script that runs the browser as its
        # child, and the browser has zygote, GPU and renderer children: killing the script alone
        # left them all running, writing into the profile. The browser gets a process group of
        # its own, and this script becomes the subreaper of whatever is orphaned in it, so close()
        # can kill the group and reap every member before it removes the profile.
        PR_SET_CHILD_SUBREAPER = 36
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "--autoplay-policy=no-user-gesture-required",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        # Chromium says where its DevTools endpoint is on stderr.
        deadline = time.time() + 60
        endpoint = None
        while time.time() < deadline and endpoint is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("chromium exited before listening")
            if "DevTools listening on " in line:
                endpoint = line.split("DevTools listening on ", 1)[1].strip()
        if endpoint is None:
            raise RuntimeError("chromium did not start its DevTools endpoint")
        port = endpoint.split("//", 1)[1].split("/", 1)[0]
        req = urllib.request.Request(f"http://{port}/json/new?{url}", method="PUT")
        target = json.load(urllib.request.urlopen(req, timeout=30))
        self.ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=TIMEOUT)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def js(self, expr):
        """Evaluates `expr` (awaiting a promise) and returns its JSON value."""
        r = self.call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, what, limit=TIMEOUT):
        deadline = time.time() + limit
        while time.time() < deadline:
            value = self.js(expr)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def set_file(self, selector, path):
        """Puts a file in a file input, as a user picking it would."""
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.call("DOM.setFileInputFiles", nodeId=node, files=[path])

    def close(self):
        try:
            self.ws.close()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            # Each member's children are handed to this process before the member itself can be
            # reaped, so the group is gone once no child of ours is left in it.
            reaped = 1
            while True:
                try:
                    os.waitpid(-self.proc.pid, 0)
                except ChildProcessError:
                    break
                reaped += 1
            shutil.rmtree(self.profile)
        return f"{reaped} processes reaped, profile removed"


def tone_wav(path, seconds, freq):
    """A 16 kHz mono 16-bit WAV of a sweeping tone."""
    import math
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        frames = bytearray()
        for i in range(int(seconds * 16_000)):
            t = i / 16_000
            x = 0.4 * math.sin(2 * math.pi * (freq + 150 * math.sin(3 * t)) * t)
            frames += int(x * 32767).to_bytes(2, "little", signed=True)
        w.writeframes(bytes(frames))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--chromium", required=True)
    args = ap.parse_args()
    cases = Cases()
    check = cases.check

    b = Browser(args.chromium, args.url)
    try:
        def loads():
            # The new tab starts on about:blank: wait for this page, loaded.
            b.wait(f"location.href === {json.dumps(args.url)} && document.readyState === 'complete'"
                   " && document.title", "the page")
            title = b.js("document.title")
            assert title == "onebit-tts", title
            # Without the key the voices request is refused and the page says why.
            err = b.wait("document.getElementById('error').textContent", "the key error", 30)
            assert "invalid_api_key" in err, err
            return err

        def voices():
            b.js(f"document.getElementById('key').value = {json.dumps(args.key)}; loadVoices()")
            names = b.wait("window.onebitVoices", "the voice list", 30)
            assert "test" in names and "jo" in names, names
            b.js("document.getElementById('voice').value = 'test'")
            return ", ".join(names)

        def speaks():
            b.js("document.getElementById('format').value = 'flac'; "
                 "document.getElementById('speak').click()")
            state = b.wait("window.onebitLast && window.onebitLast.done && window.onebitLast",
                           "the synthesis")
            assert state["error"] is None, state["error"]
            assert state["samples"] > 0 and state["samples"] % 480 == 0, state
            assert state["rms"] > 0.001, f"silent: {state}"
            assert state["firstAudioMs"] is not None and state["firstAudioMs"] > 0, state
            shown = b.js("document.getElementById('ttfa').textContent")
            assert shown.endswith(" ms"), shown
            return (f"{state['samples']} samples, rms {state['rms']:.3f}, first audio "
                    f"{state['firstAudioMs']:.0f} ms, {state['codesPerSecond'] or 0:.1f} codes/s")

        def plays():
            b.js("document.getElementById('player').play()")
            t = b.wait("(() => { const p = document.getElementById('player');"
                       " return p.currentTime > 0.2 && !p.paused && p.currentTime; })()",
                       "the player's clock", 30)
            duration = b.js("document.getElementById('player').duration")
            assert duration > 0.5, duration
            return f"played {t:.2f} s of {duration:.2f} s"

        def download():
            link = b.js("(() => { const a = document.getElementById('download');"
                        " return !a.hidden && a.download; })()")
            assert link == "onebit-tts.flac", link
            data = b.js("(async () => { const b = new Uint8Array(await window.onebitDownload"
                        ".arrayBuffer()); let s = ''; for (const x of b) s += String.fromCharCode(x);"
                        " return btoa(s); })()")
            raw = base64.b64decode(data)
            assert raw[:4] == b"fLaC" and len(raw) > 1000, raw[:16]
            return f"{len(raw)} bytes of FLAC"

        def clone():
            cloning = b.js("window.onebitCloning")
            assert cloning and cloning["available"], cloning
            assert b.js("!document.getElementById('clone').hidden")
            files = tempfile.mkdtemp(prefix="onebit-page-")
            consent, sample = os.path.join(files, "consent.wav"), os.path.join(files, "sample.wav")
            tone_wav(consent, 1.5, 300.0)
            tone_wav(sample, 2.0, 200.0)
            b.js("document.getElementById('clone').open = true; "
                 "document.getElementById('clone-name').value = 'paged'; "
                 "document.getElementById('clone-transcript').value = 'A tone from the page.'")
            b.set_file("#clone-consent", consent)
            b.set_file("#clone-sample", sample)
            b.js("document.getElementById('clone-go').click()")
            state = b.wait("window.onebitClone && window.onebitClone.done && window.onebitClone",
                           "the clone")
            shutil.rmtree(files, ignore_errors=True)
            assert state["error"] is None, state["error"]
            assert "paged" in b.js("window.onebitVoices"), b.js("window.onebitVoices")
            assert b.js("document.getElementById('voice').value") == "paged"
            # The new voice speaks at once.
            b.js("document.getElementById('format').value = 'wav'; "
                 "document.getElementById('speak').click()")
            spoken = b.wait("window.onebitLast && window.onebitLast.done && window.onebitLast",
                            "speech in the new voice")
            assert spoken["error"] is None and spoken["rms"] > 0.001, spoken
            return f"{state['voice']['id']}, then {spoken['samples']} samples in it"

        def wrong_key():
            b.js("document.getElementById('key').value = 'wrong'; "
                 "document.getElementById('speak').click()")
            state = b.wait("window.onebitLast && window.onebitLast.done && window.onebitLast",
                           "the refusal", 30)
            assert state["error"] and "invalid_api_key" in state["error"], state
            return state["error"].split(":")[0]

        check("the page loads without the key and asks for it", loads)
        check("the key lists the voices", voices)
        check("Speak streams non-silent audio and shows first audio and codes/s", speaks)
        check("the player plays the take", plays)
        check("the download is a valid file of the chosen format", download)
        check("a voice cloned from the page speaks at once", clone)
        check("a wrong key shows the server's error", wrong_key)
    finally:
        check("the browser's processes and its profile are gone", b.close)
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
