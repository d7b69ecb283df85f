"""What a package ships (pretrained/shipped_bytes.py, issue 43 part 4): a checkpoint shard the package
reads most of is hard-linked, the tensors it reads of another are copied into its own file and the shard
is not linked; ``copy=True`` (``fastonnx export --copy``) links nothing. The copied package is verified
against transformers like any other."""

from __future__ import annotations

import os
import pathlib

import pytest
from checkpoint_folders import save_decoder

import fastonnx
from fastonnx.pretrained import cli
from fastonnx.pretrained.shipped_bytes import OWN_FILE


def _links(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.stat().st_nlink > 1)


def test_a_float_package_links_the_shard_it_reads(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "checkpoint"
    save_decoder(folder, "llama")
    written = fastonnx.export_pretrained(folder, tmp_path / "package", progress=False)
    assert written.verified is True, written.verify_note
    shipped = written.stats["shipped"]
    assert shipped["linked"] == ["model.safetensors"] and shipped["copied"] == {}
    assert _links(written.outdir) == ["model.safetensors"]
    assert shipped["linked_bytes"] == (folder / "model.safetensors").stat().st_size
    assert "## Shipped bytes" in written.report_path.read_text()


def test_a_copied_package_links_nothing_and_is_verified(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "checkpoint"
    save_decoder(folder, "llama")
    out = tmp_path / "package"
    assert cli.main(["export", str(folder), str(out), "--copy", "--no-progress"]) == 0
    assert _links(out) == [] and "model.safetensors" not in os.listdir(out)
    assert (out / OWN_FILE).stat().st_size >= 0.9 * (folder / "model.safetensors").stat().st_size
    # the package runs from its own file: verified against transformers after the copy
    written = fastonnx.export_pretrained(folder, tmp_path / "again", copy=True, progress=False)
    assert written.verified is True, written.verify_note
    assert written.stats["shipped"]["linked_bytes"] == 0


def test_an_int4_package_copies_what_it_reads_of_the_float_shard(tmp_path: pathlib.Path) -> None:
    """quantize="int4" writes the products' codes; of the float shard it reads the embedding and the
    norms (the head too, left float): less than half of it, so those are copied and the shard goes."""
    import torch
    from test_text_generation import PROMPT, _genai_greedy

    folder = tmp_path / "checkpoint"
    model = save_decoder(folder, "llama")
    written = fastonnx.export_pretrained(folder, tmp_path / "package", quantize="int4", progress=False)
    shipped = written.stats["shipped"]
    shard = (folder / "model.safetensors").stat().st_size
    assert shipped["linked"] == [] and 0 < shipped["copied"]["model.safetensors"] < shard / 2
    assert _links(written.outdir) == []
    # onnxruntime-genai runs it from its own file: first logits as the float model's, to int4's rounding
    _, logits = _genai_greedy(written.outdir)
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits[0, -1]
    assert torch.nn.functional.cosine_similarity(logits[0], want, dim=0) > 0.9  # a wrong offset: ~0


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_half_package_ships_its_weights_in_the_half_type(tmp_path: pathlib.Path, dtype: str) -> None:
    """A float32 checkpoint's half package: the weights its half products read are converted into its own
    file (half the bytes, the shard not linked), each equal to torch's conversion of the stored tensor,
    and read without a Cast; the fp16 package is verified against transformers from them."""
    import hashlib

    import onnx
    import torch
    from onnx import numpy_helper
    from safetensors.torch import load_file

    folder = tmp_path / "checkpoint"
    save_decoder(folder, "llama")
    shard = folder / "model.safetensors"
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    target = "cuda" if dtype == "bf16" else "cpu"  # onnxruntime's CPU runs no bfloat16 graph
    written = fastonnx.export_pretrained(
        folder, tmp_path / "package", dtype=dtype, target=target, progress=False
    )
    if dtype == "fp16":
        assert written.verified is True, written.verify_note
    shipped = written.stats["shipped"]
    assert shipped["linked"] == [] and _links(written.outdir) == []
    assert (written.outdir / OWN_FILE).stat().st_size < 0.6 * shard.stat().st_size
    stored = {
        hashlib.sha256(t.to(half).view(torch.int16).numpy().tobytes()).hexdigest()
        for t in load_file(shard).values()
    }
    model = onnx.load(str(written.model_path))  # the weights read from the package's files
    kind = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[dtype]
    halves = [t for t in model.graph.initializer if t.data_type == kind and len(t.dims) == 2]
    assert len(halves) >= 15  # the embedding, seven products a layer and the head
    for t in halves:
        raw = numpy_helper.to_array(t).view("<i2").tobytes()
        assert hashlib.sha256(raw).hexdigest() in stored, t.name
    names = {t.name for t in model.graph.initializer}
    assert not [n.name for n in model.graph.node if n.op_type == "Cast" and n.input[0] in names]
