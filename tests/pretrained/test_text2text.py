"""text2text-generation packages (T5, BART, Marian) and automatic-speech-recognition (Whisper): ``export_pretrained`` writes the encoder, the
decoder's first step and the decoder with its past; a greedy loop in plain onnxruntime over the three
files gives the same 20 tokens as transformers' ``generate(do_sample=False)`` (at least 5 distinct), every
step's logits within 1e-3 of the largest: the matrices are redrawn at std 1 (tiny seq2seq models at their
initial scale repeat one token), which makes the activations large and float32 rounding grow with the
steps (BART: 2e-4 of the largest logit at step 10)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import TOKENS, VOCAB, save_checkpoint

import fastonnx
from support.matrix import sampled

BART = {
    "vocab_size": VOCAB,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_position_embeddings": 64,
    **TOKENS,
}
T5 = {"vocab_size": VOCAB, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4, **TOKENS}
# name -> (model type, class, config, seed); weights redrawn at std 1 (see checkpoint_folders) with a seed
# whose greedy output holds at least 5 distinct tokens
MODELS: dict[str, tuple[str, str, dict[str, Any], int]] = {
    "t5": ("t5", "T5ForConditionalGeneration", {**T5, "decoder_start_token_id": 0}, 1),
    "bart": ("bart", "BartForConditionalGeneration", {**BART, "decoder_start_token_id": 2}, 1),
    "marian": ("marian", "MarianMTModel", {**BART, "decoder_start_token_id": 0}, 16),
}
SOURCE = [[5, 17, 42, 99, 23, 63, 88, 2]]
NEW_TOKENS = 20


def speech_greedy(
    model: Any, features: torch.Tensor, prompt: list[int], new_tokens: int, eos: int | None = None
) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy loop over a speech seq2seq model's forward from ``prompt``: ``new_tokens``
    tokens, or fewer where one is ``eos``; each step's last logits."""
    tokens: list[int] = []
    logits: list[torch.Tensor] = []
    cache, decoder_ids = None, torch.tensor([prompt])
    with torch.no_grad():
        states = model.get_encoder()(input_features=features)
        for _ in range(new_tokens):
            out = model(
                encoder_outputs=states, decoder_input_ids=decoder_ids, past_key_values=cache, use_cache=True
            )
            cache, decoder_ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
            tokens.append(int(decoder_ids))
            logits.append(out.logits[0, -1])
            if tokens[-1] == eos:
                break
    return tokens, logits


def _onnxruntime_greedy(
    package: pathlib.Path,
    start: int,
    layers: int,
    encoder_feeds: dict[str, np.ndarray[Any, Any]] | None = None,
) -> tuple[list[int], list[torch.Tensor]]:
    def session(name: str) -> ort.InferenceSession:
        return ort.InferenceSession(str(package / name), providers=["CPUExecutionProvider"])

    encoder, first, with_past = (
        session("encoder_model.onnx"),
        session("decoder_model.onnx"),
        session("decoder_with_past_model.onnx"),
    )
    if encoder_feeds is None:
        ids = np.array(SOURCE, dtype=np.int64)
        encoder_feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    (states,) = encoder.run(None, encoder_feeds)
    mask = encoder_feeds.get("attention_mask", np.ones(states.shape[:2], dtype=np.int64))
    feeds = {
        "decoder_input_ids": np.array([[start]], dtype=np.int64),
        "encoder_hidden_states": states,
        "encoder_attention_mask": mask,
    }
    outputs = first.run(None, feeds)
    tokens, logits = [], []
    for step in range(NEW_TOKENS):
        step_logits = outputs[0][0, -1]
        logits.append(torch.from_numpy(step_logits.copy()))
        tokens.append(int(step_logits.argmax()))
        if step == NEW_TOKENS - 1:
            break
        names = [o.name for o in with_past.get_outputs()][1:]
        past = {
            n.replace("present", "past_key_values", 1): v for n, v in zip(names, outputs[1:], strict=True)
        }
        assert len(past) == 4 * layers
        feeds = {**feeds, "decoder_input_ids": np.array([[tokens[-1]]], dtype=np.int64), **past}
        outputs = with_past.run(None, feeds)
    return tokens, logits


# Marian (BART's layers, sinusoidal positions) under FASTONNX_FULL_MATRIX=1
@pytest.mark.parametrize("name", sampled(sorted(MODELS), lambda name: name == "t5"))
def test_onnxruntime_greedy_loop_matches_generate(tmp_path: pathlib.Path, name: str) -> None:
    import transformers
    from transformers import GenerationConfig

    model_type, class_name, config, seed = MODELS[name]
    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    save_checkpoint(folder, model_type, class_name, config, seed=seed, redraw_std=1.0)
    # the reference is the checkpoint as transformers loads it (Marian's position tables are not saved:
    # from_pretrained computes them)
    model: Any = getattr(transformers, class_name).from_pretrained(folder, dtype=torch.float32).eval()
    start = int(model.config.decoder_start_token_id)
    # plain greedy, as the loop below: no token forced at the first or last step (BART's defaults)
    model.generation_config.forced_bos_token_id = None
    model.generation_config.forced_eos_token_id = None
    generation = GenerationConfig(
        decoder_start_token_id=start, max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1, pad_token_id=0
    )
    ids = torch.tensor(SOURCE)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        generation_config=generation,
        output_logits=True,
        return_dict_in_generate=True,
    )
    expected_tokens = out.sequences[0, 1:].tolist()
    assert len(expected_tokens) == NEW_TOKENS and len(set(expected_tokens)) >= 5, expected_tokens

    written = fastonnx.export_pretrained(folder, package, progress=False)
    assert written.task == "text2text-generation"
    assert written.verified is True, written.verify_note
    assert set(written.graphs) == {"encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"}
    layers = 2
    tokens, logits = _onnxruntime_greedy(package, start, layers)
    assert tokens == expected_tokens
    for step, (got, want) in enumerate(zip(logits, out.logits, strict=True)):
        scale = float(want.abs().max())
        torch.testing.assert_close(
            got, want[0], atol=1e-3 * scale, rtol=1e-4, msg=lambda m, s=step: f"{name} step {s}: {m}"
        )


def test_whisper_onnxruntime_greedy_loop_matches_transformers(tmp_path: pathlib.Path) -> None:
    """Whisper through ``automatic-speech-recognition``: the same three files, the encoder reading
    log-mel features. The reference is transformers' own greedy loop over the model's forward (Whisper's
    ``generate`` adds language and task tokens of its own)."""
    import transformers

    config = {
        **BART,
        "max_target_positions": 64,
        "num_mel_bins": 16,
        "max_source_positions": 16,
        "decoder_start_token_id": 1,
    }
    config.pop("max_position_embeddings")
    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    save_checkpoint(folder, "whisper", "WhisperForConditionalGeneration", config, seed=0, redraw_std=1.0)
    model: Any = transformers.WhisperForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32
    ).eval()
    features = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(3))
    expected_tokens, expected_logits = speech_greedy(model, features, [1], NEW_TOKENS)
    assert len(set(expected_tokens)) >= 5, expected_tokens

    written = fastonnx.export_pretrained(folder, package, progress=False)
    assert written.task == "automatic-speech-recognition"
    assert written.verified is True, written.verify_note
    assert written.input_names == ["input_features"]
    tokens, logits = _onnxruntime_greedy(package, 1, 2, {"input_features": features.numpy()})
    assert tokens == expected_tokens
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        scale = float(want.abs().max())
        torch.testing.assert_close(
            got, want, atol=1e-3 * scale, rtol=1e-4, msg=lambda m, s=step: f"step {s}: {m}"
        )
