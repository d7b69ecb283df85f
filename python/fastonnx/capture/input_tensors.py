"""Which tensors of the user's arguments a capture sees as graph inputs, and the guard that none of them
became a constant of the program.

torch.export flattens the arguments with torch's pytree: a tensor leaf is a graph input, a leaf of a
basic type (None, bool, int, float, str) is baked in, and anything else is refused ("Unsupported input
type ...") unless its class is registered (``register_pytree_node``, ``torch.export.register_dataclass``,
``register_constant``). The real-tensor trace must see the same leaves; a tensor it reached any other
way (an attribute of an unregistered object, a registered constant holding one) would be recorded as a
lifted constant: a file that computes with the example's values whatever the caller passes later.

So: :func:`unsupported_leaf` names the first leaf the trace may not take (it then refuses, and
torch.export raises its own error or takes the value its way), and :func:`check_no_input_constants`
runs after every capture and raises when a CONSTANT_TENSOR of the program is memory reached through the
arguments (by storage: ``.data``, views and slices of an input's memory count too). Tensors read from a
global or a closure are lifted by torch.export as constants without a word; the trace does the same.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.export.graph_signature import InputKind

from fastonnx.errors import CaptureError
from fastonnx.torch_internals import FakeTensor, pytree

# the leaves torch.export bakes into the program (torch._export.non_strict_utils.fakify; ints may be
# made symbolic there, which a trace never does: static shapes only)
CONSTANT_LEAF_TYPES: tuple[type, ...] = (type(None), bool, int, float, str)

# values with no tensor inside to look for (modules are walked: their weights are reachable)
_OPAQUE = (
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    torch.dtype,
    torch.device,
    torch.memory_format,
    torch.layout,
)

# how many objects the walk of the arguments visits at most (a bound, not a limit met in practice: a
# KV cache of 80 layers is ~500 objects)
_MAX_VISITED = 200_000


def unsupported_leaf(args: tuple[Any, ...], kwargs: Mapping[str, Any], names: list[str]) -> str | None:
    """Why the trace may not take the pytree leaves of ``(args, kwargs)``, or None: a leaf that is neither
    a plain tensor nor a basic constant (an object of an unregistered class, a module, a dtype...).
    ``names`` are the forward's names for ``args`` then ``kwargs`` (for the message)."""
    flat = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))[0]
    for path, leaf in flat:
        if isinstance(leaf, torch.Tensor) or type(leaf) in CONSTANT_LEAF_TYPES:
            continue
        where = _path_text(path, names)
        kind = "dataclass " if dataclasses.is_dataclass(leaf) else ""
        return (
            f"input {where} is a {kind}{type(leaf).__qualname__}, which torch's pytree does not flatten "
            "(no registered pytree node): the trace would bake whatever tensors it holds into the file"
        )
    return None


def reachable_tensors(args: tuple[Any, ...], kwargs: Mapping[str, Any], names: list[str]) -> dict[int, str]:
    """Every tensor reached from the arguments (through containers, object attributes and slots, pytree
    leaves or not), by the address of its storage: {storage address: readable path}."""
    found: dict[int, str] = {}
    seen: set[int] = set()
    roots = [*args, *kwargs.values()]
    for name, value in zip(names, roots):
        for path, t in _walk(value, name, seen):
            ptr = storage_address(t)
            if ptr:
                found.setdefault(ptr, path)
    return found


def check_no_input_constants(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any], names: list[str]
) -> None:
    """Raises CaptureError when a constant tensor of ``ep`` is memory of the user's arguments."""
    constants = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.CONSTANT_TENSOR]
    if not constants:
        return
    reached = reachable_tensors(args, kwargs, names)
    if not reached:
        return
    for spec in constants:
        value = ep.constants.get(spec.target) if spec.target is not None else None
        if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor):
            continue
        path = reached.get(storage_address(value))
        if path is not None:
            raise CaptureError(
                f"the capture made the tensor at input {path!r} a constant of the program ({spec.target}): "
                "the ONNX model would compute with the example's values whatever the caller passes. Pass "
                "the tensor as an input torch's pytree flattens: a tensor argument, or inside a list, "
                "tuple, dict, NamedTuple or a class registered with torch.export.register_dataclass / "
                "torch.utils._pytree.register_pytree_node (not register_constant)"
            )


def forward_params(model: Any) -> tuple[list[str], str]:
    """The names of the forward's positional parameters, and of its ``*args`` ("args" without one)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (AttributeError, TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional, next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args")


def forward_names(model: Any, n_args: int, kwargs: Mapping[str, Any]) -> list[str]:
    """The forward's parameter names for ``n_args`` positional arguments (``*args`` as ``args_0``...),
    then the keywords' names."""
    positional, var = forward_params(model)
    names = [positional[i] if i < len(positional) else f"{var}_{i - len(positional)}" for i in range(n_args)]
    return names + list(kwargs)


def _walk(value: Any, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor reached from ``value``, each object visited once."""
    stack = [(value, path)]
    while stack and len(seen) < _MAX_VISITED:
        v, p = stack.pop()
        if isinstance(v, torch.Tensor):
            yield p, v
            continue
        if v is None or isinstance(v, _OPAQUE):
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, Mapping):
            stack.extend((item, f"{p}[{k!r}]") for k, item in v.items())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v))
        else:
            stack.extend((item, f"{p}.{k}") for k, item in _attributes(v))
    return


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    found = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                found.append((slot, getattr(obj, slot)))
    return found


def storage_address(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # meta, fake, sparse or other storage-less tensors
        return 0


def _path_text(path: tuple[Any, ...], names: list[str]) -> str:
    """``h``, ``past.0.key`` from a pytree path of ``(args, kwargs)``."""
    top, first, *rest = path
    if top.idx == 0:
        i = first.idx
        head = names[i] if i < len(names) else f"args_{i}"
    else:
        head = str(first.key)
    return repr(".".join([head, *(key_text(k) for k in rest)]))


def key_text(k: Any) -> str:
    """A pytree path entry as text: a mapping's key, a sequence's index or an attribute's name."""
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)
