"""Matrix-product converters against torch's OpInfo samples, plus hand-written cases OpInfo lacks."""

from __future__ import annotations

import pytest
import torch

from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, opinfo_cases

OPS = [
    "nn.functional.linear",
    "mm",
    "bmm",
    "matmul",
    "__rmatmul__",
    "dot",
    "vdot",
    "mv",
    "addmm",
    "addmm.decomposed",
    "baddbmm",
    "addbmm",
    "addmv",
    "outer",
    "linalg.vecdot",
    "linalg.multi_dot",
    "cross",
    "linalg.cross",
    "einsum",
    "tensordot",
    "nn.functional.bilinear",
    "addr",
    "inner",
    "trace",
]


# onnxruntime runs float16 MatMul / Gemm / Einsum; the ops whose samples capture in float16
FLOAT16_OPS = [
    "nn.functional.linear",
    "mm",
    "bmm",
    "matmul",
    "addmm",
    "baddbmm",
    "addmv",
    "outer",
    "linalg.vecdot",
    "cross",
    "einsum",
    "tensordot",
    "nn.functional.bilinear",
    "addr",
    "inner",
    "trace",
]
# integer products: MatMul and Einsum have int64 kernels (Gemm does not, so addmm takes MatMul)
INT64_OPS = [
    "mm",
    "bmm",
    "matmul",
    "dot",
    "mv",
    "addmm",
    "baddbmm",
    "addbmm",
    "addmv",
    "outer",
    "cross",
    "einsum",
    "addr",
    "inner",
    "trace",
]


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS, float16=FLOAT16_OPS, int64=INT64_OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


def test_addr_bool() -> None:
    # bool addr is (beta and self) or (alpha and outer)
    assert_op_converts("addr", ENDS, dtype=torch.bool, limit=2)


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_module(shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    check_export(torch.nn.Linear(5, 4, bias=bias), (torch.randn(shape),))


def test_linear_dynamic_batch() -> None:
    batch = torch.export.Dim("batch", max=64)
    seq = torch.export.Dim("seq", max=64)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 3))
    check_export(
        model,
        (torch.randn(2, 3, 5),),
        dynamic_shapes=({0: batch, 1: seq},),
        run_args=[(torch.randn(4, 7, 5),)],
    )
    check_export(model, (torch.randn(2, 5),), dynamic_shapes=({0: batch},), run_args=[(torch.randn(9, 5),)])


def test_addmm_beta_zero_ignores_nan_bias() -> None:
    bias = torch.full((3, 4), float("nan"))
    fn = Fn(lambda b, m1, m2: torch.addmm(b, m1, m2, beta=0, alpha=2.0))
    check_export(fn, (bias, torch.randn(3, 5), torch.randn(5, 4)))
    fn = Fn(lambda b, m1, m2: torch.baddbmm(b, m1, m2, beta=0.0, alpha=0.5))
    check_export(fn, (torch.full((2, 3, 4), float("inf")), torch.randn(2, 3, 5), torch.randn(2, 5, 4)))


@pytest.mark.parametrize("use_gelu", [False, True])
def test_addmm_activation(use_gelu: bool) -> None:
    fn = Fn(lambda b, m1, m2: torch.ops.aten._addmm_activation(b, m1, m2, beta=0.5, use_gelu=use_gelu))
    check_export(fn, (torch.randn(4), torch.randn(3, 5), torch.randn(5, 4)), opsets=(17, 20))


@pytest.mark.parametrize(
    ("a", "b"), [((5,), (2, 5, 3)), ((2, 3, 5), (5,)), ((4, 1, 3, 5), (2, 5, 6)), ((5,), (5,))]
)
def test_matmul_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    check_export(Fn(torch.matmul), (torch.randn(a), torch.randn(b)))


def test_einsum_upper_case_and_ellipsis() -> None:
    fn = Fn(lambda x, y: torch.einsum("...Ij,jK->...KI", x, y))
    check_export(fn, (torch.randn(2, 3, 4), torch.randn(4, 5)))
    check_export(Fn(lambda x: torch.einsum("ii->i", x)), (torch.randn(4, 4),))
    # '...' of different ranks, broadcast and summed away
    fn = Fn(lambda x, y: torch.einsum("...ik,...j->ij", x, y))
    check_export(fn, (torch.randn(3, 2, 4), torch.randn(2, 1, 5)))


def test_tensordot_int_dims() -> None:
    check_export(Fn(lambda x, y: torch.tensordot(x, y, dims=2)), (torch.randn(2, 3, 4), torch.randn(3, 4, 5)))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_small_integer_inner_trace_addr(dtype: torch.dtype) -> None:
    # Einsum has no small-integer kernels: inner runs in int64 and wraps back like torch
    x = torch.randint(0, 40, (4, 4)).to(dtype)
    fn = Fn(lambda t: (torch.inner(t, t), torch.trace(t), torch.addr(t, t[0], t[:, 1], beta=2, alpha=3)))
    check_export(fn, (x,), opsets=ENDS)


def test_empty_inner_dim_gives_zeros() -> None:
    # onnxruntime's MatMul leaves its output uninitialized when the contracted dim is empty
    a, b = torch.randn(2, 5, 0), torch.randn(2, 0, 3)
    check_export(Fn(lambda x, y: (x @ y, torch.mm(x[0], y[0]))), (a, b), opsets=ENDS)
