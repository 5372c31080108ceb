#!/usr/bin/env bash
# Two replicas of the container image behind haproxy, on this machine (what CI runs):
#   scripts/replicas-test.sh TARBALL        (the release package, scripts/package.sh)
#
# 1. builds the image from TARBALL (scripts/image.sh: the Debian base is made once, about 1.5
#    minutes the first time, then reused; the image build reuses its apt layer);
# 2. runs two containers of it with the image's default command (serve on 0.0.0.0:8880 with an
#    API key), published on 127.0.0.1 at two free ports, the generated test package models/tiny
#    mounted read-only at /models/tiny and ONE voice-store directory bind-mounted at /voices in
#    both;
# 3. puts haproxy in front (balance leastconn, option httpchk GET /health, a stats socket; the
#    configuration is the one docs/deploy.md shows, with this run's ports);
# 4. runs tests/python/replicas.py: a voice created through replica 1 spoken through both and
#    through haproxy; replica 2 stopped (podman stop: SIGTERM through tini) under a stream of
#    requests through haproxy, every request counted;
# 5. checks the image's HEALTHCHECK on replica 1 and replica 2's clean exit.
# Containers, haproxy and temporary files are removed on exit, whatever happens.
#
# Environment: ONEBIT_REPLICAS_IMAGE (the tag to build, onebit-tts:replicas-test),
# ONEBIT_REPLICAS_KEEP=1 (leave the temporary directory with the logs), ONEBIT_SETUP_INSTALL=0
# (never install haproxy and the container tools, even as root).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "replicas-test: $*" >&2; }
die() { say "$*"; exit 1; }
[ $# -eq 1 ] || die "usage: scripts/replicas-test.sh TARBALL (onebit-tts-VERSION-linux-x86_64.tar.gz)"
package="$(realpath "$1")"
[ -f "$package" ] || die "no such package: $1"
tag="${ONEBIT_REPLICAS_IMAGE:-onebit-tts:replicas-test}"
model="$(realpath "$root/models/tiny")"
[ -f "$model/genai_config.json" ] || die "no test package in models/tiny: run scripts/gen-test-models.sh"
command -v python3 >/dev/null || die "python3 is required"
t_start=$SECONDS

if ! command -v haproxy >/dev/null; then
  if [ "$(id -u)" = 0 ] && [ "${ONEBIT_SETUP_INSTALL:-1}" != 0 ] && command -v apt-get >/dev/null; then
    say "installing haproxy"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >/dev/null
  else
    die "haproxy is missing; run:  sudo apt-get install -y --no-install-recommends haproxy  and then this script again"
  fi
fi

tmp="$(mktemp -d "${TMPDIR:-/var/tmp}/onebit-replicas.XXXXXX")"
names=("onebit-replica-$$-1" "onebit-replica-$$-2")
haproxy_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local rc=$?
  set +e
  if [ -n "$haproxy_pid" ]; then
    kill "$haproxy_pid" 2>/dev/null
    wait "$haproxy_pid" 2>/dev/null
  fi
  local n
  for n in "${names[@]}"; do
    podman rm -f -t 0 "$n" >/dev/null 2>&1 || true
  done
  if [ "$rc" != 0 ] || [ "${ONEBIT_REPLICAS_KEEP:-0}" = 1 ]; then
    say "logs of this run: $tmp (haproxy.log, replica-*.log)"
    # The voice store belongs to the containers' user: keep only the logs.
    [ "${ONEBIT_REPLICAS_KEEP:-0}" = 1 ] || rm -rf "$tmp/voices"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The image (and podman's configuration for this machine, which every podman call below needs).
# The build's own output goes to image.log; its summary lines are shown.
t0=$SECONDS
"$root/scripts/image.sh" --package "$package" --tag "$tag" > /dev/null 2> "$tmp/image.log" ||
  { tail -30 "$tmp/image.log" >&2; die "the image did not build"; }
grep '^image:' "$tmp/image.log" >&2 || true
t_image=$((SECONDS - t0))
eval "$("$root/scripts/image.sh" --podman-env)"
if [ -n "${CONTAINERS_CONF:-}" ]; then export CONTAINERS_CONF; fi

# Three free loopback ports (replica 1, replica 2, haproxy).
read -r p1 p2 plb < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
key="replicas-test-$$-$RANDOM"
mkdir "$tmp/voices"

# The image's default command (serve --host 0.0.0.0, port 8880 inside, a key required there);
# one thread each (two replicas share this machine's cores); a 2 s shutdown grace so that the
# stop below meets requests it has to cancel as well as requests that finish in time.
# --health-interval disable: no timer for the HEALTHCHECK (podman runs it through systemd, absent
# here); `podman healthcheck run` below runs it once. :U gives the shared voice store to the
# image's user (uid 10001); the model is mounted read-only.
for i in 1 2; do
  port_var="p$i"
  podman run -d --name "${names[$((i - 1))]}" --health-interval disable \
    -p "127.0.0.1:${!port_var}:8880" \
    -v "$model:/models/tiny:ro" -v "$tmp/voices:/voices:U" \
    -e ONEBIT_API_KEYS="$key" -e ONEBIT_THREADS=1 -e ONEBIT_SHUTDOWN_GRACE_S=2 \
    "$tag" > "$tmp/replica-$i.id" 2> "$tmp/replica-$i.run.log" ||
    { cat "$tmp/replica-$i.run.log" >&2; die "replica $i did not start"; }
done

cat > "$tmp/haproxy.cfg" <<EOF
global
    log stderr format raw local0 info
    stats socket $tmp/haproxy.sock mode 600 level admin
    maxconn 1000

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 330s
    timeout server 330s
    timeout queue 30s
    # A refused connection (a replica that stopped listening) is tried again on the other one.
    retries 3
    option redispatch 1

frontend tts
    bind 127.0.0.1:$plb
    default_backend onebit

backend onebit
    balance leastconn
    option httpchk GET /health
    http-check send hdr Host localhost
    http-check expect status 200
    default-server check inter 1s fall 2 rise 2
    http-response set-header X-Served-By %s
    server r1 127.0.0.1:$p1
    server r2 127.0.0.1:$p2
EOF
haproxy -c -q -f "$tmp/haproxy.cfg" || die "haproxy refuses $tmp/haproxy.cfg"
haproxy -db -f "$tmp/haproxy.cfg" > "$tmp/haproxy.log" 2>&1 &
haproxy_pid=$!

t0=$SECONDS
set +e
python3 "$root/tests/python/replicas.py" \
  --r1 "http://127.0.0.1:$p1" --r2 "http://127.0.0.1:$p2" --lb "http://127.0.0.1:$plb" \
  --key "$key" --haproxy-socket "$tmp/haproxy.sock" \
  --stop-r2 "podman stop -t 30 ${names[1]}"
rc=$?
set -e
t_test=$((SECONDS - t0))

# The image's HEALTHCHECK, run once on the replica still serving.
if podman healthcheck run "${names[0]}" >/dev/null 2>"$tmp/healthcheck.log"; then
  echo "PASS healthcheck (the image's HEALTHCHECK on replica 1: healthy)"
else
  echo "FAIL healthcheck: $(grep -v systemd "$tmp/healthcheck.log" | tail -3)"
  rc=1
fi
# Replica 2 stopped by itself on SIGTERM (exit 0, not podman's SIGKILL: 137) and said so.
exit2="$(podman inspect --format '{{.State.ExitCode}}' "${names[1]}" 2>/dev/null || echo none)"
podman logs "${names[1]}" > "$tmp/replica-2.log" 2>&1 || true
podman logs "${names[0]}" > "$tmp/replica-1.log" 2>&1 || true
if [ "$exit2" = 0 ] && grep -q "shutting down" "$tmp/replica-2.log" && grep -q "INFO stopped" "$tmp/replica-2.log"; then
  echo "PASS clean exit (replica 2: SIGTERM, drain, exit 0)"
else
  echo "FAIL clean exit: replica 2 exit code $exit2; its log ends:"
  tail -5 "$tmp/replica-2.log"
  rc=1
fi
say "image ${t_image} s, test ${t_test} s, all $((SECONDS - t_start)) s"
exit "$rc"
