"""torch.onnx.export's ``custom_translation_table`` (torch op -> onnxscript function) through
fastonnx.export, and the same functions as ``to_onnx(custom_converters=...)``: script functions inlined,
Python functions calling onnxscript ops run on fastonnx's evaluator, overloads chosen by input types,
opsets reconciled, and failures named (fastonnx/translation/)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import onnx
import pytest
import torch

import fastonnx
from fastonnx import onnxscript_converters

onnxscript = pytest.importorskip("onnxscript")
from onnxscript import BOOL, FLOAT, opset13, opset20  # noqa: E402
from onnxscript import opset18 as op  # noqa: E402
from onnxscript.values import Opset  # noqa: E402

CUSTOM_ATEN = Opset("custom.aten", 1)


# ---- helpers --------------------------------------------------------------------------------------
def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)


def _op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in _nodes(model.graph)]


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def _both(
    model: torch.nn.Module, args: tuple[Any, ...], table: dict[Any, Any], **kwargs: Any
) -> list[onnx.ModelProto]:
    """Exports through fastonnx.export(custom_translation_table=) and to_onnx(custom_converters=),
    checks both against eager in onnxruntime; returns both models."""
    want = _flat(model(*args))
    program = fastonnx.export(model, args, custom_translation_table=table, **kwargs)
    torch.testing.assert_close(_flat(program(*args)), want)
    result = fastonnx.to_onnx(model, args, custom_converters=table, opset=kwargs.get("opset_version"))
    torch.testing.assert_close(_flat(result(*args)), want)
    assert result.stats["custom_converters_used"]
    for proto in (program.model_proto, result.model_proto):
        onnx.checker.check_model(proto)
    return [program.model_proto, result.model_proto]


class Add(torch.nn.Module):
    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.add(x, y, alpha=self.alpha)


def _xy(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


# ---- (i) a script function overriding aten.add.Tensor ------------------------------------------------
@onnxscript.script(CUSTOM_ATEN, default_opset=op)
def custom_aten_add(self, other, alpha: float = 1.0):  # type: ignore[no-untyped-def]
    alpha = op.CastLike(alpha, other)
    other = op.Mul(other, alpha)
    return op.Add(self, other)


@pytest.mark.parametrize("alpha", [1.0, 2.5])
def test_script_function_overrides_add(alpha: float) -> None:
    for model in _both(Add(alpha), _xy(2, 3), {torch.ops.aten.add.Tensor: custom_aten_add}):
        types = _op_types(model)
        assert "Add" in types
        if alpha != 1.0:
            assert "Mul" in types  # alpha * other: the function's body, inlined
        # inlined: no node of the function's domain, no local function
        assert all(n.domain != "custom.aten" for n in model.graph.node)
        assert not model.functions


def test_script_function_nodes_are_inlined_with_the_bound_attribute() -> None:
    """``Constant <value_float = @alpha>`` takes the call's alpha, and its CastLike to other's type is
    folded: Mul(other, 2.5) then Add, nothing of the function's own left."""
    model = _both(Add(2.5), _xy(2, 3), {torch.ops.aten.add.Tensor: custom_aten_add}, optimize=False)[0]
    assert _op_types(model) == ["Mul", "Add"]
    mul = model.graph.node[0]
    constant = next(i for i in model.graph.initializer if i.name == mul.input[1])
    assert constant.data_type == onnx.TensorProto.FLOAT
    assert onnx.numpy_helper.to_array(constant).item() == 2.5


@onnxscript.script(CUSTOM_ATEN)
def _scaled(x, k: float = 2.0):  # type: ignore[no-untyped-def]
    return op.Mul(x, op.CastLike(k, x))


@onnxscript.script(CUSTOM_ATEN, default_opset=op)
def add_with_branch(self, other, alpha: float = 1.0):  # type: ignore[no-untyped-def]
    if alpha != 1.0:
        other = _scaled(other, k=alpha)
    else:
        other = op.Identity(other)
    return op.Add(self, other)


@pytest.mark.parametrize("alpha", [1.0, -0.5])
def test_script_control_flow_and_nested_functions_are_inlined(alpha: float) -> None:
    """The If's branches become subgraphs, the call of another script function in one is inlined too,
    the attribute reaching it through the If."""
    for model in _both(Add(alpha), _xy(3, 2), {torch.ops.aten.add.Tensor: add_with_branch}):
        assert "If" in _op_types(model)
        assert "Mul" in _op_types(model)  # _scaled's body, inside the then-branch


@onnxscript.script()
def repeat_add(self, other):  # type: ignore[no-untyped-def]
    acc = self
    for _ in range(3):
        acc = op.Add(acc, other)
    return acc


def test_script_loop_body_types_come_from_the_loop_inputs() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    x, y = _xy(2, 3)
    result = fastonnx.to_onnx(M(), (x, y), custom_converters={torch.ops.aten.add.Tensor: repeat_add})
    assert "Loop" in _op_types(result.model_proto)
    torch.testing.assert_close(result(x, y), x + 3 * y)


# ---- (ii) overloads chosen by the input types ---------------------------------------------------------
class LogicalAnd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.logical_and.default(x, y)


def and_bool(self: BOOL, other: BOOL) -> BOOL:
    return op.And(self, other)


def and_float(self: FLOAT, other: FLOAT) -> BOOL:
    return op.Not(op.Or(op.Equal(self, 0.0), op.Equal(other, 0.0)))


OVERLOADS = {torch.ops.aten.logical_and.default: [and_float, and_bool]}


def test_overloads_bool_inputs_take_the_bool_function() -> None:
    args = (torch.tensor([True, False, True, False]), torch.tensor([True, True, False, False]))
    for model in _both(LogicalAnd(), args, OVERLOADS):
        assert _op_types(model) == ["And"]


def test_overloads_float_inputs_take_the_float_function() -> None:
    args = (torch.tensor([1.0, 0.0, 2.0, 0.0]), torch.tensor([3.0, 1.0, 0.0, 0.0]))
    for model in _both(LogicalAnd(), args, OVERLOADS):
        types = _op_types(model)
        assert "And" not in types and {"Equal", "Or", "Not"} <= set(types)


def test_overloads_none_fitting_is_a_conversion_error_saying_why() -> None:
    args = (torch.tensor([1, 0]), torch.tensor([3, 1]))
    with pytest.raises(fastonnx.ConversionError) as info:
        fastonnx.export(LogicalAnd(), args, custom_translation_table=OVERLOADS)
    message = str(info.value)
    assert "none of the 2 functions" in message and "FX node 'logical_and'" in message
    assert "and_float" in message and "and_bool" in message and "INT64" in message


# ---- (iii) a custom op defined with torch.library -------------------------------------------------------
@torch.library.custom_op("fastonnx_tt::custom_add", mutates_args=())
def _custom_add(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return a + alpha * b


@_custom_add.register_fake
def _(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return torch.empty_like(a)


class CustomAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.fastonnx_tt.custom_add(x, y, 0.5)


@onnxscript.script(CUSTOM_ATEN, default_opset=op)
def onnx_custom_add(a, b, alpha: float = 1.0):  # type: ignore[no-untyped-def]
    return op.Add(a, op.Mul(b, op.CastLike(alpha, b)))


@pytest.mark.parametrize(
    "key", [torch.ops.fastonnx_tt.custom_add.default, "fastonnx_tt.custom_add.default"], ids=["op", "name"]
)
def test_custom_op_mapped_to_a_script_function(key: Any) -> None:
    for model in _both(CustomAdd(), _xy(2, 3), {key: onnx_custom_add}):
        assert sorted(_op_types(model)) == ["Add", "Mul"]


def test_an_overload_packet_key_stands_for_its_overloads_in_a_table() -> None:
    x, y = _xy(2, 3)
    program = fastonnx.export(
        CustomAdd(), (x, y), custom_translation_table={torch.ops.fastonnx_tt.custom_add: onnx_custom_add}
    )
    torch.testing.assert_close(program(x, y)[0], CustomAdd()(x, y))


def test_composite_custom_op_is_kept_whole_for_its_translation() -> None:
    """A CompositeImplicitAutograd op is decomposed below autograd, where the trace records: a custom
    converter for one makes capture="auto" use torch.export, which keeps it one node."""
    with torch.library._scoped_library("fastonnx_tt2", "FRAGMENT") as lib:
        torch.library.define("fastonnx_tt2::foo", "(Tensor a, Tensor b) -> Tensor", lib=lib)

        @torch.library.impl("fastonnx_tt2::foo", "CompositeImplicitAutograd", lib=lib)
        def foo(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

        class Foo(torch.nn.Module):
            def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return torch.ops.fastonnx_tt2.foo(x, y)

        def onnx_sub(self, other):  # type: ignore[no-untyped-def]
            return op.Sub(self, other)

        x, y = _xy(2, 3)
        program = fastonnx.export(
            Foo(), (x, y), custom_translation_table={torch.ops.fastonnx_tt2.foo.default: onnx_sub}
        )
        assert _op_types(program.model_proto) == ["Sub"]
        torch.testing.assert_close(program(x, y)[0], x - y)
        assert "torch.export keeps" in program.stats["trace_refused"]
        # without the translation the op is decomposed as the model runs it
        assert _op_types(fastonnx.export(Foo(), (x, y)).model_proto) == ["Add"]


# ---- (iv) a plain Python function calling onnxscript ops ---------------------------------------------
def custom_sub(self, other):  # type: ignore[no-untyped-def]
    return op.Sub(self, other)


class Plus(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def test_plain_function_replaces_add_with_sub() -> None:
    """pytorch's test_custom_translation_table_overrides_ops: Sub in the graph, no Add."""
    x, y = _xy(2, 2)
    program = fastonnx.export(
        Plus(), (x, y), custom_translation_table={torch.ops.aten.add.Tensor: custom_sub}
    )
    assert _op_types(program.model_proto) == ["Sub"]
    torch.testing.assert_close(program(x, y)[0], x - y)
    result = fastonnx.to_onnx(Plus(), (x, y), custom_converters={torch.ops.aten.add.Tensor: custom_sub})
    assert _op_types(result.model_proto) == ["Sub"]
    torch.testing.assert_close(result(x, y), x - y)
    assert result.stats["custom_converters_used"] == ["aten.add.Tensor"]


def test_plain_function_reads_value_types_and_python_arguments() -> None:
    """What the vendors' functions do: int(x.dtype), static dims from x.shape, Python lists, bools and
    None as arguments, numbers autocast to the other input's type, operators on values."""

    def mean(self, dim, keepdim=False, dtype=None):  # type: ignore[no-untyped-def]
        assert int(self.dtype) == onnx.TensorProto.FLOAT and dtype is None
        rows = [int(d) for d in self.shape][0]
        total = op.ReduceSum(self, dim, keepdims=keepdim)  # dim: a list -> an int64 constant
        return total / float(self.shape[dim[0]]) + 0 * rows  # operators, numbers cast like total

    class Mean(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=[1], keepdim=True)

    (x,) = _xy(3, 4)[:1]
    for model in _both(Mean(), (x,), {torch.ops.aten.mean.dim: mean}):
        assert "ReduceSum" in _op_types(model)


def test_a_fastonnx_converter_is_not_taken_for_an_onnxscript_function() -> None:
    def sub(ctx, x, y):  # type: ignore[no-untyped-def]
        return ctx.op("Sub", x, y)

    assert onnxscript_converters.is_translation(custom_sub)
    assert onnxscript_converters.is_translation(custom_aten_add)
    assert onnxscript_converters.is_translation([custom_sub])
    assert not onnxscript_converters.is_translation(sub)
    x, y = _xy(2, 2)
    result = fastonnx.to_onnx(Plus(), (x, y), custom_converters={torch.ops.aten.add.Tensor: sub})
    torch.testing.assert_close(result(x, y), x - y)


def test_plain_function_with_dynamic_shapes() -> None:
    x, y = _xy(2, 3)
    batch = torch.export.Dim("batch")
    program = fastonnx.export(
        Plus(),
        (x, y),
        custom_translation_table={torch.ops.aten.add.Tensor: custom_sub},
        dynamic_shapes=({0: batch}, {0: batch}),
    )
    x5, y5 = _xy(5, 3)
    torch.testing.assert_close(program(x5, y5)[0], x5 - y5)


# ---- (v) attributes --------------------------------------------------------------------------------------
@onnxscript.script(opset20)
def gelu_script(self: FLOAT, approximate: str = "none") -> FLOAT:
    return opset20.Gelu(self, approximate=approximate)


def gelu_plain(self, approximate="none"):  # type: ignore[no-untyped-def]
    return opset20.Gelu(self, approximate=approximate)


class Gelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


@pytest.mark.parametrize("fn", [gelu_script, gelu_plain], ids=["script", "plain"])
def test_string_attribute(fn: Callable[..., Any]) -> None:
    (x,) = _xy(4, 5)[:1]
    for model in _both(Gelu(), (x,), {torch.ops.aten.gelu.default: fn}):
        (node,) = (n for n in model.graph.node if n.op_type == "Gelu")
        assert onnx.helper.get_attribute_value(node.attribute[0]) == b"tanh"


def test_float_attribute_of_a_plain_function() -> None:
    def leaky(self, negative_slope=0.01):  # type: ignore[no-untyped-def]
        return op.LeakyRelu(self, alpha=negative_slope)

    class Leaky(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.leaky_relu(x, 0.3)

    (x,) = _xy(4, 5)[:1]
    for model in _both(Leaky(), (x,), {torch.ops.aten.leaky_relu.default: leaky}):
        (node,) = model.graph.node
        assert node.op_type == "LeakyRelu"
        assert onnx.helper.get_attribute_value(node.attribute[0]) == pytest.approx(0.3)


# ---- (vi) several outputs -----------------------------------------------------------------------------
def topk(self, k, dim=-1, largest=True, sorted=True):  # type: ignore[no-untyped-def]
    values, indices = op.TopK(self, [k], axis=dim, largest=largest, sorted=sorted)
    return values, indices


@onnxscript.script()
def split_in_two(self, split_size: int, dim: int = 0):  # type: ignore[no-untyped-def]
    first, second = op.Split(self, axis=dim, num_outputs=2)
    return first, second


def test_multi_output_plain_function() -> None:
    class TopK(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            values, indices = torch.topk(x, 2)
            return values * 2, indices

    (x,) = _xy(3, 5)[:1]
    for model in _both(TopK(), (x,), {torch.ops.aten.topk.default: topk}):
        assert "TopK" in _op_types(model)


def test_multi_output_script_function() -> None:
    class Halves(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a, b = torch.split(x, 2, dim=1)
            return a + 1, b * 2

    (x,) = _xy(3, 4)[:1]
    for model in _both(Halves(), (x,), {torch.ops.aten.split.Tensor: split_in_two}):
        assert _op_types(model).count("Split") == 1


# ---- torch's own functions -------------------------------------------------------------------------
class Block(torch.nn.Module):
    """Convolution, pooling, embedding, attention, layer norm, activations, reductions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.ln = torch.nn.LayerNorm(16)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.lin = torch.nn.Linear(16, 4)
        self.emb = torch.nn.Embedding(10, 16)

    def forward(self, img: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv(img)), 2).flatten(2).transpose(1, 2)
        e = self.emb(ids)
        a, _ = self.attn(e, e, e, need_weights=False)
        z = self.ln(e + a)
        z = torch.nn.functional.gelu(z) * torch.sigmoid(z)
        out = self.lin(z).softmax(-1)
        return out.mean(dim=1), h.sum(), torch.cat([out, out], dim=-1)[..., 1:5].pow(2).rsqrt()


@pytest.mark.parametrize("capture", ["trace", "export"])
def test_the_official_exporters_functions_as_a_table(capture: str) -> None:
    """Every op of a block given the onnxscript functions torch.onnx.export itself uses (onnxscript's
    torch_lib: Python functions calling onnxscript ops, ir.tensor constants, ir.Attr attributes, lists
    of overloads): the same outputs as eager."""
    from onnxscript.function_libs.torch_lib import ops as _  # noqa: F401 - fills the registry
    from onnxscript.function_libs.torch_lib import registration

    model = Block().eval()
    args = (torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2, 5)))
    program = fastonnx.to_onnx(model, args, capture=capture).exported_program
    assert program is not None
    table = {}
    for node in program.graph.nodes:
        name = node.target.name() if isinstance(node.target, torch._ops.OpOverload) else ""
        name = name if name in registration.default_registry else name.removesuffix(".default")
        if name in registration.default_registry:
            table[node.target] = list(registration.default_registry[name].overloads)
    result = fastonnx.to_onnx(model, args, custom_converters=table, capture=capture)
    assert len(result.stats["custom_converters_used"]) == len(table) >= 20
    torch.testing.assert_close(_flat(result(*args)), _flat(model(*args)), rtol=1e-4, atol=1e-5)


# ---- opsets ------------------------------------------------------------------------------------------
def test_an_attribute_that_became_an_input_is_moved() -> None:
    """ReduceMean's axes is an attribute at opset 13 and an input from 18: a function written for 13
    works in a model of 20."""

    def mean13(self, dim, keepdim=False, dtype=None):  # type: ignore[no-untyped-def]
        return opset13.ReduceMean(self, axes=dim, keepdims=keepdim)

    class Mean(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=[0], keepdim=False)

    (x,) = _xy(3, 4)[:1]
    for model in _both(Mean(), (x,), {torch.ops.aten.mean.dim: mean13}):
        (node,) = (n for n in model.graph.node if n.op_type == "ReduceMean")
        assert len(node.input) == 2 and not [a for a in node.attribute if a.name == "axes"]


def test_a_function_written_for_opset_18_runs_at_every_opset() -> None:
    for opset in (17, 18, 20, 23):
        _both(Add(2.0), _xy(2, 3), {torch.ops.aten.add.Tensor: custom_aten_add}, opset_version=opset)


def test_an_op_missing_at_the_model_opset_is_an_opset_error_naming_everything() -> None:
    (x,) = _xy(4, 5)[:1]
    with pytest.raises(fastonnx.OpsetError) as info:
        fastonnx.export(
            Gelu(),
            (x,),
            custom_translation_table={torch.ops.aten.gelu.default: gelu_script},
            opset_version=18,
        )
    message = str(info.value)
    assert message.startswith("aten.gelu.default: the onnxscript function gelu_script")
    assert "FX node 'gelu'" in message
    assert "Gelu is written for opset 20 but opset 18 has no Gelu" in message and "opset=20" in message


# ---- errors --------------------------------------------------------------------------------------------
def _missing_input(self, other):  # type: ignore[no-untyped-def]
    return op.Add(self, op.Reshape(other))  # Reshape's shape is missing


def _string_input(self, other):  # type: ignore[no-untyped-def]
    return op.Add(self, "other")  # fails while emitting: no tensor of a string


@pytest.mark.parametrize(
    ("broken", "why"), [(_missing_input, "Reshape"), (_string_input, "a string cannot be a tensor input")]
)
def test_a_failing_function_is_a_conversion_error_naming_op_node_and_function(
    broken: Callable[..., Any], why: str
) -> None:
    x, y = _xy(2, 2)
    table = {torch.ops.aten.add.Tensor: broken}
    for call in (
        lambda: fastonnx.export(Plus(), (x, y), custom_translation_table=table),
        lambda: fastonnx.to_onnx(Plus(), (x, y), custom_converters=table),
    ):
        with pytest.raises(fastonnx.ConversionError) as info:
            call()
        message = str(info.value)
        where = rf"the onnxscript function {broken.__name__} \(.*test_translation_tables\.py:\d+\)"
        assert re.match(rf"aten\.add\.Tensor: {where} failed on FX node 'add'", message), message
        assert why in message


def test_a_value_that_is_no_function_is_refused_before_capture() -> None:
    with pytest.raises(fastonnx.InputError, match="onnxscript function"):
        fastonnx.export(Plus(), _xy(2, 2), custom_translation_table={torch.ops.aten.add.Tensor: print})
    with pytest.raises(fastonnx.InputError, match="empty list"):
        fastonnx.export(Plus(), _xy(2, 2), custom_translation_table={torch.ops.aten.add.Tensor: []})
    with pytest.raises(fastonnx.InputError, match="both custom_converters and custom_translation_table"):
        fastonnx.export(
            Plus(),
            _xy(2, 2),
            custom_translation_table={torch.ops.aten.add.Tensor: custom_sub},
            custom_converters={"aten.add.Tensor": custom_sub},
        )


def test_onnxscript_is_imported_only_when_a_translation_is_given() -> None:
    code = (
        "import sys, torch, fastonnx\n"
        "fastonnx.to_onnx(torch.nn.Linear(2, 2), (torch.randn(1, 2),))\n"
        "print('onnxscript' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
