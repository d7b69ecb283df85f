"""Ops other libraries define with torch.library, converted by name."""

from __future__ import annotations

import pytest
import torch

from support.export_check import ENDS, Fn, check_export


@pytest.mark.parametrize("offsets", [[2, 2, 5, 7], [0, 3, 3, 6], [7, 7, 7, 7]])
def test_transformers_grouped_mm(offsets: list[int]) -> None:
    import transformers.integrations.moe  # noqa: F401  (defines the op)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 5, generator=g)  # the last rows are past every offset: they stay 0
    w = torch.randn(4, 5, 3, generator=g)
    offs = torch.tensor(offsets, dtype=torch.int32)
    check_export(Fn(torch.ops.transformers.grouped_mm_fallback), (x, w, offs), opsets=ENDS)
