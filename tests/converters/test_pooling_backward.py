"""The backward of max_pool2d and avg_pool2d (what torch.compile training graphs hold) against torch's
kernels: strides, overlapping windows, padding, dilation, ceil_mode, unbatched inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fastonnx

aten = torch.ops.aten

# (input shape, kernel, stride, padding, dilation, ceil_mode)
MAX_CASES: dict[str, tuple[Any, ...]] = {
    "2x2": ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
    "overlapping": ((2, 3, 9, 7), [3, 3], [1, 2], [1, 1], [1, 1], False),
    "dilation_ceil": ((1, 2, 10, 11), [3, 2], [2, 2], [1, 0], [2, 1], True),
    "unbatched": ((3, 6, 6), [2, 2], [2, 2], [0, 0], [1, 1], False),
}


@pytest.mark.parametrize("case", sorted(MAX_CASES))
def test_max_pool2d_backward(case: str) -> None:
    shape, kernel, stride, padding, dilation, ceil = MAX_CASES[case]
    g = torch.Generator().manual_seed(0)
    # integers: ties inside a window would make the argmax depend on the scan order
    x = torch.randperm(torch.Size(shape).numel(), generator=g).reshape(shape).float()
    out, idx = aten.max_pool2d_with_indices.default(x, kernel, stride, padding, dilation, ceil)
    dout = torch.randn(out.shape, generator=g)

    def f(dout: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward.default(
            dout, x, kernel, stride, padding, dilation, ceil, idx
        )

    result = fastonnx.graph_module_to_onnx(make_fx(f)(dout, x, idx))
    expected = f(dout, x, idx)
    assert float(expected.abs().max()) > 1e-2
    torch.testing.assert_close(result(dout, x, idx), expected, atol=1e-6, rtol=1e-5)


# (input shape, kernel, stride, padding, ceil_mode, divisor_override)
AVG_CASES: dict[str, tuple[Any, ...]] = {
    "2x2": ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, None),
    "overlapping_unread_rows": ((2, 3, 9, 8), [3, 2], [2, 1], [0, 0], False, None),
    "divisor_override_padding": ((1, 2, 7, 7), [3, 3], [2, 2], [1, 1], False, 5),
    "unbatched": ((3, 6, 6), [2, 3], [2, 3], [0, 0], False, None),
}


@pytest.mark.parametrize("case", sorted(AVG_CASES))
def test_avg_pool2d_backward(case: str) -> None:
    shape, kernel, stride, padding, ceil, divisor = AVG_CASES[case]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    out = aten.avg_pool2d.default(x, kernel, stride, padding, ceil, True, divisor)
    dout = torch.randn(out.shape, generator=g)

    def f(dout: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return aten.avg_pool2d_backward.default(dout, x, kernel, stride, padding, ceil, True, divisor)

    result = fastonnx.graph_module_to_onnx(make_fx(f)(dout, x))
    expected = f(dout, x)
    assert float(expected.abs().max()) > 1e-2
    torch.testing.assert_close(result(dout, x), expected, atol=1e-6, rtol=1e-5)


def test_avg_pool2d_backward_with_border_divisors_is_refused() -> None:
    x = torch.randn(1, 2, 7, 7)
    out = aten.avg_pool2d.default(x, [3, 3], [2, 2], [1, 1], False, False, None)

    def f(dout: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return aten.avg_pool2d_backward.default(dout, x, [3, 3], [2, 2], [1, 1], False, False, None)

    with pytest.raises(fastonnx.ConversionError, match="border windows"):
        fastonnx.graph_module_to_onnx(make_fx(f)(torch.randn(out.shape), x))
