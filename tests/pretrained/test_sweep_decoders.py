"""Causal LMs the architecture sweep (scripts/architecture_sweep.py) found failing to export, each built
from the sweep's own tiny config with random weights, exported by ``export_pretrained`` and verified
(the package run in onnxruntime against transformers eager: a prefill and a decode step, logits and
every present tensor at fastonnx's float32 tolerances):

- buffers on the meta device with the parameters: BERT's ``token_type_ids`` buffer, gathered at the
  position ids, used to stay on the CPU ("found at least two devices, cpu and meta");
- the past's shapes as the model caches them, not as its config states them: multi-query attention
  (GPT-BigCode: one head) and multi-head latent attention (DeepSeek-V3: the compressed latent and the
  rotary part, of different sizes) failed at the concatenation ("Sizes of tensors must match");
- Mllama's text-only decoder skips its cross-attention layers while their cache is empty; its package
  keeps them as caches of 0 positions, passed through (a dynamic past made the captured step attend
  over them, and onnxruntime failed on the prefill's empty cross cache);
- an encoder config returning no cache is an InputError naming is_decoder; a decoder keeping no cache
  transformers' ``Cache`` holds (GPT-1 none, RWKV and RecurrentGemma state of their own) is packaged
  without one: the whole sequence in, its logits out (caches of more than keys and values:
  test_hybrid_caches.py).
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import DECODER, architecture_sweep, save_checkpoint
from safetensors.torch import load_file

import fastonnx
from fastonnx.errors import InputError
from fastonnx.pretrained.meta_init import buffers_on_meta, build_on_meta
from support.matrix import sampled

_sweep = architecture_sweep


def _export(tmp_path: pathlib.Path, model_type: str, class_name: str) -> fastonnx.PretrainedExport:
    folder = tmp_path / "checkpoint"
    _sweep().build_checkpoint("text-generation", model_type, class_name, folder)
    return fastonnx.export_pretrained(folder, tmp_path / "package", task="text-generation", progress=False)


def test_every_buffer_moves_to_meta_with_its_value_kept() -> None:
    from transformers import BertConfig, BertLMHeadModel

    config = BertConfig(**{k: DECODER[k] for k in ("vocab_size", "hidden_size", "intermediate_size")})
    config.update({"num_hidden_layers": 2, "num_attention_heads": 4, "is_decoder": True})
    real = BertLMHeadModel(config).eval()
    meta = build_on_meta(lambda: BertLMHeadModel(config)).eval()
    values = buffers_on_meta(meta, [])  # no checkpoint: every buffer's value is returned
    assert all(b.device.type == "meta" for b in meta.buffers())
    expected = dict(real.named_buffers())
    assert set(values) == set(expected)
    for name, want in expected.items():
        torch.testing.assert_close(values[name], want, rtol=0, atol=0, msg=name)
        assert values[name].is_contiguous() and values[name].device.type == "cpu"


# CI: BERT's buffer; GPT-Neo's made number (capture/meta_constants.py's own unit tests run in CI too)
MADE_ON_CPU = {"bert": "BertLMHeadModel", "gpt_neo": "GPTNeoForCausalLM"}


@pytest.mark.parametrize("model_type", sampled(sorted(MADE_ON_CPU), lambda name: name == "bert"))
def test_values_the_model_makes_on_the_cpu_keep_their_values(tmp_path: pathlib.Path, model_type: str) -> None:
    """BERT decoder: the token type ids its embeddings gather, computed by the model's __init__, are read
    beside the shards. GPT-Neo's attention makes ``torch.tensor(mask_value, device=attn_weights.device)``:
    on the meta device the package's constant had no bytes ("is on the meta device and not in the
    shards"); the capture makes it on the CPU (capture/meta_constants.py)."""
    written = _export(tmp_path, model_type, MADE_ON_CPU[model_type])
    assert written.verified is True, written.verify_note
    if model_type == "bert":
        stored = load_file(written.outdir / "fastonnx_missing.safetensors")
        want = torch.zeros(1, 128, dtype=torch.int64)
        assert torch.equal(stored["model.bert.embeddings.token_type_ids"], want)


@pytest.mark.parametrize(
    ("model_type", "class_name", "key", "value"),
    [
        ("gpt_bigcode", "GPTBigCodeForCausalLM", (1, 16), (1, 16)),  # multi-query: 1 head, not 4
        (
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            (1, 32),
            (1, 8),
        ),  # the latent (rank 32), the rotary part (8)
    ],
    ids=["gpt_bigcode", "deepseek_v3"],
)
def test_the_past_has_the_shapes_the_model_caches(
    tmp_path: pathlib.Path,
    model_type: str,
    class_name: str,
    key: tuple[int, int],
    value: tuple[int, int],
) -> None:
    import onnx

    written = _export(tmp_path, model_type, class_name)
    assert written.verified is True, written.verify_note
    graph = onnx.load(str(written.model_path), load_external_data=False).graph
    dims = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.input}
    for layer in range(2):
        assert dims[f"past_key_values.{layer}.key"] == ["batch_size", key[0], "past_sequence_length", key[1]]
        assert dims[f"past_key_values.{layer}.value"] == [
            "batch_size",
            value[0],
            "past_sequence_length",
            value[1],
        ]


def test_an_encoder_config_is_refused_naming_is_decoder(tmp_path: pathlib.Path) -> None:
    # BertLMHeadModel with is_decoder=False attends both ways and returns no cache
    folder = tmp_path / "checkpoint"
    sizes = {k: DECODER[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")}
    save_checkpoint(
        folder, "bert", "BertLMHeadModel", {**sizes, "num_attention_heads": 4, "is_decoder": False}
    )
    with pytest.raises(InputError, match=r"BertLMHeadModel returns no cache .* is_decoder=False"):
        fastonnx.export_pretrained(folder, tmp_path / "package", task="text-generation", progress=False)
    assert not (tmp_path / "package").exists()


def test_a_composite_models_text_path_is_packaged(tmp_path: pathlib.Path) -> None:
    """Gemma 3's vision-language class is in transformers' causal-LM mapping: its sizes are in its text
    config, and text-generation packages its text path (genai's type from the text config)."""
    import json

    written = _export(tmp_path, "gemma3", "Gemma3ForConditionalGeneration")
    assert written.verified is True, written.verify_note
    config = json.loads((tmp_path / "package" / "genai_config.json").read_text())
    assert config["model"]["type"] == "gemma3_text"
    assert config["model"]["vocab_size"] == 128


def test_cross_attention_layers_of_a_text_decoder_stay_empty(tmp_path: pathlib.Path) -> None:
    import onnx

    written = _export(tmp_path, "mllama", "MllamaForCausalLM")
    assert written.verified is True, written.verify_note
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tmp_path / "checkpoint").get_text_config()
    proto = onnx.load(str(written.model_path), load_external_data=False)
    sizes = {
        i.name: [
            d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim
        ]
        for i in proto.graph.input
    }
    for layer in range(config.num_hidden_layers):
        past = sizes[f"past_key_values.{layer}.key"][2]
        assert (past == 0) is (layer in config.cross_attention_layers), (layer, past)


NO_CACHE = {
    "openai-gpt": ("OpenAIGPTLMHeadModel", True),  # no cache at all
    "rwkv": ("RwkvForCausalLM", False),  # its own state; a Python loop over the positions (swapped)
    "recurrent_gemma": ("RecurrentGemmaForCausalLM", True),  # state in module buffers; position ids
}


@pytest.mark.parametrize("model_type", sampled(sorted(NO_CACHE), lambda name: name == "rwkv"))
def test_a_decoder_keeping_no_cache_is_packaged_without_one(tmp_path: pathlib.Path, model_type: str) -> None:
    import onnxruntime as ort

    class_name, with_positions = NO_CACHE[model_type]
    written = _export(tmp_path, model_type, class_name)
    assert written.verified is True, written.verify_note
    names = ["input_ids", "attention_mask", *(["position_ids"] if with_positions else [])]
    assert written.input_names == names and written.output_names == ["logits"]
    assert "genai_config.json" not in written.files
    assert "keeps no cache" in written.report_path.read_text()
    # a batch and a length the verification did not use, one row left-padded as generation pads it
    import transformers

    model = getattr(transformers, class_name).from_pretrained(tmp_path / "checkpoint").eval()
    ids = torch.randint(3, 100, (3, 11), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {n: feeds[n].numpy() for n in names})
    extra = {"position_ids": positions} if with_positions else {}
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits
    torch.testing.assert_close(torch.from_numpy(got), want)


def test_a_decoder_reading_a_row_a_codebook_is_packaged(tmp_path: pathlib.Path) -> None:
    """MusicGen's decoder takes ``input_ids`` of ``(batch * num_codebooks, length)`` and reshapes them to
    ``(batch, num_codebooks, length)``: a free batch of rows failed that reshape ("shape '[-1, 4, s70]'
    is invalid"); the rows are ``4*batch_size``, the mask and the cache ``batch_size``."""
    import onnx

    written = _export(tmp_path, "musicgen", "MusicgenForCausalLM")
    assert written.verified is True, written.verify_note
    graph = onnx.load(str(written.model_path), load_external_data=False).graph
    dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in graph.input}
    assert dims["input_ids"] == ["4*batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert dims["past_key_values.0.key"][0] == "batch_size"
    assert "genai_config.json" not in written.files
    assert "4 rows a sequence" in written.report_path.read_text()
    # Moshi's text model has num_codebooks (8) too, and one embedding table: a row a sequence
    import transformers

    from fastonnx.pretrained.task_inputs import codebooks

    config = _sweep().tiny_config("moshi")
    with torch.device("meta"):
        moshi = transformers.MoshiForCausalLM(config)
    assert config.num_codebooks > 1 and codebooks(moshi, config) == 1


@pytest.mark.full_matrix  # one architecture's fix; Mamba's scan runs in CI (test_hybrid_caches)
def test_a_mixer_scanning_head_by_head_starts_each_from_its_state(tmp_path: pathlib.Path) -> None:
    """Zamba's Mamba mixer reads the recurrent state of every head and scans them one by one: the capture
    refused it ("a selective scan over part of the recurrent state read"); each scan now starts from its
    head's part, and the decode step the verification runs reads the prefill's states."""
    written = _export(tmp_path, "zamba", "ZambaForCausalLM")
    assert written.verified is True, written.verify_note
    assert any(n.endswith(".recurrent_state") for n in written.input_names)


@pytest.mark.full_matrix  # one architecture's fix; an indexed cache runs in CI (test_hybrid_caches)
def test_indexed_positions_are_a_cache_field(tmp_path: pathlib.Path) -> None:
    """Qwen4-Exp's indexed layer keeps the positions of the keys it indexed ([3, batch, past]: its
    multimodal rotary's history) beside the indexer keys, and its indexer loops over every row and
    query in Python: the positions are an input and an output of their own, batch first, and the loop
    is one selection for all (capture/chunked_kernels.py)."""
    import onnx

    written = _export(tmp_path, "qwen4_exp", "Qwen4ExpForCausalLM")
    assert written.verified is True, written.verify_note
    graph = onnx.load(str(written.model_path), load_external_data=False).graph
    dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in graph.input}
    assert dims["past_key_values.1.indexer_position"] == ["batch_size", 3, "past_sequence_length"]
    assert "present.1.indexer_position" in written.output_names
