"""Encoder families the architecture sweep (scripts/architecture_sweep.py) found failing to export:

- ConvBERT's span-based dynamic convolution unfolds (``aten.im2col``) a k x 1 kernel over the
  sequence, whose length is dynamic: the converter required static spatial sizes (op-level cases in
  tests/converters/test_fold.py); built from the sweep's own tiny config, exported by
  ``export_pretrained`` and verified against transformers eager;
- CANINE reads Unicode code points (its config has no ``vocab_size``; the task's inputs are code
  points), and its local attention loop, max-pool of the mask and molecule upsampling specialised the
  length; the forms swapped in while torch.export captures (capture/chunked_kernels.py) are checked
  against eager at lengths other than the example's.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.chunked_kernels import length_following_kernels
from fastonnx.pretrained.encoder_tasks import UNICODE_CODEPOINTS, text_inputs, text_length
from support.matrix import sampled

_sweep = architecture_sweep


@pytest.mark.parametrize(
    "task",
    sampled(
        ["fill-mask", "text-classification", "question-answering", "token-classification"],
        lambda task: task == "token-classification",  # one head in CI: the convolution is the same
    ),
)
def test_convbert_exports_verified(tmp_path: pathlib.Path, task: str) -> None:
    sweep = _sweep()
    class_name = dict(sweep.architectures(task))["convbert"]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, "convbert", class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True


def _canine() -> torch.nn.Module:
    from transformers import CanineConfig, CanineModel

    config = CanineConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_hash_functions=2,
        num_hash_buckets=64,
        local_transformer_stride=8,  # several local blocks at the lengths below
        max_position_embeddings=64,
        downsampling_rate=4,
    )
    torch.manual_seed(0)
    return CanineModel(config).eval()


def test_canine_inputs_are_code_points() -> None:
    from transformers import CanineConfig

    config = CanineConfig()
    assert not hasattr(config, "vocab_size")
    assert text_length(config) == 15  # three molecules of 4 characters and a partial group
    ids = text_inputs(config, 2, text_length(config), "cpu", True)["input_ids"]
    assert ids.shape == (2, 15) and int(ids.max()) < UNICODE_CODEPOINTS and int(ids.max()) > 0xFFFF


def test_canine_forms_match_eager_at_every_length() -> None:
    """Captured once at 37 characters (5 local blocks of 8), the program run at other lengths (whole
    and partial blocks and molecule groups) equals eager CANINE, a padded row included."""
    model = _canine()

    def inputs(length: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(length)
        ids = torch.randint(0, UNICODE_CODEPOINTS, (2, length), generator=g)
        mask = torch.ones(2, length, dtype=torch.int64)
        mask[1, length // 3 :] = 0
        return ids, mask

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            out = self.model(input_ids=ids, attention_mask=mask)
            return torch.cat([out.last_hidden_state, out.pooler_output[:, None]], dim=1)

    # as the capture's refinement does: guards torch cannot prove over a range (one molecule or more)
    # are kept, and ep.module() checks them on each call
    length = torch.export.Dim.DYNAMIC
    with length_following_kernels():
        ep = torch.export.export(
            Encoder(), inputs(37), dynamic_shapes=({1: length}, {1: length}), strict=False
        )
    captured = ep.module()
    for n in (8, 21, 37, 50, 64):
        with torch.no_grad():
            expected = Encoder()(*inputs(n))
            got = captured(*inputs(n))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_tapas_takes_a_token_type_per_table_feature(tmp_path: pathlib.Path) -> None:
    """TAPAS' token_type_ids hold one id a table feature (batch x sequence x 7): the graph takes them so."""
    sweep = _sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint("text-classification", "tapas", "TapasForSequenceClassification", folder)
    written = fastonnx.export_pretrained(
        folder, tmp_path / "package", task="text-classification", progress=False
    )
    assert written.verified is True, written.verify_note
    assert written.input_names == ["input_ids", "attention_mask", "token_type_ids"]
