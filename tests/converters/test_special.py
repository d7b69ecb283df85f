"""Special-function converters (gamma family, erfinv / ndtri, Bessel functions) against torch's OpInfo
samples, at both ends of the opset range, plus edge values the samples do not reach."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import (
    assert_case_converts,
    opinfo_cases,
    ops_supporting,
)

OPS = [
    "lgamma",
    "digamma",
    "erfinv",
    "i0",
    "special.i0e",
    "special.i1",
    "special.i1e",
    "special.log_ndtr",
    "special.ndtri",
    "special.erfcx",
    "polygamma.polygamma_n_0",
    "polygamma.polygamma_n_1",
    "polygamma.polygamma_n_2",
    "polygamma.polygamma_n_3",
    "polygamma.polygamma_n_4",
    "special.polygamma.special_polygamma_n_0",
    "mvlgamma.mvlgamma_p_1",
    "mvlgamma.mvlgamma_p_3",
    "mvlgamma.mvlgamma_p_5",
    "special.bessel_j0",
    "special.bessel_j1",
    "special.bessel_y0",
    "special.bessel_y1",
    "special.modified_bessel_i0",
    "special.modified_bessel_i1",
    "special.modified_bessel_k0",
    "special.modified_bessel_k1",
    "special.scaled_modified_bessel_k0",
    "special.scaled_modified_bessel_k1",
    "special.spherical_bessel_j0",
    "special.chebyshev_polynomial_t",
    "special.chebyshev_polynomial_u",
    "special.chebyshev_polynomial_v",
    "special.chebyshev_polynomial_w",
    "special.shifted_chebyshev_polynomial_t",
    "special.shifted_chebyshev_polynomial_u",
    "special.shifted_chebyshev_polynomial_v",
    "special.shifted_chebyshev_polynomial_w",
    "special.hermite_polynomial_h",
    "special.hermite_polynomial_he",
    "special.laguerre_polynomial_l",
    "special.legendre_polynomial_p",
    "special.zeta",
    "igamma",
    "igammac",
    "special.airy_ai",
    "nextafter",
    "frexp",
]
HALF_OPS = ops_supporting(OPS, torch.float16)
INT_OPS = ops_supporting(OPS, torch.int64)
BOOL_OPS = ops_supporting(OPS, torch.bool)


@pytest.mark.parametrize(
    ("op_name", "dtype"), opinfo_cases(OPS, float16=HALF_OPS, int64=INT_OPS, bool=BOOL_OPS)
)
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


# ---- hand-written cases: edge values and ranges the OpInfo samples do not reach -----------------

_INF, _NAN = float("inf"), float("nan")
EDGES = torch.tensor(
    [_NAN, _INF, -_INF, 0.0, -0.0, -1.0, -2.0, -3.0, -2.5, 1e-30, -1e-30, 3e38, -3e38, 1e-3, 0.5, 1.0, 2.0]
)
WIDE = torch.cat(
    [EDGES, torch.linspace(-30, 30, 1201), torch.logspace(-8, 6, 120), -torch.logspace(-8, 6, 120)]
)

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "trigamma": lambda x: torch.polygamma(1, x),
    "polygamma_2": lambda x: torch.polygamma(2, x),
    "polygamma_3": lambda x: torch.polygamma(3, x),
    "polygamma_7": lambda x: torch.polygamma(7, x),
    "i0": torch.i0,
    "i0e": torch.special.i0e,
    "i1": torch.special.i1,
    "i1e": torch.special.i1e,
    "erfcx": torch.special.erfcx,
    "log_ndtr": torch.special.log_ndtr,
    "bessel_j0": torch.special.bessel_j0,
    "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0,
    "bessel_y1": torch.special.bessel_y1,
    "modified_bessel_k0": torch.special.modified_bessel_k0,
    "modified_bessel_k1": torch.special.modified_bessel_k1,
    "scaled_modified_bessel_k0": torch.special.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": torch.special.scaled_modified_bessel_k1,
    "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "airy_ai": torch.special.airy_ai,
}


@pytest.mark.parametrize("name", list(UNARY))
def test_edges_and_wide_range(name: str) -> None:
    check_export(Fn(UNARY[name]), (WIDE,), opsets=(17,))


def test_inverse_normal_tails() -> None:
    # probabilities down to float32's smallest normal, and erfinv arguments next to +-1
    p = torch.cat([torch.rand(200), torch.logspace(-38, 0, 100), 1 - torch.logspace(-7.5, 0, 50)])
    p = torch.cat([p, torch.tensor([0.0, 1.0, 0.5, -0.5, 1.5, _NAN])])
    y = torch.cat([2 * p - 1, -1 + torch.logspace(-7.5, 0, 50), torch.tensor([1e-30, -1e-30, -1.0, 1.0])])
    check_export(Fn(torch.special.ndtri), (p,), opsets=(17,))
    check_export(Fn(torch.erfinv), (y,), opsets=(17,))


@pytest.mark.parametrize(
    "fn",
    [lambda x: torch.mvlgamma(x, 2), lambda x: torch.special.multigammaln(x, 4), torch.special.gammaln],
    ids=["mvlgamma_2", "multigammaln_4", "gammaln"],
)
def test_gamma_aliases(fn: Callable[..., Any]) -> None:
    x = torch.linspace(2.0, 40.0, 50)
    check_export(Fn(fn), (x,), opsets=ENDS)


def test_inplace_and_float16_edges() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x.clone()
        y.lgamma_()
        z = x.clone()
        z.digamma_()
        return y, z, torch.polygamma(2, x), torch.i0(x)

    x = torch.tensor([0.25, 1.5, 3.0, -2.5, 0.0, 7.0, 1e-3], dtype=torch.float16)
    check_export(Fn(fn), (x,), opsets=ENDS, atol=1e-2, rtol=1e-2)


POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_degrees_and_scalars(name: str) -> None:
    # the interval's ends, the trigonometric branch (large n inside [-1, 1]), overflow to inf / NaN
    # outside it (the loop stops early), non-integer, negative, NaN and infinite degrees, scalar x and n
    f = getattr(torch.special, name)
    x = torch.tensor([-2.5, -1.0, -0.3, 0.0, 0.2, 0.7, 1.0, 1.5, 3.0, _NAN, 0.5, 0.5])
    n = torch.tensor([0.0, 1.0, 2.0, 5.0, 7.0, 9.0, 12.0, 40.0, 1000.0, 3.0, _NAN, -_INF])
    check_export(
        Fn(lambda a, b: (f(a, b), f(a, 7), f(0.3, b), f(a, 11.5), f(a, b - 0.5))), (x, n), opsets=ENDS
    )
    check_export(Fn(f), (x[:9].long(), n[:9].long()), opsets=(17,))


def _grid(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair of ``values`` (edges against edges)."""
    t = torch.tensor(values)
    return t.repeat_interleave(len(values)), t.repeat(len(values))


PAIR_EDGES = [0.0, -0.0, 1.0, 2.0, 3.0, -1.0, -2.5, _NAN, _INF, -_INF, 0.5, 1e-30, 30.0, 100.0]


def test_zeta_edges_and_scalars() -> None:
    x, q = _grid(PAIR_EDGES)
    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [x, torch.rand(300, generator=gen) * 12, torch.randint(2, 9, (100,), generator=gen).float()]
    )
    q = torch.cat([q, torch.randn(300, generator=gen) * 6, torch.rand(100, generator=gen) * -20])
    fn = Fn(lambda a, b: (torch.special.zeta(a, b), torch.special.zeta(a, 2.5), torch.special.zeta(3.0, b)))
    check_export(fn, (x, q), opsets=ENDS)


def test_incomplete_gamma_edges_and_large_arguments() -> None:
    a, x = _grid(PAIR_EDGES)
    gen = torch.Generator().manual_seed(0)
    big = torch.rand(200, generator=gen) * 400
    a = torch.cat([a, big, torch.rand(200, generator=gen) * 5])
    x = torch.cat(
        [x, big * (1 + 0.3 * torch.randn(200, generator=gen)).abs(), torch.rand(200, generator=gen) * 20]
    )
    check_export(Fn(lambda s, t: (torch.igamma(s, t), torch.igammac(s, t))), (a, x), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_nextafter_and_frexp_are_exact(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    special = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, info.tiny, info.tiny / 2, info.tiny * info.eps]
    special += [-info.tiny * info.eps, info.max, -info.max, _INF, -_INF, _NAN]
    x, y = _grid(special)
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([x, torch.randn(500, generator=gen) * 100]).to(dtype)
    y = torch.cat([y, torch.randn(500, generator=gen) * 100]).to(dtype)
    check_export(Fn(torch.nextafter), (x, y), opsets=ENDS, atol=0, rtol=0)
    check_export(Fn(torch.frexp), (x,), opsets=ENDS, atol=0, rtol=0)


class DynamicSpecial(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.special.chebyshev_polynomial_t(x, n),
            torch.special.hermite_polynomial_he(x, 5),
            torch.igamma(x.abs() + 0.5, n.abs()),
            torch.special.zeta(n.abs() + 1.5, x.abs() + 0.1),
            torch.lgamma(x),
            torch.special.i1e(x),
        )


def test_dynamic_shapes() -> None:
    batch = torch.export.Dim("batch")
    gen = torch.Generator().manual_seed(0)
    x, n = torch.randn(3, 4, generator=gen) * 3, torch.randint(0, 12, (4,), generator=gen).float()
    check_export(
        DynamicSpecial(),
        (x, n),
        opsets=ENDS,
        dynamic_shapes=({0: batch}, None),
        run_args=[(torch.randn(7, 4, generator=gen) * 3, n)],
    )
