"""Orthogonal polynomials: Chebyshev (first to fourth kind, plain and shifted to [0, 1]), Hermite (H and
He), Laguerre and Legendre. They follow torch's kernels step by step in torch's own dtype (special values,
trigonometric forms for large degrees, the three-term recurrence run by a Loop up to the largest degree,
``lib.float_math``), so that rounding matches."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter
from fastonnx.converters.lib.float_math import (
    FloatMath,
    Num,
    any_true,
    f32,
    f64,
    float_loop,
    trip_count,
)

Step = Callable[[FloatMath, str, str, str], str]  # (m, k, p, q) -> the next term


def _recurrence(
    m: FloatMath, steps: str, first_k: float, k_stride: float, p0: str, q0: str, step: Step, rank: int
) -> str:
    """q after ``steps`` (per element, float) applications of q, p <- step(k, p, q), q with
    k = first_k, first_k + k_stride, ...; an element whose q turned NaN keeps it (torch stops there)."""
    ctx = m.ctx
    count = ctx.cast(steps, torch.int64)
    trips = trip_count(ctx, m, steps)  # the longest run

    def body(iteration: str, state: list[str]) -> tuple[str, list[str]]:
        p, q = state
        k = m.add(first_k, m.mul(ctx.cast(iteration, m.dt), k_stride))
        active = ctx.op("Less", iteration, count)
        r = step(m, k, p, q)
        new_p, new_q = m.where(active, q, p), m.where(active, r, q)
        more = m.and_(ctx.op("Less", ctx.op("Add", iteration, ctx.i64(1)), count), m.not_(m.isnan(new_q)))
        return any_true(ctx, more), [new_p, new_q]

    _, q = float_loop(ctx, trips, [p0, q0], m.dt, rank, body)
    return q


def _even(m: FloatMath, n: str) -> str:
    return m.eq(m.ctx.op("Mod", n, m.v(2.0), fmod=1), 0.0)


def _signed(m: FloatMath, positive: str, n: str, value: Num) -> str:
    """value if ``positive`` or n is even, else -value."""
    return m.where(m.or_(positive, _even(m, n)), value, m.neg(value))


def _parity(m: FloatMath, n: str, value: Num) -> str:
    """value for even n, -value for odd n."""
    return m.where(_even(m, n), value, m.neg(value))


Cases = list[tuple[str, Num]]


def _chebyshev(kind: str, shifted: bool) -> Callable[[FloatMath, str, str], tuple[Cases, str, Step, str]]:
    """torch's Chebyshev polynomials of the first to fourth kind (T, U, V, W), plain or shifted to
    [0, 1]: special values at the interval's ends, a trigonometric form inside it for large n, the
    three-term recurrence otherwise."""

    def build(m: FloatMath, x: str, n: str) -> tuple[Cases, str, Step, str]:
        t = m.sub(m.add(x, x), 1.0) if shifted else x
        two_n1 = m.add(m.add(n, n), 1.0)
        one = m.v(1.0)
        q0 = {"t": t, "u": m.add(t, t), "v": m.sub(m.add(t, t), 1.0), "w": m.add(m.add(t, t), 1.0)}[kind]
        if shifted:
            upper, lower = m.eq(x, 1.0), m.eq(x, 0.0)
            at_upper = {"t": one, "u": m.add(n, 1.0), "v": one, "w": two_n1}[kind]
            at_lower = {"t": one, "u": m.add(n, 1.0), "v": two_n1, "w": one}[kind]
            edges: Cases = [(upper, at_upper), (lower, _parity(m, n, at_lower))]
        else:
            pos = m.gt(x, 0.0)
            edge = {
                "t": _signed(m, pos, n, 1.0),
                "u": _signed(m, pos, n, m.add(n, 1.0)),
                "v": m.where(pos, 1.0, _parity(m, n, two_n1)),
                "w": m.where(pos, two_n1, _parity(m, n, 1.0)),
            }[kind]
            edges = [(m.eq(m.abs(x), 1.0), edge)]
        threshold = 6.0 if kind == "t" or shifted else 8.0
        if shifted and kind == "w":
            threshold = 4.0
        big = m.and_(m.gt(n, threshold), m.lt(m.abs(t), 1.0))
        theta = m.acos(t)
        if kind == "t":
            trig = m.cos(m.mul(n, theta))
        elif kind == "u":
            n1 = m.add(n, 1.0)
            s = m.sin(theta)
            trig = m.where(
                m.eq(s, 0.0), m.div(m.mul(n1, m.cos(m.mul(n1, theta))), t), m.div(m.sin(m.mul(n1, theta)), s)
            )
        else:
            half = m.div(theta, 2.0)
            nh = m.mul(m.add(n, 0.5), theta)
            if kind == "v":
                degenerate = m.eq(m.sin(half), 1.0)
                fallback: Num = _parity(m, n, two_n1)
                ratio = m.div(m.cos(nh), m.cos(half))
            else:
                degenerate = m.eq(m.cos(half), 1.0)
                fallback = _parity(m, n, 1.0)
                if not shifted:
                    fallback = m.where(m.gt(x, 0.0), two_n1, fallback)
                ratio = m.div(m.sin(nh), m.sin(half))
            trig = m.where(degenerate, fallback, ratio)
        cases: Cases = [*edges, (big, trig), (m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), q0)]

        def step(m: FloatMath, k: str, p: str, q: str) -> str:
            return m.sub(m.mul(m.add(t, t), q), p)

        return cases, q0, step, m.sub(n, 1.0)

    return build


def _hermite_h(m: FloatMath, x: str, n: str) -> tuple[Cases, str, Step, str]:
    limit = 512.0 if m.dt == f64 else 128.0  # torch gives NaN above this degree
    q0 = m.add(x, x)
    cases: Cases = [(m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), q0), (m.gt(n, limit), math.nan)]

    def step(m: FloatMath, k: str, p: str, q: str) -> str:
        return m.sub(m.mul(m.add(x, x), q), m.mul(k, p))

    return cases, q0, step, m.sub(n, 1.0)


def _hermite_he(m: FloatMath, x: str, n: str) -> tuple[Cases, str, Step, str]:
    limit = 512.0 if m.dt == f64 else 128.0
    cases: Cases = [(m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), x), (m.gt(n, limit), math.nan)]

    def step(m: FloatMath, k: str, p: str, q: str) -> str:
        return m.sub(m.mul(x, q), m.mul(k, p))

    return cases, x, step, m.sub(n, 1.0)


def _laguerre(m: FloatMath, x: str, n: str) -> tuple[Cases, str, Step, str]:
    q0 = m.sub(1.0, x)
    cases: Cases = [(m.eq(x, 0.0), 1.0), (m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), q0)]

    def step(m: FloatMath, k: str, p: str, q: str) -> str:
        return m.div(m.sub(m.mul(m.add(m.add(k, k), q0), q), m.mul(k, p)), m.add(k, 1.0))

    return cases, q0, step, m.sub(n, 1.0)


def _legendre(m: FloatMath, x: str, n: str) -> tuple[Cases, str, Step, str]:
    edge = _signed(m, m.gt(x, 0.0), n, 1.0)
    cases: Cases = [(m.eq(m.abs(x), 1.0), edge), (m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), x)]

    def step(m: FloatMath, k: str, p: str, q: str) -> str:
        return m.div(m.sub(m.mul(m.mul(m.add(m.add(k, k), 1.0), x), q), m.mul(k, p)), m.add(k, 1.0))

    return cases, x, step, m.sub(n, 1.0)


# the first k of each recurrence and its stride (Hermite's H steps k by 2)
_POLY_K = {"hermite_h": (2.0, 2.0)}


def _polynomial(name: str, build: Callable[[FloatMath, str, str], tuple[Cases, str, Step, str]]) -> Converter:
    """A polynomial of degree n (tensor or Python number, truncated to an integer as torch's
    static_cast: NaN, infinite and out-of-range degrees are negative) in x, evaluated in torch's
    result dtype with torch's special cases and recurrence."""
    first_k, stride = _POLY_K.get(name, (1.0, 1.0))
    if name.startswith(("chebyshev", "shifted")):
        first_k = 2.0

    def convert(ctx: ConversionContext, x: Any, n: Any) -> str:
        dtype = ctx.out_dtype
        if dtype not in (f32, f64):
            raise ctx.error(f"{name}: only float32 / float64 results are converted, got {dtype}")
        m = FloatMath(ctx, dtype)
        xv, nv = ctx.operand(x, dtype), ctx.operand(n, dtype)
        in_range = m.lt(m.abs(nv), 2.0**63)  # False for NaN too
        nv = m.where(in_range, m.trunc(nv), -1.0)
        cases, q0, step, steps = build(m, xv, nv)
        use_recurrence = m.ge(nv, 2.0)
        for cond, _ in cases:
            use_recurrence = m.and_(use_recurrence, m.not_(cond))
        steps = m.where(use_recurrence, steps, 0.0)
        # the recurrence runs on the broadcast shape of x and n
        shape = ctx.op("Shape", m.add(xv, nv))
        p0, q0 = ctx.op("Expand", m.v(1.0), shape), ctx.op("Expand", q0, shape)
        result: Num = _recurrence(m, steps, first_k, stride, p0, q0, step, len(ctx.out_shape))
        for cond, value in reversed(cases):
            result = m.where(cond, value, result)
        return m.where(m.lt(nv, 0.0), 0.0, result)

    convert.__name__ = f"convert_{name}"
    return convert


_POLYNOMIALS = {
    "chebyshev_polynomial_t": _chebyshev("t", False),
    "chebyshev_polynomial_u": _chebyshev("u", False),
    "chebyshev_polynomial_v": _chebyshev("v", False),
    "chebyshev_polynomial_w": _chebyshev("w", False),
    "shifted_chebyshev_polynomial_t": _chebyshev("t", True),
    "shifted_chebyshev_polynomial_u": _chebyshev("u", True),
    "shifted_chebyshev_polynomial_v": _chebyshev("v", True),
    "shifted_chebyshev_polynomial_w": _chebyshev("w", True),
    "hermite_polynomial_h": _hermite_h,
    "hermite_polynomial_he": _hermite_he,
    "laguerre_polynomial_l": _laguerre,
    "legendre_polynomial_p": _legendre,
}


CONVERTERS: dict[str, Converter] = {
    "aten.special_chebyshev_polynomial_t.default": _polynomial("chebyshev_t", _chebyshev("t", False)),
    "aten.special_chebyshev_polynomial_t.x_scalar": _polynomial("chebyshev_t", _chebyshev("t", False)),
    "aten.special_chebyshev_polynomial_t.n_scalar": _polynomial("chebyshev_t", _chebyshev("t", False)),
    "aten.special_chebyshev_polynomial_u.default": _polynomial("chebyshev_u", _chebyshev("u", False)),
    "aten.special_chebyshev_polynomial_u.x_scalar": _polynomial("chebyshev_u", _chebyshev("u", False)),
    "aten.special_chebyshev_polynomial_u.n_scalar": _polynomial("chebyshev_u", _chebyshev("u", False)),
    "aten.special_chebyshev_polynomial_v.default": _polynomial("chebyshev_v", _chebyshev("v", False)),
    "aten.special_chebyshev_polynomial_v.x_scalar": _polynomial("chebyshev_v", _chebyshev("v", False)),
    "aten.special_chebyshev_polynomial_v.n_scalar": _polynomial("chebyshev_v", _chebyshev("v", False)),
    "aten.special_chebyshev_polynomial_w.default": _polynomial("chebyshev_w", _chebyshev("w", False)),
    "aten.special_chebyshev_polynomial_w.x_scalar": _polynomial("chebyshev_w", _chebyshev("w", False)),
    "aten.special_chebyshev_polynomial_w.n_scalar": _polynomial("chebyshev_w", _chebyshev("w", False)),
    "aten.special_shifted_chebyshev_polynomial_t.default": _polynomial(
        "shifted_chebyshev_t", _chebyshev("t", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_t.x_scalar": _polynomial(
        "shifted_chebyshev_t", _chebyshev("t", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_t.n_scalar": _polynomial(
        "shifted_chebyshev_t", _chebyshev("t", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_u.default": _polynomial(
        "shifted_chebyshev_u", _chebyshev("u", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_u.x_scalar": _polynomial(
        "shifted_chebyshev_u", _chebyshev("u", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_u.n_scalar": _polynomial(
        "shifted_chebyshev_u", _chebyshev("u", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_v.default": _polynomial(
        "shifted_chebyshev_v", _chebyshev("v", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_v.x_scalar": _polynomial(
        "shifted_chebyshev_v", _chebyshev("v", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_v.n_scalar": _polynomial(
        "shifted_chebyshev_v", _chebyshev("v", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_w.default": _polynomial(
        "shifted_chebyshev_w", _chebyshev("w", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_w.x_scalar": _polynomial(
        "shifted_chebyshev_w", _chebyshev("w", True)
    ),
    "aten.special_shifted_chebyshev_polynomial_w.n_scalar": _polynomial(
        "shifted_chebyshev_w", _chebyshev("w", True)
    ),
    "aten.special_hermite_polynomial_h.default": _polynomial("hermite_h", _hermite_h),
    "aten.special_hermite_polynomial_h.x_scalar": _polynomial("hermite_h", _hermite_h),
    "aten.special_hermite_polynomial_h.n_scalar": _polynomial("hermite_h", _hermite_h),
    "aten.special_hermite_polynomial_he.default": _polynomial("hermite_he", _hermite_he),
    "aten.special_hermite_polynomial_he.x_scalar": _polynomial("hermite_he", _hermite_he),
    "aten.special_hermite_polynomial_he.n_scalar": _polynomial("hermite_he", _hermite_he),
    "aten.special_laguerre_polynomial_l.default": _polynomial("laguerre_l", _laguerre),
    "aten.special_laguerre_polynomial_l.x_scalar": _polynomial("laguerre_l", _laguerre),
    "aten.special_laguerre_polynomial_l.n_scalar": _polynomial("laguerre_l", _laguerre),
    "aten.special_legendre_polynomial_p.default": _polynomial("legendre_p", _legendre),
    "aten.special_legendre_polynomial_p.x_scalar": _polynomial("legendre_p", _legendre),
    "aten.special_legendre_polynomial_p.n_scalar": _polynomial("legendre_p", _legendre),
}
