"""Op-by-op checks driven by torch's OpInfo database: each sample becomes a one-op module (tensor
arguments are graph inputs, everything else is baked in), exported with torch.export, converted by
fastonnx at each opset, run in onnxruntime (bfloat16: onnx's reference evaluator) and compared with eager.

Used by tests/converters/ (a few samples per op) and by scripts/sweep.py (every sample, every opset).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

import torch
import torch.utils._pytree as pytree

import fastonnx

# Tolerances, per dtype; ops listed in OP_TOLERANCE get their own, with the reason next to them.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float64: (1e-7, 1e-7),
}
OP_TOLERANCE: dict[str, tuple[float, float]] = {
    # float32 accumulations in a different order (onnxruntime's kernels) over long reductions
    "cumprod": (1e-3, 1e-3),
    "prod": (1e-3, 1e-3),
    "logcumsumexp": (1e-3, 1e-3),
    "nn.functional.conv_transpose3d": (1e-3, 1e-3),
    "nn.functional.conv3d": (1e-3, 1e-3),
    "linalg.vector_norm": (1e-3, 1e-3),
}

# ops whose values are uninitialized memory: only their shape and dtype can be compared
UNDEFINED_VALUES = frozenset(
    {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
)

PASS = "pass"
CAPTURE_FAILED = "capture_failed"  # torch.export could not capture the sample: not ours
NO_CONVERTER = "no_converter"
CONVERSION_ERROR = "conversion_error"
ORT_REFUSED = "ort_refused"
WRONG = "wrong"
EAGER_FAILED = "eager_failed"  # the sample itself does not run in eager mode


@dataclasses.dataclass
class Outcome:
    status: str
    detail: str = ""
    opset: int | None = None


@cache
def op_db_by_name() -> dict[str, Any]:
    """OpInfo entries keyed 'name' or 'name.variant'."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {(f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name): op for op in op_db}


def ops_supporting(names: Sequence[str], dtype: torch.dtype, skip_prefix: str | None = None) -> list[str]:
    """The ops of ``names`` whose OpInfo entry declares ``dtype`` on CPU (minus those named ``skip_prefix*``)."""
    db = op_db_by_name()
    return [
        n
        for n in names
        if dtype in db[n].supported_dtypes("cpu") and not (skip_prefix and n.startswith(skip_prefix))
    ]


class OneOp(torch.nn.Module):
    """Calls one op on a sample: forward's tensors replace the sample's tensor leaves, in order."""

    def __init__(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.op = op
        leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.is_tensor = [isinstance(v, torch.Tensor) for v in leaves]
        self.constants = [None if t else v for v, t in zip(leaves, self.is_tensor)]

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        leaves = [next(it) if t else c for t, c in zip(self.is_tensor, self.constants)]
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(*args, **kwargs)


def sample_call(sample: Any) -> tuple[tuple[Any, ...], dict[str, Any], tuple[torch.Tensor, ...]]:
    args = (sample.input, *sample.args)
    kwargs = dict(sample.kwargs)
    leaves = pytree.tree_leaves((args, kwargs))
    tensors = tuple(t.detach().clone() for t in leaves if isinstance(t, torch.Tensor))
    return args, kwargs, tensors


def _clone(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in tensors)


def _compare(got: Any, expected: Any, atol: float, rtol: float) -> str | None:
    try:
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True, check_device=False)
    except (AssertionError, TypeError, ValueError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def _compare_layout(got: Any, expected: Any) -> str | None:
    """Shape and dtype only, leaf by leaf."""
    g, e = pytree.tree_leaves(got), pytree.tree_leaves(expected)
    if len(g) != len(e):
        return f"{len(g)} outputs, {len(e)} expected"
    for a, b in zip(g, e):
        if isinstance(b, torch.Tensor) and (tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype):
            return f"got {a.dtype} {tuple(a.shape)}, expected {b.dtype} {tuple(b.shape)}"
    return None


def _run_reference(result: fastonnx.ExportResult, tensors: Sequence[torch.Tensor]) -> Any:
    """bfloat16 models run in onnx's reference evaluator (onnxruntime's CPU kernels lack bf16)."""
    import ml_dtypes
    import onnx.reference

    ref = onnx.reference.ReferenceEvaluator(result.model_proto)
    feeds = {}
    slots = [s for s in result._layout.inputs if s.onnx_name is not None]
    for slot, t in zip(slots, tensors):
        a = t.detach().contiguous()
        feeds[slot.onnx_name] = (
            a.view(torch.uint16).numpy().view(ml_dtypes.bfloat16) if a.dtype == torch.bfloat16 else a.numpy()
        )
    outs = ref.run(None, feeds)
    conv = []
    for o in outs:
        if getattr(o, "dtype", None) == ml_dtypes.bfloat16:
            conv.append(torch.from_numpy(o.view("uint16")).view(torch.bfloat16))
        else:
            conv.append(torch.as_tensor(o))
    return conv[0] if len(conv) == 1 else tuple(conv)


def check_sample(
    op_name: str, op: Any, sample: Any, opsets: Iterable[int], dtype: torch.dtype = torch.float32
) -> list[Outcome]:
    """One outcome per opset (or one capture/eager outcome for all)."""
    args, kwargs, tensors = sample_call(sample)
    module = OneOp(op.op, args, kwargs)
    try:
        with torch.no_grad():
            expected = module(*_clone(tensors))
    except Exception as e:
        return [Outcome(EAGER_FAILED, f"{type(e).__name__}: {e}")]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, _clone(tensors), strict=False)
    except Exception as e:
        return [Outcome(CAPTURE_FAILED, f"{type(e).__name__}: {str(e)[:300]}")]
    # an op's own tolerance widens the dtype's, never narrows it (float16 keeps its 1e-2)
    base = TOLERANCE.get(dtype, (1e-4, 1e-4))
    extra = OP_TOLERANCE.get(op_name, base)
    atol, rtol = max(base[0], extra[0]), max(base[1], extra[1])
    outcomes = []
    for opset in opsets:
        try:
            result = fastonnx.to_onnx(ep, _clone(tensors), opset=opset)
        except fastonnx.UnsupportedOpError as e:
            outcomes.append(Outcome(NO_CONVERTER, str(e).split(" (FX node")[0], opset))
            continue
        except fastonnx.FastOnnxError as e:
            outcomes.append(Outcome(CONVERSION_ERROR, f"{type(e).__name__}: {str(e)[:400]}", opset))
            continue
        try:
            if dtype == torch.bfloat16:
                got = _run_reference(result, tensors)
            else:
                got = result(*_clone(tensors))
        except fastonnx.RuntimeCheckError as e:
            outcomes.append(Outcome(ORT_REFUSED, str(e)[:400], opset))
            continue
        except Exception as e:
            outcomes.append(Outcome(ORT_REFUSED, f"{type(e).__name__}: {str(e)[:400]}", opset))
            continue
        if op_name in UNDEFINED_VALUES:
            problem = _compare_layout(got, expected)
        else:
            problem = _compare(got, expected, atol, rtol)
        outcomes.append(Outcome(WRONG, problem, opset) if problem else Outcome(PASS, "", opset))
    return outcomes


def samples(op: Any, dtype: torch.dtype = torch.float32, limit: int | None = None) -> list[Any]:
    """The op's samples for ``dtype``; ``limit`` keeps an evenly spread subset (CI's sampled sweep)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        all_samples = list(op.sample_inputs("cpu", dtype))
    if limit is None or len(all_samples) <= limit:
        return all_samples
    step = len(all_samples) / limit
    return [all_samples[int(i * step)] for i in range(limit)]


def ci_sample_limit() -> int | None:
    """Samples per op in tests: a few in CI, all with FASTONNX_FULL_SWEEP=1."""
    return None if os.environ.get("FASTONNX_FULL_SWEEP") == "1" else 3


def assert_op_converts(
    op_name: str, opsets: Sequence[int], dtype: torch.dtype = torch.float32, limit: int | None = 3
) -> None:
    """The test body of tests/converters: every captured sample matches eager at every opset.

    Samples torch.export cannot capture are not ours and are not counted; if none is captured the
    test is skipped with torch's reason (visible in the report), never passed silently.
    """
    import pytest

    op = op_db_by_name()[op_name]
    checked = 0
    failures = []
    capture_reason = ""
    for i, sample in enumerate(samples(op, dtype, limit)):
        for o in check_sample(op_name, op, sample, opsets, dtype):
            if o.status in (CAPTURE_FAILED, EAGER_FAILED):
                capture_reason = o.detail
                continue
            checked += 1
            if o.status != PASS:
                failures.append(f"sample {i} opset {o.opset}: {o.status}: {o.detail}")
    if checked == 0:
        pytest.skip(f"{op_name}: no sample could be captured by torch.export: {capture_reason[:200]}")
    assert not failures, f"{op_name} ({dtype}): " + "\n".join(failures[:10])
