"""VideoMT's frames, swapped while torch.export captures for a form whose frame count stays symbolic.

``VideomtForUniversalSegmentation.forward`` encodes every frame of ``pixel_values_videos`` (batch x
frames x channels x height x width) through its first layers as one batch, then walks the frames in a
Python loop: each frame's query tokens (the learned queries on the first frame; on each later one the
``query_updater`` of the previous frame's queries after its last layers, plus the learned queries) are put
before the frame's patches and run through its last ``num_blocks`` layers, and the frame's mask and class
logits are predicted from them. A Python loop over ``range(num_frames)`` makes torch.export specialise the
frames. The model takes any number of frames (nothing it holds is sized by them), so the loop is a
``scan`` over the frames (an ONNX ``Scan``), carrying the next frame's query tokens: the learned queries
first, ``query_updater(queries) + learned`` after each frame (computed once more after the last frame,
unread). Each frame's outputs are stacked frame-major, as transformers concatenates them (frames x batch
rows). Only the modules already imported are swapped (model_swaps.py), for the duration of the capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import Forms, as_transformers_forward, swapped_forms
from fastonnx.errors import CaptureError
from fastonnx.torch_internals import scan


def videomt_frames_scanned(
    self: Any,
    pixel_values_videos: torch.Tensor | None = None,
    mask_labels: Any = None,
    class_labels: Any = None,
    patch_offsets: Any = None,
    **kwargs: Any,
) -> Any:
    """``VideomtForUniversalSegmentation.forward`` with its loop over the frames as a ``scan``."""
    from transformers.models.videomt.modeling_videomt import VideomtForUniversalSegmentationOutput

    if pixel_values_videos is None or pixel_values_videos.ndim != 5:
        raise CaptureError(
            f"{type(self).__name__} is captured with pixel_values_videos of batch x frames x channels x "
            "height x width"
        )
    if mask_labels is not None or class_labels is not None:
        raise CaptureError(
            f"{type(self).__name__} is captured without mask_labels and class_labels (training)"
        )
    batch, frames, channels, height, width = pixel_values_videos.shape
    hidden_states = self.embeddings(pixel_values_videos.reshape(batch * frames, channels, height, width))
    query_start = self.num_hidden_layers - self.config.num_blocks
    for layer in self.layers[:query_start]:
        hidden_states = layer(hidden_states)
    hidden_states = hidden_states.view(batch, frames, hidden_states.shape[1], hidden_states.shape[2])
    queries = self.config.num_queries
    last_layers = self.layers[query_start:]

    def frame_step(query_tokens: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, Any]:
        states = torch.cat((query_tokens, frame), dim=1)
        for layer in last_layers:
            states = layer(states)
        sequence_output = self.layernorm(states)
        masks, classes = self.predict(sequence_output)
        # the weight itself, not a tensor made from it outside the body (the scan would give that
        # one's dims symbols of their own)
        next_tokens = self.query_updater(states[:, :queries, :]) + self.query.weight
        return next_tokens, (masks, classes, sequence_output)

    first = (
        self.query.weight[None, :, :].expand(batch, -1, -1).clone()
    )  # a scan's carry may not alias a weight
    # without gradients: a scan whose body reads weights that require them is captured with its
    # backward's bookkeeping, which specialises the batch (the capture is for inference only)
    with torch.no_grad():
        _, (masks, classes, sequence) = scan(frame_step, first, hidden_states.transpose(0, 1))
    return VideomtForUniversalSegmentationOutput(
        loss=None,
        masks_queries_logits=masks.flatten(0, 1),
        class_queries_logits=classes.flatten(0, 1),
        last_hidden_state=sequence.flatten(0, 1),
    )


SWAPS: Forms = {"videomt": {"VideomtForUniversalSegmentation.forward": videomt_frames_scanned}}
"""transformers' model types and the ``Class.method``s swapped (model_swaps.py)."""


@contextlib.contextmanager
def scanned_video_frames() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have their scanned forms."""
    with swapped_forms(SWAPS, as_transformers_forward):
        yield
