"""Whole models match eager PyTorch in onnxruntime at every tested opset (exported once each)."""

from __future__ import annotations

import onnx
import pytest
import torch

import fastonnx
from export_check import OPSETS, check_export
from model_zoo import MLP, Field, Logits, SmallCNN, tiny_bert, tiny_llama, with_random_batchnorm_stats

# every model is exported once, then converted at each opset under each optimization setting
SETTINGS = (False, True, "onnxruntime")
_ORT_ONLY = {"SimplifiedLayerNormalization"}


def _check_files(results: list[fastonnx.ExportResult]) -> None:
    for r in results:
        # onnxruntime's contrib operators (optimize="onnxruntime") are unknown to onnx's checker;
        # onnxruntime itself loaded and ran those files in check_export
        if not any(n.op_type in _ORT_ONLY for n in r.model_proto.graph.node):
            onnx.checker.check_model(r.model_proto, full_check=True)


def _same_file_from_module_and_program(model: torch.nn.Module, args: tuple) -> None:
    model = model.eval()
    ep = torch.export.export(model, args, strict=False)
    assert fastonnx.to_onnx(model, args).to_bytes() == fastonnx.to_onnx(ep, args).to_bytes()


def test_mlp() -> None:
    model, x = MLP(), torch.randn(3, 16)
    _check_files(check_export(model, (x,), opsets=OPSETS, optimize=SETTINGS))
    _same_file_from_module_and_program(model, (x,))


def test_small_cnn() -> None:
    model = with_random_batchnorm_stats(SmallCNN())
    _check_files(check_export(model, (torch.randn(2, 3, 32, 32),), opsets=OPSETS, optimize=SETTINGS))


def test_resnet18() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = with_random_batchnorm_stats(torchvision.models.resnet18(weights=None))
    x = torch.randn(1, 3, 64, 64)
    _check_files(check_export(model, (x,), opsets=OPSETS, optimize=SETTINGS, atol=1e-3, rtol=1e-3))
    _same_file_from_module_and_program(model, (x,))


def test_llama() -> None:
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)

    _check_files(check_export(Logits(model), (ids, mask), opsets=OPSETS, optimize=SETTINGS))
    _same_file_from_module_and_program(Logits(model), (ids, mask))


def test_bert() -> None:
    model = tiny_bert()
    ids = torch.randint(0, 256, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0

    hidden = Field(model, "last_hidden_state")
    _check_files(check_export(hidden, (ids, mask), opsets=OPSETS, optimize=SETTINGS))
    _same_file_from_module_and_program(hidden, (ids, mask))


@pytest.mark.parametrize("opset", [17, fastonnx.MAX_OPSET])
def test_module_and_exported_program_give_identical_files(tmp_path, opset: int) -> None:
    model = with_random_batchnorm_stats(SmallCNN()).eval()
    x = torch.randn(1, 3, 16, 16)
    fastonnx.to_onnx(model, (x,), opset=opset, filename=tmp_path / "a.onnx")
    ep = torch.export.export(model, (x,), strict=False)
    fastonnx.to_onnx(ep, (x,), opset=opset, filename=tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
