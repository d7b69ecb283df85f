"""to_onnx(value_info=True), the default: the type of every intermediate value fastonnx knows, written by
the Rust writer, agrees with what ONNX's own shape inference finds (``infer_shapes(strict_mode=True)``)
on the transformers suite and a CNN, with dynamic dims named as the graph inputs name theirs;
value_info=False leaves exactly that out.

The comparison runs ONNX's inference (with data propagation) on the file with its value_info removed
(main graph and subgraphs) and compares, value by value, the element type and each dim: a static dim
must be equal; a symbolic dim must be symbolic or unknown to ONNX (ONNX names a dim it derives itself
``unk__N``: only counted); a static dim ONNX cannot infer (a size behind a Loop, a shape computed at run
time that data propagation does not follow) is counted as not inferred, as is a value whose rank ONNX
does not find (Mixtral's expert loop). Values made by nodes of another domain (contrib operators, local
functions' calls) are not compared: ``infer_shapes`` knows the standard domain only (the "onnxruntime"
level is checked by onnxruntime itself, which reads value_info too, in test_the_file_runs_as_eager_does).
The file as written (with its value_info) must also pass ``infer_shapes(strict_mode=True)``, which fails
on a declared type that contradicts an inferred one, and ``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import onnx
import onnx.shape_inference
import pytest
import torch

import fastonnx
from fastonnx.errors import InputError
from support.model_zoo import TRANSFORMERS_MODELS, Logits, SmallCNN, tiny_llama, with_random_batchnorm_stats

STANDARD_DOMAINS = ("", "ai.onnx")
Dims = list[int | str | None]


def typed(values: Any) -> dict[str, tuple[int, Dims | None]]:
    """name -> (element type, dims: int, dim_param or None per dim; None for an unknown rank)."""
    out = {}
    for v in values:
        if not v.type.HasField("tensor_type"):
            continue
        t = v.type.tensor_type
        dims = None
        if t.HasField("shape"):
            dims = [
                d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                for d in t.shape.dim
            ]
        out[v.name] = (t.elem_type, dims)
    return out


def graphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``g`` and its subgraphs (If / Loop / Scan bodies), depth first, in node order."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from graphs(a.g)


def without_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for g in graphs(bare.graph):
        del g.value_info[:]
    return bare


@dataclasses.dataclass
class Agreement:
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    mismatches: list[str] = dataclasses.field(default_factory=list)


def agreement(model: onnx.ModelProto) -> Agreement:
    """fastonnx's value_info against ONNX's inference on the same file without it, graph by graph."""
    onnx.shape_inference.infer_shapes(model, strict_mode=True)  # a contradiction raises
    inferred_model = onnx.shape_inference.infer_shapes(
        without_value_info(model), strict_mode=True, data_prop=True
    )
    found = Agreement()
    for ours, theirs in zip(graphs(model.graph), graphs(inferred_model.graph), strict=True):
        producer = {o: n for n in ours.node for o in n.output}
        inferred = typed(theirs.value_info)
        for name, (dtype, dims) in typed(ours.value_info).items():
            assert dims is not None, f"{name}: value_info without a shape"
            node = producer[name]
            if node.domain not in STANDARD_DOMAINS:
                found.counts["another domain"] += 1
                continue
            where = f"{name} ({node.op_type} in graph {ours.name!r})"
            if name not in inferred or inferred[name][1] is None:
                found.counts["not inferred"] += 1
                continue
            their_dtype, their_dims = inferred[name]
            assert their_dims is not None
            if their_dtype != dtype or len(their_dims) != len(dims):
                found.mismatches.append(f"{where}: ours {dtype} {dims}, ONNX's {their_dtype} {their_dims}")
                continue
            found.counts["values"] += 1
            for a, b in zip(dims, their_dims, strict=True):
                if isinstance(a, int) and isinstance(b, int):
                    found.counts["static dims equal"] += 1
                    if a != b:
                        found.mismatches.append(f"{where}: ours {dims}, ONNX's {their_dims}")
                elif isinstance(a, int):
                    found.counts["static dim, not inferred"] += 1
                elif isinstance(b, int):
                    found.mismatches.append(f"{where}: ours {dims} symbolic where ONNX's {their_dims} is not")
                else:
                    found.counts["symbolic dims"] += 1
                    found.counts[
                        "symbolic dims, the same name" if a == b else "symbolic dims, ONNX's own"
                    ] += 1
    return found


def check_file(model: onnx.ModelProto) -> Agreement:
    """The checker's full check and the agreement; no mismatch."""
    onnx.checker.check_model(model, full_check=True)
    found = agreement(model)
    assert not found.mismatches, "\n".join(found.mismatches)
    return found


def intermediates(g: onnx.GraphProto) -> set[str]:
    outputs = {o.name for o in g.output}
    return {o for n in g.node for o in n.output if o and o not in outputs}


def cnn() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return with_random_batchnorm_stats(SmallCNN()).eval(), (torch.randn(2, 3, 16, 16),)


MODELS = {**TRANSFORMERS_MODELS, "cnn": cnn}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_value_info_agrees_with_onnx_shape_inference(name: str) -> None:
    model, args = MODELS[name]()
    proto = fastonnx.to_onnx(model, args).model_proto
    found = check_file(proto)
    values = {v.name for v in proto.graph.value_info}
    assert values <= intermediates(proto.graph), "value_info holds only what nodes make, outputs excepted"
    # at least most of them: the values a converter adds inside an op's decomposition (attention's
    # scores, a norm's square root) have no type torch recorded, and are left out
    assert len(values) >= 0.6 * len(intermediates(proto.graph)), (
        len(values),
        len(intermediates(proto.graph)),
    )
    assert found.counts["values"] > 0 and found.counts["static dims equal"] > 0, found.counts


def test_dynamic_dims_are_named_as_the_inputs_name_theirs() -> None:
    model = Logits(tiny_llama(layers=2))
    ids, mask = torch.randint(0, 256, (2, 6)), torch.ones(2, 6, dtype=torch.int64)
    spec = {0: "batch", 1: "seq"}
    result = fastonnx.to_onnx(model, (ids, mask), dynamic_shapes=(spec, spec))
    proto = result.model_proto
    input_dims = {d.dim_param for i in proto.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    assert input_dims == {"batch", "seq"}
    symbolic: collections.Counter[str] = collections.Counter()
    for v in proto.graph.value_info:
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                symbolic[d.dim_param] += 1
                names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", d.dim_param))
                assert names <= input_dims, f"{v.name}: dim {d.dim_param!r} is not made of the inputs' dims"
    assert symbolic["batch"] > 0 and symbolic["seq"] > 0, symbolic
    found = check_file(proto)
    assert found.counts["symbolic dims"] > 0, found.counts
    # the file runs as the model does, on other sizes than the example's
    for b, s in ((2, 6), (3, 9), (1, 1)):
        x, m = torch.randint(0, 256, (b, s)), torch.ones(b, s, dtype=torch.int64)
        with torch.no_grad():
            want = model(x, m)
        torch.testing.assert_close(result(x, m), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("optimize", [False, True, "onnxruntime"])
def test_the_file_runs_as_eager_does(optimize: bool | str) -> None:
    """onnxruntime reads value_info too (a declared type it disagrees with fails the session), also at
    the "onnxruntime" level, whose contrib operators ONNX's inference does not know."""
    for build in (cnn, TRANSFORMERS_MODELS["llama"], TRANSFORMERS_MODELS["bert"]):
        model, args = build()
        result = fastonnx.to_onnx(model, args, optimize=optimize)
        assert len(result.model_proto.graph.value_info) > 0
        with torch.no_grad():
            want = model(*args)
        torch.testing.assert_close(result(*args), want, atol=1e-4, rtol=1e-4)
        if optimize != "onnxruntime":
            check_file(result.model_proto)


def test_value_info_false_leaves_it_out_and_nothing_else() -> None:
    model, args = cnn()
    on = fastonnx.to_onnx(model, args).to_bytes()
    off = fastonnx.to_onnx(model, args, value_info=False).to_bytes()
    on_proto, off_proto = onnx.load_from_string(on), onnx.load_from_string(off)
    assert len(on_proto.graph.value_info) > 0
    assert all(len(g.value_info) == 0 for g in graphs(off_proto.graph))
    assert without_value_info(on_proto) == off_proto
    assert len(off) < len(on)
    onnx.checker.check_model(off_proto, full_check=True)


def test_value_info_must_be_a_bool() -> None:
    model, args = cnn()
    with pytest.raises(InputError, match="value_info must be True or False"):
        fastonnx.to_onnx(model, args, value_info=1)  # type: ignore[arg-type]


class Branches(torch.nn.Module):
    """torch.cond whose branches make intermediate values, one of them a nested cond."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def yes(x: torch.Tensor) -> torch.Tensor:
            y = (x.sin() * 2).reshape(2, -1)
            return torch.cond(y.mean() > 0, lambda t: t.t().exp(), lambda t: t.t() + 1, (y,)).sum(0)

        def no(x: torch.Tensor) -> torch.Tensor:
            return (x.cos() - 1).reshape(3, 2).abs().sum(1)

        return torch.cond(x.sum() > 0, yes, no, (x,))


def test_subgraphs_get_their_value_info() -> None:
    x = torch.rand(6)
    result = fastonnx.to_onnx(Branches(), (x,), optimize=False)
    proto = result.model_proto
    bodies = list(graphs(proto.graph))[1:]
    assert len(bodies) == 4
    assert all(len(b.value_info) > 0 for b in bodies), [len(b.value_info) for b in bodies]
    for b in bodies:
        assert {v.name for v in b.value_info} <= intermediates(b)
    found = check_file(proto)
    assert found.counts["values"] > 0
    for arg in (x, -x):
        torch.testing.assert_close(result(arg), Branches()(arg))


def test_local_functions_bodies_have_none() -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model, args = TRANSFORMERS_MODELS["llama"]()
    proto = fastonnx.to_onnx(model, args, export_modules_as_functions={LlamaDecoderLayer}).model_proto
    assert len(proto.functions) > 0
    assert all(len(f.value_info) == 0 for f in proto.functions)
    assert len(proto.graph.value_info) > 0
    found = check_file(proto)
    assert found.counts["another domain"] > 0, "the calls' outputs are typed, not compared"


def test_torch_onnx_export_drop_in_writes_it(tmp_path: Any) -> None:
    model = Logits(tiny_llama(layers=1))
    ids, mask = torch.randint(0, 256, (2, 6)), torch.ones(2, 6, dtype=torch.int64)
    path = tmp_path / "m.onnx"
    fastonnx.export(
        model,
        (ids, mask),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"},
        },
    )
    proto = onnx.load(str(path))
    assert len(proto.graph.value_info) > 0
    check_file(proto)
