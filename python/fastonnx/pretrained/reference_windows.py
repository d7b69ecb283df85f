"""Reference sliding-window attention (Unlimited-OCR's R-SWA) in image-text-to-text's decoder.

transformers' cache layer (``UnlimitedOcrDynamicReferenceSlidingWindowLayer``) keeps every prompt
(prefill) position and the last ``sliding_window - 1`` generated ones; a step attends to those and its
own tokens. Its mask (``create_reference_sliding_window_causal_mask``) is the sliding-window causal mask
or-ed with "a prompt key", which it tells from the prompt's length the cache holds as a Python int (set by
``generate`` before the prefill): a capture would fix it.

Decision: the decoder takes the prompt's length as an input, ``prefill_length`` (an int64 scalar: the
prompt's tokens, padding included, as transformers counts them), and its cache layers are plain growing
keys and values, as every sliding-window layer's in this package (decoder_cache.py): the graph keeps
every position and the mask hides the ones transformers drops, key ``k`` visible to query ``q`` where
``k <= q`` and (``k < prefill_length`` or ``q - k < sliding_window``), and the padding mask. Attention over
hidden keys is attention without them, so the logits are transformers'; the present outputs hold the
dropped positions too (onnxruntime-genai's cache grows by each step's tokens). A prefill (every key a
prompt key) is causal over the whole prompt, as transformers' first step is.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

from fastonnx.pretrained.decoder_cache import returned_cache

PREFILL_LENGTH = "prefill_length"
MASK_FUNCTION = "create_reference_sliding_window_causal_mask"


def mask_reading(prefill_length: torch.Tensor) -> Callable[..., Any]:
    """transformers' reference sliding-window mask, the prompt's length read from ``prefill_length``
    (a tensor) over a cache of full layers (every key at its position: no offset)."""
    from transformers.masking_utils import (
        and_masks,
        causal_mask_function,
        create_sliding_window_causal_mask,
        or_masks,
    )

    def prompt_key(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx < prefill_length

    def create(**kwargs: Any) -> Any:
        overlay = and_masks(causal_mask_function, prompt_key)
        if (more := kwargs.get("or_mask_function")) is not None:
            overlay = or_masks(overlay, more)
        return create_sliding_window_causal_mask(**{**kwargs, "or_mask_function": overlay})

    return create


@contextlib.contextmanager
def prefill_length_read(model: torch.nn.Module, prefill_length: torch.Tensor) -> Iterator[None]:
    """Within: ``model``'s modeling modules build the reference mask from ``prefill_length``."""
    modules = {sys.modules[type(m).__module__] for m in model.modules()}
    with contextlib.ExitStack() as stack:
        for module in modules:
            if hasattr(module, MASK_FUNCTION):
                stack.enter_context(mock.patch.object(module, MASK_FUNCTION, mask_reading(prefill_length)))
        yield


class ReferenceWindowStep(torch.nn.Module):
    """vision_language's ``EmbedsStep`` taking the prompt's length its reference sliding-window mask reads
    (the model under ``model``, as there: the weights keep the checkpoint's names)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        prefill_length: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        with prefill_length_read(self.model, prefill_length):
            out = self.model(
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=True,
            )
        return out.logits, returned_cache(out)


def prefill_length_step(
    model: torch.nn.Module, args: tuple[Any, ...], dims: dict[str, Any], names: list[str]
) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The embeds decoder's step and example arguments with ``prefill_length`` (added to ``dims`` and
    ``names``): the example's 4 past and 3 new positions, 5 of them the prompt's."""
    dims[PREFILL_LENGTH] = {}
    names.append(PREFILL_LENGTH)
    return ReferenceWindowStep(model), (*args, torch.tensor(5, dtype=torch.int64, device="meta"))


def prefill_length_feed(prompt: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ``prefill_length`` a decoder is fed at every step of a generation from ``prompt`` (its ids)."""
    return {PREFILL_LENGTH: torch.tensor(prompt.shape[1], dtype=torch.int64)}
