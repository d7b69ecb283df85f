"""Shape and layout converters against torch's OpInfo samples, plus the cases OpInfo does not sample."""

from __future__ import annotations

import sys

import pytest
import torch

from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, opinfo_cases

OPS = [
    "view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "transpose", "permute", "t",
    "movedim", "unsqueeze", "squeeze", "squeeze.multiple", "expand", "expand_as", "broadcast_to",
    "slice", "narrow", "select", "cat", "stack", "hstack", "vstack", "dstack", "column_stack",
    "atleast_1d", "atleast_2d", "atleast_3d", "split", "split.list_args", "split_with_sizes", "chunk",
    "unbind", "flip", "fliplr", "flipud", "roll", "repeat", "tile", "constant_pad_nd",
    "nn.functional.pad.constant", "nn.functional.pad.reflect", "nn.functional.pad.replicate",
    "nn.functional.pad.replicate_negative", "nn.functional.pad.circular", "tril", "triu", "diagonal",
    "diag_embed", "diag", "diagflat", "linalg.diagonal", "mT", "mH", "ravel", "rot90", "unfold",
    "repeat_interleave", "meshgrid.list_of_tensors", "meshgrid.variadic_tensors", "broadcast_tensors",
    "view_copy", "permute_copy", "transpose_copy", "t_copy", "squeeze_copy", "unsqueeze_copy",
    "expand_copy", "narrow_copy", "split_with_sizes_copy", "unbind_copy", "diagonal_copy", "unfold_copy",
    "unsafe_chunk", "unsafe_split", "block_diag", "cartesian_prod", "combinations", "kron",
    "as_strided", "as_strided_copy", "as_strided.partial_views", "H", "T", "hsplit", "vsplit", "dsplit",
    "_chunk_cat", "resize_", "resize_as_",
]  # fmt: skip
# Left out: tensor_split (OpInfo samples split by a 0-d tensor, whose sizes are data-dependent; the
# converter raises a ConversionError for those; int sections are checked below).
# reflect / replicate padding has no integer or bool kernel in eager torch
# the *_copy / unsafe_ variants share their converter with the view op: float32 checks them
COPIES = {op for op in OPS if op.endswith("_copy") or op.startswith("unsafe_")}
NO_INT = {"nn.functional.pad.reflect", "nn.functional.pad.replicate", "nn.functional.pad.replicate_negative"}


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


@pytest.mark.parametrize("op_name", [op for op in OPS if op not in COPIES])
def test_float16(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.float16, limit=2)


@pytest.mark.parametrize("op_name", [op for op in OPS if op not in NO_INT | COPIES])
def test_int64(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.int64, limit=2)


@pytest.mark.parametrize("op_name", [op for op in OPS if op not in NO_INT | COPIES])
def test_bool(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.bool, limit=2)


def test_cat_skips_empty_1d_and_promotes() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return torch.cat([a, e, b], dim=1)

    a = torch.randn(2, 3)
    b = torch.randint(0, 5, (2, 4))
    check_export(Fn(fn), (a, b, torch.zeros(0)))


def test_slice_to_maxsize_negative_and_step() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x[:, -3 : sys.maxsize : 2] + x[:, 1::2][:, :2] * 0 + x[:, -5:-1:2]

    check_export(Fn(fn), (torch.randn(3, 7),))


def test_expand_keeps_minus_one_and_new_dims() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.expand(2, -1, 4)

    check_export(Fn(fn), (torch.randn(3, 1),))


def test_view_with_minus_one_dynamic() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            y = x.view(b, s, -1, 4).transpose(1, 2)
            return y.reshape(b, -1).flatten(0).unsqueeze(0)

    batch = torch.export.Dim("batch", max=64)
    seq = torch.export.Dim("seq", max=64)
    check_export(
        M(),
        (torch.randn(2, 5, 8),),
        dynamic_shapes={"x": {0: batch, 1: seq}},
        run_args=[(torch.randn(3, 7, 8),)],
    )


def test_dynamic_split_slice_cat_pad() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = x.chunk(2, dim=-1)
            y = torch.cat([b, a], dim=-1)[:, 1:]
            y = torch.nn.functional.pad(y, (1, 2, 0, 1), value=3.0)
            return torch.roll(y, 2, 1) + y.expand_as(y).flip(0)

    seq = torch.export.Dim("seq", min=3, max=64)
    check_export(M(), (torch.randn(5, 8),), dynamic_shapes={"x": {0: seq}}, run_args=[(torch.randn(9, 8),)])


def test_unfold_along_a_dynamic_dim() -> None:
    """Sliding windows over a symbolic length (Inkling's short convolutions): the window count is
    computed in the graph, right at lengths that leave a remainder or none (from two windows: torch's
    own broadcasting guards one window)."""

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.unfold(1, 3, 2) * 2

    seq = torch.export.Dim("seq", min=5, max=64)
    run = [(torch.randn(2, n, 4),) for n in (5, 6, 10, 31)]
    check_export(M(), (torch.randn(2, 9, 4),), dynamic_shapes={"x": {1: seq}}, run_args=run)


def test_unbind_stack_and_squeeze() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        parts = x.unbind(1)
        return torch.stack(parts[::-1], dim=-1).squeeze(0).unsqueeze(-1).squeeze()

    check_export(Fn(fn), (torch.randn(1, 3, 4),))


def test_negative_constant_pad_crops() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (-1, 2, 1, -2), value=-1.0)

    check_export(Fn(fn), (torch.randn(2, 5, 6),))


def test_tensor_split_by_ints() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        a, b, c = torch.tensor_split(x, [1, 4], dim=1)
        d, e = torch.tensor_split(x, 2)
        return torch.cat([c, b, a], dim=1) + torch.cat([e, d]).sum()

    check_export(Fn(fn), (torch.randn(4, 6),))


def test_resize_shrinks_and_grows() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.clone().resize_(2, 3), x.clone().resize_as_(torch.empty(4))

    check_export(Fn(fn), (torch.randn(3, 4),), opsets=ENDS)
    # growing: the old elements come first; torch leaves the rest uninitialised, so only they compare
    x = torch.randn(2, 3)
    ep = torch.export.export(Fn(lambda t: t.clone().resize_(3, 4)), (x,))
    import fastonnx

    for opset in ENDS:
        got = fastonnx.to_onnx(ep, (x,), opset=opset)(x)
        assert got.shape == (3, 4)
        torch.testing.assert_close(got.reshape(-1)[:6], x.reshape(-1))


def test_chunk_cat_pads_each_tensor() -> None:
    a, b = torch.randn(2, 5, 3), torch.randn(2, 7)
    fn = Fn(lambda x, y: torch._chunk_cat([x, y], dim=1, num_chunks=3))
    check_export(fn, (a, b), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.bool])
def test_chunk_cat_small_types(dtype: torch.dtype) -> None:
    # Pad has no 16-bit integer kernels in onnxruntime: padded in int32
    a = torch.randint(0, 2, (3, 5)).to(dtype)
    check_export(Fn(lambda x: torch._chunk_cat([x, x[:, :2]], dim=1, num_chunks=4)), (a,), opsets=ENDS)
