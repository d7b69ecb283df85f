"""The one way capture swaps transformers' model code for traceable forms (seq2seq_shifts.py,
speech_encoders.py): per model type, functions or ``Class.method``s of its modeling module replaced while
a block runs, and put back after, in every case. Only modules already imported are touched (a model not
loaded cannot call them)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Forms = Mapping[str, Mapping[str, Callable[..., Any]]]
"""transformers' model type (``transformers.models.<type>.modeling_<type>``) -> the name swapped (a
function, or ``Class.method`` of a class the module defines) -> the form swapped in."""


@contextlib.contextmanager
def swapped_forms(
    forms: Forms, wrap: Callable[[Callable[..., Any], Any], Any] | None = None
) -> Iterator[list[tuple[Any, str, Any]]]:
    """While active, the loaded modules of ``forms`` have them (``wrap(form, original)`` where given);
    yields the (owner, name, original) swapped."""
    swapped: list[tuple[Any, str, Any]] = []
    try:
        for model_type, by_name in forms.items():
            module = sys.modules.get(f"transformers.models.{model_type}.modeling_{model_type}")
            if module is None:
                continue
            for name, form in by_name.items():
                owner: Any = module
                if "." in name:  # a method, ``Class.method``, of a class the module defines
                    owner_name, name = name.split(".")
                    owner = vars(module).get(owner_name)
                if owner is None or not callable(vars(owner).get(name)):
                    continue
                original = vars(owner)[name]
                swapped.append((owner, name, original))
                setattr(owner, name, wrap(form, original) if wrap is not None else form)
        yield swapped
    finally:
        for owner, name, original in reversed(swapped):
            setattr(owner, name, original)


def as_transformers_forward(form: Callable[..., Any], original: Any = None) -> Any:
    """``form`` under the decorators transformers' model forwards carry (``merge_with_config_defaults``:
    the config's defaults of ``output_attentions``...; ``capture_outputs``: the hidden states and
    attentions recorded by hooks), for a ``wrap`` of a swapped ``forward``."""
    generic: Any = importlib.import_module("transformers.utils.generic")
    capturing: Any = importlib.import_module("transformers.utils.output_capturing")
    return generic.merge_with_config_defaults(capturing.capture_outputs(form))
