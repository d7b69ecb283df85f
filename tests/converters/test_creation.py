"""Creation converters (arange, full/zeros/ones and their _like / new_ variants, eye, linspace) against
OpInfo samples, plus static-vs-symbolic sizes and the empty family (whose values are arbitrary)."""

from __future__ import annotations

import pytest
import torch

import fastonnx
from support.export_check import ENDS, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, ci_sample_limit, opinfo_cases

OPS = [
    "arange", "linspace", "eye", "full", "zeros", "ones", "new_full", "new_zeros", "new_ones",
    "full_like", "zeros_like", "ones_like", "scalar_tensor", "fill", "zero_", "logspace",
    "logspace.tensor_overload", "linspace.tensor_overload",
]  # fmt: skip
# empty, new_empty, empty_like: the values are arbitrary, so OpInfo's value comparison cannot apply;
# test_empty_family checks their shapes and dtypes instead.
# no bool kernel in eager torch
NO_BOOL = {"arange", "linspace", "logspace", "logspace.tensor_overload", "linspace.tensor_overload"}


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS, float16=OPS, int64=OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


def test_kaiser_window() -> None:
    # signal.windows.kaiser reaches linspace with tensor endpoints (float32 only in OpInfo)
    assert_op_converts("signal.windows.kaiser", ENDS, limit=ci_sample_limit())


@pytest.mark.parametrize("op_name", ["full", "zeros", "ones", "full_like", "new_ones"])
def test_bfloat16(op_name: str) -> None:
    # ConstantOfShape takes a bfloat16 value from opset 20: below, it is filled in float32 and cast
    assert_op_converts(op_name, (17, fastonnx.MAX_OPSET), dtype=torch.bfloat16, limit=2)


@pytest.mark.parametrize("op_name", [op for op in OPS if op not in NO_BOOL])
def test_bool(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.bool, limit=2)


def test_empty_family() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (
                torch.empty(2, 3, dtype=torch.int32),
                x.new_empty((4, 1)),
                torch.empty_like(x, dtype=torch.float16),
                torch.empty_strided((2, 2), (1, 2)),
            )

    x = torch.randn(3, 5)
    for opset in ENDS:
        got = fastonnx.to_onnx(M(), (x,), opset=opset)(x)
        expected = M()(x)
        assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in expected]


def test_static_sizes_make_no_shape_node() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.arange(4) + x.new_ones(3, 4) + torch.zeros_like(x)

    (result,) = check_export(M(), (torch.randn(3, 4),), opsets=(fastonnx.MAX_OPSET,))
    ops = {n.op_type for n in result.model_proto.graph.node}
    assert "Shape" not in ops and "Range" not in ops


def test_symbolic_sizes() -> None:
    class M(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
            b, s = ids.shape
            pos = torch.arange(s).unsqueeze(0).expand(b, -1)
            mask = ids.new_ones(b, s, dtype=torch.bool)
            full = torch.full((s, 2), 7, dtype=torch.int64)
            return pos + ids, mask, full, torch.ones_like(ids, dtype=torch.float32), torch.eye(s)

    batch = torch.export.Dim("batch", max=16)
    seq = torch.export.Dim("seq", max=64)
    check_export(
        M(),
        (torch.randint(0, 9, (2, 5)),),
        dynamic_shapes={"ids": {0: batch, 1: seq}},
        run_args=[(torch.randint(0, 9, (3, 9)),)],
    )
