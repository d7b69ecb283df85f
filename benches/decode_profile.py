"""One decode step of a package's decoder, op type by op type, in onnxruntime's profiler.

`python benches/decode_profile.py [LABEL=]PACKAGE [...] --past 2048 --runs 20 [--ledger]`

Each package's `model.onnx` runs a single-token step after a cache of `--past` positions (random values:
the kernels' work does not depend on them), one intra-op and one inter-op thread, `--runs` times after two
warm-ups. A package whose genai_config.json shares the past and present buffers
(`past_present_share_buffer`) is run as onnxruntime-genai runs it: each cache one buffer of the config's
`max_length` positions bound as both the past input and the present output (IOBinding), the attention
mask `--past` + 1 long. The profiler's node events are summed by op type
(and domain), divided by the runs: the table gives ms a step and the share of the step's node time.
The packages are profiled in turns, so that a load change on the shared machine meets them alike.
`--ledger` writes the tables, labelled, to docs/benchmarks.md (section decode_profile).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import ledger

_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def _dim(value: Any, sizes: dict[str, int]) -> int:
    if isinstance(value, int):
        return value
    name = str(value)
    if name in sizes:
        return sizes[name]
    raise SystemExit(f"input dim {name!r}: unknown to this bench (add it to the sizes it knows)")


def shared_length(path: str) -> int | None:
    """The cache buffers' length where genai shares past and present buffers, else None."""
    config_path = Path(path).with_name("genai_config.json")
    if not config_path.exists():
        return None
    search = json.loads(config_path.read_text()).get("search", {})
    return int(search["max_length"]) if search.get("past_present_share_buffer") else None


def step_feeds(
    session: ort.InferenceSession, path: str, past: int, buffer: int | None
) -> dict[str, np.ndarray]:
    """A one-token step at `past` for the input names genai and fastonnx packages use (caches of
    `buffer` positions where they are shared buffers)."""
    sizes = {
        "batch_size": 1,
        "batch": 1,
        "sequence_length": 1,
        "past_sequence_length": past if buffer is None else buffer,
        "total_sequence_length": past + 1,
        "past_sequence_length + 1": past + 1,
    }
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.type not in _TYPES:
            raise SystemExit(f"input {arg.name}: type {arg.type} is not one this bench feeds")
        dtype = _TYPES[arg.type]
        if arg.name.startswith("past_key_values"):
            # the head size of a genai cache is a named dim; read it from the output of the same name
            known = (
                sizes
                if all(isinstance(d, int) or d in sizes for d in arg.shape)
                else {**sizes, "kv_cache_dim": _head_size(path)}
            )
            shape = [_dim(d, known) for d in arg.shape]
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif arg.name == "input_ids":
            feeds[arg.name] = np.array([[17]], dtype=dtype)
        elif arg.name == "attention_mask":
            feeds[arg.name] = np.ones((1, past + 1), dtype=dtype)
        elif arg.name == "position_ids":
            feeds[arg.name] = np.array([[past]], dtype=dtype)
        else:
            raise SystemExit(f"input {arg.name}: not a decoder input this bench knows")
    return feeds


def _head_size(path: str) -> int:
    """genai's named head-size dim (`kv_cache_dim`): its config's decoder head size."""
    config = json.loads(Path(path).with_name("genai_config.json").read_text())
    return int(config["model"]["decoder"]["head_size"])


def bound_step(path: str, past: int, options: ort.SessionOptions) -> tuple[ort.InferenceSession, Any]:
    """A session of ``path`` and its IOBinding of one step at ``past`` (kept alive with its values)."""
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    buffer = shared_length(path)
    feeds = step_feeds(session, path, past, buffer)
    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    for out in session.get_outputs():
        shared = out.name.replace("present.", "past_key_values.", 1)
        if buffer is not None and out.name.startswith("present.") and shared in values:
            binding.bind_ortvalue_output(out.name, values[shared])  # written in place, as genai does
        else:
            binding.bind_output(out.name)
    binding.values = values  # the bound buffers live as long as it
    return session, binding


def one_thread() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return options


def unprofiled_walls(paths: dict[str, str], past: int, runs: int, turns: int) -> dict[str, float]:
    """Median wall ms of a step of each package without the profiler (whose events cost per node), the
    packages' sessions open together and timed in turns of ``runs`` steps."""
    bound = {label: bound_step(path, past, one_thread()) for label, path in paths.items()}
    times: dict[str, list[float]] = {label: [] for label in paths}
    for session, binding in bound.values():
        for _ in range(2):
            session.run_with_iobinding(binding)
    for _ in range(turns):
        for label, (session, binding) in bound.items():
            t = time.perf_counter()
            for _ in range(runs):
                session.run_with_iobinding(binding)
            times[label].append((time.perf_counter() - t) * 1000 / runs)
    return {label: statistics.median(t) for label, t in times.items()}


def profile_once(path: str, past: int, runs: int) -> tuple[dict[str, float], float]:
    """ms a step by op type, and the median wall ms of a step."""
    options = one_thread()
    with tempfile.TemporaryDirectory() as tmp:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session, binding = bound_step(path, past, options)
        for _ in range(2):
            session.run_with_iobinding(binding)
        walls = []
        for _ in range(runs):
            t = time.perf_counter()
            session.run_with_iobinding(binding)
            walls.append((time.perf_counter() - t) * 1000)
        trace = session.end_profiling()
        events = json.loads(Path(trace).read_text())
    per_op: dict[str, float] = collections.defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"] / 1000
    # the warm-ups are profiled too
    return {op: total / (runs + 2) for op, total in per_op.items()}, statistics.median(walls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("packages", nargs="+", help="[LABEL=]package folder (or .onnx file)")
    p.add_argument("--past", type=int, default=2048, help="cached positions before the step")
    p.add_argument("--runs", type=int, default=20, help="profiled steps per turn")
    p.add_argument("--turns", type=int, default=3, help="turns over the packages (medians)")
    p.add_argument("--top", type=int, default=12, help="op types listed per package")
    p.add_argument("--note", default="", help="what the packages are, for the ledger")
    p.add_argument("--ledger", action="store_true", help="write the tables to docs/benchmarks.md")
    args = p.parse_args()
    labelled = [x.split("=", 1) if "=" in x else [x, x] for x in args.packages]
    paths = {label: str(Path(x) / "model.onnx") if Path(x).is_dir() else x for label, x in labelled}
    profiles: dict[str, list[dict[str, float]]] = {x: [] for x in paths}
    walls: dict[str, list[float]] = {x: [] for x in paths}
    load = os.getloadavg()[0]
    for _ in range(args.turns):
        for label, path in paths.items():
            by_type, wall = profile_once(path, args.past, args.runs)
            profiles[label].append(by_type)
            walls[label].append(wall)
    medians = {}
    for label in paths:
        ops = {op for run in profiles[label] for op in run}
        medians[label] = {op: statistics.median(run.get(op, 0.0) for run in profiles[label]) for op in ops}
    ranked = sorted(
        {op for m in medians.values() for op in m},
        key=lambda op: -max(m.get(op, 0) for m in medians.values()),
    )
    rows = [[op, *(f"{medians[label].get(op, 0.0):.2f}" for label in paths)] for op in ranked[: args.top]]
    rows.append(["all nodes", *(f"{sum(medians[label].values()):.2f}" for label in paths)])
    rows.append(["step (wall, profiled)", *(f"{statistics.median(walls[label]):.2f}" for label in paths)])
    plain = unprofiled_walls(paths, args.past, args.runs, 4 * args.turns)
    first = next(iter(paths))
    rows.append(["step (wall, not profiled)", *(f"{plain[label]:.2f}" for label in paths)])
    rows.append([f"not profiled / {first}", *(f"{plain[label] / plain[first]:.3f}x" for label in paths)])
    body = "\n".join(
        [
            "## One decode step, op type by op type (benches/decode_profile.py)",
            "",
            f"`python benches/decode_profile.py {' '.join(args.packages)} --past {args.past} --runs {args.runs} "
            f"--turns {args.turns}`; machine: {ledger.machine()}; load average {load:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end. onnxruntime {ort.__version__}'s profiler, 1 intra-op and 1 "
            f"inter-op thread, one token after a past of {args.past}; ms a step (node time summed by op type, "
            f"medians of {args.turns} turns of {args.runs} steps). Shared cache buffers (genai's "
            "past_present_share_buffer) are bound as genai binds them. The last rows time the same steps "
            f"without the profiler (its events cost per node): medians of {4 * args.turns} turns of "
            f"{args.runs} steps, the sessions open together. " + args.note,
            "",
            ledger.table(["op type", *paths], rows),
        ]
    )
    print(body)
    if args.ledger:
        ledger.write_section("decode_profile", body)


if __name__ == "__main__":
    main()
