"""Shared test helper: export a module once, convert it per opset/setting, compare with eager in onnxruntime."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

import fastonnx
from fastonnx.capture import capture
from fastonnx.opsets import MAX_OPSET

CAPTURE = os.environ.get("FASTONNX_CAPTURE", "export")
"""FASTONNX_CAPTURE=trace runs the model suites' static-shape checks through to_onnx's real-tensor
trace (capture="trace") instead of torch.export; a model the trace refuses is checked through the
torch.export fallback, its name and the reason appended to REFUSED."""
REFUSED: list[tuple[str, str]] = []


class Fn(torch.nn.Module):
    """A module calling one function of its inputs (so a test can export any torch function)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Any) -> Any:
        return self.fn(*xs)


OPSETS: tuple[int, ...] = (17, 18, 20, 23, MAX_OPSET)
ENDS: tuple[int, ...] = (17, MAX_OPSET)


def check_export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    opsets: Iterable[int] = ENDS,
    optimize: Sequence[bool | str] = (True,),
    atol: float = 1e-4,
    rtol: float = 1e-4,
    dynamic_shapes: Any = None,
    run_args: Sequence[tuple[Any, ...]] | None = None,
    fusions: Callable[[int, bool | str], Mapping[str, int]] | None = None,
) -> list[fastonnx.ExportResult]:
    """torch.export once; for each opset and optimize setting: convert, run in onnxruntime, compare.

    ``run_args`` are further inputs (for dynamic shapes) run on the same exported file.
    ``fusions(opset, optimize)`` gives the counters of ``stats["optimize"]`` each conversion must report
    (a counter the stats do not hold counts as 0; counters not named are not checked).
    """
    model = model.eval()
    kwargs = kwargs or {}
    if CAPTURE == "trace" and dynamic_shapes is None:
        stats: dict[str, Any] = {}
        ep = capture(model, args, kwargs, None, stats, how="trace")
        if stats["capture"] != "trace":
            REFUSED.append((type(model).__name__, stats["trace_refused"]))
    else:
        ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    all_inputs = [args, *(run_args or [])]
    with torch.no_grad():
        expected = [model(*a, **kwargs) for a in all_inputs]
    results = []
    for opset in opsets:
        for opt in optimize:
            result = fastonnx.to_onnx(ep, args, kwargs, opset=opset, optimize=opt)
            if fusions is not None:
                want = dict(fusions(opset, opt))
                stats = result.stats.get("optimize") or {}
                got = {name: stats.get(name, 0) for name in want}
                assert got == want, f"opset={opset} optimize={opt}: fusions {got}, expected {want}"
            for a, exp in zip(all_inputs, expected, strict=True):
                got = result(*a, **kwargs)
                torch.testing.assert_close(
                    got,
                    exp,
                    atol=atol,
                    rtol=rtol,
                    equal_nan=True,
                    msg=lambda m, o=opset, p=opt: f"opset={o} optimize={p}: {m}",
                )
            results.append(result)
    return results
