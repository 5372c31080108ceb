#!/usr/bin/env bash
# The whole test suite: installs the runtime pieces, generates the test packages, checks format
# and lints, then runs every Rust and Python test. CI runs exactly this.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
bash scripts/gen-test-models.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The stub RyzenAI provider the NPU-route tests load (they build it too, if it is missing).
cargo build --locked -p onebit-stub-ep
cargo test --locked
"$root/.onebit/venv/bin/python" tests/python/test_generated_models.py "$root/target/pytest-models"
"$root/.onebit/venv/bin/python" tests/python/test_stub_ep.py "$root/target/debug/libonebit_stub_ep.so"
"$root/.onebit/venv/bin/python" tests/python/test_onnx_to_gguf.py "$root/target/pytest-gguf" models/tiny models/tiny-random
