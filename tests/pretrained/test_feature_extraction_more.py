"""More base models (feature-extraction) the architecture sweep found failing, each built from the sweep's
own tiny config with random weights, exported by ``export_pretrained`` and verified against transformers
eager:

- outputs that are no single tensor field (pretrained/tuple_outputs.py): HGNetV2Backbone's tuple of
  feature maps, one output each; SAM 2's image embeddings, one a level; BLIP-2's Q-Former states in its nested output (its images and text
  both: its forward requires the images, though its config names an image token); InstructBLIP's with
  its Q-Former prompt, InstructBLIP-Video's over its 4 frames;
- Diffusion Gemma: its canvas an input (its forward draws one at random when none comes);
- DINOv3 without register tokens: its empty ``register_tokens`` written, not pointed at in the shard
  (stored_weights/checkpoints.py);
- VITS: refused with an InputError naming what it returns (a waveform, no states), no longer a crash in
  the codebook look-up (side_inputs.codebook_rows).
"""

from __future__ import annotations

import pathlib
import types
from typing import Any

import pytest
import torch
from checkpoint_folders import architecture_sweep, export_swept

from fastonnx.errors import InputError
from fastonnx.pretrained.side_inputs import codebook_rows
from fastonnx.pretrained.tuple_outputs import output_names, read
from fastonnx.stored_weights.checkpoints import index_shards
from support.matrix import sampled

TASK = "feature-extraction"
FIXED = ["blip-2", "dinov3_vit", "hgnet_v2", "instructblip", "instructblipvideo", "diffusion_gemma", "sam2"]


def _export(tmp_path: pathlib.Path, model_type: str) -> Any:
    return export_swept(tmp_path, TASK, model_type)


@pytest.mark.parametrize("model_type", sampled(FIXED, lambda name: name in ("dinov3_vit", "blip-2")))
def test_the_base_model_exports_and_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
    written = _export(tmp_path, model_type)
    assert written.verified is True, written.verify_note


def test_a_diffusion_lms_canvas_is_an_input() -> None:
    """Diffusion Gemma's decoder refines a canvas its forward draws with torch.randint when none is given:
    the graph would draw another, so the canvas is an input beside the prompt."""
    import transformers

    from fastonnx.pretrained.encoder_tasks import encoder_inputs

    config = architecture_sweep().tiny_config("diffusion_gemma")
    with torch.device("meta"):
        model = transformers.DiffusionGemmaModel(config)
    inputs, dims = encoder_inputs(model, config, TASK, 2, "meta")
    assert list(inputs) == ["input_ids", "attention_mask", "decoder_input_ids"]
    assert dims["decoder_input_ids"] == {0: "batch_size", 1: "decoder_sequence_length"}


def test_sam2s_image_embeddings_are_one_output_a_level() -> None:
    """SAM 2's image embeddings are a list of its vision config's num_feature_levels levels; SAM's one
    tensor keeps its one name."""
    model = types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(num_feature_levels=3))
    )
    sam = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace()))
    assert output_names(model, ("image_embeddings",)) == tuple(f"image_embeddings.{i}" for i in range(3))  # type: ignore[arg-type]
    assert output_names(sam, ("image_embeddings",)) == ("image_embeddings",)  # type: ignore[arg-type]


def test_a_base_model_without_states_is_refused() -> None:
    """VITS's output is a waveform drawn with noise and its lengths: no state a feature user reads, so its
    feature-extraction graph is refused by name (its speech is text-to-audio's)."""
    import transformers

    from fastonnx.pretrained import encoder_tasks

    with torch.device("meta"):
        model = transformers.VitsModel(transformers.VitsConfig())
    fields = encoder_tasks.output_fields(model, "feature-extraction")
    with pytest.raises(InputError, match="VitsModel returns VitsModelOutput .*none of the states"):
        encoder_tasks._refuse_no_features(model, "feature-extraction", fields)


def test_tuple_and_nested_fields_are_named_and_read() -> None:
    maps = (torch.zeros(1, 2), torch.ones(1, 3))
    backbone = types.SimpleNamespace(out_features=["stage1", "stage2"])
    names = output_names(backbone, ("feature_maps",))  # type: ignore[arg-type]
    assert names == ("feature_maps.0", "feature_maps.1")
    out = types.SimpleNamespace(feature_maps=maps, inner=types.SimpleNamespace(last_hidden_state=maps[1]))
    torch.testing.assert_close(read(out, "feature_maps.1"), maps[1])
    torch.testing.assert_close(read(out, "inner.last_hidden_state"), maps[1])
    assert read(out, "missing.last_hidden_state") is None


def test_codebook_rows_does_not_ask_a_model_without_codebooks() -> None:
    class Refusing(torch.nn.Module):
        def get_input_embeddings(self) -> torch.nn.Module:
            raise NotImplementedError("as VitsModel's")

    assert codebook_rows(Refusing(), types.SimpleNamespace()) == 1


def test_empty_tensors_are_not_pointed_at(tmp_path: pathlib.Path) -> None:
    from safetensors.torch import save_file

    shard = tmp_path / "model.safetensors"
    save_file({"weight": torch.ones(2, 2), "register_tokens": torch.zeros(1, 0, 4)}, str(shard))
    assert set(index_shards([str(shard)])) == {"weight"}
