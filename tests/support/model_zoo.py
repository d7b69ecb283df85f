"""Small models the tests and benches share, built from configs with random weights (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


class Wide(torch.nn.Module):
    """Linear layers of width 4096 holding about ``n_bytes`` of weights (memory and big-model tests)."""

    def __init__(self, n_bytes: int, dtype: torch.dtype) -> None:
        super().__init__()
        width = 4096
        itemsize = torch.empty((), dtype=dtype).element_size()
        layers = max(1, n_bytes // (width * width * itemsize))
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(width, width, bias=False, dtype=dtype) for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def with_calibrated_batchnorm(
    model: torch.nn.Module, side: int, batches: int = 4, batch_size: int = 4
) -> torch.nn.Module:
    """BatchNorm statistics measured on random images, as training would give, and random affine terms.

    A fresh BatchNorm (mean 0, var 1, weight 1, bias 0) is nearly the identity, which would hide a wrong
    normalisation; random statistics instead make deep nets' activations grow layer by layer (logits
    ~1e6), so that a comparison must scale its tolerance by the largest logit. Here each layer's weight
    and bias are drawn at random (weight in [0.5, 1.5], bias ~ N(0, 0.1²): timm zero-initialises the
    last BatchNorm of each residual block, which would leave that branch out), then a few training-mode
    passes on random ``side``-pixel images (fixed seed) set each layer's running mean and variance to the
    average of its batches' (momentum None): per-channel statistics that differ from 0 / 1, and
    activations of order 1 throughout, so logits are O(1) and compared with tight absolute tolerances.
    Returns the model in eval mode.
    """
    g = torch.Generator().manual_seed(0)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    with torch.no_grad():
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
            if m.affine:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
        if norms:
            model.train()
            for _ in range(batches):
                model(torch.randn(batch_size, 3, side, side, generator=g))
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    return model.eval()


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


def decode_step_shapes(
    layers: int, seq_max: int = 4096, past_min: int = 1, past_max: int = 8192
) -> dict[str, Any]:
    """DecodeStep's dynamic shapes: batch, new tokens and past dynamic, the mask's length left to torch
    (past + new: torch finds the relation), each of ``layers`` cache entries' keys and values."""
    from torch.export import Dim

    b, s = Dim("batch", min=1, max=64), Dim("seq", min=1, max=seq_max)
    p = Dim("past", min=past_min, max=past_max)
    return {
        "input_ids": {0: b, 1: s},
        "attention_mask": {0: b, 1: Dim.DYNAMIC},
        "position_ids": {0: b, 1: s},
        "past": [{"key": {0: b, 2: p}, "value": {0: b, 2: p}} for _ in range(layers)],
    }


class DecodeStep(torch.nn.Module):
    """One call of generation with a KV cache: logits and the grown cache (tests/models/test_decode_steps.py,
    benches/decode.py)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, past: Any
    ) -> Any:
        out = self.m(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past,
            use_cache=True,
        )
        return out.logits, out.past_key_values


class Seq2SeqDecodeStep(torch.nn.Module):
    """One decoder call of a seq2seq model's generation (T5, BART, Whisper): the encoder's states and
    mask, the new decoder ids and an EncoderDecoderCache in; logits and the grown cache out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_key_values: Any,
    ) -> Any:
        out = self.m(
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=encoder_attention_mask,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return out.logits, out.past_key_values


def ladder_llama(layers: int, hidden: int) -> torch.nn.Module:
    """A rung of the benches' Llama ladder (benches/compare.py): LAYERS x HIDDEN, 32000 tokens, heads of
    64, a quarter of them key-value heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(4, hidden // 64)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        max_position_embeddings=2048,
        use_cache=False,
    )
    with torch.no_grad():
        return LlamaForCausalLM(cfg).eval()


def tied_llama_config():  # type: ignore[no-untyped-def]
    """The tiny Llama the checkpoint-in-place tests save and reload (lm_head tied to the embedding)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=False,
        tie_word_embeddings=True,  # lm_head shares the embedding: saved once in the checkpoint
    )


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


# ---- transformers architectures from tiny configs ------------------------------------------------
# Token ids 0..2 are pad/bos/eos in every tiny config; inputs use ids >= 3.
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
TEXT = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 72,
    **TOKENS,
}
SEQ2SEQ = {
    "vocab_size": 128,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
    **TOKENS,
}
VISION = {
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}


class Seq2SeqLogits(torch.nn.Module):
    """An encoder-decoder LM called with encoder ids, their mask and decoder ids."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoder_ids: torch.Tensor
    ) -> Any:
        return self.m(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_ids
        ).logits


class Hidden(torch.nn.Module):
    """A vision or audio encoder returning its last hidden state."""

    def __init__(self, model: torch.nn.Module, keyword: str) -> None:
        super().__init__()
        self.m, self.keyword = model, keyword

    def forward(self, x: torch.Tensor) -> Any:
        return self.m(**{self.keyword: x}).last_hidden_state


class VisionLanguage(torch.nn.Module):
    """A LLaVA-style model: token ids with image placeholders, their mask and the images."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixels: torch.Tensor) -> Any:
        return self.m(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixels).logits


def _text_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0  # right padding exercises the attention mask
    return ids, mask


def _config(model_type: str, **kwargs: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **kwargs)


def _build(cls_name: str, cfg: Any) -> torch.nn.Module:
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()  # tiny configs trip harmless vocabulary warnings
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(cfg).eval()


def causal_lm(model_type: str, cls_name: str, **extra: Any) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    return Logits(_build(cls_name, _config(model_type, **{**TEXT, **extra}))), _text_inputs()


def encoder(model_type: str, cls_name: str, **cfg: Any) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    return Field(_build(cls_name, _config(model_type, **cfg)), "last_hidden_state"), _text_inputs()


def seq2seq(model_type: str, cls_name: str, **cfg: Any) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    decoder_ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    return Seq2SeqLogits(_build(cls_name, _config(model_type, **cfg))), (*_text_inputs(), decoder_ids)


def vision(model_type: str, cls_name: str, **cfg: Any) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    # BatchNorm (MobileViT): its initial statistics let activations shrink to 0 by the last layer
    model = with_calibrated_batchnorm(
        Hidden(_build(cls_name, _config(model_type, **cfg)), "pixel_values"), 32
    )
    return model, (pixels,)


def whisper_encoder() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    cfg = _config("whisper", **SEQ2SEQ, num_mel_bins=16, max_source_positions=16)
    features = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4))
    return Hidden(_build("WhisperModel", cfg).get_encoder(), "input_features"), (features,)


def llava() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision_cfg = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
        projection_dim=32,
    )
    text_cfg = LlamaConfig(**{**TEXT, "vocab_size": 160})
    image_token = 150
    cfg = LlavaConfig(vision_config=vision_cfg, text_config=text_cfg, image_token_id=image_token)
    patches = (16 // 4) ** 2  # the 'default' feature strategy drops CLS: one token per patch
    ids = torch.tensor([[5, 6, *[image_token] * patches, 7, 8], [9, 10, *[image_token] * patches, 11, 12]])
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    return VisionLanguage(_build("LlavaForConditionalGeneration", cfg)), (ids, torch.ones_like(ids), pixels)


# name -> builder returning (module, example inputs); each builds a tiny config with random weights
TRANSFORMERS_MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    "llama": lambda: causal_lm("llama", "LlamaForCausalLM"),
    "mistral": lambda: causal_lm("mistral", "MistralForCausalLM"),
    "qwen2": lambda: causal_lm("qwen2", "Qwen2ForCausalLM"),
    "phi": lambda: causal_lm("phi", "PhiForCausalLM", num_key_value_heads=4),
    "phi3": lambda: causal_lm("phi3", "Phi3ForCausalLM"),
    "gemma": lambda: causal_lm("gemma", "GemmaForCausalLM", head_dim=8),
    "gemma3": lambda: causal_lm("gemma3_text", "Gemma3ForCausalLM", head_dim=8, sliding_window=4),
    "gpt2": lambda: causal_lm("gpt2", "GPT2LMHeadModel"),
    "gpt_neox": lambda: causal_lm("gpt_neox", "GPTNeoXForCausalLM"),
    "opt": lambda: causal_lm("opt", "OPTForCausalLM", ffn_dim=64, word_embed_proj_dim=32),
    "granite": lambda: causal_lm("granite", "GraniteForCausalLM"),
    "olmo": lambda: causal_lm("olmo", "OlmoForCausalLM"),
    "mixtral": lambda: causal_lm("mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "bert": lambda: encoder("bert", "BertModel", **TEXT),
    "roberta": lambda: encoder("roberta", "RobertaModel", **TEXT),
    "xlm-roberta": lambda: encoder("xlm-roberta", "XLMRobertaModel", **TEXT),
    "distilbert": lambda: encoder(
        "distilbert",
        "DistilBertModel",
        vocab_size=128,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=64,
        pad_token_id=0,
    ),
    "t5": lambda: seq2seq(
        "t5",
        "T5ForConditionalGeneration",
        vocab_size=128,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        **TOKENS,
    ),
    "bart": lambda: seq2seq("bart", "BartForConditionalGeneration", **SEQ2SEQ),
    "marian": lambda: seq2seq("marian", "MarianMTModel", **SEQ2SEQ),
    "vit": lambda: vision("vit", "ViTModel", **VISION),
    "beit": lambda: vision("beit", "BeitModel", **VISION),
    "swin": lambda: vision(
        "swin",
        "SwinModel",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
    "convnext": lambda: vision(
        "convnext", "ConvNextModel", hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32
    ),
    "mobilevit": lambda: vision(
        "mobilevit",
        "MobileViTModel",
        image_size=32,
        patch_size=2,
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
        num_attention_heads=2,
    ),
    "yolos": lambda: vision(
        "yolos", "YolosModel", **{**VISION, "image_size": [32, 32], "num_detection_tokens": 5}
    ),
    "whisper-encoder": whisper_encoder,
    "llava": llava,
}


class SpeechEncoder(torch.nn.Module):
    """A small speech-style encoder: log-mel frames (batch, mels, frames) through a strided conv1d
    front end, a two-layer bidirectional LSTM and a linear head giving per-frame token logits."""

    def __init__(self, mels: int = 16, channels: int = 24, hidden: int = 20, tokens: int = 12) -> None:
        super().__init__()
        self.front = torch.nn.Sequential(
            torch.nn.Conv1d(mels, channels, kernel_size=3, padding=1),
            torch.nn.GELU(),
            torch.nn.Conv1d(channels, channels, kernel_size=3, stride=2, padding=1),
            torch.nn.GELU(),
        )
        self.lstm = torch.nn.LSTM(
            channels, hidden, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1
        )
        self.head = torch.nn.Linear(2 * hidden, tokens)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.front(features).transpose(1, 2)  # (batch, frames / 2, channels)
        x, _ = self.lstm(x)
        return self.head(x).log_softmax(-1)


class GRUTagger(torch.nn.Module):
    """A GRU sequence model: token embeddings, a two-layer GRU started from a learned state, and a
    per-step classifier; it also returns the last hidden state."""

    def __init__(self, vocab: int = 50, dim: int = 16, hidden: int = 24, classes: int = 5) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.gru = torch.nn.GRU(dim, hidden, num_layers=2)
        self.h0 = torch.nn.Parameter(torch.randn(2, 1, hidden) * 0.5)
        self.out = torch.nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(tokens)  # (seq, batch, dim)
        h0 = self.h0.expand(-1, tokens.shape[1], -1).contiguous()
        y, h = self.gru(x, h0)
        return self.out(y), h
