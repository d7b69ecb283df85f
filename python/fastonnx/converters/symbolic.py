"""Symbolic scalars: sizes read at runtime and the Python operators torch.export leaves on SymInts.

Arguments are Python numbers (static) or Values of 0-d tensors (int64 for SymInt, float32 for
SymFloat, bool for SymBool). When every argument is a Python number the Python result is returned
and the interpreter keeps folding; otherwise 0-d ONNX ops are emitted.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import normalize_axis
from fastonnx.converters.lib.shape_graphs import dim_scalar

aten = torch.ops.aten

Number = int | float | bool


def _static(*args: Any) -> bool:
    return all(isinstance(a, (int, float, bool)) for a in args)


def _operand(ctx: ConversionContext, x: Any, dtype: torch.dtype) -> str:
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        x = ctx.sym_value(x)
    return ctx.operand(x, dtype)


def _common(a: Any, b: Any) -> torch.dtype:
    """float32 when either side is a float, else int64 (bool operands count as int64)."""
    for x in (a, b):
        if isinstance(x, float) or (isinstance(x, Value) and x.dtype.is_floating_point):
            return torch.float32
    return torch.int64


# ---- sizes ----------------------------------------------------------------------------------------
def convert_sym_size(ctx: ConversionContext, x: Value, dim: int) -> Any:
    return dim_scalar(ctx, x, normalize_axis(dim, x.rank))


def convert_sym_numel(ctx: ConversionContext, x: Value) -> Any:
    static = x.static_shape()
    if static is not None:
        return math.prod(static)
    return ctx.op("ReduceProd", ctx.op("Shape", x), keepdims=0)


# what a value may flow into and still be read by runtime assertions only (which convert to nothing)
_ASSERTION_PATH = frozenset(
    {
        operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
        operator.add, operator.sub, operator.mul, operator.and_, operator.or_, torch.sym_not,
        aten._assert_scalar.default, aten.sym_constrain_range.default,
        aten.sym_constrain_range_for_size.default,
    }
)  # fmt: skip


def _read_by_assertions_only(node: torch.fx.Node) -> bool:
    seen: set[torch.fx.Node] = set()
    todo = list(node.users)
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op != "call_function" or user.target not in _ASSERTION_PATH:
            return False
        todo.extend(user.users)
    return True


def convert_sym_storage_offset(ctx: ConversionContext, x: Value, *args: Any) -> Any:
    # torch.export reads the storage offsets of views with data-dependent bounds (tensor_split at a
    # tensor of indices) only to assert they are in range; those assertions convert to nothing
    assert ctx.node is not None
    if _read_by_assertions_only(ctx.node):
        return 0
    raise ctx.error("storage offsets do not exist in ONNX; the model reads x.storage_offset()")


def convert_sym_stride(ctx: ConversionContext, x: Value, dim: int) -> Any:
    # a contiguous layout is the only one ONNX has
    axis = normalize_axis(dim, x.rank)
    static = x.static_shape()
    if static is not None:
        return math.prod(static[axis + 1 :])
    raise ctx.error("stride() of a tensor with symbolic dims is not supported")


def convert_local_scalar_dense(ctx: ConversionContext, x: Value) -> Any:
    dtype = ctx.out_dtype
    scalar = ctx.op("Reshape", x, ctx.i64([])) if x.rank else x.name
    return ctx.cast(scalar, dtype)


# ---- arithmetic -----------------------------------------------------------------------------------
def _binary(fold: Callable[[Any, Any], Any], op_type: str) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> Any:
        if _static(a, b):
            return fold(a, b)
        dtype = _common(a, b)
        return ctx.op(op_type, _operand(ctx, a, dtype), _operand(ctx, b, dtype))

    convert.__name__ = f"convert_sym_{op_type.lower()}"
    return convert


convert_sym_add = _binary(operator.add, "Add")
convert_sym_sub = _binary(operator.sub, "Sub")
convert_sym_mul = _binary(operator.mul, "Mul")
convert_sym_max = _binary(builtins.max, "Max")
convert_sym_min = _binary(builtins.min, "Min")


def convert_sym_sum(ctx: ConversionContext, args: Any) -> Any:
    """torch.sym_sum([a, b, ...]): the symbolic terms added in turn (ONNX Sum has no integer form),
    the static ones folded into one constant."""
    terms = list(args)
    dynamic = [t for t in terms if not _static(t)]
    folded = sum(t for t in terms if _static(t))
    if not dynamic:
        return folded
    dtype = torch.float32 if any(_common(t, 0) == torch.float32 for t in terms) else torch.int64
    operands = [_operand(ctx, t, dtype) for t in dynamic]
    if folded != 0:
        operands.append(_operand(ctx, folded, dtype))
    total = operands[0]
    for term in operands[1:]:
        total = ctx.op("Add", total, term)
    return total


def convert_sym_floordiv(ctx: ConversionContext, a: Any, b: Any) -> Any:
    if _static(a, b):
        return a // b
    dtype = _common(a, b)
    x, y = _operand(ctx, a, dtype), _operand(ctx, b, dtype)
    if dtype.is_floating_point:
        return ctx.op("Floor", ctx.op("Div", x, y))
    # integer Div truncates; subtracting the Python-style remainder first makes it exact and floored
    rem = ctx.op("Mod", x, y, fmod=0)
    return ctx.op("Div", ctx.op("Sub", x, rem), y)


def convert_sym_mod(ctx: ConversionContext, a: Any, b: Any) -> Any:
    if _static(a, b):
        return a % b
    dtype = _common(a, b)
    x, y = _operand(ctx, a, dtype), _operand(ctx, b, dtype)
    if dtype.is_floating_point:
        # Python's float %: the result has the sign of the divisor
        return ctx.op("Sub", x, ctx.op("Mul", ctx.op("Floor", ctx.op("Div", x, y)), y))
    return ctx.op("Mod", x, y, fmod=0)


def convert_sym_truediv(ctx: ConversionContext, a: Any, b: Any) -> Any:
    if _static(a, b):
        return a / b
    return ctx.op("Div", _operand(ctx, a, torch.float32), _operand(ctx, b, torch.float32))


def convert_sym_pow(ctx: ConversionContext, a: Any, b: Any) -> Any:
    if _static(a, b):
        return a**b
    dtype = _common(a, b)
    return ctx.op("Pow", _operand(ctx, a, dtype), _operand(ctx, b, dtype))


def convert_sym_abs(ctx: ConversionContext, a: Any) -> Any:
    if _static(a):
        return abs(a)
    return ctx.op("Abs", _operand(ctx, a, _common(a, 0)))


def convert_sym_sqrt(ctx: ConversionContext, a: Any) -> Any:
    """torch.sym_sqrt (recorded as torch._sym_sqrt): a float result, as math.sqrt gives."""
    if _static(a):
        return math.sqrt(a)
    return ctx.op("Sqrt", _operand(ctx, a, torch.float32))


def convert_sym_round(ctx: ConversionContext, a: Any, ndigits: Any = None) -> Any:
    """round(x): halves to even, as ONNX Round; with ndigits the result stays a float."""
    if _static(a, ndigits if ndigits is not None else 0):
        return round(a) if ndigits is None else round(a, ndigits)
    if isinstance(a, Value) and not a.dtype.is_floating_point:
        if ndigits is None or (isinstance(ndigits, int) and ndigits >= 0):
            return a.name  # an int rounds to itself
        raise ctx.error("round(int, ndigits) with a negative or symbolic ndigits is not supported")
    x = _operand(ctx, a, torch.float32)
    if ndigits is None:
        return ctx.cast(ctx.op("Round", x), torch.int64)
    if not isinstance(ndigits, int):
        raise ctx.error("round(x, ndigits) needs a static ndigits")
    scale = ctx.const(10.0**ndigits, torch.float32)
    return ctx.op("Div", ctx.op("Round", ctx.op("Mul", x, scale)), scale)


def _shift(fold: Callable[[Any, Any], Any], direction: str) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> Any:
        if _static(a, b):
            return fold(a, b)
        # Python's shifts of ints: a << b == a * 2**b, a >> b == a // 2**b (floored)
        x = _operand(ctx, a, torch.int64)
        if _static(b):
            power = ctx.const(2**b, torch.int64)
        else:
            power = ctx.op("Pow", ctx.const(2, torch.int64), _operand(ctx, b, torch.int64))
        if direction == "LEFT":
            return ctx.op("Mul", x, power)
        return convert_sym_floordiv(ctx, Value(x, torch.int64, ()), Value(power, torch.int64, ()))

    convert.__name__ = f"convert_sym_{direction.lower()}_shift"
    return convert


def convert_sym_neg(ctx: ConversionContext, a: Any) -> Any:
    if _static(a):
        return -a
    dtype = _common(a, 0)
    return ctx.op("Neg", _operand(ctx, a, dtype))


def _compare(fold: Callable[[Any, Any], bool], op_type: str, negate: bool = False) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> Any:
        if _static(a, b):
            return fold(a, b)
        dtype = _common(a, b)
        out = ctx.op(op_type, _operand(ctx, a, dtype), _operand(ctx, b, dtype))
        return ctx.op("Not", out) if negate else out

    convert.__name__ = f"convert_sym_{fold.__name__}"
    return convert


convert_sym_eq = _compare(operator.eq, "Equal")
convert_sym_ne = _compare(operator.ne, "Equal", negate=True)
convert_sym_lt = _compare(operator.lt, "Less")
convert_sym_le = _compare(operator.le, "LessOrEqual")
convert_sym_gt = _compare(operator.gt, "Greater")
convert_sym_ge = _compare(operator.ge, "GreaterOrEqual")


def _logical(fold: Callable[[Any, Any], Any], op_type: str) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> Any:
        if _static(a, b):
            return fold(a, b)
        if isinstance(ctx.out, (torch.SymInt, int)) and not isinstance(ctx.out, bool):
            # `&` / `|` of SymInts are bitwise, not logical
            ctx.require_opset(18, f"a bitwise {op_type} of symbolic ints (Bitwise{op_type})")
            return ctx.op(f"Bitwise{op_type}", _operand(ctx, a, torch.int64), _operand(ctx, b, torch.int64))
        return ctx.op(op_type, _operand(ctx, a, torch.bool), _operand(ctx, b, torch.bool))

    convert.__name__ = f"convert_sym_{op_type.lower()}"
    return convert


convert_sym_and = _logical(operator.and_, "And")
convert_sym_or = _logical(operator.or_, "Or")


def convert_sym_not(ctx: ConversionContext, a: Any) -> Any:
    if _static(a):
        return not a
    return ctx.op("Not", _operand(ctx, a, torch.bool))


def convert_sym_float(ctx: ConversionContext, a: Any) -> Any:
    if _static(a):
        return float(a)
    return _operand(ctx, a, torch.float32)


def convert_sym_int(ctx: ConversionContext, a: Any) -> Any:
    if _static(a):
        return int(a)
    # Cast from float truncates toward zero, as int() does
    return _operand(ctx, a, torch.int64)


def _rounding(fold: Callable[[Any], int], op_type: str) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, a: Any) -> Any:
        if _static(a):
            return fold(a)
        if isinstance(a, Value) and not a.dtype.is_floating_point:
            return ctx.cast(a, torch.int64)
        return ctx.cast(ctx.op(op_type, _operand(ctx, a, torch.float32)), torch.int64)

    convert.__name__ = f"convert_sym_{op_type.lower()}"
    return convert


def convert_sym_ite(ctx: ConversionContext, cond: Any, a: Any, b: Any) -> Any:
    if _static(cond):
        return a if cond else b
    dtype = _common(a, b)
    return ctx.op("Where", _operand(ctx, cond, torch.bool), _operand(ctx, a, dtype), _operand(ctx, b, dtype))


CONVERTERS: dict[str, Converter] = {
    "aten.sym_size.int": convert_sym_size,
    "aten.sym_numel.default": convert_sym_numel,
    "aten.sym_storage_offset.default": convert_sym_storage_offset,
    "aten.sym_stride.int": convert_sym_stride,
    "aten._local_scalar_dense.default": convert_local_scalar_dense,
    "aten.item.default": convert_local_scalar_dense,
    "operator.add": convert_sym_add,
    "operator.sub": convert_sym_sub,
    "operator.mul": convert_sym_mul,
    "operator.floordiv": convert_sym_floordiv,
    "operator.mod": convert_sym_mod,
    "operator.truediv": convert_sym_truediv,
    "operator.pow": convert_sym_pow,
    "operator.neg": convert_sym_neg,
    "operator.eq": convert_sym_eq,
    "operator.ne": convert_sym_ne,
    "operator.lt": convert_sym_lt,
    "operator.le": convert_sym_le,
    "operator.gt": convert_sym_gt,
    "operator.ge": convert_sym_ge,
    "operator.and_": convert_sym_and,
    "operator.or_": convert_sym_or,
    "operator.lshift": _shift(operator.lshift, "LEFT"),
    "operator.rshift": _shift(operator.rshift, "RIGHT"),
    "operator.abs": convert_sym_abs,
    "builtins.round": convert_sym_round,
    "torch.sym_sum": convert_sym_sum,
    "torch._sym_sqrt": convert_sym_sqrt,
    "torch.sym_max": convert_sym_max,
    "torch.sym_min": convert_sym_min,
    "torch.sym_float": convert_sym_float,
    "torch.sym_int": convert_sym_int,
    "torch.sym_not": convert_sym_not,
    "torch.sym_ite": convert_sym_ite,
    "math.ceil": _rounding(math.ceil, "Ceil"),
    "math.floor": _rounding(math.floor, "Floor"),
    "math.trunc": convert_sym_int,
}
