#!/usr/bin/env bash
# Regenerates tests/data/neucodec-decoder (the real NeuCodec decoder architecture with random
# weights, exported to ONNX, with torch's and the vendor's streaming decodes of it) and compares
# it with the committed files, or writes them with --write. CI does not run this: torch 2.11 with
# torchaudio and the vendor's packages are a second ~5 GB venv, and tests/neucodec_reference.rs
# needs only the committed outputs. Run it after changing tools/neucodec_reference.py or to
# confirm the committed files (a few minutes the first time; the export itself takes ~1 min).
#
#   .onebit/neucodec-venv   the venv: the vendor's neutts and neucodec at the versions the
#                           reference records, the torch/torchaudio pair neucodec imports, and
#                           the onnxruntime our runtime uses
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.onebit/neucodec-venv"
py="${PYTHON:-python3}"

# torchaudio's wheels pin their torch; neutts pins transformers. neucodec, neutts, torchtune and
# torchdata are installed without their dependency lists (--no-deps), which pip cannot resolve
# together in reasonable time; `reqs` is what importing the decoder classes and the vendor's
# streaming code needs (torchtune's package import pulls in datasets and kagglehub).
reqs="torch==2.11.0 torchaudio==2.11.0 transformers==5.1.0 numpy==2.4.6 onnxruntime==1.31.1 \
onnx==1.23.2 onnxscript==0.7.2 librosa==0.11.0 phonemizer==3.4.0 soundfile==0.13.1 \
vector-quantize-pytorch==1.17.8 local-attention==1.11.2 einops==0.8.2 torchao==0.17.0 \
omegaconf==2.4.0 sentencepiece==0.2.1 psutil==7.2.2 tiktoken==0.14.0 blobfile==3.3.0 \
datasets==5.2.0 kagglehub==1.0.3"
nodeps="neucodec==0.0.6 neutts==1.4.1 torchtune==0.6.1 torchdata==0.11.0"
if [ "$(cat "$venv/.onebit-reqs" 2>/dev/null)" != "$reqs $nodeps" ]; then
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check $reqs
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps $nodeps
  echo "$reqs $nodeps" > "$venv/.onebit-reqs"
fi

case "${1:-}" in
  ""|--write) ;;
  *) echo "usage: scripts/neucodec-reference.sh [--write]" >&2; exit 2 ;;
esac
if [ "${1:-}" = --write ]; then
  exec "$venv/bin/python" "$root/tools/neucodec_reference.py" --out "$root/tests/data/neucodec-decoder"
fi
exec "$venv/bin/python" "$root/tools/neucodec_reference.py" --check "$root/tests/data/neucodec-decoder"
