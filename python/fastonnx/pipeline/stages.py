"""The stages of an export — capture, convert, weights, optimize, write, verify — each a function
returning a small result that says what it made and, through ``stats()``, what ``ExportResult.stats``
reports of it. The weights stage runs in two steps around the passes (``plan_weights``,
``place_weights``); ``optimize_stats`` gives the optimize part of the stats from both and the passes.

``to_onnx`` runs them all (pipeline.run); ``graph_module_to_onnx`` (torch.compile's backends) starts at
convert, with a GraphModule seen as a program, and stops before the write.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fastonnx._core import GraphBuilder
from fastonnx.capture import CaptureInfo, capture_program, dynamic_dims, prepare, register_pytree_types
from fastonnx.capture.fused_experts import fused_experts
from fastonnx.capture.meta_constants import numbers_on_cpu
from fastonnx.context import ConversionContext
from fastonnx.errors import InputError
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


@dataclasses.dataclass(frozen=True)
class WeightsPlanned:
    """The weights stage before the passes (``plan_weights``): what it decided and rewrote."""

    plan: checkpoints.ReferencePlan | None  # the checkpoint tensors to reference after the passes
    deferred: dict[str, str]  # initializer -> state-dict key of the weights still without bytes
    quantized: dict[str, Any] | None  # what quantize= did (stats["quantize"])
    read_as_stored: int  # Linear products rewritten to read their weight as stored
    seconds: float


@dataclasses.dataclass(frozen=True)
class WeightsPlaced:
    """The weights stage once done (``place_weights``, after the passes): where the weights went."""

    referenced: checkpoints.Referenced | None  # weights pointing into the checkpoint's shards
    # the weights without bytes the file's metadata lists for attach_weights; None when there are none
    deferred: dict[str, str] | None
    quantized: dict[str, Any] | None  # what quantize= did (stats["quantize"])
    seconds: float  # both steps

    def stats(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.quantized is not None:
            found["quantize"] = self.quantized
        if self.deferred is not None:
            found["deferred_weights"] = len(self.deferred)
        return found


@dataclasses.dataclass(frozen=True)
class Optimized:
    """The passes (``run_optimize``)."""

    counts: dict[str, int]  # what each pass did
    metadata_s: float  # composing the node metadata, alongside the passes
    seconds: float


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
    # every strategy: numbers a forward makes into tensors on the CPU, not the meta device; quantized at
    # the onnxruntime level, transformers' SwiGLU experts as one op (QMoE, stored_weights/)
    with numbers_on_cpu(), fused_experts(options.quantize is not None and options.level == "onnxruntime"):
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


# ---- the weights stage ---------------------------------------------------------------------------
# Where each weight the converted graph reads goes: referenced in place in the checkpoint's shards
# (weights=), quantized (quantize=), written, or left a hole for attach_weights (a meta-device model).
# It runs in two steps around the passes, because the passes must see the weights as they will be
# stored (a referenced Linear weight read untransposed, a quantized product already rewritten) and
# only after them is it known which initializers survive: ``plan_weights`` before, ``place_weights``
# after, the first's result handed to the second. Functions here rather than a module of
# stored_weights/: like every stage they read ExportOptions (the pipeline's; stored_weights sits below
# the pipeline and does not import it) and give their part of ExportResult.stats; the pieces they
# call (checkpoints, weight_quantization, attach's metadata key) stay in stored_weights/. Neither
# step changes the converter's records (``Interpreter.deferred``, ``weights_read``) or a plan once
# made: what is still deferred, and which plan entries remain, are new dicts in its result.


def plan_weights(converted: Converted, model: Any, options: ExportOptions) -> WeightsPlanned:
    """The weights stage before the passes: the checkpoint's tensors matched (weights=), the products'
    weights rewritten to be read quantized (quantize=; computed by the writer as it streams, those a
    checkpoint holds read from it and no longer referenced), the Linear weights to be referenced read
    as stored (not pre-transposed by the passes)."""
    t0 = time.perf_counter()
    builder, interp = converted.builder, converted.interp
    deferred = dict(interp.deferred)
    plan = quantized = None
    if options.shards is not None:
        plan = checkpoints.plan_references(
            interp.weights_read, interp.deferred, options.shards, model, options.cast_weights
        )
    if options.quantize is not None:
        quantized, from_shards = weight_quantization.quantize_weights(
            builder,
            options.quantize,
            model,
            options.level,
            interp.weights_read,
            interp.deferred,
            plan.entries if plan is not None else None,
        )
        # read from the shards by the quantizer: neither a hole nor a tensor to reference any more
        deferred = {k: v for k, v in deferred.items() if k not in from_shards}
        if plan is not None:
            plan = plan.without(from_shards)
    read_as_stored = 0
    if plan is not None:
        read_as_stored = builder.read_weights_as_stored(plan.as_stored(), options.level)
    return WeightsPlanned(plan, deferred, quantized, read_as_stored, time.perf_counter() - t0)


KNOWN_VALUES_BYTES = 1 << 16
"""The largest float32 tensor of the shards whose values the passes are handed (rotary frequencies)."""


def hand_known_values(builder: GraphBuilder, planned: WeightsPlanned) -> None:
    """The values of the small float32 tensors the plan reads from the shards, for the passes that need
    them (GroupQueryAttention's rotary tables from the frequencies; the file still references them)."""
    if planned.plan is None:
        return
    for name, (tensor, _) in planned.plan.entries.items():
        if tensor.dtype in (torch.float32, "F32") and tensor.length <= KNOWN_VALUES_BYTES:
            with open(tensor.shard, "rb") as f:
                f.seek(tensor.offset)
                builder.set_known_values(name, f.read(tensor.length))


def place_weights(builder: GraphBuilder, planned: WeightsPlanned) -> WeightsPlaced:
    """The weights stage after the passes: the planned initializers that survived pointed at the
    shards; the weights still without bytes that the graph reads listed in the file's metadata
    (attach_weights fills them)."""
    t0 = time.perf_counter()
    deferred, referenced = planned.deferred, None
    if planned.plan is not None:
        referenced = checkpoints.reference(builder, planned.plan, planned.read_as_stored)
        # weights filled from the shards are not holes any more: attach_weights has nothing to fill there
        deferred = {k: v for k, v in deferred.items() if k not in referenced.filled_names}
    recorded = _record_deferred(builder, deferred)
    seconds = planned.seconds + time.perf_counter() - t0
    return WeightsPlaced(referenced, recorded, planned.quantized, seconds)


def _record_deferred(builder: GraphBuilder, deferred: dict[str, str]) -> dict[str, str] | None:
    """The weights without bytes that the optimized graph still reads, in the file's metadata
    (attach_weights fills them); None when there are none."""
    if not deferred:
        return None
    kept = {k: v for k, v in deferred.items() if builder.has_initializer(k)}
    builder.set_metadata(DEFERRED_KEY, json.dumps(kept, sort_keys=True))
    return kept


# ---- the passes -------------------------------------------------------------------------------------
def run_optimize(converted: Converted, options: ExportOptions, bars: Progress | None = None) -> Optimized:
    """The builder's passes at the options' level, and nothing else. With metadata, the node metadata
    (``node_metadata.Scopes.compose``) is composed alongside them: on a second thread, while the passes
    run on this one without the GIL. The passes have not decided yet which nodes survive, so every
    scope with a node is composed; ``metadata_s`` is the time that took (overlapping the passes). The
    metadata of inputs, initializers and the graph is composed there too and given to the builder
    after the passes; the nodes are then named from their scopes, and the trace (debug.Trace) finds
    them by scope from then on."""
    t0 = time.perf_counter()
    builder, interp = converted.builder, converted.interp
    bars = bars or Progress(False)
    metadata_s = 0.0
    if options.shared_cache_mask is not None and options.level == "onnxruntime":
        builder.set_shared_cache_mask(options.shared_cache_mask)
        if options.shared_cache_positions is not None:
            builder.set_shared_cache_positions(options.shared_cache_positions)
        if options.shared_cache_windows:
            builder.set_shared_cache_windows(dict(options.shared_cache_windows))
    with bars.stage("optimize", unit="pass") as stage:
        progress = stage.update if stage.enabled else None
        scopes = interp.scopes
        if scopes is None:
            counts = builder.optimize(options.level, progress)
        else:
            table = builder.scope_table()
            # the scopes of FX nodes that made no ONNX node (~13% of a Llama's) are left out already
            made = builder.used_scopes()

            def compose() -> None:
                nonlocal metadata_s
                start = time.perf_counter()
                scopes.compose(table, used=set(made))
                metadata_s = time.perf_counter() - start

            counts = builder.optimize(options.level, progress, alongside=compose)
            scopes.apply(builder)
            builder.name_nodes_by_scope()
            interp.trace.scopes, interp.trace.builder = scopes, builder
    seconds = time.perf_counter() - t0
    log.info("optimize: %.3fs, %d ONNX nodes", seconds, builder.num_nodes)
    return Optimized(counts, metadata_s, seconds)


def optimize_stats(converted: Converted, optimized: Optimized, weights: WeightsPlaced) -> dict[str, Any]:
    """The optimize part of ExportResult.stats, in the order to_onnx has always given it: the passes'
    counts and metadata time, the weights stage's accounts, ``optimize_s`` (the passes and both steps
    of the weights stage), and the graph the writer gets (nodes, local functions, initializers), read
    now that both are done."""
    builder = converted.builder
    found: dict[str, Any] = {"optimize": optimized.counts, "metadata_s": optimized.metadata_s}
    found.update(weights.stats())
    found.update(optimize_s=optimized.seconds + weights.seconds, nodes=builder.num_nodes)
    if converted.carved is not None:
        made = [f"{domain}.{name}: {nodes} nodes" for domain, name, nodes in builder.functions()]
        found["functions"] = {**converted.carved, "functions": made}
    found["initializers"] = builder.num_initializers
    return found


def name_output_dims(builder: GraphBuilder, output_dims: Mapping[str, Mapping[int, str]]) -> None:
    """``ExportOptions.output_dims``: the outputs' dims named as fastonnx.export's dynamic_axes ask,
    before the write (the symbolic ones; a dim torch.export fixed stays fixed, with a warning)."""
    outputs = set(builder.output_names())
    for name, axes in output_dims.items():
        if name not in outputs:
            raise InputError(f"dynamic_axes names output {name!r}, which the model does not have")
        shape = builder.shape(name)
        if shape is None:
            continue
        for axis, dim in axes.items():
            if not -len(shape) <= axis < len(shape):
                raise InputError(
                    f"dynamic_axes[{name!r}]: axis {axis} is not an axis of a {len(shape)}-d output"
                )
            if isinstance(shape[axis], int):
                log.warning(
                    "output %r dim %d was asked to be dynamic but is fixed at %d in the exported graph",
                    name,
                    axis,
                    shape[axis],
                )
                continue
            shape[axis] = dim
        builder.set_type(name, builder.dtype(name), shape)


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


def run_half_precision(
    result: ExportResult, args: tuple[Any, ...], kwargs: dict[str, Any], options: ExportOptions
) -> dict[str, Any]:
    """to_onnx(dtype=): the written float32 file run on the example inputs with its intermediate values
    as outputs (their magnitudes; not with meta-device inputs), converted to the half type
    (half_precision.py) and written over itself. ``stats["half_precision"]``: the nodes kept float32 by
    reason and the share of MatMul work in the half type."""
    import onnx

    from fastonnx import half_precision

    assert options.dtype is not None and result.path is not None
    t0 = time.perf_counter()
    feeds = result._feeds(args, kwargs)
    ranges = None
    if options.dtype == "fp16":
        if any(t.device.type == "meta" for t in feeds.values()):
            log.warning("dtype='fp16': meta-device inputs cannot be run, no value's range is recorded")
        else:
            arrays = {k: v.detach().cpu().numpy() for k, v in feeds.items()}
            ranges = half_precision.record_ranges(result.path, [arrays])
    model = onnx.load(result.path, load_external_data=False)
    folder = os.path.dirname(os.path.abspath(result.path))
    converted = half_precision.convert(
        model, options.dtype, ranges=ranges, keep_io_types=options.keep_io_types, base_dir=folder
    )
    onnx.save(converted.model, result.path)
    result.reset_caches()
    result.converted_file = True
    sizes = {
        d.dim_param: int(feeds[v.name].shape[i])
        for v in converted.model.graph.input
        if v.name in feeds
        for i, d in enumerate(v.type.tensor_type.shape.dim)
        if d.dim_param and i < feeds[v.name].dim()
    }
    share = half_precision.half_share(half_precision.matmul_flops(converted.model, sizes), options.dtype)
    return {
        "half_precision": {
            "dtype": options.dtype,
            "kept_float32": converted.reasons(),
            "matmul_share": share,
            "casts": converted.casts,
            "calibrated": ranges is not None,
        },
        "half_precision_s": time.perf_counter() - t0,
    }


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
