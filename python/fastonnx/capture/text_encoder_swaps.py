"""Bare text encoders whose transformers code specialises or guards on the length, swapped while
torch.export captures for forms that compute the same function at every length.

- CPM-Ant's attention mask (``CpmAntModel._prepare_attention_mask``) builds its left-padding positions
  with ``torch.tensor(list(range(L - prompt))[::-1])``: a Python list of the example's length, so the
  length is specialised; ``cpmant_attention_mask`` counts them down with ``arange``.
- FSMT's decoder inputs: ``make_padding_mask`` returns None where no id is padding (``.any()`` read into
  Python, a data-dependent guard); ``padding_mask_always`` returns the mask, all False there, which masks
  nothing, as None does. Its ``shift_tokens_right`` writes the last non-pad token into column 0 through
  ``.squeeze()`` (a guard on the batch) and the rest into a slice of length ``L - 1`` (a guard on the
  length); seq2seq_shifts.py's ``shift_right_wrapping_eos`` is the same function (mBART's) without them.
- Longformer's windowed attention is LED's (transformers copies it): its chunks need the length padded to
  a multiple of the window, read by ``.item()``; seq2seq_shifts.py's ``led_attention_dense`` is the same
  attention dense with masks, and ``longformer_no_window_padding`` pads nothing, since it needs no
  multiple (the padding transformers adds is masked keys and dropped queries).

Only the modules already imported are swapped (model_swaps.py), for the duration of the capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms
from fastonnx.capture.seq2seq_shifts import led_attention_dense, shift_right_wrapping_eos


def cpmant_attention_mask(
    self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor, length: torch.Tensor
) -> torch.Tensor:
    """``CpmAntModel._prepare_attention_mask`` with the padding positions from ``arange``."""
    batch, seqlen = input_ids.shape
    device = input_ids.device
    steps = torch.arange(seqlen, device=device)
    directional = steps <= steps.view(-1, 1)
    mask = context[:, None, :] | (context[:, :, None].logical_not() & directional.view(1, seqlen, seqlen))
    mask = mask & (span[:, None, :] == span[:, :, None])
    # transformers' reversed list(range(L - prompt)): L - prompt - 1 down to 0
    counted = steps[self.prompt_length :].flip(0) - self.prompt_length
    mask_1d = counted[None, :].repeat(batch, 1) < length[:, None]
    mask_1d = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), mask_1d), dim=1)
    out: torch.Tensor = mask_1d.view(batch, seqlen, 1) & mask_1d.view(batch, 1, seqlen) & mask
    return out


def padding_mask_always(input_ids: torch.Tensor, padding_idx: int = 1) -> torch.Tensor:
    """FSMT's ``make_padding_mask``: True at pad tokens, returned even where none is (masking nothing)."""
    return input_ids.eq(padding_idx)


def longformer_no_window_padding(
    self: Any,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    pad_token_id: int,
) -> tuple[int, Any, torch.Tensor, torch.Tensor, Any, Any]:
    """``LongformerModel._pad_to_window_size`` padding nothing (``led_attention_dense`` needs no multiple)."""
    return 0, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds


SWAPS: dict[str, dict[str, Callable[..., Any]]] = {
    "cpmant": {"CpmAntModel._prepare_attention_mask": cpmant_attention_mask},
    "fsmt": {"make_padding_mask": padding_mask_always, "shift_tokens_right": shift_right_wrapping_eos},
    "longformer": {
        "LongformerSelfAttention.forward": led_attention_dense,
        "LongformerModel._pad_to_window_size": longformer_no_window_padding,
    },
}


@contextlib.contextmanager
def guard_free_text_encoders() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have their guard-free forms."""
    with swapped_forms(SWAPS):
        yield
