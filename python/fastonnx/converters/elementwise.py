"""Elementwise arithmetic and math with explicit type promotion (ONNX casts nothing implicitly)."""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.context import ConversionContext

aten = torch.ops.aten


def _binary(op_type: str):  # noqa: ANN202 - returns a converter
    def convert(ctx: ConversionContext, a: Any, b: Any, *, alpha: Any = None) -> str:
        dtype = ctx.out_dtype
        lhs = ctx.operand(a, dtype)
        rhs = ctx.operand(b, dtype)
        if alpha is not None and alpha != 1:
            rhs = ctx.op("Mul", rhs, ctx.const(alpha, dtype))
        return ctx.op(op_type, lhs, rhs)

    convert.__name__ = f"convert_{op_type.lower()}"
    return convert


convert_add = _binary("Add")
convert_sub = _binary("Sub")
convert_mul = _binary("Mul")

CONVERTERS: dict[Any, Any] = {
    aten.add.Tensor: convert_add,
    aten.add.Scalar: convert_add,
    aten.sub.Tensor: convert_sub,
    aten.sub.Scalar: convert_sub,
    aten.mul.Tensor: convert_mul,
    aten.mul.Scalar: convert_mul,
}
