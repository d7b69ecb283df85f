"""EnCodec's padded convolutions, swapped while torch.export captures for a form that computes the same
function at every length without a data-dependent guard.

``EncodecConv1d.forward`` computes its extra right padding from tensor buffers (``stride``,
``kernel_size``, ``padding_total``: ``ceil`` of a float division of the length), so the padding is a
tensor value, and its reflect padding (``_pad1d``) branches on ``length <= max(pads)``: a guard on data.
``encodec_conv1d_by_sizes`` computes the same paddings from the convolution's own ints (the buffers are
made from them): the extra padding ``ceil(L / stride) * stride - L`` is ``(-L) mod stride``, 0 for a
stride of 1 (every convolution of EnCodec's decoder); and the reflection (``F.pad``'s needs pads shorter
than the input, transformers appends zeros to a short one first and cuts them after) is one gather of
reflected positions over the zero-extended length, the same values at every length.

Only the modules already imported are swapped (model_swaps.py), for the duration of the capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms


def reflect_pad_any_length(hidden_states: torch.Tensor, left: Any, right: Any) -> torch.Tensor:
    """``EncodecConv1d._pad1d`` in reflect mode as one gather: zeros appended up to ``max(left, right) + 1``
    where the input is shorter (reflection needs that), positions reflected over that length, the
    appended zeros' reflected share cut again (the output is ``left + L + right`` long)."""
    length = hidden_states.shape[-1]
    extended = torch.sym_max(length, max(left, right) + 1)
    device = hidden_states.device
    source = (torch.arange(left + length + right, device=device) - left).abs()
    source = torch.where(source >= extended, 2 * (extended - 1) - source, source)
    inside = source < length
    picked = hidden_states.index_select(-1, torch.where(inside, source, 0))
    return torch.where(inside, picked, 0.0)


def encodec_conv1d_by_sizes(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``EncodecConv1d.forward`` with its paddings from the convolution's ints, not its tensor buffers."""
    conv = self.conv
    stride = int(conv.stride[0])
    total = (int(conv.kernel_size[0]) - 1) * int(conv.dilation[0]) + 1 - stride
    extra = (-hidden_states.shape[-1]) % stride  # ceil(L / stride) * stride - L
    if self.causal:
        left, right = total, extra
    else:  # asymmetric for odd strides
        left, right = total - total // 2, total // 2 + extra
    if self.pad_mode == "reflect":
        hidden_states = reflect_pad_any_length(hidden_states, left, right)
    else:
        hidden_states = torch.nn.functional.pad(hidden_states, (left, right), self.pad_mode)
    hidden_states = conv(hidden_states)
    if self.norm_type == "time_group_norm":
        hidden_states = self.norm(hidden_states)
    return hidden_states


SWAPS = {"encodec": {"EncodecConv1d.forward": encodec_conv1d_by_sizes}}
"""transformers' model types and the ``Class.method``s swapped (model_swaps.py)."""


@contextlib.contextmanager
def guard_free_codec_paddings() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have their guard-free forms."""
    with swapped_forms(SWAPS):
        yield
