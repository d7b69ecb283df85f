"""Tests import their helpers (export_check) from this folder."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs; nothing is downloaded

from support.worker_threads import one_thread_per_worker  # found through the path above

one_thread_per_worker()  # before any test imports numpy's BLAS
