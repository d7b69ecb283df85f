"""FastSpeech2Conformer's length regulator, swapped while torch.export captures for a form torch.export
traces at every batch size and length.

transformers' ``length_regulator`` (modeling_fastspeech2_conformer.py) repeats each phoneme's encoder state
by its predicted duration: a branch on ``duration_labels.sum() == 0`` (rows of an all-zero batch get
duration 1 everywhere), then a Python loop over the batch rows, each ``repeat_interleave`` of a
data-dependent length written into a zero tensor of the longest row's frames. The loop unrolls to the
example's batch, and the branch is a data-dependent guard.

``length_regulator_by_gather`` computes the same function for all rows at once: each output frame ``f``
of a row reads the state of the phoneme ``#{i : ends[i] <= f}`` (``ends`` the cumulative durations), the
frames past the row's total are zeros, and the all-zero branch is a ``where`` written back into the
durations (transformers' assignment is in place: the model returns those durations). The frame count, the
largest total, stays a data-dependent (unbacked) size: the graph's output length.

Its conformer's relative positional encoding (``FastSpeech2ConformerRelPositionalEncoding.forward``) slices
a table of 5000 positions and rebuilds it where ``2 T - 1`` rows do not fit: a branch on the decoder's
frame count, which is unbacked (torch cannot decide it). ``relative_positions_by_formula`` computes the
``2 T - 1`` rows, relative positions ``T - 1`` down to ``1 - T``, from the table's own formula: the same
values at every length. Its attention's Transformer-XL shift of the relative scores
(``FastSpeech2ConformerAttention.shift_relative_position_tensor``: a padded column, views as ``(2T, T)``
and back) guards on the frame count through its views; ``shifted_relative_scores`` gathers the same
entries (speech_encoders.skewed_relative_scores, wav2vec2-conformer's).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms
from fastonnx.capture.speech_encoders import skewed_relative_scores


def length_regulator_by_gather(
    encoded_embeddings: torch.Tensor, duration_labels: torch.Tensor, speaking_speed: float = 1.0
) -> torch.Tensor:
    """transformers' ``length_regulator``: ``encoded_embeddings`` (batch, phonemes, width) repeated by
    ``duration_labels`` (batch, phonemes) into (batch, the largest row's frames, width), float32."""
    if speaking_speed <= 0:
        raise ValueError("`speaking_speed` must be greater than 0.")
    if speaking_speed != 1.0:
        duration_labels = torch.round(duration_labels.float() * speaking_speed).long()
    # transformers' branch: in an all-zero batch, every row summing to zero takes 1 at every position
    empty = (duration_labels.sum(dim=1) == 0) & (duration_labels.sum() == 0)
    # in place, as transformers writes it: the model returns these predictions (duration_outputs)
    duration_labels.copy_(torch.where(empty[:, None], torch.ones_like(duration_labels), duration_labels))
    ends = duration_labels.cumsum(dim=1)
    totals = ends[:, -1]
    frames = torch.arange(totals.max().item(), device=ends.device)  # data-dependent: the output's length
    phoneme = (ends.unsqueeze(1) <= frames[None, :, None]).sum(-1)  # (batch, frames)
    last = encoded_embeddings.shape[1] - 1
    index = phoneme.clamp(max=last).unsqueeze(-1).expand(-1, -1, encoded_embeddings.shape[2])
    states = encoded_embeddings.gather(1, index).to(torch.float)
    return torch.where((frames[None, :] < totals[:, None]).unsqueeze(-1), states, 0.0)


def relative_positions_by_formula(
    self: Any, feature_representation: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``FastSpeech2ConformerRelPositionalEncoding.forward``: the scaled input and its ``2 T - 1`` relative
    position rows, row ``j`` the sines and cosines (interleaved) of position ``T - 1 - j``."""
    length = feature_representation.shape[1]
    device = feature_representation.device
    relative = (length - 1 - torch.arange(2 * length - 1, device=device)).float()
    frequencies = torch.exp(
        torch.arange(0, self.embed_dim, 2, device=device).float() * -(math.log(10000.0) / self.embed_dim)
    )
    angles = relative.unsqueeze(1) * frequencies
    # flatten, not reshape(2 T - 1, -1): inferring -1 leaves a divisibility guard on T
    table = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(-2)
    positions = table.unsqueeze(0).to(feature_representation.dtype)
    return self.dropout(feature_representation * self.input_scale), self.dropout(positions)


def shifted_relative_scores(self: Any, pos_tensor: torch.Tensor) -> torch.Tensor:
    """``FastSpeech2ConformerAttention.shift_relative_position_tensor``: (..., T, 2T - 1) to (..., T, T)."""
    del self
    return skewed_relative_scores(pos_tensor, pos_tensor.shape[-2])


SWAPS: dict[str, dict[str, Callable[..., Any]]] = {
    "fastspeech2_conformer": {
        "length_regulator": length_regulator_by_gather,
        "FastSpeech2ConformerRelPositionalEncoding.forward": relative_positions_by_formula,
        "FastSpeech2ConformerAttention.shift_relative_position_tensor": shifted_relative_scores,
    }
}


@contextlib.contextmanager
def gathered_length_regulators() -> Iterator[None]:
    """While active, a loaded FastSpeech2Conformer modeling module regulates lengths by
    ``length_regulator_by_gather``."""
    with swapped_forms(SWAPS):
        yield
