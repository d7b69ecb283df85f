"""What a dynamic-shape capture was proven for, against what the user asked.

torch.export proves its program for a range of each symbolic input size (``range_constraints``) and
records the conditions its trace relied on as guards over the input sizes (``ShapeEnv.guards``), which
``ep.module()`` checks on every call. An ONNX file checks neither: at a size outside them onnxruntime
runs the traced program anyway and may return a wrong answer without an error (a loop over 64-token
chunks traced at 9 tokens runs one chunk at 70).

:func:`prove` compares them with the request. For every dim the user asked to be dynamic it finds the
sizes of the asked range that the kept range and the guards admit. 0 and 1 are left out, as
torch.export leaves them out (size-oblivious reasoning treats them as any other size), so a guard
``s >= 2`` or ``s != 1`` restates the request and stays silent. Sizes are tried, not solved for
(torch's own solver cannot prove ``(s + (64 - s % 64) % 64) // 64 == 1`` over [2, 64], which holds):
every size when the asked range holds at most :data:`EXHAUSTIVE` of them, otherwise every size up to
the lower bound + 256, each power of two up to 2^20 with its neighbours, the upper bound and the
example's size. A guard over several inputs' sizes is evaluated with the sizes that equal the varied
one in the example varied with it (a mask's length follows the ids' length), the others at their
example's values.

:class:`Proven` is what the file is proven for: each symbolic input dim's range and the guards that
narrow the request, kept when the user asks for them. ``ExportResult`` checks inputs against it
before onnxruntime runs them (:class:`fastonnx.errors.SizeGuardError`), and the file's metadata holds
it (:data:`METADATA_KEY`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import linecache
import math
import os
import sysconfig
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

import torch

from fastonnx.capture.dynamic_dims import Asked, DerivedRange
from fastonnx.errors import SizeGuardError
from fastonnx.torch_internals import (
    backed_values,
    guard_namespace,
    input_guards,
    shape_env_of_symint,
    symint_expr,
    sympy_python,
    user_guard_locations,
    value_ranges,
)

METADATA_KEY = "pkg.fastonnx.proven_sizes"
"""The file's metadata entry holding :meth:`Proven.to_json`."""

EXHAUSTIVE = 4096
"""An asked range of at most this many sizes is checked at every size (a proof); a larger one is sampled."""


@dataclasses.dataclass(frozen=True)
class DimRange:
    """The sizes one symbolic input dim is proven for. The lower bound is enforced only above 2: 0 and
    1 run as any size (size-oblivious capture), as ``ep.module()`` enforces it."""

    input: str  # the input's path ("x", "past_key_values.0.key")
    index: int  # its place among the flattened user inputs
    axis: int
    lower: int
    upper: int | None  # None: unbounded

    def admits(self, size: int) -> bool:
        return (self.lower <= 2 or size >= self.lower) and (self.upper is None or size <= self.upper)

    def text(self) -> str:
        return f"[{self.lower}, {'inf' if self.upper is None else self.upper}]"


@dataclasses.dataclass(frozen=True)
class KeptGuard:
    """A guard the program relies on that narrows what was asked, kept because the user accepted it."""

    text: str  # over the inputs' sizes, as the user writes them: "(x.shape[1] + 63) // 64 == 1"
    where: str | None  # the source line that made it, where one outside torch was found
    code: str  # Python over the arguments named in ``sizes``
    sizes: tuple[tuple[str, int, int], ...]  # (argument name, input index, axis)

    def holds(self, shapes: Sequence[Sequence[int]]) -> bool:
        values = [shapes[index][axis] for _, index, axis in self.sizes]
        return bool(_compiled(self.code, tuple(n for n, _, _ in self.sizes))(*values))


@dataclasses.dataclass
class Proven:
    """The sizes the file is right for: every symbolic input dim's range, and the guards kept."""

    dims: list[DimRange]
    guards: list[KeptGuard]

    def check(self, leaves: Sequence[Any]) -> None:
        """Raises SizeGuardError when the flattened user inputs ``leaves`` are outside what was proven."""
        shapes = [tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else () for leaf in leaves]
        for d in self.dims:
            if d.index < len(shapes) and d.axis < len(shapes[d.index]):
                size = int(shapes[d.index][d.axis])
                if not d.admits(size):
                    raise SizeGuardError(
                        f"input {d.input!r} axis {d.axis} has size {size}: the export was proven for "
                        f"sizes {d.text()} there only (the program was captured for those; export again "
                        "with a dynamic_shapes range that includes this size)"
                    )
        for g in self.guards:
            if not g.holds(shapes):
                where = f" (made at {g.where})" if g.where else ""
                raise SizeGuardError(
                    f"the inputs' sizes fail the guard {g.text}{where}, which the exported program "
                    "relies on: onnxruntime would compute a wrong answer at these sizes"
                )

    def to_json(self) -> str:
        return json.dumps(
            {
                "dims": {f"{d.input}[{d.axis}]": [d.lower, d.upper] for d in self.dims},
                "guards": [{"guard": g.text, "where": g.where} for g in self.guards],
            }
        )

    def __bool__(self) -> bool:
        return bool(self.dims or self.guards)


@dataclasses.dataclass
class Narrowing:
    """A dim asked to be dynamic that the program is right for at some of the asked sizes only."""

    input: str
    axis: int
    name: str  # the dim's name in the request, or "<input>_dim<axis>"
    asked: tuple[int, int | None]  # the asked range, 0 and 1 left out
    admitted: list[int]  # of the sizes tried
    refused: list[int]
    causes: list[str]  # the guards (with their source lines) or the range that refuse sizes
    exhaustive: bool  # every size of the asked range was tried
    tried: list[int]  # the sizes tried, in order

    def describe(self) -> str:
        lo, hi = self.asked
        tried = "every size of that range" if self.exhaustive else f"sizes {lo} to {lo + 256}, powers of two"
        if self.admitted and min(self.refused) > max(self.admitted):
            refused = f"any size above {max(self.admitted)}"
        elif self.admitted and max(self.refused) < min(self.admitted):
            refused = f"any size below {min(self.admitted)}"
        else:
            refused = _sizes(self.refused, self.tried, 6)
        return (
            f"input {self.input!r} axis {self.axis} was asked to be dynamic over [{lo}, "
            f"{'inf' if hi is None else hi}], but the program is right for "
            f"{_sizes(self.admitted, self.tried, 6)} of "
            f"the sizes tried ({tried} and their neighbours), not {refused}:\n"
            + "".join(f"  - {c}\n" for c in self.causes)
        )

    def fix(self) -> str:
        """The Dim that asks for the sizes admitted, when they are a range."""
        if not self.admitted:
            return "no size of the range asked for: make the model's code keep the size symbolic"
        first, last = self.tried.index(self.admitted[0]), self.tried.index(self.admitted[-1])
        if self.admitted != self.tried[first : last + 1]:
            return "the sizes it is right for are no range (keep_narrowed=True keeps the guards, checked on every call)"
        upper = None if self.asked[1] is None and last == len(self.tried) - 1 else self.admitted[-1]
        return f"Dim({self.name!r}, min={self.admitted[0]}" + (
            f", max={upper})" if upper is not None else ")"
        )


def _sizes(values: list[int], tried: list[int], most: int = 0) -> str:
    """``values`` (a sorted part of ``tried``) as runs of sizes next to each other in ``tried``:
    "2 to 64", "2 to 64, 128"; the first ``most`` runs if given."""
    if not values:
        return "none"
    place = {v: i for i, v in enumerate(tried)}
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and place[v] == place[runs[-1][1]] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    shown = runs[:most] if most else runs
    text = ", ".join(f"{a} to {b}" if b > a else str(a) for a, b in shown)
    return text + (", ..." if len(shown) < len(runs) else "")


# ---- where torch's guards come from -------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]


def _user_line(frame: Any) -> str | None:
    """``file:line: code`` of the innermost frame outside torch, fastonnx and the standard library:
    the model's line that made a guard (a transformers model's own line counts)."""
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith((_TORCH_DIR, _OWN_DIR, _STDLIB_DIR)) or path.startswith("<frozen")):
            code = linecache.getline(path, frame.f_lineno).strip()
            return f"{path}:{frame.f_lineno}" + (f": {code}" if code else "")
        frame = frame.f_back
    return None


_LOCATING = [0.0]  # seconds spent naming guards' lines since the last locating_seconds()


def locating_seconds() -> float:
    """The seconds :func:`locate_guards` spent since the last call (part of ``stats["guards_s"]``)."""
    spent, _LOCATING[0] = _LOCATING[0], 0.0
    return spent


@contextlib.contextmanager
def locate_guards() -> Iterator[None]:
    """While torch.export runs: every guard's source location (``ShapeGuard.sloc``, torch's ``SLoc``)
    also names the model's line, found as :func:`_user_line` finds it. Relies on
    ``ShapeEnv._get_sloc`` (torch_internals.user_guard_locations). Process-wide: the caller holds
    capture.TRACE_LOCK."""

    def user_line(frame: FrameType | None) -> str | None:
        t0 = time.perf_counter()
        line = _user_line(frame)
        _LOCATING[0] += time.perf_counter() - t0
        return line

    with user_guard_locations(user_line):
        yield


# ---- the proof ----------------------------------------------------------------------------------


def _compiled(code: str, names: tuple[str, ...]) -> Callable[..., Any]:
    """A guard's Python (torch's printer: ``//`` for FloorDiv, ``%`` for Mod, ``max`` / ``min``) as a
    function of its sizes; the namespace is torch's own for its guards (``SYMPY_INTERP``)."""
    key = (code, names)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = eval(
            f"lambda {', '.join(names)}: {code}", {**guard_namespace(), "math": math}
        )  # guards' own code, printed above
        _COMPILED[key] = fn
    return fn


_COMPILED: dict[tuple[str, tuple[str, ...]], Callable[..., Any]] = {}


@dataclasses.dataclass
class _Guard:
    expr: Any  # sympy boolean over input symbols
    where: str | None
    symbols: tuple[Any, ...]
    fn: Callable[..., Any]
    # str(expr), printed once: sympy's printer costs ~1 ms, and a proof asks per size tried
    text: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.text = str(self.expr)

    def holds(self, values: Mapping[Any, int]) -> bool:
        try:
            return bool(self.fn(*(values[s] for s in self.symbols)))
        except (ArithmeticError, ValueError, TypeError):
            return False  # a size the guard cannot be evaluated at (a division by zero) is not proven


def _tried(lo: int, hi: int | None, example: int) -> tuple[list[int], bool]:
    """The sizes tried over [lo, hi] (see the module's docstring) and whether that is all of them."""
    if hi is not None and hi - lo < EXHAUSTIVE:
        return list(range(lo, hi + 1)), True
    found = set(range(lo, lo + 257))
    for k in range(1, 21):
        found.update((2**k - 1, 2**k, 2**k + 1))
    found.update((example - 1, example, example + 1))
    if hi is not None:
        found.add(hi)
    return sorted(v for v in found if v >= lo and (hi is None or v <= hi)), False


def shape_env_of(ep: torch.export.ExportedProgram) -> Any:
    """The ShapeEnv of ``ep``'s symbolic placeholder sizes (``SymInt.node.shape_env``), or None."""
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            for d in val.shape:
                if isinstance(d, torch.SymInt):
                    return shape_env_of_symint(d)
    return None


def prove(
    ep: torch.export.ExportedProgram,
    paths: Sequence[str],
    asked: Asked | None,
    names: Mapping[tuple[int, int], str | None],
) -> tuple[Proven, list[Narrowing]]:
    """What ``ep`` is proven for, and every requested dim it narrows. ``paths``: the user inputs'
    names (dynamic_shapes.input_paths); ``asked``: the requested dims' ranges, None for a program
    captured elsewhere (each symbolic dim is then checked against the range torch kept for it);
    ``names``: the dims' requested names."""
    env = shape_env_of(ep)
    dims, source = _symbolic_dims(ep)
    if env is None or not dims:
        return Proven([], []), []
    facts = _facts(env, dims)
    if asked is None:  # a program exported elsewhere: its own ranges are what was asked
        asked = {key: facts.ranges[e] for key, e in dims.items() if e.is_Symbol and e in facts.ranges}
    narrowed: list[Narrowing] = []
    kept_guards: dict[str, _Guard | None] = {}
    kept: dict[tuple[int, int], tuple[int, int | None]] = {}
    for key, (lo, hi) in asked.items():
        expr = dims.get(key)
        if expr is None or len(expr.free_symbols) != 1 or next(iter(expr.free_symbols)) not in facts.example:
            continue
        lo = max(lo, 2)
        if hi is not None and hi < lo:
            continue
        check = _check_dim(expr, lo, hi, facts, derived=isinstance(asked[key], DerivedRange))
        if not check.refused:
            kept[key] = (lo, hi)  # what was asked is what the result holds its inputs to
            continue
        index, axis = key
        causes = [_cause_text(text, guard, source, paths) for text, guard in list(check.causes.items())[:4]]
        name = names.get(key) or f"{paths[index]}_dim{axis}"
        narrowed.append(
            Narrowing(
                paths[index],
                axis,
                name,
                (lo, hi),
                check.admitted,
                check.refused,
                causes,
                check.exhaustive,
                check.sizes,
            )
        )
        kept_guards.update({text: g for text, g in check.causes.items() if g is not None})
        if check.admitted:
            kept[key] = check.bounds(lo, hi)
    return _proven(dims, facts.ranges, kept, kept_guards, source, paths), narrowed


def _symbolic_dims(
    ep: torch.export.ExportedProgram,
) -> tuple[dict[tuple[int, int], Any], dict[Any, tuple[int, int]]]:
    """The user inputs' symbolic dims, ``(index, axis) -> sympy expression``, and where each root
    symbol is first read as a dim of its own (a derived dim's root, ``n = 2*_n``, is read from none)."""
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    dims: dict[tuple[int, int], Any] = {}
    source: dict[Any, tuple[int, int]] = {}
    for index, name in enumerate(ep.graph_signature.user_inputs):
        val = nodes[name].meta.get("val") if name in nodes else None
        if not isinstance(val, torch.Tensor):
            continue
        for axis, d in enumerate(val.shape):
            expr = symint_expr(d) if isinstance(d, torch.SymInt) else None
            if expr is not None and not expr.is_number:
                dims[(index, axis)] = expr
                if expr.is_Symbol:
                    source.setdefault(expr, (index, axis))
    return dims, source


@dataclasses.dataclass
class _Facts:
    """What the capture knows of the dims' root symbols."""

    example: dict[Any, int]  # the example's value
    ranges: dict[Any, tuple[int, int | None]]  # torch's range, as ints
    guards: list[_Guard]  # over input sizes only
    related: set[Any]  # symbols a guard relates to another


def _facts(env: Any, dims: Mapping[tuple[int, int], Any]) -> _Facts:
    roots = {s for expr in dims.values() for s in expr.free_symbols}
    backed, known = backed_values(env), value_ranges(env)
    # as ints, once: sympy's int() of int_oo goes through evalf
    ranges = {s: (_int(known[s].lower) or 0, _int(known[s].upper)) for s in roots if s in known}
    guards = _input_guards(env, roots)
    # a guard over several sizes relates inputs (the mask as long as the ids and the cache together):
    # it narrows a dim only where no move of the others satisfies it (_failing). Relations are not
    # checked on the result's calls: some are the internals of an op's kernel (a contiguity test
    # over |x - y|), which ep.module() checks although the values do not depend on them
    related = {s for g in guards if len(g.symbols) > 1 for s in g.symbols}
    return _Facts({s: int(backed[s]) for s in roots if s in backed}, ranges, guards, related)


@dataclasses.dataclass
class _DimCheck:
    """One requested dim, size by size."""

    sizes: list[int]  # tried
    exhaustive: bool
    admitted: list[int] = dataclasses.field(default_factory=list)
    refused: list[int] = dataclasses.field(default_factory=list)
    skipped: list[int] = dataclasses.field(default_factory=list)  # the root at 0 or 1
    causes: dict[str, _Guard | None] = dataclasses.field(default_factory=dict)

    def bounds(self, lo: int, hi: int | None) -> tuple[int, int | None]:
        """The bounds of what was admitted, where sizes past them were refused (not skipped)."""
        fine = sorted(self.admitted + self.skipped)
        top = fine[-1] if any(v > fine[-1] for v in self.refused) else hi
        bottom = fine[0] if any(v < fine[0] for v in self.refused) else lo
        return bottom, top


def _check_dim(expr: Any, lo: int, hi: int | None, facts: _Facts, derived: bool = False) -> _DimCheck:
    """``derived``: the dim was asked as a derived dim, whose sizes are those ``expr`` takes (the others
    are not tried); otherwise a size ``expr`` never takes is one the program refuses."""
    (root,) = expr.free_symbols
    check = _DimCheck(*_tried(lo, hi, int(expr.xreplace({root: facts.example[root]}))))
    if derived:
        check.sizes = [size for size in check.sizes if _root_value(expr, root, size) is not None]
    for size in check.sizes:
        value = _root_value(expr, root, size)
        if value is not None and value < 2:
            check.skipped.append(size)  # left out as the request's own 0 and 1 are
            continue
        failing = _failing(expr, root, size, facts.example, facts.ranges, facts.guards, facts.related)
        if failing is None:
            check.admitted.append(size)
            continue
        check.refused.append(size)
        for text, guard in failing:
            check.causes.setdefault(text, guard)
    return check


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, AttributeError, OverflowError, ValueError):
        return None  # torch's int_oo, sympy's oo: unbounded


def _input_guards(env: Any, symbols: set[Any]) -> list[_Guard]:
    """The guards over input sizes alone (others read unbacked sizes, which no input gives), with
    torch's replacements applied (a mask's length replaced by the ids' length), true ones dropped,
    conjunctions split (``h // 2 >= 3 and w // 2 >= 3``: one guard over each size)."""
    import sympy

    found: list[_Guard] = []
    seen: set[Any] = set()
    parts: list[tuple[Any, Any]] = []
    for whole, where in input_guards(env):
        parts.extend((p, where) for p in (whole.args if isinstance(whole, sympy.And) else (whole,)))
    for expr, where in parts:
        if expr in seen or expr is sympy.true or not expr.free_symbols or not expr.free_symbols <= symbols:
            continue
        if _oblivious(expr):
            continue
        seen.add(expr)
        ordered = tuple(sorted(expr.free_symbols, key=str))
        fn = _compiled(sympy_python(expr), tuple(str(s) for s in ordered))
        found.append(_Guard(expr, where, ordered, fn))
    return found


_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!=", "==": "=="}


def _oblivious(expr: Any) -> bool:
    """Whether ``expr`` says a size is not 0 or 1 (``h // 2 != 1``, ``w - 1 >= 2``, ``3*b*h > 1``): what
    size-oblivious reasoning assumes of every size, computed ones included, as of the inputs' own
    (whose 0 and 1 the request leaves out), where the program is general all the same."""
    op, lhs, rhs = getattr(expr, "rel_op", None), getattr(expr, "lhs", None), getattr(expr, "rhs", None)
    if op is None or lhs is None or rhs is None:
        return False
    if lhs.is_number and not rhs.is_number:
        op, lhs, rhs = _FLIPPED[op], rhs, lhs
    if not rhs.is_number or not rhs.is_integer:
        return False
    c = int(rhs)
    scale, _ = lhs.as_coeff_Mul()  # ``16*max(1, f) != 16``: a size scaled by a constant (heads x frames)
    if scale.is_integer and int(scale) > 1 and c % int(scale) == 0:
        c //= int(scale)
    return (op == "!=" and c in (0, 1)) or (op == ">=" and c in (0, 1, 2)) or (op == ">" and c in (0, 1))


def _failing(
    expr: Any,
    root: Any,
    size: int,
    example: Mapping[Any, int],
    ranges: Mapping[Any, tuple[int, int | None]],
    guards: Sequence[_Guard],
    related: set[Any],
) -> list[tuple[str, _Guard | None]] | None:
    """Why the program is not proven at ``size`` of the dim ``expr`` (over ``root``), or None when it
    is: the guards over ``root`` alone that fail there; the guards relating it to other sizes that
    fail for every move of those sizes tried (:func:`_assignments`); the range torch kept for
    ``root`` unless such a relation (``related``) may be what bounds it (the mask's length is
    bounded by the ids' and the cache's together)."""
    value = _root_value(expr, root, size)
    if value is None:
        return [(f"the program has this dim as {expr} (a derived dim), which is never {size}", None)]
    reasons: list[tuple[str, _Guard | None]] = []
    r = ranges.get(root)
    if root not in related and r is not None and not r[0] <= value <= (value if r[1] is None else r[1]):
        reasons.append(
            (f"torch.export kept the range [{r[0]}, {'inf' if r[1] is None else r[1]}] for it", None)
        )
    alone = {root: value}
    reasons.extend((g.text, g) for g in guards if g.symbols == (root,) and not g.holds(alone))
    relations = [g for g in guards if len(g.symbols) > 1 and root in g.symbols]
    if relations:
        others = sorted({s for g in relations for s in g.symbols if s != root}, key=str)
        solvers = [solved for g in relations for t in g.symbols if t != root for solved in _solver(g, t)]
        first: list[_Guard] | None = None
        for values in _assignments(root, value, others, example, solvers):
            failed = [g for g in relations if not g.holds(values)]
            if not failed:
                first = []
                break
            first = failed if first is None else first
        reasons.extend((g.text, g) for g in first or [])
    return reasons or None


_MAX_ASSIGNMENTS = 64  # moves of the other sizes tried, per size (each also solved for, below)

Solver = tuple[Any, Callable[..., Any], tuple[Any, ...]]  # (size solved for, its function, its arguments)


def _solver(guard: _Guard, t: Any) -> list[Solver]:
    """``t`` solved from ``guard``'s boundary where it is linear in ``t`` (``mask = ids + past`` from
    ``ids + past - mask <= 0``; ``a = b*c / d`` from ``a*d == b*c``): ``[(t, fn, args)]``, else ``[]``."""
    key = (guard.text, t)
    if key not in _SOLVED:
        import sympy

        found: list[Solver] = []
        lhs, rhs = getattr(guard.expr, "lhs", None), getattr(guard.expr, "rhs", None)
        if lhs is not None and rhs is not None:
            d = sympy.expand(lhs - rhs)
            if d.is_polynomial(t) and sympy.degree(d, t) == 1:
                a = d.coeff(t)
                num, den = sympy.expand(a * t - d), a  # t = num / den
                args = tuple(sorted(num.free_symbols | den.free_symbols, key=str))
                try:  # torch's printer prints no negative powers: the division is written here
                    code = f"({sympy_python(num)}) / ({sympy_python(den)})"
                except (AssertionError, TypeError, ValueError):
                    code = None
                if code is not None:
                    found.append((t, _compiled(code, tuple(str(x) for x in args)), args))
        _SOLVED[key] = found
    return _SOLVED[key]


_SOLVED: dict[tuple[str, Any], list[Solver]] = {}


def _assignments(
    root: Any, value: int, others: Sequence[Any], example: Mapping[Any, int], solvers: Sequence[Solver] = ()
) -> Iterator[dict[Any, int]]:
    """Values of the sizes related to ``root`` for ``root`` = ``value``: the example's, those equal to
    root's moved with it, all shifted by as much; then each moved as ``root`` moved (shifted by as
    much: a mask's length that is the ids' plus the cache's; scaled: a flattened size; equal to it;
    or 1), in every combination up to
    :data:`_MAX_ASSIGNMENTS`, each also with one size solved from a relation (:func:`_solver`). A
    guard that only relates inputs holds for one of them; one that decides on ``root`` fails all."""
    base = dict(example)
    base[root] = value
    for values in _moves(root, value, others, example, base):
        yield values
        for t, fn, args in solvers:
            try:
                v = fn(*(values[x] for x in args))
            except (ArithmeticError, KeyError, TypeError, ValueError):
                continue
            if v == int(v) and v >= 1:
                yield {**values, t: int(v)}


def _moves(
    root: Any, value: int, others: Sequence[Any], example: Mapping[Any, int], base: dict[Any, int]
) -> Iterator[dict[Any, int]]:
    yield base
    delta, start = value - example[root], example[root]
    # whole moves first (a stack's caches all as long as each other): the sizes equal to root's in
    # the example moved with it, then every size shifted by as much
    yield {**base, **{s: value for s in others if example[s] == start}}
    yield {**base, **{s: example[s] + delta for s in others if example[s] + delta >= 1}}
    choices = []
    for s in others:
        e = example[s]
        found = [e, e + delta, value] + ([e * value // start] if start and (e * value) % start == 0 else [])
        # 1 too: a decode step's length (not 0: it satisfies any product trivially)
        choices.append([v for v in dict.fromkeys([*found, 1]) if v >= 1])
    for n, combo in enumerate(itertools.product(*choices)):
        if n >= _MAX_ASSIGNMENTS:
            return
        yield {**base, **dict(zip(others, combo))}


def _root_value(expr: Any, root: Any, size: int) -> int | None:
    """The root symbol's value that gives the dim ``expr`` the size ``size`` (affine dims: ``2*_n``,
    ``s + 1``), or None when none does."""
    if expr == root:
        return size
    import sympy

    a, b = expr.coeff(root), expr.xreplace({root: 0})
    if not (a.is_Integer and b.is_Integer) or sympy.expand(a * root + b - expr) != 0 or a == 0:
        return None
    value, rest = divmod(size - int(b), int(a))
    return value if rest == 0 else None


def _user_terms(expr: Any, source: Mapping[Any, tuple[int, int]], paths: Sequence[str]) -> str:
    """``expr`` over the inputs' sizes as the user writes them (``x.shape[1]``; a derived dim's root
    keeps torch's name)."""
    import sympy

    named = {s: sympy.Symbol(f"{paths[i]}.shape[{a}]", integer=True) for s, (i, a) in source.items()}
    return sympy_python(expr.xreplace(named))


def _cause_text(
    text: str, guard: _Guard | None, source: Mapping[Any, tuple[int, int]], paths: Sequence[str]
) -> str:
    if guard is None:
        return text
    where = f", made at {guard.where}" if guard.where else ""
    return f"the guard {_user_terms(guard.expr, source, paths)}{where}"


def _proven(
    dims: Mapping[tuple[int, int], Any],
    ranges: Mapping[Any, tuple[int, int | None]],
    kept: Mapping[tuple[int, int], tuple[int, int | None]],
    guards: Mapping[str, _Guard | None],
    source: Mapping[Any, tuple[int, int]],
    paths: Sequence[str],
) -> Proven:
    """Every symbolic input dim's range: the one checked against the request (``kept``), else
    torch's; and the guards kept."""
    out: list[DimRange] = []
    for (index, axis), expr in dims.items():
        lo, hi = 0, None
        if (index, axis) in kept:
            lo, hi = kept[(index, axis)]
        elif expr.is_Symbol and expr in ranges:
            lo, hi = ranges[expr]
        if hi is not None or lo > 2:
            out.append(DimRange(paths[index], index, axis, lo, hi))
    import sympy

    kept_guards = []
    for g in guards.values():
        if g is None or not all(s in source for s in g.symbols):
            continue  # over a derived dim's root, which no input gives as it is: not checkable
        names = tuple(f"_{i}" for i in range(len(g.symbols)))
        code = sympy_python(
            g.expr.xreplace({s: sympy.Symbol(n, integer=True) for s, n in zip(g.symbols, names)})
        )
        sizes = tuple((n, *source[s]) for n, s in zip(names, g.symbols))
        kept_guards.append(KeptGuard(_user_terms(g.expr, source, paths), g.where, code, sizes))
    return Proven(out, kept_guards)
