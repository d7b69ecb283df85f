"""Small tasks the architecture sweep (scripts/architecture_sweep.py) found failing to export:

- Grounding DINO ties its decoder's ``bbox_embed`` to the head's: the tied name cut at
  ``model.decoder.`` meets the head's own key in the shards, so the export's wrapper prefix was
  ambiguous and the weights it reads (``model.level_embed``) were not found. Each weight's names now
  count together (``wrapper_prefix``).

Each is built from the sweep's own tiny config, exported by ``export_pretrained`` and verified against
transformers eager.
"""

from __future__ import annotations

import pathlib

import pytest
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.stored_weights.checkpoints import wrapper_prefix
from support.matrix import sampled

EXPORTS = [
    ("zero-shot-object-detection", "grounding-dino"),
    ("zero-shot-object-detection", "mm-grounding-dino"),
]

# CI: at most one export of this file (<= 20 s)
CI_EXPORTS: set[tuple[str, str]] = set()


@pytest.mark.parametrize(("task", "model_type"), sampled(EXPORTS, lambda case: case in CI_EXPORTS))
def test_sweep_small_task_exports_verified(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    sweep = architecture_sweep()
    class_name = dict(sweep.architectures(task))[model_type]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


def test_wrapper_prefix_counts_a_tied_weights_names_together() -> None:
    # Grounding DINO's shards: the head's bbox_embed, not the decoder's tied name for it
    index = dict.fromkeys(["model.level_embed", "bbox_embed.0.weight"])
    decoder, head = "inner.model.model.decoder.bbox_embed.0.weight", "inner.model.bbox_embed.0.weight"
    keys = ["inner.model.model.level_embed", decoder]
    tied = {decoder: [decoder, head], head: [decoder, head]}
    assert wrapper_prefix(keys, index, tied) == "inner.model."  # type: ignore[arg-type]
    assert wrapper_prefix(keys, index) == ""  # type: ignore[arg-type]  # untied: two cuts disagree
