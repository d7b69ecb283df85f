"""Bessel functions (I0, I1 and their scaled forms, J0, J1, Y0, Y1, K0, K1 and their scaled forms,
the spherical j0) and the Airy function Ai, evaluated in float64 (``lib.float_math``): power series
near zero, asymptotic (Hankel) expansions far from it, so that the series stay short and accurate;
values at 0, the infinities and negative arguments as torch gives them."""

from __future__ import annotations

import math
from collections.abc import Callable

from fastonnx.context import Converter
from fastonnx.converters.lib.float_math import (
    FloatMath,
    f32,
    f64,
    unary_converter,
)

_EULER_GAMMA = 0.57721566490153286061


# ---- Bessel functions ----------------------------------------------------------------------------


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


def _odd(m: FloatMath, x: str, value: str) -> str:
    """An odd function from its value at |x|."""
    return m.where(m.lt(x, 0.0), m.neg(value), value)


def _bessel_i(m: FloatMath, nu: int, x: str, scaled: bool) -> str:
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


def _hankel(m: FloatMath, nu: int, ax: str) -> tuple[str, str]:
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


def _bessel_j_series(m: FloatMath, nu: int, ax: str) -> str:
    u = m.mul(m.mul(ax, ax), -0.25)
    series = m.poly(u, _series_coeffs(nu), _J_SPLIT**2 / 4)
    return m.mul(series, m.mul(ax, 0.5)) if nu else series


def _bessel_j(m: FloatMath, nu: int, x: str) -> str:
    ax = m.abs(x)
    j_far, _ = _hankel(m, nu, ax)
    value = m.where(m.le(ax, _J_SPLIT), _bessel_j_series(m, nu, ax), j_far)
    return _odd(m, x, value) if nu else value


def _bessel_y(m: FloatMath, nu: int, x: str) -> str:
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


def _bessel_k(m: FloatMath, nu: int, x: str, scaled: bool) -> str:
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


def _spherical_j0(m: FloatMath, x: str) -> str:
    """sin(x) / x: 1 at 0, 0 at the infinities."""
    value = m.div(m.sin(x), x)
    value = m.where(m.eq(x, 0.0), 1.0, value)
    return m.where(m.isinf(x), 0.0, value)


# ---- Airy function -------------------------------------------------------------------------------


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


def _airy_ai(m: FloatMath, x: str) -> str:
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


_UNARY: dict[str, Callable[[FloatMath, str], str]] = {
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


CONVERTERS: dict[str, Converter] = {
    "aten.i0.default": unary_converter(_UNARY["i0"], "i0"),
    "aten.special_i0.default": unary_converter(_UNARY["special_i0"], "special_i0"),
    "aten.special_modified_bessel_i0.default": unary_converter(
        _UNARY["special_modified_bessel_i0"], "special_modified_bessel_i0"
    ),
    "aten.special_i0e.default": unary_converter(_UNARY["special_i0e"], "special_i0e"),
    "aten.special_i1.default": unary_converter(_UNARY["special_i1"], "special_i1"),
    "aten.special_modified_bessel_i1.default": unary_converter(
        _UNARY["special_modified_bessel_i1"], "special_modified_bessel_i1"
    ),
    "aten.special_i1e.default": unary_converter(_UNARY["special_i1e"], "special_i1e"),
    "aten.special_bessel_j0.default": unary_converter(_UNARY["special_bessel_j0"], "special_bessel_j0"),
    "aten.special_bessel_j1.default": unary_converter(_UNARY["special_bessel_j1"], "special_bessel_j1"),
    "aten.special_bessel_y0.default": unary_converter(_UNARY["special_bessel_y0"], "special_bessel_y0"),
    "aten.special_bessel_y1.default": unary_converter(_UNARY["special_bessel_y1"], "special_bessel_y1"),
    "aten.special_modified_bessel_k0.default": unary_converter(
        _UNARY["special_modified_bessel_k0"], "special_modified_bessel_k0"
    ),
    "aten.special_modified_bessel_k1.default": unary_converter(
        _UNARY["special_modified_bessel_k1"], "special_modified_bessel_k1"
    ),
    "aten.special_scaled_modified_bessel_k0.default": unary_converter(
        _UNARY["special_scaled_modified_bessel_k0"], "special_scaled_modified_bessel_k0"
    ),
    "aten.special_scaled_modified_bessel_k1.default": unary_converter(
        _UNARY["special_scaled_modified_bessel_k1"], "special_scaled_modified_bessel_k1"
    ),
    "aten.special_spherical_bessel_j0.default": unary_converter(_spherical_j0, "special_spherical_bessel_j0"),
    "aten.special_airy_ai.default": unary_converter(_airy_ai, "special_airy_ai"),
}
