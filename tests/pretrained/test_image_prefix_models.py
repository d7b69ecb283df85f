"""Vision-language models the architecture sweep found failing in image-text-to-text because their images
do not reach the decoder as LLaVA's (``get_image_features`` of plain pixels, rows at the image token),
each built from the sweep's own tiny config, exported by ``export_pretrained`` and verified (the image
features, then a greedy generation over the three files against transformers' ``generate``):

- DeepSeek-VL keeps ``get_image_features`` on its base model; DeepSeek-VL-Hybrid takes a second,
  high-resolution image (vision_extras.py), and the sweep's tiny SAM tower had its global-attention
  layer past its two layers;
- InstructBLIP's Q-Former reads the prompt: ``qformer_input_ids`` and its mask are vision inputs;
  InstructBLIP-Video the same over a video's frames (``get_video_features``, the video token), which
  was taken for a vision encoder-decoder (its forward takes decoder ids, for T5 language models);
- Kosmos-2 places its rows at ``image_embeds_position_mask`` (image_prefix.py), positions past the pad;
- GIT's image is a prefix before the prompt attending both ways (image_prefix.py).
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.image_prefix import GitStep, PositionMaskEmbeddings, PrefixEmbeddings, image_features
from support.matrix import sampled

TASK = "image-text-to-text"
FIXED = ["deepseek_vl", "deepseek_vl_hybrid", "instructblip", "instructblipvideo", "kosmos-2", "git"]
# cross_attention_vlms.py's, IDEFICS' (gated_cross_attention.py), Kosmos-2.5 and Gemma 4's (~25 s, ~20 s,
# ~85 s, ~25 s on 2 cores: not in CI; unit tests of their graphs' modules against eager in test_cross_attention_vlms.py)
FIXED += ["mllama", "kosmos-2.5", "idefics", "gemma4", "gemma4_unified"]
IN_CI = {"git"}  # the image prefix: its own embedding and decoder graphs, the check's longer steps
CASES = sampled(FIXED, lambda name: name in IN_CI)


@pytest.mark.parametrize("model_type", CASES)
def test_the_model_exports_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    sweep = architecture_sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(TASK, model_type, dict(sweep.architectures(TASK))[model_type], folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note


class _Embeds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.table


def test_kosmos_rows_go_where_the_position_mask_is_set() -> None:
    torch.manual_seed(0)
    model = _Embeds()
    ids = torch.tensor([[1, 5, 6, 7, 2], [3, 4, 5, 6, 7]])
    where = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 1, 1]])
    rows = torch.randn(4, 4)
    expected = model.table(ids).detach().clone()
    expected[where.bool()] = rows  # Kosmos-2's forward_embedding
    with torch.no_grad():
        torch.testing.assert_close(PositionMaskEmbeddings(model)(ids, rows, where), expected)
        # no rows (a generation step): the plain embeddings
        assert torch.equal(PositionMaskEmbeddings(model)(ids, rows[:0], where), model.table(ids))


def _tiny_git() -> torch.nn.Module:
    from transformers import GitConfig, GitForCausalLM

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = GitConfig(
        vision_config={**vision, "image_size": 32, "patch_size": 16},
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return GitForCausalLM(config).eval()


def test_the_git_step_is_gits_forward_with_its_image_prefix() -> None:
    from transformers import DynamicCache

    model = _tiny_git()
    pixels, ids = torch.randn(1, 3, 32, 32), torch.randint(3, 50, (1, 6))
    with torch.no_grad():
        expected = model(input_ids=ids, pixel_values=pixels).logits
        rows = image_features(model, pixels)
        image = torch.ones(1, rows.shape[0], dtype=torch.int64)
        types = torch.cat([image, torch.zeros_like(ids)], dim=1)
        positions = torch.cat([0 * image, torch.arange(6).unsqueeze(0)], dim=1)
        embeds = PrefixEmbeddings(model)(ids, rows)
        mask = torch.ones_like(types)
        got, _ = GitStep(model)(embeds, mask, positions, DynamicCache(), types)
    # every row: the image's attend to each other both ways (a causal mask changes them)
    torch.testing.assert_close(got, expected)
