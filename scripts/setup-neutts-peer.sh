#!/usr/bin/env bash
# Makes the vendor's whole streaming pipeline peer for `onebit-tts bench --peers` (without
# --engine-only): benches/peers/neutts_stream.py runs the PyPI package neutts's own infer_stream on
# llama.cpp with a GGUF and its NeuCodec ONNX decoder. Bench only; CI never runs this.
# Idempotent: a second run only checks.
#
#   .onebit/neutts-peer/venv   a venv holding neutts (--no-deps: its torch, transformers, librosa and
#                              neucodec are left out; neutts_stream.py stubs what its GGUF + ONNX
#                              path never calls), phonemizer, onnxruntime, gguf and numpy, plus a
#                              .pth file that puts .onebit/llama/venv's packages on its path, so it
#                              imports the llama_cpp that scripts/setup-llama-peer.sh built (run
#                              first, from here) instead of building llama.cpp a second time
#
# Not .onebit/neutts: scripts/setup.sh keeps the neutts wheel's espeak-ng and voices there.
#
# Environment: PYTHON (python for the venv; the llama venv's minor version, since the .pth reuses
# its compiled packages), LLAMA_JOBS (passed on to scripts/setup-llama-peer.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

"$root/scripts/setup-llama-peer.sh"

mkdir -p "$root/.onebit/neutts-peer"
# The physical path: .onebit may be a link shared by several checkouts, and the .pth must keep
# working from every one of them.
home="$(cd "$root/.onebit/neutts-peer" && pwd -P)"
llama_py="$root/.onebit/llama/venv/bin/python"
py="${PYTHON:-python3}"

# The runtime venv's versions (scripts/setup.sh), so the peer's ONNX Runtime is the one ours runs.
pin() { sed -n "s/^$1=//p" "$root/scripts/setup.sh"; }
NEUTTS_VERSION="$(pin NEUTTS_VERSION)"
ORT_VERSION="$(pin ORT_VERSION)"
GGUF_VERSION="$(pin GGUF_VERSION)"
NUMPY_VERSION="$(sed -n 's/.*numpy==\([0-9.]*\).*/\1/p' "$root/scripts/setup.sh" | head -n 1)"
: "${NEUTTS_VERSION:?cannot read NEUTTS_VERSION from scripts/setup.sh}"
: "${ORT_VERSION:?cannot read ORT_VERSION from scripts/setup.sh}"
: "${GGUF_VERSION:?cannot read GGUF_VERSION from scripts/setup.sh}"
: "${NUMPY_VERSION:?cannot read the numpy pin from scripts/setup.sh}"
# The phonemizer the vendor's front end was compared against (README: byte-identical phonemes).
PHONEMIZER_VERSION=3.4.0
# numpy >= 2.2.6 is what neutts 1.4.1 asks for; the runtime venv's pin satisfies it.
deps="phonemizer==$PHONEMIZER_VERSION onnxruntime==$ORT_VERSION gguf==$GGUF_VERSION numpy==$NUMPY_VERSION"
want="neutts==$NEUTTS_VERSION $deps"
stamp="$home/.stamp"

if [ ! -x "$home/venv/bin/python" ]; then
  "$py" -m venv "$home/venv"
fi
vpy="$home/venv/bin/python"
minor='import sys; print("%d.%d" % sys.version_info[:2])'
if [ "$("$vpy" -c "$minor")" != "$("$llama_py" -c "$minor")" ]; then
  echo "setup-neutts-peer: $home/venv and .onebit/llama/venv run different Pythons; remove $home/venv and run again with PYTHON set to the llama venv's" >&2
  exit 1
fi
llama_site="$("$llama_py" -c 'import os, sysconfig; print(os.path.realpath(sysconfig.get_paths()["purelib"]))')"
site="$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pth="$site/onebit-llama-venv.pth"
if [ "$(cat "$pth" 2>/dev/null)" != "$llama_site" ]; then
  echo "$llama_site" > "$pth"
fi

# neutts itself is only found, not imported: it imports torch and librosa at module level, which
# neutts_stream.py stubs.
imports='import importlib.util, llama_cpp, phonemizer, onnxruntime, gguf, numpy
assert importlib.util.find_spec("neutts"), "no neutts"'
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$vpy" -c "$imports" 2>/dev/null; then
  echo "setup-neutts-peer: installing $want into $home/venv" >&2
  "$vpy" -m pip install -q --disable-pip-version-check --no-deps "neutts==$NEUTTS_VERSION"
  # shellcheck disable=SC2086  # one word per requirement
  "$vpy" -m pip install -q --disable-pip-version-check $deps
  "$vpy" -c "$imports"
  echo "$want" > "$stamp"
fi

report='from importlib.metadata import version as v
import os, llama_cpp
print(", ".join(n + " " + v(n) for n in ("neutts", "phonemizer", "onnxruntime", "gguf", "numpy"))
      + ", llama-cpp-python " + llama_cpp.__version__ + " (" + os.path.dirname(llama_cpp.__file__) + ")")'
versions="$("$vpy" -c "$report")"
echo "setup-neutts-peer: $home/venv: $versions"
echo "setup-neutts-peer: $pth -> $llama_site"
echo "setup-neutts-peer: bench python $vpy, script benches/peers/neutts_stream.py"
echo "setup-neutts-peer: next: target/release/onebit-tts bench --model MODEL_DIR --peers --llama-gguf GGUF"
