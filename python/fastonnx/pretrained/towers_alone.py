"""feature-extraction of the towers transformers' MODEL mapping lists alone whose forward takes more than
``pixel_values`` (or no pixels at all): each graph takes what the model's processor (or, for BLIP-2's
Q-Former, BLIP-2 itself) feeds that forward, and returns the fields the forward returns.

- SigLIP 2's NaFlex tower (``Siglip2VisionModel``): the processor's three tensors, ``pixel_values``
  (``batch_size`` x ``num_patches`` x channels · patch², each image's patches padded with zeros to the
  processor's ``max_num_patches``), ``pixel_attention_mask`` (``batch_size`` x ``num_patches``, int32, 1
  on the real patches) and ``spatial_shapes`` (``batch_size`` x 2, int64: each image's rows and columns
  in patches), to ``last_hidden_state`` and, where the config has the attention-pooling head,
  ``pooler_output``. transformers resizes the position table to each image's shape by
  ``spatial_shapes[i].tolist()`` in a loop; here every patch's table row weights come from its image's
  shape as tensor arithmetic (capture/naflex_positions.py's, which the capture of SigLIP 2's whole
  models swaps in), a padding patch taking the first patch's row as transformers pads; the encoder and the head
  run as transformers' under the patch mask.
- Gemma 4's tower (``Gemma4VisionModel``): one image as the processor gives it, ``pixel_values`` (1 x
  ``num_patches`` x 3 · patch², padded to the image's soft-token budget) and ``pixel_position_ids`` (1 x
  ``num_patches`` x 2: each patch's (x, y), (-1, -1) on the padding; ``num_patches`` a multiple of the
  pooling kernel²), to ``last_hidden_state``, the real pooled rows alone (a data-dependent count): the
  tower's own forward, which padded_patch_vlms.py's vision encoder runs inside Gemma 4's package.
- Pixtral's tower (``PixtralVisionModel``) without ``image_sizes``: ``pixel_values`` (``batch_size`` x
  channels x ``height`` x ``width``, multiples of the patch, every image of the batch that size), to
  ``last_hidden_state`` in transformers' layout, 1 x (``batch_size`` · patches) x hidden: the images'
  patches in one sequence, each attending within its image. transformers lists the patch grids in a
  Python loop over the images (which fixes the batch in a capture); here each patch's image, row and
  column come from its index, the rotary positions and the block mask from them.
- BLIP-2's Q-Former alone (``Blip2QFormerModel``): as ``Blip2Model`` runs it, ``query_embeds``
  (``batch_size`` x ``num_query_tokens`` x hidden: BLIP-2's learned ``query_tokens``, which the bare
  Q-Former does not hold, expanded to the batch) and ``encoder_hidden_states`` (``batch_size`` x
  ``image_sequence_length`` x ``encoder_hidden_size``: the vision model's ``last_hidden_state``), every
  image position attended (BLIP-2's all-ones ``encoder_attention_mask``, so none is an input), to
  ``last_hidden_state``, the query features BLIP-2's language projection reads. No text: the Q-Former's
  text input is InstructBLIP's.

The check runs the model's own forward against the file on two examples of different sizes (batch and
patch counts; Gemma 4: another image shape and padding), every output compared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained.graph_spec import BATCH, GraphSpec
from fastonnx.pretrained.naflex_images import PATCHES, naflex_example

TASK = "feature-extraction"
HEIGHT, WIDTH = "height", "width"
QUERIES, IMAGE_SEQUENCE = "num_query_tokens", "image_sequence_length"

Run = Callable[[Any, list[str], list[torch.Tensor]], list[torch.Tensor]]
Tolerance = Callable[[torch.Tensor], tuple[float | None, float | None]]


def owns(model: torch.nn.Module, task: str) -> bool:
    """Whether ``model`` is one of this module's towers exported for ``task``."""
    return task == TASK and type(model).__name__ in TOWERS


def _dim(name: str, low: int = 1, high: int = 1 << 16) -> Any:
    return torch.export.Dim(name, min=low, max=high)


# SigLIP 2's NaFlex tower


class NaflexTower(torch.nn.Module):
    """SigLIP 2's tower over padded images (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(
        self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor, spatial_shapes: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        from transformers.masking_utils import create_bidirectional_mask

        from fastonnx.capture.naflex_positions import naflex_embeddings_forward

        tower: Any = self.model
        hidden = naflex_embeddings_forward(tower.embeddings, pixel_values, spatial_shapes)
        mask = create_bidirectional_mask(
            config=tower.config, inputs_embeds=hidden, attention_mask=pixel_attention_mask
        )
        states = tower.encoder(inputs_embeds=hidden, attention_mask=mask).last_hidden_state
        states = tower.post_layernorm(states)
        if getattr(tower, "use_head", False):
            return states, tower.head(states, pixel_attention_mask)
        result: torch.Tensor = states
        return result


def _siglip2_spec(model: torch.nn.Module) -> GraphSpec:
    example = naflex_example(model.config, [(4, 6), (3, 5)], 32)
    patches = {0: _dim(BATCH, high=1024), 1: _dim(PATCHES)}
    outputs = ["last_hidden_state", *(["pooler_output"] if getattr(model, "use_head", False) else [])]
    return GraphSpec(
        NaflexTower(model),
        tuple(example.values()),
        {"pixel_values": patches, "pixel_attention_mask": patches, "spatial_shapes": {0: patches[0]}},
        list(example),
        outputs,
    )


def _siglip2_checks(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    # a padded batch of two (the example's sizes), then one image filling its patches, wider than the
    # position table (16 a side at 256 patches): resampled up along it
    return [
        naflex_example(model.config, [(4, 6), (3, 5)], 32),
        naflex_example(model.config, [(2, 18)], 36),
    ]


# Gemma 4's tower


def _gemma4_example(model: torch.nn.Module, rows: int, columns: int, soft: int) -> dict[str, torch.Tensor]:
    from fastonnx.pretrained.padded_patch_vlms import tower_image

    image = tower_image(model.config, rows, columns, soft)
    return {"pixel_values": image["pixel_values"], "pixel_position_ids": image["image_position_ids"]}


class PaddedPatchTower(torch.nn.Module):
    """Gemma 4's tower over one image's padded patches: its own forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, pixel_position_ids: torch.Tensor) -> torch.Tensor:
        states: torch.Tensor = self.model(
            pixel_values=pixel_values, pixel_position_ids=pixel_position_ids
        ).last_hidden_state
        return states


def _gemma4_spec(model: torch.nn.Module) -> GraphSpec:
    example = _gemma4_example(model, 2, 3, 9)
    pooled = int(getattr(model.config, "pooling_kernel_size", 1)) ** 2
    patches = {1: pooled * _dim(PATCHES)}
    return GraphSpec(
        PaddedPatchTower(model),
        tuple(example.values()),
        {"pixel_values": patches, "pixel_position_ids": patches},
        list(example),
        ["last_hidden_state"],
    )


def _gemma4_checks(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    # the example's wide image, then a tall one under another padding
    return [_gemma4_example(model, 2, 3, 9), _gemma4_example(model, 3, 2, 8)]


# Pixtral's tower


def _pixtral_example(config: Any, batch: int, rows: int, columns: int) -> dict[str, torch.Tensor]:
    patch = int(config.patch_size)
    shape = (batch, int(config.num_channels), rows * patch, columns * patch)
    return {"pixel_values": torch.randn(*shape, generator=torch.Generator().manual_seed(batch))}


class PackedImagesTower(torch.nn.Module):
    """Pixtral's tower over a batch of images of one size (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        tower: Any = self.model
        grid = tower.patch_conv(pixel_values.to(tower.patch_conv.weight.dtype))  # batch x hidden x h x w
        h, w = grid.shape[2], grid.shape[3]
        embeds = tower.ln_pre(grid.flatten(2).transpose(1, 2).reshape(1, -1, grid.shape[1]))
        at = torch.arange(embeds.shape[1], device=pixel_values.device)
        image, within = at // (h * w), at % (h * w)
        positions = torch.stack([within // w, within % w], dim=-1)
        rotary = tower.patch_positional_embedding(embeds, positions)
        low = torch.finfo(embeds.dtype).min
        blocks = image[:, None] == image[None, :]
        mask = torch.where(blocks, 0.0, low).to(embeds.dtype)[None, None]
        states: torch.Tensor = tower.transformer(
            embeds, attention_mask=mask, position_embeddings=rotary
        ).last_hidden_state
        return states


def _pixtral_spec(model: torch.nn.Module) -> GraphSpec:
    config: Any = model.config
    example = _pixtral_example(config, 2, 4, 3)
    patch = int(config.patch_size)
    dims = {
        0: _dim(BATCH, high=1024),
        2: patch * _dim(HEIGHT, high=1 << 10),
        3: patch * _dim(WIDTH, high=1 << 10),
    }
    return GraphSpec(
        PackedImagesTower(model),
        tuple(example.values()),
        {"pixel_values": dims},
        ["pixel_values"],
        ["last_hidden_state"],
    )


def _pixtral_checks(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    # the example's two images taller than wide, then three wider than tall (the rotary has no table:
    # any size is the config's)
    return [_pixtral_example(model.config, 2, 4, 3), _pixtral_example(model.config, 3, 2, 5)]


# BLIP-2's Q-Former


def _qformer_example(config: Any, batch: int, queries: int, image: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch * queries)
    return {
        "query_embeds": torch.randn(batch, queries, int(config.hidden_size), generator=g),
        "encoder_hidden_states": torch.randn(batch, image, int(config.encoder_hidden_size), generator=g),
    }


class QueryFeatures(torch.nn.Module):
    """BLIP-2's Q-Former over the queries and the image's states (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, query_embeds: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        states: torch.Tensor = self.model(
            query_embeds=query_embeds, encoder_hidden_states=encoder_hidden_states
        ).last_hidden_state
        return states


def _qformer_spec(model: torch.nn.Module) -> GraphSpec:
    example = _qformer_example(model.config, 2, 8, 17)
    batch = _dim(BATCH, high=1024)
    return GraphSpec(
        QueryFeatures(model),
        tuple(example.values()),
        {
            "query_embeds": {0: batch, 1: _dim(QUERIES, high=1024)},
            "encoder_hidden_states": {0: batch, 1: _dim(IMAGE_SEQUENCE)},
        },
        list(example),
        ["last_hidden_state"],
    )


def _qformer_checks(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    return [_qformer_example(model.config, 2, 8, 17), _qformer_example(model.config, 1, 4, 10)]


Spec = Callable[[torch.nn.Module], GraphSpec]
Checks = Callable[[torch.nn.Module], list[dict[str, torch.Tensor]]]

TOWERS: dict[str, tuple[Spec, Checks]] = {
    "Siglip2VisionModel": (_siglip2_spec, _siglip2_checks),
    "Gemma4VisionModel": (_gemma4_spec, _gemma4_checks),
    "PixtralVisionModel": (_pixtral_spec, _pixtral_checks),
    "Blip2QFormerModel": (_qformer_spec, _qformer_checks),
}
"""Each tower's graph and the check's examples (the forward's keyword inputs), by transformers class."""


def tower_graph(model: torch.nn.Module) -> GraphSpec:
    """The one graph of the tower's feature-extraction package."""
    return TOWERS[type(model).__name__][0](model)


def check_examples(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    """The check's examples: the forward's keyword inputs, the graph's named alike."""
    return TOWERS[type(model).__name__][1](model)


def check(
    session: Any, model: torch.nn.Module, spec: GraphSpec, run: Run, tolerance: Tolerance
) -> list[VerificationInfo]:
    """The file against the model's own forward on each of ``check_examples``."""
    infos = []
    for i, feeds in enumerate(check_examples(model)):
        got = run(session, spec.input_names, [feeds[n] for n in spec.input_names])
        with torch.no_grad():
            out = model(**feeds)
        sizes = "x".join(str(n) for n in feeds[spec.input_names[0]].shape)
        for name, have in zip(spec.output_names, got, strict=True):
            want = getattr(out, name)
            infos.append(compare(f"{name} (example {i + 1}: {sizes})", want, have, *tolerance(want)))
    return infos
