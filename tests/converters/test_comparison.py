"""Comparison, logical and float-predicate converters against OpInfo samples and hand-written cases."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, opinfo_cases

OPS = [
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "isnan",
    "isinf",
    "isposinf",
    "isneginf",
    "isfinite",
    "isreal",
    "signbit",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "isclose",
]
HALF_OPS = OPS
INT_OPS = [op for op in OPS if op != "isclose"]


@pytest.mark.parametrize(
    ("op_name", "dtype"), opinfo_cases(OPS, float16=HALF_OPS, int64=INT_OPS, bool=INT_OPS)
)
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


def _all_comparisons(a: Any, b: Any) -> tuple[torch.Tensor, ...]:
    return (a == b, a != b, a < b, a <= b, a > b, a >= b)


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bool]
)
def test_comparison_dtypes(dtype: torch.dtype) -> None:
    a = torch.tensor([0, 1, 2, 3, 1], dtype=dtype)
    b = torch.tensor([1, 1, 0, 3, 0], dtype=dtype)
    check_export(Fn(lambda x, y: _all_comparisons(x, y) + _all_comparisons(x, 1)), (a, b), opsets=ENDS)


def test_mixed_promotion() -> None:
    # int tensor vs float scalar compares as float (2 > 2.5 is False, not 2 > 2); int vs float tensor
    i = torch.tensor([1, 2, 3, 4])
    f = torch.tensor([1.5, 2.0, 2.5, 4.0])
    h = torch.tensor([1.5, 2.0, 2.5, 4.0], dtype=torch.float16)

    def fn(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            _all_comparisons(x, 2.5)
            + _all_comparisons(x, y)
            + _all_comparisons(z, 2.0001)
            + (x.ge(2), y.le(x))
        )

    check_export(Fn(fn), (i, f, h), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_special_values(dtype: torch.dtype) -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -2.0], dtype=dtype)
    y = torch.tensor([float("nan"), float("inf"), float("inf"), -0.0, 0.0, 1.0 + 1e-6, -2.5], dtype=dtype)

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _all_comparisons(a, b) + (
            a.isnan(),
            a.isinf(),
            a.isposinf(),
            a.isneginf(),
            a.isfinite(),
            a.signbit(),
            torch.isclose(a, b),
            torch.isclose(a, b, equal_nan=True),
            torch.isclose(a, b, rtol=0, atol=0),
            torch.logical_and(a, b),
            torch.logical_not(a),
            torch.logical_xor(a, b),
        )

    check_export(Fn(fn), (x, y), opsets=ENDS)


class IntPredicates(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.isnan(), x.isinf(), x.isfinite(), x.signbit(), torch.logical_not(x)


def test_integer_predicates_dynamic() -> None:
    batch = torch.export.Dim("batch")
    check_export(
        IntPredicates(),
        (torch.tensor([[-1, 0, 3], [2, -2, 0]]),),
        opsets=ENDS,
        dynamic_shapes=({0: batch},),
        run_args=[(torch.tensor([[-1, 0, 3], [4, -5, 6], [7, 8, -9]]),)],
    )


class LongNames(torch.nn.Module):
    """torch's long comparison names under ``torch.no_grad()``: the body torch.export captures in
    ``wrap_with_set_grad_enabled`` keeps them as called (DBRX's ``torch.greater``)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            return (
                torch.greater(a, b),
                torch.greater(a, 0.5),
                torch.greater_equal(a, b),
                torch.greater_equal(a, 0.5),
                torch.less(a, b),
                torch.less(a, 0.5),
                torch.less_equal(a, b),
                torch.less_equal(a, 0.5),
                torch.not_equal(a, b),
                torch.not_equal(a, 0.5),
            )


def test_long_comparison_names() -> None:
    a = torch.tensor([0.0, 0.5, 1.0, 0.25, 0.5])
    b = torch.tensor([0.5, 0.5, 0.0, 1.0, 0.25])
    check_export(LongNames(), (a, b), opsets=ENDS)
