#!/usr/bin/env bash
# The test command: commit subjects (scripts/check_subjects.sh), Rust lints and tests, Python lints,
# mypy --strict over the package (settings in pyproject.toml; its cache is .mypy_cache), then pytest
# (which also checks the .pyi stubs).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`. No test collected is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

bash scripts/check_subjects.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
ruff check python tests benches scripts examples
ruff format --check python tests benches scripts examples
mypy

set +e
# one compute thread a worker: two workers are the parallelism (tests/support/worker_threads.py);
# worksteal: an idle worker takes queued tests from the busy one (under `load` one worker finished
# 145 s before the other at 6691f30)
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" python -m pytest -q -n 2 --dist worksteal "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit "$rc"
