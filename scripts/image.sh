#!/usr/bin/env bash
# Builds the onebit-tts container image from a release package, without any container registry:
#   1. the base, made once (skipped when the image exists; --rebuild-base makes it again) with
#      `debootstrap --variant=minbase SUITE`, then `podman import`. The suite follows the variant:
#        cpu     onebit-base:bookworm  Debian 12, from the Debian mirror this machine's apt uses;
#        vulkan  onebit-base:trixie    Debian 13, same mirror: its Mesa (25.0) has RADV for
#                                      gfx1151, Strix Halo's Radeon 8060S, which came in Mesa 24.1
#                                      (bookworm's 22.3 does not know the chip);
#        npu     onebit-base:noble     Ubuntu 24.04 from the mirror in ONEBIT_UBUNTU_MIRROR: AMD
#                                      builds XRT and the Ryzen AI libraries for 24.04, and the
#                                      NPU worker puts /lib/x86_64-linux-gnu first on its
#                                      LD_LIBRARY_PATH, so the image's glibc and libstdc++ are
#                                      the ones AMD's libraries get (bookworm's are older); its
#                                      universe has the boost 1.74 AMD asks for;
#   2. `podman build --pull=never --format docker` of deploy/container/Containerfile on it, with
#      the package unpacked into the build context. The vulkan build fails when the installed
#      Mesa is older than 24.1.0.
#
#   scripts/image.sh [--package TARBALL] [--variant cpu|vulkan|npu] [--tag NAME] [--apt "PKG..."]
#                    [--rebuild-base] [--dry-run]
#   scripts/image.sh --podman-env       print the CONTAINERS_CONF=... this machine's podman
#                                       needs (nothing when it needs none), after the checks
#
#   --package TARBALL   onebit-tts-VERSION-linux-x86_64[-VARIANT].tar.gz (scripts/package.sh);
#                       default: the newest onebit-tts-*-linux-x86_64.tar.gz in target/dist/
#   --variant V         cpu (the default), vulkan (the default for a `--features vulkan` package,
#                       whose name ends -linux-x86_64-vulkan.tar.gz, and only for one) or npu
#                       (the default package on the Ubuntu 24.04 base, with a writable NPU
#                       compile cache at /var/cache/onebit-tts/npu)
#   --tag NAME          the image's name (default onebit-tts:VERSION for cpu,
#                       onebit-tts:VERSION-VARIANT otherwise, VERSION from the package)
#   --apt "PKG..."      more packages in the image (vulkan gets libvulkan1, mesa-vulkan-drivers
#                       and vulkan-tools, npu libboost-filesystem1.74.0, without asking)
#   --rebuild-base      make the base image again (a new debootstrap: security updates)
#   --dry-run           check the arguments, the package and what making the base needs, print
#                       the plan, build nothing (no root, no podman needed)
#
# Environment:
#   ONEBIT_BASE_IMAGE      the base's name (default per variant, above); when it does not exist
#                          it is made from the variant's suite
#   ONEBIT_DEBIAN_MIRROR   the Debian mirror to bootstrap bookworm and trixie from (default: the
#                          URI the machine's apt sources give for the suite, else for its own
#                          Debian release)
#   ONEBIT_UBUNTU_MIRROR   the Ubuntu mirror for the npu base (required to make it: no Ubuntu
#                          mirror is assumed), e.g. http://MIRROR/ubuntu; it must carry noble,
#                          noble-updates and noble-security with main and universe
#   ONEBIT_UBUNTU_SECURITY_MIRROR  where noble-security comes from (default ONEBIT_UBUNTU_MIRROR)
#   ONEBIT_UBUNTU_KEYRING  Ubuntu's archive keyring, to check what debootstrap downloads (default
#                          /usr/share/keyrings/ubuntu-archive-keyring.gpg, which Ubuntu's
#                          ubuntu-keyring package installs; Debian has no such package)
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
net_timeout="${ONEBIT_NET_TIMEOUT_S:-60}"
say() { echo "image: $*" >&2; }
die() { say "$*"; exit 1; }
[[ "$net_timeout" =~ ^[1-9][0-9]{0,3}$ ]] ||
  die "ONEBIT_NET_TIMEOUT_S must be a whole number of seconds, 1-9999 (got '$net_timeout')"

package=""
variant_arg=""
tag=""
dry_run=0
rebuild_base=0
extra_packages=""
podman_env_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --package) package="${2:?--package needs a file}"; shift 2 ;;
    --package=*) package="${1#*=}"; shift ;;
    --variant) variant_arg="${2:?--variant needs cpu, vulkan or npu}"; shift 2 ;;
    --variant=*) variant_arg="${1#*=}"; shift ;;
    --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
    --tag=*) tag="${1#*=}"; shift ;;
    --apt) extra_packages+=" ${2:?--apt needs package names}"; shift 2 ;;
    --apt=*) extra_packages+=" ${1#*=}"; shift ;;
    --rebuild-base) rebuild_base=1; shift ;;
    --podman-env) podman_env_only=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
case "$variant_arg" in
  "" | cpu | vulkan | npu) ;;
  *) die "unknown variant '$variant_arg': cpu, vulkan or npu" ;;
esac

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

setup_podman() {
  need_tools podman:podman runc:runc
  conf="$(podman_conf)"
  if [ -n "$conf" ]; then
    export CONTAINERS_CONF="$conf"
  fi
}
if [ "$podman_env_only" = 1 ]; then
  setup_podman
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
pkg_variant=""
if [[ "$(basename "$package")" =~ -linux-x86_64-([A-Za-z0-9_]+)\.tar\.gz$ ]]; then
  pkg_variant="${BASH_REMATCH[1]}"
fi
# The variant: --variant, else the package's. A vulkan image needs a vulkan binary, and a vulkan
# binary (linked to libvulkan.so.1) runs nowhere else; the npu route is in the default build.
variant="${variant_arg:-${pkg_variant:-cpu}}"
case "$variant/$pkg_variant" in
  cpu/ | vulkan/vulkan | npu/ | npu/npu) ;;
  vulkan/*) die "the vulkan variant needs a \`--features vulkan\` package (onebit-tts-VERSION-linux-x86_64-vulkan.tar.gz: scripts/package.sh --features vulkan), not $(basename "$package")" ;;
  *) [ -z "$variant_arg" ] || die "--variant $variant_arg does not fit $(basename "$package"), a ${pkg_variant:-default} package" ;;
esac
# Per variant: the base's distribution and suite, the packages it adds, and the oldest Mesa the
# image may have (checked in the build: deploy/container/Containerfile's MESA_MIN).
distro=debian
mesa_min=""
target=""
case "$variant" in
  vulkan)
    # RADV knows gfx1151 (Strix Halo's Radeon 8060S) from Mesa 24.1.0 on; bookworm has 22.3.6,
    # whose RADV does not list the chip, so Vulkan would find no AMD device. trixie has 25.0.
    suite=trixie
    mesa_min=24.1.0
    extra_packages="libvulkan1 mesa-vulkan-drivers vulkan-tools$extra_packages" ;;
  npu)
    # AMD's Ryzen AI 1.7/1.8 for Linux: Ubuntu 24.04, libboost-filesystem1.74.0 (noble's
    # universe). No Python: the worker loads the venv's libraries, it runs none of its Python.
    distro=ubuntu
    suite=noble
    target=npu
    extra_packages="libboost-filesystem1.74.0$extra_packages" ;;
  *)
    # The release package's promise is glibc 2.34+ and GCC 11's libstdc++: bookworm (2.36, GCC 12)
    # is the system it is built and tested on.
    suite=bookworm ;;
esac
base="${ONEBIT_BASE_IMAGE:-onebit-base:$suite}"
if [ "$variant" = cpu ]; then
  tag="${tag:-onebit-tts:$version}"
else
  tag="${tag:-onebit-tts:$version-$variant}"
fi

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
host_codename() {  # the machine's own Debian release, when it is Debian
  [ -r /etc/os-release ] && grep -qx 'ID=debian' /etc/os-release || return 0
  # shellcheck disable=SC1091
  (. /etc/os-release && echo "${VERSION_CODENAME:-}")
}
# A suite's mirror (or its -security one): what the machine's apt names for that suite, else for
# its own release. A bookworm machine has no trixie source, and Debian's mirrors carry both.
debian_uri() {  # debian_uri SUFFIX ("" or -security)
  local m codename
  m="$(apt_uri "$suite$1" | head -1)"
  if [ -z "$m" ]; then
    codename="$(host_codename)"
    [ -n "$codename" ] && m="$(apt_uri "$codename$1" | head -1)"
  fi
  echo "$m"
}

# Where the base comes from, per distribution: sets mirror, security, keyring, components and
# script, or stops saying what is missing. Run before anything is downloaded.
mirror="" security="" keyring="" components="" script=""
plan_base() {
  if [ "$distro" = ubuntu ]; then
    mirror="${ONEBIT_UBUNTU_MIRROR:-}"
    [ -n "$mirror" ] || die "the $variant image is built on Ubuntu 24.04 (noble), and no Ubuntu mirror is known here: set ONEBIT_UBUNTU_MIRROR=URL (an Ubuntu archive mirror with noble, noble-updates and noble-security, main and universe) to make $base. Why Ubuntu 24.04: AMD builds XRT and the Ryzen AI libraries for it; the NPU worker puts /lib/x86_64-linux-gnu first on its LD_LIBRARY_PATH (AMD's order), so AMD's libraries get the image's glibc and libstdc++, which must be at least 24.04's (Debian 12's glibc 2.36 and GCC 12 are older); and they need libboost-filesystem1.74.0, which noble has and Debian 13 does not"
    [[ "$mirror" =~ ^https?://[^[:space:]]+$ ]] ||
      die "ONEBIT_UBUNTU_MIRROR must be an http:// or https:// URL (got '$mirror')"
    security="${ONEBIT_UBUNTU_SECURITY_MIRROR:-$mirror}"
    [[ "$security" =~ ^https?://[^[:space:]]+$ ]] ||
      die "ONEBIT_UBUNTU_SECURITY_MIRROR must be an http:// or https:// URL (got '$security')"
    # debootstrap checks the Release file's signature with it; without it, it would refuse (or,
    # told not to check, trust whatever the mirror sends).
    keyring="${ONEBIT_UBUNTU_KEYRING:-/usr/share/keyrings/ubuntu-archive-keyring.gpg}"
    [ -s "$keyring" ] || die "no Ubuntu archive keyring at $keyring (debootstrap checks noble's Release file with it): Debian does not package it; copy /usr/share/keyrings/ubuntu-archive-keyring.gpg from an Ubuntu machine (package ubuntu-keyring) and set ONEBIT_UBUNTU_KEYRING=FILE"
    # tini is in universe, and so is libboost-filesystem1.74.0.
    components=main,universe
    # bookworm's debootstrap (1.0.128) has no script named noble; every Ubuntu suite since gutsy
    # uses the one script (jammy's and, in newer debootstraps, noble's are links to it).
    script=/usr/share/debootstrap/scripts/noble
    [ -e "$script" ] || script=/usr/share/debootstrap/scripts/gutsy
  else
    if [ -n "${ONEBIT_DEBIAN_MIRROR:-}" ]; then mirror="$ONEBIT_DEBIAN_MIRROR"; else mirror="$(debian_uri "")"; fi
    [ -n "$mirror" ] || die "no Debian mirror in this machine's apt sources (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list); set ONEBIT_DEBIAN_MIRROR=URL"
    security="$(debian_uri -security)"
    # debootstrap's default keyring, the machine's debian-archive-keyring (bookworm's has had
    # trixie's keys since 2023.3+deb12u1).
    keyring=""
    components=main
    script=""
  fi
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
  plan_base
  [ -z "$script" ] || [ -e "$script" ] || die "debootstrap has no script for $suite ($script)"
  local rootfs t0 signed_by name f args=(--variant=minbase --components="$components")
  [ -z "$keyring" ] || args+=(--keyring="$keyring")
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
  say "making $base: debootstrap --variant=minbase $suite from $mirror (a minute or two)"
  WGETRC="$base_work/wgetrc" debootstrap "${args[@]}" "$suite" "$rootfs" "$mirror" ${script:+"$script"} \
    > "$base_work/debootstrap.log" 2>&1 ||
    { tail -20 "$base_work/debootstrap.log" >&2; die "debootstrap failed"; }
  # The image's apt sources: the same mirror with the updates suite, and the security mirror
  # (the machine's for Debian, where it has one), so the build can install and upgrade. Signed-By
  # names the keyring the base itself installed (trixie's package ships it as .pgp, bookworm's
  # as .gpg); the one debootstrap checked with is copied in when the base has none.
  rm -f "$rootfs/etc/apt/sources.list"
  if [ "$distro" = ubuntu ]; then name=ubuntu; else name=debian; fi
  signed_by=""
  for f in "/usr/share/keyrings/$name-archive-keyring.gpg" "/usr/share/keyrings/$name-archive-keyring.pgp"; do
    [ -s "$rootfs$f" ] && { signed_by="$f"; break; }
  done
  if [ -z "$signed_by" ]; then
    [ -n "$keyring" ] || keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    signed_by="/etc/apt/keyrings/onebit-$name-archive.gpg"
    [[ "$keyring" == *.asc ]] && signed_by="${signed_by%.gpg}.asc"
    mkdir -p "$rootfs/etc/apt/keyrings"
    cp "$keyring" "$rootfs$signed_by"
    chmod 0644 "$rootfs$signed_by"
  fi
  {
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: %s\nSigned-By: %s\n' \
      "$mirror" "$suite" "$suite" "${components//,/ }" "$signed_by"
    if [ -n "$security" ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: %s\nSigned-By: %s\n' \
        "$security" "$suite" "${components//,/ }" "$signed_by"
    fi
  } > "$rootfs/etc/apt/sources.list.d/$name.sources"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
  tar --numeric-owner -C "$rootfs" -c . |
    podman import --change 'CMD ["/bin/bash"]' \
      --change "LABEL org.opencontainers.image.description=${name^} $suite minbase (debootstrap)" \
      - "$base" >/dev/null
  remove_base_work
  trap - EXIT
  say "made $base in $((SECONDS - t0)) s"
}

if [ "$dry_run" = 1 ]; then
  # What would be built, as KEY=VALUE lines (scripts/image-check.sh reads them). The base is
  # looked for only where podman is; otherwise it counts as to be made, and what making it
  # needs (the mirror, the keyring) is checked.
  base_state="to be made"
  if [ "$rebuild_base" = 0 ] && command -v podman >/dev/null && podman image exists "$base" 2>/dev/null; then
    base_state=exists
  fi
  if [ "$base_state" != exists ]; then
    plan_base
    base_state="to be made from $mirror"
  fi
  read -r -a extra <<< "$extra_packages"
  printf '%s=%s\n' variant "$variant" package "$package" version "$version" tag "$tag" \
    base "$base" suite "$suite" base_state "$base_state" apt "${extra[*]}" \
    mesa_min "$mesa_min" target "${target:-default}"
  exit 0
fi

setup_podman
if [ "$rebuild_base" = 1 ] || ! podman image exists "$base"; then
  make_base
else
  say "base $base exists (--rebuild-base makes it again)"
  # A base named by ONEBIT_BASE_IMAGE, or one made by an older version of this script, may be
  # another suite than the variant's (a vulkan image on bookworm fails the Mesa check): say so.
  desc="$(podman image inspect --format '{{index .Config.Labels "org.opencontainers.image.description"}}' "$base" 2>/dev/null || true)"
  case " $desc " in
    *" $suite "*) ;;
    *) say "warning: $base is not a $suite base (its description: \"${desc:-none}\"); the $variant variant is meant for $suite" ;;
  esac
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
podman build --pull=never --format docker --layers ${target:+--target "$target"} \
  --build-arg BASE="$base" --build-arg VERSION="$version" \
  --build-arg EXTRA_PACKAGES="${extra[*]}" --build-arg MESA_MIN="$mesa_min" \
  --build-arg NET_TIMEOUT="$net_timeout" \
  -f "$root/deploy/container/Containerfile" -t "$tag" "$ctx" >&2
# The binary runs in the image (its libraries resolve there).
podman run --rm --network none --health-cmd none "$tag" --version >&2 || die "the image's onebit-tts does not run"
say "built $tag in $((SECONDS - t0)) s ($(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}'))"
echo "$tag"
