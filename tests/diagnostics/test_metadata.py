"""Node metadata and readable node names (fastonnx.walker.node_metadata): the official exporter's keys on every node,
the graph signature and range constraints on the graph, kinds on inputs / outputs / initializers, names
after the module path, kept through fusions, left out with metadata=False, and the same bytes twice."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import onnx
import pytest
import torch

import fastonnx
from fastonnx.walker import node_metadata as md
from support.model_zoo import SmallCNN, tiny_llama, with_random_batchnorm_stats

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the support package's parent


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, those of If / Loop / Scan bodies included."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(a.g)


def props(p: Any) -> dict[str, str]:
    return {e.key: e.value for e in p.metadata_props}


def export(model: torch.nn.Module, args: tuple[Any, ...], **kw: Any) -> tuple[Any, fastonnx.ExportResult]:
    """The ExportedProgram (to check the metadata against) and its export, compared with eager."""
    ep = torch.export.export(model, args, strict=False)
    result = fastonnx.to_onnx(ep, args, **kw)
    with torch.no_grad():
        torch.testing.assert_close(result(*args), model(*args), atol=1e-4, rtol=1e-4)
    return ep, result


@pytest.fixture(scope="module")
def llama() -> tuple[Any, fastonnx.ExportResult]:
    # opset 23, optimize=True: RMSNormalization, RotaryEmbedding and Attention fusions all fire
    model = tiny_llama(layers=2)
    ids = torch.randint(0, 256, (2, 8))
    return export(model, (ids,), opset=23)


@pytest.fixture(scope="module")
def cnn() -> tuple[Any, fastonnx.ExportResult]:
    torch.manual_seed(0)
    model = with_random_batchnorm_stats(SmallCNN()).eval()
    return export(model, (torch.randn(2, 3, 16, 16),))


def fx_names(ep: Any) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in ep.graph.nodes}


def module_prefix(name_scopes: list[str]) -> str:
    """The name prefix the module paths give, worked out independently of fastonnx.walker.node_metadata: each
    level's path relative to its parent's."""
    parts, parent = [], ""
    for path in name_scopes[:-1]:
        if path:
            parts.append(path[len(parent) + 1 :] if parent else path)
        parent = path
    return "".join("/" + p for p in parts)


@pytest.mark.parametrize("which", ["llama", "cnn"])
def test_every_node_carries_the_five_keys_of_its_fx_node(which: str, request: Any) -> None:
    ep, result = request.getfixturevalue(which)
    nodes = fx_names(ep)
    graph_nodes = list(all_nodes(result.model_proto.graph))
    assert graph_nodes
    for node in graph_nodes:
        p = props(node)
        assert set(md.NODE_KEYS) <= set(p), f"{node.name} ({node.op_type}) lacks {set(md.NODE_KEYS) - set(p)}"
        fx_name = re.match(r"%(\w+) :", p[md.FX_NODE])
        assert fx_name is not None, p[md.FX_NODE]
        fx = nodes.get(fx_name.group(1))
        assert fx is not None, f"{node.name}: {fx_name.group(1)} is not a node of the FX graph"
        assert p[md.FX_NODE] == fx.format_node()
        scopes = ast.literal_eval(p[md.NAME_SCOPES])
        classes = ast.literal_eval(p[md.CLASS_HIERARCHY])
        assert scopes[-1] == fx.name
        assert classes[-1] == str(fx.target)
        stack = fx.meta.get("nn_module_stack") or {}
        assert scopes[:-1] == [path for path, _ in stack.values()]
        assert p[md.NAMESPACE].endswith(f"{fx.name}: {fx.target}")
        assert p[md.STACK_TRACE] == (fx.meta.get("stack_trace") or "")


@pytest.mark.parametrize("which", ["llama", "cnn"])
def test_names_follow_the_module_path_and_are_unique(which: str, request: Any) -> None:
    _, result = request.getfixturevalue(which)
    names = [n.name for n in all_nodes(result.model_proto.graph)]
    assert len(names) == len(set(names))
    for node in all_nodes(result.model_proto.graph):
        prefix = module_prefix(ast.literal_eval(props(node)[md.NAME_SCOPES]))
        assert re.fullmatch(re.escape(f"{prefix}/{node.op_type}") + r"(_\d+)?", node.name), (
            node.name,
            prefix,
        )


def test_transformer_names_read_like_the_torchscript_exporters(llama: Any) -> None:
    _, result = llama
    names = {n.name: n for n in result.model_proto.graph.node}
    assert names["/model/layers.0/self_attn/q_proj/MatMul"].op_type == "MatMul"
    assert names["/model/layers.1/mlp/down_proj/MatMul"].op_type == "MatMul"
    assert names["/lm_head/MatMul"].op_type == "MatMul"


def test_fused_nodes_keep_the_metadata_of_the_node_whose_result_they_produce(llama: Any, cnn: Any) -> None:
    _, result = llama
    stats = result.stats["optimize"]
    assert stats["rms_norm_fused"] == 5 and stats["attention_fused"] == 2, stats
    by_op: dict[str, list[onnx.NodeProto]] = {}
    for node in result.model_proto.graph.node:
        by_op.setdefault(node.op_type, []).append(node)
    norms = sorted(n.name for n in by_op["RMSNormalization"])
    assert norms == sorted(
        [
            f"/model/layers.{i}/{m}/RMSNormalization"
            for i in range(2)
            for m in ("input_layernorm", "post_attention_layernorm")
        ]
        + ["/model/norm/RMSNormalization"]
    )
    for n in by_op["RMSNormalization"]:
        assert "LlamaRMSNorm" in props(n)[md.CLASS_HIERARCHY]
    attention = sorted(n.name for n in by_op["Attention"])
    assert attention == [f"/model/layers.{i}/self_attn/Attention" for i in range(2)]
    for n in by_op["Attention"]:
        assert "scaled_dot_product_attention" in props(n)[md.FX_NODE]

    _, result = cnn
    assert result.stats["optimize"]["conv_batchnorm_fused"] == 2
    convs = [n for n in result.model_proto.graph.node if n.op_type == "Conv"]
    # Conv + BatchNormalization: the Conv takes the BatchNormalization's result and keeps its own scope
    assert [n.name for n in convs] == ["/features/0/Conv", "/features/4/Conv"]
    for n in convs:
        assert "aten.conv2d" in props(n)[md.NAMESPACE]
    assert not any(n.op_type == "BatchNormalization" for n in result.model_proto.graph.node)


def test_graph_signature_and_range_constraints_parse() -> None:
    model = tiny_llama(layers=1)
    ids = torch.randint(0, 256, (2, 8))
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(model, (ids,), dynamic_shapes=({0: batch},), strict=False)
    result = fastonnx.to_onnx(ep, (ids,))
    graph = props(result.model_proto.graph)
    lines = graph[md.GRAPH_SIGNATURE].splitlines()
    # the signature's text: "# inputs", "name: KIND target='...'" per input, "# outputs", ...
    specs = dict(
        re.fullmatch(r"(\w+): (\w+)(?: target='.*')?(?: persistent=\w+)?", ln).groups()  # type: ignore[union-attr]
        for ln in lines
        if ln and not ln.startswith("#")
    )
    for spec in ep.graph_signature.input_specs:
        assert specs[spec.arg.name] == spec.kind.name
    constraints = re.findall(r"(\w+): VR\[(\d+), (\d+)\]", graph[md.RANGE_CONSTRAINTS])
    assert ("2", "64") in [(lo, hi) for _, lo, hi in constraints], graph[md.RANGE_CONSTRAINTS]
    other = torch.randint(0, 256, (5, 8))
    with torch.no_grad():
        torch.testing.assert_close(result(other), model(other), atol=1e-4, rtol=1e-4)


def test_inputs_outputs_and_initializers_carry_their_kind(cnn: Any) -> None:
    ep, result = cnn
    graph = result.model_proto.graph
    (x,) = graph.input
    assert props(x) == {md.INPUT_KIND: "USER_INPUT", md.INPUT_PERSISTENT: "None", md.ORIGINAL_NAME: "x"}
    (out,) = graph.output
    fx_out = next(n for n in ep.graph.nodes if n.op == "output").args[0][0]
    assert props(out) == {md.OUTPUT_KIND: "USER_OUTPUT", md.ORIGINAL_NAME: fx_out.name}
    specs = {s.target: s for s in ep.graph_signature.input_specs if s.target is not None}
    kept = [t for t in graph.initializer if t.name in specs]
    assert kept, "the Linear's weight and bias stay initializers under their state-dict names"
    for t in kept:
        spec = specs[t.name]
        assert props(t)[md.INPUT_KIND] == spec.kind.name
        assert props(t)[md.ORIGINAL_NAME] == spec.arg.name


def test_buffers_mutated_in_place_are_marked_as_such() -> None:
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.add_(x)
            return x * 2

    x = torch.randn(3)
    result = fastonnx.to_onnx(Counter(), (x,))
    outputs = {o.name: props(o) for o in result.model_proto.graph.output}
    assert outputs["mutated.seen"][md.OUTPUT_KIND] == "BUFFER_MUTATION"
    assert [p[md.OUTPUT_KIND] for n, p in outputs.items() if n != "mutated.seen"] == ["USER_OUTPUT"]


def test_nodes_in_control_flow_bodies_carry_metadata() -> None:
    class Cond(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda t: t.sin() * 2, lambda t: t.cos() - 1, (x,))

    x = torch.rand(4)
    result = fastonnx.to_onnx(Cond(), (x,), optimize=False)
    torch.testing.assert_close(result(-x), Cond()(-x))
    (if_node,) = [n for n in result.model_proto.graph.node if n.op_type == "If"]
    inner = [n for a in if_node.attribute for n in all_nodes(a.g)]
    assert {n.op_type for n in inner} >= {"Sin", "Cos"}
    for n in inner:
        assert set(md.NODE_KEYS) <= set(props(n)), n.name
    sin = next(n for n in inner if n.op_type == "Sin")
    assert "aten.sin.default" in props(sin)[md.NAMESPACE]


def test_metadata_false_leaves_it_all_out(cnn: Any) -> None:
    ep, with_md = cnn
    args = (torch.randn(2, 3, 16, 16),)
    without = fastonnx.to_onnx(ep, args, metadata=False)
    proto = without.model_proto
    assert not any(n.metadata_props for n in all_nodes(proto.graph))
    assert not proto.graph.metadata_props
    for v in [*proto.graph.input, *proto.graph.output, *proto.graph.initializer]:
        assert not v.metadata_props, v.name
    assert not any(n.name.startswith("/") for n in proto.graph.node)
    assert [n.op_type for n in proto.graph.node] == [n.op_type for n in with_md.model_proto.graph.node]
    assert len(without.to_bytes()) < len(with_md.to_bytes())
    torch.testing.assert_close(without(*args), with_md(*args))


def test_metadata_must_be_a_bool() -> None:
    with pytest.raises(fastonnx.InputError, match="metadata must be True or False"):
        fastonnx.to_onnx(SmallCNN(), (torch.randn(1, 3, 8, 8),), metadata="yes")  # type: ignore[arg-type]


_EXPORT = textwrap.dedent(
    """
    import sys
    import torch
    import fastonnx
    from support.model_zoo import tiny_llama

    model = tiny_llama(layers=1)
    torch.manual_seed(1)
    fastonnx.to_onnx(model, (torch.randint(0, 256, (1, 6)),), filename=sys.argv[1])
    print(hash("fastonnx"))
    """
)


def test_the_same_model_gives_the_same_bytes_in_two_processes(tmp_path: Any) -> None:
    """This process and a child with another string-hash seed (set names, dict orders of str keys
    differ between them) write the same bytes. One child, not two: a Python start costs ~8 s here."""
    seed = "271828" if os.environ.get("PYTHONHASHSEED") != "271828" else "314159"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, *sys.path]), "PYTHONHASHSEED": seed}
    child = tmp_path / "child.onnx"
    run = subprocess.run(
        [sys.executable, "-c", _EXPORT, str(child)],
        check=True,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert int(run.stdout.split()[-1]) != hash("fastonnx"), "the child hashes strings as this process does"
    here = tmp_path / "here.onnx"
    model = tiny_llama(layers=1)
    torch.manual_seed(1)
    fastonnx.to_onnx(model, (torch.randint(0, 256, (1, 6)),), filename=str(here))
    assert child.read_bytes() == here.read_bytes()
    proto = onnx.load_from_string(here.read_bytes())
    assert all(n.metadata_props for n in proto.graph.node)


class _Slicing(torch.nn.Module):
    """Arguments of every kind the builder prints itself (nodes, ints, floats, None, dtypes, lists,
    tuples, kwargs) and one it leaves to torch's printer (a slice)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.add(x, 2.5, alpha=2)
        z = torch.cat([y, x.view(-1, 2).to(torch.float64).float().view(-1)], dim=0)
        return z[1:3] + z.new_zeros((2,), dtype=torch.float32, device="cpu", pin_memory=None)


@pytest.mark.parametrize("marked", [True, False], ids=["top graph, marked", "subgraph, entered"])
def test_composed_metadata_is_what_torchs_printer_gives_and_only_for_used_scopes(marked: bool) -> None:
    """Scopes.compose: the builder's text of plain calls and the Python text of the others (a slice)
    equal ``format_node``; a scope whose nodes are gone gets no metadata. The top builder's nodes are
    marked during the walk and given their scopes by ``assign``; another builder's enter them."""
    gm = torch.fx.symbolic_trace(_Slicing())
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert any(isinstance(a, slice) for n in calls for a in n.args), "the slice case is gone"
    g = fastonnx.api.new_builder(18)
    x = g.add_input("x", onnx.TensorProto.FLOAT, [4])
    scopes = md.Scopes(g if marked else None)
    for n in calls:
        scopes.enter(g, n, g.num_nodes)
        g.add_node("Neg", [x])
    scopes.enter(g, calls[0], g.num_nodes)  # a second entry reuses the scope
    g.add_node("Abs", [x])
    if marked:
        assert g.node_scopes() == [None] * (len(calls) + 1), "marked, not entered"
        scopes.assign()
        assert g.node_scopes()[-1] == g.node_scopes()[0], "the second entry's scope is the first's"
        assert scopes.index_of(calls[1].name) == g.node_scopes()[1]
    g.set_scope(None)
    unused = g.add_scope("/gone")
    scopes.compose(g.scope_table(), used=set(g.used_scopes()))
    proto = onnx.load_from_string(g.to_bytes())
    assert len(proto.graph.node) == len(calls) + 1
    by_fx: dict[str, list[tuple[str, str]]] = {}
    for node in proto.graph.node:
        entries = [(e.key, e.value) for e in node.metadata_props]
        fx_text = dict(entries)[md.FX_NODE]
        by_fx.setdefault(fx_text, entries)
        assert by_fx[fx_text] == entries, "two nodes of one FX node differ"
    for n in calls:
        assert by_fx.pop(n.format_node()) == [
            (md.NAMESPACE, f"{n.name}: {n.target}"),
            (md.CLASS_HIERARCHY, repr([str(n.target)])),
            (md.NAME_SCOPES, repr([n.name])),
            (md.FX_NODE, n.format_node()),
            (md.STACK_TRACE, n.meta.get("stack_trace") or ""),
        ]
    assert not by_fx
    assert unused not in g.used_scopes()


def test_scope_calls_name_what_is_wrong() -> None:
    g = fastonnx.api.new_builder(18).scope_table()
    with pytest.raises(fastonnx.GraphError, match="set_scope_props: there is no scope 3"):
        g.set_scope_props(3, [])
    with pytest.raises(fastonnx.GraphError, match="compose_fx_scopes: 1 indices but 0 levels"):
        g.compose_fx_scopes(md.NODE_KEYS, [0], [], [], [])
    node = next(iter(torch.fx.symbolic_trace(_Slicing()).graph.nodes))
    with pytest.raises(fastonnx.GraphError, match="compose_fx_scopes: there is no scope 5"):
        g.compose_fx_scopes(md.NODE_KEYS, [5], [("", "[", "[")], [node], [("t", "'t'", "t")])
    b = fastonnx.api.new_builder(18)
    x = b.add_input("x", onnx.TensorProto.FLOAT, [4])
    b.add_node("Neg", [x])
    with pytest.raises(fastonnx.GraphError, match="assign_scopes: 2 starts but 1 keys"):
        b.assign_scopes([0, 1], [0])
    with pytest.raises(fastonnx.GraphError, match="the starts must ascend, up to the 1 nodes made"):
        b.assign_scopes([0, 2], [0, 1])
    with pytest.raises(fastonnx.GraphError, match="the starts must ascend"):
        b.assign_scopes([1, 0], [0, 1])
    with pytest.raises(fastonnx.GraphError, match="add_values_metadata: 1 names, 1 value rows, 2 keys"):
        b.add_values_metadata(["k", "l"], [x], [["v"]])
    with pytest.raises(fastonnx.GraphError, match='value metadata "k": "nope" is not a value'):
        b.add_values_metadata(["k"], ["nope"], [["v"]])


def test_graph_module_to_onnx_composes_the_metadata_too() -> None:
    """graph_module_to_onnx (the torch.compile path) composes its scopes after its passes as to_onnx does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ x.T + 1.5)[1:]

    x = torch.randn(3, 3)
    gm = make_fx(f)(x)
    result = fastonnx.graph_module_to_onnx(gm)
    torch.testing.assert_close(result(x), f(x))
    texts = {n.format_node() for n in gm.graph.nodes}
    nodes = list(all_nodes(result.model_proto.graph))
    assert nodes
    for node in nodes:
        p = props(node)
        assert set(md.NODE_KEYS) <= set(p), node.name
        assert p[md.FX_NODE] in texts


def test_metadata_composed_alongside_the_passes_equals_metadata_composed_after_them(
    llama: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """to_onnx composes while the passes run on another thread (stages.run_optimize); the file is the
    one composing after the passes, for the surviving scopes only, gives."""
    from fastonnx.pipeline import stages

    ep, first = llama
    args = (torch.randint(0, 256, (2, 8)),)
    alongside = fastonnx.to_onnx(ep, args, opset=23).to_bytes()
    assert alongside == first.to_bytes()

    def after(converted: Any, options: Any, bars: Any = None) -> stages.Optimized:
        builder, scopes = converted.builder, converted.interp.scopes
        counts = builder.optimize(options.level)
        scopes.compose(builder.scope_table(), used=set(builder.used_scopes()))
        scopes.apply(builder)
        builder.name_nodes_by_scope()
        return stages.Optimized(counts, 0.0, 0.0)

    monkeypatch.setattr(stages, "run_optimize", after)
    assert fastonnx.to_onnx(ep, args, opset=23).to_bytes() == alongside
