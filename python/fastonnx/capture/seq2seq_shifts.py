"""The BART and T5 families' shift of ``input_ids`` into ``decoder_input_ids``, swapped while torch.export
captures for a form that computes the same function at every length without a guard.

Given no decoder ids (their classifiers, question answering and masked LM graphs), those models shift
``input_ids`` right with ``shifted[:, 1:] = input_ids[:, :-1].clone()``: a tensor of length ``L - 1``,
whose contiguity check leaves the guard ``L - 1 != 1`` (guards.py then refuses length 2).
``shift_right_from_start`` (BART, MVP, BigBird-Pegasus, LED), ``shift_right_wrapping_eos`` (mBART, PLBart:
each row's last non-pad token moved to the front) and ``t5_shift_right`` (T5, mT5, UMT5) read position
``max(i - 1, 0)`` for every ``i`` and put the start token at 0: no tensor of length ``L - 1`` at all.

Their sequence classifiers' pooling at the last eos (a boolean-mask read, then ``view(batch, -1, width)``)
is left as transformers writes it: torch.export keeps its data-dependent size unbacked, and the file is
transformers' function on every input it accepts (as many eos tokens in every row, at least one); its
checks of the counts become runtime asserts, which ONNX drops (converters/checks.py).

Only the modules of ``SWAPS`` already imported are swapped, for the duration of the capture.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch


def _shifted(ids: torch.Tensor, first: int | torch.Tensor) -> torch.Tensor:
    """``ids`` moved one position right along the last dim, ``first`` at position 0 (a number, or a
    tensor broadcasting against ``ids[..., :1]``)."""
    positions = torch.arange(ids.shape[-1], device=ids.device)
    previous = ids.index_select(-1, (positions - 1).clamp(min=0))
    return torch.where(positions == 0, first, previous)


def shift_right_from_start(
    input_ids: torch.Tensor, pad_token_id: int | None, decoder_start_token_id: int
) -> torch.Tensor:
    """transformers' ``shift_tokens_right`` of BART, MVP, BigBird-Pegasus and LED."""
    if pad_token_id is None:
        raise ValueError("self.model.config.pad_token_id has to be defined.")
    shifted = _shifted(input_ids, decoder_start_token_id)
    return shifted.masked_fill(shifted == -100, pad_token_id)  # labels' ignored positions made pad


def shift_right_wrapping_eos(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """transformers' ``shift_tokens_right`` of mBART and PLBart: each row's last non-pad token (its
    language code / eos) moved to the front."""
    if pad_token_id is None:
        raise ValueError("self.model.config.pad_token_id has to be defined.")
    tokens = input_ids.masked_fill(input_ids == -100, pad_token_id)
    last = (tokens.ne(pad_token_id).sum(dim=1) - 1).unsqueeze(-1)
    return _shifted(tokens, tokens.gather(1, last))


def t5_shift_right(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """``T5PreTrainedModel._shift_right`` (mT5's, UMT5's alike)."""
    start, pad = self.config.decoder_start_token_id, self.config.pad_token_id
    if start is None:
        raise ValueError("self.model.config.decoder_start_token_id has to be defined.")
    if pad is None:
        raise ValueError("self.model.config.pad_token_id has to be defined.")
    shifted = _shifted(input_ids, start)
    return shifted.masked_fill(shifted == -100, pad)


SWAPS: dict[str, dict[str, Callable[..., Any]]] = {
    "bart": {"shift_tokens_right": shift_right_from_start},
    "mvp": {"shift_tokens_right": shift_right_from_start},
    "bigbird_pegasus": {"shift_tokens_right": shift_right_from_start},
    "led": {"shift_tokens_right": shift_right_from_start},
    "mbart": {"shift_tokens_right": shift_right_wrapping_eos},
    "plbart": {"shift_tokens_right": shift_right_wrapping_eos},
    "t5": {"T5PreTrainedModel._shift_right": t5_shift_right},
    "mt5": {"MT5PreTrainedModel._shift_right": t5_shift_right},
    "umt5": {"UMT5PreTrainedModel._shift_right": t5_shift_right},
}
"""transformers' model types (``transformers.models.<type>.modeling_<type>``), each with its functions or
``Class.method``s and the forms swapped in: listed per module, as other modules' ``shift_tokens_right``
(FSMT's, MusicGen's...) are other functions of the same name."""


@contextlib.contextmanager
def guard_free_seq2seq_shifts() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have the forms of this module."""
    swapped: list[tuple[Any, str, Any]] = []
    for model_type, forms in SWAPS.items():
        module = sys.modules.get(f"transformers.models.{model_type}.modeling_{model_type}")
        if module is None:
            continue
        for name, form in forms.items():
            owner: Any = module
            if "." in name:  # a method, ``Class.method``, of a class the module defines
                owner_name, name = name.split(".")
                owner = vars(module).get(owner_name)
            if owner is None or not callable(vars(owner).get(name)):
                continue
            swapped.append((owner, name, vars(owner)[name]))
            setattr(owner, name, form)
    try:
        yield
    finally:
        for owner, name, original in reversed(swapped):
            setattr(owner, name, original)
