"""docs/coverage.md's comparison with Hugging Face optimum's ONNX exporter, per task.

optimum's side is docs/data/optimum_onnx_tasks.json (written by scripts/optimum_tasks.py from optimum's
source: it does not install beside transformers 5, so its registrations are counted, not run).
fastonnx's side is what a sweep verified: ``render(verified, swept_tasks)`` gives the markdown lines.
Model types are compared lowercased with "_" read as "-" (transformers spells some with either).

    python scripts/optimum_comparison.py verified.json    # {"text-generation": ["gpt2", ...], ...}
    python scripts/optimum_comparison.py verified.json --swept text-generation,fill-mask
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_JSON = os.path.join(ROOT, "docs", "data", "optimum_onnx_tasks.json")
HEADING = "### Compared with Hugging Face optimum's ONNX exporter"
NOT_SWEPT = "not swept"
SERVED_BY = {"image-to-text": "image-text-to-text"}
"""optimum's tasks that a fastonnx task of another name exports (fastonnx.pretrained.tasks.ALIASES)."""


def load(path: str = DEFAULT_JSON) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def normalize(model_type: str) -> str:
    return model_type.lower().replace("_", "-")


def _names(model_types: list[str] | set[str]) -> dict[str, str]:
    """normalized -> a spelling to show (the first in sorted order, so output is stable)."""
    out: dict[str, str] = {}
    for m in sorted(model_types):
        out.setdefault(normalize(m), m)
    return out


def _listed(names: list[str]) -> str:
    """A count, with the names folded in a <details> so the table row stays short on the page."""
    if not names:
        return "0"
    return f"<details><summary>{len(names)}</summary>{', '.join(names)}</details>"


def _row(label: str, theirs: dict[str, str], ours: dict[str, str] | None) -> str:
    if ours is None:
        cells = [NOT_SWEPT] * 4
    else:
        both = theirs.keys() & ours.keys()
        only_theirs = sorted(theirs[k] for k in theirs.keys() - ours.keys())
        only_ours = sorted(ours[k] for k in ours.keys() - theirs.keys())
        cells = [str(len(ours)), str(len(both)), _listed(only_theirs), _listed(only_ours)]
    return f"| {label} | {len(theirs)} | " + " | ".join(cells) + " |"


def render(
    verified: dict[str, list[str]],
    swept_tasks: list[str],
    data: dict[str, Any] | None = None,
    heading: str | None = HEADING,
) -> list[str]:
    """Markdown lines: one row per task of optimum's or fastonnx's sweep, then totals over model types.

    ``verified``: fastonnx task -> model types that passed verification. ``swept_tasks``: the tasks the
    sweep ran (a task with none verified is 0, a task not run is "not swept"). ``data``: optimum's
    registrations as load() returns them (default: the committed JSON).
    """
    data = load() if data is None else data
    optimum: dict[str, list[str]] = data["tasks"]
    swept = list(dict.fromkeys([*swept_tasks, *verified]))  # a task with verified types was swept
    tasks = swept + sorted(t for t in optimum if t not in swept)

    lines = [heading, ""] if heading else []
    lines += [
        f"Per task: the model types optimum's ONNX exporter registers (read from "
        f"[{data['source']}](https://github.com/{data['source']}) at commit `{data['commit'][:12]}`, "
        f"`{data['file']}`, counted not run, as optimum does not install beside transformers 5; its "
        f"transformers registrations only) against those fastonnx verified in the architecture sweep. "
        f"A registration means optimum has an export config for the pair, not that it was checked. Names "
        f'are compared lowercased with "_" read as "-"; click a count to see the names.',
        "",
        "| task | optimum registers | fastonnx verified | both | only optimum | only fastonnx |",
        "|---|---|---|---|---|---|",
    ]
    for task in tasks:
        theirs = _names(optimum.get(task, []))
        ours = SERVED_BY.get(task, task)
        label = task if ours == task else f"{task} (fastonnx: {ours})"
        lines.append(_row(label, theirs, _names(verified.get(ours, [])) if ours in swept else None))

    all_theirs = _names({m for ms in optimum.values() for m in ms})
    all_ours = _names({m for t in swept for m in verified.get(t, [])})
    swept_theirs = _names({m for t, ms in optimum.items() if SERVED_BY.get(t, t) in swept for m in ms})
    lines.append(_row("**any task** (distinct model types)", all_theirs, all_ours))
    lines.append(_row("**any swept task** (distinct model types)", swept_theirs, all_ours))
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "verified", help='JSON of fastonnx task -> verified model types, e.g. {"fill-mask": ["bert"]}'
    )
    p.add_argument("--swept", help="comma-separated tasks the sweep ran (default: the JSON's keys)")
    p.add_argument(
        "--optimum", default=DEFAULT_JSON, help="optimum's registrations (scripts/optimum_tasks.py)"
    )
    args = p.parse_args(argv)
    with open(args.verified, encoding="utf-8") as f:
        verified: dict[str, list[str]] = json.load(f)
    swept = args.swept.split(",") if args.swept else list(verified)
    print("\n".join(render(verified, swept, data=load(args.optimum))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
