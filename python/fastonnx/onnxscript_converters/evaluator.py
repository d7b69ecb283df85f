"""An onnxscript evaluator that emits into fastonnx's graph instead of computing.

onnxscript dispatches every op call (``op.Sub(a, b)``) and every call of a script function to the
current default evaluator (``onnxscript.evaluator.default_as``). ``GraphEvaluator`` is that evaluator
while a translation runs: an op call becomes one node of the graph being built (its inputs graph
values, Python numbers and lists made constants of the type the op's signature binds, keyword
arguments attributes), a script function is inlined from its FunctionProto (``inline.py``), and the
results are ``SymbolicValue``s: what an onnxscript function sees of a graph value (``name``,
``dtype``, ``shape``, arithmetic operators).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxscript
import onnxscript.evaluator
import torch
from onnxscript import ir

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Value
from fastonnx.errors import ConversionError
from fastonnx.onnxscript_converters.inline import Inliner, coerce
from fastonnx.onnxscript_converters.script_nodes import (
    _constant_value,
    as_tensor_proto,
    emit_script_node,
    is_tensor_like,
)

_DEFAULT_ELEM = {bool: onnx.TensorProto.BOOL, int: onnx.TensorProto.INT64, float: onnx.TensorProto.FLOAT}


class SymbolicValue:
    """A value of the graph being built, as an onnxscript function sees it: ``name``, ``dtype`` (an
    ``onnx_ir.DataType``, None when unknown), ``shape`` (an ``onnx_ir.Shape``, None when unknown), both
    settable (a custom op's output types), and the arithmetic operators as ONNX ops. Its value is not
    known while exporting: Python control flow on it (``if x:``) is refused."""

    __slots__ = ("_evaluator", "name")

    def __init__(self, name: str, evaluator: GraphEvaluator) -> None:
        self.name = name
        self._evaluator = evaluator

    @property
    def dtype(self) -> Any:
        elem = self._evaluator.elem_type(self.name)
        return ir.DataType(elem) if elem else None

    @dtype.setter
    def dtype(self, value: Any) -> None:
        g = self._evaluator.ctx.g
        g.set_type(self.name, int(value), self._evaluator.dims(self.name))

    @property
    def shape(self) -> Any:
        dims = self._evaluator.dims(self.name)
        return None if dims is None else ir.Shape(dims)

    @shape.setter
    def shape(self, value: Any) -> None:
        dims: list[int | str | None] = []
        for d in value:
            if isinstance(d, int) or d is None:
                dims.append(d)
            else:
                symbolic = getattr(d, "value", d)
                dims.append(symbolic if isinstance(symbolic, (int, str)) else None)
        self._evaluator.ctx.g.set_type(self.name, self._evaluator.elem_type(self.name), dims)

    @property
    def rank(self) -> int | None:
        dims = self._evaluator.dims(self.name)
        return None if dims is None else len(dims)

    def __repr__(self) -> str:
        return f"SymbolicValue({self.name!r}, dtype={self.dtype!r}, shape={self._evaluator.dims(self.name)})"

    def __bool__(self) -> bool:
        raise TypeError(
            f"the value of {self.name!r} is not known while exporting: use ONNX ops (op.Where, op.If in "
            "an @onnxscript.script function) instead of Python control flow on a tensor"
        )

    def _op(self, op_type: str, *args: Any) -> Any:
        return self._evaluator.default_op(op_type, *args)

    def __add__(self, other: Any) -> Any:
        return self._op("Add", self, other)

    def __radd__(self, other: Any) -> Any:
        return self._op("Add", other, self)

    def __sub__(self, other: Any) -> Any:
        return self._op("Sub", self, other)

    def __rsub__(self, other: Any) -> Any:
        return self._op("Sub", other, self)

    def __mul__(self, other: Any) -> Any:
        return self._op("Mul", self, other)

    def __rmul__(self, other: Any) -> Any:
        return self._op("Mul", other, self)

    def __truediv__(self, other: Any) -> Any:
        return self._op("Div", self, other)

    def __rtruediv__(self, other: Any) -> Any:
        return self._op("Div", other, self)

    def __pow__(self, other: Any) -> Any:
        return self._op("Pow", self, other)

    def __matmul__(self, other: Any) -> Any:
        return self._op("MatMul", self, other)

    def __neg__(self) -> Any:
        return self._op("Neg", self)

    def __lt__(self, other: Any) -> Any:
        return self._op("Less", self, other)

    def __le__(self, other: Any) -> Any:
        return self._op("LessOrEqual", self, other)

    def __gt__(self, other: Any) -> Any:
        return self._op("Greater", self, other)

    def __ge__(self, other: Any) -> Any:
        return self._op("GreaterOrEqual", self, other)


def _leaves(value: Any) -> Iterator[SymbolicValue]:
    if isinstance(value, SymbolicValue):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)


# ---- signatures --------------------------------------------------------------------------------------
def bind(
    sig: Any, args: Sequence[Any], kwargs: Mapping[str, Any], what: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The call's arguments by the function's signature (an ``onnx_ir.schemas.OpSignature``): the
    inputs and the attributes by name, defaults filled (None: an omitted optional input, an attribute
    left to the function's default). Keyword arguments the signature does not name are dropped, as
    torch.onnx.export drops them."""
    params = list(sig.params)
    if len(args) > len(params):
        raise TypeError(f"{what} takes {len(params)} arguments, {len(args)} were given")
    given = {p.name: a for p, a in zip(params, args)}
    for key, value in kwargs.items():
        if key not in sig.params_map:
            continue
        if key in given:
            raise TypeError(f"{what} got argument {key!r} twice")
        given[key] = value
    inputs: dict[str, Any] = {}
    attrs: dict[str, Any] = {}
    for p in params:
        if p.name in given:
            value = given[p.name]
        elif p.has_default():
            default = p.default
            value = default if p.is_param() else getattr(default, "value", default)
        elif p.required:
            raise TypeError(f"{what} misses its argument {p.name!r}")
        else:
            value = None
        (inputs if p.is_param() else attrs)[p.name] = value
    return inputs, attrs


def allowed_elems(param: Any) -> set[int]:
    """The tensor element types a signature parameter accepts."""
    return {int(t.dtype) for t in param.type_constraint.allowed_types if isinstance(t, ir.TensorType)}


def sequence_only(param: Any) -> bool:
    allowed = param.type_constraint.allowed_types
    return bool(allowed) and all(isinstance(t, ir.SequenceType) for t in allowed)


def _elem_name(elem: int) -> str:
    return str(onnx.TensorProto.DataType.Name(elem))


# ---- the evaluator -----------------------------------------------------------------------------------
_PROTOS: weakref.WeakKeyDictionary[Any, tuple[onnx.FunctionProto, dict[tuple[str, str], onnx.FunctionProto]]]
_PROTOS = weakref.WeakKeyDictionary()


def function_protos(
    function: Any,
) -> tuple[onnx.FunctionProto, dict[tuple[str, str], onnx.FunctionProto]]:
    """A script function's FunctionProto and those of the script functions it calls (by domain and
    name), made once per function."""
    try:
        return _PROTOS[function]
    except (KeyError, TypeError):
        pass
    proto = function.to_function_proto()
    called: dict[tuple[str, str], onnx.FunctionProto] = {}
    stack = [function]
    while stack:
        f = stack.pop()
        for callee in f.function_ir.get_called_functions().values():
            p = callee.to_function_proto()
            if (p.domain, p.name) not in called:
                called[(p.domain, p.name)] = p
                stack.append(callee)
    try:
        _PROTOS[function] = (proto, called)
    except TypeError:
        pass
    return proto, called


class GraphEvaluator(onnxscript.evaluator.Evaluator):
    """The onnxscript evaluator of one translation call: ops and script functions emit into
    ``ctx.g`` (see the module docstring)."""

    def __init__(self, ctx: ConversionContext) -> None:
        self.ctx = ctx
        # types of the FX node's values, for a builder that does not hold them (a subgraph's)
        self.known: dict[str, tuple[int, list[int | str | None]]] = {}

    # ---- values --------------------------------------------------------------------------------------
    def value(self, name: str) -> SymbolicValue:
        return SymbolicValue(name, self)

    def elem_type(self, name: str) -> int | None:
        elem = self.ctx.g.dtype(name)
        if elem:
            return elem
        known = self.known.get(name)
        return known[0] if known is not None else None

    def type_of(self, name: str) -> tuple[int, list[int | str | None] | None] | None:
        """The type of one of the FX node's values the builder does not hold (emit's lookup)."""
        known = self.known.get(name)
        return (known[0], list(known[1])) if known is not None else None

    def dims(self, name: str) -> list[int | str | None] | None:
        dims = self.ctx.g.shape(name)
        if dims is not None:
            return dims
        known = self.known.get(name)
        return list(known[1]) if known is not None else None

    def from_fx(self, a: Any) -> Any:
        """An FX argument as onnxscript functions take it (torch.onnx.export's conventions): a value
        is a SymbolicValue, a dtype its ONNX element type, a device / layout / memory format its text."""
        if isinstance(a, Value):
            elem, dims = self.ctx.onnx_type(a.dtype, a.shape)
            self.known[a.name] = (elem, dims)
            return self.value(a.name)
        if isinstance(a, (list, tuple)):
            return [self.from_fx(x) for x in a]
        if isinstance(a, torch.dtype):
            return dtypes.to_onnx_dtype(a)
        if isinstance(a, (torch.device, torch.memory_format, torch.layout)):
            return str(a)
        return a

    def to_fx(self, result: Any) -> Any:
        """A function's result as the converter's: value names (a list for several outputs)."""
        out = self.ctx.out
        if isinstance(result, (list, tuple)):
            items = [self._fx_value(r) for r in result]
            if not isinstance(out, (list, tuple)) and len(items) == 1:
                return items[0]
            return items
        value = self._fx_value(result)
        return [value] if isinstance(out, (list, tuple)) else value

    def _fx_value(self, r: Any) -> str | None:
        if r is None:
            return None
        if isinstance(r, SymbolicValue):
            return r.name
        out = self.ctx.out
        if isinstance(out, (list, tuple)):
            out = out[0] if out else None
        elem = dtypes.to_onnx_dtype(out.dtype) if isinstance(out, torch.Tensor) else None
        return self.constant(r, elem)

    # ---- constants -----------------------------------------------------------------------------------
    def constant(self, value: Any, elem: int | None) -> str:
        """A Python number / list, numpy array, torch tensor or TensorProto as a constant; Python
        values take ``elem`` (default: bool, int64 or float32 by their Python type)."""
        if isinstance(value, SymbolicValue):
            return value.name
        if isinstance(value, torch.Tensor):
            return self.ctx.const(value, value.dtype)
        if is_tensor_like(value):
            proto = as_tensor_proto(value)
            return emit_script_node(
                self.ctx, "Constant", "", None, [], {"value": proto}, ["const"], self.type_of
            )[0]
        if isinstance(value, str) or (
            isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value)
        ):
            raise ConversionError(f"{value!r}: a string cannot be a tensor input")
        if elem is None:
            elem = _DEFAULT_ELEM[type(_first(value))] if _first(value) is not None else onnx.TensorProto.INT64
        return self.ctx.const(value, dtypes.to_torch_dtype(elem))

    def inputs(self, pairs: Sequence[tuple[Any, Any]]) -> list[str]:
        """Input names for (signature parameter or None, argument) pairs: Python numbers and lists
        become constants of the type their parameter's type variable is bound to by the other inputs
        (``Add(x, 1)``: x's), else of the one type the parameter allows, else of their Python type, cast
        like an input of unknown type sharing the variable."""
        bound: dict[str, int] = {}
        anchors: dict[str, str] = {}
        for p, v in pairs:
            if p is None:
                continue
            var = p.type_constraint.name
            for s in _leaves(v):
                elem = self.elem_type(s.name)
                if elem:
                    bound.setdefault(var, elem)
                else:
                    anchors.setdefault(var, s.name)
        return [self._input(p, v, bound, anchors) for p, v in pairs]

    def _input(self, p: Any, v: Any, bound: Mapping[str, int], anchors: Mapping[str, str]) -> str:
        if v is None:
            return ""
        if isinstance(v, SymbolicValue):
            return v.name
        if isinstance(v, (list, tuple)) and any(isinstance(x, SymbolicValue) for x in v):
            if all(isinstance(x, SymbolicValue) for x in v) and (p is None or sequence_only(p)):
                return emit_script_node(
                    self.ctx, "SequenceConstruct", "", None, [x.name for x in v], {}, 1, self.type_of
                )[0]
            return self._shape_list(v)
        elem: int | None = None
        var = p.type_constraint.name if p is not None else None
        if var is not None and var in bound:
            elem = bound[var]
        elif p is not None and len(allowed_elems(p)) == 1:
            (elem,) = allowed_elems(p)
        elif p is not None and isinstance(_first(v), (int, float)) and not isinstance(_first(v), bool):
            allowed = allowed_elems(p)
            default = _DEFAULT_ELEM[type(_first(v))]
            if allowed and default not in allowed and onnx.TensorProto.FLOAT in allowed:
                elem = onnx.TensorProto.FLOAT
        name = self.constant(v, elem)
        if elem is None and var is not None and var in anchors and not is_tensor_like(v):
            name = emit_script_node(
                self.ctx, "CastLike", "", None, [name, anchors[var]], {}, 1, self.type_of
            )[0]
        return name

    def _shape_list(self, items: Sequence[Any]) -> str:
        """A list of ints and 0-d / 1-element int values (a shape) as one 1-D int64 tensor."""
        parts: list[int | str] = []
        for x in items:
            if isinstance(x, SymbolicValue):
                name = x.name
                if self.elem_type(name) not in (None, onnx.TensorProto.INT64):
                    name = emit_script_node(
                        self.ctx, "Cast", "", None, [name], {"to": onnx.TensorProto.INT64}, 1, self.type_of
                    )[0]
                parts.append(self.ctx.unsqueeze0(name) if self.ctx.rank(name) != 1 else name)
            elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                parts.append(int(x))
            else:
                raise ConversionError(f"{items!r} mixes graph values with {x!r}: only ints can be mixed in")
        return self.ctx.concat_dims(parts)

    def attribute(self, key: str, value: Any, param: Any, what: str) -> Any:
        """A keyword argument as an attribute value (None: left out)."""
        if isinstance(value, ir.Attr):  # onnx_ir's attribute (ir.AttrInt64s(...)): its value
            value = value.value
        if value is None:
            return None
        if isinstance(value, SymbolicValue):
            constant = _constant_value(self.ctx.g, value.name)
            if constant is None:
                raise ConversionError(
                    f"{what}: attribute {key!r} was given the graph value {value.name!r}; an attribute "
                    "must be a constant"
                )
            value = constant
        if type(value).__name__ == "OnnxClosure" or (callable(value) and not isinstance(value, type)):
            raise ConversionError(
                f"{what}: attribute {key!r} is a function (a graph attribute): write the op in an "
                "@onnxscript.script function, whose If / Loop / Scan bodies fastonnx inlines"
            )
        if param is not None and param.is_attribute():
            return coerce(value, int(param.type), f"{what}'s attribute {key}")
        if is_tensor_like(value):
            return as_tensor_proto(value)
        return value

    # ---- onnxscript's Evaluator protocol ------------------------------------------------------------
    def eval_op(self, op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """One op call: one node (see the module docstring)."""
        sig = op.op_signature
        schema = op.op_schema
        kwargs = dict(kwargs)
        explicit = kwargs.pop("_outputs", None)
        formals = list(sig.inputs) if sig is not None else []
        pairs: list[tuple[Any, Any]] = []
        for i, a in enumerate(args):
            if i < len(formals):
                pairs.append((formals[i], a))
            elif formals and formals[-1].variadic:
                pairs.append((formals[-1], a))
            elif sig is None:
                pairs.append((None, a))
            else:
                raise TypeError(f"{op.name} takes {len(formals)} inputs, {len(args)} were given")
        attrs: dict[str, Any] = {}
        for key, value in kwargs.items():
            p = sig.params_map.get(key) if sig is not None else None
            if p is not None and p.is_param():
                index = formals.index(p)
                while len(pairs) <= index:
                    pairs.append((formals[len(pairs)], None))
                pairs[index] = (p, value)
            else:
                attrs[key] = self.attribute(key, value, p, op.name)
        names = self.inputs(pairs)
        count = explicit if explicit is not None else _num_outputs(op.name, op.domain, schema, pairs, attrs)
        outs = emit_script_node(
            self.ctx, op.name, op.domain, op.opset.version, names, attrs, int(count), self.type_of
        )
        values = [self.value(n) for n in outs]
        return values[0] if len(values) == 1 else tuple(values)

    def eval_function(self, function: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """A script function's call: inlined from its FunctionProto (a ``traceable`` one runs its
        Python body on this evaluator, as torch.onnx.export does)."""
        sig = function.op_signature
        what = f"function {function.name}"
        named_inputs, named_attrs = bind(sig, args, kwargs, what)
        if getattr(function, "traceable", False):
            order = list(named_inputs)
            names = self.inputs([(sig.params_map[k], named_inputs[k]) for k in order])
            py_inputs = {k: (self.value(n) if n else None) for k, n in zip(order, names)}
            return function.function(**py_inputs, **named_attrs)
        proto, called = function_protos(function)
        pairs = [(sig.params_map.get(k), named_inputs.get(k)) for k in proto.input]
        names = self.inputs(pairs)
        attrs = {
            k: self.attribute(k, v, sig.params_map.get(k), what)
            for k, v in named_attrs.items()
            if v is not None
        }
        outs = Inliner(self.ctx, called, self.type_of).call(proto, names, attrs)
        values = [self.value(n) for n in outs]
        return values[0] if len(values) == 1 else tuple(values)

    # ---- helpers ---------------------------------------------------------------------------------------
    def call(self, fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Run translation function ``fn`` (under ``default_as(self)``, set by the caller)."""
        if isinstance(fn, onnxscript.OnnxFunction):
            return self.eval_function(fn, args, kwargs)
        return fn(*args, **kwargs)

    def default_op(self, op_type: str, *args: Any) -> Any:
        """``op_type`` of the model's default-domain opset, applied to ``args`` (operators on values)."""
        opset = onnxscript.values.Opset("", self.ctx.opset)
        return self.eval_op(onnxscript.values.Op(opset, op_type), args, {})


def _first(value: Any) -> Any:
    while isinstance(value, (list, tuple)):
        if not value:
            return None
        value = value[0]
    return value


def _num_outputs(
    op_type: str, domain: str, schema: Any, pairs: Sequence[tuple[Any, Any]], attrs: Mapping[str, Any]
) -> int:
    """How many outputs a node gets: every output of its definition (a single one for an op ONNX does
    not define, unless ``_outputs=`` says), with onnxscript's rules for the ops whose count depends on
    the call (BatchNormalization outside training, Split)."""
    if schema is None:
        return 1
    if domain in ("", "ai.onnx"):
        if op_type == "BatchNormalization" and not attrs.get("training_mode", 0):
            return 1
        if op_type == "Split":
            if attrs.get("num_outputs") is not None:
                return int(attrs["num_outputs"])
            if len(pairs) > 1 and isinstance(pairs[1][1], (list, tuple)):
                return len(pairs[1][1])
            raise ConversionError(
                "Split: give num_outputs= (or the split sizes as a Python list): the number of outputs "
                "is not known otherwise"
            )
    return len(schema.outputs)
