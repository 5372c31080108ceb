#!/usr/bin/env bash
# Builds the onebit-tts container image from a release package, without any container registry:
#   1. the base, onebit-base:bookworm: `debootstrap --variant=minbase bookworm` from the Debian
#      mirror this machine's apt is configured with, then `podman import` (made once: skipped
#      when the image exists; --rebuild-base makes it again);
#   2. `podman build --pull=never --format docker` of deploy/container/Containerfile on it, with
#      the package unpacked into the build context.
#
#   scripts/image.sh [--package TARBALL] [--tag NAME] [--apt "PKG..."] [--rebuild-base]
#   scripts/image.sh --podman-env       print the CONTAINERS_CONF=... this machine's podman
#                                       needs (nothing when it needs none), after the checks
#
#   --package TARBALL   onebit-tts-VERSION-linux-x86_64[-VARIANT].tar.gz (scripts/package.sh);
#                       default: the newest onebit-tts-*-linux-x86_64.tar.gz in target/dist/
#   --tag NAME          the image's name (default onebit-tts:VERSION, VERSION from the package;
#                       onebit-tts:VERSION-vulkan for a `--features vulkan` package, whose name
#                       ends -linux-x86_64-vulkan.tar.gz)
#   --apt "PKG..."      more Debian packages in the image (a Vulkan package gets libvulkan1 and
#                       mesa-vulkan-drivers without asking)
#   --rebuild-base      make the base image again (a new debootstrap: security updates)
#
# Environment:
#   ONEBIT_BASE_IMAGE      the base's name (onebit-base:bookworm)
#   ONEBIT_DEBIAN_MIRROR   the Debian mirror to bootstrap from (default: the URI the machine's apt
#                          sources give for bookworm, else for its own Debian release)
#   ONEBIT_SETUP_INSTALL=0 never install missing tools, even as root: report and stop
#   ONEBIT_NET_TIMEOUT_S   seconds a download may stall (connect or read) before it is tried
#                          again, by debootstrap's wget and by apt in the build (default 60;
#                          3 tries in all)
#   CONTAINERS_CONF        when set, used as it is (see "podman's configuration" below)
#
# Needs root for debootstrap (and, here, for podman: the base is imported into root's storage).
# Missing tools (podman, debootstrap, runc) are installed with apt-get as root; otherwise the
# script prints the command and stops.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="${ONEBIT_BASE_IMAGE:-onebit-base:bookworm}"
suite=bookworm
net_timeout="${ONEBIT_NET_TIMEOUT_S:-60}"
say() { echo "image: $*" >&2; }
die() { say "$*"; exit 1; }
[[ "$net_timeout" =~ ^[1-9][0-9]{0,3}$ ]] ||
  die "ONEBIT_NET_TIMEOUT_S must be a whole number of seconds, 1-9999 (got '$net_timeout')"

package=""
tag=""
rebuild_base=0
extra_packages=""
podman_env_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --package) package="${2:?--package needs a file}"; shift 2 ;;
    --package=*) package="${1#*=}"; shift ;;
    --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
    --tag=*) tag="${1#*=}"; shift ;;
    --apt) extra_packages+=" ${2:?--apt needs package names}"; shift 2 ;;
    --apt=*) extra_packages+=" ${1#*=}"; shift ;;
    --rebuild-base) rebuild_base=1; shift ;;
    --podman-env) podman_env_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

# --- tools -------------------------------------------------------------------------------------
can_install() {
  [ "$(id -u)" = 0 ] && [ "${ONEBIT_SETUP_INSTALL:-1}" != 0 ] && command -v apt-get >/dev/null
}
need_tools() {  # need_tools CMD:PACKAGE...; installs the missing packages or stops
  local missing=() t
  for t in "$@"; do
    command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if can_install; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    if command -v apt-get >/dev/null; then
      die "missing ${missing[*]}; run:  sudo apt-get install -y --no-install-recommends ${missing[*]}  and then this script again"
    fi
    die "missing ${missing[*]}: install them with your system's package manager, then run this script again"
  fi
}

# --- podman's configuration ------------------------------------------------------------------
# On a cgroup v1 machine, or one whose root lacks CAP_SYS_RESOURCE (these CI machines: both),
# podman 4.3 fails to start any container: its default rlimits (nofile and nproc at 1048576) are
# above what the process may raise them to ("error setting rlimit type 6/7: operation not
# permitted"), and crun is not there (runc is). There a containers.conf of our own is written
# under the state dir and named by CONTAINERS_CONF for the podman calls of this script and
# scripts/replicas-test.sh only: runc, and both limits at what the runtime may set, the current
# hard limits (nproc at most kernel.pid_max, which podman itself is held to). Nothing of the
# user's is changed; a CONTAINERS_CONF already set is used as it is (but then it must carry
# these settings itself on such a machine).
hard_limit() {  # hard_limit -n|-u CAP
  local v
  v="$(ulimit -H "$1")"
  if [ "$v" = unlimited ] || [ "$v" -gt "$2" ]; then v="$2"; fi
  echo "$v"
}
podman_conf() {
  [ -n "${CONTAINERS_CONF:-}" ] && { echo "$CONTAINERS_CONF"; return; }
  local v1=0 no_sys_resource=0 eff
  [ -e /sys/fs/cgroup/cgroup.controllers ] || v1=1
  eff="$(awk '/^CapEff:/ {print $2}' /proc/self/status 2>/dev/null || echo 0)"
  (( (16#${eff:-0} >> 24) & 1 )) || no_sys_resource=1
  if [ "$v1" = 0 ] && [ "$no_sys_resource" = 0 ]; then
    return 0
  fi
  local dir="${XDG_STATE_HOME:-${HOME:-/root}/.local/state}/onebit-tts/podman"
  local pid_max nofile nproc
  pid_max="$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)"
  nofile="$(hard_limit -n 1048576)"
  nproc="$(hard_limit -u "$pid_max")"
  mkdir -p "$dir"
  cat > "$dir/containers.conf.tmp" <<EOF
# Written by onebit-tts's scripts/image.sh for this machine (cgroup v1: $v1, no CAP_SYS_RESOURCE:
# $no_sys_resource); used through CONTAINERS_CONF by its podman calls only.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
EOF
  mv "$dir/containers.conf.tmp" "$dir/containers.conf"
  echo "$dir/containers.conf"
}

need_tools podman:podman runc:runc
conf="$(podman_conf)"
if [ -n "$conf" ]; then
  export CONTAINERS_CONF="$conf"
fi
if [ "$podman_env_only" = 1 ]; then
  [ -n "$conf" ] && printf 'CONTAINERS_CONF=%q\n' "$conf"
  exit 0
fi

# --- the package ---------------------------------------------------------------------------
if [ -z "$package" ]; then
  # shellcheck disable=SC2012  # the names are onebit-tts-VERSION-linux-x86_64.tar.gz
  package="$(ls -t "${CARGO_TARGET_DIR:-$root/target}"/dist/onebit-tts-*-linux-x86_64.tar.gz \
    2>/dev/null | head -1 || true)"
  [ -n "$package" ] || die "no release package found; make one with scripts/package.sh, or pass --package FILE"
fi
[ -f "$package" ] || die "no such package: $package"
package="$(realpath "$package")"
# One top directory onebit-tts-VERSION/ holding bin/onebit-tts.
top="$({ tar -tzf "$package" || true; } | head -1)"
top="${top%%/*}"
[[ "$top" =~ ^onebit-tts-([0-9][^/]*)$ ]] || die "$package: its top directory is \"$top\", not onebit-tts-VERSION"
version="${BASH_REMATCH[1]}"
# A variant package (scripts/package.sh --features vulkan) says so after the architecture.
variant=""
if [[ "$(basename "$package")" =~ -linux-x86_64-([A-Za-z0-9_]+)\.tar\.gz$ ]]; then
  variant="${BASH_REMATCH[1]}"
fi
case "$variant" in
  vulkan) extra_packages="libvulkan1 mesa-vulkan-drivers$extra_packages" ;;
esac
tag="${tag:-onebit-tts:$version${variant:+-$variant}}"

# --- the base image ------------------------------------------------------------------------
# The first URI the machine's apt sources give for a suite (deb822 .sources first, then the
# one-line format). Nothing is assumed about the mirror's name.
apt_uri() {
  local want="$1" f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    awk -v want="$want" '
      function flush() {
        if (!done && uris != "" && index(" " suites " ", " " want " ") && index(" " types " ", " deb ")) {
          split(uris, u, " "); print u[1]; done = 1
        }
        uris = ""; suites = ""; types = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { key = tolower($1); $1 = "" }
      key == "uris:" { uris = $0 } key == "suites:" { suites = $0 } key == "types:" { types = $0 }
      END { flush() }' "$f"
  done
  { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } |
    awk -v want="$want" '$1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i + 1) == want) print $i
    }'
}
debian_mirror() {
  if [ -n "${ONEBIT_DEBIAN_MIRROR:-}" ]; then echo "$ONEBIT_DEBIAN_MIRROR"; return; fi
  local m codename=""
  m="$(apt_uri "$suite" | head -1)"
  if [ -z "$m" ] && [ -r /etc/os-release ] && grep -qx 'ID=debian' /etc/os-release; then
    # shellcheck disable=SC1091
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    [ -n "$codename" ] && m="$(apt_uri "$codename" | head -1)"
  fi
  echo "$m"
}

base_work=""
# A debootstrap killed midway can leave proc/sys/dev mounted in the root file system: unmount
# what is under the work directory (deepest first), and never cross into another file system.
remove_base_work() {
  [ -n "$base_work" ] && [ -d "$base_work" ] || return 0
  local m
  awk -v w="$base_work/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$base_work"
  base_work=""
}

make_base() {
  [ "$(id -u)" = 0 ] || die "making the base image runs debootstrap, which needs root: run this script as root (or with sudo)"
  need_tools debootstrap:debootstrap
  local mirror security rootfs t0
  mirror="$(debian_mirror)"
  [ -n "$mirror" ] || die "no Debian mirror in this machine's apt sources (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list); set ONEBIT_DEBIAN_MIRROR=URL"
  security="$(apt_uri "$suite-security" | head -1)"
  # One private directory for the root file system, debootstrap's log and its wgetrc, removed
  # on every way out (global: the EXIT trap runs after this function has returned).
  base_work="$(mktemp -d "${TMPDIR:-/var/tmp}/onebit-base.XXXXXX")"
  trap remove_base_work EXIT
  rootfs="$base_work/rootfs"
  mkdir "$rootfs"
  t0=$SECONDS
  # debootstrap downloads with wget, whose defaults wait 15 minutes on a stalled read and try 20
  # times: a mirror that stops answering would hang the build for hours. Its own wgetrc bounds
  # each wait and try (wget reads $WGETRC; debootstrap passes the environment on).
  printf '%s\n' "timeout = $net_timeout" "tries = 3" "waitretry = 5" "retry_connrefused = on" \
    > "$base_work/wgetrc"
  say "making $base: debootstrap --variant=minbase $suite from $mirror (about a minute)"
  WGETRC="$base_work/wgetrc" debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" \
    > "$base_work/debootstrap.log" 2>&1 ||
    { tail -20 "$base_work/debootstrap.log" >&2; die "debootstrap failed"; }
  # The image's apt sources: the same mirror with the updates suite, and the security mirror
  # where the machine has one, so the build can install and upgrade.
  rm -f "$rootfs/etc/apt/sources.list"
  {
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$mirror" "$suite" "$suite"
    if [ -n "$security" ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$security" "$suite"
    fi
  } > "$rootfs/etc/apt/sources.list.d/debian.sources"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
  tar --numeric-owner -C "$rootfs" -c . |
    podman import --change 'CMD ["/bin/bash"]' \
      --change "LABEL org.opencontainers.image.description=Debian $suite minbase (debootstrap)" \
      - "$base" >/dev/null
  remove_base_work
  trap - EXIT
  say "made $base in $((SECONDS - t0)) s"
}

if [ "$rebuild_base" = 1 ] || ! podman image exists "$base"; then
  make_base
else
  say "base $base exists (--rebuild-base makes it again)"
fi

# --- the image -----------------------------------------------------------------------------
ctx="$(mktemp -d "${TMPDIR:-/var/tmp}/onebit-image.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/onebit-tts"
tar -xzf "$package" -C "$ctx/onebit-tts" --strip-components=1 --no-same-owner
[ -x "$ctx/onebit-tts/bin/onebit-tts" ] || die "$package has no $top/bin/onebit-tts"
cp "$root/deploy/container/healthcheck.sh" "$ctx/"
chmod 0755 "$ctx/healthcheck.sh"
read -r -a extra <<< "$extra_packages"
t0=$SECONDS
say "building $tag from $(basename "$package") on $base${extra[0]:+ (with ${extra[*]})}"
podman build --pull=never --format docker --layers \
  --build-arg BASE="$base" --build-arg VERSION="$version" \
  --build-arg EXTRA_PACKAGES="${extra[*]}" --build-arg NET_TIMEOUT="$net_timeout" \
  -f "$root/deploy/container/Containerfile" -t "$tag" "$ctx" >&2
# The binary runs in the image (its libraries resolve there).
podman run --rm --network none --health-cmd none "$tag" --version >&2 || die "the image's onebit-tts does not run"
say "built $tag in $((SECONDS - t0)) s ($(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}'))"
echo "$tag"
