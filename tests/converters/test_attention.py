"""scaled_dot_product_attention against eager: OpInfo samples (those without dropout, which is random)
and hand-written masks, causal, GQA, scale, unbatched and dynamic-shape cases."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from support.export_check import ENDS, check_export
from support.opinfo_harness import (
    PASS,
    assert_op_converts,
    check_sample,
    ci_sample_limit,
    op_db_by_name,
    samples,
)


def _deterministic_samples(op_name: str, dtype: torch.dtype) -> list:
    # dropout_p > 0 draws random numbers in eager mode: those samples cannot be compared
    return [s for s in samples(op_db_by_name()[op_name], dtype) if not s.kwargs.get("dropout_p")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sdpa_opinfo(dtype: torch.dtype) -> None:
    name = "nn.functional.scaled_dot_product_attention"
    chosen = _deterministic_samples(name, dtype)
    limit = ci_sample_limit()
    if limit is not None:
        chosen = chosen[:: max(1, len(chosen) // limit)][:limit]
    failures = []
    for i, s in enumerate(chosen):
        for o in check_sample(name, op_db_by_name()[name], s, ENDS, dtype):
            if o.status != PASS:
                failures.append(f"sample {i} opset {o.opset}: {o.status}: {o.detail}")
    assert chosen and not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_multi_head_attention_forward_opinfo(dtype: torch.dtype) -> None:
    # training samples with dropout are checked as random ops (opinfo_harness.RANDOM_VALUES)
    assert_op_converts("nn.functional.multi_head_attention_forward", ENDS, dtype=dtype, limit=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_flash_attention_for_cpu_opinfo(dtype: torch.dtype) -> None:
    assert_op_converts("torch.ops.aten._scaled_dot_product_flash_attention_for_cpu", ENDS, dtype=dtype)


class Sdpa(torch.nn.Module):
    def __init__(self, **kwargs: object) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.kwargs)


def _qkv(
    b: int = 2, h: int = 4, hk: int = 4, lq: int = 5, s: int = 7, e: int = 8
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, h, lq, e, generator=g),
        torch.randn(b, hk, s, e, generator=g),
        torch.randn(b, hk, s, e, generator=g),
    )


def test_float_mask() -> None:
    q, k, v = _qkv()
    mask = torch.randn(2, 1, 5, 7)
    check_export(Sdpa(), (q, k, v, mask))


def test_bool_mask_with_fully_masked_row() -> None:
    q, k, v = _qkv()
    mask = torch.rand(5, 7) > 0.4
    mask[2] = False  # torch gives zeros for this row, not NaN
    check_export(Sdpa(), (q, k, v, mask))


def test_float_mask_with_fully_masked_row() -> None:
    q, k, v = _qkv()
    mask = torch.zeros(1, 1, 5, 7)
    mask[..., 1, :] = float("-inf")
    mask[..., 3, 2:] = float("-inf")
    check_export(Sdpa(), (q, k, v, mask))


@pytest.mark.parametrize(("lq", "s"), [(5, 7), (7, 5), (6, 6)])
def test_causal(lq: int, s: int) -> None:
    check_export(Sdpa(is_causal=True), _qkv(lq=lq, s=s))


def test_gqa_and_scale() -> None:
    check_export(Sdpa(enable_gqa=True, scale=0.3), _qkv(h=6, hk=2))


def test_gqa_causal_fp16() -> None:
    q, k, v = (t.half() for t in _qkv(h=4, hk=2))
    check_export(Sdpa(enable_gqa=True, is_causal=True), (q, k, v), atol=1e-2, rtol=1e-2)


def test_unbatched_3d() -> None:
    q, k, v = (t[0] for t in _qkv())
    check_export(Sdpa(), (q, k, v))
    check_export(Sdpa(is_causal=True), (q, k, v))


def test_dynamic_shapes_causal() -> None:
    batch = torch.export.Dim("batch", max=64)
    seq = torch.export.Dim("seq", max=128)
    q, k, v = _qkv(lq=6, s=6)
    spec = {0: batch, 2: seq}
    q2, k2, v2 = _qkv(b=3, lq=9, s=9)
    check_export(
        Sdpa(is_causal=True),
        (q, k, v),
        dynamic_shapes=(spec, spec, spec),
        run_args=[(q2, k2, v2)],
    )


def test_dynamic_head_dim_default_scale() -> None:
    e = torch.export.Dim("e", max=64)
    q, k, v = _qkv(e=8)
    q2, k2, v2 = _qkv(e=16)
    spec = {3: e}
    check_export(Sdpa(), (q, k, v), dynamic_shapes=(spec, spec, spec), run_args=[(q2, k2, v2)])


# dropout_p > 0 (random attention weights) is tested in test_random.py


def test_single_kv_head_broadcasts() -> None:
    # k / v with one head broadcast over the query heads, with or without enable_gqa
    check_export(Sdpa(), _qkv(h=4, hk=1))
    check_export(Sdpa(enable_gqa=True, is_causal=True), _qkv(h=4, hk=1))


# torch's enable_gqa rule (the math kernel): with enable_gqa, key and value are each repeat_interleaved
# on dim -3 to the query's head count unless all three counts are equal; without it, heads broadcast
# as matmul does, so one query head against several key/value heads is broadcasting, not GQA
GQA_CASES = {
    # name: (q shape, k shape, v shape, enable_gqa)
    "one_q_head_broadcasts": ((2, 1, 5, 8), (2, 4, 6, 8), (2, 4, 6, 8), False),
    "one_q_head_one_v_head": ((2, 1, 5, 8), (2, 4, 6, 8), (2, 1, 6, 8), False),
    "k_and_v_groups_differ": ((2, 8, 5, 8), (2, 2, 6, 8), (2, 4, 6, 8), True),
    "only_v_repeated": ((2, 4, 5, 8), (2, 4, 6, 8), (2, 1, 6, 8), True),
    "only_k_repeated": ((2, 6, 5, 8), (2, 3, 6, 8), (2, 6, 6, 8), True),
    "equal_heads_with_flag": ((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 8), True),
    "unbatched": ((4, 5, 8), (2, 6, 8), (2, 6, 8), True),
    "rank5": ((3, 2, 4, 5, 8), (3, 2, 2, 6, 8), (3, 2, 2, 6, 8), True),
    "batch_broadcast": ((2, 4, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), True),
}


@pytest.mark.parametrize("name", sorted(GQA_CASES))
def test_enable_gqa_rule(name: str) -> None:
    qs, ks, vs, gqa = GQA_CASES[name]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, vs))
    expected_shape = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa).shape
    for causal in (False, True):
        # opset 17 keeps the MatMul / Softmax form; at MAX_OPSET the fusion may form ONNX Attention
        results = check_export(Sdpa(enable_gqa=gqa, is_causal=causal), (q, k, v), atol=1e-5, rtol=1e-5)
        assert tuple(results[0](q, k, v).shape) == tuple(expected_shape)


def test_enable_gqa_mask_and_dynamic_sequence() -> None:
    g = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(1, 6, 5, 8, generator=g),
        torch.randn(1, 2, 7, 8, generator=g),
        torch.randn(1, 3, 7, 8),
    )
    mask = torch.rand(5, 7, generator=g) > 0.3
    seq = torch.export.Dim("s", min=2, max=64)
    q2, k2, v2 = torch.randn(1, 6, 5, 8), torch.randn(1, 2, 11, 8), torch.randn(1, 3, 11, 8)
    check_export(
        Sdpa(enable_gqa=True),
        (q, k, v, mask),
        dynamic_shapes=(None, {2: seq}, {2: seq}, ({1: seq},)),
        run_args=[(q2, k2, v2, torch.rand(5, 11) > 0.3)],
        atol=1e-5,
        rtol=1e-5,
    )
