"""The write stage of two builds of fastonnx, alternated on the same machine: a writer change's before/after.

The write stage's share of the Llama ladder (benches/compare.py) moves with the disk and the page cache as
much as with the code, so a writer change is judged here by running the old and the new build in turn, each
in a fresh process that exports the same seeded Llama rung and writes it with external data, next to W (one
plain write() of the same bytes). Build a checkout's extension first, e.g. for the commit before a change:

    git worktree add /tmp/before <commit> && cd /tmp/before \\
        && cargo build --release -p fastonnx-python --features pyo3/abi3-py311 \\
        && cp target/release/lib_core.so python/fastonnx/_core.abi3.so
    python benches/write_stage.py --before /tmp/before/python --rung 16x1024 --rounds 5

Each round runs both builds (their order alternating) and each process writes ``--writes`` times. The
section "write_stage" of docs/benchmarks.md gets the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ledger

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = """
import json, os, sys, tempfile
sys.path.insert(0, {benches!r}); sys.path.insert(0, {tests!r})
import torch
import compare
import fastonnx
layers, hidden = {layers}, {hidden}
torch.manual_seed(0)
model = compare.llama(layers, hidden)
args = (torch.randint(0, 32000, (2, 32)), torch.ones(2, 32, dtype=torch.int64))
ep = torch.export.export(compare.Logits(model), args, strict=False)
folder = tempfile.mkdtemp(dir={folder!r})
rows = []
for _ in range({writes}):
    path = os.path.join(folder, "m.onnx")
    compare.settle()
    r = fastonnx.to_onnx(ep, args, filename=path, external_data=True)
    rows.append({{"write": r.stats["write_s"], "W": compare.plain_write(model, folder)}})
    del r
    os.remove(path)
    os.remove(path + ".data")
os.rmdir(folder)
print("ROWS " + json.dumps({{"module": fastonnx.__file__, "rows": rows}}))
"""


def run_build(python_dir: str, rung: str, writes: int, folder: str) -> dict[str, Any]:
    layers, hidden = (int(v) for v in rung.split("x"))
    code = CHILD.format(
        benches=HERE,
        tests=os.path.join(os.path.dirname(HERE), "tests"),
        layers=layers,
        hidden=hidden,
        folder=folder,
        writes=writes,
    )
    env = {**os.environ, "PYTHONPATH": python_dir}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("ROWS ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"the build in {python_dir} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(line[5:])
    if not os.path.realpath(result["module"]).startswith(os.path.realpath(python_dir)):
        raise SystemExit(f"{python_dir} did not provide fastonnx (imported {result['module']})")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the python/ folder of the build to compare against")
    p.add_argument("--before-label", default="before", help="how the section names that build")
    p.add_argument("--after", default=os.path.join(os.path.dirname(HERE), "python"))
    p.add_argument("--rung", action="append", help="LAYERSxHIDDEN (repeatable; default 16x1024)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--writes", type=int, default=2, help="writes per process")
    a = p.parse_args()
    rungs = a.rung or ["16x1024"]
    builds = {a.before_label: a.before, "this commit": a.after}
    rows = []
    for rung in rungs:
        samples: dict[str, dict[str, list[float]]] = {k: {"write": [], "W": []} for k in builds}
        for i in range(a.rounds):
            order = list(builds) if i % 2 == 0 else list(reversed(builds))
            for label in order:
                folder = tempfile.mkdtemp(prefix="fastonnx-write-stage-")
                try:
                    got = run_build(builds[label], rung, a.writes, folder)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)  # nothing of a failed run stays on the disk
                for r in got["rows"]:
                    samples[label]["write"].append(r["write"])
                    samples[label]["W"].append(r["W"])
                print(f"{rung} round {i + 1}/{a.rounds} {label}: {got['rows']}", flush=True)
        medians = {k: {m: ledger.median(v) for m, v in s.items()} for k, s in samples.items()}
        before, after = medians[a.before_label], medians["this commit"]
        rows.append(
            [
                rung,
                f"{before['write']:.2f} / {before['W']:.2f}",
                f"{after['write']:.2f} / {after['W']:.2f}",
                f"{after['write'] / before['write']:.2f}",
                f"{min(samples[a.before_label]['write']):.2f} / {min(samples['this commit']['write']):.2f}",
            ]
        )
    text = "\n".join(
        [
            "## Write stage, two builds alternated (benches/write_stage.py)",
            "",
            f"Machine: {ledger.machine()}. {a.rounds} rounds, each running both builds in a fresh process "
            f"(order alternating) that writes {a.writes} times: medians over {a.rounds * a.writes} writes. "
            f"Compared against: {a.before_label}. W = one plain write() of the same bytes in the same process.",
            "",
            ledger.table(
                [
                    "layers x hidden",
                    f"{a.before_label}: write / W s",
                    "this commit: write / W s",
                    "write, this / before",
                    "fastest write before / this s",
                ],
                rows,
            ),
        ]
    )
    ledger.write_section("write_stage", text)
    print(text)


if __name__ == "__main__":
    main()
