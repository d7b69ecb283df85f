"""The tasks ``export_pretrained`` knows, and which transformers class serves a checkpoint's task.

Each task names the transformers auto mapping (model type -> class name) that lists the architectures
having it; ``task="auto"`` takes the first task whose mapping holds the class the config's
``architectures`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastonnx.errors import InputError


@dataclass(frozen=True)
class Task:
    name: str
    mapping: str  # the name of the transformers.models.auto.modeling_auto mapping of the task
    summary: str


# in the order task="auto" tries them: feature-extraction (the bare model) last
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "text-generation",
            "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            "decoder LM: one model for prefill and decode with a KV cache, genai_config.json for onnxruntime-genai",
        ),
        Task(
            "text2text-generation",
            "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
            "encoder-decoder LM (T5, BART, Marian): encoder, decoder and decoder-with-past files",
        ),
        Task(
            "automatic-speech-recognition",
            "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
            "speech-to-text (Whisper): encoder (input_features), decoder and decoder-with-past files",
        ),
        Task("fill-mask", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked LM: logits per token"),
        Task(
            "text-classification",
            "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
            "sequence classifier: logits",
        ),
        Task(
            "token-classification",
            "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
            "token classifier: logits per token",
        ),
        Task(
            "image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image classifier: logits"
        ),
        Task(
            "question-answering",
            "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
            "extractive question answering: start_logits and end_logits per token",
        ),
        Task("feature-extraction", "MODEL_MAPPING_NAMES", "the bare encoder: last_hidden_state"),
    )
}


def _mapping(task: Task) -> dict[str, Any]:
    from transformers.models.auto import modeling_auto

    mapping: dict[str, Any] = getattr(modeling_auto, task.mapping)
    return mapping


def _class_names(entry: Any) -> list[str]:
    return [entry] if isinstance(entry, str) else [e for e in entry if isinstance(e, str)]


def _has(task: Task, model_type: str, arch: str | None) -> str | None:
    """The class serving ``task`` for this checkpoint: its own architecture when the task's mapping
    lists it, else the mapping's class for the model type; None when the type has no such class."""
    mapping = _mapping(task)
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


def choose(config: dict[str, Any], task: str) -> tuple[Task, str]:
    """The task (``auto`` resolved) and the transformers class name to build for ``config``."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise InputError("config.json has no model_type: not a transformers config")
    archs = config.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    if task == "auto":
        for t in TASKS.values():
            if arch is not None and any(arch in _class_names(v) for v in _mapping(t).values()):
                return t, arch
        for t in TASKS.values():  # the architecture in no task's mapping: the first task the type has
            cls = _has(t, model_type, arch)
            if cls is not None:
                return t, cls
        raise InputError(
            f"cannot tell the task of {arch or model_type}: none of {', '.join(TASKS)} lists it; "
            "pass task= explicitly"
        )
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}: one of auto, {', '.join(TASKS)}")
    cls = _has(TASKS[task], model_type, arch)
    if cls is None:
        raise InputError(
            f"model type {model_type!r} ({arch or 'no architectures entry'}) has no {task} model in "
            "transformers"
        )
    return TASKS[task], cls


def tasks_help() -> str:
    """One line a task, for ``fastonnx export --help``."""
    return "\n".join(f"  {t.name:22s} {t.summary}" for t in TASKS.values())
