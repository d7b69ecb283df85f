"""Indexing converters (gather/scatter, advanced indexing, sorting, nonzero) against OpInfo samples,
plus hand-written checks of the index patterns models use and of symbolic-size arithmetic."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import fastonnx
from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, ci_sample_limit, opinfo_cases

OPS = [
    "__getitem__", "index_put", "gather", "take_along_dim", "take", "index_select", "scatter",
    "scatter_add", "scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.mean", "index_add",
    "index_copy", "index_fill", "select_scatter", "slice_scatter", "diagonal_scatter", "nonzero",
    "argwhere", "masked_select", "topk", "sort", "argsort", "msort", "bucketize", "searchsorted",
    "masked_scatter", "index_reduce.mean", "index_reduce.prod", "put", "nonzero_static",
    "_unsafe_masked_index", "_unsafe_masked_index_put_accumulate", "scatter_reduce.amax",
    "scatter_reduce.amin", "index_reduce.amax", "index_reduce.amin", "as_strided_scatter",
]  # fmt: skip
# ScatterElements reduces with max/min from opset 18; below, a one-hot mask and ReduceMax/Min do it, so
# the amax/amin ops are checked at 17 and 18 both
FROM_18 = ["scatter_reduce.amax", "scatter_reduce.amin", "index_reduce.amax", "index_reduce.amin"]
# no eager kernel for index_reduce with bool inputs
NO_BOOL_INDEX_REDUCE = {"index_reduce.amax", "index_reduce.amin"}
# torch's default (unstable) sort orders ties as its implementation happens to; samples with many ties
# (float16, int64, bool) cannot match index for index. Stable sorts are matched exactly (float32).
TIES = {"sort", "argsort", "topk", "msort"}
# no eager kernel for these with bool inputs
NO_BOOL = {"scatter_reduce.mean", "index_reduce.mean", "bucketize", "topk"} | NO_BOOL_INDEX_REDUCE


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


@pytest.mark.parametrize("op_name", FROM_18)
def test_float32_from_opset_18(op_name: str) -> None:
    assert_op_converts(op_name, (18, fastonnx.MAX_OPSET), limit=ci_sample_limit())


@pytest.mark.parametrize("op_name", [op for op in OPS if op not in TIES])
def test_float16(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.float16, limit=2)


@pytest.mark.parametrize("op_name", [op for op in OPS if op not in TIES])
def test_int64(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.int64, limit=2)


@pytest.mark.parametrize("op_name", [op for op in OPS if op not in TIES | NO_BOOL])
def test_bool(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.bool, limit=2)


X = torch.randn(4, 5, 6, 7)
IDX = torch.tensor([[0, 2], [3, -1]])
J = torch.tensor([1, 4])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i, j: x[i],
        lambda x, i, j: x[:, None, j],
        lambda x, i, j: x[..., j],
        lambda x, i, j: x[:, i, j],  # adjacent: the broadcast dims stay in place
        lambda x, i, j: x[i, :, j],  # not adjacent: torch moves them to the front
        lambda x, i, j: x[:, j, :, i],
        lambda x, i, j: x[i, j, :, None],
        lambda x, i, j: x[None, :, j][..., 1:3],
    ],
)
def test_advanced_index(fn: Callable[..., torch.Tensor]) -> None:
    check_export(Fn(fn), (X, IDX, J))


def _put_first(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return x.index_put((i,), v)


def _put_adjacent(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, i, j] = v[0, 0, 0, 0]
    return y


def _put_apart(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[i, :, j] = v[0, :1, 0, :1, 0]
    return y


def _accumulate(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # duplicate indices: accumulate=True must add every one of them
    return x.index_put((i, j), v[0, 0, 0], accumulate=True) + x.index_put(
        (j,), v[0, :1, 0, 0], accumulate=True
    )


def _put_middle(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, j] += v[0, 0, :1, :1]
    return y


@pytest.mark.parametrize("fn", [_put_first, _put_adjacent, _put_apart, _accumulate, _put_middle])
def test_index_put(fn: Callable[..., torch.Tensor]) -> None:
    v = torch.randn(2, 2, 5, 6, 7)
    check_export(Fn(fn), (X, IDX.abs(), torch.tensor([1, 1]), v))


def test_mask_index_and_mask_put() -> None:
    def fn(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[m] = 0.5
        y[:, m[0]] += 2.0
        return y

    check_export(Fn(fn), (torch.randn(3, 4), torch.rand(3, 4) > 0.5))


def test_kv_cache_style_index_copy_and_slice_scatter() -> None:
    def fn(cache: torch.Tensor, new: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        c = cache.index_copy(2, pos, new)
        return torch.slice_scatter(c, new[:, :, :1] * 2, dim=2, start=-1)

    check_export(Fn(fn), (torch.zeros(1, 2, 8, 4), torch.randn(1, 2, 3, 4), torch.tensor([5, 1, 6])))


def test_one_hot_and_where_one_arg() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.nn.functional.one_hot(x, 5), *torch.where(x > 2)

    check_export(Fn(fn), (torch.tensor([[0, 3, 4], [2, 1, 4]]),))


def test_scatter_reduce_without_self() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        a = x.scatter_reduce(1, i, s, "sum", include_self=False)
        b = x.scatter_reduce(1, i, s, "prod", include_self=False)
        c = x.scatter_reduce(1, i, s, "mean", include_self=False)
        return a + b + c

    idx = torch.tensor([[0, 0, 2], [1, 3, 3]])
    check_export(Fn(fn), (torch.randn(2, 5), idx, torch.randn(2, 3)))


def test_topk_smallest_and_dynamic_sort() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            v, i = torch.topk(x, 2, dim=0, largest=False)
            s, j = torch.sort(x, dim=0, descending=True, stable=True)
            return v, i, s, j

    n = torch.export.Dim("n", min=2, max=32)
    check_export(M(), (torch.randn(6, 3),), dynamic_shapes={"x": {0: n}}, run_args=[(torch.randn(9, 3),)])


def test_symbolic_size_arithmetic() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            n = x.shape[0]
            half = (n + 1) // 2
            a = torch.arange(n - 1, -1, -1, dtype=torch.float32)
            b = x.new_zeros(torch.sym_max(half, 2), n * 2 - 1)
            # floor division and modulo of negative values floor like Python
            c = torch.full((2,), (n - 7) // 3) + torch.full((2,), (-n) % 4)
            d = torch.full((1,), n / 2) + torch.full((1,), torch.sym_float(n) * 0.5)
            return a, b, c, d

    n = torch.export.Dim("n", min=3, max=64)
    check_export(M(), (torch.randn(5, 3),), dynamic_shapes={"x": {0: n}}, run_args=[(torch.randn(8, 3),)])


def test_symbolic_floordiv_and_item() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            n = x.shape[0]
            steps = k.item()
            torch._check(steps >= 0)
            torch._check(steps <= 8)
            return torch.ones(n // 3 + 1, steps + 1) * (n // 2)

    n = torch.export.Dim("n", min=3, max=64)
    check_export(
        M(),
        (torch.randn(7, 2), torch.tensor(3)),
        dynamic_shapes={"x": {0: n}, "k": None},
        run_args=[(torch.randn(11, 2), torch.tensor(3))],
    )


def test_symbolic_min_max_rounding_and_comparisons() -> None:
    import math

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            n = x.shape[0]
            a = torch.full((1,), torch.sym_min(n, 6))
            b = torch.full((1,), math.ceil(n / 3)) + torch.full((1,), math.floor(n / 4))
            c = torch.full((1,), torch.sym_int(n * 0.75))
            d = torch.full((1,), torch.sym_ite(n > 6, n - 6, 6 - n))
            return a, b, c, d, x.new_zeros(n - 1, 2) + (n % 2)

    n = torch.export.Dim("n", min=3, max=64)
    check_export(
        M(),
        (torch.randn(5, 2),),
        dynamic_shapes={"x": {0: n}},
        run_args=[(torch.randn(8, 2),), (torch.randn(13, 2),)],
    )


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.float32])
def test_scatter_amax_amin_opset_17(dtype: torch.dtype) -> None:
    # opset 17 has no ScatterElements max/min: a one-hot mask and ReduceMax/Min, include_self both ways
    x = torch.randint(-50, 50, (4, 5)).to(dtype)
    idx = torch.tensor([[0, 0, 1, 3], [4, 4, 4, 0], [2, 1, 2, 1]])
    src = torch.randint(-50, 50, (3, 4)).to(dtype)

    def fn(t: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            t.scatter_reduce(1, i, s, "amax"),
            t.scatter_reduce(1, i, s, "amin", include_self=False),
            t.index_reduce(0, torch.tensor([3, 0, 3]), s.repeat(1, 2)[:, :5], "amax", include_self=False),
        )

    check_export(Fn(fn), (x, idx, src), opsets=(17, 18))
