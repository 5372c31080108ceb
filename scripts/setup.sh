#!/usr/bin/env bash
# Checks the system packages the build needs (installs them as root with apt-get, else prints
# the command and stops), then installs what onebit-tts needs at run and test time into
# .onebit/ (ignored by git):
#   .onebit/venv          python venv: onnxruntime, onnxruntime-genai, onnx, numpy (generator, parity tests),
#                         gguf (tools/onnx_to_gguf.py, the llama.cpp peer's model, and its test),
#                         openai (the official SDK, for tests/python/openai_client.py against the server),
#                         tokenizers (the HF tokenizers check of the generated tokenizer.json),
#                         wyoming (Home Assistant's protocol library, for tests/python/wyoming_client.py),
#                         websocket-client (drives Chromium for tests/python/web_page.py)
#   .onebit/onnxruntime   the ONNX Runtime shared library from the onnxruntime wheel
#   .onebit/neutts        espeak-ng 1.52 library + data and the sample voices from the neutts wheel
#   .onebit/tn            damga 1.0.5's text-normalisation grammars (en, de, fr, es) with its
#                         LICENSE and NOTICE; with --build-tools also the normaliser's outside test
#                         sets (damga's golden files, NeMo's cases from kitten-text-processing)
#   .onebit/node          the official OpenAI Node SDK (npm `openai`, for tests/node/openai_client.js)
# Idempotent: a second run only checks.
#   --prereqs-only            check (and install) the system packages, then stop
#   --build-tools             also install what `models build` runs onnxruntime-genai's model
#                             builder with (torch, transformers, onnx-ir: ~6 GB in the venv),
#                             and llama.cpp's checkpoint converter into .onebit/llama-convert
#                             (sentencepiece in the venv); scripts/test.sh asks for them
#                             (tests/pull.rs builds and converts real packages); with them the
#                             test-only tools: damga (the normaliser's parity test),
#                             kubernetes-validate, and the system packages of the container
#                             tests (podman, runc, catatonit, debootstrap, haproxy)
#   --release-build           the caller runs `cargo build --release` next (scripts/quickstart.sh):
#                             the free-space check counts it too
#   ONEBIT_SETUP_INSTALL=0    never install system packages, even as root: report and stop
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
home="$root/.onebit"
py="${PYTHON:-python3}"

# System prerequisites, as Debian/Ubuntu packages. Checked before anything is built so a bare
# machine gets one clear message instead of a build error minutes in:
#   build-essential  cc and make: the linker, and mp3lame-sys builds LAME with configure + make
#   cmake            opusic-sys (under the opus crate) builds the bundled libopus with cmake
#   python3-venv     `python3 -m venv` with pip (ensurepip) for .onebit/venv
#   nodejs, npm      the OpenAI Node SDK's test against the server
#   chromium-headless-shell  the web page's test in a real browser
#   libclang-dev     bindgen's libclang, for llama-cpp-sys-2 (the llama engine's bundled llama.cpp,
#                    which cmake and the C++ compiler of build-essential build)
#   binutils         objcopy and readelf: scripts/package.sh splits the release binary's debug info
#                    off and its test (tests/release_package.rs) reads the ELF files' needs
#   patchelf         scripts/package.sh sets the release binary's RUNPATH ($ORIGIN/../lib)
# and with --build-tools (what scripts/test.sh asks for) the container and scale-out checks:
#   podman, runc, catatonit, debootstrap  scripts/image.sh (a local Debian base, podman build) and
#                    scripts/k8s-check.sh --play (podman kube play's infra container)
#   haproxy          scripts/replicas-test.sh puts two replicas behind it
command -v "$py" >/dev/null || { echo "setup: $py (Python 3) is required" >&2; exit 1; }
missing=()
{ command -v cc >/dev/null && command -v make >/dev/null; } || missing+=(build-essential)
command -v cmake >/dev/null || missing+=(cmake)
"$py" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v chromium-headless-shell >/dev/null || missing+=(chromium-headless-shell)
has_libclang() {  # plain bash: the check runs with a minimal PATH too
  local f
  for f in ${LIBCLANG_PATH:+"$LIBCLANG_PATH"/libclang*.so*} /usr/lib/llvm-*/lib/libclang.so* \
    /usr/lib/*/libclang.so* /usr/lib/*/libclang-[0-9]*.so*; do
    [ -e "$f" ] && return 0
  done
  return 1
}
has_libclang || missing+=(libclang-dev)
{ command -v objcopy >/dev/null && command -v readelf >/dev/null; } || missing+=(binutils)
command -v patchelf >/dev/null || missing+=(patchelf)
build_tools_note=""
if [ "${1:-}" = --build-tools ]; then
  build_tools_note=", podman, runc, catatonit, debootstrap, haproxy"
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || missing+=(runc)
  { [ -x /usr/libexec/podman/catatonit ] || command -v catatonit >/dev/null; } || missing+=(catatonit)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v haproxy >/dev/null || missing+=(haproxy)
fi
# Optional: ccache lets scripts/test.sh's clippy and test runs share one build of llama.cpp and
# libopus (without it they are built twice). Installed beside the others as root, else noted.
optional=()
command -v ccache >/dev/null || optional+=(ccache)
can_install() {
  [ "$(id -u)" = 0 ] && [ "${ONEBIT_SETUP_INSTALL:-1}" != 0 ] && command -v apt-get >/dev/null
}
if [ ${#missing[@]} -gt 0 ]; then
  if can_install; then
    echo "setup: installing the build's system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "setup: missing system packages: ${missing[*]} (cmake builds libopus, build-essential the C parts, python3-venv the .onebit venv, nodejs and npm the Node SDK test, chromium-headless-shell the web page test, libclang-dev the llama engine's bindings, binutils and patchelf the release package, podman, runc, catatonit, debootstrap and haproxy the container tests)" >&2
    if command -v apt-get >/dev/null; then
      echo "setup: installing them needs root; run:  sudo apt-get install -y ${missing[*]}  and then this script again" >&2
    else
      echo "setup: install the equivalents with your system's package manager (a C compiler and make, cmake, python3's venv module), then run this script again" >&2
    fi
    exit 1
  fi
fi
echo "setup: system prerequisites present (cc, make, cmake, python3 venv, node, npm, chromium-headless-shell, libclang, binutils, patchelf${build_tools_note:-})"
# An optional package never stops the setup: offline or without the package, it is a note.
if [ ${#optional[@]} -gt 0 ] && can_install; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${optional[@]}"; } || echo "setup: note: could not install ${optional[*]} (optional)" >&2
fi
command -v ccache >/dev/null ||
  echo "setup: note: no ccache; scripts/test.sh builds llama.cpp twice (sudo apt-get install ccache saves ~4 min)"
[ "${1:-}" = --prereqs-only ] && exit 0
build_tools=0
[ "${1:-}" = --build-tools ] && build_tools=1
release_build=0
[ "${1:-}" = --release-build ] && release_build=1
mkdir -p "$home"

ORT_VERSION=1.31.1
OGA_VERSION=0.18.0
NEUTTS_VERSION=1.4.1
OPENAI_VERSION=3.57.0
# The Node SDK's 6.x line still runs on Node 18/20 (7.x needs Node 22).
OPENAI_NODE_VERSION=7.55.0
GGUF_VERSION=0.19.0
WYOMING_VERSION=1.10.2
WEBSOCKET_CLIENT_VERSION=1.9.2
# The WebSocket route's client test (tests/python/ws_client.py) and the caption files' parsers
# (tests/python/test_captions.py): real implementations, not our own readers.
WEBSOCKETS_VERSION=17.4
SRT_VERSION=3.5.3
WEBVTT_VERSION=0.6.0
TOKENIZERS_VERSION=0.23.3
# Hugging Face's Python hub client: tests/pull.rs checks that `models pull` shares its cache.
HF_HUB_VERSION=2.4.0
# scripts/k8s-check.sh: strict schema validation of deploy/k8s's rendered manifests.
KUBERNETES_VALIDATE_VERSION=1.37.0

# onnxruntime-genai's model builder imports the checkpoint with transformers (on torch) and
# writes the graph with onnx-ir. PyPI's torch wheel is the CUDA build (~6 GB with its libraries);
# the builder runs it on the CPU.
TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.23.0
ONNX_IR_VERSION=1.1.0
# Imported by llama.cpp's converter before it looks for a tokenizer.model.
SENTENCEPIECE_VERSION=0.2.1
# The normaliser's parity test runs damga's own Python (and its OpenFst runtime) beside ours.
DAMGA_VERSION=1.0.5
build_reqs="damga==$DAMGA_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION onnx-ir==$ONNX_IR_VERSION sentencepiece==$SENTENCEPIECE_VERSION"
stamp="$home/venv/.onebit-reqs"
reqs="onnxruntime==$ORT_VERSION onnxruntime-genai==$OGA_VERSION onnx==1.23.2 numpy==2.4.6 openai==$OPENAI_VERSION gguf==$GGUF_VERSION tokenizers==$TOKENIZERS_VERSION huggingface_hub==$HF_HUB_VERSION wyoming==$WYOMING_VERSION websocket-client==$WEBSOCKET_CLIENT_VERSION websockets==$WEBSOCKETS_VERSION srt==$SRT_VERSION webvtt-py==$WEBVTT_VERSION ${ONEBIT_EXTRA_PIP:-}"

# What is still to install, decided once: the space check counts it, then it is installed.
install_runtime=0
[ "$(cat "$stamp" 2>/dev/null)" != "$reqs" ] && install_runtime=1
install_build_tools=0
[ "$build_tools" = 1 ] && [ "$(cat "$home/venv/.onebit-build-reqs" 2>/dev/null)" != "$build_reqs" ] &&
  install_build_tools=1
target="${CARGO_TARGET_DIR:-$root/target}"

# Free space, checked before anything is downloaded: a full disk otherwise shows as a pip
# traceback halfway through. Sizes from measurements on a fresh clone, rounded up (pip holds
# every wheel of an install in its temporary folder while it unpacks them, hence more than the
# venv grows; a fresh `cargo build --release --locked` took 2.0 GiB).
need=0
what=""
count() { need=$((need + $1)); what+="${what:+, }$2 $1 GiB"; }
[ "$install_runtime" = 1 ] && count 1 "the venv's runtime packages"
[ "$install_build_tools" = 1 ] && count 9 "the model builder's torch with its CUDA libraries"
[ "$build_tools" = 1 ] && [ ! -d "$target/debug" ] && count 6 "the test build in target/"
[ "$release_build" = 1 ] && [ ! -d "$target/release" ] && count 3 "the release build in target/"
if [ "$need" -gt 0 ] && [ "${ONEBIT_SETUP_SPACE_CHECK:-1}" != 0 ] && command -v df >/dev/null; then
  # A df that fails (no mount table in some containers) leaves the number empty: no check.
  avail_kib="$({ df -Pk "$root" 2>/dev/null || true; } | { read -r _; read -r _ _ _ avail _; echo "${avail:-}"; })"
  if [[ "$avail_kib" =~ ^[0-9]+$ ]] && [ "$avail_kib" -lt $((need * 1024 * 1024)) ]; then
    echo "setup: $((avail_kib / 1024 / 1024)) GiB free on the disk of $root; this setup needs about $need GiB ($what). Free some space and run this again (ONEBIT_SETUP_SPACE_CHECK=0 skips this check)" >&2
    exit 1
  fi
fi

if [ ! -x "$home/venv/bin/python" ]; then
  "$py" -m venv "$home/venv"
fi
if [ "$install_runtime" = 1 ]; then
  "$home/venv/bin/pip" install -q --disable-pip-version-check $reqs
  echo "$reqs" > "$stamp"
fi

if [ "$install_build_tools" = 1 ]; then
  "$home/venv/bin/pip" install -q --disable-pip-version-check $build_reqs
  echo "$build_reqs" > "$home/venv/.onebit-build-reqs"
fi

site="$("$home/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! ls "$home/onnxruntime/lib/libonnxruntime.so"* >/dev/null 2>&1; then
  mkdir -p "$home/onnxruntime/lib"
  cp -a "$site"/onnxruntime/capi/libonnxruntime.so.* "$home/onnxruntime/lib/"
  (cd "$home/onnxruntime/lib" && ln -sf libonnxruntime.so.$ORT_VERSION libonnxruntime.so)
fi
if [ ! -d "$home/oga/lib" ]; then
  mkdir -p "$home/oga/lib"
  cp -a "$site"/onnxruntime_genai/libonnxruntime-genai.so "$home/oga/lib/"
fi

if [ ! -f "$home/neutts/libespeak-ng.so.1" ]; then
  tmp="$(mktemp -d)"
  "$home/venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$tmp" "neutts==$NEUTTS_VERSION"
  rm -rf "$home/neutts.partial"
  mkdir -p "$home/neutts.partial"
  "$home/venv/bin/python" - "$tmp"/neutts-*.whl "$home/neutts.partial" <<'PY'
import sys, zipfile, os
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.endswith("/"):
            continue
        if n.startswith(("neutts/espeak-ng-data/", "neutts/samples/")) or n in (
            "neutts/libespeak-ng.so.1", "neutts-%s.dist-info/licenses/LICENSE" % "1.4.1"):
            dest = os.path.join(out, n.split("/", 1)[1])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(n) as src, open(dest, "wb") as dst:
                dst.write(src.read())
PY
  rm -rf "$home/neutts" "$tmp"
  mv "$home/neutts.partial" "$home/neutts"
fi
# llama.cpp's convert_hf_to_gguf.py with its `conversion` package and gguf-py (released together),
# from the llama.cpp that the llama-cpp-python source package vendors: tools/hf_to_gguf.py runs it.
# scripts/setup-llama-peer.sh builds the bench's peer from the same source package and version.
# The sha256 pins the code that runs: a cut or changed download is fetched again, then refused.
LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
convert="$home/llama-convert"
if [ "$build_tools" = 1 ] && [ "$(cat "$convert/.version" 2>/dev/null)" != "$LLAMA_CPP_PYTHON_VERSION" ]; then
  sdist="$home/llama/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  for attempt in 1 2; do
    if ! echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --status 2>/dev/null; then
      rm -f "$sdist"
      "$home/venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$home/llama/src" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    fi
  done
  if ! echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --status; then
    echo "setup: $sdist does not have the sha256 this script pins ($LLAMA_CPP_PYTHON_SHA256)" >&2
    exit 1
  fi
  rm -rf "$convert.partial"
  "$home/venv/bin/python" - "$sdist" "$convert.partial" <<'PY'
import os, sys, tarfile
sdist, out = sys.argv[1], sys.argv[2]
keep = ("convert_hf_to_gguf.py", "LICENSE", "conversion/", "gguf-py/gguf/")
with tarfile.open(sdist) as tar:
    for m in tar.getmembers():
        parts = m.name.split("/", 3)  # llama_cpp_python-V/vendor/llama.cpp/REST
        if len(parts) < 4 or parts[1:3] != ["vendor", "llama.cpp"] or not m.isfile():
            continue
        if parts[3] in keep or parts[3].startswith(keep[2:]):
            m.name = parts[3]
            tar.extract(m, out, filter="data")
for need in ("convert_hf_to_gguf.py", "conversion/__init__.py", "gguf-py/gguf/__init__.py"):
    if not os.path.isfile(os.path.join(out, need)):
        sys.exit(f"setup: {sdist} has no vendor/llama.cpp/{need}: its layout changed")
PY
  echo "$LLAMA_CPP_PYTHON_VERSION" > "$convert.partial/.version"
  rm -rf "$convert"
  mv "$convert.partial" "$convert"
fi
# Text normalisation: damga's compiled grammars (OpenFst binary transducers) from its source
# package, which holds the same files as its wheels and no platform code. The sha256 pins the
# package; src/text/tn/mod.rs pins each grammar file again. With --build-tools, the outside test
# sets of tests/normalize_upstream.rs: damga's tests/golden and NeMo's test_cases_*.txt as the
# kitten-text-processing source package carries them (tests/upstream); never committed.
DAMGA_SHA256=a8b982887d650f844071a3c5d51452a0ad7c594bd7fb0b602b4288f796c7363e
KITTEN_VERSION=0.1.0
KITTEN_SHA256=14f7d2855c20b4047d6acbb73b1e1c7f1e9fd49b956b2e39f2bd7ff537ec1b31
fetch_sdist() {  # NAME VERSION SHA256 -> path of the checked source package in $home/tn/src
  local sdist="$home/tn/src/$1-$2.tar.gz" attempt
  for attempt in 1 2; do
    if ! echo "$3  $sdist" | sha256sum -c --status 2>/dev/null; then
      rm -f "$sdist"
      "$home/venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$home/tn/src" "$1==$2" >&2
    fi
  done
  if ! echo "$3  $sdist" | sha256sum -c --status; then
    echo "setup: $sdist does not have the sha256 this script pins ($3)" >&2
    return 1
  fi
  echo "$sdist"
}
tn="$home/tn/damga-$DAMGA_VERSION"
if [ ! -f "$tn/.complete" ] || { [ "$build_tools" = 1 ] && [ ! -f "$home/tn/tests/.complete" ]; }; then
  mkdir -p "$home/tn/src"
  damga_sdist="$(fetch_sdist damga "$DAMGA_VERSION" "$DAMGA_SHA256")"
  kitten_sdist=""
  [ "$build_tools" = 1 ] && kitten_sdist="$(fetch_sdist kitten_text_processing "$KITTEN_VERSION" "$KITTEN_SHA256")"
  rm -rf "$tn.partial" "$home/tn/tests.partial"
  "$home/venv/bin/python" - "$damga_sdist" "$tn.partial" "$kitten_sdist" "$home/tn/tests.partial" <<'PY'
import os, sys, tarfile
damga, out, kitten, tests = sys.argv[1:5]
langs = ("en", "de", "fr", "es")
with tarfile.open(damga) as tar:
    for m in tar.getmembers():
        parts = m.name.split("/")  # damga-V/damga/<lang>/tn/compiled/<file>
        if not m.isfile():
            continue
        if parts[1:] in (["LICENSE"], ["NOTICE"]):
            m.name = parts[1]
        elif len(parts) == 6 and parts[1] == "damga" and parts[2] in langs and parts[3:5] == ["tn", "compiled"] \
                and parts[5] in ("read.fst", "write.fst"):
            m.name = f"{parts[2]}/{parts[5]}"
        elif kitten and len(parts) == 5 and parts[1:3] == ["tests", "golden"] and parts[3] in langs and parts[4] == "tn.tsv":
            m.name = f"damga/{parts[3]}/tn.tsv"
            tar.extract(m, tests, filter="data")
            continue
        else:
            continue
        tar.extract(m, out, filter="data")
for lang in langs:
    for f in ("read.fst", "write.fst"):
        if not os.path.isfile(os.path.join(out, lang, f)):
            sys.exit(f"setup: {damga} has no damga/{lang}/tn/compiled/{f}: its layout changed")
if kitten:
    with tarfile.open(kitten) as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")  # kitten_text_processing-V/tests/upstream/<lang>/<file>
            if m.isfile() and len(parts) == 5 and parts[1:3] == ["tests", "upstream"] and parts[3] in langs:
                m.name = os.path.join("nemo", parts[3], parts[4])
                tar.extract(m, tests, filter="data")
            elif m.isfile() and len(parts) == 2 and parts[1] in ("LICENSE", "NOTICE"):
                m.name = os.path.join("nemo", parts[1])
                tar.extract(m, tests, filter="data")
    for lang in langs:
        if not os.path.isdir(os.path.join(tests, "nemo", lang)) or not os.path.isfile(os.path.join(tests, "damga", lang, "tn.tsv")):
            sys.exit(f"setup: no normaliser test set for {lang}: a source package's layout changed")
PY
  touch "$tn.partial/.complete"
  rm -rf "$tn"
  mv "$tn.partial" "$tn"
  if [ -n "$kitten_sdist" ]; then
    touch "$home/tn/tests.partial/.complete"
    rm -rf "$home/tn/tests"
    mv "$home/tn/tests.partial" "$home/tn/tests"
  fi
fi
if [ "$(cat "$home/node/.onebit-reqs" 2>/dev/null)" != "openai@$OPENAI_NODE_VERSION" ]; then
  mkdir -p "$home/node"
  npm install --prefix "$home/node" --no-audit --no-fund --silent "openai@$OPENAI_NODE_VERSION"
  echo "openai@$OPENAI_NODE_VERSION" > "$home/node/.onebit-reqs"
fi

echo "setup: runtime in $home (onnxruntime $ORT_VERSION, onnxruntime-genai $OGA_VERSION, espeak-ng from neutts $NEUTTS_VERSION, grammars of damga $DAMGA_VERSION)"
