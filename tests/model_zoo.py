"""Small models the tests and benches share, built from configs with random weights (no downloads)."""

from __future__ import annotations

import torch


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32),
            torch.nn.ReLU(),
            torch.nn.Linear(32, 32),
            torch.nn.GELU(),
            torch.nn.Linear(32, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(inplace=True),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, stride=2),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.AvgPool2d(2),
            torch.nn.AdaptiveAvgPool2d((1, 1)),
        )
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def with_random_batchnorm_stats(model: torch.nn.Module) -> torch.nn.Module:
    """Fresh BatchNorm layers have mean 0 / var 1, which would hide a wrong normalisation."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model


class Field(torch.nn.Module):
    """A transformers model called with input_ids and attention_mask, returning one field of its output."""

    def __init__(self, model: torch.nn.Module, field: str) -> None:
        super().__init__()
        self.m, self.field = model, field

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return getattr(self.m(input_ids=input_ids, attention_mask=attention_mask), self.field)


class Logits(Field):
    """A causal LM returning only its logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, "logits")


def tiny_llama(layers: int = 2, hidden: int = 64, use_cache: bool = False) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=use_cache,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def tiny_bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return BertModel(cfg).eval()
