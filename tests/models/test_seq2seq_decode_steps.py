"""Seq2seq decoder steps with their cache: T5, BART and Whisper given transformers' EncoderDecoderCache
(a DynamicCache of self-attention and one of cross-attention) export with every cache tensor as an input
and the grown cache as outputs, under the default capture and torch.export, and the file exported at one
batch and past length runs at another against eager (the cache must never become a constant)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.export import Dim

import fastonnx
from support.model_zoo import SEQ2SEQ, TOKENS, Seq2SeqDecodeStep, _build, _config

# the tiny configs' logits are O(1); float32 rounding through two layers stays near 1e-6
ATOL, RTOL = 1e-5, 1e-4
T5 = {"vocab_size": 128, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4, **TOKENS}
MODELS = {
    "t5": lambda: _build("T5ForConditionalGeneration", _config("t5", **T5)),
    "bart": lambda: _build("BartForConditionalGeneration", _config("bart", **SEQ2SEQ)),
    "whisper": lambda: _build(
        "WhisperForConditionalGeneration",
        _config("whisper", **SEQ2SEQ, num_mel_bins=16, max_source_positions=16, max_target_positions=64),
    ),
}


def _shape(cfg: Any) -> tuple[int, int, int]:
    """(decoder layers, heads, head size) of a tiny config of any of the three families."""
    layers = getattr(cfg, "num_decoder_layers", None) or cfg.decoder_layers
    heads = getattr(cfg, "num_heads", None) or cfg.decoder_attention_heads
    return layers, heads, getattr(cfg, "d_kv", None) or cfg.d_model // heads


def _inputs(model: torch.nn.Module, batch: int, past: int, source: int, seed: int) -> tuple[Any, ...]:
    from transformers import DynamicCache, EncoderDecoderCache

    g = torch.Generator().manual_seed(seed)
    layers, heads, size = _shape(model.config)
    own, cross = DynamicCache(), DynamicCache()
    for i in range(layers):
        own.update(*(torch.randn(batch, heads, past, size, generator=g) for _ in range(2)), i)
        cross.update(*(torch.randn(batch, heads, source, size, generator=g) for _ in range(2)), i)
    mask = torch.ones(batch, source, dtype=torch.int64)
    mask[0, source - 1 :] = 0  # a padded source position: the cross-attention mask must be read
    return (
        torch.randint(3, 128, (batch, 1), generator=g),
        torch.randn(batch, source, model.config.d_model, generator=g),
        mask,
        EncoderDecoderCache(own, cross),
    )


def _spec(layers: int) -> dict[str, Any]:
    b, p, s = Dim("batch", min=1, max=16), Dim("past", min=1, max=256), Dim("source", min=2, max=256)
    kv = {"key": {0: b, 2: p}, "value": {0: b, 2: p}}
    cross = {"key": {0: b, 2: s}, "value": {0: b, 2: s}}
    return {
        "decoder_input_ids": {0: b},
        "encoder_hidden_states": {0: b, 1: s},
        "encoder_attention_mask": {0: b, 1: s},
        "past_key_values": [{"decoder": kv, "encoder": cross} for _ in range(layers)],
    }


def _assert_matches(result: Any, step: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
    with torch.no_grad():
        logits, cache = step(*copy.deepcopy(inputs))
    got_logits, got_cache = result(*copy.deepcopy(inputs))
    torch.testing.assert_close(got_logits, logits, atol=ATOL, rtol=RTOL)
    assert type(got_cache) is type(cache)
    for part in ("self_attention_cache", "cross_attention_cache"):
        for want, got in zip(getattr(cache, part).layers, getattr(got_cache, part).layers, strict=True):
            torch.testing.assert_close(got.keys, want.keys, atol=ATOL, rtol=RTOL)
            torch.testing.assert_close(got.values, want.values, atol=ATOL, rtol=RTOL)


def _names(layers: int, prefix: str) -> list[str]:
    return [
        f"{prefix}.{i}.{side}.{kv}"
        for i in range(layers)
        for side in ("decoder", "encoder")
        for kv in ("key", "value")
    ]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_decoder_step_takes_its_cache_as_inputs_at_any_past_length(name: str) -> None:
    step = Seq2SeqDecodeStep(MODELS[name]()).eval()
    layers = _shape(step.m.config)[0]
    example = _inputs(step.m, batch=2, past=4, source=6, seed=0)
    result = fastonnx.to_onnx(step, copy.deepcopy(example), dynamic_shapes=_spec(layers))
    assert result.input_names == [
        "decoder_input_ids",
        "encoder_hidden_states",
        "encoder_attention_mask",
        *_names(layers, "past_key_values"),
    ]
    assert result.output_names == ["output.0", *_names(layers, "output.1")]
    _assert_matches(result, step, _inputs(step.m, batch=3, past=9, source=5, seed=1))


@pytest.mark.parametrize("capture", ["auto", "trace", "export"])
def test_static_decoder_step_reads_the_cache_it_is_given(capture: str) -> None:
    # the default capture is the trace here: the cache's tensors are its inputs, not initializers
    step = Seq2SeqDecodeStep(MODELS["t5"]()).eval()
    result = fastonnx.to_onnx(step, _inputs(step.m, batch=2, past=4, source=6, seed=0), capture=capture)
    assert result.stats["capture"] == ("export" if capture == "export" else "trace")
    assert len(result.input_names) == 3 + 4 * _shape(step.m.config)[0]
    _assert_matches(result, step, _inputs(step.m, batch=2, past=4, source=6, seed=2))
