"""Informer's and Autoformer's attention masks, swapped while torch.export captures.

Neither forecaster passes a padding mask to its encoder or to its decoder's cross-attention, so eager
transformers builds none (``masking_utils`` returns None where nothing is masked). Under torch.export it
builds the all-visible mask anyway (it does not read a mask's values while exporting, and keeps every
mask), at the length it is built for: Informer's encoder builds it once, at the input's length, and its
distilling convolutions halve the sequence between layers, so the second layer finds a mask of the first
layer's length and raises; Autoformer's autocorrelation reshapes the cross-attention weights by the
decoder's length twice. ``unmasked_when_unpadded`` returns None where no padding mask and no mask function
is given, as eager does: a mask that hides nothing is no mask, at any length."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fastonnx.capture.model_swaps import swapped_forms


def unmasked_when_unpadded(*args: Any, **kwargs: Any) -> Any:
    """``create_bidirectional_mask``, None where nothing can be masked (no padding mask, no mask
    function): what eager returns there."""
    from transformers.masking_utils import create_bidirectional_mask

    functions = ("or_mask_function", "and_mask_function")
    if not args and kwargs.get("attention_mask") is None and all(kwargs.get(f) is None for f in functions):
        return None
    return create_bidirectional_mask(*args, **kwargs)


SWAPS = {
    "informer": {"create_bidirectional_mask": unmasked_when_unpadded},
    "autoformer": {"create_bidirectional_mask": unmasked_when_unpadded},
}


@contextlib.contextmanager
def unmasked_series_encoders() -> Iterator[None]:
    """While active, the loaded forecasters of ``SWAPS`` build no mask where nothing is masked."""
    with swapped_forms(SWAPS):
        yield
