"""EoMT's ``attn_mask_probs``, the buffer its forward branches on (capture/control_buffers.py): a
checkpoint folder exported with the branches its stored values take, a live model with its own, and a
value that makes transformers unmask random queries refused."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.errors import CaptureError


def _tiny(probs: tuple[float, ...]) -> Any:
    from transformers import EomtConfig, EomtForUniversalSegmentation

    config = EomtConfig(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        num_blocks=len(probs),
        num_queries=4,
        num_register_tokens=1,
        num_upscale_blocks=1,
        mlp_ratio=2,
        num_labels=3,
    )
    torch.manual_seed(0)
    model = EomtForUniversalSegmentation(config).eval()
    model.attn_mask_probs.copy_(torch.tensor(probs))
    return model


def _pixels() -> torch.Tensor:
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_a_folder_exports_the_branches_its_stored_values_take(tmp_path: pathlib.Path) -> None:
    # block 1 masks its attention, block 2 (0) runs no mask head and keeps block 1's mask, as eager does
    _tiny((1.0, 0.0)).save_pretrained(tmp_path / "checkpoint")
    written = fastonnx.export_pretrained(
        tmp_path / "checkpoint", tmp_path / "package", task="image-segmentation", progress=False
    )
    assert written.verified is True, written.verify_note


def test_a_live_model_is_captured_with_its_own_values(tmp_path: pathlib.Path) -> None:
    model, pixels = _tiny((0.0, 1.0)), _pixels()
    with torch.no_grad():
        want = model(pixel_values=pixels).masks_queries_logits
        unmasked = _tiny((0.0, 0.0))(pixel_values=pixels).masks_queries_logits
    assert not torch.allclose(want, unmasked, atol=1e-3)  # the branch changes the output
    fastonnx.to_onnx(model, (pixels,), filename=tmp_path / "eomt.onnx")
    session = ort.InferenceSession(str(tmp_path / "eomt.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    got = session.run(None, {session.get_inputs()[0].name: pixels.numpy()})
    masks = got[next(i for i, n in enumerate(names) if "mask" in n)]
    torch.testing.assert_close(torch.from_numpy(np.asarray(masks)), want, atol=1e-4, rtol=1e-3)
    assert isinstance(model.attn_mask_probs, torch.Tensor)  # put back after the capture
    assert "attn_mask_probs" in dict(model.named_buffers())


def test_a_random_unmasking_value_is_refused(tmp_path: pathlib.Path) -> None:
    model = _tiny((0.5, 1.0))
    with pytest.raises(CaptureError, match=r"attn_mask_probs\[0\] is 0.5: transformers then unmasks random"):
        fastonnx.to_onnx(model, (_pixels(),), filename=tmp_path / "eomt.onnx")
    assert not (tmp_path / "eomt.onnx").exists()
    assert "attn_mask_probs" in dict(model.named_buffers())
