#!/usr/bin/env bash
# The whole test suite: installs the runtime pieces, generates the test packages, checks format
# and lints, then runs every Rust and Python test. CI runs exactly this.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh --build-tools
# `cargo clippy` (check mode) and `cargo test` (build mode) each run the C/C++ build scripts of
# llama-cpp-sys-2 (llama.cpp, ~4 min on 2 cores) and opusic-sys (libopus) in an OUT_DIR of their
# own. With ccache as CMake's compiler launcher the second build is all cache hits; BASEDIR makes
# the two OUT_DIRs' paths hash alike (NOHASHDIR: Release builds carry no debug paths).
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$(realpath -m "${CARGO_TARGET_DIR:-$root/target}")" CCACHE_NOHASHDIR=true
fi
bash scripts/gen-test-models.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The stub RyzenAI provider the NPU-route tests load (they build it too, if it is missing).
cargo build --locked -p onebit-stub-ep
cargo test --locked
"$root/.onebit/venv/bin/python" tests/python/test_generated_models.py "$root/target/pytest-models"
"$root/.onebit/venv/bin/python" tests/python/test_stub_ep.py "$root/target/debug/libonebit_stub_ep.so"
"$root/.onebit/venv/bin/python" tests/python/test_onnx_to_gguf.py "$root/target/pytest-gguf" models/tiny models/tiny-random
"$root/.onebit/venv/bin/python" tests/python/test_normalizer_parity.py "$root/target/debug/onebit-tts"
"$root/.onebit/venv/bin/python" tests/python/test_captions.py "$root/target/debug/onebit-tts" models/tiny "$root/target/pytest-captions"
# The release package of the test build (no release build in CI: the package's mechanics, not
# its optimisation, are under test), then the container image made from it: two replicas behind
# haproxy sharing a voice store, one drained under load (~3.5 min on a fresh machine, which
# makes the Debian base first; ~30 s where the base image is cached); the Kubernetes manifests
# rendered and validated, and the cpu Deployment run with podman kube play on that image.
rm -rf "$root/target/replicas-dist"
bash scripts/package.sh --binary "$root/target/debug/onebit-tts" --out "$root/target/replicas-dist"
# The same package where only scripts/quickstart.sh ran: a CARGO_HOME holding what a release
# build fetched (no dev-dependencies), offline, must give it with the same licences (~30 s).
bash scripts/package-check.sh --binary "$root/target/debug/onebit-tts" \
  --compare "$(echo "$root"/target/replicas-dist/onebit-tts-*-linux-x86_64.tar.gz)"
bash scripts/replicas-test.sh "$root"/target/replicas-dist/onebit-tts-*-linux-x86_64.tar.gz
# The image build's choices per variant (bases, the Mesa check, the npu cache), offline (~1 s).
bash scripts/image-check.sh
bash scripts/k8s-check.sh
K8S_PLAY_IMAGE=onebit-tts:replicas-test bash scripts/k8s-check.sh --play
