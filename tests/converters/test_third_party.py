"""Ops other libraries define with torch.library, converted by name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import fastonnx
from support.export_check import ENDS, Fn, check_export


@pytest.mark.parametrize("offsets", [[2, 2, 5, 7], [0, 3, 3, 6], [7, 7, 7, 7], [0, 0, 0, 0], [8, 8, 8, 8]])
def test_transformers_grouped_mm(offsets: list[int]) -> None:
    import transformers.integrations.moe  # noqa: F401  (defines the op)

    g = torch.Generator().manual_seed(0)
    # rows past the last offset stay 0; [0, 0, 0, 0]: no expert owns a row, the map runs no step
    x = torch.randn(8, 5, generator=g)
    w = torch.randn(4, 5, 3, generator=g)
    offs = torch.tensor(offsets, dtype=torch.int32)
    check_export(Fn(torch.ops.transformers.grouped_mm_fallback), (x, w, offs), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
def test_transformers_grouped_mm_float_types(dtype: torch.dtype) -> None:
    """ONNX's sequence ops take no bfloat16: its blocks travel as float32 and the map's body reads
    its rows and weights from the outer scope (onnx.checker with type inference passes; onnxruntime's
    CPU has no bfloat16 MatMul to run it). The other types run in onnx's reference evaluator, which
    passes no outer scope to a SequenceMap body: the body reads nothing from outside."""
    import transformers.integrations.moe  # noqa: F401  (defines the op)
    from onnx.reference import ReferenceEvaluator

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 5, generator=g).to(dtype)
    w = torch.randn(4, 5, 3, generator=g).to(dtype)
    offs = torch.tensor([2, 2, 5, 7], dtype=torch.int32)
    op = Fn(torch.ops.transformers.grouped_mm_fallback)
    want = op(x, w, offs)
    for opset in ENDS:
        proto = fastonnx.to_onnx(op, (x, w, offs), opset=opset).model_proto
        onnx.checker.check_model(proto, full_check=True)
        if dtype == torch.bfloat16:
            continue
        feeds = dict(
            zip([i.name for i in proto.graph.input], [x.numpy(), w.numpy(), offs.numpy()], strict=True)
        )
        (got,) = ReferenceEvaluator(proto).run(None, feeds)
        torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, rtol=1e-3, atol=1e-3)
