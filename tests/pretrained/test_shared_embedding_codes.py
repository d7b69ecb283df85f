"""A tied decoder quantized with its head at the onnxruntime level (issue 43): the embedding gathers the
head's MatMulNBits codes through com.microsoft.GatherBlockQuantized, the same bytes of the data file, and
the package holds no float table. At accuracy level 1 the package is transformers with the package's own
dequantized codes, the embedding's rows among them."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from checkpoint_folders import DECODER, save_checkpoint
from test_packed_decoder import PROMPT, _feeds, _load_dequantized

import fastonnx
from fastonnx.stored_weights.weight_quantization import WeightQuantization
from support.matrix import sampled


def _external(t: onnx.TensorProto) -> tuple[str, str, str]:
    info = {e.key: e.value for e in t.external_data}
    return info["location"], info["offset"], info["length"]


@pytest.mark.parametrize("bits", sampled([4, 8], lambda bits: bits == 4))
def test_a_tied_embedding_gathers_its_heads_codes(tmp_path: pathlib.Path, bits: int) -> None:
    import onnxruntime as ort

    config = {**DECODER, "tie_word_embeddings": True}
    model: Any = save_checkpoint(tmp_path / "checkpoint", "llama", "LlamaForCausalLM", config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    written = fastonnx.export_pretrained(
        tmp_path / "checkpoint",
        tmp_path / "package",
        quantize=WeightQuantization(bits=bits, accuracy_level=1, exclude=()),
        optimize="onnxruntime",
        progress=False,
    )
    shell = onnx.load(str(written.model_path), load_external_data=False)
    inits = {t.name: t for t in shell.graph.initializer}
    vocab, hidden = DECODER["vocab_size"], DECODER["hidden_size"]
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    tables = [t for t in inits.values() if t.data_type in floats and list(t.dims) == [vocab, hidden]]
    assert tables == [], "no float embedding table in the package"
    # what the package still reads of the checkpoint (the norms) is less than a table's bytes
    assert (written.outdir / "package_weights.data").stat().st_size < vocab * hidden
    (gather,) = [n for n in shell.graph.node if n.op_type == "GatherBlockQuantized"]
    assert not [n for n in shell.graph.node if n.op_type == "Gather" and n.input[0] in inits]
    head = [n for n in shell.graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits"]
    (head,) = head or [n for n in shell.graph.node if n.op_type == "MatMulNBits"][-1:]
    # the gathered codes and scales are the head's bytes, read in 2-D: one copy in the data file
    for mine, its in ((0, 1), (2, 2)):
        assert _external(inits[gather.input[mine]]) == _external(inits[head.input[its]])
    assert list(inits[gather.input[0]].dims) == [vocab, hidden * bits // 8]
    report = written.report_path.read_text()
    assert "shares the head's codes" in report

    proto = onnx.load(str(written.model_path))
    _load_dequantized(model, proto)
    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    ids = np.array(PROMPT, np.int64)
    outputs = dict(zip(names, session.run(None, _feeds(session, ids, {}, 0)), strict=True))
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).logits
    torch.testing.assert_close(torch.from_numpy(outputs["logits"]), want, atol=1e-4, rtol=1e-4)


def test_only_a_provider_with_the_kernel_gathers_codes() -> None:
    """DirectML registers no GatherBlockQuantized: its packages keep the float table; the CPU, CUDA and
    WebGPU providers run the kernel."""
    from fastonnx.pretrained import targets

    for target in ("cpu", "cuda", "webgpu"):
        assert targets.quantize_for(target, "int4") == "int4"
    dml = targets.quantize_for("dml", "int4")
    assert isinstance(dml, WeightQuantization) and (dml.bits, dml.gather_codes) == (4, False)
    assert targets.quantize_for("dml", None) is None
