"""Encoder-decoder families run as classifiers, question answering and masked LMs, which the architecture
sweep (scripts/architecture_sweep.py) found failing, each built from the sweep's own tiny config with
random weights, exported by ``export_pretrained`` and verified against transformers eager:

- given no decoder ids, BART-like and T5-like models shift ``input_ids`` right by writing a slice of
  length ``L - 1``, whose contiguity check left the guard ``L != 2`` (the capture refused length 2);
  the shift is swapped for a guard-free form while capturing (capture/seq2seq_shifts.py);
- their sequence classifiers pool the decoder at each row's last eos: the example and verification
  inputs of a seq2seq model end each row with one eos, as its tokenizer writes them (encoder_tasks.py),
  and the sweep's eager check gives them no decoder ids of their own;
- BigBird-Pegasus switches to block-sparse attention past 704 tokens, a length its learned position
  table (128 here) never reaches: the length is bounded by the table (package_export.py).
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.seq2seq_shifts import (
    guard_free_seq2seq_shifts,
    shift_right_from_start,
    shift_right_wrapping_eos,
    t5_shift_right,
)
from support.matrix import sampled

_sweep = architecture_sweep


FIXED = [
    ("text-classification", "bart", "BartForSequenceClassification"),
    ("text-classification", "mbart", "MBartForSequenceClassification"),
    ("text-classification", "mvp", "MvpForSequenceClassification"),
    ("text-classification", "plbart", "PLBartForSequenceClassification"),
    ("text-classification", "bigbird_pegasus", "BigBirdPegasusForSequenceClassification"),
    ("text-classification", "t5", "T5ForSequenceClassification"),
    ("text-classification", "mt5", "MT5ForSequenceClassification"),
    ("text-classification", "umt5", "UMT5ForSequenceClassification"),
    ("question-answering", "bart", "BartForQuestionAnswering"),
    ("question-answering", "mbart", "MBartForQuestionAnswering"),
    ("question-answering", "mvp", "MvpForQuestionAnswering"),
    ("question-answering", "bigbird_pegasus", "BigBirdPegasusForQuestionAnswering"),
    ("question-answering", "t5", "T5ForQuestionAnswering"),
    ("question-answering", "mt5", "MT5ForQuestionAnswering"),
    ("question-answering", "umt5", "UMT5ForQuestionAnswering"),
    ("fill-mask", "bart", "BartForConditionalGeneration"),
    ("fill-mask", "mbart", "MBartForConditionalGeneration"),
    ("fill-mask", "mvp", "MvpForConditionalGeneration"),
]
# in CI one of each cause: BART's shift and pooling, mBART's wrapping shift, T5's, BigBird-Pegasus' bound
# one export through the swapped shift in CI (the three shift forms have their own tests below);
# BigBird-Pegasus' position table (19 s) and every other case under FASTONNX_FULL_MATRIX=1
IN_CI = {
    ("text-classification", "bart"),
}


@pytest.mark.parametrize(
    ("task", "model_type", "class_name"),
    sampled(FIXED, lambda c: (c[0], c[1]) in IN_CI),
    ids=lambda v: str(v),
)
def test_the_sweeps_tiny_model_exports_verified(
    tmp_path: pathlib.Path, task: str, model_type: str, class_name: str
) -> None:
    folder = tmp_path / "checkpoint"
    _sweep().build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


def _ids(rows: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 9, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("length", [1, 2, 5])
def test_the_shifts_are_transformers(length: int) -> None:
    from transformers import T5Config
    from transformers.models.bart.modeling_bart import shift_tokens_right as bart_shift
    from transformers.models.mbart.modeling_mbart import shift_tokens_right as mbart_shift
    from transformers.models.t5.modeling_t5 import T5PreTrainedModel

    ids = _ids(3, length, length)
    ids[0, 0] = -100  # a label's ignored position: made pad
    torch.testing.assert_close(shift_right_from_start(ids, 1, 2), bart_shift(ids, 1, 2))
    ids[:, -1] = 5  # mBART moves each row's last non-pad token to the front
    torch.testing.assert_close(shift_right_wrapping_eos(ids, 1), mbart_shift(ids, 1))
    owner = T5PreTrainedModel.__new__(T5PreTrainedModel)
    owner.config = T5Config(decoder_start_token_id=0, pad_token_id=0)
    torch.testing.assert_close(t5_shift_right(owner, ids), T5PreTrainedModel._shift_right(owner, ids))


def test_the_shift_is_captured_for_every_length() -> None:
    # loaded before the swap, as a model built before its export has it (the swap patches loaded modules)
    from transformers.models.bart import modeling_bart

    class Shift(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return modeling_bart.shift_tokens_right(ids, 1, 2) * 1

    length = torch.export.Dim("length", min=2, max=64)
    with guard_free_seq2seq_shifts():
        program = torch.export.export(Shift(), (_ids(2, 5, 0),), dynamic_shapes=({1: length},), strict=False)
    assert modeling_bart.shift_tokens_right is not shift_right_from_start  # restored
    for size in (2, 3, 9):
        ids = _ids(2, size, size)
        torch.testing.assert_close(program.module()(ids), modeling_bart.shift_tokens_right(ids, 1, 2))
