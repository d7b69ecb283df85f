"""CI's sample of a test matrix: a fixed, deterministic subset of the cases by default (one representative
of each architecture family and code path, named by the test), every case with ``FASTONNX_FULL_MATRIX=1``
(the sweep)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

FULL = os.environ.get("FASTONNX_FULL_MATRIX") == "1"
"""Whether this run checks every case of every sampled matrix."""


def sampled(every: Iterable[T], in_ci: Callable[[T], bool]) -> list[T]:
    """The cases of ``every`` that ``in_ci`` keeps, in order; all of them under ``FASTONNX_FULL_MATRIX=1``."""
    cases = list(every)
    return cases if FULL else [case for case in cases if in_ci(case)]


def rotated_conversions(
    index: int, opsets: Sequence[int], settings: Sequence[bool | str], shift: Mapping[bool | str, int]
) -> list[tuple[int, bool | str]]:
    """The (opset, optimize) pairs the ``index``-th model of a list converts at in CI: each setting
    once, at ``opsets[(index + shift[setting]) % len(opsets)]``, so that consecutive models take the
    opsets in turn and the list as a whole converts at every pair (with at least ``len(opsets)``
    models); every pair under ``FASTONNX_FULL_MATRIX=1``."""
    every = [(opset, opt) for opset in opsets for opt in settings]
    return sampled(every, lambda c: opsets.index(c[0]) == (index + shift[c[1]]) % len(opsets))
