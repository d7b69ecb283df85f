"""to_onnx(weights=) with checkpoint keys that transformers' loading renames: found through the model's
own conversion mapping (transformers.conversion_mapping.get_model_conversion_mapping)."""

from __future__ import annotations

import os

import onnxruntime
import torch
from safetensors.torch import load_file, save_file

import fastonnx
from support.model_zoo import Field


def _config():  # type: ignore[no-untyped-def]
    from transformers import BertConfig

    return BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )


def _old_style_checkpoint(folder: str, pooler: bool = True) -> dict[str, torch.Tensor]:
    """A BertModel saved with the old ``LayerNorm.gamma`` / ``LayerNorm.beta`` keys (TF-era checkpoints),
    which from_pretrained renames to ``LayerNorm.weight`` / ``LayerNorm.bias``. Returns its tensors."""
    from transformers import BertModel

    torch.manual_seed(0)
    model = BertModel(_config(), add_pooling_layer=pooler).eval()
    with torch.no_grad():
        # trained norms and biases differ (equal all-ones or all-zeros ones merge into one initializer)
        for p in model.parameters():
            p.add_(torch.rand_like(p) * 0.1)
    model.save_pretrained(folder)
    shard = os.path.join(folder, "model.safetensors")
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in load_file(shard).items()
    }
    save_file(renamed, shard, metadata={"format": "pt"})
    return renamed


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(2))
    return ids.to(device), torch.ones(2, 7, dtype=torch.int64, device=device)


def _run(path: str) -> torch.Tensor:
    ids, mask = _inputs("cpu")
    sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0])


def test_old_style_layer_norm_keys_are_found_through_the_models_mapping(tmp_path) -> None:
    from transformers import BertModel

    ckpt = str(tmp_path)
    # no pooler: last_hidden_state does not read it (the export would drop its weights)
    tensors = _old_style_checkpoint(ckpt, pooler=False)
    assert sum(".gamma" in k for k in tensors) == 5  # embeddings + 2 per layer
    real = BertModel.from_pretrained(ckpt, add_pooling_layer=False).eval()
    with torch.device("meta"):
        meta = BertModel(_config(), add_pooling_layer=False).eval()
    # non-persistent buffers are in no checkpoint: made on the CPU
    meta.embeddings.register_buffer("position_ids", torch.arange(64).expand((1, -1)), persistent=False)
    meta.embeddings.register_buffer("token_type_ids", torch.zeros(1, 64, dtype=torch.int64), persistent=False)
    path = os.path.join(ckpt, "model.onnx")
    r = fastonnx.to_onnx(Field(meta, "last_hidden_state"), _inputs("meta"), filename=path, weights=ckpt)
    w = r.stats["file"]["weights"]
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    assert (w["referenced_tensors"], w["referenced_bytes"], w["written_tensors"]) == (len(tensors), size, 0)
    with torch.no_grad():
        expected = real(*_inputs("cpu")).last_hidden_state
    torch.testing.assert_close(_run(path), expected, atol=1e-5, rtol=1e-5)


def test_a_base_model_checkpoint_is_found_under_the_heads_prefix(tmp_path) -> None:
    from transformers import BertForSequenceClassification

    ckpt = str(tmp_path / "ckpt")
    tensors = _old_style_checkpoint(ckpt)
    # keys "embeddings..." of a BertModel; the classifier's are "bert.embeddings...": from_pretrained adds
    # the base model's prefix (and the classifier's own weights are new, written)
    real = BertForSequenceClassification.from_pretrained(ckpt, num_labels=3).eval()
    path = str(tmp_path / "out" / "model.onnx")
    os.mkdir(tmp_path / "out")
    r = fastonnx.to_onnx(
        Field(real, "logits"), _inputs("cpu"), filename=path, weights=ckpt, optimize="onnxruntime"
    )
    w = r.stats["file"]["weights"]
    # the pooler and every encoder tensor referenced (linked into out/); the classifier is not in the shard
    assert w["referenced_tensors"] == len(tensors) and w["written_tensors"] == 0
    assert w["shards"] == {"model.safetensors": "linked"}
    with torch.no_grad():
        expected = real(*_inputs("cpu")).logits
    torch.testing.assert_close(_run(path), expected, atol=1e-5, rtol=1e-5)
