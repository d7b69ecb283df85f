"""Whole-export speed with pytest-benchmark: `python -m pytest benches/test_export_speed.py`.

Each benchmark converts an ExportedProgram captured once (the part fastonnx adds to torch.export) and
writes it to a temporary folder. Speed is measured here, never asserted.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import fastonnx
from support.model_zoo import Field, Logits, tiny_bert, tiny_llama, with_random_batchnorm_stats


def _text() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 256, (2, 16)), torch.ones(2, 16, dtype=torch.int64)


def _resnet18() -> tuple[torch.nn.Module, tuple]:
    import torchvision

    return with_random_batchnorm_stats(torchvision.models.resnet18(weights=None)).eval(), (
        torch.randn(1, 3, 64, 64),
    )


CASES = {
    "tiny_llama": lambda: (Logits(tiny_llama()), _text()),
    "small_bert": lambda: (Field(tiny_bert(), "last_hidden_state"), _text()),
    "resnet18": _resnet18,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_convert_and_write(benchmark, tmp_path, name: str) -> None:
    model, args = CASES[name]()
    ep = torch.export.export(model, args, strict=False)
    path = tmp_path / "model.onnx"
    result = benchmark(lambda: fastonnx.to_onnx(ep, args, filename=path))
    benchmark.extra_info.update({k: v for k, v in result.stats.items() if k.endswith("_s") or k == "nodes"})


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_export_for_reference(benchmark, name: str) -> None:
    model, args = CASES[name]()
    benchmark.pedantic(lambda: torch.export.export(model, args, strict=False), rounds=3, iterations=1)
