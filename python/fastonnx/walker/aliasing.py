"""Writes through views, without re-tracing the program.

torch.export's graph is not functional: ``y[:, 1:] = v`` is ``slice`` then ``copy_`` into the slice, and
the write changes ``y``. ONNX values are immutable, so the walker keeps, for every view, its base and the
view op it came from, and converts an in-place op on a view in three steps:

1. the op's functional twin gives the view's new contents;
2. each view op of the chain back to the base is inverted ("the parent with this view replaced"):
   ``ScatterElements`` along the sliced / selected dim, a ``Reshape`` for reshaping views, the inverse
   ``Transpose`` for transposes;
3. the base is rebound to the result. Views of the base read later are recomputed from the new base
   (their version is stale), and an in-place op's own result is an alias of what it wrote.

A mutated graph input or buffer becomes an extra graph output, ``mutated.<name>``, as torch's
functionalization would make it. What the walker cannot prove right here (a write through another
view op — ``diagonal``, ``as_strided``, ``unfold``, ``split`` / ``chunk`` pieces, ``expand`` —, an op
mutating an argument other than its first, a mutated parameter or constant, a complex tensor written
in place) is left to
``ExportedProgram.run_decompositions({})``; ``unsupported_mutation`` says why, and ``to_onnx`` records
it in ``stats["functionalized"]``.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export.graph_signature import InputKind

from fastonnx.context import ConversionContext, Value
from fastonnx.errors import ConversionError
from fastonnx.registry import functional_key, op_key
from fastonnx.torch_internals import OpOverload, op_schema

# views whose inverse is a Reshape of the new contents to the parent's shape
RESHAPING_VIEWS = frozenset(
    {
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.reshape.default",
        "aten.flatten.using_ints",
        "aten.unflatten.int",
        "aten.unsqueeze.default",
        "aten.squeeze.default",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.alias.default",
    }
)
TRANSPOSING_VIEWS = frozenset({"aten.transpose.int", "aten.permute.default", "aten.t.default"})
SLICING_VIEWS = frozenset({"aten.slice.Tensor", "aten.narrow.default", "aten.select.int"})
WRITABLE_VIEWS = RESHAPING_VIEWS | TRANSPOSING_VIEWS | SLICING_VIEWS


def is_view(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result shares its first argument's memory (torch's schema says so)."""
    return node.op == "call_function" and bool(getattr(node.target, "is_view", False))


def is_in_place(node: torch.fx.Node) -> bool:
    """An in-place overload (``aten.add_.Tensor``): it writes its first argument and returns it."""
    return isinstance(node.target, OpOverload) and functional_key(op_key(node.target)) is not None


def _mutated_args(node: torch.fx.Node) -> list[Any]:
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            if a.kwarg_only or i >= len(node.args):
                out.append(node.kwargs.get(a.name))
            else:
                out.append(node.args[i])
    return out


def unsupported_mutation(ep: torch.export.ExportedProgram) -> str | None:
    """Why a mutation in ``ep`` needs torch's functionalization, or None when the walker writes every
    one of them itself (see the module docstring)."""
    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        mutated = _mutated_args(node)
        if not mutated:
            continue
        first = node.args[0] if node.args else None
        if not is_in_place(node) or len(mutated) != 1 or mutated[0] is not first:
            return f"{node.name} ({node.target}) mutates an argument other than its first"
        if not isinstance(first, torch.fx.Node):
            return f"{node.name} ({node.target}) mutates a non-tensor argument"
        val = first.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype.is_complex:
            return f"{node.name} ({node.target}) mutates {first.name}, a complex tensor"
        target: Any = first
        while True:
            if target.op == "placeholder":
                kind = kinds.get(target.name, InputKind.USER_INPUT)
                if kind not in (InputKind.USER_INPUT, InputKind.BUFFER):
                    return f"{node.name} ({node.target}) mutates {target.name}, a {kind.name.lower()}"
                break
            if target.op != "call_function":
                break
            if is_in_place(target):
                target = target.args[0]  # an in-place op returns what it wrote
            elif is_view(target):
                key = op_key(target.target)
                if key not in WRITABLE_VIEWS:
                    return (
                        f"{node.name} ({node.target}) writes through {target.name} ({target.target}), "
                        "a view fastonnx does not write through"
                    )
                target = target.args[0]
            elif target.target is operator.getitem and is_view(target.args[0]):
                return (
                    f"{node.name} ({node.target}) writes through {target.name}, a piece of "
                    f"{target.args[0]} ({target.args[0].target})"
                )
            else:
                break
            if not isinstance(target, torch.fx.Node):
                return f"{node.name} ({node.target}) writes through a view of a non-tensor"
    return None


def _normalized(ctx: ConversionContext, index: Any, size: Any, clamp: bool) -> Any:
    """A Python-style index (negative counts from the end) as a position in ``[0, size]``; an int when
    both are ints, else a 0-d int64 value."""
    if isinstance(index, int) and isinstance(size, int):
        at = index + size if index < 0 else index
        return min(max(at, 0), size) if clamp else at
    i = ctx.cast(index, torch.int64) if not isinstance(index, int) else ctx.i64(index)
    n = ctx.sym_value(size) if not isinstance(size, int) else ctx.i64(size)
    zero = ctx.i64(0)
    pos = ctx.op("Where", ctx.op("Less", i, zero), ctx.op("Add", i, n), i)
    if clamp:
        pos = ctx.op("Min", ctx.op("Max", pos, zero), n)
    return pos


def _positions(ctx: ConversionContext, new: Value, dim: int, start: Any, step: int) -> str:
    """int64 indices of ``new``'s shape holding start + step * i along ``dim`` (ScatterElements')."""
    length = ctx.op("Shape", new, start=dim, end=dim + 1)
    count = ctx.op("Squeeze", length, ctx.i64([0]))
    steps = ctx.op("Range", ctx.i64(0), count, ctx.i64(1))
    first = start if isinstance(start, str) else ctx.i64(start)
    along = ctx.op("Add", ctx.op("Mul", steps, ctx.i64(step)), first)
    shape = [1] * new.rank
    shape[dim] = -1
    along = ctx.op("Reshape", along, ctx.i64(shape))
    return ctx.op("Expand", along, ctx.op("Shape", new))


def bound_args(node: torch.fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The op's arguments in schema order, keyword ones and defaults included."""
    schema = op_schema(node.target)
    out = []
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        else:
            out.append(a.default_value if a.has_default_value() else None)
    return out


def write_into(
    ctx: ConversionContext, view: torch.fx.Node, args: list[Any], parent: Value, new: Value
) -> str:
    """``parent`` with the part that ``view`` shows replaced by ``new``; ``args`` are the view op's
    mapped arguments in schema order (``bound_args``), ``args[0]`` the parent."""
    key = op_key(view.target)
    rank = parent.rank
    if key in RESHAPING_VIEWS:
        static = parent.static_shape()
        shape = ctx.i64(list(static)) if static is not None else ctx.op("Shape", parent)
        # allowzero: a 0 in the parent's shape is an empty dim, not "copy the input's dim"
        return ctx.op("Reshape", new, shape, allowzero=1)
    if key in TRANSPOSING_VIEWS:
        if key == "aten.permute.default":
            perm = [d % rank for d in args[1]]
        else:
            perm = list(range(rank))
            if key == "aten.transpose.int":
                a, b = args[1] % rank, args[2] % rank
                perm[a], perm[b] = perm[b], perm[a]
            elif rank == 2:
                perm = [1, 0]
        inverse = [perm.index(i) for i in range(rank)]
        return ctx.op("Transpose", new, perm=inverse)
    if key in SLICING_VIEWS:
        dim = args[1] % rank
        size = parent.shape[dim]
        if key == "aten.select.int":
            pos = _normalized(ctx, args[2], size, clamp=False)
            grown = Value(
                ctx.op("Unsqueeze", new, ctx.i64([dim])), new.dtype, (*new.shape[:dim], 1, *new.shape[dim:])
            )
            indices = _positions(ctx, grown, dim, pos, 1)
            return ctx.op("ScatterElements", parent, indices, grown, axis=dim)
        if key == "aten.narrow.default":
            start, step = args[2], 1
        else:
            start = 0 if args[2] is None else args[2]
            step = args[4]
        if not isinstance(step, int) or step < 1:
            raise ConversionError(f"cannot write through {view.name}: slice step {step!r}")
        pos = _normalized(ctx, start, size, clamp=True)
        return ctx.op("ScatterElements", parent, _positions(ctx, new, dim, pos, step), new, axis=dim)
    raise ConversionError(f"fastonnx does not write through {view.name} ({view.target})")
