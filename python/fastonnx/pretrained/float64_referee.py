"""The float64 referee of a one-graph package check: when the graph and transformers' float32 forward
disagree past the tolerances, both are judged against the same forward in float64.

Some random tiny models are ill-conditioned in float32: DepthPro's depth is a reciprocal of a small
inverse depth, so torch's own float32 result is 1.1% from its float64 one while the graph is 0.67%.
Comparing the graph with float32 eager then measures torch's rounding, not the conversion. The rule:
a value passes when its worst error against float64 eager, in units of the tolerance
(``|x - exact| / (atol + rtol * |exact|)``), is within 1 or within torch float32's own worst error in
the same units: the graph is at least as close to the exact answer as the framework it is checked
against. A wrong conversion is far from both and still fails. The referee never runs when the float32
comparison passes, and is skipped (the failure stands, with a note why) when the model does not run in
float64 or its float64 copy would not fit in memory.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo

Forward = Callable[[torch.nn.Module, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""Runs a model on inputs and returns the compared values by name."""


def _as_double(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}


def _worst(x: torch.Tensor, exact: torch.Tensor, atol: float, rtol: float) -> float:
    """``x``'s largest error against ``exact`` in units of the allowed difference."""
    err = (x.double() - exact).abs() / (atol + rtol * exact.abs())
    return float(torch.nan_to_num(err, nan=float("inf")).max()) if err.numel() else 0.0


def referee(
    infos: list[VerificationInfo],
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
    actual: dict[str, torch.Tensor],
    forward: Forward,
    room: int | None,
) -> list[VerificationInfo]:
    """``infos`` with each failed float value judged against float64 eager (the module docstring's
    rule). ``expected``: torch's float32 values, ``actual``: the graph's, by the infos' names; ``room``:
    bytes free for the float64 copy (None: unknown)."""
    failed = [i for i in infos if not i.passed and i.dtype in ("float32", "float16", "bfloat16")]
    if not failed:
        return infos
    need = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    if room is not None and need > room:
        return [_noted(i, "float64 referee skipped: its copy would not fit in memory") for i in infos]
    try:
        with torch.no_grad():
            exact = forward(copy.deepcopy(model).double(), _as_double(inputs))
    except Exception as e:  # any failure of transformers' forward in float64: the float32 verdict stands
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        return [_noted(i, f"float64 referee could not run: {first}") for i in infos]
    judged = []
    for info in infos:
        if info not in failed or info.name not in exact or info.note:
            judged.append(info)
            continue
        e64 = exact[info.name].double()
        graph = _worst(actual[info.name], e64, info.atol, info.rtol)  # the tolerances the check used
        torch32 = _worst(expected[info.name], e64, info.atol, info.rtol)
        passed = graph <= max(1.0, torch32)
        note = f"against float64 eager: graph {graph:.3g}x the tolerance, torch float32 {torch32:.3g}x" + (
            "" if passed else " (the graph is further from the exact answer)"
        )
        judged.append(dataclasses.replace(info, passed=passed, note=note))
    return judged


def _noted(info: VerificationInfo, note: str) -> VerificationInfo:
    return info if info.passed or info.note else dataclasses.replace(info, note=note)
