"""The markdown report of one export (``to_onnx(report=True | path)``), written also when it fails.

Where: ``report=path`` writes there; ``report=True`` writes next to the model file with ``.onnx``
replaced by ``.report.md`` (``model.onnx`` -> ``model.report.md``), or, without a filename, to
``<ModelClass>.report.md`` in the current folder. A failed export's exception message ends with the
report's path. Sections: versions, model and arguments, capture (torch.export's error and the user's
line when it failed), op inventory, the conversion failure (FX node, its arguments, the builder's last
values), stage timings, nodes by op type before / after optimization with what each pass changed, and
the verification table when verification ran.

What the report costs is paid only when it is asked for: the op inventory and the node counts are
computed here, not during the export.
"""

from __future__ import annotations

import collections
import importlib.metadata
import os
import platform
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from fastonnx._core import GraphBuilder
from fastonnx.diagnostics import debug
from fastonnx.errors import InputError
from fastonnx.torch_internals import pytree

_MAX_ERROR_CHARS = 6000  # torch.export's messages can run to pages; the head says what went wrong


def report_path(report: Any, filename: str | os.PathLike[str] | None, model: Any) -> str | None:
    """Where ``report`` asks the report to go (None: no report). See the module docstring."""
    if report is False or report is None:
        return None
    if report is True:
        if filename is not None:
            base = os.fspath(filename)
            stem = base[: -len(".onnx")] if base.endswith(".onnx") else base
            return stem + ".report.md"
        return os.path.abspath(f"{type(model).__name__}.report.md")
    if isinstance(report, (str, os.PathLike)):
        return os.fspath(report)
    raise InputError(f"report must be False, True or a path, got {type(report).__name__}")


@dataclass
class ExportRecord:
    """What the report needs, filled in by to_onnx as the stages run."""

    path: str | None  # None: no report asked for, the stages are still followed (api._explain)
    model: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    stage: str = "checking arguments"
    ep: torch.export.ExportedProgram | None = None
    registry: Any = None
    builder: GraphBuilder | None = None
    ops_before: collections.Counter[str] | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    def count_before_optimize(self, builder: GraphBuilder) -> None:
        self.builder = builder
        self.ops_before = collections.Counter(op for _, op, _, _ in builder.nodes())

    def write(self, error: BaseException | None = None) -> str:
        assert self.path is not None
        text = render(self, error)
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(text)
        return self.path


def render(rec: ExportRecord, error: BaseException | None) -> str:
    name = type(rec.model).__name__
    status = "succeeded" if error is None else f"FAILED at {rec.stage} ({type(error).__name__})"
    out = [f"# fastonnx export report: {name}", "", f"**Status:** export {status}.", ""]
    out += _versions()
    out += _model_section(rec)
    out += _capture_section(rec, error)
    out += _inventory_section(rec)
    if error is not None and rec.stage != "capture":
        out += _failure_section(rec, error)
    out += _timings_section(rec)
    out += _nodes_section(rec)
    out += _verification_section(rec)
    return "\n".join(out).rstrip() + "\n"


def _versions() -> list[str]:
    def version(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    from fastonnx import __version__

    rows = [
        ("fastonnx", __version__),
        ("torch", torch.__version__),
        ("onnx", version("onnx")),
        ("onnxruntime", version("onnxruntime")),
        ("python", platform.python_version()),
        ("platform", platform.platform()),
    ]
    return (
        ["## Versions", "", "| package | version |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    )


def describe_tree(tree: Any) -> str:
    """The arguments' structure with every tensor as ``dtype[shape]``."""
    if isinstance(tree, torch.Tensor):
        return debug.describe_val(tree)
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        inner = ", ".join(describe_tree(x) for x in tree)
        return f"({inner},)" if len(tree) == 1 else f"({inner})"
    if isinstance(tree, list):
        return "[" + ", ".join(describe_tree(x) for x in tree) + "]"
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{k!r}: {describe_tree(v)}" for k, v in tree.items()) + "}"
    leaves, spec = pytree.tree_flatten(tree)
    if spec.num_leaves and not (len(leaves) == 1 and leaves[0] is tree):
        # a registered container (dataclass, cache...): its type and its leaves
        return f"{type(tree).__name__}(" + ", ".join(describe_tree(x) for x in leaves) + ")"
    return repr(tree) if len(repr(tree)) < 80 else f"<{type(tree).__name__}>"


def _model_section(rec: ExportRecord) -> list[str]:
    m = rec.model
    cls = f"{type(m).__module__}.{type(m).__qualname__}"
    lines = ["## Model", "", f"- class: `{cls}`"]
    if isinstance(m, torch.nn.Module):
        n_params = sum(p.numel() for p in m.parameters())
        lines.append(f"- parameters: {n_params:,}; training mode: {m.training}")
    lines.append(f"- args: `{describe_tree(rec.args)}`")
    lines.append(f"- kwargs: `{describe_tree(rec.kwargs)}`")
    opts = ", ".join(f"{k}={v!r}" for k, v in rec.options.items())
    lines += [f"- options: `{opts}`", ""]
    return lines


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The frame of the model's code where torch.export failed: the deepest frame of the causes'
    tracebacks (what ran inside torch.export) in the user's own code (not torch, fastonnx, the standard
    library or an installed package); else the deepest that is at least not torch or fastonnx (a model
    from an installed library, transformers...); else the user's frame calling to_onnx."""
    ours = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))]
    installed = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    installed.append(os.path.dirname(os.__file__))

    def frames(e: BaseException) -> list[traceback.FrameSummary]:
        return [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<")]

    def outside(frame: traceback.FrameSummary, folders: list[str]) -> bool:
        path = os.path.abspath(frame.filename)
        return not any(path.startswith(folder) for folder in folders)

    inner: list[traceback.FrameSummary] = []
    seen = {id(exc)}
    e = exc.__cause__ or exc.__context__
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        inner += frames(e)
        e = e.__cause__ or e.__context__
    for pool, folders in ((inner, ours + installed), (inner, ours), (frames(exc), ours + installed)):
        found = [f for f in pool if outside(f, folders)]
        if found:
            return found[-1]
    return None


def _capture_section(rec: ExportRecord, error: BaseException | None) -> list[str]:
    lines = ["## Capture", ""]
    if rec.stage == "checking arguments":
        return lines + ["- not reached", ""]
    if error is not None and rec.stage == "capture":
        frame = user_frame(error)
        where = (
            f"`{frame.filename}:{frame.lineno}` in `{frame.name}`: `{(frame.line or '').strip()}`"
            if frame
            else "not found"
        )
        message = str(error)
        if len(message) > _MAX_ERROR_CHARS:
            message = (
                message[:_MAX_ERROR_CHARS] + f"\n... ({len(message) - _MAX_ERROR_CHARS} more characters)"
            )
        lines += [
            f"torch.export **failed** ({type(error).__name__}).",
            "",
            f"- your line: {where}",
            "",
            "```",
            message,
            "```",
            "",
        ]
        return lines
    if isinstance(rec.model, torch.export.ExportedProgram):
        lines.append("- given an ExportedProgram: no capture")
    else:
        lines.append(f"- torch.export: ok in {rec.stats.get('capture_s', 0.0):.3f} s")
    for key in (
        "dynamic_shapes_refined",
        "dynamic_ranges",
        "guards_kept",
        "narrowed",
        "functionalized",
        "decompositions",
        "training_mode",
    ):
        if key in rec.stats:
            lines.append(f"- {key}: {rec.stats[key]}")
    if rec.ep is not None:
        lines.append(f"- FX graph: {len(rec.ep.graph.nodes)} nodes")
    return lines + [""]


def _inventory_section(rec: ExportRecord) -> list[str]:
    if rec.ep is None or rec.registry is None:
        return []
    from fastonnx.converters._generated_index import FAMILY_OF
    from fastonnx.registry import op_key

    counts: collections.Counter[str] = collections.Counter()
    targets: dict[str, Any] = {}
    for gm in rec.ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule):
            for n in gm.graph.nodes:
                if n.op == "call_function":
                    key = op_key(n.target)
                    counts[key] += 1
                    targets.setdefault(key, n.target)
    lines = ["## Op inventory", "", "| op | count | converter | family |", "|---|---|---|---|"]
    missing, custom = [], []
    for key in sorted(counts):
        try:
            entry = rec.registry.lookup(targets[key])
        except Exception as e:  # a family failing to import is itself worth a line
            entry, family = None, f"lookup failed: {e}"
        if entry is None:
            has, family = "**missing**", "-"
            missing.append(key)
        elif entry.custom:
            has, family = "custom", "your custom_converters"
            custom.append(key)
        else:
            has = "yes" + (f" (in-place, via {entry.key})" if entry.in_place else "")
            family = FAMILY_OF.get(entry.key, "?")
        lines.append(f"| `{key}` | {counts[key]} | {has} | {family} |")
    lines.append("")
    lines.append(
        f"{len(counts)} distinct ops, {sum(counts.values())} calls; missing converters: "
        f"{', '.join(f'`{k}`' for k in missing) or 'none'}; custom converters used: "
        f"{', '.join(f'`{k}`' for k in custom) or 'none'}."
    )
    return lines + [""]


def _failure_section(rec: ExportRecord, error: BaseException) -> list[str]:
    from fastonnx.walker.interpreter import source_line

    notes = "".join(f"\n{n}" for n in getattr(error, "__notes__", []))  # where the walker was
    lines = [
        f"## Failure at {rec.stage}",
        "",
        f"**{type(error).__name__}**:",
        "",
        "```",
        str(error) + notes,
        "```",
        "",
    ]
    node = getattr(error, "fx_node", None)
    if isinstance(node, torch.fx.Node):
        lines += [
            f"- FX node: `{node.name}` = `{node.target}`",
            f"- your line: `{source_line(node)}`",
            f"- expected result: `{debug.describe_val(node.meta.get('val'))}`",
            "- arguments:",
        ]
        lines += [f"  - arg {i}: `{debug.describe_arg(a)}`" for i, a in enumerate(node.args)]
        lines += [f"  - {k}: `{debug.describe_arg(a)}`" for k, a in node.kwargs.items()]
        lines.append("")
    if rec.builder is not None:
        values = debug.last_values(rec.builder)
        lines += [
            f"### Builder state: {rec.builder.num_nodes} ONNX nodes; the last {len(values)} values",
            "",
            "| value | dtype[shape] | made by |",
            "|---|---|---|",
        ]
        lines += [f"| `{v}` | {t} | {op} |" for v, t, op in values]
        lines.append("")
    text = getattr(error, "debug", None)
    if text:
        lines += ["### Debug dump", "", "```", text, "```", ""]
    return lines


def _timings_section(rec: ExportRecord) -> list[str]:
    keys = ("capture_s", "convert_s", "optimize_s", "metadata_s", "write_s", "verify_s")
    # the metadata is composed while the passes run (stages.run_optimize): not a stage of its own
    label = {"metadata_s": "metadata (alongside optimize)"}
    rows = [f"| {label.get(k, k[:-2])} | {rec.stats[k]:.3f} |" for k in keys if k in rec.stats]
    if not rows:
        return []
    return ["## Stage timings (s)", "", "| stage | seconds |", "|---|---|", *rows, ""]


def _nodes_section(rec: ExportRecord) -> list[str]:
    if rec.ops_before is None or rec.builder is None or rec.stage in ("capture", "convert"):
        return []
    before = rec.ops_before
    after = collections.Counter(op for _, op, _, _ in rec.builder.nodes())
    lines = [
        "## ONNX nodes by op type",
        "",
        f"{sum(before.values())} nodes before optimization, {sum(after.values())} after.",
        "",
        "| op type | before | after |",
        "|---|---|---|",
    ]
    for op in sorted(set(before) | set(after), key=lambda o: (-before.get(o, 0), o)):
        lines.append(f"| {op} | {before.get(op, 0)} | {after.get(op, 0)} |")
    passes = {k: v for k, v in (rec.stats.get("optimize") or {}).items() if v}
    lines += [
        "",
        "Optimization passes that changed the graph (times applied): "
        + (", ".join(f"`{k}` {v}" for k, v in passes.items()) or "none"),
        "",
    ]
    return lines


def _verification_section(rec: ExportRecord) -> list[str]:
    infos = rec.stats.get("verify")
    if not infos:
        return []
    from fastonnx.diagnostics.verdicts import table

    ok = all(i.passed for i in infos)
    return [
        "## Verification (onnxruntime vs eager PyTorch)",
        "",
        table(infos),
        "",
        f"**{'All outputs agree.' if ok else 'Some outputs DISAGREE.'}**",
        "",
    ]
