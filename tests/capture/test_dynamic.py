"""Dynamic shapes, structured inputs and KV caches: one export that runs at every batch and length."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch.export import Dim

import fastonnx
from support.model_zoo import Logits, SmallCNN, tiny_llama, with_random_batchnorm_stats


def _symbolic_dims(result: fastonnx.ExportResult) -> dict[str, list]:
    graph = result.model_proto.graph
    return {
        vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in graph.input
    }


def _left_padded(batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 256, (batch, seq), generator=generator)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for b in range(1, batch):
        mask[b, : min(b, seq - 1)] = 0  # left padding, one more token per row
    return ids, mask


@pytest.fixture(scope="module")
def padded_decoder() -> tuple[torch.nn.Module, torch.export.ExportedProgram, tuple]:
    """A tiny Llama exported once with a dynamic batch and length (converted below per setting)."""
    model = Logits(tiny_llama()).eval()
    ids, mask = _left_padded(2, 8, torch.Generator().manual_seed(0))
    seq, batch = Dim("seq", min=2, max=64), Dim("batch", min=1, max=8)
    spec = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    return model, torch.export.export(model, (ids, mask), dynamic_shapes=spec, strict=False), (ids, mask)


# opset 23 fuses attention (with rows the left padding closes entirely), rotary tables computed at run
# time stay unfused; the onnxruntime level adds its contrib operators
@pytest.mark.parametrize(
    ("opset", "optimize"), [(20, True), (20, "onnxruntime"), (23, True), (23, "onnxruntime")]
)
def test_decoder_runs_at_every_batch_and_length(
    padded_decoder: tuple[torch.nn.Module, torch.export.ExportedProgram, tuple],
    opset: int,
    optimize: bool | str,
) -> None:
    model, ep, args = padded_decoder
    result = fastonnx.to_onnx(ep, args, opset=opset, optimize=optimize)
    dims = _symbolic_dims(result)
    assert dims["input_ids"] == dims["attention_mask"] and all(isinstance(d, str) for d in dims["input_ids"])
    if opset >= 23:
        assert result.stats["optimize"]["attention_fused"] == 2, result.stats["optimize"]
    g = torch.Generator().manual_seed(1)
    for batch, seq in [(2, 8), (1, 5), (3, 17), (4, 33)]:
        ids, mask = _left_padded(batch, seq, g)
        with torch.no_grad():
            expected = model(ids, mask)
        got = result(ids, mask)
        # every position: padded queries attend to nothing and must give torch's values, not NaN
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_dims_named_by_strings_name_the_inputs(
    padded_decoder: tuple[torch.nn.Module, torch.export.ExportedProgram, tuple],
) -> None:
    model, _, args = padded_decoder
    spec = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    result = fastonnx.to_onnx(model, args, dynamic_shapes=spec)
    assert _symbolic_dims(result) == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}


def test_cnn_with_dynamic_batch() -> None:
    model = with_random_batchnorm_stats(SmallCNN()).eval()
    batch = Dim("batch", min=1, max=64)
    result = fastonnx.to_onnx(model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: batch},))
    assert _symbolic_dims(result)["x"] == ["batch", 3, 32, 32]
    for n in (1, 3, 8):
        x = torch.randn(n, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(result(x), model(x), atol=1e-4, rtol=1e-4)


class Structured(torch.nn.Module):
    def forward(self, pair: tuple, items: list, named: dict, nothing: None, *, scale: torch.Tensor) -> dict:
        a, (b, c) = pair
        total = a + b * c + items[0] - items[1] + named["x"] * named["y"]
        return {"total": total * scale, "parts": [a.sum(), named["x"]], "none": None}


def test_structured_inputs_and_outputs() -> None:
    t = lambda *s: torch.randn(*s)  # noqa: E731 - short local factory
    args = ((t(3), (t(3), t(3))), [t(3), t(3)], {"x": t(3), "y": t(3)}, None)
    kwargs = {"scale": t(3)}
    model = Structured()
    result = fastonnx.to_onnx(model, args, kwargs)
    assert result.input_names == [
        "pair.0",
        "pair.1.0",
        "pair.1.1",
        "items.0",
        "items.1",
        "named.x",
        "named.y",
        "scale",
    ]
    new_args = ((t(3), (t(3), t(3))), [t(3), t(3)], {"x": t(3), "y": t(3)}, None)
    new_kwargs = {"scale": t(3)}
    got = result(*new_args, **new_kwargs)
    expected = model(*new_args, **new_kwargs)
    assert got["none"] is None
    torch.testing.assert_close(got["total"], expected["total"])
    torch.testing.assert_close(got["parts"], expected["parts"])


class Derived(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, y[1:]], dim=0) * 2


def test_derived_dims_get_readable_names() -> None:
    seq = Dim("seq", min=2, max=100)
    x, y = torch.randn(4, 3), torch.randn(5, 3)
    result = fastonnx.to_onnx(Derived(), (x, y), dynamic_shapes=({0: seq}, {0: seq + 1}))
    dims = _symbolic_dims(result)
    assert dims["x"] == ["seq", 3] and dims["y"] == ["seq+1", 3]
    for n in (2, 7):
        a, b = torch.randn(n, 3), torch.randn(n + 1, 3)
        torch.testing.assert_close(result(a, b), Derived()(a, b))


def test_specialised_dim_warns_when_not_strict() -> None:
    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 3) + 1

    # strict_dynamic=True (the default) makes it an error: see test_capture.py
    with pytest.warns(
        UserWarning, match="input 'x' dim 0 was asked to be dynamic but torch.export specialised it to 2"
    ):
        fastonnx.to_onnx(
            Fixed(), (torch.randn(2, 3),), dynamic_shapes={"x": {0: "batch"}}, strict_dynamic=False
        )


def test_dynamic_shapes_of_the_wrong_structure() -> None:
    with pytest.raises(fastonnx.InputError, match="dynamic_shapes has 2 entries but the model gets 1 inputs"):
        fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(2),), dynamic_shapes=({0: "a"}, {0: "b"}))
    with pytest.raises(fastonnx.InputError, match="axis 3 is not an axis of a 1-d tensor"):
        fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(2),), dynamic_shapes=({3: "a"},))
    with pytest.raises(fastonnx.InputError, match="names \\['y'\\], which are not inputs"):
        fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(2),), dynamic_shapes={"y": {0: "a"}})


def test_constraint_violation_is_explained() -> None:
    # a violation with suggested fixes is retried with them (test_capture.py); Dim.DYNAMIC gets none
    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 3) + 1

    with pytest.raises(fastonnx.CaptureError, match="torch.export.export failed on Fixed") as info:
        fastonnx.to_onnx(Fixed(), (torch.randn(2, 3),), dynamic_shapes=({0: Dim.DYNAMIC},))
    assert "Constraints violated" in str(info.value)
    assert "specialized it to be a constant (2)" in str(info.value)


def _cache(layers: int, batch: int, length: int, heads: int, head_dim: int, g: torch.Generator) -> object:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i in range(layers):
        k = torch.randn(batch, heads, length, head_dim, generator=g)
        cache.update(k, torch.randn(batch, heads, length, head_dim, generator=g), i)
    return cache


class DecodeStep(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values: object
    ) -> tuple:
        out = self.m(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return out.logits, out.past_key_values


def test_llama_decoding_with_a_growing_cache() -> None:
    import copy

    llama = tiny_llama(use_cache=True)
    model = DecodeStep(llama).eval()
    cfg = llama.config
    heads, head_dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(1)
    past_len, seq, batch = 3, 2, 2
    cache = _cache(cfg.num_hidden_layers, batch, past_len, heads, head_dim, g)
    ids = torch.randint(0, 256, (batch, seq), generator=g)
    mask = torch.ones(batch, past_len + seq, dtype=torch.int64)
    b, s, p = Dim("batch", min=1, max=16), Dim("seq", min=1, max=256), Dim("past", min=1, max=256)
    kv = [[{0: b, 2: p}, {0: b, 2: p}] for _ in range(cfg.num_hidden_layers)]
    spec = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: "total_len"}, "past_key_values": kv}
    result = fastonnx.to_onnx(model, (ids, mask, cache), dynamic_shapes=spec)
    names = result.input_names
    assert names[:2] == ["input_ids", "attention_mask"] and names[2] == "past_key_values.0.key"
    assert "past_key_values.1.value" in names

    # prefill of 4 tokens on a 1-token cache, then three decode steps, the cache growing each time
    ids = torch.randint(0, 256, (batch, 4), generator=g)
    ort_cache = _cache(cfg.num_hidden_layers, batch, 1, heads, head_dim, g)
    eager_cache = copy.deepcopy(ort_cache)
    for step in range(4):
        length = ort_cache.get_seq_length() + ids.shape[1]
        mask = torch.ones(batch, length, dtype=torch.int64)
        with torch.no_grad():
            exp_logits, eager_cache = model(ids, mask, eager_cache)
        got_logits, ort_cache = result(ids, mask, ort_cache)
        torch.testing.assert_close(got_logits, exp_logits, atol=1e-4, rtol=1e-4, msg=f"step {step}")
        for layer_got, layer_exp in zip(ort_cache.layers, eager_cache.layers):
            torch.testing.assert_close(layer_got.keys, layer_exp.keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(layer_got.values, layer_exp.values, atol=1e-4, rtol=1e-4)
        ids = exp_logits[:, -1:].argmax(-1)
    assert ort_cache.get_seq_length() == 1 + 4 + 3


def test_output_names_follow_the_pytree_path() -> None:
    llama = tiny_llama(use_cache=True)
    model = DecodeStep(llama).eval()
    cfg = llama.config
    g = torch.Generator().manual_seed(2)
    cache = _cache(
        cfg.num_hidden_layers, 1, 2, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads, g
    )
    ids = torch.randint(0, 256, (1, 3), generator=g)
    result = fastonnx.to_onnx(model, (ids, torch.ones(1, 5, dtype=torch.int64), cache))
    onnx.checker.check_model(result.model_proto)
    assert result.output_names[1:3] == ["output.1.0.key", "output.1.0.value"]
