"""quantized_decomposed's quantize / dequantize ops (PT2E, defined when torchao is imported) and QAT's
fake quantization, against eager torch in onnxruntime."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torchao  # noqa: F401  (registers torch.ops.quantized_decomposed)

import fastonnx
from fastonnx.errors import ConversionError, OpsetError
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


# ---- per token, per channel group, choose_qparams ------------------------------------------------


def _rand(*shape: int, seed: int = 2) -> torch.Tensor:
    # random values at scales that are not powers of two: no value lies on a rounding tie (torch adds
    # the zero point before rounding per token / per group, ONNX after: only a tie tells them apart)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(
    ("dtype", "lo", "hi"), [(torch.int8, -128, 127), (torch.uint8, 0, 255), (torch.int8, -8, 7)]
)
def test_quantize_dequantize_per_token(dtype: torch.dtype, lo: int, hi: int) -> None:
    scales = torch.linspace(0.021, 0.33, 6).reshape(2, 3, 1)
    zps = (torch.arange(6).reshape(2, 3, 1) % 3) + (0 if dtype == torch.int8 else 100)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = qd.quantize_per_token(x, scales, zps, lo, hi, dtype)
        return q, qd.dequantize_per_token(q, scales, zps, lo, hi, dtype, torch.float32)

    check_export(Fn(fn), (_rand(2, 3, 40),), opsets=ENDS)


@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_dynamic_per_token_asymmetric(input_dtype: torch.dtype) -> None:
    """8da4w's activation path: qparams chosen per token at run time, then quantize / dequantize."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = x.to(input_dtype)
        s, zp = qd.choose_qparams_per_token_asymmetric(x, torch.int8)
        q = qd.quantize_per_token(x, s, zp, -128, 127, torch.int8)
        return s, zp, q, qd.dequantize_per_token(q, s, zp, -128, 127, torch.int8, torch.float32)

    x = _rand(2, 5, 24)
    x[0, 1] = x[0, 1].abs() + 0.5  # a row without negatives: its range still includes zero
    x[1, 2] = 0.0  # a constant row: the scale is float32's eps
    check_export(Fn(fn), (x,), opsets=ENDS)


def test_choose_qparams_per_token() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, zp = qd.choose_qparams_per_token(x, torch.int8)
        # eager gives float32 scales and zero points, the op's declared types are float64 / int64
        return s.float(), zp.float(), qd.quantize_per_token(x, s, zp, -128, 127, torch.int8)

    x = _rand(3, 4, 16)
    x[2, 3] = 0.0  # clamped to 1e-5 before the division
    check_export(Fn(fn), (x,), opsets=ENDS)


@pytest.mark.parametrize(
    ("dtype", "lo", "hi", "symmetric"),
    [
        (torch.uint8, 0, 255, False),
        (torch.int8, -128, 127, False),
        (torch.uint8, 0, 127, False),
        (torch.int8, -128, 127, True),
        (torch.uint8, 0, 255, True),
    ],
)
@pytest.mark.parametrize("shift", [0.0, 5.0, None])
def test_choose_qparams_per_tensor(
    dtype: torch.dtype, lo: int, hi: int, symmetric: bool, shift: float | None
) -> None:
    """choose_qparams.tensor / choose_qparams_symmetric.tensor then quantize with them; ``shift`` moves
    the input away from zero (the range still includes it); None: an all-zero input (scale = eps)."""
    eps = float(torch.finfo(torch.float32).eps)
    choose = qd.choose_qparams_symmetric.tensor if symmetric else qd.choose_qparams.tensor

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, zp = choose(x, lo, hi, eps, dtype)
        return s.float(), zp, qd.quantize_per_tensor.tensor(x, s, zp, lo, hi, dtype)

    x = torch.zeros(4, 30) if shift is None else _rand(4, 30) + shift
    check_export(Fn(fn), (x,), opsets=ENDS)


def test_choose_qparams_bfloat16_input() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, zp = qd.choose_qparams.tensor(x.bfloat16(), 0, 255, 1e-7, torch.uint8)
        return s.float(), zp

    check_export(Fn(fn), (_rand(4, 30) - 1.3,), opsets=ENDS)


def _groups() -> tuple[torch.Tensor, torch.Tensor]:
    scales = torch.linspace(0.013, 0.41, 8 * 4)  # 8 rows of 4 groups, flat as torch's op takes them
    zps = torch.arange(32) % 5 - 2
    return scales, zps


@pytest.mark.parametrize(("lo", "hi"), [(-8, 7), (-128, 127)])
def test_quantize_dequantize_per_channel_group(lo: int, hi: int) -> None:
    scales, zps = _groups()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = qd.quantize_per_channel_group(x, scales, zps, lo, hi, torch.int8, 16)
        return q, qd.dequantize_per_channel_group(q, scales, zps, lo, hi, torch.int8, 16, torch.float32)

    results = check_export(Fn(fn), (_rand(8, 64),), opsets=[MAX_OPSET])
    ops = [n.op_type for n in results[0].model_proto.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops, ops
    with pytest.raises(OpsetError, match="quantize_per_channel_group.*opset >= 21"):
        fastonnx.to_onnx(Fn(fn), (_rand(8, 64),), opset=20)


def test_dequantize_per_channel_group_without_zero_points() -> None:
    scales, _ = _groups()

    def fn(q: torch.Tensor) -> torch.Tensor:
        return qd.dequantize_per_channel_group(q, scales, None, -8, 7, torch.int8, 16, torch.float32)

    q = torch.randint(-8, 8, (8, 64), generator=torch.Generator().manual_seed(3), dtype=torch.int8)
    check_export(Fn(fn), (q,), opsets=[MAX_OPSET])


# ---- torchao's affine ops ------------------------------------------------------------------------

ta = torch.ops.torchao


@pytest.mark.parametrize(
    ("block", "opsets"),
    [
        ([4, 64], ENDS),  # per tensor
        ([1, 64], ENDS),  # per axis 0
        ([4, 1], ENDS),  # per axis 1
        ([1, 16], [MAX_OPSET]),  # per group of 16 along axis 1 (blocked)
    ],
)
@pytest.mark.parametrize(
    ("dtype", "lo", "hi"),
    [(torch.int8, None, None), (torch.int8, -8, 7), (torch.uint8, 0, 200), (torch.uint4, None, None)],
)
def test_quantize_dequantize_affine(
    block: list[int], opsets: list[int], dtype: torch.dtype, lo: int | None, hi: int | None
) -> None:
    x = _rand(4, 64)
    mapping = "SYMMETRIC" if dtype == torch.int8 else "ASYMMETRIC"
    # the model's qparams, chosen by torchao in eager (constants of the graph)
    scale, zp = ta.choose_qparams_affine(x, mapping, block, dtype, lo, hi, None, torch.float32, torch.int32)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = ta.quantize_affine(x, block, scale, zp, dtype, lo, hi)
        return q, ta.dequantize_affine(q, block, scale, zp, dtype, lo, hi, torch.float32)

    check_export(Fn(fn), (x * 0.93,), opsets=opsets)


@pytest.mark.parametrize("mapping", ["SYMMETRIC", "ASYMMETRIC", "SYMMETRIC_NO_CLIPPING_ERR"])
@pytest.mark.parametrize("block", [[1, 1, 16], [1, 3, 64], [2, 3, 64]])
@pytest.mark.parametrize("keepdim", [False, True])
def test_choose_qparams_affine(mapping: str, block: list[int], keepdim: bool) -> None:
    """qparams chosen at run time (dynamic activation quantization), then used."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, zp = ta.choose_qparams_affine(x, mapping, block, torch.int8, -8, 7, None, None, None, keepdim)
        return s, zp.float()

    x = _rand(2, 3, 64)
    x[1, 2, :16] = 0.0  # a constant block: the scale is clamped to eps
    check_export(Fn(fn), (x,), opsets=ENDS)


def test_choose_qparams_affine_bfloat16() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, zp = ta.choose_qparams_affine(
            x.bfloat16(), "ASYMMETRIC", [1, 16], torch.uint8, None, None, None, torch.float32
        )
        return s, zp.float()

    # torch.export keeps the op whole; the real-tensor trace records torchao's own aten ops, whose
    # bfloat16 min / max onnxruntime has no kernel for (not this converter's concern)
    x = _rand(4, 64) + 0.7
    result = fastonnx.to_onnx(Fn(fn), (x,), capture="export")
    for got, expected in zip(result(x), fn(x)):
        torch.testing.assert_close(torch.as_tensor(got), expected, rtol=0, atol=0)


def test_dynamic_quantize_affine_per_token() -> None:
    """choose_qparams_affine → quantize_affine → dequantize_affine per token (blocked along the last
    axis at opset 21)."""
    block = [1, 1, 64]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, zp = ta.choose_qparams_affine(
            x, "ASYMMETRIC", block, torch.int8, None, None, None, torch.float32, torch.int32
        )
        q = ta.quantize_affine(x, block, s, zp, torch.int8)
        return q, ta.dequantize_affine(q, block, s, zp, torch.int8)

    check_export(Fn(fn), (_rand(2, 3, 64),), opsets=[MAX_OPSET])


def test_affine_refusals() -> None:
    x, q = (
        _rand(4, 64),
        torch.randint(-8, 8, (4, 64), generator=torch.Generator().manual_seed(4), dtype=torch.int8),
    )
    scale, zp = torch.full((4, 4), 0.05), torch.zeros(4, 4, dtype=torch.int32)

    def float_zero_point(x: torch.Tensor) -> torch.Tensor:
        return ta.quantize_affine(x, [1, 16], scale, torch.zeros(4, 4), torch.uint8)

    def two_blocked_axes(q: torch.Tensor) -> torch.Tensor:
        return ta.dequantize_affine(q, [2, 16], scale[:2], None, torch.int8)

    def bfloat16_input(x: torch.Tensor) -> torch.Tensor:
        return ta.quantize_affine(x.bfloat16(), [1, 16], scale.bfloat16(), zp, torch.int8)

    # torch.export keeps the ops whole (the real-tensor trace would record torchao's aten ops)
    for fn, arg, match in [
        (float_zero_point, x, "quantize_affine with a torch.float32 zero_point"),
        (two_blocked_axes, q, r"dequantize_affine: block_size \[2, 16\] .* has no QuantizeLinear"),
        (bfloat16_input, x, "quantize_affine of a torch.bfloat16 input"),
    ]:
        with pytest.raises(ConversionError, match=match):
            fastonnx.to_onnx(Fn(fn), (arg,), opset=MAX_OPSET, capture="export")
    blocked = Fn(lambda q: ta.dequantize_affine(q, [1, 16], scale, zp, torch.int8))
    with pytest.raises(OpsetError, match=r"torchao.dequantize_affine with block_size \[1, 16\].*opset >= 21"):
        fastonnx.to_onnx(blocked, (q,), opset=20, capture="export")


def test_dynamic_per_token_with_dynamic_shapes() -> None:
    """Per-token qparams over a dynamic batch and sequence: the rows are counted at run time."""
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=64)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, zp = qd.choose_qparams_per_token_asymmetric(x, torch.int8)
        q = qd.quantize_per_token(x, s, zp, -128, 127, torch.int8)
        return q, qd.dequantize_per_token(q, s, zp, -128, 127, torch.int8, torch.float32)

    check_export(
        Fn(fn),
        (_rand(2, 5, 24),),
        dynamic_shapes=(({0: batch, 1: seq},),),
        run_args=[(_rand(3, 9, 24, seed=5),), (_rand(1, 2, 24, seed=6),)],
        opsets=ENDS,
    )


def test_int_mm() -> None:
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-128, 128, (17, 64), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 24), generator=g, dtype=torch.int8)
    check_export(Fn(torch._int_mm), (a, b), opsets=ENDS)
    # torch's CPU kernel takes a uint8 activation too (torchao quantizes to it on CPUs with VNNI)
    u = torch.randint(0, 256, (17, 64), generator=g, dtype=torch.uint8)
    check_export(Fn(torch._int_mm), (u, b), opsets=ENDS)
    # the extremes: pairs of products past int16, which a saturating uint8 x int8 kernel clips
    hi = torch.full((17, 64), 255, dtype=torch.uint8)
    check_export(Fn(torch._int_mm), (hi, torch.full((64, 24), 127, dtype=torch.int8)), opsets=ENDS)
    check_export(Fn(torch._int_mm), (hi, torch.full((64, 24), -128, dtype=torch.int8)), opsets=ENDS)
