"""Dynamic-shape capture by stamping repeated layers (capture/stamping.py): the same ONNX graph as
torch.export's whole capture (op types in order, inputs and outputs with their dims' names), the same
values as eager at other sizes, and a refusal with a reason wherever sameness is not proven."""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fastonnx
from support.export_check import _graph
from support.matrix import sampled
from support.model_zoo import TEXT, VISION, DecodeStep, causal_lm, encoder, seq2seq, vision

LAYERS = 5

# name -> (builder, whether stamping applies); models whose layers differ by index (SmolLM3's
# no-RoPE layers, Gemma3's sliding / full layers) are stamped from one representative per kind
MODELS: dict[str, tuple[Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]], bool]] = {
    "llama": (
        lambda: causal_lm("llama", "LlamaForCausalLM", num_hidden_layers=LAYERS, use_cache=False),
        True,
    ),
    "qwen3": (
        lambda: causal_lm("qwen3", "Qwen3ForCausalLM", num_hidden_layers=LAYERS, head_dim=8, use_cache=False),
        True,
    ),
    "phi3": (lambda: causal_lm("phi3", "Phi3ForCausalLM", num_hidden_layers=LAYERS, use_cache=False), True),
    "gemma3": (
        lambda: causal_lm(
            "gemma3_text",
            "Gemma3ForCausalLM",
            head_dim=8,
            sliding_window=4,
            num_hidden_layers=LAYERS,
            sliding_window_pattern=3,
            use_cache=False,
        ),
        True,
    ),
    "smollm3": (
        lambda: causal_lm(
            "smollm3",
            "SmolLM3ForCausalLM",
            num_hidden_layers=LAYERS,
            no_rope_layer_interval=3,
            use_cache=False,
        ),
        True,
    ),
    # its experts run transformers' grouped_mm custom op, which the static trace proving sameness
    # refuses: captured whole
    "gpt_oss": (
        lambda: causal_lm(
            "gpt_oss",
            "GptOssForCausalLM",
            num_hidden_layers=LAYERS,
            head_dim=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            use_cache=False,
        ),
        False,
    ),
    "bert": (lambda: encoder("bert", "BertModel", **{**TEXT, "num_hidden_layers": LAYERS}), True),
    "vit": (lambda: vision("vit", "ViTModel", **{**VISION, "num_hidden_layers": LAYERS}), True),
    # the forward builds its own cache, whose sliding-window layers it creates outside the stack
    "mistral-own-cache": (
        lambda: causal_lm("mistral", "MistralForCausalLM", num_hidden_layers=LAYERS),
        False,
    ),
    "mistral": (
        lambda: causal_lm("mistral", "MistralForCausalLM", num_hidden_layers=LAYERS, use_cache=False),
        True,
    ),
    "qwen2": (
        lambda: causal_lm("qwen2", "Qwen2ForCausalLM", num_hidden_layers=LAYERS, use_cache=False),
        True,
    ),
    "gemma": (
        lambda: causal_lm("gemma", "GemmaForCausalLM", head_dim=8, num_hidden_layers=LAYERS, use_cache=False),
        True,
    ),
    "gpt_neox": (
        lambda: causal_lm("gpt_neox", "GPTNeoXForCausalLM", num_hidden_layers=LAYERS, use_cache=False),
        True,
    ),
    "granite": (
        lambda: causal_lm("granite", "GraniteForCausalLM", num_hidden_layers=LAYERS, use_cache=False),
        True,
    ),
    "olmo": (lambda: causal_lm("olmo", "OlmoForCausalLM", num_hidden_layers=LAYERS, use_cache=False), True),
    "opt": (
        lambda: causal_lm(
            "opt",
            "OPTForCausalLM",
            ffn_dim=64,
            word_embed_proj_dim=32,
            num_hidden_layers=LAYERS,
            use_cache=False,
        ),
        True,
    ),
    "bart": (
        lambda: seq2seq("bart", "BartForConditionalGeneration", **{**_bart(), "encoder_layers": LAYERS}),
        True,
    ),
}
# gpt_oss (stamping refused, captured whole: 2 whole captures of a MoE model) only with
# FASTONNX_FULL_MATRIX=1: the refusals are covered by the small models of the refusal tests below
# qwen3 and smollm3 (llama's layer with a q/k norm, and with layers without rotary) under the full matrix
IN_CI = ("llama", "gemma3", "bert", "vit", "mistral-own-cache")


def _bart() -> dict[str, Any]:
    from support.model_zoo import SEQ2SEQ

    return {**SEQ2SEQ, "decoder_layers": LAYERS, "use_cache": False}


def _shapes(model: torch.nn.Module, args: tuple[Any, ...]) -> dict[str, Any]:
    import inspect

    names = list(inspect.signature(model.forward).parameters)
    shapes: dict[str, Any] = {}
    # up to the tiny configs' position embeddings (BERT's 72, BART's 64): the program is right there
    # only, and a longer request is refused (capture/guards.py)
    lengths = {"seq": torch.export.Dim("seq", max=64), "dec": torch.export.Dim("dec", max=64)}
    for i, a in enumerate(args):
        # images: batch dynamic; token ids and masks: batch and (shared) sequence dynamic
        shapes[names[i]] = (
            {0: "batch"} if a.dim() == 4 else {0: "batch", 1: lengths["dec" if i == 2 else "seq"]}
        )
    return shapes


def _other_size(args: tuple[Any, ...]) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(7)
    out = []
    for a in args:
        if a.dim() == 4:
            out.append(torch.randn(3, *a.shape[1:], generator=g))
        elif a.dtype == torch.int64 and int(a.max()) <= 1:
            out.append(torch.ones(3, a.shape[1] + 3, dtype=torch.int64))
        else:
            out.append(torch.randint(3, 128, (3, a.shape[1] + 3), generator=g))
    return tuple(out)


@pytest.mark.parametrize("name", sampled(MODELS, IN_CI.__contains__))
def test_stamped_capture_is_torch_exports_graph(name: str) -> None:
    build, stamped = MODELS[name]
    model, args = build()
    shapes = _shapes(model, args)
    fast = fastonnx.to_onnx(model, args, dynamic_shapes=shapes)
    whole = fastonnx.to_onnx(model, args, dynamic_shapes=shapes, capture="export")
    assert fast.stats["capture"] == ("stamped" if stamped else "export"), fast.stats.get("stamp_refused")
    if stamped:
        # copied from the second layer of each kind: layers 0-1 captured (0-2 where layer 2 is of its
        # own kind: Gemma3's full attention, SmolLM3's layer without RoPE)
        want = 2 if name in ("gemma3", "smollm3") else 3
        assert fast.stats["stamped"].startswith(f"{want} of {LAYERS} layers"), fast.stats["stamped"]
    else:
        assert fast.stats["stamp_refused"]  # a reason, never a silent whole capture
    got, want = _graph(fast), _graph(whole)
    diff = "\n".join(difflib.unified_diff(want, got, "torch.export", "stamped", lineterm="", n=1))
    assert got == want, f"stamped and torch.export's graphs differ:\n{diff}"
    for run in (args, _other_size(args)):
        with torch.no_grad():
            expected = model(*run)
        torch.testing.assert_close(fast(*run), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", sampled(["llama", "gemma3", "smollm3"], lambda n: n == "llama"))
def test_a_decode_step_stamps_each_layers_own_cache_entries(name: str) -> None:
    """With the KV cache an input, stamped layer k reads past.k, computes its sizes from past.k's length
    (torch.export gives each layer's cache length its own symbol and orders ``past + seq`` by the
    symbols' names) and makes present.k."""
    from transformers import DynamicCache

    extra: dict[str, Any] = {"llama": {}, "gemma3": {"sliding_window_pattern": 3}, "smollm3": {}}[name]
    types = {
        "llama": ("llama", "LlamaForCausalLM"),
        "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
        "smollm3": ("smollm3", "SmolLM3ForCausalLM"),
    }[name]
    logits_model, _ = causal_lm(*types, num_hidden_layers=LAYERS, head_dim=8, sliding_window=4, **extra)
    model = logits_model.m
    step = DecodeStep(model).eval()
    cfg = model.config

    def inputs(batch: int, seq: int, past: int, seed: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(seed)
        cache = DynamicCache()
        shape = (batch, cfg.num_key_value_heads, past, cfg.head_dim)
        for i in range(LAYERS):
            cache.update(torch.randn(shape, generator=g), torch.randn(shape, generator=g), i)
        return (
            torch.randint(3, 128, (batch, seq), generator=g),
            torch.ones(batch, past + seq, dtype=torch.int64),
            torch.arange(past, past + seq).repeat(batch, 1),
            cache,
        )

    args = inputs(2, 3, 2, 0)
    b, s, p = "batch", "seq", "past"
    shapes = {
        "input_ids": {0: b, 1: s},
        "attention_mask": {0: b, 1: "total"},
        "position_ids": {0: b, 1: s},
        "past": [{"key": {0: b, 2: p}, "value": {0: b, 2: p}} for _ in range(LAYERS)],
    }
    fast = fastonnx.to_onnx(step, args, dynamic_shapes=shapes)
    whole = fastonnx.to_onnx(step, args, dynamic_shapes=shapes, capture="export")
    assert fast.stats["capture"] == "stamped", fast.stats.get("stamp_refused")
    got, want = _graph(fast), _graph(whole)
    assert got == want, "\n".join(
        difflib.unified_diff(want, got, "torch.export", "stamped", lineterm="", n=1)
    )
    run = inputs(3, 4, 3, 1)
    with torch.no_grad():
        logits, cache = step(*copy.deepcopy(run))
    got, got_cache = fast(*run)
    torch.testing.assert_close(got, logits, atol=1e-4, rtol=1e-4)
    for mine, theirs in zip(got_cache.layers, cache.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-5)


class _Block(torch.nn.Module):
    def __init__(self, index: int, width: int = 16, odd: int | None = None) -> None:
        super().__init__()
        self.layer_idx = index
        self.proj = torch.nn.Linear(width, width)
        self.scale = 2.0 if odd is not None and index == odd else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.proj(x)) * self.scale


class _ReadsIndex(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + torch.tanh(self.proj(x))
        return y.flip(-1) if self.layer_idx == 3 else y  # an index read in Python: layer 3 differs


class _Stack(torch.nn.Module):
    def __init__(self, block: type[_Block], n: int = 6, **kw: Any) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(block(i, **kw) for i in range(n))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class _Residual(_Stack):
    """Every layer after the first also gets the first layer's output added to its input (a value
    residual): what a layer reads is not what the previous one handed on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = x = self.layers[0](x)
        for layer in self.layers[1:]:
            x = layer(x) + first
        return self.head(x)


def _export(model: torch.nn.Module) -> fastonnx.ExportResult:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    result = fastonnx.to_onnx(model, (x,), dynamic_shapes=({0: "batch", 1: "seq"},))
    other = torch.randn(3, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(result(other), model(other), atol=1e-5, rtol=1e-5)
    return result


def test_layers_of_another_kind_are_captured_not_stamped() -> None:
    torch.manual_seed(0)
    result = _export(_Stack(_Block, odd=2).eval())  # layer 2 scales by 2: its own kind
    assert result.stats["capture"] == "stamped"
    assert result.stats["stamped"] == "3 of 6 layers of layers"  # 0..2 captured, 3..5 stamped from 0


def test_an_index_read_in_python_is_caught_by_the_trace_and_refused() -> None:
    torch.manual_seed(0)
    result = _export(_Stack(_ReadsIndex).eval())
    assert result.stats["capture"] == "export"
    assert "layer layers.3 does not run what layer layers.0 runs" in result.stats["stamp_refused"]


def test_a_layer_reading_more_than_the_previous_layers_output_is_refused() -> None:
    torch.manual_seed(0)
    result = _export(_Residual(_Block).eval())
    assert result.stats["capture"] == "export"
    assert "layer layers.2 does not run what layer layers.0 runs" in result.stats["stamp_refused"]


class _Skips(_Stack):
    """Each layer reads the output of the layer two before it too (a skip connection inside the
    stack, through the layer's second input)."""

    def __init__(self) -> None:
        super().__init__(_Block)
        self.layers = torch.nn.ModuleList(_TwoInputs(i) for i in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [x, x]
        for layer in self.layers:
            outs.append(layer(outs[-1], outs[-2]))
        return self.head(outs[-1])


class _TwoInputs(_Block):
    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x + torch.tanh(self.proj(x)) * skip.sigmoid()


def test_a_layer_reading_another_layers_tensor_is_refused() -> None:
    torch.manual_seed(0)
    result = _export(_Skips().eval())
    assert result.stats["capture"] == "export"
    assert "layer layers.2 reads a tensor of layer layers.0" in result.stats["stamp_refused"]


def test_explicit_export_capture_never_stamps() -> None:
    torch.manual_seed(0)
    model = _Stack(_Block).eval()
    x = torch.randn(2, 5, 16)
    result = fastonnx.to_onnx(model, (x,), dynamic_shapes=({0: "batch"},), capture="export")
    assert result.stats["capture"] == "export" and "stamp_refused" not in result.stats


def test_a_specialised_dim_is_refused_as_by_torch_export() -> None:
    """strict_dynamic holds through the prefix's capture: a dim the layers fix is an error."""

    class Fixes(_Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tanh(self.proj(x)).reshape(2, -1, 16)  # batch fixed to 2

    torch.manual_seed(0)
    model = _Stack(Fixes).eval()
    with pytest.raises(fastonnx.CaptureError, match="specialised"):
        fastonnx.to_onnx(model, (torch.randn(2, 5, 16),), dynamic_shapes=({0: "batch", 1: "seq"},))
