"""Token lengths bounded up front by the position table BERT's embeddings slice (package_export's
``table_bounded``): the export captures once where it used to capture four times (refused, refused,
narrowed, bounded), and the bound is the one the capture's guards give; tables indexed otherwise are
left to those guards."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, GraphSpec
from fastonnx.pretrained.package_export import table_bounded


def test_bert_is_bounded_by_its_table_in_one_capture(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    folder = tmp_path / "checkpoint"
    architecture_sweep().build_checkpoint("feature-extraction", "bert", "BertModel", folder)
    captures: list[Any] = []
    export = torch.export.export

    def counted(*args: Any, **kwargs: Any) -> Any:
        captures.append(kwargs.get("dynamic_shapes"))
        return export(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", "feature-extraction", progress=False)
    assert written.verified is True, written.verify_note
    assert len(captures) == 1
    table = transformers.AutoConfig.from_pretrained(folder).max_position_embeddings
    proto = onnx.load(str(written.model_path), load_external_data=False)
    proven = json.loads({p.key: p.value for p in proto.metadata_props}["pkg.fastonnx.proven_sizes"])["dims"]
    assert proven["input_ids[1]"][1] == table

    # the longest sequence the table holds runs right
    eager = transformers.BertModel.from_pretrained(folder).eval()
    ids = torch.randint(0, eager.config.vocab_size, (1, table), generator=torch.Generator().manual_seed(0))
    feeds = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
    }
    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {k: v.numpy() for k, v in feeds.items() if k in written.input_names})
    with torch.no_grad():
        want = eager(**feeds).last_hidden_state
    torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-3)


def _spec(model: torch.nn.Module) -> GraphSpec:
    dims = {0: torch.export.Dim(BATCH, min=1, max=1024), 1: torch.export.Dim(SEQUENCE, min=1, max=1 << 20)}
    ids = torch.zeros(2, 8, dtype=torch.long)
    return GraphSpec(model, (ids,), {"input_ids": dims}, ["input_ids"], ["last_hidden_state"])


@pytest.mark.parametrize(
    ("model_type", "bounded"),
    [
        ("bert", True),
        ("roberta", False),  # indexed from its padding id up
        ("tapas", False),  # positions within a table's cell, clamped to the table
        ("luke", False),  # the unpadded table is its entities'
    ],
)
def test_only_a_sliced_table_bounds_up_front(model_type: str, bounded: bool) -> None:
    import transformers

    config = transformers.AutoConfig.for_model(
        model_type, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    config.max_position_embeddings = 64
    model = transformers.AutoModel.from_config(config)
    shapes = table_bounded(_spec(model), config)
    if not bounded:
        assert shapes is None
        return
    assert shapes is not None
    assert shapes["input_ids"][1].max == 64
    assert shapes["input_ids"][0].max == 1024
