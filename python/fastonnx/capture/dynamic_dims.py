"""dynamic_shapes in the forms torch.export and torch.onnx accept, and readable names for dynamic dims.

Accepted per tensor: a dict {axis: spec} or a list/tuple with one spec per axis, where a spec is a
``torch.export.Dim`` (with min/max, or derived like ``seq + 1``), ``Dim.DYNAMIC`` / ``Dim.AUTO`` /
``Dim.STATIC``, None (static), or a string: the name the ONNX dim gets. A string becomes ``Dim.AUTO``
for torch.export (torch may then specialise it: see :func:`specialised`).

When torch.export refuses the dynamic shapes with its "Constraints violated ... Suggested fixes" error,
:func:`refine` turns the suggested fixes into new dynamic shapes for one more try.

Names of ONNX dims: the user's string, else the Dim's name, else ``<input>_dim<axis>``; a derived dim is
written as its expression over those names ("seq+1").
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.export import Dim

from fastonnx.capture.input_tensors import key_text
from fastonnx.errors import InputError
from fastonnx.torch_internals import DerivedDim, DimHint, DimHintType, pytree, symint_expr

# (flattened input index, axis) -> requested name (None when only "dynamic" was asked, without a name)
Requested = dict[tuple[int, int], str | None]


def _param_names(model: Any, n_args: int) -> list[str]:
    fn = getattr(model, "forward", None)
    try:
        params = list(inspect.signature(fn).parameters.values()) if fn is not None else []
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"arg{i}" for i in range(n_args)]


def _signature_order(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[str]:
    """The inputs' names in the order of ``forward``'s signature (keywords by their parameter's place,
    ``**kwargs`` extras last, in call order): how torch.export reads a tuple of dynamic_shapes."""
    top = _param_names(model, len(args))
    try:
        params = [p.name for p in inspect.signature(model.forward).parameters.values()]
    except (AttributeError, TypeError, ValueError):
        params = []
    named = [n for n in params if n in kwargs and n not in top]
    return top + named + [k for k in kwargs if k not in top and k not in named]


def _asks_dynamic(d: Any) -> tuple[bool, str | None]:
    """Whether a dim spec asks for a dynamic dim that must stay dynamic (strict_dynamic), and its
    name: a named Dim (bounds or not) or Dim.DYNAMIC. Dim.AUTO may specialise by definition,
    Dim.STATIC and ints ask for a static dim, a derived dim (``dx + 1``) follows its root."""
    if isinstance(d, DimHint):
        return d.type == DimHintType.DYNAMIC, None
    if isinstance(d, DerivedDim) or not isinstance(d, Dim):
        return False, None
    name = getattr(d, "__name__", None)
    return True, name if isinstance(name, str) else None


def input_paths(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[str]:
    """Readable names of the flattened user inputs: the FX placeholder name for a top-level tensor
    (``x``), a dotted pytree path for nested ones (``past_key_values.0.key``)."""
    placeholders = list(ep.graph_signature.user_inputs)
    flat = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))[0]
    if len(flat) != len(placeholders):
        raise InputError(
            f"the inputs flatten to {len(flat)} values but the exported program takes {len(placeholders)} "
            f"({', '.join(str(p) for p in placeholders)}): pass the args and kwargs it was exported with"
        )
    paths = []
    for i, ((path, _), ph) in enumerate(zip(flat, placeholders)):
        rest = [key_text(k) for k in path[2:]]
        if not rest:
            paths.append(str(ph))
            continue
        if key_text(path[0]) == "1":
            top = key_text(path[1])
        else:
            suffix = "_" + "_".join(rest)
            ph = str(ph)
            top = ph[: -len(suffix)] if ph.endswith(suffix) and len(ph) > len(suffix) else f"input{i}"
        paths.append(".".join([top, *rest]))
    return paths


def output_paths(out_spec: Any, n: int) -> list[str | None]:
    """Readable names of the flattened outputs, from the output's pytree path (``logits``,
    ``past_key_values.0.key``, ``output.1.0.key`` for tuples); None for every output when the model
    returns one tensor or a flat tuple of them (those keep their FX node names)."""
    if out_spec is None or n == 0:
        return [None] * n
    # rebuild the structure around placeholders, then read the path of each leaf back
    tree = pytree.tree_unflatten([torch.empty(0) for _ in range(n)], out_spec)
    flat = pytree.tree_flatten_with_path(tree)[0]
    if len(flat) != n:
        return [None] * n
    # one tensor or a flat tuple: paths of at most one sequence index
    if all(len(path) <= 1 and all(isinstance(k, pytree.SequenceKey) for k in path) for path, _ in flat):
        return [None] * n
    names: list[str | None] = []
    for path, _ in flat:
        keys = [key_text(k) for k in path]
        if path and isinstance(path[0], pytree.SequenceKey):
            keys = ["output", *keys]
        names.append(".".join(keys))
    return names


# (flattened input index, axis) -> the range asked for (min, max or None), for every dim asked to be
# dynamic whatever the spelling (Dim.AUTO and strings included; a derived dim follows its root)
Asked = dict[tuple[int, int], tuple[int, int | None]]


class DerivedRange(tuple[int, int | None]):
    """The range asked of a derived dim (``9 * b``): only the sizes its expression takes are asked
    (capture/guards.py tries no other), not every size between its bounds."""


def _asked_range(d: Any) -> tuple[int, int | None] | None:
    """The range a dim spec asks for (a derived dim's: its expression's), or None when it asks for no
    dynamic dim."""
    if isinstance(d, str):
        return 0, None
    if isinstance(d, DimHint):
        return (0, None) if d.type in (DimHintType.DYNAMIC, DimHintType.AUTO) else None
    if not isinstance(d, Dim):
        return None
    # a derived dim (9 * b) asks for its own range too: where its root appears in no other input,
    # a guard on the root (torch specialising b through 9 * b // 9) is seen only through it
    lower, upper = getattr(d, "min", 0), getattr(d, "max", None)
    asked = int(lower) if isinstance(lower, int) else 0, upper if isinstance(upper, int) else None
    return DerivedRange(asked) if isinstance(d, DerivedDim) else asked


def normalize(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any
) -> tuple[Any, Requested, Asked]:
    """The dynamic_shapes to give torch.export (strings replaced by Dim.AUTO), the names asked for
    (the dims strict_dynamic holds) and the ranges asked for (the dims capture/guards.py checks)."""
    if dynamic_shapes is None:
        return None, {}, {}
    top = _param_names(model, len(args))
    values: dict[str, Any] = dict(zip(top, args))
    values.update(kwargs)
    specs = _specs_by_input(model, args, kwargs, values, dynamic_shapes)
    walker = _SpecWalker()
    # torch.export flattens (args, kwargs) with kwargs in the order given: walk in that order too
    converted: dict[str, Any] = {}
    for name in [*list(values)[: len(args)], *kwargs]:
        converted[name] = walker.walk(values[name], specs[name], name)
    if isinstance(dynamic_shapes, Mapping):
        return {k: converted[k] for k in values}, walker.requested, walker.asked
    ordered = tuple(converted[k] for k in _signature_order(model, args, kwargs))
    return ordered, walker.requested, walker.asked


def _specs_by_input(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], values: dict[str, Any], dynamic_shapes: Any
) -> dict[str, Any]:
    """Each input's spec, from a dict keyed by input name or a sequence in the signature's order."""
    if isinstance(dynamic_shapes, Mapping):
        unknown = [k for k in dynamic_shapes if k not in values]
        if unknown:
            raise InputError(
                f"dynamic_shapes names {unknown}, which are not inputs of the model (inputs: {list(values)})"
            )
        return {k: dynamic_shapes.get(k) for k in values}
    if isinstance(dynamic_shapes, (list, tuple)):
        if len(dynamic_shapes) != len(values):
            raise InputError(
                f"dynamic_shapes has {len(dynamic_shapes)} entries but the model gets {len(values)} inputs "
                f"({', '.join(values)}); give one entry per input (None for static ones)"
            )
        # by the signature's order, as torch.export reads it, whatever the keywords' order in the call
        return dict(zip(_signature_order(model, args, kwargs), dynamic_shapes))
    raise InputError(
        f"dynamic_shapes must be a dict keyed by input name or a tuple with one entry per input, "
        f"got {type(dynamic_shapes).__name__}"
    )


class _SpecWalker:
    """Walks an input and its spec together: each tensor's spec checked and converted (strings to
    Dim.AUTO), the dims asked to be dynamic and their ranges recorded by the tensor's place among the
    tensor leaves (``index``) and axis."""

    def __init__(self) -> None:
        self.requested: Requested = {}
        self.asked: Asked = {}
        self.index = 0  # the next tensor leaf's place

    def walk(self, value: Any, spec: Any, where: str) -> Any:
        if isinstance(value, torch.Tensor):
            self.index += 1
            return None if spec is None else self._tensor(value, spec, where, self.index - 1)
        if isinstance(value, (list, tuple)):
            return self._sequence(value, spec, where)
        if isinstance(value, dict):
            return self._mapping(value, spec, where)
        return self._container(value, spec, where)

    def _tensor(self, value: torch.Tensor, spec: Any, where: str, index: int) -> Any:
        if isinstance(spec, Mapping):
            items = list(spec.items())
        elif isinstance(spec, (list, tuple)):
            items = list(enumerate(spec))
        else:
            raise InputError(
                f"dynamic_shapes for {where} must be a dict {{axis: name or Dim}} or a list with one "
                f"entry per axis, got {spec!r}"
            )
        out: dict[int, Any] = {}
        for axis, d in items:
            if not isinstance(axis, int) or not -value.dim() <= axis < value.dim():
                raise InputError(
                    f"dynamic_shapes for {where}: axis {axis!r} is not an axis of a {value.dim()}-d tensor"
                )
            axis %= max(value.dim(), 1)
            if d is not None:
                out[axis] = self._dim(d, (index, axis))
        return out if isinstance(spec, Mapping) else [out.get(i) for i in range(value.dim())]

    def _dim(self, d: Any, key: tuple[int, int]) -> Any:
        """One axis's spec as torch.export takes it, its request and range recorded."""
        wanted = _asked_range(d)
        if wanted is not None:
            self.asked[key] = wanted
        if isinstance(d, str):
            self.requested[key] = d
            return Dim.AUTO
        held, name = _asks_dynamic(d)
        if held:
            self.requested[key] = name
        return d

    def _sequence(self, value: list[Any] | tuple[Any, ...], spec: Any, where: str) -> Any:
        if spec is None:
            return type(value)(self.walk(v, None, f"{where}[{i}]") for i, v in enumerate(value))
        if not isinstance(spec, (list, tuple)) or len(spec) != len(value):
            raise InputError(
                f"dynamic_shapes for {where} must be a list of {len(value)} entries like the input, got {spec!r}"
            )
        return type(spec)(self.walk(v, s, f"{where}[{i}]") for i, (v, s) in enumerate(zip(value, spec)))

    def _mapping(self, value: dict[Any, Any], spec: Any, where: str) -> Any:
        if spec is None:
            return {k: self.walk(v, None, f"{where}[{k!r}]") for k, v in value.items()}
        if isinstance(spec, (list, tuple)) and len(spec) == len(value):
            spec = dict(zip(value, spec))  # a list in the dict's order is accepted too
        if not isinstance(spec, Mapping) or set(spec) != set(value):
            raise InputError(
                f"dynamic_shapes for {where} must be a dict with keys {sorted(value)}, got {spec!r}"
            )
        return {k: self.walk(v, spec[k], f"{where}[{k!r}]") for k, v in value.items()}

    def _container(self, value: Any, spec: Any, where: str) -> Any:
        node = pytree.SUPPORTED_NODES.get(type(value))
        if node is None:
            return None  # a constant (int, float, None...)
        # a registered pytree container (e.g. a KV cache): one spec per child, as torch.export expects
        children, _ = node.flatten_fn(value)
        if spec is None:
            for i, c in enumerate(children):
                self.walk(c, None, f"{where}.{i}")
            return None
        if not isinstance(spec, (list, tuple)) or len(spec) != len(children):
            raise InputError(
                f"dynamic_shapes for {where} ({type(value).__name__}) must be a list with one entry per "
                f"child ({len(children)}: for a KV cache, one [key, value] pair per layer), got {spec!r}"
            )
        return [self.walk(c, s, f"{where}.{i}") for i, (c, s) in enumerate(zip(children, spec))]


def dim_names(placeholders: Sequence[tuple[str, Any]], requested: Requested) -> dict[str, str]:
    """Symbol text ("s17") -> readable name, from the user's requests, then ``<input>_dim<axis>``.

    Warns for every dim the user asked to be dynamic that torch.export specialised.
    """
    names: dict[str, str] = {}
    defaults: dict[str, str] = {}
    roots: dict[str, str] = {}
    for index, (input_name, val) in enumerate(placeholders):
        if not isinstance(val, torch.Tensor):
            continue
        for axis, d in enumerate(val.shape):
            asked = (index, axis) in requested
            if isinstance(d, int) or symint_expr(d).is_number:
                if asked:
                    warnings.warn(
                        f"input {input_name!r} dim {axis} was asked to be dynamic but torch.export "
                        f"specialised it to {int(d)}: the ONNX model only accepts that size there",
                        stacklevel=4,
                    )
                continue
            expr = symint_expr(d)
            wanted = requested.get((index, axis))
            if not expr.is_Symbol:
                # a dim torch's suggested fixes derived from a new root ("n = 2*_n"): the root is
                # named as torch names it, "_" + the user's name
                if wanted and len(expr.free_symbols) == 1:
                    roots.setdefault(str(next(iter(expr.free_symbols))), f"_{wanted}")
                continue
            key = str(expr)
            if wanted and key not in names:
                names[key] = wanted
            defaults.setdefault(key, f"{input_name}_dim{axis}")
    return {**roots, **defaults, **names}


def ranges(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, list[int | None]]:
    """{"input[axis]": [min, max]} of every symbolic dim of the user inputs, as the capture bounded it
    (max None: unbounded)."""
    paths = input_paths(ep, args, kwargs)
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    bounds = {str(sym): r for sym, r in ep.range_constraints.items()}
    found: dict[str, list[int | None]] = {}
    for index, name in enumerate(ep.graph_signature.user_inputs):
        val = nodes[name].meta.get("val") if name in nodes else None
        if not isinstance(val, torch.Tensor):
            continue
        for axis, d in enumerate(val.shape):
            if isinstance(d, torch.SymInt) and str(symint_expr(d)) in bounds:
                r = bounds[str(symint_expr(d))]
                found[f"{paths[index]}[{axis}]"] = [_bound(r.lower), _bound(r.upper)]
    return found


def _bound(value: Any) -> int | None:
    """A range bound as an int, None for torch's unbounded ``int_oo`` (sympy: no int())."""
    try:
        return int(value)
    except (TypeError, AttributeError, OverflowError, ValueError):
        return None


def specialised(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any], requested: Requested
) -> list[tuple[str, int, int]]:
    """(input path, axis, size) of every dim the user asked to be dynamic that torch.export fixed."""
    if not requested:
        return []
    paths = input_paths(ep, args, kwargs)
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    out = []
    for index, name in enumerate(ep.graph_signature.user_inputs):
        val = nodes[name].meta.get("val") if name in nodes else None
        if not isinstance(val, torch.Tensor):
            continue
        for axis, d in enumerate(val.shape):
            if (index, axis) in requested and (isinstance(d, int) or symint_expr(d).is_number):
                out.append((paths[index], axis, int(d)))
    return out


# one fix per line after "Suggested fixes:": "n = Dim('n', min=2, max=32)", "n = 2*_n", "batch = 2"
_FIX = re.compile(r"^\s+([A-Za-z_][\w.]*) = (\S.*)$")


def suggested_fixes(message: str) -> list[str]:
    """The lines of torch.export's "Suggested fixes:" block ("n = 2*_n"), without the text after it."""
    _, found, rest = message.partition("Suggested fixes:")
    if not found:
        return []
    lines = rest.splitlines()
    if lines and not lines[0].strip():
        lines = lines[1:]  # the end of the header's own line
    fixes = []
    for line in lines:
        match = _FIX.match(line)
        if match is None:
            break
        fixes.append(f"{match.group(1)} = {match.group(2).strip()}")
    return fixes


def refine(message: str, dynamic_shapes: Any) -> tuple[Any, list[str]] | None:
    """torch's suggested fixes applied to ``dynamic_shapes`` (with the fixes as text), or None when
    the message suggests none or torch cannot apply them."""
    fixes = suggested_fixes(message)
    if not fixes or dynamic_shapes is None:
        return None
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    # torch's parser reads every line after the header as a fix: give it only the fixes
    clean = "Suggested fixes:\n" + "\n".join(f"  {f}" for f in fixes)
    try:
        return refine_dynamic_shapes_from_suggested_fixes(clean, dynamic_shapes), fixes
    except Exception:  # a fix torch's own helper cannot apply (an unsupported relation)
        return None


# "Not all values of s = L['x'].size()[1] in the specified range s <= 64 satisfy the generated guard ..."
_UNPROVEN = re.compile(r"Not all values of ([A-Za-z_]\w*) = ")
_GUARD = re.compile(r"satisfy the generated guard (.+?)\.?$", re.MULTILINE)


def size_one_guards_only(message: str) -> bool:
    """Whether every guard torch.export could not prove is a size's ``!= 1`` or ``> 1`` (the guards
    size-oblivious reasoning makes of a branch on a size of 1: it assumes the branch taken for sizes of 2
    and more holds for 1), and it specialised nothing."""
    guards = _GUARD.findall(message)
    return (
        bool(guards)
        and "specialized it to be a constant" not in message
        and all(g.strip().endswith(("!= 1", "> 1")) for g in guards)
    )


def _is_dim(x: Any) -> bool:
    return isinstance(x, Dim)


def map_dims(dynamic_shapes: Any, fn: Callable[[Any], Any]) -> Any:
    """``dynamic_shapes`` with every ``Dim`` (derived ones included) replaced by ``fn(dim)``."""
    return pytree.tree_map(lambda d: fn(d) if isinstance(d, Dim) else d, dynamic_shapes, is_leaf=_is_dim)


def unproven_dims(message: str, dynamic_shapes: Any) -> set[str]:
    """The named Dims of ``dynamic_shapes`` over whose range torch.export could not prove a guard
    (its "Not all values of NAME ... satisfy the generated guard"), but those a derived dim builds on."""
    named = set(_UNPROVEN.findall(message))
    if not named:
        return set()
    dims = [d for d in pytree.tree_leaves(dynamic_shapes, is_leaf=_is_dim) if isinstance(d, Dim)]
    roots = {getattr(d.root, "__name__", None) for d in dims if isinstance(d, DerivedDim)}
    return {d.__name__ for d in dims if not isinstance(d, DerivedDim) and d.__name__ in named} - roots


def root_dims(dynamic_shapes: Any) -> set[str]:
    """The names of the Dims of ``dynamic_shapes`` that no other builds on and that are not derived."""
    dims = [d for d in pytree.tree_leaves(dynamic_shapes, is_leaf=_is_dim) if isinstance(d, Dim)]
    roots = {getattr(d.root, "__name__", None) for d in dims if isinstance(d, DerivedDim)}
    return {d.__name__ for d in dims if not isinstance(d, DerivedDim)} - roots


SUGGESTION_CRASH = "Cannot create Dim with inconsistent"
"""torch's own assertion when the fixes it would suggest for a refusal give a Dim an empty range (a
derived dim's root through nested ``//`` and ``%`` of a codec's convolutions): the refusal is lost."""


def as_dynamic(dynamic_shapes: Any, names: set[str]) -> Any:
    """``dynamic_shapes`` with the Dims named in ``names`` replaced by Dim.DYNAMIC."""
    return map_dims(dynamic_shapes, lambda d: Dim.DYNAMIC if getattr(d, "__name__", None) in names else d)


def fixes_bound_or_fix(message: str, names: set[str]) -> bool:
    """Whether torch's suggested fixes are none, or bound or fix one of ``names`` (``s = Dim('s',
    max=64)``, ``s = 9``) rather than relate Dims (``b = a + 1``, ``n = 2*_n``)."""
    fixes = suggested_fixes(message)
    if not fixes:
        return True
    for fix in fixes:
        name, _, value = fix.partition(" = ")
        if name in names and (value.strip().isdigit() or value.startswith(("Dim(", "torch.export.Dim("))):
            return True
    return False
