#!/usr/bin/env bash
# Installs everything fastonnx needs (a Python environment with the pinned torch stack, the Rust
# extension built in release mode), then runs an example export. Safe to run again: it reuses the
# environment it finds at $FASTONNX_ENV (default ~/.fastonnx-env, outside the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

command -v cargo >/dev/null || { echo "cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
if [ ! -x "$FASTONNX_ENV/bin/python" ]; then
    echo "creating the Python environment in $FASTONNX_ENV (torch is a ~3 GB download, once per machine)"
    python3 -m venv "$FASTONNX_ENV"
    python -m pip install -q --upgrade pip
fi

# constraints.txt pins the tested versions; pyproject.toml declares the ranges. pip skips what is
# already installed at the pinned version, so a reused environment costs only the Rust build.
python -m pip install -q -c constraints.txt "maturin>=1.9,<2"
# clients: ultralytics + onnxslim for tests/models/test_clients.py (~145 MB of wheels, mostly opencv and polars)
# quantization: torchao for the PT2E / QAT tests; genai: onnxruntime-genai (runs exported packages)
python -m pip install -q -c constraints.txt -e ".[test,bench,clients,quantization,genai]"
python examples/quickstart.py
