"""torch.onnx.export's ``dynamic_axes`` (TorchScript era) as the ``dynamic_shapes`` to_onnx takes.

``dynamic_axes`` is keyed by ONNX input and output names: ``{"images": {0: "batch", 2: "height"}}``,
or a list of axes (``{"x": [0]}``) whose dims torch names ``<name>_dynamic_axes_<k>`` (k from 1): the
same names are kept here. Input entries become dynamic shapes with the axis names as strings (which
to_onnx gives the ONNX dims); output entries only name the output's dims after the export.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.torch_internals import pytree

# ONNX name -> {axis: dim name}
AxisNames = dict[str, dict[int, str]]


def axis_names(dynamic_axes: Mapping[str, Any]) -> AxisNames:
    """Each entry as {axis: name}, in torch's two accepted forms."""
    if not isinstance(dynamic_axes, Mapping):
        raise InputError(
            f"dynamic_axes must be a dict {{input or output name: {{axis: dim name}} or [axes]}}, "
            f"got {type(dynamic_axes).__name__}"
        )
    out: AxisNames = {}
    for name, axes in dynamic_axes.items():
        if isinstance(axes, Mapping):
            named: dict[int, str] = {}
            for axis, dim in axes.items():
                if not isinstance(axis, int) or not isinstance(dim, str):
                    raise InputError(
                        f"dynamic_axes[{name!r}] must map int axes to dim names, got {axis!r}: {dim!r}"
                    )
                named[axis] = dim
            out[name] = named
        elif isinstance(axes, Sequence) and not isinstance(axes, str):
            if not all(isinstance(a, int) for a in axes):
                raise InputError(f"dynamic_axes[{name!r}] must be a list of int axes, got {axes!r}")
            # torch's automatic names for the list form
            out[name] = {axis: f"{name}_dynamic_axes_{k + 1}" for k, axis in enumerate(axes)}
        else:
            raise InputError(
                f"dynamic_axes[{name!r}] must be a dict {{axis: dim name}} or a list of axes, got {axes!r}"
            )
    return out


def _forward_names(model: Any, n_args: int) -> list[str]:
    fn = getattr(model, "forward", model)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"arg{i}" for i in range(n_args)]


def to_dynamic_shapes(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    axes: AxisNames,
) -> tuple[dict[str, Any] | None, AxisNames]:
    """The dynamic_shapes for the inputs (a dict keyed by forward's parameter names, None when no input
    is dynamic) and the entries that name outputs.

    The k-th tensor among the flattened (args, kwargs) is the input named ``input_names[k]``, as in
    torch.onnx.export; without input_names a top-level tensor is known by its parameter name.
    """
    top = _forward_names(model, len(args))
    values: dict[str, Any] = dict(zip(top, args))
    values.update(kwargs)
    leaves, spec = pytree.tree_flatten(values)
    tensor_names: list[str | None] = []
    k = 0
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            tensor_names.append(input_names[k] if input_names is not None and k < len(input_names) else None)
            k += 1
        else:
            tensor_names.append(None)
    if input_names is None:
        # a top-level tensor is its own leaf: name it after the parameter
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                index = _leaf_index(values, name)
                tensor_names[index] = name

    outputs = set(output_names or ())
    known = {n for n in tensor_names if n is not None}
    unknown = [n for n in axes if n not in known and n not in outputs]
    if unknown:
        raise InputError(
            f"dynamic_axes names {unknown}, which are neither inputs ({sorted(known)}) nor output_names "
            f"({list(output_names or [])})"
        )
    specs = [axes.get(n) if n is not None else None for n in tensor_names]
    output_axes = {n: a for n, a in axes.items() if n not in known}
    if not any(s is not None for s in specs):
        return None, output_axes
    for leaf, input_name, s in zip(leaves, tensor_names, specs):
        if s is not None:
            bad = [a for a in s if not -leaf.dim() <= a < leaf.dim()]
            if bad:
                raise InputError(
                    f"dynamic_axes[{input_name!r}]: axes {bad} are not axes of a {leaf.dim()}-d input"
                )
    shapes = pytree.tree_unflatten(specs, spec)
    return dict(shapes), output_axes


def _leaf_index(values: dict[str, Any], name: str) -> int:
    """Index, among the flattened leaves of ``values``, of the top-level entry ``name``."""
    index = 0
    for key, value in values.items():
        if key == name:
            return index
        index += len(pytree.tree_leaves(value))
    raise KeyError(name)  # unreachable: name is a key of values
