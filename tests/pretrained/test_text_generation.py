"""text-generation packages (issue 32): ``export_pretrained`` on a checkpoint folder of each decoder
architecture of the suite, loaded by onnxruntime-genai, whose greedy generation must give the same 20
tokens as transformers' ``generate(do_sample=False)`` with the logits of every step within 1e-4.

CI runs Llama and Gemma (Qwen2 at the onnxruntime level); ``FASTONNX_PRETRAINED_ALL=1`` runs every decoder architecture
(docs/guides/pretrained.md records which pass).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import DECODER, DECODERS, save_checkpoint, save_decoder

import fastonnx
from support.matrix import sampled

og = pytest.importorskip("onnxruntime_genai")

# Qwen2 runs in CI at the onnxruntime level (test_onnxruntime_level_writes_into_shared_caches)
CI = ("llama", "gemma")
NAMES = sorted(DECODERS) if os.environ.get("FASTONNX_PRETRAINED_ALL") == "1" else CI
PROMPT = [1, 17, 42, 99, 5, 63, 21]
NEW_TOKENS = 20


def _transformers_greedy(model: torch.nn.Module) -> tuple[list[int], list[torch.Tensor]]:
    ids = torch.tensor([PROMPT])
    out = model.generate(  # type: ignore[operator]
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0, len(PROMPT) :].tolist(), [step[0] for step in out.logits]


def _genai_greedy(package: pathlib.Path) -> tuple[list[int], list[torch.Tensor]]:
    model = og.Model(str(package))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + NEW_TOKENS, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([PROMPT], dtype=np.int32))
    tokens, logits = [], []
    while not generator.is_done():
        logits.append(torch.from_numpy(np.array(generator.get_logits())).reshape(-1))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens, logits


@pytest.mark.parametrize("name", NAMES)
def test_genai_generates_as_transformers(tmp_path: pathlib.Path, name: str) -> None:
    _check_package(tmp_path, save_decoder(tmp_path / "checkpoint", name), name)


def test_bf16_checkpoint_cast_while_streaming(tmp_path: pathlib.Path) -> None:
    """A bf16 checkpoint, its weights cast to the float32 graph's type as they are written
    (``cast_weights=True`` passed on to to_onnx): none of the checkpoint's referenced, all converted.
    Referenced in place: only the float32 buffers the model computes (rotary frequencies), from the
    package's file of what the checkpoint lacks."""
    import onnx

    model = save_checkpoint(
        tmp_path / "checkpoint", "llama", "LlamaForCausalLM", DECODER, dtype=torch.bfloat16
    )
    written = _check_package(tmp_path, model, "llama", cast_weights=True)
    weights = written.stats["model.onnx"]["file"]["weights"]
    proto = onnx.load(str(written.model_path), load_external_data=False)
    locations = [e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"]
    assert "model.safetensors" not in locations and weights["converted_tensors"] > 0, weights
    assert weights["referenced_tensors"] == locations.count("fastonnx_missing.safetensors"), (
        weights,
        locations,
    )


def _check_package(tmp_path: pathlib.Path, saved: torch.nn.Module, name: str, **options: Any) -> Any:
    written = _check_greedy(tmp_path, saved, name, **options)
    layers = saved.config.num_hidden_layers
    assert written.output_names == ["logits"] + [
        f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")
    ]
    return written


def _check_greedy(tmp_path: pathlib.Path, saved: torch.nn.Module, name: str, **options: Any) -> Any:
    """The package of the checkpoint saved in ``tmp_path / "checkpoint"`` verified, with its genai config
    and tokenizer, and its greedy generation in onnxruntime-genai that of transformers."""
    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    # the reference: the checkpoint as transformers loads it (a bf16 one's buffers are computed in float32
    # again, which the model that was saved in bf16 no longer holds)
    model: Any = type(saved).from_pretrained(folder, dtype=torch.float32).eval()  # type: ignore[attr-defined]
    expected_tokens, expected_logits = _transformers_greedy(model)
    # a random tiny model easily repeats one token, which would prove little
    assert len(set(expected_tokens)) >= 5, expected_tokens

    written = fastonnx.export_pretrained(folder, package, progress=False, **options)
    assert written.task == "text-generation"
    assert written.verified is True, written.verify_note
    config = json.loads((package / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["num_hidden_layers"] == model.config.get_text_config().num_hidden_layers
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(written.files)

    tokens, logits = _genai_greedy(package)
    assert tokens == expected_tokens
    assert len(logits) == len(expected_tokens)  # NEW_TOKENS, or fewer where both reach the end token
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"{name} step {step}")
    return written


# windows of 8 positions, which the 7-token prompt and its 20 new tokens pass: Gemma 3 windows its
# sliding_attention layers (both of the tiny one's, local rotary tables), GPT-OSS every other one (with
# attention sinks: the kernel's head_sink); Mistral and Phi-3 every layer
WINDOWED = {"gemma3": {}, "gpt_oss": {}, "mistral": {"sliding_window": 8}, "phi3": {"sliding_window": 8}}


@pytest.mark.parametrize(
    "name", sampled(["llama", "qwen2", *WINDOWED], lambda name: name in ("qwen2", "gpt_oss"))
)
def test_onnxruntime_level_writes_into_shared_caches(tmp_path: pathlib.Path, name: str) -> None:
    """At ``optimize="onnxruntime"`` a plain causal decoder's attention is one GroupQueryAttention a layer
    reading each cache input alone, and genai_config.json shares the past and present buffers: genai then
    hands every layer one buffer of max_length positions and the kernel writes each step into it. The
    package still verifies in onnxruntime (caches of the exact length, as the default level's) and genai's
    greedy generation over the shared buffers is transformers' (tokens, logits within 1e-4): the kernel
    also rotates the queries and keys, from cos / sin tables of the context's positions. A layer attending
    within a sliding window gets it as the kernel's ``local_window_size`` (without it genai's logits
    leave transformers' once the context passes the window), and attention sinks (GPT-OSS) its
    ``head_sink``."""
    import onnx

    model_type, class_name, extra = DECODERS[name]
    folder = tmp_path / "checkpoint"
    saved = save_checkpoint(folder, model_type, class_name, {**DECODER, **extra, **WINDOWED.get(name, {})})
    written = _check_package(tmp_path, saved, name, optimize="onnxruntime")
    config = json.loads((tmp_path / "package" / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    proto = onnx.load(str(written.model_path), load_external_data=False)
    fused = [n for n in proto.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(fused) == DECODER["num_hidden_layers"]
    past = {i.name for i in proto.graph.input if i.name.startswith("past_key_values.")}
    assert {name for n in fused for name in n.input} >= past
    assert not any(
        name in past for n in proto.graph.node if n.op_type != "GroupQueryAttention" for name in n.input
    )
    # the rotary embedding runs in the kernel, from tables of the context's positions and position_ids
    text = saved.config.get_text_config()
    kinds = getattr(text, "layer_types", None) or ["full_attention"] * len(fused)
    windows = [
        text.sliding_window if kind == "sliding_attention" or name in ("mistral", "phi3") else None
        for kind in kinds
    ]
    # every family's: Gemma 3's heads after their q / k norms (which stay, over the heads as the
    # kernel reads them), Phi-3's (its rotary over the whole head concatenates an empty slice) and
    # GPT-OSS's (it rotates the two halves apart, rotary_live's second form)
    # Phi-3's one qkv product (its checkpoint's), sliced apart, is the kernel's packed input; the others'
    # float products stay apart (packed_products packs quantized ones)
    assert all(n.input[1] == "" for n in fused) is (name == "phi3"), [list(n.input[:3]) for n in fused]
    for n, window in zip(fused, windows, strict=True):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs.get("do_rotary") == 1 and n.input[9] == "position_ids", n.input
        assert attrs.get("local_window_size") == window, (n.name, attrs)
        # GPT-OSS's sinks, the per-head initializer its attention concatenates to the scores
        sinks = n.input[11] if len(n.input) > 11 else None
        assert (sinks is not None and sinks.endswith("self_attn.sinks")) is (name == "gpt_oss"), n.input
    assert not any(n.op_type == "RotaryEmbedding" for n in proto.graph.node)
    assert (
        "GroupQueryAttention writing into its cache in place"
        in (tmp_path / "package" / "fastonnx_report.md").read_text()
    )


def test_onnxruntime_level_shares_float16_caches(tmp_path: pathlib.Path) -> None:
    """``dtype="fp16"`` (the default of the GPU targets): the half conversion runs GroupQueryAttention in
    float16 on float16 caches, still read by it alone, so genai shares their buffers; the package verifies at
    the half tolerance and genai's logits over the shared buffers follow transformers' float32 ones within
    it at every step."""
    import onnx

    from fastonnx.pretrained.half_package import half_tolerance

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    model: Any = save_decoder(folder, "llama")
    written = fastonnx.export_pretrained(
        folder, package, optimize="onnxruntime", dtype="fp16", progress=False
    )
    assert written.verified is True, written.verify_note
    config = json.loads((package / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    past = [i for i in proto.graph.input if i.name.startswith("past_key_values.")]
    assert {i.type.tensor_type.elem_type for i in past} == {onnx.TensorProto.FLOAT16}
    assert sum(n.op_type == "GroupQueryAttention" for n in proto.graph.node) == DECODER["num_hidden_layers"]
    _, expected = _transformers_greedy(model.float().eval())
    tokens, logits = _genai_greedy(package)
    assert len(tokens) == NEW_TOKENS
    # the steps genai and transformers both took from the same tokens: the first, and each while they agree
    for step, (got, want) in enumerate(zip(logits, expected, strict=False)):
        atol, rtol = half_tolerance(want)
        torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol, msg=f"step {step}")
        if int(got.argmax()) != int(want.argmax()):
            break


def test_shared_caches_only_for_plain_causal_attention() -> None:
    """The fusion drops the graph's own mask (the kernel applies the causal rule, right-padded lengths and
    a layer's sliding window): it is asked for only where that is the model's whole attention."""
    from transformers import AutoConfig

    from fastonnx.pretrained.shared_cache import plain_causal, sliding_windows, window_inputs

    def config(model_type: str, **fields: Any) -> Any:
        return AutoConfig.for_model(model_type, **DECODER, **fields)

    assert plain_causal(config("llama")) is None
    assert plain_causal(config("qwen2", use_sliding_window=False, sliding_window=16)) is None
    assert sliding_windows(config("qwen2", use_sliding_window=False, sliding_window=16)) == {}
    # windows the kernel applies: every layer's (Mistral), the sliding_attention layers' (Qwen2 past
    # max_window_layers, Gemma 3)
    assert plain_causal(config("mistral", sliding_window=16)) is None
    assert sliding_windows(config("mistral", sliding_window=16)) == {0: 16, 1: 16}
    qwen2 = config("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1)
    assert plain_causal(qwen2) is None and sliding_windows(qwen2) == {1: 16}
    assert window_inputs(qwen2) == {"past_key_values.1.key": 16}
    assert "not one of the model types" in str(plain_causal(config("gemma2")))
    assert "soft-capped" in str(plain_causal(config("llama", attn_logit_softcapping=30.0)))
    chunked = ["chunked_attention", "full_attention"]
    assert "not full or sliding-window attention alone" in str(
        plain_causal(config("qwen3", layer_types=chunked))
    )


def test_int4_package_runs_in_genai(tmp_path: pathlib.Path) -> None:
    """``quantize="int4"`` (to_onnx's weight-only option) gives a package onnxruntime-genai runs; its
    first logits follow the float model's (quantization error only), and verification is skipped with
    its reason (no float tolerance holds for quantized products)."""
    import onnx

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    model = save_decoder(folder, "llama")
    written = fastonnx.export_pretrained(folder, package, quantize="int4", progress=False)
    assert written.verified is None and "quantized (int4)" in written.verify_note
    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    # every product of every layer (attention and MLP), the head left float
    assert (
        sum(n.op_type == "DequantizeLinear" for n in proto.graph.node) == 7 * model.config.num_hidden_layers
    )
    tokens, logits = _genai_greedy(package)
    # greedy decoding runs until the length or the end token (the quantized model may pick it early)
    assert len(tokens) == NEW_TOKENS or (0 < len(tokens) and tokens[-1] == model.config.eos_token_id)
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits[0, -1]
    cosine = torch.nn.functional.cosine_similarity(logits[0], want, dim=0)
    assert cosine > 0.9, float(cosine)  # 0.95 measured; a wrong layout would give ~0
    assert not torch.allclose(logits[0], want, atol=1e-5)  # the weights were quantized


def test_cli_quantize_head_quantizes_the_lm_head_too(tmp_path: pathlib.Path) -> None:
    """``fastonnx export --quantize int4 --quantize-head``: the LM head's product is quantized too (one
    more DequantizeLinear than without, no float head weight read by a MatMul); without --quantize it
    is a usage error."""
    import onnx

    from fastonnx.pretrained import cli

    folder = tmp_path / "checkpoint"
    model = save_decoder(folder, "llama")
    counts = {}
    for flags in ([], ["--quantize-head"]):
        out = tmp_path / f"package{len(flags)}"
        argv = ["export", str(folder), str(out), "--quantize", "int4", "--no-verify", "--no-progress"]
        assert cli.main(argv + flags) == 0
        proto = onnx.load(str(out / "model.onnx"), load_external_data=False)
        counts[len(flags)] = sum(n.op_type == "DequantizeLinear" for n in proto.graph.node)
    # every layer's seven products in both (the MLP's width equals this vocabulary, 128: not a head)
    assert counts[1] == counts[0] + 1 == 7 * model.config.num_hidden_layers + 1
    assert cli.main(["export", str(folder), str(tmp_path / "bad"), "--quantize-head"]) == 2


def test_a_deeper_decoder_is_stamped_and_generates_as_transformers(tmp_path: pathlib.Path) -> None:
    """Four layers: the decode step (KV cache as input, dynamic batch, sequence and past) is captured
    as torch.export of two layers with the others stamped (capture/stamping.py), and onnxruntime-genai
    still generates what transformers generates."""
    model_type, class_name, extra = DECODERS["llama"]
    saved = save_checkpoint(
        tmp_path / "checkpoint",
        model_type,
        class_name,
        {**DECODER, **extra, "num_hidden_layers": 4},
        seed=6,  # greedy tokens with 6 distinct ids (seed 0 repeats one token at 4 layers)
    )
    written = _check_package(tmp_path, saved, "llama, 4 layers")
    (stats,) = [v for v in written.stats.values() if isinstance(v, dict) and "capture" in v]
    assert stats["capture"] == "stamped", stats.get("stamp_refused")
    assert stats["stamped"].startswith("2 of 4 layers")
