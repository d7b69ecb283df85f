"""The stages of an export — capture, convert, optimize, write, verify — each a function returning a
small result that says what it made and, through ``stats()``, what ``ExportResult.stats`` reports of it.

``to_onnx`` runs them all (pipeline.run); ``graph_module_to_onnx`` (torch.compile's backends) starts at
convert, with a GraphModule seen as a program.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastonnx._core import GraphBuilder
from fastonnx.capture import CaptureInfo, capture_program, dynamic_dims, prepare, register_pytree_types
from fastonnx.context import ConversionContext
from fastonnx.pipeline.options import ExportOptions
from fastonnx.progress_bars import Progress
from fastonnx.registry import Registry
from fastonnx.result import ExportResult
from fastonnx.stored_weights import checkpoints, weight_quantization
from fastonnx.stored_weights.attach import DEFERRED_KEY
from fastonnx.walker import local_functions
from fastonnx.walker.interpreter import Interpreter, Layout

log = logging.getLogger("fastonnx")


@dataclasses.dataclass
class Captured:
    ep: torch.export.ExportedProgram
    requested: dynamic_dims.Requested
    info: CaptureInfo
    seconds: float

    def stats(self) -> dict[str, Any]:
        return {**self.info.stats(), "capture_s": self.seconds}


@dataclasses.dataclass
class Converted:
    builder: GraphBuilder
    interp: Interpreter
    layout: Layout
    carved: dict[str, Any] | None  # what the local functions' extraction did, when asked for
    seconds: float

    def stats(self) -> dict[str, Any]:
        found: dict[str, Any] = {"convert_s": self.seconds, "fx_nodes": len(self.interp.ep.graph.nodes)}
        if self.interp.custom_used:
            found["custom_converters_used"] = sorted(self.interp.custom_used)
        return found


@dataclasses.dataclass
class Optimized:
    counts: dict[str, int]  # what each pass did
    metadata_s: float
    referenced: checkpoints.Referenced | None  # weights pointing into the checkpoint's shards
    deferred: int | None  # weights without bytes, for attach_weights
    functions: dict[str, Any] | None  # the extraction's account with the functions made, when asked for
    seconds: float
    nodes: int
    initializers: int
    quantized: dict[str, Any] | None = None  # what quantize= did (stats["quantize"])

    def stats(self) -> dict[str, Any]:
        found: dict[str, Any] = {"optimize": self.counts, "metadata_s": self.metadata_s}
        if self.quantized is not None:
            found["quantize"] = self.quantized
        if self.deferred is not None:
            found["deferred_weights"] = self.deferred
        found.update(optimize_s=self.seconds, nodes=self.nodes)
        if self.functions is not None:
            found["functions"] = self.functions
        found["initializers"] = self.initializers
        return found


@dataclasses.dataclass
class Written:
    file: dict[str, Any] | None  # the writer's account of the files, when a filename was given
    seconds: float

    def stats(self) -> dict[str, Any]:
        return (
            {"write_s": self.seconds} if self.file is None else {"write_s": self.seconds, "file": self.file}
        )


def run_capture(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: ExportOptions, registry: Registry
) -> Captured:
    """The program of ``model`` (capture/), with the user's decompositions applied."""
    t0 = time.perf_counter()
    register_pytree_types()
    shapes = options.dynamic_shapes
    requested: dynamic_dims.Requested = {}
    asked: dynamic_dims.Asked = {}
    if isinstance(model, torch.nn.Module):
        shapes, requested, asked = dynamic_dims.normalize(model, args, kwargs, shapes)
    ep, info = capture_program(
        model,
        args,
        kwargs,
        shapes,
        requested=requested,
        asked=asked,
        strict_dynamic=options.strict_dynamic,
        keep_narrowed=options.keep_narrowed,
        how=options.capture,
        needs_export=needs_export(options.decompositions, registry.custom_composites()),
        convertible=registry.converts,
    )
    ep, info = prepare(ep, options.decompositions, info)
    seconds = time.perf_counter() - t0
    log.info("capture: %.3fs, %d FX nodes", seconds, len(ep.graph.nodes))
    return Captured(ep, requested, info, seconds)


def needs_export(
    decompositions: dict[Any, Callable[..., Any]] | None, custom_composites: Sequence[str] = ()
) -> str | None:
    """Why an option of to_onnx needs torch.export's capture under capture="auto", or None. The others
    work on the trace: export_modules_as_functions (it records torch.export's nn_module_stack), weights=
    (every weight lifted under its name), report, verify and verify(intermediate=True) (they read the
    program's graph and signature), metadata; a meta-device model is traced on meta tensors.
    ``custom_composites``: the composite ops custom converters are given for (Registry.custom_composites)."""
    if decompositions is not None:
        # run_decompositions re-traces the program with torch.export's machinery: the trace's
        # program holds ops below autograd already and no fake-tensor state to re-trace with
        return "decompositions= are applied with torch.export's run_decompositions"
    if custom_composites:
        # the trace runs below autograd, where a CompositeImplicitAutograd op is already decomposed
        return (
            f"custom converters are given for {', '.join(custom_composites)}, composite ops that only "
            "torch.export keeps whole"
        )
    return None


def run_convert(
    ep: torch.export.ExportedProgram,
    builder: GraphBuilder,
    user_args: tuple[tuple[Any, ...], dict[str, Any]],
    requested: dynamic_dims.Requested,
    options: ExportOptions,
    registry: Registry,
    bars: Progress | None = None,
    *,
    program: bool = True,
) -> Converted:
    """One converter call per FX node into ``builder`` (new: options.new_builder); modules carved into
    local functions when asked for. ``user_args``: the inputs as given (names and dims of the graph
    inputs). ``program=False`` for a GraphModule (graph_module.py): it has no signature or range
    constraints for the graph's metadata."""
    t0 = time.perf_counter()
    builder.value_info = options.value_info  # written by the Rust writer from the types the walk records
    interp = Interpreter(
        ep,
        ConversionContext(builder, options.opset),
        registry,
        options.input_names,
        options.output_names,
        user_args,
        requested,
        options.metadata,
    )
    bars = bars or Progress(False)
    with bars.stage("convert", unit="node") as stage, torch.no_grad():
        layout = interp.run(stage.update if stage.enabled else None)
        if not options.metadata:
            # names before the passes rename or remove nodes: what each FX node made (~0.3 us per
            # node); with metadata, nodes are named after the passes and found by scope (debug.Trace)
            interp.trace.node_names = builder.node_names()
    if interp.scopes is not None and program:
        interp.scopes.program(ep)  # the graph's metadata, composed alongside the passes
    carved = local_functions.extract(
        builder, ep, interp.trace.steps, interp.outputs_start, options.functions, options.metadata
    )
    seconds = time.perf_counter() - t0
    log.info("convert: %.3fs, %d ONNX nodes", seconds, builder.num_nodes)
    return Converted(builder, interp, layout, carved, seconds)


def run_optimize(
    converted: Converted, model: Any, options: ExportOptions, bars: Progress | None = None
) -> Optimized:
    """The passes at the options' level (node metadata composed alongside them); checkpoint weights
    referenced in place; the weights still without bytes recorded for attach_weights."""
    t0 = time.perf_counter()
    builder, interp = converted.builder, converted.interp
    plan = read_as_stored = quantized = None
    if options.shards is not None:
        plan = checkpoints.plan_references(
            interp.weights_read, interp.deferred, options.shards, model, options.cast_weights
        )
    if options.quantize is not None:
        # before the passes: the products' weights read quantized (computed by the writer as it
        # streams); those a checkpoint holds are read from it, not referenced
        quantized, from_shards = weight_quantization.quantize_weights(
            builder,
            options.quantize,
            model,
            options.level,
            interp.weights_read,
            interp.deferred,
            plan.entries if plan is not None else None,
        )
        interp.deferred = {k: v for k, v in interp.deferred.items() if k not in from_shards}
        if plan is not None:
            plan.entries = {k: v for k, v in plan.entries.items() if k not in from_shards}
    if plan is not None:
        # before the passes: the Linear weights to be referenced are read as stored, not pre-transposed
        read_as_stored = builder.read_weights_as_stored(plan.as_stored(), options.level)
    bars = bars or Progress(False)
    with bars.stage("optimize", unit="pass") as stage:
        counts = interp.optimize(options.level, stage.update if stage.enabled else None)
    referenced = None
    if plan is not None:
        referenced = checkpoints.reference(builder, plan, read_as_stored or 0)
        # weights filled from the shards are not holes any more: attach_weights has nothing to fill there
        interp.deferred = {k: v for k, v in interp.deferred.items() if k not in referenced.filled_names}
    deferred = _record_deferred(builder, interp.deferred)
    carved = None
    if converted.carved is not None:
        made = [f"{domain}.{name}: {nodes} nodes" for domain, name, nodes in builder.functions()]
        carved = {**converted.carved, "functions": made}
    seconds = time.perf_counter() - t0
    log.info("optimize: %.3fs, %d ONNX nodes", seconds, builder.num_nodes)
    return Optimized(
        counts,
        interp.metadata_s,
        referenced,
        deferred,
        carved,
        seconds,
        builder.num_nodes,
        builder.num_initializers,
        quantized,
    )


def _record_deferred(builder: GraphBuilder, deferred: dict[str, Any]) -> int | None:
    """The weights without bytes that the optimized graph still reads, in the file's metadata
    (attach_weights fills them); how many, or None when there are none."""
    if not deferred:
        return None
    kept = {k: v for k, v in deferred.items() if builder.has_initializer(k)}
    builder.set_metadata(DEFERRED_KEY, json.dumps(kept, sort_keys=True))
    return len(kept)


def run_write(
    result: ExportResult, referenced: checkpoints.Referenced | None, options: ExportOptions
) -> Written:
    """The files at ``options.filename`` (nothing without one); the shards' hard links accounted."""
    if options.filename is None:
        return Written(None, 0.0)
    t0 = time.perf_counter()
    info = result.save(
        options.filename, options.external_data, durable=options.durable, progress=options.progress
    )
    if referenced is not None:
        written = info["data_bytes"] if info["data_path"] else 0
        folder = os.path.dirname(os.path.abspath(options.filename))
        info["weights"] = checkpoints.file_stats(referenced, folder, written)
    if info.get("switched_to_external"):
        log.warning("model is over 2 GiB: weights written to %s", info.get("data_path"))
    return Written(info, time.perf_counter() - t0)


def run_verify(result: ExportResult, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """to_onnx(verify=True): the per-output comparison (``stats["verify"]``); a disagreement is a
    warning, not an error."""
    from fastonnx.diagnostics import verification

    t0 = time.perf_counter()
    infos = verification.verify_outputs(result, result.eager_model(), args, kwargs, None, None)
    seconds = time.perf_counter() - t0
    bad = [i.name for i in infos if not i.passed]
    if bad:
        log.warning("verify: onnxruntime disagrees with PyTorch on %s", ", ".join(bad))
    log.info("verify: %.3fs, %d outputs compared, %d disagree", seconds, len(infos), len(bad))
    return {"verify": infos, "verify_s": seconds}


def log_summary(stats: dict[str, Any]) -> None:
    log.info(
        "fastonnx: capture %.3fs, convert %.3fs, optimize %.3fs, write %.3fs, %d nodes",
        stats["capture_s"],
        stats["convert_s"],
        stats["optimize_s"],
        stats["write_s"],
        stats["nodes"],
    )
