"""Special functions and orthogonal polynomials from ONNX elementwise ops (and a Loop where torch
iterates a data-dependent number of times).

ONNX has Erf but no gamma, zeta or Bessel functions. Each one is built from published series,
asymptotic expansions and rational approximations, evaluated in float64 (onnxruntime has float64
kernels for the basic ops) and cast to torch's result dtype: the series below sum up to 40 terms or
cancel large terms (K0, Y0, reflection formulas near poles), which float32 cannot do to 1e-4, and torch
itself evaluates zeta in double for float inputs. Edge values (0, negative integers, poles,
infinities, NaN) are set with Where to what torch returns there.

The orthogonal polynomials follow torch's kernels step by step in torch's own dtype (special values,
trigonometric forms for large degrees, the three-term recurrence run by a Loop up to the largest
degree), so that rounding matches. frexp and nextafter are exact (powers of two in float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import ERFC_FIT, reduce

aten = torch.ops.aten

f32, f64 = torch.float32, torch.float64
Num = str | float | int

# float32's pi: torch's trigamma kernel reflects with it
_PI_F32 = float(np.float32(math.pi))
_EULER_GAMMA = 0.57721566490153286061


class _Math:
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


def _unary(build: Callable[[_Math, str], str], name: str) -> Converter:
    """A float function of one tensor: computed in float64, returned in torch's result dtype."""

    def convert(ctx: ConversionContext, x: Value) -> str:
        dtype = ctx.out_dtype
        if not dtype.is_floating_point:
            raise ctx.error(f"{name} is only converted for floating point results, got {dtype}")
        m = _Math(ctx)
        return ctx.cast(build(m, ctx.cast(x, f64)), dtype)

    convert.__name__ = f"convert_{name}"
    return convert


# ---- gamma family -------------------------------------------------------------------------------

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


def _lgamma_right(m: _Math, y: str) -> str:
    """log Gamma(y) for y >= 0.5 (Lanczos)."""
    z = m.sub(y, 1.0)
    series = m.v(_LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        series = m.add(series, m.div(c, m.add(z, float(i))))
    t = m.add(z, _LANCZOS_G + 0.5)
    power = m.sub(m.mul(m.add(z, 0.5), m.log(t)), t)
    return m.add(power, m.add(0.5 * math.log(2.0 * math.pi), m.log(series)))


def _abs_sinpi(m: _Math, x: str) -> str:
    """|sin(pi x)| from x minus its nearest integer (exact; pi * x itself would lose the remainder)."""
    return m.abs(m.sin(m.mul(math.pi, m.sub(x, m.round(x)))))


def _lgamma(m: _Math, x: str) -> str:
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


def _digamma_right(m: _Math, y: str) -> str:
    """psi(y) for y >= 0: psi(y + 10) - sum 1 / (y + k), then the asymptotic series."""
    w = m.add(y, float(_SHIFT))
    iw2 = m.div(1.0, m.mul(w, w))
    result = m.sub(m.sub(m.log(w), m.div(0.5, w)), m.mul(iw2, m.poly(iw2, _DIGAMMA_ASYMPTOTIC)))
    for k in range(_SHIFT):
        result = m.sub(result, m.div(1.0, m.add(y, float(k))))
    return result


def _digamma(m: _Math, x: str) -> str:
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


def _zeta_tail(m: _Math, s: int, w: str) -> str:
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


def _polygamma_right(m: _Math, n: int, y: str) -> str:
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


def _trigamma(m: _Math, x: str, rounded_product: bool) -> str:
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


def _polygamma(m: _Math, n: int, x: str) -> str:
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
    m = _Math(ctx)
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
    m = _Math(ctx)
    v = ctx.cast(x, f64)
    total = m.v(p * (p - 1) / 4 * math.log(math.pi))
    for j in range(p):
        total = m.add(total, _lgamma(m, m.sub(v, j / 2)))
    return ctx.cast(total, dtype)


# ---- error-function family ----------------------------------------------------------------------

# Acklam's rational approximation of the inverse normal CDF (relative error < 1.2e-9 everywhere)
_ACKLAM_A: tuple[float, ...] = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02)
_ACKLAM_A += (1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
_ACKLAM_B: tuple[float, ...] = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02)
_ACKLAM_B += (6.680131188771972e01, -1.328068155288572e01, 1.0)
_ACKLAM_C: tuple[float, ...] = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00)
_ACKLAM_C += (-2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
_ACKLAM_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00, 1.0)
_ACKLAM_SPLIT = 0.02425


def _rev(coeffs: Sequence[float]) -> list[float]:
    """Acklam lists the highest power first."""
    return list(reversed(coeffs))


def _inverse_normal(m: _Math, centered: str, lower: str, upper: str) -> str:
    """ndtri(p) from p - 1/2, p and 1 - p (each computed exactly by the caller)."""
    r = m.mul(centered, centered)
    central = m.div(m.mul(m.poly(r, _rev(_ACKLAM_A)), centered), m.poly(r, _rev(_ACKLAM_B)))

    def tail(p: str) -> str:
        t = m.sqrt(m.mul(-2.0, m.log(p)))
        return m.div(m.poly(t, _rev(_ACKLAM_C)), m.poly(t, _rev(_ACKLAM_D)))

    result = m.where(m.lt(upper, _ACKLAM_SPLIT), m.neg(tail(upper)), central)
    result = m.where(m.lt(lower, _ACKLAM_SPLIT), tail(lower), result)
    result = m.where(m.eq(lower, 0.0), -math.inf, result)
    return m.where(m.eq(upper, 0.0), math.inf, result)


def _ndtri(m: _Math, p: str) -> str:
    return _inverse_normal(m, m.sub(p, 0.5), p, m.sub(1.0, p))


def _erfinv(m: _Math, y: str) -> str:
    """erfinv(y) = ndtri((1 + y) / 2) / sqrt(2); (1 +- y) / 2 are exact in float64 for float32 y."""
    half = m.mul(y, 0.5)
    value = _inverse_normal(m, half, m.sub(0.5, m.neg(half)), m.sub(0.5, half))
    return m.mul(value, math.sqrt(0.5))


def _erfc_parts(m: _Math, z: str) -> tuple[str, str]:
    """(t, P(t)) of the erfc fit for z >= 0: erfc(z) = t exp(P(t) - z^2)."""
    t = m.div(1.0, m.add(1.0, m.mul(z, 0.5)))
    return t, m.poly(t, ERFC_FIT)


def _erfcx(m: _Math, x: str) -> str:
    """exp(x^2) erfc(x): t exp(P(t)) for x >= 0; 2 exp(x^2) - erfcx(-x) below."""
    t, p = _erfc_parts(m, m.abs(x))
    right = m.mul(t, m.exp(p))
    left = m.sub(m.mul(2.0, m.exp(m.mul(x, x))), right)
    return m.where(m.lt(x, 0.0), left, right)


def _log_ndtr(m: _Math, x: str) -> str:
    """log(erfc(-x / sqrt 2) / 2): for x < 0 as log(t / 2) + P(t) - z^2 (no underflow in the far tail);
    for x >= 0 as log(1 - erfc(z) / 2)."""
    z = m.mul(m.abs(x), math.sqrt(0.5))
    t, p = _erfc_parts(m, z)
    z2 = m.mul(z, z)
    left = m.sub(m.add(m.log(m.mul(t, 0.5)), p), z2)
    right = m.log(m.sub(1.0, m.mul(m.mul(t, 0.5), m.exp(m.sub(p, z2)))))
    return m.where(m.lt(x, 0.0), left, right)


# ---- Bessel functions ---------------------------------------------------------------------------

_SERIES_TERMS = 40
_ASYMPTOTIC_TERMS = 20
_I_SPLIT = 15.0  # I0 / I1: power series up to here, asymptotic expansion above (rel. error < 1e-12)
_J_SPLIT = 12.0  # J / Y: power series up to here, Hankel's expansion above (abs. error < 1e-6)
_K_SPLIT = 8.0  # K: power series up to here, asymptotic expansion above (rel. error < 1e-7)


def _series_coeffs(nu: int, terms: int = _SERIES_TERMS) -> list[float]:
    """1 / (k! (k + nu)!): J_nu(x) = (x/2)^nu sum (-x^2/4)^k / (k! (k+nu)!), I_nu with +x^2/4."""
    return [1.0 / (math.factorial(k) * math.factorial(k + nu)) for k in range(terms)]


def _log_series_coeffs(nu: int, terms: int = _SERIES_TERMS) -> list[float]:
    """(psi(k+1) + psi(k+nu+1)) / (k! (k+nu)!), the second series of Y_nu and K_nu (DLMF 10.8.1, 10.31.1)."""

    def psi(j: int) -> float:
        return -_EULER_GAMMA + sum(1.0 / i for i in range(1, j))

    return [
        (psi(k + 1) + psi(k + nu + 1)) / (math.factorial(k) * math.factorial(k + nu)) for k in range(terms)
    ]


def _hankel_coeffs(nu: int, terms: int = _ASYMPTOTIC_TERMS) -> list[float]:
    """a_k(nu) = prod_{j<=k} (4 nu^2 - (2j - 1)^2) / (k! 8^k) of the large-argument expansions."""
    out = [1.0]
    for k in range(1, terms + 1):
        out.append(out[-1] * (4 * nu * nu - (2 * k - 1) ** 2) / (8 * k))
    return out


def _odd(m: _Math, x: str, value: str) -> str:
    """An odd function from its value at |x|."""
    return m.where(m.lt(x, 0.0), m.neg(value), value)


def _bessel_i(m: _Math, nu: int, x: str, scaled: bool) -> str:
    """I_nu(|x|) (times exp(-|x|) when scaled): series below 15, e^x / sqrt(2 pi x) sum (-1)^k a_k / x^k
    above (at +-inf this gives torch's NaN unscaled and 0 scaled)."""
    ax = m.abs(x)
    u = m.mul(m.mul(ax, ax), 0.25)
    series = m.poly(u, _series_coeffs(nu), _I_SPLIT**2 / 4)
    if nu:
        series = m.mul(series, m.mul(ax, 0.5))
    a = _hankel_coeffs(nu)
    asymptotic = m.div(
        m.poly(m.div(1.0, ax), [(-1) ** k * c for k, c in enumerate(a)]), m.sqrt(m.mul(2.0 * math.pi, ax))
    )
    if scaled:
        series = m.mul(series, m.exp(m.neg(ax)))
    else:
        asymptotic = m.mul(asymptotic, m.exp(ax))
    return m.where(m.le(ax, _I_SPLIT), series, asymptotic)


def _hankel(m: _Math, nu: int, ax: str) -> tuple[str, str]:
    """(J_nu, Y_nu) at ax > 0 from Hankel's expansion sqrt(2 / (pi x)) (P cos w -+ Q sin w),
    w = x - nu pi/2 - pi/4."""
    a = _hankel_coeffs(nu)
    inv = m.div(1.0, ax)
    inv2 = m.mul(inv, inv)
    p = m.poly(inv2, [(-1) ** k * a[2 * k] for k in range(len(a) // 2)])
    q = m.mul(inv, m.poly(inv2, [(-1) ** k * a[2 * k + 1] for k in range((len(a) - 1) // 2)]))
    phase = m.sub(ax, (2 * nu + 1) * math.pi / 4)
    amplitude = m.sqrt(m.div(2.0 / math.pi, ax))
    cos, sin = m.cos(phase), m.sin(phase)
    j = m.mul(amplitude, m.sub(m.mul(p, cos), m.mul(q, sin)))
    y = m.mul(amplitude, m.add(m.mul(p, sin), m.mul(q, cos)))
    return j, y


def _bessel_j_series(m: _Math, nu: int, ax: str) -> str:
    u = m.mul(m.mul(ax, ax), -0.25)
    series = m.poly(u, _series_coeffs(nu), _J_SPLIT**2 / 4)
    return m.mul(series, m.mul(ax, 0.5)) if nu else series


def _bessel_j(m: _Math, nu: int, x: str) -> str:
    ax = m.abs(x)
    j_far, _ = _hankel(m, nu, ax)
    value = m.where(m.le(ax, _J_SPLIT), _bessel_j_series(m, nu, ax), j_far)
    return _odd(m, x, value) if nu else value


def _bessel_y(m: _Math, nu: int, x: str) -> str:
    """Y_nu for x > 0 (DLMF 10.8.1); -inf at 0, NaN for negative x (log of a negative number)."""
    u = m.mul(m.mul(x, x), -0.25)
    log_term = m.mul(2.0 / math.pi, m.mul(m.log(m.mul(x, 0.5)), _bessel_j_series(m, nu, x)))
    second = m.poly(u, _log_series_coeffs(nu), _J_SPLIT**2 / 4)
    if nu == 0:
        near = m.sub(log_term, m.mul(1.0 / math.pi, second))
    else:
        near = m.sub(m.sub(log_term, m.div(2.0 / math.pi, x)), m.mul(m.mul(x, 0.5 / math.pi), second))
    _, y_far = _hankel(m, nu, x)
    value = m.where(m.le(x, _J_SPLIT), near, y_far)
    return m.where(m.eq(x, 0.0), -math.inf, value)


def _bessel_k(m: _Math, nu: int, x: str, scaled: bool) -> str:
    """K_nu for x > 0 (DLMF 10.31.1 below 8, sqrt(pi / 2x) e^-x sum a_k / x^k above); inf at 0, NaN
    for negative x."""
    u = m.mul(m.mul(x, x), 0.25)
    i_near = m.poly(u, _series_coeffs(nu), _K_SPLIT**2 / 4)
    second = m.poly(u, _log_series_coeffs(nu), _K_SPLIT**2 / 4)
    log_half = m.log(m.mul(x, 0.5))
    if nu == 0:
        near = m.add(m.mul(m.neg(log_half), i_near), m.mul(0.5, second))
    else:
        i_near = m.mul(i_near, m.mul(x, 0.5))
        near = m.sub(m.add(m.div(1.0, x), m.mul(log_half, i_near)), m.mul(m.mul(x, 0.25), second))
    far = m.mul(m.sqrt(m.div(math.pi / 2, x)), m.poly(m.div(1.0, x), _hankel_coeffs(nu)))
    if scaled:
        near = m.mul(near, m.exp(x))
    else:
        far = m.mul(far, m.exp(m.neg(x)))
    value = m.where(m.le(x, _K_SPLIT), near, far)
    return m.where(m.eq(x, 0.0), math.inf, value)


def _spherical_j0(m: _Math, x: str) -> str:
    """sin(x) / x: 1 at 0, 0 at the infinities."""
    value = m.div(m.sin(x), x)
    value = m.where(m.eq(x, 0.0), 1.0, value)
    return m.where(m.isinf(x), 0.0, value)


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


def _broadcast(ctx: ConversionContext, m: _Math, *xs: str) -> list[str]:
    """The operands expanded to their common shape (loop-carried values keep one shape)."""
    total = xs[0]
    for x in xs[1:]:
        total = m.add(total, x)
    shape = ctx.op("Shape", total)
    return [ctx.op("Expand", x, shape) for x in xs]


def _trip_count(ctx: ConversionContext, m: _Math, need: str) -> str:
    """max(need) as an int64 scalar (0 for empty tensors)."""
    flat = ctx.op("Reshape", ctx.cast(m.ceil(need), torch.int64), ctx.i64([-1]))
    return reduce(ctx, "ReduceMax", ctx.op("Concat", flat, ctx.i64([0]), axis=0), None, keepdims=False)


def _any(ctx: ConversionContext, flags: str) -> str:
    """True when some element of a bool tensor is (False for an empty one)."""
    flat = ctx.op("Reshape", ctx.cast(flags, torch.int32), ctx.i64([-1]))
    top = reduce(
        ctx, "ReduceMax", ctx.op("Concat", flat, ctx.const([0], torch.int32), axis=0), None, keepdims=False
    )
    return ctx.op("Greater", top, ctx.const(0, torch.int32))


def _zeta(m: _Math, x: str, q: str, rank: int) -> str:
    """torch's (Cephes') Hurwitz zeta: terms (q + k)^-x until k >= 9 and q + k > 9 (or the sum stops
    changing), then the Euler-Maclaurin tail; inf at x = 1 and at the poles q = 0, -1, ...; NaN for
    x < 1 and for a non-integer x with q <= 0."""
    ctx = m.ctx
    x, q = _broadcast(ctx, m, x, q)
    regular = m.and_(m.gt(x, 1.0), m.not_(m.and_(m.le(q, 0.0), m.or_(m.is_int(q), m.not_(m.is_int(x))))))
    status0 = m.where(regular, _RUNNING, _CONVERGED)
    s0 = m.pow(q, m.neg(x))
    trips = _trip_count(ctx, m, m.where(regular, m.max(9.0, m.sub(10.0, q)), 0.0))

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
        return _any(ctx, m.eq(new[3], _RUNNING)), new

    s, w, b, status = _loop(ctx, trips, [s0, q, s0, status0], m.dt, rank, body)
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


def _igamma_pair(m: _Math, a: str, x: str, rank: int) -> tuple[str, str]:
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
        return _any(ctx, m.or_(series_more, fraction_more)), [total, term, ap, b, c, d, h]

    trips = ctx.i64(_IGAMMA_MAX_TERMS)
    total, _, _, _, _, _, h = _loop(ctx, trips, state0, m.dt, rank, body)
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


def _binary(name: str, build: Callable[[_Math, str, str, int], str]) -> Converter:
    """A float function of two broadcasting operands (tensors or Python numbers, promoted as torch),
    computed in float64."""

    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        dtype = ctx.out_dtype
        if not dtype.is_floating_point:
            raise ctx.error(f"{name} is only converted for floating point results, got {dtype}")
        m = _Math(ctx)
        av, bv = (ctx.cast(ctx.operand(v, dtype), f64) for v in (a, b))
        return ctx.cast(build(m, av, bv, len(ctx.out_shape)), dtype)

    convert.__name__ = f"convert_{name}"
    return convert


# ---- orthogonal polynomials ---------------------------------------------------------------------


Step = Callable[[_Math, str, str, str], str]  # (m, k, p, q) -> the next term


def _loop(
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


def _recurrence(
    m: _Math, steps: str, first_k: float, k_stride: float, p0: str, q0: str, step: Step, rank: int
) -> str:
    """q after ``steps`` (per element, float) applications of q, p <- step(k, p, q), q with
    k = first_k, first_k + k_stride, ...; an element whose q turned NaN keeps it (torch stops there)."""
    ctx = m.ctx
    count = ctx.cast(steps, torch.int64)
    trips = _trip_count(ctx, m, steps)  # the longest run

    def body(iteration: str, state: list[str]) -> tuple[str, list[str]]:
        p, q = state
        k = m.add(first_k, m.mul(ctx.cast(iteration, m.dt), k_stride))
        active = ctx.op("Less", iteration, count)
        r = step(m, k, p, q)
        new_p, new_q = m.where(active, q, p), m.where(active, r, q)
        more = m.and_(ctx.op("Less", ctx.op("Add", iteration, ctx.i64(1)), count), m.not_(m.isnan(new_q)))
        return _any(ctx, more), [new_p, new_q]

    _, q = _loop(ctx, trips, [p0, q0], m.dt, rank, body)
    return q


def _even(m: _Math, n: str) -> str:
    return m.eq(m.ctx.op("Mod", n, m.v(2.0), fmod=1), 0.0)


def _signed(m: _Math, positive: str, n: str, value: Num) -> str:
    """value if ``positive`` or n is even, else -value."""
    return m.where(m.or_(positive, _even(m, n)), value, m.neg(value))


def _parity(m: _Math, n: str, value: Num) -> str:
    """value for even n, -value for odd n."""
    return m.where(_even(m, n), value, m.neg(value))


Cases = list[tuple[str, Num]]


def _chebyshev(kind: str, shifted: bool) -> Callable[[_Math, str, str], tuple[Cases, str, Step, str]]:
    """torch's Chebyshev polynomials of the first to fourth kind (T, U, V, W), plain or shifted to
    [0, 1]: special values at the interval's ends, a trigonometric form inside it for large n, the
    three-term recurrence otherwise."""

    def build(m: _Math, x: str, n: str) -> tuple[Cases, str, Step, str]:
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

        def step(m: _Math, k: str, p: str, q: str) -> str:
            return m.sub(m.mul(m.add(t, t), q), p)

        return cases, q0, step, m.sub(n, 1.0)

    return build


def _hermite_h(m: _Math, x: str, n: str) -> tuple[Cases, str, Step, str]:
    limit = 512.0 if m.dt == f64 else 128.0  # torch gives NaN above this degree
    q0 = m.add(x, x)
    cases: Cases = [(m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), q0), (m.gt(n, limit), math.nan)]

    def step(m: _Math, k: str, p: str, q: str) -> str:
        return m.sub(m.mul(m.add(x, x), q), m.mul(k, p))

    return cases, q0, step, m.sub(n, 1.0)


def _hermite_he(m: _Math, x: str, n: str) -> tuple[Cases, str, Step, str]:
    limit = 512.0 if m.dt == f64 else 128.0
    cases: Cases = [(m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), x), (m.gt(n, limit), math.nan)]

    def step(m: _Math, k: str, p: str, q: str) -> str:
        return m.sub(m.mul(x, q), m.mul(k, p))

    return cases, x, step, m.sub(n, 1.0)


def _laguerre(m: _Math, x: str, n: str) -> tuple[Cases, str, Step, str]:
    q0 = m.sub(1.0, x)
    cases: Cases = [(m.eq(x, 0.0), 1.0), (m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), q0)]

    def step(m: _Math, k: str, p: str, q: str) -> str:
        return m.div(m.sub(m.mul(m.add(m.add(k, k), q0), q), m.mul(k, p)), m.add(k, 1.0))

    return cases, q0, step, m.sub(n, 1.0)


def _legendre(m: _Math, x: str, n: str) -> tuple[Cases, str, Step, str]:
    edge = _signed(m, m.gt(x, 0.0), n, 1.0)
    cases: Cases = [(m.eq(m.abs(x), 1.0), edge), (m.eq(n, 0.0), 1.0), (m.eq(n, 1.0), x)]

    def step(m: _Math, k: str, p: str, q: str) -> str:
        return m.div(m.sub(m.mul(m.mul(m.add(m.add(k, k), 1.0), x), q), m.mul(k, p)), m.add(k, 1.0))

    return cases, x, step, m.sub(n, 1.0)


# the first k of each recurrence and its stride (Hermite's H steps k by 2)
_POLY_K = {"hermite_h": (2.0, 2.0)}


def _polynomial(name: str, build: Callable[[_Math, str, str], tuple[Cases, str, Step, str]]) -> Converter:
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
        m = _Math(ctx, dtype)
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


# ---- Airy function ------------------------------------------------------------------------------

_AIRY_SPLIT = 8.0  # Maclaurin series inside, asymptotic expansions outside
_AI0, _AIP0 = 0.355028053887817239260, 0.258819403792806798405  # Ai(0), -Ai'(0)


def _airy_coeffs(terms: int = 40) -> tuple[list[float], list[float]]:
    """Ai(x) = Ai(0) f(x) + Ai'(0) g(x), f = sum f_k x^3k, g = x sum g_k x^3k."""
    f, g = [1.0], [1.0]
    for k in range(1, terms):
        f.append(f[-1] / ((3 * k - 1) * (3 * k)))
        g.append(g[-1] / ((3 * k) * (3 * k + 1)))
    return f, g


def _airy_u(terms: int = 24) -> list[float]:
    """u_k of the large-argument expansions (DLMF 9.7.2)."""
    u = [1.0]
    for k in range(1, terms):
        u.append(u[-1] * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / ((2 * k - 1) * 216 * k))
    return u


def _airy_ai(m: _Math, x: str) -> str:
    """Ai(x): the series for |x| <= 8, e^-zeta / (2 sqrt(pi) x^1/4) sum (-1)^k u_k / zeta^k above, and
    (sin(t) P - cos(t) Q) / (sqrt(pi) |x|^1/4) below with the phase t = zeta + pi/4 rounded to float32
    step by step as torch's kernel computes it (so far-negative arguments oscillate in step with
    torch); NaN at +-inf and 0 above 103.892 like torch."""
    ctx = m.ctx
    f, g = _airy_coeffs()
    cube = m.mul(m.mul(x, x), x)
    near = m.sub(m.mul(_AI0, m.poly(cube, f, 512.0)), m.mul(_AIP0, m.mul(x, m.poly(cube, g, 512.0))))
    u = _airy_u()
    ax = m.abs(x)
    root = m.sqrt(ax)
    zeta = m.div(m.mul(2.0, m.mul(ax, root)), 3.0)
    inv = m.div(1.0, zeta)
    quarter = m.sqrt(root)
    right = m.poly(m.neg(inv), u)
    right = m.div(m.mul(right, m.exp(m.neg(zeta))), m.mul(2.0 * math.sqrt(math.pi), quarter))
    inv2 = m.mul(inv, inv)
    p = m.poly(inv2, [(-1) ** k * u[2 * k] for k in range(len(u) // 2)])
    q = m.mul(inv, m.poly(inv2, [(-1) ** k * u[2 * k + 1] for k in range(len(u) // 2)]))
    # the phase -2 x sqrt(-x) / 3 + pi/4 in torch's kernel dtype (float32 for float32 / float16 results)
    pdt = f64 if ctx.out_dtype == f64 else f32
    xf = ctx.cast(x, pdt)
    phase = ctx.op("Mul", ctx.const(-2.0, pdt), xf)
    phase = ctx.op("Mul", phase, ctx.op("Sqrt", ctx.op("Neg", xf)))
    phase = ctx.op("Div", phase, ctx.const(3.0, pdt))
    phase = ctx.cast(ctx.op("Add", phase, ctx.const(0.25 * math.pi, pdt)), m.dt)
    left = m.sub(m.mul(m.sin(phase), p), m.mul(m.cos(phase), q))
    left = m.div(left, m.mul(math.sqrt(math.pi), quarter))
    result = m.where(m.le(ax, _AIRY_SPLIT), near, m.where(m.lt(x, 0.0), left, right))
    result = m.where(m.gt(x, 103.892), 0.0, result)
    return m.where(m.isinf(x), math.nan, result)


# ---- floating-point structure: frexp, nextafter -------------------------------------------------


def _exponent(m: _Math, ax: str) -> str:
    """floor(log2(ax)) for finite ax > 0, exactly: the logarithm's estimate corrected by comparing with
    powers of two (exact in float64)."""
    e = m.floor(m.div(m.log(ax), math.log(2.0)))
    power = m.pow(2.0, e)
    e = m.where(m.gt(power, ax), m.sub(e, 1.0), e)
    return m.where(m.le(m.mul(m.pow(2.0, e), 2.0), ax), m.add(e, 1.0), e)


def convert_frexp(ctx: ConversionContext, x: Value) -> list[str]:
    """x = mantissa * 2^exponent with |mantissa| in [0.5, 1); (x, 0) for 0, infinities and NaN."""
    dtype = x.dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"frexp is only defined for floating point tensors, got {dtype}")
    m = _Math(ctx)
    v = ctx.cast(x, f64)
    ax = m.abs(v)
    special = m.or_(m.or_(m.eq(v, 0.0), m.isinf(v)), m.isnan(v))
    e = m.add(_exponent(m, m.where(special, 1.0, ax)), 1.0)
    e = m.where(special, 0.0, e)
    mantissa = m.div(v, m.pow(2.0, e))
    return [ctx.cast(mantissa, dtype), ctx.cast(e, torch.int32)]


def convert_nextafter(ctx: ConversionContext, x: Value, y: Value) -> str:
    """The next representable value after x toward y, from the spacing of x's binade (computed exactly
    in float64: a power of two), halved when stepping down from a power of two toward zero."""
    dtype = ctx.out_dtype
    if dtype not in (f32, torch.float16, torch.bfloat16, f64):
        raise ctx.error(f"nextafter is only converted for floating point tensors, got {dtype}")
    info = torch.finfo(dtype)
    mantissa_bits = round(-math.log2(info.eps))
    smallest = info.tiny * info.eps  # the smallest subnormal
    m = _Math(ctx)
    xv, yv = (ctx.cast(ctx.operand(v, dtype), f64) for v in (x, y))
    ax = m.abs(xv)
    finite_nonzero = m.and_(m.gt(ax, 0.0), m.not_(m.isinf(xv)))
    e = m.max(_exponent(m, m.where(finite_nonzero, ax, 1.0)), math.log2(info.tiny))
    spacing = m.pow(2.0, m.sub(e, float(mantissa_bits)))
    away = m.eq(m.lt(xv, yv), m.gt(xv, 0.0))  # moving away from zero
    at_power = m.and_(m.eq(ax, m.pow(2.0, e)), m.gt(ax, info.tiny))
    down = m.where(at_power, m.mul(spacing, 0.5), spacing)
    step = m.where(away, spacing, down)
    result = m.where(m.lt(xv, yv), m.add(xv, step), m.sub(xv, step))
    result = m.where(m.isinf(xv), m.where(m.gt(xv, 0.0), info.max, -info.max), result)
    result = m.where(m.eq(xv, 0.0), m.where(m.lt(xv, yv), smallest, -smallest), result)
    result = m.where(m.eq(xv, yv), yv, result)
    result = m.where(m.or_(m.isnan(xv), m.isnan(yv)), math.nan, result)
    return ctx.cast(result, dtype)


# ---- registry -----------------------------------------------------------------------------------

_UNARY: dict[str, Callable[[_Math, str], str]] = {
    "lgamma": _lgamma,
    "digamma": _digamma,
    "special_digamma": _digamma,
    "special_psi": _digamma,
    "special_gammaln": _lgamma,
    "erfinv": _erfinv,
    "special_erfinv": _erfinv,
    "special_ndtri": _ndtri,
    "special_erfcx": _erfcx,
    "special_log_ndtr": _log_ndtr,
    "i0": lambda m, x: _bessel_i(m, 0, x, False),
    "special_i0": lambda m, x: _bessel_i(m, 0, x, False),
    "special_modified_bessel_i0": lambda m, x: _bessel_i(m, 0, x, False),
    "special_i0e": lambda m, x: _bessel_i(m, 0, x, True),
    "special_i1": lambda m, x: _odd(m, x, _bessel_i(m, 1, x, False)),
    "special_modified_bessel_i1": lambda m, x: _odd(m, x, _bessel_i(m, 1, x, False)),
    "special_i1e": lambda m, x: _odd(m, x, _bessel_i(m, 1, x, True)),
    "special_bessel_j0": lambda m, x: _bessel_j(m, 0, x),
    "special_bessel_j1": lambda m, x: _bessel_j(m, 1, x),
    "special_bessel_y0": lambda m, x: _bessel_y(m, 0, x),
    "special_bessel_y1": lambda m, x: _bessel_y(m, 1, x),
    "special_modified_bessel_k0": lambda m, x: _bessel_k(m, 0, x, False),
    "special_modified_bessel_k1": lambda m, x: _bessel_k(m, 1, x, False),
    "special_scaled_modified_bessel_k0": lambda m, x: _bessel_k(m, 0, x, True),
    "special_scaled_modified_bessel_k1": lambda m, x: _bessel_k(m, 1, x, True),
    "special_spherical_bessel_j0": _spherical_j0,
    "special_airy_ai": _airy_ai,
}


def _igamma(m: _Math, a: str, x: str, rank: int) -> str:
    return _igamma_pair(m, a, x, rank)[0]


def _igammac(m: _Math, a: str, x: str, rank: int) -> str:
    return _igamma_pair(m, a, x, rank)[1]


CONVERTERS: dict[str, Converter] = {
    "aten.lgamma.default": _unary(_lgamma, "lgamma"),
    "aten.digamma.default": _unary(_digamma, "digamma"),
    "aten.special_digamma.default": _unary(_digamma, "special_digamma"),
    "aten.special_psi.default": _unary(_digamma, "special_psi"),
    "aten.special_gammaln.default": _unary(_lgamma, "special_gammaln"),
    "aten.erfinv.default": _unary(_erfinv, "erfinv"),
    "aten.special_erfinv.default": _unary(_erfinv, "special_erfinv"),
    "aten.special_ndtri.default": _unary(_ndtri, "special_ndtri"),
    "aten.special_erfcx.default": _unary(_erfcx, "special_erfcx"),
    "aten.special_log_ndtr.default": _unary(_log_ndtr, "special_log_ndtr"),
    "aten.i0.default": _unary(_UNARY["i0"], "i0"),
    "aten.special_i0.default": _unary(_UNARY["special_i0"], "special_i0"),
    "aten.special_modified_bessel_i0.default": _unary(
        _UNARY["special_modified_bessel_i0"], "special_modified_bessel_i0"
    ),
    "aten.special_i0e.default": _unary(_UNARY["special_i0e"], "special_i0e"),
    "aten.special_i1.default": _unary(_UNARY["special_i1"], "special_i1"),
    "aten.special_modified_bessel_i1.default": _unary(
        _UNARY["special_modified_bessel_i1"], "special_modified_bessel_i1"
    ),
    "aten.special_i1e.default": _unary(_UNARY["special_i1e"], "special_i1e"),
    "aten.special_bessel_j0.default": _unary(_UNARY["special_bessel_j0"], "special_bessel_j0"),
    "aten.special_bessel_j1.default": _unary(_UNARY["special_bessel_j1"], "special_bessel_j1"),
    "aten.special_bessel_y0.default": _unary(_UNARY["special_bessel_y0"], "special_bessel_y0"),
    "aten.special_bessel_y1.default": _unary(_UNARY["special_bessel_y1"], "special_bessel_y1"),
    "aten.special_modified_bessel_k0.default": _unary(
        _UNARY["special_modified_bessel_k0"], "special_modified_bessel_k0"
    ),
    "aten.special_modified_bessel_k1.default": _unary(
        _UNARY["special_modified_bessel_k1"], "special_modified_bessel_k1"
    ),
    "aten.special_scaled_modified_bessel_k0.default": _unary(
        _UNARY["special_scaled_modified_bessel_k0"], "special_scaled_modified_bessel_k0"
    ),
    "aten.special_scaled_modified_bessel_k1.default": _unary(
        _UNARY["special_scaled_modified_bessel_k1"], "special_scaled_modified_bessel_k1"
    ),
    "aten.special_spherical_bessel_j0.default": _unary(_spherical_j0, "special_spherical_bessel_j0"),
    "aten.special_airy_ai.default": _unary(_airy_ai, "special_airy_ai"),
    "aten.polygamma.default": convert_polygamma,
    "aten.special_polygamma.default": convert_polygamma,
    "aten.mvlgamma.default": convert_mvlgamma,
    "aten.frexp.Tensor": convert_frexp,
    "aten.nextafter.default": convert_nextafter,
    "aten.special_zeta.default": _binary("zeta", _zeta),
    "aten.special_zeta.self_scalar": _binary("zeta", _zeta),
    "aten.special_zeta.other_scalar": _binary("zeta", _zeta),
    "aten.igamma.default": _binary("igamma", _igamma),
    "aten.igammac.default": _binary("igammac", _igammac),
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
    "aten.special_multigammaln.default": convert_mvlgamma,
}
