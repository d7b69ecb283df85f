"""The error-function family beyond ONNX's Erf, evaluated in float64 (``lib.float_math``): erfinv and
ndtri (Acklam's rational approximation of the inverse normal CDF), erfcx and log_ndtr (the erfc fit of
``lib.ops``, kept in the form that does not underflow in the far tail)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fastonnx.context import Converter
from fastonnx.converters.lib.float_math import (
    FloatMath,
    unary_converter,
)
from fastonnx.converters.lib.ops import ERFC_FIT

# ---- error-function family -----------------------------------------------------------------------


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


def _inverse_normal(m: FloatMath, centered: str, lower: str, upper: str) -> str:
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


def _ndtri(m: FloatMath, p: str) -> str:
    return _inverse_normal(m, m.sub(p, 0.5), p, m.sub(1.0, p))


def _erfinv(m: FloatMath, y: str) -> str:
    """erfinv(y) = ndtri((1 + y) / 2) / sqrt(2); (1 +- y) / 2 are exact in float64 for float32 y."""
    half = m.mul(y, 0.5)
    value = _inverse_normal(m, half, m.sub(0.5, m.neg(half)), m.sub(0.5, half))
    return m.mul(value, math.sqrt(0.5))


def _erfc_parts(m: FloatMath, z: str) -> tuple[str, str]:
    """(t, P(t)) of the erfc fit for z >= 0: erfc(z) = t exp(P(t) - z^2)."""
    t = m.div(1.0, m.add(1.0, m.mul(z, 0.5)))
    return t, m.poly(t, ERFC_FIT)


def _erfcx(m: FloatMath, x: str) -> str:
    """exp(x^2) erfc(x): t exp(P(t)) for x >= 0; 2 exp(x^2) - erfcx(-x) below."""
    t, p = _erfc_parts(m, m.abs(x))
    right = m.mul(t, m.exp(p))
    left = m.sub(m.mul(2.0, m.exp(m.mul(x, x))), right)
    return m.where(m.lt(x, 0.0), left, right)


def _log_ndtr(m: FloatMath, x: str) -> str:
    """log(erfc(-x / sqrt 2) / 2): for x < 0 as log(t / 2) + P(t) - z^2 (no underflow in the far tail);
    for x >= 0 as log(1 - erfc(z) / 2)."""
    z = m.mul(m.abs(x), math.sqrt(0.5))
    t, p = _erfc_parts(m, z)
    z2 = m.mul(z, z)
    left = m.sub(m.add(m.log(m.mul(t, 0.5)), p), z2)
    right = m.log(m.sub(1.0, m.mul(m.mul(t, 0.5), m.exp(m.sub(p, z2)))))
    return m.where(m.lt(x, 0.0), left, right)


CONVERTERS: dict[str, Converter] = {
    "aten.erfinv.default": unary_converter(_erfinv, "erfinv"),
    "aten.special_erfinv.default": unary_converter(_erfinv, "special_erfinv"),
    "aten.special_ndtri.default": unary_converter(_ndtri, "special_ndtri"),
    "aten.special_erfcx.default": unary_converter(_erfcx, "special_erfcx"),
    "aten.special_log_ndtr.default": unary_converter(_log_ndtr, "special_log_ndtr"),
}
