"""Modules as ONNX local functions: ``to_onnx(export_modules_as_functions=...)``, and
``inline_functions`` to get the flat graph back.

Each FX node's ``nn_module_stack`` says which module instances it runs in. After conversion, every ONNX
node of the top graph gets the path of the selected instances of the FX node that made it (outermost
first); the builder then carves each instance's nodes into one body and replaces them by one call
(``rust/core/src/functions.rs``). Bodies with the same structure share one ``FunctionProto``, named
after the class (``LlamaDecoderLayer``) in the domain of its package (``pkg.transformers``); bodies of
one class that differ (another config) get ``LlamaDecoderLayer_1``, ``_2``... in the order met. A
module called twice gives two calls (torch.export tells the calls apart: ``layer@1``).

An instance whose nodes cannot form one call (a value computed inside it reaches its own later nodes
only through nodes outside it) is left inline, with a warning on the ``fastonnx`` logger naming it
(``stats["functions"]["inlined"]``): the export still succeeds, as flat as without the option.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fastonnx._core import GraphBuilder
from fastonnx.errors import InputError
from fastonnx.walker import node_metadata

if TYPE_CHECKING:
    import onnx

log = logging.getLogger("fastonnx")

Selection = bool | set[type] | frozenset[type] | Sequence[type] | None


def class_filter(option: Selection) -> tuple[bool, frozenset[str]] | None:
    """None when nothing is carved; else (every module?, qualified names of the selected classes)."""
    if option is None or option is False:
        return None
    if option is True:
        return True, frozenset()
    if isinstance(option, (set, frozenset, list, tuple)):
        names = set()
        for cls in option:
            if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                raise InputError(
                    "export_modules_as_functions takes False, True or a set of nn.Module classes; "
                    f"{cls!r} is not an nn.Module class"
                )
            names.add(f"{cls.__module__}.{cls.__qualname__}")
        return (False, frozenset(names)) if names else None
    raise InputError(
        f"export_modules_as_functions must be False, True or a set of nn.Module classes, got {option!r}"
    )


def _qualified(cls: Any) -> str:
    return node_metadata._qualified(cls)


def _call_scope(g: GraphBuilder, stack: dict[str, Any], key: str, with_metadata: bool) -> int | None:
    """The scope of a call node: the module's name prefix and the official exporter's keys, as for a
    node made in that module (namespace ``model.layers.0: ...LlamaDecoderLayer``)."""
    if not with_metadata:
        return None
    keys = list(stack)
    upto = {k: stack[k] for k in keys[: keys.index(key) + 1]}
    levels = node_metadata._ModuleLevels(None)
    for path, cls in upto.values():
        levels = node_metadata._ModuleLevels(levels, str(path), cls)
    props = [
        (node_metadata.NAMESPACE, levels.namespace.rstrip("/")),
        (node_metadata.CLASS_HIERARCHY, repr([_qualified(cls) for _, cls in upto.values()])),
        (node_metadata.NAME_SCOPES, repr([str(path) for path, _ in upto.values()])),
    ]
    return g.add_scope(levels.prefix, props)


def extract(
    g: GraphBuilder,
    ep: torch.export.ExportedProgram,
    steps: list[tuple[str, int, Any]],
    outputs_start: int,
    option: Selection,
    with_metadata: bool,
) -> dict[str, Any] | None:
    """Carves the selected module instances of the converted top graph into local functions.
    ``steps`` are the walker's trace (FX node name, index of its first ONNX node); nodes from
    ``outputs_start`` on were made for the graph outputs and stay in the main graph."""
    selection = class_filter(option)
    if selection is None:
        return None
    every, names = selection
    fx_nodes = {n.name: n for n in ep.graph.nodes}
    instance_of: dict[str, int] = {}
    instances: list[tuple[str, str, int | None, str]] = []
    paths: list[list[int]] = [[] for _ in range(g.num_nodes)]
    stops = [start for _, start, _ in steps[1:]] + [outputs_start]
    path_cache: dict[tuple[str, ...], list[int]] = {}
    for (fx_name, start, _), stop in zip(steps, stops, strict=True):
        node = fx_nodes.get(fx_name)
        stack: dict[str, Any] = (node.meta.get("nn_module_stack") if node is not None else None) or {}
        cache_key = tuple(stack)
        path = path_cache.get(cache_key)
        if path is None:
            path = []
            for key, (module_path, cls) in stack.items():
                qualified = _qualified(cls)
                if not module_path or not (every or qualified in names):
                    continue  # the root module is the main graph
                if "." not in qualified:
                    continue  # no module: torch.export's placeholder stack for nodes it made itself
                index = instance_of.get(key)
                if index is None:
                    index = instance_of[key] = len(instances)
                    class_name = qualified.rsplit(".", 1)[-1]
                    domain = "pkg." + qualified.split(".", 1)[0]
                    call = key.rsplit("@", 1)[1] if "@" in key else None
                    label = f"{module_path} ({class_name})" + (f", call {int(call) + 1}" if call else "")
                    instances.append((domain, class_name, _call_scope(g, stack, key, with_metadata), label))
                path.append(index)
            path_cache[cache_key] = path
        for i in range(start, min(stop, g.num_nodes)):
            paths[i] = path
    if not every and not instances:
        log.warning(
            "export_modules_as_functions: no module of the classes %s runs in the model", sorted(names)
        )
    calls, inlined = g.extract_functions(paths, instances)
    for message in inlined:
        log.warning("export_modules_as_functions: %s", message)
    return {"calls": calls, "inlined": inlined}


def inline_functions(
    model: str | os.PathLike[str] | onnx.ModelProto, output: str | os.PathLike[str] | None = None
) -> onnx.ModelProto:
    """The model with every local function call replaced by the function's body (onnx's
    ``onnx.inliner.inline_local_functions``), for consumers that want a flat graph. ``model`` is a
    path or a ModelProto; a path's external data is loaded. With ``output`` the flat model is saved
    there too (weights inline, or in ``<output>.data`` past 2 GiB)."""
    # imported by whoever calls this, not by `import fastonnx` (the import-cost guard)
    import onnx
    import onnx.inliner

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    flat = onnx.inliner.inline_local_functions(proto)
    # the functions' own domains have no operator left to import
    gone = {f.domain for f in proto.functions} - {n.domain for n in flat.graph.node}
    kept = [o for o in flat.opset_import if o.domain not in gone]
    del flat.opset_import[:]
    flat.opset_import.extend(kept)
    if output is not None:
        weights = sum(len(t.raw_data) for t in flat.graph.initializer)
        large = weights > 2**31 - (64 << 20)  # the protobuf limit, less room for the graph itself
        onnx.save(
            flat,
            os.fspath(output),
            save_as_external_data=large,
            location=os.path.basename(os.fspath(output)) + ".data",
        )
    return flat
