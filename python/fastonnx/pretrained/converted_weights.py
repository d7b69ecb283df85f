"""The checkpoint tensors transformers converts as it loads them, converted the same way into a file of
the package.

transformers (5.x) loads some checkpoints through a conversion mapping: per-expert tensors of a
mixture-of-experts stacked into one ``experts.gate_up_proj`` / ``experts.down_proj`` per layer
(``MergeModulelist``, ``Concatenate``), fused projections split (``Chunk``), some transposed. The
stored bytes are then not the parameter's: they cannot be referenced in place, and the parameter, absent
from the shards under its name, would otherwise be "newly initialized" (random).

The mapping is transformers' own (``conversion_mapping.get_model_conversion_mapping`` for the model,
keys renamed by ``core_model_loading.rename_source_key``, each target's converter fed its source tensors
in transformers' order and run with its own ``convert``): no table per architecture here. Each target is
converted alone, its sources read from the shards and dropped once written, so memory holds one layer's
tensors, never the model. The results are written into one safetensors file of the package
(``CONVERTED_FILE``), which the export references in place like the checkpoint's shards (and reads
quantized from under ``quantize=``).

The file is written in one pass: the converters are first run on meta tensors (shapes and dtypes from
the shards' headers) to learn every output's name, shape and dtype, so the header is written first and
each converted tensor streamed after it. safetensors' ``save_file`` needs every tensor in memory at
once, hence the small writer here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.stored_weights.checkpoints import (
    SAFETENSORS_DTYPES,
    SUPERSEDES_KEY,
    ShardTensor,
    index_shards,
)

CONVERTED_FILE = "converted_weights.safetensors"

# torch dtype -> safetensors' dtype name
_DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


@dataclasses.dataclass
class _Target:
    """One converter run: its first target key and the source tensors it reads, in loading order."""

    key: str
    converter: Any  # a transformers WeightConverter of its own
    sources: list[tuple[str, ShardTensor, str]]  # (source pattern, where the tensor is, its checkpoint key)


def conversions(model: torch.nn.Module, index: Mapping[str, ShardTensor]) -> list[_Target]:
    """The converter runs transformers would make loading the checkpoint whose tensors ``index`` lists
    (``checkpoints.index_shards``) into ``model`` (a PreTrainedModel, meta parameters allowed); empty for
    a model whose checkpoint loads by name only."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            dot_natural_key,
            rename_source_key,
        )
    except ImportError:  # a transformers without load-time conversions
        return []
    mapping = get_model_conversion_mapping(model)  # type: ignore[arg-type]  # a PreTrainedModel
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    if not converters:
        return []
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    meta_state = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None)
    targets: dict[str, _Target] = {}
    for key in sorted(index, key=dot_natural_key):
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, meta_state)
        if pattern is None or renamed not in meta_state:
            continue
        target = targets.get(renamed)
        if target is None:
            # each target gets a converter of its own, as transformers' loading gives it
            target = targets[renamed] = _Target(renamed, copy.deepcopy(by_pattern[pattern]), [])
        target.sources.append((pattern, index[key], key))
    return list(targets.values())


def write_converted(model: torch.nn.Module, shards: list[str], path: str | os.PathLike[str]) -> list[str]:
    """The converted tensors of ``model``'s checkpoint written to ``path`` (a safetensors file); the
    keys written, or none (and no file) when nothing is converted. A converted key the model does not
    have, or one whose shape differs from the model's, is an InputError."""
    targets = conversions(model, index_shards(shards))
    if not targets:
        return []
    meta_state = model.state_dict()
    header: dict[str, dict[str, Any]] = {}
    offset = 0
    for target in targets:
        for key, t in _convert(model, target, _meta_source).items():
            _check_against_model(key, t, meta_state)
            size = t.numel() * t.element_size()
            header[key] = {
                "dtype": _dtype_name(key, t.dtype),
                "shape": list(t.shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
    with _atomic(path) as f, _ShardReader() as read:
        _write_header(f, header)
        for target in targets:
            for key, t in _convert(model, target, read).items():
                if key in header:  # every key of the meta run, in the same order
                    f.write(t.contiguous().view(torch.uint8).numpy().data)
    return list(header)


Source = Callable[[ShardTensor, str], Callable[[], torch.Tensor]]


def _convert(model: torch.nn.Module, target: _Target, read: Source) -> dict[str, torch.Tensor]:
    """``target``'s converter run on its sources (read lazily by ``read(where, key)``)."""
    converter = copy.deepcopy(target.converter)  # convert() consumes what add_tensor collected
    for pattern, where, key in target.sources:
        converter.add_tensor(target.key, key, pattern, read(where, key))
    try:
        out = converter.convert(target.key, model=model, config=getattr(model, "config", None))
    except Exception as e:  # transformers' ops raise many types; which target failed is what matters
        raise InputError(f"transformers' load-time conversion of {target.key} failed: {e}") from e
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def _meta_source(where: ShardTensor, key: str) -> Callable[[], torch.Tensor]:
    """The tensor as its shard's header describes it, on the meta device (no bytes read)."""
    if not isinstance(where.dtype, torch.dtype):
        raise InputError(
            f"{key} in {where.shard} is of safetensors dtype {where.dtype}, which torch does not have"
        )
    dtype = where.dtype
    return lambda: torch.empty(where.shape, dtype=dtype, device="meta")


class _ShardReader(contextlib.ExitStack):
    """Sources reading the shards' tensors, each shard opened once (its header parsed once) for the
    whole pass, not once per tensor."""

    def __init__(self) -> None:
        super().__init__()
        self._open: dict[str, Any] = {}

    def __call__(self, where: ShardTensor, key: str) -> Callable[[], torch.Tensor]:
        def read() -> torch.Tensor:
            from safetensors import safe_open

            if where.shard not in self._open:
                self._open[where.shard] = self.enter_context(safe_open(where.shard, "pt"))
            tensor: torch.Tensor = self._open[where.shard].get_tensor(key)
            return tensor

        return read


def _check_against_model(key: str, t: torch.Tensor, meta_state: dict[str, Any]) -> None:
    expected = meta_state.get(key)
    if expected is None:
        raise InputError(f"transformers' load-time conversion made {key}, which the model does not have")
    if tuple(expected.shape) != tuple(t.shape):
        raise InputError(
            f"transformers' load-time conversion made {key} of shape {tuple(t.shape)}, the model's is "
            f"{tuple(expected.shape)}"
        )


def _dtype_name(key: str, dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise InputError(
            f"transformers' load-time conversion made {key} as {dtype}, which safetensors cannot hold"
        )
    return name


def _write_header(f: Any, header: dict[str, dict[str, Any]]) -> None:
    # the converted tensors replace the checkpoint's of the same name (a transpose keeps its source's)
    marked = {"__metadata__": {SUPERSEDES_KEY: "true"}, **header}
    text = json.dumps(marked, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    f.write(struct.pack("<Q", len(text)))
    f.write(text)


@contextlib.contextmanager
def _atomic(path: str | os.PathLike[str]) -> Iterator[Any]:
    """A file written under a temporary name and renamed once complete (removed on failure)."""
    tmp = f"{os.fspath(path)}.partial"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
