"""quantized_decomposed's quantize / dequantize ops (PT2E, defined when torchao is imported) and QAT's
fake quantization, against eager torch in onnxruntime."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torchao  # noqa: F401  (registers torch.ops.quantized_decomposed)

import fastonnx
from fastonnx.errors import OpsetError
from fastonnx.opsets import MAX_OPSET
from support.export_check import ENDS, Fn, check_export

qd = torch.ops.quantized_decomposed

RANGES = {
    torch.int8: [(-128, 127), (-127, 127), (-8, 7)],
    torch.uint8: [(0, 255), (0, 127), (3, 200)],
}
CASES = [(dt, lo, hi) for dt, ranges in RANGES.items() for lo, hi in ranges]


def _x(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * 4
    # values on rounding boundaries (exact in binary at scale 0.5): half to even in both
    return torch.cat([x.flatten(), torch.arange(-40, 40) * 0.25])[: x.numel()].reshape(shape)


def _q(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    lo, hi = (-128, 127) if dtype == torch.int8 else (0, 255)
    g = torch.Generator().manual_seed(1)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32).to(dtype)


def _zp(dtype: torch.dtype, lo: int, hi: int) -> int:
    return 0 if dtype == torch.int8 else (lo + hi) // 2


@pytest.mark.parametrize(("dtype", "lo", "hi"), CASES)
@pytest.mark.parametrize("scale", [0.5, 0.037])
def test_quantize_per_tensor(dtype: torch.dtype, lo: int, hi: int, scale: float) -> None:
    zp = _zp(dtype, lo, hi)
    fn = functools.partial(
        qd.quantize_per_tensor, scale=scale, zero_point=zp, quant_min=lo, quant_max=hi, dtype=dtype
    )
    check_export(Fn(fn), (_x(3, 40),), opsets=ENDS)


@pytest.mark.parametrize(("dtype", "lo", "hi"), CASES)
@pytest.mark.parametrize("overload", ["tensor", "tensor2"])
def test_quantize_per_tensor_tensor_qparams(dtype: torch.dtype, lo: int, hi: int, overload: str) -> None:
    op = getattr(qd.quantize_per_tensor, overload)
    zp = _zp(dtype, lo, hi)
    scale, zero_point = torch.tensor(0.5, dtype=torch.float64), torch.tensor(zp)
    bounds = (torch.tensor(lo), torch.tensor(hi)) if overload == "tensor2" else (lo, hi)

    def fn(x: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return op(x, s, z, *bounds, dtype)

    check_export(Fn(fn), (_x(2, 40), scale, zero_point), opsets=ENDS)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("overload", ["default", "tensor", "tensor2"])
def test_dequantize_per_tensor(dtype: torch.dtype, out_dtype: torch.dtype | None, overload: str) -> None:
    op = getattr(qd.dequantize_per_tensor, overload)
    lo, hi = RANGES[dtype][0]
    zp = _zp(dtype, lo, hi)
    if overload == "default":
        qparams: tuple[Any, ...] = (0.037, zp, lo, hi)
    elif overload == "tensor":
        qparams = (torch.tensor([0.037]), torch.tensor([zp]), lo, hi)
    else:
        qparams = (torch.tensor(0.037), torch.tensor(zp), torch.tensor(lo), torch.tensor(hi))

    def fn(q: torch.Tensor) -> torch.Tensor:
        y = op(q, *qparams, dtype, out_dtype=out_dtype)
        return y.float() if out_dtype == torch.bfloat16 else y  # onnxruntime's numpy I/O has no bfloat16

    check_export(Fn(fn), (_q(dtype, 3, 7),), opsets=ENDS)


@pytest.mark.parametrize(("dtype", "lo", "hi"), CASES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_dequantize_per_channel(dtype: torch.dtype, lo: int, hi: int, axis: int) -> None:
    x = _x(4, 5, 6)
    channels = x.shape[axis]
    scales = torch.linspace(0.02, 0.5, channels, dtype=torch.float64)
    zps = torch.arange(channels) + (0 if dtype == torch.int8 else lo + 1)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = qd.quantize_per_channel(x, scales, zps, axis, lo, hi, dtype)
        return q, qd.dequantize_per_channel(q, scales, zps, axis, lo, hi, dtype)

    check_export(Fn(fn), (x,), opsets=ENDS)


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_dequantize_per_channel_without_zero_points(out_dtype: torch.dtype | None) -> None:
    scales = torch.tensor([0.1, 0.2, 0.3])
    fn = functools.partial(
        qd.dequantize_per_channel,
        scales=scales,
        zero_points=None,
        axis=1,
        quant_min=-128,
        quant_max=127,
        dtype=torch.int8,
        out_dtype=out_dtype,
    )
    check_export(Fn(lambda q: fn(q).float()), (_q(torch.int8, 2, 3, 4),), opsets=ENDS)


# per-channel uint16 is not among them: eager torch cannot subtract int64 zero points from uint16 (no
# uint16 promotion), so there is nothing to compare with
@pytest.mark.parametrize(
    ("dtype", "lo", "hi", "zp", "per_channel"),
    [
        (torch.int16, -1000, 1000, 7, False),
        (torch.int16, -1000, 1000, 7, True),
        (torch.uint16, 10, 60000, 300, False),
    ],
)
def test_16_bit_from_opset_21(dtype: torch.dtype, lo: int, hi: int, zp: int, per_channel: bool) -> None:
    scales, zps = torch.tensor([0.001, 0.002, 0.0005]), torch.tensor([zp, zp + 1, zp - 1])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if per_channel:
            q = qd.quantize_per_channel(x, scales, zps, 1, lo, hi, dtype)
            return q.int(), qd.dequantize_per_channel(q, scales, zps, 1, lo, hi, dtype)
        q = qd.quantize_per_tensor(x, 0.001, zp, lo, hi, dtype)
        return q.int(), qd.dequantize_per_tensor(q, 0.001, zp, lo, hi, dtype)

    check_export(Fn(fn), (_x(2, 3, 40),), opsets=[MAX_OPSET])
    with pytest.raises(OpsetError, match="opset >= 21"):
        fastonnx.to_onnx(Fn(fn), (_x(2, 3, 40),), opset=17)


# ---- fake quantization (QAT) -----------------------------------------------------------------------

FAKE_RANGES = [(-128, 127), (0, 255), (0, 15), (-8, 7), (0, 65535)]  # the last fits no type at opset 17


@pytest.mark.parametrize(("lo", "hi"), FAKE_RANGES)
@pytest.mark.parametrize("tensor_qparams", [False, True])
def test_fake_quantize_per_tensor(lo: int, hi: int, tensor_qparams: bool) -> None:
    zp = (lo + hi) // 3 if lo >= 0 else 0
    scale = 0.5 if hi < 1000 else 1e-4
    if tensor_qparams:
        args: tuple[Any, ...] = (torch.tensor([scale]), torch.tensor([zp], dtype=torch.int32))
    else:
        args = (scale, zp)
    check_export(
        Fn(lambda x: torch.fake_quantize_per_tensor_affine(x, *args, lo, hi)), (_x(3, 40),), opsets=ENDS
    )


@pytest.mark.parametrize(("lo", "hi"), FAKE_RANGES)
@pytest.mark.parametrize("zp_dtype", [torch.int32, torch.float32])
def test_fake_quantize_per_channel(lo: int, hi: int, zp_dtype: torch.dtype) -> None:
    x = _x(2, 4, 5)
    scales = torch.tensor([0.5, 0.1, 0.25, 0.05]) * (1 if hi < 1000 else 1e-3)
    zps = torch.tensor([0, 1, 2, 3], dtype=zp_dtype) + max(lo, 0)
    fn = functools.partial(
        torch.fake_quantize_per_channel_affine,
        scale=scales,
        zero_point=zps,
        axis=1,
        quant_min=lo,
        quant_max=hi,
    )
    check_export(Fn(fn), (x,), opsets=ENDS)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quantize_cachemask(per_channel: bool) -> None:
    scales, zps = torch.tensor([0.5, 0.1, 0.25, 0.05]), torch.tensor([0, 1, 2, 3], dtype=torch.int32)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if per_channel:
            out, mask = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(x, scales, zps, 1, 0, 15)
        else:
            out, mask = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, 0.25, 2, 0, 15)
        return out, mask

    check_export(Fn(fn), (_x(3, 4),), opsets=ENDS)


@pytest.mark.parametrize("enabled", [0, 1])
def test_fake_quantize_cachemask_tensor_qparams(enabled: int) -> None:
    scale, zp = torch.tensor([0.25]), torch.tensor([3], dtype=torch.int32)
    on = torch.tensor([enabled], dtype=torch.uint8)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, mask = torch.ops.aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
            x, scale, zp, on, 0, 15
        )
        return out, mask

    check_export(Fn(fn), (_x(3, 40),), opsets=ENDS)
