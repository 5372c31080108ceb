#!/usr/bin/env bash
# npu-check.sh — end-to-end proof that onebit-tts serves speech from the NPU on a Strix Halo box.
#
# For the owner of the hardware (CI has no NPU; nothing here has run on an NPU yet). One check
# at a time: it takes a lock (flock on $NPU_CHECK_LOCK) before touching the device. It builds
# the release binary, records `onebit-tts doctor --json`, runs `onebit-tts npu probe --json`
# on the model, then starts
#   onebit-tts serve --device npu --require-npu --model $MODEL
# in the background, asks for speech, and then checks, printing PASS/FAIL per criterion:
#   0. `onebit-tts doctor` (recorded; its FAILs are shown but do not stop the check)
#   p. `onebit-tts npu probe`: residency proven (exit 0) before the server starts
#   1. the server becomes healthy
#   2. POST /v1/audio/speech returns a WAV
#   3. the worker child holds /dev/accel/accel0 open (/proc/<pid>/fd)
#   4. the server's log says the worker appended the RyzenAI provider
#   5. /health says residency "state":"proven" (placement + device activity, from the worker)
#   6. one SIGTERM to the server ends server and worker within the stop grace
#   7. nothing was SIGKILLed on the way down
#   8. the kernel log of the whole run (every line since the lock was taken, not only amdxdna's)
#      has no NPU driver failure and no kernel-wide trouble (Oops, IOMMU faults, hung tasks); it
#      is read after shutdown, because the device's close path is where SIGKILL damage shows up
# Then it writes one JSON report to attach to a bug report ($REPORT): the criteria, doctor's and
# the probe's JSON with their exit codes, the kernel log window, versions, the server log tail.
# Exit status: 0 when every criterion passed, 1 otherwise, 2 on bad usage, 3 when another check
# holds the lock.
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
#   SERVE=0            doctor, probe and kernel log only (no server, criteria 1-7 left out)
#   REPORT             where the JSON report goes (default: <work dir>/npu-check-report.json)
#   NPU_CHECK_LOCK     lock file (default: ${XDG_RUNTIME_DIR:-/tmp}/onebit-npu-check.lock)
#   LOCK_WAIT          seconds to wait for a check that holds the lock (default 0: say busy,
#                      exit 3)
#
# It never SIGKILLs anything: if the server or worker outlives the check it says so and leaves
# them, because SIGKILL of an NPU holder has left amdxdna errors and once panicked a machine. A
# server left running keeps the lock (it inherited it, and it still holds the NPU).

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
SERVE="${SERVE:-1}"
LOCK="${NPU_CHECK_LOCK:-${XDG_RUNTIME_DIR:-/tmp}/onebit-npu-check.lock}"
LOCK_WAIT="${LOCK_WAIT:-0}"

if [ -z "$MODEL" ]; then
    echo "usage: MODEL=<model package dir> [VOICE=name] [SERVE=0] $0" >&2
    exit 2
fi
case "$LOCK_WAIT" in '' | *[!0-9]*)
    echo "npu-check: LOCK_WAIT must be whole seconds, not '$LOCK_WAIT'" >&2
    exit 2
    ;;
esac
if ! command -v flock >/dev/null; then
    echo "npu-check: flock (util-linux) is needed to keep checks one at a time" >&2
    exit 2
fi

# One check at a time on the device: two would mean two NPU holders. The lock is on fd 9, which
# every child inherits; the holder writes its pid into the file so a second run can name it.
if ! exec 9>>"$LOCK"; then
    echo "npu-check: cannot open the lock file $LOCK" >&2
    exit 2
fi
if ! flock -n 9; then
    holder="$(cat "$LOCK" 2>/dev/null)"
    if [ "$LOCK_WAIT" -eq 0 ]; then
        echo "npu-check: busy: another check holds $LOCK${holder:+ (pid $holder, or a server it left running)}; LOCK_WAIT=SECONDS waits for it" >&2
        exit 3
    fi
    echo "npu-check: waiting up to ${LOCK_WAIT}s for $LOCK${holder:+ (held by pid $holder)}"
    if ! flock -w "$LOCK_WAIT" 9; then
        echo "npu-check: busy: $LOCK still held after ${LOCK_WAIT}s" >&2
        exit 3
    fi
fi
printf '%s\n' "$$" >"$LOCK"

# The kernel log window starts here, before anything of this run touches the device.
start_epoch="$(date +%s)"
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
dmesg_lines="$( (dmesg 2>/dev/null || true) | wc -l)"

work="$(mktemp -d "${TMPDIR:-/tmp}/npu-check.XXXXXX")"
log="$work/server.log"
REPORT="${REPORT:-$work/npu-check-report.json}"
criteria="$work/criteria.tsv"
: >"$criteria"
failures=0
server=""
worker=""
doctor_rc=""
probe_rc=""
klog_source=""

# Each criterion is printed and recorded (tab-separated) for the report.
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$(printf '%s' "$3" | tr '\t\n' '  ' | json_clean)" >>"$criteria"; }
pass() {
    printf 'PASS  %s: %s\n' "$1" "$2"
    record PASS "$1" "$2"
}
fail() {
    printf 'FAIL  %s: %s\n' "$1" "$2"
    record FAIL "$1" "$2"
    failures=$((failures + 1))
}
warn() {
    printf 'WARN  %s: %s\n' "$1" "$2"
    record WARN "$1" "$2"
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

# The kernel log since the check started (every line, whatever it is tagged): the journal when
# readable, else the lines dmesg added.
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

# JSON without jq or python (neither is promised on the box): a file's text as one JSON
# string, or its lines as an array. Control characters other than tab/CR/LF are dropped, bytes
# that are not UTF-8 too (iconv -c) where iconv exists.
json_clean() {
    if command -v iconv >/dev/null; then iconv -c -f UTF-8 -t UTF-8 2>/dev/null; else cat; fi |
        LC_ALL=C tr -d '\000-\010\013\014\016-\037\177' |
        LC_ALL=C sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' -e 's/\r/\\r/g'
}
json_text() { # file -> "line\nline"
    printf '"'
    [ -r "$1" ] && json_clean <"$1" | LC_ALL=C sed -e ':a' -e 'N' -e '$!ba' -e 's/\n/\\n/g' | tr -d '\n'
    printf '"'
}
json_str() { # text -> "text"
    local f="$work/.json_str"
    printf '%s' "$1" >"$f"
    json_text "$f"
}
json_lines() { # file -> ["line", ...]
    printf '['
    [ -r "$1" ] && json_clean <"$1" | LC_ALL=C sed -e 's/.*/"&"/' | LC_ALL=C sed -e ':a' -e 'N' -e '$!ba' -e 's/\n/,/g' | tr -d '\n'
    printf ']'
}
# A command's own JSON output, as is when it looks whole (starts with '{', ends with '}'),
# else null (its text is then in the report's *_output string).
json_doc() {
    local first last
    first="$(tr -d ' \t\r\n' <"$1" 2>/dev/null | head -c 1)"
    last="$(tr -d ' \t\r\n' <"$1" 2>/dev/null | tail -c 1)"
    if [ "$first" = "{" ] && [ "$last" = "}" ]; then cat "$1"; else printf 'null'; fi
}
json_num() { case "$1" in '' | *[!0-9]*) printf 'null' ;; *) printf '%s' "$1" ;; esac; }
read_first() { head -n 1 "$1" 2>/dev/null | tr -d '\n'; }

# The report a user attaches to a bug report: everything this run saw, in one JSON file.
write_report() {
    local rc="$1"
    {
        printf '{\n"tool": "scripts/npu-check.sh",\n'
        printf '"started": %s,\n"finished": %s,\n' "$(json_str "$started")" "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
        printf '"exit_code": %s,\n"ok": %s,\n"failures": %s,\n' "$rc" "$([ "$rc" = 0 ] && echo true || echo false)" "$failures"
        printf '"model": %s,\n"serve": %s,\n' "$(json_str "$MODEL")" "$([ "$SERVE" = 0 ] && echo false || echo true)"
        printf '"versions": {"onebit_tts": %s, "kernel": %s, "amdxdna_module": %s, "npu_firmware": %s},\n' \
            "$(json_str "$("$BIN" --version 2>/dev/null | head -n 1)")" "$(json_str "$(uname -r)")" \
            "$(json_str "$(read_first /sys/module/amdxdna/version)")" \
            "$(json_str "$(read_first /sys/class/accel/accel0/device/fw_version)")"
        printf '"environment": {"ONEBIT_RYZENAI_ROOT": %s, "ONEBIT_XRT_ROOT": %s, "XILINX_XRT": %s},\n' \
            "$(json_str "${ONEBIT_RYZENAI_ROOT:-}")" "$(json_str "${ONEBIT_XRT_ROOT:-}")" "$(json_str "${XILINX_XRT:-}")"
        printf '"criteria": ['
        awk -F '\t' '{ printf "%s{\"status\":\"%s\",\"name\":\"%s\",\"detail\":\"%s\"}", (NR > 1 ? "," : ""), $1, $2, $3 }' \
            "$criteria"
        printf '],\n'
        printf '"doctor": {"exit_code": %s, "report": %s, "stderr": %s},\n' \
            "$(json_num "$doctor_rc")" "$(json_doc "$work/doctor.json")" "$(json_text "$work/doctor.err")"
        printf '"probe": {"exit_code": %s, "report": %s, "output": %s, "stderr": %s},\n' \
            "$(json_num "$probe_rc")" "$(json_doc "$work/probe.json")" \
            "$( [ "$(json_doc "$work/probe.json")" = null ] && json_text "$work/probe.json" || printf '""')" \
            "$(json_text "$work/probe.err")"
        printf '"kernel_log": {"source": %s, "since": %s, "lines": %s, "flagged": %s, "other": %s},\n' \
            "$( [ -n "$klog_source" ] && json_str "$klog_source" || printf 'null')" "$(json_str "@$start_epoch")" \
            "$(json_lines "$work/klog")" "$(json_lines "$work/klog.flagged")" "$(json_lines "$work/klog.other")"
        printf '"server_log_tail": %s\n}\n' "$( [ -r "$log" ] && tail -n 200 "$log" >"$work/server.tail" && json_lines "$work/server.tail" || printf '[]')"
    } >"$REPORT.tmp" && mv "$REPORT.tmp" "$REPORT" && echo "npu-check: report $REPORT (attach it to a bug report)"
}

# On exit, early or not: one SIGTERM to a server still running (never SIGKILL), then the report.
cleanup() {
    local rc=$?
    if [ -n "$server" ] && ! gone "$server"; then
        kill -TERM "$server" 2>/dev/null
        info "sent SIGTERM to server $server on exit; not waiting, not SIGKILLing (log: $log)"
    fi
    write_report "$rc"
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
# the probe and the server's own criteria below are what decide).
"$BIN" doctor --json >"$work/doctor.json" 2>"$work/doctor.err"
doctor_rc=$?
if [ "$doctor_rc" = 0 ]; then
    pass doctor "no FAIL ($work/doctor.json)"
else
    grep -A2 '"status": "FAIL"' "$work/doctor.json" | grep '"detail"' | sed 's/^ *"detail": /      /'
    info "doctor exit $doctor_rc: FAILs above (all in $work/doctor.json); going on"
fi

# Residency as `npu probe` proves it, in its own worker, before the server takes the device.
"$BIN" npu probe --json --model "$MODEL" >"$work/probe.json" 2>"$work/probe.err"
probe_rc=$?
state="$(grep -o '"state": *"[a-z]*"' "$work/probe.json" 2>/dev/null | tail -n 1 | sed 's/.*"\([a-z]*\)"$/\1/')"
case "$probe_rc" in
0) pass probe "npu probe: residency ${state:-proven} (exit 0)" ;;
2) fail probe "npu probe: ran, residency ${state:-unproven} (exit 2; reasons in $work/probe.json)" ;;
3) fail probe "npu probe: setup failed (exit 3; $(tail -n 1 "$work/probe.err" 2>/dev/null | cut -c1-200))" ;;
*) fail probe "npu probe: exit $probe_rc ($(tail -n 1 "$work/probe.err" 2>/dev/null | cut -c1-200))" ;;
esac

if [ "$SERVE" != 0 ]; then

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
        grep -q '"state":"proven"' "$work/health.json"; then
        # /health's residency is {"evidence", "reasons", "state"}; "proven" is only ever its state.
        pass residency "/health: residency proven, device $(grep -o '"device":"[^"]*"' "$work/health.json" | head -1)"
    else
        fail residency "/health: $(grep -o '"reasons":\[[^]]*\]' "$work/health.json" 2>/dev/null | head -c 600 || head -c 300 "$work/health.json" 2>/dev/null)"
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

fi # SERVE

# 8. The kernel log of the whole run: every line since the lock was taken, not only the lines
# amdxdna tags (an IOMMU fault or an Oops names the device, or nothing, but not the driver).
known='aie2_check_protocol|firmware is not alive|HW Context is not ready|Map host buf failed|Resume failed|Unknown symbol'
trouble='BUG:|Oops|WARNING: CPU|Call Trace|general protection|IO_PAGE_FAULT|page fault|Kernel panic|blocked for more than|hung_task|iommu.*(fault|error)'
if klog_source="$(kernel_log_since_start)"; then
    # Failures: the known ones, any NPU driver line saying fail/error/timeout, kernel-wide
    # trouble. Each line once, in log order.
    {
        grep -E "$known|$trouble" "$work/klog"
        grep -iE 'xdna|aie2' "$work/klog" | grep -iE 'fail|error|timeout|timed out'
    } | awk '!seen[$0]++' >"$work/klog.flagged.unordered"
    grep -Fxf "$work/klog.flagged.unordered" "$work/klog" | awk '!seen[$0]++' >"$work/klog.flagged"
    # Other lines that say fail/error/timeout: reported, not counted (a USB hiccup is not ours).
    grep -iE 'fail|error|timeout|timed out' "$work/klog" | grep -vFxf "$work/klog.flagged" >"$work/klog.other"
    lines="$(wc -l <"$work/klog")"
    if [ -s "$work/klog.flagged" ]; then
        fail "kernel log" "$(wc -l <"$work/klog.flagged") failure line(s) in the run's $lines kernel log lines ($klog_source):"
        head -n 20 "$work/klog.flagged" | sed 's/^/      /'
    else
        pass "kernel log" "no NPU driver failure or kernel trouble in the run's $lines line(s) ($klog_source)"
    fi
    if [ -s "$work/klog.other" ]; then
        warn "kernel log (other)" "$(wc -l <"$work/klog.other") other line(s) say fail/error/timeout (in the report)"
    fi
else
    klog_source=""
    fail "kernel log" "not readable (run as root, or join systemd-journal/adm; kernel.dmesg_restrict)"
fi

if [ "$failures" -eq 0 ]; then
    echo "npu-check: all criteria passed (work dir $work)"
    exit 0
fi
echo "npu-check: $failures criteria failed (server log: $log)"
exit 1
