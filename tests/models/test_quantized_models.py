"""Quantized models as QDQ: a PT2E model (torchao's X86InductorQuantizer, calibrated, convert_pt2e) and
a QAT model calling fake quantization, run in onnxruntime with its graph optimizations off (so that the
file's own QuantizeLinear / DequantizeLinear run, not fused kernels) against the converted torch model."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torchao.quantization.pt2e import move_exported_model_to_eval
from torchao.quantization.pt2e.fake_quantize import disable_fake_quant, disable_observer
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

import fastonnx
from fastonnx.errors import ConversionError
from support.matrix import sampled

qd = torch.ops.quantized_decomposed


class ConvReluLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _pt2e_model(fold_quantize: bool = True) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = ConvReluLinear().eval()
    x = torch.randn(2, 3, 8, 8)
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for _ in range(4):  # calibration
        prepared(torch.randn(2, 3, 8, 8))
    return convert_pt2e(prepared, fold_quantize=fold_quantize), torch.randn(2, 3, 8, 8)


def _run_unoptimized(proto: onnx.ModelProto, x: torch.Tensor) -> np.ndarray[Any, Any]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


def _last_step(model: torch.nn.Module) -> float:
    """How far the output moves when the last quantized activation (the Linear's input) moves by one
    step in one element: that activation's scale times the largest dequantized Linear weight."""
    nodes = [n for n in model.graph.nodes if n.target == qd.quantize_per_tensor.default]
    scale = float(nodes[-1].args[1])
    (dq_weight,) = [n for n in model.graph.nodes if n.target == qd.dequantize_per_channel.default][-1:]
    w = getattr(model, dq_weight.args[0].target).float()
    w_scale = getattr(model, dq_weight.args[1].target).float()
    return scale * float((w.abs().amax(dim=1) * w_scale).max())


@pytest.mark.parametrize("capture", ["auto", "export"])
@pytest.mark.parametrize("optimize", [False, True, "onnxruntime"])
def test_pt2e_x86_inductor_model(capture: str, optimize: bool | str) -> None:
    model, x = _pt2e_model()
    result = fastonnx.to_onnx(model, (x,), capture=capture, optimize=optimize)
    graph = result.model_proto.graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") == 2, ops  # the Conv's and the Linear's inputs
    assert ops.count("DequantizeLinear") == 4, ops  # those two and the two weights
    # the weights stay int8 in the file, read through DequantizeLinear (never folded to float)
    inits = {t.name: t for t in graph.initializer}
    weights = [n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert len(weights) == 2
    assert all(inits[w].data_type == onnx.TensorProto.INT8 for w in weights)
    read = {i for n in graph.node for i in n.input}
    float_weights = [t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.name in read]
    float_weights = [t for t in float_weights if len(t.dims) > 1]
    if optimize:  # convert_pt2e leaves the float parameters on the module, unread: the passes drop them
        assert not [t.name for t in graph.initializer if t.name not in read]
    assert not float_weights, [t.name for t in float_weights]

    with torch.no_grad():
        expected = model(x).numpy()
    got = _run_unoptimized(result.model_proto, x)
    # the QDQ values are torch's (both round half to even); a value exactly on a rounding boundary may
    # still land one step apart (torch multiplies by 1 / scale, ONNX divides): at most one step of the
    # last activation through the largest Linear weight, plus float32 accumulation order
    tolerance = _last_step(model) + 1e-5
    np.testing.assert_allclose(got, expected, atol=tolerance, rtol=0)
    # the scales and zero points are constants of their ONNX types, not Casts at every run
    assert "Cast" not in ops, ops


class QatModel(torch.nn.Module):
    """QAT as written by hand: fake-quantized activations (per tensor, uint8 and a 4-bit range) and
    weights (per channel, int8 narrowed to [-127, 127])."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)
        self.register_buffer("w_scale", self.conv.weight.detach().abs().amax(dim=(1, 2, 3)) / 127)
        self.register_buffer("w_zp", torch.zeros(4, dtype=torch.int32))
        self.register_buffer("fc_scale", self.fc.weight.detach().abs().amax(dim=1) / 127)
        self.register_buffer("fc_zp", torch.zeros(5, dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.fake_quantize_per_tensor_affine(x, 0.03, 128, 0, 255)
        w = torch.fake_quantize_per_channel_affine(self.conv.weight, self.w_scale, self.w_zp, 0, -127, 127)
        y = torch.relu(F.conv2d(x, w, self.conv.bias)).flatten(1)
        y = torch.fake_quantize_per_tensor_affine(y, 0.1, 0, 0, 15)
        fw = torch.fake_quantize_per_channel_affine(self.fc.weight, self.fc_scale, self.fc_zp, 0, -127, 127)
        return F.linear(y, fw, self.fc.bias)


@pytest.mark.parametrize("capture", ["auto", "export"])
def test_qat_fake_quantized_model(capture: str) -> None:
    torch.manual_seed(0)
    model, x = QatModel().eval(), torch.randn(2, 3, 8, 8)
    result = fastonnx.to_onnx(model, (x,), capture=capture)
    ops = [n.op_type for n in result.model_proto.graph.node]
    # the weights are quantized at export: int8 initializers read by DequantizeLinear
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 4, ops
    graph = result.model_proto.graph
    inits = {t.name: t for t in graph.initializer}
    weights = [n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert sorted(tuple(inits[w].dims) for w in weights) == [(4, 3, 3, 3), (5, 144)]
    assert all(inits[w].data_type == onnx.TensorProto.INT8 for w in weights)
    assert not [
        t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) > 1
    ]
    with torch.no_grad():
        expected = model(x).numpy()
    # one step of the 4-bit activation (0.1) through the largest Linear weight, as above
    tolerance = 0.1 * float(model.fc.weight.abs().max()) + 1e-5
    np.testing.assert_allclose(_run_unoptimized(result.model_proto, x), expected, atol=tolerance, rtol=0)


@pytest.mark.parametrize("capture", ["auto", "export"])
@pytest.mark.parametrize("fake_quant", [True, False])
def test_pt2e_qat_prepared_model(capture: str, fake_quant: bool) -> None:
    """torchao's QAT flow before convert_pt2e: FakeQuantize modules (fused_moving_avg_obs_fake_quant)
    export as QDQ with their observed qparams once the observers are off; on, they are refused."""
    torch.manual_seed(0)
    model, x = ConvReluLinear(), torch.randn(2, 3, 8, 8)
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = prepare_qat_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for _ in range(3):
        prepared(torch.randn(2, 3, 8, 8))
    prepared = move_exported_model_to_eval(prepared)
    with pytest.raises(ConversionError, match="observer on"):
        fastonnx.to_onnx(prepared, (x,), capture=capture)
    prepared.apply(disable_observer)
    if not fake_quant:  # fake quantization switched off: the float model
        prepared.apply(disable_fake_quant)
        result = fastonnx.to_onnx(prepared, (x,), capture=capture)
        assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in result.model_proto.graph.node}
        with torch.no_grad():
            expected = prepared(x).numpy()
        np.testing.assert_allclose(_run_unoptimized(result.model_proto, x), expected, atol=1e-5, rtol=1e-5)
        return
    result = fastonnx.to_onnx(prepared, (x,), capture=capture)
    graph = result.model_proto.graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 4, ops
    inits = {t.name: t for t in graph.initializer}
    weights = [n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert sorted(tuple(inits[w].dims) for w in weights) == [(8, 3, 3, 3), (10, 288)]
    assert all(inits[w].data_type == onnx.TensorProto.INT8 for w in weights)
    with torch.no_grad():
        expected = prepared(x).numpy()
    # one step of the coarsest activation (the per-tensor FakeQuantize modules) through the largest Linear weight
    scales = [float(m.scale) for m in prepared.modules() if hasattr(m, "scale") and m.scale.numel() == 1]
    tolerance = max(scales) * float(prepared.fc.weight.abs().max()) + 1e-5
    np.testing.assert_allclose(_run_unoptimized(result.model_proto, x), expected, atol=tolerance, rtol=0)


@pytest.mark.parametrize("optimize", [False, True, "onnxruntime"])
def test_pt2e_unfolded_weight_quantization(optimize: bool | str) -> None:
    """convert_pt2e(fold_quantize=False) leaves each weight as float → quantize → dequantize: the
    weight is quantized at export (torch's arithmetic), so the file stores int8 + scales, as
    onnxruntime's QDQ tools write it, and no pass folds the DequantizeLinear back into float."""
    converted, x = _pt2e_model(fold_quantize=False)
    weight_q = [n for n in converted.graph.nodes if n.target == qd.quantize_per_channel.default]
    assert len(weight_q) == 2  # the Conv's and the Linear's weights, quantized in the graph
    result = fastonnx.to_onnx(converted, (x,), optimize=optimize)
    graph = result.model_proto.graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") == 2, ops  # the activations only
    inits = {t.name: t for t in graph.initializer}
    weights = [n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert sorted(tuple(inits[w].dims) for w in weights) == [(8, 3, 3, 3), (10, 288)]
    assert all(inits[w].data_type == onnx.TensorProto.INT8 for w in weights)
    # the int8 values are torch's own quantization of the weights
    for node, w in zip(weight_q, sorted(weights, key=lambda w: len(inits[w].dims), reverse=True)):
        with torch.no_grad():
            expected = node.target(
                *[
                    operator.attrgetter(a.target)(converted) if isinstance(a, torch.fx.Node) else a
                    for a in node.args
                ]
            )
        assert np.array_equal(onnx.numpy_helper.to_array(inits[w]), expected.numpy())
    with torch.no_grad():
        out = converted(x).numpy()
    # one step of the Linear's input through its largest dequantized weight (see _last_step)
    act_scale = float(
        [n for n in converted.graph.nodes if n.target == qd.quantize_per_tensor.default][-1].args[1]
    )
    fc_scales = operator.attrgetter(weight_q[-1].args[1].target)(converted)
    tolerance = act_scale * float((expected.float().abs().amax(dim=1) * fc_scales).max()) + 1e-5
    np.testing.assert_allclose(_run_unoptimized(result.model_proto, x), out, atol=tolerance, rtol=0)


@pytest.mark.parametrize("optimize", [False, True, "onnxruntime"])
def test_grouped_weight_stays_int8(optimize: bool | str) -> None:
    """A float weight behind quantize_per_channel_group → dequantize_per_channel_group (8da4w's QAT
    form) is quantized at export into an int8 initializer read by a blocked DequantizeLinear."""

    class Grouped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 64, generator=torch.Generator().manual_seed(0)))
            self.register_buffer("s", self.w.detach().reshape(8, 4, 16).abs().amax(-1).flatten() / 7)
            self.register_buffer("z", torch.zeros(32, dtype=torch.int32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = qd.quantize_per_channel_group(self.w, self.s, self.z, -8, 7, torch.int8, 16)
            return (
                x @ qd.dequantize_per_channel_group(q, self.s, self.z, -8, 7, torch.int8, 16, torch.float32).T
            )

    model, x = Grouped(), torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    result = fastonnx.to_onnx(model, (x,), opset=21, optimize=optimize)
    graph = result.model_proto.graph
    ops = [n.op_type for n in graph.node]
    assert "QuantizeLinear" not in ops and ops.count("DequantizeLinear") == 1, ops
    (dq,) = [n for n in graph.node if n.op_type == "DequantizeLinear"]
    inits = {t.name: t for t in graph.initializer}
    assert inits[dq.input[0]].data_type == onnx.TensorProto.INT8 and list(inits[dq.input[0]].dims) == [8, 64]
    # the float parameter is read by no node (optimize=False writes it unread, as torch.export lifts
    # it; the passes drop it)
    read = {i for n in graph.node for i in n.input}
    assert not [
        t.name
        for t in graph.initializer
        if t.data_type == onnx.TensorProto.FLOAT
        and len(t.dims) == 2
        and t.dims[0] * t.dims[1] == 512
        and (optimize or t.name in read)
    ]
    with torch.no_grad():
        expected = model(x)
    # the dequantized weight is exact in both; only the 64-term sums' order differs
    torch.testing.assert_close(
        torch.from_numpy(_run_unoptimized(result.model_proto, x)), expected, rtol=1e-6, atol=2e-6
    )


@pytest.mark.parametrize(
    ("level", "conv_domain"),
    [("ORT_ENABLE_EXTENDED", ""), ("ORT_ENABLE_ALL", "com.microsoft")],
)
def test_pt2e_model_fuses_in_onnxruntime(tmp_path: Any, level: str, conv_domain: str) -> None:
    """onnxruntime's QDQ transformers fuse the file's Conv group into QLinearConv (the NHWC contrib op
    at ORT_ENABLE_ALL, between Transposes): no float Conv and no Q / DQ of the Conv's input, weight or
    output remain. The Linear stays a float Gemm on dequantized inputs: onnxruntime's QDQ Gemm fusion
    wants an int32 bias behind its own DequantizeLinear (PT2E leaves it float) — the official
    exporter's file of the same model optimizes to the same graph."""
    model, x = _pt2e_model()
    result = fastonnx.to_onnx(model, (x,))
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(result.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath).graph
    ops = [(n.op_type, n.domain) for n in optimized.node]
    assert ("QLinearConv", conv_domain) in ops, ops
    assert "Conv" not in [op for op, _ in ops], ops
    # one QuantizeLinear (the model's input into the QLinearConv; the one after the ReLU is fused into
    # it), the two DequantizeLinear of the Linear's input and weight
    assert [op for op, _ in ops].count("QuantizeLinear") == 1, ops
    assert [op for op, _ in ops].count("DequantizeLinear") == 2, ops
    assert ("Gemm", "") in ops, ops


def _output_step(model: torch.nn.Module) -> float:
    """One step of the activation quantized last, as the output sees it: through a final Linear (its
    largest dequantized weight times that step), or, with no product after it (SqueezeNet ends in conv,
    ReLU, average pool), the step itself."""
    nodes = list(model.graph.nodes)
    last_q = max(i for i, n in enumerate(nodes) if n.target == qd.quantize_per_tensor.default)
    if any(n.target == qd.dequantize_per_channel.default for n in nodes[last_q:]):
        return _last_step(model)
    return float(nodes[last_q].args[1])


@pytest.mark.parametrize(
    "name", sampled(["squeezenet1_0", "shufflenet_v2_x0_5"], lambda name: name == "squeezenet1_0")
)
def test_torchvision_models_the_x86_quantizer_annotates(name: str) -> None:
    """torchvision models through torchao's X86InductorQuantizer (it raises inside torchao on ResNets:
    docs/guides/quantization.md lists which it annotates), against the converted torch model within one
    quantization step of the output."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for _ in range(2):
        prepared(torch.randn(1, 3, 64, 64))
    converted = convert_pt2e(prepared)
    r = fastonnx.to_onnx(converted, (x,))
    ops = [n.op_type for n in r.model_proto.graph.node]
    assert ops.count("QuantizeLinear") > 10 and ops.count("DequantizeLinear") > 10
    got = torch.from_numpy(_run_unoptimized(r.model_proto, x))
    with torch.no_grad():
        want = converted(x)
    assert want.abs().max() > 10 * _output_step(converted)  # outputs of many steps: a real comparison
    torch.testing.assert_close(got, want, atol=_output_step(converted), rtol=1e-3)
