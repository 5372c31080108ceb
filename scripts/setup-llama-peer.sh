#!/usr/bin/env bash
# Builds the llama.cpp peer for `onebit-tts bench --engine-only --peers`, whose llama_cpp the
# vendor's pipeline peer (scripts/setup-neutts-peer.sh, `bench --peers`) imports too (bench only;
# CI never runs this). Idempotent: a second run only checks.
#
#   .onebit/llama/src     the llama-cpp-python source package from the Python package index; it
#                         vendors llama.cpp (with its CMake build) and the matching gguf-py
#   .onebit/llama/build   the CMake build tree (CPU only, Release, -march=native, only the llama and
#                         ggml libraries: no tools, examples, tests, server or mtmd), kept so a
#                         rerun rebuilds incrementally
#   .onebit/llama/venv    a venv of its own holding llama-cpp-python built from that source: the
#                         bench drives exact token ids through its low-level C API bindings
#                         (benches/peers/llama_bench.py); kept apart from .onebit/venv so the
#                         runtime/test venv does not change
#
# llama-cpp-python rather than the llama.cpp tools (llama-bench, llama-cli): the bench must feed
# the very prompt ids the other engines get and make exactly N greedy tokens with a warm-up and a
# fresh context per run, which its ctypes bindings of llama.h allow without patching any tool.
#
# Then make the GGUF: .onebit/venv/bin/python tools/onnx_to_gguf.py models/real-shape
# (writes models/real-shape/model-q4_0.gguf; needs `gguf`, which scripts/setup.sh installs).
#
# Environment: LLAMA_JOBS (build jobs, default: all cores), PYTHON (python for the venv).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$root/.onebit/llama/src"
# The physical path: .onebit may be a link shared by several checkouts, and CMake's cache
# remembers the directory it was made in.
home="$(cd "$root/.onebit/llama" && pwd -P)"
py="${PYTHON:-python3}"

# The version scripts/setup.sh unpacks llama.cpp's converter from: one llama.cpp for both.
LLAMA_CPP_PYTHON_VERSION="$(sed -n 's/^LLAMA_CPP_PYTHON_VERSION=//p' "$root/scripts/setup.sh")"
: "${LLAMA_CPP_PYTHON_VERSION:?cannot read LLAMA_CPP_PYTHON_VERSION from scripts/setup.sh}"
CMAKE_ARGS_PEER="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
-DGGML_RPC=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF"
want="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION $CMAKE_ARGS_PEER"
stamp="$home/.stamp"

if [ ! -x "$home/venv/bin/python" ]; then
  "$py" -m venv "$home/venv"
fi
vpy="$home/venv/bin/python"

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$vpy" -c 'import llama_cpp' 2>/dev/null; then
  sdist="$home/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  if [ ! -f "$sdist" ]; then
    "$vpy" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
      -d "$home/src" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  fi
  cache="$home/build/CMakeCache.txt"
  if [ -f "$cache" ] && ! grep -qx "CMAKE_CACHEFILE_DIR:INTERNAL=$home/build" "$cache"; then
    rm -rf "$home/build"  # made under another path: start it again
  fi
  jobs="${LLAMA_JOBS:-$(nproc)}"
  echo "setup-llama-peer: building llama.cpp (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION) with $jobs jobs; minutes on 2 cores" >&2
  CMAKE_ARGS="$CMAKE_ARGS_PEER" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
    "$vpy" -m pip install -q --disable-pip-version-check --no-binary llama-cpp-python \
      --config-settings=build-dir="$home/build" \
      --config-settings=cmake.build-type=Release \
      "$sdist"
  echo "$want" > "$stamp"
fi

ver="$("$vpy" -c 'import llama_cpp; print(llama_cpp.__version__)')"
lib="$("$vpy" -c 'import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib"))')"
sysinfo="$("$vpy" -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode().strip())')"
echo "setup-llama-peer: llama-cpp-python $ver in $home/venv (libraries in $lib)"
echo "setup-llama-peer: llama.cpp system info: $sysinfo"
echo "setup-llama-peer: bench python $vpy, script benches/peers/llama_bench.py"
echo "setup-llama-peer: next: .onebit/venv/bin/python tools/onnx_to_gguf.py MODEL_DIR  (writes MODEL_DIR-q4_0.gguf beside it)"
