#!/usr/bin/env python3
"""Two onebit-tts replicas behind haproxy: one shared voice store, and a replica stopped under load.

    python3 tests/python/replicas.py --r1 URL --r2 URL --lb URL --key KEY \
        --haproxy-socket PATH --stop-r2 'podman stop -t 30 NAME'

scripts/replicas-test.sh starts the two containers (one voice-store directory bind-mounted into
both), haproxy in front of them (`balance leastconn`, `option httpchk GET /health`, the serving
server's name in an X-Served-By response header, a stats socket) and then runs this. Only the
standard library: the URLs are plain HTTP on 127.0.0.1.

Cases, in order (one line each, then "N passed, M failed"; exit status 1 on any failure):
  ready            both replicas answer /health 200 and haproxy reports both UP (polled, bounded)
  create voice     a consent, then a voice cloned through replica 1 (docs/api.md, "Custom voices")
  speak r1         that voice by id through replica 1: a valid WAV
  speak r2         the same through replica 2, which did not create it: a valid WAV, byte-identical
                   for the same seed (the shared store: a lookup that misses re-reads it)
  listed r2        replica 2's GET /v1/audio/voices lists it
  speak lb         through haproxy, several times: every answer a valid WAV, from both replicas
  drain            a stream of requests through haproxy (short ones and long ones, whole WAVs);
                   once both replicas have served some and replica 2 has requests in flight, it is
                   stopped (SIGTERM: the server closes its listener, lets in-flight requests
                   finish within its shutdown grace, then answers the rest 503). Every request
                   must be a 200 with a valid WAV, or a clean error (the server's JSON error
                   body) only if it was in flight on replica 2 when it stopped; nothing at the
                   connection level (reset, cut body, haproxy's own 502/503/504); haproxy marks
                   replica 2 DOWN and every later request is served by replica 1.
"""

import argparse
import csv
import io
import json
import math
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import wave

from harness import Cases  # tests/python, this script's folder

TRANSCRIPT = "A tone that sweeps up and down, for the test."
SHORT = "Hello there."
# Long enough to still be generating when the stop comes, short enough for the test's budget:
# the tiny model never draws its end token, so a request runs to its code budget (10 codes per
# character + 100).
LONG = ("The replicas share one directory of voices, and a balancer sends each request to the "
        "one with the fewest connections. When one of them is told to stop, it finishes what it "
        "has in hand and takes nothing new.")
SEED = 7


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_until(what, fn, timeout_s, every_s=0.2):
    """Polls fn until it returns a true value (returned) or timeout_s passes (raises)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            got = fn()
            if got:
                return got
        except Exception as e:  # noqa: BLE001 - polling: the last error is reported at the end
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s (last error: {last!r})")
        time.sleep(every_s)


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


def wav_check(data):
    """Frames of a complete 24 kHz mono 16-bit WAV; raises on anything cut or malformed."""
    if len(data) < 44 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"not a WAV ({len(data)} bytes: {data[:16]!r})")
    riff = int.from_bytes(data[4:8], "little")
    if riff + 8 != len(data):
        raise ValueError(f"RIFF size {riff + 8} but {len(data)} bytes")
    with wave.open(io.BytesIO(data)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (24_000, 1, 2):
            raise ValueError(f"format {w.getparams()}")
        n = w.getnframes()
        body = w.readframes(n)
    if n == 0 or len(body) != 2 * n:
        raise ValueError(f"{n} frames declared, {len(body) // 2} present")
    return n


class Client:
    def __init__(self, key, timeout=120):
        self.key = key
        self.timeout = timeout

    def request(self, method, url, body=None, ctype=None):
        """(status, headers, body) for any HTTP answer; connection-level failures raise."""
        req = urllib.request.Request(url, data=body, method=method)
        req.add_header("Authorization", f"Bearer {self.key}")
        if ctype:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, method, url, payload=None):
        body = None if payload is None else json.dumps(payload).encode()
        status, _, data = self.request(method, url, body, "application/json" if body else None)
        return status, data

    def multipart(self, url, fields, files):
        boundary = uuid.uuid4().hex
        out = bytearray()
        for name, value in fields.items():
            out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
                    f"{value}\r\n").encode()
        for name, (filename, data, ctype) in files.items():
            out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; "
                    f"filename=\"{filename}\"\r\nContent-Type: {ctype}\r\n\r\n").encode()
            out += data + b"\r\n"
        out += f"--{boundary}--\r\n".encode()
        status, _, data = self.request("POST", url, bytes(out),
                                       f"multipart/form-data; boundary={boundary}")
        return status, data

    def speak(self, base, voice, text=SHORT):
        payload = {"model": "tts-1", "input": text, "voice": voice, "response_format": "wav",
                   "seed": SEED}
        return self.request("POST", f"{base}/v1/audio/speech", json.dumps(payload).encode(),
                            "application/json")


def health(base):
    with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
        return r.status == 200


def haproxy_stats(sock_path):
    """{server name: row} of the backend servers, from the stats socket's `show stat`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(sock_path)
    s.sendall(b"show stat\n")
    chunks = []
    while True:
        c = s.recv(65536)
        if not c:
            break
        chunks.append(c)
    s.close()
    text = b"".join(chunks).decode().lstrip("# ")
    rows = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("svname") not in ("FRONTEND", "BACKEND"):
            rows[row["svname"]] = row
    return rows


def error_code(data):
    """The server's JSON error code, or None when the body is not the server's error JSON."""
    try:
        err = json.loads(data).get("error")
    except (ValueError, AttributeError):
        return None
    return err.get("code") if isinstance(err, dict) and err.get("message") else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--r1", required=True)
    ap.add_argument("--r2", required=True)
    ap.add_argument("--lb", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--haproxy-socket", required=True)
    ap.add_argument("--stop-r2", required=True, help="shell command that stops replica 2")
    ap.add_argument("--ready-timeout", type=float, default=180)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    client = Client(args.key)
    cases = Cases()
    state = {}

    def ready():
        wait_until("replica 1 /health", lambda: health(args.r1), args.ready_timeout)
        wait_until("replica 2 /health", lambda: health(args.r2), args.ready_timeout)
        up = wait_until("haproxy: both servers UP", lambda: (
            lambda st: st if all(r["status"] == "UP" for r in st.values()) and len(st) == 2
            else None)(haproxy_stats(args.haproxy_socket)), 30)
        return ", ".join(f"{n} {r['status']}" for n, r in sorted(up.items()))

    def create_voice():
        status, data = client.multipart(
            f"{args.r1}/v1/audio/voice_consents", {"name": "Replica test", "language": "en-US"},
            {"recording": ("consent.wav", wav_bytes(1.5, freq=330.0), "audio/wav")})
        assert status == 200, (status, data[:300])
        consent = json.loads(data)["id"]
        name = f"shared_{uuid.uuid4().hex[:8]}"
        status, data = client.multipart(
            f"{args.r1}/v1/audio/voices",
            {"name": name, "consent": consent, "transcript": TRANSCRIPT},
            {"audio_sample": ("sample.wav", wav_bytes(2.0), "audio/wav")})
        assert status == 200, (status, data[:300])
        v = json.loads(data)
        assert v["id"].startswith("voice_") and v["name"] == name, v
        state["voice"] = v["id"]
        return f"{v['id']} ({name}) through replica 1"

    def speak_r1():
        status, _, data = client.speak(args.r1, {"id": state["voice"]})
        assert status == 200, (status, data[:300])
        state["wav"] = data
        return f"{wav_check(data)} samples"

    def speak_r2():
        status, _, data = client.speak(args.r2, {"id": state["voice"]})
        assert status == 200, f"replica 2 answered {status}: {data[:300]!r}"
        n = wav_check(data)
        assert data == state.get("wav"), "not the bytes replica 1 made for the same seed"
        return f"{n} samples, identical to replica 1's"

    def listed_r2():
        status, data = client.json("GET", f"{args.r2}/v1/audio/voices")
        assert status == 200, (status, data[:300])
        ids = [v.get("id") for v in json.loads(data).get("data", [])]
        assert state["voice"] in ids, f"{state['voice']} not among replica 2's {len(ids)} voices"
        return f"{len(ids)} voices listed"

    def speak_lb():
        outcomes = []
        for _ in range(8):
            status, headers, data = client.speak(args.lb, {"id": state["voice"]})
            ok = status == 200 and data == state.get("wav")
            outcomes.append((headers.get("X-Served-By"), status, ok or error_code(data)))
        by = {}
        for server, status, ok in outcomes:
            by.setdefault(server, []).append(status if ok is True else f"{status} {ok}")
        summary = "; ".join(f"{s}: {v}" for s, v in sorted(by.items(), key=str))
        assert all(ok is True for _, _, ok in outcomes), summary
        assert len(by) == 2, f"only {list(by)} answered: {summary}"
        return summary

    def drain():
        results = []  # dicts: start, end, text, server, status, outcome, detail
        lock = threading.Lock()
        stop_stream = threading.Event()
        marks = {}

        def worker(i):
            text = LONG if i % 2 == 1 else SHORT
            while not stop_stream.is_set():
                start = time.monotonic()
                rec = {"start": start, "text": "long" if text is LONG else "short"}
                try:
                    status, headers, data = client.speak(args.lb, "test", text)
                    rec.update(status=status, server=headers.get("X-Served-By"))
                    if status == 200:
                        wav_check(data)
                        rec["outcome"] = "ok"
                    elif rec["server"] and error_code(data):
                        rec.update(outcome="clean_error", detail=error_code(data))
                    else:
                        rec.update(outcome="garbage",
                                   detail=f"{status} from {rec['server'] or 'haproxy'}: "
                                          f"{data[:120]!r}")
                except Exception as e:  # noqa: BLE001 - a connection-level failure is counted
                    rec.update(status=None, server=None, outcome="garbage", detail=repr(e))
                rec["end"] = time.monotonic()
                with lock:
                    results.append(rec)

        threads = [threading.Thread(target=worker, args=(i,), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        # Stop replica 2 once both have served the stream and replica 2 has requests in hand.
        def loaded():
            st = haproxy_stats(args.haproxy_socket)
            with lock:
                served = {s: sum(1 for r in results if r.get("server") == s) for s in st}
            return (all(n >= 2 for n in served.values()) and int(st["r2"]["scur"]) >= 1
                    and st)
        st = wait_until("both replicas serving the stream, replica 2 busy", loaded, 90)
        marks["stop_begin"] = time.monotonic()
        log(f"stopping replica 2 with {st['r2']['scur']} request(s) in flight on it "
            f"({st['r1']['scur']} on replica 1)")
        stopped = subprocess.run(args.stop_r2, shell=True, capture_output=True, text=True)
        marks["stop_end"] = time.monotonic()
        log(f"replica 2 stopped in {marks['stop_end'] - marks['stop_begin']:.2f} s "
            f"(exit {stopped.returncode})")
        wait_until("haproxy: replica 2 DOWN",
                   lambda: haproxy_stats(args.haproxy_socket)["r2"]["status"].startswith("DOWN"),
                   30)
        marks["down"] = time.monotonic()
        log(f"haproxy marked replica 2 DOWN {marks['down'] - marks['stop_begin']:.2f} s "
            "after the stop began")
        with lock:
            before = len(results)
        wait_until("8 more requests after replica 2 went DOWN",
                   lambda: len(results) >= before + 8, 120, every_s=0.1)
        stop_stream.set()
        for t in threads:
            t.join(timeout=180)
        assert not any(t.is_alive() for t in threads), "a client hung"
        assert stopped.returncode == 0, f"stop command failed: {stopped.stderr[-500:]}"

        in_flight_r2 = [r for r in results
                        if r["start"] < marks["stop_begin"] < r["end"] and r.get("server") == "r2"]
        garbage = [r for r in results if r["outcome"] == "garbage"]
        bad_errors = [r for r in results if r["outcome"] == "clean_error"
                      and not (r.get("server") == "r2" and r["start"] < marks["stop_end"])]
        after_down = [r for r in results if r["start"] > marks["down"]]
        wrong_after = [r for r in after_down if r["outcome"] != "ok" or r.get("server") != "r1"]
        counts = {}
        for r in results:
            key = (r.get("server"), r["outcome"], r.get("detail") if r["outcome"] != "garbage"
                   else "")
            counts[key] = counts.get(key, 0) + 1
        log("outcomes: " + "; ".join(f"{s} {o}{(' ' + d) if d else ''}: {n}"
                                     for (s, o, d), n in sorted(counts.items(), key=str)))
        for r in garbage[:10]:
            log(f"  garbage: {r['text']} request, {r['detail']}")
        r2_in_flight = ", ".join(sorted(
            f"{r['text']} {r['outcome']}{(' ' + r['detail']) if r.get('detail') else ''}"
            for r in in_flight_r2)) or "none"
        st = haproxy_stats(args.haproxy_socket)
        redispatched = (f"haproxy retried {st['r2'].get('wretr') or 0} connection(s) to "
                        f"replica 2 and redispatched {st['r2'].get('wredis') or 0} to replica 1")
        summary = (f"{len(results)} requests: {sum(r['outcome'] == 'ok' for r in results)} valid "
                   f"WAVs, {sum(r['outcome'] == 'clean_error' for r in results)} clean errors, "
                   f"{len(garbage)} connection-level failures; in flight on replica 2 at the "
                   f"stop: {r2_in_flight}; {len(after_down)} after DOWN, all from r1: "
                   f"{not wrong_after}; {redispatched}")
        assert not garbage, summary
        assert not bad_errors, f"errors outside replica 2's in-flight requests: {summary}"
        assert not wrong_after, summary
        return summary

    cases.check("ready", ready)
    cases.check("create voice", create_voice)
    if "voice" in state:
        cases.check("speak r1", speak_r1)
        cases.check("speak r2 (voice created on r1)", speak_r2)
        cases.check("listed r2 (voice created on r1)", listed_r2)
        cases.check("speak lb (voice created on r1)", speak_lb)
    cases.check("drain (replica 2 stopped under load)", drain)
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
