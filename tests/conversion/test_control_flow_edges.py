"""Control-flow edges: while_loop carrying Python ints and SymInts, scan bodies reading symbolic sizes,
cond nested in scan, a scan whose carries start from one tensor (refused: torch.export records a wrong
body), invoke_subgraph (torch.compiler.nested_compile_region), and the torch.sym_* /
Python operators torch.export records on symbolic sizes."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo.config
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import fastonnx
from fastonnx.errors import ConversionError, OpsetError
from support.export_check import ENDS, check_export

Dim = torch.export.Dim


class CountedLoop(torch.nn.Module):
    """A loop counter that starts as the Python int 0: torch.export carries it as a SymInt."""

    def forward(self, x: torch.Tensor) -> tuple[Any, torch.Tensor]:
        def cond_fn(i: Any, x: torch.Tensor) -> Any:
            return i < 3

        def body_fn(i: Any, x: torch.Tensor) -> tuple[Any, torch.Tensor]:
            return i + 1, x * 2 - 1

        return while_loop(cond_fn, body_fn, (0, x))


def test_while_loop_python_int_carry() -> None:
    results = check_export(CountedLoop(), (torch.randn(3),), opsets=ENDS)
    i, _ = results[0](torch.randn(3))
    assert i == 3


class SizeBoundLoop(torch.nn.Module):
    """The bound is a SymInt (the input's length), read by the condition as an additional input."""

    def forward(self, x: torch.Tensor) -> tuple[Any, torch.Tensor]:
        n = x.shape[0]

        def cond_fn(i: Any, x: torch.Tensor) -> Any:
            return i < n

        def body_fn(i: Any, x: torch.Tensor) -> tuple[Any, torch.Tensor]:
            return i + 1, x.cumsum(0) * 0.5

        return while_loop(cond_fn, body_fn, (0, x))


def test_while_loop_symint_bound() -> None:
    check_export(
        SizeBoundLoop(),
        (torch.randn(4),),
        dynamic_shapes=({0: Dim("n", min=2, max=64)},),
        run_args=[(torch.randn(7),), (torch.randn(2),)],
    )


class SymIntCarry(torch.nn.Module):
    """A carried SymInt that starts from a symbolic size and counts down; the tensor grows each step."""

    def forward(self, x: torch.Tensor) -> tuple[Any, Any, torch.Tensor]:
        def cond_fn(k: Any, total: Any, x: torch.Tensor) -> Any:
            return k > 0

        def body_fn(k: Any, total: Any, x: torch.Tensor) -> tuple[Any, Any, torch.Tensor]:
            return k - 1, total + k * 2, x * k

        return while_loop(cond_fn, body_fn, (x.shape[0], 1, x))


def test_while_loop_symint_carry() -> None:
    results = check_export(
        SymIntCarry(),
        (torch.randn(4),),
        dynamic_shapes=({0: Dim("n", min=2, max=16)},),
        run_args=[(torch.randn(6),), (torch.randn(2),)],
    )
    k, total, _ = results[-1](torch.randn(5))
    assert (k, total) == (0, 1 + 2 * (5 + 4 + 3 + 2 + 1))


class ScanReadsSize(torch.nn.Module):
    """The combine function reads the symbolic length of the scanned input (an outer value)."""

    def forward(self, init: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def combine(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            n = xs.shape[0]
            nxt = carry * 0.5 + x / n
            return nxt, nxt.sin() * xs.shape[1]

        return scan(combine, init, xs)


def test_scan_reads_symbolic_size() -> None:
    check_export(
        ScanReadsSize(),
        (torch.randn(3), torch.randn(5, 3)),
        dynamic_shapes=(None, {0: Dim("n", min=2, max=64)}),
        run_args=[(torch.randn(3), torch.randn(9, 3)), (torch.randn(3), torch.randn(2, 3))],
    )


class ScanOfCond(torch.nn.Module):
    """torch.cond inside the scan body: the branch is taken per slice."""

    def forward(self, init: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def combine(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            nxt = torch.cond(x.sum() > 0, lambda c, v: c + v.exp(), lambda c, v: c * v, (carry, x))
            return nxt, nxt - carry

        return scan(combine, init, xs)


class SharedStart(torch.nn.Module):
    """Two carries evolving differently from one tensor of zeros."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.shared = shared

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        def combine(carry: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> Any:
            a, b = carry
            return (a + x, b * 0.5 + x), a - b

        zeros = torch.zeros_like(xs[0])
        start = (zeros, zeros) if self.shared else (zeros, zeros.clone())
        (a, b), ys = scan(combine, start, xs)
        return a, b, ys


def test_scan_carries_from_one_tensor() -> None:
    xs = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ConversionError, match="carries 0 and 1 from the same tensor"):
        fastonnx.to_onnx(SharedStart(shared=True), (xs,))
    check_export(SharedStart(shared=False), (xs,))  # the fix the error names


def test_cond_nested_in_scan() -> None:
    xs = torch.randn(6, 4)
    xs[::2] = xs[::2].abs()  # both branches are taken
    xs[1::2] = -xs[1::2].abs()
    check_export(
        ScanOfCond(), (torch.randn(4), xs), run_args=[(torch.randn(4), -xs), (torch.randn(4), xs.abs())]
    )


@torch.compiler.nested_compile_region
def _block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w + b) + x


class RepeatedBlocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8) / 3)
        self.b = torch.nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = _block(x, self.w, self.b)
        return x


@pytest.mark.parametrize("strict", [False, True])
def test_invoke_subgraph(strict: bool) -> None:
    # torch.export inlines a region used once per compiled frame; non-strict export compiles each call
    # on its own, so keeping the higher-order op needs inline_single_use_invoke_subgraph=False
    model, x = RepeatedBlocks().eval(), torch.randn(2, 8)
    with torch._dynamo.config.patch(inline_single_use_invoke_subgraph=False):
        ep = torch.export.export(model, (x,), strict=strict)
    calls = [n for n in ep.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 3
    expected = model(x)
    for opset in ENDS:
        result = fastonnx.to_onnx(ep, (x,), opset=opset)
        torch.testing.assert_close(result(x), expected, atol=1e-5, rtol=1e-5)
        assert not any(n.op_type in ("If", "Loop", "Scan") for n in result.model_proto.graph.node)


# ---- symbolic scalars --------------------------------------------------------------------------------
SymFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SYM_CASES: dict[str, SymFn] = {
    "sym_sum": lambda x, y: x.new_ones(torch.sym_sum([x.shape[0], y.shape[0], 2])),
    "sym_sum_float": lambda x, y: x * torch.sym_sum([torch.sym_float(x.shape[0]), y.shape[0], 0.5]),
    "sym_max": lambda x, y: x.new_ones(torch.sym_max(x.shape[0], y.shape[0])),
    "sym_min": lambda x, y: x.new_ones(torch.sym_min(x.shape[0], y.shape[0])),
    "sym_max_float": lambda x, y: x * torch.sym_max(torch.sym_float(x.shape[0]) / 3, y.shape[0] / 4),
    "sym_not": lambda x, y: x * torch.sym_ite(torch.sym_not(x.shape[0] > y.shape[0]), 2.0, 3.0),
    "sym_ite": lambda x, y: x.new_ones(torch.sym_ite(x.shape[0] > y.shape[0], x.shape[0], y.shape[0])),
    "sym_float": lambda x, y: x * torch.sym_float(y.shape[0]),
    "sym_int": lambda x, y: x * torch.sym_int(torch.sym_float(y.shape[0]) * 0.5),
    "sym_sqrt": lambda x, y: x * torch.sym_sqrt(y.shape[0]),
    "abs": lambda x, y: x.new_ones(abs(x.shape[0] - y.shape[0])),
    "round": lambda x, y: x * round(y.shape[0] / 4),
    "lshift": lambda x, y: x.new_ones(y.shape[0] << 1),
    "rshift": lambda x, y: x * (y.shape[0] >> 1),
    "trunc": lambda x, y: x * math.trunc(y.shape[0] / 3),
    "floor": lambda x, y: x * math.floor(y.shape[0] / 3),
    "ceil": lambda x, y: x * math.ceil(y.shape[0] / 3),
    "mod": lambda x, y: x * (y.shape[0] % 3),
    "float_pow": lambda x, y: x * (torch.sym_float(y.shape[0]) ** 0.5),
    "logical_and": lambda x, y: x * torch.sym_ite((x.shape[0] > 2) & (y.shape[0] > 6), 1.0, 2.0),
    "logical_or": lambda x, y: x * torch.sym_ite((x.shape[0] > 8) | (y.shape[0] > 6), 1.0, 2.0),
}
SIZES = [(5, 7), (9, 4), (3, 3), (2, 12), (12, 5)]
DYNAMIC = ({0: Dim("a", min=2, max=64)}, {0: Dim("b", min=2, max=64)})


class Pair(torch.nn.Module):
    """A function of two tensors, with named arguments for dynamic_shapes."""

    def __init__(self, fn: SymFn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fn(x, y)


def _sym_args(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(a), torch.randn(b)


@pytest.mark.parametrize("name", sorted(SYM_CASES))
def test_symbolic_scalar(name: str) -> None:
    check_export(
        Pair(SYM_CASES[name]),
        _sym_args(*SIZES[0]),
        dynamic_shapes=DYNAMIC,
        run_args=[_sym_args(a, b) for a, b in SIZES[1:]],
        atol=1e-6,
        rtol=1e-6,
    )


@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or"])
def test_bitwise_symint(name: str) -> None:
    op = {"bitwise_and": lambda a, b: a & b, "bitwise_or": lambda a, b: a | b}[name]
    model = Pair(lambda x, y: x * op(x.shape[0], y.shape[0]))
    args = _sym_args(*SIZES[0])
    check_export(
        model, args, dynamic_shapes=DYNAMIC, run_args=[_sym_args(a, b) for a, b in SIZES[1:]], opsets=(18, 26)
    )
    ep = torch.export.export(model, args, dynamic_shapes=DYNAMIC, strict=False)
    with pytest.raises(OpsetError, match="needs opset >= 18"):
        fastonnx.to_onnx(ep, args, opset=17)


def test_sym_ops_recorded() -> None:
    """The functions above reach the converters as torch.export records them (not folded away)."""
    ep = torch.export.export(
        Pair(lambda x, y: x * torch.sym_sqrt(torch.sym_sum([x.shape[0], y.shape[0]]))),
        _sym_args(*SIZES[0]),
        dynamic_shapes=DYNAMIC,
        strict=False,
    )
    names = {getattr(n.target, "__name__", "") for n in ep.graph.nodes if n.op == "call_function"}
    assert {"sym_sum", "_sym_sqrt"} <= names
