"""Candidates for dynamic-shape capture (issue 33, part 2), measured on a meta-device Llama-3-8B-shaped
model (hidden 4096, GQA 32/8, vocab 128256, intermediate 14336, bf16, ``use_cache=False``) at 2, 8 and
32 layers, input ``input_ids`` of shape (2, 8) with batch and sequence dynamic:

- ``export``: ``torch.export.export`` with ``dynamic_shapes`` (non-strict, the default): the baseline;
- ``make_fx``: the symbolic trace alone — ``make_fx(tracing_mode="symbolic", pre_dispatch=True)`` over
  ``torch.func.functional_call`` under a FakeTensorMode whose ShapeEnv makes only the input's two dims
  symbolic (the weights stay static), without torch.export's other stages (no dynamo-style input
  processing, no constraint solving, no ExportedProgram, no verifier);
- ``export, deferred asserts``: ``prefer_deferred_runtime_asserts_over_guards=True``;
- ``export, no fake cache``: ``torch._dynamo.config.fake_tensor_cache_enabled = False`` (FakeTensor's
  own per-op output cache; rebuilding outputs from it was 32% of an 8-layer profile);
- ``export, strict``: ``strict=True`` (dynamo in front), at the depths given by ``--strict-layers``;
- ``trace, static``: fastonnx's own trace (``capture="trace"``, static shapes): the floor;
- ``export, one layer`` / ``make_fx, one layer``: a single ``LlamaDecoderLayer`` (hidden states
  (2, 8, 4096) and the rotary (cos, sin) (2, 8, 128), batch and sequence dynamic), measured once: what
  capturing one layer costs, the basis of "capture one layer, stamp the others".

    PYTHONPATH=python python benches/dynamic_capture_candidates.py [--layers 2,8,32] [--runs 1]

Each measurement is the first capture in a fresh process (a subprocess per run), timed around the
capture call alone: imports and building the model excluded. Wall and CPU seconds (median over runs; the
machine is shared, CPU is what the capture spent). The graphs of ``make_fx`` and ``export`` are compared
by their multiset of call_function targets (aten ops and symbolic-size ops) and by the output's shape.
Writes the section ``dynamic_capture_candidates`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEPTH_CANDIDATES = (
    "export",
    "make_fx",
    "export, deferred asserts",
    "export, no fake cache",
    "export, strict",
    "trace, static",
)
LAYER_CANDIDATES = ("export, one layer", "make_fx, one layer")


def config(layers: int) -> Any:
    from transformers.utils import logging

    logging.set_verbosity_error()
    from inplace_big import config as llama3_8b  # the same shape as the in-place bench

    return llama3_8b(layers)


def build(candidate: str, layers: int) -> tuple[Any, tuple[Any, ...]]:
    """The module on the meta device and its example inputs."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    cfg = config(layers)
    cfg._attn_implementation = "sdpa"  # as LlamaForCausalLM picks it, for the layer alone too
    if candidate.endswith("one layer"):

        class Layer(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layer = LlamaDecoderLayer(cfg, 0)

            def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
                out: torch.Tensor = self.layer(hidden, position_embeddings=(cos, sin))
                return out

        with torch.device("meta"):
            module = Layer().to(torch.bfloat16).eval()
        hidden = torch.zeros(2, 8, 4096, dtype=torch.bfloat16, device="meta")
        cos = torch.zeros(2, 8, 128, dtype=torch.bfloat16, device="meta")
        return module, (hidden, cos, cos.clone())

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = LlamaForCausalLM(cfg)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = self.model(input_ids=input_ids).logits
            return logits

    with torch.device("meta"):
        module = Logits().to(torch.bfloat16).eval()
    return module, (torch.zeros(2, 8, dtype=torch.int64, device="meta"),)


# Bookkeeping, not computation: export's metadata asserts and grad-mode regions (a higher-order op with
# a submodule in export, two _set_grad_enabled calls in make_fx), left out of the ops compared.
BOOKKEEPING = (
    "aten._assert_tensor_metadata.default",
    "wrap_with_set_grad_enabled",
    "<built-in function _set_grad_enabled>",
    "<built-in function getitem>",
)


def ops(graph: Any) -> dict[str, int]:
    """The call_function targets of the graph and of its submodules (higher-order ops' bodies), counted,
    bookkeeping left out."""
    import torch

    root = graph.owning_module
    graphs = [m.graph for m in root.modules() if isinstance(m, torch.fx.GraphModule)] if root else [graph]
    return dict(
        collections.Counter(
            str(n.target)
            for g in graphs
            for n in g.nodes
            if n.op == "call_function" and str(n.target) not in BOOKKEEPING
        )
    )


def capture_make_fx(module: Any, args: tuple[Any, ...]) -> tuple[Any, str]:
    """The symbolic trace alone: input dims 0 and 1 symbolic, weights static."""
    import torch
    from torch._dynamo.source import LocalSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=False)
    fake_args = tuple(
        mode.from_tensor(
            a,
            source=LocalSource(f"arg{i}"),
            symbolic_context=StatelessSymbolicContext(
                dynamic_sizes=[DimDynamic.DYNAMIC] * 2 + [DimDynamic.STATIC] * (a.dim() - 2)
            ),
        )
        for i, a in enumerate(args)
    )
    state = {
        **{k: mode.from_tensor(v, static_shapes=True) for k, v in module.named_parameters()},
        **{k: mode.from_tensor(v, static_shapes=True) for k, v in module.named_buffers()},
    }

    def run(state: dict[str, Any], *inputs: Any) -> Any:
        return torch.func.functional_call(module, state, inputs)

    with torch.no_grad():
        gm = make_fx(run, tracing_mode="symbolic", pre_dispatch=True)(state, *fake_args)
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    first = out[0] if isinstance(out, (list, tuple)) else out
    return gm.graph, str(tuple(first.meta["val"].shape))


def child(candidate: str, layers: int) -> dict[str, Any]:
    """One capture, in this (fresh) process."""
    import importlib

    import torch
    from torch.export import Dim

    if candidate == "trace, static":
        from fastonnx.api import _heap_set_aside
        from fastonnx.opsets import MAX_OPSET
        from fastonnx.pipeline import stages
        from fastonnx.pipeline.options import ExportOptions
        from fastonnx.registry import FAMILIES, Registry

        for family in FAMILIES:  # the converters' modules: imports, which the trace's check would load
            importlib.import_module(f"fastonnx.converters.{family}")
    module, args = build(candidate, layers)
    names = ["input_ids"] if len(args) == 1 else ["hidden", "cos", "sin"]
    batch, seq = Dim("batch"), Dim("sequence")
    shapes = {n: {0: batch, 1: seq} for n in names}
    kwargs: dict[str, Any] = {}
    if candidate == "export, deferred asserts":
        kwargs["prefer_deferred_runtime_asserts_over_guards"] = True
    if candidate == "export, strict":
        kwargs["strict"] = True
    if candidate == "export, no fake cache":
        torch._dynamo.config.fake_tensor_cache_enabled = False
    shape = ""
    wall, cpu = time.perf_counter(), time.process_time()
    if candidate.startswith("export"):
        graph = torch.export.export(module, args, dynamic_shapes=shapes, **kwargs).graph
    elif candidate.startswith("make_fx"):
        graph, shape = capture_make_fx(module, args)
    else:
        options = ExportOptions(opset=MAX_OPSET, level="default", capture="trace")
        with _heap_set_aside():
            captured = stages.run_capture(module, args, {}, options, Registry())
        if captured.info.path != "trace":
            raise SystemExit(f"captured by {captured.info.path}: {captured.info.trace_refused}")
        graph = captured.ep.graph
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not shape:
        out = [n for n in graph.nodes if n.op == "output"][0].args[0]
        first = out[0] if isinstance(out, (list, tuple)) else out
        shape = str(tuple(first.meta["val"].shape))
    return {"wall": wall, "cpu": cpu, "nodes": len(graph.nodes), "ops": ops(graph), "shape": shape}


def run_child(candidate: str, layers: int) -> dict[str, Any]:
    from ledger import child_json

    return child_json(__file__, candidate, str(layers))


def difference(a: dict[str, int], b: dict[str, int]) -> str:
    """What b has that a has not and the reverse, as '+op xN' / '-op xN'."""
    parts = []
    for op in sorted(set(a) | set(b)):
        d = b.get(op, 0) - a.get(op, 0)
        if d:
            parts.append(f"{'+' if d > 0 else '-'}{op.split('.')[-2] if '.' in op else op} x{abs(d)}")
    return ", ".join(parts) or "same"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="2,8,32")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--candidates", default=";".join(DEPTH_CANDIDATES), help="';'-separated, of the above")
    p.add_argument("--strict-layers", default="2,8", help="depths at which strict=True is measured")
    p.add_argument("--no-layer", action="store_true", help="skip the single-layer captures")
    p.add_argument("--no-ledger", action="store_true", help="print the table only")
    p.add_argument("--child", nargs=2, metavar=("CANDIDATE", "LAYERS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]))))
        return

    from ledger import machine, median, table, write_section

    depths = [int(x) for x in a.layers.split(",")]
    strict_depths = {int(x) for x in a.strict_layers.split(",") if x}
    chosen = [c.strip() for c in a.candidates.split(";") if c.strip() in DEPTH_CANDIDATES]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    failed: set[tuple[int, str]] = set()
    jobs = [
        (layers, c) for layers in depths for c in chosen if c != "export, strict" or layers in strict_depths
    ]
    if not a.no_layer:
        jobs += [(1, c) for c in LAYER_CANDIDATES]
    for run in range(a.runs):
        for layers, candidate in jobs if run % 2 == 0 else reversed(jobs):
            try:
                r = run_child(candidate, layers)
            except RuntimeError as e:  # reported, the other candidates still measured
                print(str(e)[-1500:], flush=True)
                failed.add((layers, candidate))
                continue
            results.setdefault((layers, candidate), []).append(r)
            print(
                f"{layers} layers, run {run + 1}/{a.runs}, {candidate}: {r['wall']:.2f}s wall, "
                f"{r['cpu']:.2f}s CPU, {r['nodes']} nodes, output {r['shape']}",
                flush=True,
            )

    def cell(layers: int, candidate: str) -> str:
        rs = results.get((layers, candidate))
        if not rs:
            return "failed" if (layers, candidate) in failed else "—"
        return f"{median([r['wall'] for r in rs]):.2f} / {median([r['cpu'] for r in rs]):.2f}"

    rows = [[layers, *(cell(layers, c) for c in chosen)] for layers in depths]
    checks = []
    for layers in [*depths, 1]:
        for base, other in (("export", "make_fx"), ("export, one layer", "make_fx, one layer")):
            if (layers, base) in results and (layers, other) in results:
                x, y = results[(layers, base)][0], results[(layers, other)][0]
                checks.append(
                    [
                        "one decoder layer" if layers == 1 else f"{layers} layers",
                        f"{x['nodes']} / {y['nodes']}",
                        f"`{x['shape']}` / `{y['shape']}`",
                        difference(x["ops"], y["ops"]),
                    ]
                )
    single = [
        [c, cell(1, c), f"{results[(1, c)][0]['nodes']}"] for c in LAYER_CANDIDATES if (1, c) in results
    ]
    body = [
        "## Dynamic-shape capture candidates (`dynamic_capture_candidates`)",
        "",
        f"`PYTHONPATH=python python benches/dynamic_capture_candidates.py --layers {a.layers} --runs {a.runs}"
        f" --strict-layers {a.strict_layers}` — {machine()}.",
        "",
        "A meta-device Llama-3-8B-shaped model (hidden 4096, GQA 32/8, vocab 128256, intermediate 14336, bf16, "
        "`use_cache=False`), input `input_ids` (2, 8) with batch and sequence dynamic (except `trace, static`); "
        "each figure the first capture of a fresh process, imports and building the model excluded; seconds, "
        f"median wall / median CPU over {a.runs} run(s). `export`: torch.export, non-strict. `make_fx`: "
        '`make_fx(tracing_mode="symbolic", pre_dispatch=True)` alone, only the input\'s two dims symbolic. '
        "`deferred asserts`: `prefer_deferred_runtime_asserts_over_guards=True`; `no fake cache`: "
        "`torch._dynamo.config.fake_tensor_cache_enabled = False`; `strict`: `strict=True` (— where not "
        "measured); `trace, static`: fastonnx's trace, static shapes (the floor).",
        "",
        table(["layers", *chosen], rows),
        "",
        "Graphs compared (export / make_fx): FX nodes of the top graph, output shape, and the call_function "
        "targets (submodules of higher-order ops included; metadata asserts and grad-mode markers left out) "
        "make_fx has more (+) or fewer (-) of than export.",
        "",
        table(["model", "FX nodes", "output shape", "make_fx against export"], checks),
    ]
    if single:
        body += [
            "",
            "One `LlamaDecoderLayer` alone (hidden states and rotary cos / sin, batch and sequence dynamic), "
            "first capture of a fresh process:",
            "",
            table(["candidate", "seconds (wall / CPU)", "FX nodes"], single),
        ]
    text = "\n".join(body)
    print(text)
    if not a.no_ledger:
        write_section("dynamic_capture_candidates", text)


if __name__ == "__main__":
    main()
