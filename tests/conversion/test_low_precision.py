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


# ---- float4 e2m1 (torch.float4_e2m1fn_x2: two 4-bit values per byte, the first in the low nibble) ----
# ONNX FLOAT4E2M1 (opset 23+) packs the same way, with a last dim twice torch's. onnxruntime 1.31 has no
# float4 kernels and torch cannot cast float4: the graphs run in onnx's reference evaluator and are
# compared with the values decoded by hand from the packed bytes.

# e2m1 from the ONNX spec: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; no inf, no NaN
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1 = torch.cat([E2M1, -E2M1])


def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """float32 values of a float4_e2m1fn_x2 tensor: (..., n) packed -> (..., 2n) decoded."""
    b = packed.view(torch.uint8).long()
    pairs = torch.stack([E2M1[b & 0xF], E2M1[b >> 4]], dim=-1)
    return pairs.reshape(*b.shape[:-1], 2 * b.shape[-1])


@torch.library.custom_op("fastonnx_test::fp4_dequant", mutates_args=())
def fp4_dequant(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A float4 weight read by a custom kernel (what a quantized matmul does): decoded, scaled."""
    return decode_e2m1(w) * scale


@fp4_dequant.register_fake
def _(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return scale.new_empty((*w.shape[:-1], 2 * w.shape[-1]))


def fp4_dequant_as_cast(ctx, w, scale):  # the user's converter: ONNX Cast reads float4 from opset 23
    return ctx.op("Mul", ctx.op("Cast", w, to=1), scale)


def fp4_dequant_as_dequantize_linear(ctx, w, scale):  # DequantizeLinear reads float4 from opset 23
    ones = ctx.const(1.0, torch.float32)
    return ctx.op("Mul", ctx.op("DequantizeLinear", w, ones), scale)


def _packed(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2)


class Float4Weights(torch.nn.Module):
    """A float4 buffer (every byte value) and a float4 parameter, read by a custom op and returned."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer(
            "w", torch.arange(256, dtype=torch.uint8).reshape(16, 16).view(torch.float4_e2m1fn_x2)
        )
        self.p = torch.nn.Parameter(_packed((2, 3, 5), 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return fp4_dequant(self.w, x), fp4_dequant(self.p, x[:10]), self.w, self.p


def test_decode_e2m1_by_hand() -> None:  # the decoder the float4 tests trust: spot checks from the spec
    packed = torch.tensor([[0x21, 0xF8, 0x7E]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert decode_e2m1(packed).tolist() == [[0.5, 1.0, -0.0, -6.0, -4.0, 6.0]]


@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("opset", [23, MAX_OPSET])
@pytest.mark.parametrize("converter", [fp4_dequant_as_cast, fp4_dequant_as_dequantize_linear])
def test_float4_weights(opset: int, optimize: bool, converter) -> None:
    import numpy as np
    import onnx
    from onnx.numpy_helper import to_array
    from onnx.reference import ReferenceEvaluator

    model = Float4Weights().eval()
    x = torch.rand(32) + 0.5
    result = fastonnx.to_onnx(
        model,
        (x,),
        opset=opset,
        optimize=optimize,
        custom_converters={torch.ops.fastonnx_test.fp4_dequant.default: converter},
    )
    proto = result.model_proto
    onnx.checker.check_model(proto, full_check=True)
    inits = {i.name: i for i in proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT4E2M1}
    assert sorted(list(i.dims) for i in inits.values()) == [[2, 3, 10], [16, 32]]
    for t in (model.w, model.p):  # the same bytes, the last dim doubled
        (init,) = [i for i in inits.values() if list(i.dims) == [*t.shape[:-1], 2 * t.shape[-1]]]
        assert init.raw_data == t.view(torch.uint8).numpy().tobytes()
        torch.testing.assert_close(
            torch.from_numpy(to_array(init).astype(np.float32)), decode_e2m1(t), atol=0, rtol=0
        )
    outputs = {o.name: o.type.tensor_type for o in proto.graph.output}
    assert [(t.elem_type, [d.dim_value for d in t.shape.dim]) for t in outputs.values()][2:] == [
        (onnx.TensorProto.FLOAT4E2M1, [16, 32]),
        (onnx.TensorProto.FLOAT4E2M1, [2, 3, 10]),
    ]
    got = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: x.numpy()})
    expected = model(x)
    for g, e in zip(got[:2], expected[:2]):
        torch.testing.assert_close(torch.from_numpy(g), e, atol=0, rtol=0)
    for g, t in zip(got[2:], (model.w, model.p)):
        torch.testing.assert_close(torch.from_numpy(g.astype(np.float32)), decode_e2m1(t), atol=0, rtol=0)


@pytest.mark.parametrize("opset", [17, 21, 22])
def test_float4_below_opset_23(opset: int) -> None:
    with pytest.raises(
        OpsetError, match=r"float4_e2m1fn_x2 tensors need opset >= 23.*targets opset " + str(opset)
    ):
        fastonnx.to_onnx(
            Float4Weights(),
            (torch.rand(32),),
            opset=opset,
            custom_converters={torch.ops.fastonnx_test.fp4_dequant.default: fp4_dequant_as_cast},
        )


def test_float4_weights_from_the_meta_device_then_attach_weights(tmp_path) -> None:
    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    real = Float4Weights().eval()
    meta = Float4Weights().to("meta").eval()
    x = torch.rand(32) + 0.5
    path = tmp_path / "fp4.onnx"
    result = fastonnx.to_onnx(
        meta,
        (x.to("meta"),),
        opset=23,
        filename=path,
        custom_converters={torch.ops.fastonnx_test.fp4_dequant.default: fp4_dequant_as_cast},
    )
    assert result.stats["deferred_weights"] == 2
    assert fastonnx.attach_weights(path, real) == 2
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    got = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: x.numpy()})
    expected = real(x)
    for g, e in zip(got[:2], expected[:2]):
        torch.testing.assert_close(torch.from_numpy(g), e, atol=0, rtol=0)
    for g, t in zip(got[2:], (real.w, real.p)):
        torch.testing.assert_close(torch.from_numpy(g.astype(np.float32)), decode_e2m1(t), atol=0, rtol=0)
