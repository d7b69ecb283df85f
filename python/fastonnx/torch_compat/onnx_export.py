"""``fastonnx.export``: torch.onnx.export's signature (TorchScript-era and dynamo-era keywords) on
fastonnx's exporter. Every keyword of the pinned torch's torch.onnx.export is listed in ``KEYWORDS``
with what it does here: mapped to to_onnx, ignored (one log line when set to a non-default value), or
refused (InputError) where honouring it is impossible. tests/test_torch_compat.py checks that the list
matches torch's signature, so a torch upgrade that adds a keyword fails there first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import IO, Any, Literal

import torch

from fastonnx import onnxscript_converters
from fastonnx.api import _verbose_logging, run_export
from fastonnx.errors import InputError
from fastonnx.registry import op_key
from fastonnx.torch_compat import dynamic_axes as axes_mod
from fastonnx.torch_compat.program import ONNXProgram, check_file_object, write_bytes
from fastonnx.torch_internals import onnx_exporting

log = logging.getLogger("fastonnx")

Handling = Literal["mapped", "ignored", "refused"]

# What each of torch.onnx.export's keywords does in fastonnx.export (the README's table says the same).
# "refused" means refused unless it has its default (harmless) value.
KEYWORDS: dict[str, Handling] = {
    "kwargs": "mapped",
    "verbose": "mapped",
    "input_names": "mapped",
    "output_names": "mapped",
    "opset_version": "mapped",
    "dynamo": "mapped",
    "external_data": "mapped",
    "dynamic_shapes": "mapped",
    "custom_translation_table": "mapped",
    "report": "mapped",
    "optimize": "mapped",
    "verify": "mapped",
    "profile": "ignored",
    "dump_exported_program": "mapped",
    "artifacts_dir": "mapped",
    "export_params": "refused",
    "keep_initializers_as_inputs": "refused",
    "dynamic_axes": "mapped",
    "training": "mapped",
    "operator_export_type": "refused",
    "do_constant_folding": "ignored",
    "custom_opsets": "ignored",
    "export_modules_as_functions": "mapped",
    "autograd_inlining": "ignored",
}


_CAPTURE_WHY = {
    "trace": "the model runs once on the example inputs, as the TorchScript exporter traced it",
    "export": "dynamic shapes or an ExportedProgram need torch.export",
}
"""Why dynamo=False captures as it does (logged). dynamo=True leaves to_onnx's capture="auto": the trace
for static shapes where it stands for torch.export, torch.export otherwise, both without a warning."""


def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...] | torch.Tensor = (),
    f: str | os.PathLike[str] | IO[bytes] | None = None,
    *,
    kwargs: dict[str, Any] | None = None,
    verbose: bool | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset_version: int | None = None,
    dynamo: bool = True,
    external_data: bool | None = None,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
    custom_translation_table: dict[Callable[..., Any], Any] | None = None,
    report: bool = False,
    optimize: bool | str = True,
    verify: bool = False,
    profile: bool = False,
    dump_exported_program: bool = False,
    artifacts_dir: str | os.PathLike[str] = ".",
    export_params: bool = True,
    keep_initializers_as_inputs: bool | None = False,
    dynamic_axes: Mapping[str, Mapping[int, str]] | Mapping[str, Sequence[int]] | None = None,
    training: Any = None,
    operator_export_type: Any = None,
    do_constant_folding: bool = True,
    custom_opsets: Mapping[str, int] | None = None,
    export_modules_as_functions: bool | Collection[type[torch.nn.Module]] = False,
    autograd_inlining: bool = True,
    custom_converters: dict[Any, Any] | None = None,
    keep_narrowed: bool = False,
) -> ONNXProgram:
    """Export like ``torch.onnx.export(model, args, f, ...)``, with fastonnx.

    ``args`` is a tuple or a single tensor; a trailing dict in the tuple is taken as keyword inputs
    when ``kwargs`` is not given (torch's TorchScript-era convention). ``f`` is a path, a PathLike,
    a binary file object (the bytes are written into it), or None (nothing written). Returns an
    ``ONNXProgram`` in every case (torch returns None with ``dynamo=False``; callers ignore it then).

    Differences from torch, by design: ``dynamo=True`` captures as to_onnx's default
    ``capture="auto"`` does (the real-tensor trace for static shapes where it gives torch.export's
    graph, torch.export otherwise); ``dynamo=False`` uses the trace (with a warning where it falls back
    to torch.export) unless dynamic axes or an ExportedProgram need torch.export; ``opset_version=None`` means fastonnx's default (20); ``external_data=None`` (the
    default here) keeps the weights in the .onnx file up to 2 GiB, like the TorchScript exporter;
    ``output_names`` must name every tensor output; a dim asked to be dynamic that torch.export
    specialises is exported with its fixed size and a warning (to_onnx's ``strict_dynamic=False``),
    but one whose program is right at some of the asked sizes only is refused as to_onnx refuses it
    (``keep_narrowed``, fastonnx's own keyword like ``custom_converters``: torch would write a file
    that answers wrong at the other sizes);
    ``custom_translation_table``'s script functions are inlined rather than written as local functions,
    a list of functions is taken as overloads chosen by input types (torch 2.14 refuses lists) and an
    overload packet as each of its overloads (docs/migrating.md, "Translation tables"). See the README,
    "Switching from torch.onnx.export", for the table of every keyword.
    """
    with _verbose_logging(bool(verbose)):
        return _export(
            model,
            args,
            f,
            kwargs=kwargs,
            input_names=input_names,
            output_names=output_names,
            opset_version=opset_version,
            dynamo=dynamo,
            external_data=external_data,
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=custom_translation_table,
            report=report,
            optimize=optimize,
            verify=verify,
            profile=profile,
            dump_exported_program=dump_exported_program,
            artifacts_dir=artifacts_dir,
            export_params=export_params,
            keep_initializers_as_inputs=keep_initializers_as_inputs,
            dynamic_axes=dynamic_axes,
            training=training,
            operator_export_type=operator_export_type,
            do_constant_folding=do_constant_folding,
            custom_opsets=custom_opsets,
            export_modules_as_functions=export_modules_as_functions,
            autograd_inlining=autograd_inlining,
            custom_converters=custom_converters,
            keep_narrowed=keep_narrowed,
        )


def _export(
    model: Any,
    args: Any,
    f: Any,
    *,
    kwargs: dict[str, Any] | None,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    opset_version: int | None,
    dynamo: bool,
    external_data: bool | None,
    dynamic_shapes: Any,
    custom_translation_table: Any,
    report: bool,
    optimize: bool | str,
    verify: bool,
    profile: bool,
    dump_exported_program: bool,
    artifacts_dir: str | os.PathLike[str],
    export_params: bool,
    keep_initializers_as_inputs: bool | None,
    dynamic_axes: Any,
    training: Any,
    operator_export_type: Any,
    do_constant_folding: bool,
    custom_opsets: Mapping[str, int] | None,
    export_modules_as_functions: Any,
    autograd_inlining: bool,
    custom_converters: dict[Any, Any] | None,
    keep_narrowed: bool,
) -> ONNXProgram:
    # ---- refused: what fastonnx cannot honour ----------------------------------------------------
    if isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
        raise InputError(
            "model is a TorchScript module or function, which torch.export cannot capture: pass the "
            "original nn.Module"
        )
    _check_operator_export_type(operator_export_type)
    if not export_params:
        raise InputError(
            "export_params=False is not supported: to export the graph without weights, build the model "
            "on the meta device (the file's weights are filled later with fastonnx.attach_weights)"
        )
    if keep_initializers_as_inputs:
        raise InputError(
            "keep_initializers_as_inputs=True is not supported: fastonnx writes weights as initializers "
            "only (IR >= 4 does not list them as inputs)"
        )
    if dynamic_axes and dynamic_shapes is not None:
        raise InputError("give dynamic_axes or dynamic_shapes, not both")
    # ---- ignored: no meaning for fastonnx --------------------------------------------------------
    if not do_constant_folding:
        log.info("do_constant_folding=False: ignored, fastonnx folds constants as part of optimize")
    if custom_opsets:
        log.info("custom_opsets: ignored, fastonnx sets each domain's version from the nodes it emits")
    if not autograd_inlining:
        log.info("autograd_inlining=False: ignored, it concerns the TorchScript tracer only")
    if profile:
        log.info("profile=True: ignored, the time of each stage is in ONNXProgram.stats")

    # ---- mapped ---------------------------------------------------------------------------------
    converters = _with_translations(custom_converters, custom_translation_table)
    if isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, list):
        args = tuple(args)
    if isinstance(args, tuple) and args and isinstance(args[-1], dict) and kwargs is None:
        args, kwargs = args[:-1], dict(args[-1])
    # f checked once, before the (long) capture: a path as to_onnx checks its filename (which it
    # becomes: written by the pipeline's write stage, stats["file"] included), a file object here
    filename = f if isinstance(f, (str, os.PathLike)) else None
    if f is not None and filename is None:
        check_file_object(f, external_data, "a path, an os.PathLike, a binary file object or None")
    output_axes: axes_mod.AxisNames = {}
    if dynamic_axes:
        if not isinstance(model, torch.nn.Module):
            raise InputError("dynamic_axes needs an nn.Module: an ExportedProgram's shapes are already fixed")
        named = axes_mod.axis_names(dynamic_axes)
        dynamic_shapes, output_axes = axes_mod.to_dynamic_shapes(
            model, args, kwargs or {}, input_names, output_names, named
        )

    # dynamo=False asks for what the TorchScript exporter did: one run on the example inputs, every size
    # fixed. to_onnx's real-tensor trace is that (and as fast); where the trace could specialise what
    # torch.export captures it falls back to torch.export with a warning naming why. Dynamic axes need
    # torch.export's symbolic shapes. dynamo=True (torch's default) asks for torch.export's graph: "auto"
    # gives the same graph for static shapes, at the trace's speed, and torch.export where it must.
    capture = "auto"
    if dynamo is False:
        capture = "export"
        if dynamic_shapes is None and isinstance(model, torch.nn.Module):
            capture = "trace"
        log.info("dynamo=False: capture=%r (%s)", capture, _CAPTURE_WHY[capture])

    t0 = time.perf_counter()
    with _mode_for_export(model, training), _onnx_exporting():
        result = run_export(
            model,
            args,
            kwargs,
            {
                "dynamic_shapes": dynamic_shapes,
                "opset": opset_version,
                "optimize": optimize,
                "input_names": input_names,
                "output_names": output_names,
                "custom_converters": converters,
                # torch.onnx.export does not fail on a dim it cannot keep dynamic (the TorchScript tracer
                # bakes the size in, the dynamo path lets torch.export specialise it): warn, as to_onnx
                # does
                "strict_dynamic": False,
                "keep_narrowed": keep_narrowed,
                "export_modules_as_functions": export_modules_as_functions or False,
                "capture": capture,
                "filename": filename,
                "external_data": external_data,
                # dynamic_axes of outputs name their dims before the file is written
                "output_dims": output_axes or None,
            },
            report=_report_path(report, artifacts_dir),
            verify=verify,
        )
    if dump_exported_program and result.exported_program is not None:
        folder = os.fspath(artifacts_dir)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"onnx_export_{time.strftime('%Y-%m-%d_%H-%M-%S')}.pt2")
        torch.export.save(result.exported_program, path)
        log.info("exported program written to %s", path)
    if f is not None and filename is None:
        t1 = time.perf_counter()
        write_bytes(result, f)  # a file object: the bytes, weights inline
        result.stats["write_s"] = time.perf_counter() - t1
    log.info("fastonnx.export: %.3fs, %s", time.perf_counter() - t0, result)
    return ONNXProgram(result, optimized=optimize is not False)


@contextlib.contextmanager
def _onnx_exporting() -> Iterator[None]:
    """torch.onnx.is_in_onnx_export() is True while the model is captured, as under torch's exporters:
    models that branch on it take their export path. The flag is torch's (private) one; without it
    (another torch) the export goes on and the function keeps returning False."""
    with onnx_exporting():
        yield


def _report_path(report: bool, artifacts_dir: str | os.PathLike[str]) -> str | bool:
    """torch's report=True writes a markdown report into artifacts_dir: so does fastonnx's (to_onnx's
    report, written also when the export fails)."""
    if not report:
        return False
    folder = os.fspath(artifacts_dir)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"onnx_export_{time.strftime('%Y-%m-%d_%H-%M-%S')}_fastonnx_report.md")


def _with_translations(
    custom_converters: Mapping[Any, Any] | None, table: Mapping[Any, Any] | None
) -> dict[Any, Any] | None:
    """``custom_translation_table`` (torch op -> onnxscript function, or a list of overloads) joined to
    ``custom_converters``: its values are onnxscript's whatever they look like, an overload packet
    stands for each of its overloads (onnxscript_converters.table_converters); an op named by both is refused."""
    if not table:
        return dict(custom_converters) if custom_converters else None
    out = dict(custom_converters or {})
    named = {op_key(target): target for target in out}
    for target, functions in onnxscript_converters.table_converters(table).items():
        key = op_key(target)
        if key in named:
            raise InputError(f"{key} is in both custom_converters and custom_translation_table: give it once")
        named[key] = target
        out[target] = functions
    return out


def _check_operator_export_type(value: Any) -> None:
    if value is None:
        return
    name = getattr(value, "name", None)
    if name != "ONNX":
        raise InputError(
            f"operator_export_type={value!r} is not supported: fastonnx exports standard ONNX operators "
            "only (OperatorExportTypes.ONNX); give custom_converters for ops that need another form"
        )


@contextlib.contextmanager
def _mode_for_export(model: Any, training: Any) -> Iterator[None]:
    """torch's TrainingMode: EVAL (the default) exports the module in eval mode and restores its mode
    afterwards, as the TorchScript exporter does; PRESERVE keeps the module's mode, which must then be
    eval; TRAINING is refused: fastonnx exports inference graphs."""
    name = "EVAL" if training is None else getattr(training, "name", str(training))
    is_module = isinstance(model, torch.nn.Module)
    if name == "TRAINING" or (name == "PRESERVE" and is_module and model.training):
        raise InputError(
            f"training={training!r} asks for a training-mode graph: fastonnx exports inference graphs "
            "(use TrainingMode.EVAL, or call model.eval())"
        )
    if name not in ("EVAL", "PRESERVE"):
        raise InputError(f"training must be a torch.onnx.TrainingMode, got {training!r}")
    if name == "PRESERVE" or not is_module or not model.training:
        yield
        return
    # eval() flips every submodule: remember each one's mode to restore it exactly
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode
