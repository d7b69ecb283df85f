"""feature-extraction of a bare image-grid vision tower (Qwen2.5-VL's, Qwen3-VL's, Qwen3.5's, GLM-4V's,
EXAONE 4.5's ``XVisionModel`` in transformers' MODEL mapping): the tower alone, as the vision-language
package's ``vision_encoder.onnx`` computes it (grid_vision.py's form, for any grid).

The towers whose vision-language model has a form of its own (grid_forms.py, axial_grid_forms.py,
more_grid_forms.py: VideoLLaMA3's, Kimi-K2.5's, LFM3-VL's, Muse Glimmer's...; the bare type is the
model's type with ``_vision``) run that form ``bare``: it stops where the tower's own forward does,
before the model's projector, and gives the field that forward returns (``GridForm.BARE_OUTPUT``: the
merged ``pooler_output`` of Inkling2's and HunYuan-VL's, whose merger is the tower's, else
``last_hidden_state``).

transformers' forward of these towers takes ``hidden_states`` (the processor's patches) and ``grid_thw``
and returns ``pooler_output``, the merged tokens' features (in the image's order), beside
``last_hidden_state``, the patches' states before the merge (Qwen2.5-VL's in its attention windows'
order, an internal layout). A feature user reads the merged features: the graph's output is
``pooler_output`` (with Qwen3-VL's ``deepstack_features``, one row of merged features a deepstack
layer), for one image a run (``image_grid_thw`` 1 x 3), as the vision-language package's file.

GLM-Image's tower (``GlmImageVisionModel``) is a plain grid tower: patches embedded by a convolution, its
learned table sampled at each patch (GLM-4V's ``embeddings``, fed tensors), blocks attending within a
frame with no rotary and no merger. Its forward returns the patches' states (``pooler_output`` is the
same tensor): the graph's output is ``last_hidden_state``, patches x hidden in the processor's order,
computed here (``PlainGridEncoder``) from the grid's values as grid_vision.py computes the others'. Its
forward indexes the grid by frame segment, so it takes one frame (an image) a run, as its processor
gives; the check's second grid is one frame taller than wide.

The check runs the tower's own forward on two grids against the file: the example's (one frame wider
than tall, split by the attention windows) and another (two frames, or GLM-4V's one taller frame).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained.graph_spec import GraphSpec, takes
from fastonnx.pretrained.grid_forms import GridForm

TASK = "feature-extraction"
OUTPUT = "pooler_output"
DEEPSTACK = "deepstack_features"
TOKENS = "num_image_tokens"
STATES = "last_hidden_state"

Run = Callable[[Any, list[str], list[torch.Tensor]], list[torch.Tensor]]
Tolerance = Callable[[torch.Tensor], tuple[float | None, float | None]]


def bare_form(model: torch.nn.Module) -> type[GridForm] | None:
    """The grid form of the vision-language model whose bare tower ``model`` is (by its type less
    ``_vision``), or None."""
    from fastonnx.pretrained.grid_vision import form_of_type

    kind = str(getattr(getattr(model, "config", None), "model_type", ""))
    return form_of_type(kind.removesuffix("_vision")) if kind.endswith("_vision") else None


def plain_tower(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a plain grid tower (GLM-Image's): ``patch_embed``, a sampled position table
    (``embeddings``) and blocks of fused ``qkv`` attention, no merger and no rotary, its forward taking
    ``grid_thw``."""
    blocks = getattr(model, "blocks", None)
    return (
        bare_form(model) is None  # a form's tower runs its form, whatever its parts
        and hasattr(model, "patch_embed")
        and hasattr(model, "embeddings")
        and not hasattr(model, "merger")
        and not hasattr(model, "rotary_pos_emb")
        and isinstance(blocks, torch.nn.ModuleList)
        and all(hasattr(getattr(b, "attn", None), "qkv") for b in blocks)
        and takes(model, "grid_thw")
    )


def owns(model: torch.nn.Module, task: str) -> bool:
    """Whether ``model`` is a bare grid tower (its own ``patch_embed`` and ``merger``, a form's tower, or a
    plain tower) exported for ``task``."""
    from fastonnx.pretrained.grid_vision import grid_form, is_grid_tower

    if task != TASK:
        return False
    if bare_form(model) is not None or plain_tower(model):
        return True
    return (
        hasattr(model, "patch_embed")
        and hasattr(model, "merger")
        and grid_form(model) is None
        and is_grid_tower(model)
    )


def _merge(model: torch.nn.Module) -> int:
    from fastonnx.pretrained.grid_vision import merge_size

    if plain_tower(model):
        return int(getattr(model.config, "spatial_merge_size", 1))
    form = bare_form(model)
    return form.merge_size(model.config) if form else merge_size(model)


def _encoder(model: torch.nn.Module) -> torch.nn.Module:
    from fastonnx.pretrained.grid_vision import grid_encoder

    if plain_tower(model):
        return PlainGridEncoder(model)
    form = bare_form(model)
    return form(model, bare=True) if form else grid_encoder(model)


def _grids(model: torch.nn.Module) -> list[tuple[int, int, int]]:
    """The check's grids (frames, rows, columns in patches): the example's (vision_language.image_grid),
    then two frames of a square grid of another size; for GLM-4V's towers (their position table sampled
    by ``embeddings``) and ``STILL_TOWERS`` one frame taller than wide, as transformers' own forward
    indexes the grid by frame (GLM-4V's processor gives a video one grid row a frame; GLM-Image's takes
    images alone). A bare form's or a plain tower's first grid is one frame wider than tall."""
    from fastonnx.pretrained.vision_language import image_grid

    merge = _merge(model)
    kind = getattr(model.config, "model_type", None)
    frames = not hasattr(model, "embeddings") and kind not in STILL_TOWERS
    other = (2, 2 * merge, 2 * merge) if frames else (1, 4 * merge, 2 * merge)
    if bare_form(model) is not None or plain_tower(model):  # one frame wider than tall
        return [(1, 2 * merge, 3 * merge), other]
    return [image_grid(model), other]


STILL_TOWERS = ("hunyuan_vl_vision",)
"""Bare towers whose own forward takes no grid of several frames (HunYuan-VL's merger reshapes each
grid row to its rows x columns): their check's second grid is one frame taller than wide."""


def _patches(model: torch.nn.Module, grid: tuple[int, int, int], seed: int) -> torch.Tensor:
    from fastonnx.pretrained.grid_vision import patch_shape

    form = bare_form(model)
    if plain_tower(model):  # GLM-Image's: channels x patch², no temporal patch
        c: Any = model.config
        shape: tuple[int, ...] = (int(c.in_channels) * int(c.patch_size) ** 2,)
    else:
        shape = form.patch_shape(model.config) if form else patch_shape(model)
    t, h, w = grid
    return torch.randn(t * h * w, *shape, generator=torch.Generator().manual_seed(seed))


def tower_graph(model: torch.nn.Module) -> GraphSpec:
    """The one graph of a bare grid tower's feature-extraction package."""
    from fastonnx.pretrained.grid_vision import deepstack_layers

    t, h, w = _grids(model)[0]
    pixels = _patches(model, (t, h, w), 0)
    tokens = torch.export.Dim(TOKENS, min=1, max=1 << 20)
    form = bare_form(model)
    if plain_tower(model):
        outputs = [STATES]
    else:
        outputs = [form.BARE_OUTPUT] if form else [OUTPUT, *([DEEPSTACK] if deepstack_layers(model) else [])]
    return GraphSpec(
        _encoder(model),
        (pixels, torch.tensor([[t, h, w]])),
        {"pixel_values": {0: _merge(model) ** 2 * tokens}, "image_grid_thw": {}},
        ["pixel_values", "image_grid_thw"],
        outputs,
    )


def _expected(
    model: torch.nn.Module, pixels: torch.Tensor, grid: torch.Tensor, names: list[str]
) -> list[Any]:
    """transformers' forward of the tower: its merged features, and its deepstack features stacked."""
    form = bare_form(model)
    extra = list(form.generate_inputs(1).values()) if form else []  # VideoLLaMA3's merge sizes
    with torch.no_grad():
        out = model(pixels, grid, *extra)
    first = getattr(out, names[0])
    if first.dim() == 3 and first.shape[0] == 1:  # HunYuan-VL's tower keeps a batch of 1
        first = first[0]
    values = [first]
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


class PlainGridEncoder(torch.nn.Module):
    """GLM-Image's tower over one image's patches (the module docstring): each patch's row and column
    laid out block by block of merge² patches, as ``get_vision_position_ids`` lays them; its table sampled
    there; attention within a frame, as the tower's ``cu_seqlens`` splits it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names
        self.merge = int(getattr(model.config, "spatial_merge_size", 1))

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        tower: Any = self.model
        m = self.merge
        grid = image_grid_thw[0]
        at = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        frame, at = at // (grid[1] * grid[2]), at % (grid[1] * grid[2])
        block, within = at // (m * m), at % (m * m)
        rows = (block // (grid[2] // m)) * m + within // m
        columns = (block % (grid[2] // m)) * m + within % m
        hidden = tower.patch_embed(pixel_values)
        count = (grid[0] * grid[1] * grid[2]).reshape(1)  # one image: every patch reads its grid
        hidden = tower.embeddings(hidden, count, image_grid_thw, rows, columns)
        same_frame = (frame[:, None] == frame[None, :])[None, None]
        for block_module in tower.blocks:
            hidden = hidden + _plain_attention(block_module.attn, block_module.norm1(hidden), same_frame)
            hidden = hidden + block_module.mlp(block_module.norm2(hidden))
        states: torch.Tensor = hidden
        return states


def _plain_attention(attn: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A fused-``qkv`` attention over ``x`` (length x width) under ``mask``, unrotated (GLM-Image's)."""
    length = x.shape[0]
    q, k, v = attn.qkv(x).reshape(length, 3, int(attn.num_heads), -1).unbind(1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask
    )
    result: torch.Tensor = attn.proj(out[0].transpose(0, 1).reshape(length, -1))
    return result
