#!/usr/bin/env bash
# scripts/package.sh after exactly what the README says: a checkout where only
# scripts/quickstart.sh ran, whose `cargo build --release --locked` fetched the sources of the
# crates it compiles, and not those of the dev-dependencies that only `cargo test` fetches (the
# package once stopped there, at `cargo metadata --offline`: issue 54). Offline, no root:
#   1. a CARGO_HOME of its own holding what that release build fetches: the registry index and
#      the crate files linked from the machine's CARGO_HOME, then the release build itself run
#      offline up to its first compile (a RUSTC_WRAPPER stops it there), so that cargo unpacks
#      exactly the crates a release build needs; the crate files it left packed are removed;
#   2. that CARGO_HOME lacks a dev-dependency (else the check below would prove nothing);
#   3. scripts/package.sh with it and CARGO_NET_OFFLINE=true (nothing can be downloaded) must
#      make the package, and its licences must be those of a package made with the machine's
#      own CARGO_HOME: the one --compare names (scripts/test.sh's, made just before), else one
#      made here.
# ~30 s on 2 cores with --compare, ~45 s without (two packages). The machine's CARGO_HOME must
# hold the crates of a release build (any build of this checkout leaves them there).
#
# Usage: scripts/package-check.sh [--binary PATH] [--compare ARCHIVE]
#   --binary PATH      what to package (default: the test build's target/debug/onebit-tts)
#   --compare ARCHIVE  a package scripts/package.sh made with the machine's CARGO_HOME
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binary="${CARGO_TARGET_DIR:-$root/target}/debug/onebit-tts"
compare=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
    --compare) compare="${2:?--compare needs an archive}"; shift 2 ;;
    *) echo "package-check: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
say() { echo "package-check: $*"; }
die() {
  echo "package-check: $*" >&2
  exit 1
}
[ -f "$binary" ] || die "no binary at $binary: build it (cargo build --locked) or pass --binary PATH"
[ -z "$compare" ] || [ -f "$compare" ] || die "no archive at $compare"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
if [ ! -d "$cargo_home/registry/index" ] || [ ! -d "$cargo_home/registry/cache" ]; then
  die "no registry in $cargo_home: build this checkout once"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
home="$tmp/cargo-home"
mkdir -p "$home/registry"
cp -R "$cargo_home/registry/index" "$home/registry/"
# Linked, not copied (72 MiB): cargo only reads a crate file; where links fail, copied.
cp -Rl "$cargo_home/registry/cache" "$home/registry/" 2>/dev/null ||
  cp -R "$cargo_home/registry/cache" "$home/registry/"

# 1. The release build up to its first compile: cargo unpacks every crate it needs before it
# compiles any, and stops at the first compile the wrapper refuses (rustc's queries of the
# target, --print, go through).
cat >"$tmp/stop-rustc" <<'SH'
#!/bin/sh
case " $* " in
  *" --print"*) exec "$@" ;;
  *" --crate-name "*) echo "package-check: stopped before the first compile" >&2; exit 1 ;;
esac
exec "$@"
SH
chmod +x "$tmp/stop-rustc"
(cd "$root" && CARGO_HOME="$home" CARGO_NET_OFFLINE=true RUSTC_WRAPPER="$tmp/stop-rustc" \
  cargo build --release --locked -j 1 --target-dir "$tmp/target") >"$tmp/build.log" 2>&1 || true
grep -q "stopped before the first compile" "$tmp/build.log" || {
  cat "$tmp/build.log" >&2
  die "the release build did not get to its first compile offline: $cargo_home lacks crates a release build needs (build this checkout once)"
}
unpacked=0 removed=0
for crate in "$home"/registry/cache/*/*.crate; do
  registry="$(basename "$(dirname "$crate")")" pkg="$(basename "$crate" .crate)"
  if [ -d "$home/registry/src/$registry/$pkg" ]; then
    unpacked=$((unpacked + 1))
  else
    rm "$crate"
    removed=$((removed + 1))
  fi
done
say "a CARGO_HOME as a release build leaves it: $unpacked crates unpacked, $removed other crate files left out"

# 2. The dev-dependencies (Cargo.toml's [dev-dependencies]) it lacks: at least one.
absent=()
while read -r dep; do
  compgen -G "$home/registry/src/*/$dep-[0-9]*" >/dev/null || absent+=("$dep")
done < <(sed -n '/^\[dev-dependencies\]/,/^\[/ s/^\([A-Za-z0-9_-]*\) *=.*/\1/p' "$root/Cargo.toml")
[ "${#absent[@]}" -gt 0 ] ||
  die "the release build's CARGO_HOME holds every dev-dependency: this check no longer tells a quickstart checkout from a tested one"
say "ok   it lacks the dev-dependencies ${absent[*]}"

# 3. The package from it, offline, and from the machine's CARGO_HOME: the same licences.
package() { # package WHICH [VAR=VALUE...]: scripts/package.sh into $tmp/WHICH, its licences unpacked
  local which="$1" rc=0
  shift
  mkdir -p "$tmp/$which"
  env "$@" bash "$root/scripts/package.sh" --binary "$binary" --out "$tmp/$which" \
    >"$tmp/$which.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || {
    cat "$tmp/$which.log" >&2
    die "scripts/package.sh with the $which CARGO_HOME exited $rc"
  }
}
licences() { tar -xzf "$1" -C "$2" --wildcards '*/licenses'; }
package quickstart CARGO_HOME="$home" CARGO_NET_OFFLINE=true
licences "$tmp"/quickstart/onebit-tts-*-linux-x86_64.tar.gz "$tmp/quickstart"
say "ok   scripts/package.sh makes the package with it, offline ($(grep -o '[0-9]* crates' "$tmp/quickstart.log"))"
if [ -z "$compare" ]; then
  package full
  compare="$(echo "$tmp"/full/onebit-tts-*-linux-x86_64.tar.gz)"
fi
mkdir -p "$tmp/compare"
licences "$compare" "$tmp/compare"
diff -r "$tmp"/quickstart/onebit-tts-*/licenses "$tmp"/compare/onebit-tts-*/licenses >&2 ||
  die "the package's licences differ between a quickstart checkout and $compare (made with $cargo_home)"
say "ok   its licences are those of $(basename "$compare"), made with $cargo_home"
echo "package-check: 3 passed, 0 failed"
