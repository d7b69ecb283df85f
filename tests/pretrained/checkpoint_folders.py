"""Tiny checkpoint folders as users have them: config.json, safetensors weights (one file or shards),
generation_config.json and a tokenizer (a WordLevel vocabulary of the model's size, made with the
``tokenizers`` library). Random weights from a fixed seed; nothing is downloaded."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType
from typing import Any

import torch

VOCAB = 128
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
DECODER = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    # weights of std 0.1 rather than 0.02: greedy generation then varies instead of repeating a token
    "initializer_range": 0.1,
    **TOKENS,
}
# the test suite's decoder architectures (tests/support/model_zoo.py): model type, class, config extras;
# initializer_range per architecture where 0.1 repeats one token or reaches eos within 20 steps
DECODERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("llama", "LlamaForCausalLM", {}),
    "mistral": ("mistral", "MistralForCausalLM", {}),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", {}),
    "phi": ("phi", "PhiForCausalLM", {"num_key_value_heads": 4}),
    "phi3": ("phi3", "Phi3ForCausalLM", {}),
    "gemma": ("gemma", "GemmaForCausalLM", {"head_dim": 16, "initializer_range": 0.3}),
    "gemma3": (
        "gemma3_text",
        "Gemma3ForCausalLM",
        {"head_dim": 16, "sliding_window": 8, "initializer_range": 0.02},
    ),
    "gpt2": ("gpt2", "GPT2LMHeadModel", {}),
    "gpt_neox": ("gpt_neox", "GPTNeoXForCausalLM", {}),
    "opt": ("opt", "OPTForCausalLM", {"ffn_dim": 128, "word_embed_proj_dim": 64, "initializer_range": 0.3}),
    "granite": ("granite", "GraniteForCausalLM", {}),
    "olmo": ("olmo", "OlmoForCausalLM", {"initializer_range": 0.3}),
    "mixtral": ("mixtral", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "gpt_oss": (
        "gpt_oss",
        "GptOssForCausalLM",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "sliding_window": 8},
    ),
}


def save_tokenizer(folder: pathlib.Path, vocab: int = VOCAB) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w3"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="w0", bos_token="w1", eos_token="w2", unk_token="w3"
    )
    fast.save_pretrained(folder)


def save_byte_tokenizer(
    folder: pathlib.Path, specials: list[str], tokenizer_class: str, **roles: str
) -> dict[str, int]:
    """A byte-level BPE without merges, the form onnxruntime-extensions loads (it reads BPE and Unigram
    tokenizers only): every byte a token, its id the byte's value, then ``specials`` from 256 on.
    ``roles`` names the eos, pad... tokens among them; ``tokenizer_class`` is what the tokenizer config
    says (onnxruntime-extensions picks its handling by it). Returns the special tokens' ids."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # GPT-2's byte-to-character table: printable bytes stand for themselves, the others shift past 255
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    shifted = iter(range(256, 512))
    table = {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}
    inner = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    named = set(roles.values())
    fast = PreTrainedTokenizerFast(
        tokenizer_object=inner,
        additional_special_tokens=[t for t in specials if t not in named],
        **{f"{role}_token": token for role, token in roles.items()},
    )
    fast.add_special_tokens({"additional_special_tokens": specials})
    fast.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": tokenizer_class}))
    return {t: int(fast.convert_tokens_to_ids(t)) for t in specials}


def save_checkpoint(
    folder: pathlib.Path,
    model_type: str,
    class_name: str,
    config: dict[str, Any],
    *,
    seed: int = 0,
    shard_size: str | None = None,
    dtype: torch.dtype = torch.float32,
    redraw_std: float | None = None,
) -> torch.nn.Module:
    """Builds ``class_name`` from a config with random weights, saves it (and a tokenizer) to ``folder``;
    returns the model (float32, eval). ``redraw_std`` redraws every matrix at that scale."""
    import transformers
    from transformers import AutoConfig
    from transformers.utils import logging

    logging.set_verbosity_error()
    cfg = AutoConfig.for_model(model_type, **config)
    torch.manual_seed(seed)
    model = getattr(transformers, class_name)(cfg).eval()
    if redraw_std is not None:
        # every matrix redrawn from N(0, redraw_std²) with a seed of its own: tiny seq2seq models at
        # their initial scale repeat one token
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=g) * redraw_std)
    kwargs: dict[str, Any] = {"max_shard_size": shard_size} if shard_size else {}
    model.to(dtype).save_pretrained(folder, **kwargs)
    model.float()
    text = cfg.get_text_config()  # a vision-language config keeps its vocabulary in its text config
    if hasattr(text, "vocab_size"):  # a text model: with its tokenizer
        save_tokenizer(folder, int(text.vocab_size))
    return model


def save_decoder(folder: pathlib.Path, name: str, seed: int = 0) -> torch.nn.Module:
    model_type, class_name, extra = DECODERS[name]
    return save_checkpoint(folder, model_type, class_name, {**DECODER, **extra}, seed=seed)


def architecture_sweep() -> ModuleType:
    """scripts/architecture_sweep.py as a module: its tiny-config maker builds the tests' checkpoints."""
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "architecture_sweep.py"
    spec = importlib.util.spec_from_file_location("architecture_sweep", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export_swept(tmp_path: pathlib.Path, task: str, model_type: str, class_name: str | None = None) -> Any:
    """The architecture sweep's tiny checkpoint of ``model_type`` for ``task`` (its mapping's class unless
    ``class_name``), exported by ``export_pretrained`` with its verification: the written package."""
    import fastonnx

    sweep = architecture_sweep()
    folder = tmp_path / "checkpoint"
    cls = class_name or dict(sweep.architectures(task))[model_type]
    sweep.build_checkpoint(task, model_type, cls, folder)
    return fastonnx.export_pretrained(folder, tmp_path / "package", task, progress=False)
