"""Base models (feature-extraction) the architecture sweep found failing at capture or verification, each
built from the sweep's own tiny config with random weights, exported by ``export_pretrained`` and verified
against transformers eager:

- guards on the length, swapped for guard-free forms while capturing (capture/text_encoder_swaps.py):
  CPM-Ant's padding positions from a Python list, FSMT's ``.any()`` of its padding mask and its guarded
  shift, Longformer's window padding read by ``.item()``;
- inputs the forward cannot do without (pretrained/side_inputs.py): BROS's boxes, LXMERT's regions,
  ViTMAE's masking noise (drawn at random on every call without it), MusicGen's ids one row a codebook;
- outputs named other than last_hidden_state: LXMERT's two streams, MaskFormer's and Mask2Former's pixel
  and transformer decoder states.
"""

from __future__ import annotations

import pathlib
import types

import pytest
import torch
from checkpoint_folders import export_swept

from fastonnx.capture.text_encoder_swaps import cpmant_attention_mask, padding_mask_always
from fastonnx.pretrained.encoder_tasks import dynamic_shapes
from fastonnx.pretrained.side_inputs import rows_of
from support.matrix import sampled

TASK = "feature-extraction"
FIXED = [
    "bros",
    "cpmant",
    "fsmt",
    "longformer",
    "lxmert",
    "mask2former",
    "maskformer",
    "musicgen",
    "musicgen_melody",
    "vit_mae",
]


@pytest.mark.parametrize("model_type", sampled(FIXED, lambda name: name == "cpmant"))
def test_the_base_model_exports_and_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
    written = export_swept(tmp_path, TASK, model_type)
    assert written.verified is True, written.verify_note


@pytest.mark.parametrize("length", [5, 6, 11])
def test_cpmant_mask_matches_transformers_at_every_length(length: int) -> None:
    from transformers.models.cpmant.modeling_cpmant import CpmAntModel

    owner = types.SimpleNamespace(prompt_length=4)
    ids = torch.randint(0, 9, (3, length))
    span = torch.zeros(3, length, dtype=torch.int32)
    context = torch.ones(3, length, dtype=torch.int32)
    counts = torch.tensor([length - 4, 2, 0], dtype=torch.int32)
    want = CpmAntModel._prepare_attention_mask(owner, ids, span, context, counts)
    torch.testing.assert_close(cpmant_attention_mask(owner, ids, span, context, counts), want)


def test_fsmt_forms_match_transformers() -> None:
    from transformers.models.fsmt import modeling_fsmt

    from fastonnx.capture.seq2seq_shifts import shift_right_wrapping_eos

    ids = torch.tensor([[5, 6, 7, 2, 1, 1], [8, 9, 4, 3, 5, 2]])
    torch.testing.assert_close(
        shift_right_wrapping_eos(ids, 1), modeling_fsmt.shift_tokens_right(ids.clone(), 1)
    )
    assert torch.equal(padding_mask_always(ids, 1), modeling_fsmt.make_padding_mask(ids, 1))
    # where nothing is padding transformers returns None: an all-False mask masks nothing alike
    assert modeling_fsmt.make_padding_mask(ids[1:], 1) is None
    assert not padding_mask_always(ids[1:], 1).any()


def test_codebook_rows_are_a_multiple_of_the_batch() -> None:
    model = torch.nn.Linear(1, 1)
    shapes = dynamic_shapes(model, {"input_ids": {0: rows_of("batch_size", 4)}, "mask": {0: "batch_size"}})
    rows, batch = shapes["input_ids"][0], shapes["mask"][0]
    assert isinstance(batch, torch.export.Dim) and batch.__name__ == "batch_size"
    assert rows.root is batch and rows.fn(3) == 12  # derived: 4 x batch_size
