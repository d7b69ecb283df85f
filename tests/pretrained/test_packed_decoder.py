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
    """The float weight [N, K] a symmetric MatMulNBits reads (4-bit codes shifted by 8, 8-bit by 128: the
    default zero points)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    k, n, block, bits = attrs["K"], attrs["N"], attrs["block_size"], attrs["bits"]
    codes, scales = tensors[node.input[1]], tensors[node.input[2]].reshape(n, -1)
    return _blocks(codes.reshape(n, -1), scales, bits, block)[:, :k]


def _blocks(
    codes: np.ndarray[Any, Any], scales: np.ndarray[Any, Any], bits: int, block: int
) -> np.ndarray[Any, Any]:
    """Rows of uint8 codes (two 4-bit values a byte, low nibble first) times their blocks' scales."""
    n = codes.shape[0]
    values = np.stack([codes & 15, codes >> 4], axis=-1).reshape(n, -1) if bits == 4 else codes
    values = values.reshape(n, -1, block).astype(np.float32) - (1 << (bits - 1))
    return (values * scales[:, :, None]).reshape(n, -1)


def _load_dequantized(model: Any, proto: onnx.ModelProto) -> None:
    """Puts the package's dequantized weights into ``model``: a packed product's rows are its parts'
    (q, k, v or gate, up) one after another; the embedding's rows where GatherBlockQuantized reads them
    from codes (a tied head's), after the products (the same values for a tied table)."""
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
    for node in (n for n in proto.graph.node if n.op_type == "GatherBlockQuantized"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert len(node.input) == 3, "symmetric codes: no zero points"
        rows = _blocks(tensors[node.input[0]], tensors[node.input[2]], attrs["bits"], attrs["block_size"])
        with torch.no_grad():
            model.get_input_embeddings().weight.copy_(torch.from_numpy(rows))


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
