"""torch.export with the user's dynamic shapes, retried the way that keeps the most of them when its
constraints refuse them. Each refinement is one step, tried in this order, each at most once per round:

0. ``crashed_suggestions_as_dynamic``: torch refused, but crashed stating its fixes (an empty range
   for a derived Dim's root: a codec's length through nested ``//`` and ``%``), so no Dim is named:
   every named Dim captured as Dim.DYNAMIC, checked by guards.py as in 2.
1. ``drop_size_oblivious``: retry without size-oblivious reasoning. It is process-wide in torch, so only
   when no requested dim's example size is 0 or 1: size-oblivious reasoning is what keeps those
   symbolic, and it generates guards such as ``batch != 1`` that plain torch.export does not.
2. ``unproven_as_dynamic``: the named Dims whose guards torch could not prove over their ranges, which it
   would bound or fix, captured as Dim.DYNAMIC (guards.py then checks the ranges asked for size by size).
3. ``torch_fixes``: the fixes torch suggests (``Dim('sequence', max=512)``, ``n = 2*_n``) applied.
4. ``size_one_guards_checked``: the first refusal, under size-oblivious reasoning, named only a size's
   ``!= 1`` guards (what it makes of a branch on a size of 1: Mamba's ``seq_len == 1`` decode path), and
   the retries without it found no way (torch's fixes refused or themselves refused, a derived Dim's
   minimum below 0): back to size-oblivious reasoning with those Dims checked by guards.py as in 2 (it
   accepts those guards: the branch taken for 2 and more holds for 1; ``> 1`` is the same guard).

Each change is logged; the error, when every step fails, chains torch's first refusal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fastonnx.capture import (
    dynamic_dims,
    fused_experts,  # noqa: F401  (defines fastonnx::routed_experts, as rnn_custom_ops its ops)
)
from fastonnx.capture.audio_windows import masked_audio_windows
from fastonnx.capture.batched_forecasts import batched_forecasts
from fastonnx.capture.chunked_kernels import length_following_kernels
from fastonnx.capture.class_prompts import batched_class_prompts
from fastonnx.capture.codec_paddings import guard_free_codec_paddings
from fastonnx.capture.control_buffers import buffers_as_numbers
from fastonnx.capture.depth_patches import symbolic_depth_patches
from fastonnx.capture.diarization_chunks import one_chunk_diarization
from fastonnx.capture.document_patches import gathered_document_patches
from fastonnx.capture.expert_loops import every_expert
from fastonnx.capture.grouped_linear import stored_grouped_linear
from fastonnx.capture.guards import locate_guards
from fastonnx.capture.length_regulators import gathered_length_regulators
from fastonnx.capture.naflex_positions import tensor_naflex_positions
from fastonnx.capture.pooling_by_positions import pooling_by_comparison
from fastonnx.capture.rnn_custom_ops import rnn_as_custom_ops
from fastonnx.capture.seq2seq_shifts import guard_free_seq2seq_shifts
from fastonnx.capture.series_masks import unmasked_series_encoders
from fastonnx.capture.speech_encoders import guard_free_speech_encoders
from fastonnx.capture.symbolic_take_along import symbolic_take_along_dims
from fastonnx.capture.text_encoder_swaps import guard_free_text_encoders
from fastonnx.capture.traceable_detection import traceable_detection_ops
from fastonnx.capture.video_queries import scanned_video_frames
from fastonnx.errors import CaptureError
from fastonnx.torch_internals import backed_size_oblivious, is_traceable_wrapper_subclass, pytree

if TYPE_CHECKING:  # stamping.py is imported when a dynamic-shape capture first needs it
    from fastonnx.capture.request import Request
    from fastonnx.capture.stamping import LayerPlan

log = logging.getLogger("fastonnx")

_MAX_ATTEMPTS = 6  # the first try, without size-oblivious reasoning, unproven Dims checked by
# guards.py, two rounds of torch's fixes, and back to size-oblivious reasoning


@dataclasses.dataclass
class Exported:
    """What the refined export made, and what it changed to make it."""

    ep: torch.export.ExportedProgram
    reason: str | None  # torch's explanation of the last refusal, when there was one
    fixes: list[str] | None  # torch's suggested fixes applied
    oblivious: bool | None  # size-oblivious reasoning at the end (None: no dynamic shapes)
    stamped: bool = False  # layers stamped (stamping.py)
    stamp_refused: str | None = None  # why stamping was given up after the plan was made


@dataclasses.dataclass
class _Attempt:
    """The request as the next try will send it, and what the refinements changed of it so far."""

    shapes: Any
    original: Any  # the shapes asked for
    oblivious: bool
    may_drop: bool  # size-oblivious reasoning may be dropped
    fixes: list[str] = dataclasses.field(default_factory=list)
    checked: bool = False  # named Dims captured as Dim.DYNAMIC for guards.py to check
    first_refusal: str | None = None  # torch's first message


def export_refined(request: Request, layers: LayerPlan | None = None) -> Exported:
    """torch.export of ``request.model`` (``layers``: stamping's plan), refined until it is accepted
    or no refinement is left (CaptureError)."""
    shapes = request.dynamic_shapes
    attempt = _Attempt(
        shapes,
        shapes,
        oblivious=shapes is not None,
        may_drop=shapes is not None and not _example_size_below_two(request),
    )
    reason: str | None = None
    failures: list[Exception] = []
    for _ in range(_MAX_ATTEMPTS):
        try:
            ep, given_up = _export(request, attempt.shapes, attempt.oblivious, layers)
        except Exception as e:  # torch raises many types; its message is what the user needs
            message = getattr(e, "msg", None) or str(e)
            failures.append(e)
            if "Constraints violated" not in message and dynamic_dims.SUGGESTION_CRASH not in message:
                # torch's fixes themselves refused (a derived Dim's min below 0): refinement 4 may still
                # hold, from the first refusal
                if not size_one_guards_checked(attempt, message, request.name):
                    break
                continue
            reason = message.split("\nThe error above occurred")[0]
            attempt.first_refusal = attempt.first_refusal or message
            if not any(step(attempt, message, request.name) for step in REFINEMENTS):
                break
            continue
        return Exported(
            ep,
            reason,
            attempt.fixes or None,
            attempt.oblivious if shapes is not None else None,
            stamped=layers is not None and given_up is None,
            stamp_refused=given_up,
        )
    # chained to torch's first error: its traceback holds the user's line (the report reads it there)
    raise _export_error(request.model, failures, attempt) from failures[0]


def drop_size_oblivious(attempt: _Attempt, message: str, name: str) -> bool:
    """Refinement 1: the next try without size-oblivious reasoning."""
    if not (attempt.may_drop and attempt.oblivious):
        return False
    attempt.oblivious = False
    log.warning(
        "torch.export refused the dynamic_shapes of %s under size-oblivious reasoning; retrying "
        "without it (no requested dim has an example size of 0 or 1)",
        name,
    )
    return True


def unproven_as_dynamic(attempt: _Attempt, message: str, name: str) -> bool:
    """Refinement 2: torch cannot prove a guard over a named Dim's range and would bound or fix the
    Dim (its solver does not prove (s + (64 - s % 64) % 64) // 64 == 1 over [2, 64] either): the Dim
    captured as Dim.DYNAMIC instead; guards.py checks the range asked for size by size and names the
    guards (fixes that relate Dims, n = 2*_n, are left to refinement 3, checked the same)."""
    if attempt.checked:
        return False
    unproven = dynamic_dims.unproven_dims(message, attempt.shapes)
    if not unproven or not dynamic_dims.fixes_bound_or_fix(message, unproven):
        return False
    return _checked_as_dynamic(attempt, unproven, "could not prove its guards over", name)


def crashed_suggestions_as_dynamic(attempt: _Attempt, message: str, name: str) -> bool:
    """Refinement 0: torch refused the dynamic shapes but crashed building its fixes (an empty range
    for a derived Dim's root), so the message names no Dim: every named Dim captured as Dim.DYNAMIC,
    guards.py checking the ranges asked size by size, as in 2 (before 1: it keeps size-oblivious
    reasoning, whose guards on a size of 1 guards.py accepts)."""
    if attempt.checked or dynamic_dims.SUGGESTION_CRASH not in message:
        return False
    names = dynamic_dims.root_dims(attempt.shapes)
    if not names:
        return False
    return _checked_as_dynamic(attempt, names, "could not state its fixes for", name)


def _checked_as_dynamic(attempt: _Attempt, dims: set[str], why: str, name: str) -> bool:
    """The next try with ``dims`` captured as Dim.DYNAMIC, guards.py checking the sizes asked for after
    the capture (refinements 0 and 2)."""
    attempt.shapes, attempt.checked = dynamic_dims.as_dynamic(attempt.shapes, dims), True
    log.info(
        "torch.export %s %s of %s; capturing them as Dim.DYNAMIC, the sizes asked for are checked after "
        "the capture",
        why,
        ", ".join(sorted(dims)),
        name,
    )
    return True


def torch_fixes(attempt: _Attempt, message: str, name: str) -> bool:
    """Refinement 3: the fixes torch suggests, applied to the dynamic shapes."""
    refined = dynamic_dims.refine(message, attempt.shapes)
    if refined is None:
        return False
    attempt.shapes, new = refined
    attempt.fixes.extend(new)
    log.warning(
        "torch.export refused the dynamic_shapes of %s; retrying with its suggested fixes: %s",
        name,
        "; ".join(new),
    )
    return True


def size_one_guards_checked(attempt: _Attempt, message: str, name: str) -> bool:
    """Refinement 4: back to size-oblivious reasoning, the Dims of the first refusal's ``!= 1`` guards
    checked by guards.py."""
    first = attempt.first_refusal
    if attempt.oblivious or attempt.checked or first is None or not dynamic_dims.size_one_guards_only(first):
        return False
    # torch's fixes for those guards alone (``n = 120*_n - 80``, a length a whole number of frames
    # past one frame) are what they say, not a relation to keep: the Dims are checked as in 2
    unproven = dynamic_dims.unproven_dims(first, attempt.original)
    if not unproven:
        return False
    attempt.oblivious, attempt.fixes, attempt.checked = True, [], True
    attempt.shapes = dynamic_dims.as_dynamic(attempt.original, unproven)
    log.info("%s: back to size-oblivious reasoning, its guards on a size of 1 checked", name)
    return True


REFINEMENTS: tuple[Callable[[_Attempt, str, str], bool], ...] = (
    crashed_suggestions_as_dynamic,
    drop_size_oblivious,
    unproven_as_dynamic,
    torch_fixes,
    size_one_guards_checked,
)
"""The refinements in the order they are tried; the first that applies changes the next try."""


def _export(
    request: Request, shapes: Any, oblivious: bool, layers: LayerPlan | None
) -> tuple[torch.export.ExportedProgram, str | None]:
    """torch.export of the model, with ``layers`` (a stamping.LayerPlan) of the prefix and the rest
    stamped; the second value is why stamping was given up (the whole model then captured)."""
    model, args, kwargs = request.model, request.args, request.kwargs

    def whole() -> torch.export.ExportedProgram:
        return torch.export.export(model, args, kwargs, dynamic_shapes=shapes, strict=False)

    # nn.LSTM / GRU / RNN as custom ops whose batch and sequence dims stay symbolic; torchvision's
    # detection post-processing in a traceable form; chunked kernels in a form whose loop follows the
    # length; experts loops over every expert, not the ones hit; seq2seq models' shift of input_ids
    # without a guard; SEW's pooling and the conformer's relative positions without one (see
    # rnn_custom_ops.py, traceable_detection.py, chunked_kernels.py, expert_loops.py, seq2seq_shifts.py,
    # speech_encoders.py); UDOP's merge of words and patches without data-dependent sizes
    # (document_patches.py)
    # one ExitStack: a with statement of that many managers nests past Python's 20 static blocks
    forms = (
        rnn_as_custom_ops(),
        traceable_detection_ops(),
        length_following_kernels(),
        guard_free_seq2seq_shifts(),
        guard_free_speech_encoders(),
        gathered_document_patches(),
        one_chunk_diarization(),  # diarization_chunks.py
        masked_audio_windows(),  # audio_windows.py: Qwen3-ASR's windows as one masked attention
        pooling_by_comparison(),  # Gemma 4's pooled rows following the patches (pooling_by_positions.py)
        symbolic_depth_patches(),  # DepthPro's patch counts following the batch (depth_patches.py)
        symbolic_take_along_dims(),  # torch's take_along_dim specialises every dim
        guard_free_text_encoders(),  # CPM-Ant, FSMT, Longformer (text_encoder_swaps.py)
        gathered_length_regulators(),  # FastSpeech2's frames per phoneme (length_regulators.py)
        guard_free_codec_paddings(),  # EnCodec's, Mimi's, PocketTTS's conv paddings (codec_paddings.py)
        unmasked_series_encoders(),  # Informer's and Autoformer's unpadded masks (series_masks.py)
        batched_forecasts(),  # TimesFM's series as one batch x steps tensor (batched_forecasts.py)
        scanned_video_frames(),  # VideoMT's frames as a scan (video_queries.py)
        every_expert(model),
        buffers_as_numbers(model),  # EoMT's attn_mask_probs, read by its ifs (control_buffers.py)
        batched_class_prompts(),  # OmDet-Turbo's prompts embedded without guards (class_prompts.py)
        tensor_naflex_positions(),  # SigLIP 2's positions following spatial_shapes (naflex_positions.py)
        stored_grouped_linear(),
        size_oblivious(oblivious),
        locate_guards(),
    )
    with contextlib.ExitStack() as stack:
        for form in forms:
            stack.enter_context(form)
        if layers is None:
            return whole(), None
        from fastonnx.capture import stamping

        try:
            return stamping.export_stamped(model, layers, whole), None
        except stamping.StampRefused as e:
            log_stamp_refusal(request.name, e)
            return whole(), str(e)


def log_stamp_refusal(name: str, reason: Exception) -> None:
    log.info("capture='auto' captures every layer of %s with torch.export: %s", name, reason)


def _export_error(model: Any, failures: list[Exception], attempt: _Attempt) -> CaptureError:
    """torch's first refusal, the last one when refinements were tried, and the subclass note."""
    retried = (
        ""
        if len(failures) == 1
        else "\nand failed again after retrying ("
        + "; ".join((["without size-oblivious reasoning"] if attempt.may_drop else []) + attempt.fixes)
        + f"): {failures[-1]}"
    )
    return CaptureError(
        f"torch.export.export failed on {type(model).__name__}: {failures[0]}{retried}{_subclass_weights(model)}"
    )


def _subclass_weights(model: torch.nn.Module) -> str:
    """A note naming the weights that are tensor subclasses (torchao's quantized tensors...): their
    own kernels run inside torch.export, and an error there is theirs."""
    found = [
        f"{n} ({type(t).__module__}.{type(t).__qualname__})"
        for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
        if is_traceable_wrapper_subclass(t.data if isinstance(t, torch.nn.Parameter) else t)
    ]
    if not found:
        return ""
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (
        f"\n(the model's weights {shown} are tensor subclasses: the error above may come from their "
        "own kernels, which torch.export runs)"
    )


def _example_size_below_two(request: Request) -> bool:
    """Whether a dim asked to be dynamic has an example size of 0 or 1 (``requested`` keys: the
    tensor's place among the tensor leaves of the inputs, the axis)."""
    leaves = pytree.tree_leaves((request.args, request.kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    return any(i < len(tensors) and tensors[i].shape[axis] < 2 for i, axis in request.requested)


@contextlib.contextmanager
def size_oblivious(enabled: bool) -> Iterator[None]:
    """torch.export's size-oblivious reasoning (as torch.onnx sets it): a dynamic dim whose example
    size is 0 or 1 stays symbolic instead of being specialised to that size."""
    if not enabled:
        yield
        return
    with backed_size_oblivious():
        yield
