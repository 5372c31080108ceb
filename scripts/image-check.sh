#!/usr/bin/env bash
# Offline check of scripts/image.sh's choices per variant and of the Containerfile's Mesa check,
# in about a second, with no root, no podman and no network:
#   1. `scripts/image.sh --dry-run` on stand-in packages (a top directory onebit-tts-0.1.0/ with
#      a shell script as bin/onebit-tts): the base, suite, tag, build target and packages of the
#      cpu, vulkan and npu variants, and the refusals: a variant that does not fit the package,
#      an unknown one, the npu base without ONEBIT_UBUNTU_MIRROR (the message must name it and
#      say why Ubuntu 24.04), with a mirror that is not a URL, without Ubuntu's keyring;
#   2. the Containerfile's MESA_MIN step, run as written with a stand-in dpkg-query: bookworm's
#      Mesa 22.3.6 and 24.0.9 fail the build with the gfx1151 message, 24.1 (an rc too) and
#      trixie's 25.0 pass, and a missing mesa-vulkan-drivers fails;
#   3. the Containerfile's npu stage: the cache directory, its variable and its volume.
# What it cannot check: debootstrap, the mirrors and podman build (building the vulkan image
# here takes minutes: docs/deploy.md, "GPU and NPU variants"); the noble base was never made here.
#
# Usage: scripts/image-check.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "image-check: $*"; }
die() {
  echo "image-check: $*" >&2
  exit 1
}
command -v dpkg >/dev/null || die "needs dpkg (dpkg --compare-versions, as the image build uses it)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/onebit-tts-0.1.0/bin"
printf '#!/bin/sh\necho "onebit-tts 0.1.0 (stand-in)"\n' >"$tmp/onebit-tts-0.1.0/bin/onebit-tts"
chmod +x "$tmp/onebit-tts-0.1.0/bin/onebit-tts"
cpu="$tmp/onebit-tts-0.1.0-linux-x86_64.tar.gz"
vulkan="$tmp/onebit-tts-0.1.0-linux-x86_64-vulkan.tar.gz"
tar -czf "$cpu" -C "$tmp" onebit-tts-0.1.0
cp "$cpu" "$vulkan"
: >"$tmp/empty.gpg"
printf 'not a real keyring: the dry run only checks that the file is there\n' >"$tmp/ubuntu.gpg"

passed=0
# The environment of every run: a base name podman never has (so the base counts as to be made
# and what making it needs is checked), a Debian mirror of its own (not the machine's apt
# sources), and no Ubuntu settings from the caller's environment.
run() { # run NAME EXPECTED_RC [VAR=VALUE...] -- ARGS...; output in $tmp/out
  local name="$1" want="$2" rc=0
  shift 2
  local envs=()
  while [ "$1" != -- ]; do
    envs+=("$1")
    shift
  done
  shift
  env -u ONEBIT_UBUNTU_MIRROR -u ONEBIT_UBUNTU_SECURITY_MIRROR -u ONEBIT_UBUNTU_KEYRING \
    -u ONEBIT_BASE_IMAGE ONEBIT_DEBIAN_MIRROR=http://debian.invalid/debian \
    "${envs[@]}" bash "$root/scripts/image.sh" --dry-run "$@" >"$tmp/out" 2>&1 || rc=$?
  if [ "$want" = 0 ] && [ "$rc" != 0 ]; then
    cat "$tmp/out" >&2
    die "$name: exited $rc, expected success"
  fi
  if [ "$want" != 0 ] && [ "$rc" = 0 ]; then
    cat "$tmp/out" >&2
    die "$name: succeeded, expected a refusal"
  fi
}
expect_grep() { # expect_grep GREP_FLAGS WHAT NAME PATTERN... : each PATTERN is in $tmp/out
  local flags="$1" what="$2" name="$3" pattern
  shift 3
  for pattern in "$@"; do
    grep "$flags" -- "$pattern" "$tmp/out" || {
      cat "$tmp/out" >&2
      die "$name: $what '$pattern'"
    }
  done
  passed=$((passed + 1))
  say "ok   $name"
}
expect() { expect_grep -qxF "no line" "$@"; }            # expect NAME LINE...: each a whole line
expect_text() { expect_grep -qF "the message lacks" "$@"; } # expect_text NAME TEXT...: each occurs
# A base podman surely lacks, so the checks of making it always run.
absent=ONEBIT_BASE_IMAGE=onebit-base:image-check-absent

run cpu 0 "$absent" -- --package "$cpu"
expect "cpu: bookworm, the plain tag" variant=cpu tag=onebit-tts:0.1.0 base=onebit-base:image-check-absent \
  suite=bookworm "base_state=to be made from http://debian.invalid/debian" apt= mesa_min= target=default
run "cpu default base" 0 -- --package "$cpu" --variant cpu
expect "cpu: the base's default name" base=onebit-base:bookworm
run vulkan 0 "$absent" -- --package "$vulkan"
expect "vulkan: trixie, Mesa >= 24.1 checked, vulkaninfo in" variant=vulkan tag=onebit-tts:0.1.0-vulkan \
  suite=trixie "apt=libvulkan1 mesa-vulkan-drivers vulkan-tools" mesa_min=24.1.0 target=default
run "vulkan default base" 0 -- --package "$vulkan" --variant=vulkan --tag my/tts:x --apt "strace"
expect "vulkan: the base's default name, --tag and --apt" base=onebit-base:trixie tag=my/tts:x \
  "apt=libvulkan1 mesa-vulkan-drivers vulkan-tools strace"
run "npu without a mirror" 1 "$absent" -- --package "$cpu" --variant npu
expect_text "npu without a mirror: refused, saying why" ONEBIT_UBUNTU_MIRROR "Ubuntu 24.04" \
  "/lib/x86_64-linux-gnu first on its LD_LIBRARY_PATH" libboost-filesystem1.74.0
run "npu, a mirror that is not a URL" 1 "$absent" ONEBIT_UBUNTU_MIRROR=mirror.example/ubuntu -- \
  --package "$cpu" --variant npu
expect_text "npu: the mirror must be a URL" "ONEBIT_UBUNTU_MIRROR must be an http:// or https:// URL"
run "npu without a keyring" 1 "$absent" ONEBIT_UBUNTU_MIRROR=http://ubuntu.invalid/ubuntu \
  ONEBIT_UBUNTU_KEYRING="$tmp/empty.gpg" -- --package "$cpu" --variant npu
expect_text "npu without Ubuntu's keyring: refused" ONEBIT_UBUNTU_KEYRING
run npu 0 "$absent" ONEBIT_UBUNTU_MIRROR=http://ubuntu.invalid/ubuntu ONEBIT_UBUNTU_KEYRING="$tmp/ubuntu.gpg" -- \
  --package "$cpu" --variant npu
expect "npu: noble, boost 1.74, the npu stage" variant=npu tag=onebit-tts:0.1.0-npu suite=noble \
  "base_state=to be made from http://ubuntu.invalid/ubuntu" apt=libboost-filesystem1.74.0 target=npu
run "npu default base" 0 ONEBIT_UBUNTU_MIRROR=https://ubuntu.invalid/ubuntu ONEBIT_UBUNTU_KEYRING="$tmp/ubuntu.gpg" -- \
  --package "$cpu" --variant npu
expect "npu: the base's default name" base=onebit-base:noble
run "vulkan variant of a cpu package" 1 -- --package "$cpu" --variant vulkan
expect_text "a cpu package is refused as vulkan" "needs a \`--features vulkan\` package"
run "npu variant of a vulkan package" 1 -- --package "$vulkan" --variant npu
expect_text "a vulkan package is refused as npu" "does not fit"
run "cpu variant of a vulkan package" 1 -- --package "$vulkan" --variant cpu
expect_text "a vulkan package is refused as cpu" "does not fit"
run "unknown variant" 1 -- --package "$cpu" --variant rocm
expect_text "an unknown variant is refused" "unknown variant 'rocm'"

# The Containerfile's Mesa step, as written: its RUN line with continuations joined, under sh
# with MESA_MIN set and a dpkg-query that answers the version given (or nothing: not installed).
containerfile="$root/deploy/container/Containerfile"
awk '/^RUN if \[ -n "\$\{MESA_MIN\}" \]/ { on = 1 } on { print } on && !/\\$/ { exit }' "$containerfile" |
  sed 's/^RUN //; s/\\$//' >"$tmp/mesa.sh"
grep -q 'dpkg-query -W' "$tmp/mesa.sh" || die "no MESA_MIN step found in $containerfile"
mkdir "$tmp/shim"
cat >"$tmp/shim/dpkg-query" <<'SH'
#!/bin/sh
[ -n "$FAKE_MESA" ] || exit 1
printf '%s' "$FAKE_MESA"
SH
chmod +x "$tmp/shim/dpkg-query"
mesa() { # mesa VERSION EXPECTED_RC
  local rc=0
  FAKE_MESA="$1" MESA_MIN=24.1.0 PATH="$tmp/shim:$PATH" sh "$tmp/mesa.sh" >"$tmp/out" 2>&1 || rc=$?
  [ "$rc" = "$2" ] || {
    cat "$tmp/out" >&2
    die "the Mesa step with mesa-vulkan-drivers '${1:-(none)}' exited $rc, expected $2"
  }
}
mesa 22.3.6-1+deb12u1 1
expect_text "Mesa 22.3.6 (bookworm) fails the build, saying why" "older than 24.1.0" gfx1151 "Radeon 8060S"
mesa 24.0.9-1 1
expect_text "Mesa 24.0.9 fails the build" "older than 24.1.0"
mesa "" 1
expect_text "no mesa-vulkan-drivers fails the build" "is not installed"
mesa 24.1.0~rc1-1 0
expect_text "Mesa 24.1.0-rc1 passes" "RADV knows gfx1151"
mesa 25.0.7-2 0
expect_text "Mesa 25.0.7 (trixie) passes" "RADV knows gfx1151"
rc=0
MESA_MIN="" PATH="$tmp/shim:$PATH" sh "$tmp/mesa.sh" >"$tmp/out" 2>&1 || rc=$?
if [ "$rc" != 0 ] || [ -s "$tmp/out" ]; then
  die "the Mesa step did something without MESA_MIN (cpu and npu images)"
fi
passed=$((passed + 1))
say "ok   no MESA_MIN: no Mesa check"

# The npu stage: the cache directory made for uid 10001, its variable, its volume, and the plain
# build's target left at the cpu/vulkan image (the last stage).
awk '/^FROM server AS npu/ { on = 1; next } /^FROM / { on = 0 } on' "$containerfile" >"$tmp/npu-stage"
for line in "RUN mkdir -p /var/cache/onebit-tts/npu \\" ' && chown -R onebit:onebit /var/cache/onebit-tts' \
  'ENV ONEBIT_NPU_CACHE_DIR=/var/cache/onebit-tts/npu' 'USER onebit:onebit' \
  'VOLUME ["/var/cache/onebit-tts/npu"]'; do
  grep -qxF -- "$line" "$tmp/npu-stage" || die "the Containerfile's npu stage lacks: $line"
done
[ "$(grep '^FROM ' "$containerfile" | tail -n 1)" = "FROM server AS default" ] ||
  die "the Containerfile's last stage (a plain build's image) is not the server as it is"
passed=$((passed + 1))
say "ok   the npu stage: ONEBIT_NPU_CACHE_DIR, its directory and volume"

echo "image-check: $passed passed, 0 failed"
