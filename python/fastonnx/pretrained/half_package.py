"""``export_pretrained(dtype="fp16" | "bf16")``: a one-graph package (text-generation, encoders) computing
in half precision.

The graph is exported in float32 as always (weights referenced in place), then run once in onnxruntime
on calibration inputs (the verification's: for text-generation a prefill of 5 tokens, batch 2, and one
decode step; an encoder's batch of 2) with every intermediate value an output, which records each
value's largest magnitude; the graph is
then converted by ``fastonnx.half_precision.convert`` (what overflows or loses its meaning in half
precision stays float32) and written over the float32 one. The report says what stayed float32, why,
and the share of MatMul work in the half type.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import torch

from fastonnx import half_precision
from fastonnx.errors import InputError
from fastonnx.pretrained.decoder_cache import config_layout, filled_cache, flat_tensors, text_config
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.task_inputs import decoder_inputs, decoder_start

log = logging.getLogger("fastonnx")

CALIBRATION = (2, 5)  # batch, prompt length


HALF_RELATIVE = 2e-2
"""A half package's verification against transformers' float32: each value within 2e-2 of its tensor's
largest magnitude, rtol 2e-2. float16 rounds each stored value by up to 2^-11 of it and the errors add up
over the layers: tiny decoders land within 2e-3, a BART whose weights are drawn at std 1 at 1.3e-2
(transformers itself in float16: 2.1e-2); a wrong value (a missing bias or norm) is off by far more."""


def half_tolerance(expected: torch.Tensor) -> tuple[float | None, float | None]:
    """(atol, rtol) of a half package's comparison with ``expected``."""
    top = float(expected.detach().abs().max()) if expected.numel() else 0.0
    return HALF_RELATIVE * max(top, 1e-3), HALF_RELATIVE


def float32_tolerance(expected: torch.Tensor) -> tuple[float | None, float | None]:
    """fastonnx's own float32 tolerances (verdicts.tolerances)."""
    del expected
    return None, None


def check_options(task: str, dtype: Any, keep_io_types: Any, options: dict[str, Any]) -> None:
    """The options' checks before anything is read (``options``: the others, to_onnx's)."""
    if not isinstance(keep_io_types, bool):
        raise InputError(f"keep_io_types must be True or False, got {keep_io_types!r}")
    if dtype is None:
        if keep_io_types:
            raise InputError("keep_io_types keeps float32 inputs and outputs of a half graph: give dtype too")
        return
    half_precision.half_type(dtype)
    if options.get("cast_weights"):
        raise InputError(
            f"dtype={dtype!r} with cast_weights: the weights would be written float32 and read through "
            "Casts; leave cast_weights off (the stored tensors are then read through a Cast to the half "
            "type, folded at load)"
        )


SEQ2SEQ_FILES = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
WHISPER_GENAI_FILES = ("genai_encoder.onnx", "genai_decoder.onnx")
"""Whisper's onnxruntime-genai files beside its three (task_inputs.GENAI_WHISPER_ENCODER / _DECODER)."""
VISION_LANGUAGE_FILES = ("vision_encoder.onnx", "embed_tokens.onnx", "decoder_model_merged.onnx")
"""image-text-to-text's three files (vision_language.py's VISION_FILE, EMBED_FILE, DECODER_FILE)."""


def converts(specs: dict[str, GraphSpec], model: Any = None) -> bool:
    """Whether a package of ``specs`` is converted to a half type: one graph, text2text's three files, or
    image-text-to-text's three in their common form (a model with a layout of its own, one of the
    ``own_layout`` modules', has files that feed one another otherwise: not yet)."""
    if len(specs) == 1 or tuple(specs) in (SEQ2SEQ_FILES, SEQ2SEQ_FILES + WHISPER_GENAI_FILES):
        return True
    return tuple(specs) == VISION_LANGUAGE_FILES and model is not None and not _own_vision_layout(model)


def _own_vision_layout(model: Any) -> bool:
    from fastonnx.pretrained import (
        cross_attention_vlms,
        gated_cross_attention,
        image_prefix,
        minicpm_vlms,
        molmo_vlms,
        padded_patch_vlms,
    )

    kinds = (cross_attention_vlms, gated_cross_attention, image_prefix, minicpm_vlms, molmo_vlms)
    return any(k.own_layout(model) for k in (*kinds, padded_patch_vlms))


def check_specs(dtype: str, task: str, specs: dict[str, GraphSpec], model: Any = None) -> None:
    """A package of several graphs other than text2text's three and image-text-to-text's common three
    (Whisper's genai files, a vision-language model of its own layout) is refused once its graphs are
    known."""
    if not converts(specs, model):
        name = type(model).__name__ if model is not None else task
        raise InputError(
            f"dtype={dtype!r} is supported for one-graph packages, text2text's three files and "
            f"image-text-to-text's three in their common form only so far, not {name}'s {task} package "
            f"({', '.join(specs)})"
        )


def seq2seq_feeds(
    folder: pathlib.Path, specs: dict[str, GraphSpec], config: Any, model: Any
) -> dict[str, list[dict[str, Any]]]:
    """Calibration inputs of text2text's three float32 files, as verification runs them: the encoder on
    a batch of 2 (right-padded text, or audio features), the first decoder step on its states, one step
    with past on the cache the first returned (both run in onnxruntime for it); Whisper's genai files
    beside them likewise (whisper_genai_steps.py)."""
    import onnxruntime as ort

    from fastonnx.pretrained.encoder_tasks import audio_inputs, text_inputs
    from fastonnx.pretrained.task_inputs import seq2seq_sides

    def session(name: str) -> Any:
        return ort.InferenceSession(os.fspath(folder / name), providers=["CPUExecutionProvider"])

    encoder_names = specs[SEQ2SEQ_FILES[0]].input_names
    mask = None
    if encoder_names == ["input_ids", "attention_mask"]:
        sides = seq2seq_sides(config)
        text = text_inputs(config if sides is None else sides[0], CALIBRATION[0], 7, "cpu", False)
        encoder = {k: v.numpy() for k, v in text.items()}
        mask = encoder["attention_mask"]
    elif encoder_names in (["input_features"], ["input_values"]):  # speech: the check's audio
        audio, _ = audio_inputs(model, config, CALIBRATION[0], "cpu")
        encoder = {k: v.numpy() for k, v in audio.items()}
    else:
        raise InputError(f"dtype= for a seq2seq encoder reading {encoder_names} is not supported yet")
    (states,) = session(SEQ2SEQ_FILES[0]).run(None, encoder)
    if mask is None:
        mask = np.ones(states.shape[:2], np.int64)
    dec = np.full((CALIBRATION[0], 1), decoder_start(config), np.int64)
    first_spec = specs[SEQ2SEQ_FILES[1]]
    first = dict(zip(first_spec.input_names, [dec, states, mask], strict=False))
    names = first_spec.output_names
    got = dict(zip(names, session(SEQ2SEQ_FILES[1]).run(None, first), strict=True))
    step_spec = specs[SEQ2SEQ_FILES[2]]
    ids = np.asarray(got[names[0]])[:, -1:].argmax(-1).astype(np.int64)
    step = dict(zip(step_spec.input_names[:3], [ids, states, mask], strict=True))
    for name in step_spec.input_names[3:]:
        step[name] = got[name.replace("past_key_values", "present")]
    feeds = {SEQ2SEQ_FILES[0]: [encoder], SEQ2SEQ_FILES[1]: [first], SEQ2SEQ_FILES[2]: [step]}
    if WHISPER_GENAI_FILES[0] in specs:
        from fastonnx.pretrained import whisper_genai_steps

        genai = {name: session(name) for name in WHISPER_GENAI_FILES}
        feeds.update(whisper_genai_steps.calibration_feeds(genai, model, config, specs))
    return feeds


def vision_language_feeds(
    folder: pathlib.Path, specs: dict[str, GraphSpec], config: Any, model: Any
) -> dict[str, list[dict[str, Any]]]:
    """Calibration inputs of image-text-to-text's three float32 files, as verification runs them: the
    vision encoder on one image, the embeddings on the check's prompt holding its features and on one
    token, the decoder on the prompt's embeddings and one step on the cache that returned."""
    import onnxruntime as ort

    from fastonnx.pretrained import vision_language as vl

    def session(name: str) -> Any:
        return ort.InferenceSession(os.fspath(folder / name), providers=["CPUExecutionProvider"])

    def named(spec: GraphSpec, values: dict[str, Any]) -> dict[str, Any]:
        return {n: np.asarray(values[n]) for n in spec.input_names}

    images = vl.vision_inputs(model, config, 1, "cpu")
    vision_spec, embed_spec, decoder_spec = (specs[f] for f in VISION_LANGUAGE_FILES)
    tensors = vl.vision_feeds(model, images, vision_spec.input_names)
    vision = {n: t.numpy() for n, t in zip(vision_spec.input_names, tensors, strict=True)}
    features, *deepstack = session(vl.VISION_FILE).run(None, vision)
    ids = vl.verification_prompt(config, features.shape[0])
    positions, offset, _ = vl.prompt_positions(model, ids, images)
    embed_session, decoder_session = session(vl.EMBED_FILE), session(vl.DECODER_FILE)
    layout = decoder_spec.cache_layout or config_layout(text_config(config))
    cache = [t.numpy() for t in flat_tensors(filled_cache(layout, 1, 0, "cpu", torch.Generator()))]
    embed_feeds, decoder_feeds, past = [], [], 0
    step_ids, rows = ids, features
    for step in range(2):  # the prompt, then one token
        extras = vl.step_extras(step, step_ids, rows.shape[0], ids, deepstack[0] if deepstack else None)
        more: dict[str, Any] = {"image_features": rows, **extras}
        embed_feeds.append(named(embed_spec, more))
        (embeds,) = embed_session.run(None, embed_feeds[-1])
        length = embeds.shape[1]
        at = positions if step == 0 else vl.step_positions(model, past, length, offset)
        values = dict(zip(decoder_spec.input_names[3:], cache, strict=False))
        values.update(more)
        values |= {"inputs_embeds": embeds, "attention_mask": np.ones((1, past + length), np.int64)}
        values["position_ids"] = at.numpy()
        feed = named(decoder_spec, values)
        decoder_feeds.append(feed)
        logits, *cache = decoder_session.run(None, feed)
        past += length
        step_ids = torch.tensor([[int(np.asarray(logits)[0, -1].argmax())]])
        rows = np.zeros((0, features.shape[-1]), features.dtype)
    return {
        vl.VISION_FILE: [vision],
        vl.EMBED_FILE: embed_feeds,
        vl.DECODER_FILE: decoder_feeds,
    }


def encoder_feeds(model: Any, config: Any, task: str) -> Iterator[dict[str, Any]]:
    """An encoder's calibration inputs: the verification's (a batch of 2, text right-padded)."""
    from fastonnx.pretrained.encoder_tasks import encoder_inputs

    if task == "text-to-audio":  # speech_synthesis.py's inputs (VITS' noise scales at 0)
        from fastonnx.pretrained.speech_synthesis import TOKENS, speech_inputs

        yield {name: t.numpy() for name, t in speech_inputs(config, CALIBRATION[0], TOKENS, "cpu").items()}
        return
    inputs, _ = encoder_inputs(model, config, task, CALIBRATION[0], "cpu")
    yield {name: t.numpy() for name, t in inputs.items()}


def calibration_feeds(model_path: pathlib.Path, spec: GraphSpec, config: Any) -> Iterator[dict[str, Any]]:
    """The calibration prompt's feeds: a prefill, then a decode step on the cache the float32 graph
    returned (run once in onnxruntime for it)."""
    import onnxruntime as ort

    batch, prompt = CALIBRATION
    with_positions = "position_ids" in spec.input_names
    layout = spec.cache_layout or config_layout(text_config(config))
    vocab = int(text_config(config).vocab_size)
    first = decoder_inputs(layout, vocab, batch, prompt, 0, "cpu", with_positions, 1, spec.codebooks)
    tensors = [first[0], first[1], *([first[2]] if with_positions else []), *flat_tensors(first[-1])]
    feed = {n: t.numpy() for n, t in zip(spec.input_names, tensors, strict=True)}
    yield feed
    if spec.stateless:
        return
    session = ort.InferenceSession(os.fspath(model_path), providers=["CPUExecutionProvider"])
    got = session.run(None, feed)
    ids = np.asarray(got[0])[:, -1:].argmax(-1).astype(np.int64)
    step = {spec.input_names[0]: ids, spec.input_names[1]: np.ones((batch, prompt + 1), np.int64)}
    if with_positions:
        step["position_ids"] = np.full((batch, 1), prompt, np.int64)
    caches = spec.input_names[3 if with_positions else 2 :]
    step.update({n: np.asarray(v) for n, v in zip(caches, got[1:], strict=True)})
    yield step


def convert_package(
    folder: pathlib.Path,
    specs: dict[str, GraphSpec],
    config: Any,
    dtype: str,
    keep_io_types: bool,
    task: str,
    model: Any,
) -> None:
    """Every graph of the package converted: one-graph packages on their own inputs, text2text's three
    files on inputs computed by the float32 files before any is converted."""
    check_specs(dtype, task, specs, model)
    every: dict[str, list[dict[str, Any]]] = {}
    if tuple(specs)[:3] == SEQ2SEQ_FILES and dtype == "fp16":
        every = seq2seq_feeds(folder, specs, config, model)
    elif tuple(specs) == VISION_LANGUAGE_FILES and dtype == "fp16":
        every = vision_language_feeds(folder, specs, config, model)
    for filename, spec in specs.items():
        convert_package_file(
            folder, filename, spec, config, dtype, keep_io_types, task, model, every.get(filename)
        )


def convert_package_file(
    folder: pathlib.Path,
    filename: str,
    spec: GraphSpec,
    config: Any,
    dtype: str,
    keep_io_types: bool,
    task: str = "text-generation",
    model: Any = None,
    feeds: list[dict[str, Any]] | None = None,
) -> half_precision.Converted:
    """The float32 ``folder/filename`` recorded on the calibration inputs (text-generation: a prompt;
    other tasks: ``model``'s verification inputs), converted to ``dtype`` and written over itself (its
    external data unchanged); the report's section appended."""
    path = folder / filename
    ranges = None
    if dtype == "fp16":
        if feeds is None:
            feeds = list(
                calibration_feeds(path, spec, config)
                if task == "text-generation"
                else encoder_feeds(model if model is not None else spec.module, config, task)
            )
        ranges = half_precision.record_ranges(path, feeds)
    model = onnx.load(os.fspath(path), load_external_data=False)
    converted = half_precision.convert(
        model, dtype, ranges=ranges, keep_io_types=keep_io_types, base_dir=folder
    )
    onnx.save(converted.model, os.fspath(path))
    batch, prompt = CALIBRATION
    flops = half_precision.matmul_flops(
        converted.model, {"batch_size": batch, "sequence_length": prompt, "total_sequence_length": prompt}
    )
    # a graph without products (image-text-to-text's embeddings: Gathers) has no share to report
    share = half_precision.half_share(flops, dtype) if sum(flops.values()) else None
    converted_share = share or 0.0
    log.info(
        "%s: %s, %.1f%% of the MatMul work in it, %d nodes kept float32",
        filename,
        dtype,
        100 * converted_share,
        len(converted.kept),
    )
    if task == "text-generation":
        what = f"a prefill of {prompt} tokens (batch {batch}) and one decode step"
    elif task == "image-text-to-text":
        what = "one image, the verification's prompt holding its features and one token after it"
    else:
        what = f"the verification's inputs (batch {batch}; text2text: 7 tokens, the first step and one with past)"
    notes = [
        f"Calibration: {what}, run in float32 by onnxruntime with every intermediate value an output."
        if ranges is not None
        else "bfloat16 has float32's range: no calibration."
    ]
    with open(folder / "fastonnx_report.md", "a", encoding="utf-8") as f:
        f.write("\n" + half_precision.report_section(converted, share, notes))
    return converted


def as_float32(outputs: list[Any]) -> list[torch.Tensor]:
    return [
        torch.from_numpy(
            np.asarray(o).astype(np.float32) if np.asarray(o).dtype.kind == "f" else np.asarray(o)
        )
        for o in outputs
    ]
