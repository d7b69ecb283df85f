# Sourced by the other scripts: where the Python environment lives. It is kept OUTSIDE the checkout so
# that a fresh clone (and CI) reuses the ~6 GB of torch and friends instead of downloading them again.
# Override with FASTONNX_ENV=/path/to/venv.
FASTONNX_ENV="${FASTONNX_ENV:-$HOME/.fastonnx-env}"
export FASTONNX_ENV
export VIRTUAL_ENV="$FASTONNX_ENV"
export PATH="$FASTONNX_ENV/bin:$PATH"
