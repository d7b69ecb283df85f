"""Decoder families the architecture sweep (scripts/architecture_sweep.py) found failing as sequence / token
classifiers and extractive QA while their causal LMs export, each built from the sweep's own tiny config
with random weights, exported by ``export_pretrained`` with batch and length dynamic and verified against
transformers eager (right padding):

- the classifier built a cache it never returns (``use_cache`` in the config): Gemma 2's sliding-window
  layers and the conv states of Qwen3.5 / Qwen3-Next / Zamba slice it by the length, guards on it; the
  graph now runs the model with ``use_cache=False``;
- a vision-language classifier (Gemma 3's) was given images: a text task's graph takes text alone; its
  mask (and T5Gemma 2's), combined with another, was made by vmap, which the capture kept as functorch
  calls (now by broadcasting, capture/chunked_kernels.py);
- MPT's ALiBi table has ``max_seq_len`` columns: a bound its config declares (``POSITION_LIMITS``);
- MiniMax's lightning attention loops over blocks in Python (capture/chunked_kernels.py's scan form);
- T5Gemma's decoder ids, shifted by a write into a slice, guarded on ``L - 1 >= 2`` (a join instead).
"""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest
import torch
from checkpoint_folders import architecture_sweep
from torch.export import Dim

import fastonnx
from fastonnx.capture.chunked_kernels import lightning_attention_by_blocks, shift_right_by_concat
from support.matrix import sampled

FIXED = [
    ("text-classification", "gemma2"),
    ("text-classification", "gemma3"),
    ("text-classification", "qwen3_5_text"),
    ("text-classification", "qwen3_next"),
    ("text-classification", "zamba"),
    ("text-classification", "zamba2"),
    ("text-classification", "jamba"),
    ("text-classification", "minimax"),
    ("text-classification", "mpt"),
    ("text-classification", "t5gemma"),
    ("text-classification", "t5gemma2"),
    ("token-classification", "gemma2"),
    ("token-classification", "minimax"),
    ("token-classification", "mpt"),
    ("token-classification", "qwen3_5"),
    ("token-classification", "qwen3_next"),
    ("token-classification", "t5gemma"),
    ("question-answering", "minimax"),
    ("question-answering", "mpt"),
    ("question-answering", "qwen3_next"),
]
# one of each cause in CI: the cache built, images given and a vmap mask, a declared bound, the block
# loop, the shift
# the cache switched off and the position limit through a whole export in CI; the swapped forms (lightning
# attention, the shift, the mask) by their own tests below; every case under FASTONNX_FULL_MATRIX=1
IN_CI = {("text-classification", "gemma2")}

CASES = sampled(FIXED, lambda case: case in IN_CI)


_sweep = architecture_sweep


@pytest.mark.parametrize(("task", "model_type"), CASES, ids=[f"{t}-{m}" for t, m in CASES])
def test_the_classifier_exports_at_every_length(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    sweep = _sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, dict(sweep.architectures(task))[model_type], folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note
    assert written.input_names[:2] == ["input_ids", "attention_mask"]  # text alone: no pixel_values
    assert "pixel_values" not in written.input_names


def _minimax_layer(block: int) -> torch.nn.Module:
    from transformers import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    config = MiniMaxConfig(
        hidden_size=32,
        num_attention_heads=4,
        head_dim=8,
        num_hidden_layers=2,
        block_size=block,
        layer_types=["linear_attention", "full_attention"],
    )
    torch.manual_seed(0)
    return MiniMaxLightningAttention(config, 0).eval()


@pytest.mark.parametrize("length", [1, 5, 16, 17, 40])
def test_the_lightning_form_computes_minimaxs_attention(length: int) -> None:
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    layer = _minimax_layer(16)
    x = torch.randn(2, length, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, length)
    mask[1, length // 2 :] = 0
    with torch.no_grad():
        # from no state: transformers by blocks (the last one partial)
        (want, want_state), (got, got_state) = (
            layer(x, None, mask),
            lightning_attention_by_blocks(layer, x, None, mask),
        )
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_state, want_state)
        # from a cached state: transformers position by position; the cache gets the state after the last
        start = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2)) * 0.1
        caches = MiniMaxCache(), MiniMaxCache()
        for cache in caches:
            cache.set_linear_cache(0, start.clone())
        want, _ = layer(x, None, None, caches[0])
        got, _ = lightning_attention_by_blocks(layer, x, None, None, caches[1])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(caches[1].get_linear_cache(0), caches[0].get_linear_cache(0))


def test_the_lightning_form_captures_without_a_guard_on_the_length() -> None:
    layer = _minimax_layer(16)

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = lightning_attention_by_blocks(self.layer, x, None, None)[0]
            return out

    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))
    result = fastonnx.to_onnx(Attention(), (x,), dynamic_shapes=({0: Dim.DYNAMIC, 1: Dim.DYNAMIC},))
    assert "guards_kept" not in result.stats and "narrowed" not in result.stats, result.stats
    for length in (2, 16, 17, 50):  # one block, a full one, one past it, several
        x = torch.randn(1 + length % 3, length, 32, generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            torch.testing.assert_close(result(x), layer(x, None, None)[0], msg=f"{length} tokens")


@pytest.mark.parametrize("module", ["t5gemma", "t5gemma2"])
def test_the_shift_by_concat_is_t5gemmas(module: str) -> None:
    import importlib

    models = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    shift = (
        models.T5GemmaPreTrainedModel._shift_right
        if module == "t5gemma"
        else models.T5Gemma2PreTrainedModel.prepare_decoder_input_ids_from_labels
    )
    model = SimpleNamespace(config=SimpleNamespace(decoder=SimpleNamespace(bos_token_id=2, pad_token_id=0)))
    for length in (1, 2, 7):
        ids = torch.randint(3, 50, (3, length), generator=torch.Generator().manual_seed(length))
        ids[0, -1], ids[1, 0] = -100, -100
        torch.testing.assert_close(shift_right_by_concat(model, ids), shift(model, ids))


def test_a_combined_mask_is_made_by_broadcasting_as_by_vmap() -> None:
    from transformers import masking_utils

    class Mask(torch.nn.Module):
        def forward(self, padding: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
            def both_images(
                b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
            ) -> torch.Tensor:
                return (images[b, q] == 1) & (images[b, kv] == 1)  # bidirectional between image tokens

            out: torch.Tensor = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](
                batch_size=padding.shape[0],
                q_length=padding.shape[1],
                kv_length=padding.shape[1],
                mask_function=masking_utils.or_masks(masking_utils.causal_mask_function, both_images),
                attention_mask=padding,
                allow_is_causal_skip=False,
                use_vmap=True,  # as transformers asks for a combined mask
            )
            return out

    padding = torch.tensor([[1] * 6, [1] * 4 + [0] * 2], dtype=torch.bool)
    images = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0]])
    dims = {0: Dim.DYNAMIC, 1: Dim.DYNAMIC}
    result = fastonnx.to_onnx(Mask(), (padding, images), dynamic_shapes=(dims, dims))
    # vmap kept as functorch calls had no converter; the mask by broadcasting is vmap's
    with torch.no_grad():
        want = Mask()(padding, images)
    torch.testing.assert_close(result(padding, images), want, rtol=0, atol=0)
    assert masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] is masking_utils.sdpa_mask  # undone
