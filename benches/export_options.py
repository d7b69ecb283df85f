"""torch.export settings that might skip work for a static-shape ONNX export: time and equivalence.

Each variant runs in a fresh process (model built first, not timed): torch.export.export(strict=False)
under the variant, then fastonnx.to_onnx of the program, checked in onnxruntime against eager PyTorch.
Equivalence is judged on the captured graph itself: the sequence of (op, target) of its nodes must be
the same as the baseline's, and the ONNX output must match eager. Variants:

- ``no_grad``: capture under ``torch.no_grad()`` (no autograd bookkeeping on the fake tensors);
- ``no_stack``: ``torch.fx.config.do_not_emit_stack_traces`` (no ``stack_trace`` in the
  node metadata, which fastonnx's diagnostics and metadata use: never a candidate for the default).

    python benches/export_options.py --models llama,resnet18 --runs 2
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

VARIANTS = ("baseline", "no_grad", "no_stack", "no_grad+no_stack")


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    import torch
    import torch.fx.config as fx_config

    with contextlib.ExitStack() as stack:
        if "no_grad" in name:
            stack.enter_context(torch.no_grad())
        if "no_stack" in name:
            # a plain module attribute (no config.patch): set and restore it by hand
            saved = fx_config.do_not_emit_stack_traces
            fx_config.do_not_emit_stack_traces = True
            stack.callback(setattr, fx_config, "do_not_emit_stack_traces", saved)
        yield


def worker(model_name: str, name: str) -> None:
    import numpy as np
    import onnxruntime
    import torch

    import fastonnx
    from end_to_end import _builders

    model, args = _builders()[model_name]()
    model = model.eval()
    with torch.no_grad():
        expected = model(*args)
    t0 = time.perf_counter()
    with variant(name):
        ep = torch.export.export(model, args, strict=False)
    export = time.perf_counter() - t0
    signature = hashlib.sha1(repr([(n.op, str(n.target)) for n in ep.graph.nodes]).encode()).hexdigest()
    stacks = sum(1 for n in ep.graph.nodes if n.meta.get("stack_trace"))
    with tempfile.TemporaryDirectory(dir=ROOT) as folder:
        path = os.path.join(folder, "m.onnx")
        fastonnx.to_onnx(ep, args, filename=path)
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
        got = torch.from_numpy(np.asarray(session.run(None, feeds)[0]))
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
    print(json.dumps({"export": export, "signature": signature[:12], "stack_traces": stacks}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--models", default="llama,resnet18")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--no-ledger", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    rows: list[tuple[str, ...]] = []
    for model in args.models.split(","):
        results: dict[str, list[dict[str, object]]] = {v: [] for v in VARIANTS}
        for _ in range(args.runs):
            for v in VARIANTS:  # alternated
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", model, v], capture_output=True, text=True
                )
                if out.returncode != 0:
                    print(f"{model} / {v}: failed\n{out.stderr[-1500:]}", file=sys.stderr)
                    continue
                results[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
        base = results["baseline"][0]["signature"] if results["baseline"] else None
        for v, runs in results.items():
            if not runs:
                continue
            med = statistics.median(float(str(r["export"])) for r in runs)
            same = "same graph" if runs[0]["signature"] == base else "DIFFERENT graph"
            row = (model, v, f"{med:.2f}", same, str(runs[0]["stack_traces"]))
            rows.append(row)
            print(" | ".join(row), flush=True)
    if not args.no_ledger and rows:
        import ledger

        body = "\n".join(
            [
                "## torch.export settings for a static-shape export: time and captured graph",
                "",
                f"`python benches/export_options.py --models {args.models} --runs {args.runs}`; "
                f"{ledger.machine()}.",
                "torch.export.export(strict=False) in a fresh process per run (model built first), median;",
                "same graph = the same sequence of (op, target) as the baseline's capture. Every variant's",
                "ONNX file (fastonnx.to_onnx of that program) matched eager PyTorch in onnxruntime.",
                "no_grad: capture under torch.no_grad(); no_stack: torch.fx.config.do_not_emit_stack_traces",
                "(drops the stack_trace metadata). Neither is fastonnx's default.",
                "",
                ledger.table(["model", "variant", "export s", "graph", "nodes with stack_trace"], rows),
            ]
        )
        ledger.write_section("export_options", body)


if __name__ == "__main__":
    main()
