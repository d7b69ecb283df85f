"""The converter registry: aten op overload -> plain converting function.

Each family module holds its converters and one dict ``CONVERTERS`` naming the overloads each serves.
The registry is their union, built once; a user's ``custom_converters`` take priority over it.
In-place overloads (``aten.add_.Tensor``) are served by their functional twin (``aten.add.Tensor``):
the interpreter rebinds the mutated value (see interpreter.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

Converter = Callable[..., Any]

# Family modules, in the order their tables are merged (a later table may not redefine an op).
_FAMILIES = (
    "elementwise",
    "activations",
    "comparison",
    "reductions",
    "creation",
    "shape_ops",
    "indexing",
    "linalg",
    "nn_ops",
    "normalization",
    "attention",
    "symbolic",
    "linalg_solve",
    "linalg_spectral",
    "special",
    "losses",
    "statistics",
    "random_ops",
    "complex_ops",
)


@cache
def registry() -> dict[Any, Converter]:
    """All built-in converters keyed by op overload (and by Python callables for sym ops)."""
    import importlib

    table: dict[Any, Converter] = {}
    for family in _FAMILIES:
        try:
            module = importlib.import_module(f"fastonnx.converters.{family}")
        except ModuleNotFoundError as e:
            if e.name == f"fastonnx.converters.{family}":
                continue  # family not written yet
            raise
        for op, fn in module.CONVERTERS.items():
            if op in table and table[op] is not fn:
                raise RuntimeError(f"{op} is registered twice ({table[op].__module__} and {family})")
            table[op] = fn
    return table


@cache
def named_registry() -> dict[str, Converter]:
    """Converters of ops other libraries define (torch.library), keyed by ``str(op)``: their OpOverload
    objects only exist once those libraries are imported."""
    from fastonnx.converters import detection
    from fastonnx.converters.library_ops import NAMED_CONVERTERS

    return {**NAMED_CONVERTERS, **detection.CONVERTERS}
