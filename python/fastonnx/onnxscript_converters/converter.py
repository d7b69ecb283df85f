"""The converter of one op whose translation is onnxscript's: the FX node's arguments handed to the
function (torch.onnx.export's conventions), the overload chosen by their types, the result handed back,
failures reported with the op, the FX node and the function."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnxscript
import onnxscript.evaluator

from fastonnx.context import ConversionContext
from fastonnx.errors import ConversionError, FastOnnxError, OpsetError
from fastonnx.onnxscript_converters.evaluator import (
    GraphEvaluator,
    SymbolicValue,
    _elem_name,
    allowed_elems,
    bind,
)

# onnxscript's default evaluator is one process-wide variable: one translation runs at a time
_LOCK = threading.RLock()
# the domain given to plain Python functions' signatures (used only to choose among overloads)
_TRACED = "pkg.fastonnx.traced"


def describe(fn: Any) -> str:
    """A function's name and where it is defined (``custom_add (model.py:12)``)."""
    name = getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or repr(fn)
    target = getattr(fn, "function", None) or getattr(fn, "func", None) or fn
    try:
        path = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return str(name)
    return f"{name} ({path}:{line})"


class Translation:
    """Converts the nodes of op ``key`` with ``functions``: onnxscript functions or Python functions
    calling onnxscript ops; several are overloads, the first whose signature takes the node's argument
    types is used."""

    def __init__(self, key: str, functions: Sequence[Any]) -> None:
        self.key = key
        self.functions = list(functions)
        self._signatures: dict[int, Any] = {}
        self.__name__ = self.__qualname__ = f"translation of {key}"

    def __repr__(self) -> str:
        return f"Translation({self.key!r}, [{', '.join(describe(f) for f in self.functions)}])"

    def __call__(self, ctx: ConversionContext, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            evaluator = GraphEvaluator(ctx)
            with onnxscript.evaluator.default_as(evaluator):
                o_args = [evaluator.from_fx(a) for a in args]
                # torch.onnx.export gives a dtype=None keyword as -1
                o_kwargs = {
                    k: -1 if k == "dtype" and v is None else evaluator.from_fx(v) for k, v in kwargs.items()
                }
                fn = self.choose(ctx, evaluator, o_args, o_kwargs)
                try:
                    result = evaluator.call(fn, o_args, o_kwargs)
                    return evaluator.to_fx(result)
                except Exception as e:
                    node = f"FX node {ctx.node.name!r}" if ctx.node is not None else "its node"
                    kind = OpsetError if isinstance(e, OpsetError) else ConversionError
                    why = str(e) if isinstance(e, FastOnnxError) else f"{type(e).__name__}: {e}"
                    raise kind(
                        f"{self.key}: the onnxscript function {describe(fn)} failed on {node}: {why}"
                    ) from e

    # ---- overloads -------------------------------------------------------------------------------------
    def signature(self, fn: Any) -> Any:
        """``fn``'s onnxscript signature (a plain function's as onnxscript reads its annotations), None
        when it cannot be read (the function then takes anything)."""
        key = id(fn)
        if key not in self._signatures:
            sig = getattr(fn, "op_signature", None)
            if sig is None:
                try:
                    sig = onnxscript.TracedOnnxFunction(onnxscript.values.Opset(_TRACED, 1), fn).op_signature
                except Exception:
                    sig = None
            self._signatures[key] = sig
        return self._signatures[key]

    def choose(
        self,
        ctx: ConversionContext,
        evaluator: GraphEvaluator,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> Any:
        """The first function whose signature takes the arguments' types (the only one without a
        choice); a ConversionError saying why each was passed over otherwise."""
        if len(self.functions) == 1:
            return self.functions[0]
        reasons = []
        for fn in self.functions:
            why = self._mismatch(fn, evaluator, args, kwargs)
            if why is None:
                return fn
            reasons.append(f"{describe(fn)}: {why}")
        node = f"FX node {ctx.node.name!r}" if ctx.node is not None else "the node"
        shown = ", ".join(_show(evaluator, a) for a in args)
        raise ConversionError(
            f"{self.key}: none of the {len(self.functions)} functions given takes the arguments of {node} "
            f"({shown}): " + "; ".join(reasons)
        )

    def _mismatch(
        self, fn: Any, evaluator: GraphEvaluator, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str | None:
        if not isinstance(fn, onnxscript.OnnxFunction):
            try:
                inspect.signature(fn).bind(*args, **kwargs)
            except TypeError as e:
                return str(e)
            except ValueError:
                pass  # no Python signature (a builtin): called as it is
        sig = self.signature(fn)
        if sig is None:
            return None
        try:
            inputs, attrs = bind(sig, args, {k: v for k, v in kwargs.items() if k in sig.params_map}, "it")
        except TypeError as e:
            return str(e)
        bound: dict[str, int] = {}
        for name, value in inputs.items():
            p = sig.params_map[name]
            if not isinstance(value, SymbolicValue):
                continue
            elem = evaluator.elem_type(value.name)
            if not elem:
                continue
            allowed = allowed_elems(p)
            if allowed and elem not in allowed:
                return f"{name} is {_elem_name(elem)}, it takes {_names(allowed)}"
            var = p.type_constraint.name
            if bound.setdefault(var, elem) != elem:
                return f"{name} is {_elem_name(elem)} but {var} is bound to {_elem_name(bound[var])}"
        for name, value in attrs.items():
            if value is None:
                continue
            if isinstance(value, SymbolicValue):
                return f"attribute {name} is given a tensor"
            if not _attribute_fits(int(sig.params_map[name].type), value):
                return f"attribute {name} ({sig.params_map[name].type.name}) is given {value!r}"
        return None


def _names(elems: set[int]) -> str:
    names = sorted(_elem_name(e) for e in elems)
    return " | ".join(names) if len(names) <= 6 else f"{' | '.join(names[:6])} | ..."


def _show(evaluator: GraphEvaluator, a: Any) -> str:
    if isinstance(a, SymbolicValue):
        elem = evaluator.elem_type(a.name)
        return _elem_name(elem) if elem else "tensor"
    return repr(a)


def _attribute_fits(attr_type: int, value: Any) -> bool:
    A = onnx.AttributeProto
    number = (int, float)
    if attr_type == A.INT:
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if attr_type == A.FLOAT:
        return isinstance(value, number)
    if attr_type == A.STRING:
        return isinstance(value, (str, bytes))
    if attr_type == A.INTS:
        return isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value)
    if attr_type == A.FLOATS:
        return isinstance(value, (list, tuple)) and all(isinstance(v, number) for v in value)
    if attr_type == A.STRINGS:
        return isinstance(value, (list, tuple)) and all(isinstance(v, (str, bytes)) for v in value)
    return True
