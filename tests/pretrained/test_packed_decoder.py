"""The onnxruntime level's int4 decoder as the genai builder writes it (issue 43, part 1): one packed
MatMulNBits a layer for q/k/v and one for gate/up, residual norms as SkipSimplifiedLayerNormalization,
and GroupQueryAttention reading the packed q/k/v product and rotating it itself. At accuracy level 1
(float32 products) the package is transformers with the weights dequantized from the package's own
codes: the prompt's and a decode step's logits within float32 rounding."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from checkpoint_folders import DECODER, save_decoder
from onnx import numpy_helper

import fastonnx
from fastonnx.stored_weights.weight_quantization import WeightQuantization

PROMPT = [[1, 17, 42, 99, 5], [3, 8, 13, 21, 34]]


def _dequantized(node: onnx.NodeProto, tensors: dict[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """The float weight [N, K] a symmetric 4-bit MatMulNBits reads (codes shifted by 8, the default zero
    point)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
    codes, scales = tensors[node.input[1]], tensors[node.input[2]].reshape(n, -1)
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(n, codes.shape[1], block)
    return ((nibbles.astype(np.float32) - 8) * scales[:, :, None]).reshape(n, -1)[:, :k]


def _load_dequantized(model: Any, proto: onnx.ModelProto) -> None:
    """Puts the package's dequantized weights into ``model``: a packed product's rows are its parts'
    (q, k, v or gate, up) one after another."""
    tensors = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    state = model.state_dict()
    for node in (n for n in proto.graph.node if n.op_type == "MatMulNBits"):
        weight = _dequantized(node, tensors)
        first = node.input[1].removeprefix("model.").split(".weight")[0]
        parts = [first]
        if state[first + ".weight"].shape[0] != weight.shape[0]:
            siblings = {"q_proj": ("k_proj", "v_proj"), "gate_proj": ("up_proj",)}
            leaf = first.rsplit(".", 1)[1]
            parts += [first.replace(leaf, other) for other in siblings[leaf]]
        at = 0
        for part in parts:
            rows = state[part + ".weight"].shape[0]
            with torch.no_grad():
                model.get_parameter(part + ".weight").copy_(torch.from_numpy(weight[at : at + rows]))
            at += rows
        assert at == weight.shape[0], parts


def _feeds(
    session: Any, ids: np.ndarray[Any, Any], past: dict[str, np.ndarray[Any, Any]], start: int
) -> dict[str, np.ndarray[Any, Any]]:
    feeds: dict[str, np.ndarray[Any, Any]] = {}
    for arg in session.get_inputs():
        if arg.name == "input_ids":
            feeds[arg.name] = ids
        elif arg.name == "attention_mask":
            feeds[arg.name] = np.ones((ids.shape[0], start + ids.shape[1]), np.int64)
        elif arg.name == "position_ids":
            feeds[arg.name] = np.tile(np.arange(start, start + ids.shape[1]), (ids.shape[0], 1))
        else:
            empty = np.zeros((ids.shape[0], arg.shape[1], 0, arg.shape[3]), np.float32)
            feeds[arg.name] = past.get(arg.name, empty)
    return feeds


@pytest.mark.parametrize("name", ["llama"])
def test_packed_int4_decoder_is_transformers_with_its_codes(tmp_path: pathlib.Path, name: str) -> None:
    import onnxruntime as ort

    model: Any = save_decoder(tmp_path / "checkpoint", name)
    written = fastonnx.export_pretrained(
        tmp_path / "checkpoint",
        tmp_path / "package",
        quantize=WeightQuantization(bits=4, accuracy_level=1),
        optimize="onnxruntime",
        progress=False,
    )
    proto = onnx.load(str(written.model_path))
    ops = [n.op_type for n in proto.graph.node]
    layers = DECODER["num_hidden_layers"]
    assert ops.count("MatMulNBits") == 4 * layers  # q/k/v, o, gate/up, down
    assert ops.count("SkipSimplifiedLayerNormalization") == 2 * layers
    assert "RotaryEmbedding" not in ops and "Split" in ops  # the MLP's gate/up stays split
    for node in (n for n in proto.graph.node if n.op_type == "GroupQueryAttention"):
        assert list(node.input[1:3]) == ["", ""] and node.input[9] == "position_ids"
    _load_dequantized(model, proto)

    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    ids = np.array(PROMPT, np.int64)
    outputs = dict(zip(names, session.run(None, _feeds(session, ids, {}, 0)), strict=True))
    past = {k.replace("present.", "past_key_values.", 1): v for k, v in outputs.items() if k != "logits"}
    step = np.array([[7], [11]], np.int64)
    logits = session.run(["logits"], _feeds(session, step, past, ids.shape[1]))[0]

    with torch.no_grad():
        first = model(input_ids=torch.from_numpy(ids), use_cache=True)
        second = model(input_ids=torch.from_numpy(step), past_key_values=first.past_key_values)
    torch.testing.assert_close(torch.from_numpy(outputs["logits"]), first.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(logits), second.logits, atol=1e-4, rtol=1e-4)
