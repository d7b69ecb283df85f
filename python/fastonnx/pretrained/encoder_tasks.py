"""The graphs of the tasks that run a model once on their inputs (classifiers, detectors, encoders): what
they take, made from the model's forward and config, and the output fields they return.

Inputs, by what the forward takes:
- text: ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the forward takes them), dims
  ``batch_size`` x ``sequence_length``; multiple-choice adds ``num_choices`` between them;
- images: ``pixel_values`` at the config's ``image_size`` (224 where it has none), ``batch_size`` dynamic;
- image and text (zero-shot image classification: CLIP, SigLIP): ``input_ids``, ``attention_mask`` of
  ``text_batch_size`` prompts and ``pixel_values`` of ``batch_size`` images; a model reading them as pairs,
  row by row (BridgeTower, ViLT: its output has no contrastive embeddings), ``batch_size`` of each;
- feature-extraction of a base model that merges image features into its text at placeholder tokens (its
  config names an image token: ``image_token_id``, ``image_token_index``, ``image_token``, or a video
  token): text alone, ``input_ids``, ``attention_mask`` to the language model's ``last_hidden_state``, as
  the text tasks read such models' classifiers; its images go through image-text-to-text's
  ``vision_encoder.onnx`` (multimodal_features.py). Two towers (CLIP, SigLIP, BridgeTower) keep both;
- a keypoint matcher's pairs (EfficientLoFTR, LightGlue: ``batch_size`` x 2 images, ``IMAGE_PAIRS``);
- video (TimeSformer, VideoMAE, ViViT, X-CLIP: 5-D ``pixel_values``): the config's ``num_frames`` frames
  of its image size, ``batch_size`` dynamic, the frames fixed as the models' frame embeddings fix them;
- zero-shot object detection: OWL-ViT's queries flattened as its processor makes them (``text_batch_size``
  rows = images x queries) beside ``batch_size`` images; Grounding DINO's one prompt an image;
- time series: ``past_values``, ``batch_size`` x the config's ``context_length`` x ``num_input_channels`` (the lagged
  forecasters' with their time features and observed mask, TimesFM's with its padding and frequency:
  ``series_inputs``; TimesFM's prediction models ``batch_size`` x ``sequence_length``, any steps:
  ``any_length_series``);
- audio: ``input_values``, a waveform ``batch_size`` x ``audio_sequence_length`` (16 kHz samples; a
  codec's ``batch_size`` x its channels x ``audio_sequence_length``: frame_widths.py), or an
  Audio Spectrogram Transformer's ``max_length`` x ``num_mel_bins`` frames; ``input_features``, Whisper's
  ``num_mel_bins`` x 3000 frames (its encoder takes exactly that many) or frames x feature size
  (Wav2Vec2-BERT, Parakeet) with ``feature_length`` dynamic;
- an encoder-decoder base model (feature-extraction of T5Model, BartModel, WhisperModel...): also
  ``decoder_input_ids``, ``batch_size`` x ``decoder_sequence_length``, which its decoder runs on; it returns
  the decoder's ``last_hidden_state`` and ``encoder_last_hidden_state``;
- feature-extraction of an audio-language base model (Voxtral's, Qwen2-Audio's... bare ``XModel``) reads
  its audio and its prompt as its automatic-speech-recognition package does: ``input_features`` (and the
  frames' mask its forward needs) and ``input_ids`` / ``attention_mask`` holding the audio placeholder
  tokens its processor writes for those frames, to the language model's ``last_hidden_state``; a
  transducer (RNN-T, TDT) reads ``input_features`` and its prediction network's one step of
  ``decoder_input_ids``, to the encoder's states, their projection and the joint's logits. Both graphs
  are audio_base_models.py's.

Outputs: the fields of the task transformers' pipelines read (``ENCODER_OUTPUTS``), those of them the
model's output class declares (image segmentation: DETR's ``logits``, ``pred_boxes``, ``pred_masks``;
Mask2Former's ``class_queries_logits``, ``masks_queries_logits``), else those of ``FALLBACK_OUTPUTS``
it declares (PP-OCR's text detectors: ``last_hidden_state``), else, for feature-extraction of a CTC head
transformers lists as a base model (Parakeet's, LASR's), its ``logits``. The output class is the one the
forward's return annotation names, else the one its source returns (RF-DETR's segmentation forward is
annotated ``dict``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.pretrained.embedded_features import embedded_frame_size
from fastonnx.pretrained.frame_widths import bins_first_width, first_layer_width, waveform_channels
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, GraphSpec, takes
from fastonnx.pretrained.graph_spec import FEATURES as FEATURES  # its users import it from here
from fastonnx.pretrained.multimodal_features import (
    as_frames,
    as_video,
    bare_decoder,
    merges_at_placeholders,
    states_from_decoder,
    video_frames,
)
from fastonnx.pretrained.tuple_outputs import (
    NESTED_FIELDS,
    SPLIT_FIELDS,
    TUPLE_FIELDS,
    flattened,
    output_names,
    read,
    scene_text_logits,
)

CLASSES, CLASS_SEQUENCE = "num_classes", "class_sequence_length"
TEXT_BATCH, CHOICES, AUDIO, DECODER_SEQUENCE = (
    "text_batch_size",
    "num_choices",
    "audio_sequence_length",
    "decoder_sequence_length",
)
AUDIO_TOKENS = "audio_tokens"
"""The tokens of a waveform read in whole tokens of samples (Muse Spark's: ``samples_per_token`` x them)."""
AUDIO_FRAMES = "audio_frames"
"""The frames of a waveform its encoder reshapes into frames of samples (Moonshine Streaming's: the
encoder's ``sample_rate`` x ``frame_ms`` samples a frame, x them)."""


def samples_per_frame(config: Any) -> int | None:
    """The samples a waveform encoder reshapes into one frame (Moonshine Streaming's: ``sample_rate`` x
    ``frame_ms`` / 1000, 80 at 16 kHz and 5 ms, on its config or its ``encoder_config``); None for others."""
    for c in (config, getattr(config, "encoder_config", None)):
        rate, ms = getattr(c, "sample_rate", None), getattr(c, "frame_ms", None)
        if isinstance(rate, int) and isinstance(ms, (int, float)) and not isinstance(ms, bool):
            return int(round(rate * ms / 1000.0))
    return None


ENCODER_OUTPUTS: dict[str, tuple[str, ...]] = {
    "feature-extraction": ("last_hidden_state",),
    "question-answering": ("start_logits", "end_logits"),
    "audio-xvector": ("logits", "embeddings"),
    "object-detection": ("logits", "pred_boxes"),
    "image-segmentation": (
        "logits",
        "pred_boxes",
        "pred_masks",
        "class_queries_logits",
        "masks_queries_logits",
    ),
    "depth-estimation": ("predicted_depth",),
    "zero-shot-image-classification": ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"),
    "masked-im": ("reconstruction",),
    "image-to-image": ("reconstruction",),
    "zero-shot-object-detection": ("logits", "pred_boxes"),
    "keypoint-detection": ("heatmaps",),
    "time-series-forecasting": ("prediction_outputs",),
}
"""The output fields an encoder task's graph returns, as transformers names them (else ``logits``)."""

CROSS_MODAL_OUTPUTS = ("language_output", "vision_output")
"""LXMERT's states of its two streams after the cross-modality encoder (it has no last_hidden_state)."""

MASK_DECODER_OUTPUTS = ("pixel_decoder_last_hidden_state", "transformer_decoder_last_hidden_state")
"""MaskFormer's and Mask2Former's per-pixel embeddings and query states, which their heads read (their
base models name no last_hidden_state)."""

CODEC_OUTPUTS = ("latents", "quantized_representation", "audio_codes")
"""A neural audio codec's encoding of a waveform (EnCodec, DAC, Mimi, X-Codec, NeuCodec...): its
continuous latents where it returns them, and the codes its quantizers pick, which speech language models
read. The reconstruction beside them (``audio_values``) is the decoder's, not a feature."""

FALLBACK_OUTPUTS: dict[str, tuple[str, ...]] = {
    # PP-OCR's text detectors return their probability map as last_hidden_state, which their image
    # processor's post_process_object_detection reads
    "object-detection": ("last_hidden_state",),
    # OmDet-Turbo's boxes and class scores, which its processor's post_process_grounded_object_detection
    # reads (with classes_structure: every image the graph's same class count)
    "zero-shot-object-detection": ("decoder_class_logits", "decoder_coord_logits"),
    # a base model without states: two towers (CLIP, SigLIP, ALIGN...) give their embeddings, as optimum's
    # feature-extraction of them does; a fusion model (BridgeTower) its text and image features and their
    # pooled output; a pooled encoder (DPR's) its pooled output
    "feature-extraction": (
        "text_embeds",
        "image_embeds",
        "text_features",
        "image_features",
        "pooler_output",
        *CROSS_MODAL_OUTPUTS,
        *MASK_DECODER_OUTPUTS,
        *TUPLE_FIELDS,  # a backbone's feature maps (HGNetV2Backbone), SAM 2's image embeddings
        *NESTED_FIELDS,  # BLIP-2's Q-Former states
        *CODEC_OUTPUTS,
        # a text-to-speech model's text encoder (FastSpeech2's), before it turns the text into audio
        "encoder_last_hidden_state",
    ),
    # TimesFM's prediction models: the point forecast and the quantiles beside it (mean first)
    "time-series-forecasting": ("mean_predictions", "full_predictions"),
    # LXMERT's visual question answering: a score per answer of its answer vocabulary, not a span
    "question-answering": ("question_answering_score",),
}
"""Fields a task's pipeline reads where the output class declares none of ``ENCODER_OUTPUTS``."""

VARIABLE_COUNTS: dict[str, tuple[str, ...]] = {
    # SuperPoint: the points of its score map above a threshold, a count per image only the data decides
    # (nonzero), padded to the batch's largest in a Python loop over the images
    "keypoint-detection": ("keypoints", "mask"),
}
"""Fields (all declared) of an output holding a data-dependent number of detections, which its
post-processing reads as they are: no graph of a dynamic batch returns them (transformers pads the batch
to its largest count in a Python loop over the images), and none of the dense maps before them serves
that post-processing. Such a model is exported for one image a run (``ONE_IMAGE_OUTPUTS``)."""

ONE_IMAGE_OUTPUTS = ("keypoints", "scores", "descriptors", "mask")
"""What a ``VARIABLE_COUNTS`` model's graph returns, for a batch of 1: its count a data-dependent
length of the outputs (ONNX NonZero), the mask all ones."""

WAVEFORM_SAMPLES = 16000  # one second at the 16 kHz the speech encoders are trained on
FEATURE_FRAMES = 100  # a second of 10 ms frames

_MAX = {BATCH: 1024, TEXT_BATCH: 1024, CHOICES: 1024}

TEXT_TASKS = frozenset(
    {"fill-mask", "text-classification", "token-classification", "question-answering", "multiple-choice"}
)
"""Tasks of text alone: a vision-language model's classifier (Gemma 3's, Qwen3.5's) reads no image there
(its pipeline passes none; images would need their tokens in the text)."""

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


def _output_class(model: torch.nn.Module) -> type | None:
    """The ModelOutput dataclass the forward's return annotation names (``tuple | XOutput``), else the
    one dataclass its source returns by name (``return XOutput(...)``)."""
    return _annotated_class(inspect.signature(model.forward)) or _returned_class(model)


def _annotated_class(signature: inspect.Signature) -> type | None:
    """The first dataclass a return annotation names (``XOutput`` or ``tuple | XOutput``), else None."""
    annotation = signature.return_annotation
    candidates = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    return next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None)


def _returned_class(model: torch.nn.Module) -> type | None:
    forward = inspect.unwrap(type(model).forward)
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return None
    names = set(re.findall(r"^\s*return\s+([A-Za-z_]\w*)\(", source, re.MULTILINE))
    found = [
        c for n in names if isinstance(c := forward.__globals__.get(n), type) and dataclasses.is_dataclass(c)
    ]
    return found[0] if len(found) == 1 else None


TRAJECTORY_OUTPUTS = ("state_preds", "action_preds", "return_preds", "last_hidden_state")
"""A Decision Transformer's predictions of the next state, action and return (what a policy reads), then
its states: its features, as optimum's export of it gives them."""


def output_fields(model: torch.nn.Module, task: str) -> tuple[str, ...]:
    """The task's output fields the model's output class declares, else its ``FALLBACK_OUTPUTS`` it
    declares (all of ``ENCODER_OUTPUTS`` where it declares none of either, or no class is found: a missing
    one is then an error at capture). A Decision Transformer's: ``TRAJECTORY_OUTPUTS``."""
    if takes(model, "returns_to_go") and task == "feature-extraction":
        return TRAJECTORY_OUTPUTS
    if scene_text_logits(model) and task == "feature-extraction":
        return ("logits",)  # MGP-STR's three heads' (tuple_outputs.py)
    wanted = ENCODER_OUTPUTS.get(task, ("logits",))
    cls = _output_class(model)
    if cls is None:
        return wanted
    declared = {f.name for f in dataclasses.fields(cls)}
    for fields in (wanted, FALLBACK_OUTPUTS.get(task, ()), ctc_outputs(model, task)):
        if kept := tuple(f for f in fields if f.partition(".")[0] in declared):
            return kept
    return wanted


def ctc_outputs(model: torch.nn.Module, task: str) -> tuple[str, ...]:
    """A CTC head transformers lists as a base model (Parakeet's, LASR's ``XForCTC`` in MODEL_MAPPING):
    in feature-extraction, the ``logits`` per frame its output declares (not a fallback for every model
    declaring logits: a vision-language base model's would be its language model's)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CTC_MAPPING_NAMES

    ctc = type(model).__name__ in MODEL_FOR_CTC_MAPPING_NAMES.values()
    return ("logits",) if task == "feature-extraction" and ctc else ()


STATE_FLAGS = ("use_cache", "use_mems_eval")
"""Config flags that make a forward keep state for later calls (a cache, XLNet's mems)."""


@contextlib.contextmanager
def states_off(model: torch.nn.Module) -> Iterator[None]:
    """``model``'s configs' ``STATE_FLAGS`` off for the duration. A decoder run as a classifier builds the
    cache its configs ask for (use_cache; XLNet's mems, use_mems_eval), which the graph never returns: its
    sliding-window and conv-state layers slice it by the length, guards on it (XLNet's mems: length <
    512); FSMT's decoder even drops its causal mask under use_cache, expecting one token a call. Not
    use_cache=False: a head may take no such argument, or pass its own beside its **kwargs. The package
    check runs transformers so too: the function the graph is."""
    switched = {
        (id(c), flag): c
        for m in model.modules()
        if (c := getattr(m, "config", None)) is not None
        for flag in STATE_FLAGS
        if getattr(c, flag, None) is True
    }  # by identity: the submodules share configs
    for (_, flag), c in switched.items():
        setattr(c, flag, False)
    try:
        yield
    finally:
        for (_, flag), c in switched.items():
            setattr(c, flag, True)


class Named(torch.nn.Module):
    """An encoder called with keyword inputs, returning fields of its output: one tensor, or a tuple of
    several (question answering's start and end logits)."""

    def __init__(self, model: torch.nn.Module, fields: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.fields = model, fields
        # a σ-VAE codec's forward draws noise into its latents unless told not to (VibeVoice's acoustic
        # tokenizer: ``sample=True``): a graph of a draw matches no run, and a feature user reads the mean
        self.fixed: dict[str, Any] = {"sample": False} if _draws_on_request(model) else {}
        # a codec's encoding read from its ``encode``: its forward decodes too, and the decoder's trim of
        # the reconstruction to the input's length (``if L < audio_values.shape[-1]``) guards the length
        self.encode_kwargs = CodecEncoding.kwargs(model, fields)  # the kwargs only: one path a weight

    def forward(self, **inputs: torch.Tensor) -> Outputs:
        with states_off(self.model):
            out = self.run(inputs)
        found: list[torch.Tensor] = []
        for f in self.fields:
            value = read(out, f)
            if f in SPLIT_FIELDS and (tensors := flattened(value)) is not None:
                found.extend(tensors)
                continue
            if not isinstance(value, torch.Tensor):
                raise InputError(
                    f"{type(self.model).__name__} returned no {f!r} tensor ({type(value).__name__}): its "
                    "output has no such field for these inputs"
                )
            found.append(value)
        return tuple(found) if len(found) > 1 else found[0]

    def run(self, inputs: dict[str, torch.Tensor]) -> Any:
        if self.encode_kwargs is not None:
            encode: Any = self.model.encode  # a method, which nn.Module types as a tensor or module
            return encode(**inputs, **self.encode_kwargs)
        return self.model(**inputs, **self.fixed)


class CodecEncoding(torch.nn.Module):
    """A codec's ``encode`` called as a module, returning its output: what its feature-extraction graph
    runs (in ``Named``) and what the package is checked against (``reference``). Looked up at each call:
    capture swaps some codecs' ``encode`` (capture/codec_paddings.py)."""

    def __init__(self, model: torch.nn.Module, fixed: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.fixed = model, fixed

    @staticmethod
    def kwargs(model: torch.nn.Module, fields: tuple[str, ...]) -> dict[str, Any] | None:
        """What ``encode`` is called with where ``codec_encode`` finds one (else None): asked for its
        output object and, where ``latents`` are read, for them (NeuCodec's, X-Codec2's
        ``output_latents``)."""
        encode = codec_encode(model, fields)
        if encode is None:
            return None
        taken = inspect.signature(encode).parameters
        fixed = {"return_dict": True} if "return_dict" in taken else {}
        if "output_latents" in taken and "latents" in fields:
            fixed["output_latents"] = True
        return fixed

    @classmethod
    def of(cls, model: torch.nn.Module, fields: tuple[str, ...]) -> CodecEncoding | None:
        """The encoding of ``model`` where ``codec_encode`` finds one, else None."""
        fixed = cls.kwargs(model, fields)
        return None if fixed is None else cls(model, fixed)

    def forward(self, **inputs: torch.Tensor) -> Any:
        encode: Any = self.model.encode  # a method, which nn.Module types as a tensor or module
        return encode(**inputs, **self.fixed)


def codec_encode(model: torch.nn.Module, fields: tuple[str, ...]) -> Any:
    """A codec's ``encode`` (EnCodec's, Mimi's, DAC's...) where ``fields`` are all its encoding
    (``CODEC_OUTPUTS``) and the output ``encode`` annotates declares them all; else None (the forward)."""
    encode = getattr(model, "encode", None)
    if not fields or not set(fields) <= set(CODEC_OUTPUTS) or not callable(encode):
        return None
    try:
        signature = inspect.signature(encode)
    except (TypeError, ValueError):
        return None
    returned = _annotated_class(signature)
    declared = {f.name for f in dataclasses.fields(returned)} if returned is not None else set()
    return encode if "input_values" in signature.parameters and set(fields) <= declared else None


def _draws_on_request(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes a ``sample`` flag, on by default (a draw, not an input tensor)."""
    try:
        parameter = inspect.signature(model.forward).parameters.get("sample")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is True


# one module a set of inputs: torch.export binds dynamic shapes to the forward's parameter names
class _Encoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, fields: tuple[str, ...]) -> None:
        super().__init__()
        self.inner = Named(model, fields)


class TextEncoder(_Encoder):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_ids=input_ids, attention_mask=attention_mask)
        return out


class TextEncoderWithTypes(_Encoder):
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        return out


class Seq2SeqTextEncoder(_Encoder):
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoder_input_ids: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        )
        return out


class Seq2SeqFeaturesEncoder(_Encoder):
    def forward(self, input_features: torch.Tensor, decoder_input_ids: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_features=input_features, decoder_input_ids=decoder_input_ids)
        return out


class Seq2SeqWaveformEncoder(_Encoder):
    def forward(self, input_values: torch.Tensor, decoder_input_ids: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_values=input_values, decoder_input_ids=decoder_input_ids)
        return out


class ImageEncoder(_Encoder):
    def forward(self, pixel_values: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(pixel_values=pixel_values)
        return out


class TaskPromptedImageEncoder(_Encoder):
    """OneFormer's: the image and its task prompt's ids (side_inputs.py)."""

    def forward(self, pixel_values: torch.Tensor, task_inputs: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(pixel_values=pixel_values, task_inputs=task_inputs)
        return out


def class_prompt_inputs(
    pixel_values: torch.Tensor,
    classes_input_ids: torch.Tensor,
    tasks_input_ids: torch.Tensor,
    tasks_attention_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """OmDet-Turbo's forward's inputs for the graph's: the class rows flattened, their mask (the cache's
    key: every token) and ``classes_structure`` (each image the same count) made here."""
    images, classes = classes_input_ids.shape[:2]
    flat = classes_input_ids.flatten(0, 1)
    return {
        "pixel_values": pixel_values,
        "classes_input_ids": flat,
        "classes_attention_mask": torch.ones_like(flat),
        "tasks_input_ids": tasks_input_ids,
        "tasks_attention_mask": tasks_attention_mask,
        "classes_structure": torch.full((images,), classes, dtype=torch.int64, device=flat.device),
    }


class ClassPromptedDetector(_Encoder):
    """OmDet-Turbo's: the images, each image's class names (``images`` x ``classes`` x tokens: the same
    count an image) and its task prompt (capture/class_prompts.py)."""

    def forward(
        self,
        pixel_values: torch.Tensor,
        classes_input_ids: torch.Tensor,
        tasks_input_ids: torch.Tensor,
        tasks_attention_mask: torch.Tensor,
    ) -> Outputs:
        from fastonnx.capture.class_prompts import equal_class_counts

        with equal_class_counts():
            out: Outputs = self.inner(
                **class_prompt_inputs(pixel_values, classes_input_ids, tasks_input_ids, tasks_attention_mask)
            )
        return out


class ClassPrompts(torch.nn.Module):
    """OmDet-Turbo called with the graph's inputs, its output as transformers returns it: what the
    package is checked against (transformers' own prompt embedding, cache and loop)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: torch.Tensor) -> Any:
        return self.model(**class_prompt_inputs(**inputs))


class ImageTextEncoder(_Encoder):
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values
        )
        return out


class NaflexImageEncoder(_Encoder):  # SigLIP 2's classifier: patches, their mask, each image's shape
    def forward(
        self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor, spatial_shapes: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            pixel_values=pixel_values,
            pixel_attention_mask=pixel_attention_mask,
            spatial_shapes=spatial_shapes,
        )
        return out


class NaflexImageTextEncoder(_Encoder):  # SigLIP 2's two towers
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        pixel_attention_mask: torch.Tensor,
        spatial_shapes: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=pixel_values,
            pixel_attention_mask=pixel_attention_mask,
            spatial_shapes=spatial_shapes,
        )
        return out


class TrajectoryEncoder(_Encoder):  # a Decision Transformer's trajectories (trajectory_inputs)
    def forward(
        self,
        states: torch.Tensor,
        actions: torch.Tensor,
        returns_to_go: torch.Tensor,
        timesteps: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            states=states,
            actions=actions,
            returns_to_go=returns_to_go,
            timesteps=timesteps,
            attention_mask=attention_mask,
        )
        return out


class SeriesEncoder(_Encoder):
    def forward(self, past_values: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(past_values=past_values)
        return out


class DatedSeriesEncoder(_Encoder):
    def forward(
        self, past_values: torch.Tensor, past_time_features: torch.Tensor, past_observed_mask: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            past_values=past_values,
            past_time_features=past_time_features,
            past_observed_mask=past_observed_mask,
        )
        return out


class PaddedSeriesEncoder(_Encoder):
    def forward(
        self, past_values: torch.Tensor, past_values_padding: torch.Tensor, freq: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(past_values=past_values, past_values_padding=past_values_padding, freq=freq)
        return out


class WaveformEncoder(_Encoder):
    def forward(self, input_values: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_values=input_values)
        return out


class FeaturesEncoder(_Encoder):
    def forward(self, input_features: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_features=input_features)
        return out


class SemanticCodecEncoder(_Encoder):  # X-Codec2, NeuCodec: a waveform and its semantic model's frames
    def forward(self, input_values: torch.Tensor, input_features: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_values=input_values, input_features=input_features)
        return out


class MaskedFeaturesEncoder(_Encoder):
    def forward(self, input_features: torch.Tensor, input_features_mask: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_features=input_features, input_features_mask=input_features_mask)
        return out


class MelEncoder(_Encoder):  # Gemma 3n's audio encoder (speech_features.py)
    def forward(self, audio_mel: torch.Tensor, audio_mel_mask: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(audio_mel=audio_mel, audio_mel_mask=audio_mel_mask)
        return out


# side inputs (side_inputs.py): BROS's boxes, LXMERT's regions, ViTMAE's noise
class BoxedTextEncoder(_Encoder):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        bbox: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, bbox=bbox
        )
        return out


class RegionTextEncoder(_Encoder):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        visual_feats: torch.Tensor,
        visual_pos: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            visual_feats=visual_feats,
            visual_pos=visual_pos,
        )
        return out


class PromptedImageTextEncoder(_Encoder):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        qformer_input_ids: torch.Tensor,
        qformer_attention_mask: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=pixel_values,
            qformer_input_ids=qformer_input_ids,
            qformer_attention_mask=qformer_attention_mask,
        )
        return out


class PlacedImageTextEncoder(_Encoder):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_embeds_position_mask: torch.Tensor,
        pixel_values: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            image_embeds_position_mask=image_embeds_position_mask,
            pixel_values=pixel_values,
        )
        return out


class VideoEncoder(_Encoder):
    def forward(self, pixel_values_videos: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(pixel_values_videos=pixel_values_videos)
        return out


class BoxedPageEncoder(_Encoder):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        bbox: torch.Tensor,
        decoder_input_ids: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=pixel_values,
            bbox=bbox,
            decoder_input_ids=decoder_input_ids,
        )
        return out


class AttendedImageTextEncoder(_Encoder):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        image_attention_mask: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=pixel_values,
            image_attention_mask=image_attention_mask,
        )
        return out


class SoundVideoEncoder(_Encoder):
    def forward(self, input_values: torch.Tensor, pixel_values_videos: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_values=input_values, pixel_values_videos=pixel_values_videos)
        return out


class PromptedImageEncoder(_Encoder):  # SegGPT's image beside its in-context prompt (side_inputs.py)
    def forward(
        self, pixel_values: torch.Tensor, prompt_pixel_values: torch.Tensor, prompt_masks: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            pixel_values=pixel_values, prompt_pixel_values=prompt_pixel_values, prompt_masks=prompt_masks
        )
        return out


class NoisedImageEncoder(_Encoder):
    def forward(self, pixel_values: torch.Tensor, noise: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(pixel_values=pixel_values, noise=noise)
        return out


ENCODERS: dict[tuple[str, ...], type[_Encoder]] = {
    ("input_ids", "attention_mask"): TextEncoder,
    ("input_ids", "attention_mask", "token_type_ids"): TextEncoderWithTypes,
    ("pixel_values",): ImageEncoder,
    ("input_ids", "attention_mask", "pixel_values"): ImageTextEncoder,
    ("input_values",): WaveformEncoder,
    ("past_values",): SeriesEncoder,
    ("past_values", "past_time_features", "past_observed_mask"): DatedSeriesEncoder,
    ("past_values", "past_values_padding", "freq"): PaddedSeriesEncoder,
    ("input_features",): FeaturesEncoder,
    ("input_features", "input_features_mask"): MaskedFeaturesEncoder,
    ("input_values", "input_features"): SemanticCodecEncoder,
    ("audio_mel", "audio_mel_mask"): MelEncoder,
    ("input_ids", "attention_mask", "decoder_input_ids"): Seq2SeqTextEncoder,
    ("input_features", "decoder_input_ids"): Seq2SeqFeaturesEncoder,
    ("input_values", "decoder_input_ids"): Seq2SeqWaveformEncoder,
    ("input_ids", "attention_mask", "token_type_ids", "bbox"): BoxedTextEncoder,
    ("input_ids", "attention_mask", "token_type_ids", "visual_feats", "visual_pos"): RegionTextEncoder,
    ("pixel_values", "noise"): NoisedImageEncoder,
    ("pixel_values", "prompt_pixel_values", "prompt_masks"): PromptedImageEncoder,
    ("pixel_values", "task_inputs"): TaskPromptedImageEncoder,
    ("pixel_values", "classes_input_ids", "tasks_input_ids", "tasks_attention_mask"): ClassPromptedDetector,
    ("pixel_values", "pixel_attention_mask", "spatial_shapes"): NaflexImageEncoder,
    ("input_ids", "attention_mask", "pixel_values", "pixel_attention_mask", "spatial_shapes"): (
        NaflexImageTextEncoder
    ),
    ("states", "actions", "returns_to_go", "timesteps", "attention_mask"): TrajectoryEncoder,
    ("pixel_values_videos",): VideoEncoder,
    ("input_values", "pixel_values_videos"): SoundVideoEncoder,
    ("input_ids", "attention_mask", "pixel_values", "image_attention_mask"): AttendedImageTextEncoder,
    ("input_ids", "attention_mask", "pixel_values", "bbox", "decoder_input_ids"): BoxedPageEncoder,
    ("input_ids", "attention_mask", "image_embeds_position_mask", "pixel_values"): PlacedImageTextEncoder,
    (
        "input_ids",
        "attention_mask",
        "pixel_values",
        "qformer_input_ids",
        "qformer_attention_mask",
    ): PromptedImageTextEncoder,
}


def _sub(config: Any, name: str) -> Any:
    """A composite config's ``name`` sub-config (CLIP's vision_config...), else the config itself."""
    sub = getattr(config, name, None)
    return sub if sub is not None else config


UNICODE_CODEPOINTS = 0x110000
"""The input ids of a model reading characters (CANINE): every Unicode code point, as its tokenizer emits."""


def vocab_bound(config: Any) -> int:
    """One past the largest input id: the vocabulary's size; for CANINE, which has no vocabulary but
    hashes code points into ``num_hash_buckets`` embeddings, the Unicode code points."""
    text = _sub(config, "text_config")
    if getattr(text, "vocab_size", None) is None and isinstance(getattr(text, "num_hash_buckets", None), int):
        return UNICODE_CODEPOINTS
    return int(text.vocab_size)


def text_length(config: Any) -> int:
    """The example's tokens: 7; for CANINE, which pools ``downsampling_rate`` characters into a molecule,
    enough for two molecules and a partial group (torch would specialise a count of 1 molecule)."""
    rate = getattr(config, "downsampling_rate", None)
    return 3 * rate + 3 if isinstance(rate, int) else 7


def text_inputs(
    config: Any, batch: int, sequence: int, device: str | torch.device, types: bool, choices: int = 0
) -> dict[str, torch.Tensor]:
    """Token ids of ``batch`` rows (``batch`` x ``choices`` rows for multiple choice), the second one right-
    padded so that the mask is exercised."""
    g = torch.Generator().manual_seed(0)
    vocab = vocab_bound(config)
    rows = (batch, choices) if choices else (batch,)
    inputs = {
        "input_ids": torch.randint(min(3, vocab - 1), vocab, (*rows, sequence), generator=g),
        "attention_mask": torch.ones(*rows, sequence, dtype=torch.int64),
    }
    if batch > 1:
        inputs["attention_mask"][1, ..., sequence // 2 :] = 0
    _end_with_eos(config, inputs["input_ids"], inputs["attention_mask"])
    if types:
        # TAPAS' token types are one id a table feature (segment, column, row, ranks...): a last axis
        kinds = getattr(_sub(config, "text_config"), "type_vocab_sizes", None)
        extra = (len(kinds),) if isinstance(kinds, list) else ()
        inputs["token_type_ids"] = torch.zeros(*rows, sequence, *extra, dtype=torch.int64)
    return {k: v.to(device) for k, v in inputs.items()}


def _end_with_eos(config: Any, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """A seq2seq model's rows end with one eos each, as its tokenizer writes them (BART's and T5's
    classifiers pool the decoder's state there, and refuse rows without one or with unequal counts)."""
    eos = getattr(_sub(config, "text_config"), "eos_token_id", None)
    if not getattr(config, "is_encoder_decoder", False) or not isinstance(eos, int) or eos < 0:
        return
    ids.masked_fill_(ids == eos, 4 if eos == 3 else 3)  # no other eos in the row (ids start at 3)
    ids.scatter_(-1, mask.sum(-1, keepdim=True) - 1, eos)  # at the last attended position


def _vision_config(config: Any) -> Any:
    """The config holding the image size: the vision tower's (FLAVA's ``image_config``), or, for an
    encoder-decoder whose encoder holds the tower (T5Gemma 2), its encoder's tower's."""
    vision = _sub(_sub(config, "image_config"), "vision_config")
    encoder = getattr(config, "encoder", None)
    if vision is config and not hasattr(config, "image_size") and encoder is not None:
        return _sub(encoder, "vision_config")
    return vision


def image_inputs(config: Any, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    vision = _vision_config(config)
    size = getattr(vision, "image_size", None) or 224
    h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    channels = int(getattr(vision, "num_channels", 3))
    pixels = torch.randn(batch, channels, h, w, generator=torch.Generator().manual_seed(0))
    return {"pixel_values": pixels.to(device)}


IMAGE_PAIRS = frozenset({"efficientloftr", "lightglue", "superglue"})
"""Keypoint matchers, which read two images a row (``batch_size`` x 2 x channels x height x width: the pair
to match, as their processor stacks them)."""


def image_pairs(config: Any, pixels: torch.Tensor) -> torch.Tensor:
    """``pixels`` and a second image beside each where the model matches pairs (``IMAGE_PAIRS``)."""
    if getattr(config, "model_type", None) not in IMAGE_PAIRS:
        return pixels
    other = torch.randn(pixels.shape, generator=torch.Generator().manual_seed(5)).to(pixels.device)
    return torch.stack([pixels, other], dim=1)


FLATTENED_QUERIES = frozenset({"owlvit", "owlv2"})
"""Detectors whose processor flattens an image's text queries into rows of ``input_ids``: batch x queries
rows, the model splitting them by the images' batch."""

QUERIES = "num_queries"


def detection_inputs(
    config: Any, batch: int, images: dict[str, torch.Tensor], device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """A zero-shot detector's text queries and images: OWL-ViT's 2 queries an image as rows of
    ``input_ids``; Grounding DINO's one prompt an image (its classes separated by dots); OmDet-Turbo's
    class names (2 an image, 5 tokens each) and task prompt (7 tokens, the second image's padded by 2)."""
    if "omdet" in str(getattr(config, "model_type", "")):
        names = text_inputs(config, batch * 2, 5, device, False)["input_ids"].reshape(batch, 2, 5)
        task = text_inputs(config, batch, 7, device, False)
        mask = torch.ones_like(task["input_ids"])
        mask[1:, -2:] = 0
        prompts = {
            "classes_input_ids": names,
            "tasks_input_ids": task["input_ids"],
            "tasks_attention_mask": mask,
        }
        dims = {
            "pixel_values": {0: BATCH},
            "classes_input_ids": {0: BATCH, 1: CLASSES, 2: CLASS_SEQUENCE},
            "tasks_input_ids": {0: BATCH, 1: SEQUENCE},
            "tasks_attention_mask": {0: BATCH, 1: SEQUENCE},
        }
        return {**images, **prompts}, dims
    flattened = getattr(config, "model_type", None) in FLATTENED_QUERIES
    text = text_inputs(config, batch * 2 if flattened else batch, 7, device, False)
    rows = TEXT_BATCH if flattened else BATCH
    dims = {"input_ids": {0: rows, 1: SEQUENCE}, "attention_mask": {0: rows, 1: SEQUENCE}}
    return {**text, **images}, {**dims, "pixel_values": {0: BATCH}}


def trajectory_inputs(
    config: Any, batch: int, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """A Decision Transformer's ``batch`` trajectories of 6 steps, as its evaluation loop feeds them: the
    states (``state_dim`` each), the actions (``act_dim``), the returns to go (1), each step's timestep
    (below ``max_ep_len``) and the mask of the steps; batch and steps dynamic. Its forward ignores
    rewards."""
    g, steps = torch.Generator().manual_seed(0), 6
    inputs = {
        "states": torch.randn(batch, steps, int(config.state_dim), generator=g),
        "actions": torch.randn(batch, steps, int(config.act_dim), generator=g),
        "returns_to_go": torch.randn(batch, steps, 1, generator=g),
        "timesteps": torch.randint(0, int(config.max_ep_len), (batch, steps), generator=g),
        "attention_mask": torch.ones(batch, steps, dtype=torch.int64),
    }
    return {k: v.to(device) for k, v in inputs.items()}, {k: {0: BATCH, 1: SEQUENCE} for k in inputs}


def series_inputs(
    model: torch.nn.Module, config: Any, batch: int, device: str | torch.device
) -> dict[str, torch.Tensor]:
    """A forecaster's ``past_values``: ``batch`` series of the config's ``context_length`` steps of
    ``num_input_channels`` channels (its patching takes exactly that many steps). The lagged models
    (Time Series Transformer, Informer, Autoformer) read ``context_length`` plus their largest lag steps of
    ``input_size`` values, each step's ``num_time_features`` and whether it was observed (the first
    series' first 5 steps missing); TimesFM its steps' padding (the first series' first 16) and the
    series' frequency class (0, high); a config naming no ``num_input_channels`` (TimesFM's prediction
    models) one channel, as batch x steps (``any_length_series``: the steps a dynamic dim)."""
    g = torch.Generator().manual_seed(0)
    if takes(model, "past_time_features"):
        steps = int(config.context_length) + max(int(lag) for lag in config.lags_sequence)
        size = int(config.input_size)
        values = torch.randn(batch, steps, *((size,) if size > 1 else ()), generator=g)
        features = torch.randn(batch, steps, int(config.num_time_features), generator=g)
        observed = torch.ones(values.shape)
        observed[0, :5] = 0
        inputs = {"past_values": values, "past_time_features": features, "past_observed_mask": observed}
    elif takes(model, "past_values_padding"):
        values = torch.randn(batch, int(config.context_length), generator=g)
        padding = torch.zeros(values.shape, dtype=torch.int64)
        padding[0, :16] = 1
        inputs = {
            "past_values": values,
            "past_values_padding": padding,
            "freq": torch.zeros(batch, 1, dtype=torch.int64),
        }
    elif any_length_series(model, config):  # a univariate forecaster (TimesFM's prediction models)
        inputs = {"past_values": torch.randn(batch, int(config.context_length), generator=g)}
    else:
        shape = (batch, int(config.context_length), int(config.num_input_channels))
        inputs = {"past_values": torch.randn(*shape, generator=g)}
    return {k: v.to(device) for k, v in inputs.items()}


def any_length_series(model: torch.nn.Module, config: Any) -> bool:
    """Whether a forecaster reads batch x steps series of any length: a config naming no
    ``num_input_channels`` and a forward taking neither time features nor padding (TimesFM's prediction
    models, which pad or cut each series to their context; capture/batched_forecasts.py keeps the steps
    symbolic)."""
    lagged = takes(model, "past_time_features") or takes(model, "past_values_padding")
    return not lagged and not hasattr(config, "num_input_channels")


def whisper_frames(config: Any) -> tuple[int, int] | None:
    """(mel bins, frames) of a Whisper-style encoder's input: its convolutions halve the frames to
    ``max_source_positions``, which the model requires exactly; None for other encoders."""
    if isinstance(getattr(config, "max_source_positions", None), int) and hasattr(config, "num_mel_bins"):
        return int(config.num_mel_bins), 2 * int(config.max_source_positions)
    return None


def frame_size(config: Any) -> int | None:
    """The features a frame of ``input_features`` holds: Wav2Vec2-BERT's projection input, the mel bins
    (the config's or its encoder's / audio tower's: Parakeet, Canary), Speech2Text's features per channel
    times its channels."""
    for c in (config, getattr(config, "encoder_config", None), getattr(config, "audio_config", None)):
        for key in ("feature_projection_input_dim", "num_mel_bins"):
            if isinstance(value := getattr(c, key, None), int):
                # FunASR's low-frame-rate frontend stacks num_stacked_frames mel frames into one (7 x 80)
                return value * int(getattr(c, "num_stacked_frames", 1) or 1)
        per_channel = getattr(c, "input_feat_per_channel", None)
        if isinstance(per_channel, int):
            return per_channel * int(getattr(c, "input_channels", 1))
    return None


WHOLE_HOP_CODECS = ("xcodec",)
"""Codecs read in whole hops of samples (``hop_length`` x ``audio_frames``), as their extractor pads
(X-Codec's, DAC's extractor): X-Codec pads its waveform for its acoustic encoder, or not, by whether its
acoustic frames and its semantic model's differ, a branch on the length's remainder; at whole hops they
never do, for every length alike."""

TRIMMED_SEMANTIC_FRAMES = ("neucodec",)
"""Codecs whose encode trims their semantic and acoustic frames to the shorter (NeuCodec's extractor
makes one semantic frame fewer than the waveform's hops): the two lengths independent, not linked."""


def semantic_codec_inputs(
    config: Any, batch: int, channels: int, g: torch.Generator, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """A codec reading its semantic model's features beside the waveform (X-Codec2, NeuCodec): the
    waveform in whole hops (their extractors pad it to a multiple of the encoder's ``hop_length``) and
    the frames of stacked mel bins their extractor makes (``feature_projection_input_dim`` wide, two
    10 ms frames a 20 ms hop). X-Codec2 concatenates the two encodings, so its features have one frame a
    hop (``audio_frames``, the waveform ``hop x audio_frames``); NeuCodec trims both to the shorter, its
    features their own length."""
    hop = getattr(config, "encoder_hop_length", None) or config.hop_length
    width = int(config.semantic_model_config.feature_projection_input_dim)
    hops = -(-WAVEFORM_SAMPLES // hop)
    wave = torch.randn(batch, channels, hop * hops, generator=g).to(device)
    features = torch.randn(batch, hops, width, generator=g).to(device)
    if getattr(config, "model_type", None) in TRIMMED_SEMANTIC_FRAMES:
        dims = {"input_values": {0: BATCH, 2: AUDIO}, "input_features": {0: BATCH, 1: FEATURES}}
    else:
        frames = {0: BATCH, 1: AUDIO_FRAMES}
        dims = {"input_values": {0: BATCH, 2: f"{hop}*{AUDIO_FRAMES}"}, "input_features": frames}
    return {"input_values": wave, "input_features": features}, dims


def audio_inputs(
    model: torch.nn.Module, config: Any, batch: int, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """A speech model's input and its dynamic dims: a waveform, or the frames of features it reads."""
    g = torch.Generator().manual_seed(0)
    if takes(model, "input_values"):
        if isinstance(getattr(config, "max_length", None), int) and hasattr(config, "num_mel_bins"):
            # Audio Spectrogram Transformer: a fixed number of frames of mel bins (its patches are fixed)
            shape = (batch, int(config.max_length), int(config.num_mel_bins))
            return {"input_values": torch.randn(*shape, generator=g).to(device)}, {"input_values": {0: BATCH}}
        channels = waveform_channels(model, config)
        if channels is not None and takes(model, "input_features"):  # X-Codec2, NeuCodec
            return semantic_codec_inputs(config, batch, channels, g, device)
        if channels is not None and getattr(config, "model_type", None) in WHOLE_HOP_CODECS:
            hop = int(config.hop_length)
            wave = torch.randn(batch, channels, -(-WAVEFORM_SAMPLES // hop) * hop, generator=g)
            return {"input_values": wave.to(device)}, {"input_values": {0: BATCH, 2: f"{hop}*{AUDIO_FRAMES}"}}
        if channels is not None:  # a codec's (EnCodec's, DAC's): batch x channels x samples
            wave = torch.randn(batch, channels, WAVEFORM_SAMPLES, generator=g)
            return {"input_values": wave.to(device)}, {"input_values": {0: BATCH, 2: AUDIO}}
        # whole units of samples: Muse Spark's tokens (as its extractor pads), Moonshine Streaming's frames
        token = getattr(config, "samples_per_token", None)
        tokens = isinstance(token, int) and token > 1
        size, unit = (token, AUDIO_TOKENS) if tokens else (samples_per_frame(config), AUDIO_FRAMES)
        if size is not None and size > 1:
            wave = torch.randn(batch, -(-WAVEFORM_SAMPLES // size) * size, generator=g)
            return {"input_values": wave.to(device)}, {"input_values": {0: BATCH, 1: f"{size}*{unit}"}}
        wave = torch.randn(batch, WAVEFORM_SAMPLES, generator=g)
        return {"input_values": wave.to(device)}, {"input_values": {0: BATCH, 1: AUDIO}}
    whisper = whisper_frames(config)
    if whisper is not None:  # its frames fixed (AudioFlamingo 3's encoder reads their mask too)
        features = torch.randn(batch, *whisper, generator=g)
        return _with_frames_mask(model, features.to(device), {0: BATCH}, 2, device)
    bins = bins_first_width(model)
    if bins is not None:  # GLM-ASR's encoder: batch x mel bins x any number of frames, into a convolution
        features = torch.randn(batch, bins, FEATURE_FRAMES, generator=g)
        return _with_frames_mask(model, features.to(device), {0: BATCH, 2: FEATURES}, 2, device)
    # the model's own first layer over the frames first: Granite Speech 5's reads 4 x its mel bins
    size = first_layer_width(model) or frame_size(config) or embedded_frame_size(model, config)
    if size is None:
        raise InputError(
            f"{type(model).__name__} reads input_features, but its config (nor its encoder_config or "
            "audio_config) names no feature_projection_input_dim, num_mel_bins or input_feat_per_channel: "
            "the size of a frame is unknown"
        )
    features = torch.randn(batch, FEATURE_FRAMES, size, generator=g)
    return _with_frames_mask(model, features.to(device), {0: BATCH, 1: FEATURES}, 1, device)


def _with_frames_mask(
    model: torch.nn.Module,
    features: torch.Tensor,
    axes: dict[int, str],
    frames: int,
    device: str | torch.device,
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """The features (their dims ``axes``, their frames on axis ``frames``) and, where the model reads
    which frames are padding (FunASR-Nano's, AudioFlamingo 3's encoders), their mask: batch x frames, the
    last row's last 5 padding here."""
    inputs, dims = {"input_features": features}, {"input_features": axes}
    if takes(model, "input_features_mask"):
        mask = torch.ones(features.shape[0], features.shape[frames], dtype=torch.int64)
        mask[-1, -5:] = 0
        inputs["input_features_mask"] = mask.to(device)
        dims["input_features_mask"] = {0: BATCH, **({1: FEATURES} if frames in axes else {})}
    return inputs, dims


def encoder_inputs(
    model: torch.nn.Module, config: Any, task: str, batch: int, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """The inputs of ``task``'s graph for ``model`` (``batch`` rows; a text batch one larger beside images)
    and the names of their dynamic dims; an encoder-decoder base model's (feature-extraction) with its
    decoder's tokens (``decoder_inputs``)."""
    inputs, names = _task_inputs(model, config, task, batch, device)
    if task == "feature-extraction" and reads_decoder(model, config) and "decoder_input_ids" not in inputs:
        inputs["decoder_input_ids"] = decoder_inputs(config, batch, device)
        names["decoder_input_ids"] = {0: BATCH, 1: DECODER_SEQUENCE}
    return inputs, names


DECODER_TOKENS = 5
SEQ2SEQ_FEATURES = ("last_hidden_state", "encoder_last_hidden_state")
"""What an encoder-decoder base model's feature-extraction returns: its decoder's states and its encoder's."""


SERIES_FEATURES = ("last_hidden_state", "encoder_last_hidden_state", "loc", "scale")
"""What a lagged or padded forecaster's feature-extraction returns: its states (the decoder's and the
encoder's, where it has both) in the scaled space, and the ``loc`` and ``scale`` that undo the scaling."""


def _returned_fields(model: torch.nn.Module) -> set[str] | None:
    """The fields of the class ``model``'s forward returns (read from its source), None where none is found."""
    returned = _returned_class(model)
    return {f.name for f in dataclasses.fields(returned)} if returned is not None else None


def series_fields(model: torch.nn.Module, inputs: dict[str, torch.Tensor] | None = None) -> tuple[str, ...]:
    """Those of ``SERIES_FEATURES`` the class the forecaster's forward returns declares and, where
    ``inputs`` (on the meta device) are given, returns for them: Autoformer's decoder runs only on future
    values, so its past values alone give no ``last_hidden_state`` (None), only the encoder's."""
    declared = _returned_fields(model) or set()
    fields = tuple(f for f in SERIES_FEATURES if f in declared)
    if inputs is None:
        return fields
    try:
        with torch.no_grad():
            out = model(**inputs)
    except Exception:  # a forward the meta device cannot run: the capture reads the fields instead
        return fields
    return tuple(f for f in fields if getattr(out, f, None) is not None)


def seq2seq_fields(model: torch.nn.Module) -> tuple[str, ...]:
    """Those of ``SEQ2SEQ_FEATURES`` the class an encoder-decoder base model's forward returns declares
    (read from its source, not its annotation: Speech2TextModel's names an LM output it does not return;
    SeamlessM4TModel's does return one, its encoder's states then alone); all where no class is found."""
    declared = _returned_fields(model)
    return tuple(f for f in SEQ2SEQ_FEATURES if declared is None or f in declared)


def reads_decoder(model: torch.nn.Module, config: Any) -> bool:
    """Whether the bare model is an encoder-decoder whose forward runs its decoder (T5Model, BartModel,
    WhisperModel...): it then needs the decoder's tokens, as transformers' own seq2seq base models do (only
    the BART family derives them from ``input_ids`` when none come, which a user's decoder prompt never is).
    A diffusion LM's (Diffusion Gemma's) decoder refines a canvas, which its forward draws at random when
    none comes: the canvas is an input too."""
    canvas = isinstance(getattr(config, "canvas_length", None), int)
    return (bool(getattr(config, "is_encoder_decoder", False)) or canvas) and takes(
        model, "decoder_input_ids"
    )


def decoder_inputs(config: Any, batch: int, device: str | torch.device) -> torch.Tensor:
    """``batch`` decoder prompts of ``DECODER_TOKENS`` tokens starting with the decoder's start token, as
    generation begins them."""
    g = torch.Generator().manual_seed(2)
    vocab = vocab_bound(config.get_text_config(decoder=True))
    ids = torch.randint(min(3, vocab - 1), vocab, (batch, DECODER_TOKENS), generator=g)
    start = getattr(config, "decoder_start_token_id", None)
    if isinstance(start, int) and 0 <= start < vocab:
        ids[:, 0] = start
    return ids.to(device)


def _task_inputs(
    model: torch.nn.Module, config: Any, task: str, batch: int, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    if task == "feature-extraction" and tracks_video(model):
        # a video tracker steps an inference session through the frames: its features are a frame's image
        # embeddings, which that session computes for each frame (embeds_images)
        return image_inputs(config, batch, device), {"pixel_values": {0: BATCH}}
    if takes(model, "returns_to_go"):  # a Decision Transformer's trajectories
        return trajectory_inputs(config, batch, device)
    if takes(model, "past_values"):
        series = series_inputs(model, config, batch, device)
        steps = {1: SEQUENCE} if any_length_series(model, config) else {}
        return series, {name: {0: BATCH, **steps} for name in series}
    text_alone = model_reads_text_alone(model, config, task)  # a vision-language model's features: its text's
    if takes(model, "pixel_values") and task not in TEXT_TASKS and not text_alone:
        # a pose estimator's image size is its backbone's (ViTPose's 256 x 192)
        pose = task == "keypoint-detection" and not hasattr(config, "image_size")
        if one_image_outputs(model, task):  # SuperPoint: one image a run, no dim dynamic
            return image_inputs(_sub(config, "backbone_config") if pose else config, 1, device), {}
        images = image_inputs(_sub(config, "backbone_config") if pose else config, batch, device)
        pixel_dims: dict[str, dict[int, str]] = {"pixel_values": {0: BATCH}}
        if takes(model, "spatial_shapes"):  # SigLIP 2's NaFlex: padded patches (towers_alone.py)
            from fastonnx.pretrained.naflex_images import naflex_images

            images, pixel_dims = naflex_images(_vision_config(config), batch, device)
        images = video_input(config, images)
        # InstructBLIP-Video's frames (its processor's 4), which its forward reads as a 5-D video
        images = {**images, "pixel_values": as_frames(config, images["pixel_values"])}
        images = {**images, "pixel_values": image_pairs(config, images["pixel_values"])}
        if task == "zero-shot-object-detection":
            return detection_inputs(config, batch, images, device)
        if not takes(model, "input_ids"):
            return _with_side_inputs(model, config, images, pixel_dims, device)
        paired = pairs_rows(model)
        text = text_inputs(config, batch if paired else batch + 1, 7, device, False)
        rows = BATCH if paired else TEXT_BATCH
        dims = {"input_ids": {0: rows, 1: SEQUENCE}, "attention_mask": {0: rows, 1: SEQUENCE}}
        prompt, prompt_dims = qformer_prompt(model, config, text["input_ids"].shape[0], rows, device)
        from fastonnx.pretrained.side_inputs import attended_images, image_positions, query_token_prefix

        text, dims = image_positions(model, config, text, dims, device)  # Kosmos-2's image in its prompt
        text = query_token_prefix(model, config, text)  # BLIP-2 retrieval's image tokens before the text
        inputs, dims = {**text, **images, **prompt}, {**dims, **pixel_dims, **prompt_dims}
        inputs, dims = attended_images(model, inputs, dims, device)  # IDEFICS' images a prompt
        return _with_side_inputs(model, config, inputs, dims, device)  # UDOP's words' boxes
    if takes(model, "pixel_values_videos") and not takes(model, "input_ids") and task not in TEXT_TASKS:
        # a video tower alone (V-JEPA 2, VideoPrism's): clips of its frames
        clips, fixed = video_clips(_sub(config, "video_config"), batch, device)
        frames = {"pixel_values_videos": {0: BATCH} if fixed else {0: BATCH, 1: VIDEO_FRAMES}}
        if takes(model, "input_values"):  # Perception Encoder's audio-video encoder: each clip's sound too
            sound, sound_dims = audio_inputs(model, config, batch, device)
            return {**sound, **clips}, {**sound_dims, **frames}
        return clips, frames
    from fastonnx.pretrained.speech_features import speech_inputs

    if (speech := speech_inputs(model, config, batch, device)) is not None:
        return speech  # Qwen3-ASR's chunked encoder, Gemma 3n's (speech_features.py)
    if (takes(model, "input_values") or takes(model, "input_features")) and not text_alone:
        return audio_inputs(model, config, batch, device)
    if (codebooks := _codebook_text(model, config, batch, device)) is not None:
        return codebooks
    if (paired_ids := _paired_text(model, config, batch, device)) is not None:
        return paired_ids
    choices = 3 if task == "multiple-choice" else 0
    text = text_inputs(config, batch, text_length(config), device, takes(model, "token_type_ids"), choices)
    names = {0: BATCH, 1: CHOICES, 2: SEQUENCE} if choices else {0: BATCH, 1: SEQUENCE}
    return _with_side_inputs(model, config, text, {name: names for name in text}, device)


QFORMER_SEQUENCE = "qformer_sequence_length"


def qformer_prompt(
    model: torch.nn.Module, config: Any, rows: int, rows_dim: str, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """InstructBLIP's Q-Former prompt (``qformer_input_ids``: the instruction in the Q-Former's own
    vocabulary, 5 tokens a row, its mask), which its forward requires beside the text; none for a model
    not taking one."""
    if not takes(model, "qformer_input_ids"):
        return {}, {}
    vocab = int(config.qformer_config.vocab_size)
    ids = torch.randint(min(3, vocab - 1), vocab, (rows, 5), generator=torch.Generator().manual_seed(4))
    inputs = {"qformer_input_ids": ids.to(device), "qformer_attention_mask": torch.ones_like(ids).to(device)}
    return inputs, {name: {0: rows_dim, 1: QFORMER_SEQUENCE} for name in inputs}


def _codebook_text(
    model: torch.nn.Module, config: Any, batch: int, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]] | None:
    """MusicGen's ids, one row a codebook (``codebooks`` x ``batch_size`` rows), its mask one a sequence;
    None for a model of one row a sequence."""
    from fastonnx.pretrained.side_inputs import codebook_rows, rows_of

    books = codebook_rows(model, config)
    if books == 1:
        return None
    length = text_length(config)
    ids = text_inputs(config, batch * books, length, device, False)["input_ids"]
    mask = text_inputs(config, batch, length, device, False)["attention_mask"]
    names = {"input_ids": {0: rows_of(BATCH, books), 1: SEQUENCE}, "attention_mask": {0: BATCH, 1: SEQUENCE}}
    return {"input_ids": ids, "attention_mask": mask}, names


PAIRED_IDS = frozenset({"KyutaiSpeechToTextModel", "KyutaiSpeechToTextForConditionalGeneration"})
"""The classes whose ids pair a text token with an audio frame's codes at each position."""


def paired_columns(model: torch.nn.Module, config: Any) -> int:
    """The columns of a position's ids where they pair a text token with an audio frame's codes (Kyutai
    STT's: 1 + ``num_codebooks``, the codes below ``codebook_vocab_size``); 0 for plain ids."""
    return 1 + int(config.num_codebooks) if type(model).__name__ in PAIRED_IDS else 0


def _paired_text(
    model: torch.nn.Module, config: Any, batch: int, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]] | None:
    """Kyutai STT's ids (``paired_columns``), its mask one a position; None for plain ids."""
    columns = paired_columns(model, config)
    if not columns:
        return None
    text = text_inputs(config, batch, text_length(config), device, False)
    text["input_ids"] = paired_ids(text["input_ids"], config, columns)
    return text, {name: {0: BATCH, 1: SEQUENCE} for name in text}


def paired_ids(text_ids: torch.Tensor, config: Any, columns: int) -> torch.Tensor:
    """``text_ids`` with ``columns - 1`` random audio codes (below ``codebook_vocab_size``) beside each
    token: the paired ids of ``paired_columns``, on the ids' device."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, int(config.codebook_vocab_size), (*text_ids.shape, columns - 1), generator=g)
    return torch.cat([text_ids.unsqueeze(-1), codes.to(text_ids.device)], dim=-1)


def _with_side_inputs(
    model: torch.nn.Module,
    config: Any,
    inputs: dict[str, torch.Tensor],
    names: dict[str, dict[int, str]],
    device: str | torch.device,
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """``inputs`` and the side inputs the forward cannot do without (side_inputs.py: BROS's boxes, LXMERT's
    regions, ViTMAE's noise)."""
    from fastonnx.pretrained import side_inputs

    make = side_inputs.text_side_inputs if "input_ids" in inputs else side_inputs.image_side_inputs
    extra, extra_names = make(model, config, inputs, device)
    return {**inputs, **extra}, {**names, **extra_names}


CONTRASTIVE = ("logits_per_image", "logits_per_video", "text_embeds", "image_embeds")
"""Output fields of a two-tower model that embeds its texts and images apart (CLIP, SigLIP, X-CLIP)."""


def pairs_rows(model: torch.nn.Module) -> bool:
    """Whether a model of images and text reads them as pairs, row by row (BridgeTower's cross-modal layers,
    ViLT's joint sequence): its output declares none of ``CONTRASTIVE``; then its text batch is the images'."""
    if takes(model, "image_embeds_position_mask"):  # Kosmos-2's: each prompt holds its own image's rows
        return True
    cls = _output_class(model)
    return cls is not None and not {f.name for f in dataclasses.fields(cls)} & set(CONTRASTIVE)


def _requires(model: torch.nn.Module, name: str) -> bool:
    """Whether ``model``'s forward takes ``name`` with no default."""
    parameter = inspect.signature(model.forward).parameters.get(name)
    return parameter is not None and parameter.default is inspect.Parameter.empty


def model_reads_text_alone(model: torch.nn.Module, config: Any, task: str) -> bool:
    """``reads_text_alone``, unless the model's forward cannot run without its images (BLIP-2's,
    InstructBLIP's: the Q-Former's states are their features, ``qformer_outputs.last_hidden_state``)."""
    return reads_text_alone(config, task) and not _requires(model, "pixel_values")


def reads_text_alone(config: Any, task: str) -> bool:
    """Whether a base model taking ``pixel_values`` reads text alone in ``task``: feature-extraction of a
    model merging image features at placeholder tokens (multimodal_features.py)."""
    return task == "feature-extraction" and merges_at_placeholders(config)


class DecoderStates(Named):
    """The bare decoder's output of a text-alone model whose own has none of the fields
    (``from_decoder``), run under the model's own paths (the checkpoint's names)."""

    def run(self, inputs: dict[str, torch.Tensor]) -> Any:
        return bare_decoder(self.model)(**inputs)


IMAGE_EMBEDDINGS = "image_embeddings"


def embeds_images(model: torch.nn.Module, task: str, fields: tuple[str, ...]) -> bool:
    """Whether feature-extraction of ``model`` returns what its ``get_image_embeddings`` computes: SAM's base
    model, whose forward's output (masks and scores from the prompts) declares none of ``fields``; its
    image embeddings are what its prompt encoder and mask decoder read, computed once an image."""
    if task != "feature-extraction" or not callable(getattr(model, "get_image_embeddings", None)):
        return False
    cls = _output_class(model)
    declared = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    return not any(f.partition(".")[0] in declared for f in fields)


INTERMEDIATE_EMBEDDINGS = "intermediate_embeddings"


def image_embedding_fields(model: torch.nn.Module) -> tuple[str, ...]:
    """The fields of ``image_embeddings_of``: SAM-HQ's method also returns the states after its vision
    encoder's global-attention layers, which its HQ mask decoder reads beside the embeddings."""
    encoder = getattr(model, "vision_encoder", None)
    cls = _output_class(encoder) if isinstance(encoder, torch.nn.Module) else None
    hq = cls is not None and INTERMEDIATE_EMBEDDINGS in {f.name for f in dataclasses.fields(cls)}
    return (IMAGE_EMBEDDINGS, INTERMEDIATE_EMBEDDINGS) if hq else (IMAGE_EMBEDDINGS,)


def tracks_video(model: torch.nn.Module) -> bool:
    """A video tracker (SAM 2 Video's, SAM 3 Tracker Video's, EdgeTAM Video's): its forward takes an
    ``inference_session`` and a frame index, and ``get_image_embeddings`` embeds frames alone."""
    return takes(model, "inference_session") and callable(getattr(model, "get_image_embeddings", None))


def image_embeddings_of(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Any:
    """``model.get_image_embeddings`` as an output with the fields ``image_embeddings`` (and SAM-HQ's
    ``intermediate_embeddings``, a list); an InputError for another form."""
    value = model.get_image_embeddings(**inputs)  # type: ignore[operator]
    if isinstance(value, torch.Tensor) or (
        isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value)
    ):  # one tensor, or a list of a level each (SAM 2's trackers)
        return types.SimpleNamespace(image_embeddings=value)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.Tensor):
        return types.SimpleNamespace(image_embeddings=value[0], intermediate_embeddings=list(value[1]))
    raise InputError(
        f"{type(model).__name__}.get_image_embeddings returns {type(value).__name__}, not the embeddings "
        "(and SAM-HQ's intermediate embeddings): its feature-extraction graph is not made yet"
    )


class ImageEmbeddingStates(Named):
    """SAM's image embeddings (``embeds_images``), run under the model's own paths."""

    def run(self, inputs: dict[str, torch.Tensor]) -> Any:
        return image_embeddings_of(self.model, inputs)


class ImageEmbeddings(torch.nn.Module):
    """What a package of ``embeds_images`` is checked against: the model's ``get_image_embeddings``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: torch.Tensor) -> Any:
        return image_embeddings_of(self.model, inputs)


def from_decoder(model: torch.nn.Module, config: Any, task: str, fields: tuple[str, ...]) -> bool:
    """Whether a text-alone model's ``fields`` come from its bare decoder (multimodal_features.py)."""
    cls = _output_class(model)
    declared = {f.name for f in dataclasses.fields(cls)} if cls is not None else None
    return model_reads_text_alone(model, config, task) and states_from_decoder(model, declared, fields)


def reference(model: torch.nn.Module, config: Any, task: str, fields: tuple[str, ...]) -> torch.nn.Module:
    """What a package of ``task`` is checked against: the model, or its bare decoder (``from_decoder``),
    or OmDet-Turbo called with the graph's inputs (``ClassPrompts``)."""
    if takes(model, "classes_structure"):
        return ClassPrompts(model)
    if embeds_images(model, task, fields):
        return ImageEmbeddings(model)
    if (encoding := CodecEncoding.of(model, fields)) is not None:
        return encoding  # a codec's encode, as its graph runs it
    return bare_decoder(model) if from_decoder(model, config, task, fields) else model


VIDEO_FRAMES = "num_frames"


def timm_image_size(vision: Any) -> Any:
    """The ``img_size`` a timm tower's config passes its model (``model_args``: Perception Encoder's,
    Perception LM's), or None."""
    return (getattr(vision, "model_args", None) or {}).get("img_size")


def video_clips(config: Any, batch: int, device: str | torch.device) -> tuple[dict[str, torch.Tensor], bool]:
    """A video tower's ``pixel_values_videos``: ``batch`` clips of its frames (``num_frames``, V-JEPA 2's
    ``frames_per_clip``) of its image size (V-JEPA 2's ``crop_size``, a timm tower's ``img_size``), batch x
    frames x channels x height x width; and whether the frames' count is the config's (else 3 frames, the count a dynamic dim:
    Perception Encoder's video tower encodes each frame, then attends across any number of them)."""
    declared = video_frames(config) or getattr(config, "frames_per_clip", None)
    frames = declared if isinstance(declared, int) else 3
    vision = _vision_config(config)
    timm = timm_image_size(vision)
    size = getattr(vision, "image_size", None) or getattr(vision, "crop_size", None) or timm or 224
    h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    channels = int(getattr(vision, "num_channels", 3))
    clips = torch.randn(batch, frames, channels, h, w, generator=torch.Generator().manual_seed(0))
    return {"pixel_values_videos": clips.to(device)}, isinstance(declared, int)


def video_input(config: Any, images: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A video encoder's frames of ``images`` (multimodal_features.py), else them."""
    frames = video_frames(config)
    return images if frames is None else as_video(images, frames)


def _declared_features(model: torch.nn.Module, used: set[str]) -> dict[str, tuple[int, int]]:
    """The feature lengths a model itself declares one run takes: Nemotron 3 Diarization's offline chunk
    (diarization_chunks.py; longer audio carries state across chunks)."""
    from fastonnx.capture.diarization_chunks import offline_chunk_features

    chunk = offline_chunk_features(model) if FEATURES in used else None
    return {FEATURES: chunk} if chunk is not None else {}


def min_samples(model: torch.nn.Module) -> int:
    """The fewest waveform samples a speech encoder's convolutions turn into 2 frames: at 1 frame its
    program is another one (a size-1 dim broadcasts), at 0 the model itself fails. SEW's encoders pool
    the frames by the config's ``squeeze_factor`` before attending: 2 pooled frames then."""
    least = 2 * int(getattr(getattr(model, "config", None), "squeeze_factor", 1))
    # the model's own, or its speech encoder's (SpeechT5's prenet)
    lengths = _length_function(model, "_get_feat_extract_output_lengths")
    return 1 if lengths is None else _fewest(lengths, least)


def min_features(model: torch.nn.Module) -> int:
    """The fewest feature frames: 1, unless the model's subsampling (``_get_subsampling_output_length``)
    makes no frame of 1 (LASR's unpadded convolutions fail below their kernel): then, as for a waveform,
    the fewest that make 2 frames; a stacking encoder's (Nemotron 3 Diarization's, Nemotron 3.5
    Transcribe's: ``subsampling_factor`` frames a row) the fewest that make 2 rows."""
    from fastonnx.capture.diarization_chunks import stacking_factor
    from fastonnx.pretrained.speech_features import least_frames

    factor = stacking_factor(model)
    if factor is not None:
        return factor + 1
    if (least := least_frames(model)) is not None:
        return least  # Gemma 3n's audio encoder: 2 blocks of its attention (speech_features.py)
    method = _length_function(model, "_get_subsampling_output_length")
    if method is None:
        return 1

    def lengths(frames: int) -> int:  # Parakeet's reads a tensor
        return int(method(torch.tensor(frames)))

    return 1 if lengths(1) >= 1 else _fewest(lengths, 2)


def _length_function(model: torch.nn.Module, name: str) -> Any:
    """The method ``name`` of the model or of a module in it (its output lengths of input lengths)."""
    return next((f for m in model.modules() if callable(f := getattr(m, name, None))), None)


def _fewest(lengths: Any, least: int) -> int:
    """The fewest inputs ``lengths`` turns into ``least`` outputs (1 if none up to 2**20 do)."""
    low, high = 1, 1 << 20
    if int(lengths(high)) < least:
        return 1
    while low < high:  # the output length grows with the input's
        middle = (low + high) // 2
        low, high = (middle + 1, high) if int(lengths(middle)) < least else (low, middle)
    return low


def encoder(model: torch.nn.Module, config: Any, task: str) -> GraphSpec:
    inputs, names = encoder_inputs(model, config, task, 2, "meta")
    module_cls = ENCODERS.get(tuple(inputs))
    if module_cls is None:
        raise InputError(f"{type(model).__name__}: no {task} graph takes {', '.join(inputs)}")
    fields = one_image_outputs(model, task) or output_fields(model, task)
    if "decoder_input_ids" in inputs:
        fields = seq2seq_fields(model) or fields
    if task == "feature-extraction" and module_cls in (DatedSeriesEncoder, PaddedSeriesEncoder):
        fields = series_fields(model, inputs) or fields
    _refuse_variable_counts(model, task, fields)
    embedded = embeds_images(model, task, fields)  # SAM's: its image embeddings
    if embedded:
        fields = image_embedding_fields(model)
    elif not from_decoder(model, config, task, fields):  # Llama 4's states come from its decoder
        _refuse_no_features(model, task, fields)
    shapes = dynamic_shapes(model, names)
    module = module_cls(model, fields)
    if embedded:
        module.inner = ImageEmbeddingStates(model, fields)
    elif from_decoder(model, config, task, fields):  # Llama 4's: logits alone
        module.inner = DecoderStates(model, fields)
    outputs = list(output_names(model, fields))
    return GraphSpec(module, tuple(inputs.values()), shapes, list(inputs), outputs)


def one_image_outputs(model: torch.nn.Module, task: str) -> tuple[str, ...]:
    """The ``ONE_IMAGE_OUTPUTS`` a model of ``VARIABLE_COUNTS`` declares (SuperPoint's), else ()."""
    cls = _output_class(model)
    counted = VARIABLE_COUNTS.get(task, ())
    declared = [f.name for f in dataclasses.fields(cls)] if cls is not None else []
    if not counted or not set(counted) <= set(declared):
        return ()
    return tuple(f for f in ONE_IMAGE_OUTPUTS if f in declared)


def _refuse_no_features(model: torch.nn.Module, task: str, fields: tuple[str, ...]) -> None:
    """A base model whose output class declares none of the states a feature user reads (VITS's: a
    waveform drawn with random noise and its lengths) has no feature-extraction graph."""
    cls = _output_class(model)
    if task != "feature-extraction" or cls is None:
        return
    declared = [f.name for f in dataclasses.fields(cls)]
    if not any(f.partition(".")[0] in declared for f in fields):
        raise InputError(
            f"{type(model).__name__} returns {cls.__name__} ({', '.join(declared)}): none of the states "
            f"a feature-extraction user reads ({', '.join(fields + FALLBACK_OUTPUTS[task])})"
        )


def _refuse_variable_counts(model: torch.nn.Module, task: str, fields: tuple[str, ...]) -> None:
    cls = _output_class(model)
    counted = VARIABLE_COUNTS.get(task, ())
    if cls is None or not counted:
        return
    declared = {f.name for f in dataclasses.fields(cls)}
    if set(counted) <= declared and not declared & set(fields):
        raise InputError(
            f"{type(model).__name__} returns {', '.join(counted)}: a number of {task} results per image that "
            "only the data decides (a threshold on its score map, padded to the batch's largest in a Python "
            "loop), which its post-processing reads as they are; no ONNX graph of dynamic sizes returns them "
            "as transformers does, and its post-processing cannot start from the dense maps before them"
        )


def dynamic_shapes(model: torch.nn.Module, names: dict[str, dict[int, str]]) -> dict[str, dict[int, Any]]:
    """The dims ``encoder_inputs`` / ``audio_inputs`` name, one ``Dim`` a name: batches up to 1024, a
    waveform from the samples that make 2 frames (``min_samples``), features from ``min_features``, the
    other lengths from 1."""
    used = {d for axes in names.values() for d in axes.values()}
    least = {AUDIO: min_samples(model)} if AUDIO in used else {}
    for d in used:  # whole frames of samples: the fewest frames holding the fewest samples
        size, _, base = d.partition("*")
        if base == AUDIO_FRAMES:
            least[AUDIO_FRAMES] = max(1, -(-min_samples(model) // int(size)))
    if FEATURES in used:
        least[FEATURES] = min_features(model)
    from fastonnx.pretrained.side_inputs import query_prefix

    if SEQUENCE in used and (prefix := query_prefix(model)):
        least[SEQUENCE] = prefix + 2  # BLIP-2 retrieval's image tokens, then at least 2 of text
    declared = _declared_features(model, used)
    least.update({d: low for d, (low, _) in declared.items()})
    most = {d: high for d, (_, high) in declared.items()}
    bases = {
        d.partition("*")[2] or d for d in used
    }  # "4*batch_size": 4 rows a batch row (side_inputs.rows_of)
    dims: dict[str, Any] = {
        d: torch.export.Dim(d, min=least.get(d, 1), max=most.get(d, _MAX.get(d, 1 << 20))) for d in bases
    }
    dims.update({d: int(d.partition("*")[0]) * dims[d.partition("*")[2]] for d in used - bases})
    return {name: {axis: dims[d] for axis, d in axes.items()} for name, axes in names.items()}
