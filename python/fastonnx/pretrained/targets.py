"""``export_pretrained(target=...)`` / ``fastonnx export --target cpu|cuda|dml|webgpu``: the runtime a
package is for.

A target selects the default precision (as onnxruntime-genai's model builder defaults it: float32 on the
CPU, float16 on the GPUs), refuses a precision its execution provider has no products for, checks every
node of the written package against the provider's kernels (``data/ep_kernels.json``, written by
scripts/ep_kernels.py from onnxruntime's kernel lists) and writes the provider's section of
``genai_config.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastonnx.errors import InputError

TARGETS = ("cpu", "cuda", "dml", "webgpu")
DEFAULT_TARGET = "cpu"
KERNELS_FILE = pathlib.Path(__file__).resolve().parent / "data" / "ep_kernels.json"
PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
}

DEFAULT_DTYPE: dict[str, str | None] = {"cpu": None, "cuda": "fp16", "dml": "fp16", "webgpu": "fp16"}
"""The builder's io precision for a float model (quantization/quant_config.py ``default_io_dtype``):
float32 on the CPU (and for int4 / int8 there), float16 on the others (None: float32)."""

NO_BF16 = {
    "cpu": "onnxruntime's CPU MatMul, Add, Mul and Softmax kernels take no bfloat16 (the package would not "
    "load)",
    "dml": "DirectML's MatMul kernels take float and float16 only",
    "webgpu": "the WebGPU EP registers no bfloat16 kernels",
}
"""Why a bfloat16 package cannot run on a target (OperatorKernels.md's types, the WebGPU sources); CUDA's
MatMul takes bfloat16."""

PROVIDER_OPTIONS: dict[str, dict[str, dict[str, str]]] = {
    "cpu": {},
    "cuda": {"cuda": {"enable_cuda_graph": "0"}},
    "dml": {"dml": {"enable_graph_capture": "1"}},
    "webgpu": {"webgpu": {"enableGraphCapture": "0", "validationMode": "basic"}},
}
"""``session_options.provider_options``' entry per target, as the builder writes it by default
(builders/base.py ``ep_attrs``: CUDA graphs off, DML's graph capture on, WebGPU's capture off with basic
validation); the CPU gets none."""


@dataclass(frozen=True)
class Target:
    """A package's target and the precision it resolved to."""

    name: str
    dtype: str | None  # None: float32
    defaulted: bool  # the dtype is the target's default, not asked for

    @property
    def dtype_name(self) -> str:
        return self.dtype or "fp32"


def resolve(target: Any, dtype: Any, given: bool) -> Target:
    """``target`` checked, with the precision: ``dtype`` where ``given`` ("fp32" is float32), else the
    target's default. A precision the target's provider cannot run is an InputError."""
    if target not in TARGETS:
        raise InputError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    if not given:
        return Target(target, DEFAULT_DTYPE[target], True)
    if dtype == "fp32":
        dtype = None
    if dtype == "bf16" and target in NO_BF16:
        raise InputError(
            f"dtype='bf16' on target {target!r}: {NO_BF16[target]}; use dtype='fp16' (--dtype fp16), or "
            "target='cuda' (--target cuda)"
        )
    return Target(target, dtype, False)


def settle(
    target: Target, task: str, specs: dict[str, Any] | None, options: Any = None, model: Any = None
) -> tuple[Target, str]:
    """``target`` with float32 where its precision is the target's default and the package cannot be
    written in it yet (half_package's limits: ``half_package.converts``, ``cast_weights``), and the
    report's note saying so; an asked-for precision is left to half_package's checks, which refuse it."""
    from fastonnx.pretrained.half_package import converts

    if not (target.defaulted and target.dtype):
        return target, ""
    why = ""
    if specs is not None and not converts(specs, model):
        why = f"{type(model).__name__ if model is not None else task}'s {task} packages are written in float32 only so far"
    elif options is not None and options.get("cast_weights"):
        why = "cast_weights writes float32 weights"
    if not why:
        return target, ""
    return Target(target.name, None, True), f"not its default {target.dtype}: {why}"


@functools.cache
def _kernel_data() -> dict[str, Any]:
    with open(KERNELS_FILE, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def kernels(target: str) -> dict[str, dict[str, list[list[int | None]]]]:
    """``{domain: {op: [[since, until or None], ...]}}`` of the target's provider."""
    return dict(_kernel_data()["kernels"][target])


def source(target: str) -> str:
    """Where the target's kernel list comes from, as the report and errors name it."""
    s = _kernel_data()["sources"][target]
    commit = f", commit {s['commit'][:12]} of {s['date']}" if "commit" in s else ""
    return f"onnxruntime {s['onnxruntime']}{commit}"


def _covers(ranges: list[list[int | None]], version: int) -> bool:
    return any(lo is not None and lo <= version and (hi is None or version <= hi) for lo, hi in ranges)


def _schema(op: str, opset: int, domain: str) -> Any:
    import onnx

    try:
        return onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _nodes(graph: Any) -> Iterator[Any]:
    """The graph's nodes and those of its control-flow bodies."""
    import onnx

    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _nodes(g)


NO_KERNEL_NEEDED = {("", "Constant")}
"""Ops onnxruntime resolves as it loads a model on every provider: a Constant becomes an initializer."""


@dataclass(frozen=True)
class Missing:
    """A node the target's provider has no kernel for."""

    domain: str
    op: str
    version: int  # the op's version at the model's opset (its schema's since_version, where onnx has it)
    file: str
    ranges: tuple[tuple[int | None, int | None], ...]  # the versions the provider has, if any

    @property
    def name(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op


def missing_kernels(model: Any, target: str, file: str = "model.onnx") -> list[Missing]:
    """The (domain, op) of ``model``'s nodes (control-flow bodies and local functions included) that the
    target's provider has no kernel for at the model's opset. An op onnxruntime expands as its ONNX
    function (no kernel, a function body) is taken as it expands."""
    table = kernels(target)
    functions = {(f.domain, f.name): f for f in model.functions}
    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in model.opset_import}
    found: dict[tuple[str, str, int], Missing] = {}

    def visit(nodes: Iterator[Any], opset: dict[str, int], seen: frozenset[tuple[str, str]]) -> None:
        for node in nodes:
            domain = "" if node.domain == "ai.onnx" else node.domain
            key = (node.domain, node.op_type)
            if key in functions:
                if key not in seen:
                    f = functions[key]
                    own = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in f.opset_import}
                    visit(_nodes(f), {**opset, **own}, seen | {key})
                continue
            if (domain, node.op_type) in NO_KERNEL_NEEDED:
                continue
            version = opset.get(domain, 1)
            schema = _schema(node.op_type, version, domain) if domain in ("", "ai.onnx.ml") else None
            since = int(schema.since_version) if schema is not None else version
            ranges = table.get(domain, {}).get(node.op_type, [])
            if _covers(ranges, since):
                continue
            if schema is not None and (schema.has_function or schema.has_context_dependent_function):
                continue  # onnxruntime inlines its function body
            found.setdefault(
                (domain, node.op_type, since),
                Missing(domain, node.op_type, since, file, tuple((lo, hi) for lo, hi in ranges)),
            )

    visit(_nodes(model.graph), opsets, frozenset())
    return list(found.values())


def _rank(model: Any, name: str) -> int | None:
    """The rank of ``name``: an initializer's, or through the Casts / Identities reading one (a weight
    read as stored behind its Cast to the graph's type), or its recorded value_info."""
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    seen: set[str] = set()
    while name not in inits and name in producers and name not in seen:
        seen.add(name)
        node = producers[name]
        if node.op_type not in ("Cast", "Identity") or node.domain not in ("", "ai.onnx"):
            break
        name = node.input[0]
    if name in inits:
        return len(inits[name].dims)
    for v in [*model.graph.value_info, *model.graph.input]:
        if v.name == name and v.type.tensor_type.HasField("shape"):
            return len(v.type.tensor_type.shape.dim)
    return None


def lower_fused_matmul(model: Any) -> int:
    """Rewrites ``com.microsoft.FusedMatMul(x, W, transB=1)`` (what the onnxruntime level writes for a
    Linear weight read as stored) as ``MatMul(x, Transpose(W))`` in the top graph, for a provider
    without FusedMatMul; onnxruntime folds the Transpose of the weight at load. A FusedMatMul of other
    attributes is left (the kernel check then names it). Returns how many were rewritten."""
    import onnx

    count, nodes = 0, []
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        rank = _rank(model, node.input[1]) if node.op_type == "FusedMatMul" else None
        if (
            node.domain != "com.microsoft"
            or node.op_type != "FusedMatMul"
            or set(attrs) - {"transB", "alpha", "transA", "transBatchA", "transBatchB"}
            or attrs.get("alpha", 1.0) != 1.0
            or any(attrs.get(k, 0) for k in ("transA", "transBatchA", "transBatchB"))
            or rank is None
            or rank < 2
        ):
            nodes.append(node)
            continue
        b = node.input[1]
        if attrs.get("transB", 0):
            b = f"{node.output[0]}_weight_t"
            perm = [*range(rank - 2), rank - 1, rank - 2]
            nodes.append(onnx.helper.make_node("Transpose", [node.input[1]], [b], name=b, perm=perm))
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], b], list(node.output), name=node.name))
        count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return count


def lower_package(folder: pathlib.Path, files: list[str], target: str) -> str:
    """The package's files rewritten where the onnxruntime level wrote a contrib op the target lacks and a
    standard form computes the same (FusedMatMul on WebGPU); the report's note, or ""."""
    import onnx

    if "FusedMatMul" in kernels(target).get("com.microsoft", {}):
        return ""
    total = 0
    for file in files:
        model = onnx.load(str(folder / file), load_external_data=False)
        if count := lower_fused_matmul(model):
            onnx.save(model, str(folder / file))
            total += count
    if not total:
        return ""
    return f"{total} com.microsoft.FusedMatMul written as MatMul of the transposed weight: {PROVIDERS[target]} has no FusedMatMul"


def quantize_for(target: str, quantize: Any) -> Any:
    """``quantize`` (to_onnx's option) for the target's provider: a tied embedding keeps its float table,
    rather than gathering its quantized head's codes, where the provider has no GatherBlockQuantized
    kernel (DirectML)."""
    from fastonnx.stored_weights.weight_quantization import resolve_scheme

    if quantize is None or "GatherBlockQuantized" in kernels(target).get("com.microsoft", {}):
        return quantize
    settings = resolve_scheme(quantize)
    return quantize if settings is None else dataclasses.replace(settings, gather_codes=False)


def _has(target: str, m: Missing) -> bool:
    return _covers(kernels(target).get(m.domain, {}).get(m.op, []), m.version)


def fix(missing: list[Missing], target: str) -> str:
    """What to do about ``missing``: the standard level for contrib ops, the opset versions the provider
    has for a standard op, and the targets whose providers have every op missing."""
    hints = []
    if any(m.domain == "com.microsoft" for m in missing):
        hints.append("export with --optimize default (optimize=True: standard ONNX ops only)")
    for m in missing:
        if m.domain != "com.microsoft" and m.ranges:
            spans = ", ".join(f"{lo}+" if hi is None else f"{lo}-{hi}" for lo, hi in m.ranges)
            hints.append(f"{m.name}'s kernels cover opset versions {spans}: pick --opset within them")
            break
    others = [t for t in TARGETS if t != target and all(_has(t, m) for m in missing)]
    if others:
        which = "it" if len(missing) == 1 else "them"
        hints.append(f"another target whose provider has {which}: --target {' / '.join(others)}")
    elif not hints:
        hints.append("no target's provider has them all")
    return ", or ".join(hints)


def check_package(folder: pathlib.Path, files: list[str], target: str) -> None:
    """Every node of the package's ``files`` against the target's kernels: an InputError naming the first
    ops missing, the target and the fix."""
    import onnx

    missing: list[Missing] = []
    for file in files:
        model = onnx.load(str(folder / file), load_external_data=False)
        missing += missing_kernels(model, target, file)
    if not missing:
        return
    names = ", ".join(f"{m.name} (version {m.version}, in {m.file})" for m in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    raise InputError(
        f"the package is not for target {target!r}: {PROVIDERS[target]} ({source(target)}) has no kernel "
        f"for {names}{more}: {fix(missing, target)}"
    )


def write_provider_options(genai_config: pathlib.Path, target: str) -> None:
    """Sets every ``session_options.provider_options`` of the written ``genai_config.json`` (the decoder's,
    and a multimodal package's other files') to the target's entry, as the builder writes it."""
    config = json.loads(genai_config.read_text(encoding="utf-8"))
    entry = PROVIDER_OPTIONS[target]

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("session_options"), dict):
                value["session_options"]["provider_options"] = [entry] if entry else []
            for v in value.values():
                visit(v)
        elif isinstance(value, list):
            for v in value:
                visit(v)

    visit(config)
    genai_config.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")


def report(target: Target, note: str = "", lowered: str = "") -> str:
    """The report's section: the target, its precision and the kernel check."""
    how = "the target's default" if target.defaulted else "asked for"
    extra = f" ({note})" if note else ""
    after = f" {lowered}." if lowered else ""
    return (
        f"## Target\n\n`{target.name}` ({PROVIDERS[target.name]}): dtype {target.dtype_name} ({how}){extra}; "
        f"op set checked against {target.name}'s kernels ({source(target.name)}).{after}\n"
    )
