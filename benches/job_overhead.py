"""What a one-model export job pays beyond torch.export and the disk, measured as the job runs.

Each model runs in a fresh process (imports done, model built, then timed): torch.export, W (one plain
write() of the same weight bytes into the same folder, no fsync), the first ``to_onnx`` of the process
to a file, and a second one. The overhead is (first - W) / export: what fastonnx adds on top of the
capture and the unavoidable write. The target is at most 10% on every model. Figures are medians over
--runs fresh processes. fastonnx's modules are byte-compiled first, as a wheel install does.

    python benches/job_overhead.py                       # every model, 2 processes each
    python benches/job_overhead.py --models llama,bert,resnet18 --runs 3
    python benches/job_overhead.py --no-ledger           # print only
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

# torchvision classifiers of the vision suite, with the input side the tests use
TORCHVISION = {
    "resnet18": 64,
    "mobilenet_v3_small": 64,
    "efficientnet_b0": 64,
    "densenet121": 64,
    "convnext_tiny": 64,
    "swin_t": 64,
    "vit_b_16": 32,
}
LADDER = ("2x256", "16x256")


def _builders() -> dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]]:
    import torch

    from support.model_zoo import TRANSFORMERS_MODELS, Logits

    def tv(name: str) -> tuple[Any, tuple[Any, ...]]:
        import torchvision

        kwargs: dict[str, Any] = {"image_size": TORCHVISION[name]} if name.startswith("vit") else {}
        model = torchvision.models.get_model(name, weights=None, **kwargs).eval()
        side = TORCHVISION[name]
        return model, (torch.randn(1, 3, side, side),)

    def rung(spec: str) -> tuple[Any, tuple[Any, ...]]:
        from compare import llama

        layers, hidden = (int(v) for v in spec.split("x"))
        ids = torch.randint(0, 32000, (2, 32))
        return Logits(llama(layers, hidden)), (ids, torch.ones(2, 32, dtype=torch.int64))

    out: dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]] = dict(TRANSFORMERS_MODELS)
    out.update({f"tv_{n}": (lambda n=n: tv(n)) for n in TORCHVISION})
    out.update({f"llama_{r}": (lambda r=r: rung(r)) for r in LADDER})
    return out


def worker(name: str) -> None:
    """One job: build, export, W, first and second to_onnx; prints one JSON line."""
    import torch

    import fastonnx

    model, args = _builders()[name]()
    model = model.eval()
    with tempfile.TemporaryDirectory(dir=ROOT) as folder:
        t0 = time.perf_counter()
        ep = torch.export.export(model, args, strict=False)
        export = time.perf_counter() - t0

        plain = os.path.join(folder, "plain.bin")
        t0 = time.perf_counter()
        with open(plain, "wb") as f:
            for t in ep.state_dict.values():
                f.write(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        write = time.perf_counter() - t0
        os.remove(plain)

        times = []
        for i in range(2):
            path = os.path.join(folder, f"model{i}.onnx")
            t0 = time.perf_counter()
            result = fastonnx.to_onnx(ep, args, filename=path)
            times.append(time.perf_counter() - t0)
            stats = result.stats
            del result
    print(
        json.dumps(
            {
                "name": name,
                "export": export,
                "write": write,
                "first": times[0],
                "second": times[1],
                "functionalized": stats.get("functionalized"),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--runs", type=int, default=2, help="fresh processes per model")
    parser.add_argument("--no-ledger", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return

    names = args.models.split(",") if args.models else sorted(_builders())
    compileall.compile_dir(os.path.join(ROOT, "python", "fastonnx"), quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    rows = []
    for name in names:
        runs = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--worker", name], capture_output=True, text=True, env=env
            )
            if out.returncode != 0:
                print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                break
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        if not runs:
            continue

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        overhead = (med("first") - med("write")) / med("export")
        row = (
            name,
            f"{med('export'):.3f}",
            f"{med('write'):.3f}",
            f"{med('first'):.3f}",
            f"{med('second'):.3f}",
            f"{100 * overhead:.1f}%",
            "yes" if runs[0]["functionalized"] else "",
        )
        rows.append(row)
        print(" | ".join(row), flush=True)

    if not args.no_ledger and rows:
        import ledger

        over = [r for r in rows if float(r[5].rstrip("%")) > 10.0]
        body = "\n".join(
            [
                "## One-model export jobs: overhead beyond torch.export and the disk",
                "",
                f"`python benches/job_overhead.py --runs {args.runs}`; {ledger.machine()}.",
                "Each figure is the median over fresh processes (imports and model construction not timed).",
                "overhead = (first to_onnx - W) / export, W = a plain write of the same weights; target <= 10%.",
                "functionalized: the graph writes through views and fastonnx re-traced it with",
                "`run_decompositions({})`.",
                "",
                ledger.table(
                    [
                        "model",
                        "export s",
                        "W s",
                        "first to_onnx s",
                        "second to_onnx s",
                        "overhead",
                        "functionalized",
                    ],
                    rows,
                ),
                "",
                f"Models over the 10% target: {', '.join(r[0] for r in over) if over else 'none'}.",
            ]
        )
        ledger.write_section("job_overhead", body)


if __name__ == "__main__":
    main()
