"""Weights referenced in place: ``to_onnx(..., weights=<folder or list of .safetensors shards>)``.

A safetensors shard holds each tensor as raw little-endian row-major bytes at a known offset, which is
what ONNX external data points at. Each initializer whose state-dict key is in the shards, with the same
shape (and dtype, or a float dtype a Cast makes it), and whose bytes the graph reads as stored, becomes
external data pointing into its shard (``location`` = the shard's file name, ``offset`` = 8 + header
length + the tensor's begin): none of its bytes are written. The model may be a real module or live on
the meta device. The shards are matched (``plan``) before the optimizer runs, and pointed at
(``reference``) after it.

- Linear weights are read as stored (``[out, in]``) so that they are referenced too: before the passes,
  ``MatMul(x, Transpose(W))`` with ``W`` found in the shards becomes ``Gemm(x, W, transB=1)`` at the
  standard level (a 3-D ``x`` reshaped to 2-D around it) and ``com.microsoft.FusedMatMul(x, W,
  transB=1)`` at the onnxruntime level (float32; other float types take the Gemm form: onnxruntime's CPU
  FusedMatMul is float32 only). Chosen per level by ``benches/inplace_latency.py`` (docs/benchmarks.md,
  "Checkpoints in place", 11 alternated runs per row on the 2x256, 16x256 and 16x1024 rungs, 1x128
  and 1x1 tokens, one and two threads): the two forms are within this shared machine's noise at both
  levels (ratio of minima, median over the rows: standard 1.03x, onnxruntime 0.96x; single rows from
  0.22x to 1.38x either way, not repeatable from one run of the bench to the next), so the form that
  reads the weights as stored is used at both levels: it is no slower and needs none of their bytes
  written.
- Weights the graph needs in another form (batch norms folded into convolutions, constants) are written
  to ``<model>.onnx.data`` as without ``weights=``.
- A checkpoint float dtype differing from the graph's (bf16 checkpoint, fp32 graph): the tensor is
  referenced as stored and a ``Cast`` to the graph's dtype writes the initializer's name (onnxruntime
  folds it at load), unless its cast is larger than onnxruntime folds (``ORT_FOLD_LIMIT``, 1 GiB: a
  Qwen3.5-MoE layer's stacked experts, a large vocabulary's embedding), which onnxruntime would cast at
  every run (a decode step of benches/moe_vs_builder.py took 836 ms so): such a tensor is written cast,
  as with ``cast_weights``; except a table read by Gathers alone (an untied embedding, or a tied one
  whose head is quantized), which stays referenced as stored with a Cast after each Gather: only the
  gathered rows are cast at run time, and the package holds the table at its stored size, not twice it. ``cast_weights=True`` writes every such tensor cast into ``<model>.onnx.data``: a meta-device
  weight is read from the shard and converted piece by piece as the writer streams
  (``TensorData::Converted``); a real module's weight is its own, already cast bytes, written as usual.
- Keys that transformers' loading renames are found through the model's own mapping: the
  ``WeightRenaming`` entries of ``transformers.conversion_mapping.get_model_conversion_mapping`` for the
  outermost ``PreTrainedModel`` inside the module (legacy ``LayerNorm.gamma``/``beta``, model-specific
  renames, the base model's prefix added or cut). Keys a ``WeightConverter`` makes (merged, split or
  permuted tensors) are not the stored bytes: not referenced.
- onnxruntime resolves external data relative to the model's folder and refuses paths leaving it,
  symbolic links included. A ``.onnx`` written in the shards' folder references them by name; written
  elsewhere (by ``to_onnx`` or a later ``ExportResult.save``), the shards it uses are hard-linked into its
  folder by the writer (same filesystem, else ``SerializationError``; made under the writer's temporary
  names, renamed with the model, swept like its other temporaries when an export is killed; a file of
  that name already there is replaced).
- A key found with another shape, or a dtype no Cast makes it, raises ``InputError`` naming the key and
  both; so does, for a meta-device model, a weight missing from the shards (its bytes would be nowhere).
  Non-persistent buffers (rotary frequencies) are not in checkpoints: create them on the CPU. A real
  module's weight missing from the shards is written as usual. Tied weights (``lm_head`` sharing the
  embedding, saved once) are found under any of the module's names for the same tensor, and a wrapper
  module's prefix (``self.m = llama`` makes keys ``m.model...``) is cut when one prefix fits all the keys
  not found.
- ``stats["file"]["weights"]["written_tensors"]`` counts the checkpoint tensors not referenced under
  their own initializer: written in another form, or dropped by the optimizer (unused, or merged with an
  equal small initializer).
- Not done yet: shards on another filesystem than the model (raises; copying them into the data file
  is left out).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fastonnx.dtypes import FLOAT_DTYPES, to_onnx_dtype
from fastonnx.errors import InputError

# safetensors' dtype names (the format's spec)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}

Weights = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

SUPERSEDES_KEY = "fastonnx_supersedes"
"""A shard whose safetensors ``__metadata__`` sets this to ``"true"`` holds tensors that replace the
other shards' of the same key (the tensors transformers converts as it loads them, some under their
source's own name: Qwen3-VL-MoE's transposed experts); any other key in two shards is an error."""


@dataclass(frozen=True)
class ShardTensor:
    """Where a tensor's bytes are: ``offset`` counts from the start of the shard file."""

    shard: str
    dtype: torch.dtype | str
    shape: tuple[int, ...]
    offset: int
    length: int


@dataclass
class Referenced:
    """What ``reference`` did: the shards used, counts for ``stats["file"]["weights"]``."""

    folder: str
    tensors: int = 0
    referenced_names: set[str] = field(default_factory=set)
    # checkpoint tensors (shard, offset) that no initializer references: the graph reads them in another
    # form (written to the data file, converted with cast_weights) or the optimizer dropped them
    written: set[tuple[str, int]] = field(default_factory=set)
    # shard path -> bytes referenced in it
    shards_used: dict[str, int] = field(default_factory=dict)
    # the initializers whose bytes come from the shards now (referenced or converted): no holes left
    filled_names: set[str] = field(default_factory=set)
    # referenced behind a Cast to the graph's dtype / written converted from the shard (cast_weights)
    cast: int = 0
    converted: int = 0
    # of cast: tables read by Gathers alone, their gathered rows cast (past onnxruntime's folding limit)
    gathered_cast: int = 0
    # Linear products rewritten to read their weight as stored (Gemm / FusedMatMul with transB)
    read_as_stored: int = 0


ORT_FOLD_LIMIT = 1 << 30
"""Bytes: onnxruntime 1.31's constant folding skips a result larger than this ("estimated output size
... exceeds the limit (1073741824 bytes)")."""


@dataclass
class ReferencePlan:
    """Which initializer is which checkpoint tensor, found before the passes run (so that they keep
    those weights as stored) and checked before anything is written."""

    folder: str
    # initializer name -> (the tensor in the shards, the model's dtype)
    entries: dict[str, tuple[ShardTensor, torch.dtype]] = field(default_factory=dict)
    # checkpoint tensors (shard, offset) a real module writes from its own, already cast weights
    # (cast_weights=True, or past onnxruntime's folding limit)
    written_cast: set[tuple[str, int]] = field(default_factory=set)
    # meta-device weights written converted from the shard as the writer streams (cast_weights=True, or
    # a cast larger than onnxruntime folds: ORT_FOLD_LIMIT)
    convert_names: set[str] = field(default_factory=set)
    # those of convert_names converted only for onnxruntime's folding limit (not cast_weights): an
    # embedding table read by Gathers alone is referenced as stored instead, its rows cast after them
    too_large: set[str] = field(default_factory=set)

    def as_stored(self) -> list[str]:
        """The initializers whose bytes will come from the shards as stored: the passes must keep them so
        (Linear weights read untransposed)."""
        return sorted(self.entries)

    def without(self, names: Collection[str]) -> ReferencePlan:
        """This plan less the initializers ``names`` (read from the shards another way: quantized), as
        a new plan; this one is left as it is."""
        return replace(self, entries={k: v for k, v in self.entries.items() if k not in names})


def shard_files(weights: Weights) -> list[str]:
    """The shard paths ``weights`` names: a folder's ``*.safetensors`` or a list of files, one folder."""
    if isinstance(weights, (str, os.PathLike)):
        path = os.fspath(weights)
        if os.path.isdir(path):
            files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
            if not files:
                raise InputError(f"weights={path!r}: the folder holds no .safetensors file")
            return [os.path.abspath(f) for f in files]
        paths = [path]
    else:
        paths = [os.fspath(p) for p in weights]
    if not paths:
        raise InputError("weights=[]: no shard given")
    for p in paths:
        if not os.path.isfile(p) or not p.endswith(".safetensors"):
            raise InputError(f"weights: {p!r} is not a .safetensors file")
    files = [os.path.abspath(p) for p in paths]
    if len({os.path.dirname(f) for f in files}) > 1:
        raise InputError("weights: the shards must be in one folder (external data names files, not paths)")
    return files


def index_shards(files: Sequence[str]) -> dict[str, ShardTensor]:
    """Every tensor of the shards by key. safetensors checks the files (``safe_open`` refuses a corrupt
    header); the tensors' begins come from the header's ``data_offsets``, which the package does not
    expose."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError as e:
        raise InputError(
            "weights= reads safetensors shards: pip install safetensors (extra 'checkpoints')"
        ) from e

    found: dict[str, ShardTensor] = {}
    superseders: set[str] = set()
    for path in files:
        try:
            with safe_open(path, "pt") as f:
                keys = list(f.keys())
        except SafetensorError as e:
            raise InputError(f"weights: {path} is not a valid safetensors file: {e}") from e
        with open(path, "rb") as raw:
            (n,) = struct.unpack("<Q", raw.read(8))
            header: dict[str, Any] = json.loads(raw.read(n))
        if (header.get("__metadata__") or {}).get(SUPERSEDES_KEY) == "true":
            superseders.add(path)
        superseding = path in superseders
        for key in keys:
            entry = header[key]
            begin, end = entry["data_offsets"]
            if end == begin:
                # no bytes to point at: onnxruntime fails reading 0 bytes at the shard's end (DINOv3's
                # register_tokens where it has none); such a tensor is written as without weights=
                continue
            if key in found:
                earlier = found[key].shard in superseders
                if earlier == superseding:
                    raise InputError(f"weights: {key!r} is in both {found[key].shard} and {path}")
                if earlier:
                    continue  # the earlier shard's tensor replaces this one
            found[key] = ShardTensor(
                shard=path,
                dtype=SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"]),
                shape=tuple(entry["shape"]),
                offset=8 + n + begin,
                length=end - begin,
            )
    return found


def aliases(model: Any) -> dict[str, list[str]]:
    """Every name of each parameter / buffer of ``model`` that has several (tied weights)."""
    if not isinstance(model, torch.nn.Module):
        return {}
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for name, b in model.named_buffers(remove_duplicate=False):
        names.setdefault(id(b), []).append(name)
    return {n: group for group in names.values() if len(group) > 1 for n in group}


def wrapper_prefix(
    keys: Sequence[str], index: dict[str, ShardTensor], tied: dict[str, list[str]] | None = None
) -> str:
    """The one prefix (``"m."``) that a wrapper module puts before the checkpoint's keys, or "": the
    prefix that, cut from the keys not in the shards, finds each of them (or one of its ``tied`` names)
    in the shards. A tied weight's other name can meet the shards under a deeper cut by chance
    (Grounding DINO's ``model.decoder.bbox_embed.0...`` cut to ``bbox_embed.0...``, the head's own
    key): so each weight's names count together, and only a cut that finds every weight is kept."""
    tied = tied or {}
    common: set[str] | None = None
    for key in keys:
        if key in index:
            continue
        cuts = {
            name[: i + 1]
            for name in [key, *tied.get(key, [])]
            for i, c in enumerate(name)
            if c == "." and name[i + 1 :] in index
        }
        if cuts:  # a key no cut finds (a computed buffer) says nothing of the prefix
            common = cuts if common is None else common & cuts
    return common.pop() if common is not None and len(common) == 1 else ""


def renamed_keys(model: Any, keys: Sequence[str]) -> dict[str, str]:
    """{key as the model names it: checkpoint key} for the checkpoint keys that transformers' loading
    renames (``LayerNorm.gamma`` -> ``LayerNorm.weight``, model-specific renames, the base model's prefix
    added or cut): the renamings of ``transformers.conversion_mapping.get_model_conversion_mapping`` for
    each ``PreTrainedModel`` in ``model``, as ``from_pretrained`` applies them. Keys that a
    ``WeightConverter`` makes (merged, split or permuted tensors) are not the stored bytes: left out."""
    if not isinstance(model, torch.nn.Module):
        return {}
    try:
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
    except ImportError:
        return {}
    found: dict[str, str] = {}
    for path, module in model.named_modules():
        if not isinstance(module, PreTrainedModel):
            continue
        renamings = [t for t in get_model_conversion_mapping(module) if isinstance(t, WeightRenaming)]
        own = dict.fromkeys(module.state_dict(keep_vars=True), True)
        prefix = f"{path}." if path else ""
        for key in keys:
            renamed, _ = rename_source_key(key, renamings, [], module.base_model_prefix, own)
            if renamed != key and renamed in own:
                found.setdefault(prefix + renamed, key)
        if found:
            break  # the outermost transformers model loaded the checkpoint
    return found


def plan_references(
    weights_read: dict[str, tuple[str, torch.dtype, tuple[int, ...]]],
    deferred: dict[str, str],
    files: Sequence[str],
    model: Any,
    cast_weights: bool = False,
) -> ReferencePlan:
    """Finds each weight the graph reads in the shards; raises, naming the key, for a tensor of another
    shape or of a dtype no cast makes it, and for a meta-device weight the shards do not hold."""
    index = index_shards(files)
    for model_key, key in renamed_keys(model, list(index)).items():
        index.setdefault(model_key, index[key])
    tied = aliases(model)
    prefix = wrapper_prefix([key for key, _, _ in weights_read.values()], index, tied)
    done = ReferencePlan(folder=os.path.dirname(files[0]))
    for name, (key, dtype, shape) in weights_read.items():
        names = [key, *tied.get(key, [])]
        names += [k.removeprefix(prefix) for k in names if prefix and k.startswith(prefix)]
        entry = next((index[k] for k in names if k in index), None)
        if entry is None:
            if name in deferred and math.prod(shape) != 0:  # an empty tensor (a fresh cache) has no bytes
                raise InputError(
                    f"weights: {key!r} ({dtype}, shape {list(shape)}) is on the meta device and not in "
                    f"the shards in {done.folder}: its bytes would be nowhere (a non-persistent buffer "
                    "such as rotary frequencies is not in checkpoints: create it on the CPU)"
                )
            continue
        castable = entry.dtype in FLOAT_DTYPES and dtype in FLOAT_DTYPES
        if (entry.dtype != dtype and not castable) or entry.shape != shape:
            raise InputError(
                f"weights: {key!r} is {entry.dtype} with shape {list(entry.shape)} in "
                f"{os.path.basename(entry.shard)}, the model's is {dtype} with shape {list(shape)}"
            )
        # onnxruntime would not fold the Cast of a tensor this large: it would cast it at every run
        too_large = math.prod(shape) * torch.empty((), dtype=dtype).element_size() > ORT_FOLD_LIMIT
        convert = entry.dtype != dtype and (cast_weights or too_large)
        if convert and name not in deferred:
            # the model holds the cast bytes already (it was loaded from the checkpoint): written as usual
            done.written_cast.add((entry.shard, entry.offset))
            continue
        if convert:
            done.convert_names.add(name)
            if too_large and not cast_weights:
                done.too_large.add(name)
        done.entries[name] = (entry, dtype)
    return done


def reference(builder: Any, plan: ReferencePlan, read_as_stored: int) -> Referenced:
    """Points the builder's initializers of ``plan`` at the shards, after the passes: as stored, behind a
    Cast when the checkpoint's dtype differs, or (``plan.convert_names``: meta-device weights under
    ``cast_weights`` or past onnxruntime's folding limit) written converted from the shard as the writer
    streams."""
    done = Referenced(folder=plan.folder, read_as_stored=read_as_stored, written=set(plan.written_cast))
    for name, (entry, dtype) in plan.entries.items():
        stored = to_onnx_dtype(entry.dtype) if isinstance(entry.dtype, torch.dtype) else 0
        if not builder.has_initializer(name):
            # gone: the optimizer replaced it by another form (a pre-transposed Linear weight), written
            done.written.add((entry.shard, entry.offset))
        elif name in plan.too_large and builder.reference_gathered_cast(
            name, os.path.basename(entry.shard), entry.offset, stored
        ):
            done.tensors += 1
            done.cast += 1
            done.gathered_cast += 1
            done.referenced_names.add(name)
            done.filled_names.add(name)
            done.shards_used[entry.shard] = done.shards_used.get(entry.shard, 0) + entry.length
            builder.set_reference_source(os.path.basename(entry.shard), entry.shard)
        elif name in plan.convert_names:
            if builder.convert_initializer(name, entry.shard, entry.offset, stored):
                done.converted += 1
                done.filled_names.add(name)
            done.written.add((entry.shard, entry.offset))
        elif builder.reference_cast_initializer(name, os.path.basename(entry.shard), entry.offset, stored):
            done.tensors += 1
            done.cast += entry.dtype != dtype
            done.referenced_names.add(name)
            done.filled_names.add(name)
            done.shards_used[entry.shard] = done.shards_used.get(entry.shard, 0) + entry.length
            # a save into another folder hard-links the shard beside the model (the writer does)
            builder.set_reference_source(os.path.basename(entry.shard), entry.shard)
        else:
            done.written.add((entry.shard, entry.offset))
    # a tied weight has one initializer for several names: referenced through any of them is enough
    done.written -= {(e.shard, e.offset) for n, (e, _) in plan.entries.items() if n in done.referenced_names}
    return done


def file_stats(done: Referenced, model_folder: str, written_bytes: int) -> dict[str, Any]:
    """``stats["file"]["weights"]``: how each shard went ("in place" beside the model, or "linked" into
    its folder, now or by an earlier export), how many bytes were referenced, linked, written, how many
    referenced tensors a Cast reads, how many were written converted, how many Linear products read
    their weight as stored."""
    how = "in place" if os.path.samefile(done.folder, model_folder) else "linked"
    return {
        "cast_tensors": done.cast,
        "converted_tensors": done.converted,
        "gathered_cast_tensors": done.gathered_cast,
        "read_as_stored": done.read_as_stored,
        "referenced_tensors": done.tensors,
        "referenced_bytes": sum(done.shards_used.values()),
        "linked_bytes": sum(done.shards_used.values()) if how == "linked" else 0,
        "written_tensors": len(done.written),
        "written_bytes": written_bytes,
        "shards": {os.path.basename(s): how for s in done.shards_used},
    }
