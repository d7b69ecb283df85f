"""Parameters on meta, buffers real (issue 32): for every transformers architecture of the test suite, the
model built from its config under ``parameters_on_meta`` has every parameter on the meta device and every
buffer (persistent or not: rotary frequencies, position ids, masks) equal to a real instance's."""

from __future__ import annotations

import pytest
import torch

from fastonnx.pretrained.meta_init import build_on_meta, parameters_on_meta
from support.model_zoo import TRANSFORMERS_MODELS


def _pretrained(module: torch.nn.Module) -> torch.nn.Module:
    from transformers import PreTrainedModel

    for m in module.modules():
        if isinstance(m, PreTrainedModel):
            return m
    raise AssertionError(f"no PreTrainedModel in {type(module).__name__}")


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_MODELS))
def test_buffers_equal_a_real_instance(name: str) -> None:
    inner = _pretrained(TRANSFORMERS_MODELS[name]()[0])
    cls, config = type(inner), inner.config
    torch.manual_seed(0)
    real = cls(config).eval()
    meta = build_on_meta(lambda: cls(config)).eval()
    params = dict(meta.named_parameters())
    assert params and all(p.device.type == "meta" for p in params.values())
    real_params = dict(real.named_parameters())
    assert {n: (p.shape, p.dtype) for n, p in params.items()} == {
        n: (p.shape, p.dtype) for n, p in real_params.items()
    }
    buffers, expected = dict(meta.named_buffers()), dict(real.named_buffers())
    assert list(buffers) == list(expected)
    for key, want in expected.items():
        got = buffers[key]
        assert got.device.type == "cpu", key
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=key)


def test_patch_is_undone_and_keeps_the_parameter_class() -> None:
    class Tagged(torch.nn.Parameter):
        pass

    original = torch.nn.Module.register_parameter
    with parameters_on_meta():
        layer = torch.nn.Linear(4, 3)
        layer.register_parameter("extra", Tagged(torch.ones(2), requires_grad=False))
    assert torch.nn.Module.register_parameter is original
    assert layer.weight.device.type == "meta" and layer.weight.requires_grad
    assert type(layer.extra) is Tagged and not layer.extra.requires_grad and layer.extra.device.type == "meta"
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"  # after the block: real again


def test_memory_stays_far_below_the_model() -> None:
    """A 1.2 GiB (float32) Llama built from its config takes memory for its buffers, not its weights:
    each parameter exists on the CPU only as untouched ``torch.empty`` pages before it moves to meta
    (17.6 MiB measured, import caches included)."""
    import transformers
    from transformers import AutoConfig

    from support.memory import peak_extra_bytes

    config = AutoConfig.for_model(
        "llama",
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
    )
    built: list[torch.nn.Module] = []
    extra = peak_extra_bytes(
        lambda: built.append(build_on_meta(lambda: transformers.LlamaForCausalLM(config)))
    )
    weights = sum(p.numel() * p.element_size() for p in built[0].parameters())
    assert weights > 2**30
    largest = max(p.numel() * p.element_size() for p in built[0].parameters())  # the embedding, 250 MiB
    assert extra < largest // 4, (extra, largest)
