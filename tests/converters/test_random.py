"""Random ops and training-mode dropout.

OpInfo samples are checked on layout and support (opinfo_harness.RANDOM_VALUES): the exported graph
draws from onnxruntime's generator, so values cannot match eager. The distributions are checked here by
hand with many draws (means, spreads and frequencies within a few standard errors of the exact ones),
at opset 17 (ONNX RandomUniform / RandomNormal) and at the newest opset (uniforms built from Dropout
masks, see random_ops.py), so that a wrong distribution fails.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastonnx
from support.export_check import ENDS, Fn
from support.opinfo_harness import (
    PASS,
    assert_case_converts,
    assert_op_converts,
    check_sample,
    op_db_by_name,
    opinfo_cases,
    ops_supporting,
    samples,
)

aten = torch.ops.aten

OPS = [
    "bernoulli",
    "multinomial",
    "normal",
    "normal.number_mean",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.rrelu",
]
# their OpInfo samples mutate the module's input (x.cauchy_()) and return it
IN_PLACE_OPS = ["cauchy", "exponential", "geometric", "log_normal", "normal.in_place", "uniform"]
HALF_OPS = ops_supporting(OPS, torch.float16)  # rrelu has no float16 kernel in torch
INT_OPS = ["randint_like"]


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases([*OPS, *IN_PLACE_OPS], float16=HALF_OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
@pytest.mark.parametrize("op_name", INT_OPS)
def test_integer(op_name: str, dtype: torch.dtype) -> None:
    assert_op_converts(op_name, ENDS, dtype=dtype, limit=2)


# ---- hand-written: distributions -----------------------------------------------------------------
N = 100_000


def _run(fn: Any, args: tuple[Any, ...], opset: int) -> list[torch.Tensor]:
    """Export ``fn`` (training-mode random ops in it), run it once in onnxruntime."""
    ep = torch.export.export(Fn(fn), args, strict=False)
    out = fastonnx.to_onnx(ep, args, opset=opset)(*args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _near(value: float, expected: float, se: float, what: str, k: float = 5.0) -> None:
    assert abs(value - expected) <= k * se, f"{what}: {value:.5f}, expected {expected:.5f} +- {k * se:.5f}"


def _mean_std(t: torch.Tensor, mean: float, std: float, what: str, kurtosis: float = 3.0) -> None:
    """Sample mean and std within 5 standard errors (the std's from the distribution's kurtosis)."""
    v = t.double().flatten()
    n = v.numel()
    _near(float(v.mean()), mean, std / math.sqrt(n), f"{what} mean")
    _near(float(v.std()), std, std * math.sqrt((kurtosis - 1) / (4 * n)), f"{what} std")


@pytest.mark.parametrize("opset", ENDS)
def test_continuous_distributions(opset: int) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.rand(N),
            torch.randn(N),
            torch.rand_like(x),
            torch.randn_like(x),
            torch.empty(N).uniform_(-2.0, 3.0),
            torch.empty(N).normal_(1.5, 2.0),
            torch.normal(x, 0.5),
            torch.normal(1.0, torch.full((N,), 3.0)),
            torch.empty(N).exponential_(2.0),
            torch.empty(N).log_normal_(0.5, 0.25),
        )

    x = torch.full((N,), 4.0)
    rand, randn, rand_like, randn_like, uni, nrm, nrm_t, nrm_ft, expo, lognorm = _run(fn, (x,), opset)
    for t, what in ((rand, "rand"), (rand_like, "rand_like")):
        assert 0 <= float(t.min()) and float(t.max()) < 1, what
        _mean_std(t, 0.5, 1 / math.sqrt(12), what, kurtosis=1.8)
    for t, what in ((randn, "randn"), (randn_like, "randn_like")):
        _mean_std(t, 0.0, 1.0, what)
        _near(float((t.abs() < 1).double().mean()), math.erf(1 / math.sqrt(2)), 0.0015, f"{what} P(|z| < 1)")
    assert -2 <= float(uni.min()) and float(uni.max()) < 3
    _mean_std(uni, 0.5, 5 / math.sqrt(12), "uniform_", kurtosis=1.8)
    _mean_std(nrm, 1.5, 2.0, "normal_")
    _mean_std(nrm_t, 4.0, 0.5, "normal(tensor, float)")
    _mean_std(nrm_ft, 1.0, 3.0, "normal(float, tensor)")
    assert float(expo.min()) >= 0
    _mean_std(expo, 0.5, 0.5, "exponential_", kurtosis=9.0)
    assert float(lognorm.min()) > 0
    _mean_std(lognorm.log(), 0.5, 0.25, "log of log_normal_")


@pytest.mark.parametrize("opset", ENDS)
def test_cauchy_and_geometric(opset: int) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.clone().cauchy_(1.0, 2.0), x.clone().geometric_(0.3)

    cauchy, geo = _run(fn, (torch.zeros(N),), opset)
    # Cauchy(1, 2): median 1, quartiles 1 -+ 2
    _near(float((cauchy < 1).double().mean()), 0.5, 0.5 / math.sqrt(N), "cauchy P(x < median)")
    _near(float(((cauchy - 1).abs() < 2).double().mean()), 0.5, 0.5 / math.sqrt(N), "cauchy P(|x - m| < s)")
    assert bool(torch.isfinite(cauchy).all())
    assert bool((geo == geo.floor()).all()) and float(geo.min()) >= 1
    p = 0.3
    _mean_std(geo, 1 / p, math.sqrt(1 - p) / p, "geometric_", kurtosis=9 + p * p / (1 - p))
    _near(float((geo == 1).double().mean()), p, math.sqrt(p * (1 - p) / N), "geometric P(1)")


@pytest.mark.parametrize("opset", ENDS)
def test_randint_frequencies(opset: int) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.randint(3, 10, (N,)),
            torch.randint_like(x, 6),
            torch.randint(-5, 2**40, (N,)),
            torch.randint(0, 4, (N,), dtype=torch.int32),
        )

    small, like, big, i32 = _run(fn, (torch.zeros(N, dtype=torch.int16),), opset)
    assert small.dtype == torch.int64 and like.dtype == torch.int16 and i32.dtype == torch.int32
    for t, lo, hi in ((small, 3, 10), (like, 0, 6), (i32, 0, 4)):
        counts = torch.bincount((t.long() - lo), minlength=hi - lo)
        assert counts.numel() == hi - lo and int(t.min()) >= lo and int(t.max()) < hi
        share = 1 / (hi - lo)
        for c in counts.tolist():
            _near(c / N, share, math.sqrt(share * (1 - share) / N), f"randint({lo}, {hi}) frequency")
    assert int(big.min()) >= -5 and int(big.max()) < 2**40
    _near(float(big.double().mean()) / 2**40, 0.5, 1 / math.sqrt(12 * N), "randint(-5, 2**40) mean")


@pytest.mark.parametrize("opset", ENDS)
def test_bernoulli(opset: int) -> None:
    def fn(p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.bernoulli(p), torch.bernoulli(p, 0.25), torch.empty_like(p).bernoulli_(0.7)

    p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0]).repeat(N // 5)
    per_p, scalar, inplace = _run(fn, (p,), opset)
    for t in (per_p, scalar, inplace):
        assert bool(((t == 0) | (t == 1)).all())
    rows = per_p.reshape(-1, 5).double().mean(0)
    assert float(rows[0]) == 0 and float(rows[4]) == 1
    for i, q in ((1, 0.1), (2, 0.5), (3, 0.9)):
        _near(float(rows[i]), q, math.sqrt(q * (1 - q) / (N // 5)), f"bernoulli(p={q})")
    for t, q in ((scalar, 0.25), (inplace, 0.7)):
        _near(float(t.double().mean()), q, math.sqrt(q * (1 - q) / N), f"bernoulli rate {q}")


@pytest.mark.parametrize("opset", ENDS)
def test_multinomial_frequencies(opset: int) -> None:
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]]) * 4  # unnormalized

    def fn(p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.multinomial(p, 20_000, replacement=True), torch.multinomial(p[0].expand(10_000, 4), 2)

    with_rep, without = _run(fn, (probs,), opset)
    assert with_rep.shape == (2, 20_000) and without.shape == (10_000, 2)
    norm = probs / probs.sum(-1, keepdim=True)
    for r in range(2):
        counts = torch.bincount(with_rep[r], minlength=4).double() / 20_000
        for c in range(4):
            q = float(norm[r, c])
            _near(float(counts[c]), q, math.sqrt(max(q * (1 - q), 1e-12) / 20_000), f"row {r} cat {c}")
    assert not bool((without == 1).any()), "a zero-probability category was drawn"
    assert bool((without[:, 0] != without[:, 1]).all()), "a category was drawn twice without replacement"
    # first draw ~ p; second draw j ~ sum_i p_i p_j / (1 - p_i)
    p = norm[0].double()
    second = torch.stack([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j) for j in range(4)])
    for pos, expected in ((0, p), (1, second)):
        counts = torch.bincount(without[:, pos], minlength=4).double() / 10_000
        for c in range(4):
            q = float(expected[c])
            _near(float(counts[c]), q, math.sqrt(max(q * (1 - q), 1e-12) / 10_000), f"draw {pos} cat {c}")


@pytest.mark.parametrize("opset", ENDS)
def test_randperm(opset: int) -> None:
    x = torch.zeros(1)
    ep = torch.export.export(Fn(lambda v: torch.randperm(5)), (x,), strict=False)
    result = fastonnx.to_onnx(ep, (x,), opset=opset)
    perms = torch.stack([result(x) for _ in range(1000)])
    assert bool((perms.sort(-1).values == torch.arange(5)).all())
    for pos in (0, 4):
        share = torch.bincount(perms[:, pos], minlength=5).double() / 1000
        for c in share.tolist():
            _near(c, 0.2, math.sqrt(0.16 / 1000), f"randperm position {pos}")


# ---- hand-written: training-mode dropout, rrelu, attention dropout ------------------------------
@pytest.mark.parametrize("opset", ENDS)
@pytest.mark.parametrize("p", [0.2, 0.75])
def test_dropout_keep_rate_and_scale(opset: int, p: float) -> None:
    x = torch.from_numpy(np.random.default_rng(0).uniform(1.0, 2.0, (8, 16, 25, 25)).astype(np.float32))

    def fn(v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.dropout(v, p, True), F.dropout2d(v, p, True), aten.native_dropout(v, p, True)

    drop, drop2d, (native, mask) = _run(fn, (x,), opset)
    n = x.numel()
    for t, what in ((drop, "dropout"), (native, "native_dropout")):
        kept = t != 0
        torch.testing.assert_close(t[kept], x[kept] / (1 - p))
        _near(float(kept.double().mean()), 1 - p, math.sqrt(p * (1 - p) / n), f"{what} keep rate")
    assert mask.dtype == torch.bool and bool((mask == (native != 0)).all())
    # dropout2d: one draw per (N, C) plane
    planes = drop2d != 0
    assert bool((planes.all((2, 3)) | ~planes.any((2, 3))).all()), "a plane is partly dropped"
    torch.testing.assert_close(drop2d[planes], x[planes] / (1 - p))
    _near(float(planes.all((2, 3)).double().mean()), 1 - p, math.sqrt(p * (1 - p) / 128), "2d keep rate")


@pytest.mark.parametrize("opset", ENDS)
def test_alpha_dropout_keeps_mean_and_variance(opset: int) -> None:
    # alpha dropout keeps a standard normal input at mean 0, variance 1
    x = torch.from_numpy(np.random.default_rng(1).standard_normal(N).astype(np.float32))
    (out,) = _run(lambda v: F.alpha_dropout(v, 0.3, True), (x,), opset)
    sat = 1.7580993408473766
    a = 1 / math.sqrt((sat * sat * 0.3 + 1) * 0.7)
    dropped = (out - (-sat * a + sat * a * 0.3)).abs() < 1e-5
    _near(float(dropped.double().mean()), 0.3, math.sqrt(0.21 / N), "alpha dropout rate")
    torch.testing.assert_close(out[~dropped], x[~dropped] * a + sat * a * 0.3)
    # the mean over the mask's draws, for this x: each element is a * x + c kept (0.7), -sat * a + c
    # dropped (0.3), its variance 0.21 * (a * (x + sat))^2; the sample mean within 5 standard errors
    # of that (a fixed 0.01 was 3 to 4 of them: it failed about one run in a few hundred)
    xd = x.double()
    mean = float((0.7 * (a * xd) + 0.3 * (-sat * a) + sat * a * 0.3).mean())
    se = float((0.21 * (a * (xd + sat)) ** 2).sum().sqrt()) / N
    _near(float(out.double().mean()), mean, se, "alpha dropout mean")
    _near(float(out.var()), 1.0, 0.02, "alpha dropout variance", k=1)


@pytest.mark.parametrize("opset", ENDS)
def test_feature_alpha_dropout(opset: int) -> None:
    x = torch.randn(64, 32, 5)
    (out,) = _run(lambda v: F.feature_alpha_dropout(v, 0.5, True), (x,), opset)
    sat = 1.7580993408473766
    a = 1 / math.sqrt((sat * sat * 0.5 + 1) * 0.5)
    dropped = (out - (-sat * a + sat * a * 0.5)).abs() < 1e-5
    kept = (out - (x * a + sat * a * 0.5)).abs() < 1e-5
    assert bool((dropped.all(-1) | kept.all(-1)).all()), "a channel is partly dropped"
    _near(float(dropped.all(-1).double().mean()), 0.5, math.sqrt(0.25 / 2048), "feature alpha dropout rate")


@pytest.mark.parametrize("opset", ENDS)
def test_rrelu_training_slopes(opset: int) -> None:
    x = -torch.from_numpy(np.random.default_rng(2).uniform(0.5, 2.0, N).astype(np.float32))
    x[:10] = torch.tensor([1.0, 2.0, 0.0, 3.5, 0.25, 1.0, 7.0, 8.0, 0.5, 1e-3])  # positives pass through
    (out,) = _run(lambda v: F.rrelu(v, 0.1, 0.3, training=True), (x,), opset)
    torch.testing.assert_close(out[:10], x[:10])
    slopes = (out[10:] / x[10:]).double()
    assert float(slopes.min()) >= 0.1 - 1e-6 and float(slopes.max()) <= 0.3 + 1e-6
    _mean_std(slopes, 0.2, 0.2 / math.sqrt(12), "rrelu slopes", kurtosis=1.8)


@pytest.mark.parametrize("opset", ENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sdpa_dropout_drops_weights(opset: int, dtype: torch.dtype) -> None:
    # v = identity: the output rows are the (dropped, rescaled) attention weights themselves
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 8, 16, 16, generator=g).to(dtype), torch.randn(4, 8, 16, 16, generator=g).to(dtype)
    v = torch.eye(16).expand(4, 8, 16, 16).to(dtype).contiguous()
    weights = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / 4, -1)
    p = 0.4
    (out,) = _run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, dropout_p=p), (q, k, v), opset)
    out = out.float()
    kept = out != 0
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out[kept], weights[kept] / (1 - p), atol=tol, rtol=tol)
    _near(float(kept.double().mean()), 1 - p, math.sqrt(p * (1 - p) / out.numel()), "attention keep rate")


def test_sdpa_dropout_opinfo() -> None:
    # the OpInfo samples with dropout_p > 0 (those without are in test_attention.py): layout + finite
    name = "nn.functional.scaled_dot_product_attention"
    op = op_db_by_name()[name]
    chosen = [s for s in samples(op, torch.float32) if s.kwargs.get("dropout_p")][::4]
    outcomes = [o for s in chosen for o in check_sample(name, op, s, ENDS)]
    assert chosen and all(o.status == PASS for o in outcomes), [o for o in outcomes if o.status != PASS]


# ---- hand-written: in-place samplers, dtypes, dynamic shapes, fresh draws -----------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_in_place_samplers(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.clone().uniform_(2.0, 2.5),
            x.clone().normal_(),
            x.clone().cauchy_(),
            x.clone().exponential_(),
            x.clone().geometric_(0.5),
            x.clone().log_normal_(),
            x.clone().random_(5),
            torch.rand(1000, dtype=dtype),
        )

    x = torch.zeros(1000, dtype=dtype)
    for opset in ENDS:
        outs = _run(fn, (x,), opset)
        assert all(o.dtype == dtype and o.shape == (1000,) for o in outs)
        uni, nrm, cau, expo, geo, logn, r5, rand = (o.double() for o in outs)
        assert 2.0 <= float(uni.min()) and float(uni.max()) < 2.5
        assert bool(torch.isfinite(nrm).all()) and not bool(cau.isnan().any())
        # a half Cauchy draw passes 65504 once in ~1e5 (|tan| > 65504), and torch's own half cauchy_
        # then gives inf too (100 in 1e7 draws): finite elsewhere
        assert int(cau.isinf().sum()) <= (2 if dtype == torch.float16 else 0)
        assert float(expo.min()) >= 0 and float(geo.min()) >= 1 and float(logn.min()) > 0
        assert set(r5.tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}
        assert 0 <= float(rand.min()) and float(rand.max()) < 1
        if dtype == torch.float16:  # torch's resolution for half uniforms: multiples of 2**-11
            assert bool((rand * 2048 == (rand * 2048).floor()).all())


def test_dynamic_shapes() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.rand_like(x),
            torch.randn(x.shape[0], 3),
            F.dropout(x, 0.5, True),
            F.dropout2d(x.unsqueeze(-1), 0.5, True),
            torch.multinomial(x.abs() + 0.1, 2),
            torch.randint(0, x.shape[0], (x.shape[0],)),
            torch.normal(x[:, :1], x[:1].abs()),  # mean and std broadcast to (batch, 6)
        )

    batch = torch.export.Dim("batch", min=2)
    x = torch.randn(4, 6)
    ep = torch.export.export(Fn(fn), (x,), dynamic_shapes=(({0: batch},),), strict=False)
    for opset in ENDS:
        result = fastonnx.to_onnx(ep, (x,), opset=opset)
        y = torch.randn(9, 6)
        rl, rn, d, d2, m, ri, nb = result(y)
        assert rl.shape == (9, 6) and rn.shape == (9, 3) and d.shape == (9, 6) and d2.shape == (9, 6, 1)
        assert m.shape == (9, 2) and bool((m[:, 0] != m[:, 1]).all()) and ri.shape == (9,)
        assert nb.shape == (9, 6) and bool(torch.isfinite(nb).all())
        assert int(ri.max()) < 9 and int(ri.min()) >= 0
        assert bool(((d == 0) | torch.isclose(d, 2 * y)).all())


@pytest.mark.parametrize("opset", ENDS)
def test_fresh_draws(opset: int) -> None:
    # two identical random nodes and two runs of one session must all draw independently (no CSE,
    # no constant folding of the random ops)
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.rand(64),
            torch.rand(64),
            torch.randn_like(x),
            torch.randn_like(x),
            F.dropout(x, 0.5, True),
        )

    x = torch.ones(64)
    ep = torch.export.export(Fn(fn), (x,), strict=False)
    result = fastonnx.to_onnx(ep, (x,), opset=opset)
    first, second = result(x), result(x)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[2], first[3])
    for a, b in zip(first, second):
        assert not torch.equal(a, b)


def test_training_mode_model_exports_random_dropout() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
    x = torch.randn(512, 8)
    with pytest.warns(UserWarning, match="training mode"):
        result = fastonnx.to_onnx(model, (x,))
    out = result(x)
    with torch.no_grad():
        full = model[0](x)
    kept = out != 0
    torch.testing.assert_close(out[kept], 2 * full[kept])
    _near(float(kept.double().mean()), 0.5, math.sqrt(0.25 / out.numel()), "Dropout module keep rate")


def test_generator_is_refused() -> None:
    ep = torch.export.export(Fn(lambda x: aten.rand.generator([3], generator=None)), (torch.zeros(1),))
    fastonnx.to_onnx(ep, (torch.zeros(1),))  # generator=None is fine
    from fastonnx.context import ConversionContext
    from fastonnx.converters import random_sampling as random_ops

    with pytest.raises(fastonnx.ConversionError, match="Generator"):
        random_ops.reject_generator(ConversionContext.__new__(ConversionContext), torch.Generator())
