"""The opset range and the IR versions fastonnx writes."""

from __future__ import annotations

import onnx
import onnx.helper
import onnxruntime
import pytest
import torch

import fastonnx
from fastonnx.opsets import ir_version_for


@pytest.mark.parametrize("opset", range(fastonnx.MIN_OPSET, fastonnx.MAX_OPSET + 1))
def test_ir_version_is_the_lowest_the_opset_needs(opset: int) -> None:
    expected = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])
    assert ir_version_for(opset) == expected


def _model(opset: int) -> bytes:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Abs", ["x"], ["y"])], "g", [x], [y])
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=ir_version_for(min(opset, 26))
    )
    return model.SerializeToString()


def test_max_opset_is_the_newest_onnxruntime_loads() -> None:
    onnxruntime.InferenceSession(_model(fastonnx.MAX_OPSET), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime raises its own exception types
        onnxruntime.InferenceSession(_model(fastonnx.MAX_OPSET + 1), providers=["CPUExecutionProvider"])


def test_default_opset_is_20() -> None:
    result = fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(2),))
    opsets = {o.domain: o.version for o in result.model_proto.opset_import}
    assert opsets[""] == 20 == fastonnx.DEFAULT_OPSET
    assert result.model_proto.ir_version == 9
