"""torch.cond → If, torch.ops.higher_order.while_loop → Loop, torch.ops.higher_order.scan → Scan;
wrap_with_set_grad_enabled / wrap_with_autocast bodies inlined (they only change autograd or autocast
state), and invoke_subgraph (torch.export's repeated regions) inlined at each call. Higher-order ops take subgraphs as operands, so their converters get the walker and the node:
``fn(walker, node)`` (see ``fastonnx.context.Walker``).

The branch and body graphs are converted into subgraph builders that share the main graph's names;
they read outer values (operands, weights, additional inputs) by name, as ONNX allows. A body's
formal inputs (loop state, scanned slices) carry torch's shapes as the body graph recorded them
(SymInts, like every other ``Value``): a size read inside the body is then an outer input's symbol,
recomputed inside the body from that input's Shape (an outer value, read by name), or the formal
input's own dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from fastonnx import dtypes
from fastonnx._core import GraphBuilder
from fastonnx.context import Converter, Value, Walker, val_dtype
from fastonnx.errors import ConversionError

Spec = tuple[torch.dtype, list[Any] | None]  # dtype and ONNX dims (None: unknown rank)
# a body's formal input: name hint, ONNX type, and torch's shape of it (ints and SymInts) for converters
Formal = tuple[str, Spec, tuple[Any, ...]]
# node.args of the higher-order ops, which FX types only as its generic argument union: subgraphs are
# get_attr nodes, operands lists of nodes (read through .meta) or of any argument (only mapped)
Node = torch.fx.Node
Args = Sequence[torch.fx.node.Argument]


def _fake_vals(node: torch.fx.Node) -> list[Any]:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (list, tuple)) else [val]


def _spec(interp: Walker, val: Any, *, drop_first: bool = False, rank_only: bool = False) -> Spec:
    """The dtype and ONNX dims of a FakeTensor or symbolic scalar recorded by torch."""
    if not isinstance(val, torch.Tensor):
        return val_dtype(val), []
    dims = list(val.shape[1:] if drop_first else val.shape)
    if rank_only:
        return val.dtype, [None] * len(dims)
    return val.dtype, [interp.ctx.dim(d) for d in dims]


def _shape(val: Any) -> tuple[Any, ...]:
    """torch's shape of a recorded value (ints and SymInts; () for a symbolic or Python scalar)."""
    return tuple(val.shape) if isinstance(val, torch.Tensor) else ()


def _placeholder_shapes(gm: torch.fx.GraphModule, count: int, fallback: Sequence[Any]) -> list[Any]:
    """torch's shapes of a body graph's first ``count`` placeholders, as the body recorded them (what
    its converters read: a dim is a symbol of an outer input or one of the body's own); ``fallback``
    (the operands' recorded values) where a placeholder has no record."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"][:count]
    shapes = [_shape(ph.meta["val"]) if "val" in ph.meta else None for ph in placeholders]
    shapes += [None] * (count - len(shapes))
    return [s if s is not None else _shape(f) for s, f in zip(shapes, fallback, strict=True)]


def _as_output(sub: GraphBuilder, interp: Walker, result: Any, spec: Spec, hint: str) -> None:
    """Declares ``result`` (a Value, an outer value or a folded Python number) a subgraph output."""
    dtype, dims = spec
    if isinstance(result, Value):
        name = result.name
    elif isinstance(result, str):
        name = result
    elif isinstance(result, (int, float, bool)):
        raw = dtypes.tensor_bytes(torch.tensor(result, dtype=dtype)).tobytes()
        name = sub.add_constant(raw, dtypes.to_onnx_dtype(dtype), [], "const")
    else:
        raise ConversionError(f"{hint}: a subgraph returned {result!r}, which ONNX cannot hold")
    out = sub.add_output(name, interp.g.unique_name(hint))
    sub.set_type(out, dtypes.to_onnx_dtype(dtype), dims)


def _subgraph(
    interp: Walker,
    name: str,
    body: Callable[[list[Value]], Sequence[Any]],
    out_specs: Sequence[Spec],
    in_specs: Sequence[Formal] = (),
) -> GraphBuilder:
    """Runs ``body`` with the interpreter emitting into a fresh subgraph; its results become outputs.
    Its formal inputs are declared with their ONNX types and handed to ``body`` as Values of torch's
    shapes (never the ONNX dims: a dim name is no value of any graph)."""
    sub = interp.g.subgraph(interp.g.unique_name(name))
    with interp.emitting_into(sub):
        formal = []
        for hint, (dtype, dims), shape in in_specs:
            n = sub.add_input(interp.g.unique_name(hint), dtypes.to_onnx_dtype(dtype), dims)
            formal.append(Value(n, dtype, shape))
        results = body(formal)
        if len(results) != len(out_specs):
            raise ConversionError(
                f"{name}: the subgraph returned {len(results)} values, {len(out_specs)} expected"
            )
        for r, spec in zip(results, out_specs):
            _as_output(sub, interp, r, spec, f"{name}_out")
    return sub


def convert_cond(interp: Walker, node: torch.fx.Node) -> Any:
    pred, true_gm, false_gm, operands = cast(tuple[Node, Node, Node, Args], node.args)
    pred_v = interp.env[pred]
    ops = [interp.map_arg(o) for o in operands]
    t_gm, f_gm = interp.env[true_gm], interp.env[false_gm]
    if isinstance(pred_v, (bool, int)):
        # the predicate folded to a constant: only the branch taken exists in ONNX
        return interp.run_subgraph((t_gm if pred_v else f_gm).graph, ops)
    specs = [_spec(interp, v) for v in _fake_vals(node)]
    then_g = _subgraph(interp, "then_branch", lambda _: interp.run_subgraph(t_gm.graph, ops), specs)
    else_g = _subgraph(interp, "else_branch", lambda _: interp.run_subgraph(f_gm.graph, ops), specs)
    cond = interp.ctx.cast(pred_v, torch.bool)
    return interp.ctx.op("If", cond, outputs=len(specs), then_branch=then_g, else_branch=else_g)


def convert_while_loop(interp: Walker, node: torch.fx.Node) -> Any:
    cond_gm, body_gm, carried, additional = cast(tuple[Node, Node, Sequence[Any], Args], node.args)
    c_gm, b_gm = interp.env[cond_gm], interp.env[body_gm]
    carried_v = [interp.map_arg(c) for c in carried]
    extra = [interp.map_arg(a) for a in additional]
    # a loop-carried value may change size from one iteration to the next: only its rank is declared;
    # a carried Python number (a loop counter `0`) or SymInt becomes a 0-d tensor of its type
    state = [_spec(interp, _carried_val(c), rank_only=True) for c in carried]
    ctx = interp.ctx
    # the first test runs on the initial values, which may fold to a Python bool
    cond0 = ctx.operand(_only(interp.run_subgraph(c_gm.graph, [*carried_v, *extra])), torch.bool)
    scalar_bool: Spec = (torch.bool, [])
    shapes = _placeholder_shapes(b_gm, len(carried), [_carried_val(c) for c in carried])
    in_specs: list[Formal] = [("iter", (torch.int64, []), ()), ("cond_in", scalar_bool, ())]
    in_specs += [(f"carried_{i}", s, shape) for i, (s, shape) in enumerate(zip(state, shapes))]

    def body(formal: list[Value]) -> list[Any]:
        new = list(interp.run_subgraph(b_gm.graph, [*formal[2:], *extra]))
        again = interp.run_subgraph(c_gm.graph, [*new, *extra])
        return [ctx.operand(_only(again), torch.bool), *new]

    body_g = _subgraph(interp, "loop_body", body, [scalar_bool, *state], in_specs)
    operands = [ctx.operand(v, dt) for v, (dt, _) in zip(carried_v, state)]
    return ctx.op("Loop", None, cond0, *operands, outputs=len(state), body=body_g)


def _carried_val(c: Any) -> Any:
    """What torch recorded for a loop-carried operand: a node's meta value, or the number itself."""
    return c.meta["val"] if isinstance(c, torch.fx.Node) else c


def convert_scan(interp: Walker, node: torch.fx.Node) -> Any:
    combine_gm, init, xs, additional = cast(tuple[Node, Sequence[Node], Sequence[Node], Args], node.args)
    gm = interp.env[combine_gm]
    _refuse_merged_carries(init, gm, node)
    init_v = [interp.map_arg(v) for v in init]
    xs_v = [interp.map_arg(v) for v in xs]
    extra = [interp.map_arg(a) for a in additional]
    state = [_spec(interp, v.meta["val"]) for v in init]
    slices = [_spec(interp, v.meta["val"], drop_first=True) for v in xs]
    outs = _fake_vals(node)
    # the body returns the next state and one slice of each stacked output
    out_specs = [*state, *[_spec(interp, v, drop_first=True) for v in outs[len(state) :]]]
    # the body's placeholders: the state, one slice of each scanned input, the additional inputs
    shapes = _placeholder_shapes(
        gm, len(init) + len(xs), [*(v.meta["val"] for v in init), *(v.meta["val"][0] for v in xs)]
    )
    names = [f"state_{i}" for i in range(len(init))] + [f"slice_{i}" for i in range(len(xs))]
    in_specs: list[Formal] = list(zip(names, [*state, *slices], shapes, strict=True))

    def body(formal: list[Value]) -> list[Any]:
        return list(interp.run_subgraph(gm.graph, [*formal, *extra]))

    body_g = _subgraph(interp, "scan_body", body, out_specs, in_specs)
    return interp.ctx.op("Scan", *init_v, *xs_v, outputs=len(outs), body=body_g, num_scan_inputs=len(xs_v))


def _refuse_merged_carries(init: Sequence[Any], gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """torch.export (2.14) records a scan whose initial carries hold one tensor twice with a body that
    reads the last of those placeholders for all of them: the first goes unread, and the program itself
    computes another function (its own ``module()`` differs from eager). Refused, with the fix."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"][: len(init)]
    for i, v in enumerate(init):
        later = [j for j in range(i + 1, len(init)) if init[j] is v]
        if later and i < len(placeholders) and not placeholders[i].users:
            raise ConversionError(
                f"scan node {node.name!r} starts carries {i} and {later[0]} from the same tensor "
                f"({getattr(v, 'name', v)}), and torch.export recorded a body that reads carry {later[0]} "
                f"in place of carry {i}: the captured program is wrong before fastonnx converts it. Pass "
                "each carry its own tensor (a .clone() of the shared one)"
            )


def _only(result: Any) -> Any:
    if isinstance(result, (list, tuple)):
        if len(result) != 1:
            raise ConversionError(f"a loop condition must return one boolean, got {len(result)} values")
        return result[0]
    return result


def convert_inline(interp: Walker, node: torch.fx.Node) -> Any:
    """The body of wrap_with_set_grad_enabled / wrap_with_autocast, converted into this graph."""
    # wrap_with_set_grad_enabled(enabled, body, *args); wrap_with_autocast(dev, dt, en, cache, body, *a)
    # a call_function node: its target is the higher-order op (FX types it as callable or str)
    target = cast(Callable[..., Any], node.target)
    skip = 1 if target.__name__ == "wrap_with_set_grad_enabled" else 4
    body = interp.env[cast(Node, node.args[skip])]
    operands = [interp.map_arg(a) for a in node.args[skip + 1 :]]
    return interp.run_subgraph(body.graph, operands)


def convert_invoke_subgraph(interp: Walker, node: torch.fx.Node) -> Any:
    """torch.export's repeated subgraph (``torch.compiler.nested_compile_region``), inlined at each call:
    ``invoke_subgraph(subgraph, identifier, *operands)`` returns the subgraph's outputs as a tuple."""
    gm = interp.env[node.args[0]]  # type: ignore[index]
    operands = [interp.map_arg(a) for a in node.args[2:]]
    return interp.run_subgraph(gm.graph, operands)


CONVERTERS: dict[str, Converter] = {
    "higher_order.cond": convert_cond,
    "higher_order.while_loop": convert_while_loop,
    "higher_order.scan": convert_scan,
    "higher_order.invoke_subgraph": convert_invoke_subgraph,
    "higher_order.wrap_with_set_grad_enabled": convert_inline,
    "higher_order.wrap_with_autocast": convert_inline,
}
