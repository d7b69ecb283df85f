"""One export, stage by stage: the options checked once (options.py), then capture -> convert ->
optimize -> write -> verify (stages.py), each stage's result adding its part of ``stats``. The report
(``diagnostics.report.ExportRecord``) follows the stages, so a failed export still says where it was."""

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
    optimized = stages.run_optimize(converted, model, options, bars)
    stats.update(optimized.stats())
    record.stage = "write"

    ep = captured.ep
    result = ExportResult(
        converted.builder, converted.layout, ep.call_spec.in_spec, ep.call_spec.out_spec, stats
    )
    result._model, result.exported_program, result._trace = model, ep, converted.interp.trace
    result.proven = proven or None
    stats.update(stages.run_write(result, optimized.referenced, options).stats())
    stages.log_summary(stats)
    if verify:
        record.stage = "verify"
        stats.update(stages.run_verify(result, args, kwargs))
    return result
