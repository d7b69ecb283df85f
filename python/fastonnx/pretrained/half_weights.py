"""A half package's weights stored in its half type, converted while streamed out of the checkpoint.

``half_precision.convert`` reads a float32 (or bfloat16) checkpoint tensor through a Cast to the half
type, which onnxruntime folds at load. The package would then ship the checkpoint's bytes: a float32
checkpoint's fp16 package linked all 4 bytes of every weight, twice what it computes with and twice the
genai builder's fp16 package. Here each such tensor, read by nothing but Casts to the half type, is
converted a piece at a time from its shard into the package's own file (``shipped_bytes.OWN_FILE``), the
initializer made the half type and its Casts dropped. The conversion is the Cast's own (round to nearest
even, float16 overflowing to infinity as onnxruntime's does), so the graph computes the same values.
What stays float32 (norm weights, values kept by range) is still read from the shard; ``shipped_bytes``
then copies it out when it is a small part of that shard.

Memory stays one piece (16 MiB) of one tensor; no float32 copy is made.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, BinaryIO

import numpy as np
from onnx import TensorProto

from fastonnx.half_precision import HALF_TYPES, bodies, outer_reads, rename_reads
from fastonnx.pretrained.shipped_bytes import OWN_FILE, is_linked

_ALIGN = 64
_PIECE = 16 << 20  # bytes of the stored tensor read at a time (a multiple of 4)
_SOURCES: dict[int, int] = {TensorProto.FLOAT: 4, TensorProto.BFLOAT16: 2}  # stored type -> bytes an element


def _cast_to(node: Any) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((int(a.i) for a in node.attribute if a.name == "to"), None)


def _to_half(stored: np.ndarray[Any, Any], source: int, target: int) -> bytes:
    """``stored`` (the shard's raw elements: float32, or bfloat16 as uint16) as the half type's bytes."""
    values = stored if source == TensorProto.FLOAT else (stored.astype(np.uint32) << 16).view(np.float32)
    if target == TensorProto.FLOAT16:
        with np.errstate(over="ignore"):  # beyond 65504: infinity, as the Cast gives
            return values.astype("<f2").tobytes()
    bits = values.view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype("<u2")  # nearest, ties to even
    rounded[np.isnan(values)] = 0x7FC0
    return rounded.tobytes()


def _convert(
    shard: pathlib.Path, offset: int, length: int, source: int, target: int, out: BinaryIO
) -> tuple[int, int]:
    """The tensor at ``offset`` / ``length`` of ``shard`` appended to ``out`` in ``target`` (64-byte
    aligned); its offset and length there."""
    out.write(b"\0" * (-out.tell() % _ALIGN))
    start, size = out.tell(), _SOURCES[source]
    raw_type = "<f4" if source == TensorProto.FLOAT else "<u2"
    with open(shard, "rb") as src:
        src.seek(offset)
        left = length
        while left:
            piece = src.read(min(left, _PIECE))
            if not piece or len(piece) % size:
                raise OSError(f"{shard.name} ends inside the tensor at byte {offset} ({length} bytes)")
            out.write(_to_half(np.frombuffer(piece, raw_type), source, target))
            left -= len(piece)
    return start, length // size * 2


def store_half_weights(folder: pathlib.Path, model_files: list[str], dtype: str) -> int:
    """Each external float32 / bfloat16 initializer of the package's ``model_files`` that only Casts to
    ``dtype`` read, converted into ``OWN_FILE`` and read directly (its Casts dropped); returns the bytes
    written. A tensor several files (or initializers) read is converted once."""
    import onnx

    target = HALF_TYPES[dtype]
    written: dict[tuple[str, int, int, int], tuple[int, int]] = {}
    with open(folder / OWN_FILE, "ab") as out:
        for name in model_files:
            proto = onnx.load(os.fspath(folder / name), load_external_data=False)
            graph = proto.graph
            readers: dict[str, list[Any]] = {}
            for node in graph.node:
                for i in node.input:
                    readers.setdefault(i, []).append(node)
            # values the control-flow bodies read from this graph, and its outputs: left as they are
            captured = {x for n in graph.node for body in bodies(n) for x in outer_reads(body)}
            captured |= {o.name for o in graph.output}
            dropped: dict[str, str] = {}  # a dropped Cast's output -> the initializer it read
            for tensor in graph.initializer:
                entries = {e.key: e.value for e in tensor.external_data}
                casts = readers.get(tensor.name, [])
                if (
                    tensor.data_location != TensorProto.EXTERNAL
                    or tensor.data_type not in _SOURCES
                    or "location" not in entries
                    or not is_linked(folder / entries["location"])  # the export's own data stays as written
                    or tensor.name in captured
                    or not casts
                    or any(_cast_to(n) != target or n.output[0] in captured for n in casts)
                ):
                    continue
                span = (int(entries.get("offset", 0)), int(entries["length"]))
                key = (entries["location"], *span, tensor.data_type)
                if key not in written:
                    written[key] = _convert(
                        folder / entries["location"], *span, tensor.data_type, target, out
                    )
                offset, length = written[key]
                tensor.data_type = target
                del tensor.external_data[:]
                for k, v in (("location", OWN_FILE), ("offset", str(offset)), ("length", str(length))):
                    tensor.external_data.add(key=k, value=v)
                dropped.update((cast.output[0], tensor.name) for cast in casts)
            if dropped:
                kept = [n for n in graph.node if not (n.op_type == "Cast" and n.output[0] in dropped)]
                del graph.node[:]
                graph.node.extend(kept)
                rename_reads(graph, dropped)  # the Casts' readers read the initializers themselves
                infos = [v for v in graph.value_info if v.name not in dropped]
                del graph.value_info[:]
                graph.value_info.extend(infos)
                onnx.save(proto, os.fspath(folder / name))
    return sum(length for _, length in written.values())
