"""Op-by-op checks driven by torch's OpInfo database: each sample becomes a one-op module (tensor
arguments are graph inputs, everything else is baked in), exported with torch.export, converted by
fastonnx at each opset, run in onnxruntime (bfloat16: onnx's reference evaluator) and compared with eager.

Used by tests/converters/ (a few samples per op) and by scripts/sweep.py (every sample, every opset).

Random ops (RANDOM_VALUES: bernoulli, normal, randint, dropout in training mode...) cannot match eager
values: the exported graph draws from the runtime's generator. They are checked on layout (shape and
dtype) and on their support (every value is one the distribution can produce: 0 or 1, within
[low, high), 0 or x / (1 - p)...); their distributions (mean, spread, frequencies) are checked by
hand-written tests with many draws (tests/converters/test_random.py).

Eigen- and singular vectors (SIGN_AMBIGUOUS: linalg.eigh, linalg.svd, svd) are defined only up to a
sign per column (a rotation for repeated values): their values are compared as they are, the vectors
after giving each column the sign of eager's, plus the reconstruction (V diag(w) Vᵀ, U diag(S) Vh);
samples with repeated values are compared by values and reconstruction only (see SIGN_AMBIGUOUS).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import unittest.mock
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from typing import Any

import torch
import torch.utils._pytree as pytree

import fastonnx
from support.export_check import ENDS

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
    # torch's own float32 result on the batched sample is up to 0.24% (relative, on entries ~1e2 next
    # to ones ~1e5) from the exact one; the converter computes in float64 and matches the exact value
    "matrix_exp": (1e-3, 1e-3),
}

# ops whose values are uninitialized memory: only their shape and dtype can be compared
UNDEFINED_VALUES = frozenset(
    {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
)


# ---- random ops: support checks (sample, got, expected) -> problem or None ----------------------
def _leaves(x: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _first(x: Any) -> torch.Tensor:
    return _leaves(x)[0]


def _tol(t: torch.Tensor) -> tuple[float, float]:
    return TOLERANCE.get(t.dtype, (1e-4, 1e-4))


def _support(ok: torch.Tensor, what: str, got: torch.Tensor) -> str | None:
    if bool(ok.all()):
        return None
    bad = got[~ok]
    return f"{int((~ok).sum())} values are not {what}, e.g. {bad.flatten()[:5].tolist()}"


def _finite(sample: Any, got: Any, expected: Any) -> str | None:
    g = _first(got)
    return _support(torch.isfinite(g), "finite", g)


def _in_range(lo: float, hi: float, integral: bool = False) -> Callable[[torch.Tensor], str | None]:
    def check(g: torch.Tensor) -> str | None:
        v = g.double()
        ok = (v >= lo) & (v < hi)
        if integral:
            ok &= v == v.floor()
        return _support(ok, f"{'integers ' if integral else ''}in [{lo}, {hi})", g)

    return check


def _bernoulli(sample: Any, got: Any, expected: Any) -> str | None:
    g, p = _first(got).double(), sample.input.double()
    problem = _support((g == 0) | (g == 1), "0 or 1", g)
    return problem or _support(
        ((p != 0) | (g == 0)) & ((p != 1) | (g == 1)), "0 where p = 0, 1 where p = 1", g
    )


def _uniform(sample: Any, got: Any, expected: Any) -> str | None:
    lo, hi = (list(sample.args) + [0.0, 1.0][len(sample.args) :])[:2]
    return _in_range(lo, hi)(_first(got))


def _randint(sample: Any, got: Any, expected: Any) -> str | None:
    # randint(high, size) or randint(low, high, size); randint_like(x, high) or (x, low, high)
    bounds = [sample.input, *sample.args] if not isinstance(sample.input, torch.Tensor) else list(sample.args)
    bounds = [b for b in bounds if isinstance(b, int)]
    lo, hi = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
    return _in_range(lo, hi, integral=True)(_first(got))


def _exponential(sample: Any, got: Any, expected: Any) -> str | None:
    return _in_range(0.0, float("inf"))(_first(got))


def _geometric(sample: Any, got: Any, expected: Any) -> str | None:
    return _in_range(1.0, float("inf"), integral=True)(_first(got))


def _log_normal(sample: Any, got: Any, expected: Any) -> str | None:
    g = _first(got)
    return _support((g > 0) & torch.isfinite(g), "positive and finite", g)


def _multinomial(sample: Any, got: Any, expected: Any) -> str | None:
    g, probs = _first(got), sample.input
    rows = g.reshape(-1, g.shape[-1]) if g.dim() else g.reshape(1, 1)
    p_rows = probs.reshape(-1, probs.shape[-1])
    if g.dtype != torch.int64 or bool(((rows < 0) | (rows >= p_rows.shape[-1])).any()):
        return f"indices out of [0, {p_rows.shape[-1]}): {rows.tolist()}"
    if bool((torch.gather(p_rows, 1, rows) == 0).any()):
        return f"a zero-probability category was drawn: {rows.tolist()}"
    replacement = sample.kwargs.get("replacement", sample.args[1] if len(sample.args) > 1 else False)
    if not replacement and any(len(set(r.tolist())) != len(r) for r in rows):
        return f"repeated categories without replacement: {rows.tolist()}"
    return None


def _dropout(alpha: bool, train_default: bool) -> Callable[[Any, Any, Any], str | None]:
    """Every element is the kept value (x / (1 - p); alpha: x * a + alpha * a * p) or the dropped one
    (0; alpha: -alpha * a + alpha * a * p), and x itself in eval mode or with p = 0."""

    def check(sample: Any, got: Any, expected: Any) -> str | None:
        g = _first(got)
        x = sample.input.to(g.dtype)
        p = sample.kwargs.get("p", 0.5)
        train = sample.kwargs.get("training", train_default)
        atol, rtol = _tol(g)
        if not train or p == 0:
            kept, dropped = x, None
        elif alpha:
            sat = 1.7580993408473766
            a = 1.0 / math.sqrt((sat * sat * p + 1) * (1 - p)) if p < 1 else 0.0
            kept, dropped = x * a + sat * a * p, torch.full_like(x, sat * a * (p - 1))
        else:
            kept, dropped = (x / (1 - p) if p < 1 else x * 0), torch.zeros_like(x)
        if p == 1 and train:  # torch: x * 0
            kept = x * 0

        def near(v: torch.Tensor) -> torch.Tensor:
            return torch.isclose(g.double(), v.double(), atol=atol, rtol=rtol, equal_nan=True)

        ok = near(kept) if dropped is None else near(kept) | near(dropped)
        return _support(ok, "the kept or the dropped value", g)

    return check


def _rrelu(sample: Any, got: Any, expected: Any) -> str | None:
    """x where x > 0, else x * r with r in [lower, upper] (the mean slope in eval mode)."""
    g, x = _first(got).double(), sample.input.double()
    lower, upper = sample.kwargs.get("lower", 1 / 8), sample.kwargs.get("upper", 1 / 3)
    if not sample.kwargs.get("training", False):
        lower = upper = (lower + upper) / 2
    atol, rtol = _tol(_first(got))
    slack = atol + rtol * x.abs()
    ok = torch.where(x > 0, (g - x).abs() <= slack, (g <= x * lower + slack) & (g >= x * upper - slack))
    return _support(ok, f"x or x * r with r in [{lower}, {upper}]", _first(got))


def _sdpa(sample: Any, got: Any, expected: Any) -> str | None:
    """Exact without dropout; with dropout each output is a combination of v's rows: finite."""
    if not sample.kwargs.get("dropout_p"):
        atol, rtol = _tol(_first(expected))
        return _compare(got, expected, atol, rtol)
    return _finite(sample, got, expected)


def _multi_head_attention(sample: Any, got: Any, expected: Any) -> str | None:
    """Exact unless training with dropout_p > 0 (args[9]); then the attention weights are dropped at
    random and the outputs are only checked finite."""
    if not (sample.kwargs.get("training", True) and sample.args[9] > 0):
        atol, rtol = _tol(_first(expected))
        return _compare(got, expected, atol, rtol)
    return _finite(sample, got, expected)


RANDOM_VALUES: dict[str, Callable[[Any, Any, Any], str | None]] = {
    "bernoulli": _bernoulli,
    "cauchy": _finite,
    "exponential": _exponential,
    "geometric": _geometric,
    "log_normal": _log_normal,
    "multinomial": _multinomial,
    "normal": _finite,
    "normal.in_place": _finite,
    "normal.number_mean": _finite,
    "rand_like": _finite,  # OpInfo's rand_like calls randn_like
    "randint": _randint,
    "randint_like": _randint,
    "randn": _finite,
    "randn_like": _finite,
    "uniform": _uniform,
    "nn.functional.dropout": _dropout(alpha=False, train_default=True),
    "nn.functional.dropout2d": _dropout(alpha=False, train_default=True),
    "nn.functional.dropout3d": _dropout(alpha=False, train_default=True),
    "nn.functional.alpha_dropout": _dropout(alpha=True, train_default=False),
    "nn.functional.feature_alpha_dropout.with_train": _dropout(alpha=True, train_default=False),
    "nn.functional.rrelu": _rrelu,
    "nn.functional.scaled_dot_product_attention": _sdpa,
    "nn.functional.multi_head_attention_forward": _multi_head_attention,
}


# ---- decompositions whose vectors are defined up to sign: (got, expected, atol, rtol) -> problem ------
def _aligned(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per-column signs (+-1, shape (..., 1, k)) that turn got's columns toward expected's."""
    dots = (got.double() * expected.double()).sum(dim=-2, keepdim=True)
    return torch.where(dots < 0, -1.0, 1.0).to(got.dtype)


def _repeated(values: torch.Tensor, atol: float, rtol: float) -> bool:
    """Some two values (per matrix) are too close for their vectors to be well defined."""
    if values.shape[-1] < 2:
        return False
    v = values.double().sort(dim=-1).values
    gaps = v[..., 1:] - v[..., :-1]
    return bool((gaps <= 10 * (atol + rtol * v.abs().amax(dim=-1, keepdim=True))).any())


def _factors(
    got_left: torch.Tensor,
    values: tuple[torch.Tensor, torch.Tensor],
    got_right: torch.Tensor,
    exp_left: torch.Tensor,
    exp_right: torch.Tensor,
    atol: float,
    rtol: float,
) -> str | None:
    """Checks left @ diag(values) @ rightᵀ, whose k = values.shape[-1] leading columns of left / right are
    each defined up to one shared sign per column; columns past k (full_matrices) are compared through the
    projector onto their span, which is unique."""
    got_vals, exp_vals = values
    problem = _compare(got_vals, exp_vals, atol, rtol)
    if problem:
        return f"values: {problem}"
    k = exp_vals.shape[-1]
    gl, el, gr, er = got_left[..., :k], exp_left[..., :k], got_right[..., :k], exp_right[..., :k]
    rebuilt = (gl * got_vals.unsqueeze(-2)) @ gr.mT
    problem = _compare(rebuilt, (el * exp_vals.unsqueeze(-2)) @ er.mT, atol, rtol)
    if problem:
        return f"reconstruction: {problem}"
    if not _repeated(exp_vals, atol, rtol):
        signs = _aligned(gl, el)
        problem = _compare(gl * signs, el, atol, rtol) or _compare(gr * signs, er, atol, rtol)
        if problem:
            return f"vectors (signs aligned): {problem}"
    for g, e in ((got_left, exp_left), (got_right, exp_right)):
        if e.shape[-1] > k:
            ge, ee = g[..., k:], e[..., k:]
            problem = _compare(ge @ ge.mT, ee @ ee.mT, atol, rtol)
            if problem:
                return f"complement basis (projector): {problem}"
    return None


def _eigh_check(got: Any, expected: Any, atol: float, rtol: float) -> str | None:
    (w, v), (ew, ev) = got, expected
    return _compare_layout(got, expected) or _factors(v, (w, ew), v, ev, ev, atol, rtol)


def _linalg_svd_check(got: Any, expected: Any, atol: float, rtol: float) -> str | None:
    (u, s, vh), (eu, es, evh) = got, expected
    return _compare_layout(got, expected) or _factors(u, (s, es), vh.mT, eu, evh.mT, atol, rtol)


def _svd_check(got: Any, expected: Any, atol: float, rtol: float) -> str | None:
    (u, s, v), (eu, es, ev) = got, expected
    return _compare_layout(got, expected) or _factors(u, (s, es), v, eu, ev, atol, rtol)


# Ops returning eigen- / singular vectors: each vector (column) is defined only up to its sign, and only
# up to a rotation within the space of a repeated value. Their values are compared directly (never
# loosened); the vectors after turning each got column to the sign of the expected one (the same sign
# for a singular pair u_i, v_i); the reconstruction V diag(w) Vᵀ / U diag(S) Vh against eager's; the
# columns full_matrices adds past min(m, n) (any orthonormal basis of the complement) through their
# projector. Samples with repeated values (gaps within 10x the tolerance) are compared by values and
# reconstruction only: their vectors are not unique.
SIGN_AMBIGUOUS: dict[str, Callable[[Any, Any, float, float], str | None]] = {
    "linalg.eigh": _eigh_check,
    "linalg.svd": _linalg_svd_check,
    "svd": _svd_check,
}


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
    atol, rtol = _tolerance(op_name, dtype)
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
            if dtype == torch.bfloat16 or any(t.dtype == torch.bfloat16 for t in _leaves(expected)):
                got = _run_reference(result, tensors)
            else:
                got = result(*_clone(tensors))
        except fastonnx.RuntimeCheckError as e:
            outcomes.append(Outcome(ORT_REFUSED, str(e)[:400], opset))
            continue
        except Exception as e:
            outcomes.append(Outcome(ORT_REFUSED, f"{type(e).__name__}: {str(e)[:400]}", opset))
            continue
        problem = _problem(op_name, sample, got, expected, atol, rtol)
        outcomes.append(Outcome(WRONG, problem, opset) if problem else Outcome(PASS, "", opset))
    return outcomes


def _tolerance(op_name: str, dtype: torch.dtype) -> tuple[float, float]:
    # an op's own tolerance widens the dtype's, never narrows it (float16 keeps its 1e-2)
    base = TOLERANCE.get(dtype, (1e-4, 1e-4))
    extra = OP_TOLERANCE.get(op_name, base)
    return max(base[0], extra[0]), max(base[1], extra[1])


def _problem(op_name: str, sample: Any, got: Any, expected: Any, atol: float, rtol: float) -> str | None:
    """What is wrong with ``got`` against eager's ``expected`` for one sample, or None."""
    if op_name in UNDEFINED_VALUES:
        return _compare_layout(got, expected)
    if op_name in SIGN_AMBIGUOUS:
        return SIGN_AMBIGUOUS[op_name](got, expected, atol, rtol)
    if op_name in RANDOM_VALUES:
        return _compare_layout(got, expected) or RANDOM_VALUES[op_name](sample, got, expected)
    return _compare(got, expected, atol, rtol)


class SampleOps(torch.nn.Module):
    """One op called on several samples in one graph: forward takes every sample's tensors in turn and
    returns a tuple of each sample's result."""

    def __init__(self, ops: list[OneOp], counts: list[int]) -> None:
        super().__init__()
        self.ops = torch.nn.ModuleList(ops)
        self.counts = counts

    def forward(self, *tensors: torch.Tensor) -> tuple[Any, ...]:
        results, at = [], 0
        for one, n in zip(self.ops, self.counts):
            results.append(one(*tensors[at : at + n]))
            at += n
        return tuple(results)


def check_samples_together(
    op_name: str, op: Any, samples_: Sequence[Any], opsets: Iterable[int], dtype: torch.dtype = torch.float32
) -> bool:
    """Whether every sample passes at every opset when the samples are captured and converted as one
    graph: one torch.export and one conversion an opset, where ``check_sample`` takes one of each per
    sample (the capture is most of a test's time). False means "not known": any sample that does not
    capture, convert, run or match sends the caller to ``check_sample``, sample by sample, for the
    outcome and its detail, so a failure is never reported from the combined graph."""
    calls = [sample_call(s) for s in samples_]
    ops = [OneOp(op.op, args, kwargs) for args, kwargs, _ in calls]
    tensors = tuple(t for _, _, ts in calls for t in ts)
    module = SampleOps(ops, [len(ts) for _, _, ts in calls])
    atol, rtol = _tolerance(op_name, dtype)
    try:
        with torch.no_grad():
            expected = module(*_clone(tensors))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, _clone(tensors), strict=False)
        for opset in opsets:
            result = fastonnx.to_onnx(ep, _clone(tensors), opset=opset)
            if dtype == torch.bfloat16 or any(t.dtype == torch.bfloat16 for t in _leaves(expected)):
                flat = pytree.tree_leaves(_run_reference(result, tensors))
            else:
                flat = pytree.tree_leaves(result(*_clone(tensors)))
            at = 0
            for sample, want in zip(samples_, expected):
                leaves, spec = pytree.tree_flatten(want)
                got = pytree.tree_unflatten(flat[at : at + len(leaves)], spec)
                at += len(leaves)
                if _problem(op_name, sample, got, want, atol, rtol) is not None:
                    return False
            if at != len(flat):
                return False
    except Exception:  # any failure: check_sample says which sample and why
        return False
    return True


@contextlib.contextmanager
def _cpu_sampling() -> Iterator[None]:
    """OpInfo's sample iterator (common_utils.TrackedInputIter), minus two costs that do not change a
    sample here: it looks up the stack for a unittest test whose name would seed it
    (``extract_test_fn``: ``inspect.stack()``, reading the source of every frame of pytest's deep
    stack, 20 ms a call) and finds none outside unittest, so it seeds with ``SEED``; and before each
    sample ``set_rng_seed`` seeds every device's generator, which, CUDA not initialised, queues the
    seeding with a formatted stack (2 ms a sample). The lookup is answered None at once, and the
    seeding is done for what CPU samples draw from: torch's CPU generator, ``random`` and numpy."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    def seed_cpu(seed: int | None = None) -> None:
        seed = common_utils.SEED if seed is None else seed
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if common_utils.TEST_NUMPY:
            import numpy

            numpy.random.seed(seed)

    with (
        unittest.mock.patch.object(common_utils, "extract_test_fn", lambda: None),
        unittest.mock.patch.object(core, "extract_test_fn", lambda: None),
        unittest.mock.patch.object(common_utils, "set_rng_seed", seed_cpu),
    ):
        yield


def samples(op: Any, dtype: torch.dtype = torch.float32, limit: int | None = None) -> list[Any]:
    """The op's samples for ``dtype``; ``limit`` keeps an evenly spread subset (CI's sampled sweep)."""
    with warnings.catch_warnings(), _cpu_sampling():
        warnings.simplefilter("ignore")
        all_samples = list(op.sample_inputs("cpu", dtype))
    if limit is None or len(all_samples) <= limit:
        return all_samples
    step = len(all_samples) / limit
    return [all_samples[int(i * step)] for i in range(limit)]


def ci_sample_limit() -> int | None:
    """Samples per op in tests: a few in CI, all with FASTONNX_FULL_SWEEP=1."""
    return None if os.environ.get("FASTONNX_FULL_SWEEP") == "1" else 3


def opinfo_cases(float32: Sequence[str], **by_dtype: Sequence[str]) -> list[Any]:
    """(op name, dtype) cases for one parametrized test: float32 for every op of ``float32``, and the
    ops listed under another dtype's name (``float16=[...]``, ``int64=[...]``) for that dtype."""
    import pytest

    cases = [pytest.param(n, torch.float32, id=f"{n}-float32") for n in float32]
    for dtype_name, names in by_dtype.items():
        cases += [pytest.param(n, getattr(torch, dtype_name), id=f"{n}-{dtype_name}") for n in names]
    return cases


def assert_case_converts(op_name: str, dtype: torch.dtype) -> None:
    """One case of ``opinfo_cases``, at both ends of the opset range: float32 with CI's sample limit,
    other dtypes with two samples."""
    assert_op_converts(op_name, ENDS, dtype=dtype, limit=ci_sample_limit() if dtype == torch.float32 else 2)


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
    chosen = samples(op, dtype, limit)
    if len(chosen) > 1 and check_samples_together(op_name, op, chosen, opsets, dtype):
        return
    for i, sample in enumerate(chosen):
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
