"""Encoder tasks (issue 32; question answering, issue 42): ``export_pretrained`` of a checkpoint folder per task, the package run in
onnxruntime against transformers eager on inputs of other sizes than the export's (a batch of 3, right
padding), outputs named as transformers names them. One checkpoint is sharded (an index and two files),
one stored in bfloat16 (read behind a Cast to the float32 graph)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import TOKENS, VOCAB, save_checkpoint

import fastonnx

TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "num_labels": 3,
    **TOKENS,
}
VISION = {
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "num_labels": 5,
}
# id -> (task given, or "auto", model type, class saved, config, save options, the expected task)
CASES: dict[str, tuple[str, str, str, dict[str, Any], dict[str, Any], str]] = {
    "bert-fill-mask-sharded": ("auto", "bert", "BertForMaskedLM", TEXT, {"shard_size": "60KB"}, "fill-mask"),
    "bert-feature-extraction": (
        "feature-extraction",
        "bert",
        "BertForMaskedLM",
        TEXT,
        {},
        "feature-extraction",
    ),
    "roberta-text-classification-bf16": (
        "auto",
        "roberta",
        "RobertaForSequenceClassification",
        {**TEXT, "max_position_embeddings": 72},
        {"dtype": torch.bfloat16},
        "text-classification",
    ),
    "distilbert-token-classification": (
        "auto",
        "distilbert",
        "DistilBertForTokenClassification",
        {
            "vocab_size": VOCAB,
            "dim": 64,
            "n_layers": 2,
            "n_heads": 4,
            "hidden_dim": 128,
            "num_labels": 4,
            "pad_token_id": 0,
        },
        {},
        "token-classification",
    ),
    "bert-question-answering": (
        "auto",
        "bert",
        "BertForQuestionAnswering",
        {**TEXT, "num_labels": 2},
        {},
        "question-answering",
    ),
    "vit-image-classification": (
        "auto",
        "vit",
        "ViTForImageClassification",
        VISION,
        {},
        "image-classification",
    ),
}


def _inputs(task: str, names: list[str], config: Any) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    if names == ["pixel_values"]:
        return {"pixel_values": torch.randn(3, 3, 32, 32, generator=g)}
    ids = torch.randint(3, VOCAB, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 6:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in names:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return inputs


@pytest.mark.parametrize("case", sorted(CASES))
def test_encoder_package_matches_transformers(tmp_path: pathlib.Path, case: str) -> None:
    import transformers

    task, model_type, class_name, config, save, expected_task = CASES[case]
    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    save_checkpoint(folder, model_type, class_name, config, **save)
    if "shard_size" in save:
        assert (folder / "model.safetensors.index.json").is_file()
        assert len(list(folder.glob("model-*.safetensors"))) >= 2
    written = fastonnx.export_pretrained(folder, package, task, progress=False)
    assert written.task == expected_task
    assert written.verified is True, written.verify_note
    fields = {
        "feature-extraction": ["last_hidden_state"],
        "question-answering": ["start_logits", "end_logits"],
    }
    names = fields.get(expected_task, ["logits"])
    assert written.output_names == names
    assert not (package / "genai_config.json").exists()
    assert "Package verification" in written.report_path.read_text()

    eager_class = getattr(transformers, written.architecture)
    eager = eager_class.from_pretrained(folder, dtype=torch.float32).eval()
    inputs = _inputs(expected_task, written.input_names, eager.config)
    assert list(inputs) == written.input_names
    with torch.no_grad():
        out = eager(**inputs)
    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == names
    results = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    for name, got in zip(names, results, strict=True):
        want = getattr(out, name)
        assert float(want.abs().max()) > 1e-2  # a comparison that can fail
        torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, atol=1e-4, rtol=1e-4, msg=name)
