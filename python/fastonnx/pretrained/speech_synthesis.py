"""text-to-audio: the text-to-speech models that synthesize in one forward, each one graph ``model.onnx``,
and the refusal of those that generate their audio in a loop; and the refusal of automatic-speech-
recognition for the text-to-speech models transformers also lists in its speech-seq2seq mapping
(VibeVoice, Dia: ``refuse_recognition``).

Inputs: ``input_ids``, ``attention_mask`` (``batch_size`` x ``sequence_length``, right-padded rows).
Outputs, per class:

- VITS (``VitsModel``): ``waveform`` (``batch_size`` x samples) and ``sequence_lengths`` (each row's
  samples); VITS draws noise in its flow prior and its stochastic duration predictor (``randn_like``
  scaled by ``config.noise_scale`` / ``noise_scale_duration``). The graph draws it too (ONNX
  RandomNormalLike) and takes the scales as float32 scalar inputs ``noise_scale`` and
  ``noise_scale_duration`` (the latter only with ``use_stochastic_duration_prediction``): the config's
  values synthesize as transformers does, 0 makes the run deterministic, which is how it is verified
  (random draws are never compared). The speaking rate is the config's; multi-speaker checkpoints
  synthesize without a speaker embedding (transformers' ``speaker_id=None``).
- FastSpeech2Conformer (``FastSpeech2ConformerModel``): ``spectrogram`` (``batch_size`` x frames x mel
  bins) and ``duration_outputs`` (frames per token: a row's frames are their sum);
  ``FastSpeech2ConformerWithHifiGan``: ``waveform`` and ``duration_outputs``. Its length regulator is
  swapped for a gather (capture/length_regulators.py).

The output length (VITS' ceiled and summed durations, FastSpeech2's repeats) is data-dependent: an unbacked
size in torch.export, a dynamic dim of the ONNX output, the batch's longest row (shorter rows padded as
transformers pads them).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.encoder_tasks import TextEncoder
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, GraphSpec

OUTPUTS: dict[str, tuple[str, ...]] = {
    "VitsModel": ("waveform", "sequence_lengths"),
    "FastSpeech2ConformerModel": ("spectrogram", "duration_outputs"),
    "FastSpeech2ConformerWithHifiGan": ("waveform", "duration_outputs"),
}
"""The one-forward classes and the outputs of their graph."""

LOOPS: dict[str, str] = {}
"""Why each other class of the task's mappings is no one-forward graph."""

LOOP_CLASSES = frozenset(
    {
        "SpeechT5ForTextToSpeech",
        "MusicgenForConditionalGeneration",
        "MusicgenMelodyForConditionalGeneration",
        "BarkModel",
        "CsmForConditionalGeneration",
        "PocketTTSForConditionalGeneration",
        "HiggsAudioV2ForConditionalGeneration",
        "SeamlessM4TForTextToSpeech",
        "SeamlessM4Tv2ForTextToSpeech",
        "GradiumPhononTTSForConditionalGeneration",
        "VibeVoiceForConditionalGeneration",
        "Qwen2_5OmniForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
    }
)
"""The classes exported as their generation loop's graphs: SpeechT5's frame loop (spectrogram_loops.py),
MusicGen's codebook loop (audio_code_loops.py), MusicGen Melody's (melody_code_loops.py), Bark's stages
(bark_stages.py), CSM's backbone and depth decoder (csm_stages.py), Pocket TTS's backbone step and flow head
(pocket_tts_stages.py), Higgs Audio V2's decoder step and audio tokenizer decode (higgs_audio_stages.py),
SeamlessM4T's and v2's (seamless_stages.py), Gradium Phonon's latent loop (phonon_latent_loops.py),
VibeVoice's (vibevoice_stages.py), Qwen2.5-Omni's (omni_speech_stages.py), Qwen3-Omni-MoE's (omni3_speech_stages.py)."""

TOKENS = 7


def one_forward(class_name: str) -> bool:
    """Whether text-to-audio exports ``class_name`` (``task="auto"`` takes no other there)."""
    return class_name in OUTPUTS


def exported(class_name: str) -> bool:
    """Whether text-to-audio exports ``class_name``: in one forward, or a generation loop over three
    graphs (SpeechT5's: spectrogram_loops.py; MusicGen's: audio_code_loops.py, melody_code_loops.py)."""
    return one_forward(class_name) or class_name in LOOP_CLASSES


def refuse(class_name: str) -> None:
    """An InputError naming why ``class_name`` has no text-to-audio graph; nothing for those it has."""
    if exported(class_name):
        return
    why = LOOPS.get(class_name, "generates its audio in a loop")
    raise InputError(
        f"text-to-audio of {class_name} {why}: not a one-forward graph; not supported yet (text-to-audio "
        f"exports {', '.join([*OUTPUTS, *sorted(LOOP_CLASSES)])})"
    )


SYNTHESIS_MAPPINGS = (
    "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES",
    "MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES",
)
AUDIO_INPUTS = ("input_features", "input_values", "input_audio", "audio_values")
"""The names a speech model's forward reads its audio by."""


def refuse_recognition(model: torch.nn.Module) -> None:
    """An InputError for automatic-speech-recognition of a text-to-speech model of transformers'
    speech-seq2seq mapping: one its text-to-speech mappings list too (VibeVoice), or one whose forward
    reads no audio and whose output is audio alone (Dia: its byte tokens' ``input_ids``, audio codebooks
    out). transformers' own
    speech-recognition pipeline cannot run them: it hands ``generate`` the audio as the model's main
    input, their ``input_ids``. Nothing for the others."""
    from transformers.models.auto import modeling_auto

    name = type(model).__name__
    main = getattr(model, "main_input_name", "input_ids")
    listed = [m for m in SYNTHESIS_MAPPINGS if name in getattr(modeling_auto, m, {}).values()]
    params = inspect.signature(model.forward).parameters
    if listed:
        why = f"transformers lists it in {listed[0]} too: its generate synthesizes audio from a text prompt"
    elif tuple(getattr(model, "output_modalities", ()) or ()) == ("audio",) and not any(
        n in params for n in AUDIO_INPUTS
    ):
        # audio out, and no audio in (Kyutai's speech-to-text reads text ids too, its audio through
        # generate's codec, but its output is text; Pop2Piano's audio out reads input_features)
        why = (
            f"its forward reads text ({main}) and no audio (none of {', '.join(AUDIO_INPUTS)}), and its "
            "output_modalities are ('audio',)"
        )
    else:
        return
    then = "export it for text-to-audio" if exported(name) else "text-to-audio does not export it yet"
    raise InputError(
        f"automatic-speech-recognition of {name}: it is a text-to-speech model, not a speech recognizer, "
        f"though transformers lists it in its speech-seq2seq mapping: {why}; transformers' own "
        f"automatic-speech-recognition pipeline cannot run it (it hands generate the audio as {main}, the "
        f"model's main input); {then}"
    )


class VitsSynthesis(torch.nn.Module):
    """VITS with its noise scales as inputs (0-d tensors standing for the config's floats)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def synthesize(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, scales: tuple[Any, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        model: Any = self.model
        kept = model.noise_scale, model.noise_scale_duration
        model.noise_scale, model.noise_scale_duration = scales  # read by its forward only
        try:
            out = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        finally:
            model.noise_scale, model.noise_scale_duration = kept
        return out.waveform, out.sequence_lengths

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, noise_scale: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # a deterministic duration predictor draws nothing: its scale is never read
        return self.synthesize(input_ids, attention_mask, (noise_scale, 0.0))


class StochasticVitsSynthesis(VitsSynthesis):
    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        noise_scale: torch.Tensor,
        noise_scale_duration: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.synthesize(input_ids, attention_mask, (noise_scale, noise_scale_duration))


def _text_config(config: Any) -> Any:
    """The config holding the vocabulary (FastSpeech2ConformerWithHifiGan's ``model_config``)."""
    return getattr(config, "model_config", None) or config


def speech_inputs(
    config: Any, batch: int, tokens: int, device: str | torch.device
) -> dict[str, torch.Tensor]:
    """``batch`` rows of ``tokens`` ids, the second right-padded from its middle; for VITS the noise
    scales at 0 (what verification feeds: no random draw compared)."""
    g = torch.Generator().manual_seed(0)
    vocab = int(_text_config(config).vocab_size)
    inputs = {
        "input_ids": torch.randint(min(3, vocab - 1), vocab, (batch, tokens), generator=g),
        "attention_mask": torch.ones(batch, tokens, dtype=torch.int64),
    }
    if batch > 1:
        inputs["attention_mask"][1, max(1, tokens // 2) :] = 0
    if getattr(config, "model_type", None) == "vits":
        inputs["noise_scale"] = torch.tensor(0.0)
        if config.use_stochastic_duration_prediction:
            inputs["noise_scale_duration"] = torch.tensor(0.0)
    return {k: v.to(device) for k, v in inputs.items()}


def speech_graph(model: torch.nn.Module, config: Any) -> GraphSpec:
    """text-to-audio's one graph for ``model`` (an InputError for a class that generates in a loop)."""
    name = type(model).__name__
    refuse(name)
    inputs = speech_inputs(config, 2, TOKENS, "meta")
    batch = torch.export.Dim(BATCH, max=1024)
    sequence = torch.export.Dim(SEQUENCE, max=1 << 20)
    shapes: dict[str, Any] = {k: {} for k in inputs}
    shapes["input_ids"] = shapes["attention_mask"] = {0: batch, 1: sequence}
    module: torch.nn.Module
    if name == "VitsModel":
        stochastic = "noise_scale_duration" in inputs
        module = (StochasticVitsSynthesis if stochastic else VitsSynthesis)(model)
    else:
        module = TextEncoder(model, OUTPUTS[name])
    return GraphSpec(module, tuple(inputs.values()), shapes, list(inputs), list(OUTPUTS[name]))


CHECKED = ((2, TOKENS), (1, 3))
"""The (batch, tokens) of the verification's runs: the example's, and another size of both."""


def check_speech(
    session: Any, model: Any, spec: GraphSpec, run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The graph against transformers' forward at the sizes of ``CHECKED``, VITS' noise scales at 0
    (``run(session, names, tensors)`` gives the session's outputs)."""
    infos: list[VerificationInfo] = []
    for batch, tokens in CHECKED:
        inputs = speech_inputs(model.config, batch, tokens, "cpu")
        got = run(session, list(inputs), list(inputs.values()))
        with torch.no_grad():
            if isinstance(spec.module, VitsSynthesis):
                ids, mask = inputs["input_ids"], inputs["attention_mask"]
                expected = VitsSynthesis(model).synthesize(ids, mask, (0.0, 0.0))
            else:
                out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
                expected = tuple(getattr(out, f) for f in spec.output_names)
        for name, e, a in zip(spec.output_names, expected, got, strict=True):
            infos.append(compare(f"{name} ({batch}x{tokens})", e, a, *tolerance(e)))
    return infos
