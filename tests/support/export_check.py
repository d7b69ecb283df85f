"""Shared test helper: export a module once, convert it per opset/setting, compare with eager in onnxruntime."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

import fastonnx
from fastonnx.capture import register_pytree_types, trace_or_refusal
from fastonnx.opsets import MAX_OPSET
from fastonnx.registry import Registry

SAME_GRAPH = True
"""Whether a static-shape check also compares the trace's ONNX graph with torch.export's (False for the
single-op checks of tests/converters: tests/converters/conftest.py)."""

REFUSED: list[tuple[str, str]] = []
"""(model class, reason) of each static-shape check whose model the real-tensor trace refused."""

DOCUMENTED_REFUSALS = (
    "reads a tensor's value into Python",  # item(), bool(t), equal... (ops tagged data_dependent_output)
    "reads a tensor's values into Python with Tensor.",  # tolist(), numpy(), __array__
    "output shape depends on the input's values",  # nonzero, unique, boolean masks
    "writes in place into",  # a user input, weight, buffer or captured constant
    "(a tensor subclass)",
    "copies a meta tensor's values",  # .cpu() / .to("cpu") in a meta-device trace
    "torch.export keeps it one recurrent op",  # nn.LSTM / GRU / RNN
    "the forward calls the higher-order op",  # torch.cond, while_loop...
    "is a custom op (not aten)",  # torchvision's nms...
    "addresses the storage under its input",  # as_strided
    "which fastonnx does not convert",  # an op below autograd of a composite op torch.export keeps
    "the graph needs torch.export's functionalization",  # writes through views the walker cannot write
)
"""The reasons capture/trace.py's docstring gives for refusing a model; any other refusal fails a check."""


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
    conversions: Sequence[tuple[int, bool | str]] | None = None,
) -> list[fastonnx.ExportResult]:
    """torch.export once; for each opset and optimize setting: convert, run in onnxruntime, compare.

    ``conversions``: the (opset, optimize) pairs to convert at, in order, instead of every opset of
    ``opsets`` with every setting of ``optimize`` (a sampled matrix, support/matrix.py).
    ``run_args`` are further inputs (for dynamic shapes) run on the same exported file.
    ``fusions(opset, optimize)`` gives the counters of ``stats["optimize"]`` each conversion must report
    (a counter the stats do not hold counts as 0; counters not named are not checked).

    Static shapes (``dynamic_shapes`` None, what to_onnx's default capture="auto" traces): the model is
    also captured by the real-tensor trace and converted at the last opset and optimize setting, run
    in onnxruntime and compared with eager, and, for a model (not one torch function wrapped in
    ``Fn``), its ONNX graph must be torch.export's (op types in order, input and output names, shapes
    and types); a model the trace refuses is appended to ``REFUSED`` and its reason must be one of
    ``DOCUMENTED_REFUSALS``. The single-op checks (``Fn``, tests/converters: ``SAME_GRAPH``) compare
    values only: the trace records a composite op as autograd decomposes it (``F.pad``, ``prelu``,
    ``stft``...) where torch.export keeps it whole, so the graph differs there, with the same values.
    """
    model = model.eval()
    kwargs = kwargs or {}
    ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    traced = None
    if dynamic_shapes is None:
        register_pytree_types()  # as to_onnx does before it captures (transformers' caches)
        got = trace_or_refusal(model, args, kwargs, Registry().converts)
        if isinstance(got, str):
            assert any(r in got for r in DOCUMENTED_REFUSALS), f"undocumented trace refusal: {got}"
            REFUSED.append((type(model).__name__, got))
        else:
            traced = got
    all_inputs = [args, *(run_args or [])]
    with torch.no_grad():
        expected = [model(*a, **kwargs) for a in all_inputs]
    pairs = list(conversions) if conversions is not None else [(o, p) for o in opsets for p in optimize]
    assert pairs, "no conversion to check"
    results = []
    for opset, opt in pairs:
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
    if traced is not None:
        opset, opt = results[-1].stats["opset"], pairs[-1][1]
        result = fastonnx.to_onnx(traced, args, kwargs, opset=opset, optimize=opt)
        for a, exp in zip(all_inputs, expected, strict=True):
            torch.testing.assert_close(
                result(*a, **kwargs), exp, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"trace: {m}"
            )
        if SAME_GRAPH and not isinstance(model, Fn):
            got, want = _graph(result), _graph(results[-1])
            diff = "\n".join(difflib.unified_diff(want, got, "torch.export", "trace", lineterm="", n=1))
            assert got == want, f"opset={opset} optimize={opt}: trace and torch.export differ:\n{diff}"
    return results


def _graph(result: fastonnx.ExportResult) -> list[str]:
    """Op types in order, inputs and outputs (name, type and shape): what a file's user sees of it."""
    graph = result.model_proto.graph

    def io(kind: str, values: Any) -> list[str]:
        return [f"{kind} {v.name}: {v.type.tensor_type.elem_type} {v.type.tensor_type.shape}" for v in values]

    return io("input", graph.input) + [n.op_type for n in graph.node] + io("output", graph.output)
