"""Matrix norms and spectral decompositions: QR, symmetric eigendecomposition, SVD and what builds on them
(pinv, matrix_rank, cond, matrix_sqrth, polar).

ONNX has no decomposition operator, so they are written out of MatMul / Gather / elementwise nodes.
Matrices need a static size (the last two dims); batch dims may be dynamic and are flattened into one.
Every decomposition runs in float64 and is cast back: it costs little at these sizes and keeps the
result within rounding of LAPACK's.

- QR and geqrf: Householder reflections unrolled at conversion time, min(m, n) of them, with LAPACK's
  sign convention (dlarfg: beta = -sign(alpha) * norm), so Q and R equal torch's.
- Symmetric eigendecomposition: cyclic Jacobi in round-robin order: each round rotates n/2 disjoint
  (p, q) pairs at once, as one rotation matrix J (A <- Jᵀ A J). A round is the body of an ONNX Loop
  (its pairs read from constant tables by the round number, so the body is small for any n) that stops
  once the off-diagonal part is at float64 rounding (Jacobi converges quadratically: a handful of
  sweeps over all pairs) or after ``_MAX_SWEEPS`` sweeps.
- SVD: one-sided (Hestenes) Jacobi on the columns, the same rotations computed from the Gram matrix
  UᵀU, applied to the matrix itself (accurate for small singular values, unlike eig(AᵀA)). Full U / V
  (full_matrices) are completed by a Householder QR of the thin ones.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import normalize_axis, reduce, squeeze, unsqueeze
from fastonnx.converters.lib.reduction_graphs import nan_reduce, vector_norm

aten = torch.ops.aten

F64 = torch.float64
_MAX_SWEEPS = 40
# a Jacobi loop stops when the off-diagonal part is below this fraction of its scale (float64 rounding
# is 1.1e-16; a few sweeps past it cost more than they give)
_CONVERGED = 1e-14
# column products below this fraction of the Gram matrix's trace are rounding noise
_NEGLIGIBLE = 1e-28


# ---- shapes ---------------------------------------------------------------------------------------
def _matrix_size(ctx: ConversionContext, x: Value, what: str) -> tuple[int, int]:
    if x.rank < 2:
        raise ctx.error(f"{what}: expected a matrix or a batch of matrices, got rank {x.rank}")
    m, n = x.shape[-2], x.shape[-1]
    if not isinstance(m, int) or not isinstance(n, int):
        raise ctx.error(
            f"{what}: the matrix size (last two dims) must be static to unroll the decomposition, "
            f"got {m} x {n}; only batch dims may be dynamic"
        )
    return m, n


def _float_out(ctx: ConversionContext, dtype: torch.dtype, what: str) -> None:
    if dtype not in (torch.float32, torch.float64):
        raise ctx.error(f"{what}: only float32 / float64 are converted (torch: also complex), got {dtype}")


class _Batch:
    """The batch dims of a matrix argument, flattened into one leading dim and restored at the end."""

    def __init__(self, ctx: ConversionContext, x: Value) -> None:
        self.ctx = ctx
        lead = x.shape[:-2]
        if all(isinstance(d, int) for d in lead):
            self.shape = ctx.i64([int(d) for d in lead])
        else:
            self.shape = ctx.op("Shape", x, start=0, end=x.rank - 2)

    def flatten(self, x: Any, m: int, n: int) -> str:
        """(..., m, n) as (B, m, n) in float64 (m * n > 0, so -1 is inferred even for an empty batch)."""
        return self.ctx.op("Reshape", self.ctx.cast(x, F64), self.ctx.i64([-1, m, n]))

    def restore(self, y: str, tail: Sequence[int], dtype: torch.dtype) -> str:
        """(B, *tail) back to (..., *tail), cast to ``dtype``."""
        shape = self.ctx.op("Concat", self.shape, self.ctx.i64(list(tail)), axis=0)
        return self.ctx.cast(self.ctx.op("Reshape", y, shape), dtype)


def _filled(ctx: ConversionContext, shape: Sequence[Any], value: float, dtype: torch.dtype) -> str:
    """A tensor of the (possibly symbolic) ``shape`` filled with ``value``."""
    return ctx.op("ConstantOfShape", ctx.shape_tensor(list(shape)), value=ctx.tensor_attr(value, dtype))


def _out_shapes(ctx: ConversionContext) -> list[tuple[Any, ...]]:
    val = ctx.out
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    return [tuple(v.shape) if isinstance(v, torch.Tensor) else () for v in vals]


def _eye(ctx: ConversionContext, rows: int, cols: int) -> str:
    return ctx.const(torch.eye(rows, cols, dtype=F64), F64)


def _batched_eye(ctx: ConversionContext, like: str, n: int) -> str:
    """An (B, n, n) identity, B taken from ``like`` (B, ., .)."""
    b = ctx.op("Shape", like, start=0, end=1)
    return ctx.op("Expand", _eye(ctx, n, n), ctx.op("Concat", b, ctx.i64([n, n]), axis=0))


def _transpose(ctx: ConversionContext, x: str) -> str:
    return ctx.op("Transpose", x, perm=[0, 2, 1])


def _mask(ctx: ConversionContext, rows: int, cols: int, keep: Callable[[int, int], bool]) -> str:
    """A bool (rows, cols) constant, True where ``keep(i, j)``."""
    t = torch.tensor([[keep(i, j) for j in range(cols)] for i in range(rows)], dtype=torch.bool)
    return ctx.const(t.reshape(rows, cols), torch.bool)


def _diagonal(ctx: ConversionContext, a: str, n: int) -> str:
    """The diagonal of (B, n, n) as (B, n)."""
    flat = ctx.op("Reshape", a, ctx.i64([0, n * n]))
    return ctx.op("Gather", flat, ctx.i64([i * n + i for i in range(n)]), axis=1)


def _reorder_columns(ctx: ConversionContext, x: str, order: str) -> str:
    """Columns of (B, r, c) picked by ``order`` (B, c)."""
    index = ctx.op("Expand", unsqueeze(ctx, order, [1]), ctx.op("Shape", x))
    return ctx.op("GatherElements", x, index, axis=2)


def _sum_last(ctx: ConversionContext, x: str, k: int) -> str:
    """The sum over the last axis (size k) of a float64 tensor, as a product with a ones column:
    onnxruntime 1.31's Reduce ops return their input unreduced when it is empty (a batch of 0), and its
    MatMul rejects an empty left operand with a 1-D right one."""
    column = ctx.op("MatMul", x, ctx.const(torch.ones(k, 1, dtype=F64), F64))
    return squeeze(ctx, column, [-1])


def _safe(ctx: ConversionContext, x: str) -> str:
    """``x`` with zeros replaced by ones (a denominator whose zero case is handled by a Where)."""
    zero = ctx.op("Equal", x, ctx.const(0.0, F64))
    return ctx.op("Where", zero, ctx.const(1.0, F64), x)


@contextlib.contextmanager
def _emitting_into(ctx: ConversionContext, sub: Any) -> Iterator[None]:
    """Nodes emitted in the block go to the subgraph ``sub`` (a Loop body)."""
    saved = (ctx.g, dict(ctx.sym_values))
    ctx.g = sub
    try:
        yield
    finally:
        ctx.g, ctx.sym_values = saved


def _loop(
    ctx: ConversionContext,
    name: str,
    state: Sequence[tuple[str, list[Any]]],
    body: Callable[[list[str]], tuple[str, list[str]]],
    trips: int,
) -> list[str]:
    """An ONNX Loop over at most ``trips`` iterations carrying float64 ``state`` (value, dims); ``body``
    maps [iteration number, *carried values] to (continue?, new values)."""
    sub = ctx.g.subgraph(ctx.g.unique_name(name))
    f64 = dtypes.to_onnx_dtype(F64)
    with _emitting_into(ctx, sub):
        step = sub.add_input(ctx.g.unique_name("iter"), dtypes.to_onnx_dtype(torch.int64), [])
        sub.add_input(ctx.g.unique_name("cond_in"), dtypes.to_onnx_dtype(torch.bool), [])
        formal = [sub.add_input(ctx.g.unique_name(f"{name}_in"), f64, dims) for _, dims in state]
        more, new = body([step, *formal])
        out = sub.add_output(more, ctx.g.unique_name(f"{name}_more"))
        sub.set_type(out, dtypes.to_onnx_dtype(torch.bool), [])
        for value, (_, dims) in zip(new, state, strict=True):
            out = sub.add_output(value, ctx.g.unique_name(f"{name}_out"))
            sub.set_type(out, f64, dims)
    start = ctx.const(True, torch.bool)
    return ctx.op("Loop", ctx.i64(trips), start, *[v for v, _ in state], outputs=len(state), body=sub)


# ---- Jacobi rotations -----------------------------------------------------------------------------
def _round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint (p, q) pairs, p < q, covering every pair of 0..n-1 once (circle method)."""
    size = n + n % 2
    players = list(range(size))
    rounds = []
    for _ in range(size - 1):
        pairs = []
        for i in range(size // 2):
            p, q = players[i], players[size - 1 - i]
            if p < n and q < n:
                pairs.append((min(p, q), max(p, q)))
        rounds.append(pairs)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


class _Schedule:
    """The round-robin rounds as constant index tables, one row per round, read by the round number."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rounds = _round_robin(n)

    def row(self, ctx: ConversionContext, position: Callable[[int, int], int], r: str) -> str:
        """``position(p, q)`` (a flat index into n * n) of each pair of round ``r`` (0-d int64)."""
        table = torch.tensor([[position(p, q) for p, q in pairs] for pairs in self.rounds], dtype=torch.int64)
        return ctx.op("Gather", ctx.const(table, torch.int64), r, axis=0)


def _rotation(ctx: ConversionContext, g: str, schedule: _Schedule, r: str) -> str:
    """The (B, n, n) product J of the Jacobi rotations of round ``r`` that zero g[p, q] for each of its
    pairs in Jᵀ g J (Golub & Van Loan, sym.schur2): J[p,p] = J[q,q] = c, J[p,q] = s, J[q,p] = -s."""
    n = schedule.n
    flat = ctx.op("Reshape", g, ctx.i64([0, n * n]))
    pp, qq = schedule.row(ctx, lambda p, q: p * n + p, r), schedule.row(ctx, lambda p, q: q * n + q, r)
    pq, qp = schedule.row(ctx, lambda p, q: p * n + q, r), schedule.row(ctx, lambda p, q: q * n + p, r)
    app, aqq, apq = (ctx.op("Gather", flat, i, axis=1) for i in (pp, qq, pq))
    one = ctx.const(1.0, F64)
    zero = ctx.op("Equal", apq, ctx.const(0.0, F64))
    tau = ctx.op("Div", ctx.op("Sub", aqq, app), ctx.op("Mul", ctx.const(2.0, F64), _safe(ctx, apq)))
    sign = ctx.op("Where", ctx.op("Less", tau, ctx.const(0.0, F64)), ctx.const(-1.0, F64), one)
    # the smaller root of t² + 2 tau t - 1 = 0; a huge tau overflows tau² and gives t = 0 (no rotation)
    root = ctx.op("Sqrt", ctx.op("Add", one, ctx.op("Mul", tau, tau)))
    t = ctx.op("Div", sign, ctx.op("Add", ctx.op("Abs", tau), root))
    t = ctx.op("Where", zero, ctx.const(0.0, F64), t)
    c = ctx.op("Div", one, ctx.op("Sqrt", ctx.op("Add", one, ctx.op("Mul", t, t))))
    s = ctx.op("Mul", t, c)
    # J: the identity with c, c, s, -s scattered at (p,p), (q,q), (p,q), (q,p) of each pair
    updates = ctx.op("Concat", c, c, s, ctx.op("Neg", s), axis=1)  # (B, 4k)
    index = ctx.op("Expand", ctx.op("Concat", pp, qq, pq, qp, axis=0), ctx.op("Shape", updates))
    rows = ctx.op("Shape", updates, start=0, end=1)
    eye = ctx.op(
        "Expand",
        ctx.const(torch.eye(n, dtype=F64).reshape(n * n), F64),
        ctx.op("Concat", rows, ctx.i64([n * n]), axis=0),
    )
    j = ctx.op("ScatterElements", eye, index, updates, axis=1)
    return ctx.op("Reshape", j, ctx.i64([0, n, n]))


def _any_batch(ctx: ConversionContext, flags: str) -> str:
    """True when any entry of the bool ``flags`` is (an empty batch gives False)."""
    total = ctx.op("ReduceSum", ctx.cast(flags, F64), keepdims=0)
    return ctx.op("Greater", total, ctx.const(0.0, F64))


def _off_diagonal(ctx: ConversionContext, g: str, n: int) -> str:
    """g with its diagonal set to 0."""
    return ctx.op("Where", _mask(ctx, n, n, lambda i, j: i != j), g, ctx.const(0.0, F64))


def _not_diagonal_yet(ctx: ConversionContext, g: str, n: int) -> str:
    """Two-sided Jacobi goes on while some matrix's off-diagonal part exceeds _CONVERGED * its Frobenius
    norm: the absolute accuracy of LAPACK's eigenvalues (eps * ||A||). Rounding in Jᵀ g J keeps the
    off-diagonal part near eps * ||A||, so a tolerance relative to each diagonal entry might never be met."""
    off = reduce(
        ctx, "ReduceSum", ctx.op("Mul", _off_diagonal(ctx, g, n), _off_diagonal(ctx, g, n)), [1, 2], True
    )
    total = reduce(ctx, "ReduceSum", ctx.op("Mul", g, g), [1, 2], True)
    return _any_batch(ctx, ctx.op("Greater", off, ctx.op("Mul", total, ctx.const(_CONVERGED**2, F64))))


def _columns_not_orthogonal(ctx: ConversionContext, gram: str, n: int) -> str:
    """One-sided Jacobi goes on while two columns p, q have |cos| > _CONVERGED (|g_pq| relative to
    sqrt(g_pp g_qq), what gives small singular values their relative accuracy), except for pairs whose
    product is below rounding of the whole matrix (columns left at rounding level by a rank deficiency
    never become orthogonal in that sense)."""
    d = _diagonal(ctx, gram, n)
    scale = ctx.op("Mul", unsqueeze(ctx, d, [2]), unsqueeze(ctx, d, [1]))
    off = _off_diagonal(ctx, gram, n)
    squared = ctx.op("Mul", off, off)
    skewed = ctx.op("Greater", squared, ctx.op("Mul", scale, ctx.const(_CONVERGED**2, F64)))
    trace = reduce(ctx, "ReduceSum", d, [1], True)
    floor = ctx.op("Mul", trace, ctx.const(_NEGLIGIBLE, F64))
    visible = ctx.op("Greater", squared, unsqueeze(ctx, ctx.op("Mul", floor, floor), [2]))
    return _any_batch(ctx, ctx.op("And", skewed, visible))


def _jacobi_loop(
    ctx: ConversionContext,
    name: str,
    schedule: _Schedule,
    state: list[tuple[str, list[Any]]],
    round_body: Callable[[str, list[str]], tuple[str, list[str]]],
) -> list[str]:
    """One Jacobi round per Loop iteration (the body stays small for any n: the round's pairs are read
    from constant tables), at most _MAX_SWEEPS sweeps of all pairs."""
    if schedule.n < 2:
        return [v for v, _ in state]

    def body(formal: list[str]) -> tuple[str, list[str]]:
        r = ctx.op("Mod", formal[0], ctx.i64(len(schedule.rounds)))
        return round_body(r, formal[1:])

    return _loop(ctx, name, state, body, len(schedule.rounds) * _MAX_SWEEPS)


def _symmetric_eig(ctx: ConversionContext, a: str, n: int, vectors: bool) -> tuple[str, str | None]:
    """Eigenvalues (B, n) in ascending order and eigenvectors (B, n, n) of the symmetric (B, n, n) ``a``."""
    schedule = _Schedule(n)
    dims: list[Any] = [None, n, n]
    state = [(a, dims)] + ([(_batched_eye(ctx, a, n), dims)] if vectors else [])

    def round_body(r: str, carried: list[str]) -> tuple[str, list[str]]:
        g = carried[0]
        # measured before the round: the loop ends one (harmless) round after convergence
        more = _not_diagonal_yet(ctx, g, n)
        j = _rotation(ctx, g, schedule, r)
        new = [ctx.op("MatMul", _transpose(ctx, j), ctx.op("MatMul", g, j))]
        if vectors:
            new.append(ctx.op("MatMul", carried[1], j))
        return more, new

    result = _jacobi_loop(ctx, "jacobi_round", schedule, state, round_body)
    w = _diagonal(ctx, result[0], n)
    w, order = ctx.op("TopK", w, ctx.i64([n]), axis=1, largest=0, sorted=1, outputs=2)
    if not vectors:
        return w, None
    return w, _reorder_columns(ctx, result[1], order)


def _one_sided_jacobi(ctx: ConversionContext, a: str, m: int, n: int, vectors: bool) -> tuple[str, str, str]:
    """Hestenes SVD of (B, m, n) with m >= n: (U (B, m, n), S (B, n) descending, V (B, n, n))."""
    schedule = _Schedule(n)
    state: list[tuple[str, list[Any]]] = [(a, [None, m, n])]
    if vectors:
        state.append((_batched_eye(ctx, a, n), [None, n, n]))

    def round_body(r: str, carried: list[str]) -> tuple[str, list[str]]:
        u = carried[0]
        gram = ctx.op("MatMul", _transpose(ctx, u), u)
        more = _columns_not_orthogonal(ctx, gram, n)  # before the round, as for eigh
        j = _rotation(ctx, gram, schedule, r)
        new = [ctx.op("MatMul", u, j)]
        if vectors:
            new.append(ctx.op("MatMul", carried[1], j))
        return more, new

    result = _jacobi_loop(ctx, "svd_round", schedule, state, round_body)
    u = result[0]
    s = reduce(ctx, "ReduceL2", u, [1], False)
    s, order = ctx.op("TopK", s, ctx.i64([n]), axis=1, largest=1, sorted=1, outputs=2)
    u = ctx.op("Div", _reorder_columns(ctx, u, order), unsqueeze(ctx, _safe(ctx, s), [1]))
    v = _reorder_columns(ctx, result[1], order) if vectors else ""
    return u, s, v


def _svd(ctx: ConversionContext, a: str, m: int, n: int, vectors: bool) -> tuple[str, str, str]:
    """Thin SVD of (B, m, n), m, n > 0: U (B, m, k), S (B, k), V (B, n, k) with k = min(m, n)."""
    if m >= n:
        return _one_sided_jacobi(ctx, a, m, n, vectors)
    u, s, v = _one_sided_jacobi(ctx, _transpose(ctx, a), n, m, vectors)
    return v, s, u  # Aᵀ = U S Vᵀ  =>  A = V S Uᵀ


# ---- Householder QR -------------------------------------------------------------------------------
class _Reflectors:
    """Householder vectors v_j (B, m) (v_j[j] = 1, zeros above) and their taus (B, 1), j < k."""

    def __init__(self, m: int) -> None:
        self.m = m
        self.vs: list[str] = []
        self.taus: list[str] = []

    def apply_left(self, ctx: ConversionContext, x: str, j: int) -> str:
        """H_j x = x - tau v (vᵀ x) for x (B, m, c)."""
        v, tau = self.vs[j], self.taus[j]
        w = ctx.op("MatMul", unsqueeze(ctx, v, [1]), x)
        return ctx.op("Sub", x, ctx.op("Mul", unsqueeze(ctx, ctx.op("Mul", tau, v), [2]), w))

    def q(self, ctx: ConversionContext, like: str, cols: int) -> str:
        """The first ``cols`` columns of H_0 H_1 ... H_{k-1} (B, m, cols), applied right to left."""
        b = ctx.op("Shape", like, start=0, end=1)
        q = ctx.op("Expand", _eye(ctx, self.m, cols), ctx.op("Concat", b, ctx.i64([self.m, cols]), axis=0))
        for j in reversed(range(len(self.vs))):
            q = self.apply_left(ctx, q, j)
        return q


def _householder_qr(ctx: ConversionContext, a: str, m: int, n: int) -> tuple[str, _Reflectors]:
    """LAPACK geqrf (dlarfg's convention) on (B, m, n): the reduced matrix (R above the diagonal, not yet
    cleared below) and the reflectors."""
    refl = _Reflectors(m)
    zero, one = ctx.const(0.0, F64), ctx.const(1.0, F64)
    r = a
    for j in range(min(m, n)):
        col = ctx.op("Gather", r, ctx.i64(j), axis=2)  # (B, m)
        alpha = ctx.op("Gather", col, ctx.i64([j]), axis=1)  # (B, 1)
        below = ctx.const(torch.tensor([1.0 if i > j else 0.0 for i in range(m)], dtype=F64), F64)
        tail = ctx.op("Mul", col, below)
        xnorm2 = reduce(ctx, "ReduceSum", ctx.op("Mul", tail, tail), [1], True)
        norm = ctx.op("Sqrt", ctx.op("Add", ctx.op("Mul", alpha, alpha), xnorm2))
        beta = ctx.op("Where", ctx.op("Less", alpha, zero), norm, ctx.op("Neg", norm))
        # nothing below the diagonal: H = I (tau = 0), R keeps alpha with its sign
        trivial = ctx.op("Equal", xnorm2, zero)
        tau = ctx.op("Where", trivial, zero, ctx.op("Div", ctx.op("Sub", beta, alpha), _safe(ctx, beta)))
        scale = ctx.op("Where", trivial, zero, ctx.op("Div", one, _safe(ctx, ctx.op("Sub", alpha, beta))))
        unit = ctx.const(torch.tensor([1.0 if i == j else 0.0 for i in range(m)], dtype=F64), F64)
        refl.vs.append(ctx.op("Add", ctx.op("Mul", tail, scale), unit))
        refl.taus.append(tau)
        r = refl.apply_left(ctx, r, j)
    return r, refl


def _triu(ctx: ConversionContext, r: str, m: int, n: int) -> str:
    return ctx.op("Where", _mask(ctx, m, n, lambda i, j: i <= j), r, ctx.const(0.0, F64))


def convert_linalg_qr(ctx: ConversionContext, x: Value, mode: str = "reduced") -> list[str | None]:
    if mode not in ("reduced", "complete", "r"):
        raise ctx.error(f"linalg_qr: unknown mode {mode!r}")
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, "linalg_qr")
    m, n = _matrix_size(ctx, x, "linalg_qr")
    q_shape, r_shape = _out_shapes(ctx)
    k = min(m, n)
    if m * n == 0:
        r_out = _filled(ctx, r_shape, 0.0, dtype)
        if mode == "r":
            return [_filled(ctx, q_shape, 0.0, dtype), r_out]
        # Q of an empty matrix: the identity's first columns (none when m == 0)
        eye = ctx.const(torch.eye(m, q_shape[-1], dtype=dtype), dtype)
        return [ctx.op("Expand", eye, ctx.shape_tensor(list(q_shape))), r_out]
    batch = _Batch(ctx, x)
    r, refl = _householder_qr(ctx, batch.flatten(x, m, n), m, n)
    rows = m if mode == "complete" else k
    r_out = batch.restore(
        ctx.op("Slice", _triu(ctx, r, m, n), ctx.i64([0]), ctx.i64([rows]), ctx.i64([1])), [rows, n], dtype
    )
    if mode == "r":
        return [_filled(ctx, q_shape, 0.0, dtype), r_out]
    q = refl.q(ctx, r, m if mode == "complete" else k)
    return [batch.restore(q, [m, rows], dtype), r_out]


def convert_geqrf(ctx: ConversionContext, x: Value) -> list[str]:
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, "geqrf")
    m, n = _matrix_size(ctx, x, "geqrf")
    a_shape, tau_shape = _out_shapes(ctx)
    if m * n == 0:
        return [_filled(ctx, a_shape, 0.0, dtype), _filled(ctx, tau_shape, 0.0, dtype)]
    batch = _Batch(ctx, x)
    r, refl = _householder_qr(ctx, batch.flatten(x, m, n), m, n)
    k = min(m, n)
    # the reflectors' tails go below the diagonal (their leading 1 is implicit)
    vs = ctx.op("Concat", *[unsqueeze(ctx, v, [2]) for v in refl.vs], axis=2)  # (B, m, k)
    if k < n:
        pad = ctx.op(
            "Expand",
            ctx.const(0.0, F64),
            ctx.op("Concat", ctx.op("Shape", vs, start=0, end=2), ctx.i64([n - k]), axis=0),
        )
        vs = ctx.op("Concat", vs, pad, axis=2)
    packed = ctx.op("Where", _mask(ctx, m, n, lambda i, j: i <= j), r, vs)
    taus = ctx.op("Concat", *refl.taus, axis=1)
    return [batch.restore(packed, [m, n], dtype), batch.restore(taus, [k], dtype)]


# ---- symmetric eigendecomposition -----------------------------------------------------------------
def _symmetrized(ctx: ConversionContext, a: str, n: int, uplo: str) -> str:
    """The symmetric matrix torch reads from one triangle (LAPACK ignores the other)."""
    if uplo not in ("L", "U", "l", "u"):
        raise ctx.error(f"UPLO must be 'L' or 'U', got {uplo!r}")
    lower = uplo in ("L", "l")
    keep = _mask(ctx, n, n, (lambda i, j: i >= j) if lower else (lambda i, j: i <= j))
    return ctx.op("Where", keep, a, _transpose(ctx, a))


def _eigh(ctx: ConversionContext, x: Value, uplo: str, vectors: bool, what: str) -> list[str]:
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, what)
    m, n = _matrix_size(ctx, x, what)
    if m != n:
        raise ctx.error(f"{what}: expected square matrices, got {m} x {n}")
    shapes = _out_shapes(ctx)
    if n == 0:
        return [_filled(ctx, s, 0.0, dtype) for s in shapes]
    batch = _Batch(ctx, x)
    a = _symmetrized(ctx, batch.flatten(x, n, n), n, uplo)
    w, v = _symmetric_eig(ctx, a, n, vectors)
    out = [batch.restore(w, [n], dtype)]
    if v is not None:
        out.append(batch.restore(v, [n, n], dtype))
    return out


def convert_linalg_eigh(ctx: ConversionContext, x: Value, UPLO: str = "L") -> list[str]:
    return _eigh(ctx, x, UPLO, True, "linalg_eigh")


def convert_linalg_eigvalsh(ctx: ConversionContext, x: Value, UPLO: str = "L") -> str:
    return _eigh(ctx, x, UPLO, False, "linalg_eigvalsh")[0]


def convert_matrix_sqrth(ctx: ConversionContext, x: Value) -> str:
    """V diag(sqrt(max(w, 0))) Vᵀ from the lower triangle: torch clamps negative eigenvalues to 0."""
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, "linalg_matrix_sqrth")
    m, n = _matrix_size(ctx, x, "linalg_matrix_sqrth")
    if m != n:
        raise ctx.error(f"linalg_matrix_sqrth: expected square matrices, got {m} x {n}")
    if n == 0:
        return _filled(ctx, ctx.out_shape, 0.0, dtype)
    batch = _Batch(ctx, x)
    w, v = _symmetric_eig(ctx, _symmetrized(ctx, batch.flatten(x, n, n), n, "L"), n, True)
    assert v is not None
    zero = ctx.const(0.0, F64)
    clamped = ctx.op("Where", ctx.op("Less", w, zero), zero, w)  # NaN stays NaN, as in clamp(min=0)
    scaled = ctx.op("Mul", v, unsqueeze(ctx, ctx.op("Sqrt", clamped), [1]))
    return batch.restore(ctx.op("MatMul", scaled, _transpose(ctx, v)), [n, n], dtype)


# ---- SVD ------------------------------------------------------------------------------------------
def _complete_basis(ctx: ConversionContext, q1: str, rows: int, k: int) -> str:
    """(B, rows, k) orthonormal columns extended to an orthogonal (B, rows, rows): Householder QR of
    q1 gives reflectors whose product starts with q1's columns (up to sign); its other columns span the
    orthogonal complement (any basis of it is a valid completion: torch's is as arbitrary)."""
    if rows == k:
        return q1
    _, refl = _householder_qr(ctx, q1, rows, k)
    full = refl.q(ctx, q1, rows)
    rest = ctx.op("Slice", full, ctx.i64([k]), ctx.i64([rows]), ctx.i64([2]))
    return ctx.op("Concat", q1, rest, axis=2)


def _svd_outputs(
    ctx: ConversionContext, x: Value, full: bool, vectors: bool, what: str
) -> tuple[str, str, str] | None:
    """(U (..., m, ku), S (..., k), V (..., n, kv)) in the output dtype, or None for empty matrices.
    ku / kv are m / n when ``full``, k otherwise."""
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, what)
    m, n = _matrix_size(ctx, x, what)
    if m * n == 0:
        return None
    k = min(m, n)
    batch = _Batch(ctx, x)
    u, s, v = _svd(ctx, batch.flatten(x, m, n), m, n, vectors)
    if not vectors:
        return "", batch.restore(s, [k], dtype), ""
    if full:
        u, v = _complete_basis(ctx, u, m, k), _complete_basis(ctx, v, n, k)
    ku, kv = (m, n) if full else (k, k)
    return batch.restore(u, [m, ku], dtype), batch.restore(s, [k], dtype), batch.restore(v, [n, kv], dtype)


def _empty_svd(ctx: ConversionContext, x: Value, full: bool) -> list[str]:
    """Empty matrices: no singular values; full U / V are identities (what LAPACK returns)."""
    dtype = ctx.out_dtype
    out = []
    for i, shape in enumerate(_out_shapes(ctx)):
        if i == 1 or not full:
            out.append(_filled(ctx, shape, 0.0, dtype))
        else:
            size = shape[-1]
            out.append(
                ctx.op(
                    "Expand", ctx.const(torch.eye(size, dtype=dtype), dtype), ctx.shape_tensor(list(shape))
                )
            )
    return out


def convert_linalg_svd(
    ctx: ConversionContext, x: Value, full_matrices: bool = True, *, driver: str | None = None
) -> list[str]:
    parts = _svd_outputs(ctx, x, full_matrices, True, "linalg_svd")
    if parts is None:
        return _empty_svd(ctx, x, full_matrices)
    u, s, v = parts
    return [u, s, ctx.op("Transpose", v, perm=_swap_last(x.rank))]


def convert_svd(ctx: ConversionContext, x: Value, some: bool = True, compute_uv: bool = True) -> list[str]:
    """torch.svd: V instead of Vh; without compute_uv, U and V are zeros of the full shapes."""
    if not compute_uv:
        shapes = _out_shapes(ctx)
        parts = _svd_outputs(ctx, x, False, False, "svd")
        dtype = ctx.out_dtype
        s = _filled(ctx, shapes[1], 0.0, dtype) if parts is None else parts[1]
        return [_filled(ctx, shapes[0], 0.0, dtype), s, _filled(ctx, shapes[2], 0.0, dtype)]
    parts = _svd_outputs(ctx, x, not some, True, "svd")
    if parts is None:
        return _empty_svd(ctx, x, not some)
    return list(parts)


def convert_linalg_svdvals(ctx: ConversionContext, x: Value, *, driver: str | None = None) -> str:
    parts = _svd_outputs(ctx, x, False, False, "linalg_svdvals")
    if parts is None:
        return _filled(ctx, ctx.out_shape, 0.0, ctx.out_dtype)
    return parts[1]


def convert_linalg_polar(ctx: ConversionContext, x: Value) -> list[str]:
    """A = U H with U = W Vᵀ (orthonormal columns) and H = V diag(S) Vᵀ from the thin SVD A = W S Vᵀ
    (real inputs give real factors; torch requires m >= n)."""
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, "linalg_polar")
    m, n = _matrix_size(ctx, x, "linalg_polar")
    if m < n:
        raise ctx.error(f"linalg_polar: the input must have at least as many rows as columns, got {m} x {n}")
    if m * n == 0:
        return [_filled(ctx, shape, 0.0, dtype) for shape in _out_shapes(ctx)]
    batch = _Batch(ctx, x)
    w, s, v = _svd(ctx, batch.flatten(x, m, n), m, n, True)
    vt = _transpose(ctx, v)
    u = ctx.op("MatMul", w, vt)
    h = ctx.op("MatMul", ctx.op("Mul", v, unsqueeze(ctx, s, [1])), vt)
    return [batch.restore(u, [m, n], dtype), batch.restore(h, [n, n], dtype)]


def _swap_last(rank: int) -> list[int]:
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return perm


def _singular_values(ctx: ConversionContext, x: Value, what: str) -> tuple[str, int, int]:
    """Singular values (..., k) of x in float64 (x: (..., m, n), m * n > 0), with m and n."""
    m, n = _matrix_size(ctx, x, what)
    batch = _Batch(ctx, x)
    _, s, _ = _svd(ctx, batch.flatten(x, m, n), m, n, False)
    return batch.restore(s, [min(m, n)], F64), m, n


# ---- matrix norms ---------------------------------------------------------------------------------
def _matrix_norm(ctx: ConversionContext, x: Value, ord: Any, dim: Sequence[int], keepdim: bool) -> str:
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"matrix norm of a {dtype} result is not supported (torch needs a float input)")
    if len(dim) != 2:
        raise ctx.error(f"matrix norm: dim must name two dims, got {dim}")
    d0, d1 = (normalize_axis(int(d), x.rank) for d in dim)
    if d0 == d1:
        raise ctx.error(f"matrix norm: dims must differ, got {dim}")
    if any(isinstance(x.shape[d], int) and x.shape[d] == 0 for d in (d0, d1)):
        # every norm of an empty matrix is 0 in torch (the min-type ords raise there when undefined)
        return _filled(ctx, ctx.out_shape, 0.0, dtype)
    compute = opmath_dtype(dtype)
    v = ctx.cast(ctx.cast(x, dtype), compute)  # dtype= casts the input first
    if ord == "fro":
        r = reduce(ctx, "ReduceL2", v, [d0, d1], True)
    elif ord in (1, -1, math.inf, -math.inf):
        # ord ±1: max/min column sum (over d0); ord ±inf: max/min row sum (over d1)
        summed, other = (d0, d1) if abs(ord) == 1 else (d1, d0)
        sums = ctx.cast(ctx.cast(reduce(ctx, "ReduceL1", v, [summed], True), dtype), compute)
        r = nan_reduce(ctx, "ReduceMax" if ord > 0 else "ReduceMin", sums, [other], True)
    elif ord in ("nuc", 2, -2):
        r = _spectral_norm(ctx, x, ord, d0, d1)
    else:
        raise ctx.error(f"matrix norm: unsupported ord {ord!r} (fro, nuc, ±1, ±2, ±inf)")
    if not keepdim:
        r = squeeze(ctx, r, sorted([d0, d1]))
    return ctx.cast(r, dtype)


def _spectral_norm(ctx: ConversionContext, x: Value, ord: Any, d0: int, d1: int) -> str:
    """nuc / ±2 norms over dims (d0, d1), with those dims kept as size 1 (float64)."""
    dtype = ctx.out_dtype
    if dtype not in (torch.float32, torch.float64):
        raise ctx.error(f"matrix norm ord={ord!r}: only float32 / float64 are converted, got {dtype}")
    rest = [i for i in range(x.rank) if i not in (d0, d1)]
    perm = [*rest, d0, d1]
    moved = ctx.op("Transpose", ctx.cast(x, dtype), perm=perm) if perm != list(range(x.rank)) else x.name
    shape = tuple(x.shape[i] for i in perm)
    mv = Value(moved, dtype, shape)
    m, n = _matrix_size(ctx, mv, "matrix norm")
    if m * n == 0:
        if ord != "nuc":
            raise ctx.error(f"matrix norm ord={ord!r} of an empty matrix is not defined")
        r = _filled(ctx, shape[:-2], 0.0, F64)
    else:
        s, _, _ = _singular_values(ctx, mv, "matrix norm")
        if ord == "nuc":
            r = _sum_last(ctx, s, min(m, n))
        else:
            k = min(m, n)
            r = ctx.op("Gather", s, ctx.i64(0 if ord == 2 else k - 1), axis=-1)
    return unsqueeze(ctx, r, sorted([d0, d1]))


def convert_linalg_matrix_norm(
    ctx: ConversionContext,
    x: Value,
    ord: Any = "fro",
    dim: Sequence[int] = (-2, -1),
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    return _matrix_norm(ctx, x, ord, list(dim), keepdim)


def convert_linalg_norm(
    ctx: ConversionContext,
    x: Value,
    ord: Any = None,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    """torch.linalg.norm: a matrix norm for a string ord, two dims, or a 2-D input with an ord and no
    dim; a vector norm otherwise (the flattened input when neither ord nor dim is given)."""
    dims = [dim] if isinstance(dim, int) else (list(dim) if dim is not None else None)
    if isinstance(ord, str):
        return _matrix_norm(ctx, x, ord, dims if dims is not None else [-2, -1], keepdim)
    if dims is not None and len(dims) == 2:
        return _matrix_norm(ctx, x, "fro" if ord is None else ord, dims, keepdim)
    if dims is None and ord is not None:
        if x.rank == 2:
            return _matrix_norm(ctx, x, ord, [-2, -1], keepdim)
        if x.rank != 1:
            raise ctx.error(f"linalg_norm: with ord={ord!r} and no dim the input must be 1-D or 2-D")
    return vector_norm(ctx, x, 2 if ord is None else ord, dims, keepdim)


# ---- pinv / matrix_rank / cond --------------------------------------------------------------------
def _tolerance(
    ctx: ConversionContext, largest: str, atol: Any, rtol: Any, m: int, n: int, dtype: torch.dtype
) -> str:
    """max(atol, rtol * largest) with torch's defaults: without rtol, rtol = eps * max(m, n) unless atol
    is given and > 0 (then 0). ``largest`` is (..., 1) float64; tensor tolerances get a trailing 1."""

    def operand(t: Any) -> str:
        return unsqueeze(ctx, ctx.cast(t, F64), [-1]) if isinstance(t, Value) else ctx.const(float(t), F64)

    default = torch.finfo(dtype).eps * max(m, n)
    if rtol is not None:
        relative = operand(rtol)
    elif atol is None:
        relative = ctx.const(default, F64)
    elif isinstance(atol, Value):
        positive = ctx.op("Greater", operand(atol), ctx.const(0.0, F64))
        relative = ctx.op("Where", positive, ctx.const(0.0, F64), ctx.const(default, F64))
    else:
        relative = ctx.const(0.0 if atol > 0 else default, F64)
    tol = ctx.op("Mul", relative, largest)
    if atol is not None:
        tol = ctx.op("Max", operand(atol), tol)
    return tol


def _spectrum(ctx: ConversionContext, x: Value, hermitian: bool, what: str) -> tuple[str, int, int]:
    """|eigenvalues| (hermitian) or singular values, (..., k) float64, unsorted for eigenvalues."""
    m, n = _matrix_size(ctx, x, what)
    if not hermitian:
        return _singular_values(ctx, x, what)
    batch = _Batch(ctx, x)
    w, _ = _symmetric_eig(ctx, _symmetrized(ctx, batch.flatten(x, n, n), n, "L"), n, False)
    return batch.restore(ctx.op("Abs", w), [n], F64), m, n


def convert_matrix_rank(
    ctx: ConversionContext,
    x: Value,
    atol: Any = None,
    rtol: Any = None,
    hermitian: bool = False,
) -> str:
    _float_out(ctx, x.dtype, "linalg_matrix_rank")
    m, n = _matrix_size(ctx, x, "linalg_matrix_rank")
    if m * n == 0:
        return _filled(ctx, ctx.out_shape, 0, torch.int64)
    s, _, _ = _spectrum(ctx, x, hermitian, "linalg_matrix_rank")
    largest = reduce(ctx, "ReduceMax", s, [-1], True)
    tol = _tolerance(ctx, largest, atol, rtol, m, n, x.dtype)
    kept = ctx.cast(ctx.op("Greater", s, tol), F64)
    return ctx.cast(_sum_last(ctx, kept, min(m, n)), torch.int64)


def convert_pinv(
    ctx: ConversionContext,
    x: Value,
    atol: Any = None,
    rtol: Any = None,
    hermitian: bool = False,
) -> str:
    """V diag(1/s) Uᵀ over the singular values above the tolerance (eigenpairs when hermitian)."""
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, "linalg_pinv")
    m, n = _matrix_size(ctx, x, "linalg_pinv")
    if m * n == 0:
        return _filled(ctx, ctx.out_shape, 0.0, dtype)
    batch = _Batch(ctx, x)
    a = batch.flatten(x, m, n)
    if hermitian:
        if m != n:
            raise ctx.error(f"linalg_pinv(hermitian=True): expected square matrices, got {m} x {n}")
        w, v = _symmetric_eig(ctx, _symmetrized(ctx, a, n, "L"), n, True)
        assert v is not None
        s, left, right = ctx.op("Abs", w), v, v
        values = w
    else:
        left, s, right = _svd(ctx, a, m, n, True)
        values = s
    largest = reduce(ctx, "ReduceMax", s, [-1], True)  # (B, 1)
    # the singular values are (B, k) here: tensor tolerances are broadcast to the batch dims and flattened
    tol = _tolerance(ctx, largest, _flat_tol(ctx, batch, atol), _flat_tol(ctx, batch, rtol), m, n, x.dtype)
    keep = ctx.op("Greater", s, tol)
    inv = ctx.op("Where", keep, ctx.op("Div", ctx.const(1.0, F64), _safe(ctx, values)), ctx.const(0.0, F64))
    scaled = ctx.op("Mul", right, unsqueeze(ctx, inv, [1]))
    return batch.restore(ctx.op("MatMul", scaled, _transpose(ctx, left)), [n, m], dtype)


def _flat_tol(ctx: ConversionContext, batch: _Batch, t: Any) -> Any:
    """A tolerance tensor broadcast to the batch dims and flattened like them (a float stays)."""
    if not isinstance(t, Value):
        return t
    full = ctx.op("Expand", ctx.cast(t, F64), batch.shape)
    return Value(ctx.op("Reshape", full, ctx.i64([-1])), F64, (None,))


def convert_pinverse(ctx: ConversionContext, x: Value, rcond: float = 1e-15) -> str:
    return convert_pinv(ctx, x, None, rcond, False)


def convert_linalg_cond(ctx: ConversionContext, x: Value, p: Any = None) -> str:
    """p None / 2 / -2: ratio of extreme singular values. Other p: norm(A) * norm(A⁻¹), the inverse
    V diag(1/s) Uᵀ from the same SVD; an exactly singular matrix gives inf in torch (its LU finds a zero
    pivot) but a huge finite number here (float64 singular values are rarely exactly 0)."""
    dtype = ctx.out_dtype
    _float_out(ctx, dtype, "linalg_cond")
    m, n = _matrix_size(ctx, x, "linalg_cond")
    if m * n == 0:
        return _filled(ctx, ctx.out_shape, 0.0, dtype)
    if p in (None, 2, -2):
        s, _, _ = _singular_values(ctx, x, "linalg_cond")
        top = ctx.op("Gather", s, ctx.i64(0), axis=-1)
        bottom = ctx.op("Gather", s, ctx.i64(min(m, n) - 1), axis=-1)
        return ctx.cast(ctx.op("Div", bottom, top) if p == -2 else ctx.op("Div", top, bottom), dtype)
    if p not in ("fro", "nuc", 1, -1, math.inf, -math.inf):
        raise ctx.error(f"linalg_cond: unsupported p {p!r} (None, fro, nuc, ±1, ±2, ±inf)")
    if m != n:
        raise ctx.error(f"linalg_cond: p={p!r} needs square matrices, got {m} x {n}")
    batch = _Batch(ctx, x)
    u, s, v = _svd(ctx, batch.flatten(x, n, n), n, n, True)
    inverse = ctx.op("MatMul", ctx.op("Div", v, unsqueeze(ctx, s, [1])), _transpose(ctx, u))
    inverse_v = Value(batch.restore(inverse, [n, n], F64), F64, x.shape)
    product = ctx.op(
        "Mul", _matrix_norm(ctx, x, p, [-2, -1], False), _matrix_norm(ctx, inverse_v, p, [-2, -1], False)
    )
    return ctx.cast(product, dtype)


def convert_legacy_matrix_rank(
    ctx: ConversionContext, x: Value, tol: Any = None, hermitian: bool = False
) -> str:
    """matrix_rank(A, tol): tol is an absolute tolerance (torch's default when None)."""
    return convert_matrix_rank(ctx, x, tol, None, hermitian)


def convert_legacy_pinv(ctx: ConversionContext, x: Value, rcond: Any = 1e-15, hermitian: bool = False) -> str:
    """pinv(A, rcond): rcond is a tolerance relative to the largest singular value."""
    return convert_pinv(ctx, x, None, rcond, hermitian)


def convert_nuclear_norm(ctx: ConversionContext, x: Value, keepdim: bool = False) -> str:
    return _matrix_norm(ctx, x, "nuc", [-2, -1], keepdim)


def convert_nuclear_norm_dim(
    ctx: ConversionContext, x: Value, dim: Sequence[int], keepdim: bool = False
) -> str:
    return _matrix_norm(ctx, x, "nuc", list(dim), keepdim)


def convert_private_linalg_svd(
    ctx: ConversionContext,
    x: Value,
    full_matrices: bool = False,
    compute_uv: bool = True,
    *,
    driver: str | None = None,
) -> list[str]:
    """_linalg_svd (what linalg_svd decomposes to): U and Vh are empty without compute_uv."""
    if compute_uv:
        return convert_linalg_svd(ctx, x, full_matrices)
    shapes = _out_shapes(ctx)
    dtype = ctx.out_dtype
    return [
        _filled(ctx, shapes[0], 0.0, dtype),
        convert_linalg_svdvals(ctx, x),
        _filled(ctx, shapes[2], 0.0, dtype),
    ]


def convert_private_linalg_eigh(
    ctx: ConversionContext,
    x: Value,
    UPLO: str = "L",
    compute_v: bool = True,
) -> list[str]:
    """_linalg_eigh (what linalg_eigh decomposes to): the vectors are empty without compute_v."""
    if compute_v:
        return convert_linalg_eigh(ctx, x, UPLO)
    shapes = _out_shapes(ctx)
    return [convert_linalg_eigvalsh(ctx, x, UPLO), _filled(ctx, shapes[1], 0.0, ctx.out_dtype)]


CONVERTERS: dict[str, Converter] = {
    "aten.linalg_matrix_norm.default": convert_linalg_matrix_norm,
    "aten.linalg_matrix_norm.str_ord": convert_linalg_matrix_norm,
    "aten.linalg_norm.default": convert_linalg_norm,
    "aten.linalg_norm.ord_str": convert_linalg_norm,
    "aten.linalg_qr.default": convert_linalg_qr,
    "aten.geqrf.default": convert_geqrf,
    "aten.linalg_eigh.default": convert_linalg_eigh,
    "aten.linalg_eigvalsh.default": convert_linalg_eigvalsh,
    "aten.linalg_matrix_sqrth.default": convert_matrix_sqrth,
    "aten.linalg_svd.default": convert_linalg_svd,
    "aten.svd.default": convert_svd,
    "aten.linalg_svdvals.default": convert_linalg_svdvals,
    "aten.linalg_polar.default": convert_linalg_polar,
    "aten.linalg_pinv.atol_rtol_tensor": convert_pinv,
    "aten.linalg_pinv.atol_rtol_float": convert_pinv,
    "aten.pinverse.default": convert_pinverse,
    "aten.linalg_matrix_rank.atol_rtol_tensor": convert_matrix_rank,
    "aten.linalg_matrix_rank.atol_rtol_float": convert_matrix_rank,
    "aten.linalg_cond.default": convert_linalg_cond,
    "aten.linalg_cond.p_str": convert_linalg_cond,
    "aten.linalg_matrix_rank.default": convert_legacy_matrix_rank,
    "aten.linalg_matrix_rank.tol_tensor": convert_legacy_matrix_rank,
    "aten.linalg_pinv.default": convert_legacy_pinv,
    "aten.linalg_pinv.rcond_tensor": convert_legacy_pinv,
    "aten.nuclear_norm.default": convert_nuclear_norm,
    "aten.nuclear_norm.dim": convert_nuclear_norm_dim,
    "aten._linalg_svd.default": convert_private_linalg_svd,
    "aten._linalg_eigh.default": convert_private_linalg_eigh,
}
