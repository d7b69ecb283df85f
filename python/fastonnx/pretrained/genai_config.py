"""``genai_config.json``: what onnxruntime-genai reads to run a text-generation package.

The schema is onnxruntime-genai's: ``model`` (its ``type``, token ids, context length, vocabulary size and
``decoder``: the file, its input and output names, heads, head size, hidden size, layers) and ``search``
(the generation defaults). ``type`` is genai's own for the architectures its library knows by name and its
generic ``decoder`` otherwise; the graph is the same either way, the type selects genai's handling of the
model's inputs. ``past_present_share_buffer`` is false: the graph concatenates the past and the new keys
and returns the grown cache, it does not write into a preallocated buffer.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from fastonnx.pretrained.task_inputs import GraphSpec, kv_shape

# transformers model_type -> onnxruntime-genai's model type, where genai names the architecture
GENAI_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "phi": "phi",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3_text",
    "smollm3": "smollm3",
    "granite": "granite",
    "olmo": "olmo",
    "nemotron": "nemotron",
    "internlm2": "internlm2",
}
GENERIC = "decoder"


def _token(value: Any) -> Any:
    """A token id as genai takes it: an int, or a list of ints for several eos ids."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def build_genai_config(
    config: Any, generation: dict[str, Any], spec: GraphSpec, filename: str
) -> dict[str, Any]:
    # the first layer's keys as the model caches them (genai takes one size for every layer)
    kv_heads, head_size = spec.cache_shapes[0][0] if spec.cache_shapes else kv_shape(config)
    layers = len(spec.cache_shapes) if spec.cache_shapes else int(config.num_hidden_layers)
    context = int(
        getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 4096
    )
    names = set(spec.input_names)
    inputs: dict[str, str] = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    if "position_ids" in names:
        inputs["position_ids"] = "position_ids"
    inputs["past_key_names"] = "past_key_values.%d.key"
    inputs["past_value_names"] = "past_key_values.%d.value"
    eos = generation.get("eos_token_id", getattr(config, "eos_token_id", None))
    bos = generation.get("bos_token_id", getattr(config, "bos_token_id", None))
    pad = generation.get("pad_token_id", getattr(config, "pad_token_id", None))
    if pad is None:
        pad = eos[0] if isinstance(eos, list) and eos else eos
    model: dict[str, Any] = {
        "type": GENAI_TYPES.get(str(config.model_type), GENERIC),
        "context_length": context,
        "vocab_size": int(config.vocab_size),
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": filename,
            "head_size": head_size,
            "hidden_size": int(config.hidden_size),
            "num_attention_heads": int(config.num_attention_heads),
            "num_key_value_heads": kv_heads,
            "num_hidden_layers": layers,
            "inputs": inputs,
            "outputs": {
                "logits": "logits",
                "present_key_names": "present.%d.key",
                "present_value_names": "present.%d.value",
            },
        },
    }
    for key, value in (("bos_token_id", bos), ("eos_token_id", eos), ("pad_token_id", pad)):
        if value is not None:
            model[key] = _token(value)
    search = {
        "diversity_penalty": 0.0,
        "do_sample": bool(generation.get("do_sample", False)),
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": int(generation.get("max_length", context) or context),
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": False,
        "repetition_penalty": float(generation.get("repetition_penalty", 1.0)),
        "temperature": float(generation.get("temperature", 1.0)),
        "top_k": int(generation.get("top_k", 50)),
        "top_p": float(generation.get("top_p", 1.0)),
    }
    search["max_length"] = min(search["max_length"], context)
    return {"model": model, "search": search}


def write_genai_config(
    folder: pathlib.Path, config: Any, generation: dict[str, Any], spec: GraphSpec, filename: str
) -> pathlib.Path:
    path = folder / "genai_config.json"
    path.write_text(json.dumps(build_genai_config(config, generation, spec, filename), indent=4) + "\n")
    return path
