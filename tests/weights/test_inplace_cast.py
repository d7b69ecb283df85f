"""to_onnx(weights=) with a checkpoint whose dtype differs from the graph's: a bf16 checkpoint, an fp32
model. The reference is the fp32 model loaded from the bf16 weights (from_pretrained(dtype=float32))."""

from __future__ import annotations

import os

import onnx
import onnxruntime
import pytest
import torch
from safetensors import safe_open

import fastonnx
from support.model_zoo import Logits, tied_llama_config


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("bf16")
    torch.manual_seed(0)
    model = LlamaForCausalLM(tied_llama_config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="30KB")
    return str(folder)


def _checkpoint(folder: str) -> tuple[int, int]:
    """(tensors, bytes) of the checkpoint; every tensor is bf16."""
    count = size = 0
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as st:
                for key in st.keys():
                    t = st.get_tensor(key)
                    assert t.dtype == torch.bfloat16
                    count, size = count + 1, size + t.numel() * 2
    return count, size


def _meta_model() -> torch.nn.Module:
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.device("meta"):
        meta = LlamaForCausalLM(tied_llama_config()).eval()
    meta.model.rotary_emb = LlamaRotaryEmbedding(tied_llama_config())
    return Logits(meta)


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    return ids.to(device), torch.ones(2, 8, dtype=torch.int64, device=device)


def _matches_fp32_eager(path: str, folder: str) -> None:
    from transformers import LlamaForCausalLM

    real = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids, mask = _inputs("cpu")
    sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = real(input_ids=ids, attention_mask=mask).logits
    assert expected.dtype == torch.float32
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)


def _initializer_types(path: str) -> dict[int, int]:
    """ONNX element type -> how many initializers over 1 KiB have it."""
    found: dict[int, int] = {}
    for t in onnx.load(path, load_external_data=False).graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if n * 2 > 1024:
            found[t.data_type] = found.get(t.data_type, 0) + 1
    return found


def _cleanup(path: str) -> None:
    for p in (path, path + ".data"):
        if os.path.exists(p):
            os.unlink(p)


@pytest.mark.parametrize("optimize", [True, "onnxruntime"])
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_bf16_checkpoint_is_referenced_behind_casts(bf16_checkpoint: str, optimize, device: str) -> None:
    from transformers import LlamaForCausalLM

    if device == "meta":
        model = _meta_model()
    else:
        model = Logits(LlamaForCausalLM.from_pretrained(bf16_checkpoint, dtype=torch.float32).eval())
    path = os.path.join(bf16_checkpoint, "model.onnx")
    try:
        r = fastonnx.to_onnx(
            model, _inputs(device), filename=path, weights=bf16_checkpoint, optimize=optimize
        )
        w = r.stats["file"]["weights"]
        count, size = _checkpoint(bf16_checkpoint)
        # every tensor referenced as stored, in bf16: a Cast to float32 after each, nothing written
        assert (w["referenced_tensors"], w["referenced_bytes"], w["cast_tensors"]) == (count, size, count)
        assert (w["written_tensors"], w["written_bytes"], w["converted_tensors"]) == (0, 0, 0)
        graph = onnx.load(path, load_external_data=False).graph
        bf16 = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16}
        casts = [n for n in graph.node if n.op_type == "Cast" and n.input[0] in bf16]
        assert len(bf16) == count and len(casts) == count
        assert all(a.i == onnx.TensorProto.FLOAT for n in casts for a in n.attribute if a.name == "to")
        _matches_fp32_eager(path, bf16_checkpoint)
    finally:
        _cleanup(path)


def test_cast_weights_writes_the_bf16_checkpoint_converted_to_float32(bf16_checkpoint: str, tmp_path) -> None:
    path = str(tmp_path / "model.onnx")
    r = fastonnx.to_onnx(
        _meta_model(),
        _inputs("meta"),
        filename=path,
        weights=bf16_checkpoint,
        cast_weights=True,
        external_data=True,
    )
    w = r.stats["file"]["weights"]
    count, size = _checkpoint(bf16_checkpoint)
    assert (w["converted_tensors"], w["written_tensors"], w["referenced_tensors"]) == (count, count, 0)
    # into <model>.onnx.data, float32: twice the checkpoint's bytes but the norms' 5 x 64 floats, which
    # stay inside the .onnx (small tensors); nothing linked, no shard beside it
    assert r.stats["file"]["data_path"] == path + ".data"
    assert w["written_bytes"] >= 2 * size - 5 * 64 * 4 and w["linked_bytes"] == 0
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert _initializer_types(path).keys() == {onnx.TensorProto.FLOAT}
    assert "deferred_weights" not in r.stats or r.stats["deferred_weights"] == 0
    _matches_fp32_eager(path, bf16_checkpoint)


def test_cast_weights_with_a_real_model_writes_its_own_float32_weights(
    bf16_checkpoint: str, tmp_path
) -> None:
    from transformers import LlamaForCausalLM

    real = Logits(LlamaForCausalLM.from_pretrained(bf16_checkpoint, dtype=torch.float32).eval())
    path = str(tmp_path / "model.onnx")
    r = fastonnx.to_onnx(real, _inputs("cpu"), filename=path, weights=bf16_checkpoint, cast_weights=True)
    w = r.stats["file"]["weights"]
    # the model holds the cast bytes already: written from memory, nothing referenced or converted
    assert (w["referenced_tensors"], w["converted_tensors"], w["cast_tensors"]) == (0, 0, 0)
    assert w["written_tensors"] == _checkpoint(bf16_checkpoint)[0]
    assert _initializer_types(path).keys() == {onnx.TensorProto.FLOAT}
    _matches_fp32_eager(path, bf16_checkpoint)


def test_a_cast_onnxruntime_would_not_fold_is_written_converted(
    bf16_checkpoint: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor whose float32 cast is larger than onnxruntime folds (1 GiB; here the limit lowered to
    the embedding's size) is written converted while streaming even without cast_weights: behind a Cast,
    onnxruntime would cast it at every run. The smaller ones stay referenced behind their Cast."""
    from fastonnx.stored_weights import checkpoints

    embedding = 256 * 64 * 4  # tied_llama_config's vocabulary x hidden, float32 bytes
    monkeypatch.setattr(checkpoints, "ORT_FOLD_LIMIT", embedding - 1)
    path = str(tmp_path / "model.onnx")
    r = fastonnx.to_onnx(
        _meta_model(), _inputs("meta"), filename=path, weights=bf16_checkpoint, external_data=True
    )
    w = r.stats["file"]["weights"]
    assert w["converted_tensors"] == 1 and w["referenced_tensors"] > 0, w
    _matches_fp32_eager(path, bf16_checkpoint)


def test_a_large_table_read_by_gathers_alone_casts_its_rows(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An untied embedding table past onnxruntime's folding limit (lowered here to below its float32
    size) is read by its Gather alone: it stays referenced in bf16, a Cast after the Gather makes the
    gathered rows float32 (neither a float32 copy written nor the whole table cast at every run). The
    head's weight of the same size, read by a product, is still written converted."""
    from transformers import LlamaForCausalLM

    from fastonnx.stored_weights import checkpoints

    config = tied_llama_config()
    config.tie_word_embeddings = False
    folder = tmp_path / "untied"
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().to(torch.bfloat16).save_pretrained(folder)
    embedding = 256 * 64 * 4  # vocabulary x hidden, float32 bytes
    monkeypatch.setattr(checkpoints, "ORT_FOLD_LIMIT", embedding - 1)
    with torch.device("meta"):
        meta = LlamaForCausalLM(config).eval()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    meta.model.rotary_emb = LlamaRotaryEmbedding(config)
    path = str(tmp_path / "model.onnx")
    r = fastonnx.to_onnx(Logits(meta), _inputs("meta"), filename=path, weights=str(folder))
    w = r.stats["file"]["weights"]
    assert (w["gathered_cast_tensors"], w["converted_tensors"]) == (1, 1), w
    graph = onnx.load(path, load_external_data=False).graph
    tables = [
        t for t in graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16 and list(t.dims) == [256, 64]
    ]
    assert len(tables) == 1
    (gather,) = [n for n in graph.node if n.input and n.input[0] == tables[0].name]
    assert gather.op_type == "Gather"
    (cast,) = [n for n in graph.node if n.input and n.input[0] == gather.output[0]]
    assert cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.FLOAT
    _matches_fp32_eager(path, str(folder))
