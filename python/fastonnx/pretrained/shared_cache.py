"""KV caches shared with onnxruntime-genai: a text-generation package at the onnxruntime level whose
attention is ``com.microsoft.GroupQueryAttention`` over cache buffers of the maximum length.

Why: with ``past_present_share_buffer`` genai hands every layer one buffer of ``max_length`` positions as
both its past and its present, and the kernel writes the step's keys and values into it in place. The
plain graph concatenates past and new keys, which copies the whole cache at every step: at 8 layers of a
Llama with 4 key-value heads of 64 and a past of 2048 that copy was a third of a one-thread decode step
(``benches/decode_profile.py``).

What it changes: the kernel takes its lengths from the attention mask (``seqlens_k`` = a row's sum - 1,
the total = the mask's length), applies the causal rule itself and reads right-padded rows, as the
onnxruntime-genai model builder's packages do. A left-padded batch run through onnxruntime directly needs
the default level's package, which keeps the mask as given. So the fusion is asked for only where the
model's attention is exactly that: every layer causal attention over a KV cache, whole or within a sliding
window the kernel applies (``local_window_size``), attention sinks (GPT-OSS's) as its ``head_sink``; no
soft-capping, no attention biases: ``plain_causal``), at float32 or float16 (the half
conversion runs the fused node in float16 on float16 caches; onnxruntime has no bfloat16 kernel of it on
the CPU), and it is checked on the written graph: every cache input read by one
``GroupQueryAttention`` and nothing else (``unshared_reason``). Where either fails the package keeps the
concatenating form, genai's ``past_present_share_buffer`` stays false, and the report says why.
"""

from __future__ import annotations

import collections
import pathlib
from typing import Any

from fastonnx.pretrained.decoder_cache import text_config
from fastonnx.pretrained.graph_spec import GraphSpec

MASK = "attention_mask"

# the transformers model types whose decoder attention is plain causal (rotary or none) over a KV cache,
# as their configs can set it; a config field below can still rule one out
PLAIN_CAUSAL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "phi3",
        "gemma",
        "gemma3_text",
        "gpt_oss",  # its sinks are the fused node's head_sink
        "granite",
        "olmo",
        "olmo2",
        "smollm3",
        "internlm2",
        "nemotron",
    }
)


def plain_causal(config: Any) -> str | None:
    """None when the text model's every layer is causal attention the fused kernel computes: over the
    whole past, or over a sliding window of it (``sliding_windows``); otherwise why not."""
    text = text_config(config)
    model_type = str(getattr(text, "model_type", ""))
    if model_type not in PLAIN_CAUSAL_TYPES:
        return f"{model_type!r} is not one of the model types whose attention is known to be plain causal"
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if not kinds <= {"full_attention", "sliding_attention"}:
        return f"its layers are {sorted(kinds)}, not full or sliding-window attention alone"
    if getattr(text, "attn_logit_softcapping", None):
        return "its attention logits are soft-capped"
    windows = sliding_windows(config)
    if isinstance(windows, str):
        return windows
    return None


def sliding_windows(config: Any) -> dict[int, int] | str:
    """The sliding window of each layer that attends within one, by layer index: the positions a query
    attends to, its own included (transformers' ``sliding_window``, which onnxruntime's
    ``local_window_size`` counts alike). ``layer_types`` names the windowed layers where the config has
    it (Gemma 3, Qwen2 past ``max_window_layers``); without it a set ``sliding_window`` windows every layer
    (Mistral, Phi-3), as their attention masks do. A string: why the window cannot be given."""
    text = text_config(config)
    window = getattr(text, "sliding_window", None)
    layers = int(getattr(text, "num_hidden_layers", 0))
    kinds = getattr(text, "layer_types", None)
    if kinds is not None:
        windowed = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
    elif window is not None and getattr(text, "use_sliding_window", True) is not False:
        windowed = list(range(layers))
    else:
        windowed = []
    if not windowed:
        return {}
    if not (isinstance(window, int) and not isinstance(window, bool) and window >= 1):
        return f"its layers {windowed} attend within a sliding window of {window!r}, not a positive int"
    return dict.fromkeys(windowed, window)


def window_inputs(config: Any) -> dict[str, int]:
    """``sliding_windows`` by the past-key input each windowed layer reads (the builder's
    ``set_shared_cache_windows``)."""
    windows = sliding_windows(config)
    return {} if isinstance(windows, str) else {f"past_key_values.{i}.key": w for i, w in windows.items()}


def wanted(
    config: Any, spec: GraphSpec, options: dict[str, Any], dtype: str | None, keep_io_types: bool = False
) -> str | None:
    """The mask input to name for the fusion, or None when the package keeps the concatenating form
    (also with ``keep_io_types``: float32 caches cast to float16 are no buffers genai can share, and
    onnxruntime's kernel would write its present into the Cast's buffer)."""
    if options.get("optimize") != "onnxruntime" or dtype == "bf16" or spec.stateless or keep_io_types:
        return None
    if MASK not in spec.input_names or plain_causal(config) is not None:
        return None
    return MASK


def unshared_reason(model_path: pathlib.Path, spec: GraphSpec) -> str | None:
    """None when every cache input of the written decoder is read by one GroupQueryAttention alone (so
    genai may share its buffers with the present outputs); otherwise why not."""
    import onnx  # imported when a package is written, not with fastonnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    caches = [name for name in spec.input_names if name.startswith("past_key_values.")]
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            if name in caches:
                readers[name].append(node.op_type)
    for name in caches:
        if readers[name] != ["GroupQueryAttention"]:
            found = ", ".join(readers[name]) or "nothing"
            return f"cache input {name} is read by {found}, not one GroupQueryAttention alone"
    return None


def report(unshared: str | None) -> str:
    """The package report's paragraph on the caches."""
    if unshared is None:
        return (
            "KV caches: every layer's attention is one com.microsoft.GroupQueryAttention writing into its cache "
            "in place; genai_config.json shares the past and present buffers (past_present_share_buffer). The "
            "lengths come from attention_mask (right-padded rows, as genai gives them). Where the rotary embedding is "
            "the default position_ids x inv_freq form, the kernel rotates the queries and keys itself from cos / sin "
            "tables of the context's positions (onnxruntime refuses a longer sequence) and reads the packed "
            "query-key-value product."
        )
    return (
        f"KV caches: concatenated at every step, past_present_share_buffer false: {unshared} (the fusion into "
        "GroupQueryAttention did not take every layer)."
    )
