"""Matrix products: linear, mm / bmm / matmul and their add-and-scale forms, einsum and friends.

ONNX MatMul follows numpy.matmul, which is torch.matmul's rule too (1-D operands promoted and the added
dim removed, batch dims broadcast), so most products map to it directly. Gemm is used only where it is
the same computation: 2-D float operands.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import NATIVE
from fastonnx.converters.lib.ops import normalize_axis, reduce, unsqueeze

aten = torch.ops.aten


def _transpose_last2(ctx: ConversionContext, x: Value | str, rank: int) -> str:
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.op("Transpose", x, perm=perm)


def _scaled(ctx: ConversionContext, x: str, factor: Any, dtype: torch.dtype) -> str:
    """``factor * x``, without a node when the factor is 1."""
    if isinstance(factor, (int, float)) and factor == 1:
        return x
    return ctx.op("Mul", x, ctx.operand(factor, dtype))


def _add_scaled(
    ctx: ConversionContext, product: str, bias: Any, beta: Any, alpha: Any, dtype: torch.dtype
) -> str:
    """``beta * bias + alpha * product``. torch ignores ``bias`` entirely when beta is 0 (NaN and inf in
    it do not propagate), so it is left out then."""
    out = _scaled(ctx, product, alpha, dtype)
    if isinstance(beta, (int, float)) and beta == 0:
        return out
    return ctx.op("Add", _scaled(ctx, ctx.operand(bias, dtype), beta, dtype), out)


# ---- linear / Gemm ------------------------------------------------------------------------------
def convert_linear(ctx: ConversionContext, x: Value, weight: Value, bias: Value | None = None) -> str:
    dtype = ctx.out_dtype
    if weight.shape[-1] == 0:
        return _empty_linear(ctx, x, weight, bias, dtype)
    if x.rank == 2 and weight.rank == 2 and dtype in NATIVE["Gemm"]:
        return ctx.op("Gemm", x, weight, bias, transB=1)
    # the Transpose is folded into the constant weight by the optimizer
    wt = ctx.op("Transpose", weight, perm=[1, 0]) if weight.rank == 2 else weight.name
    out = ctx.op("MatMul", x, wt)
    if bias is not None:
        out = ctx.op("Add", out, bias)
    return out


def _empty_linear(
    ctx: ConversionContext, x: Value, weight: Value, bias: Value | None, dtype: torch.dtype
) -> str:
    """No input features: the product is zeros (onnxruntime's MatMul+Add fusion rejects the empty
    inner dim, so the zeros are built directly)."""
    lead = ctx.op("Shape", x, start=0, end=x.rank - 1) if x.rank > 1 else ctx.i64([])
    out_features = ctx.op("Shape", weight, start=0, end=1) if weight.rank == 2 else ctx.i64([])
    zeros = ctx.op(
        "ConstantOfShape", ctx.op("Concat", lead, out_features, axis=0), value=ctx.tensor_attr(0, dtype)
    )
    return ctx.op("Add", zeros, bias) if bias is not None else zeros


def convert_mm(ctx: ConversionContext, a: Value, b: Value) -> str:
    if a.rank and a.shape[-1] == 0:
        # onnxruntime's MatMul over an empty inner dim returns uninitialized memory, not zeros
        return ctx.op(
            "ConstantOfShape", ctx.shape_tensor(ctx.out_shape), value=ctx.tensor_attr(0, ctx.out_dtype)
        )
    return ctx.op("MatMul", ctx.operand(a, ctx.out_dtype), ctx.operand(b, ctx.out_dtype))


def convert_addmm(
    ctx: ConversionContext, bias: Any, m1: Value, m2: Value, *, beta: Any = 1, alpha: Any = 1
) -> str:
    dtype = ctx.out_dtype
    plain = all(isinstance(s, (int, float)) for s in (beta, alpha))
    # onnxruntime's Gemm skips the bias when the inner dim is empty
    empty = m1.shape[1] == 0
    if dtype in NATIVE["Gemm"] and plain and not empty and isinstance(bias, Value) and bias.rank <= 2:
        if beta == 0:
            return ctx.op("Gemm", m1, m2, alpha=float(alpha))
        return ctx.op("Gemm", m1, m2, bias, alpha=float(alpha), beta=float(beta))
    return _add_scaled(ctx, ctx.op("MatMul", m1, m2), bias, beta, alpha, dtype)


def convert_addmm_activation(
    ctx: ConversionContext,
    bias: Any,
    m1: Value,
    m2: Value,
    *,
    beta: Any = 1,
    alpha: Any = 1,
    use_gelu: bool = False,
) -> str:
    out = convert_addmm(ctx, bias, m1, m2, beta=beta, alpha=alpha)
    if not use_gelu:
        return ctx.op("Relu", out)
    # the CPU kernel applies exact (erf) gelu; the CUDA one fuses a tanh approximation
    if ctx.opset >= 20:
        return ctx.op("Gelu", out)
    dtype = ctx.out_dtype
    erf = ctx.op("Erf", ctx.op("Mul", out, ctx.const(0.5**0.5, dtype)))
    half = ctx.op("Mul", out, ctx.const(0.5, dtype))
    return ctx.op("Mul", half, ctx.op("Add", erf, ctx.const(1.0, dtype)))


def convert_baddbmm(
    ctx: ConversionContext, bias: Any, b1: Value, b2: Value, *, beta: Any = 1, alpha: Any = 1
) -> str:
    return _add_scaled(ctx, ctx.op("MatMul", b1, b2), bias, beta, alpha, ctx.out_dtype)


def convert_addbmm(
    ctx: ConversionContext, bias: Any, b1: Value, b2: Value, *, beta: Any = 1, alpha: Any = 1
) -> str:
    product = reduce(ctx, "ReduceSum", ctx.op("MatMul", b1, b2), [0], keepdims=False)
    return _add_scaled(ctx, product, bias, beta, alpha, ctx.out_dtype)


def convert_addmv(
    ctx: ConversionContext, bias: Any, mat: Value, vec: Value, *, beta: Any = 1, alpha: Any = 1
) -> str:
    return _add_scaled(ctx, ctx.op("MatMul", mat, vec), bias, beta, alpha, ctx.out_dtype)


def convert_outer(ctx: ConversionContext, a: Value, b: Value) -> str:
    dtype = ctx.out_dtype
    return ctx.op("Mul", unsqueeze(ctx, ctx.operand(a, dtype), [1]), ctx.operand(b, dtype))


def convert_vecdot(ctx: ConversionContext, x: Value, y: Value, *, dim: int = -1) -> str:
    if x.dtype.is_complex:
        raise ctx.error("linalg.vecdot of complex tensors is not supported")
    dtype = ctx.out_dtype
    prod = ctx.op("Mul", ctx.operand(x, dtype), ctx.operand(y, dtype))
    rank = max(x.rank, y.rank)
    return reduce(ctx, "ReduceSum", prod, [normalize_axis(dim, rank)], keepdims=False)


def convert_multi_dot(ctx: ConversionContext, tensors: Sequence[Value]) -> str:
    out = tensors[0].name
    for t in tensors[1:]:
        out = ctx.op("MatMul", out, t)
    return out


# ---- cross ----------------------------------------------------------------------------------------
def convert_cross(ctx: ConversionContext, a: Value, b: Value, dim: int | None = None) -> str:
    dtype = ctx.out_dtype
    out_shape = ctx.out_shape
    rank = len(out_shape)
    if dim is None:
        # torch.cross without dim: the first dim of size 3 (deprecated behaviour, kept for exactness)
        dims = [i for i, d in enumerate(out_shape) if isinstance(d, int) and d == 3]
        if not dims:
            raise ctx.error("cross without dim needs a dim of size 3")
        dim = dims[0]
    axis = normalize_axis(dim, rank)
    a_name, b_name = ctx.operand(a, dtype), ctx.operand(b, dtype)

    def pick(x: str, x_rank: int, order: list[int]) -> str:
        # the dim counted from the right, so that operands of lower rank line up as in broadcasting
        return ctx.op("Gather", x, ctx.i64(order), axis=axis - (rank - x_rank))

    first = ctx.op("Mul", pick(a_name, a.rank, [1, 2, 0]), pick(b_name, b.rank, [2, 0, 1]))
    second = ctx.op("Mul", pick(a_name, a.rank, [2, 0, 1]), pick(b_name, b.rank, [1, 2, 0]))
    return ctx.op("Sub", first, second)


def convert_linalg_cross(ctx: ConversionContext, a: Value, b: Value, *, dim: int = -1) -> str:
    return convert_cross(ctx, a, b, dim)


# ---- einsum and the products built on it ----------------------------------------------------------
def _onnx_equation(ctx: ConversionContext, equation: str) -> str:
    """ONNX Einsum takes lower-case letters only: upper-case subscripts are renamed to unused ones."""
    eq = equation.replace(" ", "")
    used = {c for c in eq if c.isalpha()}
    upper = sorted(c for c in used if c.isupper())
    free = [c for c in string.ascii_lowercase if c not in used]
    if len(upper) > len(free):
        raise ctx.error(f"einsum equation {equation!r} uses more than 26 distinct subscripts")
    table = dict(zip(upper, free))
    return "".join(table.get(c, c) for c in eq)


def convert_einsum(
    ctx: ConversionContext, equation: str, tensors: Sequence[Value], *, path: Any = None
) -> str:
    dtype = ctx.out_dtype
    operands = [ctx.operand(t, dtype) for t in tensors]
    eq = _onnx_equation(ctx, equation)
    terms = eq.split("->")[0].split(",")
    if len(terms) == len(tensors) and any("..." in t for t in terms):
        operands = _align_ellipsis(ctx, terms, tensors, operands)
        if "->" in eq and "..." not in eq.split("->")[1]:
            operands, eq = _sum_ellipsis(ctx, eq, terms, tensors, operands)
    return ctx.op("Einsum", *operands, equation=eq)


def _sum_ellipsis(
    ctx: ConversionContext, eq: str, terms: Sequence[str], tensors: Sequence[Value], operands: list[str]
) -> tuple[list[str], str]:
    """onnxruntime refuses an output without '...' when inputs have one (torch sums those dims). The
    ellipsis becomes explicit letters, the operands broadcast to the common ellipsis shape first (an
    explicit letter must have one size)."""
    shapes = {}
    for i, (term, t) in enumerate(zip(terms, tensors)):
        if "..." in term:
            before = sum(c.isalpha() for c in term.split("...")[0])
            after = sum(c.isalpha() for c in term.split("...")[1])
            shapes[i] = (before, list(t.shape[before : t.rank - after]), after)
    widest = max(len(dims) for _, dims, _ in shapes.values())
    common = [1] * widest
    for _, dims, _ in shapes.values():
        for j, d in enumerate(dims, start=widest - len(dims)):
            if not isinstance(d, int):
                raise ctx.error("einsum summing over '...' needs static sizes for the '...' dims")
            common[j] = max(common[j], d) if d != 1 else common[j]
    letters = [c for c in string.ascii_lowercase if c not in eq][:widest]
    if len(letters) < widest:
        raise ctx.error("einsum: not enough free subscripts to spell out '...'")
    out = list(operands)
    for i, (before, _, after) in shapes.items():
        out[i] = ctx.op("Expand", operands[i], ctx.i64([1] * before + common + [1] * after))
    return out, eq.replace("...", "".join(letters))


def _align_ellipsis(
    ctx: ConversionContext, terms: Sequence[str], tensors: Sequence[Value], operands: list[str]
) -> list[str]:
    """ONNX wants '...' to stand for as many dims in every operand; torch broadcasts them like numpy
    (right-aligned). Operands with fewer get leading size-1 dims at the ellipsis."""
    ranks = {}
    for i, (term, t) in enumerate(zip(terms, tensors)):
        if "..." in term:
            ranks[i] = t.rank - sum(c.isalpha() for c in term)
    widest = max(ranks.values())
    out = list(operands)
    for i, r in ranks.items():
        if r < widest:
            at = sum(c.isalpha() for c in terms[i].split("...")[0])
            out[i] = unsqueeze(ctx, operands[i], list(range(at, at + widest - r)))
    return out


def convert_tensordot(
    ctx: ConversionContext, a: Value, b: Value, dims_a: Sequence[int], dims_b: Sequence[int]
) -> str:
    letters = iter(string.ascii_lowercase)
    sa = [next(letters) for _ in range(a.rank)]
    sb = [next(letters) for _ in range(b.rank)]
    for da, db in zip(dims_a, dims_b, strict=True):
        sb[normalize_axis(db, b.rank)] = sa[normalize_axis(da, a.rank)]
    contracted = {sa[normalize_axis(d, a.rank)] for d in dims_a}
    out = [c for c in sa if c not in contracted] + [c for c in sb if c not in contracted]
    dtype = ctx.out_dtype
    eq = f"{''.join(sa)},{''.join(sb)}->{''.join(out)}"
    return ctx.op("Einsum", ctx.operand(a, dtype), ctx.operand(b, dtype), equation=eq)


def convert_bilinear(
    ctx: ConversionContext, x1: Value, x2: Value, weight: Value, bias: Value | None = None
) -> str:
    out = ctx.op("Einsum", x1, weight, x2, equation="...i,oij,...j->...o")
    if bias is not None:
        out = ctx.op("Add", out, bias)
    return out


# ---- outer-product updates, inner products, trace -------------------------------------------------
def convert_addr(
    ctx: ConversionContext, bias: Any, v1: Value, v2: Value, *, beta: Any = 1, alpha: Any = 1
) -> str:
    """``beta * self + alpha * outer(vec1, vec2)``; for bool, ``(beta and self) or (alpha and outer)``.
    The outer product has the full (n, m) shape, so a broadcast ``self`` needs no Expand."""
    dtype = ctx.out_dtype
    if dtype != torch.bool:
        return _add_scaled(ctx, convert_outer(ctx, v1, v2), bias, beta, alpha, dtype)
    if not all(isinstance(s, (bool, int, float)) for s in (beta, alpha)):
        raise ctx.error("addr of bool tensors needs Python beta and alpha")
    outer = ctx.op("And", unsqueeze(ctx, ctx.cast(v1, torch.bool), [1]), ctx.cast(v2, torch.bool))
    out = outer if alpha else ctx.op("Xor", outer, outer)  # all False, in the outer product's shape
    if beta:
        out = ctx.op("Or", ctx.cast(bias, torch.bool), out)
    return out


def convert_inner(ctx: ConversionContext, a: Value, b: Value) -> str:
    """Sum over the last dim of both: ``a.shape[:-1] + b.shape[:-1]``; a 0-d operand multiplies."""
    if a.rank == 0 or b.rank == 0:
        dtype = ctx.out_dtype
        return ctx.op("Mul", ctx.operand(a, dtype), ctx.operand(b, dtype))
    dtype = ctx.out_dtype
    if dtype in NATIVE["Einsum"]:
        return convert_tensordot(ctx, a, b, [-1], [-1])
    # Einsum has no kernel for small integer types: int64 products wrap to the same low bits
    a64 = Value(ctx.cast(a, torch.int64), torch.int64, a.shape)
    b64 = Value(ctx.cast(b, torch.int64), torch.int64, b.shape)
    eq = _inner_equation(a.rank, b.rank)
    return ctx.cast(ctx.op("Einsum", a64, b64, equation=eq), dtype)


def _inner_equation(rank_a: int, rank_b: int) -> str:
    letters = string.ascii_lowercase
    sa, sb = letters[: rank_a - 1], letters[rank_a - 1 : rank_a + rank_b - 2]
    return f"{sa}z,{sb}z->{sa}{sb}"


def convert_trace(ctx: ConversionContext, x: Value) -> str:
    """The sum of the main diagonal of a 2-D tensor, gathered from the flattened matrix (a product
    with an identity matrix would turn inf off the diagonal into NaN)."""
    rows, cols = x.shape
    if not (isinstance(rows, int) and isinstance(cols, int)):
        raise ctx.error("trace needs a matrix of static shape")
    dtype = ctx.out_dtype  # integers sum in int64
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    flat = ctx.op("Reshape", ctx.cast(x, compute), ctx.i64([-1]))
    diag = ctx.op("Gather", flat, ctx.i64([i * (cols + 1) for i in range(min(rows, cols))]), axis=0)
    return ctx.cast(reduce(ctx, "ReduceSum", diag, [0], keepdims=False), dtype)


CONVERTERS: dict[str, Converter] = {
    "aten.linear.default": convert_linear,
    "aten.mm.default": convert_mm,
    "aten.bmm.default": convert_mm,
    "aten.matmul.default": convert_mm,
    "aten.dot.default": convert_mm,
    "aten.vdot.default": convert_mm,
    "aten.mv.default": convert_mm,
    "aten.addmm.default": convert_addmm,
    "aten._addmm_activation.default": convert_addmm_activation,
    "aten.baddbmm.default": convert_baddbmm,
    "aten.addbmm.default": convert_addbmm,
    "aten.addmv.default": convert_addmv,
    "aten.outer.default": convert_outer,
    "aten.ger.default": convert_outer,
    "aten.linalg_vecdot.default": convert_vecdot,
    "aten.linalg_multi_dot.default": convert_multi_dot,
    "aten.cross.default": convert_cross,
    "aten.linalg_cross.default": convert_linalg_cross,
    "aten.einsum.default": convert_einsum,
    "aten.tensordot.default": convert_tensordot,
    "aten.bilinear.default": convert_bilinear,
    "aten.addr.default": convert_addr,
    "aten.inner.default": convert_inner,
    "aten.trace.default": convert_trace,
}
