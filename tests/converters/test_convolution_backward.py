"""The backward of convolution (what torch.compile training graphs hold) against torch's kernel:
1-d / 2-d / 3-d, stride, padding, dilation, groups, rows the forward never read, masks of outputs."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fastonnx

conv_backward = torch.ops.aten.convolution_backward.default

# (input shape, weight shape, stride, padding, dilation, groups)
CASES = {
    "2d": ((2, 3, 8, 8), (4, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    "2d_stride_unread_rows": ((2, 3, 10, 12), (4, 3, 3, 3), [2, 3], [0, 1], [1, 1], 1),
    "2d_dilation": ((1, 2, 9, 9), (3, 2, 3, 2), [1, 2], [2, 0], [2, 3], 1),
    "2d_groups": ((2, 6, 7, 7), (4, 3, 3, 3), [2, 2], [1, 1], [1, 1], 2),
    "2d_depthwise": ((2, 4, 6, 6), (8, 1, 3, 3), [1, 1], [1, 1], [1, 1], 4),
    "1d": ((3, 2, 11), (5, 2, 4), [3], [1], [1], 1),
    "3d": ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), [1, 2, 1], [1, 0, 1], [1, 1, 2], 1),
}


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch(case: str, mask: tuple[bool, bool, bool]) -> None:
    in_shape, w_shape, stride, padding, dilation, groups = CASES[case]
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(in_shape, generator=g), torch.randn(w_shape, generator=g)
    out = torch.ops.aten.convolution.default(x, w, None, stride, padding, dilation, False, [0], groups)
    dout = torch.randn(out.shape, generator=g)

    def f(dout: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
        grads = conv_backward(
            dout, x, w, [w.shape[0]], stride, padding, dilation, False, [0], groups, list(mask)
        )
        return [t for t, m in zip(grads, mask) if m]

    gm = make_fx(f)(dout, x, w)
    result = fastonnx.graph_module_to_onnx(gm)
    got = result(dout, x, w)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    expected = f(dout, x, w)
    assert len(got) == len(expected) == sum(mask)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        assert float(b.abs().max()) > 1e-2
        # float32 sums of up to a few hundred products in another order
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_transposed_is_refused() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 2, 5, 5, generator=g), torch.randn(2, 3, 3, 3, generator=g)
    dout = torch.randn(1, 3, 7, 7, generator=g)

    def f(dout: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(
            conv_backward(dout, x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1, [True, True, False])
        )[:2]

    with pytest.raises(fastonnx.ConversionError, match="transposed convolution"):
        fastonnx.graph_module_to_onnx(make_fx(f)(dout, x, w))
