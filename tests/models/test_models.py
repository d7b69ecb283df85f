"""Whole models match eager PyTorch in onnxruntime at every tested opset (exported once each)."""

from __future__ import annotations

import onnx
import pytest
import torch

import fastonnx
from support.export_check import OPSETS, check_export
from support.fusion_expectations import TRANSFORMERS_PATTERNS, expecting, traced_patterns
from support.matrix import sampled
from support.model_zoo import (
    MLP,
    Field,
    Logits,
    SmallCNN,
    tiny_bert,
    tiny_llama,
    with_calibrated_batchnorm,
    with_random_batchnorm_stats,
)

# every model is exported once, then converted at each opset under each optimization setting
SETTINGS = (False, True, "onnxruntime")
_ORT_ONLY = {"SimplifiedLayerNormalization"}


def _check_files(results: list[fastonnx.ExportResult]) -> None:
    for r in results:
        # onnxruntime's contrib operators (optimize="onnxruntime") are unknown to onnx's checker;
        # onnxruntime itself loaded and ran those files in check_export
        if not any(n.op_type in _ORT_ONLY for n in r.model_proto.graph.node):
            onnx.checker.check_model(r.model_proto, full_check=True)


def _same_file_from_module_and_program(model: torch.nn.Module, args: tuple, capture: str = "auto") -> None:
    """to_onnx(module) writes the file to_onnx(torch.export.export(module)) writes. Under the default
    capture a static-shape module is traced: the same bytes where each torch call the model makes is one
    aten op in torch.export's graph too (CNNs); transformers models call composite ops (``.to``,
    ``&``...) the trace records below autograd, whose FX names reach the metadata and value names
    (capture/trace.py), so they compare torch.export's capture on both sides."""
    model = model.eval()
    ep = torch.export.export(model, args, strict=False)
    from_module = fastonnx.to_onnx(model, args, capture=capture)
    assert from_module.stats["capture"] == ("trace" if capture == "auto" else capture)
    assert from_module.to_bytes() == fastonnx.to_onnx(ep, args).to_bytes()


def test_mlp() -> None:
    model, x = MLP(), torch.randn(3, 16)
    fusions = expecting(traced_patterns(model, (x,)))  # one torch gelu
    _check_files(check_export(model, (x,), opsets=OPSETS, optimize=SETTINGS, fusions=fusions))
    _same_file_from_module_and_program(model, (x,))


def test_small_cnn() -> None:
    model, x = with_random_batchnorm_stats(SmallCNN()), torch.randn(2, 3, 32, 32)
    fusions = expecting(traced_patterns(model.eval(), (x,)))  # two Conv + BatchNorm pairs
    _check_files(check_export(model, (x,), opsets=OPSETS, optimize=SETTINGS, fusions=fusions))


def test_resnet18() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = with_calibrated_batchnorm(torchvision.models.resnet18(weights=None), 64)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    fusions = expecting(traced_patterns(model, (x,)))  # every BatchNorm follows a Conv: 20
    # logits O(1) with calibrated BatchNorm; onnxruntime is within 6e-6 of eager (float32 rounding),
    # as in test_vision_models (was atol = rtol = 1e-3 on random statistics)
    # test_vision_models converts resnet18 too: here every opset once, the settings in turn (every pair
    # with FASTONNX_FULL_MATRIX=1)
    pairs = sampled(
        [(o, s) for o in OPSETS for s in SETTINGS], lambda c: SETTINGS.index(c[1]) == OPSETS.index(c[0]) % 3
    )
    results = check_export(model, (x,), conversions=pairs, atol=5e-5, rtol=1e-4, fusions=fusions)
    _check_files(results)
    _same_file_from_module_and_program(model, (x,))


def test_llama() -> None:
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)

    fusions = expecting(TRANSFORMERS_PATTERNS["llama"](Logits(model)))
    _check_files(check_export(Logits(model), (ids, mask), opsets=OPSETS, optimize=SETTINGS, fusions=fusions))
    _same_file_from_module_and_program(Logits(model), (ids, mask), capture="export")


def test_bert() -> None:
    model = tiny_bert()
    ids = torch.randint(0, 256, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0

    hidden = Field(model, "last_hidden_state")
    fusions = expecting(TRANSFORMERS_PATTERNS["bert"](hidden))
    _check_files(check_export(hidden, (ids, mask), opsets=OPSETS, optimize=SETTINGS, fusions=fusions))
    _same_file_from_module_and_program(hidden, (ids, mask), capture="export")


@pytest.mark.parametrize("opset", [17, fastonnx.MAX_OPSET])
def test_module_and_exported_program_give_identical_files(tmp_path, opset: int) -> None:
    model = with_random_batchnorm_stats(SmallCNN()).eval()
    x = torch.randn(1, 3, 16, 16)
    # the default capture traces the module: byte for byte torch.export's file for a CNN
    assert (
        fastonnx.to_onnx(model, (x,), opset=opset, filename=tmp_path / "a.onnx").stats["capture"] == "trace"
    )
    ep = torch.export.export(model, (x,), strict=False)
    fastonnx.to_onnx(ep, (x,), opset=opset, filename=tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
