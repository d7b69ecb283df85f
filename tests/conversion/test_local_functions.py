"""Modules as ONNX local functions (``export_modules_as_functions``) and ``inline_functions``."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

import fastonnx
from support.model_zoo import TRANSFORMERS_MODELS, Logits, tiny_bert, tiny_llama

ATOL = RTOL = 1e-4


def _functions(proto: onnx.ModelProto) -> dict[tuple[str, str], onnx.FunctionProto]:
    return {(f.domain, f.name): f for f in proto.functions}


def _calls(nodes: list[onnx.NodeProto] | object, domain_prefix: str = "pkg.") -> list[onnx.NodeProto]:
    return [n for n in nodes if n.domain.startswith(domain_prefix)]  # type: ignore[attr-defined]


def _run(proto: onnx.ModelProto, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    return [torch.from_numpy(o) for o in outs]


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, torch.export.ExportedProgram, tuple[torch.Tensor, torch.Tensor]]:
    """A tiny Llama (2 layers) captured once with a dynamic batch and sequence."""
    model = Logits(tiny_llama()).eval()
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, :2] = 0  # left padding
    seq, batch = Dim("seq", min=2, max=64), Dim("batch", min=1, max=8)
    spec = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    ep = torch.export.export(model, (ids, mask), dynamic_shapes=spec, strict=False)
    return model, ep, (ids, mask)


@pytest.mark.parametrize("optimize", [False, True, "onnxruntime"])
@pytest.mark.parametrize("opset", [18, fastonnx.MAX_OPSET])
def test_llama_layers_become_one_function_called_per_layer(
    llama: tuple[torch.nn.Module, torch.export.ExportedProgram, tuple[torch.Tensor, torch.Tensor]],
    opset: int,
    optimize: bool | str,
) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model, ep, args = llama
    result = fastonnx.to_onnx(
        ep, args, opset=opset, optimize=optimize, export_modules_as_functions={LlamaDecoderLayer}
    )
    proto = result.model_proto
    functions = _functions(proto)
    assert list(functions) == [("pkg.transformers", "LlamaDecoderLayer")]
    body = functions["pkg.transformers", "LlamaDecoderLayer"]
    calls = _calls(proto.graph.node)
    assert [c.op_type for c in calls] == ["LlamaDecoderLayer"] * 2
    # the main graph: embeddings, the mask, the calls, the final norm and the head (one MatMul)
    assert [n.op_type for n in proto.graph.node].count("MatMul") == 1
    assert sum(n.op_type == "MatMul" for n in body.node) >= 7  # q, k, v, o, gate, up, down (+ attention)
    # the weights are function inputs passed at each call, each call its own layer's
    initializers = {t.name for t in proto.graph.initializer}
    # without the passes a hoisted Transpose of the weight stays in the main graph, before the call
    transposed = {
        n.output[0]: n.input[0]
        for n in proto.graph.node
        if n.op_type == "Transpose" and n.input[0] in initializers
    }
    weights = [[transposed.get(i, i) for i in c.input if i in initializers or i in transposed] for c in calls]
    # (equal small weights, the norms' ones of a fresh model, are merged by the passes: shared)
    assert len(weights[0]) >= 9 and len(set(weights[1]) - set(weights[0])) >= 7
    # the call carries its module's scope; the body's nodes keep their module names
    if optimize is not False:
        # no call transposes a weight at run time: the hoisted Transposes were folded into the weights
        assert "Transpose" not in [n.op_type for n in proto.graph.node]
        fed_weights = {body.input[k] for k, i in enumerate(calls[0].input) if i in initializers}
        assert not [n for n in body.node if n.op_type == "Transpose" and n.input[0] in fed_weights]
    assert calls[0].name == "/m/model/layers.0/LlamaDecoderLayer"
    namespace = {p.key: p.value for p in calls[0].metadata_props}["namespace"]
    assert namespace.endswith("model.layers.0: transformers.models.llama.modeling_llama.LlamaDecoderLayer")
    assert result.stats["functions"]["calls"] == 2
    # the body's nodes made from FX calls carry their metadata too (composed after the passes)
    q_proj = [n for n in body.node if "q_proj" in n.name and n.op_type != "Constant"]
    assert q_proj, [n.name for n in body.node]
    for n in q_proj:
        props = {p.key: p.value for p in n.metadata_props}
        assert "self_attn.q_proj" in props["namespace"] and props["pkg.torch.onnx.fx_node"], n.name
    body_domains = {n.domain for n in body.node}
    assert {o.domain for o in body.opset_import} == body_domains | {""}
    assert {o.domain: o.version for o in body.opset_import}[""] == opset
    if optimize == "onnxruntime" and opset == 18:
        assert "com.microsoft" in body_domains  # contrib operators inside the body, imported there
    if optimize != "onnxruntime":
        onnx.checker.check_model(proto, full_check=True)
    g = torch.Generator().manual_seed(1)
    for batch, seq in [(2, 8), (1, 5), (3, 17)]:
        ids = torch.randint(3, 256, (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[-1, :1] = 0
        with torch.no_grad():
            expected = model(ids, mask)
        torch.testing.assert_close(result(ids, mask), expected, atol=ATOL, rtol=RTOL)


def test_fusions_run_inside_the_function(
    llama: tuple[torch.nn.Module, torch.export.ExportedProgram, tuple[torch.Tensor, torch.Tensor]],
) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    _, ep, args = llama
    flat = fastonnx.to_onnx(ep, args, opset=fastonnx.MAX_OPSET)
    result = fastonnx.to_onnx(
        ep, args, opset=fastonnx.MAX_OPSET, export_modules_as_functions={LlamaDecoderLayer}
    )
    body = result.model_proto.functions[0]
    body_ops = {n.op_type for n in body.node}
    flat_ops = [n.op_type for n in flat.model_proto.graph.node]
    # what the passes fuse in each layer of the flat graph, they fuse in the body once
    for fused in ("Attention", "RMSNormalization"):
        assert fused in flat_ops
        assert fused in body_ops, sorted(body_ops)
    assert flat_ops.count("Attention") == 2 and [n.op_type for n in body.node].count("Attention") == 1


def test_default_output_is_unchanged(
    llama: tuple[torch.nn.Module, torch.export.ExportedProgram, tuple[torch.Tensor, torch.Tensor]],
) -> None:
    _, ep, args = llama
    plain = fastonnx.to_onnx(ep, args).to_bytes()
    assert fastonnx.to_onnx(ep, args, export_modules_as_functions=False).to_bytes() == plain
    assert fastonnx.to_onnx(ep, args, export_modules_as_functions=set()).to_bytes() == plain
    assert "functions" not in fastonnx.to_onnx(ep, args).stats


class Block(torch.nn.Module):
    def __init__(self, dim: int, scale: float) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * self.scale + x


class Stack(torch.nn.Module):
    """Three blocks of one class, the second with another scale (another body), the first called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(8, 0.5), Block(8, 2.0), Block(8, 0.5)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x)
        x = self.blocks[0](x)  # the same instance again
        return self.blocks[2](self.blocks[1](x))


@pytest.mark.parametrize("opset", [fastonnx.MIN_OPSET, fastonnx.MAX_OPSET])
def test_instances_that_differ_get_their_own_function_and_each_call_is_a_call(opset: int) -> None:
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(3, 8)
    result = fastonnx.to_onnx(model, (x,), export_modules_as_functions={Block}, optimize=False, opset=opset)
    proto = result.model_proto
    domain = f"pkg.{__name__.split('.')[0]}"
    assert list(_functions(proto)) == [(domain, "Block"), (domain, "Block_1")]
    calls = _calls(proto.graph.node)
    assert [c.op_type for c in calls] == ["Block", "Block", "Block_1", "Block"]
    # the two calls of blocks[0] read the same weights, blocks[2] its own
    initializers = {t.name for t in proto.graph.initializer}
    weights = [tuple(i for i in c.input if i in initializers) for c in calls]
    assert weights[0] == weights[1] and weights[3] != weights[0] and weights[2] != weights[0]
    assert [c.name for c in calls] == [
        "/blocks.0/Block",
        "/blocks.0/Block_1",
        "/blocks.1/Block_1",
        "/blocks.2/Block",
    ]
    onnx.checker.check_model(proto, full_check=True)
    torch.testing.assert_close(result(x), model(x), atol=ATOL, rtol=RTOL)


def test_metadata_off_names_calls_by_their_function() -> None:
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(3, 8)
    result = fastonnx.to_onnx(model, (x,), export_modules_as_functions={Block}, metadata=False)
    calls = _calls(result.model_proto.graph.node)
    assert [c.name for c in calls] == ["Block", "Block_1", "Block_1_1", "Block_2"]
    assert all(not c.metadata_props for c in calls)
    torch.testing.assert_close(result(x), model(x), atol=ATOL, rtol=RTOL)


def test_every_submodule_becomes_a_nested_function_on_bert() -> None:
    model = tiny_bert()
    ids = torch.randint(3, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[0, -3:] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    for optimize in (False, True):
        result = fastonnx.to_onnx(
            model,
            (),
            {"input_ids": ids, "attention_mask": mask},
            export_modules_as_functions=True,
            optimize=optimize,
        )
        proto = result.model_proto
        functions = _functions(proto)
        layer = functions["pkg.transformers", "BertLayer"]
        attention = functions["pkg.transformers", "BertAttention"]
        # layer -> attention -> self-attention, each a call in its parent's body
        assert "BertAttention" in [n.op_type for n in _calls(layer.node)]
        assert "BertSelfAttention" in [n.op_type for n in _calls(attention.node)]
        assert ("pkg.torch", "Linear") in functions
        assert {o.domain for o in layer.opset_import} >= {"", "pkg.transformers"}
        main_calls = [n.op_type for n in _calls(proto.graph.node)]
        assert main_calls == ["BertEmbeddings", "BertEncoder", "BertPooler"], main_calls
        onnx.checker.check_model(proto, full_check=True)
        got = result(input_ids=ids, attention_mask=mask)
        torch.testing.assert_close(got.last_hidden_state, expected, atol=ATOL, rtol=RTOL)


def test_an_instance_that_cannot_be_one_call_stays_inline(caplog: pytest.LogCaptureFixture) -> None:
    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.tanh(self.a(x)))

    model = Pair().eval()
    x = torch.randn(2, 4)
    ep = torch.export.export(model, (x,), strict=False)
    # make `a` and `b` one instance of a class with the tanh between them outside it: not convex
    stack_of = {n.name: n.meta.get("nn_module_stack") for n in ep.graph.nodes}
    linear_stack = next(s for s in stack_of.values() if s and len(s) == 2)
    for n in ep.graph.nodes:
        if n.op == "call_function" and n.target == torch.ops.aten.linear.default:
            n.meta["nn_module_stack"] = dict(linear_stack)
    with caplog.at_level(logging.WARNING, logger="fastonnx"):
        result = fastonnx.to_onnx(ep, (x,), export_modules_as_functions={torch.nn.Linear})
    assert not result.model_proto.functions
    assert result.stats["functions"]["calls"] == 0
    (message,) = result.stats["functions"]["inlined"]
    assert message.startswith("a (Linear)") and "left inline" in message
    assert "left inline" in caplog.text
    torch.testing.assert_close(result(x), model(x), atol=ATOL, rtol=RTOL)


def test_inline_functions_gives_the_flat_graph_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(3, 8)
    path = tmp_path / "stack.onnx"
    fastonnx.to_onnx(model, (x,), filename=path, export_modules_as_functions=True)
    out = tmp_path / "flat.onnx"
    flat = fastonnx.inline_functions(path, out)
    assert not flat.functions and not _calls(flat.graph.node)
    assert {o.domain for o in flat.opset_import} == {""}
    onnx.checker.check_model(flat, full_check=True)
    reloaded = onnx.load(out)
    assert len(reloaded.graph.node) == len(flat.graph.node)
    (got,) = _run(reloaded, {"x": x})
    torch.testing.assert_close(got, model(x), atol=ATOL, rtol=RTOL)
    assert len(fastonnx.inline_functions(onnx.load(path)).graph.node) == len(flat.graph.node)


def test_a_bad_selection_is_refused_before_the_capture() -> None:
    with pytest.raises(fastonnx.InputError, match="int.*is not an nn.Module class"):
        fastonnx.to_onnx(Stack(), (torch.randn(1, 8),), export_modules_as_functions={int})
    with pytest.raises(fastonnx.InputError, match="must be False, True or a set"):
        fastonnx.to_onnx(Stack(), (torch.randn(1, 8),), export_modules_as_functions="Block")  # type: ignore[arg-type]


def _resnet() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import torchvision

    from support.model_zoo import with_random_batchnorm_stats

    torch.manual_seed(0)
    model = with_random_batchnorm_stats(torchvision.models.resnet18(weights=None)).eval()
    return model, (torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)),)


# a decoder LM, an encoder, a ViT, a ResNet, each with its block class as functions
SUITES = {
    "gpt2": (lambda: TRANSFORMERS_MODELS["gpt2"](), "transformers.models.gpt2.modeling_gpt2", "GPT2Block", 2),
    "bert": (lambda: TRANSFORMERS_MODELS["bert"](), "transformers.models.bert.modeling_bert", "BertLayer", 2),
    "vit": (lambda: TRANSFORMERS_MODELS["vit"](), "transformers.models.vit.modeling_vit", "ViTLayer", 2),
    "resnet18": (_resnet, "torchvision.models.resnet", "BasicBlock", 8),
}


@pytest.mark.parametrize("name", sorted(SUITES))
def test_model_suites_with_their_blocks_as_functions(name: str) -> None:
    import importlib

    build, module, cls_name, calls = SUITES[name]
    model, args = build()
    block = getattr(importlib.import_module(module), cls_name)
    result = fastonnx.to_onnx(model, args, export_modules_as_functions={block})
    proto = result.model_proto
    assert [c.op_type.split("_")[0] for c in _calls(proto.graph.node)] == [cls_name] * calls
    assert not result.stats["functions"]["inlined"]
    onnx.checker.check_model(proto, full_check=True)
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(result(*args), expected, atol=ATOL, rtol=RTOL)


def test_external_data_and_a_kv_cache(tmp_path: Path) -> None:
    """A decode step (KV cache in and out) with its weights in a data file."""
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from support.model_zoo import DecodeStep

    model = DecodeStep(tiny_llama(use_cache=True)).eval()

    def past() -> DynamicCache:  # a fresh one per call: eager grows the cache it is given
        g = torch.Generator().manual_seed(0)
        cache = DynamicCache()
        for layer in range(2):
            cache.update(torch.randn(1, 2, 6, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g), layer)
        return cache

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (1, 1), generator=g)
    mask = torch.ones(1, 7, dtype=torch.int64)
    positions = torch.tensor([[6]])
    args = (ids, mask, positions, past())
    path = tmp_path / "step.onnx"
    result = fastonnx.to_onnx(
        model, args, filename=path, external_data=True, export_modules_as_functions={LlamaDecoderLayer}
    )
    assert (tmp_path / "step.onnx.data").exists()
    assert [c.op_type for c in _calls(onnx.load(path, load_external_data=False).graph.node)] == [
        "LlamaDecoderLayer"
    ] * 2
    with torch.no_grad():
        logits, cache = model(ids, mask, positions, past())
    got_logits, got_cache = result(ids, mask, positions, past())
    torch.testing.assert_close(got_logits, logits, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got_cache.layers[1].keys, cache.layers[1].keys, atol=ATOL, rtol=RTOL)


def test_the_torch_onnx_drop_in_passes_the_keyword_on(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(3, 8)
    program = fastonnx.export(model, (x,), str(tmp_path / "s.onnx"), export_modules_as_functions={Block})
    proto = onnx.load(tmp_path / "s.onnx")
    assert [f.name for f in proto.functions] == ["Block", "Block_1"]
    (got,) = _run(proto, {"x": x})
    torch.testing.assert_close(got, model(x), atol=ATOL, rtol=RTOL)
    assert program is not None


def test_two_calls_that_draw_random_values_are_not_merged() -> None:
    class Noisy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(x) * 2

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.noisy = Noisy()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.noisy(x) - self.noisy(x)  # two draws: not zero

    model = Twice().train()
    x = torch.ones(64, 64)
    with pytest.warns(UserWarning, match="training mode"):
        result = fastonnx.to_onnx(model, (x,), export_modules_as_functions={Noisy}, opset=20)
    assert [c.op_type for c in _calls(result.model_proto.graph.node)] == ["Noisy", "Noisy"]
    (got,) = _run(result.model_proto, {"x": x})
    assert got.abs().max() == 4.0  # kept by one draw, dropped by the other somewhere


@pytest.mark.parametrize("capture", ["export", "trace"])
def test_sliding_and_full_attention_layers_are_two_functions(capture: str) -> None:
    """Under torch.export the sliding layers' bodies keep the (unused) slicing of their cache update,
    so they differ from the full-attention layer's; the trace drops those dead ops, the masks that
    tell the two kinds apart are inputs of every call, and all three layers are one function."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3DecoderLayer

    from support.model_zoo import causal_lm

    kinds = ["sliding_attention", "full_attention", "sliding_attention"]
    model, args = causal_lm(
        "gemma3_text",
        "Gemma3ForCausalLM",
        head_dim=8,
        sliding_window=4,
        num_hidden_layers=3,
        layer_types=kinds,
    )
    result = fastonnx.to_onnx(model, args, export_modules_as_functions={Gemma3DecoderLayer}, capture=capture)
    assert result.stats["capture"] == capture
    proto = result.model_proto
    calls = [c.op_type for c in _calls(proto.graph.node)]
    if capture == "export":
        assert [f.name for f in proto.functions] == ["Gemma3DecoderLayer", "Gemma3DecoderLayer_1"]
        assert calls == ["Gemma3DecoderLayer", "Gemma3DecoderLayer_1", "Gemma3DecoderLayer"]
    else:
        assert [f.name for f in proto.functions] == ["Gemma3DecoderLayer"]
        assert calls == ["Gemma3DecoderLayer"] * 3
    onnx.checker.check_model(proto, full_check=True)
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(result(*args), expected, atol=ATOL, rtol=RTOL)


def test_every_module_of_a_dynamic_llama(
    llama: tuple[torch.nn.Module, torch.export.ExportedProgram, tuple[torch.Tensor, torch.Tensor]],
) -> None:
    model, ep, args = llama
    result = fastonnx.to_onnx(ep, args, export_modules_as_functions=True, opset=fastonnx.MAX_OPSET)
    proto = result.model_proto
    # torch.export's own stack entry for the size nodes it adds is no module: no function of it
    assert all("." not in f.name and not f.name.startswith("_") for f in proto.functions)
    assert [c.op_type for c in _calls(proto.graph.node)] == ["LlamaForCausalLM"]
    layer = _functions(proto)["pkg.transformers", "LlamaDecoderLayer"]
    assert {"LlamaAttention", "LlamaMLP", "LlamaRMSNorm"} <= {n.op_type for n in _calls(layer.node)}
    onnx.checker.check_model(proto, full_check=True)
    for batch, seq in [(2, 8), (3, 13)]:
        ids = torch.randint(3, 256, (batch, seq), generator=torch.Generator().manual_seed(seq))
        mask = torch.ones(batch, seq, dtype=torch.int64)
        with torch.no_grad():
            expected = model(ids, mask)
        torch.testing.assert_close(result(ids, mask), expected, atol=ATOL, rtol=RTOL)


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: self.fc(t).relu(), lambda t: self.fc(t) * 2, (x,))


def test_bodies_holding_control_flow_run_and_are_not_shared() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(Branchy(), Branchy()).eval()
    x = torch.randn(2, 4)
    result = fastonnx.to_onnx(model, (x,), export_modules_as_functions={Branchy})
    proto = result.model_proto
    # the If's branches read the weights by name: each body is its own function
    assert [n.op_type for n in proto.graph.node] == ["Branchy", "Branchy_1"]
    assert all("If" in [n.op_type for n in f.node] for f in proto.functions)
    onnx.checker.check_model(proto, full_check=True)
    for sign in (1, -1):
        torch.testing.assert_close(result(x * sign), model(x * sign), atol=ATOL, rtol=RTOL)
