"""Float formulas for the special-function families (gamma_functions, error_functions, bessel_functions,
orthogonal_polynomials, float_structure): ``FloatMath`` emits elementwise formulas in one dtype, Python
numbers becoming constants of it; ``float_loop`` is an ONNX Loop over float state for iterations whose
count torch decides from the data.

ONNX has Erf but no gamma, zeta or Bessel functions. Each one is built from published series,
asymptotic expansions and rational approximations, evaluated in float64 (onnxruntime has float64
kernels for the basic ops) and cast to torch's result dtype (``unary_converter``): the series sum up
to 40 terms or cancel large terms (K0, Y0, reflection formulas near poles), which float32 cannot do to
1e-4, and torch itself evaluates zeta in double for float inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import reduce

f32, f64 = torch.float32, torch.float64


Num = str | float | int


class FloatMath:
    """Emits float formulas in one dtype; Python numbers become constants of that dtype."""

    def __init__(self, ctx: ConversionContext, dt: torch.dtype = f64) -> None:
        self.ctx = ctx
        self.dt = dt

    def v(self, a: Num) -> str:
        if isinstance(a, (int, float)):
            return self.ctx.const(float(a), self.dt)
        return a

    def _op(self, op_type: str, *xs: Num) -> str:
        return self.ctx.op(op_type, *(self.v(x) for x in xs))

    def add(self, a: Num, b: Num) -> str:
        return self._op("Add", a, b)

    def sub(self, a: Num, b: Num) -> str:
        return self._op("Sub", a, b)

    def mul(self, a: Num, b: Num) -> str:
        return self._op("Mul", a, b)

    def div(self, a: Num, b: Num) -> str:
        return self._op("Div", a, b)

    def pow(self, a: Num, b: Num) -> str:
        return self._op("Pow", a, b)

    def max(self, a: Num, b: Num) -> str:
        return self._op("Max", a, b)

    def min(self, a: Num, b: Num) -> str:
        return self._op("Min", a, b)

    def neg(self, a: Num) -> str:
        return self._op("Neg", a)

    def abs(self, a: Num) -> str:
        return self._op("Abs", a)

    def exp(self, a: Num) -> str:
        return self._op("Exp", a)

    def log(self, a: Num) -> str:
        return self._op("Log", a)

    def sqrt(self, a: Num) -> str:
        return self._op("Sqrt", a)

    def sin(self, a: Num) -> str:
        return self._op("Sin", a)

    def cos(self, a: Num) -> str:
        return self._op("Cos", a)

    def acos(self, a: Num) -> str:
        return self._op("Acos", a)

    def floor(self, a: Num) -> str:
        return self._op("Floor", a)

    def ceil(self, a: Num) -> str:
        return self._op("Ceil", a)

    def round(self, a: Num) -> str:
        return self._op("Round", a)

    def lt(self, a: Num, b: Num) -> str:
        return self._op("Less", a, b)

    def le(self, a: Num, b: Num) -> str:
        return self._op("LessOrEqual", a, b)

    def gt(self, a: Num, b: Num) -> str:
        return self._op("Greater", a, b)

    def ge(self, a: Num, b: Num) -> str:
        return self._op("GreaterOrEqual", a, b)

    def eq(self, a: Num, b: Num) -> str:
        return self._op("Equal", a, b)

    def and_(self, a: str, b: str) -> str:
        return self.ctx.op("And", a, b)

    def or_(self, a: str, b: str) -> str:
        return self.ctx.op("Or", a, b)

    def not_(self, a: str) -> str:
        return self.ctx.op("Not", a)

    def isnan(self, a: str) -> str:
        return self.ctx.op("IsNaN", a)

    def isinf(self, a: str) -> str:
        return self.ctx.op("IsInf", a)

    def where(self, cond: str, a: Num, b: Num) -> str:
        return self.ctx.op("Where", cond, self.v(a), self.v(b))

    def poly(self, x: Num, coeffs: Sequence[float], scale: float = 1.0) -> str:
        """c0 + c1 x + c2 x^2 + ... by Horner's rule.

        With ``scale`` (the largest |x| the caller uses the result for) it is evaluated as
        sum (c_k scale^k) (x / scale)^k, dropping the terms below 1e-20 of the largest: power series'
        coefficients fall below float32's range (1 / (40!)^2...), where onnxruntime's graph optimizer
        takes distinct tiny float64 constants for equal ones."""
        if scale != 1.0:
            scaled = [c * scale**k for k, c in enumerate(coeffs)]
            top = max(abs(c) for c in scaled)
            while len(scaled) > 1 and abs(scaled[-1]) < 1e-20 * top:
                scaled.pop()
            return self.poly(self.div(x, scale), scaled)
        acc = self.v(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.add(c, self.mul(acc, x))
        return acc

    def is_int(self, x: str) -> str:
        """x is a whole number (infinities included: floor(inf) == inf)."""
        return self.eq(x, self.floor(x))

    def trunc(self, x: str) -> str:
        return self.where(self.lt(x, 0.0), self.ceil(x), self.floor(x))

    def round_f32(self, x: str) -> str:
        """x rounded to float32 and back (to reproduce a float32 product in torch's kernels)."""
        return self.ctx.cast(self.ctx.cast(x, f32), self.dt)


def unary_converter(build: Callable[[FloatMath, str], str], name: str) -> Converter:
    """A float function of one tensor: computed in float64, returned in torch's result dtype."""

    def convert(ctx: ConversionContext, x: Value) -> str:
        dtype = ctx.out_dtype
        if not dtype.is_floating_point:
            raise ctx.error(f"{name} is only converted for floating point results, got {dtype}")
        m = FloatMath(ctx)
        return ctx.cast(build(m, ctx.cast(x, f64)), dtype)

    convert.__name__ = f"convert_{name}"
    return convert


def trip_count(ctx: ConversionContext, m: FloatMath, need: str) -> str:
    """max(need) as an int64 scalar (0 for empty tensors)."""
    flat = ctx.op("Reshape", ctx.cast(m.ceil(need), torch.int64), ctx.i64([-1]))
    return reduce(ctx, "ReduceMax", ctx.op("Concat", flat, ctx.i64([0]), axis=0), None, keepdims=False)


def any_true(ctx: ConversionContext, flags: str) -> str:
    """True when some element of a bool tensor is (False for an empty one)."""
    flat = ctx.op("Reshape", ctx.cast(flags, torch.int32), ctx.i64([-1]))
    top = reduce(
        ctx, "ReduceMax", ctx.op("Concat", flat, ctx.const([0], torch.int32), axis=0), None, keepdims=False
    )
    return ctx.op("Greater", top, ctx.const(0, torch.int32))


def float_loop(
    ctx: ConversionContext,
    trips: str,
    state: Sequence[str],
    dt: torch.dtype,
    rank: int,
    body: Callable[[str, list[str]], tuple[str, list[str]]],
) -> list[str]:
    """An ONNX Loop of at most ``trips`` iterations over float ``state`` values (all of dtype ``dt``
    and rank ``rank``); ``body(iteration, state)`` returns (continue?, new state)."""
    g = ctx.g
    sub = g.subgraph(g.unique_name("recurrence"))
    iteration = sub.add_input(g.unique_name("iter"), dtypes.INT64, [])
    sub.add_input(g.unique_name("cond_in"), dtypes.BOOL, [])  # unused: the body decides by itself
    dims: list[Any] = [None] * rank
    formal = [
        sub.add_input(g.unique_name(f"state{i}"), dtypes.to_onnx_dtype(dt), dims) for i in range(len(state))
    ]
    ctx.g = sub
    try:
        again, new = body(iteration, formal)
        out = sub.add_output(again, g.unique_name("cond_out"))
        sub.set_type(out, dtypes.BOOL, [])
        for v in new:
            out = sub.add_output(v, g.unique_name("state_out"))
            sub.set_type(out, dtypes.to_onnx_dtype(dt), dims)
    finally:
        ctx.g = g
    cond0 = ctx.const(True, torch.bool)
    return ctx.op("Loop", trips, cond0, *state, outputs=len(state), body=sub)
