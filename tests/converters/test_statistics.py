"""Order statistics and counting converters against torch's OpInfo samples, at both ends of the opset range."""

from __future__ import annotations

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
    "kthvalue",
    "median",
    "nanmedian",
    "masked.median",
    "mode",
    "quantile",
    "nanquantile",
    "isin",
    "unique",
    "unique_consecutive",
    "histc",
    "histogram",
    "histogramdd",
    "_segment_reduce.lengths",
    "_segment_reduce.offsets",
]
# Integer samples repeat values: kthvalue / median / mode then return the index torch's quickselect or
# std::sort happens to leave (implementation-defined), so index-returning ops are checked on integers
# with distinct values by hand below.
INT_OPS = ["isin", "unique", "unique_consecutive"]


# torch sums float16 segments in float16, one element at a time (a rounding per step); our float32 sum
# differs past the float16 tolerance where terms cancel
HALF_OPS = [op for op in ops_supporting(OPS, torch.float16) if not op.startswith("_segment_reduce")]


@pytest.mark.parametrize(
    ("op_name", "dtype"),
    opinfo_cases(OPS, float16=HALF_OPS, int64=INT_OPS, bool=["unique", "unique_consecutive", "mode"]),
)
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


# ---- hand-written cases ------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


def test_nan_handling() -> None:
    x = torch.tensor(
        [
            [1.0, NAN, 2.0, NAN, 0.0, 5.0],
            [NAN, 4.0, NAN, NAN, 3.0, NAN],
            [INF, NAN, INF, 1.0, -INF, 2.0],
            [3.0, 1.0, 2.0, 6.0, 5.0, 4.0],
        ]
    )

    def fn(t: torch.Tensor) -> tuple:
        return (
            torch.median(t, 1),
            torch.nanmedian(t, 1),
            torch.median(t[3]),
            torch.nanmedian(t[0]),
            torch.median(t),
            torch.kthvalue(t, 2, 1),
            # the k-th is NaN or a tied inf in some rows: torch's quickselect index there is arbitrary
            torch.kthvalue(t, 6, 1, keepdim=True).values,
            torch.kthvalue(t, 4, 1).values,
            torch.quantile(t, 0.4, dim=1),
            torch.nanquantile(t, torch.tensor([0.0, 0.25, 1.0]), dim=1, keepdim=True),
            # all NaN: NaN; torch's index there is whatever its quickselect leaves, not compared
            torch.nanmedian(t * NAN, 1).values,
            torch.nanquantile(t * NAN, 0.5, dim=1),
        )

    check_export(Fn(fn), (x,), opsets=ENDS)


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile_interpolation(interpolation: str) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 4, generator=gen)
    q = torch.tensor([0.0, 0.1, 0.5, 0.75, 1.0])

    def fn(t: torch.Tensor, qq: torch.Tensor) -> tuple:
        return (
            torch.quantile(t, qq, dim=1, interpolation=interpolation),
            torch.quantile(t, 0.3, dim=-1, keepdim=True, interpolation=interpolation),
            torch.quantile(t, qq, interpolation=interpolation),
            torch.nanquantile(t, qq, dim=0, keepdim=True, interpolation=interpolation),
            torch.quantile(t[0, 0, 0], 0.5, interpolation=interpolation),
        )

    check_export(Fn(fn), (x, q), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float16])
def test_order_statistics_distinct_values(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randperm(60, generator=gen).reshape(3, 4, 5).to(dtype)

    def fn(t: torch.Tensor) -> tuple:
        return (
            torch.kthvalue(t, 2, 1),
            torch.median(t, -1, keepdim=True),
            torch.nanmedian(t, 0),
            torch.median(t),
            torch.mode(t, 2),
        )

    check_export(Fn(fn), (x,), opsets=ENDS)


def test_mode_ties() -> None:
    # most frequent value, the smallest among equally frequent ones; torch's index is the last
    # occurrence for slices of up to 16 elements (insertion sort keeps the order)
    x = torch.tensor(
        [
            [3, 1, 3, 1, 3, 1, 2, 2, 2, 2],
            [5, 5, 5, 5, 1, 1, 1, 1, 7, 7],
            [9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
        ]
    )
    check_export(Fn(lambda t: (torch.mode(t, 1), torch.mode(t.float(), 1, keepdim=True))), (x,), opsets=ENDS)


def test_values_with_ties() -> None:
    # torch's tie indices are implementation-defined: compare values only
    x = torch.randint(0, 4, (6, 50), generator=torch.Generator().manual_seed(0))

    def fn(t: torch.Tensor) -> tuple:
        return (
            torch.kthvalue(t, 7, 1).values,
            torch.median(t, 1).values,
            torch.mode(t, 1).values,
            torch.nanmedian(t.float(), 0).values,
        )

    check_export(Fn(fn), (x,), opsets=ENDS)


def test_isin_arguments() -> None:
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, 2.0, -0.0]])
    y = torch.tensor([2.0, 0.0, NAN, 7.0])

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple:
        return (
            torch.isin(a, b),
            torch.isin(a, b, invert=True),
            torch.isin(a, 2.0),
            torch.isin(a.long(), b.nan_to_num().long(), assume_unique=True),
            torch.isin(4, a[1].long()),
            torch.isin(a, b.half()),
        )

    check_export(Fn(fn), (x, y), opsets=ENDS)


def test_unique_arguments() -> None:
    x = torch.tensor([[3.0, 1.0, NAN], [1.0, 3.0, NAN], [3.0, 1.0, NAN], [-0.0, 0.0, 2.0]])
    rows = torch.tensor([[3, 1, 2], [1, 3, 0], [3, 1, 2], [0, 0, 2], [1, 3, 0]])

    def fn(a: torch.Tensor, r: torch.Tensor) -> tuple:
        return (
            torch.unique(a, return_inverse=True, return_counts=True),
            torch.unique(r, dim=0, return_inverse=True, return_counts=True),
            torch.unique(r, dim=1),
            torch.unique_consecutive(r, return_inverse=True, return_counts=True, dim=0),
            torch.unique_consecutive(a, return_inverse=True, return_counts=True),
        )

    check_export(Fn(fn), (x, rows), opsets=ENDS)


def test_histogram_arguments() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, generator=gen) * 3
    x[:5] = torch.tensor([-2.0, 2.0, 0.0, 2.0000001, -1.9999999])  # on and near the edges
    w = torch.rand(200, generator=gen)
    pts = torch.randn(50, 3, generator=gen)

    def fn(t: torch.Tensor, wt: torch.Tensor, p: torch.Tensor) -> tuple:
        return (
            torch.histc(t, bins=7, min=-2, max=2),
            torch.histc(t, bins=10),
            torch.histc(t * 0 + 1, bins=4),  # min == max: widened by 1
            torch.histogram(t, bins=9, range=(-2.0, 2.0), weight=wt, density=True),
            torch.histogram(t, bins=torch.tensor([-3.0, -1.0, 0.0, 0.5, 4.0]), weight=wt),
            torch.histogram(t * 0 + 1, bins=3),  # one value: widened by 0.5
            torch.histogramdd(p, bins=[3, 4, 2], range=[-1.0, 1.0, -2.0, 2.0, 0.0, 3.0], density=True),
            torch.histogramdd(
                p, bins=[torch.tensor([-1.0, 0.0, 1.0]), torch.tensor([-2.0, 2.0]), p[:4, 2].sort()[0]]
            ),
        )

    check_export(Fn(fn), (x, w, pts), opsets=ENDS)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce_trailing_axis(reduce: str) -> None:
    data = torch.randn(3, 6, 2, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([[2, 0, 4], [1, 5, 0], [0, 0, 6]])

    def fn(d: torch.Tensor, n: torch.Tensor) -> tuple:
        return (
            torch.ops.aten.segment_reduce(d, reduce, lengths=n, axis=1),
            torch.ops.aten.segment_reduce(d, reduce, lengths=n, axis=1, initial=0.5),
        )

    check_export(Fn(fn), (data, lengths), opsets=ENDS)


def test_dynamic_shapes() -> None:
    batch = torch.export.Dim("batch", min=2, max=1024)

    def fn(t: torch.Tensor) -> tuple:
        return (
            torch.median(t, 0),
            torch.nanmedian(t, 1),
            torch.kthvalue(t, 2, 0),
            torch.mode(t, 0).values,
            torch.quantile(t, 0.25, dim=0),
            torch.histc(t, bins=5),
        )

    gen = torch.Generator().manual_seed(0)
    check_export(
        Fn(fn),
        (torch.randn(5, 4, generator=gen),),
        opsets=ENDS,
        dynamic_shapes=(({0: batch},),),  # Fn's forward takes *xs
        run_args=[(torch.randn(8, 4, generator=gen),)],
    )


def _integer_histc(x: torch.Tensor, bins: int, lo: int, hi: int) -> torch.Tensor:
    """torch's integer histc (its CUDA kernel; the CPU has none) from its definition: integer bins
    (x - lo) * bins // (hi - lo), the last one holding hi, elements outside [lo, hi] skipped."""
    if lo == hi:  # the data's range, widened by one each way when it is one value
        lo, hi = int(x.min()), int(x.max())
        if lo == hi:
            lo, hi = lo - 1, hi + 1
    v = x.reshape(-1).to(torch.int64)
    v = v[(v >= lo) & (v <= hi)]
    b = ((v - lo) * bins // (hi - lo)).clamp(max=bins - 1)
    return torch.bincount(b, minlength=bins).to(x.dtype)


@pytest.mark.parametrize("capture", ["auto", "export"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers(dtype: torch.dtype, capture: str, tmp_path: Any) -> None:
    # torch's CPU kernels take no integers; on the meta device they are taken (transformers' MoE routing
    # loss counts int32 expert ids there): the model is exported from meta inputs, run on real ones
    import onnxruntime

    import fastonnx

    class Counts(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (
                torch.histc(x, bins=8, min=0, max=8),
                torch.histc(x, bins=5, min=2, max=9),
                torch.histc(x, bins=3),
            )

    x = torch.randint(0, 12, (40,), generator=torch.Generator().manual_seed(0)).to(dtype)
    x[:3] = torch.tensor([0, 8, 9])  # both edges, one beyond
    path = str(tmp_path / "histc.onnx")
    fastonnx.to_onnx(Counts(), (x.to("meta"),), filename=path, capture=capture)
    got = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    expected = (_integer_histc(x, 8, 0, 8), _integer_histc(x, 5, 2, 9), _integer_histc(x, 3, 0, 0))
    for g, e in zip(got, expected):
        torch.testing.assert_close(torch.from_numpy(g), e, rtol=0, atol=0)
