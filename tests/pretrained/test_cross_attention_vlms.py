"""The last decoder-only vision-language models the architecture sweep found failing in image-text-to-text,
each built from the sweep's own tiny config, exported by ``export_pretrained`` and verified (the vision
encoder's outputs, then a greedy generation over the three files against transformers' ``generate``):

- Mllama reads the image through cross-attention layers (cross_attention_vlms.py): the vision encoder
  gives their keys and values, the decoder takes them on every step; the sweep's tiny config had no
  cross-attention layer and vision taps past its layers;
- IDEFICS reads the images through gated cross-attention layers (gated_cross_attention.py): the vision
  encoder gives the images' rows (the resampler's latents), the decoder takes them on every step;
- Gemma 4 (and Unified) take an image as patches padded to a fixed count (padded_patch_vlms.py): the vision
  encoder gives the real rows only, counted from the positions; its pooling's ``one_hot`` had the
  example's row count baked in (capture/pooling_by_positions.py);
- Kosmos-2.5 places its rows at ``image_embeds_position_mask`` as Kosmos-2 (image_prefix.py), from
  flattened patches, its decoder adding the mask's segment embedding; its 2048 image rows outgrow the
  sinusoidal table, whose rows are now computed by formula (capture/seq2seq_shifts.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fastonnx.capture.seq2seq_shifts import sinusoidal_positions_by_formula
from fastonnx.pretrained.cross_attention_vlms import (
    CrossAttentionStep,
    TokenEmbeddings,
    image_keys_values,
    self_layout,
    vision_example,
)
from fastonnx.pretrained.decoder_cache import config_layout, filled_cache
from fastonnx.pretrained.gated_cross_attention import (
    DecoupledEmbeddings,
    GatedCrossAttentionStep,
    ImageStates,
    pixels_example,
)
from fastonnx.pretrained.padded_patch_vlms import image_example

# their exports are sampled with the other image-prefix models' (test_image_prefix_models.py)


def test_kosmos_positions_by_formula_past_the_table() -> None:
    from transformers.models.kosmos2_5.modeling_kosmos2_5 import Kosmos2_5TextSinusoidalPositionalEmbedding

    table = Kosmos2_5TextSinusoidalPositionalEmbedding(num_positions=8, embedding_dim=16, padding_idx=1)
    positions = torch.tensor([[2, 3, 40, 1], [50, 7, 2, 9]])  # past the 10 rows, and the padding row
    got = sinusoidal_positions_by_formula(table, inputs_embeds=torch.zeros(2, 4, 16), position_ids=positions)
    # eager grows its table to cover the length it is given: 60 positions cover the ids
    expected = table(inputs_embeds=torch.zeros(2, 60, 16), position_ids=positions.repeat(1, 15))[:, :4]
    torch.testing.assert_close(got, expected)


def _tiny_mllama() -> Any:
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    config = MllamaConfig(
        text_config={
            "vocab_size": 64,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "cross_attention_layers": [1],
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_global_layers": 1,
            "attention_heads": 2,
            "image_size": 16,
            "patch_size": 8,
            "max_num_tiles": 4,
            "intermediate_layers_indices": [0, 1],
            "vision_output_dim": 96,
        },
        image_token_index=63,
    )
    torch.manual_seed(0)
    model = MllamaForConditionalGeneration(config).eval()
    with torch.no_grad():  # open the gates (zeros at init: the image would change nothing)
        for layer in model.model.language_model.layers[1:2]:
            layer.cross_attn_attn_gate.fill_(0.5)
            layer.cross_attn_mlp_gate.fill_(0.5)
    return model


def test_the_cross_attention_step_is_mllamas_forward() -> None:
    from transformers import DynamicCache

    model = _tiny_mllama()
    image = vision_example(model.config, "cpu")
    ids = torch.tensor([[5, 6, 63, 7, 8, 9]])
    mask = torch.zeros(1, 6, 1, 4, dtype=torch.int64)
    mask[:, 2:] = image["aspect_ratio_mask"][:, None]  # the first 2 tokens see no tile
    with torch.no_grad():
        expected = model(input_ids=ids, cross_attention_mask=mask, **image).logits
        cross = image_keys_values(model, **image)
        empty = filled_cache(self_layout(model.config), 1, 0, "cpu", torch.Generator())
        embeds = TokenEmbeddings(model)(ids)
        positions = torch.arange(6).unsqueeze(0)
        got, present = CrossAttentionStep(model)(embeds, torch.ones_like(ids), positions, empty, mask, cross)
    torch.testing.assert_close(got, expected)
    # the self-attention layers' cache only (layers 0 and 2), grown by the prompt
    assert isinstance(present, DynamicCache)
    assert [layer.keys.shape[2] for layer in present.layers] == [6, 6]


def _tiny_idefics(resampler: bool) -> Any:
    from transformers import IdeficsConfig, IdeficsForVisionText2Text

    config = IdeficsConfig(
        vocab_size=64,
        additional_vocab_size=2,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        cross_layer_interval=2,
        qk_layer_norms=True,
        use_resampler=resampler,
        # gates open (zeros by default: the images would change nothing)
        alpha_initializer="normal",
        alphas_initializer_range=1.0,
        alpha_type="vector",
        vision_config={
            "embed_dim": 16,
            "image_size": 16,
            "patch_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
        },
        perceiver_config={
            "use_resampler": resampler,
            "resampler_n_latents": 3,
            "resampler_depth": 1,
            "resampler_n_heads": 2,
            "resampler_head_dim": 8,
        },
        pad_token_id=0,
        freeze_lm_head=False,
    )
    torch.manual_seed(0)
    return IdeficsForVisionText2Text(config).eval()


def test_idefics_embeddings_read_the_additional_vocabulary() -> None:
    model = _tiny_idefics(False)
    ids = torch.tensor([[5, 64, 6, 65], [65, 1, 64, 63]])  # 64 and 65: the additional table's
    with torch.no_grad():
        torch.testing.assert_close(DecoupledEmbeddings(model)(ids), model.get_input_embeddings()(ids))


@pytest.mark.parametrize("resampler", [True, False])
def test_the_gated_step_is_idefics_forward(resampler: bool) -> None:
    model = _tiny_idefics(resampler)
    pixels = pixels_example(model.config, 2, "cpu")
    ids = torch.tensor([[5, 6, 64, 7, 65, 8, 9]])
    mask = torch.zeros(1, 7, 2, dtype=torch.int64)
    mask[:, 2:, 0] = 1  # the first 2 tokens see no image, the rest the first, from token 4 both
    mask[:, 4:, 1] = 1
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=pixels, image_attention_mask=mask)
        states = ImageStates(model)(pixels)
        empty = filled_cache(config_layout(model.config), 1, 0, "cpu", torch.Generator())
        step = GatedCrossAttentionStep(model)
        embeds = DecoupledEmbeddings(model)(ids)
        got, cache = step(embeds, torch.ones_like(ids), torch.arange(7)[None], empty, states, mask)
        # the next step: one token, the prompt's last row of the mask, the grown cache
        nxt = torch.tensor([[10]])
        expected = model(
            input_ids=nxt,
            attention_mask=torch.ones(1, 8, dtype=torch.int64),
            past_key_values=out.past_key_values,
            perceiver_embeddings=out.image_hidden_states if resampler else None,
            image_encoder_embeddings=None if resampler else out.image_hidden_states,
            image_attention_mask=mask[:, -1:],
        ).logits
        after, _ = step(
            DecoupledEmbeddings(model)(nxt),
            torch.ones(1, 8, dtype=torch.int64),
            torch.tensor([[7]]),
            cache,
            states,
            mask[:, -1:],
        )
        blind = step(embeds, torch.ones_like(ids), torch.arange(7)[None], empty, states, 0 * mask)[0]
    torch.testing.assert_close(states, out.image_hidden_states)
    torch.testing.assert_close(got, out.logits)
    torch.testing.assert_close(after, expected)
    assert not torch.allclose(blind[:, 2:], got[:, 2:])  # the images reach the logits


def test_gemma4_pools_as_many_rows_as_the_patches_give() -> None:
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionPooler

    from fastonnx.capture.pooling_by_positions import pooling_by_comparison

    pooler = Gemma4VisionPooler(Gemma4VisionConfig(hidden_size=8))

    class Pool(torch.nn.Module):
        def forward(self, states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            out, mask = pooler(states, positions, positions[..., 0] < 0, states.shape[1] // 4)
            return torch.where(mask.unsqueeze(-1), out, 0.0)

    def image(rows: int, columns: int, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        example = image_example(_Gemma4Sizes(), "cpu", rows, columns, total)
        states = torch.randn(1, 4 * total, 8, generator=torch.Generator().manual_seed(rows))
        return states.masked_fill(example["image_position_ids"][..., :1] < 0, 0.0), example[
            "image_position_ids"
        ]

    blocks = torch.export.Dim("blocks", min=1, max=1024)
    with pooling_by_comparison():  # one_hot's class count would be the example's 9 rows
        ep = torch.export.export(Pool(), image(2, 3, 9), dynamic_shapes=({1: 4 * blocks}, {1: 4 * blocks}))
    wide = image(2, 5, 16)  # 10 soft tokens of 16
    torch.testing.assert_close(ep.module()(*wide), Pool()(*wide))


class _Gemma4Sizes:
    """The config fields image_example reads: patches of 2 pooled 2 x 2."""

    model_type = "gemma4"

    class vision_config:
        patch_size, pooling_kernel_size = 2, 2
