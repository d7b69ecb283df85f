"""Models without their weights (meta device) export their graph; weights attach later and match eager."""

from __future__ import annotations

import os

import pytest
import torch

import fastonnx
from support.model_zoo import Logits, tiny_llama


def test_meta_llama_then_attach_weights(tmp_path) -> None:
    with torch.device("meta"):
        meta_model = Logits(tiny_llama())
    ids = torch.randint(0, 256, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    path = tmp_path / "llama.onnx"
    result = fastonnx.to_onnx(meta_model, (ids.to("meta"), mask.to("meta")), filename=path)
    n = result.stats["deferred_weights"]
    assert n > 0 and result.stats["file"]["external_data"] is True
    real = Logits(tiny_llama())  # same seed and config: any other weights would do as well
    assert fastonnx.attach_weights(path, real) == n
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = real(ids, mask)
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)


def test_meta_export_cannot_be_inline_and_attach_checks_shapes(tmp_path) -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8, device="meta")
    with pytest.raises(fastonnx.SerializationError, match="meta device"):
        fastonnx.to_onnx(model, (x,), filename=tmp_path / "m.onnx", external_data=False)
    assert not os.path.exists(tmp_path / "m.onnx")
    fastonnx.to_onnx(model, (x,), filename=tmp_path / "m.onnx")
    with pytest.raises(fastonnx.InputError, match="expects"):
        fastonnx.attach_weights(tmp_path / "m.onnx", torch.nn.Linear(8, 5))
    with pytest.raises(fastonnx.InputError, match="no tensor for 1 weights: bias"):
        fastonnx.attach_weights(tmp_path / "m.onnx", {"weight": torch.randn(4, 8)})


@pytest.mark.slow
def test_over_2gib_switches_to_external_data_on_its_own(tmp_path) -> None:
    import onnxruntime

    from support.model_zoo import Wide

    with torch.no_grad():
        model = Wide(int(2.25 * (1 << 30)), torch.float32).eval()
    x = torch.randn(1, 4096)
    path = tmp_path / "big.onnx"
    result = fastonnx.to_onnx(model, (x,), filename=path)
    info = result.stats["file"]
    assert info["switched_to_external"] is True and info["external_data"] is True
    assert os.path.getsize(path) < (1 << 20) and os.path.getsize(str(path) + ".data") > (2 << 30)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {result.input_names[0]: x.numpy()})
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-3, rtol=1e-3)
