"""Models quantized with torchao's weight-only configs on the CPU (torchao 0.18): the quantized weights
(tensor subclasses whose inner tensors torch.export reads) go to the file as stored, int8, with the
model's own scales and zero points; onnxruntime against the quantized torch model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.quant_primitives import MappingType

import fastonnx
from fastonnx.errors import CaptureError, OpsetError
from fastonnx.opsets import MAX_OPSET
from support.model_zoo import Logits, _text_inputs, tiny_llama

CONFIGS: dict[str, Callable[[], Any]] = {
    "int8": Int8WeightOnlyConfig,
    "intx-int4-group32": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    "intx-int8-group32": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerGroup(32)),
    # zero points (INT4 too, in the file)
    "intx-int4-group32-asymmetric": lambda: IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(32), mapping_type=MappingType.ASYMMETRIC
    ),
    "intx-int4-axis0": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerAxis(0)),
    "intx-int8-axis0": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
}


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).eval()


def _run(proto: onnx.ModelProto, args: tuple[torch.Tensor, ...]) -> torch.Tensor:
    # optimizations off: the file's own arithmetic (onnxruntime may fuse DequantizeLinear → MatMul into
    # MatMulNBits, whose kernel rounds differently; benches/quantized_latency.py reports that error)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    return torch.from_numpy(np.asarray(session.run(None, feeds)[0]))


def _quantized_weights(model: torch.nn.Module) -> list[Any]:
    """Every quantized weight (torchao's tensor subclass, its int8 qdata inside)."""
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    if str(a.dtype) in ("int4", "uint4"):  # onnx's ml_dtypes arrays of INT4 / UINT4 initializers
        a = a.astype(np.int8)
    return a.size == b.size and any(x.shape == a.shape and np.array_equal(a, x) for x in (b, b.T))


def _check_file(proto: onnx.ModelProto, model: torch.nn.Module, int4: bool = False) -> None:
    """Each quantized weight is an initializer holding torchao's qdata (as stored or transposed), INT8,
    or INT4 for int4 weights (the same values, two a byte), and no float initializer holds it
    dequantized or cast (no float copy)."""
    kind = onnx.TensorProto.INT4 if int4 else onnx.TensorProto.INT8
    arrays = [(t.data_type, onnx.numpy_helper.to_array(t)) for t in proto.graph.initializer]
    for w in _quantized_weights(model):
        q = w.qdata.numpy()
        assert any(dt == kind and _same(a, q) for dt, a in arrays), (
            f"no {onnx.TensorProto.DataType.Name(kind)} initializer holds the {q.shape} weight"
        )
        copies = (w.dequantize().detach().numpy(), q.astype(np.float32))
        assert not any(dt == onnx.TensorProto.FLOAT and _same(a, c) for dt, a in arrays for c in copies), (
            f"a float copy of the {q.shape} weight"
        )


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("optimize", [True, False])
def test_weight_only_linear_model(config: str, optimize: bool) -> None:
    model = _mlp()
    quantize_(model, CONFIGS[config]())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    result = fastonnx.to_onnx(model, (x,), opset=MAX_OPSET, optimize=optimize)
    _check_file(result.model_proto, model, int4="int4" in config)
    ops = [n.op_type for n in result.model_proto.graph.node]
    if config == "int8":
        # torch's own order, to → mm → mul: the int8 weight Cast to float, MatMul, then the scale
        assert "DequantizeLinear" not in ops and ops.count("Cast") == 2, ops
    else:
        assert ops.count("DequantizeLinear") == 2, ops
        if "int4" in config:
            # INT4 zero points only where torchao's are not all zero (DequantizeLinear's default is 0)
            dq = [n for n in result.model_proto.graph.node if n.op_type == "DequantizeLinear"]
            assert all(len(n.input) == (3 if "asymmetric" in config else 2) for n in dq), dq
    with torch.no_grad():
        expected = model(x)
    # the same float32 operations as torch (DequantizeLinear's product of an int8 and a float32 scale is
    # exact in both); only the order of the 64- and 32-term sums of the products differs: a few ulps of
    # outputs below 2
    torch.testing.assert_close(_run(result.model_proto, (x,)), expected, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("config", ["int8", "intx-int4-group32", "intx-int8-axis0"])
def test_weight_only_llama(config: str, tmp_path: Any) -> None:
    model = Logits(tiny_llama())
    quantize_(model, CONFIGS[config]())
    args = _text_inputs()
    result = fastonnx.to_onnx(model, args, opset=MAX_OPSET)
    _check_file(result.model_proto, model, int4="int4" in config)
    assert len(_quantized_weights(model)) == 15  # 2 layers x 7 projections, and the LM head
    with torch.no_grad():
        expected = model(*args)
    # float32 throughout: the sums' order in MatMul, RMSNorm and attention differs from torch's by a
    # few ulps per op, compounding over 2 layers on logits below 1
    torch.testing.assert_close(_run(result.model_proto, args), expected, rtol=1e-5, atol=1e-5)
    ops = [n.op_type for n in result.model_proto.graph.node]
    if config == "int8":
        # torch's to → mm → mul: each weight Cast to float, MatMul, then the per-row scale
        assert ops.count("Cast") >= 15 and "DequantizeLinear" not in ops, ops
        return
    # DequantizeLinear of the transposed int8 weight straight into MatMul (no Transpose of the
    # dequantized weight at run time), which onnxruntime fuses into MatMulNBits
    readers = {i: n.op_type for n in result.model_proto.graph.node for i in n.input}
    dq = [n for n in result.model_proto.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dq) == 15 and all(readers[n.output[0]] == "MatMul" for n in dq), ops
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    fused = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    assert fused.count("MatMulNBits") == 15 and "DequantizeLinear" not in fused, fused


@pytest.mark.parametrize("config", ["int8-int8", "int8-intx"])
def test_dynamic_activation_linear_model(config: str) -> None:
    """torchao's dynamic int8 activation configs (not weight-only, same machinery): the activation's
    qparams chosen per token at run time (choose_qparams_affine), QuantizeLinear, then MatMulInteger
    of the int8 activation and the int8 weight (Int8DynamicActivationInt8WeightConfig's _int_mm) or
    DequantizeLinear of both (Int8DynamicActivationIntxWeightConfig)."""
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8DynamicActivationIntxWeightConfig,
    )

    model = _mlp()
    make = (
        Int8DynamicActivationInt8WeightConfig
        if config == "int8-int8"
        else Int8DynamicActivationIntxWeightConfig
    )
    quantize_(model, make())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    result = fastonnx.to_onnx(model, (x,), opset=MAX_OPSET)
    _check_file(result.model_proto, model)
    ops = [n.op_type for n in result.model_proto.graph.node]
    assert ops.count("QuantizeLinear") == 2, ops
    assert ops.count("MatMulInteger" if config == "int8-int8" else "DequantizeLinear") >= 2, ops
    with torch.no_grad():
        expected = model(x)
    # the integer products are exact; the rest is elementwise float32 arithmetic in torch's order (the
    # MLP's second input comes out of it, so its quantization sees torch's values), and the random
    # inputs put no value on a rounding tie: the same numbers up to the dequantized products' sums
    torch.testing.assert_close(_run(result.model_proto, (x,)), expected, rtol=1e-6, atol=2e-6)


def test_weight_only_group_needs_opset_21() -> None:
    model = _mlp()
    quantize_(model, CONFIGS["intx-int4-group32"]())
    with pytest.raises(OpsetError, match=r"dequantize_affine with block_size \[1, 32\].*opset >= 21"):
        fastonnx.to_onnx(model, (torch.randn(3, 64),), opset=20)


def test_int4_per_axis_below_opset_21_stays_int8() -> None:
    """ONNX has INT4 from opset 21: below it a per-axis int4 weight stays in torchao's int8 bytes."""
    model = _mlp()
    quantize_(model, CONFIGS["intx-int4-axis0"]())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    result = fastonnx.to_onnx(model, (x,), opset=20)
    _check_file(result.model_proto, model, int4=False)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(_run(result.model_proto, (x,)), expected, rtol=1e-6, atol=2e-6)


def test_int4_weight_only_config_error_is_torchaos() -> None:
    """Int4WeightOnlyConfig needs mslk or CUDA in torchao 0.18: quantize_ itself raises on the CPU. A
    model holding its Int4Tensor weights (quantized elsewhere) fails in torch.export inside torchao's
    kernel: fastonnx's CaptureError carries torchao's message and names the subclass weight."""
    from torchao.quantization import Int4Tensor, Int4WeightOnlyConfig

    model = torch.nn.Sequential(torch.nn.Linear(256, 32)).eval()
    with pytest.raises(ImportError, match="mslk"):
        quantize_(model, Int4WeightOnlyConfig())
    model = model.bfloat16()
    qdata = torch.randint(-128, 128, (32, 128), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    scale = torch.ones(2, 32, dtype=torch.bfloat16)
    weight = Int4Tensor(qdata, scale, torch.zeros_like(scale), [1, 128], torch.Size([32, 256]))
    model[0].weight = torch.nn.Parameter(weight, requires_grad=False)
    with pytest.raises(CaptureError, match=r"(?s)mslk.*0\.weight.*Int4Tensor"):
        fastonnx.to_onnx(model, (torch.randn(3, 256, dtype=torch.bfloat16),))
