"""Verification: per output, and down to the first FX node whose value diverges (verification.py).

The divergence tests bury a deliberately wrong converter in the middle of a small transformer and of a
small CNN: intermediate verification must name exactly that FX node, its source line and the ONNX
nodes made from it; with a correct converter it must report no divergence.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

import fastonnx
from fastonnx.diagnostics.verdicts import VerificationInfo, compare


# ---- compare ------------------------------------------------------------------------------------
def test_compare_measures_differences_and_applies_tolerance() -> None:
    expected = torch.tensor([1.0, 2.0, 4.0])
    actual = torch.tensor([1.0, 2.5, 4.0])
    info = compare("y", expected, actual, atol=0.1, rtol=0.1)
    assert info.max_abs_diff == pytest.approx(0.5)
    assert info.max_rel_diff == pytest.approx(0.25)
    assert not info.passed  # 0.5 > 0.1 + 0.1 * 2
    assert compare("y", expected, actual, atol=0.0, rtol=0.3).passed  # 0.5 <= 0.3 * 2


def test_compare_nan_shape_dtype_and_integers() -> None:
    nan = torch.tensor([math.nan, 1.0])
    assert compare("n", nan, nan.clone()).passed
    assert not compare("n", nan, torch.tensor([0.0, 1.0])).passed
    bad_shape = compare("s", torch.zeros(2, 3), torch.zeros(3, 2))
    assert not bad_shape.passed and "shape (3, 2) instead of (2, 3)" in bad_shape.note
    bad_dtype = compare("d", torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not bad_dtype.passed and "dtype float64 instead of float32" in bad_dtype.note
    # integers are exact whatever the tolerances
    assert not compare("i", torch.tensor([3]), torch.tensor([4]), atol=10.0, rtol=10.0).passed


# ---- outputs ------------------------------------------------------------------------------------
class TwoOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.lin(x))
        return h * 2, h.sum(-1)


def test_verify_true_stores_a_table_per_output() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    result = fastonnx.to_onnx(TwoOutputs().eval(), (x,), verify=True)
    infos = result.stats["verify"]
    assert [type(i) for i in infos] == [VerificationInfo, VerificationInfo]
    assert [i.shape for i in infos] == [(4, 8), (4,)]
    assert all(i.passed for i in infos)
    assert all(i.max_abs_diff < 1e-5 for i in infos)


def test_verify_reports_a_wrong_output(caplog: pytest.LogCaptureFixture) -> None:
    def relu_as_abs(ctx, x):  # deliberately wrong
        return ctx.op("Abs", x)

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="fastonnx"):
        result = fastonnx.to_onnx(
            TwoOutputs().eval(),
            (x,),
            verify=True,
            custom_converters={torch.ops.aten.relu.default: relu_as_abs},
        )
    assert [i.passed for i in result.stats["verify"]] == [False, False]
    assert "disagrees with PyTorch" in caplog.text
    again = result.verify(x)
    assert not again.passed and again.intermediate is None


# ---- intermediate: a transformer ----------------------------------------------------------------
@torch.library.custom_op("fastonnx_diag_test::quick_gelu", mutates_args=())
def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """A user's activation, converted by the user's converter (right or deliberately wrong)."""
    return x * torch.sigmoid(1.702 * x)


@quick_gelu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def quick_gelu_right(ctx, x):
    k = ctx.const(1.702, torch.float32)
    return ctx.op("Mul", x, ctx.op("Sigmoid", ctx.op("Mul", x, k)))


def quick_gelu_wrong(ctx, x):
    k = ctx.const(1.0, torch.float32)  # the bug: 1.0 instead of 1.702
    return ctx.op("Mul", x, ctx.op("Sigmoid", ctx.op("Mul", x, k)))


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int, custom_act: bool) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)
        self.custom_act = custom_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.up(self.norm2(x))
        h = quick_gelu(h) if self.custom_act else F.gelu(h)
        return x + self.down(h)


class TinyTransformer(torch.nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, dim)
        # the user's op only in the middle block
        self.blocks = torch.nn.ModuleList([Block(dim, heads, custom_act=i == 1) for i in range(3)])
        self.head = torch.nn.Linear(dim, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _only_node(ep: torch.export.ExportedProgram, target: object) -> torch.fx.Node:
    nodes = [n for n in ep.graph.nodes if n.target == target]
    assert len(nodes) == 1
    return nodes[0]


def test_intermediate_names_the_wrong_converter_in_a_transformer() -> None:
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    ids = torch.randint(0, 50, (2, 7))
    op = torch.ops.fastonnx_diag_test.quick_gelu.default
    result = fastonnx.to_onnx(model, (ids,), custom_converters={op: quick_gelu_wrong})
    check = result.verify(ids, intermediate=True)
    assert not check.passed
    inter = check.intermediate
    assert inter is not None and inter.first_divergence is not None
    div = inter.first_divergence
    wrong = _only_node(result.exported_program, op)
    assert div.fx_node == wrong.name
    assert div.target == "fastonnx_diag_test.quick_gelu.default"
    assert "test_verification.py" in div.source_line
    assert "h = quick_gelu(h) if self.custom_act else F.gelu(h)" in div.source_line
    # the converter's three nodes, by their names before optimization
    assert len(div.onnx_nodes) == 3 and any("Sigmoid" in n for n in div.onnx_nodes)
    # its input (the `up` Linear of the middle block) was compared and agrees
    assert div.inputs_agreeing == [wrong.args[0].name] and div.inputs_not_compared == []
    assert div.info.max_abs_diff > 1e-2
    # everything before the wrong node agrees
    before = {n.name for n in result.exported_program.graph.nodes if n.op == "call_function"}
    order = [n.name for n in result.exported_program.graph.nodes]
    earlier = set(order[: order.index(wrong.name)]) & before
    assert all(c.info.passed for c in inter.checks if c.fx_node in earlier)
    assert len([c for c in inter.checks if c.fx_node in earlier]) > 20
    assert "first divergence: FX node" in str(check)


def test_intermediate_reports_no_divergence_on_a_correct_transformer() -> None:
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    ids = torch.randint(0, 50, (2, 7))
    op = torch.ops.fastonnx_diag_test.quick_gelu.default
    result = fastonnx.to_onnx(model, (ids,), custom_converters={op: quick_gelu_right})
    check = result.verify(ids, intermediate=True)
    assert check.passed
    inter = check.intermediate
    assert inter is not None and inter.first_divergence is None
    assert len(inter.checks) > 50 and all(c.info.passed for c in inter.checks)
    assert "no divergence" in str(inter)


# ---- intermediate: a CNN ------------------------------------------------------------------------
class TinyCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = F.silu(self.conv2(x))  # the one SiLU, in the middle
        x = torch.relu(self.conv3(x))
        return self.fc(x.mean(dim=(2, 3)))


def silu_wrong(ctx, x):
    return ctx.op("Mul", x, ctx.op("Sigmoid", ctx.op("Mul", x, ctx.const(0.5, torch.float32))))


def test_intermediate_names_the_wrong_converter_in_a_cnn() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12)
    result = fastonnx.to_onnx(
        TinyCNN().eval(), (x,), custom_converters={torch.ops.aten.silu.default: silu_wrong}
    )
    inter = result.verify(x, intermediate=True).intermediate
    assert inter is not None and inter.first_divergence is not None
    div = inter.first_divergence
    wrong = _only_node(result.exported_program, torch.ops.aten.silu.default)
    assert (div.fx_node, div.target) == (wrong.name, "aten.silu.default")
    assert "x = F.silu(self.conv2(x))" in div.source_line
    assert div.inputs_agreeing == [wrong.args[0].name]  # conv2's output
    assert len(div.onnx_nodes) == 3


def test_intermediate_on_a_correct_cnn_skips_what_optimization_removed() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12)
    model = TinyCNN().eval()
    inter = fastonnx.to_onnx(model, (x,)).verify(x, intermediate=True).intermediate
    assert inter is not None and inter.first_divergence is None
    assert all(c.info.passed for c in inter.checks)
    # the BatchNorm is folded into the convolution: its value is skipped, not guessed
    assert sum(inter.skipped.values()) >= 1
    compared = {c.fx_node for c in inter.checks}
    assert "silu" in compared and "relu" in compared


def test_verify_without_the_model_kept_is_refused() -> None:
    x = torch.randn(4, 8)
    result = fastonnx.to_onnx(TwoOutputs().eval(), (x,))
    result._model = result.exported_program = None
    with pytest.raises(fastonnx.InputError, match="does not hold the model"):
        result.verify(x)


def test_verify_of_an_exported_program_runs_its_module() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep = torch.export.export(TwoOutputs().eval(), (x,), strict=False)
    result = fastonnx.to_onnx(ep, (x,), verify=True)
    assert [i.passed for i in result.stats["verify"]] == [True, True]
    inter = result.verify(torch.randn(4, 8), intermediate=True).intermediate
    assert inter is not None and inter.first_divergence is None and len(inter.checks) >= 4


class WithCond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h = torch.cond(h.sum() > 0, lambda t: torch.sin(t) * 2, lambda t: torch.cos(t) - 1, (h,))
        return h + 1


def test_intermediate_skips_values_inside_if_bodies() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 6)
    inter = fastonnx.to_onnx(WithCond().eval(), (x,)).verify(x, intermediate=True).intermediate
    assert inter is not None and inter.first_divergence is None
    # sin, mul / cos, sub live in the two branches: counted as skipped, not compared
    assert inter.skipped["inside subgraphs (If/Loop/Scan bodies, wrapped regions)"] == 4
    # the If's own result (and the comparison choosing the branch) are top-level values: compared
    assert [c.fx_node for c in inter.checks] == ["linear", "sum_1", "gt", "cond", "getitem", "add"]


def test_compare_complex_against_the_real_layout() -> None:
    z = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64)
    assert compare("z", z, torch.view_as_real(z).clone()).passed  # onnxruntime's (..., 2) layout
    assert compare("z", z, z.clone()).passed
    off = torch.view_as_real(z).clone()
    off[1, 1] += 1.0
    info = compare("z", z, off)
    assert not info.passed and info.max_abs_diff == pytest.approx(1.0)


def test_intermediate_names_a_wrong_aten_converter_in_a_transformers_llama() -> None:
    from support.model_zoo import tiny_llama

    def rsqrt_wrong(ctx, x):  # forgets the square root
        return ctx.op("Reciprocal", x)

    torch.manual_seed(0)
    ids = torch.randint(0, 100, (1, 8))
    result = fastonnx.to_onnx(
        tiny_llama(layers=2, hidden=64), (ids,), custom_converters={torch.ops.aten.rsqrt.default: rsqrt_wrong}
    )
    inter = result.verify(ids, intermediate=True).intermediate
    assert inter is not None and inter.first_divergence is not None
    div = inter.first_divergence
    first_rsqrt = next(
        n for n in result.exported_program.graph.nodes if n.target == torch.ops.aten.rsqrt.default
    )
    assert (div.fx_node, div.target) == (first_rsqrt.name, "aten.rsqrt.default")
    assert (
        "modeling_llama.py" in div.source_line
        and "torch.rsqrt(variance + self.variance_epsilon)" in div.source_line
    )
    # node names may carry a scope (/model/layers.0/...): the op type ends them
    assert len(div.onnx_nodes) == 1 and div.onnx_nodes[0].endswith("Reciprocal")
    assert div.inputs_not_compared == []
