#!/usr/bin/env bash
# Builds the release package: onebit-tts-VERSION-linux-x86_64.tar.gz, a directory that runs from
# anywhere with no Rust, no Python and no LD_LIBRARY_PATH (docs/deploy.md, "Release package").
#
#   scripts/package.sh [--binary PATH] [--out DIR] [--features LIST]
#
#   --binary PATH    the onebit-tts to ship (default: $CARGO_TARGET_DIR or target/, release/)
#   --out DIR        where the archives go (default: target/dist)
#   --features LIST  the cargo features PATH was built with beyond the default ones (vulkan, ...):
#                    they name the archive (…-linux-x86_64-vulkan.tar.gz) and decide which
#                    crates' licences it carries
#
# Layout (VERSION from Cargo.toml):
#   onebit-tts-VERSION/
#     bin/onebit-tts          stripped; RUNPATH $ORIGIN/../lib (a lib/ beside bin/ is searched
#                             first for its own system dependencies; the package needs none)
#     .onebit/                the runtime exactly as scripts/setup.sh lays it out, so the binary
#                             finds it the way it finds a checkout's (src/paths.rs: `.onebit`
#                             beside the executable or any ancestor):
#       onnxruntime/lib/      libonnxruntime.so.X.Y.Z (+ libonnxruntime.so), with LICENSE and
#                             ThirdPartyNotices.txt from the onnxruntime wheel it came from
#       oga/lib/              libonnxruntime-genai.so, the same from its wheel
#       neutts/               espeak-ng: libespeak-ng.so.1 + espeak-ng-data/, COPYING (GPL-3)
#       tn/damga-1.0.5/       damga's grammars with its LICENSE and NOTICE
#     voices/ samples/ docs/ README.md LICENSE NOTICE
#     licenses/               what the binary has built in: crates.txt (every crate compiled in,
#                             with its licence) and each crate's licence files, the C libraries'
#                             (llama.cpp, libopus, LAME, Oniguruma), and the GPL/LGPL texts
# and beside the archive:
#   onebit-tts-VERSION-linux-x86_64.debug.tar.gz   bin/onebit-tts.debug (objcopy
#       --only-keep-debug; the binary's .gnu_debuglink names it): unpacked over the package,
#       gdb and backtraces find it beside the binary
#   *.sha256                                       sha256sum lines for both archives
# No models: `bin/onebit-tts models pull` fetches them.
#
# Needs: objcopy and readelf (binutils), patchelf, python3, tar, gzip, and cargo with the sources
# of the crates compiled into the binary in its registry (the build of PATH left them there; the
# dev-dependencies, which only `cargo test` fetches, are not needed). The runtime comes from
# .onebit/ (scripts/setup.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
binary="$target_dir/release/onebit-tts"
out="$root/target/dist"
features=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --features) features="${2:?--features needs a list}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;;
    *) echo "package: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "package: $*" >&2; exit 1; }

for tool in objcopy readelf patchelf python3 tar gzip sha256sum cargo; do
  command -v "$tool" >/dev/null ||
    die "$tool is missing (scripts/setup.sh --prereqs-only installs binutils and patchelf)"
done
[ -f "$binary" ] || die "no binary at $binary: build it (cargo build --release --locked) or pass --binary PATH"
readelf -h "$binary" 2>/dev/null | grep -q 'Machine:.*X86-64' || die "$binary is not an x86-64 ELF file"

version="$(sed -n '/^\[package\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml" | head -1)"
[ -n "$version" ] || die "no version in Cargo.toml's [package]"
suffix=""
[ -n "$features" ] && suffix="-$(echo "$features" | tr ', ' '--')"
name="onebit-tts-$version"
archive="$name-linux-x86_64$suffix"

# ---- What the package takes from the runtime install, checked before anything is written.
home="$root/.onebit"
venv_site="$(ls -d "$home"/venv/lib/python3*/site-packages 2>/dev/null | head -1 || true)"
[ -n "$venv_site" ] || die "no $home/venv: run scripts/setup.sh"
ort_lib="$(cd "$home/onnxruntime/lib" 2>/dev/null && ls libonnxruntime.so.[0-9]* 2>/dev/null | sort -V | tail -1 || true)"
[ -n "$ort_lib" ] || die "no $home/onnxruntime/lib/libonnxruntime.so.*: run scripts/setup.sh"
oga_lib="$home/oga/lib/libonnxruntime-genai.so"
[ -f "$oga_lib" ] || die "no $oga_lib: run scripts/setup.sh"
espeak="$home/neutts"
[ -f "$espeak/libespeak-ng.so.1" ] && [ -d "$espeak/espeak-ng-data" ] ||
  die "no espeak-ng in $espeak: run scripts/setup.sh"
# Each library's licence comes from the wheel it was copied from: the files must be that wheel's.
ort_pkg="$venv_site/onnxruntime"
oga_pkg="$venv_site/onnxruntime_genai"
cmp -s "$home/onnxruntime/lib/$ort_lib" "$ort_pkg/capi/$ort_lib" ||
  die "$home/onnxruntime/lib/$ort_lib is not the venv's onnxruntime wheel's file: its licence texts would not match (rerun scripts/setup.sh after removing .onebit/onnxruntime)"
cmp -s "$oga_lib" "$oga_pkg/libonnxruntime-genai.so" ||
  die "$oga_lib is not the venv's onnxruntime-genai wheel's file: its licence texts would not match (rerun scripts/setup.sh after removing .onebit/oga)"
for f in "$ort_pkg/LICENSE" "$ort_pkg/ThirdPartyNotices.txt" "$oga_pkg/LICENSE" "$oga_pkg/ThirdPartyNotices.txt"; do
  [ -f "$f" ] || die "no $f (the licence texts of the wheel the library came from)"
done
# The GNU licence texts, as Debian's base-files ships them (every Debian/Ubuntu system has them).
common=/usr/share/common-licenses
for f in GPL-3 LGPL-3 LGPL-2; do
  [ -f "$common/$f" ] || die "no $common/$f (Debian's base-files): the package must carry that licence text"
done
damga="$home/tn/damga-1.0.5"

# ---- Stage.
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/onebit-package.XXXXXX")"
trap 'rm -rf "$work"' EXIT
pkg="$work/$name"
mkdir -p "$pkg/bin" "$pkg/.onebit/onnxruntime/lib" "$pkg/.onebit/oga/lib" "$pkg/.onebit/neutts" "$pkg/licenses"

# The binary: debug info split off into onebit-tts.debug (the binary keeps a .gnu_debuglink to it),
# everything else of the symbol tables stripped, RUNPATH relative to itself.
cp "$binary" "$pkg/bin/onebit-tts"
chmod 755 "$pkg/bin/onebit-tts"
mkdir -p "$work/debug/$name/bin"
dbg="$work/debug/$name/bin/onebit-tts.debug"
objcopy --only-keep-debug "$pkg/bin/onebit-tts" "$dbg"
chmod 644 "$dbg"
objcopy --strip-all --add-gnu-debuglink="$dbg" "$pkg/bin/onebit-tts"
patchelf --set-rpath '$ORIGIN/../lib' "$pkg/bin/onebit-tts"
readelf -d "$pkg/bin/onebit-tts" | grep -q 'RUNPATH.*\[\$ORIGIN/\.\./lib\]' || die "patchelf did not set the RUNPATH"

# ONNX Runtime and onnxruntime-genai with their wheels' licence texts.
cp "$home/onnxruntime/lib/$ort_lib" "$pkg/.onebit/onnxruntime/lib/"
ln -s "$ort_lib" "$pkg/.onebit/onnxruntime/lib/libonnxruntime.so"
cp "$ort_pkg/LICENSE" "$ort_pkg/ThirdPartyNotices.txt" "$pkg/.onebit/onnxruntime/"
cp "$oga_lib" "$pkg/.onebit/oga/lib/"
cp "$oga_pkg/LICENSE" "$oga_pkg/ThirdPartyNotices.txt" "$pkg/.onebit/oga/"

# espeak-ng (GPL-3.0-or-later): its own library file and data, opened with dlopen at run time.
# The wheel's library carries a DT_RPATH to the /tmp build directory it was made in, which would
# let whoever creates that directory supply its dependencies: removed (NOTICE says so).
cp "$espeak/libespeak-ng.so.1" "$pkg/.onebit/neutts/"
patchelf --remove-rpath "$pkg/.onebit/neutts/libespeak-ng.so.1"
cp -R "$espeak/espeak-ng-data" "$pkg/.onebit/neutts/"
cp "$common/GPL-3" "$pkg/.onebit/neutts/COPYING"

# damga's grammars (Apache-2.0, text normalisation), with its own LICENSE and NOTICE.
if [ ! -f "$damga/LICENSE" ] || [ ! -f "$damga/NOTICE" ] || [ ! -f "$damga/en/read.fst" ]; then
  echo "package: no normalisation grammars in $damga: run scripts/setup.sh" >&2
  exit 1
fi
mkdir -p "$pkg/.onebit/tn"
cp -R "$damga" "$pkg/.onebit/tn/"
rm -f "$pkg/.onebit/tn/damga-1.0.5/.complete"

# The checkout's shipped files.
cp -R "$root/voices" "$pkg/voices"
rm -rf "$pkg/voices/custom"
[ -d "$root/samples" ] && cp -R "$root/samples" "$pkg/samples"
cp -R "$root/docs" "$pkg/docs"
cp "$root/README.md" "$root/LICENSE" "$root/NOTICE" "$pkg/"

# What the binary has built in: every crate compiled into it (normal dependencies of onebit-tts
# for this target, proc-macros excluded) with its licence files, plus the C/C++ libraries the
# -sys crates vendor and build into it. `cargo tree` without dev edges resolves features as
# `cargo build` does and needs only the sources a build fetched; `cargo metadata` would need the
# dev-dependencies' too (a checkout only built, as by scripts/quickstart.sh, lacks them), and its
# graph also lists optional crates no build of this checkout compiles.
tree_args=(--locked --offline -e 'normal,no-proc-macro' --target x86_64-unknown-linux-gnu
  --prefix none --format $'{p}\t{l}' --manifest-path "$root/Cargo.toml")
[ -n "$features" ] && tree_args+=(--features "$features")
cargo tree "${tree_args[@]}" >"$work/crates.tsv" ||
  die "cargo tree failed: the sources of the crates compiled into the binary must be in cargo's registry (the build of $binary leaves them there; \`cargo fetch --locked\` fetches them)"
cp "$common/GPL-3" "$pkg/licenses/GPL-3.0.txt"
cp "$common/LGPL-3" "$pkg/licenses/LGPL-3.0.txt"
python3 - "$work/crates.tsv" "$pkg/licenses" "${CARGO_HOME:-$HOME/.cargo}" <<'PY'
import glob, os, re, shutil, sys

out, cargo_home = sys.argv[2], sys.argv[3]
# The libraries -sys crates vendor and link into the binary statically, and their licence files.
vendored = {
    "llama-cpp-sys-2": [("llama.cpp", "llama.cpp/LICENSE")],
    "mp3lame-sys": [("LAME", "lame-3.100/COPYING"), ("LAME", "lame-3.100/LICENSE")],
    "opusic-sys": [("libopus", "opus/COPYING")],
    "onig_sys": [("Oniguruma", "oniguruma/COPYING")],
}
licence_name = re.compile(r"^(LICEN[CS]E|COPYING|COPYRIGHT|NOTICE|UNLICENSE)([-._].*)?$", re.I)

# One line per edge ("NAME vVERSION[ (PATH)]<TAB>LICENCE", " (*)" where a crate's dependencies were
# listed before); the first is onebit-tts itself.
entry = re.compile(r"^(\S+) v(\S+)(?: \((/[^)]*)\))?\t(.*?)(?: \(\*\))?$")
shipped = {}
for line in open(sys.argv[1]).read().splitlines()[1:]:
    m = entry.match(line)
    if not m:
        sys.exit(f"package: cargo tree printed {line!r}, not a crate: update scripts/package.sh")
    name, version, path, licence = m.groups()
    if path:
        src = path
    else:
        # A registry crate's sources, as cargo unpacked them (any registry's copy: crates.io's
        # files of a version never change).
        found = sorted(glob.glob(os.path.join(glob.escape(cargo_home), "registry", "src", "*", f"{name}-{version}", "Cargo.toml")))
        if not found:
            sys.exit(f"package: {name} {version} is not in {cargo_home}/registry/src (cargo fetch --locked fetches it)")
        src = os.path.dirname(found[0])
    manifest = open(os.path.join(src, "Cargo.toml"), encoding="utf-8").read()
    licence_file = re.search(r'^license-file\s*=\s*"([^"]*)"', manifest, re.M)
    shipped[(name, version)] = {"name": name, "version": version, "license": licence or None,
                                "license_file": licence_file and licence_file[1], "src": src}

lines, missing = [], []
for key in sorted(shipped):
    p = shipped[key]
    src = p["src"]
    dest = os.path.join(out, "crates", f'{p["name"]}-{p["version"]}')
    files = sorted(f for f in os.listdir(src) if licence_name.match(f) and os.path.isfile(os.path.join(src, f)))
    if p.get("license_file"):
        lf = os.path.normpath(os.path.join(src, p["license_file"]))
        if os.path.isfile(lf) and os.path.basename(lf) not in files:
            files.append(os.path.relpath(lf, src))
    for what, rel in vendored.get(p["name"], []):
        if not os.path.isfile(os.path.join(src, rel)):
            sys.exit(f"package: {p['name']} {p['version']} has no {rel} ({what}'s licence): update scripts/package.sh")
        files.append(rel)
    for rel in files:
        target = os.path.join(dest, rel.replace("/", "__"))
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(os.path.join(src, rel), target)
    shown = ", ".join(rel.replace("/", "__") for rel in files) or "(the crate ships no licence file)"
    lines.append(f'{p["name"]} {p["version"]}\t{p["license"] or p.get("license_file") or "?"}\t{shown}')
    if not p["license"] and not files:
        missing.append(p["name"])
if missing:
    sys.exit("package: crates with neither a licence expression nor a licence file: " + ", ".join(missing))
with open(os.path.join(out, "crates.txt"), "w") as f:
    f.write("# Crates compiled into bin/onebit-tts: name version<TAB>licence<TAB>files in crates/NAME-VERSION/\n")
    f.write("# (a vendored C library's licence file is named by its path in the crate, / as __)\n")
    f.write("\n".join(lines) + "\n")
print(f"package: {len(lines)} crates' licences in licenses/crates/")
PY

# ---- Archive: reproducible (sorted names, fixed owner and mtime, gzip without a timestamp).
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}"
tar_args=(--sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=gnu)
chmod -R u+rwX,go+rX,go-w "$work"  # readable by all whatever the umask was
tar "${tar_args[@]}" -C "$work" -cf - "$name" | gzip -n >"$out/$archive.tar.gz.partial"
mv "$out/$archive.tar.gz.partial" "$out/$archive.tar.gz"
tar "${tar_args[@]}" -C "$work/debug" -cf - "$name" | gzip -n >"$out/$archive.debug.tar.gz.partial"
mv "$out/$archive.debug.tar.gz.partial" "$out/$archive.debug.tar.gz"
(cd "$out" && sha256sum "$archive.tar.gz" "$archive.debug.tar.gz" >"$archive.sha256")

# The oldest system it runs on: the newest glibc and libstdc++ symbol versions any of its ELF
# files needs (docs/deploy.md states them for the build made here).
needs() {
  find "$pkg" -type f -print0 | while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && readelf -V -W "$f"
  done | grep -o "Name: $1_[0-9.]*" | sed "s/Name: $1_//" | sort -uV | tail -1
}
echo "package: needs glibc >= $(needs GLIBC), libstdc++ with GLIBCXX_$(needs GLIBCXX) (GCC's runtime), libgomp"
size() { stat -c %s "$1"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "package: binary $(mib "$(size "$binary")") -> stripped $(mib "$(size "$pkg/bin/onebit-tts")") (debug file $(mib "$(size "$dbg")"))"
echo "package: unpacked $(mib "$(du -sb "$pkg" | cut -f1)")"
echo "package: $out/$archive.tar.gz ($(mib "$(size "$out/$archive.tar.gz")"))"
echo "package: $out/$archive.debug.tar.gz ($(mib "$(size "$out/$archive.debug.tar.gz")"))"
