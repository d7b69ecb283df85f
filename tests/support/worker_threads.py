"""One compute thread a pytest-xdist worker: ``-n 2`` on a 2-core machine otherwise runs two torch (and
OpenMP / BLAS) thread pools per core, and the suite waits on the oversubscription. Measured on four
test files at ``-n 2``: 116 s with every pool, 100 s with one thread a worker; onnxruntime's own pool
left as it is (one thread a session measured slower: 105 s). A plain ``pytest`` keeps every thread."""

from __future__ import annotations

import os


def one_thread_per_worker() -> None:
    """Under xdist with more than one worker: OpenMP's and torch's intra-op pools at one thread (a
    thread count the environment names is kept)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
