"""Writes the "backward" section of docs/coverage.md: training under torch.compile(backend="fastonnx")
module by module. Each module runs forward + backward compiled and eagerly; the ledger says whether its
backward graph ran in onnxruntime or fell back to eager (naming the ops without converters), which
aten ops the backward graph held after the training decomposition table, and whether the input and
parameter gradients match eager (atol 1e-5, rtol 1e-4).

    python scripts/backward_coverage.py
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COVERAGE = os.path.join(ROOT, "docs", "coverage.md")
SECTION = "backward"


class Attention(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.reshape(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        out: torch.Tensor = torch.nn.functional.scaled_dot_product_attention(
            q, q * 0.5, q.tanh(), is_causal=True
        )
        return out


class RMSNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(x)
        return out


def _seq() -> torch.Tensor:
    return torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))


def _image() -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


MODULES: dict[str, Callable[[], tuple[torch.nn.Module, torch.Tensor]]] = {
    "Linear + ReLU": lambda: (torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), _seq()),
    "GELU": lambda: (torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()), _seq()),
    "GELU tanh": lambda: (torch.nn.GELU(approximate="tanh"), _seq()),
    "SiLU": lambda: (torch.nn.SiLU(), _seq()),
    "Tanh / Sigmoid": lambda: (torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Sigmoid()), _seq()),
    "Softmax": lambda: (torch.nn.Softmax(-1), _seq()),
    "LogSoftmax": lambda: (torch.nn.LogSoftmax(-1), _seq()),
    "LayerNorm": lambda: (torch.nn.LayerNorm(8), _seq()),
    "RMSNorm": lambda: (RMSNorm(), _seq()),
    "scaled_dot_product_attention (causal)": lambda: (Attention(), _seq()),
    "Embedding": lambda: (torch.nn.Embedding(10, 8), torch.tensor([[1, 2, 1, 7], [3, 3, 0, 9]])),
    "Conv2d": lambda: (torch.nn.Conv2d(3, 4, 3, padding=1), _image()),
    "BatchNorm2d (training)": lambda: (torch.nn.BatchNorm2d(3), _image()),
    "MaxPool2d": lambda: (torch.nn.MaxPool2d(2), _image()),
    "AvgPool2d": lambda: (torch.nn.AvgPool2d(2), _image()),
    "AdaptiveAvgPool2d": lambda: (torch.nn.AdaptiveAvgPool2d(1), _image()),
}


def check(name: str) -> dict[str, Any]:
    import fastonnx

    torch._dynamo.reset()
    model, x = MODULES[name]()
    eager = copy.deepcopy(model)
    backend = fastonnx.backend()
    seen: list[str] = []
    compile_graph = backend.compile_graph

    def record(gm: torch.fx.GraphModule, inputs: Any, graph: str) -> Any:
        if graph.endswith("backward"):
            seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return compile_graph(gm, inputs, graph)

    backend.compile_graph = record  # type: ignore[method-assign,assignment]
    xs = [x.clone().requires_grad_(x.is_floating_point()) for _ in range(2)]
    weight = torch.randn(model(xs[0]).shape, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (torch.compile(model, backend=backend)(xs[0]) * weight).sum().backward()
    (eager(xs[1]) * weight).sum().backward()
    grads = [(xs[0].grad, xs[1].grad)] + [
        (p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters(), strict=True)
    ]
    match = True
    for got, expected in grads:
        if expected is None:
            continue
        try:
            assert got is not None
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
        except AssertionError:
            match = False
    backward = [s for s in backend.stats if s.name.endswith("backward")]
    ops = sorted({o.removeprefix("aten.").removesuffix(".default") for o in seen if "getitem" not in o})
    if not backward:
        where = "no backward graph"
    elif any(s.fell_back for s in backward):
        where = "eager: " + ", ".join(m for s in backward for m in s.missing_ops or [s.reason])
    else:
        where = "onnxruntime"
    return {"name": name, "where": where, "match": match, "ops": ops}


def render(records: list[dict[str, Any]]) -> str:
    import fastonnx

    sys.path.insert(0, os.path.join(ROOT, "benches"))
    import ledger  # type: ignore[import-not-found]

    ran = sum(r["where"] == "onnxruntime" for r in records)
    lines = [
        "## Backward (training under torch.compile)",
        "",
        "Generated by `python scripts/backward_coverage.py` "
        f"(fastonnx {fastonnx.__version__}; {ledger.machine()}). Each module runs forward + backward "
        'under `torch.compile(backend="fastonnx")` (training decomposition table: core ATen except CPU '
        "flash attention) and eagerly; gradients of the input and the parameters are compared "
        "(atol 1e-5, rtol 1e-4). A backward graph with an op without converter runs in eager PyTorch.",
        "",
        f"{ran} of {len(records)} modules run their backward in onnxruntime.",
        "",
        "| module | backward runs in | gradients match eager | aten ops of the backward graph |",
        "|---|---|---|---|",
    ]
    for r in records:
        ops = ", ".join(r["ops"]).replace("|", "\\|")
        lines.append(f"| {r['name']} | {r['where']} | {'yes' if r['match'] else '**no**'} | {ops} |")
    return "\n".join(lines)


def main() -> None:
    records = []
    for name in MODULES:
        record = check(name)
        print(record, flush=True)
        records.append(record)
    sys.path.insert(0, os.path.join(ROOT, "benches"))
    import ledger

    ledger.write_section(SECTION, render(records), path=COVERAGE, header="# Converter coverage\n")


if __name__ == "__main__":
    main()
