"""The architecture sweep's CI sample (issue 32, part 5): scripts/architecture_sweep.py's per-architecture
function on one causal LM, one masked LM and one image classifier, each built from its tiny config with
random weights, saved to a folder, exported by ``fastonnx export`` and verified against transformers.
The full sweep writes the "transformers architectures" section of docs/coverage.md."""

from __future__ import annotations

import pathlib

import pytest
from checkpoint_folders import architecture_sweep

_sweep = architecture_sweep


SAMPLE = [
    ("text-generation", "qwen2", "Qwen2ForCausalLM"),
    ("fill-mask", "roberta", "RobertaForMaskedLM"),
    ("image-classification", "convnext", "ConvNextForImageClassification"),
]


@pytest.mark.parametrize(("task", "model_type", "class_name"), SAMPLE, ids=[s[1] for s in SAMPLE])
def test_sample_architecture_passes(
    tmp_path: pathlib.Path, task: str, model_type: str, class_name: str
) -> None:
    sweep = _sweep()
    assert (model_type, class_name) in sweep.architectures(task)  # the sweep's own list holds it
    result = sweep.sweep_one(task, model_type, class_name, workdir=str(tmp_path))
    assert result["status"] == "pass", result
    assert list(tmp_path.iterdir()) == []  # every folder it wrote is deleted


def test_tiny_config_is_tiny() -> None:
    sweep = _sweep()
    config = sweep.tiny_config("llama")
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 64, 128)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)
    vision = sweep.tiny_config("vit")
    assert (vision.image_size, vision.patch_size, vision.num_hidden_layers) == (32, 8, 2)


def test_unbuildable_architecture_is_reported(tmp_path: pathlib.Path) -> None:
    sweep = _sweep()
    result = sweep.sweep_one("text-generation", "llama", "NoSuchModelForCausalLM", workdir=str(tmp_path))
    assert result["status"] == "not buildable"
    assert "NoSuchModelForCausalLM" in result["detail"]
    assert list(tmp_path.iterdir()) == []


def test_only_what_no_input_could_run_is_left_out_of_a_tasks_count() -> None:
    """Issue 42: "not buildable" only where transformers itself cannot run the model here; a forward
    failing on the sweep's inputs, or a tiny config still too large, is the sweep's gap and counts
    against the task, in new runs and in runs stored before the rule."""
    sweep = _sweep()
    assert sweep.build_failure("LookupError: transformers has no class FooModel") == "not buildable"
    detectron = "ImportError: LayoutLMv2Model requires the detectron2 library but it was not found"
    assert sweep.build_failure(detectron) == "not buildable"
    torchaudio = (
        "ImportError: HiggsAudioV2TokenizerModel requires the torchaudio library but it was not found"
    )
    assert sweep.build_failure(torchaudio) == "sweep gap"  # the index has it: ours to install
    eager = "RuntimeError: eager forward fails: ValueError: `visual_feats` cannot be `None`"
    assert sweep.build_failure(eager) == "sweep gap"
    assert sweep.build_failure("ValueError: 296M parameters at the tiny sizes") == "sweep gap"
    stored = [
        {"model_type": "a", "class_name": "A", "status": "pass", "detail": "", "seconds": 1},
        {"model_type": "b", "class_name": "B", "status": "not buildable", "detail": eager, "seconds": 1},
        {"model_type": "c", "class_name": "C", "status": "not buildable", "detail": detectron, "seconds": 1},
    ]
    entry = {
        "commit": "abc",
        "transformers": "5",
        "torch": "2",
        "command": "x",
        "planned": 3,
        "results": stored,
    }
    swept, buildable, counts = sweep._counts(entry)
    assert (swept, buildable, counts["pass"], counts["sweep gap"]) == (3, 2, 1, 1)
    assert "**1 of 2** (50.0%) | 0 | 0 | 1 | 1 |" in sweep._row("fill-mask", entry)


def test_a_config_without_the_tasks_sizes_is_a_named_input_error(tmp_path: pathlib.Path) -> None:
    # xLSTM's config has no attention heads, which text-generation's cache reads: a clear refusal naming
    # the missing size (a composite config's text sizes are read from its text config instead:
    # test_sweep_decoders.py)
    import fastonnx
    from fastonnx.errors import InputError

    sweep = _sweep()
    folder = tmp_path / "xlstm"
    sweep.build_checkpoint("text-generation", "xlstm", "xLSTMForCausalLM", folder)
    with pytest.raises(InputError, match=r"xLSTMConfig\) has no 'num_attention_heads'"):
        fastonnx.export_pretrained(folder, tmp_path / "out", task="text-generation")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the tiny-config maker's rules (issue 41)


def test_per_layer_config_follows_the_two_kept_layers() -> None:
    # Gemma 4 sets its full-attention layers (5, 11, ... of 30) apart with twice as wide heads: at two
    # layers, one sliding and one full, the full one (index 1) keeps its heads twice as wide
    sweep = _sweep()
    config = sweep.tiny_config("gemma4_text")
    assert config.num_hidden_layers == 2
    assert config.layer_types == ["sliding_attention", "full_attention"]
    per_layer = config.to_dict()["per_layer_config"]
    assert {int(k) for k in per_layer} <= {0, 1}
    assert [layer.head_dim for layer in config.per_layer_config] == [16, 32]


def test_a_composite_config_gives_the_class_its_text_config() -> None:
    # Qwen3_5ForCausalLM takes Qwen3_5Config's text_config, as transformers' auto classes pass it
    import torch
    import transformers

    sweep = _sweep()
    composite = sweep.tiny_config("qwen3_5")
    config = sweep._model_config(transformers.Qwen3_5ForCausalLM, composite)
    assert type(config).__name__ == "Qwen3_5TextConfig"
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 64, 128)
    with torch.device("meta"):
        model = transformers.Qwen3_5ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) < sweep.MAX_PARAMS


def test_a_config_of_several_text_configs_gives_its_decoders() -> None:
    # MusicGen's config holds text_encoder and decoder: get_text_config() raises on it ("Multiple valid
    # text configs"); the sweep reads the decoder's (its codes: the EnCodec codebook) and, for the
    # tokenizer, the text encoder's
    sweep = _sweep()
    for model_type in ("musicgen", "musicgen_melody"):
        config = sweep.tiny_config(model_type)
        assert sweep.text_config(config) is config.decoder
        assert sweep.text_config(config, encoder=True) is config.text_encoder
        assert config.decoder.vocab_size == config.audio_encoder.codebook_size == config.pad_token_id
    llama = sweep.tiny_config("llama")
    assert sweep.text_config(llama) is llama


def test_sizes_left_none_are_filled() -> None:
    sweep = _sweep()
    assert sweep.tiny_config("hunyuan_v1_dense").head_dim == 16  # its attention computes head_dim ** -0.5
    assert sweep.tiny_config("nemotron").num_key_value_heads == 2


def test_hybrids_keep_an_attention_layer() -> None:
    sweep = _sweep()
    assert sweep.tiny_config("bamba").attn_layer_indices == [1]  # none by default
    assert sweep.tiny_config("granitemoehybrid").layer_types == ["linear_attention", "full_attention"]
    assert sweep.tiny_config("recurrent_gemma").block_types == ["recurrent", "attention"]


def test_validator_messages_name_the_value_they_want() -> None:
    sweep = _sweep()
    assert sweep._validator_fix("hidden_size_per_layer_input must be 0, got 256") == (
        "hidden_size_per_layer_input",
        False,
        0,
    )
    assert sweep._validator_fix("ZAYA currently supports `num_experts_per_tok=1` only.") == (
        "num_experts_per_tok",
        False,
        1,
    )
    message = "`num_key_value_heads` (2) must equal `num_attention_heads` (4)."
    assert sweep._validator_fix(message) == ("num_key_value_heads", True, "num_attention_heads")
    assert sweep._validator_fix("vision adapter output width must match the text hidden size")[2] == "the"
    assert sweep._validator_fix("Inconsistent configuration") is None
    # applied: Gemma 4 Assistant's own defaults break its validator (in its text_config), Zaya's top-1
    assert sweep.tiny_config("gemma4_assistant").text_config.hidden_size_per_layer_input == 0
    assert sweep.tiny_config("zaya").num_experts_per_tok == 1
    mamba2 = sweep.tiny_config("mamba2")  # its heads span hidden x expand
    assert mamba2.num_heads * mamba2.head_dim == mamba2.hidden_size * mamba2.expand


def test_a_size_not_shrunk_is_found_from_the_largest_parameters() -> None:
    # XLM's width is emb_dim, which no rule names: its 2048-wide weights lead to it
    import torch
    import transformers

    sweep = _sweep()
    config = sweep.tiny_config("xlm")
    with torch.device("meta"):
        model = transformers.XLMWithLMHeadModel(config)
    assert sweep._unshrunk(model, config) == {"emb_dim": 64}


def test_build_only_counts_without_exporting(tmp_path: pathlib.Path) -> None:
    sweep = _sweep()
    result = sweep.sweep_one("text-generation", "llama", "LlamaForCausalLM", str(tmp_path), build_only=True)
    assert result["status"] == "buildable", result
    assert result["detail"].endswith(" parameters")
    assert list(tmp_path.iterdir()) == []
