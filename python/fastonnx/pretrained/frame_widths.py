"""The width of a frame of ``input_features`` as a speech model's own first layer reads it, where the
config's mel bins are not it: Granite Speech 5's encoder reads each mel frame with its delta, two frames
stacked (``nn.Linear(config.num_mel_bins * 4, ...)``: its feature extractor writes 4 x 80 values a frame,
its config says 80)."""

from __future__ import annotations

import inspect
import re

import torch

_HANDED = re.compile(r"self\.(\w+)\(\s*(?:input_features=)?input_features\b")
"""A forward handing ``input_features`` on, first argument, to one of its submodules."""


def first_layer_width(model: torch.nn.Module) -> int | None:
    """``in_features`` of the ``nn.Linear`` the forward applies to ``input_features`` itself, following
    the submodules it hands them to (GraniteSpeech5ForCTC: its encoder, then its ``input_linear``); None
    where the first module they reach is no linear layer (a convolution, a norm, a projection block)."""
    module = model
    for _ in range(8):  # a few wrappers deep at most
        try:
            source = inspect.getsource(inspect.unwrap(type(module).forward))
        except (OSError, TypeError):
            return None
        handed = _HANDED.search(source)
        child = getattr(module, handed.group(1), None) if handed else None
        if isinstance(child, torch.nn.Linear):
            return int(child.in_features)
        if not isinstance(child, torch.nn.Module):
            return None
        module = child
    return None
