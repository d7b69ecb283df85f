"""Writes the kernel lists of the execution providers `fastonnx export --target` checks a package against.

    python scripts/ep_kernels.py GIT_DIR [--ref REF] [--out PATH]

GIT_DIR is the git directory of an onnxruntime clone (no work tree needed: files are read with
``git show REF:path``). From it:

- cuda, dml: the CUDAExecutionProvider and DmlExecutionProvider sections of docs/OperatorKernels.md
  (op, domain, opset versions), which onnxruntime generates from its registered kernels;
- webgpu: the kernels the WebGPU EP registers, read from onnxruntime/core/providers/webgpu/
  webgpu_execution_provider.cc and onnxruntime/contrib_ops/webgpu/webgpu_contrib_kernels.cc (the WebGPU EP
  is not in OperatorKernels.md);
- cpu: the CPU kernels of the onnxruntime installed here (``get_all_opkernel_def``, the registry that
  OperatorKernels.md is generated from), so that the CPU list is exactly the runtime the tests run.

The JSON (``{"sources": {target: ...}, "kernels": {target: {domain: {op: [[since, until], ...]}}}}``,
``until`` null when open) is stamped with the onnxruntime commit and version each list comes from.
It is data for fastonnx.pretrained.targets: regenerate it with this script, never edit it by hand.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

OUT = pathlib.Path(__file__).resolve().parents[1] / "python/fastonnx/pretrained/data/ep_kernels.json"
KERNELS_DOC = "docs/OperatorKernels.md"
WEBGPU_FILES = (
    "onnxruntime/core/providers/webgpu/webgpu_execution_provider.cc",
    "onnxruntime/contrib_ops/webgpu/webgpu_contrib_kernels.cc",
)
DOC_SECTIONS = {"cuda": "CUDAExecutionProvider", "dml": "DmlExecutionProvider"}
# onnxruntime's C++ domain constants, as node domains name them ("" is ai.onnx)
CPP_DOMAINS = {
    "kOnnxDomain": "",
    "kMSDomain": "com.microsoft",
    "kMSInternalNHWCDomain": "com.ms.internal.nhwc",
    "kMSNchwcDomain": "com.microsoft.nchwc",
    "kMLDomain": "ai.onnx.ml",
    "kMSDmlDomain": "com.microsoft.dml",
}
OPEN = 2147483647  # onnxruntime's end of an open version range (INT_MAX)

Ranges = dict[str, dict[str, list[list[int | None]]]]


def git_show(git_dir: pathlib.Path, ref: str, path: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def _add(table: Ranges, domain: str, op: str, since: int, until: int | None) -> None:
    ranges = table.setdefault(domain, {}).setdefault(op, [])
    if [since, until] not in ranges:
        ranges.append([since, until])


def _sorted(table: Ranges) -> Ranges:
    return {
        d: {op: sorted(r, key=lambda x: x[0] or 0) for op, r in sorted(ops.items())}
        for d, ops in sorted(table.items())
    }


def _versions(cell: str) -> tuple[int, int | None]:
    """An OperatorKernels.md version cell: "13+", "[6, 12]" or "13"."""
    cell = cell.strip()
    if cell.endswith("+"):
        return int(cell[:-1]), None
    if m := re.fullmatch(r"\[(\d+),\s*(\d+)\]", cell):
        return int(m.group(1)), int(m.group(2))
    return int(cell), int(cell)


def doc_kernels(text: str, provider: str) -> Ranges:
    """The ops one provider's section of OperatorKernels.md lists."""
    table: Ranges = {}
    inside, domain, op = False, "", ""
    for line in text.splitlines():
        if line.startswith("## Operators implemented by"):
            inside = line.strip().endswith(provider)
            continue
        if not inside or not line.startswith("|"):
            continue
        if m := re.match(r"\|\*\*Operator Domain:\*\* \*([^*]+)\*", line):
            domain = "" if m.group(1) == "ai.onnx" else m.group(1)
            continue
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or cells[1].startswith(("Op Name", "---")):
            continue
        op = cells[1] or op  # a row with an empty name continues the op above (older versions)
        since, until = _versions(cells[3])
        _add(table, domain, op, since, until)
    if not table:
        raise SystemExit(f"{KERNELS_DOC} has no section for {provider}")
    return table


_CLASS = re.compile(
    r"ONNX_OPERATOR_(VERSIONED_)?(TYPED_)?KERNEL_CLASS_NAME\(\s*kWebGpuExecutionProvider\s*,\s*(\w+)\s*,([^)]*)\)"
)
_MACRO = re.compile(r"KERNEL_CREATE_INFO(_VERSIONED|_TYPED)?\(([^)]*)\)")


def webgpu_kernels(sources: list[str]) -> Ranges:
    """The kernels the WebGPU EP's sources declare and register (comments and macro definitions left
    out): ``ONNX_OPERATOR_*_KERNEL_CLASS_NAME(kWebGpuExecutionProvider, domain, ...)`` and the EP's own
    ``KERNEL_CREATE_INFO*`` shorthands (ai.onnx)."""
    table: Ranges = {}
    for source in sources:
        for line in source.splitlines():
            code = line.split("//", 1)[0]
            if code.lstrip().startswith("#define") or code.rstrip().endswith("\\"):
                continue
            for m in _CLASS.finditer(code):
                versioned, domain = m.group(1), m.group(3)
                args = [a.strip() for a in m.group(4).split(",")]
                if domain not in CPP_DOMAINS or not args[0].isdigit():
                    continue
                since, until = int(args[0]), (int(args[1]) if versioned else None)
                _add(table, CPP_DOMAINS[domain], args[-1], since, until)
            for m in _MACRO.finditer(code):
                kind, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
                if not args[0].isdigit():
                    continue  # the macro's own parameters
                until = int(args[1]) if kind == "_VERSIONED" else None
                _add(table, "", args[-1], int(args[0]), until)
    return table


def cpu_kernels() -> tuple[Ranges, str]:
    """The installed onnxruntime's CPU kernels, and its version."""
    import onnxruntime
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    table: Ranges = {}
    for kernel in state.get_all_opkernel_def():
        if kernel.provider != "CPUExecutionProvider":
            continue
        since, end = kernel.version_range
        _add(table, kernel.domain, kernel.op_name, since, None if end >= OPEN else end)
    return table, onnxruntime.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("git_dir", type=pathlib.Path, help="an onnxruntime clone's git directory")
    parser.add_argument("--ref", default="HEAD", help="the commit to read (default HEAD)")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", f"--git-dir={args.git_dir}", "rev-parse", args.ref],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    version = git_show(args.git_dir, commit, "VERSION_NUMBER").strip()
    date = subprocess.run(
        ["git", f"--git-dir={args.git_dir}", "show", "-s", "--format=%cs", commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    from_git = {"onnxruntime": version, "commit": commit, "date": date}
    doc = git_show(args.git_dir, commit, KERNELS_DOC)
    kernels: dict[str, Ranges] = {}
    sources: dict[str, dict[str, str]] = {}
    cpu, installed = cpu_kernels()
    kernels["cpu"] = cpu
    sources["cpu"] = {"onnxruntime": installed, "from": "the installed onnxruntime's CPU kernel registry"}
    for target, provider in DOC_SECTIONS.items():
        kernels[target] = doc_kernels(doc, provider)
        sources[target] = {**from_git, "from": f"{KERNELS_DOC}, {provider}"}
    kernels["webgpu"] = webgpu_kernels([git_show(args.git_dir, commit, p) for p in WEBGPU_FILES])
    sources["webgpu"] = {**from_git, "from": ", ".join(WEBGPU_FILES)}
    data = {"sources": sources, "kernels": {t: _sorted(k) for t, k in kernels.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    counts = ", ".join(f"{t}: {sum(len(o) for o in k.values())} ops" for t, k in kernels.items())
    print(f"{args.out}: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
