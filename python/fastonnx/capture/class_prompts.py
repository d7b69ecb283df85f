"""OmDet-Turbo's class and task prompts embedded as one batch while captured.

Its ``get_language_embedding`` embeds each class name and task prompt through an LRU cache keyed by the
ids' values (``tolist``), regroups the class embeddings by ``classes_structure`` (each image's class count)
in a Python loop, and cuts the task prompts to their longest unpadded length (``.item()``): every step a
guard on data, which torch.export refuses. zero-shot-object-detection's graph gives every image the same
number of classes (``ClassPromptedDetector``, encoder_tasks.py), and inside it (``equal_class_counts``)
the form embeds all class names in one call and reshapes them to classes x images x width, and embeds the
task prompts whole, returning their mask as given: the padded positions the eager cut drops are masked
out by that mask in the decoder's attention. The cache only saves recomputing: the values are those of
the eager path, which the package's verification compares. Outside ``equal_class_counts`` (OmDet-Turbo
exported on its own, image class counts of any value) transformers' code runs as it is. Its decoder's
anchors are computed anew while captured, not from their ``lru_cache``."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms

_EQUAL_COUNTS = contextvars.ContextVar("equal_class_counts", default=False)


@contextlib.contextmanager
def equal_class_counts() -> Iterator[None]:
    """While active, the forward's ``classes_structure`` gives every image the same count."""
    token = _EQUAL_COUNTS.set(True)
    try:
        yield
    finally:
        _EQUAL_COUNTS.reset(token)


def _batched(form: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    def language_embedding(self: Any, *args: Any, **kwargs: Any) -> Any:
        return (form if _EQUAL_COUNTS.get() else original)(self, *args, **kwargs)

    return language_embedding


def batched_language_embedding(
    self: Any,
    classes_input_ids: torch.Tensor,
    classes_attention_mask: torch.Tensor,
    tasks_input_ids: torch.Tensor,
    tasks_attention_mask: torch.Tensor,
    classes_structure: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Classes x images x width class embeddings, sequence x images x width task states and their mask."""
    del classes_attention_mask, classes_structure  # the cache's key; the counts all equal
    classes = self.language_backbone(classes_input_ids, encode_type="class")
    images = tasks_input_ids.shape[0]
    grouped = classes.reshape(images, -1, classes.shape[-1]).transpose(0, 1)
    states = self.language_backbone.model(tasks_input_ids)[0]
    return grouped, states.transpose(0, 1), tasks_attention_mask


FORMS = {"omdet_turbo": {"OmDetTurboPreTrainedModel.get_language_embedding": batched_language_embedding}}


def _uncached(form: Callable[..., Any], original: Any) -> Any:
    del form
    return getattr(original, "__wrapped__", original)


# the decoder's anchors are an lru_cache of the feature maps' sizes: a capture would cache its fake tensors,
# which the next capture (a retry, another graph) then finds as constants without values
UNCACHED = {"omdet_turbo": {"OmDetTurboDecoder.generate_anchors": _uncached}}


@contextlib.contextmanager
def batched_class_prompts() -> Iterator[None]:
    """While active, a loaded OmDet-Turbo embeds its prompts as one batch inside ``equal_class_counts``
    and computes its anchors anew."""
    with swapped_forms(FORMS, wrap=_batched), swapped_forms(UNCACHED, wrap=_uncached):
        yield
