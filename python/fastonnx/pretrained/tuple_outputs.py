"""Output fields that hold a tuple of tensors, returned as one named graph output each, and fields of a
nested output.

A backbone base model (HGNetV2Backbone, feature-extraction) returns ``feature_maps``, a tuple of one map a
stage it was asked for (``out_features``), and no ``last_hidden_state``. Its graph returns them as
``feature_maps.0``, ``feature_maps.1``... in the tuple's order, which :func:`read` looks up in an eager
output for the verification.

SAM 2's base model (Sam2Model) returns ``image_embeddings``, its image encoder's features at each of its
``num_feature_levels`` levels (a list), which its mask decoder reads for every prompt: ``image_embeddings.0``
(the finest)... SAM's (one tensor) keeps its one name.

MGP-STR (feature-extraction of its recogniser, the MODEL mapping's class) returns ``logits``, a tuple of
its character, BPE and WordPiece heads' logits: ``logits.0``, ``logits.1``, ``logits.2``.

BLIP-2's base model (Blip2Model) returns its language model's logits and its towers' outputs as nested
outputs, no states of its own: its graph returns the Q-Former's query states,
``qformer_outputs.last_hidden_state`` (what ``Blip2Model.get_qformer_features`` gives a feature user).
"""

from __future__ import annotations

from typing import Any

import torch

TUPLE_FIELDS = ("feature_maps", "image_embeddings", "intermediate_embeddings")
"""Fields that may hold a tuple: a backbone's ``feature_maps`` (a stage each of its ``out_features``), SAM
2's ``image_embeddings`` (a level each of its vision config's ``num_feature_levels``, SAM 3's tracker a
level each of its ``backbone_feature_sizes``), SAM-HQ's ``intermediate_embeddings`` (one after each of
its vision encoder's global-attention layers)."""


SCENE_TEXT_HEADS = ("char", "bpe", "wp")
"""MGP-STR's three recognition heads (characters, BPE and WordPiece tokens), whose logits its ``logits``
field holds in that order: what its processor's ``batch_decode`` reads, its features (``logits.0``...)."""

SPLIT_FIELDS = (*TUPLE_FIELDS, "logits")
"""Fields whose tuple value is returned one output an element: ``TUPLE_FIELDS`` and MGP-STR's ``logits``
(``tuple_count``: one tensor for every other model)."""


def scene_text_logits(model: torch.nn.Module) -> bool:
    """Whether ``model`` is MGP-STR's recogniser, whose ``logits`` are its three heads'."""
    return type(model).__name__ == "MgpstrForSceneTextRecognition"


def tuple_count(model: torch.nn.Module, field: str) -> int | None:
    """How many tensors ``model``'s tuple ``field`` holds; None where it holds one tensor."""
    if field == "logits":
        return len(SCENE_TEXT_HEADS) if scene_text_logits(model) else None
    if field == "feature_maps" and type(model).__name__ == "EfficientLoFTRModel":
        # its coarse states, then the residual stages its fine matching reads: every stage but the first
        # and the last, whose output the coarse transformer turns into the coarse states
        config: Any = model.config
        return len(config.stage_stride) - 1
    if field == "feature_maps":
        return len(getattr(model, "out_features", ()) or ())
    if field == "intermediate_embeddings":  # SAM-HQ's: the states after each global-attention layer
        layers = getattr(getattr(model, "vision_encoder", None), "layers", ())
        return sum(1 for layer in layers if getattr(layer, "window_size", None) == 0)
    vision = getattr(getattr(model, "config", None), "vision_config", None)
    levels = getattr(vision, "num_feature_levels", None)
    if isinstance(levels, int):
        return levels
    # SAM 3's tracker names no level count: its image embeddings are one a backbone feature size
    sizes = getattr(model, "backbone_feature_sizes", None)
    return len(sizes) if isinstance(sizes, (list, tuple)) and sizes else None


def output_names(model: torch.nn.Module, fields: tuple[str, ...]) -> tuple[str, ...]:
    """``fields`` with each tuple field spelled one name an element (``feature_maps.0``...)."""
    names: list[str] = []
    for f in fields:
        count = tuple_count(model, f) if f in SPLIT_FIELDS else None
        if count is not None:
            names.extend(f"{f}.{i}" for i in range(count))
        else:
            names.append(f)
    return tuple(names)


def flattened(value: Any) -> list[torch.Tensor] | None:
    """The tensors of a tuple field's value, or None where it is no tuple of tensors."""
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return None


NESTED_FIELDS = ("qformer_outputs.last_hidden_state",)
"""Fields of a nested output, ``outer.inner``, a base model without states of its own returns."""


def read(out: Any, name: str) -> Any:
    """The value of output ``name`` in a model output: a field, ``field.i`` the i-th of a tuple field, or
    ``outer.inner`` a field of a nested output (None where a part is missing)."""
    field, _, rest = name.partition(".")
    value = getattr(out, field, None)
    if not rest:
        return value
    if rest.isdigit() and field in SPLIT_FIELDS:
        return value[int(rest)] if value is not None else None
    return read(value, rest) if value is not None else None
