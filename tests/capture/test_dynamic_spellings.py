"""Dynamic shapes as users spell them: named Dims (with and without bounds), Dim.DYNAMIC, Dim.AUTO,
strings and torch.onnx.export's dynamic_axes, on the suite's transformers models with and without an
attention mask and with use_cache on and off; each file runs at two other sizes (batch 1 included)
against eager. CI runs a fixed sample of the matrix; ``FASTONNX_FULL_MATRIX=1`` runs all of it (the
sweep). Also the official exporter's cases on what a spelling asks for: Dim.AUTO / Dim.STATIC / ints
are no request for a dynamic dim, and a tuple of dynamic_shapes follows the signature's order."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.export import Dim

import fastonnx
from support.matrix import sampled
from support.model_zoo import TEXT, _build, _config

# the tiny models' logits are O(1); float32 rounding through two layers stays near 1e-6
ATOL, RTOL = 1e-5, 1e-4
EXAMPLE = (2, 8)  # batch, sequence of the example: no dim of size 0 or 1
OTHER_SIZES = ((1, 5), (3, 11))

CAUSAL = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
ENCODERS = {"bert": "BertForSequenceClassification"}
SPELLINGS = ("dim", "dim_bounds", "dynamic", "auto", "strings", "dynamic_axes")


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        return self.m(input_ids=input_ids, attention_mask=attention_mask).logits


def _model(name: str, use_cache: bool) -> torch.nn.Module:
    if name in ENCODERS:
        cfg = _config(
            name,
            vocab_size=128,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=512,
        )
        return Logits(_build(ENCODERS[name], cfg)).eval()
    extra = {"n_positions": 72, "n_embd": 32, "n_layer": 2, "n_head": 4} if name == "gpt2" else {}
    return Logits(_build(CAUSAL[name], _config(name, **{**TEXT, **extra, "use_cache": use_cache}))).eval()


def _inputs(batch: int, sequence: int, mask: bool, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (batch, sequence), generator=g)
    if not mask:
        return (ids,)
    attention = torch.ones(batch, sequence, dtype=torch.int64)
    attention[0, sequence - 2 :] = 0  # padding: the mask is read
    return ids, attention


def _spec(spelling: str, mask: bool) -> Any:
    dims: dict[str, Any] = {
        "dim": (Dim("batch"), Dim("sequence")),
        "dim_bounds": (Dim("batch", min=1, max=16), Dim("sequence", min=1, max=64)),
        "dynamic": (Dim.DYNAMIC, Dim.DYNAMIC),
        "auto": (Dim.AUTO, Dim.AUTO),
        "strings": ("batch", "sequence"),
    }
    batch, sequence = dims[spelling]
    spec = {"input_ids": {0: batch, 1: sequence}}
    if mask:
        spec["attention_mask"] = {0: batch, 1: sequence}
    return spec


def _export(model: torch.nn.Module, spelling: str, mask: bool, folder: Any) -> Any:
    args = _inputs(*EXAMPLE, mask=mask, seed=0)
    if spelling != "dynamic_axes":
        return fastonnx.to_onnx(model, args, dynamic_shapes=_spec(spelling, mask))
    # torch.onnx.export's spelling, through the drop-in
    axes = {"input_ids": {0: "batch", 1: "sequence"}}
    names = ["input_ids"]
    if mask:
        axes["attention_mask"] = {0: "batch", 1: "sequence"}
        names.append("attention_mask")
    program = fastonnx.export(model, args, input_names=names, dynamic_axes=axes, dynamo=True)
    return program.result  # the ExportResult behind the ONNXProgram


def _cases() -> list[tuple[str, str, bool, bool]]:
    every = [
        (model, spelling, mask, cache)
        for model in [*CAUSAL, *ENCODERS]
        for spelling, mask, cache in itertools.product(SPELLINGS, (False, True), (False, True))
        if not (model in ENCODERS and cache)  # an encoder has no cache to use
    ]
    # CI: every model and every spelling, each with and without a mask, in a fixed rotation
    return sampled(every, lambda case: every.index(case) % 7 == 0)


@pytest.mark.parametrize(
    ("model_name", "spelling", "mask", "use_cache"),
    _cases(),
    ids=lambda v: {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else str(v),
)
def test_dynamic_spellings_export_and_run_at_other_sizes(
    model_name: str, spelling: str, mask: bool, use_cache: bool, tmp_path: Any
) -> None:
    model = _model(model_name, use_cache)
    if model_name in ENCODERS and spelling != "dim_bounds":
        # BERT's 512 position embeddings: the program is right up to 512 tokens only, which these
        # spellings cannot say (capture/guards.py)
        with pytest.raises(fastonnx.CaptureError) as caught:
            _export(model, spelling, mask, tmp_path)
        assert "input 'input_ids' axis 1" in str(caught.value), caught.value
        assert "not any size above 512" in str(caught.value) and "max=512)" in str(caught.value)
        return
    result = _export(model, spelling, mask, tmp_path)
    for seed, (batch, sequence) in enumerate(OTHER_SIZES, start=1):
        inputs = _inputs(batch, sequence, mask, seed)
        with torch.no_grad():
            expected = model(*inputs)
        torch.testing.assert_close(result(*inputs), expected, atol=ATOL, rtol=RTOL)


def test_the_sample_covers_every_model_and_spelling() -> None:
    cases = _cases()
    assert {c[0] for c in cases} == {*CAUSAL, *ENCODERS}
    assert {c[1] for c in cases} == set(SPELLINGS)
    assert {c[2] for c in cases} == {False, True} and {c[3] for c in cases} == {False, True}


def test_a_size_oblivious_guard_is_retried_without_it_and_the_ranges_are_recorded() -> None:
    # Llama given input_ids alone: size-oblivious reasoning adds a batch != 1 guard, plain torch.export
    # does not: the retry keeps batch 1, which the file then runs at
    model = _model("llama", use_cache=False)
    result = fastonnx.to_onnx(
        model, _inputs(*EXAMPLE, mask=False, seed=0), dynamic_shapes=_spec("dim", False)
    )
    assert result.stats["size_oblivious"] is False
    assert result.stats["dynamic_ranges"]["input_ids[0]"][0] <= 1
    ids = _inputs(1, 3, mask=False, seed=4)
    torch.testing.assert_close(result(*ids), model(*ids), atol=ATOL, rtol=RTOL)


def test_a_bound_the_model_needs_is_refused_then_asked_for() -> None:
    # BERT's position embeddings bound the sequence (torch would suggest Dim('sequence', max=512)):
    # refused with the guard named, then exported with the bound asked for, which the result keeps
    model = _model("bert", use_cache=False)
    example = _inputs(*EXAMPLE, mask=False, seed=0)
    with pytest.raises(fastonnx.CaptureError) as caught:
        fastonnx.to_onnx(model, example, dynamic_shapes=_spec("dim", False))
    message = str(caught.value)
    assert "input_ids.shape[1]" in message and "Dim('sequence', min=2, max=512)" in message, message
    result = fastonnx.to_onnx(
        model, example, dynamic_shapes={"input_ids": {0: Dim("batch"), 1: Dim("sequence", max=512)}}
    )
    assert result.stats["dynamic_ranges"]["input_ids[1]"] == [2, 512]
    with pytest.raises(fastonnx.SizeGuardError, match="input 'input_ids' axis 1 has size 513"):
        result(_inputs(1, 513, mask=False, seed=1)[0])


def test_auto_static_and_ints_are_no_request_for_a_dynamic_dim() -> None:
    # the official exporter's test_export_of_static_dim_constraints
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = torch.nn.Linear(6, 4)

        def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> Any:
            return self.l(x) + y[1:], z * 2.0

    torch.manual_seed(0)
    model = Model().eval()
    dx, dz = Dim("dx", min=3, max=6), Dim("dz", min=3, max=6)
    shapes = ({0: dx, 1: Dim.AUTO}, {0: dx + 1, 1: Dim.STATIC}, {0: dz, 1: 3})
    result = fastonnx.to_onnx(
        model, (torch.randn(4, 6), torch.randn(5, 4), torch.randn(3, 3)), dynamic_shapes=shapes
    )
    other = (torch.randn(6, 6), torch.randn(7, 4), torch.randn(5, 3))
    for got, want in zip(result(*other), model(*other), strict=True):
        torch.testing.assert_close(got, want)


def test_a_tuple_of_dynamic_shapes_follows_the_signature_not_the_call() -> None:
    # the official exporter's test_export_with_non_arg_name_with_kwarg: keywords given kw2 first
    class Model(torch.nn.Module):
        def forward(
            self, a: torch.Tensor, b: torch.Tensor, kw1: torch.Tensor, kw2: torch.Tensor
        ) -> torch.Tensor:
            return a.sum() + b.sum() + kw1.sum() - kw2.sum()

    shapes = (None, {0: Dim("dim")}, {0: Dim("dim_for_kw1")}, None)
    result = fastonnx.to_onnx(
        Model(),
        (torch.randn(4, 4), torch.randn(4, 4)),
        {"kw2": torch.ones(4, 4), "kw1": torch.zeros(4, 4)},
        dynamic_shapes=shapes,
    )
    args, kwargs = (torch.randn(4, 4), torch.randn(7, 4)), {"kw2": torch.ones(4, 4), "kw1": torch.randn(9, 4)}
    torch.testing.assert_close(result(*args, **kwargs), Model()(*args, **kwargs))
