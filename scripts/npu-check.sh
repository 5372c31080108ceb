#!/usr/bin/env bash
# npu-check.sh — end-to-end proof that onebit-tts serves speech from the NPU on a Strix Halo box.
#
# For the owner of the hardware (CI has no NPU; nothing here has run on an NPU yet). One check
# at a time: it takes a lock (flock on $NPU_CHECK_LOCK) before touching the device. It builds
# the release binary, records `onebit-tts doctor --json`, runs `onebit-tts npu probe --json`
# on the model and one short `onebit-tts say --device npu`, then starts
#   onebit-tts serve --device npu --require-npu --model $MODEL
# in the background, asks for speech, and then checks, printing PASS/FAIL per criterion (WARN
# and INFO lines are recorded, never counted as failures):
#   0. `onebit-tts doctor` (recorded; its FAILs are shown but do not stop the check)
#   p. `onebit-tts npu probe`: residency proven (exit 0) before the server starts
#   c. the probe's "npu_counters": the amdxdna driver's hardware-context counters say the NPU
#      completed commands for the probe's worker during its evidence run (else a WARN with the
#      reason: residency may rest on fdinfo busy time instead, and criterion p decides)
#   s. a short `onebit-tts say --device npu --require-npu --json`: the NPU commands the driver
#      counted for that one request ("npu_commands" > 0; 0 with codes made is a CPU fallback and
#      fails; null, not countable, is a WARN)
#   1. the server becomes healthy
#   2. POST /v1/audio/speech returns a WAV
#   3. the worker child holds /dev/accel/accel0 open (/proc/<pid>/fd)
#   4. the server's log says the worker appended the RyzenAI provider
#   5. /health says residency "state":"proven" (placement by weight + the driver's counters or
#      busy time, from the worker)
#   6. /health's "last_request": the NPU commands of the speech request of 2 (as in s)
#   x. `xrt-smi examine -r aie-partitions`, recorded while the worker holds the NPU: once
#      before the speech request of 2 and once after it (once, after s, with SERVE=0). INFO
#      lines, never a failure by themselves: without xrt-smi they say "unknown"
#   y. contexts survive readings: the session's hardware contexts (/health's residency.ours:
#      the driver's pid and the context ids) that xrt-smi shows before the speech request still
#      show after it (PASS), or one is gone (FAIL). A worker log line saying the driver
#      destroyed the session's contexts (its npu_commands then null) is a FAIL too. Without
#      xrt-smi, without identified contexts, or when xrt-smi's output cannot be read: INFO,
#      not judged (XRT's output format has not been seen here)
#   n. which way the worker told its contexts apart (/health's residency.ours.identified); with
#      CONTAINER=1 a PASS for "creation" (the container's own PID namespace)
#   7. one SIGTERM to the server ends server and worker within the stop grace
#   8. nothing was SIGKILLed on the way down
#   9. the kernel log of the whole run (every line since the lock was taken, not only amdxdna's)
#      has no NPU driver failure and no kernel-wide trouble (Oops, IOMMU faults, hung tasks); it
#      is read after shutdown, because the device's close path is where SIGKILL damage shows up
# Then it writes one JSON report to attach to a bug report ($REPORT): the criteria, doctor's and
# the probe's JSON with their exit codes, the say run's JSON and NPU commands, the server's NPU
# commands, the session's contexts from /health, xrt-smi's outputs before and after the speech
# request, the kernel log window, versions, the server log tail.
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
#   SERVE=0            no server (criteria 1-8, y and n left out): doctor, probe, say, one
#                      xrt-smi reading, kernel log
#   SAY=0              leave out the say run (criterion s)
#   SAY_MAX_CODES      code limit of the say run (default: 200, 4 s of audio)
#   REPORT             where the JSON report goes (default: <work dir>/npu-check-report.json)
#   NPU_CHECK_LOCK     lock file (default: ${XDG_RUNTIME_DIR:-/tmp}/onebit-npu-check.lock)
#   LOCK_WAIT          seconds to wait for a check that holds the lock (default 0: say busy,
#                      exit 3)
#   CONTAINER=1        the check runs inside the npu image (docs/npu.md, "scripts/npu-check.sh"
#                      has the podman line, with the npu overlay's mounts): no build, BIN
#                      defaults to the image's /opt/onebit-tts/bin/onebit-tts, and criterion n
#                      expects the contexts identified by "creation" (the container's own PID
#                      namespace; the driver records host pids; "creation_and_pid" is a WARN).
#                      A container seldom may read the kernel log: criterion 9 then fails, and
#                      the host's log for the run's window (the report's kernel_log.since)
#                      is to be read on the host. The script starts no container
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
CONTAINER="${CONTAINER:-0}"
if [ "$CONTAINER" = 1 ]; then
    # Inside the npu image: its own binary, no cargo.
    BIN="${BIN:-/opt/onebit-tts/bin/onebit-tts}"
    NO_BUILD=1
else
    BIN="${BIN:-$root/target/release/onebit-tts}"
fi
URL="http://$HOST:$PORT"
SERVE="${SERVE:-1}"
SAY="${SAY:-1}"
SAY_MAX_CODES="${SAY_MAX_CODES:-200}"
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
case "$SAY_MAX_CODES" in '' | *[!0-9]*)
    echo "npu-check: SAY_MAX_CODES must be a whole number, not '$SAY_MAX_CODES'" >&2
    exit 2
    ;;
esac
if ! command -v flock >/dev/null; then
    echo "npu-check: flock (util-linux) is needed to keep checks one at a time" >&2
    exit 2
fi
if [ "$SERVE" != 0 ] && ! command -v curl >/dev/null; then
    echo "npu-check: curl is needed to talk to the server (SERVE=0 leaves the server out)" >&2
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
say_rc=""
say_device=""
say_commands=""
server_commands=""
smi_path=""
# One xrt-smi reading per slot: "before" and "after" the speech request (SERVE=0: "after" only).
# record_xrt_smi sets them with printf -v, smi_json reads them by name (${!name}).
smi_rc_before=""
smi_rc_after=""
# shellcheck disable=SC2034  # read by name in smi_json
smi_when_before="" smi_when_after="" smi_names_worker_before="" smi_names_worker_after=""
# The session's contexts as /health names them (residency.ours): the driver's pid, the context
# ids (space-separated) and how they were identified.
ours_pid=""
ours_ids=""
ours_identified=""
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
# Recorded for the report; neither a pass nor a failure.
note() {
    printf 'INFO  %s: %s\n' "$1" "$2"
    record INFO "$1" "$2"
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
json_bool() { case "$1" in true | false) printf '%s' "$1" ;; *) printf 'null' ;; esac; }
read_first() { head -n 1 "$1" 2>/dev/null | tr -d '\n'; }

# One scalar field of a named object in the pretty JSON `npu probe --json` prints (serde's
# to_string_pretty: one key per line, two spaces per level): the first line `"OBJECT": {`, then
# that object's own `"FIELD": value` line, one level deeper (or, for an object written on one
# line, the field on that line). Strings come out without their quotes, null as null; nothing
# when there is no such field.
json_get() { # file object field -> value
    awk -v obj="\"$2\": {" -v key="\"$3\": " '
        !inside && (i = index($0, obj)) {
            rest = substr($0, i + length(obj))
            if ((j = index(rest, key))) {
                v = substr(rest, j + length(key))
                sub(/[,}].*$/, "", v)
                sub(/^"/, "", v)
                sub(/"$/, "", v)
                print v
                exit
            }
            inside = 1; match($0, /^ */); want = RLENGTH + 2; next
        }
        inside {
            match($0, /^ */)
            if (RLENGTH < want) exit
            if (RLENGTH == want && substr($0, want + 1, length(key)) == key) {
                v = substr($0, want + 1 + length(key))
                sub(/,$/, "", v)
                sub(/^"/, "", v)
                sub(/"$/, "", v)
                print v
                exit
            }
        }' "$1" 2>/dev/null
}

# A field of the one-line JSON `say --json` and /health print: its number (or null/true/false),
# or its string without the quotes. The first occurrence: both put the fields this script reads
# ahead of any text a user gave.
flat_num() { grep -o "\"$2\":[0-9a-z]*" "$1" 2>/dev/null | head -n 1 | cut -d: -f2; }
flat_str() { grep -o "\"$2\":\"[^\"]*\"" "$1" 2>/dev/null | head -n 1 | cut -d'"' -f4; }

# /health's residency.ours, the session's hardware contexts as the worker identified them
# (compact JSON, one object without nested ones: {"context_ids":[..],"identified":"..","pid":N},
# in whatever key order): sets ours_pid, ours_ids and ours_identified; nothing when it is null.
read_ours() { # health.json
    local obj
    obj="$(grep -oE '"ours": ?\{[^}]*\}' "$1" 2>/dev/null | head -n 1)"
    [ -n "$obj" ] || return 1
    ours_pid="$(printf '%s' "$obj" | grep -oE '"pid": ?-?[0-9]+' | head -n 1 | grep -oE -- '-?[0-9]+$')"
    ours_ids="$(printf '%s' "$obj" | grep -oE '"context_ids": ?\[[0-9, ]*\]' | head -n 1 |
        sed -e 's/.*\[//' -e 's/\]//' | tr ',' ' ' | tr -s ' ' | sed -e 's/^ //' -e 's/ $//')"
    ours_identified="$(printf '%s' "$obj" | grep -oE '"identified": ?"[a-z_]*"' | head -n 1 | cut -d'"' -f4)"
}

# The (pid, context id) pairs of an `xrt-smi examine -r aie-partitions` text output, one
# "PID CTX" per line. XRT's source (Xilinx/XRT, ReportAiePartitions.cpp, as read there) prints
# each hardware context as a table whose first row is `|PID |Ctx ID |Submissions |...`; only
# rows whose first two cells are whole numbers count. The output of XRT 2.25 itself has not been
# seen here: when no row reads this way, nothing is judged.
smi_pairs() { # file
    sed -n 's/^[[:space:]]*|[[:space:]]*\([0-9][0-9]*\)[[:space:]]*|[[:space:]]*\([0-9][0-9]*\)[[:space:]]*|.*$/\1 \2/p' "$1" 2>/dev/null
}
# Whether the output could be read: rows as above, or XRT's "no hardware contexts" sentence.
smi_readable() { # file
    [ -n "$(smi_pairs "$1")" ] || grep -qi 'no hardware contexts' "$1" 2>/dev/null
}
# Which of the session's context ids (ours_ids, with ours_pid) an output shows, space-separated.
smi_ours() { # file
    local id shown=""
    for id in $ours_ids; do
        if smi_pairs "$1" | grep -qx "$ours_pid $id"; then shown="$shown $id"; fi
    done
    printf '%s' "${shown# }"
}

# xrt-smi's own view of the NPU's hardware contexts (`xrt-smi examine -r aie-partitions`, the
# counters residency reads), from the XRT tree the worker uses: ONEBIT_XRT_ROOT, else XILINX_XRT,
# else /opt/xilinx/xrt, else one on PATH. Recorded per slot ("before" or "after" the speech
# request), never a failure by itself: without xrt-smi the report says "unknown". Whether its
# output names the worker's pid is noted, not judged (inside a container the worker's own pid is
# not the one the driver records); criterion y compares the session's contexts across the two.
record_xrt_smi() { # slot when
    local slot="$1" when="$2" xrt="${ONEBIT_XRT_ROOT:-${XILINX_XRT:-/opt/xilinx/xrt}}" limit=""
    local out="$work/xrt-smi.$1.out" rc names="" ours=""
    printf -v "smi_when_$slot" '%s' "$when"
    if [ -x "$xrt/bin/xrt-smi" ]; then
        smi_path="$xrt/bin/xrt-smi"
    elif smi_path="$(command -v xrt-smi 2>/dev/null)" && [ -n "$smi_path" ]; then
        xrt="$(dirname "$(dirname "$smi_path")")"
    else
        smi_path=""
        note xrt-smi "unknown ($slot): no xrt-smi in $xrt/bin or on PATH"
        return 0
    fi
    if command -v timeout >/dev/null; then limit="timeout 60"; fi
    # An unpacked XRT tree runs only with its own environment; XRT's setup.sh sets the same.
    # shellcheck disable=SC2086  # $limit is empty or two words on purpose
    XILINX_XRT="$xrt" LD_LIBRARY_PATH="$xrt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        $limit "$smi_path" examine -r aie-partitions >"$out" 2>&1
    rc=$?
    printf -v "smi_rc_$slot" '%s' "$rc"
    if [ -n "$worker" ]; then
        if grep -qw "$worker" "$out"; then
            printf -v "smi_names_worker_$slot" true
            names="; it names worker pid $worker"
        else
            printf -v "smi_names_worker_$slot" false
            names="; it does not name worker pid $worker"
        fi
    fi
    if [ -n "$ours_pid" ] && [ -n "$ours_ids" ]; then
        if ! smi_readable "$out"; then
            ours="; its format was not read, so the session's contexts are not looked for"
        else
            ours="; of the session's contexts (pid $ours_pid, [$ours_ids]) it shows [$(smi_ours "$out")]"
        fi
    fi
    if [ "$rc" = 0 ]; then
        note xrt-smi "examine -r aie-partitions answered ($slot: $when)$names$ours; output in the report"
        head -n 30 "$out" | sed 's/^/      /'
    else
        warn xrt-smi "examine -r aie-partitions exit $rc$([ "$rc" = 124 ] && echo ' (timed out after 60 s)') ($slot: $when): $(tail -n 1 "$out" | cut -c1-200)"
    fi
}

# y. The session's hardware contexts survive the worker's own readings around a request (its
# counter reader is an fd of its own; a duplicate of XRT's fd, closed, would destroy them).
contexts_survive() {
    local name="contexts survive readings" destroyed before after id gone=""
    destroyed="$(grep -h -m1 'are gone: the driver destroyed them' "$log" "$work/say.err" 2>/dev/null | head -n 1 | cut -c1-300)"
    if [ -n "$destroyed" ]; then
        fail "$name" "the worker says the driver destroyed its session's hardware contexts (/health npu_commands ${server_commands:-missing}): $destroyed"
        return
    fi
    if [ -z "$ours_pid" ] || [ -z "$ours_ids" ]; then
        note "$name" "unknown: /health names no hardware context of the session (residency.ours is null), so there is nothing to follow"
        return
    fi
    if [ -z "$smi_path" ]; then
        note "$name" "unknown: no xrt-smi to read the contexts with (the session's: pid $ours_pid, [$ours_ids])"
        return
    fi
    if [ "$smi_rc_before" != 0 ] || [ "$smi_rc_after" != 0 ]; then
        note "$name" "not judged: xrt-smi did not answer both times (exit ${smi_rc_before:-not run} before, ${smi_rc_after:-not run} after)"
        return
    fi
    if ! smi_readable "$work/xrt-smi.before.out" || ! smi_readable "$work/xrt-smi.after.out"; then
        note "$name" "not judged: xrt-smi's output has no row this script can read as |PID |Ctx ID | (its format is XRT's; both outputs are in the report)"
        return
    fi
    before="$(smi_ours "$work/xrt-smi.before.out")"
    if [ -z "$before" ]; then
        note "$name" "not judged: xrt-smi before the request shows none of the session's contexts (pid $ours_pid, [$ours_ids]; rows: $(smi_pairs "$work/xrt-smi.before.out" | tr '\n' ';' | cut -c1-200))"
        return
    fi
    after="$(smi_ours "$work/xrt-smi.after.out")"
    for id in $before; do
        case " $after " in *" $id "*) ;; *) gone="$gone $id" ;; esac
    done
    if [ -n "$gone" ]; then
        fail "$name" "context(s) [${gone# }] of pid $ours_pid, shown by xrt-smi before the speech request, are gone after it (after: [$after])"
    else
        pass "$name" "contexts [$before] of pid $ours_pid (/health residency.ours, identified by ${ours_identified:-?}) shown by xrt-smi before and after the speech request"
    fi
}

# n. How the worker told its contexts apart; inside a container (CONTAINER=1) by creation alone.
context_identity() {
    local name="context identity"
    if [ -z "$ours_pid" ]; then
        note "$name" "/health names no hardware context of the session (residency.ours is null; the residency criterion has the reasons)"
    elif [ "$CONTAINER" != 1 ]; then
        note "$name" "${ours_identified:-?}: pid $ours_pid, contexts [$ours_ids]"
    elif [ "$ours_identified" = creation ]; then
        pass "$name" "creation: contexts [$ours_ids], created with the session, under pid $ours_pid as the driver records it (the container's own PID namespace)"
    else
        warn "$name" "${ours_identified:-?} (pid $ours_pid, contexts [$ours_ids]): the container seems to share the host's PID namespace, so the in-container identification was not what this run exercised"
    fi
}

# One xrt-smi reading for the report: its object, or null when the slot never ran.
smi_json() { # slot
    local slot="$1" w="smi_when_$1" r="smi_rc_$1" n="smi_names_worker_$1" when rc names out state
    when="${!w}" rc="${!r}" names="${!n}" out="$work/xrt-smi.$1.out"
    if [ -z "$when" ]; then
        printf 'null'
        return
    fi
    if [ -z "$smi_path" ]; then state=unknown; elif [ -z "$rc" ]; then state=not_run; elif [ "$rc" = 0 ]; then state=answered; else state=failed; fi
    printf '{"path": %s, "state": %s, "when": %s, "exit_code": %s, "names_worker_pid": %s, "ours_contexts": %s, "output": %s}' \
        "$( [ -n "$smi_path" ] && json_str "$smi_path" || printf 'null')" "$(json_str "$state")" \
        "$(json_str "$when")" "$(json_num "$rc")" "$(json_bool "$names")" \
        "$(if [ "$rc" = 0 ] && [ -n "$ours_pid" ] && [ -n "$ours_ids" ] && smi_readable "$out"; then
            printf '[%s]' "$(smi_ours "$out" | tr ' ' ',')"
        else printf 'null'; fi)" \
        "$(json_text "$out")"
}

# The report a user attaches to a bug report: everything this run saw, in one JSON file.
write_report() {
    local rc="$1"
    {
        printf '{\n"tool": "scripts/npu-check.sh",\n'
        printf '"started": %s,\n"finished": %s,\n' "$(json_str "$started")" "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
        printf '"exit_code": %s,\n"ok": %s,\n"failures": %s,\n' "$rc" "$([ "$rc" = 0 ] && echo true || echo false)" "$failures"
        printf '"model": %s,\n"serve": %s,\n"container": %s,\n' "$(json_str "$MODEL")" \
            "$([ "$SERVE" = 0 ] && echo false || echo true)" "$([ "$CONTAINER" = 1 ] && echo true || echo false)"
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
        [ -r "$work/say.err" ] && tail -n 100 "$work/say.err" >"$work/say.err.tail"
        printf '"say": {"exit_code": %s, "device": %s, "npu_commands": %s, "report": %s, "stderr_tail": %s},\n' \
            "$(json_num "$say_rc")" "$( [ -n "$say_device" ] && json_str "$say_device" || printf 'null')" \
            "$(json_num "$say_commands")" "$(json_doc "$work/say.json")" "$(json_text "$work/say.err.tail")"
        printf '"server_npu_commands": %s,\n' "$(json_num "$server_commands")"
        printf '"ours": %s,\n' "$(if [ -n "$ours_pid" ]; then
            printf '{"pid": %s, "context_ids": [%s], "identified": %s}' "$ours_pid" \
                "$(printf '%s' "$ours_ids" | tr ' ' ',')" "$(json_str "$ours_identified")"
        else printf 'null'; fi)"
        printf '"xrt_smi": {"before": %s, "after": %s},\n' "$(smi_json before)" "$(smi_json after)"
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
# The residency's own state: the report has other "state" keys (npu_counters, the counters).
state="$(json_get "$work/probe.json" residency state)"
case "$probe_rc" in
0) pass probe "npu probe: residency ${state:-proven} (exit 0)" ;;
2) fail probe "npu probe: ran, residency ${state:-unproven} (exit 2; reasons in $work/probe.json)" ;;
3) fail probe "npu probe: setup failed (exit 3; $(tail -n 1 "$work/probe.err" 2>/dev/null | cut -c1-200))" ;;
*) fail probe "npu probe: exit $probe_rc ($(tail -n 1 "$work/probe.err" 2>/dev/null | cut -c1-200))" ;;
esac

# c. The amdxdna driver's hardware-context counters in the probe's worker: the first thing to
# look at when residency is not proven. A missing count (no context) counts from 0.
c_state="$(json_get "$work/probe.json" npu_counters state)"
c_pid="$(json_get "$work/probe.json" npu_counters pid)"
c_before="$(json_get "$work/probe.json" npu_counters completions_before)"
c_after="$(json_get "$work/probe.json" npu_counters completions_after)"
c_from="$(json_get "$work/probe.json" npu_counters query) on $(json_get "$work/probe.json" npu_counters driver)"
case "$c_before" in '' | *[!0-9]*) c_base=0 c_before="no context" ;; *) c_base="$c_before" ;; esac
case "$c_state" in
read)
    case "$c_after" in
    '' | *[!0-9]*) warn "npu counters" "probe worker pid $c_pid has no hardware context ($c_from): its model did not reach the NPU" ;;
    *)
        if [ "$c_after" -gt "$c_base" ]; then
            pass "npu counters" "probe worker pid $c_pid: the NPU completed $((c_after - c_base)) commands in its evidence run ($c_before -> $c_after; $c_from)"
        else
            warn "npu counters" "probe worker pid $c_pid: no command completed in its evidence run ($c_before -> $c_after; $c_from)"
        fi
        ;;
    esac
    ;;
'') warn "npu counters" "not in the probe's report (see $work/probe.err)" ;;
*) warn "npu counters" "$c_state: $(json_get "$work/probe.json" npu_counters reason | cut -c1-200)" ;;
esac

# s. One short request through `say`, in its own worker, before the server starts (one NPU
# holder at a time): the commands the driver counted for that request, the same per-request
# evidence the server reports (criterion 6).
if [ "$SAY" != 0 ]; then
    "$BIN" say --model "$MODEL" --device npu --require-npu --voice "$VOICE" \
        --max-new-tokens "$SAY_MAX_CODES" --json --output "$work/say.wav" -- "$TEXT" \
        >"$work/say.json" 2>"$work/say.err"
    say_rc=$?
    say_commands="$(flat_num "$work/say.json" npu_commands)"
    say_device="$(flat_str "$work/say.json" device)"
    if [ "$say_rc" != 0 ]; then
        fail say "say --device npu: exit $say_rc ($(tail -n 1 "$work/say.err" 2>/dev/null | cut -c1-200))"
    else
        case "$say_commands" in
        0) fail say "say on ${say_device:-?}: codes made, but the NPU completed no command for them: a CPU fallback" ;;
        '' | *[!0-9]*) warn say "say on ${say_device:-?}: NPU commands not countable (npu_commands ${say_commands:-missing}: the driver's counters could not be read, no context of the session was identified, or the driver destroyed them; say's log in the report)" ;;
        *) pass say "say on ${say_device:-?}: the NPU completed $say_commands commands for one request ($work/say.json)" ;;
        esac
    fi
fi

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

    # The worker, and the session's contexts as /health names them (fixed once loaded).
    for c in $(children_of "$server"); do
        if tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -qw worker; then
            worker="$c"
        fi
    done
    if [ "$healthy" = 1 ]; then read_ours "$work/health.json"; fi

    # x (before). xrt-smi's view while the worker holds the model, before the speech request.
    if gone "$server"; then
        record_xrt_smi before "server pid $server already gone"
    else
        record_xrt_smi before "before the speech request; server pid $server, worker pid ${worker:-unknown}"
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

    # 3. The worker holds the NPU (looked for again: it may have started late).
    if [ -z "$worker" ]; then
        for c in $(children_of "$server"); do
            if tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -qw worker; then
                worker="$c"
            fi
        done
    fi
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

    # 6. The speech request's own NPU commands, as the server counted them: /health's
    # "last_request" (read in 5, after the request finished).
    if [ "$healthy" = 1 ] && [ "${code:-}" = 200 ]; then
        server_commands="$(flat_num "$work/health.json" npu_commands)"
        case "$server_commands" in
        0) fail "npu commands" "/health last_request: the NPU completed no command for the speech request: a CPU fallback" ;;
        '' | *[!0-9]*) warn "npu commands" "/health last_request: npu_commands ${server_commands:-missing} (not countable: the driver's counters could not be read, no context of the session was identified, or the driver destroyed them: see \"contexts survive readings\")" ;;
        *) pass "npu commands" "/health last_request: the NPU completed $server_commands commands for the speech request" ;;
        esac
    else
        fail "npu commands" "not checked: no speech request finished"
    fi

    # x (after). xrt-smi's view again, after the speech request and the worker's readings
    # around it; then y and n.
    if [ "$healthy" = 1 ] && [ -r "$work/health.json" ]; then read_ours "$work/health.json"; fi
    if gone "$server"; then
        record_xrt_smi after "server pid $server already gone"
    else
        record_xrt_smi after "after the speech request; server pid $server, worker pid ${worker:-unknown}"
    fi
    contexts_survive
    context_identity

    # 7 + 8. One SIGTERM ends everything, nothing SIGKILLed.
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

else
    # x. Nothing of this check holds the NPU now: xrt-smi shows what else does.
    record_xrt_smi after "SERVE=0: no onebit-tts process on the NPU"
fi # SERVE

# 9. The kernel log of the whole run: every line since the lock was taken, not only the lines
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
    if [ "$CONTAINER" = 1 ]; then
        fail "kernel log" "not readable inside the container (kernel.dmesg_restrict); on the host: journalctl -k --since @$start_epoch"
    else
        fail "kernel log" "not readable (run as root, or join systemd-journal/adm; kernel.dmesg_restrict)"
    fi
fi

if [ "$failures" -eq 0 ]; then
    echo "npu-check: all criteria passed (work dir $work)"
    exit 0
fi
echo "npu-check: $failures criteria failed (server log: $log)"
exit 1
