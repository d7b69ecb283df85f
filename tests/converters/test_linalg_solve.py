"""Direct linear-algebra solvers (LU, Cholesky, triangular solves and what is built on them) against
torch's OpInfo samples, plus hand-written cases for what the samples do not reach: singular matrices
and their ``info``, pivot ties, dynamic batches, integer powers, well-conditioned matrix exponentials."""

from __future__ import annotations

import pytest
import torch

import fastonnx
from support.export_check import Fn, check_export
from support.opinfo_harness import assert_case_converts, opinfo_cases

OPS = [
    "linalg.inv",
    "linalg.inv_ex",
    "linalg.solve",
    "linalg.solve_ex",
    "linalg.det",
    "linalg.slogdet",
    "logdet",
    "linalg.cholesky",
    "linalg.cholesky_ex",
    "cholesky_solve",
    "cholesky_inverse",
    "linalg.solve_triangular",
    "triangular_solve",
    "lu",
    "linalg.lu",
    "linalg.lu_factor",
    "linalg.lu_factor_ex",
    "lu_solve",
    "linalg.lu_solve",
    "lu_unpack",
    "linalg.ldl_factor",
    "linalg.ldl_factor_ex",
    "linalg.ldl_solve",
    "linalg.matrix_power",
    "matrix_exp",  # with its own tolerance (opinfo_harness.OP_TOLERANCE says why)
    "linalg.tensorinv",
    "linalg.tensorsolve",
    "linalg.vander",
    "linalg.householder_product",
    "ormqr",
]
# float64 takes other paths (onnxruntime's Det has no float64 kernel: det goes through our LU)
FLOAT64_OPS = ["linalg.det", "linalg.slogdet", "linalg.inv", "linalg.lu", "linalg.cholesky", "matrix_exp"]
# no float16 parametrization: torch's linalg ops have no float16 CPU kernels, except matrix_exp whose
# float16 kernel is broken in eager (NaN for 0.1 * I); the converter computes half types in float32
INT64_OPS = ["linalg.vander"]


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS, float64=FLOAT64_OPS, int64=INT64_OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


# ---- hand-written cases ---------------------------------------------------------------------------

SINGULAR = torch.tensor(
    [
        # rank 2: a zero pivot at step 3. Powers of two keep every elimination step exact, so torch's
        # det is 0 on every CPU (with [[1, 2, 3], [2, 4, 6], ...] some LAPACK builds give 3.6e-7)
        [[2.0, 4.0, 8.0], [1.0, 2.0, 4.0], [1.0, 0.0, 1.0]],
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],  # zero column first: info 1
        [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]],  # regular: info 0
    ]
)


def test_lu_info_and_pivots_of_singular_matrices() -> None:
    def fn(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lu, piv, info = torch.linalg.lu_factor_ex(a)
        return lu, piv, info, torch.linalg.inv_ex(a).info, torch.linalg.solve_ex(a, a[..., :1]).info

    check_export(Fn(fn), (SINGULAR,))
    check_export(Fn(lambda a: (torch.linalg.det(a), torch.linalg.slogdet(a), torch.logdet(a))), (SINGULAR,))
    check_export(Fn(lambda a: torch.linalg.det(a)), (SINGULAR.double(),))


def test_lu_pivot_ties_pick_the_first_row() -> None:
    # |values| tie in the pivot column: getrf takes the first of them
    a = torch.tensor(
        [
            [[1.0, 2.0, 0.5], [-1.0, 3.0, 1.0], [1.0, -2.0, 4.0]],
            [[0.0, 1.0, 2.0], [2.0, 1.0, 1.0], [-2.0, 5.0, 1.0]],
        ]
    )
    check_export(Fn(lambda x: (torch.linalg.lu_factor(x), torch.linalg.lu(x))), (a,), atol=0, rtol=0)


def test_negative_determinants() -> None:
    a = torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[2.0, 0.0], [0.0, 3.0]], [[-1.0, 0.0], [0.0, 1.0]]])
    check_export(Fn(lambda x: (torch.linalg.slogdet(x), torch.logdet(x), torch.det(x))), (a,))


def test_cholesky_info_of_indefinite_matrices() -> None:
    a = torch.tensor(
        [
            [[4.0, 2.0, 0.0], [2.0, 5.0, 1.0], [0.0, 1.0, 3.0]],  # positive definite: info 0
            [[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]],  # fails at column 2
            [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],  # fails at column 1
        ]
    )
    check_export(Fn(lambda x: torch.linalg.cholesky_ex(x).info), (a,))
    check_export(Fn(lambda x: torch.linalg.cholesky_ex(x[:1], upper=True)), (a,))


def test_triangular_solves_read_one_triangle_and_broadcast() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 1, 4, 4, generator=gen) + 4 * torch.eye(4)
    b = torch.randn(3, 4, 2, generator=gen)

    def fn(t: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.linalg.solve_triangular(t, r, upper=True),
            torch.linalg.solve_triangular(t, r, upper=False, unitriangular=True),
            torch.linalg.solve_triangular(t, r.mT, upper=False, left=False),
            torch.triangular_solve(r, t, upper=False, transpose=True),
            torch.cholesky_solve(r, t.tril()),
            torch.linalg.solve(t, r[0, :, 0]),
            torch.linalg.solve(t, r.mT, left=False),
        )

    check_export(Fn(fn), (a, b))


def test_dynamic_batch() -> None:
    gen = torch.Generator().manual_seed(0)

    def make(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.randn(batch, 4, 4, generator=gen)
        return a, a @ a.mT + torch.eye(4)

    def fn(a: torch.Tensor, spd: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.linalg.inv(a),
            torch.linalg.det(a),
            torch.linalg.slogdet(a.double()),
            torch.linalg.solve(a, spd),
            torch.linalg.cholesky(spd),
            torch.linalg.lu(a),
            torch.linalg.matrix_power(a, -2),
            torch.linalg.matrix_exp(a * 0.3),
        )

    batch = torch.export.Dim("batch")
    check_export(
        Fn(fn), make(3), dynamic_shapes=(({0: batch}, {0: batch}),), run_args=[make(5), make(1)], atol=1e-3
    )


def test_symbolic_matrix_size_is_refused() -> None:
    size = torch.export.Dim("size", min=2)
    a = torch.randn(3, 3)
    ep = torch.export.export(Fn(torch.linalg.inv), (a,), dynamic_shapes=(({0: size, 1: size},),))
    with pytest.raises(fastonnx.ConversionError, match="must be static"):
        fastonnx.to_onnx(ep, (a,))


@pytest.mark.parametrize("power", [0, 1, 2, 3, 6, 7, -1, -3])
def test_matrix_power(power: int) -> None:
    a = torch.tensor([[[2.0, 1.0], [0.5, 1.5]], [[1.0, -1.0], [2.0, 0.5]]])
    check_export(Fn(lambda x: torch.linalg.matrix_power(x, power)), (a,))
    if power >= 0:  # integer matrices: exact products
        check_export(Fn(lambda x: torch.matrix_power(x, power)), ((a * 2).long(),), atol=0, rtol=0)


def test_matrix_exp_well_conditioned() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, 5, generator=gen)
    zeros = torch.zeros(1, 5, 5)
    big = torch.randn(5, 5, generator=gen)
    big = -(big @ big.mT) * 3 - 20 * torch.eye(5)  # large norm, many squarings, decaying result
    check_export(
        Fn(lambda x, z, y: (torch.matrix_exp(x), torch.matrix_exp(z), torch.matrix_exp(y))), (a, zeros, big)
    )


def test_ldl_with_2x2_pivots() -> None:
    # random symmetric matrices: about half of them take a 2 x 2 pivot somewhere; the zero matrix and a
    # matrix with a zero first column give info > 0 and no update
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(40, 5, 5, generator=gen)
    a = a + a.mT
    a[0] = 0.0
    a[1, 0, :] = a[1, :, 0] = 0.0
    ld, piv, _ = torch.linalg.ldl_factor_ex(a)
    assert bool((piv < 0).any()), "the samples must exercise 2 x 2 pivots"
    # the factors to float32 rounding (LAPACK builds order their sums differently: 1 ulp apart on some
    # CPUs); pivots and info are integers, which these tolerances still compare exactly
    check_export(Fn(lambda x: torch.linalg.ldl_factor_ex(x)), (a,), atol=1e-5, rtol=1.3e-6)
    b = torch.randn(5, 3, generator=gen)  # broadcast over the batch of factors
    check_export(Fn(lambda f, p, r: torch.linalg.ldl_solve(f, p, r)), (ld[2:], piv[2:], b), atol=1e-3)


def test_internal_overloads_of_decomposed_programs() -> None:
    # ExportedProgram.run_decompositions() turns det / slogdet / solve into these
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 4, 4, generator=gen)
    b = torch.randn(2, 4, 3, generator=gen)
    aten = torch.ops.aten

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            *aten._linalg_det(x),
            *aten._linalg_slogdet(x),
            *aten._linalg_solve_ex(x, y),
            aten._linalg_solve_ex(x, y.mT, left=False)[0],
        )

    check_export(Fn(fn), (a, b))


@pytest.mark.parametrize("unpack_data,unpack_pivots", [(True, False), (False, True), (False, False)])
def test_lu_unpack_flags(unpack_data: bool, unpack_pivots: bool) -> None:
    lu, piv = torch.linalg.lu_factor(torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0)))
    fn = Fn(lambda x, y: torch.lu_unpack(x, y, unpack_data=unpack_data, unpack_pivots=unpack_pivots))
    check_export(fn, (lu, piv))
