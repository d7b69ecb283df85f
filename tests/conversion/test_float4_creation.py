"""float4 e2m1 (torch.float4_e2m1fn_x2) tensors made inside the model (torch.onnx's test_float4_support:
``torch.empty(..., dtype=torch.float4_e2m1fn_x2)``), beside float4 inputs and weights: ONNX FLOAT4E2M1
from opset 23, the last dim twice torch's (torch counts bytes, two values each; ONNX counts values),
filled by ConstantOfShape with a one-value float4 tensor. onnxruntime 1.31 has no float4 kernel: the
graphs are checked for structure, declared types, bytes and onnx.checker, and run in onnx's reference
evaluator. Ops whose converters compute in torch's dims are refused on float4 values by name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.numpy_helper import to_array
from onnx.reference import ReferenceEvaluator

import fastonnx
from fastonnx import dtypes
from fastonnx.errors import OpsetError, UnsupportedOpError
from fastonnx.opsets import MAX_OPSET

F4 = torch.float4_e2m1fn_x2
FLOAT4E2M1 = onnx.TensorProto.FLOAT4E2M1


def _packed(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(F4)


def _as_onnx(t: torch.Tensor) -> np.ndarray:
    """A float4 tensor as the reference evaluator takes it: its bytes read as ONNX FLOAT4E2M1 values."""
    dims = [*t.shape[:-1], 2 * t.shape[-1]]
    raw = t.view(torch.uint8).numpy().tobytes()
    return to_array(helper.make_tensor("t", FLOAT4E2M1, dims, raw, raw=True))


def _types(proto: onnx.ModelProto) -> list[tuple[int, list[int | str]]]:
    return [
        (o.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
        for o in proto.graph.output
    ]


class EmptyFloat4(torch.nn.Module):
    """torch.onnx's test_float4_support: no input, one float4 tensor made by torch.empty."""

    def forward(self) -> torch.Tensor:
        return torch.empty([1], dtype=F4)


@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("opset", [23, MAX_OPSET])
def test_float4_empty_without_inputs(opset: int, optimize: bool) -> None:
    proto = fastonnx.to_onnx(EmptyFloat4(), (), opset=opset, optimize=optimize).model_proto
    onnx.checker.check_model(proto, full_check=True)
    assert _types(proto) == [(FLOAT4E2M1, [2])]  # one torch element: two float4 values
    (node,) = proto.graph.node
    assert node.op_type == "ConstantOfShape"
    (shape,) = [i for i in proto.graph.initializer if i.name == node.input[0]]
    assert to_array(shape).tolist() == [2]
    (value,) = node.attribute
    assert (value.t.data_type, list(value.t.dims), value.t.raw_data) == (FLOAT4E2M1, [1], b"\x00")
    (got,) = ReferenceEvaluator(proto).run(None, {})
    assert got.shape == (2,) and got.astype(np.float32).tolist() == [0.0, 0.0]


class Float4Creation(torch.nn.Module):
    """float4 tensors made from sizes, from a float4 input and from nothing, beside a float4 input
    and weights returned as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", _packed((3, 4), 1))
        self.p = torch.nn.Parameter(_packed((2, 5), 2), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cleared = x.clone()
        cleared.zero_()
        return (
            torch.empty(4, 8, dtype=F4),
            torch.zeros(2, 3, dtype=F4),
            torch.empty_like(x),
            x.new_empty((5, 2)),
            x.new_zeros((1, 7)),
            cleared,
            x.clone(),
            self.w,
            self.p.detach(),
        )


@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("capture", ["export", "trace"])
def test_float4_creation_inputs_and_weights(capture: str, optimize: bool) -> None:
    model = Float4Creation().eval()
    x = _packed((2, 3), 3)
    proto = fastonnx.to_onnx(model, (x,), opset=23, optimize=optimize, capture=capture).model_proto
    onnx.checker.check_model(proto, full_check=True)
    # declared shapes: torch's with the last dim doubled
    assert _types(proto) == [
        (FLOAT4E2M1, dims)
        for dims in ([4, 16], [2, 6], [2, 6], [5, 4], [1, 14], [2, 6], [2, 6], [3, 8], [2, 10])
    ]
    (graph_input,) = proto.graph.input
    assert graph_input.type.tensor_type.elem_type == FLOAT4E2M1
    assert [d.dim_value for d in graph_input.type.tensor_type.shape.dim] == [2, 6]
    # the weights: torch's bytes as they are, under the doubled last dim
    inits = {i.name: i for i in proto.graph.initializer if i.data_type == FLOAT4E2M1}
    assert sorted(list(i.dims) for i in inits.values()) == [[2, 10], [3, 8]]
    for t in (model.w, model.p):
        (init,) = [i for i in inits.values() if list(i.dims) == [*t.shape[:-1], 2 * t.shape[-1]]]
        assert init.raw_data == t.view(torch.uint8).numpy().tobytes()
    # the fills: ConstantOfShape of a zero float4 value (those of one shape merged by the passes)
    fills = [n for n in proto.graph.node if n.op_type == "ConstantOfShape"]
    assert len(fills) >= (4 if optimize else 6)
    for n in fills:
        (value,) = n.attribute
        assert (value.t.data_type, value.t.raw_data) == (FLOAT4E2M1, b"\x00")
    got = ReferenceEvaluator(proto).run(None, {graph_input.name: _as_onnx(x)})
    for out in got[:6]:
        assert not out.astype(np.float32).any()  # empty is filled with zeros, zeros are zeros
    for out, t in zip(got[6:], (x, model.w, model.p), strict=True):
        np.testing.assert_array_equal(out.astype(np.float32), _as_onnx(t).astype(np.float32))


class Float4Like(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty_like(x), x.new_zeros((x.shape[0], 4))


def test_float4_creation_with_a_dynamic_batch() -> None:
    x = _packed((3, 5), 4)
    proto = fastonnx.to_onnx(
        Float4Like(), (x,), opset=23, dynamic_shapes=({0: torch.export.Dim("batch")},)
    ).model_proto
    onnx.checker.check_model(proto, full_check=True)
    assert _types(proto) == [(FLOAT4E2M1, ["batch", 10]), (FLOAT4E2M1, ["batch", 8])]
    other = _packed((7, 5), 5)
    got = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: _as_onnx(other)})
    assert [g.shape for g in got] == [(7, 10), (7, 8)]
    assert not any(g.astype(np.float32).any() for g in got)


@pytest.mark.parametrize("opset", [17, 21, 22])
def test_float4_creation_below_opset_23(opset: int) -> None:
    with pytest.raises(
        OpsetError, match=rf"float4_e2m1fn_x2 tensors need opset >= 23 .*float4.*targets opset {opset}"
    ):
        fastonnx.to_onnx(EmptyFloat4(), (), opset=opset)


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("aten.view.default", lambda x: x.view(3, 4)),
        ("aten.transpose.int", lambda x: x.transpose(0, 1).contiguous()),
        ("aten.slice.Tensor", lambda x: x[:, 1:]),
        ("aten.unsqueeze.default", lambda x: x.unsqueeze(-1)),
    ],
)
def test_float4_shape_ops_are_refused_by_name(op: str, fn) -> None:
    # their converters compute with torch's dims, which count pairs of ONNX values in the last axis
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return fn(x)

    with pytest.raises(UnsupportedOpError, match=rf"{op} is not converted for torch.float4_e2m1fn_x2"):
        fastonnx.to_onnx(Model(), (_packed((2, 6), 6),), opset=23)


def test_e2m1_codes() -> None:
    assert [dtypes.e2m1_code(v) for v in (0.0, 0.5, 1, 1.5, 2, 3, 4, 6)] == list(range(8))
    assert [dtypes.e2m1_code(v) for v in (-0.0, -0.5, -6.0)] == [8, 9, 15]
    with pytest.raises(ValueError, match="not a float4 e2m1 value"):
        dtypes.e2m1_code(0.25)
