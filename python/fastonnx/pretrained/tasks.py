"""The tasks ``export_pretrained`` knows, and which transformers class serves a checkpoint's task.

Each task names the transformers auto mapping (model type -> class name) that lists the architectures
having it; ``task="auto"`` takes the first task whose mapping holds the class the config's
``architectures`` names. text-to-audio (speech_synthesis.py) exports the models synthesizing in one
forward and the loops of SpeechT5 (spectrogram_loops.py) and MusicGen (audio_code_loops.py); ``auto``
takes no other class there (the others generating their audio in a loop keep their other tasks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastonnx.errors import InputError


@dataclass(frozen=True)
class Task:
    name: str
    mappings: tuple[str, ...]  # the transformers.models.auto.modeling_auto mappings of the task
    summary: str
    # (model type, class) pairs of classes no mapping lists (PatchTST's forecaster), named directly
    classes: tuple[tuple[str, str], ...] = ()


# in the order task="auto" tries them: feature-extraction (the bare model) last
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "text-generation",
            ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",),
            "decoder LM: one model for prefill and decode with a KV cache, genai_config.json for onnxruntime-genai",
        ),
        Task(
            "image-text-to-text",
            ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",),
            "vision-language model: vision_encoder, embed_tokens (image features merged) and "
            "decoder_model_merged files",
        ),
        Task(
            "text2text-generation",
            ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",),
            "encoder-decoder LM (T5, BART, Marian): encoder, decoder and decoder-with-past files",
        ),
        Task(
            "automatic-speech-recognition",
            ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "MODEL_FOR_CTC_MAPPING_NAMES"),
            "speech-to-text: Whisper's encoder, decoder and decoder-with-past files; CTC (wav2vec2): logits",
        ),
        Task("fill-mask", ("MODEL_FOR_MASKED_LM_MAPPING_NAMES",), "masked LM: logits per token"),
        Task(
            "text-classification",
            ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
            "sequence classifier: logits",
        ),
        Task(
            "token-classification",
            ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",),
            "token classifier: logits per token",
        ),
        Task(
            "question-answering",
            ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",),
            "extractive question answering: start_logits and end_logits per token",
        ),
        Task(
            "multiple-choice",
            ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",),
            "multiple choice: input_ids of batch x num_choices x sequence, logits per choice",
        ),
        Task(
            "image-classification",
            ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
            "image classifier: logits",
        ),
        Task(
            "zero-shot-object-detection",
            ("MODEL_FOR_ZERO_SHOT_OBJECT_DETECTION_MAPPING_NAMES",),
            "open-vocabulary detector (OWL-ViT, OWLv2): text queries and images, logits and pred_boxes",
        ),
        Task(
            "object-detection",
            ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",),
            "detector (DETR, RT-DETR, YOLOS): logits and pred_boxes per query",
        ),
        Task(
            "image-segmentation",
            (
                "MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES",
                "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES",
                "MODEL_FOR_INSTANCE_SEGMENTATION_MAPPING_NAMES",
            ),
            "panoptic / instance segmentation: class and mask logits per query (DETR: boxes too)",
        ),
        Task(
            "semantic-segmentation",
            ("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",),
            "semantic segmentation: logits per class and pixel",
        ),
        Task(
            "depth-estimation",
            ("MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",),
            "depth estimation: predicted_depth",
        ),
        Task(
            "masked-im",
            ("MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES",),
            "masked image modeling: the reconstructed pixels",
        ),
        Task(
            "image-to-image",
            ("MODEL_FOR_IMAGE_TO_IMAGE_MAPPING_NAMES",),
            "image to image (super-resolution): the reconstructed image",
        ),
        Task(
            "keypoint-detection",
            ("MODEL_FOR_KEYPOINT_DETECTION_MAPPING_NAMES", "MODEL_FOR_POSE_ESTIMATION_MAPPING_NAMES"),
            "pose estimation (ViTPose): heatmaps per keypoint; SuperPoint: one image a run, keypoints of a "
            "data-dependent count",
        ),
        Task(
            "time-series-forecasting",
            ("MODEL_FOR_TIME_SERIES_PREDICTION_MAPPING_NAMES",),
            "forecaster (PatchTST, PatchTSMixer): past_values of batch x context x channels, "
            "prediction_outputs; TimesFM: batch x steps, mean_predictions and full_predictions",
            # their forecasters are in no transformers mapping (optimum's task names them)
            (("patchtst", "PatchTSTForPrediction"), ("patchtsmixer", "PatchTSMixerForPrediction")),
        ),
        Task(
            "zero-shot-image-classification",
            ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
            "two towers (CLIP, SigLIP): logits_per_image, logits_per_text, text_embeds and image_embeds",
        ),
        Task(
            "audio-classification",
            ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",),
            "audio classifier (a waveform or features): logits",
        ),
        Task(
            "audio-frame-classification",
            ("MODEL_FOR_AUDIO_FRAME_CLASSIFICATION_MAPPING_NAMES",),
            "audio frame classifier: logits per frame",
        ),
        Task(
            "audio-xvector",
            ("MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES",),
            "speaker embeddings (x-vectors): logits and embeddings",
        ),
        Task(
            "text-to-audio",
            ("MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES", "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES"),
            "text to speech in one forward (VITS, FastSpeech2Conformer): waveform or spectrogram of a "
            "data-dependent length",
        ),
        Task(
            "feature-extraction",
            ("MODEL_MAPPING_NAMES",),
            "the bare model: last_hidden_state (an encoder-decoder's also takes decoder_input_ids)",
        ),
    )
}


ALIASES: dict[str, str] = {
    # transformers 5 folded its image-to-text mapping (AutoModelForVision2Seq: VisionEncoderDecoder,
    # Pix2Struct, BLIP...) into image-text-to-text's; optimum's and the pipelines' name for it
    "image-to-text": "image-text-to-text",
}
"""Task names that other tools use for one of ``TASKS``: they export as that task."""


def task_mapping(task: Task) -> dict[str, Any]:
    """The task's mappings merged: model type -> class names (a type in several keeps them all)."""
    from transformers.models.auto import modeling_auto

    merged: dict[str, list[str]] = {}
    for name in task.mappings:
        for model_type, entry in getattr(modeling_auto, name, {}).items():
            merged.setdefault(model_type, []).extend(
                c for c in _class_names(entry) if c not in merged.get(model_type, [])
            )
    for model_type, cls in task.classes:
        if cls not in merged.get(model_type, []):
            merged.setdefault(model_type, []).append(cls)
    return merged


def _class_names(entry: Any) -> list[str]:
    return [entry] if isinstance(entry, str) else [e for e in entry if isinstance(e, str)]


def _has(task: Task, model_type: str, arch: str | None) -> str | None:
    """The class serving ``task`` for this checkpoint: its own architecture when the task's mapping
    lists it, else the mapping's class for the model type; None when the type has no such class."""
    mapping = task_mapping(task)
    if arch is not None and any(arch in _class_names(v) for v in mapping.values()):
        return arch
    if task.name == "text-generation" and arch is not None and _generates_text(arch, model_type):
        # a vision-language checkpoint (Qwen3.5-MoE's, Gemma 3's...): its own class, whose text path the
        # package is; the causal-LM class of the model type takes the text config, not this one
        return arch
    names = _class_names(mapping.get(model_type, []))
    return names[0] if names else None


def _generates_text(arch: str, model_type: str) -> bool:
    """Whether ``arch`` is the image-text-to-text class of ``model_type`` in transformers' mapping."""
    from transformers.models.auto import modeling_auto

    vision = getattr(modeling_auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", {})
    return arch in _class_names(vision.get(model_type, []))


def _synthesizes(arch: str | None) -> bool:
    """Whether text-to-audio exports ``arch`` (one forward: VITS, FastSpeech2Conformer; SpeechT5's and
    MusicGen's loops)."""
    from fastonnx.pretrained.speech_synthesis import exported

    return arch is not None and exported(arch)


def _three_files(arch: str) -> bool:
    """Whether the vision-language class takes its images as image-text-to-text exports them: plain
    ``pixel_values`` (LLaVA, InternVL), Qwen-VL's patch grids, or a vision encoder-decoder's images (its
    encoder and decoder files; BLIP's, Pix2Struct's, Florence-2's...: image_encoder_decoders.py);
    Idefics3's tiles it does not yet."""
    import transformers

    from fastonnx.pretrained.grid_vision import GRID_TYPES
    from fastonnx.pretrained.image_encoder_decoders import image_kind
    from fastonnx.pretrained.task_inputs import encodes_images
    from fastonnx.pretrained.vision_language import plain_images

    cls = getattr(transformers, arch, None)
    if cls is None:
        return False
    if encodes_images(cls) or image_kind(cls) is not None:
        return True  # a vision encoder-decoder: text2text's files over an image encoder
    return plain_images(cls) or getattr(cls.config_class, "model_type", None) in GRID_TYPES


def choose(config: dict[str, Any], task: str) -> tuple[Task, str]:
    """The task (``auto`` resolved) and the transformers class name to build for ``config``. ``auto``
    takes a vision-language checkpoint to image-text-to-text where its images are plain pixel values
    or Qwen-VL's grids (even where the causal-LM mapping lists the class too, as Gemma 3's: the whole
    model), else to text-generation (its text path, onnxruntime-genai's package)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise InputError("config.json has no model_type: not a transformers config")
    archs = config.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    if task == "auto":
        vision = TASKS["image-text-to-text"]
        if (
            arch is not None
            and _three_files(arch)
            and any(arch in _class_names(v) for v in task_mapping(vision).values())
        ):
            return vision, arch  # the whole model, before the causal-LM mapping's text path (Gemma 3's)
        for t in TASKS.values():
            if t.name == "image-text-to-text" and arch is not None and not _three_files(arch):
                continue  # images as tiles: the text path's package (text-generation) below
            if t.name == "text-to-audio" and not _synthesizes(arch):
                continue  # a model generating its audio in a loop: its other tasks' packages
            if arch is not None and any(arch in _class_names(v) for v in task_mapping(t).values()):
                return t, arch
        for t in TASKS.values():  # the architecture in no task's mapping: the first task the type has
            cls = _has(t, model_type, arch)
            if cls is not None and (t.name != "text-to-audio" or _synthesizes(cls)):
                return t, cls
        raise InputError(
            f"cannot tell the task of {arch or model_type}: none of {', '.join(TASKS)} lists it; "
            "pass task= explicitly"
        )
    task = ALIASES.get(task, task)
    if task not in TASKS:
        known = ", ".join([*TASKS, *ALIASES])
        raise InputError(f"unknown task {task!r}: one of auto, {known}")
    cls = _has(TASKS[task], model_type, arch)
    if cls is None:
        raise InputError(
            f"model type {model_type!r} ({arch or 'no architectures entry'}) has no {task} model in "
            "transformers"
        )
    if task == "text-to-audio":
        from fastonnx.pretrained.speech_synthesis import refuse

        refuse(cls)  # a model generating its audio in a loop, refused before its weights are read
    return TASKS[task], cls


def tasks_help() -> str:
    """One line a task, for ``fastonnx export --help``."""
    lines = [f"  {t.name:22s} {t.summary}" for t in TASKS.values()]
    return "\n".join(lines + [f"  {a:22s} the same as {t}" for a, t in ALIASES.items()])
