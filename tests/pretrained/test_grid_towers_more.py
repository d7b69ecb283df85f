"""More image-text-to-text architectures the sweep found failing, each built from its own tiny config:

- grid towers of other shapes (grid_forms.py): VideoLLaMA3 (SigLIP with a 2-D rotary position, its
  images merged by 1); axial_grid_forms.py's Inkling2 (a class token, rows of image tokens), Kimi-K2.5,
  LFM3-VL (a depthwise convolution over each frame), MiniMax-M3-VL (a rotary over frames too) and Muse
  Glimmer (windows): each compared with transformers' ``get_image_features`` at two grids (non-square,
  two frames where the tower takes them, two windows);
- Kimi-K2.5 and Muse Glimmer embed a generated image or video placeholder as token 0, as their forward
  does (``placeholders_as_pad``);
- Qwen3-VL-MoE: transformers transposes its stacked experts under their own names as it loads them;
  the converted file supersedes the checkpoint's tensors of those names (``SUPERSEDES_KEY``);
- Llama 4: ``get_image_features`` gives the tower's states, which its forward projects with
  ``multi_modal_projector``: the vision graph does too.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from checkpoint_folders import architecture_sweep
from safetensors.torch import save_file

import fastonnx
from fastonnx.errors import InputError
from fastonnx.pretrained.grid_vision import grid_encoder, grid_inputs, is_grid_tower, patch_shape
from fastonnx.pretrained.vision_language import MergedEmbeddings
from fastonnx.stored_weights.checkpoints import SUPERSEDES_KEY, index_shards
from support.matrix import sampled

TASK = "image-text-to-text"
FIXED = [
    *("llama4", "video_llama_3", "qwen3_vl_moe"),
    *("inkling2", "kimi_k25", "lfm3_vl", "minimax_m3_vl", "muse_glimmer"),
]
IN_CI = {"llama4"}  # the smallest; the grid forms and the superseding file: their unit tests in CI
CASES = sampled(FIXED, lambda name: name in IN_CI)

_sweep = architecture_sweep


def _model(model_type: str) -> Any:
    import transformers

    sweep = _sweep()
    config = sweep.tiny_config(model_type, sweep._tokens_in_vocabulary(sweep._defaults(model_type)))
    cls = getattr(transformers, dict(sweep.architectures(TASK))[model_type])
    torch.manual_seed(0)
    return cls(config).eval()


@pytest.mark.parametrize(
    ("model_type", "grids"),
    [
        ("video_llama_3", [(1, 2, 3), (1, 5, 2)]),
        ("inkling2", [(1, 2, 3), (1, 3, 1)]),  # in image tokens
        ("kimi_k25", [(1, 4, 6), (1, 6, 2)]),
        ("lfm3_vl", [(1, 4, 6), (2, 6, 2)]),  # two frames: the convolution stays within each
        ("minimax_m3_vl", [(1, 4, 6), (2, 6, 2)]),  # frames rotate too
        ("muse_glimmer", [(1, 4, 6), (1, 34, 2)]),  # two windows down (32 patches a side)
    ],
)
def test_the_grid_form_is_get_image_features(model_type: str, grids: list[tuple[int, int, int]]) -> None:
    model = _model(model_type)
    assert is_grid_tower(model)
    encoder = grid_encoder(model)
    for seed, (t, h, w) in enumerate(grids):
        g = torch.Generator().manual_seed(seed)
        pixels, grid = torch.randn(t * h * w, *patch_shape(model), generator=g), torch.tensor([[t, h, w]])
        with torch.no_grad():
            out = model.get_image_features(
                pixel_values=pixels, image_grid_thw=grid, return_dict=True, **grid_inputs(model, 1)
            )
            got = encoder(pixels, grid)
        torch.testing.assert_close(got, torch.cat(list(out.pooler_output)), msg=f"{model_type} at {grid}")


def test_a_generated_placeholder_embeds_as_token_0() -> None:
    model = _model("muse_glimmer")
    config = model.config
    image, video = int(config.image_token_id), int(config.video_token_id)
    ids = torch.tensor([[5, image, video, 7, image]])
    features = torch.randn(1, config.text_config.hidden_size)
    with torch.no_grad():
        got = MergedEmbeddings(model, image)(ids, features)
        table = model.get_input_embeddings()
        # the first image token takes the feature row; the rest are transformers' token 0
        want = table(torch.tensor([[5, 0, 0, 7, 0]]))
    want[0, 1] = features[0]
    torch.testing.assert_close(got, want)


def test_a_converted_file_supersedes_the_checkpoints_tensor(tmp_path: pathlib.Path) -> None:
    checkpoint, converted, other = (tmp_path / f"{n}.safetensors" for n in ("model", "converted", "other"))
    save_file({"experts": torch.zeros(2, 3), "kept": torch.ones(2)}, checkpoint)
    save_file({"experts": torch.zeros(3, 2)}, converted, metadata={SUPERSEDES_KEY: "true"})
    save_file({"kept": torch.ones(2)}, other)
    for files in ([checkpoint, converted], [converted, checkpoint]):
        index = index_shards([str(f) for f in files])
        assert index["experts"].shape == (3, 2) and index["experts"].shard == str(converted)
        assert index["kept"].shard == str(checkpoint)
    with pytest.raises(InputError, match="'kept' is in both"):  # a plain duplicate is still refused
        index_shards([str(checkpoint), str(other)])


@pytest.mark.parametrize("model_type", CASES)
def test_the_package_exports_and_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
    folder = tmp_path / "checkpoint"
    class_name = dict(_sweep().architectures(TASK))[model_type]
    _sweep().build_checkpoint(TASK, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
