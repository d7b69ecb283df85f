"""Reduction and cumulative-op converters against torch's OpInfo samples and hand-written cases."""

from __future__ import annotations

import pytest
import torch

from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import (
    assert_case_converts,
    opinfo_cases,
    ops_supporting,
)

OPS = [
    "sum",
    "mean",
    "prod",
    "nansum",
    "nanmean",
    "amax",
    "amin",
    "max.reduction_no_dim",
    "max.reduction_with_dim",
    "min.reduction_no_dim",
    "min.reduction_with_dim",
    "aminmax",
    "argmax",
    "argmin",
    "var",
    "var.unbiased",
    "std",
    "std.unbiased",
    "var_mean",
    "var_mean.unbiased",
    "std_mean",
    "std_mean.unbiased",
    "linalg.vector_norm",
    "norm",
    "norm.inf",
    "norm.fro",
    "any",
    "all",
    "count_nonzero",
    "logsumexp",
    "cumsum",
    "cumprod",
    "logcumsumexp",
    "cummax",
    "cummin",
    # these reach aten as the reductions above plus where / elementwise ops of other families
    "nn.functional.normalize",
    "masked.sum",
    "masked.mean",
    "masked.amax",
    "masked.amin",
    "masked.prod",
    "masked.norm",
    "masked.logsumexp",
    "masked.cumsum",
    "masked.cumprod",
    "masked.argmax",
    "masked.argmin",
    "masked.normalize",
    "masked.std",
    "masked.var",
    "sum_to_size",
    "renorm",
    "diff",
    "trapezoid",
    "trapz",
    "cumulative_trapezoid",
    "gradient",
]


FLOAT16_OPS = ops_supporting(OPS, torch.float16, "masked.")
INT_OPS = ops_supporting(OPS, torch.int64, "masked.")
BOOL_OPS = ops_supporting(OPS, torch.bool, "masked.")


@pytest.mark.parametrize(
    ("op_name", "dtype"), opinfo_cases(OPS, float16=FLOAT16_OPS, int64=INT_OPS, bool=BOOL_OPS)
)
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


aten = torch.ops.aten
X = torch.randn(3, 4, 5)


@pytest.mark.parametrize("dim", [None, [], [0, 2], [-1], 1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean_dims(dim, keepdim: bool) -> None:
    check_export(Fn(lambda x: aten.sum.dim_IntList(x, dim, keepdim)), (X,))
    check_export(Fn(lambda x: aten.mean.dim(x, dim, keepdim)), (X,))


def test_sum_promotes_integers_and_dtype_argument() -> None:
    ints = torch.randint(-100, 100, (4, 6), dtype=torch.int32)
    check_export(Fn(lambda x: torch.sum(x, 1)), (ints,))
    check_export(Fn(lambda x: torch.prod(x, 0)), (torch.randint(-3, 4, (4, 6), dtype=torch.int8),))
    check_export(Fn(lambda x: torch.sum(x, 0, dtype=torch.float64)), (X,), atol=1e-6, rtol=1e-6)
    check_export(Fn(lambda x: torch.mean(x, dtype=torch.float64)), (X,), atol=1e-6, rtol=1e-6)
    check_export(Fn(lambda x: torch.sum(x > 0, [0, 1])), (X,))


def test_mean_of_empty_is_nan() -> None:
    check_export(Fn(lambda x: torch.mean(x, 0)), (torch.randn(0, 3),))


def test_zero_dim_inputs() -> None:
    s = torch.tensor(2.5)
    check_export(
        Fn(lambda x: (torch.sum(x, 0, keepdim=True), torch.amax(x, -1), torch.argmax(x, 0, True))), (s,)
    )
    check_export(Fn(lambda x: (torch.var(x, 0, correction=0), torch.cumsum(x, 0), torch.cumprod(x, 0))), (s,))
    check_export(Fn(lambda x: torch.max(x, 0, keepdim=True)), (s,))


@pytest.mark.parametrize("correction", [0, 1, 2, 0.5, 5])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_std_correction(correction: float, keepdim: bool) -> None:
    x = torch.randn(4, 5, 3) * 2 + 10
    check_export(Fn(lambda v: torch.var(v, [0, 2], correction=correction, keepdim=keepdim)), (x,))
    check_export(Fn(lambda v: torch.std_mean(v, 1, correction=correction, keepdim=keepdim)), (x,))
    check_export(Fn(lambda v: torch.var_mean(v, correction=correction)), (x,))


def test_var_dynamic_count() -> None:
    dyn = (({0: torch.export.Dim("a"), 1: torch.export.Dim("b")},),)  # forward(*xs)
    check_export(
        Fn(lambda v: torch.var_mean(v, [0, 1])),
        (torch.randn(3, 4, 2),),
        dynamic_shapes=dyn,
        run_args=[(torch.randn(6, 5, 2),)],
        opsets=(17, 26),
    )


@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, -1, float("inf"), float("-inf")])
def test_vector_norm_orders(ord: float) -> None:
    x = torch.randn(3, 4, 5)
    x[0, 0, 0] = 0.0
    check_export(
        Fn(lambda v: torch.linalg.vector_norm(v, ord, [1, 2], keepdim=True)), (x,), atol=1e-3, rtol=1e-3
    )
    check_export(Fn(lambda v: aten.norm.ScalarOpt_dim(v, ord, [0])), (x,), atol=1e-3, rtol=1e-3)


def test_norm_scalar_overloads() -> None:
    check_export(Fn(lambda v: aten.norm.Scalar(v, 3)), (X,), atol=1e-3, rtol=1e-3)
    check_export(
        Fn(lambda v: aten.norm.ScalarOpt_dtype(v, None, dtype=torch.float64)), (X,), atol=1e-6, rtol=1e-6
    )


@pytest.mark.parametrize("dim", [None, [], [1], [0, 1]])
def test_any_all_dims(dim) -> None:
    x = torch.tensor([[0.0, 1.0, float("nan")], [0.0, 0.0, 0.0]])
    check_export(Fn(lambda v: (aten.any.dims(v, dim), aten.all.dims(v, dim, True))), (x,))


def test_any_all_empty_and_uint8() -> None:
    check_export(Fn(lambda v: (torch.any(v, 0), torch.all(v, 0))), (torch.randn(0, 3),))
    check_export(
        Fn(lambda v: (torch.any(v), torch.all(v, 1))), (torch.tensor([[0, 3], [1, 2]], dtype=torch.uint8),)
    )


def test_argmax_first_occurrence_and_keepdim() -> None:
    x = torch.tensor([[1.0, 5.0, 5.0, 2.0], [7.0, 7.0, 0.0, 7.0]])
    check_export(
        Fn(lambda v: (torch.argmax(v, 1), torch.argmin(v, 0, True), torch.argmax(v, keepdim=True))), (x,)
    )
    check_export(Fn(lambda v: (torch.max(v, 1, keepdim=True), torch.min(v, 1))), (x,))
    big = torch.tensor([[3, 2**40, 2**40 - 1], [-(2**50), 5, -(2**50)]], dtype=torch.int64)
    check_export(Fn(lambda v: (torch.argmax(v, 1), torch.argmin(v, 1), torch.amax(v, 0))), (big,))


def test_aminmax_keepdim() -> None:
    check_export(Fn(lambda v: (torch.aminmax(v), torch.aminmax(v, dim=1, keepdim=True))), (X,))


def test_logsumexp_infinities() -> None:
    x = torch.tensor([[float("-inf"), float("-inf")], [1000.0, 0.0], [float("inf"), 1.0]])
    check_export(Fn(lambda v: torch.logsumexp(v, 1)), (x,))
    check_export(Fn(lambda v: torch.logsumexp(v, [0, 1], keepdim=True)), (X,))


def test_cumsum_dtype() -> None:
    check_export(Fn(lambda v: torch.cumsum(v, 1, dtype=torch.float64)), (X,), atol=1e-6, rtol=1e-6)
    check_export(Fn(lambda v: torch.cumsum(v, 0)), (torch.randint(-5, 5, (4, 3), dtype=torch.int8),))


def test_cumprod_zeros_and_signs() -> None:
    x = torch.tensor([[2.0, -1.5, 0.0, 3.0, -2.0], [-1.0, -1.0, -1.0, 4.0, 0.5]])
    check_export(Fn(lambda v: (torch.cumprod(v, 1), torch.cumprod(v, 0))), (x,))
    check_export(Fn(lambda v: torch.cumprod(v, 1)), (torch.tensor([[2, -3, 0, 5], [1, 2, 3, 4]]),))


def test_cumulative_dynamic_length() -> None:
    dyn = (({1: torch.export.Dim("n")},),)  # forward(*xs)
    check_export(
        Fn(lambda v: (torch.cumprod(v, 1), torch.logcumsumexp(v, 1))),
        (torch.randn(2, 5, 3),),
        dynamic_shapes=dyn,
        run_args=[(torch.randn(2, 9, 3),)],
        opsets=(17, 26),
    )


def test_logcumsumexp_wide_range() -> None:
    x = torch.tensor([[-1000.0, 0.0, -5.0, 800.0], [float("-inf"), float("-inf"), 2.0, float("inf")]])
    check_export(Fn(lambda v: torch.logcumsumexp(v, 1)), (x,))


def test_count_nonzero_dims() -> None:
    x = torch.tensor([[0.0, 1.0, float("nan")], [0.0, 0.0, 2.0]])
    check_export(
        Fn(lambda v: (torch.count_nonzero(v), torch.count_nonzero(v, [0]), torch.count_nonzero(v, 1))), (x,)
    )


def test_nansum_nanmean() -> None:
    x = torch.tensor([[float("nan"), 1.0, 2.0], [float("nan"), float("nan"), float("nan")]])
    check_export(Fn(lambda v: (torch.nansum(v, 1), torch.nanmean(v, 1), torch.nanmean(v))), (x,))


def test_nan_propagates_through_max_min_and_arg() -> None:
    nan = float("nan")
    x = torch.tensor([[1.0, nan, 2.0], [nan, 5.0, 1.0], [3.0, 4.0, nan], [1.0, 2.0, 3.0]])
    check_export(
        Fn(lambda v: (torch.amax(v, 1), torch.max(v, 1), torch.min(v), torch.aminmax(v), torch.argmin(v, 1))),
        (x,),
    )
    check_export(Fn(lambda v: (torch.argmax(v), torch.linalg.vector_norm(v, float("inf"), 1))), (x,))


def test_cummax_cummin_ties_nan_ints() -> None:
    nan = float("nan")
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, nan, 5.0, nan, 0.0], [4.0, 4.0, -1.0, -1.0, 4.0, 7.0, -2.0, -2.0]])
    check_export(Fn(lambda v: (torch.cummax(v, 1), torch.cummin(v, 1), torch.cummax(v, 0))), (x,))
    ints = torch.tensor([[3, 1, 3, 2**62, -(2**63), 2**62], [0, 0, 0, -5, -5, 9]])
    check_export(Fn(lambda v: (torch.cummax(v, 1), torch.cummin(v, 1))), (ints,))
    check_export(Fn(lambda v: torch.cummax(v, -1)), (torch.tensor([True, False, True, True]),))


@pytest.mark.parametrize("edge_order", [1, 2])
def test_gradient_spacings(edge_order: int) -> None:
    # uniform spacing (scalar, per-dim list) and coordinate tensors (non-uniform), both edge orders
    x = torch.randn(5, 6, 4)
    coords = (torch.tensor([0.0, 0.5, 1.5, 1.7, 3.0]), torch.tensor([0.0, 1.0, 1.1, 2.5, 4.0, 4.2]))

    def fn(t: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            *torch.gradient(t, spacing=0.7, edge_order=edge_order),
            *torch.gradient(t, spacing=[2.0, 0.5], dim=[0, 2], edge_order=edge_order),
            *torch.gradient(t, spacing=(c0, c1), dim=[0, 1], edge_order=edge_order),
            *torch.gradient(t, dim=-1, edge_order=edge_order),
        )

    check_export(Fn(fn), (x, *coords), opsets=ENDS, atol=1e-4, rtol=1e-4)


def test_diff_trapezoid_variants() -> None:
    y = torch.randn(3, 5)
    x2 = torch.cumsum(torch.rand(3, 5), dim=1)
    b = torch.tensor([True, False, False, True, True])

    def fn(t: torch.Tensor, xs: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.diff(t, n=2, dim=1, prepend=t[:, :1], append=t[:, -2:]),
            torch.diff(m, prepend=m[:1]),
            torch.trapezoid(t, xs, dim=1),
            torch.trapezoid(t, dx=0.3, dim=0),
            torch.cumulative_trapezoid(t, xs[0], dim=1),
            torch.cumulative_trapezoid(t, dx=2, dim=0),
            t.sum_to_size(1, 5),
            t.renorm(1, 0, 1.5),
        )

    check_export(Fn(fn), (y, x2, b), opsets=ENDS)


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.bool, torch.uint8, torch.float32, torch.float16]
)
def test_hash_tensor_bit_exact(dtype: torch.dtype) -> None:
    # XOR of 64-bit patterns. Run in onnxruntime directly: fastonnx's result object cannot hand back
    # onnxruntime's uint64 arrays (numpy "ulonglong", which torch.from_numpy rejects)
    import numpy as np
    import onnxruntime as ort

    import fastonnx

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 5, 3, generator=gen) * 1000).to(dtype)
    if dtype == torch.int64:
        x[0, 0, 0] = -(2**63)  # the sign bit
    fn = Fn(
        lambda t: (
            torch.hash_tensor(t),
            torch.hash_tensor(t, dim=[0, 2]),
            torch.hash_tensor(t, 1, keepdim=True),
        )
    )
    expected = fn(x)
    ep = torch.export.export(fn, (x,))
    for opset in (26,) if dtype.is_floating_point else ENDS:
        model = fastonnx.to_onnx(ep, (x,), opset=opset).model_proto
        sess = ort.InferenceSession(model.SerializeToString())
        outs = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
        for got, exp in zip(outs, expected, strict=True):
            arr = np.asarray(got).astype(np.uint64)
            assert arr.shape == tuple(exp.shape)
            assert torch.equal(torch.from_numpy(arr.view(np.int64)), exp.view(torch.int64))


def test_hash_tensor_of_floats_needs_opset_26() -> None:
    import fastonnx

    x = torch.randn(3)
    ep = torch.export.export(Fn(torch.hash_tensor), (x,))
    with pytest.raises(fastonnx.OpsetError, match="opset >= 26"):
        fastonnx.to_onnx(ep, (x,), opset=25)


def test_differences_with_dynamic_batch() -> None:
    # (torch.gradient and sum_to_size specialise the batch dim during export, so they are not here)
    batch = torch.export.Dim("batch")

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.diff(t, dim=1),
            torch.cumulative_trapezoid(t, dim=1),
            torch.trapezoid(t, dim=1),
        )

    check_export(
        Fn(fn),
        (torch.randn(3, 6),),
        opsets=ENDS,
        dynamic_shapes=(({0: batch},),),  # Fn takes *xs
        run_args=[(torch.randn(5, 6),)],
    )
