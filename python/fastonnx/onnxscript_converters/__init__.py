"""onnxscript functions as converters: the values of torch.onnx.export's ``custom_translation_table``.

A translation table maps a torch op to an onnxscript function (or a list of them, overloads chosen by
the node's input types). fastonnx turns each value into a converter (``converter.Translation``) that
the registry holds like any other custom converter:

- an ``@onnxscript.script`` function (``OnnxFunction``) is inlined: its FunctionProto's nodes are
  emitted into the graph (``inline.py``), attributes bound from the call and defaults filled;
- a plain Python function calling onnxscript ops (``op.Sub(self, other)``) runs on an onnxscript
  evaluator whose every op call emits a node into the graph (``evaluator.py``);
- every node is written for the opset its function names and emitted at the model's (``emit.py``:
  unchanged definitions pass, a moved attribute / input is moved, anything else is an OpsetError).

onnxscript is imported only here, by the submodules, and only once a value is recognised as
onnxscript's: this module's checks look at type and module names, never import it, so that
``import fastonnx`` (and an export without translation functions) does not load it.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

from fastonnx.context import Converter
from fastonnx.errors import InputError
from fastonnx.torch_internals import OpOverloadPacket

__all__ = ["is_onnxscript_object", "is_translation", "table_converters", "translation_converter"]


def is_onnxscript_object(value: object) -> bool:
    """Whether ``value`` is one of onnxscript's objects (an OnnxFunction, a TracedOnnxFunction, an
    opset...), told from its type's module without importing onnxscript."""
    return type(value).__module__.split(".", 1)[0] == "onnxscript"


def _onnxscript_thing(value: object) -> bool:
    if isinstance(value, types.ModuleType):
        return value.__name__.split(".", 1)[0] == "onnxscript"
    return is_onnxscript_object(value)


def _code_names(code: types.CodeType) -> set[str]:
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def refers_to_onnxscript(fn: object, depth: int = 3) -> bool:
    """Whether plain function ``fn`` uses onnxscript: it imports it, or a global or closure variable it
    reads is onnxscript's (an opset such as ``onnxscript.opset18``, a script function), directly or
    through the plain functions it calls (``depth`` levels)."""
    if not isinstance(fn, types.FunctionType):
        return False
    names = _code_names(fn.__code__)
    if any(n.split(".", 1)[0] == "onnxscript" for n in names):
        return True  # `import onnxscript` / `from onnxscript import ...` inside the function
    found: list[object] = [fn.__globals__[n] for n in names if n in fn.__globals__]
    for cell in fn.__closure__ or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    if any(_onnxscript_thing(v) for v in found):
        return True
    return depth > 0 and any(
        refers_to_onnxscript(v, depth - 1) for v in found if isinstance(v, types.FunctionType) and v is not fn
    )


def _first_parameter_is_a_context(fn: types.FunctionType) -> bool:
    code = fn.__code__
    if code.co_argcount == 0:
        return False
    first = code.co_varnames[0]
    annotation = fn.__annotations__.get(first)
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return first == "ctx" or text.endswith("ConversionContext")


def is_translation(value: object) -> bool:
    """Whether a ``custom_converters`` value is onnxscript's rather than a fastonnx converter: an
    onnxscript object, a list of overloads, or a plain function that uses onnxscript and whose first
    parameter is not a ``ctx`` (a fastonnx converter is ``fn(ctx, *args)``)."""
    if isinstance(value, (list, tuple)):
        return True
    if is_onnxscript_object(value):
        return True
    return (
        isinstance(value, types.FunctionType)
        and not _first_parameter_is_a_context(value)
        and refers_to_onnxscript(value)
    )


def _check_function(where: str, value: object) -> None:
    if is_onnxscript_object(value):
        if not callable(value):
            raise InputError(f"{where} is {value!r}, an onnxscript object that is not a function")
        return
    if not isinstance(value, types.FunctionType):
        raise InputError(
            f"{where} is {value!r}: a translation is an onnxscript function (@onnxscript.script) or a "
            "Python function calling onnxscript ops, or a list of them"
        )


def translation_converter(key: str, value: Any) -> Converter:
    """The converter running ``value`` (an onnxscript function, a Python function calling onnxscript
    ops, or a list of them: overloads chosen by the node's input types) for the op named ``key``."""
    functions: Sequence[Any] = list(value) if isinstance(value, (list, tuple)) else [value]
    if not functions:
        raise InputError(f"the translation of {key} is an empty list")
    for i, fn in enumerate(functions):
        _check_function(f"the translation of {key}" + (f" [{i}]" if len(functions) > 1 else ""), fn)
    if key.startswith("higher_order."):
        raise InputError(
            f"{key} is a higher-order op (its operands are subgraphs): onnxscript functions cannot convert it"
        )
    from fastonnx.onnxscript_converters.converter import Translation

    return Translation(key, functions)


def table_converters(table: Mapping[Any, Any]) -> dict[Any, list[Any]]:
    """A ``custom_translation_table`` as ``custom_converters`` entries: every value a list (the registry
    takes a list as onnxscript functions whatever it holds: a plain function in a table calls onnxscript
    ops by definition), checked here, before the capture; an overload packet (``torch.ops.aten.add``)
    stands for each of its overloads."""
    if not isinstance(table, Mapping):
        raise InputError(f"custom_translation_table must be a dict, got {type(table).__name__}")
    out: dict[Any, list[Any]] = {}
    for target, value in table.items():
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if not values:
            raise InputError(f"custom_translation_table[{target}] is an empty list")
        for fn in values:
            _check_function(f"custom_translation_table[{target}]", fn)
        if isinstance(target, OpOverloadPacket):
            for name in target.overloads():  # type: ignore[no-untyped-call]
                out[getattr(target, name)] = values
        else:
            out[target] = values
    return out
