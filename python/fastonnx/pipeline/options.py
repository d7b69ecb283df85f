"""The options of one export, checked once: what ``to_onnx``'s keywords mean, as the stages read them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastonnx._core import GraphBuilder
from fastonnx.errors import InputError
from fastonnx.opsets import ir_version_for, resolve_opset
from fastonnx.stored_weights import checkpoints, weight_quantization
from fastonnx.walker import local_functions

OPTIMIZE_LEVELS = {
    False: "none",
    True: "default",
    "none": "none",
    "default": "default",
    "onnxruntime": "onnxruntime",
}
"""to_onnx(optimize=...) -> the builder's optimize level. The levels' one spelling is "none" /
"default" / "onnxruntime" (the CLI's, Rust's ``Level``); False and True are "none" and "default"."""


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """to_onnx's keywords, validated and resolved (the opset a number, optimize a level, the
    checkpoint's shards listed); the stages read nothing else of the call."""

    opset: int
    level: str
    filename: str | None = None
    external_data: bool | None = None
    input_names: Sequence[str] | None = None
    output_names: Sequence[str] | None = None
    custom_converters: dict[Any, Callable[..., Any]] | None = None
    decompositions: dict[Any, Callable[..., Any]] | None = None
    dynamic_shapes: Any = None
    strict_dynamic: bool = True
    keep_narrowed: bool = False
    metadata: bool = True
    value_info: bool = True
    durable: bool = False
    progress: bool | None = None
    shards: list[str] | None = None
    cast_weights: bool = False
    functions: local_functions.Selection = False
    capture: str = "auto"
    quantize: weight_quantization.WeightQuantization | None = None
    dtype: str | None = None  # "fp16" / "bf16": the written graph converted (half_precision.py)
    keep_io_types: bool = False
    # output name -> {axis: dim name}: the outputs' dims named so before the write (fastonnx.export's
    # dynamic_axes for outputs; not a keyword of to_onnx)
    output_dims: Mapping[str, Mapping[int, str]] | None = None
    # the attention-mask input of a decoder whose caches onnxruntime-genai shares with the present
    # outputs: the onnxruntime level fuses attention over them into GroupQueryAttention (set by the
    # text-generation package, pretrained/shared_cache.py; not a keyword of to_onnx)
    shared_cache_mask: str | None = None
    # the most positions those caches hold (the package's context length): the rows of the cos / sin
    # tables GroupQueryAttention then rotates with itself (not a keyword of to_onnx)
    shared_cache_positions: int | None = None
    # past-key input -> the sliding window of its layer (the positions a query attends to, its own
    # included), which the fused attention of that layer applies (not a keyword of to_onnx)
    shared_cache_windows: Mapping[str, int] | None = None

    @classmethod
    def from_keywords(
        cls,
        *,
        opset: int | None = None,
        optimize: bool | str = True,
        filename: str | os.PathLike[str] | None = None,
        weights: checkpoints.Weights | None = None,
        metadata: bool = True,
        value_info: bool = True,
        export_modules_as_functions: local_functions.Selection = False,
        quantize: Any = None,
        **rest: Any,
    ) -> ExportOptions:
        """Every check that can fail before the (long) capture: a bad value is an InputError here.

        The keywords are to_onnx's but report, verify and verbose, with its defaults (a test holds
        them equal): every entry point taking to_onnx's keywords passes them here before capturing
        (to_onnx, fastonnx.export, export_pretrained, the torch.compile backends and
        graph_module_to_onnx), so a bad value fails the same way everywhere. A keyword to_onnx does not
        have is an InputError too."""
        _check_rest(rest)
        if rest.get("keep_io_types") and rest.get("dtype") is None:
            raise InputError("keep_io_types keeps float32 inputs and outputs of a half graph: give dtype too")
        if rest.get("dtype") is not None:
            if filename is None:
                raise InputError(f"dtype={rest['dtype']!r} converts the written file: give filename too")
            if rest.get("cast_weights"):
                raise InputError(
                    f"dtype={rest['dtype']!r} with cast_weights: the weights would be written float32 and read "
                    "through Casts; leave cast_weights off (the stored tensors are then read through a Cast "
                    "to the half type, folded at load)"
                )
        if not isinstance(metadata, bool):
            raise InputError(f"metadata must be True or False, got {metadata!r}")
        if not isinstance(value_info, bool):
            raise InputError(f"value_info must be True or False, got {value_info!r}")
        if not isinstance(rest.get("keep_narrowed", False), bool):
            raise InputError(f"keep_narrowed must be True or False, got {rest['keep_narrowed']!r}")
        local_functions.class_filter(export_modules_as_functions)  # a bad selection fails before the capture
        path = os.fspath(filename) if filename is not None else None
        if path is not None:
            check_writable(path)
        shards = None
        if weights is not None:
            if path is None:
                raise InputError("weights= references a checkpoint from the written file: give filename too")
            shards = checkpoints.shard_files(weights)
        level = optimize_level(optimize)
        settings = weight_quantization.resolve_scheme(quantize)
        if settings is not None and opset is None and level != "onnxruntime":
            # the standard forms need blocked DequantizeLinear: the default opset rises to it
            opset = max(resolve_opset(None), weight_quantization.BLOCKED_DEQUANTIZE_OPSET)
        resolved = resolve_opset(opset)
        if settings is not None:
            weight_quantization.check_opset(settings, resolved, level)
            if export_modules_as_functions:
                # function bodies read their weights as inputs: no product there reads an initializer
                raise InputError(
                    "quantize= with export_modules_as_functions: the products inside local functions read "
                    "their weights as function inputs and would stay float; export without functions"
                )
        return cls(
            opset=resolved,
            level=level,
            quantize=settings,
            filename=path,
            metadata=metadata,
            value_info=value_info,
            shards=shards,
            functions=export_modules_as_functions,
            **rest,
        )


def _names(value: Any) -> bool:
    return (
        isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, str) for v in value)
    )


# the keywords from_keywords passes on as they are: what each must be, checked before the capture
_REST_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "external_data": (lambda v: v is None or isinstance(v, bool), "None, True or False"),
    "input_names": (lambda v: v is None or _names(v), "None or a sequence of strings"),
    "output_names": (lambda v: v is None or _names(v), "None or a sequence of strings"),
    "custom_converters": (lambda v: v is None or isinstance(v, dict), "None or a dict of op -> converter"),
    "decompositions": (
        lambda v: v is None or isinstance(v, dict),
        "None or a dict of op overload -> function",
    ),
    "strict_dynamic": (lambda v: isinstance(v, bool), "True or False"),
    "keep_narrowed": (lambda v: isinstance(v, bool), "True or False"),
    "durable": (lambda v: isinstance(v, bool), "True or False"),
    "cast_weights": (lambda v: isinstance(v, bool), "True or False"),
    "progress": (lambda v: v is None or isinstance(v, bool), "None (automatic), True or False"),
    "capture": (lambda v: v in ("auto", "export", "trace"), "one of 'auto', 'export', 'trace'"),
    "dtype": (lambda v: v is None or v in ("fp16", "bf16"), "'fp16' or 'bf16' (or None for float32)"),
    "keep_io_types": (lambda v: isinstance(v, bool), "True or False"),
    "output_dims": (
        lambda v: v is None or isinstance(v, Mapping),
        "None or a dict of output -> {axis: name}",
    ),
    "shared_cache_mask": (lambda v: v is None or isinstance(v, str), "None or an input name"),
    "shared_cache_positions": (
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
        "None or a positive int",
    ),
    "shared_cache_windows": (
        lambda v: (
            v is None
            or (
                isinstance(v, Mapping)
                and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in v.values())
            )
        ),
        "None or a dict of past-key input -> positive window",
    ),
}


# the keywords from_keywords passes on as they are without a check of their own (torch.export's
# dynamic shapes are checked by the capture)
_REST_UNCHECKED = ("dynamic_shapes",)


def _check_rest(rest: dict[str, Any]) -> None:
    for name, value in rest.items():
        if name in _REST_UNCHECKED:
            continue
        check = _REST_CHECKS.get(name)
        if check is None:
            raise InputError(f"to_onnx has no keyword {name!r}")
        if not check[0](value):
            raise InputError(f"{name} must be {check[1]}, got {value!r}")


def optimize_level(optimize: bool | str) -> str:
    """The builder's optimize level for to_onnx's (and graph_module_to_onnx's) ``optimize``."""
    if optimize not in OPTIMIZE_LEVELS:
        raise InputError(
            f"optimize must be False / 'none', True / 'default' or 'onnxruntime', got {optimize!r}"
        )
    return OPTIMIZE_LEVELS[optimize]


def check_writable(path: str) -> None:
    """Fail before the (long) conversion when the file could not be written anyway."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"cannot write {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"cannot write {path!r}: folder {folder!r} is not writable")
    if os.path.isdir(path):
        raise InputError(f"cannot write {path!r}: it is a folder")


def new_builder(opset: int) -> GraphBuilder:
    """An empty graph at ``opset`` (its IR version), fastonnx's version as producer."""
    from fastonnx._core import __version__

    return GraphBuilder(opset, ir_version_for(opset), producer_version=__version__)
