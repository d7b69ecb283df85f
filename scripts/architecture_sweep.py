"""The architecture sweep (issue 32, part 5): every architecture of the pinned transformers in the
causal-LM, masked-LM, sequence-classification and image-classification auto-mappings, built from a tiny
config with random weights, saved with ``save_pretrained`` (and a tiny tokenizer for text tasks) to a
temporary folder, then exported by the ``fastonnx export`` command with verification on (the package run
in onnxruntime against transformers eager). Writes the "transformers architectures" section of
docs/coverage.md (between its markers; scripts/sweep.py keeps the section when it rewrites the rest),
stamped with the commit, after each architecture: an interrupted run leaves an honest partial section.

    python scripts/architecture_sweep.py                          # every task, rewrite the section
    python scripts/architecture_sweep.py --tasks text-generation  # one task (the others listed as not run)
    python scripts/architecture_sweep.py --only llama,bert        # these model types (prints, no write)
    python scripts/architecture_sweep.py --limit 10               # the first 10 of each task (no write)

Each architecture runs in a worker process (imports paid once per worker) with a timeout; a worker that
crashes or times out is replaced. Every folder written is deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing as mp
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COVERAGE = os.path.join(ROOT, "docs", "coverage.md")
SECTION = "transformers-architectures"

# task -> the transformers.models.auto.modeling_auto mapping listing its architectures
TASKS = {
    "text-generation": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "fill-mask": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "text-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
VOCAB = 128
MAX_PARAMS = 20_000_000  # a tiny config still above this: the shrinking missed a size of the architecture

# config keys set where the architecture's config has them (a key absent from its defaults is left out)
_SIZES: dict[str, Any] = {
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "n_layers",
            "num_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
        ),
        2,
    ),
    **dict.fromkeys(("hidden_size", "n_embd", "n_embed", "d_model", "dim", "model_dim"), 64),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
        ),
        4,
    ),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("head_dim", "kv_channels", "d_kv", "d_head", "attention_head_dim"), 16),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "n_inner",
            "d_ff",
            "hidden_dim",
            "ffn_hidden_size",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "expert_intermediate_size",
        ),
        128,
    ),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"), 128),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_k", "top_k"), 2),
    **dict.fromkeys(("n_group", "topk_group"), 1),
    "vocab_size": VOCAB,
    "embedding_size": 32,
    "word_embed_proj_dim": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "num_labels": 3,
    # vision
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
}
_VISION_LISTS = {
    "num_attention_heads": 1,
    "depths": 1,
    "hidden_sizes": None,
    "num_heads": 2,
    "embed_dim": None,
    "embed_dims": None,
}


def _shrunk(defaults: dict[str, Any], vision: bool) -> dict[str, Any]:
    """Overrides making a config of these defaults tiny (recursing into sub-configs)."""
    out: dict[str, Any] = {}
    layers = next(
        (v for k in ("num_hidden_layers", "n_layer", "num_layers") if isinstance(v := defaults.get(k), int)),
        None,
    )
    for key, value in defaults.items():
        if isinstance(value, dict) and key.endswith("_config"):
            out[key] = {**value, **_shrunk(value, vision)}
        elif key == "num_experts_per_tok" and value is None:
            out[key] = _SIZES[key]
        elif key == "rotary_dim" and isinstance(value, int):
            out[key] = 8  # partial rotary within the 16-wide heads (GPT-J, CodeGen)
        elif key in _SIZES and isinstance(value, int) and not isinstance(value, bool):
            out[key] = _SIZES[key]
            if key == "patch_size" and value < 8:
                # hierarchical vision models (Swin...) keep their small patches, on larger images
                out[key], out["image_size"] = value, 16 * value
        elif key == "window_size" and isinstance(value, int) and vision:
            out[key] = 2  # windows that the last stage's resolution still holds
        elif key in _VISION_LISTS and isinstance(value, list) and value and isinstance(value[0], int):
            fixed = _VISION_LISTS[key]
            out[key] = [fixed] * len(value) if fixed else [16 * 2**i for i in range(len(value))]
        elif key in _VISION_LISTS and key == "embed_dim" and isinstance(value, int):
            out[key] = 32 if vision else 64
        elif (
            isinstance(value, list) and layers is not None and layers > 2 and len(value) == layers
        ):  # per-layer lists (layer_types...) follow the layer count, keeping one layer of each kind
            kinds = list(dict.fromkeys(v for v in value if isinstance(v, str)))
            out[key] = (kinds + value[:2])[:2] if len(kinds) > 1 else value[:2]
    # hybrid models (Jamba, Bamba...): one attention layer among the two
    for key, value in (("attn_layer_period", 2), ("attn_layer_offset", 1), ("expert_layer_period", 2)):
        if isinstance(defaults.get(key), int):
            out[key] = value
    if isinstance(defaults.get("expert_layer_offset"), int):
        out["expert_layer_offset"] = 1
    if isinstance(defaults.get("attn_layer_indices"), list):
        out["attn_layer_indices"] = [1]
    if isinstance(defaults.get("qk_rope_head_dim"), int):  # multi-head latent attention (DeepSeek)
        out.update(qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=32)
        out.update({k: 4 for k in ("num_key_value_heads",) if k in defaults})
        out.update({k: 8 for k in ("head_dim",) if k in defaults})
        if isinstance(defaults.get("q_lora_rank"), int):
            out["q_lora_rank"] = 32
    return out


def tiny_config(model_type: str) -> Any:
    """The architecture's config at tiny sizes; raises where it cannot be built."""
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type).to_dict()
    vision = "image_size" in defaults or any(
        isinstance(v, dict) and "image_size" in v for v in defaults.values()
    )
    overrides = {k: v for k, v in _shrunk(defaults, vision).items() if k != "model_type"}
    if not vision:  # the special tokens inside the tiny vocabulary (a classifier needs its pad token)
        overrides.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return AutoConfig.for_model(model_type, **overrides)


def _save_tokenizer(folder: pathlib.Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    inner = Tokenizer(models.WordLevel(words, unk_token="t3"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3"
    ).save_pretrained(folder)


def build_checkpoint(task: str, model_type: str, class_name: str, folder: pathlib.Path) -> int:
    """Saves a tiny random ``class_name`` (and its tokenizer for text tasks) to ``folder``; returns its
    parameter count. Raises where the architecture cannot be built at tiny sizes."""
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    cls = getattr(transformers, class_name, None)
    if cls is None:
        raise LookupError(f"transformers has no class {class_name}")
    config = tiny_config(model_type)
    if task == "text-generation" and getattr(config, "is_decoder", None) is False:
        # an encoder family's causal LM (BertLMHeadModel, RobertaForCausalLM...): its checkpoints for
        # generation are decoders (causal, with a cache), as transformers' own warning asks
        config.is_decoder = True
    with torch.device("meta"):  # the size first: a config the shrinking missed is not built for real
        params = sum(p.numel() for p in cls(config).parameters())
    if params > MAX_PARAMS:
        raise ValueError(f"{params / 1e6:.0f}M parameters at the tiny sizes (a size not shrunk)")
    torch.manual_seed(0)
    model = cls(config).eval()
    _eager_check(task, model)
    model.save_pretrained(folder)
    vocab = getattr(model.config.get_text_config(), "vocab_size", None)
    if task != "image-classification" and isinstance(vocab, int):
        _save_tokenizer(folder, vocab)
    return params


def _eager_check(task: str, model: Any) -> None:
    """One eager forward on a small input: a tiny config the model itself cannot run is not buildable."""
    import torch

    g = torch.Generator().manual_seed(0)
    config = model.config
    try:
        with torch.no_grad():
            if task == "image-classification":
                vision = getattr(config, "vision_config", config)
                size = getattr(vision, "image_size", 32)
                size = size if isinstance(size, int) else size[0]
                channels = int(getattr(vision, "num_channels", 3))
                model(pixel_values=torch.randn(1, channels, size, size, generator=g))
            else:
                vocab = int(config.get_text_config().vocab_size)
                ids = torch.randint(3, vocab, (1, 8), generator=g)
                ids[:, -1] = 2  # ends with eos: BART-family classifiers pool there
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except Exception as e:
        raise RuntimeError(f"eager forward fails: {type(e).__name__}: {_first_line(str(e))}") from e


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else "(no message)"
    return line[:240]


def _max_diff(report: pathlib.Path) -> str:
    """The largest max abs diff of the failed rows of a package report's verification table."""
    worst: tuple[float, str] | None = None
    if report.is_file():
        for row in report.read_text(encoding="utf-8").splitlines():
            if "**FAIL**" in row:
                cells = [c.strip() for c in row.strip("|").split("|")]
                try:
                    diff = float(cells[3])
                except (IndexError, ValueError):
                    continue
                if worst is None or diff > worst[0]:
                    worst = (diff, cells[0].strip("`"))
    return f"max abs diff {worst[0]:.3g} ({worst[1]})" if worst else "max diff not found in the report"


def sweep_one(task: str, model_type: str, class_name: str, workdir: str | None = None) -> dict[str, Any]:
    """One architecture through ``fastonnx export`` with verification; returns {"status", "detail",
    "seconds"}: status pass, verify-failed (the max diff), export error (the exception's first line) or
    not buildable (why). Writes into a temporary folder, deleted before returning."""
    from fastonnx.pretrained.cli import main

    t0 = time.perf_counter()
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"archsweep-{model_type}-", dir=workdir))
    try:
        checkpoint, package = root / "checkpoint", root / "package"
        try:
            build_checkpoint(task, model_type, class_name, checkpoint)
        except Exception as e:
            status, detail = "not buildable", f"{type(e).__name__}: {_first_line(str(e))}"
            return {"status": status, "detail": detail, "seconds": time.perf_counter() - t0}
        out, err = io.StringIO(), io.StringIO()
        argv = ["export", str(checkpoint), str(package), "--task", task, "--no-progress"]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        except Exception as e:  # not one of fastonnx's errors: the exception itself
            code, message = -1, f"{type(e).__name__}: {_first_line(str(e))}"
        else:  # the command's own line (stderr also holds log lines)
            said = [ln for ln in err.getvalue().splitlines() if ln.startswith("fastonnx export: ")]
            message = _first_line(said[0].removeprefix("fastonnx export: ") if said else err.getvalue())
        if code == 0:
            verified = "verification: verified" in out.getvalue()
            status, detail = ("pass", "") if verified else ("export error", "not verified: " + out.getvalue())
        elif code == 1 and "verification failed" in err.getvalue():
            status, detail = "verify-failed", _max_diff(package / "fastonnx_report.md")
        else:
            status, detail = "export error", message
        return {"status": status, "detail": detail, "seconds": time.perf_counter() - t0}
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- workers


def _worker(conn: Any, workdir: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import fastonnx.pretrained.cli  # noqa: F401  (imports paid once)

    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            result = sweep_one(*job, workdir=workdir)
        except BaseException as e:  # the worker survives whatever one architecture does
            tb = traceback.format_exc(limit=-1).strip().splitlines()
            result = {"status": "export error", "detail": f"{type(e).__name__}: {e} {tb[-1:]}", "seconds": 0}
        conn.send(result)


class Worker:
    def __init__(self, workdir: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, workdir), daemon=True)
        self.proc.start()

    def run(self, job: tuple[str, str, str], timeout: float) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.conn.send(job)
        try:
            if self.conn.poll(timeout):
                result: dict[str, Any] = self.conn.recv()
                return result
            status = f"timeout after {timeout:.0f} s"
        except (EOFError, OSError):
            status = f"the worker crashed (exit code {self.proc.exitcode})"
        self.stop()
        return {"status": "export error", "detail": status, "seconds": time.perf_counter() - t0, "dead": True}

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


# ---------------------------------------------------------------- the section


def architectures(task: str) -> list[tuple[str, str]]:
    """(model type, class name) of the task's mapping, in its order (the first class of a tuple)."""
    from transformers.models.auto import modeling_auto

    mapping = getattr(modeling_auto, TASKS[task])
    return [(t, c if isinstance(c, str) else c[0]) for t, c in mapping.items()]


def _group(detail: str) -> str:
    """A failure's reason without its particulars (names, numbers), to count alike reasons."""
    text = re.sub(r"torch\.export\.export failed on \w+: ", "torch.export: ", detail)
    text = re.sub(
        r"\b[A-Z]\w*(ForCausalLM|ForMaskedLM|ForSequenceClassification|ForImageClassification)\w*", "X", text
    )
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:110]


def render(
    results: dict[str, list[dict[str, Any]]], planned: dict[str, int], swept: list[str], argv: str
) -> str:
    import torch
    import transformers

    lines = [
        "## transformers architectures",
        "",
        "Generated by `python scripts/architecture_sweep.py`; do not edit by hand. Every architecture of "
        "transformers' causal-LM, masked-LM, sequence-classification and image-classification auto-mappings, "
        "built from its config at tiny sizes (2 layers, hidden 64, 4 heads, vocabulary 128, 32-pixel images) "
        "with random weights, saved with `save_pretrained` (and a tiny tokenizer) and exported by "
        "`fastonnx export FOLDER OUT --task T` with verification on (the package run in onnxruntime against "
        "transformers eager, atol 1e-4, rtol 1e-3). Statuses: **pass**, **verify-failed** (the largest "
        "difference), **export error** (the exception's first line: torch.export's message where the "
        "capture failed), **not buildable** (the tiny config or model cannot be made: not fastonnx's).",
        "",
        f"Generated from commit `{_commit()}` with transformers {transformers.__version__}, torch "
        f"{torch.__version__}; command `python scripts/architecture_sweep.py {argv}`.",
        "",
        "| task | mapping | architectures | swept | pass | verify-failed | export error | not buildable |",
        "|---|---|---|---|---|---|---|---|",
    ]
    not_run = []
    for task in TASKS:
        rs = results.get(task, [])
        if task not in swept or not rs:
            not_run.append(task)
        c = Counter(r["status"] for r in rs)
        buildable = len(rs) - c["not buildable"]
        lines.append(
            f"| {task} | {TASKS[task]} | {planned.get(task, '-')} | {len(rs)} | **{c['pass']} of {buildable}** "
            f"buildable | {c['verify-failed']} | {c['export error']} | {c['not buildable']} |"
        )
    lines.append("")
    partial = [t for t in swept if 0 < len(results.get(t, [])) < planned.get(t, 0)]
    if partial or not_run:
        lines.append(
            "**Partial run.** "
            + (
                f"Swept in part (stopped at the time box; the rest not run): {', '.join(partial)}. "
                if partial
                else ""
            )
            + (f"Not swept: {', '.join(not_run)}. " if not_run else "")
            + "The full run: `python scripts/architecture_sweep.py` (about 20-60 s an architecture on 2 cores)."
        )
        lines.append("")
    failures = [(t, r) for t in TASKS for r in results.get(t, []) if r["status"] != "pass"]
    if failures:
        groups = Counter(f"{r['status']}: {_group(r['detail'])}" for _, r in failures)
        lines += ["Most common reasons (numbers and names folded):", "", "| count | reason |", "|---|---|"]
        lines += [f"| {n} | {_cell(g)} |" for g, n in groups.most_common(12)]
        lines += ["", "| task | model type | class | status | reason |", "|---|---|---|---|---|"]
        lines += [
            f"| {t} | {r['model_type']} | {r['class_name']} | {r['status']} | {_cell(r['detail'])} |"
            for t, r in failures
        ]
        lines.append("")
    passed = {t: [r["model_type"] for r in results.get(t, []) if r["status"] == "pass"] for t in TASKS}
    for t, names in passed.items():
        if names:
            lines.append(f"Passing ({t}): {', '.join(names)}.")
            lines.append("")
    return "\n".join(lines)


def _commit() -> str:
    """HEAD, with "+changes" when what the sweep runs (python/, this script) differs from it: others'
    edits elsewhere (and this section itself) are not its inputs."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git(
        "status", "--porcelain", "--untracked-files=no", "--", "python", "scripts/architecture_sweep.py"
    )
    return head + ("+changes" if changed else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:240]


def _ledger() -> Any:
    sys.path.insert(0, os.path.join(ROOT, "benches"))
    import ledger

    return ledger


def write_section(body: str) -> None:
    _ledger().write_section(SECTION, body, path=COVERAGE, header="# Converter coverage\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated tasks (default: all four)")
    p.add_argument("--only", default=None, help="comma-separated model types; prints, no write")
    p.add_argument("--limit", type=int, default=None, help="the first N of each task; prints, no write")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds an architecture (default 180)")
    a = p.parse_args()
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            p.error(f"unknown task {t!r}: one of {', '.join(TASKS)}")
    only = {s.strip() for s in a.only.split(",")} if a.only else None
    write = only is None and a.limit is None
    jobs: list[tuple[str, str, str]] = []
    planned: dict[str, int] = {}
    for task in tasks:
        archs = architectures(task)
        planned[task] = len(archs)
        archs = [x for x in archs if only is None or x[0] in only][: a.limit]
        jobs += [(task, t, c) for t, c in archs]
    for task in TASKS:
        planned.setdefault(task, len(architectures(task)))
    argv = " ".join(sys.argv[1:])
    results: dict[str, list[dict[str, Any]]] = {}
    workdir = tempfile.mkdtemp(prefix="archsweep-")
    workers: list[Worker | None] = [None] * max(1, a.workers)
    pending = list(jobs)
    try:
        import concurrent.futures as cf

        def run(slot: int, job: tuple[str, str, str]) -> dict[str, Any]:
            w = workers[slot]
            if w is None:
                w = workers[slot] = Worker(workdir)
            r = w.run(job, a.timeout)
            if r.pop("dead", False):
                workers[slot] = None
            return r

        free = list(range(len(workers)))
        with cf.ThreadPoolExecutor(len(workers)) as pool:
            running: dict[cf.Future[dict[str, Any]], tuple[int, tuple[str, str, str]]] = {}
            while pending or running:
                while pending and free:
                    slot, job = free.pop(), pending.pop(0)
                    running[pool.submit(run, slot, job)] = (slot, job)
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    slot, (task, model_type, class_name) = running.pop(fut)
                    free.append(slot)
                    r = {"model_type": model_type, "class_name": class_name, **fut.result()}
                    results.setdefault(task, []).append(r)
                    print(
                        f"[{task}] {model_type} ({class_name}): {r['status']} {r['seconds']:.0f}s {r['detail']}",
                        flush=True,
                    )
                    if write:
                        write_section(render(results, planned, tasks, argv))
    finally:
        for w in workers:
            if w is not None:
                with contextlib.suppress(Exception):
                    w.conn.send(None)
                w.proc.join(5)
                w.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    for task in tasks:
        c = Counter(r["status"] for r in results.get(task, []))
        print(
            f"{task}: {c['pass']} pass of {len(results.get(task, []))} swept ({planned[task]} in the mapping); {dict(c)}"
        )
    if write:
        write_section(render(results, planned, tasks, argv))
        print(f"wrote the {SECTION} section of {COVERAGE}")


if __name__ == "__main__":
    main()
