"""transformers run with its sorts stable, for the package check.

An unstable sort (``torch.sort`` / ``argsort`` with ``stable=False``, their default) may order equal
elements any way: torch's CPU kernel gives an arbitrary order, the graph's TopK puts the lower index
first (ONNX's rule), which is also what a stable sort gives. A model sorting values with ties
(PP-DocLayout V2 sorts its boxes by a 0/1 mask) then returns another permutation in each, both valid
results of the function it calls. The check compares against the one the graph computes: the
reference forward runs with every sort stable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_SORTS = frozenset({torch.sort, torch.argsort, torch.Tensor.sort, torch.Tensor.argsort})
_AFTER_INPUT = ("dim", "descending")
"""The arguments after the input that may come positionally: with ``stable``, sort takes them by name."""


class StableSorts(TorchFunctionMode):
    """Within it, every ``sort`` and ``argsort`` is stable."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _SORTS and len(args) <= 1 + len(_AFTER_INPUT):
            kwargs.update(zip(_AFTER_INPUT, args[1:], strict=False))
            kwargs["stable"] = True
            args = args[:1]
        return func(*args, **kwargs)
