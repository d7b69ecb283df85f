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
from fastonnx import debug, dynamic, inplace
from fastonnx import functions as functions_mod
from fastonnx import report as report_mod
from fastonnx._core import GraphBuilder, GraphError
from fastonnx.context import ConversionContext
from fastonnx.errors import ConversionError, InputError
from fastonnx.interpreter import Interpreter
from fastonnx.interrupt import sigterm_as_interrupt
from fastonnx.opsets import ir_version_for, resolve_opset
from fastonnx.progress import Progress
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
    report: bool | str | os.PathLike[str] = False,
    verify: bool = False,
    verbose: bool = False,
    durable: bool = False,
    progress: bool | None = None,
    weights: inplace.Weights | None = None,
    export_modules_as_functions: functions_mod.Selection = False,
    cast_weights: bool = False,
    capture: str = "auto",
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

    Diagnostics (README, "When something goes wrong"): ``report=True`` or a path writes a markdown
    report (report.py says where), also when the export fails, whose exception message then ends with
    the report's path. ``verify=True`` runs the model eagerly and in onnxruntime on ``args`` and stores
    the per-output comparison in ``stats["verify"]`` (a list of ``VerificationInfo``; a disagreement is
    logged as a warning, not raised). ``verbose=True`` logs each stage through the ``fastonnx`` logger
    (to stderr when nothing else handles it) and puts the builder-state dump (``.debug``) of a
    conversion error into its message, as ``FASTONNX_DEBUG=1`` does.

    Ctrl-C stops the export within about a second at any stage (KeyboardInterrupt, the files already
    at ``filename`` untouched, no temporary left); so does SIGTERM while the export runs on the main
    thread and no handler of the program's own is installed (``fastonnx.interrupt``).
    ``durable=True`` flushes the written files and their folder to the disk before returning (for jobs
    that hand the file on at once; it costs the time the disk takes to store them). ``progress``:
    None shows a bar per stage on stderr when it is a terminal and the stage runs past a second,
    True always, False never.

    ``metadata=True`` (the default) names each node after the module it comes from
    (``/model/layers.0/self_attn/q_proj/MatMul``) and gives nodes, inputs, outputs, initializers and
    the graph the ``metadata_props`` the official exporter writes (``fastonnx.metadata``);
    ``metadata=False`` leaves all of that out: node names are op types (``MatMul_3``), the file is
    smallest.

    ``export_modules_as_functions``: False (default), True (every submodule below the root) or a set of
    nn.Module classes: each instance becomes one call of an ONNX local function (``fastonnx.functions``);
    instances with the same body share one function named after the class (``LlamaDecoderLayer``, domain
    ``pkg.transformers``), others get ``LlamaDecoderLayer_1``...; weights are passed at each call; the
    passes run inside each body and never across a call. An instance whose nodes cannot form one call
    is left inline with a warning (``stats["functions"]["inlined"]``). ``fastonnx.inline_functions``
    gives the flat model back.
    ``capture``: ``"auto"`` (the default) runs the module once on the real ``args`` and records its aten
    ops (``fastonnx.trace_capture``, the same graph as torch.export's for static shapes, without its
    fake-tensor cost per op) when ``model`` is an nn.Module, ``dynamic_shapes`` is None, no dropout or
    norm layer is in training mode and ``decompositions`` is None; otherwise, and wherever a real run could
    fix what torch.export keeps general (a tensor's value read into Python, an output size that depends
    on the data, an in-place write into an input, a weight or a buffer, a higher-order op, a recurrent
    layer, weights on the meta device, anything the recorder does not know), it captures with
    ``torch.export.export(strict=False)``, logging why at INFO level. ``"export"`` always uses
    torch.export; ``"trace"`` asks for the trace and warns when it falls back (with ``dynamic_shapes`` or
    an ExportedProgram it is an ``InputError``). ``stats["capture"]`` says which ran and
    ``stats["trace_refused"]`` why the trace did not. README, "Faster capture for static shapes".

    Weights that are not on the CPU (a model on CUDA or another accelerator) stay where they are
    while the graph is converted and optimized; each is copied to the host only when the file (or
    the in-memory model of ``result.session()``) is written, one tensor at a time: the writer's
    prefetching worker asks Python for the next weight's host copy (``t.to("cpu")``, in
    ``dtypes.tensor_bytes``, the one place a weight leaves its device) while the previous one is
    written, and drops it once written, so the host never holds more than about one weight. A CUDA
    weight is copied with the GIL held by that worker; one read through a Transpose is permuted as
    its copy is written. The model's inputs are traced on their own device.

    ``weights``: a folder of ``.safetensors`` shards, or a list of them (one folder), holding the model's
    checkpoint. The initializers found there (same key, as transformers' loading renames them, and
    shape) that the graph reads as stored are not written: their external data points into the shards;
    Linear weights are read as stored (Gemm / FusedMatMul with transB), a checkpoint float dtype
    differing from the graph's is read through a Cast (``fastonnx.inplace`` says which and how;
    ``stats["file"]["weights"]`` counts them). ``cast_weights=True`` writes those cast into
    ``<model>.onnx.data`` instead (converted piece by piece from the shards for a meta-device model). The
    model may be on the meta device. Needs ``filename``; a ``.onnx`` outside the shards' folder gets them
    hard-linked beside it.
    """
    if not isinstance(metadata, bool):
        raise InputError(f"metadata must be True or False, got {metadata!r}")
    path = report_mod.report_path(report, filename, model)
    options = {"opset": opset, "optimize": optimize, "dynamic_shapes": dynamic_shapes, "filename": filename}
    # the stages followed also without a report: an error outside any node still gets the builder's state
    record = report_mod.ExportRecord(path, model, args, dict(kwargs or {}), options)
    with sigterm_as_interrupt(), _verbose_logging(verbose), _heap_set_aside():
        try:
            result = _export(
                model,
                args,
                kwargs,
                dynamic_shapes,
                opset,
                filename,
                external_data,
                optimize,
                input_names,
                output_names,
                custom_converters,
                decompositions,
                strict_dynamic,
                record,
                durable=durable,
                progress=progress,
                metadata=metadata,
                weights=weights,
                export_modules_as_functions=export_modules_as_functions,
                cast_weights=cast_weights,
                capture=capture,
            )
            if verify:
                _verify(result, args, dict(kwargs or {}), record)
        except Exception as e:
            _explain(e, record, verbose)
            raise
    if record.path is not None:
        record.stage = "done"
        result.stats["report"] = record.write()
        log.info("report written to %s", record.path)
    return result


def _export(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    opset: int | None,
    filename: str | os.PathLike[str] | None,
    external_data: bool | None,
    optimize: bool | str,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    custom_converters: dict[Any, Callable[..., Any]] | None,
    decompositions: dict[Any, Callable[..., Any]] | None,
    strict_dynamic: bool,
    record: report_mod.ExportRecord,
    *,
    durable: bool,
    progress: bool | None,
    metadata: bool,
    weights: inplace.Weights | None = None,
    export_modules_as_functions: functions_mod.Selection = False,
    cast_weights: bool = False,
    capture: str = "auto",
) -> ExportResult:
    """The stages of to_onnx; ``record`` follows them (and what the report needs, when one is asked for)."""
    if not isinstance(args, tuple):
        raise InputError(f"args must be a tuple of the model's positional inputs, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InputError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    level = optimize_level(optimize)
    opset = resolve_opset(opset)
    functions_mod.class_filter(export_modules_as_functions)  # a bad selection fails before the capture
    bars = Progress(progress)
    if filename is not None:
        _check_writable(os.fspath(filename))
    shards = None
    if weights is not None:
        if filename is None:
            raise InputError("weights= references a checkpoint from the written file: give filename too")
        shards = inplace.shard_files(weights)
    registry = Registry(custom_converters)
    stats: dict[str, Any] = {"opset": opset}
    record.stats, record.registry, record.stage = stats, registry, "capture"

    t0 = time.perf_counter()
    with bars.timed("capture"):
        capture_mod.register_pytree_types()
        requested: dynamic.Requested = {}
        if isinstance(model, torch.nn.Module):
            dynamic_shapes, requested = dynamic.normalize(model, args, kwargs or {}, dynamic_shapes)
        ep = capture_mod.capture(
            model,
            args,
            kwargs,
            dynamic_shapes,
            stats,
            requested,
            strict_dynamic,
            how=capture,
            needs_export=_needs_export(decompositions),
            convertible=registry.converts,
        )
        ep = capture_mod.prepare(ep, decompositions, stats)
    t1 = time.perf_counter()
    stats["capture_s"] = t1 - t0
    log.info("capture: %.3fs, %d FX nodes", t1 - t0, len(ep.graph.nodes))
    record.ep, record.stage = ep, "convert"

    builder = new_builder(opset)
    ctx = ConversionContext(builder, opset)
    record.builder = builder
    interp = Interpreter(
        ep, ctx, registry, input_names, output_names, (args, dict(kwargs or {})), requested, metadata
    )
    with bars.stage("convert", unit="node") as stage, torch.no_grad():
        layout = interp.run(stage.update if stage.enabled else None)
        if not metadata:
            # names before the passes rename or remove nodes: what each FX node made (~0.3 us per
            # node); with metadata, nodes are named after the passes and found by scope (debug.Trace)
            interp.trace.node_names = builder.node_names()
    if interp.scopes is not None:
        interp.scopes.program(ep)  # the graph's metadata, composed alongside the passes
    carved = functions_mod.extract(
        builder, ep, interp.trace.steps, interp.outputs_start, export_modules_as_functions, metadata
    )
    t2 = time.perf_counter()
    stats["convert_s"] = t2 - t1
    stats["fx_nodes"] = len(ep.graph.nodes)
    if interp.custom_used:
        stats["custom_converters_used"] = sorted(interp.custom_used)
    log.info("convert: %.3fs, %d ONNX nodes", t2 - t1, builder.num_nodes)
    if record.path is not None:
        record.count_before_optimize(builder)
    record.stage = "optimize"

    plan = read_as_stored = None
    if shards is not None:
        plan = inplace.plan(interp.weights_read, interp.deferred, shards, model, cast_weights)
        # before the passes: the Linear weights to be referenced are read as stored, not pre-transposed
        read_as_stored = builder.read_weights_as_stored(plan.as_stored(), level)
    with bars.stage("optimize", unit="pass") as stage:
        # the node metadata is composed alongside the passes (Interpreter.optimize)
        stats["optimize"] = interp.optimize(level, stage.update if stage.enabled else None)
    stats["metadata_s"] = interp.metadata_s
    referenced = None
    if plan is not None:
        referenced = inplace.reference(builder, plan, read_as_stored or 0)
        # weights filled from the shards are not holes any more: attach_weights has nothing to fill there
        interp.deferred = {k: v for k, v in interp.deferred.items() if k not in referenced.filled_names}
    if interp.deferred:
        # the weights without bytes that the optimized graph still reads: attach_weights fills them
        deferred = {k: v for k, v in interp.deferred.items() if builder.has_initializer(k)}
        builder.set_metadata(DEFERRED_KEY, json.dumps(deferred, sort_keys=True))
        stats["deferred_weights"] = len(deferred)
    t3 = time.perf_counter()
    stats["optimize_s"] = t3 - t2
    stats["nodes"] = builder.num_nodes
    if carved is not None:
        carved["functions"] = [
            f"{domain}.{name}: {nodes} nodes" for domain, name, nodes in builder.functions()
        ]
        stats["functions"] = carved
    stats["initializers"] = builder.num_initializers
    log.info("optimize: %.3fs, %d ONNX nodes", t3 - t2, builder.num_nodes)
    record.stage = "write"

    call_spec = ep.call_spec
    result = ExportResult(builder, layout, call_spec.in_spec, call_spec.out_spec, stats)
    result._model, result.exported_program, result._trace = model, ep, interp.trace
    stats["write_s"] = 0.0
    if filename is not None:
        model_folder = os.path.dirname(os.path.abspath(os.fspath(filename)))
        # the writer hard-links the shards beside a model written elsewhere (renamed with the model)
        info = result.save(filename, external_data, durable=durable, progress=progress)
        if referenced is not None:
            written = info["data_bytes"] if info["data_path"] else 0
            info["weights"] = inplace.file_stats(referenced, model_folder, written)
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


def _needs_export(decompositions: dict[Any, Callable[..., Any]] | None) -> str | None:
    """Why an option of to_onnx needs torch.export's capture under capture="auto", or None. The others
    work on the trace: export_modules_as_functions (it records torch.export's nn_module_stack), weights=
    (every weight lifted under its name), report, verify and verify(intermediate=True) (they read the
    program's graph and signature), metadata; a meta-device model is refused by the trace itself."""
    if decompositions is not None:
        # run_decompositions re-traces the program with torch.export's machinery: the trace's
        # program holds ops below autograd already and no fake-tensor state to re-trace with
        return "decompositions= are applied with torch.export's run_decompositions"
    return None


def _verify(
    result: ExportResult,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    record: report_mod.ExportRecord,
) -> None:
    """to_onnx(verify=True): the per-output comparison into stats["verify"]; disagreement is a warning."""
    from fastonnx import verification

    record.stage = "verify"
    t0 = time.perf_counter()
    infos = verification.verify_outputs(result, result.eager_model(), args, kwargs, None, None)
    result.stats["verify"] = infos
    result.stats["verify_s"] = time.perf_counter() - t0
    bad = [i.name for i in infos if not i.passed]
    if bad:
        log.warning("verify: onnxruntime disagrees with PyTorch on %s", ", ".join(bad))
    log.info(
        "verify: %.3fs, %d outputs compared, %d disagree", result.stats["verify_s"], len(infos), len(bad)
    )


def _explain(e: Exception, record: report_mod.ExportRecord, verbose: bool) -> None:
    """A failed export: the builder state on the error (.debug), shown in the message when asked for,
    and the report written, its path at the end of the message."""
    if isinstance(e, (ConversionError, GraphError)):
        # an error outside any node (a refused opset, optimize): the stage, and the graph if one exists
        g = record.builder
        opset = g.opset if g is not None else record.options.get("opset")
        debug.attach(e, debug.stage_dump(g, record.stage, opset))
    if verbose or debug.env_enabled():
        debug.show_in_message(e)
    if record.path is None:
        return
    try:
        where = record.write(e)
    except Exception as write_error:  # the report must not hide the export's own error
        e.add_note(f"(the report could not be written to {record.path}: {write_error})")
        return
    if e.args and isinstance(e.args[0], str):
        e.args = (f"{e.args[0]}\n(fastonnx report: {where})", *e.args[1:])
    else:
        e.add_note(f"fastonnx report: {where}")


@contextlib.contextmanager
def _verbose_logging(verbose: bool) -> Iterator[None]:
    """verbose=True: the fastonnx logger at INFO for this call, printing to stderr when no handler of
    the application would show it."""
    if not verbose:
        yield
        return
    previous = log.level
    handler = None if log.hasHandlers() else logging.StreamHandler()
    log.setLevel(logging.INFO)
    if handler is not None:
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        log.addHandler(handler)
    try:
        yield
    finally:
        log.setLevel(previous)
        if handler is not None:
            log.removeHandler(handler)


@contextlib.contextmanager
def _heap_set_aside() -> Iterator[None]:
    """The export with the caller's objects out of the garbage collector's sight. Importing the
    converter families a graph needs allocates enough objects to trigger a full collection, and in a
    process holding torch and transformers (~400k tracked objects) that collection took 0.23 s of a
    0.25 s first export (Mixtral, benches/job_overhead.py). gc.freeze() moves every object that exists
    now to the permanent generation, so collections during the export (capture, conversion, passes
    with the metadata composed alongside them, write) scan only what it allocates; gc.unfreeze() hands
    them back afterwards (both are O(1) list splices). A caller that froze objects itself (a pre-fork
    server) keeps its frozen set untouched: nothing is done then."""
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


def optimize_level(optimize: bool | str) -> str:
    """The builder's optimize level for to_onnx's (and graph_module_to_onnx's) ``optimize``."""
    if optimize not in _OPTIMIZE_LEVELS:
        raise InputError(f"optimize must be False, True or 'onnxruntime', got {optimize!r}")
    return _OPTIMIZE_LEVELS[optimize]


def new_builder(opset: int) -> GraphBuilder:
    """An empty graph at ``opset`` (its IR version), fastonnx's version as producer."""
    from fastonnx import __version__

    return GraphBuilder(opset, ir_version_for(opset), producer_version=__version__)
