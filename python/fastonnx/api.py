"""fastonnx.to_onnx: capture, convert, optimize, write — each stage timed in ``stats``."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fastonnx import capture as capture_mod
from fastonnx import dynamic
from fastonnx import metadata as metadata_mod
from fastonnx._core import GraphBuilder
from fastonnx.context import ConversionContext
from fastonnx.errors import InputError
from fastonnx.interpreter import Interpreter
from fastonnx.opsets import ir_version_for, resolve_opset
from fastonnx.registry import Registry
from fastonnx.result import ExportResult
from fastonnx.weights import DEFERRED_KEY

log = logging.getLogger("fastonnx")

_OPTIMIZE_LEVELS = {False: "none", True: "default", "onnxruntime": "onnxruntime"}


def to_onnx(
    model: Any,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    opset: int | None = None,
    filename: str | os.PathLike[str] | None = None,
    external_data: bool | None = None,
    optimize: bool | str = True,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    custom_converters: dict[Any, Callable[..., Any]] | None = None,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    strict_dynamic: bool = True,
    metadata: bool = True,
) -> ExportResult:
    """Export ``model`` (an nn.Module or a torch.export.ExportedProgram) to ONNX.

    ``args`` is a tuple of positional inputs; tensors become graph inputs in order, named after the FX
    placeholders unless ``input_names`` is given. ``opset`` defaults to 20. ``optimize`` is False,
    True (standard ONNX) or "onnxruntime". When ``filename`` is given the model is written there
    (atomically; ``external_data=None`` switches to a ``.data`` file only past 2 GiB).

    ``dynamic_shapes`` are refined once with torch.export's suggested fixes when it refuses them
    (``stats["dynamic_shapes_refined"]``). A dim asked to be dynamic that torch.export specialises
    raises ``CaptureError`` naming the input, axis and size; ``strict_dynamic=False`` exports it with
    the fixed size and a warning instead. Safe to call from several threads: the capture is
    serialised, conversion and writing run in parallel.

    ``metadata=True`` (the default) names each node after the module it comes from
    (``/model/layers.0/self_attn/q_proj/MatMul``) and gives nodes, inputs, outputs, initializers and
    the graph the ``metadata_props`` the official exporter writes (``fastonnx.metadata``);
    ``metadata=False`` leaves all of that out: node names are op types (``MatMul_3``), the file is
    smallest.
    """
    if not isinstance(metadata, bool):
        raise InputError(f"metadata must be True or False, got {metadata!r}")
    if not isinstance(args, tuple):
        raise InputError(f"args must be a tuple of the model's positional inputs, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InputError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    if optimize not in _OPTIMIZE_LEVELS:
        raise InputError(f"optimize must be False, True or 'onnxruntime', got {optimize!r}")
    opset = resolve_opset(opset)
    if filename is not None:
        _check_writable(os.fspath(filename))
    registry = Registry(custom_converters)
    stats: dict[str, Any] = {"opset": opset}

    t0 = time.perf_counter()
    capture_mod.register_pytree_types()
    requested: dynamic.Requested = {}
    if isinstance(model, torch.nn.Module):
        dynamic_shapes, requested = dynamic.normalize(model, args, kwargs or {}, dynamic_shapes)
    ep = capture_mod.capture(model, args, kwargs, dynamic_shapes, stats, requested, strict_dynamic)
    ep = capture_mod.prepare(ep, decompositions, stats)
    t1 = time.perf_counter()
    stats["capture_s"] = t1 - t0

    builder = GraphBuilder(opset, ir_version_for(opset), producer_version=_version())
    ctx = ConversionContext(builder, opset)
    interp = Interpreter(
        ep, ctx, registry, input_names, output_names, (args, dict(kwargs or {})), requested, metadata
    )
    with torch.no_grad(), _heap_set_aside():
        layout = interp.run()
    if metadata:
        metadata_mod.graph_metadata(builder, ep)
    t2 = time.perf_counter()
    stats["convert_s"] = t2 - t1
    stats["fx_nodes"] = len(ep.graph.nodes)
    if interp.custom_used:
        stats["custom_converters_used"] = sorted(interp.custom_used)

    stats["optimize"] = builder.optimize(_OPTIMIZE_LEVELS[optimize])
    if interp.deferred:
        # the weights without bytes that the optimized graph still reads: attach_weights fills them
        deferred = {k: v for k, v in interp.deferred.items() if builder.has_initializer(k)}
        builder.set_metadata(DEFERRED_KEY, json.dumps(deferred, sort_keys=True))
        stats["deferred_weights"] = len(deferred)
    t3 = time.perf_counter()
    stats["optimize_s"] = t3 - t2
    stats["nodes"] = builder.num_nodes
    stats["initializers"] = builder.num_initializers

    call_spec = ep.call_spec
    result = ExportResult(builder, layout, call_spec.in_spec, call_spec.out_spec, stats)
    stats["write_s"] = 0.0
    if filename is not None:
        info = result.save(filename, external_data)
        stats["write_s"] = time.perf_counter() - t3
        stats["file"] = info
        if info.get("switched_to_external"):
            log.warning("model is over 2 GiB: weights written to %s", info.get("data_path"))
    log.info(
        "fastonnx: capture %.3fs, convert %.3fs, optimize %.3fs, write %.3fs, %d nodes",
        stats["capture_s"],
        stats["convert_s"],
        stats["optimize_s"],
        stats["write_s"],
        stats["nodes"],
    )
    return result


@contextlib.contextmanager
def _heap_set_aside() -> Iterator[None]:
    """The conversion with the caller's objects out of the garbage collector's sight. Importing the
    converter families a graph needs allocates enough objects to trigger a full collection, and in a
    process holding torch and transformers (~400k tracked objects) that collection took 0.23 s of a
    0.25 s first export (Mixtral, benches/job_overhead.py). gc.freeze() moves every object that exists
    now to the permanent generation, so collections during the conversion scan only what it allocates;
    gc.unfreeze() hands them back afterwards (both are O(1) list splices). A caller that froze objects
    itself (a pre-fork server) keeps its frozen set untouched: nothing is done then."""
    if gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _check_writable(path: str) -> None:
    """Fail before the (long) conversion when the file could not be written anyway."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"cannot write {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"cannot write {path!r}: folder {folder!r} is not writable")
    if os.path.isdir(path):
        raise InputError(f"cannot write {path!r}: it is a folder")


def _version() -> str:
    from fastonnx import __version__

    return __version__
