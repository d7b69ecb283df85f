"""Matrix norms and spectral decompositions (QR, eigh, SVD, pinv, matrix_rank, cond) against torch's
OpInfo samples and hand-written cases. Eigen- and singular vectors are compared up to their sign
(tests/support/opinfo_harness.py SIGN_AMBIGUOUS); hand-written cases return sign-free quantities (|V|, V diag(w) Vᵀ).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import fastonnx
from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, opinfo_cases

OPS = [
    "linalg.matrix_norm",
    "linalg.norm",
    "linalg.norm.subgradients_at_zero",
    "norm.nuc",
    "linalg.qr",
    "geqrf",
    "linalg.eigh",
    "linalg.eigvalsh",
    "linalg.svd",
    "svd",
    "linalg.svdvals",
    "linalg.pinv",
    "linalg.pinv.singular",
    "linalg.pinv.hermitian",
    "pinverse",
    "linalg.matrix_rank",
    "linalg.matrix_rank.hermitian",
    "linalg.cond",
    "linalg.matrix_sqrth",
    "linalg.polar",
    # linalg.eig / linalg.eigvals: complex outputs (a real matrix may have complex eigenvalues).
]
# torch computes the norms of float16 inputs (the SVD-based ords are float32 / float64 only)
HALF_OPS = ["linalg.matrix_norm", "linalg.norm", "linalg.norm.subgradients_at_zero"]
# float64: the decompositions must match LAPACK to float64 tolerances (1e-7), not just float32's
DOUBLE_OPS = ["linalg.qr", "geqrf", "linalg.eigh", "linalg.svd", "linalg.pinv", "linalg.matrix_norm"]


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS, float16=HALF_OPS, float64=DOUBLE_OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


@pytest.mark.parametrize("op_name", ["linalg.matrix_norm", "linalg.norm"])
def test_bfloat16(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.bfloat16, limit=2)


# ---- hand-written cases ------------------------------------------------------------------------------
def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sym(n: int, batch: tuple[int, ...] = (), seed: int = 0) -> torch.Tensor:
    a = torch.randn(*batch, n, n, generator=_gen(seed))
    return a + a.mT


def _eigh_invariants(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    w, v = torch.linalg.eigh(a)
    return w, v.abs(), (v * w.unsqueeze(-2)) @ v.mT, v.mT @ v


def _svd_invariants(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    return s, u.abs(), vh.abs(), (u * s.unsqueeze(-2)) @ vh


@pytest.mark.parametrize("n", [1, 2, 3, 8, 13])
def test_eigh_sizes(n: int) -> None:
    # odd sizes leave one index out of each round-robin round; n = 1 needs no rotation at all
    check_export(Fn(_eigh_invariants), (_sym(n, (2,), seed=n),), opsets=ENDS, atol=2e-4)


@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (1, 4), (7, 3), (3, 7), (6, 6), (2, 9, 5)])
def test_svd_shapes(shape: tuple[int, ...]) -> None:
    check_export(Fn(_svd_invariants), (torch.randn(*shape, generator=_gen(1)),), opsets=ENDS)


def test_eigh_reads_one_triangle() -> None:
    a = torch.randn(5, 5, generator=_gen(2))  # not symmetric: torch reads the lower (or upper) triangle

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lw, lv = torch.linalg.eigh(x)
        uw, uv = torch.linalg.eigh(x, UPLO="U")
        return lw, lv.abs(), uw, uv.abs(), torch.linalg.eigvalsh(x, UPLO="U")

    check_export(Fn(fn), (a,), opsets=ENDS)


def test_eigh_repeated_and_diagonal() -> None:
    # repeated eigenvalues: vectors are not unique, values and reconstruction are
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=_gen(3)))
    a = q @ torch.diag(torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0, -3.0])) @ q.T
    diag = torch.diag(torch.tensor([3.0, -1.0, 2.0, 0.0]))

    def fn(x: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w, v = torch.linalg.eigh(x)
        dw, dv = torch.linalg.eigh(d)
        return w, (v * w.unsqueeze(-2)) @ v.mT, dw, dv.abs(), torch.linalg.eigvalsh(d * 0)

    check_export(Fn(fn), (a, diag), opsets=ENDS)


def test_qr_modes() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, r = torch.linalg.qr(x, mode="complete")
        _, r_only = torch.linalg.qr(x, mode="r")
        q2, r2 = torch.linalg.qr(x.mT)
        q3, r3 = torch.linalg.qr(x.mT, mode="complete")
        return q, r, r_only, q2, r2, q3, r3

    check_export(Fn(fn), (torch.randn(2, 6, 4, generator=_gen(4)),), opsets=ENDS)


def test_qr_signs_follow_lapack() -> None:
    # columns whose leading entry is negative, zero, or which are already reduced (nothing below)
    a = torch.tensor([[-2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, -4.0], [0.0, 4.0, 2.0]])
    b = torch.tensor([[0.0, 1.0], [3.0, 2.0], [4.0, 0.5]])
    fn = Fn(lambda x, y: (*torch.linalg.qr(x), *torch.linalg.qr(y), *torch.geqrf(x), *torch.geqrf(y)))
    check_export(fn, (a, b), opsets=ENDS)


def test_svd_variants() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        u, s, v = torch.svd(x, compute_uv=False)
        full_u, full_s, full_vh = torch.linalg.svd(x, full_matrices=True)
        # the columns past min(m, n) are any basis of the complement: compare their projector
        extra = full_u[..., 3:]
        return u, s, v, full_s, full_u[..., :3].abs(), full_vh.abs(), extra @ extra.mT, full_u.mT @ full_u

    check_export(Fn(fn), (torch.randn(5, 3, generator=_gen(5)),), opsets=ENDS)


def test_pinv_of_singular_matrices() -> None:
    g = _gen(6)
    low_rank = torch.randn(2, 6, 2, generator=g) @ torch.randn(2, 2, 5, generator=g)  # rank 2
    sym = low_rank[0, :5] @ low_rank[0, :5].T  # symmetric, rank 2

    def fn(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.linalg.pinv(x),
            torch.linalg.pinv(s, hermitian=True),
            torch.linalg.matrix_rank(x),
            torch.linalg.matrix_rank(s, hermitian=True),
            torch.linalg.matrix_rank(x, atol=1.0, rtol=0.0),
            torch.linalg.matrix_rank(x, atol=0.0),  # atol <= 0 keeps the default rtol
            torch.linalg.matrix_rank(x, atol=torch.tensor([0.0, 1e-30])),
            torch.linalg.pinv(x, atol=0.0),
            torch.linalg.pinv(x, atol=torch.tensor(0.5), rtol=torch.tensor([0.01, 0.2])),
        )

    check_export(Fn(fn), (low_rank, sym), opsets=ENDS, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.linalg.matrix_norm(x, "nuc", dim=(0, 2), keepdim=True),
        lambda x: torch.linalg.matrix_norm(x, 2, dim=(2, 0)),
        lambda x: torch.linalg.matrix_norm(x, -2),
        lambda x: torch.linalg.matrix_norm(x, float("inf"), dim=(1, 2), keepdim=True),
        lambda x: torch.linalg.matrix_norm(x, -1, dim=(0, 1), dtype=torch.float64),
        lambda x: torch.linalg.norm(x, dim=(0, 2)),
        lambda x: torch.linalg.norm(x, 2, dim=(-1, -2), keepdim=True),
        lambda x: torch.linalg.norm(x[0], float("-inf")),
        lambda x: torch.linalg.norm(x, 3, dim=1),
        lambda x: torch.linalg.norm(x),
        lambda x: torch.linalg.cond(x),
        lambda x: torch.linalg.cond(x[:, :3, :3], -2),
    ],
)
def test_norm_dims_and_cond(fn: Callable[..., Any]) -> None:
    check_export(Fn(fn), (torch.randn(3, 4, 5, generator=_gen(7)),), opsets=ENDS)


def test_nan_propagates_through_norms() -> None:
    x = torch.randn(2, 3, 3, generator=_gen(8))
    x[0, 1, 1] = float("nan")
    fn = Fn(lambda t: (torch.linalg.matrix_norm(t, 1), torch.linalg.matrix_norm(t, float("inf"))))
    check_export(fn, (x,), opsets=ENDS)


class Decompositions(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, r = torch.linalg.qr(x)
        return (*_eigh_invariants(x + x.mT), *_svd_invariants(x), q, r, torch.linalg.pinv(x))


def test_dynamic_batch() -> None:
    batch = torch.export.Dim("batch")
    check_export(
        Decompositions(),
        (torch.randn(2, 4, 4, generator=_gen(9)),),
        opsets=ENDS,
        dynamic_shapes=({0: batch},),
        run_args=[(torch.randn(5, 4, 4, generator=_gen(10)),), (torch.randn(1, 4, 4, generator=_gen(11)),)],
        atol=1e-3,
    )


def test_symbolic_matrix_size_is_refused() -> None:
    n = torch.export.Dim("n", min=2)
    x = torch.randn(4, 4)
    ep = torch.export.export(Fn(torch.linalg.eigvalsh), (x,), dynamic_shapes=(({0: n, 1: n},),), strict=False)
    with pytest.raises(fastonnx.ConversionError, match="must be static"):
        fastonnx.to_onnx(ep, (x,))


@pytest.mark.parametrize("p", ["fro", "nuc", 1, -1, float("inf"), float("-inf")])
def test_cond_through_the_inverse(p: Any) -> None:
    x = torch.randn(2, 4, 4, generator=_gen(12))
    check_export(Fn(lambda t: torch.linalg.cond(t, p)), (x,), opsets=ENDS, atol=1e-3, rtol=1e-3)


def test_legacy_and_private_overloads() -> None:
    x = torch.randn(5, 4, generator=_gen(13))
    s = x.T @ x

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _, sv, _ = torch.ops.aten._linalg_svd(a, compute_uv=False)
        w, _ = torch.ops.aten._linalg_eigh(b, "L", False)
        return (
            torch.ops.aten.nuclear_norm(a),
            torch.ops.aten.nuclear_norm(a.unsqueeze(0), [0, 2], True),
            torch.ops.aten.linalg_matrix_rank(a, 0.5, False),
            torch.ops.aten.linalg_pinv(a, 0.1, False),
            sv,
            w,
        )

    check_export(Fn(fn), (x, s), opsets=ENDS, atol=1e-3, rtol=1e-3)


def test_graded_and_clustered_spectra() -> None:
    # singular values over 9 decades and eigenvalues 1e-6 apart: float64 answers to float64 accuracy
    g = _gen(14)
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    graded = u[:, :4] @ torch.diag(torch.tensor([1.0, 1e-3, 1e-6, 1e-9], dtype=torch.float64)) @ v.T
    w = torch.tensor([1.0, 1.0 + 1e-6, 2.0, -1.0, 5.0], dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))
    clustered = q @ torch.diag(w) @ q.T
    fn = Fn(lambda a, b: (torch.linalg.svdvals(a), torch.linalg.eigvalsh(b), torch.linalg.matrix_rank(a)))
    check_export(fn, (graded, clustered), opsets=ENDS, atol=1e-13, rtol=1e-9)


def test_matrix_sqrth_clamps_negative_eigenvalues() -> None:
    a = torch.randn(2, 4, 4, generator=_gen(15))  # neither symmetric nor positive definite
    check_export(Fn(torch.linalg.matrix_sqrth), (a,), opsets=ENDS)
