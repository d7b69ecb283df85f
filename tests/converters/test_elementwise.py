"""Elementwise converters against torch's OpInfo samples, at both ends of the opset range."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, opinfo_cases

OPS = [
    "add",
    "sub",
    "mul",
    "rsub",
    "div.no_rounding_mode",
    "div.trunc_rounding",
    "div.floor_rounding",
    "true_divide",
    "floor_divide",
    "remainder",
    "fmod",
    "pow",
    "float_power",
    "neg",
    "abs",
    "sign",
    "sgn",
    "square",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "atan2",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "tanh",
    "sigmoid",
    "erf",
    "erfc",
    "floor",
    "ceil",
    "round",
    "round.decimals_0",
    "round.decimals_3",
    "round.decimals_neg_3",
    "trunc",
    "frac",
    "clamp",
    "clamp_min",
    "clamp_max",
    "minimum",
    "maximum",
    "max.binary",
    "min.binary",
    "fmin",
    "fmax",
    "lerp",
    "addcmul",
    "addcdiv",
    "hypot",
    "copysign",
    "heaviside",
    "logaddexp",
    "logaddexp2",
    "positive",
    "deg2rad",
    "rad2deg",
    "sinc",
    "logit",
    "nan_to_num",
    "xlogy",
    "special.xlog1py",
    "special.ndtr",
    "special.entr",
    "ldexp",
    "where",
    "masked_fill",
    "clone",
    "alias_copy",
    "contiguous",
    "to",
    "bool",
    "byte",
    "char",
    "double",
    "float",
    "half",
    "int",
    "long",
    "short",
    "__radd__",
    "__rsub__",
    "__rmul__",
    "__rdiv__",
    "__rpow__",
    "__rmod__",
    "resolve_conj",
    "resolve_neg",
]
INT_OPS = [
    "add",
    "sub",
    "mul",
    "rsub",
    "div.no_rounding_mode",
    "div.trunc_rounding",
    "div.floor_rounding",
    "floor_divide",
    "remainder",
    "fmod",
    "pow",
    "neg",
    "abs",
    "sign",
    "square",
    "floor",
    "ceil",
    "round",
    "trunc",
    "clamp",
    "minimum",
    "maximum",
    "where",
    "masked_fill",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_not",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "__rand__",
    "__ror__",
    "__rxor__",
    "sqrt",
    "exp",
    "sigmoid",
    "to",
    "float",
]
# dtype conversions and aliases do not depend on the input dtype; float_power computes in float64
HALF_OPS = [
    op
    for op in OPS
    if op not in ("float_power", "bool", "byte", "char", "double", "float", "half", "int", "long", "short")
    and op not in ("clone", "alias_copy", "contiguous", "resolve_conj", "resolve_neg", "positive")
]


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS, float16=HALF_OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


@pytest.mark.parametrize("op_name", INT_OPS)
def test_int64(op_name: str) -> None:
    opsets = (18, ENDS[-1]) if op_name.startswith(("bitwise", "__r")) else ENDS
    assert_op_converts(op_name, opsets, dtype=torch.int64, limit=2)


# ---- hand-written cases: modes, dtypes and values the OpInfo samples do not reach ---------------


def _signed_operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.tensor([7, -7, 7, -7, 0, 5, -6, 100, -100], dtype=dtype)
    b = torch.tensor([2, 2, -2, -2, 3, -5, 4, 7, 7], dtype=dtype)
    return a, b


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        lambda a, b: a // b,
        lambda a, b: torch.remainder(a, b),
        lambda a, b: torch.fmod(a, b),
        lambda a, b: a % 3,
        lambda a, b: a // -3,
        lambda a, b: a / b,
    ],
    ids=["floor", "trunc", "floordiv", "remainder", "fmod", "mod_scalar", "floordiv_scalar", "truediv"],
)
def test_integer_division(fn: Callable[..., Any], dtype: torch.dtype) -> None:
    check_export(Fn(fn), _signed_operands(dtype), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_float_floor_division_is_exact(dtype: torch.dtype) -> None:
    # 1 // 0.1 is 9 in torch (the quotient 10.000000000000000555 rounds up); floor(1 / 0.1) is 10
    a = torch.tensor([1.0, -1.0, 7.5, -7.5, 0.0, -0.0, 3.0, 1.0, -2.0, 5.0], dtype=dtype)
    b = torch.tensor([0.1, 0.1, 2.0, 2.0, -3.0, 3.0, 0.0, -0.0, -0.7, float("inf")], dtype=dtype)
    check_export(Fn(lambda x, y: torch.div(x, y, rounding_mode="floor")), (a, b), atol=0, rtol=0)
    check_export(Fn(torch.remainder), (a, b), atol=1e-6, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_shifts(dtype: torch.dtype) -> None:
    if dtype == torch.uint8:
        a = torch.tensor([1, 3, 255, 128, 7, 200, 9], dtype=dtype)
    else:
        a = torch.tensor([1, -3, 100, -128 if dtype == torch.int8 else -1000, 7, -1, 0], dtype=dtype)
    s = torch.tensor([0, 1, 3, 7, 8, 5, 2], dtype=dtype)
    check_export(Fn(lambda x, y: (x << y, x >> y, x << 2, x >> 3)), (a, s), opsets=ENDS)
    big = torch.tensor([1, 2, 3, 4, 5, 6, 7], dtype=dtype) * 9  # shifts of the whole width or more
    big = torch.minimum(big, torch.tensor(63, dtype=dtype))
    check_export(Fn(lambda x, y: (x << y, x >> y)), (a, big), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool])
def test_bitwise(dtype: torch.dtype) -> None:
    a = torch.tensor([0, 1, 5, 6, 1], dtype=dtype)
    b = torch.tensor([1, 1, 3, 0, 0], dtype=dtype)
    one = True if dtype == torch.bool else 1  # bool & int would promote to int64
    fn = Fn(
        lambda x, y: (x & y, x | y, x ^ y, ~x, torch.bitwise_and(x, one), x | one, torch.bitwise_xor(one, y))
    )
    check_export(fn, (a, b), opsets=(ENDS[-1],) if dtype != torch.bool else ENDS)
    if dtype == torch.int8:
        check_export(Fn(lambda x: ~x), (a,), opsets=ENDS)  # signed bitwise_not needs no BitwiseNot


def test_integer_bitwise_and_needs_opset_18() -> None:
    import fastonnx

    args = (torch.tensor([1, 2]), torch.tensor([3, 3]))
    ep = torch.export.export(Fn(lambda x, y: x & y), args)
    with pytest.raises(fastonnx.OpsetError, match="opset >= 18"):
        fastonnx.to_onnx(ep, args, opset=17)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_integer_unary_and_minmax(dtype: torch.dtype) -> None:
    a = torch.tensor([0, 1, 5, 100, 3], dtype=dtype)
    b = torch.tensor([2, 1, 7, 20, 3], dtype=dtype)
    if dtype != torch.uint8:
        a = a - 3
    fn = Fn(
        lambda x, y: (
            -x,
            x.abs(),
            x.sign(),
            torch.maximum(x, y),
            torch.minimum(x, y),
            x.clamp(1, 50),
            x.clamp(min=y),
            x * x,
            x**2,
            x**3,
            torch.pow(x.clamp(0, 3), y.clamp(0, 3)),
            torch.where(x > y, x, y),
            x.masked_fill(x > 2, 9),
            x + y * 2,
            torch.add(x, y, alpha=3),
        )
    )
    check_export(fn, (a, b), opsets=ENDS)


def test_bool_arithmetic() -> None:
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    fn = Fn(
        lambda x, y: (
            x + y,
            x * y,
            torch.where(x, y, False),
            torch.maximum(x, y),
            torch.minimum(x, y),
            x.sign(),
            x.masked_fill(y, True),
            x + 1,
            x * 2.5,
            x.float() / 2,
        )
    )
    check_export(fn, (a, b), opsets=ENDS)


def test_scalar_promotion() -> None:
    i = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    h = torch.tensor([0.1, 0.2, 3.5, 4.0], dtype=torch.float16)
    fn = Fn(
        lambda x, y: (x * 2.5, x + 1, x / 2, y * 3.3, y + 1, y + x, x - 0.5, 2**x, 2.0**y, x.clamp(0.5, 2.5))
    )
    check_export(fn, (i, h), opsets=ENDS, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -0.5, -1, -2, 1, 0, 1.7, -3])
def test_pow_exponents(exponent: float) -> None:
    x = torch.tensor([0.5, 1.0, 2.0, 3.0, 10.0])
    check_export(Fn(lambda t: t**exponent), (x,), opsets=ENDS)


def test_dtype_conversions() -> None:
    x = torch.tensor([[-2.7, -0.5, 0.0, 0.4, 3.9, 250.0]])

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            t.to(torch.int32),
            t.to("cpu", torch.float16),
            t.to(dtype=torch.int64, memory_format=torch.preserve_format),
            t.to(torch.bool),
            t.type_as(torch.tensor([1], dtype=torch.int16)),
            t.half().float(),
            t.to("cpu"),
            t.clone(memory_format=torch.contiguous_format),
            t.detach(),
            t.contiguous(),
        )

    check_export(Fn(fn), (x,), opsets=ENDS)


def test_copy_broadcasts_and_casts() -> None:
    check_export(
        Fn(lambda x, y: torch.ops.aten.copy(x, y)), (torch.zeros(2, 3), torch.arange(3)), opsets=ENDS
    )


def test_inplace_variants() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = x.clone()
        z.add_(y, alpha=2).mul_(3).sub_(1).div_(2).clamp_(-5, 5)
        z.masked_fill_(z > 4, 0.0)
        z[0].copy_(y)
        return z.pow_(2).neg_()

    check_export(Fn(fn), (torch.randn(3, 4), torch.randn(4)), opsets=ENDS)


def test_special_values() -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -2.0, 1e-20])
    y = torch.tensor([1.0, float("nan"), 2.0, -0.0, 0.0, float("inf"), -float("inf"), -1.0])

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.maximum(a, b),
            torch.minimum(a, b),
            torch.fmax(a, b),
            torch.fmin(a, b),
            a.clamp(-1, 1),
            a.clamp(min=b),
            a.clamp(float("nan"), 1.0),
            torch.nan_to_num(a),
            torch.nan_to_num(a, 1.0, 2.0, -3.0),
            torch.xlogy(a, b),
            torch.copysign(b, a),
            torch.atan2(a, b),
            torch.logaddexp(a, b),
            torch.heaviside(a, b),
            torch.sign(a),
            torch.trunc(a),
            torch.frac(b),
            torch.hypot(a, b),
            torch.sinc(a),
            torch.where(a > b, a, b),
        )

    check_export(Fn(fn), (x, y), opsets=ENDS)


def test_accurate_near_zero_and_tails() -> None:
    # expm1 / log1p of tiny values and erfc of large ones: relative error matters (no atol)
    x = torch.tensor([1e-10, -1e-8, 3e-6, 0.3, -0.7, 2.0, 5.0, 9.0, -3.0, 20.0])
    fn = Fn(lambda t: (torch.expm1(t), torch.log1p(t.abs()), torch.erfc(t)))
    check_export(fn, (x,), opsets=ENDS, atol=0, rtol=2e-6)


class Dynamic(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.ops.aten.copy(x, y),
            torch.ops.aten.copy(x, x.int()),
            x.masked_fill(x > 0, -1.0),
            torch.where(x > 0, 1.0, y),
            x.isnan(),
        )


def test_dynamic_shapes() -> None:
    batch = torch.export.Dim("batch")
    check_export(
        Dynamic(),
        (torch.randn(3, 4), torch.randn(4)),
        opsets=ENDS,
        dynamic_shapes=({0: batch}, None),
        run_args=[(torch.randn(5, 4), torch.randn(4))],
    )


def test_round_decimals_half_even() -> None:
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 1.2345, 125.0, -175.0])
    check_export(Fn(lambda t: (t.round(), t.round(decimals=2), t.round(decimals=-1))), (x,), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_integer_pow_is_exact(dtype: torch.dtype) -> None:
    # results past 2**53 (onnxruntime's integer Pow goes through double) and wrapped overflows
    x = torch.tensor([3, 3, 5, 7, 1, 1, 0, 2, 0], dtype=dtype)
    y = torch.tensor([39, 33, 27, 22, 29, 5, 0, 3, 2], dtype=dtype)
    if dtype.is_signed:
        x = x * torch.tensor([1, -1, 1, 1, -1, 1, 1, -1, 1], dtype=dtype)
    fn = Fn(lambda a, b: (a**b, a**39, a**5, a**0, 3**b))
    check_export(fn, (x, y), opsets=ENDS, atol=0, rtol=0)
    if dtype.is_signed:  # negative exponents: 1 for base 1, +-1 for base -1, 0 otherwise
        check_export(Fn(lambda a, b: a ** (b - 30)), (x, y), opsets=ENDS, atol=0, rtol=0)


class WithConstants(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([2.0, 3.0]) + torch.tensor(1.5)  # lift_fresh_copy of constants


def test_tensor_constants() -> None:
    check_export(WithConstants(), (torch.randn(3, 2),), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rounded_division_bit_exact(dtype: torch.dtype) -> None:
    # torch divides half tensors in their own precision for floor / trunc modes: the quotients'
    # rounding decides many results, so these must match bit for bit
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(4000, generator=gen) * 10).to(dtype)
    b = torch.randn(4000, generator=gen).to(dtype)

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.div(x, y, rounding_mode="floor"),
            torch.div(x, y, rounding_mode="trunc"),
            torch.remainder(x, y),
            x // 0.3,
        )

    check_export(Fn(fn), (a, b), opsets=ENDS, atol=0, rtol=0)
    check_export(Fn(lambda x, y: torch.add(x, y, alpha=0.3)), (a, b), opsets=ENDS, atol=1e-2, rtol=1e-3)


def test_half_tensor_with_inexact_scalars() -> None:
    # torch multiplies / divides a float16 tensor by a Python float kept in float32 (rounded once)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4000, generator=gen) * 10).to(torch.float16)
    fn = Fn(lambda t: (t * 0.3, 0.3 * t, t / 0.3, t * 0.5, t + 0.3, t - 0.3, t % 0.3, torch.fmod(t, 0.3)))
    check_export(fn, (x,), opsets=ENDS, atol=0, rtol=0)


def test_numpy_style_aliases() -> None:
    # torch.export keeps divide / multiply / subtract as their own overloads
    a = torch.tensor([7.0, -7.5, 3.0, 0.5])
    b = torch.tensor([2.0, 2.0, -0.7, 4.0])
    fn = Fn(
        lambda x, y: (
            torch.divide(x, y),
            torch.divide(x, y, rounding_mode="floor"),
            torch.divide(x, 3, rounding_mode="trunc"),
            torch.multiply(x, y),
            torch.multiply(x, 2),
            torch.subtract(x, y, alpha=2),
            torch.subtract(x, 1.5),
        )
    )
    check_export(fn, (a, b), opsets=ENDS)
