"""LLM decode steps (issue 17): one export per model (Llama, Mistral, Qwen2, Phi-3, and Phi's partial rotary;
tiny configs with 4 query / 2 key-value heads) with dynamic batch, sequence and past length runs a
prefill (past 0) and then decode steps from the same file, matched with eager at every step, left
padding included, at opsets 18, 20, 23 and MAX_OPSET under every optimize setting.

Each conversion of the dynamic program proves its guards again (capture/guards.py), some seconds each:
CI converts each model once per optimize setting, the opsets rotated across the models so that every
(opset, setting) pair is converted by some model and each model's optimized conversions fall on both
sides of opset 23 (``_conversions``); ``FASTONNX_FULL_MATRIX=1`` converts every model at every pair.

Grouped-query attention must read the cache unrepeated (no Expand of keys or values): the
grouped_attention_unrepeated pass below opset 23, Attention from 23; rotary embeddings computed from the
position ids fuse to RotaryEmbedding from opset 23 and to com.microsoft.RotaryEmbedding below it at the
onnxruntime level.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.export import Dim

import fastonnx
from support.matrix import rotated_conversions, sampled
from support.model_zoo import TEXT, DecodeStep, _build, _config

MODELS = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    # partial rotary (half the head rotated): the rotated slice fuses
    "phi": ("phi", "PhiForCausalLM"),
}
OPSETS = (18, 20, 23, fastonnx.MAX_OPSET)
SETTINGS = (False, True, "onnxruntime")
# logits of tiny random models are O(1); float32 rounding through two layers stays near 1e-6
ATOL, RTOL = 1e-5, 1e-4
BATCH, PROMPT, STEPS = 2, 5, 3
# CI: model i converts at OPSETS[(i + shift) % 4] for each setting (rotated_conversions); the shifts of
# True and "onnxruntime" differ by 2, so one of each model's two optimized conversions is below opset 23
# and the other from it
_SHIFT = {False: 0, True: 1, "onnxruntime": 3}


def _conversions(name: str) -> list[tuple[int, bool | str]]:
    """The (opset, optimize) pairs ``name``'s program is converted at (see the module's docstring)."""
    return rotated_conversions(sorted(MODELS).index(name), OPSETS, SETTINGS, _SHIFT)


def _cache(model: torch.nn.Module, batch: int, length: int, g: torch.Generator) -> Any:
    from transformers import DynamicCache

    cfg = model.config
    shape = (batch, cfg.num_key_value_heads, length, cfg.hidden_size // cfg.num_attention_heads)
    cache = DynamicCache()
    for i in range(cfg.num_hidden_layers):
        cache.update(torch.randn(shape, generator=g), torch.randn(shape, generator=g), i)
    return cache


def _positions(mask: torch.Tensor, new: int) -> torch.Tensor:
    """As generate computes them: left padding does not count."""
    return (mask.cumsum(-1) - 1).clamp(min=0)[:, -new:]


def _export(step: DecodeStep) -> Any:
    g = torch.Generator().manual_seed(0)
    batch, seq, past = 2, 3, 4
    args = (
        torch.randint(3, 128, (batch, seq), generator=g),
        torch.ones(batch, past + seq, dtype=torch.int64),
        torch.arange(past, past + seq).repeat(batch, 1),
        _cache(step.m, batch, past, g),
    )
    b, s, p = Dim("batch", min=1, max=64), Dim("seq", min=1, max=1024), Dim("past", min=0, max=1024)
    layers = step.m.config.num_hidden_layers
    spec = {
        "input_ids": {0: b, 1: s},
        "attention_mask": {0: b, 1: Dim.DYNAMIC},
        "position_ids": {0: b, 1: s},
        "past": [{"key": {0: b, 2: p}, "value": {0: b, 2: p}} for _ in range(layers)],
    }
    fastonnx.capture.transformers_caches.register_transformers_caches()
    return torch.export.export(step, args, dynamic_shapes=spec, strict=False), args


# CI: Llama (grouped-query attention) and Phi (partial rotary); Qwen2, Mistral and Phi-3 are Llama's step
@pytest.mark.parametrize("name", sampled(sorted(MODELS), lambda name: name in ("llama", "phi")))
def test_prefill_then_decode_from_one_file(name: str) -> None:
    model_type, cls_name = MODELS[name]
    model = _build(cls_name, _config(model_type, **{**TEXT, "use_cache": True}))
    step = DecodeStep(model).eval()
    cfg = model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention is exercised
    ep, args = _export(step)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 128, (BATCH, PROMPT), generator=g)
    prompt_mask = torch.ones(BATCH, PROMPT, dtype=torch.int64)
    prompt_mask[1, :2] = 0  # left padding
    # eager, once: the prefill on an empty cache (past 0), then greedy decode steps
    expected = []
    eager_cache, ids, mask = _cache(model, BATCH, 0, g), prompt, prompt_mask
    with torch.no_grad():
        for _ in range(1 + STEPS):
            logits, eager_cache = step(ids, mask, _positions(mask, ids.shape[1]), eager_cache)
            expected.append((ids, mask, logits, copy.deepcopy(eager_cache)))
            ids = logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones(BATCH, 1, dtype=torch.int64)], dim=1)
    assert float(expected[0][2].abs().max()) > 1e-2  # a comparison that can fail
    for opset, opt in _conversions(name):
        result = fastonnx.to_onnx(ep, args, opset=opset, optimize=opt)
        counts = result.stats.get("optimize") or {}
        where = f"{name} opset={opset} optimize={opt}"
        if opt is not False:
            # every layer's attention reads the cache unrepeated
            unrepeated = "attention_fused" if opset >= 23 else "grouped_attention_unrepeated"
            assert counts[unrepeated] == cfg.num_hidden_layers, (where, counts)
            # queries and keys rotated by cos / sin computed from position_ids: RotaryEmbedding
            # from 23, com.microsoft.RotaryEmbedding below it at the onnxruntime level
            fused = opset >= 23 or opt == "onnxruntime"
            rotated = 2 * cfg.num_hidden_layers if fused else 0
            assert counts["rotary_live_fused"] == rotated, (where, counts)
            # repeat_kv starts with an Unsqueeze of the grown cache: nothing may copy it
            cache_out = {n for n in result.output_names if ".key" in n or ".value" in n}
            assert len(cache_out) == 2 * cfg.num_hidden_layers, result.output_names
            repeats = [
                n.name
                for n in result.model_proto.graph.node
                if n.op_type in ("Unsqueeze", "Expand") and cache_out & set(n.input)
            ]
            assert not repeats, (where, repeats)
        cache = _cache(model, BATCH, 0, g)
        for i, (ids, mask, logits, exp_cache) in enumerate(expected):
            got, cache = result(ids, mask, _positions(mask, ids.shape[1]), cache)
            torch.testing.assert_close(got, logits, atol=ATOL, rtol=RTOL, msg=f"{where} step {i}")
            for got_layer, exp_layer in zip(cache.layers, exp_cache.layers, strict=True):
                torch.testing.assert_close(got_layer.keys, exp_layer.keys, atol=ATOL, rtol=RTOL)
                torch.testing.assert_close(got_layer.values, exp_layer.values, atol=ATOL, rtol=RTOL)


def test_the_sample_converts_every_pair_and_both_sides_of_23_per_model() -> None:
    pairs = {pair: name for name in MODELS for pair in _conversions(name)}
    assert set(pairs) == {(opset, opt) for opset in OPSETS for opt in SETTINGS}
    for name in MODELS:
        done = _conversions(name)
        assert {opt for _, opt in done} == set(SETTINGS), (name, done)
        optimized = {opset >= 23 for opset, opt in done if opt is not False}
        assert optimized == {False, True}, (name, done)
