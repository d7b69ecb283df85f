"""One export, stage by stage: the options checked once (options.py), then capture -> convert ->
weights (before the passes) -> optimize -> weights (after them) -> write -> verify (stages.py), each
stage's result adding its part of ``stats``. The report (``diagnostics.report.ExportRecord``) follows
the stages, so a failed export still says where it was."""

from __future__ import annotations

from typing import Any

from fastonnx.capture import guards
from fastonnx.diagnostics.export_report import ExportRecord
from fastonnx.pipeline import stages
from fastonnx.pipeline.options import ExportOptions, new_builder
from fastonnx.progress_bars import Progress
from fastonnx.registry import Registry
from fastonnx.result import ExportResult


def run(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: ExportOptions,
    record: ExportRecord,
    verify: bool = False,
) -> ExportResult:
    """``model`` exported as ``options`` say; ``record.stage`` names the stage running, and
    ``record.stats`` holds what the finished stages reported."""
    bars = Progress(options.progress)
    registry = Registry(options.custom_converters)
    stats: dict[str, Any] = {"opset": options.opset}
    record.stats, record.registry, record.stage = stats, registry, "capture"
    with bars.timed("capture"):
        captured = stages.run_capture(model, args, kwargs, options, registry)
    stats.update(captured.stats())
    record.ep, record.stage = captured.ep, "convert"

    # the report and error dumps read the builder's state, also when the conversion fails
    record.builder = builder = new_builder(options.opset)
    converted = stages.run_convert(
        captured.ep, builder, (args, kwargs), captured.requested, options, registry, bars
    )
    stats.update(converted.stats())
    record.stage = "optimize"
    if record.path is not None:
        record.count_before_optimize(converted.builder)

    proven = captured.info.proven
    if proven:
        # what the file is right for, beside it (guards.py); the result checks its inputs against it
        builder.set_metadata(guards.METADATA_KEY, proven.to_json())
    # the weights stage around the passes: its plan before them, the weights placed after them
    planned = stages.plan_weights(converted, model, options)
    if options.shared_cache_positions is not None and options.level == "onnxruntime":
        stages.hand_known_values(builder, planned)
    optimized = stages.run_optimize(converted, options, bars)
    placed = stages.place_weights(builder, planned)
    stats.update(stages.optimize_stats(converted, optimized, placed))
    if options.output_dims:
        stages.name_output_dims(builder, options.output_dims)
    record.stage = "write"

    ep = captured.ep
    result = ExportResult(
        builder,
        converted.layout,
        ep.call_spec.in_spec,
        ep.call_spec.out_spec,
        stats,
        exported_program=ep,
        model=model,
        trace=converted.interp.trace,
        proven=proven or None,
    )
    stats.update(stages.run_write(result, placed.referenced, options).stats())
    if options.dtype is not None:
        record.stage = "half precision"
        stats.update(stages.run_half_precision(result, args, kwargs, options))
    stages.log_summary(stats)
    if verify and options.dtype is not None:
        stages.log.warning("verify: skipped with dtype=%r (its tolerances are float32's)", options.dtype)
    elif verify:
        record.stage = "verify"
        stats.update(stages.run_verify(result, args, kwargs))
    return result
