"""to_onnx(value_info=True), the default: every value a node makes (graph outputs aside, typed in
``output``), in the top graph and in subgraphs, at every optimization level, has a ``value_info`` entry
with its element type and full rank (a sequence's: its elements'), written by the Rust writer (the
builder's types, the rest inferred: ``rust/core/src/infer``), with dynamic dims named as the graph
inputs name theirs; value_info=False leaves exactly that out.

Each entry is checked against what onnxruntime computes (``runtime_agreement``): a copy of the file
with every value made a graph output runs at two input sizes (dynamic batch and sequence), and every
declared element type and dim must be what came out (a symbolic dim evaluated with the sizes of the
input dims it names). CI samples the transformers suite (``FASTONNX_FULL_MATRIX=1`` runs all of it).

The comparison runs ONNX's inference (with data propagation) on the file with its value_info removed
(main graph and subgraphs) and compares, value by value, the element type and each dim: a static dim
must be equal; a symbolic dim must be symbolic or unknown to ONNX (ONNX names a dim it derives itself
``unk__N``: only counted); a static dim ONNX cannot infer (a size behind a Loop, a shape computed at run
time that data propagation does not follow) is counted as not inferred, as is a value whose rank ONNX
does not find (the blocks of Mixtral's experts, as many rows as routing sends). Values made by nodes of
another domain (contrib operators, local functions' calls) are not compared: ``infer_shapes`` knows the
standard domain only (the "onnxruntime" level is checked by onnxruntime itself, which reads value_info
too, in test_the_file_runs_as_eager_does). The file as written (with its value_info) must also pass
``infer_shapes(strict_mode=True)``, which fails on a declared type that contradicts an inferred one, and
``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
import onnx.shape_inference
import onnxruntime as ort
import pytest
import torch
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import fastonnx
from fastonnx.errors import InputError
from support.matrix import sampled
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


def sequences(values: Any) -> dict[str, tuple[int, Dims]]:
    """name -> (element type, dims) of the entries typed as sequences of tensors (SequenceMap's...)."""
    out = {}
    for v in values:
        if v.type.HasField("sequence_type") and v.type.sequence_type.elem_type.HasField("tensor_type"):
            t = v.type.sequence_type.elem_type.tensor_type
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
    assert untyped(proto) == [], "every value a node makes is typed"
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
    assert untyped(proto) == []
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


# --- every value typed, as onnxruntime computes it --------------------------------------------------


def untyped(model: onnx.ModelProto) -> list[str]:
    """The values nodes make (graph outputs aside), main graph and subgraphs, without an entry holding
    an element type and a shape."""
    missing = []
    for g in graphs(model.graph):
        declared = {**typed(g.value_info), **sequences(g.value_info)}
        for name in sorted(intermediates(g)):
            elem, dims = declared.get(name, (0, None))
            if not elem or dims is None:
                missing.append(f"{name} in graph {g.name!r}")
    return missing


def anonymous_dims(model: onnx.ModelProto) -> int:
    return sum(
        1
        for g in graphs(model.graph)
        for v in g.value_info
        for d in v.type.tensor_type.shape.dim
        if not d.HasField("dim_value") and not d.HasField("dim_param")
    )


# what a symbolic dim may hold besides the inputs' dim names (sympy's spellings)
SIZE_FUNCTIONS: dict[str, Any] = {
    "Max": max,
    "Min": min,
    "Mod": lambda a, b: a % b,
    "floor": math.floor,
    "ceiling": math.ceil,
    "FloorDiv": lambda a, b: a // b,
    "CeilToInt": math.ceil,
}


def size_of(expr: str, sizes: dict[str, int]) -> int:
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr)) - set(SIZE_FUNCTIONS)
    unbound = names - set(sizes)
    assert not unbound, f"dim {expr!r} names {sorted(unbound)}, not dims of the graph inputs"
    return int(eval(expr, {"__builtins__": {}, **SIZE_FUNCTIONS}, dict(sizes)))


def probe(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without value_info whose outputs include every value the top graph's nodes
    make."""
    copy = without_value_info(model)
    outputs = {o.name for o in copy.graph.output}
    for name in sorted(intermediates(model.graph) - outputs):
        copy.graph.output.append(onnx.ValueInfoProto(name=name))
    return copy


@dataclasses.dataclass
class Runtime:
    sequences: int = 0
    values: int = 0
    dims: int = 0
    symbolic: int = 0
    anonymous: int = 0


def runtime_agreement(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> Runtime:
    """Every top-graph value_info entry against what onnxruntime produces for each of ``feeds``."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(
        probe(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    declared = typed(model.graph.value_info)
    declared_sequences = sequences(model.graph.value_info)
    inputs = {i.name: i for i in model.graph.input}
    found, wrong = Runtime(), []
    for feed in feeds:
        sizes: dict[str, int] = {}
        for name, array in feed.items():
            for d, n in zip(inputs[name].type.tensor_type.shape.dim, array.shape, strict=True):
                if d.HasField("dim_param"):
                    assert sizes.setdefault(d.dim_param, n) == n, (d.dim_param, name)
        got = dict(zip(names, session.run(None, feed), strict=True))
        # a sequence's entry holds its elements' type: each element is checked as a tensor's entry
        elements = [
            (name, elem, dims, array)
            for name, (elem, dims) in declared_sequences.items()
            for array in got[name]
        ]
        found.sequences += len(declared_sequences)
        for name, (elem, dims) in declared.items():
            assert dims is not None
            elements.append((name, elem, dims, got[name]))
        for name, elem, dims, array in elements:
            where = f"{name} at {sizes}: declared {onnx.helper.tensor_dtype_to_np_dtype(elem)} {dims}"
            if array.dtype != onnx.helper.tensor_dtype_to_np_dtype(elem) or array.ndim != len(dims):
                wrong.append(f"{where}, ran {array.dtype} {list(array.shape)}")
                continue
            found.values += 1
            for d, n in zip(dims, array.shape, strict=True):
                found.dims += 1
                if d is None:
                    found.anonymous += 1
                elif isinstance(d, str):
                    found.symbolic += 1
                    if size_of(d, sizes) != n:
                        wrong.append(f"{where}, ran {list(array.shape)}")
                elif d != n:
                    wrong.append(f"{where}, ran {list(array.shape)}")
    assert not wrong, f"{len(wrong)} mismatches:\n" + "\n".join(wrong[:40])
    return found


def feeds_of(model: onnx.ModelProto, args: tuple[Any, ...]) -> dict[str, np.ndarray]:
    names = [i.name for i in model.graph.input]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    assert len(names) == len(tensors), (names, len(tensors))
    return {n: t.detach().numpy() for n, t in zip(names, tensors, strict=True)}


D = torch.export.Dim.DYNAMIC
# bounded: BERT's and DistilBERT's position tables fix the longest sequence
SEQ = torch.export.Dim("seq", min=2, max=64)
DECODER_SEQ = torch.export.Dim("decoder_seq", min=2, max=64)


def dynamic_spec(name: str, args: tuple[Any, ...]) -> tuple[dict[int, Any], ...] | None:
    """Dynamic batch everywhere, dynamic sequence for token ids and masks (a decoder's its own); LLaVA
    static (its image placeholders fix the text's length and the vision tower the batch)."""
    if name == "llava":
        return None
    return tuple(
        {0: D, 1: SEQ if i < 2 else DECODER_SEQ} if a.dim() == 2 and not a.is_floating_point() else {0: D}
        for i, a in enumerate(args)
    )


def other_sizes(spec: tuple[dict[int, Any], ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The inputs at another size: one more row (the first repeated), three tokens fewer."""
    out = []
    for a, dims in zip(args, spec, strict=True):
        a = torch.cat([a, a[:1]])
        if 1 in dims:
            a = a[:, :-3]
        out.append(a)
    return tuple(out)


@functools.cache
def built(name: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    return MODELS[name]()


def check_everything_typed(
    name: str,
    optimize: bool | str,
    build: Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]] | None = None,
    dynamic_shapes_override: tuple[dict[int, Any], ...] | None = None,
    **kw: Any,
) -> tuple[onnx.ModelProto, Runtime]:
    """Export ``name`` with dynamic dims at ``optimize``: every value typed, the file checked in full,
    each entry as onnxruntime computes it at two sizes."""
    model, args = build() if build is not None else built(name)
    spec = dynamic_shapes_override or dynamic_spec(name, args)
    result = fastonnx.to_onnx(model, args, optimize=optimize, dynamic_shapes=spec, **kw)
    proto = result.model_proto
    assert untyped(proto) == []
    if optimize != "onnxruntime":
        # the "onnxruntime" level writes onnxruntime's SimplifiedLayerNormalization in the standard
        # domain, which ONNX's checker does not know
        onnx.checker.check_model(proto, full_check=True)
        onnx.shape_inference.infer_shapes(proto, strict_mode=True)  # a contradiction raises
    sizes = [args] if spec is None else [args, other_sizes(spec, args)]
    found = runtime_agreement(proto, [feeds_of(proto, a) for a in sizes])
    return proto, found


LEVELS: list[bool | str] = [False, True, "onnxruntime"]


def _sampled() -> list[tuple[str, bool | str]]:
    every = [(m, level) for m in sorted(MODELS) for level in LEVELS]
    # CI: a fixed rotation through the models and levels, the decoder-only models at every level
    return sampled(every, lambda case: every.index(case) % 7 == 0 or case[0] in ("qwen2", "cnn"))


@pytest.mark.parametrize(("name", "optimize"), _sampled(), ids=str)
def test_every_value_is_typed_as_onnxruntime_computes_it(name: str, optimize: bool | str) -> None:
    _, found = check_everything_typed(name, optimize)
    assert found.values > 0 and (found.symbolic > 0 or name == "llava"), found


def test_sequences_are_typed_as_onnxruntime_computes_their_elements() -> None:
    """Mixtral's experts (converters/third_party.py): a SequenceMap over the experts that own rows,
    its sequences typed as sequences of their elements' tensors, each element as onnxruntime makes it."""
    proto, found = check_everything_typed("mixtral", True)
    assert found.sequences > 0 and found.values > 0, found
    seqs = {n for g in graphs(proto.graph) for n in sequences(g.value_info)}
    made = {o for n in proto.graph.node if n.op_type in ("SplitToSequence", "SequenceMap") for o in n.output}
    assert made and made <= seqs, (made, seqs)


class Loops(torch.nn.Module):
    """A while_loop (Loop) and a scan (Scan) whose bodies make intermediate values, a cond (If) on
    their results; sizes read from the input inside the bodies."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def cond_fn(i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return i < 3

        def body_fn(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, (y * 2 + 1).reshape(y.shape[0], -1).tanh()

        _, y = while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))

        def combine(carry: torch.Tensor, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            nxt = carry + row.sin()
            return nxt, torch.cat([nxt, row]).unsqueeze(0)

        last, rows = scan(combine, torch.zeros_like(y[0]), y)
        flat = rows.flatten(1)
        return torch.cond(last.sum() > 0, lambda t: t.exp(), lambda t: t.cos() - 1, (flat,))


def test_control_flow_values_are_typed_at_every_level() -> None:
    x = torch.randn(4, 3)
    for optimize in LEVELS:
        proto, found = check_everything_typed(
            "loops", optimize, build=lambda: (Loops(), (x,)), dynamic_shapes_override=({0: D},)
        )
        ops = {n.op_type for n in proto.graph.node}
        assert {"Loop", "Scan", "If"} <= ops, ops
        assert all(len(g.value_info) > 0 for g in list(graphs(proto.graph))[1:])
        check_file(proto)  # the bodies' entries against ONNX's inference


@pytest.mark.parametrize("optimize", LEVELS, ids=str)
def test_quantized_values_are_typed(optimize: bool | str) -> None:
    proto, _ = check_everything_typed("llama", optimize, quantize="int4")
    if optimize == "onnxruntime":
        assert any(n.op_type == "MatMulNBits" for n in proto.graph.node)


def test_local_function_calls_are_typed() -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    for optimize in LEVELS:
        proto, _ = check_everything_typed("llama", optimize, export_modules_as_functions={LlamaDecoderLayer})
        assert any(n.domain.startswith("pkg.") for n in proto.graph.node)
