"""The vision encoders of the OCR models that see an image as a global view and local crops (DeepSeek-OCR 2,
Unlimited-OCR, Step3p7) as one graph over one image, in vision_language.py's three-file layout.

Their processors resize the image to a square global view of a fixed size (1024, Step3p7 728) and, where
it is large, cut it into a grid of crops of another fixed size (the tiles: 768, 640, 504), their number
chosen from the image's aspect ratio (0 for a small image: no crops). The tower encodes each view alone;
``get_image_features`` returns, for each image, its crops' rows, then the global view's rows, then (but
for Step3p7) a learned view separator row. Unlimited-OCR lays the rows out as the picture they come from:
the crops' query grids side by side, a learned newline row closing each line of the crops' rows and of the
global view's (as its processor counts the image tokens). The graph takes one image:

- ``pixel_values``: 1 x channels x size x size, the global view (the tower's ``image_size``);
- ``pixel_values_local``: ``num_local_patches`` x channels x tile x tile, its crops in the processor's
  order (rows, then columns); ``num_local_patches`` dynamic, 0 for an image without crops (an empty
  tensor where the processor gives none). The tile is the processor's, in pixels of the config's size:
  ``LOCAL_VIEWS``' tile / global of the tower's ``image_size`` (768, 640, 504 at the released configs);
- ``patches_grid`` (Unlimited-OCR's only): 1 x 2 int64, the crops' (columns, rows) as the processor gives
  them, columns x rows = ``num_local_patches`` (the caller's to keep so); ([1, 1] for no crops);

and gives ``image_features``, the image's rows in transformers' order, as many as its processor writes
image tokens. The number of crops per image (``num_local_patches``) is the crops' count, a shape; it is no
input.

What ``get_image_features`` does from data, and what the graph does instead: it splits the crops' rows by
image (``torch.split`` by ``num_local_patches``, a list; ``.tolist()`` of a tensor) and loops over the
images in Python; one image a call needs no split. Unlimited-OCR reshapes the crops' rows by the grid's
values (``patches_grid[idx]``, Python ints) to (rows · queries) lines of (columns · queries) rows, each
closed by the newline: here slot ``s`` of the lines, of width ``w = columns · q + 1``, holds the newline
where ``s % w`` is ``columns · q``, else crop ``(s // w // q) · columns + (s % w) // q``'s query ``(s // w %
q) · q + (s % w) % q``: tensor arithmetic of the grid's values (``grid_rows``). The slots are counted up
to the most lines a crop count can give (one column: ``num_local_patches`` · q), those past the grid's
lines dropped by a boolean mask, so the rows' number is data (rows · q · w), as the processor's count is.
The crops' tower runs on 0 crops too where transformers skips it: it gives 0 rows, as the skipped path
adds none.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import GraphSpec

LOCAL_VIEWS: dict[str, tuple[int, int]] = {
    "deepseek_ocr2": (768, 1024),
    "unlimited_ocr": (640, 1024),
    "step3p7": (504, 728),
}
"""Model types whose images are a global view and local crops: their processors' tile and global sizes
(``tile_size`` and ``size``; Step3p7's ``patch_size`` and ``size``), whose ratio gives the tile at the
config's size."""

CROPS = "num_local_patches"
EXAMPLE_GRID = (2, 1)
"""The crops (columns, rows) of the image the package is captured and checked with."""


def _inner(model: torch.nn.Module) -> Any:
    return getattr(model, "model", model)


def local_patch_tower(model: torch.nn.Module) -> bool:
    """Whether the model's images are a global view and local crops (``LOCAL_VIEWS``)."""
    get = getattr(_inner(model), "get_image_features", None)
    return (
        getattr(model.config, "model_type", None) in LOCAL_VIEWS
        and get is not None
        and "pixel_values_local" in inspect.signature(get).parameters
    )


def _gridded(model: torch.nn.Module) -> bool:
    """Whether the rows are laid out by the crops' grid (Unlimited-OCR's newlines)."""
    return "patches_grid" in inspect.signature(_inner(model).get_image_features).parameters


def local_names(model: torch.nn.Module) -> list[str]:
    """The vision encoder's inputs."""
    return ["pixel_values", "pixel_values_local", *(["patches_grid"] if _gridded(model) else [])]


def view_sizes(config: Any) -> tuple[int, int, int]:
    """(channels, the global view's side, the tile's side) in pixels: the tower's ``image_size`` (a SAM
    tower's), the tile its processor's share of it, a whole number of patches."""
    vision = config.vision_config
    tower = getattr(vision, "sam_config", None) or vision
    size, patch = int(tower.image_size), int(tower.patch_size)
    tile, full = LOCAL_VIEWS[config.model_type]
    side = max(1, round(size * tile / full / patch)) * patch
    return int(getattr(tower, "num_channels", 3)), size, side


def local_inputs(
    model: torch.nn.Module, grid: tuple[int, int], device: str | torch.device
) -> dict[str, torch.Tensor | list[Any] | None]:
    """What transformers' forward takes for one image of ``grid`` (columns, rows) crops, as its processor
    gives them: the views, ``num_local_patches`` (a list), ``patches_grid`` (a list, Unlimited-OCR's); no
    crops (``grid`` 0 x 0) as the processor gives a small image's (no ``pixel_values_local``; grid 1 x 1)."""
    channels, size, side = view_sizes(model.config)
    crops = grid[0] * grid[1]
    g = torch.Generator().manual_seed(crops)
    out: dict[str, torch.Tensor | list[Any] | None] = {
        "pixel_values": torch.randn(1, channels, size, size, generator=g).to(device),
        "pixel_values_local": None,
        "num_local_patches": [crops],
    }
    if crops:
        out["pixel_values_local"] = torch.randn(crops, channels, side, side, generator=g).to(device)
    if _gridded(model):
        out["patches_grid"] = [list(grid) if crops else [1, 1]]
    return out


def local_feeds(model: torch.nn.Module, images: dict[str, Any]) -> list[torch.Tensor]:
    """The vision encoder's inputs for ``local_inputs``' image: an empty ``pixel_values_local`` for no
    crops, ``patches_grid`` as a tensor."""
    channels, _, side = view_sizes(model.config)
    pixels: torch.Tensor = images["pixel_values"]
    crops = images["pixel_values_local"]
    if crops is None:
        crops = pixels.new_zeros(0, channels, side, side)
    feeds = [pixels, crops]
    if _gridded(model):
        feeds.append(torch.tensor(images["patches_grid"], dtype=torch.int64, device=pixels.device))
    return feeds


def grid_rows(crops: torch.Tensor, grid: torch.Tensor, newline: torch.Tensor, queries: int) -> torch.Tensor:
    """Unlimited-OCR's crop rows laid out by their grid: ``crops`` n x q² x width (a crop's q x q query
    grid, row by row) and ``grid`` 1 x 2 (columns, rows) to (rows · q) lines of (columns · q) rows and the
    ``newline`` row, flattened (the module docstring)."""
    n, width = crops.shape[0], crops.shape[-1]
    per_crop = queries * queries
    table = torch.cat([crops.reshape(-1, width), newline.reshape(1, width).to(crops.dtype)], dim=0)
    columns = torch.clamp(grid[0, 0], min=1)  # no crops: the processor's [1, 1]; never a 0 divisor
    rows = grid[0, 1]
    line = columns * queries + 1
    slot = torch.arange(n * per_crop + n * queries, device=crops.device)
    at, within = slot // line, slot % line
    crop = (at // queries) * columns + within // queries
    index = crop * per_crop + (at % queries) * queries + within % queries
    index = torch.where(within == columns * queries, n * per_crop, index)  # the line's newline
    kept = at < rows * queries
    index = torch.where(kept, index, n * per_crop)  # in range; dropped below
    return table[index][kept]


class LocalPatchEncoder(torch.nn.Module):
    """``get_image_features`` of one image's global view and crops (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names
        self.gridded = _gridded(model)

    def _views(self, pixels: torch.Tensor) -> torch.Tensor:
        inner = _inner(self.model)
        tower = getattr(inner, "vision_tower", None) or inner.vision_model
        features: torch.Tensor = inner.multi_modal_projector(tower(pixels).last_hidden_state)
        return features

    def forward(
        self,
        pixel_values: torch.Tensor,
        pixel_values_local: torch.Tensor,
        patches_grid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inner = _inner(self.model)
        whole, crops = self._views(pixel_values)[0], self._views(pixel_values_local)
        width = whole.shape[-1]
        if self.gridded:
            if patches_grid is None:
                raise InputError("Unlimited-OCR's vision encoder takes patches_grid")
            q = int(round(whole.shape[0] ** 0.5))
            newline = inner.image_newline.to(whole.dtype)
            lines = torch.cat([whole.reshape(q, q, width), newline.expand(q, 1, width)], dim=1)
            local = grid_rows(crops, patches_grid, newline, int(round(crops.shape[1] ** 0.5)))
            parts = [local, lines.reshape(-1, width)]
        else:
            parts = [crops.reshape(-1, width), whole]
        separator = getattr(inner, "view_separator", None)
        if separator is not None:
            parts.append(separator.to(whole.dtype).reshape(1, width))
        return torch.cat(parts, dim=0)


def local_spec(model: torch.nn.Module) -> GraphSpec:
    """``vision_encoder.onnx`` of a global view and its crops: one image's rows."""
    crops = torch.export.Dim(CROPS, min=0, max=1024)
    images = local_inputs(model, EXAMPLE_GRID, "meta")
    feeds = local_feeds(model, images)
    dims: dict[str, Any] = {"pixel_values": {}, "pixel_values_local": {0: crops}}
    if len(feeds) > 2:
        dims["patches_grid"] = {}
    return GraphSpec(LocalPatchEncoder(model), tuple(feeds), dims, local_names(model), ["image_features"])


def other_images(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Images of other crop counts than ``vision_inputs``' for the check of the vision encoder: none (a
    small image's), and a grid of another shape and count (one column, three rows)."""
    return [local_inputs(model, (0, 0), "cpu"), local_inputs(model, (1, 3), "cpu")]


def check_other_images(
    session: Any, model: torch.nn.Module, check: Any, features: Callable[..., torch.Tensor]
) -> list[Any]:
    """The vision encoder's ``session`` against transformers' rows (``features``: vision_language.py's
    ``image_features``) on ``other_images``; ``check`` is package_check's module (``_run``, ``compare``)."""
    infos = []
    for images in other_images(model):
        (got,) = check._run(session, local_names(model), local_feeds(model, images))
        with torch.no_grad():
            expected = features(model, **images)
        crops = images["num_local_patches"][0]
        infos.append(check.compare(f"vision_encoder: image_features of {crops} crops", expected, got))
    return infos
