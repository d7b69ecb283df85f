"""Qwen3-ASR's windowed audio attention, swapped while torch.export captures for a form without
data-dependent sizes.

Qwen3-ASR's encoder packs the frames that hold audio into one sequence and attends within windows of it:
each audio's post-convolution rows cut into windows of ``W`` rows (the longest chunk's rows times
``n_window_infer / (2 * n_window)``), the last one shorter. transformers builds the windows' boundaries,
``cu_seqlens``, in a Python loop over ``.item()`` values and splits the queries by ``lengths.tolist()``:
sizes read from the mask, which torch.export cannot trace. The form here returns the boundaries as
tensors (``W``, then each audio's end in the packed rows) and attends over all the rows at once, masked to
the pairs in the same window: row ``p`` of the audio it falls in has window ``(p - start) // W``. A row
outside its window gets zero weight in the softmax, so each window's rows get what transformers' split
gives them. The attention reads ``cu_seqlens`` only through these forms, which are swapped together.

Only the modules of ``SWAPS`` already imported are swapped, for the duration of the capture.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms


def window_bounds(
    chunk_lengths: torch.Tensor,
    feature_lens: torch.Tensor,
    n_window_infer: int,
    n_window: int,
    kwargs: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``get_audio_cu_seqlens``: ``[W, end of audio 0, end of audio 1, ...]`` in the packed rows, the
    window size and the audios' ends as tensors (no value read into Python)."""
    if kwargs is not None and kwargs.get("cu_seqlens") is not None:
        raise NotImplementedError("Qwen3-ASR with precomputed cu_seqlens is captured as transformers has it")
    module = sys.modules["transformers.models.qwen3_asr.modeling_qwen3_asr"]
    lengths = module._get_feat_extract_output_lengths
    rows = lengths(feature_lens, n_window)
    window = lengths(chunk_lengths, n_window).max() * (n_window_infer // (n_window * 2))
    return torch.cat([window.reshape(1), rows.cumsum(-1)]).to(torch.long)


def same_window(bounds: torch.Tensor, rows: int | torch.SymInt) -> torch.Tensor:
    """(rows, rows) bool: whether two packed rows share a window, from ``window_bounds``' tensor."""
    window, ends = bounds[0], bounds[1:]
    position = torch.arange(rows, device=bounds.device)
    audio = (position[:, None] >= ends[None, :]).sum(-1)  # the audio each row falls in
    starts = torch.cat([ends.new_zeros(1), ends])[audio]
    window_of = (position - starts) // window
    same: torch.Tensor = (audio[:, None] == audio[None, :]) & (window_of[:, None] == window_of[None, :])
    return same


def windowed_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Qwen3ASRAudioAttention.forward`` over ``window_bounds``' tensor: one attention, masked to windows."""
    rows = hidden_states.shape[0]
    q, k, v = (
        proj(hidden_states).reshape(rows, self.num_heads, -1).transpose(0, 1)
        for proj in (self.q_proj, self.k_proj, self.v_proj)
    )
    # torch's attention itself, whatever the config's implementation (all compute this softmax attention):
    # transformers' sdpa wrapper asks ``rows > 1`` of the packed rows, a number read from the mask
    dropout = self.attention_dropout if self.training else 0.0
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=same_window(cu_seqlens, rows), dropout_p=dropout, scale=self.scaling
    )
    out = out.transpose(0, 1)
    result: torch.Tensor = self.out_proj(out.reshape(rows, -1).contiguous())
    return result


SWAPS: dict[str, dict[str, Callable[..., Any]]] = {
    "qwen3_asr": {
        "get_audio_cu_seqlens": window_bounds,
        "Qwen3ASRAudioAttention.forward": windowed_attention_forward,
    }
}
"""transformers' model types, each with its functions or ``Class.method``s and the forms swapped in."""


@contextlib.contextmanager
def masked_audio_windows() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have the forms of this module."""
    with swapped_forms(SWAPS):
        yield
