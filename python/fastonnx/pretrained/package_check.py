"""Verification of a written package: onnxruntime on the task's inputs against transformers eager.

Runs only where the model fits in memory twice over: transformers' float32 model and onnxruntime's
session each hold the weights, so verification runs when 2 x (the weights as float32) is at most half of
the memory available now (``MemAvailable``, else the free pages). Otherwise it is skipped, and the report says
so. text-generation checks a prefill (past length 0) and a decode step on the grown cache: logits and
every ``present`` tensor (a model that keeps no cache: the logits of a prompt and of the prompt grown by
one token); encoders check their one output, on a batch of 2 with right padding.
The comparisons (fastonnx's float32 tolerances, atol 1e-4, rtol 1e-3) are appended to the package's
``fastonnx_report.md``.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare, table
from fastonnx.half_precision import feeds_as_session_types
from fastonnx.pretrained import (
    frame_paired_speech,
    phonon_latent_loops,
    streamed_audio_steps,
    tower_features,
    towers_alone,
    whisper_genai_steps,
)
from fastonnx.pretrained.decoder_cache import (
    cache_argument,
    config_layout,
    filled_cache,
    flat_tensors,
    fresh_cache,
    present_tensors,
    returned_cache,
    text_config,
)
from fastonnx.pretrained.embedded_features import encoder_states
from fastonnx.pretrained.encoder_tasks import audio_inputs, encoder_inputs, states_off, text_inputs
from fastonnx.pretrained.encoder_tasks import reference as encoder_reference
from fastonnx.pretrained.float64_referee import referee
from fastonnx.pretrained.folder import CheckpointFolder
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.half_package import as_float32, float32_tolerance, half_tolerance
from fastonnx.pretrained.image_encoder_decoders import check_package as check_image_encoder_decoder
from fastonnx.pretrained.image_encoder_decoders import image_kind
from fastonnx.pretrained.stable_sorts import StableSorts
from fastonnx.pretrained.task_inputs import (
    GENAI_WHISPER_ENCODER,
    decoder_inputs,
    decoder_start,
    encoder_images,
    encoder_output,
    no_cache_flags,
    seq2seq_sides,
)
from fastonnx.pretrained.tuple_outputs import read
from fastonnx.progress_bars import Progress

Tolerance = Callable[[torch.Tensor], tuple[float | None, float | None]]
"""(atol, rtol) for a comparison with the expected tensor."""

_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def available_memory() -> int | None:
    """Bytes of memory available now, or None when it cannot be told."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # no /proc: the free pages (a lower bound of what is available)
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def float32_bytes(checkpoint: CheckpointFolder) -> int:
    """The checkpoint's size once loaded as float32 (its smallest stored float type decides)."""
    sizes = [_ITEMSIZE.get(d, 4) for d in checkpoint.stored_dtypes()] or [4]
    return checkpoint.weight_bytes * 4 // min(sizes)


def fits(checkpoint: CheckpointFolder) -> tuple[bool, str]:
    need = 2 * float32_bytes(checkpoint)
    free = available_memory()
    if free is None:
        return False, "skipped: the available memory cannot be read"
    if need > free // 2:
        return False, (
            f"skipped: the model needs ~{need / 2**30:.1f} GiB (float32, eager and onnxruntime), more than "
            f"half of the {free / 2**30:.1f} GiB available"
        )
    return True, ""


def _numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    return t.detach().cpu().numpy()


def _run(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The session's outputs for ``tensors``; float ones cast to the session's input types, a half
    package's half outputs returned as float32."""
    feeds = feeds_as_session_types(session, {n: _numpy(t) for n, t in zip(names, tensors, strict=True)})
    return as_float32(session.run(None, feeds))


def _check_decoder(
    session: Any, model: Any, config: Any, spec: GraphSpec, tolerance: Tolerance
) -> list[VerificationInfo]:
    """A prefill of 5 tokens from an empty cache, then a decode step on the grown one: transformers runs
    its own prefill (a fresh cache), the graph its one form (no past, states of zeros)."""
    with_positions = "position_ids" in spec.input_names
    mamba = cache_argument(model) == "cache_params"
    infos: list[VerificationInfo] = []
    batch, prompt = 2, 5
    layout = spec.cache_layout or config_layout(text_config(config))
    vocab = int(text_config(config).vocab_size)
    first = decoder_inputs(layout, vocab, batch, prompt, 0, "cpu", with_positions, 1, spec.codebooks)
    ids, mask = first[0], first[1]
    positions = first[2] if with_positions else None
    onnx_cache = flat_tensors(first[-1])
    cache = fresh_cache(layout)
    for step in ("prefill", "decode"):
        kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": True}
        if mamba:  # transformers passes a state-space model no mask once it has a cache
            kwargs.update(cache_params=cache, attention_mask=mask if step == "prefill" else None)
        else:
            kwargs.update(past_key_values=cache, attention_mask=mask)
        if positions is not None:
            kwargs["position_ids"] = positions
        feeds = [ids, mask, *([positions] if positions is not None else []), *onnx_cache]
        got = _run(session, spec.input_names, feeds)
        with torch.no_grad():
            out = model(**kwargs)
        cache = returned_cache(out)
        expected = [out.logits, *present_tensors(cache, layout, batch)]
        for name, e, a in zip(spec.output_names, expected, got, strict=True):
            infos.append(compare(f"{step}: {name}", e, a, *tolerance(e)))
        onnx_cache = got[1:]
        past = mask.shape[1]
        ids = out.logits[:, -1:].argmax(-1)
        mask = torch.ones(batch, past + 1, dtype=torch.int64)
        positions = torch.full((batch, 1), past, dtype=torch.int64) if with_positions else None
    return infos


def _check_no_cache(
    session: Any, model: Any, config: Any, spec: GraphSpec, tolerance: Tolerance
) -> list[VerificationInfo]:
    """A model that keeps no cache: the logits of a prompt of 5 tokens, then of the prompt grown by its
    greedy token, each step over the whole sequence as a generation loop runs it."""
    with_positions = "position_ids" in spec.input_names
    ids, mask, positions, _ = decoder_inputs([], int(text_config(config).vocab_size), 2, 5, 0, "cpu", True, 1)
    infos: list[VerificationInfo] = []
    for step in ("prompt", "grown by one"):
        extra = {"position_ids": positions} if with_positions else {}
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask, **no_cache_flags(model), **extra).logits
        feeds = [ids, mask, *([positions] if with_positions else [])]
        (got,) = _run(session, spec.input_names, feeds)
        infos.append(compare(f"{step}: logits", expected, got, *tolerance(expected)))
        ids = torch.cat([ids, expected[:, -1:].argmax(-1)], dim=1)
        mask = torch.ones_like(ids)
        positions = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
    return infos


def _flat_seq2seq_cache(cache: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for own, cross in zip(cache.self_attention_cache.layers, cache.cross_attention_cache.layers, strict=True):
        out += [own.keys, own.values, cross.keys, cross.values]
    return out


def _check_text2text(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec], tolerance: Tolerance
) -> list[VerificationInfo]:
    from transformers import DynamicCache, EncoderDecoderCache

    infos: list[VerificationInfo] = []
    if specs["encoder_model.onnx"].input_names in (["input_features"], ["input_values"]):
        audio, _ = audio_inputs(model, config, 2, "cpu")  # Whisper's 3000 frames, or a second of audio
        (states_got,) = _run(sessions["encoder_model.onnx"], list(audio), list(audio.values()))
        with torch.no_grad():
            states = encoder_states(model, audio)
        mask = torch.ones(states.shape[:2], dtype=torch.int64)
    elif specs["encoder_model.onnx"].input_names == ["pixel_values"]:
        pixels = encoder_images(config, 2, "cpu")["pixel_values"]
        (states_got,) = _run(sessions["encoder_model.onnx"], ["pixel_values"], [pixels])
        with torch.no_grad():
            states = model.get_encoder()(pixel_values=pixels).last_hidden_state
        mask = torch.ones(states.shape[:2], dtype=torch.int64)
    else:
        sides = seq2seq_sides(config)  # a composite config's encoder holds the vocabulary the ids index
        inputs = text_inputs(config if sides is None else sides[0], 2, 7, "cpu", False)
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        (states_got,) = _run(sessions["encoder_model.onnx"], ["input_ids", "attention_mask"], [ids, mask])
        with torch.no_grad():
            states = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    infos.append(compare("encoder: last_hidden_state", states, states_got, *tolerance(states)))
    dec = torch.full((2, 1), decoder_start(config), dtype=torch.int64)
    cache: Any = EncoderDecoderCache(DynamicCache(), DynamicCache())
    for filename in ("decoder_model.onnx", "decoder_with_past_model.onnx"):
        spec = specs[filename]
        feeds = [dec, states, mask, *([] if filename == "decoder_model.onnx" else _flat_seq2seq_cache(cache))]
        got = _run(sessions[filename], spec.input_names, feeds)
        with torch.no_grad():
            out = model(
                decoder_input_ids=dec,
                encoder_outputs=encoder_output(states),
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
            )
        expected = [out.logits, *_flat_seq2seq_cache(out.past_key_values)]
        for name, e, a in zip(spec.output_names, expected, got, strict=True):
            infos.append(compare(f"{filename.removesuffix('.onnx')}: {name}", e, a, *tolerance(e)))
        cache = out.past_key_values
        dec = out.logits[:, -1:].argmax(-1)
    return infos


def _generate(model: Any, ids: torch.Tensor, inputs: dict[str, torch.Tensor]) -> Any:
    """transformers' greedy ``generate`` of 6 tokens from the prompt ``ids`` (and the media ``inputs``),
    with its logits: no eos, so that it stops early only where the config's own eos is drawn."""
    from transformers import GenerationConfig

    settings = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False, max_new_tokens=6, eos_token_id=None, pad_token_id=0
    )
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            **inputs,
            generation_config=settings,
            output_logits=True,
            return_dict_in_generate=True,
        )


Positions = Callable[[int, int, int], torch.Tensor]
"""The position ids of step ``step`` of ``length`` tokens after ``past`` cached ones."""
Extra = Callable[[int, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
"""The decoder's inputs beyond the embeddings, mask, positions and cache at a step (its ids, its
features' rows), by name; those the graph declares are fed."""


def _greedy_over_files(
    sessions: dict[str, Any],
    embed: tuple[str, str],
    decoder_spec: GraphSpec,
    config: Any,
    ids: torch.Tensor,
    features: torch.Tensor,
    generated: Any,
    tolerance: Tolerance = float32_tolerance,
    forced: bool = False,
) -> Callable[[Positions, Extra], list[VerificationInfo]]:
    """The greedy loop of a multimodal package against ``generated``: the embedding file (``embed``: its
    name and its features input) on the prompt and ``features``, then on each token with 0 rows; the
    decoder on each step's embeddings and the grown cache: every step's logits, and the tokens.
    ``forced`` (a half package): each step reads transformers' token, not the graph's own argmax, and
    the tokens are not compared (float16 may pick the other of two logits closer than its rounding)."""

    from fastonnx.pretrained.vision_language import DECODER_FILE

    def run(positions: Positions, extra: Extra) -> list[VerificationInfo]:
        filename, feature_name = embed
        hidden = features.shape[-1]
        layout = decoder_spec.cache_layout or config_layout(text_config(config))
        cache = flat_tensors(filled_cache(layout, 1, 0, "cpu", torch.Generator()))  # an empty past
        step_ids, rows, past, tokens, infos = ids, features, 0, [], []
        # generate stops early where it draws the config's eos: the steps it made
        # the embedding file's inputs beyond the ids and features (Kosmos-2's image positions) from extra
        embed_names = [i.name for i in sessions[filename].get_inputs()]
        for step in range(len(generated.logits)):
            more = extra(step, step_ids, rows)
            given = {"input_ids": step_ids, feature_name: rows, **more}
            (embeds,) = _run(sessions[filename], embed_names, [given[n] for n in embed_names])
            length = embeds.shape[1]  # GIT's: the image's rows before the ids
            mask = torch.ones(1, past + length, dtype=torch.int64)
            named = [more[n] for n in decoder_spec.input_names if n in more]
            feeds = [embeds, mask, positions(step, past, length), *cache, *named]
            got = _run(sessions[DECODER_FILE], decoder_spec.input_names, feeds)  # vision's, audio's alike
            expected = generated.logits[step]
            infos.append(compare(f"step {step}: logits", expected, got[0][:, -1], *tolerance(expected)))
            cache, past = got[1:], past + length
            tokens.append(int(got[0][0, -1].argmax()))
            step_ids, rows = torch.tensor([[tokens[-1]]]), torch.zeros(0, hidden)
            if forced:
                step_ids = generated.sequences[:, ids.shape[1] + step : ids.shape[1] + step + 1]
        want = generated.sequences[0, ids.shape[1] :].tolist()
        if not forced:
            infos.append(compare("generated tokens", torch.tensor(want), torch.tensor(tokens)))
        return infos

    return run


def _check_vision_language(
    sessions: dict[str, Any],
    model: Any,
    config: Any,
    specs: dict[str, GraphSpec],
    half: bool = False,
) -> list[VerificationInfo]:
    """One image and a prompt holding its tokens: the image features, then a greedy generation of 6
    tokens over the three files (the vision encoder once, embed and decode a step) against transformers'
    ``generate`` on the same prompt and image: every step's logits, and the tokens. ``half``: a half
    package (half_package.py) at its tolerance, each step on transformers' token."""
    tolerance: Tolerance = half_tolerance if half else float32_tolerance

    from fastonnx.pretrained import image_prefix
    from fastonnx.pretrained import vision_language as vl

    if image_prefix.own_layout(model):
        return _check_image_prefix(sessions, model, config, specs)
    from fastonnx.pretrained import cross_attention_vlms

    if cross_attention_vlms.own_layout(model):
        return cross_attention_vlms.check_package(sessions, model, config, specs, sys.modules[__name__])
    from fastonnx.pretrained import padded_patch_vlms

    if padded_patch_vlms.own_layout(model):
        return padded_patch_vlms.check_package(sessions, model, config, specs, sys.modules[__name__])
    from fastonnx.pretrained import minicpm_vlms

    if minicpm_vlms.own_layout(model):
        return minicpm_vlms.check_package(sessions, model, config, specs, sys.modules[__name__])
    from fastonnx.pretrained import molmo_vlms

    if molmo_vlms.own_layout(model):
        return molmo_vlms.check_package(sessions, model, config, specs, sys.modules[__name__])
    decoder_spec = specs[vl.DECODER_FILE]
    images = vl.vision_inputs(model, config, 1, "cpu")
    vision_names = specs[vl.VISION_FILE].input_names
    features, *deepstack = _run(
        sessions[vl.VISION_FILE], vision_names, vl.vision_feeds(model, images, vision_names)
    )
    with torch.no_grad():
        expected_features = vl.image_features(model, **images)
    infos = [
        compare("vision_encoder: image_features", expected_features, features, *tolerance(expected_features))
    ]
    infos += _other_crop_counts(sessions, model)
    if deepstack:  # Qwen3-VL's deepstack rows, a layer's each
        with torch.no_grad():
            out = model.get_image_features(**images, return_dict=True)
        expected = vl.deepstack_rows(model, out)
        infos.append(
            compare("vision_encoder: deepstack_features", expected, deepstack[0], *tolerance(expected))
        )
    ids = vl.verification_prompt(config, features.shape[0])
    positions, offset, placed = vl.prompt_positions(model, ids, images)
    generated = _generate(model, ids, {**images, **placed})

    def step_positions(step: int, past: int, length: int) -> torch.Tensor:
        return positions if step == 0 else vl.step_positions(model, past, length, offset)

    def extra(step: int, step_ids: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return vl.step_extras(step, step_ids, rows.shape[0], ids, deepstack[0] if deepstack else None)

    steps = _greedy_over_files(
        sessions,
        (vl.EMBED_FILE, "image_features"),
        decoder_spec,
        config,
        ids,
        features,
        generated,
        tolerance,
        forced=half,
    )
    return infos + steps(step_positions, extra)


def _other_crop_counts(sessions: dict[str, Any], model: Any) -> list[VerificationInfo]:
    """A global view and crops' vision encoder (local_patch_towers.py) at other crop counts too."""
    from fastonnx.pretrained import local_patch_towers as lp
    from fastonnx.pretrained import vision_language as vl

    if not lp.local_patch_tower(model):
        return []
    return lp.check_other_images(sessions[vl.VISION_FILE], model, sys.modules[__name__], vl.image_features)


def _check_image_prefix(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec]
) -> list[VerificationInfo]:
    """``_check_vision_language`` of image_prefix.py's families (Kosmos-2, GIT): their prompt, positions
    and step inputs are the module's ``check_plan``."""
    from fastonnx.pretrained import image_prefix as ip
    from fastonnx.pretrained import vision_language as vl

    name, image = ip.image_input(config, "cpu")  # pixels, or Kosmos-2.5's flattened patches
    (features,) = _run(sessions[vl.VISION_FILE], [name], [image])
    with torch.no_grad():
        expected = ip.image_features(model, image)
    infos = [compare("vision_encoder: image_features", expected, features)]
    _, vocab = vl.text_sizes(config)
    text = torch.randint(min(5, vocab - 1), vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    plan = ip.check_plan(model, config, text, features.shape[0])
    generated = _generate(model, plan["ids"], {name: image, **plan["generate"]})
    steps = _greedy_over_files(
        sessions,
        (vl.EMBED_FILE, "image_features"),
        specs[vl.DECODER_FILE],
        config,
        plan["ids"],
        features,
        generated,
    )
    return infos + steps(plan["positions"], plan["extra"])


def _check_audio_language(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec]
) -> list[VerificationInfo]:
    """One audio (its last quarter padding, where the encoder takes the mask) and a prompt holding its
    tokens: the audio features, then a greedy generation of 6 tokens over the three files against
    transformers' ``generate`` on the same prompt and audio: every step's logits, and the tokens."""

    from fastonnx.pretrained import audio_language as al
    from fastonnx.pretrained import vision_language as vl

    audio_spec, decoder_spec = specs[al.AUDIO_FILE], specs[al.DECODER_FILE]
    audio = al.audio_inputs(model, config, "cpu", kept=0.75)
    (features,) = _run(
        sessions[al.AUDIO_FILE], audio_spec.input_names, [audio[n] for n in audio_spec.input_names]
    )
    with torch.no_grad():
        expected_features = al.audio_features(model, **audio)
    infos = [compare("audio_encoder: audio_features", expected_features, features)]
    token = al.audio_token_id(config)
    _, vocab = vl.text_sizes(config)
    text = torch.randint(min(3, vocab - 1), vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    text[text == token] = 3  # the audio's tokens only where the audio goes
    ids = torch.cat([text[:, :2], torch.full((1, features.shape[0]), token), text[:, 2:]], dim=1)
    ids = audio.get(al.PROMPT, ids)  # the prompt the audio encoder read too (MusicFlamingo's)
    generated = _generate(model, ids, al.model_audio_inputs(model, audio))

    def positions(step: int, past: int, length: int) -> torch.Tensor:
        return torch.arange(past, past + length).unsqueeze(0)

    steps = _greedy_over_files(
        sessions, (al.EMBED_FILE, "audio_features"), decoder_spec, config, ids, features, generated
    )
    return infos + steps(positions, lambda *_: {})


def _check_encoder(
    session: Any, model: Any, config: Any, task: str, spec: GraphSpec, tolerance: Tolerance
) -> list[VerificationInfo]:
    names = tuple(spec.output_names)
    inputs = _encoder_feeds(model, config, task)
    got = dict(zip(names, _run(session, list(inputs), list(inputs.values())), strict=True))

    def forward(m: Any, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # as the graph runs it (encoder_tasks.Named), ties sorted as its TopK sorts them
        with torch.no_grad(), states_off(m), StableSorts():
            out = encoder_reference(m, m.config, task, names)(**feeds)
        return {name: read(out, name) for name in names}

    expected = forward(model, inputs)
    infos = [compare(name, expected[name], got[name], *tolerance(expected[name])) for name in names]
    return referee(infos, model, inputs, expected, got, forward, available_memory())


def _encoder_feeds(model: Any, config: Any, task: str) -> dict[str, torch.Tensor]:
    """A one-graph task's inputs of 2 rows: encoder_tasks', or an audio base model's prompts and audios
    (audio_base_models.py)."""
    from fastonnx.pretrained import audio_base_models, media_text_towers

    # the two towers first, as task_inputs makes their graph first (CLAP's has get_audio_features too)
    if media_text_towers.owns(model, task):  # PE's audio and video models, VideoPrism's clip model, CLAP
        return media_text_towers.tower_inputs(model, config, 2, "cpu")[0]
    if audio_base_models.owns(model, task):
        return audio_base_models.base_inputs(model, config, 2, "cpu")
    inputs, _ = encoder_inputs(model, config, task, 2, "cpu")
    return inputs


def verify_package(
    package: pathlib.Path,
    checkpoint: CheckpointFolder,
    task: str,
    class_name: str,
    specs: dict[str, GraphSpec],
    progress: bool | None,
    *,
    half: bool = False,
) -> tuple[bool | None, str]:
    """Runs the package against transformers; returns (passed or None when skipped, a note) and
    appends the comparison to the package's report. ``half``: a float16 package (half_package.py),
    compared at half_package.half_tolerance."""
    tolerance: Tolerance = half_tolerance if half else float32_tolerance
    ok, note = fits(checkpoint)
    report = package / "fastonnx_report.md"
    if not ok:
        _append(report, [f"Verification {note}."])
        return None, note
    import onnxruntime as ort
    import transformers

    with Progress(progress).timed("verify"):
        cls = getattr(transformers, class_name)
        model = cls.from_pretrained(checkpoint.path, dtype=torch.float32).eval()
        try:
            sessions = {
                name: ort.InferenceSession(str(package / name), providers=["CPUExecutionProvider"])
                for name in specs
            }
            if task == "text-generation" and specs["model.onnx"].stateless:
                infos = _check_no_cache(
                    sessions["model.onnx"], model, model.config, specs["model.onnx"], tolerance
                )
            elif task == "text-generation":
                infos = _check_decoder(
                    sessions["model.onnx"], model, model.config, specs["model.onnx"], tolerance
                )
            elif task == "image-text-to-text" and image_kind(model) is not None:
                infos = check_image_encoder_decoder(sessions, model, _run)
            elif task == "image-text-to-text" and "encoder_model.onnx" not in specs:
                infos = _check_vision_language(sessions, model, model.config, specs, half)
            elif task == "text-to-audio" and "chroma_prefix.onnx" in specs:
                from fastonnx.pretrained.melody_code_loops import check_package as check_melody

                infos = check_melody(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "encodec_decode.onnx" in specs:
                from fastonnx.pretrained.audio_code_loops import check_package as check_codes

                infos = check_codes(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "semantic_model.onnx" in specs:
                from fastonnx.pretrained.bark_stages import check_package as check_bark

                infos = check_bark(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "backbone_model.onnx" in specs:
                from fastonnx.pretrained.csm_stages import check_package as check_csm

                infos = check_csm(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and type(model).__name__ == "PocketTTSForConditionalGeneration":
                # by class: Gradium Phonon's package also holds a flow_head.onnx
                from fastonnx.pretrained.pocket_tts_stages import check_package as check_pocket

                infos = check_pocket(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "audio_tokenizer_decode.onnx" in specs:
                from fastonnx.pretrained.higgs_audio_stages import check_package as check_higgs

                infos = check_higgs(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "vocoder.onnx" in specs:
                from fastonnx.pretrained.seamless_stages import check_package as check_seamless

                infos = check_seamless(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and phonon_latent_loops.own_layout(model):
                infos = phonon_latent_loops.check_package(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "diffusion_head.onnx" in specs:
                from fastonnx.pretrained.vibevoice_stages import check_package as check_vibevoice

                infos = check_vibevoice(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "code_predictor_model.onnx" in specs:
                from fastonnx.pretrained.omni3_speech_stages import check_package as check_omni3

                infos = check_omni3(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "talker_model.onnx" in specs:
                from fastonnx.pretrained.omni_speech_stages import check_package as check_omni

                infos = check_omni(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio" and "model.onnx" not in specs:
                from fastonnx.pretrained.spectrogram_loops import check_package as check_loop

                infos = check_loop(sessions, model, specs, _run, tolerance)
            elif task == "text-to-audio":
                from fastonnx.pretrained.speech_synthesis import check_speech

                infos = check_speech(sessions["model.onnx"], model, specs["model.onnx"], _run, tolerance)
            elif frame_paired_speech.own_layout(model):
                infos = frame_paired_speech.check_package(sessions, model, specs, _run, tolerance)
            elif streamed_audio_steps.own_layout(model):
                infos = streamed_audio_steps.check_package(sessions, model, specs, _run, tolerance)
            elif "audio_encoder.onnx" in specs:
                infos = _check_audio_language(sessions, model, model.config, specs)
            elif "encoder_model.onnx" in specs:
                infos = _check_text2text(sessions, model, model.config, specs, tolerance)
                if GENAI_WHISPER_ENCODER in specs:  # Whisper's onnxruntime-genai files beside them
                    infos += whisper_genai_steps.check(sessions, model, model.config, specs, _run, tolerance)
            elif streamed_audio_steps.owns_bare(model, task):
                infos = streamed_audio_steps.check_bare(
                    sessions["model.onnx"], model, specs["model.onnx"], _run, tolerance
                )
            elif tower_features.owns(model, task):
                infos = tower_features.check(
                    sessions["model.onnx"], model, specs["model.onnx"], _run, tolerance
                )
            elif towers_alone.owns(model, task):
                infos = towers_alone.check(
                    sessions["model.onnx"], model, specs["model.onnx"], _run, tolerance
                )
            else:
                infos = _check_encoder(
                    sessions["model.onnx"], model, model.config, task, specs["model.onnx"], tolerance
                )
        except Exception as e:
            if not type(e).__module__.startswith("onnxruntime"):
                raise
            # the package is written; onnxruntime refusing to load or run it is a failed verification
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            note = f"onnxruntime could not run the package: {first}"
            _append(report, [f"## Package verification ({class_name}, {task})", "", f"**FAILED**: {note}"])
            return False, note
    passed = all(i.passed for i in infos)
    failed = [i.name for i in infos if not i.passed]
    note = "passed" if passed else f"{len(failed)} of {len(infos)} values disagree: {', '.join(failed[:5])}"
    _append(
        report,
        [
            f"## Package verification (onnxruntime vs transformers eager, {class_name}, {task})",
            "",
            table(infos),
            "",
            f"**{'All outputs agree.' if passed else 'Some outputs DISAGREE.'}**",
        ],
    )
    return passed, note


def _append(report: pathlib.Path, lines: list[str]) -> None:
    with open(report, "a", encoding="utf-8") as f:
        f.write("\n" + "\n".join(lines) + "\n")
