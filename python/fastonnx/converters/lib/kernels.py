"""Which dtypes onnxruntime's CPU kernels take, and the dtype an op runs in.

``NATIVE`` is the one table of kernel dtypes (probed on onnxruntime 1.31 at opsets 17 and 26): an op
whose dtype has no kernel runs in ``compute_dtype`` (a wider dtype holding every value exactly) and is
cast back (``emit``). ``opmath_dtype`` is torch's rule for composite float formulas: float16 / bfloat16
compute in float32 and round once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext

f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


i8, i16, i32, i64 = torch.int8, torch.int16, torch.int32, torch.int64


u8, u16, u32, u64 = torch.uint8, torch.uint16, torch.uint32, torch.uint64


HALF = frozenset({f16, bf16})


# dtypes onnxruntime 1.31's CPU provider has kernels for (probed at opsets 17 and 26). bfloat16 is
# listed where the ONNX spec allows it at opset 17: onnxruntime has no bf16 kernels at all, such graphs
# are checked with onnx's reference evaluator. An op whose float64 kernel is missing in onnxruntime
# (Tan, Asin, Erf...) stays in float64: the graph is valid ONNX and keeps torch's precision.
FLOAT_TYPES = frozenset({f16, bf16, f32, f64})


INT_TYPES = frozenset({i8, i16, i32, i64, u8, u16, u32, u64})


MINMAX_TYPES = FLOAT_TYPES | {i8, i32, i64, u8, u32, u64}


COMPARE_TYPES = FLOAT_TYPES | INT_TYPES


NATIVE: dict[str, frozenset[torch.dtype]] = {
    "Add": FLOAT_TYPES | INT_TYPES,
    "Sub": FLOAT_TYPES | INT_TYPES,
    "Mul": FLOAT_TYPES | INT_TYPES,
    "Div": FLOAT_TYPES | INT_TYPES,
    "Mod": FLOAT_TYPES | INT_TYPES,
    "Abs": FLOAT_TYPES | INT_TYPES,
    "Sign": FLOAT_TYPES | INT_TYPES,
    "Neg": FLOAT_TYPES | {i8, i16, i32, i64},
    "Pow": FLOAT_TYPES | {i32, i64},
    "Max": MINMAX_TYPES,
    "Min": MINMAX_TYPES,
    "Clip": MINMAX_TYPES,
    "Where": FLOAT_TYPES | {i8, i32, i64, u8, u32},
    "Equal": COMPARE_TYPES | {torch.bool},
    "Less": COMPARE_TYPES,
    "LessOrEqual": COMPARE_TYPES,
    "Greater": COMPARE_TYPES,
    "GreaterOrEqual": COMPARE_TYPES,
    "IsNaN": frozenset({f16, f32, f64}),
    "IsInf": frozenset({f32, f64}),  # float16 only from opset 20 in onnxruntime
    "Round": frozenset({f16, f32, f64}),
    "Floor": FLOAT_TYPES,
    "Ceil": FLOAT_TYPES,
    "Sqrt": FLOAT_TYPES,
    "Reciprocal": FLOAT_TYPES,
    "Exp": FLOAT_TYPES,
    "Log": FLOAT_TYPES,
    "Tanh": FLOAT_TYPES,
    "Sigmoid": FLOAT_TYPES,
    "Erf": frozenset({f16, bf16, f32}),
    "Sin": frozenset({f16, f32, f64}),
    "Cos": frozenset({f16, f32, f64}),
    **{op: frozenset({f16, f32}) for op in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh")},
    **{op: frozenset({f16, f32}) for op in ("Asinh", "Acosh", "Atanh")},
    # kernels whose dtypes decide a converter's form rather than a cast around one op
    "Range": frozenset({f32, f64, i16, i32, i64}),
    "TopK": frozenset({f32, f64, i32, i64}),
    "Gemm": frozenset({f16, f32, f64}),
    "Einsum": frozenset({f16, f32, f64, i32, i64}),
    "Trilu": frozenset({f32, f64, i64, torch.bool}),
    "Unique": frozenset({f32, f64, i64, i8}),
}


def compute_dtype(op_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype to run ``op_type`` in so that onnxruntime has a kernel and values stay exact."""
    native = NATIVE.get(op_type)
    if native is None or dtype in native or dtype == f64:
        return dtype
    if dtype.is_floating_point:
        return f32
    if dtype == torch.bool:
        return u8 if u8 in native else i32
    # narrow integers widen to int32 (all values fit; a cast back wraps like torch's arithmetic)
    if dtype in (i8, i16, u8, u16) and i32 in native:
        return i32
    if dtype == u32 and i64 in native:
        return i64
    return dtype


def emit(
    ctx: ConversionContext, op_type: str, inputs: Sequence[Any], dtype: torch.dtype, **attrs: Any
) -> str:
    """``op_type`` on ``inputs`` converted to ``dtype``, run in ``compute_dtype``, result as ``dtype``."""
    cd = compute_dtype(op_type, dtype)
    names = [ctx.cast(ctx.operand(x, dtype), cd) for x in inputs]
    return ctx.cast(ctx.op(op_type, *names, **attrs), dtype)


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's CPU kernels compute a float op in: float32 for float16 / bfloat16 (rounded once
    at the end), the dtype itself otherwise."""
    return torch.float32 if dtype in HALF else dtype
