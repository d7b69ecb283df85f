"""Gemma 4's vision pooling, swapped while torch.export captures for a form whose pooled rows follow the
patches' number.

transformers' ``Gemma4VisionPooler._avg_pool_by_positions`` averages each k x k block of patches into one
of ``length`` rows (``length`` = patches / k², a size of the input) by a ``one_hot(kernel_idxs, length)``
weight matrix. ``one_hot`` takes its class count as an int: torch.export bakes in the example's (9 rows
from 36 patches) without a guard, so the captured program pools every image into that many rows, and an
image of more soft tokens silently loses its last ones. ``avg_pool_by_comparison`` builds the same
weights by comparing the block indices with ``arange(length)``, whose length stays symbolic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms


def avg_pool_by_comparison(
    self: Any, hidden_states: torch.Tensor, pixel_position_ids: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``_avg_pool_by_positions``, ``one_hot`` as a comparison with the row indices."""
    input_seq_len = hidden_states.shape[1]
    k = int((input_seq_len // length) ** 0.5)
    k_squared = k**2
    if k_squared * length != input_seq_len:
        raise ValueError(
            f"Cannot pool {hidden_states.shape} to {length}: {k=}^2 times {length=} must be {input_seq_len}."
        )
    clamped = pixel_position_ids.clamp(min=0)  # padding (-1, -1): zero states, no weight on the average
    max_x = clamped[..., 0].max(dim=-1, keepdim=True)[0] + 1
    blocks = torch.div(clamped, k, rounding_mode="floor")
    blocks = blocks[..., 0] + (max_x // k) * blocks[..., 1]
    rows = torch.arange(length, device=blocks.device)
    weights = (blocks.long().unsqueeze(-1) == rows).float() / k_squared
    output = weights.transpose(1, 2) @ hidden_states.float()
    mask = torch.logical_not((weights == 0).all(dim=1))
    return output.to(hidden_states.dtype), mask


SWAPS = {"gemma4": {"Gemma4VisionPooler._avg_pool_by_positions": avg_pool_by_comparison}}


@contextlib.contextmanager
def pooling_by_comparison() -> Iterator[None]:
    """While active, a loaded Gemma 4 modeling module pools its patches by ``avg_pool_by_comparison``."""
    with swapped_forms(SWAPS):
        yield
