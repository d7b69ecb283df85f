"""float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) inputs, weights, constants and outputs from opset 19, fed to
and read back from onnxruntime as the right torch dtype; a clear OpsetError below opset 19."""

from __future__ import annotations

import pytest
import torch

import fastonnx
from fastonnx.errors import OpsetError
from fastonnx.opsets import MAX_OPSET

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz]


class Float8Model(torch.nn.Module):
    """A float8 input and buffer, dequantized, computed in float32, requantized; a float8 constant."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.register_buffer("scale", (torch.rand(4) + 0.5).to(dtype))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x.float() * self.scale.float() - 0.25
        const = torch.full((2, 4), 1.75, dtype=self.dtype)
        return y.to(self.dtype), y, const


class Float8Movement(torch.nn.Module):
    """Float8 values moved without arithmetic: onnxruntime 1.31 has float8 Reshape / Transpose kernels
    from opset 21 only (the opset-19 and -20 versions exist in ONNX but not in its CPU provider); ONNX
    Slice takes no float8 at any opset."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.reshape(4, 3), x.t()


def _float8_input(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 4, generator=g) * 4).to(dtype)


@pytest.mark.parametrize("opset", [19, 23, MAX_OPSET])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_io(dtype: torch.dtype, opset: int) -> None:
    model, x = Float8Model(dtype).eval(), _float8_input(dtype)
    result = fastonnx.to_onnx(model, (x,), opset=opset)
    for run in (x, (x.float() * -3).to(dtype)):  # a second input, in range for every format
        expected = model(run)
        got = result(run)
        assert [t.dtype for t in got] == [t.dtype for t in expected]
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            if g.dtype == torch.float32:
                torch.testing.assert_close(g, e, atol=0, rtol=0)
            else:  # bit-exact: the same rounding (round to nearest even, saturating where torch saturates)
                assert torch.equal(g.view(torch.uint8), e.view(torch.uint8)), (g, e)


@pytest.mark.parametrize("opset", [21, MAX_OPSET])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_movement(dtype: torch.dtype, opset: int) -> None:
    x = _float8_input(dtype)
    result = fastonnx.to_onnx(Float8Movement(), (x,), opset=opset)
    for g, e in zip(result(x), Float8Movement()(x)):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.equal(g.view(torch.uint8), e.view(torch.uint8))


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_below_opset_19(dtype: torch.dtype, opset: int) -> None:
    x = _float8_input(dtype)
    with pytest.raises(OpsetError, match=r"need opset >= 19.*targets opset " + str(opset)):
        fastonnx.to_onnx(Float8Model(dtype).eval(), (x,), opset=opset)

    class WeightOnly(torch.nn.Module):  # float32 in and out: only the weight is float8
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.ones(3).to(dtype))

        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return v * self.w.float()

    with pytest.raises(OpsetError, match="need opset >= 19"):
        fastonnx.to_onnx(WeightOnly(), (torch.randn(3),), opset=opset)
