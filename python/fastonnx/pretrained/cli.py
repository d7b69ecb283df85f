"""The ``fastonnx`` command: ``fastonnx export MODEL OUTDIR [--task T] ...`` (also ``python -m fastonnx``).

Exit status: 0 when the package is written (and verified, unless skipped), 1 when verification finds a
mismatch (the package and its report are written), 2 on bad input (a clear message, nothing written).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from fastonnx.errors import FastOnnxError, InputError, RuntimeCheckError
from fastonnx.pretrained.targets import DEFAULT_TARGET, TARGETS
from fastonnx.pretrained.tasks import tasks_help

OPTIMIZE = {"none": False, "default": True, "onnxruntime": "onnxruntime", "standard": True}
"""--optimize's levels, named as to_onnx's optimize= and Rust's Level name them; "standard" is the
earlier name of "default", still accepted."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastonnx", description="fastonnx: PyTorch to ONNX.")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser(
        "export",
        help="export a transformers checkpoint folder to an ONNX package",
        description=(
            "Export a transformers checkpoint (a folder with config.json and safetensors weights, or a "
            "Hub id in huggingface_hub's cache) to a package folder: model.onnx referencing the weights "
            "in place, tokenizer and generation files, genai_config.json for text generation and "
            "fastonnx_report.md."
        ),
        epilog="tasks:\n  auto                   read from the config's architectures\n" + tasks_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("model", metavar="MODEL", help="checkpoint folder or Hub id")
    export.add_argument("outdir", metavar="OUTDIR", help="the package folder to write")
    export.add_argument("--task", default="auto", help="the task (default: auto); listed below")
    export.add_argument("--opset", type=int, default=None, help="ONNX opset (default: fastonnx's)")
    export.add_argument(
        "--optimize",
        choices=sorted(OPTIMIZE),
        default="default",
        help="optimization level: none, default (any runtime; 'standard' is an alias) or onnxruntime "
        "(its contrib ops)",
    )
    export.add_argument(
        "--quantize",
        choices=("int4", "int8"),
        default=None,
        help="weight-only quantization of the MatMul weights (the LM head stays float)",
    )
    export.add_argument(
        "--quantize-head",
        action="store_true",
        help="with --quantize: quantize the LM head too (as the onnxruntime-genai builder does)",
    )
    export.add_argument(
        "--int8",
        metavar="PATTERNS",
        default=None,
        help="with --quantize int4: comma-separated module-name patterns whose products are int8 instead "
        "(mixed precision; 'lm_head' quantizes the head in int8, 'model.layers.0.*' a layer)",
    )
    export.add_argument(
        "--block-size",
        type=int,
        default=None,
        metavar="N",
        help="with --quantize: values per quantization block along a product's input axis (a power of two "
        "from 16 to 256; default 32, as the onnxruntime-genai builder's): larger blocks ship fewer scales "
        "and decode faster, with a larger logits error (the report gives both)",
    )
    export.add_argument(
        "--accuracy-level",
        metavar="[PATTERN=]N",
        action="append",
        default=None,
        help="with --quantize and --optimize onnxruntime: MatMulNBits' accuracy_level (0-4; default 4), "
        "for every product or, as PATTERN=N (repeatable), for the modules PATTERN matches",
    )
    export.add_argument(
        "--target",
        choices=TARGETS,
        default=DEFAULT_TARGET,
        help="the runtime the package is for (default: cpu): its default --dtype (cpu fp32, the others "
        "fp16), the ops its onnxruntime execution provider has kernels for, genai's provider options",
    )
    export.add_argument(
        "--dtype",
        choices=("fp32", "fp16", "bf16"),
        default=None,
        help="the type the graph computes in (default: the target's): fp16 / bf16 keep reductions, "
        "norms, softmax, soft-capping and values past float16's range in float32",
    )
    export.add_argument(
        "--keep-io-types",
        action="store_true",
        help="with --dtype fp16 / bf16: float32 inputs and outputs (logits, cache)",
    )
    export.add_argument(
        "--no-verify", action="store_true", help="skip running the package against transformers"
    )
    export.add_argument("--overwrite", action="store_true", help="replace OUTDIR when it is not empty")
    export.add_argument(
        "--copy",
        action="store_true",
        help="copy every weight the package reads into it, linking no checkpoint shard (by default a "
        "shard it reads most of is hard-linked, the tensors it reads of the others copied)",
    )
    bars = export.add_mutually_exclusive_group()
    bars.add_argument(
        "--progress", dest="progress", action="store_true", default=None, help="always show bars"
    )
    bars.add_argument("--no-progress", dest="progress", action="store_false", help="never show bars")
    return parser


def _accuracy_levels(values: list[str]) -> dict[str, int] | None:
    """``--accuracy-level`` values as {pattern: level}, "" for the overall level; None if one is bad."""
    levels: dict[str, int] = {}
    for value in values:
        pattern, _, level = value.rpartition("=")
        if not level.isdigit() or int(level) > 4:
            return None
        levels[pattern] = int(level)
    return levels


def target_line(target: dict[str, str]) -> str:
    """The target, its dtype and the kernels its op set was checked against."""
    from fastonnx.pretrained.targets import source

    name = target["name"]
    return (
        f"target: {name}, dtype {target['dtype']}; op set checked against {name}'s kernels ({source(name)})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from fastonnx.pretrained.package_export import export_pretrained

    options: dict[str, object] = {"optimize": OPTIMIZE[args.optimize]}
    if args.opset is not None:
        options["opset"] = args.opset
    if args.quantize_head and args.quantize is None:
        print("fastonnx export: error: --quantize-head needs --quantize", file=sys.stderr)
        return 2
    options["target"] = args.target
    if args.dtype is not None:
        options["dtype"] = args.dtype
    if args.keep_io_types:
        options["keep_io_types"] = True
    if (args.int8 or args.accuracy_level or args.block_size is not None) and args.quantize is None:
        print(
            "fastonnx export: error: --int8, --accuracy-level and --block-size need --quantize",
            file=sys.stderr,
        )
        return 2
    if args.quantize is not None:
        from fastonnx.stored_weights.weight_quantization import resolve_scheme

        options["quantize"] = args.quantize  # the shorthand, as the report names it
        settings = resolve_scheme(args.quantize)
        if settings is None:  # the parser takes int4 / int8 only
            raise AssertionError(args.quantize)
        if args.quantize_head:
            settings = dataclasses.replace(settings, exclude=())
        if args.int8:
            patterns = [p.strip() for p in args.int8.split(",") if p.strip()]
            settings = dataclasses.replace(settings, bits_for=dict.fromkeys(patterns, 8))
        if args.accuracy_level:
            levels = _accuracy_levels(args.accuracy_level)
            if levels is None:
                print(
                    "fastonnx export: error: --accuracy-level takes N or PATTERN=N with N from 0 to 4, got "
                    f"{args.accuracy_level}",
                    file=sys.stderr,
                )
                return 2
            overall = levels.pop("", settings.accuracy_level)
            settings = dataclasses.replace(
                settings, accuracy_level=overall, accuracy_level_for=levels or None
            )
        if args.block_size is not None:
            settings = dataclasses.replace(settings, block_size=args.block_size)  # checked by to_onnx
        if settings != resolve_scheme(args.quantize):
            options["quantize"] = settings
    try:
        written = export_pretrained(
            args.model,
            args.outdir,
            args.task,
            verify=not args.no_verify,
            overwrite=args.overwrite,
            progress=args.progress,
            copy=args.copy,
            **options,
        )
    except InputError as e:
        print(f"fastonnx export: error: {e}", file=sys.stderr)
        return 2
    except RuntimeCheckError as e:
        print(f"fastonnx export: verification failed: {e}", file=sys.stderr)
        return 1
    except FastOnnxError as e:
        print(f"fastonnx export: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    verified = {True: "verified", False: "MISMATCH", None: written.verify_note}[written.verified]
    print(f"{written.task} ({written.architecture}) -> {written.outdir}: {', '.join(written.files)}")
    print(target_line(written.stats["target"]))
    print(f"verification: {verified}; report: {written.report_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
