"""The width of a frame of ``input_features`` as a speech model's own first layer reads it, where the
config's mel bins are not it: Granite Speech 5's encoder reads each mel frame with its delta, two frames
stacked (``nn.Linear(config.num_mel_bins * 4, ...)``: its feature extractor writes 4 x 80 values a frame,
its config says 80). Also the channels of a waveform a codec reads as ``batch x channels x samples``
(EnCodec, DAC, Mimi: ``waveform_channels``), where a speech encoder reads ``batch x samples``, and the mel bins
of frames an encoder reads bins first (GLM-ASR's: ``bins_first_width``)."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

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


_WAVEFORM_SHAPE = re.compile(
    r"input_values \(`[^`]*` of shape `\(batch_size, (1|channels|audio_channels), \w+\)`"
)
"""A forward's docstring giving ``input_values`` a channels axis (transformers' own shape of its input)."""


def _handed_to(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str] | None:
    """The attribute of ``module`` its forward first calls on its argument ``name`` as it came (first
    argument or keyword), and that callee's first parameter; None where the forward rebinds ``name``
    first (Moonshine's ``input_values.unsqueeze(1)``) or hands it to no attribute."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(type(module).forward))))
    except (OSError, TypeError, SyntaxError):
        return None
    events: list[tuple[int, int, str]] = []  # where: a rebinding takes effect after its value
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                events.append((node.end_lineno or node.lineno, node.end_col_offset or 0, ""))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, args = node.func.value, [*node.args[:1], *(k.value for k in node.keywords)]
            if isinstance(owner, ast.Name) and owner.id == "self":
                if any(isinstance(a, ast.Name) and a.id == name for a in args):
                    events.append((node.lineno, node.col_offset, node.func.attr))
    if not events or not (attribute := min(events)[2]):
        return None
    child = getattr(module, attribute, None)
    if not isinstance(child, torch.nn.Module):
        return None
    return child, next(iter(inspect.signature(child.forward).parameters), "")


def waveform_channels(model: torch.nn.Module, config: object) -> int | None:
    """The channels of the ``batch x channels x samples`` waveform a codec reads as ``input_values``: its
    forward's documented shape (EnCodec's ``(batch_size, channels, sequence_length)``, the config's
    ``audio_channels`` or ``channels``; DAC's ``(batch_size, 1, time_steps)``), else the ``in_channels`` of
    an ``nn.Conv1d`` the waveform is handed to as it is (Perception Encoder's audio encoder: its DAC
    encoder's first convolution). None for a model reading ``batch x samples`` (Wav2Vec2's and
    Moonshine's encoders add the channel themselves)."""
    documented = _WAVEFORM_SHAPE.search(inspect.getdoc(type(model).forward) or "")
    if documented is not None:
        axis = documented.group(1)
        if axis.isdigit():
            return int(axis)
        for key in ("audio_channels", "channels"):
            if isinstance(value := getattr(config, key, None), int):
                return value
        return 1
    return _first_convolution(model, "input_values")


def bins_first_width(model: torch.nn.Module) -> int | None:
    """The mel bins of the frames an encoder reads bins first (``batch x bins x frames``: GLM-ASR's and
    Voxtral Realtime's encoders hand ``input_features`` to an ``nn.Conv1d`` as they come), the convolution's
    ``in_channels``; None where the features reach no convolution as they are (frames first)."""
    return _first_convolution(model, "input_features")


def _first_convolution(model: torch.nn.Module, name: str) -> int | None:
    """``in_channels`` of the ``nn.Conv1d`` the forward's input ``name`` reaches unchanged through the
    submodules it is handed to; None where it reaches none."""
    module = model
    for _ in range(8):  # a few wrappers deep at most
        handed = _handed_to(module, name)
        if handed is None:
            return None
        module, name = handed
        if isinstance(module, torch.nn.Conv1d):
            return int(module.in_channels)
    return None
