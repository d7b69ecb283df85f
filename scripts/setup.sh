#!/usr/bin/env bash
# Installs everything fastonnx needs (Python env with the pinned torch stack, the Rust extension),
# then runs an example export. Safe to run again: it reuses the environment it finds.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

if [ ! -x "$FASTONNX_ENV/bin/python" ]; then
    echo "creating the Python environment in $FASTONNX_ENV"
    python3 -m venv "$FASTONNX_ENV"
    python -m pip install -q --upgrade pip
fi
command -v cargo >/dev/null || { echo "cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }

# constraints.txt pins the tested versions; pyproject.toml declares the ranges.
python -m pip install -q -c constraints.txt "maturin>=1.9,<2"
python -m pip install -q -c constraints.txt -e ".[test,bench]"
python examples/quickstart.py
