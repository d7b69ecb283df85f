"""feature-extraction of a bare image-grid vision tower (Qwen2.5-VL's, Qwen3-VL's, Qwen3.5's, GLM-4V's,
EXAONE 4.5's ``XVisionModel`` in transformers' MODEL mapping): the tower alone, as the vision-language
package's ``vision_encoder.onnx`` computes it (grid_vision.py's form, for any grid).

transformers' forward of these towers takes ``hidden_states`` (the processor's patches) and ``grid_thw``
and returns ``pooler_output``, the merged tokens' features (in the image's order), beside
``last_hidden_state``, the patches' states before the merge (Qwen2.5-VL's in its attention windows'
order, an internal layout). A feature user reads the merged features: the graph's output is
``pooler_output`` (with Qwen3-VL's ``deepstack_features``, one row of merged features a deepstack
layer), for one image a run (``image_grid_thw`` 1 x 3), as the vision-language package's file.

The check runs the tower's own forward on two grids against the file: the example's (one frame wider
than tall, split by the attention windows) and another (two frames, or GLM-4V's one taller frame).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained.graph_spec import GraphSpec

TASK = "feature-extraction"
OUTPUT = "pooler_output"
DEEPSTACK = "deepstack_features"
TOKENS = "num_image_tokens"

Run = Callable[[Any, list[str], list[torch.Tensor]], list[torch.Tensor]]
Tolerance = Callable[[torch.Tensor], tuple[float | None, float | None]]


def owns(model: torch.nn.Module, task: str) -> bool:
    """Whether ``model`` is a bare grid tower (its own ``patch_embed`` and ``merger``) exported for
    ``task``; the towers of grid_forms.py's kinds (their forms include the model's projector) are not."""
    from fastonnx.pretrained.grid_vision import grid_form, is_grid_tower

    return (
        task == TASK
        and hasattr(model, "patch_embed")
        and hasattr(model, "merger")
        and grid_form(model) is None
        and is_grid_tower(model)
    )


def _grids(model: torch.nn.Module) -> list[tuple[int, int, int]]:
    """The check's grids (frames, rows, columns in patches): the example's (vision_language.image_grid),
    then two frames of a square grid of another size; for GLM-4V's towers (their position table sampled
    by ``embeddings``) one frame taller than wide, as transformers' own forward indexes the grid by frame
    (GLM-4V's processor gives a video one grid row a frame)."""
    from fastonnx.pretrained.grid_vision import merge_size
    from fastonnx.pretrained.vision_language import image_grid

    merge = merge_size(model)
    other = (1, 4 * merge, 2 * merge) if hasattr(model, "embeddings") else (2, 2 * merge, 2 * merge)
    return [image_grid(model), other]


def _patches(model: torch.nn.Module, grid: tuple[int, int, int], seed: int) -> torch.Tensor:
    from fastonnx.pretrained.grid_vision import patch_shape

    t, h, w = grid
    return torch.randn(t * h * w, *patch_shape(model), generator=torch.Generator().manual_seed(seed))


def tower_graph(model: torch.nn.Module) -> GraphSpec:
    """The one graph of a bare grid tower's feature-extraction package."""
    from fastonnx.pretrained.grid_vision import deepstack_layers, grid_encoder, merge_size

    t, h, w = _grids(model)[0]
    pixels = _patches(model, (t, h, w), 0)
    tokens = torch.export.Dim(TOKENS, min=1, max=1 << 20)
    return GraphSpec(
        grid_encoder(model),
        (pixels, torch.tensor([[t, h, w]])),
        {"pixel_values": {0: merge_size(model) ** 2 * tokens}, "image_grid_thw": {}},
        ["pixel_values", "image_grid_thw"],
        [OUTPUT, *([DEEPSTACK] if deepstack_layers(model) else [])],
    )


def _expected(
    model: torch.nn.Module, pixels: torch.Tensor, grid: torch.Tensor, names: list[str]
) -> list[Any]:
    """transformers' forward of the tower: its merged features, and its deepstack features stacked."""
    with torch.no_grad():
        out = model(pixels, grid)
    values = [out.pooler_output]
    if DEEPSTACK in names:
        values.append(torch.stack(list(out.deepstack_features)))
    return values


def check(
    session: Any, model: torch.nn.Module, spec: GraphSpec, run: Run, tolerance: Tolerance
) -> list[VerificationInfo]:
    """The file against the tower's forward on each of ``_grids``' grids."""
    infos = []
    for i, (t, h, w) in enumerate(_grids(model)):
        pixels, grid = _patches(model, (t, h, w), 5 + i), torch.tensor([[t, h, w]])
        got = run(session, spec.input_names, [pixels, grid])
        for name, want, have in zip(
            spec.output_names, _expected(model, pixels, grid, spec.output_names), got, strict=True
        ):
            infos.append(compare(f"{name} (grid {t}x{h}x{w})", want, have, *tolerance(want)))
    return infos
