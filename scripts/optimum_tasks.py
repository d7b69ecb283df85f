"""Which model types Hugging Face optimum's ONNX exporter registers for each task, read from its source.

optimum cannot be installed beside transformers 5, so its registrations are counted, not run: the file
that declares them (``optimum/exporters/onnx/model_configs.py``, in huggingface/optimum-onnx since 2025)
is parsed with ``ast`` and never imported. Each ``@register_tasks_manager_onnx("bert", *TASKS)``
decorator gives a model type and its tasks; module-level list constants (``COMMON_TEXT_TASKS``) and
starred names inside them are resolved. Writes docs/data/optimum_onnx_tasks.json for
scripts/optimum_comparison.py.

    # from a bare git directory (what the `fetch` tool returns), at HEAD or a given commit
    python scripts/optimum_tasks.py --git-dir /work/.mirror/huggingface+optimum-onnx/repo [--commit SHA]
    # from a checked-out file
    python scripts/optimum_tasks.py --file model_configs.py --source huggingface/optimum-onnx --commit SHA

Task names: "-with-past" is dropped (optimum registers it as a variant of the same task) and optimum's
legacy synonyms ("default" -> "feature-extraction", ...) are mapped to its canonical names. Model types
are kept as optimum writes them; comparisons (scripts/optimum_comparison.py) normalize them.
Only registrations for the transformers library go into "tasks"; those for diffusers, timm and
sentence_transformers (pipeline parts such as "vae-encoder", not transformers model types) go into
"other_libraries".
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "docs", "data", "optimum_onnx_tasks.json")
DEFAULT_PATH = "optimum/exporters/onnx/model_configs.py"
DEFAULT_SOURCE = "huggingface/optimum-onnx"
# the name model_configs.py gives TasksManager.create_register("onnx"); others assigned so are found too
REGISTER = "register_tasks_manager_onnx"

# From optimum/exporters/tasks.py, TasksManager._SYNONYM_TASK_MAP, less the keys that are themselves
# tasks a registration may name (mask-generation, sentence-similarity): the register function only
# accepts canonical tasks today, but older sources used these names.
SYNONYMS = {
    "audio-ctc": "automatic-speech-recognition",
    "causal-lm": "text-generation",
    "default": "feature-extraction",
    "masked-lm": "fill-mask",
    "seq2seq-lm": "text2text-generation",
    "sequence-classification": "text-classification",
    "speech2seq-lm": "automatic-speech-recognition",
    "summarization": "text2text-generation",
    "text-to-speech": "text-to-audio",
    "translation": "text2text-generation",
    "vision2seq-lm": "image-to-text",
    "zero-shot-classification": "text-classification",
    "image-feature-extraction": "feature-extraction",
    "pretraining": "feature-extraction",
}


def normalize_task(task: str) -> str:
    """optimum's canonical task: "-with-past" dropped (as its register function does), synonyms mapped."""
    base = task.replace("-with-past", "")
    return SYNONYMS.get(base, base)


class ParseError(ValueError):
    """A registration whose arguments are not literal strings or resolvable names: fail rather than
    silently under-count."""


def _strings(node: ast.expr, consts: dict[str, list[str]]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        out: list[str] = []
        for elt in node.elts:
            out += _strings(elt.value if isinstance(elt, ast.Starred) else elt, consts)
        return out
    if isinstance(node, ast.Starred):
        return _strings(node.value, consts)
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _strings(node.left, consts) + _strings(node.right, consts)
    raise ParseError(f"line {node.lineno}: cannot resolve {ast.unparse(node)!r} to strings")


def parse(source: str) -> dict[str, dict[str, list[str]]]:
    """library -> normalized task -> sorted model types, as written, from model_configs.py's text."""
    tree = ast.parse(source)
    consts: dict[str, list[str]] = {}
    registers = {REGISTER}
    for stmt in tree.body:  # module level, in order: a constant may star an earlier one
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name, value = stmt.targets[0].id, stmt.value
            if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("create_register"):
                registers.add(name)
            elif isinstance(value, (ast.List, ast.Tuple)):
                try:
                    consts[name] = _strings(value, consts)
                except ParseError:
                    pass  # not a list of strings: no registration can use it as tasks
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in registers):
            continue
        if not node.args:
            raise ParseError(f"line {node.lineno}: registration without a model type")
        model_type = _strings(node.args[0], consts)
        if len(model_type) != 1:
            raise ParseError(f"line {node.lineno}: model type {ast.unparse(node.args[0])!r}")
        library = "transformers"  # the register function's default
        for kw in node.keywords:
            if kw.arg == "library_name":
                library = _strings(kw.value, consts)[0]
            else:
                raise ParseError(f"line {node.lineno}: unknown keyword {kw.arg!r}")
        tasks = [t for arg in node.args[1:] for t in _strings(arg, consts)]
        if not tasks:
            raise ParseError(f"line {node.lineno}: {model_type[0]!r} registers no task")
        for task in tasks:
            found[library][normalize_task(task)].add(model_type[0])
    if not found.get("transformers"):
        raise ParseError(f"no {' or '.join(sorted(registers))} registration for transformers found")
    return {lib: {t: sorted(ts) for t, ts in sorted(tasks.items())} for lib, tasks in sorted(found.items())}


def build(source_text: str, source: str, commit: str, path: str) -> dict[str, object]:
    libraries = parse(source_text)
    return {
        "source": source,
        "commit": commit,
        "file": path,
        "library": "transformers",
        "tasks": libraries.pop("transformers"),
        "other_libraries": libraries,
    }


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout


def _origin(git_dir: str) -> str | None:
    """owner/name from the remote's URL, where the clone has one (a fetched mirror may not)."""
    try:
        url = _git(git_dir, "config", "--get", "remote.origin.url").strip()
    except subprocess.CalledProcessError:
        return None
    m = re.search(r"github\.com[:/]([^/]+/[^/]+?)(?:\.git)?/?$", url)
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--git-dir", help="a (bare) git directory of optimum-onnx or optimum")
    where.add_argument("--file", help="the model_configs.py to parse")
    p.add_argument("--commit", help="the commit to read (--git-dir: default HEAD; --file: required)")
    p.add_argument(
        "--path", default=DEFAULT_PATH, help=f"the file inside the repository (default {DEFAULT_PATH})"
    )
    p.add_argument(
        "--source", help=f"owner/name of the repository (default: the remote's, else {DEFAULT_SOURCE})"
    )
    p.add_argument(
        "--out", default=DEFAULT_OUT, help="the JSON to write (default docs/data/optimum_onnx_tasks.json)"
    )
    args = p.parse_args(argv)

    if args.git_dir:
        try:
            commit = _git(
                args.git_dir, "rev-parse", "--verify", f"{args.commit or 'HEAD'}^{{commit}}"
            ).strip()
            text = _git(args.git_dir, "show", f"{commit}:{args.path}")
        except subprocess.CalledProcessError as e:
            # e.g. huggingface/optimum after the ONNX exporter moved out to optimum-onnx
            p.error(f"git: {e.stderr.strip()}")
        source = args.source or _origin(args.git_dir) or DEFAULT_SOURCE
    else:
        if not (args.commit and args.source):
            p.error("--file needs --source and --commit (the JSON records where the file came from)")
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
        commit, source = args.commit, args.source
    data = build(text, source, commit, args.path)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    tasks = data["tasks"]
    assert isinstance(tasks, dict)
    types = {m for ms in tasks.values() for m in ms}
    print(
        f"{source}@{commit[:12]} {args.path}: {len(types)} model types over {len(tasks)} tasks -> {args.out}"
    )
    for task, ms in tasks.items():
        print(f"  {task}: {len(ms)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
