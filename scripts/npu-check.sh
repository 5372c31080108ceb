#!/usr/bin/env bash
# npu-check.sh — end-to-end proof that onebit-tts serves speech from the NPU on a Strix Halo box.
#
# For the owner of the hardware (CI has no NPU). It builds the release binary, starts
#   onebit-tts serve --device npu --require-npu --model $MODEL
# in the background, asks for speech, and then checks, printing PASS/FAIL per criterion:
#   0. `onebit-tts doctor` (recorded; its FAILs are shown but do not stop the check)
#   1. the server becomes healthy
#   2. POST /v1/audio/speech returns a WAV
#   3. the worker child holds /dev/accel/accel0 open (/proc/<pid>/fd)
#   4. the server's log says the worker appended the RyzenAI provider
#   5. /health says "npu residency: proven"
#   6. one SIGTERM to the server ends server and worker within the stop grace
#   7. nothing was SIGKILLed on the way down
#   8. the kernel log has no amdxdna errors since the start (read after shutdown, because the
#      device's close path is where SIGKILL damage shows up)
# Exit status: 0 when every criterion passed, 1 otherwise, 2 on bad usage.
#
# Environment:
#   MODEL     model package directory (required)
#   VOICE     voice name (default: test)
#   TEXT      text to speak (default: a short sentence)
#   PORT      port to serve on (default: 18089); HOST (default: 127.0.0.1)
#   ONEBIT_RYZENAI_ROOT, ONEBIT_XRT_ROOT, ONEBIT_BACKEND_STOP_GRACE_S   passed through as is
#   ONEBIT_LOG         log filter for the server (default: info; the worker's lines need info)
#   NO_BUILD=1         use the binary as built (BIN, default target/release/onebit-tts)
#   HEALTH_TIMEOUT     seconds to wait for /health (default: 300; first NPU loads compile)
#   SERVE_EXTRA_ARGS   extra words for `onebit-tts serve` (word-split)
#
# It never SIGKILLs anything: if the server or worker outlives the check it says so and leaves
# them, because SIGKILL of an NPU holder has left amdxdna errors and once panicked a machine.

set -u -o pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2

MODEL="${MODEL:-}"
VOICE="${VOICE:-test}"
TEXT="${TEXT:-The quick brown fox jumps over the lazy dog.}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-18089}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-300}"
GRACE="${ONEBIT_BACKEND_STOP_GRACE_S:-30}"
case "$GRACE" in '' | *[!0-9]*) GRACE=30 ;; esac
BIN="${BIN:-$root/target/release/onebit-tts}"
URL="http://$HOST:$PORT"

if [ -z "$MODEL" ]; then
    echo "usage: MODEL=<model package dir> [VOICE=name] $0" >&2
    exit 2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/npu-check.XXXXXX")"
log="$work/server.log"
failures=0
server=""
worker=""

pass() { printf 'PASS  %s: %s\n' "$1" "$2"; }
fail() {
    printf 'FAIL  %s: %s\n' "$1" "$2"
    failures=$((failures + 1))
}
info() { printf '      %s\n' "$*"; }

# A pid counts as gone when /proc has no entry or it is a zombie (ours, not yet waited for).
gone() {
    local st
    [ -r "/proc/$1/stat" ] || return 0
    st="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
    [ -z "$st" ] || [ "$st" = Z ]
}

# Children of a pid, from /proc (no dependence on pgrep or CONFIG_PROC_CHILDREN).
children_of() {
    local f ppid
    for f in /proc/[0-9]*/stat; do
        ppid="$(sed 's/.*) //' "$f" 2>/dev/null | cut -d' ' -f2)"
        [ "$ppid" = "$1" ] && basename "$(dirname "$f")"
    done
}

holds_accel() {
    local fd
    for fd in /proc/"$1"/fd/*; do
        [ "$(readlink "$fd" 2>/dev/null)" = /dev/accel/accel0 ] && return 0
    done
    return 1
}

# The kernel log since the check started: the journal when readable, else the lines dmesg added.
kernel_log_since_start() {
    # journalctl exits 0 with nothing to show when it may not read the kernel's entries, so it
    # counts only if it shows at least one kernel line of this boot.
    if [ -n "$(journalctl -k -b -q --no-pager -n 1 2>/dev/null)" ] &&
        journalctl -k -q --no-pager -o short-monotonic --since "@$start_epoch" >"$work/klog" 2>/dev/null; then
        echo journal
    elif dmesg >"$work/dmesg.after" 2>/dev/null; then
        tail -n +"$((dmesg_lines + 1))" "$work/dmesg.after" >"$work/klog"
        echo dmesg
    else
        return 1
    fi
}

# On an early exit: one SIGTERM to a server still running, never SIGKILL.
cleanup() {
    if [ -n "$server" ] && ! gone "$server"; then
        kill -TERM "$server" 2>/dev/null
        info "sent SIGTERM to server $server on exit; not waiting, not SIGKILLing (log: $log)"
    fi
}
trap cleanup EXIT

echo "npu-check: model $MODEL, voice $VOICE, grace ${GRACE}s, work dir $work"

# 0. Build.
if [ "${NO_BUILD:-0}" != 1 ]; then
    if cargo build --release >"$work/build.log" 2>&1; then
        pass build "cargo build --release"
    else
        fail build "cargo build --release failed (tail of $work/build.log below)"
        tail -n 20 "$work/build.log" | sed 's/^/      /'
        exit 1
    fi
fi
if [ ! -x "$BIN" ]; then
    fail build "$BIN is missing"
    exit 1
fi

# The doctor's view of this box, kept with the result (FAILs are shown, the check goes on:
# the server's own criteria below are what decide).
if "$BIN" doctor --json >"$work/doctor.json" 2>"$work/doctor.err"; then
    pass doctor "no FAIL ($work/doctor.json)"
else
    "$BIN" doctor 2>/dev/null | grep '^FAIL' | sed 's/^/      /'
    info "doctor reports FAILs (above; $work/doctor.json); going on"
fi

start_epoch="$(date +%s)"
dmesg_lines="$( (dmesg 2>/dev/null || true) | wc -l)"

# shellcheck disable=SC2086  # SERVE_EXTRA_ARGS is word-split on purpose
ONEBIT_LOG="${ONEBIT_LOG:-info}" NO_COLOR=1 "$BIN" serve --device npu --require-npu --model "$MODEL" \
    --host "$HOST" --port "$PORT" ${SERVE_EXTRA_ARGS:-} >"$log" 2>&1 &
server=$!
info "server pid $server, log $log"

# 1. Health.
healthy=0
deadline=$(($(date +%s) + HEALTH_TIMEOUT))
while [ "$(date +%s)" -lt "$deadline" ]; do
    if gone "$server"; then break; fi
    if curl -fsS -m 5 "$URL/health" >"$work/health.json" 2>/dev/null; then
        healthy=1
        break
    fi
    sleep 1
done
if [ "$healthy" = 1 ]; then
    pass health "$URL/health answered after $(($(date +%s) - start_epoch)) s"
else
    if gone "$server"; then
        fail health "the server exited before it was healthy (tail of its log below)"
    else
        fail health "no answer from $URL/health within ${HEALTH_TIMEOUT}s (tail of its log below)"
    fi
    tail -n 30 "$log" | sed 's/^/      /'
fi

# 2. Speech.
if [ "$healthy" = 1 ]; then
    esc_text="$(printf '%s' "$TEXT" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    esc_voice="$(printf '%s' "$VOICE" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    body="{\"input\":\"$esc_text\",\"voice\":\"$esc_voice\",\"response_format\":\"wav\"}"
    code="$(curl -sS -m 600 -o "$work/speech.wav" -w '%{http_code}' \
        -H 'Content-Type: application/json' -d "$body" "$URL/v1/audio/speech" 2>"$work/curl.err")"
    size="$(wc -c <"$work/speech.wav" 2>/dev/null || echo 0)"
    if [ "$code" = 200 ] && [ "$(head -c 4 "$work/speech.wav")" = RIFF ] &&
        [ "$(dd if="$work/speech.wav" bs=1 skip=8 count=4 2>/dev/null)" = WAVE ] && [ "$size" -gt 44 ]; then
        pass speech "HTTP 200, WAV of $size bytes ($work/speech.wav)"
    else
        fail speech "HTTP ${code:-none}, $size bytes: $(head -c 300 "$work/speech.wav" 2>/dev/null; cat "$work/curl.err")"
    fi
else
    fail speech "skipped: server not healthy"
fi

# 3. The worker holds the NPU.
for c in $(children_of "$server"); do
    if tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -qw worker; then
        worker="$c"
    fi
done
if [ -z "$worker" ]; then
    fail "accel held" "no worker child of server pid $server"
elif holds_accel "$worker"; then
    pass "accel held" "worker pid $worker has /dev/accel/accel0 open"
else
    fail "accel held" "worker pid $worker does not hold /dev/accel/accel0 (CPU fallback?)"
fi

# 4. The worker appended the provider (not merely tried to register it).
appended='execution provider RyzenAILightExecutionProvider appended'
if grep -q "$appended" "$log"; then
    pass provider "$(grep -m1 "$appended" "$log" | sed 's/.*\(execution provider\)/\1/' | cut -c1-160)"
else
    fail provider "the log never says '$appended'$(grep -m1 -E 'RyzenAI provider|No RyzenAI devices' "$log" | sed 's/^/: /' | cut -c1-200)"
fi

# 5. Residency as the server proves it.
if [ "$healthy" = 1 ] && curl -fsS -m 5 "$URL/health" >"$work/health.json" 2>/dev/null &&
    grep -q 'npu residency: proven' "$work/health.json"; then
    pass residency "/health: npu residency: proven"
else
    fail residency "/health: $(grep -o 'npu residency[^"]*' "$work/health.json" 2>/dev/null || head -c 300 "$work/health.json" 2>/dev/null)"
fi

# 6 + 7. One SIGTERM ends everything, nothing SIGKILLed.
if gone "$server"; then
    fail shutdown "the server was already gone before SIGTERM"
else
    t0="$(date +%s)"
    kill -TERM "$server"
    deadline=$((t0 + GRACE + 10))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if gone "$server" && { [ -z "$worker" ] || gone "$worker"; }; then break; fi
        sleep 0.2
    done
    took=$(($(date +%s) - t0))
    if gone "$server" && { [ -z "$worker" ] || gone "$worker"; }; then
        wait "$server"
        rc=$?
        server=""
        if [ "$took" -le "$GRACE" ]; then
            pass shutdown "server and worker gone ${took}s after one SIGTERM (server exit status $rc)"
        else
            fail shutdown "gone only after ${took}s, beyond the ${GRACE}s grace"
        fi
        if [ "$rc" = 137 ] || grep -qE 'SIGKILL sent|ended: signal 9|exited: signal 9|SIGKILLed after|NOT sending SIGKILL' "$log"; then
            fail "no SIGKILL" "something was (or had to be) SIGKILLed (server status $rc; see $log)"
        else
            pass "no SIGKILL" "$(grep -m1 -E 'worker pid [0-9]+: ended after SIGTERM|worker pid [0-9]+ exited' "$log" | cut -c1-160)"
        fi
    else
        left="server $server"
        [ -n "$worker" ] && ! gone "$worker" && left="$left, worker $worker"
        fail shutdown "still running ${took}s after SIGTERM: $left (left running, not SIGKILLed)"
        fail "no SIGKILL" "not checked: shutdown did not finish"
        server=""
    fi
fi

# 8. Kernel log since the start.
if src="$(kernel_log_since_start)"; then
    # The known failures, then any other amdxdna/aie2 line that reports an error; each once.
    bad="$({
        grep -E 'aie2_check_protocol|firmware is not alive|HW Context is not ready|Map host buf failed|Resume failed' "$work/klog"
        grep -iE 'amdxdna|aie2' "$work/klog" | grep -iE 'fail|error|timeout|timed out'
    } | awk '!seen[$0]++')"
    if [ -z "$bad" ]; then
        pass "kernel log" "no amdxdna errors since the start ($src)"
    else
        fail "kernel log" "amdxdna errors since the start ($src):"
        printf '%s\n' "$bad" | head -n 20 | sed 's/^/      /'
    fi
else
    fail "kernel log" "not readable (run as root, or join systemd-journal/adm; kernel.dmesg_restrict)"
fi

if [ "$failures" -eq 0 ]; then
    echo "npu-check: all criteria passed (work dir $work)"
    exit 0
fi
echo "npu-check: $failures criteria failed (server log: $log)"
exit 1
