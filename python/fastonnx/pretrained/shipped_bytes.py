"""What a package ships: the bytes its graphs read, never a whole checkpoint shard linked for one tensor.

A package references the checkpoint's shards in place (hard-linked into its folder: onnxruntime reads
external data only inside the model's folder). A shard the package reads mostly (a float package: every
weight) stays linked; a shard it reads a small part of (an int4 package reads the float embedding and
the norms of a shard whose matrices it wrote quantized) is replaced by those tensors, copied into the
package's own file ``OWN_FILE``, so that a user who copies or uploads the folder ships what the package
reads. ``copy=True`` (``fastonnx export --copy``) copies every referenced tensor and links nothing: a
package that shares no file with the checkpoint.

The copy streams each tensor's byte range from the shard into ``OWN_FILE`` (aligned to 64 bytes, as
the writer aligns), a piece at a time, and rewrites the ``location`` / ``offset`` / ``length`` of the
initializers that read it, in every model file of the package; a range read by several initializers
(tied weights) or files is copied once.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections import defaultdict
from typing import Any

OWN_FILE = "package_weights.data"
"""The package's own file of the tensors copied out of the checkpoint's shards."""

READ_MOSTLY = 0.5
"""A linked shard stays linked when the package reads at least this part of its bytes."""

_ALIGN = 64
_PIECE = 16 << 20


@dataclasses.dataclass
class Shipped:
    """The bytes of a package's weight files: its own and those hard-linked from the checkpoint."""

    own_bytes: int
    linked_bytes: int
    linked: list[str]  # the shards left linked (the package reads most of each)
    copied: dict[str, int]  # shard -> bytes copied out of it into OWN_FILE (the shard unlinked)

    def stats(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def report(self) -> str:
        lines = [
            "## Shipped bytes",
            "",
            f"The package's own files hold {_gib(self.own_bytes)}; {_gib(self.linked_bytes)} are hard-linked "
            "from the checkpoint (a copy or an upload of the folder carries both).",
        ]
        if self.linked:
            lines.append(
                "Linked: " + ", ".join(f"`{s}`" for s in self.linked) + f" (the package reads at least "
                f"{READ_MOSTLY:.0%} of each)."
            )
        if self.copied:
            lines.append(
                f"Copied into `{OWN_FILE}` and not linked: "
                + ", ".join(f"{_gib(n)} of `{s}`" for s, n in sorted(self.copied.items()))
                + "."
            )
        return "\n".join(lines) + "\n"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3f} GiB"


def _entries(tensor: Any) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def all_initializers(graph: Any) -> list[Any]:
    """A graph's initializers and those of its subgraphs (Loop / Scan bodies)."""
    found = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                found += all_initializers(attr.g)
            for sub in attr.graphs:
                found += all_initializers(sub)
    return found


def is_linked(path: pathlib.Path) -> bool:
    """Whether ``path`` is a checkpoint shard hard-linked into the package (its bytes shared)."""
    return path.is_file() and path.stat().st_nlink > 1


def ship(folder: pathlib.Path, model_files: list[str], copy: bool) -> Shipped:
    """Copies into ``OWN_FILE`` the tensors the model files read from linked shards the package reads
    little of (every linked shard with ``copy``), unlinks those shards, and returns the account."""
    import onnx

    protos = {name: onnx.load(os.fspath(folder / name), load_external_data=False) for name in model_files}
    read: dict[str, int] = defaultdict(int)
    ranges: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for proto in protos.values():
        for tensor in all_initializers(proto.graph):
            entries = _entries(tensor)
            if "location" in entries:
                span = (int(entries.get("offset", 0)), int(entries.get("length", 0)))
                if span not in ranges[entries["location"]]:
                    ranges[entries["location"]].add(span)
                    read[entries["location"]] += span[1]
    linked = {loc for loc in ranges if (folder / loc).is_file() and is_linked(folder / loc)}
    moved = sorted(loc for loc in linked if copy or read[loc] < READ_MOSTLY * (folder / loc).stat().st_size)
    if moved:
        where = _copy_ranges(folder, {loc: sorted(ranges[loc]) for loc in moved})
        for name, proto in protos.items():
            changed = False
            for tensor in all_initializers(proto.graph):
                entries = _entries(tensor)
                if entries.get("location") not in where:
                    continue
                span = (int(entries.get("offset", 0)), int(entries.get("length", 0)))
                offset = where[entries["location"]][span]
                for e in tensor.external_data:
                    if e.key == "location":
                        e.value = OWN_FILE
                    elif e.key == "offset":
                        e.value = str(offset)
                changed = True
            if changed:
                onnx.save(proto, os.fspath(folder / name))
        for loc in moved:
            (folder / loc).unlink()
    kept = sorted(loc for loc in linked if loc not in moved)
    own = sum(
        p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name not in kept and p.suffix != ".md"
    )
    return Shipped(
        own_bytes=own,
        linked_bytes=sum((folder / loc).stat().st_size for loc in kept),
        linked=kept,
        copied={loc: read[loc] for loc in moved},
    )


def _copy_ranges(
    folder: pathlib.Path, spans: dict[str, list[tuple[int, int]]]
) -> dict[str, dict[tuple[int, int], int]]:
    """Appends each shard's byte ranges to ``OWN_FILE`` (64-byte aligned), a piece at a time; returns
    each range's offset there."""
    where: dict[str, dict[tuple[int, int], int]] = {}
    target = folder / OWN_FILE
    with open(target, "ab") as out:
        for loc, ranges in spans.items():
            where[loc] = {}
            with open(folder / loc, "rb") as src:
                for start, length in ranges:
                    pad = -out.tell() % _ALIGN
                    out.write(b"\0" * pad)
                    where[loc][(start, length)] = out.tell()
                    src.seek(start)
                    left = length
                    while left:
                        piece = src.read(min(left, _PIECE))
                        if not piece:
                            raise OSError(f"{loc} ends before byte {start + length}")
                        out.write(piece)
                        left -= len(piece)
    return where
