"""What a verification found: per-value comparisons of onnxruntime against eager PyTorch, the
tolerances they use, and the tables they print. verification.py runs the comparisons; this module holds
only their results, so that ExportResult can name them without importing the runs (which read it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

# (atol, rtol) per dtype when the caller gives none: what a float32 graph reordering its reductions
# (fusions, onnxruntime's kernels) stays within on typical models; integers and booleans are exact.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-3),
    torch.complex64: (1e-4, 1e-3),
    torch.complex128: (1e-7, 1e-7),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
_LOW_PRECISION = (1e-1, 1e-1)  # float8 and float4


@dataclass(frozen=True)
class VerificationInfo:
    """One compared value: the largest absolute and relative differences and whether every element is
    within ``atol + rtol * |expected|`` (NaN matching NaN, same dtype and shape)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_rel_diff: float
    passed: bool
    atol: float
    rtol: float
    note: str = ""


def tolerances(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The tolerances applied to a value of ``dtype``: the caller's, else the dtype's defaults.
    Integers and booleans are always compared exactly."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0
    default = DEFAULT_TOLERANCES.get(dtype, _LOW_PRECISION)
    return (default[0] if atol is None else atol), (default[1] if rtol is None else rtol)


def compare(
    name: str, expected: Any, actual: Any, atol: float | None = None, rtol: float | None = None
) -> VerificationInfo:
    """Compare onnxruntime's ``actual`` with torch's ``expected`` (tensors or Python numbers)."""
    e = expected if isinstance(expected, torch.Tensor) else torch.as_tensor(expected)
    a = actual if isinstance(actual, torch.Tensor) else torch.as_tensor(actual)
    e, a = e.detach().cpu(), a.detach().cpu()
    at, rt = tolerances(e.dtype, atol, rtol)
    shape = tuple(int(d) for d in e.shape)
    dtype = str(e.dtype).removeprefix("torch.")

    def failed(note: str) -> VerificationInfo:
        return VerificationInfo(name, dtype, shape, math.inf, math.inf, False, at, rt, note)

    if e.is_complex():
        # the graph holds complex values as (..., 2) reals: compare in that layout
        e = torch.view_as_real(e.resolve_conj())
        if a.is_complex():
            a = torch.view_as_real(a.resolve_conj())
    if tuple(a.shape) != tuple(e.shape):
        return failed(f"shape {tuple(a.shape)} instead of {tuple(e.shape)}")
    # a Python number (a SymInt output) is compared by value; tensors must also agree on dtype
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor) and a.dtype != e.dtype:
        return failed(f"dtype {str(a.dtype).removeprefix('torch.')} instead of {dtype}")
    if e.numel() == 0:
        return VerificationInfo(name, dtype, shape, 0.0, 0.0, True, at, rt)
    e64, a64 = e.to(torch.float64), a.to(torch.float64)
    both_nan = torch.isnan(e64) & torch.isnan(a64)
    same = (e64 == a64) | both_nan  # equal infinities included
    diff = torch.where(same, torch.zeros_like(e64), (a64 - e64).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    within = same | (diff <= at + rt * e64.abs())
    nonzero = e64.abs() > 0
    rel = torch.where(nonzero & ~same, diff / e64.abs().clamp_min(1e-300), torch.zeros_like(diff))
    rel = torch.where(~nonzero & ~same, torch.full_like(diff, math.inf), rel)
    return VerificationInfo(
        name, dtype, shape, float(diff.max()), float(rel.max()), bool(within.all()), at, rt
    )


def table(infos: list[VerificationInfo]) -> str:
    """A markdown table of compared values."""
    rows = [
        "| value | dtype | shape | max abs diff | max rel diff | atol | rtol | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i in infos:
        verdict = ("pass" if i.passed else "**FAIL**") + (f" ({i.note})" if i.note else "")
        rows.append(
            f"| `{i.name}` | {i.dtype} | {list(i.shape)} | {i.max_abs_diff:.3g} | {i.max_rel_diff:.3g} | "
            f"{i.atol:g} | {i.rtol:g} | {verdict} |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class NodeCheck:
    """The comparison of one output of one FX node."""

    fx_node: str
    target: str
    onnx_value: str
    info: VerificationInfo


@dataclass(frozen=True)
class Divergence:
    """The first FX node whose value is outside tolerance while its compared inputs agree."""

    fx_node: str
    target: str
    source_line: str
    onnx_value: str
    onnx_nodes: list[str]
    info: VerificationInfo
    inputs_agreeing: list[str]
    inputs_not_compared: list[str]

    def __str__(self) -> str:
        lines = [
            f"first divergence: FX node {self.fx_node!r} ({self.target})",
            f"  at {self.source_line}",
            f"  ONNX value {self.onnx_value!r}, made by ONNX nodes: {', '.join(self.onnx_nodes) or '?'}",
            f"  max abs diff {self.info.max_abs_diff:.3g}, max rel diff {self.info.max_rel_diff:.3g} "
            f"(atol {self.info.atol:g}, rtol {self.info.rtol:g})"
            + (f"; {self.info.note}" if self.info.note else ""),
            f"  inputs that agree: {', '.join(self.inputs_agreeing) or 'none (graph inputs and weights only)'}",
        ]
        if self.inputs_not_compared:
            lines.append(
                "  inputs NOT compared (skipped; the divergence may start there): "
                + ", ".join(self.inputs_not_compared)
            )
        return "\n".join(lines)


@dataclass
class IntermediateVerification:
    """Every compared FX value in graph order, the first divergence (None when all agree), and how
    many values were skipped and why."""

    checks: list[NodeCheck] = field(default_factory=list)
    first_divergence: Divergence | None = None
    skipped: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        n_fail = sum(1 for c in self.checks if not c.info.passed)
        skipped = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        head = f"intermediate verification: {len(self.checks)} values compared, {n_fail} outside tolerance; skipped {skipped}"
        if self.first_divergence is None:
            return head + "\nno divergence: every compared value agrees with PyTorch"
        return head + "\n" + str(self.first_divergence)


@dataclass
class Verification:
    """What ``ExportResult.verify`` returns: the outputs' table and, when asked, the intermediate one."""

    outputs: list[VerificationInfo]
    intermediate: IntermediateVerification | None = None

    @property
    def passed(self) -> bool:
        ok = all(i.passed for i in self.outputs)
        return ok and (self.intermediate is None or self.intermediate.first_divergence is None)

    def __str__(self) -> str:
        text = "outputs:\n" + table(self.outputs)
        if self.intermediate is not None:
            text += "\n" + str(self.intermediate)
        return text


# ---- outputs ------------------------------------------------------------------------------------
