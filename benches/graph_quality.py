"""Graph quality against torch.onnx.export(dynamo=True): node count and onnxruntime latency.

Both exporters convert the same ExportedProgram at the same opset (each model at each of --opsets), with their optimizers on (ours at
optimize=True, the standard-ONNX level). Nodes are counted after inlining local functions, subgraphs
included. Latency: one onnxruntime thread, the models alternated (each run starting with the next one),
median of --runs runs each.
Regenerates its section of docs/benchmarks.md.

    python benches/graph_quality.py                 # every model
    python benches/graph_quality.py --models llama,bert --runs 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnxruntime
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import fastonnx
import ledger
from support.model_zoo import Field

# 20: the opset most deployments pin; 23: where ONNX gained Attention, RMSNormalization and
# RotaryEmbedding, which both exporters then use at their standard level
OPSETS = (20, 23)


def _text_inputs(vocab: int, seq: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (1, seq), generator=g), torch.ones(1, seq, dtype=torch.int64)


def llama(layers: int, hidden: int) -> tuple[torch.nn.Module, tuple]:
    """The same Llama configs as benches/compare.py."""
    from compare import llama as build

    torch.manual_seed(0)
    return Field(build(layers, hidden), "logits"), _text_inputs(32000)


def bert() -> tuple[torch.nn.Module, tuple]:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )
    torch.manual_seed(0)
    return Field(BertModel(cfg).eval(), "last_hidden_state"), _text_inputs(30522)


class Pixels(torch.nn.Module):
    def __init__(self, m: torch.nn.Module, field: str | None) -> None:
        super().__init__()
        self.m, self.field = m, field

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.m(pixel_values)
        return getattr(out, self.field) if self.field else out


def vit() -> tuple[torch.nn.Module, tuple]:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        image_size=96,
        patch_size=16,
    )
    torch.manual_seed(0)
    return Pixels(ViTModel(cfg).eval(), "last_hidden_state"), (torch.randn(1, 3, 96, 96),)


def resnet50() -> tuple[torch.nn.Module, tuple]:
    import torchvision

    from support.model_zoo import with_random_batchnorm_stats

    torch.manual_seed(0)
    model = with_random_batchnorm_stats(torchvision.models.resnet50(weights=None)).eval()
    return Pixels(model, None), (torch.randn(1, 3, 128, 128),)


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple]]] = {
    "llama 2x256": lambda: llama(2, 256),
    "bert 4x256": bert,
    "vit 4x256": vit,
    "resnet50": resnet50,
    "llama 16x1024": lambda: llama(16, 1024),
}


def count_nodes(model: onnx.ModelProto) -> int:
    model = onnx.inliner.inline_local_functions(model)

    def walk(graph: onnx.GraphProto) -> int:
        n = 0
        for node in graph.node:
            n += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n += walk(a.g)
                for g in a.graphs:
                    n += walk(g)
        return n

    return walk(model.graph)


def session(path: str) -> onnxruntime.InferenceSession:
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def feeds_for(sess: onnxruntime.InferenceSession, args: tuple) -> dict[str, np.ndarray]:
    return {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}


def measure(name: str, opset: int, runs: int, folder: str) -> dict[str, Any]:
    model, args = MODELS[name]()
    ep = torch.export.export(model, args, strict=False)
    ours = os.path.join(folder, "ours.onnx")
    theirs = os.path.join(folder, "theirs.onnx")
    ours_ort = os.path.join(folder, "ours_ort.onnx")
    fastonnx.to_onnx(ep, args, opset=opset, filename=ours, external_data=True)
    fastonnx.to_onnx(ep, args, opset=opset, filename=ours_ort, external_data=True, optimize="onnxruntime")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            ep, args, dynamo=True, optimize=True, opset_version=opset, external_data=True
        )
        program.save(theirs, external_data=True)
    n_ours = count_nodes(onnx.load(ours, load_external_data=False))
    n_theirs = count_nodes(onnx.load(theirs, load_external_data=False))
    sessions = [session(p) for p in (ours, theirs, ours_ort)]
    feeds = [feeds_for(s, args) for s in sessions]
    with torch.no_grad():
        expected = model(*args).numpy()
    for sess, f in ((sessions[0], feeds[0]), (sessions[2], feeds[2])):
        (got,) = sess.run(None, f)
        np.testing.assert_allclose(got, expected, atol=1e-3, rtol=1e-3)
    for _ in range(3):  # warm-up
        for sess, f in zip(sessions, feeds):
            sess.run(None, f)
    times: list[list[float]] = [[], [], []]
    for r in range(runs):
        # each run starts with the next model: none always runs first, on the caches the others left
        order = [(r + k) % len(sessions) for k in range(len(sessions))]
        for k in order:
            t0 = time.perf_counter()
            sessions[k].run(None, feeds[k])
            times[k].append(time.perf_counter() - t0)
    return {
        "name": name,
        "opset": opset,
        "nodes": (n_ours, n_theirs),
        "latency": tuple(ledger.median(t) for t in times),
    }


def report(rows: list[dict[str, Any]], runs: int, opsets: list[int]) -> str:
    body = []
    for r in rows:
        (no, nt), (lo, lt, lr) = r["nodes"], r["latency"]
        body.append(
            [
                r["name"],
                r["opset"],
                no,
                nt,
                f"{no / nt:.2f}",
                f"{lo * 1e3:.2f}",
                f"{lt * 1e3:.2f}",
                f"{lo / lt:.2f}",
                f"{lr * 1e3:.2f}",
                f"{lr / lt:.2f}",
            ]
        )
    return "\n".join(
        [
            "## Graph quality (benches/graph_quality.py)",
            "",
            f"Machine: {ledger.machine()}. Each model at opsets {', '.join(map(str, opsets))}: fastonnx optimize=True vs torch.onnx.export(dynamo=True, "
            f"optimize=True). Nodes after inlining local functions, subgraphs included. Latency: onnxruntime, "
            f"1 thread, median of {runs} alternated runs. The last two columns: fastonnx at "
            'optimize="onnxruntime" (contrib operators), same opset.',
            "",
            ledger.table(
                [
                    "model",
                    "opset",
                    "nodes fastonnx",
                    "nodes official",
                    "ratio",
                    "ms fastonnx",
                    "ms official",
                    "latency ratio",
                    "ms fastonnx ort-level",
                    "ort-level latency ratio",
                ],
                body,
            ),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--opsets", default=",".join(map(str, OPSETS)))
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastonnx-quality-") as folder:
        opsets = [int(o) for o in a.opsets.split(",")]
        for name in a.models.split(","):
            for opset in opsets:
                print(f"{name}, opset {opset} ...", flush=True)
                rows.append(measure(name, opset, a.runs, folder))
                print(f"  nodes {rows[-1]['nodes']}, latency {rows[-1]['latency']}", flush=True)
    text = report(rows, a.runs, opsets)
    ledger.write_section("graph_quality", text)
    print(text)


if __name__ == "__main__":
    main()
