"""``genai_config.json``: what onnxruntime-genai reads to run a text-generation package (and a Whisper
package: ``build_whisper_genai_config``).

The schema is onnxruntime-genai's: ``model`` (its ``type``, token ids, context length, vocabulary size and
``decoder``: the file, its input and output names, heads, head size, hidden size, layers) and ``search``
(the generation defaults). ``type`` is genai's own for the architectures its library knows by name and its
generic ``decoder`` otherwise; the graph is the same either way, the type selects genai's handling of the
model's inputs. Layers with convolution and recurrent states (linear attention, state-space models) are found by genai's
decoder from their input names (``past_key_values.%d.conv_state`` / ``.recurrent_state``); layers with
convolution states alone (LFM2) need genai's ``lfm2`` type and its ``layer_types``. ``unmet_contract``
tells a graph genai cannot run. ``past_present_share_buffer`` is false where the graph concatenates the past and the new
keys and returns the grown cache; it is true where every cache is written in place by a GroupQueryAttention
(the onnxruntime level of plain causal decoders: ``shared_cache.py``).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from fastonnx.pretrained.decoder_cache import kv_shape, text_config
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.task_inputs import GENAI_WHISPER_DECODER, GENAI_WHISPER_ENCODER, seq2seq_shape

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
STATES = ("conv_state", "recurrent_state")


def _token(value: Any) -> Any:
    """A token id as genai takes it: an int, or a list of ints for several eos ids."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def _first_set(top: Any, text: Any, name: str) -> Any:
    value = getattr(top, name, None)
    return value if value is not None else getattr(text, name, None)


def unmet_contract(spec: GraphSpec) -> str | None:
    """Why onnxruntime-genai cannot run the graph of ``spec``, or None: its recurrent-state cache takes one
    shape for every layer's states (and both states in each layer, unless the LFM2 cache, conv states
    alone), its key-value cache one (heads, head size) for every layer."""
    if spec.codebooks > 1:
        return f"its input_ids hold {spec.codebooks} rows a sequence (one a codebook), genai's one"
    if spec.stateless:
        return "the model keeps no cache, and genai's decoder types all read and grow one"
    layout = spec.cache_layout or []
    kv = {layer.heads_and_size for layer in layout if layer.heads_and_size is not None}
    states = {
        tuple(layer.shapes.get(f) for f in STATES) for layer in layout if set(STATES) & set(layer.shapes)
    }
    if any(f.startswith(("conv_state_", "recurrent_state_")) for layer in layout for f in layer.shapes):
        return "its layers hold several states each, genai's recurrent state one"
    if any("indexer_key" in layer.shapes for layer in layout):
        return "its layers cache the indexer keys of sparse attention, which genai has no cache for"
    if len(kv) > 1:
        return f"its layers cache keys of several sizes ({', '.join(map(str, sorted(kv)))})"
    if len(states) > 1:
        return "its layers hold states of several shapes"
    if any(conv is None for conv, _ in states):
        return "its layers hold recurrent states without convolution states"
    return None


def build_genai_config(
    config: Any, generation: dict[str, Any], spec: GraphSpec, filename: str, share_buffer: bool = False
) -> dict[str, Any]:
    top, config = config, text_config(config)  # a composite model's text path: its sizes and type
    layout = spec.cache_layout or []
    # the first attention layer's keys as the model caches them (genai takes one size for every layer)
    kv = next((layer.heads_and_size for layer in layout if layer.heads_and_size), None)
    kv_heads, head_size = kv or (kv_shape(config) if hasattr(config, "num_attention_heads") else (0, 0))
    layers = len(layout) if layout else int(config.num_hidden_layers)
    context = context_length(config)
    names = set(spec.input_names)
    inputs: dict[str, str] = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    if "position_ids" in names:
        inputs["position_ids"] = "position_ids"
    # genai finds the layers of each kind by these names (the state names follow from the key ones)
    inputs["past_key_names"] = "past_key_values.%d.key"
    inputs["past_value_names"] = "past_key_values.%d.value"
    outputs = {
        "logits": "logits",
        "present_key_names": "present.%d.key",
        "present_value_names": "present.%d.value",
    }
    decoder: dict[str, Any] = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": filename,
        "head_size": head_size,
        "hidden_size": int(config.hidden_size),
        "num_attention_heads": int(getattr(config, "num_attention_heads", 0) or 0),
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": layers,
        "inputs": inputs,
        "outputs": outputs,
    }
    eos = generation.get("eos_token_id", _first_set(top, config, "eos_token_id"))
    bos = generation.get("bos_token_id", _first_set(top, config, "bos_token_id"))
    pad = generation.get("pad_token_id", _first_set(top, config, "pad_token_id"))
    if pad is None:
        pad = eos[0] if isinstance(eos, list) and eos else eos
    genai_type = GENAI_TYPES.get(str(config.model_type), GENERIC)
    if any("conv_state" in layer.shapes and "recurrent_state" not in layer.shapes for layer in layout):
        # convolution states alone (LFM2): genai's LFM2 cache, which reads the layer kinds from layer_types
        genai_type = "lfm2"
        decoder["layer_types"] = [
            "conv" if "conv_state" in layer.shapes else "full_attention" for layer in layout
        ]
        inputs["past_conv_names"] = "past_key_values.%d.conv_state"
        outputs["present_conv_names"] = "present.%d.conv_state"
    model: dict[str, Any] = {
        "type": genai_type,
        "context_length": context,
        "vocab_size": int(config.vocab_size),
        "decoder": decoder,
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
        "past_present_share_buffer": share_buffer,
        "repetition_penalty": float(generation.get("repetition_penalty", 1.0)),
        "temperature": float(generation.get("temperature", 1.0)),
        "top_k": int(generation.get("top_k", 50)),
        "top_p": float(generation.get("top_p", 1.0)),
    }
    search["max_length"] = min(search["max_length"], context)
    return {"model": model, "search": search}


def context_length(config: Any) -> int:
    """The decoder's context length as genai_config.json gives it: the most positions of a sequence
    (and of the rotary tables a shared-cache package's GroupQueryAttention reads)."""
    return int(
        getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 4096
    )


def write_genai_config(
    folder: pathlib.Path,
    config: Any,
    generation: dict[str, Any],
    spec: GraphSpec,
    filename: str,
    share_buffer: bool = False,
) -> pathlib.Path | str:
    """Writes ``genai_config.json`` into ``folder`` and returns its path, or returns why genai cannot run
    the graph (``unmet_contract``) and writes nothing."""
    unmet = unmet_contract(spec)
    if unmet is not None:
        return f"onnxruntime-genai cannot run this package: {unmet}"
    path = folder / "genai_config.json"
    built = build_genai_config(config, generation, spec, filename, share_buffer)
    path.write_text(json.dumps(built, indent=4) + "\n")
    return path


def _session(filename: str) -> dict[str, Any]:
    return {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": filename}


def build_whisper_genai_config(config: Any, generation: dict[str, Any]) -> dict[str, Any]:
    """genai's ``whisper`` type over ``GENAI_WHISPER_ENCODER`` / ``GENAI_WHISPER_DECODER``: the names are
    those of genai's model builder (task_inputs.genai_whisper). Greedy search by default (``top_k`` 1), as
    the builder writes it; ``max_length`` counts the prompt, and is the decoder's position table."""
    layers, heads, head_size, width = seq2seq_shape(config)
    encoder_heads = int(config.encoder_attention_heads)
    context = int(config.max_target_positions)
    decoder: dict[str, Any] = {
        **_session(GENAI_WHISPER_DECODER),
        "head_size": head_size,
        "hidden_size": width,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "num_hidden_layers": layers,
        "inputs": {
            "input_ids": "input_ids",
            "past_key_names": "past_key_self_%d",
            "past_value_names": "past_value_self_%d",
            "cross_past_key_names": "past_key_cross_%d",
            "cross_past_value_names": "past_value_cross_%d",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present_key_self_%d",
            "present_value_names": "present_value_self_%d",
        },
    }
    encoder: dict[str, Any] = {
        **_session(GENAI_WHISPER_ENCODER),
        "head_size": width // encoder_heads,
        "hidden_size": width,
        "num_attention_heads": encoder_heads,
        "num_key_value_heads": encoder_heads,
        "num_hidden_layers": int(config.encoder_layers),
        "inputs": {"audio_features": "audio_features"},
        "outputs": {
            "encoder_hidden_states": "hidden_states",
            "cross_present_key_names": "present_key_cross_%d",
            "cross_present_value_names": "present_value_cross_%d",
        },
    }
    model: dict[str, Any] = {
        "type": "whisper",
        "context_length": context,
        "vocab_size": int(config.vocab_size),
        "decoder": decoder,
        "encoder": encoder,
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        value = generation.get(key, getattr(config, key, None))
        if value is not None:
            model[key] = _token(value)
    search = {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": context,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": False,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 1,
        "top_p": 1.0,
    }
    return {"model": model, "search": search}


def audio_processor_config(config: Any) -> dict[str, Any]:
    """genai's speech feature extractor (onnxruntime-extensions) for ``create_multimodal_processor``:
    decode the audio, a 400-point STFT at a hop of 160 samples, log-mel over 30 s chunks at the model's
    mel bins: Whisper's features (transformers' WhisperFeatureExtractor: n_fft 400, hop 160, 30 s)."""
    return {
        "feature_extraction": {
            "sequence": [
                {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
                {
                    "operation": {
                        "name": "STFT",
                        "type": "STFTNorm",
                        "attrs": {"n_fft": 400, "frame_length": 400, "hop_length": 160},
                    }
                },
                {
                    "operation": {
                        "name": "log_mel_spectrogram",
                        "type": "LogMelSpectrum",
                        "attrs": {
                            "chunk_size": 30,
                            "hop_length": 160,
                            "n_fft": 400,
                            "n_mel": int(config.num_mel_bins),
                        },
                    }
                },
            ]
        }
    }


def write_whisper_genai_config(
    folder: pathlib.Path, config: Any, generation: dict[str, Any], files: list[str]
) -> pathlib.Path | str:
    """Writes ``genai_config.json`` and ``audio_processor_config.json`` for the genai graphs among
    ``files``, or returns why there are none (genai reads exactly 3000 frames of features)."""
    if GENAI_WHISPER_ENCODER not in files:
        if config.model_type != "whisper":
            return (
                f"onnxruntime-genai runs no {config.model_type} speech model (its speech type is Whisper's)"
            )
        frames = 2 * int(config.max_source_positions)
        return (
            f"onnxruntime-genai cannot run this package: its Whisper reads 3000 frames of features, "
            f"this encoder {frames} (max_source_positions {config.max_source_positions})"
        )
    built = build_whisper_genai_config(config, generation)
    path = folder / "genai_config.json"
    path.write_text(json.dumps(built, indent=4) + "\n")
    processor = json.dumps(audio_processor_config(config), indent=4) + "\n"
    (folder / "audio_processor_config.json").write_text(processor)
    return path
