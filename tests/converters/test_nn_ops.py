"""Convolution, pooling, embedding, resampling and rearrangement converters against OpInfo samples,
plus hand-written cases for arguments OpInfo does not sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastonnx
from fastonnx.opsets import MAX_OPSET
from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, ci_sample_limit, opinfo_cases

OPS = [
    "nn.functional.conv1d",
    "nn.functional.conv2d",
    "nn.functional.conv3d",
    "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d",
    "nn.functional.conv_transpose3d",
    "nn.functional.max_pool1d",
    "nn.functional.max_pool2d",
    "nn.functional.max_pool3d",
    "nn.functional.avg_pool1d",
    "nn.functional.avg_pool2d",
    "nn.functional.avg_pool3d",
    "nn.functional.adaptive_avg_pool1d",
    "nn.functional.adaptive_avg_pool2d",
    "nn.functional.adaptive_avg_pool3d",
    "nn.functional.adaptive_max_pool1d",
    "nn.functional.adaptive_max_pool2d",
    "nn.functional.adaptive_max_pool3d",
    "nn.functional.embedding",
    "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.nearest-exact",
    "nn.functional.interpolate.linear",
    "nn.functional.interpolate.bilinear",
    "nn.functional.interpolate.trilinear",
    "nn.functional.interpolate.bicubic",
    "nn.functional.interpolate.area",
    "nn.functional.upsample_bilinear",
    "nn.functional.upsample_nearest",
    "grid_sampler_2d",
    "nn.functional.pixel_shuffle",
    "nn.functional.pixel_unshuffle",
    "nn.functional.channel_shuffle",
    "nn.functional.unfold",
    "nn.functional.pairwise_distance",
    "cdist",
    "nn.functional.cosine_similarity",
    "nn.functional.max_unpool1d",
    "nn.functional.max_unpool2d",
    "nn.functional.max_unpool3d",
    "nn.functional.max_unpool1d.grad",
    "nn.functional.max_unpool2d.grad",
    "nn.functional.max_unpool3d.grad",
    "_upsample_bilinear2d_aa",
    "grid_sampler_3d",
    "nn.functional.grid_sample",
]


# float16 runs in onnxruntime for all of these. Left out: conv_transpose3d (the harness's 1e-3 override
# for it also applies to float16, tighter than torch's own float16 rounding), avg_pool3d (no float16
# kernel in eager), grid_sampler_2d (torch rounds the float16 grid coordinates differently), cdist
# (no float16 kernel in eager)
FLOAT16_OPS = [
    "nn.functional.conv1d",
    "nn.functional.conv2d",
    "nn.functional.conv3d",
    "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d",
    "nn.functional.max_pool1d",
    "nn.functional.max_pool2d",
    "nn.functional.max_pool3d",
    "nn.functional.avg_pool1d",
    "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool1d",
    "nn.functional.adaptive_avg_pool2d",
    "nn.functional.adaptive_avg_pool3d",
    "nn.functional.embedding",
    "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.nearest-exact",
    "nn.functional.interpolate.linear",
    "nn.functional.interpolate.bilinear",
    "nn.functional.interpolate.trilinear",
    "nn.functional.interpolate.bicubic",
    "nn.functional.interpolate.area",
    "nn.functional.pixel_shuffle",
    "nn.functional.pixel_unshuffle",
    "nn.functional.channel_shuffle",
    "nn.functional.unfold",
    "nn.functional.pairwise_distance",
    "nn.functional.cosine_similarity",
    "nn.functional.max_unpool1d",
    "nn.functional.max_unpool2d",
    "nn.functional.max_unpool3d",
]
# integer inputs where eager supports them: max pools (run in float64, exact below 2**53), gathers and
# data movement. Conv has no integer form in ONNX; integer avg_pool without divisor_override is refused
# (torch truncates integer sums, a float average can land one below).
INT64_OPS = [
    "nn.functional.max_pool1d",
    "nn.functional.max_pool2d",
    "nn.functional.max_pool3d",
    "nn.functional.embedding",
    "nn.functional.pixel_shuffle",
    "nn.functional.pixel_unshuffle",
    "nn.functional.channel_shuffle",
    "nn.functional.pairwise_distance",
]


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS, float16=FLOAT16_OPS, int64=INT64_OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


def test_embedding_bag_all_opsets() -> None:
    # mode="max" uses ScatterND reduction="max" from opset 18, a membership mask and ReduceMax below
    assert_op_converts("nn.functional.embedding_bag", (17, 18, MAX_OPSET), limit=ci_sample_limit())


def test_embedding_bag_float16() -> None:
    # ScatterND has no float16 reduction kernels in onnxruntime: the bags are reduced in float32
    assert_op_converts("nn.functional.embedding_bag", (17, 18, MAX_OPSET), dtype=torch.float16, limit=3)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_opset_17(mode: str) -> None:
    weight = torch.randn(6, 3)
    indices = torch.tensor([0, 5, 5, 1, 2, 3, 4])
    offsets = torch.tensor([0, 3, 3, 5])  # bag 1 is empty: zeros
    fn = Fn(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=-1))
    check_export(fn, (weight, indices, offsets), opsets=(17,))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_5d_every_mode(mode: str, padding_mode: str, align_corners: bool) -> None:
    # GridSample takes 3-D grids from opset 20; below, a gather-based trilinear / nearest form is used
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6, generator=gen)
    grid = torch.rand(2, 3, 4, 2, 3, generator=gen) * 3 - 1.5  # a third of the points fall outside
    fn = Fn(
        lambda a, b: F.grid_sample(a, b, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    )
    check_export(fn, (x, grid), opsets=(17, 20))


@pytest.mark.parametrize(
    "conv",
    [
        torch.nn.Conv2d(3, 4, 4, padding="same", dilation=2),
        torch.nn.Conv2d(3, 6, 3, padding="valid", groups=3, bias=False),
        torch.nn.Conv1d(3, 4, 2, padding="same"),
        torch.nn.ConvTranspose2d(3, 4, 3, stride=3, padding=1, output_padding=2),
        torch.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=2, output_padding=1, dilation=2),
        torch.nn.ConvTranspose1d(2, 4, 3, stride=1, padding=0, output_padding=1, dilation=2),
    ],
)
def test_conv_modules(conv: torch.nn.Module) -> None:
    torch.manual_seed(0)
    shape = (
        (2, 3, 9, 8)
        if isinstance(conv, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))
        else (2, conv.in_channels, 9)
    )
    check_export(conv, (torch.randn(shape),))


def test_conv_unbatched() -> None:
    check_export(torch.nn.Conv1d(3, 4, 3), (torch.randn(3, 10),))


def test_conv_dynamic_spatial() -> None:
    h = 2 * torch.export.Dim("h2", min=2, max=32)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding="same"), torch.nn.MaxPool2d(2))
    check_export(
        model,
        (torch.randn(1, 3, 10, 10),),
        dynamic_shapes=({2: h, 3: h},),
        run_args=[(torch.randn(1, 3, 14, 14),)],
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": 2, "stride": 2, "dilation": 2, "ceil_mode": True},
        {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0)},
    ],
)
def test_max_pool2d_with_indices(kwargs: dict) -> None:
    x = torch.randn(2, 3, 9, 8)
    check_export(Fn(lambda t: F.max_pool2d(t, return_indices=True, **kwargs)), (x,))


@pytest.mark.parametrize("padding", [0, 1])
def test_zero_pad_then_max_pool_keeps_the_zeros(padding: int) -> None:
    # onnxruntime's PadFusion would fold the zero Pad into MaxPool's -inf pads (opsets 11-21): the
    # inputs are all negative, so every window touching the border differs if it does
    x = -1.0 - torch.rand(2, 3, 9, 8, generator=torch.Generator().manual_seed(0))
    model = Fn(lambda t: F.max_pool2d(F.pad(t, (1, 1, 1, 1)), 3, 2, padding))
    check_export(model, (x,), opsets=(17, 20, 21, MAX_OPSET), optimize=(False, True))


def test_max_pool2d_indices_with_ties() -> None:
    x = torch.randint(0, 3, (2, 3, 9, 8)).float()
    check_export(Fn(lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True)), (x,))


def test_max_pool1d_3d_with_indices() -> None:
    check_export(Fn(lambda t: F.max_pool1d(t, 3, 2, 1, return_indices=True)), (torch.randn(2, 3, 11),))
    check_export(Fn(lambda t: F.max_pool3d(t, 2, return_indices=True)), (torch.randn(1, 2, 4, 5, 6),))


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [True, False])
def test_avg_pool2d_modes(ceil_mode: bool, count_include_pad: bool) -> None:
    x = torch.randn(2, 3, 10, 9)
    fn = Fn(lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=count_include_pad))
    check_export(fn, (x,))


@pytest.mark.parametrize("ceil_mode", [True, False])
def test_avg_pool_divisor_override(ceil_mode: bool) -> None:
    x = torch.randn(2, 3, 10, 9)
    check_export(Fn(lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=ceil_mode, divisor_override=5)), (x,))
    check_export(Fn(lambda t: F.avg_pool1d(t, 2, 3, ceil_mode=ceil_mode)), (torch.randn(2, 3, 10),))


@pytest.mark.parametrize("size", [(1, 1), (7, 7), (3, 5), (None, 2)])
def test_adaptive_avg_pool2d(size: tuple) -> None:
    check_export(torch.nn.AdaptiveAvgPool2d(size), (torch.randn(2, 3, 14, 7),))


def test_adaptive_avg_pool2d_global_dynamic() -> None:
    h = torch.export.Dim("h", min=2, max=64)
    check_export(
        torch.nn.AdaptiveAvgPool2d(1),
        (torch.randn(2, 3, 8, 8),),
        dynamic_shapes=({2: h, 3: h},),
        run_args=[(torch.randn(2, 3, 5, 5),)],
    )


@pytest.mark.parametrize("size", [(1, 1), (2, 3), (4, None)])
def test_adaptive_max_pool2d_even(size: tuple) -> None:
    check_export(torch.nn.AdaptiveMaxPool2d(size, return_indices=True), (torch.randn(2, 3, 8, 6),))


def test_adaptive_max_pool_1d_3d_even() -> None:
    check_export(torch.nn.AdaptiveMaxPool1d(3, return_indices=True), (torch.randn(2, 3, 9),))
    check_export(torch.nn.AdaptiveMaxPool3d((2, 1, 3), return_indices=True), (torch.randn(1, 2, 4, 5, 6),))


@pytest.mark.parametrize(
    ("shape", "size"),
    [((2, 3, 8, 7), (3, 5)), ((2, 3, 8, 6), (4, 3)), ((2, 9), (4,)), ((1, 2, 5, 4, 7), (2, 3, 3))],
)
def test_adaptive_max_pool_uneven_with_indices_and_ties(shape: tuple, size: tuple) -> None:
    # small integer values make ties: torch's index is the first maximum in row-major order
    x = torch.randint(0, 4, shape).float()
    pool = {1: torch.nn.AdaptiveMaxPool1d, 2: torch.nn.AdaptiveMaxPool2d, 3: torch.nn.AdaptiveMaxPool3d}[
        len(size)
    ]
    check_export(pool(size, return_indices=True), (x,))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale_factor": 2, "mode": "bilinear", "align_corners": False},
        {"scale_factor": 2, "mode": "bilinear", "align_corners": True},
        {"scale_factor": 0.6, "mode": "bilinear"},
        {"size": (1, 1), "mode": "bilinear"},
        {"size": (5, 3), "mode": "bilinear", "align_corners": True},
        {"size": (13, 11), "mode": "bicubic", "align_corners": False},
        {"scale_factor": 1.7, "mode": "bicubic", "align_corners": True},
        {"scale_factor": 1.5, "mode": "nearest"},
        {"size": (5, 4), "mode": "nearest"},
        {"scale_factor": 0.5, "mode": "nearest-exact"},
        {"size": (13, 3), "mode": "nearest-exact"},
    ],
)
def test_interpolate_2d(kwargs: dict) -> None:
    check_export(Fn(lambda t: F.interpolate(t, **kwargs)), (torch.randn(2, 3, 7, 6),))


@pytest.mark.parametrize(
    ("shape", "size", "mode"),
    [
        ((2, 3, 224, 224), (32, 32), "bilinear"),  # ViT-style resize to the tower's size: 7x
        ((1, 2, 189, 5), (27, 5), "bilinear"),  # one dim kept
        ((2, 3, 231), (33,), "linear"),
        ((1, 2, 99, 99, 3), (33, 11, 1), "trilinear"),
    ],
)
def test_interpolate_odd_downscale_is_exact(shape: tuple, size: tuple, mode: str) -> None:
    # torch reads one whole source pixel per output there; Resize's float scale blended a neighbour in
    # at ~1e-5 of the difference (9.8e-5 on 224 -> 32): compared without tolerance
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    fn = Fn(lambda t: F.interpolate(t, size=size, mode=mode, align_corners=False))
    check_export(fn, (x,), atol=0, rtol=0)


def test_interpolate_dynamic_scale() -> None:
    h = torch.export.Dim("h", min=2, max=64)
    fn = Fn(lambda t: F.interpolate(t, scale_factor=2.0, mode="bilinear"))
    check_export(
        fn,
        (torch.randn(1, 3, 6, 6),),
        dynamic_shapes=(({2: h, 3: h},),),
        run_args=[(torch.randn(1, 3, 9, 9),)],
    )


def test_interpolate_uint8_nearest() -> None:
    x = torch.randint(0, 255, (1, 3, 5, 4), dtype=torch.uint8)
    check_export(Fn(lambda t: F.interpolate(t, scale_factor=2, mode="nearest")), (x,))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [True, False])
def test_grid_sample_2d(mode: str, padding_mode: str, align_corners: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 5, generator=g)
    grid = torch.rand(2, 4, 7, 2, generator=g) * 2.4 - 1.2
    fn = Fn(
        lambda t, gr: F.grid_sample(t, gr, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    )
    check_export(fn, (x, grid), atol=1e-4 if mode != "bicubic" else 1e-3)


def test_pixel_shuffle_dynamic() -> None:
    h = 2 * torch.export.Dim("h2", min=1, max=32)
    shuffle = Fn(lambda t: F.pixel_unshuffle(F.pixel_shuffle(t, 2) * 2, 2))
    check_export(
        shuffle,
        (torch.randn(2, 8, 4, 4),),
        dynamic_shapes=(({2: h},),),
        run_args=[(torch.randn(2, 8, 6, 4),)],
    )


def test_embedding_module() -> None:
    emb = torch.nn.Embedding(10, 4, padding_idx=0)
    check_export(emb, (torch.tensor([[0, 3, 9], [1, 1, 2]]),))
    check_export(emb, (torch.tensor([[0, 3, 9], [1, 1, 2]], dtype=torch.int32),))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_weight_norm(dim: int) -> None:
    fn = Fn(lambda v, g: torch._weight_norm(v, g, dim))
    g_shape = {0: (4, 1, 1), 1: (1, 3, 1), -1: ()}[dim]
    check_export(fn, (torch.randn(4, 3, 5), torch.rand(g_shape) + 0.5))


def test_integer_avg_pool() -> None:
    x = torch.randint(-50, 50, (2, 3, 7, 6))
    check_export(Fn(lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, divisor_override=4)), (x,))
    ep = torch.export.export(Fn(lambda t: F.avg_pool2d(t, 2)), (x,), strict=False)
    with pytest.raises(fastonnx.ConversionError, match="divisor_override"):
        fastonnx.to_onnx(ep, (x,))


def test_integer_conv_is_refused() -> None:
    x, w = torch.randint(-5, 5, (1, 2, 5)), torch.randint(-5, 5, (3, 2, 2))
    ep = torch.export.export(Fn(torch.nn.functional.conv1d), (x, w), strict=False)
    with pytest.raises(fastonnx.ConversionError, match="Conv takes floating types"):
        fastonnx.to_onnx(ep, (x, w))


def test_max_unpool_unbatched_and_module() -> None:
    pool = torch.nn.MaxPool2d(2, stride=2, return_indices=True)
    unpool = torch.nn.MaxUnpool2d(2, stride=2)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, idx = pool(x)
        y3, idx3 = F.max_pool1d(x[0], 3, stride=2, return_indices=True)
        return unpool(y, idx), unpool(y[0], idx[0], output_size=(7, 6)), F.max_unpool1d(y3, idx3, 3, 2)

    check_export(Fn(fn), (torch.randn(2, 3, 6, 6),), opsets=ENDS)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_antialiased_resize(mode: str, align_corners: bool) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.interpolate(x, size=(4, 9), mode=mode, antialias=True, align_corners=align_corners),
            F.interpolate(x, scale_factor=0.4, mode=mode, antialias=True, align_corners=align_corners),
            F.interpolate(x, scale_factor=(1.5, 0.3), mode=mode, antialias=True),
        )

    check_export(Fn(fn), (torch.randn(2, 3, 11, 13),), opsets=ENDS)


def test_max_unpool_dynamic_batch() -> None:
    batch = torch.export.Dim("batch")

    def fn(x: torch.Tensor) -> torch.Tensor:
        y, idx = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(y, idx, 2)

    check_export(
        Fn(fn),
        (torch.randn(2, 3, 4, 6),),
        opsets=ENDS,
        dynamic_shapes=(({0: batch},),),  # Fn takes *xs
        run_args=[(torch.randn(4, 3, 4, 6),)],
    )
