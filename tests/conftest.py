"""Tests import their helpers (export_check) from this folder."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs; nothing is downloaded

from support.worker_threads import one_thread_per_worker  # found through the path above

one_thread_per_worker()  # before any test imports numpy's BLAS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``full_matrix`` cases unless FASTONNX_FULL_MATRIX=1 (support.matrix.FULL): neither
    passed nor skipped. pytest's summary counts them as deselected (under xdist the workers deselect, and
    the summary leaves them out); ``--collect-only`` names them."""
    from support.matrix import FULL

    if FULL:
        return
    kept = [item for item in items if item.get_closest_marker("full_matrix") is None]
    if len(kept) != len(items):
        deselected = [item for item in items if item.get_closest_marker("full_matrix") is not None]
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
