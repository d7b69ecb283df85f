"""Chunked kernels swapped while torch.export captures (capture/chunked_kernels.py, issue 41 part 4):
transformers' chunked gated delta rule, Mamba2's state-space duality scan, Mamba's selective scan, RWKV's
linear attention, RecurrentGemma's RG-LRU and the recurrent layers' padding mask in forms whose padding and loop follow the length,
so a linear-attention or state-space model's file is right at every length and keeps no guard on it."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.export import Dim

import fastonnx
from fastonnx.capture.chunked_kernels import (
    KERNELS,
    dynamic_mask_by_length,
    gated_delta_rule_by_chunks,
    length_following_kernels,
    note_recurrent_state,
    qsa_indexer_by_masks,
    recurrent_mask_by_length,
    rglru_scan_by_steps,
    rwkv_attention_by_steps,
    selective_scan_by_steps,
    ssd_scan_by_chunks,
)

transformers = pytest.importorskip("transformers")  # a test dependency, pinned in constraints.txt
from transformers import masking_utils  # noqa: E402
from transformers.models.canine import modeling_canine  # noqa: E402
from transformers.models.doge import modeling_doge  # noqa: E402
from transformers.models.glm5_next import modeling_glm5_next  # noqa: E402
from transformers.models.mamba import modeling_mamba  # noqa: E402
from transformers.models.mamba2 import modeling_mamba2  # noqa: E402
from transformers.models.minimax import modeling_minimax  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: E402
from transformers.models.qwen4_exp import modeling_qwen4_exp  # noqa: E402
from transformers.models.recurrent_gemma import modeling_recurrent_gemma  # noqa: E402
from transformers.models.rwkv import modeling_rwkv  # noqa: E402
from transformers.models.t5gemma import modeling_t5gemma  # noqa: E402
from transformers.models.t5gemma2 import modeling_t5gemma2  # noqa: E402

LENGTHS = (1, 63, 64, 65, 300)  # below, at and above one chunk of 64, and several chunks


def _kernel_inputs(length: int, v_heads: int = 2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(length)
    b, k_heads, d = 2, 1, 16
    q, k = (torch.randn(b, length, k_heads, d, generator=g) for _ in range(2))
    v = torch.randn(b, length, v_heads, d, generator=g)
    decay = -torch.rand(b, length, v_heads, generator=g)  # log-decay <= 0
    beta = torch.rand(b, length, v_heads, generator=g)
    state = torch.randn(b, v_heads, d, d, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("length", (*LENGTHS, 130))
def test_the_form_computes_transformers_kernel(length: int) -> None:
    q, k, v, decay, beta, state = _kernel_inputs(length)
    kwargs = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, want_state = modeling_qwen3_next.torch_chunk_gated_delta_rule(q, k, v, decay, beta, **kwargs)
    got, got_state = gated_delta_rule_by_chunks(q, k, v, decay, beta, **kwargs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_state, want_state)


def _owned(module: object, key: str) -> tuple[object, str] | None:
    """Where ``KERNELS``' key lives in ``module``: the module, or the class of a ``Class.method`` key."""
    owner, _, name = key.rpartition(".")
    holder = getattr(module, owner, None) if owner else module
    return (holder, name) if holder is not None and hasattr(holder, name) else None


def test_the_swap_is_undone() -> None:
    modules = (
        modeling_qwen3_next,
        modeling_mamba2,
        modeling_mamba,
        modeling_rwkv,
        modeling_recurrent_gemma,
        modeling_doge,
        modeling_qwen4_exp,
        modeling_minimax,
        modeling_t5gemma,
        modeling_t5gemma2,
        modeling_canine,
        modeling_glm5_next,
    )
    places = {key: found for m in modules for key in KERNELS if (found := _owned(m, key)) is not None}
    assert set(places) == set(KERNELS)
    originals = {place: getattr(*place) for place in places.values()}
    with length_following_kernels():
        loaded = [m for n, m in sys.modules.items() if n.startswith("transformers.models.")]
        for key, form in KERNELS.items():
            assert all(getattr(*p) is form for m in loaded if (p := _owned(m, key)) is not None)
    assert all(getattr(*place) is original for place, original in originals.items())


@pytest.mark.parametrize("length", (1, 3, 4, 8, 9, 16, 17, 40))
def test_the_ssd_form_computes_mamba2s_scan(length: int) -> None:
    """Mamba2's chunk scan at chunk size 8: below, at and across chunk edges, with every option."""
    g = torch.Generator().manual_seed(length)
    b, h, p, groups, n = 2, 4, 8, 2, 16
    x, dt = torch.randn(b, length, h, p, generator=g), torch.randn(b, length, h, generator=g)
    a = -torch.rand(h, generator=g)
    bm, cm = (torch.randn(b, length, groups, n, generator=g) for _ in range(2))
    options = dict(
        D=torch.randn(h, generator=g),
        dt_bias=torch.randn(h, generator=g),
        initial_states=torch.randn(b, h, p, n, generator=g),
        dt_softplus=True,
        return_final_states=True,
    )
    want, want_state = modeling_mamba2.mamba2_chunk_scan(x, dt, a, bm, cm, 8, **options)
    got, got_state = ssd_scan_by_chunks(x, dt, a, bm, cm, 8, **options)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_state, want_state)


def _selective_inputs(length: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(length)
    b, d, n = 2, 6, 4
    x, dt, z = (torch.randn(b, d, length, generator=g) for _ in range(3))
    a = -torch.rand(d, n, generator=g)
    bm, cm = (torch.randn(b, n, length, generator=g) for _ in range(2))
    return x, dt, a, bm, cm, torch.randn(d, generator=g), z, torch.randn(d, generator=g)


@pytest.mark.parametrize("length", (1, 5, 17))
def test_the_selective_scan_form_computes_mambas(length: int) -> None:
    """From no state read: transformers' reference scan (which starts from zeros)."""
    x, dt, a, bm, cm, d, z, bias = _selective_inputs(length)
    options = dict(D=d, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True)
    want, want_state = modeling_mamba.mamba_selective_scan(x, dt, a, bm, cm, **options)
    got, got_state = selective_scan_by_steps(x, dt, a, bm, cm, **options)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_state, want_state)


def test_the_selective_scan_form_starts_from_the_state_read() -> None:
    """After a state is noted (a rebuilt cache layer's read), the scan continues from it: the same as
    transformers' recurrent step token by token from that state."""
    x, dt, a, bm, cm, d, z, bias = _selective_inputs(4)
    state = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(9))
    want_state, outs = state.clone(), []
    for t in range(4):
        outs.append(
            modeling_mamba.mamba_selective_state_update(
                want_state, x[..., t], dt[..., t], a, bm[..., t], cm[..., t], d, bias, True, z[..., t]
            )
        )
    note_recurrent_state(state)
    got, got_state = selective_scan_by_steps(
        x, dt, a, bm, cm, D=d, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True
    )
    torch.testing.assert_close(got, torch.stack(outs, dim=-1))
    torch.testing.assert_close(got_state, want_state)


def test_the_selective_scan_form_takes_a_head_a_scan() -> None:
    """Zamba's mixer reads the state of every head, [b, heads, d, n], then scans head after head: each
    scan starts from its head's part, as if that part alone had been read."""
    x, dt, a, bm, cm, d, z, bias = _selective_inputs(5)
    heads = torch.randn(2, 3, 6, 4, generator=torch.Generator().manual_seed(9))
    kwargs = dict(D=d, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True)
    note_recurrent_state(heads)
    together = [selective_scan_by_steps(x + h, dt, a, bm, cm, **kwargs) for h in range(3)]
    for h, (out, state) in enumerate(together):
        note_recurrent_state(heads[:, h])
        want_out, want_state = selective_scan_by_steps(x + h, dt, a, bm, cm, **kwargs)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(state, want_state)
    # the third scan used the last head: a fourth starts from zeros, as transformers' reference does
    out, _ = selective_scan_by_steps(x, dt, a, bm, cm, **kwargs)
    want, _ = modeling_mamba.mamba_selective_scan(x, dt, a, bm, cm, **kwargs)
    torch.testing.assert_close(out, want)


def test_the_recurrent_mask_form_is_the_masks_last_columns() -> None:
    """transformers' form where it returns a mask (several new tokens, padding), the same columns where it
    returns none (multiplying by those ones changes nothing)."""
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[1, :3] = 0  # left padding of the second row
    for length in (1, 4, 9):
        embeds = torch.zeros(2, length, 8)
        want = masking_utils.create_recurrent_attention_mask(None, embeds, mask)
        got = recurrent_mask_by_length(None, embeds, mask)
        torch.testing.assert_close(got, want if want is not None else mask[:, -length:])


@pytest.mark.parametrize("keys", (3, 8, 13))
@pytest.mark.parametrize("mask_dtype", (torch.bool, torch.float32))
def test_the_dynamic_mask_form_computes_doges(keys: int, mask_dtype: torch.dtype) -> None:
    """Below, at and above a window of 8 keys, with a boolean and an additive mask."""
    g = torch.Generator().manual_seed(keys)
    queries = 4
    hidden = torch.randn(2, queries, 16, generator=g)
    dt = torch.rand(2, 3, keys, generator=g)
    allowed = torch.rand(2, 1, queries, keys, generator=g) > 0.3
    mask = allowed if mask_dtype == torch.bool else torch.zeros(allowed.shape).masked_fill(~allowed, -1e9)
    args = (hidden, dt, 8, mask)
    want = modeling_doge.DogeAttention.prepare_dynamic_mask(None, *args)  # type: ignore[arg-type]
    torch.testing.assert_close(dynamic_mask_by_length(None, *args), want)


def _logits(model: torch.nn.Module) -> torch.nn.Module:
    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=input_ids, use_cache=False).logits

    return Logits()


def _right_at(model: torch.nn.Module, lengths: tuple[int, ...]) -> None:
    """Exported with dynamic batch and sequence from 9 tokens: no guard kept, and the file agrees with
    eager PyTorch at each of ``lengths``."""
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    result = fastonnx.to_onnx(model, (ids,), dynamic_shapes=({0: Dim.DYNAMIC, 1: Dim.DYNAMIC},))
    assert "guards_kept" not in result.stats and "narrowed" not in result.stats, result.stats
    for length in lengths:
        x = torch.randint(0, 128, (1 + length % 3, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(result(x), want, msg=f"{length} tokens")


@pytest.mark.parametrize("length", (1, 5, 17))
@pytest.mark.parametrize("with_state", (False, True))
def test_the_rwkv_form_computes_rwkvs_kernel(length: int, with_state: bool) -> None:
    g = torch.Generator().manual_seed(length)
    b, d = 2, 6
    decay, first = torch.randn(d, generator=g), torch.randn(d, generator=g)
    key, value = (torch.randn(b, length, d, generator=g) for _ in range(2))
    state = [
        torch.randn(b, d, generator=g).abs(),
        torch.rand(b, d, generator=g) + 0.5,
        torch.randn(b, d, generator=g),
    ]
    start = state if with_state else None
    want, want_state = modeling_rwkv.rwkv_linear_attention_cpu(decay, first, key, value, start, True)
    got, got_state = rwkv_attention_by_steps(decay, first, key, value, start, True)
    torch.testing.assert_close(got, want)
    for g_s, w_s in zip(got_state or [], want_state or [], strict=True):
        torch.testing.assert_close(g_s, w_s)


@pytest.mark.parametrize("length", (1, 5, 17))
@pytest.mark.parametrize("with_state", (False, True))
def test_the_rglru_form_computes_recurrent_gemmas_scan(length: int, with_state: bool) -> None:
    g = torch.Generator().manual_seed(length)
    b, w = 2, 6
    x, gate = torch.randn(b, length, w, generator=g), torch.rand(b, length, w, generator=g)
    reset = torch.rand(b, length, 1, generator=g) < 0.2  # document starts: the state forgotten there
    state = torch.randn(b, w, generator=g) if with_state else None
    layer = modeling_recurrent_gemma.RecurrentGemmaRglru.__new__(modeling_recurrent_gemma.RecurrentGemmaRglru)
    want, want_state = modeling_recurrent_gemma.RecurrentGemmaRglru._rnn_scan(layer, x, gate, reset, state)
    got, got_state = rglru_scan_by_steps(layer, x, gate, reset, state)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_state, want_state)


def test_rwkv_is_right_at_every_length() -> None:
    """Its program was specialised to the example's length before (a Python loop over the positions)."""
    cfg = transformers.RwkvConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64
    )
    torch.manual_seed(0)
    _right_at(_logits(transformers.AutoModelForCausalLM.from_config(cfg).eval()), (1, 4, 9, 33))


def test_recurrent_gemma_is_right_at_every_length() -> None:
    """Its program was specialised to the example's length before (a Python loop over the positions)."""
    cfg = transformers.RecurrentGemmaConfig(
        vocab_size=128,
        hidden_size=32,
        lru_width=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        attention_window_size=8,
        block_types=["recurrent", "recurrent", "attention"],
    )
    torch.manual_seed(0)
    _right_at(_logits(transformers.AutoModelForCausalLM.from_config(cfg).eval()), (1, 4, 9, 33))


def test_doge_is_right_at_every_length() -> None:
    """Its program was right at 2 to 2047 keys only before (a window of 8 here, 2048 in real configs):
    transformers keeps each query's largest keys only where there are more than the window."""
    cfg = transformers.DogeConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        keep_window_size=8,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    # A starts at zeros and dt_proj near them: the keys' scores tie or nearly, and which ones the window
    # keeps would be up to the top-k's tie-breaking (or the last bit of exp), here and in onnxruntime
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.self_attn.A)
        torch.nn.init.normal_(layer.self_attn.dt_proj.weight)
    _right_at(_logits(model), (1, 4, 8, 9, 33))


def test_mamba2_is_right_at_every_length() -> None:
    """Its program refused 1, 3, 4 and 8 tokens before (chunk size 8 here, 256 in real configs)."""
    cfg = transformers.Mamba2Config(
        vocab_size=128,
        hidden_size=64,
        state_size=16,
        num_heads=8,
        head_dim=16,
        n_groups=2,
        expand=2,
        num_hidden_layers=2,
        chunk_size=8,
        conv_kernel=4,
        use_cache=False,
    )
    torch.manual_seed(0)
    _right_at(_logits(transformers.AutoModelForCausalLM.from_config(cfg).eval()), (1, 3, 4, 5, 8, 9, 70))


@pytest.fixture(scope="module")
def qwen3_next() -> torch.nn.Module:
    cfg = transformers.Qwen3NextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"],
        use_cache=False,
    )
    torch.manual_seed(0)
    return _logits(transformers.AutoModelForCausalLM.from_config(cfg).eval())


def test_qwen3_next_is_right_at_every_length(qwen3_next: torch.nn.Module) -> None:
    """2 tiny layers (a linear-attention one, a full-attention one; the 4-layer capture time of
    docs/capture.md was measured on the same config with 4 layers)."""
    _right_at(qwen3_next, LENGTHS)


def _indexer(budget: int, ratio: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A Qwen4-Exp sparse-attention indexer (4 heads of 16) and its rotary embedding, weights drawn wide."""
    cfg = transformers.AutoConfig.for_model(
        "qwen4_exp_text",
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        indexer_n_heads=4,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=budget,
        indexer_compress_ratio=ratio,
    )
    torch.manual_seed(budget * 10 + ratio)
    indexer = modeling_qwen4_exp.Qwen4ExpTextQSAIndexer(cfg, 0).eval()
    for p in indexer.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return indexer, modeling_qwen4_exp.Qwen4ExpTextRotaryEmbedding(cfg)


@pytest.mark.parametrize(("budget", "ratio"), [(8, 4), (16, 4), (12, 2)])
def test_the_indexer_form_selects_qwen4_exps_tokens(budget: int, ratio: int) -> None:
    """Every row and query at once against transformers' loop over them: causal masks, one row
    left-padded, 1 to 37 tokens (0 to 9 complete blocks, fewer and more than the blocks kept). The
    indexer scores blocks by a sum of ReLUs, so blocks tie at 0 and the top-k may keep either: with the
    ReLU the identity (no ties), the selections are equal; with it, where no tie decides them."""
    from unittest import mock

    indexer, rotary = _indexer(budget, ratio)
    for batch, length in ((2, 37), (1, 1), (3, 9), (2, 16)):
        g = torch.Generator().manual_seed(length)
        hidden = torch.randn(batch, length, 64, generator=g)
        positions = torch.arange(length)[None].expand(3, batch, length)
        embeddings = rotary(hidden, positions)
        mask = torch.ones(length, length).tril().bool()[None, None].repeat(batch, 1, 1, 1)
        if batch > 1:
            mask[1, :, :, :3] = False  # left padding
        with torch.no_grad(), mock.patch("torch.relu", lambda x: x):
            want = indexer(hidden, embeddings, mask, None)
            got = qsa_indexer_by_masks(indexer, hidden, embeddings, mask, None)
        assert torch.equal(got, want), (batch, length)
        assert got.any() and (length < budget + ratio or not got.all())  # keys dropped once past the budget
        if (budget, ratio) != (12, 2):  # no tie at the top-k's boundary with these weights
            with torch.no_grad():
                torch.testing.assert_close(
                    qsa_indexer_by_masks(indexer, hidden, embeddings, mask, None),
                    indexer(hidden, embeddings, mask, None),
                )
