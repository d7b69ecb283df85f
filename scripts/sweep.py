"""The op sweep: every OpInfo op, every sample, at each opset; regenerates docs/coverage.md.

    python scripts/sweep.py                        # full sweep, float32 (hours; resumable)
    python scripts/sweep.py --dtypes float32,float16,int64,bool,bfloat16 --jobs 2
    python scripts/sweep.py --limit 3 --ops add,mul    # a quick look
    python scripts/sweep.py --report                  # rewrite docs/coverage.md from the cache only

Results are cached per op and dtype in .sweep/ (delete it, or pass --fresh, after changing converters).
Samples torch.export cannot capture are counted apart: they are not fastonnx's to fix.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

CACHE = os.path.join(ROOT, ".sweep")
COVERAGE = os.path.join(ROOT, "docs", "coverage.md")
DEFAULT_OPSETS = (17, 18, 21, 23, 26)


def _cache_path(op: str, dtype: str, limit: int | None) -> str:
    suffix = "" if limit is None else f".limit{limit}"
    return os.path.join(CACHE, dtype, op.replace("/", "_") + suffix + ".json")


def sweep_op(
    op_name: str, dtype_name: str, opsets: tuple[int, ...], limit: int | None, commit: str
) -> dict[str, Any]:
    """Runs in a worker process: every sample of one op at one dtype, at the given commit."""
    import warnings

    import torch

    from support import opinfo_harness as h

    warnings.filterwarnings("ignore")
    dtype = getattr(torch, dtype_name)
    op = h.op_db_by_name()[op_name]
    t0 = time.perf_counter()
    record: dict[str, Any] = {
        "op": op_name,
        "dtype": dtype_name,
        "samples": 0,
        "captured": 0,
        "commit": commit,
    }
    per_opset: dict[int, collections.Counter[str]] = {o: collections.Counter() for o in opsets}
    details: dict[str, str] = {}
    try:
        samples = h.samples(op, dtype, limit)
    except Exception as e:
        record["error"] = f"samples: {type(e).__name__}: {e}"[:300]
        samples = []
    for sample in samples:
        record["samples"] += 1
        outcomes = h.check_sample(op_name, op, sample, opsets, dtype)
        if outcomes[0].status in (h.CAPTURE_FAILED, h.EAGER_FAILED):
            details.setdefault(outcomes[0].status, outcomes[0].detail[:300])
            continue
        record["captured"] += 1
        for o in outcomes:
            per_opset[o.opset or 0][o.status] += 1
            if o.status != h.PASS:
                details.setdefault(o.status, o.detail[:300])
    record["per_opset"] = {str(k): dict(v) for k, v in per_opset.items()}
    record["details"] = details
    record["seconds"] = round(time.perf_counter() - t0, 2)
    return record


def load_cached(dtype_names: list[str], limit: int | None) -> list[dict[str, Any]]:
    """Every cached result for these dtypes and this sample limit."""
    suffix = ".json" if limit is None else f".limit{limit}.json"
    records = []
    for dtype_name in dtype_names:
        folder = os.path.join(CACHE, dtype_name)
        for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if f.endswith(suffix) and (limit is not None or ".limit" not in f):
                with open(os.path.join(folder, f)) as fh:
                    records.append(json.load(fh))
    return records


def status_of(rec: dict[str, Any], opsets: tuple[int, ...]) -> str:
    if rec.get("error"):
        return "no samples"
    if rec["captured"] == 0:
        return "not capturable" if rec["samples"] else "no samples"
    passes = [rec["per_opset"].get(str(o), {}).get("pass", 0) for o in opsets]
    if all(p == rec["captured"] for p in passes):
        return "pass"
    statuses: collections.Counter[str] = collections.Counter()
    for o in opsets:
        for s, n in rec["per_opset"].get(str(o), {}).items():
            if s != "pass":
                statuses[s] += n
    return statuses.most_common(1)[0][0] if not any(passes) else "partial"


def _owned_sections() -> list[str]:
    """The marked sections of the current docs/coverage.md, each with its markers."""
    if not os.path.exists(COVERAGE):
        return []
    text = open(COVERAGE).read()
    blocks = []
    for part in text.split("<!-- section:")[1:]:
        name = part.split(" -->", 1)[0]
        end = f"<!-- /section:{name} -->"
        if end in part:
            blocks.append("<!-- section:" + part.split(end, 1)[0] + end)
    return blocks


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _commit() -> str:
    """HEAD, with "+changes" when tracked files differ from it: what each cached result is stamped with."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def write_report(records: list[dict[str, Any]], opsets: tuple[int, ...], limit: int | None) -> str:
    by_dtype: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        if "backward" in r["op"]:
            continue
        by_dtype[r["dtype"]].append(r)
    lines = [
        "# Converter coverage",
        "",
        "Generated by `python scripts/sweep.py` from torch's OpInfo samples; do not edit by hand. Each "
        "sample is exported by torch.export as a one-op module, converted by fastonnx at each opset, run in "
        "onnxruntime (bfloat16: onnx's reference evaluator) and compared with eager PyTorch.",
        "",
        f"Opsets: {', '.join(map(str, opsets))}. Samples per op: {'all' if limit is None else limit}.",
        "",
        # a resumable sweep may span commits: the stamp names every commit a cached result came from
        "Measured at commit "
        + ", ".join(sorted({str(r.get("commit", "unrecorded")) for r in records}))
        + f" (torch {_torch_version()}).",
        "",
        "Statuses: **pass** (every captured sample matches at every opset), **partial**, **no_converter**, "
        "**wrong** (runs, differs from eager), **ort_refused** (onnxruntime could not load or run it), "
        "**conversion_error** (a converter refused the arguments), **not capturable** (torch.export "
        "failed on every sample: not fastonnx's).",
        "",
    ]
    for dtype, recs in sorted(by_dtype.items()):
        recs.sort(key=lambda r: r["op"])
        counts = collections.Counter(status_of(r, opsets) for r in recs)
        captured_ops = [r for r in recs if r["captured"] > 0]
        passing = sum(1 for r in captured_ops if status_of(r, opsets) == "pass")
        share = passing / len(captured_ops) if captured_ops else 0.0
        lines += [
            f"## {dtype}",
            "",
            f"{passing} of {len(captured_ops)} capturable ops pass every sample at every opset ({share:.1%}). "
            + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
            "",
            "| op | samples | captured | "
            + " | ".join(f"pass @{o}" for o in opsets)
            + " | status | first problem |",
            "|---|---|---|" + "---|" * len(opsets) + "---|---|",
        ]
        for r in recs:
            passes = [str(r["per_opset"].get(str(o), {}).get("pass", 0)) for o in opsets]
            status = status_of(r, opsets)
            problem = ""
            if status != "pass":
                d = r.get("details", {})
                problem = next(iter(d.values()), r.get("error", "")) if d or r.get("error") else ""
            problem = problem.replace("|", "\\|").replace("\n", " ")[:160]
            lines.append(
                f"| {r['op']} | {r['samples']} | {r['captured']} | "
                + " | ".join(passes)
                + f" | {status} | {problem} |"
            )
        lines.append("")
    os.makedirs(os.path.dirname(COVERAGE), exist_ok=True)
    text = "\n".join(lines)
    # sections other scripts own (scripts/module_sweep.py: <!-- section:modules -->) are kept as they are
    text = text.rstrip() + "".join(f"\n\n{block}" for block in _owned_sections()) + "\n"
    with open(COVERAGE, "w") as f:
        f.write(text)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--opsets", default=",".join(map(str, DEFAULT_OPSETS)))
    p.add_argument("--ops", default=None, help="comma-separated OpInfo names (default: all)")
    p.add_argument("--limit", type=int, default=None, help="samples per op (default: all)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--fresh", action="store_true", help="ignore cached results")
    p.add_argument("--report", action="store_true", help="only rewrite docs/coverage.md from the cache")
    a = p.parse_args()
    opsets = tuple(int(o) for o in a.opsets.split(","))
    import torch

    from support import opinfo_harness as h

    db = h.op_db_by_name()
    # backward ops are out of scope: torch.export of inference graphs never emits them
    names = a.ops.split(",") if a.ops else sorted(n for n in db if "backward" not in n)
    unknown = [n for n in names if n not in db]
    if unknown:
        sys.exit(f"not OpInfo names: {', '.join(unknown)} (see opinfo_harness.op_db_by_name())")
    cached = 0
    todo: list[tuple[str, str]] = []
    for dtype_name in a.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for name in names:
            if dtype not in db[name].supported_dtypes("cpu"):
                continue
            path = _cache_path(name, dtype_name, a.limit)
            if os.path.exists(path) and not a.fresh:
                cached += 1
            elif not a.report:
                todo.append((name, dtype_name))
    commit = _commit()
    print(f"{cached} cached, {len(todo)} to run at commit {commit}", flush=True)
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        futures = {pool.submit(sweep_op, n, d, opsets, a.limit, commit): (n, d) for n, d in todo}
        for i, fut in enumerate(as_completed(futures)):
            name, dtype_name = futures[fut]
            try:
                rec = fut.result()
            except Exception as e:
                rec = {
                    "op": name,
                    "dtype": dtype_name,
                    "samples": 0,
                    "captured": 0,
                    "error": repr(e)[:300],
                    "per_opset": {},
                    "details": {},
                }
            path = _cache_path(name, dtype_name, a.limit)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(rec, f)
            print(
                f"[{i + 1}/{len(todo)}] {name} {dtype_name}: {status_of(rec, opsets)} ({rec.get('seconds', 0)}s)",
                flush=True,
            )
    # every result is in the cache: the ledger covers every cached op, not only those run now
    write_report(load_cached(a.dtypes.split(","), a.limit), opsets, a.limit)
    print(f"wrote {COVERAGE}")


if __name__ == "__main__":
    main()
