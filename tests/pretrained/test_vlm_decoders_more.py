"""More image-text-to-text decoders the architecture sweep (scripts/architecture_sweep.py) found failing,
each built from the sweep's own tiny config with random weights, exported by ``export_pretrained`` and
verified (the image features, then a greedy generation over the three files against transformers'
``generate`` on the model ``from_pretrained`` loads):

- ShieldGemma 2 (Gemma3ForConditionalGeneration under a ShieldGemma 2 config): transformers' own
  ``save_pretrained`` writes its language model under key names its ``from_pretrained`` does not read
  back (the ``shieldgemma2`` conversion mapping is ShieldGemma2ForImageClassification's), which then loads
  random weights, a new draw at each load; the sweep saves such a model under its own key names;
- Unlimited-OCR's reference sliding-window cache keeps every prompt position and a window of the
  generated ones, its mask reading the prompt's length from the cache as a Python int: the decoder takes
  it as an input (``prefill_length``, reference_windows.py) and keeps every position, the mask hiding the
  dropped ones (the sweep's tiny window of 3 slides within a verification's 6 steps);
- T5Gemma 2 is an encoder-decoder (its encoder merges the image's rows into the prompt, its decoder
  cross-attends the states): it took the decoder-only layout, whose step's embeddings went to its
  encoder with the decoder's mask over past and new positions, two lengths ("The size of tensor a (s29)
  must match the size of tensor b (s53)"); it now takes the encoder-decoders' layout
  (image_encoder_decoders.py) with Florence-2's inputs;
- GLM-5 Next's sparse-attention indexer keeps the pools some row can select, a count read from the
  values, so the fake prefill that reads the cache's layout failed and its hybrid cache (linear-attention
  states, indexed keys) was taken for plain keys and values ("Cannot get conv state for non linear
  attention layer 0"); capture/pooled_indexers.py keeps every pool (and the budget's unselectable ones),
  the same selection; its rotary part of no width then needed ``allowzero`` on a view beside symbolic
  dims.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from support.matrix import sampled

TASK = "image-text-to-text"
FIXED = ["shieldgemma2", "unlimited_ocr", "t5gemma2", "glm5_next"]
IN_CI = {"unlimited_ocr"}  # the prefill_length input end to end; ShieldGemma 2 by the unit test below
CASES = sampled(FIXED, lambda name: name in IN_CI)

_sweep = architecture_sweep


def _build(tmp_path: pathlib.Path, model_type: str) -> pathlib.Path:
    sweep = _sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(TASK, model_type, dict(sweep.architectures(TASK))[model_type], folder)
    return folder


@pytest.mark.parametrize("model_type", CASES)
def test_the_decoder_exports_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    folder = _build(tmp_path, model_type)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note


def _tiny_shieldgemma2() -> torch.nn.Module:
    from transformers import Gemma3ForConditionalGeneration

    sweep = _sweep()
    defaults = sweep._tokens_in_vocabulary(sweep._defaults("shieldgemma2"))
    config = sweep._model_config(Gemma3ForConditionalGeneration, sweep.tiny_config("shieldgemma2", defaults))
    torch.manual_seed(0)
    model: torch.nn.Module = Gemma3ForConditionalGeneration(config).eval()
    return model


def test_transformers_does_not_reload_its_own_shieldgemma2_save(tmp_path: pathlib.Path) -> None:
    """transformers against itself: the default save's language model is lost on reload, the sweep's
    save loads back every weight as built."""
    model = _tiny_shieldgemma2()
    cls = type(model)
    model.save_pretrained(tmp_path / "default")
    _, info = cls.from_pretrained(tmp_path / "default", output_loading_info=True)
    assert any(k.startswith("model.language_model.") for k in info["missing_keys"])

    _sweep().save_reloadable(model, tmp_path / "sweep")
    reloaded, info = cls.from_pretrained(tmp_path / "sweep", output_loading_info=True)
    assert not info["missing_keys"]
    built = model.state_dict()
    for name, value in reloaded.state_dict().items():
        torch.testing.assert_close(value, built[name], rtol=0, atol=0, msg=name)


def test_the_prompt_length_mask_is_transformers_reference_window() -> None:
    """A prefill then single-token steps past the window: the text model over full layers with the mask
    reading ``prefill_length`` gives transformers' states over its own reference sliding-window cache."""
    from transformers import DynamicCache, UnlimitedOcrForConditionalGeneration
    from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrTextModel

    from fastonnx.pretrained.reference_windows import prefill_length_read

    sweep = _sweep()
    defaults = sweep._tokens_in_vocabulary(sweep._defaults("unlimited_ocr"))
    composite = sweep.tiny_config("unlimited_ocr", defaults)
    config = sweep._model_config(UnlimitedOcrForConditionalGeneration, composite).text_config
    torch.manual_seed(0)
    model = UnlimitedOcrTextModel(config).eval()
    prompt, steps = 5, 2 * int(config.sliding_window)
    embeds = torch.randn(1, prompt + steps, int(config.hidden_size))

    def run(cache: object) -> list[torch.Tensor]:
        states, bounds = [], [(0, prompt)] + [(prompt + i, prompt + i + 1) for i in range(steps)]
        with torch.no_grad():
            for start, end in bounds:
                out = model(
                    inputs_embeds=embeds[:, start:end],
                    attention_mask=torch.ones(1, end, dtype=torch.int64),
                    position_ids=torch.arange(start, end)[None],
                    past_key_values=cache,
                    use_cache=True,
                )
                states.append(out.last_hidden_state)
        return states

    reference = DynamicCache(config=config)
    assert type(reference.layers[0]).__name__ == "UnlimitedOcrDynamicReferenceSlidingWindowLayer"
    expected = run(reference)
    with prefill_length_read(model, torch.tensor(prompt)):
        got = run(DynamicCache())  # full layers: every position kept
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want)


def test_t5gemma2s_encoder_states_are_its_own_merge() -> None:
    """The encoder file's states (the image's rows merged as Florence-2's are) equal T5Gemma 2's own
    encoder on the prompt and pixels, a padded position included."""
    from transformers import T5Gemma2ForConditionalGeneration

    from fastonnx.pretrained.image_encoder_decoders import image_kind

    sweep = _sweep()
    defaults = sweep._tokens_in_vocabulary(sweep._defaults("t5gemma2"))
    config = sweep._model_config(T5Gemma2ForConditionalGeneration, sweep.tiny_config("t5gemma2", defaults))
    torch.manual_seed(0)
    model = T5Gemma2ForConditionalGeneration(config).eval()
    kind = image_kind(model)
    assert kind is not None
    inputs = kind.pad(kind.example(model, 2, "cpu"))
    with torch.no_grad():
        states, mask = kind.encode(model, inputs)
        expected = model.get_encoder()(**inputs).last_hidden_state
    torch.testing.assert_close(states, expected)
    assert torch.equal(mask, inputs["attention_mask"])


class _EmptyDimView(torch.nn.Module):
    """GLM-5 Next's rotary part of no width (``qk_rope_head_dim`` 0): a view to a static 0 beside
    symbolic dims, which ONNX's Reshape reads as "copy the input dim" without ``allowzero``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        empty = x[..., :0]
        return empty.view(x.shape[0], 1, x.shape[1], 0), empty.flatten(1)


def test_a_view_to_an_empty_dim_beside_symbolic_ones() -> None:
    from support.export_check import check_export

    x = torch.randn(2, 5, 4)
    dims = {"x": {0: torch.export.Dim("b", min=1, max=64), 1: torch.export.Dim("s", min=1, max=64)}}
    check_export(
        _EmptyDimView(), (x,), dynamic_shapes=dims, run_args=[(torch.randn(3, 7, 4),)], atol=0, rtol=0
    )


def test_glm5_next_pools_kept_whole_select_transformers_keys() -> None:
    """GLM-5 Next's indexer with every pool kept (and the budget's unselectable ones) selects the keys
    transformers' selects, a left-padded row and lengths below and above the budget's pools included
    (the indices feed a mask by scattering: compared as sets)."""
    from transformers import Glm5NextForConditionalGeneration
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextIndexer

    from fastonnx.capture.pooled_indexers import pools_of_fixed_count

    sweep = _sweep()
    defaults = sweep._tokens_in_vocabulary(sweep._defaults("glm5_next"))
    composite = sweep.tiny_config("glm5_next", defaults)
    text = sweep._model_config(Glm5NextForConditionalGeneration, composite).text_config
    torch.manual_seed(0)
    indexer = Glm5NextTextIndexer(text, 0).eval()
    with torch.no_grad():
        for p in indexer.parameters():  # zeros at initialization: every pool alike
            p.copy_(torch.randn(p.shape))
    for length in (3, 6, 11, 23):
        hidden = torch.randn(2, length, int(text.hidden_size))
        resid = torch.randn(2, length, int(text.q_lora_rank))
        mask = torch.ones(2, length, dtype=torch.bool)
        mask[1, : length // 3] = False  # left padding
        want = indexer(hidden, resid, mask, None)
        with pools_of_fixed_count():
            got = indexer(hidden, resid, mask, None)
        assert got.shape == want.shape
        assert torch.equal(got.sort(-1).values, want.sort(-1).values), length
