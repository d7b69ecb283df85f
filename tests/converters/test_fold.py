"""aten.col2im (nn.Fold / F.fold): the patches summed into the image by one ScatterElements-add,
checked against eager nn.Fold for kernel / stride / padding / dilation settings, batched and unbatched."""

from __future__ import annotations

import pytest
import torch

from support.export_check import check_export

SETTINGS = [  # output_size, kernel_size, dilation, padding, stride
    ((4, 5), 2, 1, 0, 1),
    ((6, 6), 3, 1, 1, 1),
    ((7, 9), (2, 3), 1, 0, (2, 1)),  # non-square kernel, stride
    ((8, 7), 3, (2, 1), (1, 2), 2),  # dilation, padding and stride together
    ((5, 5), 2, 1, 0, 3),  # stride larger than the kernel: some pixels get no patch (zeros)
    ((3, 3), 3, 1, 0, 1),  # one patch
]


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize(("output_size", "kernel_size", "dilation", "padding", "stride"), SETTINGS)
def test_fold_matches_eager(output_size, kernel_size, dilation, padding, stride, batched: bool) -> None:
    fold = torch.nn.Fold(output_size, kernel_size, dilation=dilation, padding=padding, stride=stride)
    unfold = torch.nn.Unfold(kernel_size, dilation=dilation, padding=padding, stride=stride)
    channels = 3
    # the patch count nn.Unfold gives for that image: what Fold expects
    length = unfold(torch.zeros(1, channels, *output_size)).shape[-1]
    rows = (
        channels * unfold.kernel_size**2
        if isinstance(kernel_size, int)
        else channels * kernel_size[0] * kernel_size[1]
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, rows, length, generator=g) if batched else torch.randn(rows, length, generator=g)
    check_export(fold, (x,), optimize=(False, True), atol=1e-5, rtol=1e-5)


def test_fold_inverts_unfold_times_counts() -> None:
    """fold(unfold(x)) = x * how many patches cover each pixel (the classic identity), float64."""

    class RoundTrip(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            cols = torch.nn.functional.unfold(x, 3, padding=1, stride=2)
            return torch.nn.functional.fold(cols, x.shape[-2:], 3, padding=1, stride=2)

    x = torch.randn(2, 4, 7, 6, dtype=torch.float64)
    check_export(RoundTrip(), (x,), atol=1e-12, rtol=1e-12)


UNFOLD_DYNAMIC = [  # kernel_size, dilation, padding, stride, which spatial axes are dynamic
    ((3, 1), 1, (1, 0), 1, (2,)),  # ConvBERT: a k x 1 kernel over a dynamic sequence length
    ((4, 1), 1, (2, 0), 1, (2,)),  # even kernel: one more output than the input's length
    ((3, 2), (2, 1), (1, 1), (2, 1), (2, 3)),  # dilation and stride over two dynamic axes
    (2, 1, 0, 3, (3,)),  # stride larger than the kernel, only the width dynamic
]


@pytest.mark.parametrize(("kernel_size", "dilation", "padding", "stride", "axes"), UNFOLD_DYNAMIC)
def test_unfold_dynamic_spatial_matches_eager(kernel_size, dilation, padding, stride, axes) -> None:
    """aten.im2col with a dynamic height / width (static kernel, stride, dilation): the Slices end
    relative to the padded end, checked at other sizes than the traced one."""
    unfold = torch.nn.Unfold(kernel_size, dilation=dilation, padding=padding, stride=stride)
    g = torch.Generator().manual_seed(0)
    dims = {a: torch.export.Dim(f"d{a}", min=6, max=64) for a in axes}
    batch = torch.export.Dim("batch", min=1, max=8)

    def sized(n: int, h: int, w: int) -> torch.Tensor:
        return torch.randn(n, 3, h if 2 in axes else 9, w if 3 in axes else 7, generator=g)

    check_export(
        unfold,
        (sized(2, 9, 7),),
        dynamic_shapes=({0: batch, **dims},),
        run_args=[(sized(3, 13, 6),), (sized(1, 6, 11),)],
        atol=1e-6,
        rtol=1e-6,
    )
