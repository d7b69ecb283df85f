"""The gamma family and its relatives, from ONNX elementwise ops evaluated in float64
(``lib.float_math``): lgamma, digamma, polygamma, mvlgamma, the Hurwitz zeta function and the
regularised incomplete gamma functions (igamma, igammac; a Loop where torch iterates a data-dependent
number of times).

Lanczos' approximation, recurrences and asymptotic series, reflection formulas left of the poles; the
zeta function follows torch's (Cephes') algorithm; edge values (0, negative integers, poles, infinities,
NaN) are set with Where to what torch returns there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.float_math import (
    FloatMath,
    any_true,
    f64,
    float_loop,
    trip_count,
    unary_converter,
)

# float32's pi: torch's trigamma kernel reflects with it
_PI_F32 = float(np.float32(math.pi))


# ---- gamma family --------------------------------------------------------------------------------


# Lanczos approximation, g = 7, 9 terms (Godfrey's coefficients): relative error ~1e-15 for z >= 0.5
_LANCZOS_G = 7.0


_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)


def _lgamma_right(m: FloatMath, y: str) -> str:
    """log Gamma(y) for y >= 0.5 (Lanczos)."""
    z = m.sub(y, 1.0)
    series = m.v(_LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        series = m.add(series, m.div(c, m.add(z, float(i))))
    t = m.add(z, _LANCZOS_G + 0.5)
    power = m.sub(m.mul(m.add(z, 0.5), m.log(t)), t)
    return m.add(power, m.add(0.5 * math.log(2.0 * math.pi), m.log(series)))


def _abs_sinpi(m: FloatMath, x: str) -> str:
    """|sin(pi x)| from x minus its nearest integer (exact; pi * x itself would lose the remainder)."""
    return m.abs(m.sin(m.mul(math.pi, m.sub(x, m.round(x)))))


def _lgamma(m: FloatMath, x: str) -> str:
    """Reflection lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x) left of 0.5; +inf at the poles
    (0 and the negative integers) and at both infinities, like torch."""
    left = m.lt(x, 0.5)
    right = _lgamma_right(m, m.where(left, m.sub(1.0, x), x))
    reflected = m.sub(m.sub(math.log(math.pi), m.log(_abs_sinpi(m, x))), right)
    result = m.where(left, reflected, right)
    pole = m.or_(m.isinf(x), m.and_(m.le(x, 0.0), m.is_int(x)))
    return m.where(pole, math.inf, result)


# psi(w) ~ log w - 1/(2w) - sum B_2k / (2k w^2k); the coefficients of 1/w^2, 1/w^4, ... (w >= 10: 1e-15)
_DIGAMMA_ASYMPTOTIC = (
    1.0 / 12,
    -1.0 / 120,
    1.0 / 252,
    -1.0 / 240,
    1.0 / 132,
    -691.0 / 32760,
    1.0 / 12,
)


_SHIFT = 10  # recurrence steps before the asymptotic series


def _digamma_right(m: FloatMath, y: str) -> str:
    """psi(y) for y >= 0: psi(y + 10) - sum 1 / (y + k), then the asymptotic series."""
    w = m.add(y, float(_SHIFT))
    iw2 = m.div(1.0, m.mul(w, w))
    result = m.sub(m.sub(m.log(w), m.div(0.5, w)), m.mul(iw2, m.poly(iw2, _DIGAMMA_ASYMPTOTIC)))
    for k in range(_SHIFT):
        result = m.sub(result, m.div(1.0, m.add(y, float(k))))
    return result


def _digamma(m: FloatMath, x: str) -> str:
    """Reflection psi(x) = psi(1 - x) - pi / tan(pi x) for x < 0 (tan of the fractional part, as
    torch); psi(+-0) = -+inf, NaN at negative integers and -inf."""
    neg = m.lt(x, 0.0)
    right = _digamma_right(m, m.where(neg, m.sub(1.0, x), x))
    frac = m.mul(math.pi, m.sub(x, m.trunc(x)))
    reflected = m.sub(right, m.div(m.mul(math.pi, m.cos(frac)), m.sin(frac)))
    result = m.where(neg, reflected, right)
    result = m.where(m.eq(x, 0.0), m.div(-1.0, x), result)  # -1 / (+-0) = -+inf
    return m.where(m.and_(neg, m.is_int(x)), math.nan, result)


# Bernoulli numbers B_2, B_4, ..., B_16 (Euler-Maclaurin tail of the Hurwitz zeta function)
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)


def _zeta_tail(m: FloatMath, s: int, w: str) -> str:
    """Hurwitz zeta(s, w) for w >= 10 and an integer s >= 2 by Euler-Maclaurin:
    w^-s * (w / (s - 1) + 1/2 + sum_j B_2j / (2j)! * s (s+1) ... (s+2j-2) * w^(1-2j))."""
    coeffs = []
    rising = float(s)  # s (s+1) ... (s + 2j - 2)
    for j, b in enumerate(_BERNOULLI, start=1):
        coeffs.append(b / math.factorial(2 * j) * rising)
        rising *= (s + 2 * j - 1) * (s + 2 * j)
    iw = m.div(1.0, w)
    bracket = m.add(m.add(m.div(w, float(s - 1)), 0.5), m.mul(iw, m.poly(m.mul(iw, iw), coeffs)))
    return m.mul(m.pow(w, float(-s)), bracket)


def _polygamma_right(m: FloatMath, n: int, y: str) -> str:
    """psi^(n)(y) = (-1)^(n+1) n! zeta(n + 1, y) for y >= 0 and n >= 1: ten terms of the sum, then the
    Euler-Maclaurin tail."""
    s = n + 1
    total = _zeta_tail(m, s, m.add(y, float(_SHIFT)))
    for k in range(_SHIFT):
        total = m.add(total, m.pow(m.add(y, float(k)), float(-s)))
    return m.mul(total, (-1.0) ** (n + 1) * math.factorial(n))


def _cot_derivative_poly(n: int) -> list[float]:
    """P_n with d^n/dy^n cot(y) = P_n(cot y): P_0 = c, P_(k+1) = -(1 + c^2) P_k'."""
    p = np.polynomial.Polynomial([0.0, 1.0])
    for _ in range(n):
        p = -np.polynomial.Polynomial([1.0, 0.0, 1.0]) * p.deriv()
    return [float(c) for c in p.coef]


def _trigamma(m: FloatMath, x: str, rounded_product: bool) -> str:
    """torch's trigamma: reflection pi^2 / sin^2(pi x) - psi'(1 - x) below 0.5, where sin(pi x) is
    evaluated on float32's pi times x rounded to float32 (so poles give torch's large finite values)."""
    left = m.lt(x, 0.5)
    right = _polygamma_right(m, 1, m.where(left, m.sub(1.0, x), x))
    pi = _PI_F32 if rounded_product else math.pi  # torch's double kernel uses double pi
    product = m.mul(pi, x)
    if rounded_product:
        product = m.round_f32(product)
    sine = m.sin(product)
    reflected = m.sub(m.div(pi * pi, m.mul(sine, sine)), right)
    result = m.where(left, reflected, right)
    return m.where(m.and_(m.isinf(x), m.gt(x, 0.0)), 0.0, result)  # the tail's inf * 0


def _polygamma(m: FloatMath, n: int, x: str) -> str:
    """n >= 2: reflection psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi^(n+1) P_n(cot(pi x)) for x < 0.
    torch evaluates (-1)^(n+1) n! zeta(n + 1, x): infinite (with that sign) at 0, the negative
    integers and -inf, NaN at +inf."""
    neg = m.lt(x, 0.0)
    right = _polygamma_right(m, n, m.where(neg, m.sub(1.0, x), x))
    frac = m.mul(math.pi, m.sub(x, m.round(x)))
    cot = m.div(m.cos(frac), m.sin(frac))
    cot_term = m.mul(math.pi ** (n + 1), m.poly(cot, _cot_derivative_poly(n)))
    reflected = m.sub(m.mul((-1.0) ** n, right), cot_term)
    result = m.where(neg, reflected, right)
    pole = m.and_(m.le(x, 0.0), m.is_int(x))
    result = m.where(pole, (-1.0) ** (n + 1) * math.inf, result)
    return m.where(m.and_(m.isinf(x), m.gt(x, 0.0)), math.nan, result)


def convert_polygamma(ctx: ConversionContext, n: Any, x: Value) -> str:
    if not isinstance(n, int) or isinstance(n, bool):
        raise ctx.error(f"polygamma: the order n must be a Python int, got {n!r}")
    if n < 0:
        raise ctx.error(f"polygamma: the order n must be non-negative, got {n}")
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"polygamma is only converted for floating point results, got {dtype}")
    m = FloatMath(ctx)
    v = ctx.cast(x, f64)
    if n == 0:
        result = _digamma(m, v)
    elif n == 1:
        result = _trigamma(m, v, rounded_product=dtype != f64)
    else:
        result = _polygamma(m, n, v)
    return ctx.cast(result, dtype)


def convert_mvlgamma(ctx: ConversionContext, x: Value, p: int) -> str:
    """log of the multivariate gamma function: p(p-1)/4 log(pi) + sum_j lgamma(x - j/2).

    torch raises when an element is <= (p - 1) / 2; a graph cannot raise, it returns that sum."""
    if not isinstance(p, int) or p < 1:
        raise ctx.error(f"mvlgamma: p must be a positive int, got {p!r}")
    dtype = ctx.out_dtype
    m = FloatMath(ctx)
    v = ctx.cast(x, f64)
    total = m.v(p * (p - 1) / 4 * math.log(math.pi))
    for j in range(p):
        total = m.add(total, _lgamma(m, m.sub(v, j / 2)))
    return ctx.cast(total, dtype)


# ---- functions of two tensors: Hurwitz zeta, incomplete gamma ------------------------------------


_MACHEP = 1.11022302462515654042e-16


# (2j)! / B_2j, j = 1..12: the Euler-Maclaurin coefficients torch's (Cephes') zeta divides by
_ZETA_EM = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)


_RUNNING, _CONVERGED, _TAIL = 0.0, 1.0, 2.0


def _broadcast(ctx: ConversionContext, m: FloatMath, *xs: str) -> list[str]:
    """The operands expanded to their common shape (loop-carried values keep one shape)."""
    total = xs[0]
    for x in xs[1:]:
        total = m.add(total, x)
    shape = ctx.op("Shape", total)
    return [ctx.op("Expand", x, shape) for x in xs]


def _zeta(m: FloatMath, x: str, q: str, rank: int) -> str:
    """torch's (Cephes') Hurwitz zeta: terms (q + k)^-x until k >= 9 and q + k > 9 (or the sum stops
    changing), then the Euler-Maclaurin tail; inf at x = 1 and at the poles q = 0, -1, ...; NaN for
    x < 1 and for a non-integer x with q <= 0."""
    ctx = m.ctx
    x, q = _broadcast(ctx, m, x, q)
    regular = m.and_(m.gt(x, 1.0), m.not_(m.and_(m.le(q, 0.0), m.or_(m.is_int(q), m.not_(m.is_int(x))))))
    status0 = m.where(regular, _RUNNING, _CONVERGED)
    s0 = m.pow(q, m.neg(x))
    trips = trip_count(ctx, m, m.where(regular, m.max(9.0, m.sub(10.0, q)), 0.0))

    def body(iteration: str, state: list[str]) -> tuple[str, list[str]]:
        s, a, b, status = state
        running = m.eq(status, _RUNNING)
        a1 = m.add(a, 1.0)
        b1 = m.pow(a1, m.neg(x))
        s1 = m.add(s, b1)
        converged = m.and_(m.lt(m.mul(-_MACHEP, s1), b1), m.lt(b1, m.mul(_MACHEP, s1)))
        count = m.add(ctx.cast(iteration, m.dt), 1.0)
        leave = m.not_(m.or_(m.lt(count, 9.0), m.le(a1, 9.0)))
        next_status = m.where(converged, _CONVERGED, m.where(leave, _TAIL, _RUNNING))
        new = [m.where(running, v1, v) for v1, v in ((s1, s), (a1, a), (b1, b), (next_status, status))]
        return any_true(ctx, m.eq(new[3], _RUNNING)), new

    s, w, b, status = float_loop(ctx, trips, [s0, q, s0, status0], m.dt, rank, body)
    tail = m.sub(m.add(s, m.div(m.mul(b, w), m.sub(x, 1.0))), m.mul(0.5, b))
    rising, k = m.v(1.0), 0.0
    stopped = m.lt(x, x)  # all False
    for divisor in _ZETA_EM:
        rising = m.mul(rising, m.add(x, k))
        b = m.div(b, w)
        t = m.div(m.mul(rising, b), divisor)
        tail = m.where(stopped, tail, m.add(tail, t))
        stopped = m.or_(stopped, m.lt(m.abs(m.div(t, tail)), _MACHEP))
        rising = m.mul(rising, m.add(x, k + 1.0))
        b = m.div(b, w)
        k += 2.0
    result = m.where(m.eq(status, _TAIL), tail, s)
    result = m.where(m.isnan(x), math.nan, result)  # pow(1, NaN) is 1; torch's sum turns NaN after it
    result = m.where(m.and_(m.le(q, 0.0), m.not_(m.is_int(x))), math.nan, result)
    result = m.where(m.and_(m.le(q, 0.0), m.is_int(q)), math.inf, result)
    result = m.where(m.lt(x, 1.0), math.nan, result)
    return m.where(m.eq(x, 1.0), math.inf, result)


_TINY = 1e-300


_IGAMMA_MAX_TERMS = 5000


def _igamma_pair(m: FloatMath, a: str, x: str, rank: int) -> tuple[str, str]:
    """Regularised incomplete gamma functions (P, Q): the power series of P for x < a + 1, Lentz's
    continued fraction of Q above, iterated until they converge (at most 5000 terms), with torch's
    values at the boundaries: NaN for a < 0 or x < 0, P(0, x > 0) = 1, P(a, 0) = 0, P(inf, x) = 0,
    P(a, inf) = 1, NaN for both infinite or both zero."""
    ctx = m.ctx
    a, x = _broadcast(ctx, m, a, x)
    log_prefactor = m.sub(m.sub(m.mul(a, m.log(x)), x), _lgamma(m, a))
    use_series = m.lt(x, m.add(a, 1.0))
    regular = m.and_(m.and_(m.gt(a, 0.0), m.gt(x, 0.0)), m.not_(m.or_(m.isinf(a), m.isinf(x))))
    series_on = m.and_(regular, use_series)
    fraction_on = m.and_(regular, m.not_(use_series))
    inv_a = m.div(1.0, a)
    b0 = m.add(m.sub(x, a), 1.0)
    d0 = m.div(1.0, b0)
    c0 = ctx.op("Expand", m.v(1.0 / _TINY), ctx.op("Shape", a))
    state0 = [inv_a, inv_a, a, b0, c0, d0, d0]

    def body(iteration: str, state: list[str]) -> tuple[str, list[str]]:
        total, term, ap, b, c, d, h = state
        ap = m.add(ap, 1.0)
        term = m.mul(term, m.div(x, ap))
        total = m.add(total, term)
        i = m.add(ctx.cast(iteration, m.dt), 1.0)
        an = m.mul(m.neg(i), m.sub(i, a))
        b = m.add(b, 2.0)
        d = m.add(m.mul(an, d), b)
        d = m.where(m.lt(m.abs(d), _TINY), _TINY, d)
        c = m.add(b, m.div(an, c))
        c = m.where(m.lt(m.abs(c), _TINY), _TINY, c)
        d = m.div(1.0, d)
        delta = m.mul(d, c)
        h = m.mul(h, delta)
        series_more = m.and_(series_on, m.gt(term, m.mul(_MACHEP, total)))
        fraction_more = m.and_(fraction_on, m.ge(m.abs(m.sub(delta, 1.0)), _MACHEP))
        return any_true(ctx, m.or_(series_more, fraction_more)), [total, term, ap, b, c, d, h]

    trips = ctx.i64(_IGAMMA_MAX_TERMS)
    total, _, _, _, _, _, h = float_loop(ctx, trips, state0, m.dt, rank, body)
    p_series = m.mul(total, m.exp(log_prefactor))
    q_fraction = m.mul(h, m.exp(log_prefactor))
    p = m.where(use_series, p_series, m.sub(1.0, q_fraction))
    q = m.where(use_series, m.sub(1.0, p_series), q_fraction)
    # boundaries, in torch's order of precedence (the first test that holds wins)
    for cond, p_value in (
        (m.isinf(x), 1.0),
        (m.isinf(a), m.where(m.isinf(x), math.nan, 0.0)),
        (m.eq(x, 0.0), 0.0),
        (m.eq(a, 0.0), m.where(m.gt(x, 0.0), 1.0, math.nan)),
        (m.or_(m.lt(x, 0.0), m.lt(a, 0.0)), math.nan),
    ):
        p = m.where(cond, p_value, p)
        q = m.where(cond, m.sub(1.0, p_value), q)
    return p, q


def _binary(name: str, build: Callable[[FloatMath, str, str, int], str]) -> Converter:
    """A float function of two broadcasting operands (tensors or Python numbers, promoted as torch),
    computed in float64."""

    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        dtype = ctx.out_dtype
        if not dtype.is_floating_point:
            raise ctx.error(f"{name} is only converted for floating point results, got {dtype}")
        m = FloatMath(ctx)
        av, bv = (ctx.cast(ctx.operand(v, dtype), f64) for v in (a, b))
        return ctx.cast(build(m, av, bv, len(ctx.out_shape)), dtype)

    convert.__name__ = f"convert_{name}"
    return convert


def _igamma(m: FloatMath, a: str, x: str, rank: int) -> str:
    return _igamma_pair(m, a, x, rank)[0]


def _igammac(m: FloatMath, a: str, x: str, rank: int) -> str:
    return _igamma_pair(m, a, x, rank)[1]


CONVERTERS: dict[str, Converter] = {
    "aten.lgamma.default": unary_converter(_lgamma, "lgamma"),
    "aten.digamma.default": unary_converter(_digamma, "digamma"),
    "aten.special_digamma.default": unary_converter(_digamma, "special_digamma"),
    "aten.special_psi.default": unary_converter(_digamma, "special_psi"),
    "aten.special_gammaln.default": unary_converter(_lgamma, "special_gammaln"),
    "aten.polygamma.default": convert_polygamma,
    "aten.special_polygamma.default": convert_polygamma,
    "aten.mvlgamma.default": convert_mvlgamma,
    "aten.special_zeta.default": _binary("zeta", _zeta),
    "aten.special_zeta.self_scalar": _binary("zeta", _zeta),
    "aten.special_zeta.other_scalar": _binary("zeta", _zeta),
    "aten.igamma.default": _binary("igamma", _igamma),
    "aten.igammac.default": _binary("igammac", _igammac),
    "aten.special_multigammaln.default": convert_mvlgamma,
}
