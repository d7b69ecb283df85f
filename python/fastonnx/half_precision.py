"""A float32 ONNX graph made to compute in float16 or bfloat16, overflow-safe by construction.

``convert(model, dtype, ranges=...)`` rewrites a float32 ``ModelProto`` (read without its external
data: the weights stay where they are) so that its products and elementwise ops run in the half type
and what overflows or loses its meaning there stays float32, with Casts at the edges:

- reductions (ReduceMean, ReduceSum, ...), the squares and roots of norms (``Mul(x, x)``, ``Pow``,
  ``Sqrt``, ``Reciprocal``), normalization ops, ``Softmax`` / ``LogSoftmax``, ``Exp`` / ``Log`` and
  ``Tanh`` (soft-capping: tanh of the logits over the cap);
- the rotary angles: every value computed from an integer cast to float (positions, masks) and
  constants only, up to and including ``Cos`` / ``Sin`` (half precision cannot tell position 2049 from
  2050);
- every node one of whose float values (an input or an output) has a recorded magnitude above
  ``FLOAT16_SAFE`` (float16's largest, 65504, over a margin of 16: 4094) in ``ranges``, the largest
  ``|value|`` per value name, from a calibration run of the float32 graph (``record_ranges``). bfloat16
  has float32's range: its conversion ignores ``ranges``.

Control flow (If, Loop, Scan, SequenceMap: Mixtral's routed experts) runs in the half type as a whole,
its bodies converted, unless a body holds an op that stays float32: then the node stays float32, and
the outer values its bodies read are cast to the type it runs in. Sequences cannot be cast: their
readers take their type. Weight-only arithmetic (Gemma's ``1 + weight``) stays float32 and is folded.

Weights: a float32 initializer read by a half node is read through a Cast (a checkpoint's bfloat16
tensor, already behind a Cast to float32, has that Cast retargeted), which onnxruntime folds at load;
small inline tensors and ``Constant`` nodes are converted in the file. Nothing is copied to float32.

``matmul_flops`` counts the MatMul / Gemm multiply-adds of a graph by the type they run in, the
measure of how much of the model the conversion moved.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fastonnx.errors import InputError

HALF_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
FLOAT16_MAX = 65504.0
MARGIN = 16.0
FLOAT16_SAFE = FLOAT16_MAX / MARGIN
"""The largest magnitude a value may have recorded and still be computed in float16: 65504 / 16, so
that inputs 16x larger than the calibration's still fit."""

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}

# op -> why it stays float32 whatever its range
KEEP_FLOAT32: dict[str, str] = {
    **{
        op: "reduction"
        for op in (
            "ReduceMean",
            "ReduceSum",
            "ReduceSumSquare",
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceProd",
            "CumSum",
        )
    },
    **{op: "norm (square, root)" for op in ("Pow", "Sqrt", "Reciprocal")},
    **{
        op: "normalization"
        for op in (
            "LayerNormalization",
            "RMSNormalization",
            "SimplifiedLayerNormalization",
            "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization",
            "GroupNormalization",
            "InstanceNormalization",
            "BatchNormalization",
            "LpNormalization",
        )
    },
    "Softmax": "softmax",
    "LogSoftmax": "softmax",
    "Exp": "exp / log",
    "Log": "exp / log",
    "Tanh": "soft-capping (tanh)",
    "Range": "float generator",
    "ConstantOfShape": "float generator",
    "RandomNormal": "float generator",
    "RandomUniform": "float generator",
    "RandomNormalLike": "float generator",
    "RandomUniformLike": "float generator",
    "EyeLike": "float generator",
}

# ops that move or pick values without arithmetic: they run in the type their data comes in
_MOVES = {
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Expand",
    "Slice",
    "Gather",
    "GatherND",
    "GatherElements",
    "Concat",
    "Split",
    "Identity",
    "Tile",
    "Pad",
    "Where",
    "ScatterND",
    "ScatterElements",
    "Trilu",
    "DepthToSpace",
    "SpaceToDepth",
}

# weight-only ops that run in the half type rather than float32 and folded: moves, and the dequantized
# weights of quantize= (onnxruntime fuses DequantizeLinear + MatMul into MatMulNBits, half scales and all)
_KEEPS_TYPE = _MOVES | {"DequantizeLinear"}

# ops through which the rotary angles are computed from positions (with constants only)
_ANGLE_OPS = _MOVES | {"Mul", "MatMul", "Div", "Add", "Sub", "Cast", "Cos", "Sin", "Neg"}

# (op, input index) read as float32 whatever the graph's type (ONNX fixes their type)
_FIXED_INPUTS = {("Resize", 1), ("Resize", 2), ("Dropout", 1)}
# ops whose float inputs are read for their shape or size only
_SHAPE_READERS = {"Shape", "Size"}


@dataclasses.dataclass
class Converted:
    """What ``convert`` did: the model, and why each float32 node stayed float32."""

    model: onnx.ModelProto
    dtype: str
    kept: dict[str, str]  # node name -> reason it computes in float32
    casts: int  # Casts inserted
    threshold: float | None  # the magnitude above which a value stays float32 (None: bfloat16)

    def reasons(self) -> dict[str, int]:
        """How many nodes stayed float32 for each reason."""
        counts: dict[str, int] = {}
        for reason in self.kept.values():
            counts[reason] = counts.get(reason, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def half_type(dtype: str) -> int:
    """The ONNX element type of ``dtype`` ("fp16" or "bf16"); anything else is an InputError."""
    if dtype not in HALF_TYPES:
        raise InputError(f"dtype must be 'fp16' or 'bf16' (or None for float32), got {dtype!r}")
    return HALF_TYPES[dtype]


def _sequence_types(g: onnx.GraphProto) -> dict[str, int]:
    """Values that are sequences of tensors: their element type."""
    found: dict[str, int] = {}
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.HasField("sequence_type") and v.type.sequence_type.elem_type.HasField("tensor_type"):
            found[v.name] = v.type.sequence_type.elem_type.tensor_type.elem_type
    return found


def _types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    found: dict[str, int] = {}
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.HasField("tensor_type"):
            found[v.name] = v.type.tensor_type.elem_type
    for t in g.initializer:
        found[t.name] = t.data_type
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    found[n.output[0]] = a.t.data_type
        if n.op_type == "Cast":
            to = next(a.i for a in n.attribute if a.name == "to")
            found[n.output[0]] = to
    missing = [o for n in g.node for o in n.output if o and o not in found]
    if missing:
        inferred = onnx.shape_inference.infer_shapes(model)
        for v in inferred.graph.value_info:
            if v.name not in found and v.type.HasField("tensor_type"):
                found[v.name] = v.type.tensor_type.elem_type
    return found


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _constant_array(node: onnx.NodeProto) -> np.ndarray[Any, Any] | None:
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
    return None


def initializer_max_abs(tensor: TensorProto, base_dir: str | os.PathLike[str] | None) -> float:
    """The largest ``|value|`` of a float initializer, its external data read through a memory map a
    few MiB at a time (never the whole tensor in memory)."""
    if tensor.data_location != TensorProto.EXTERNAL:
        arr = numpy_helper.to_array(tensor)
        return float(np.max(np.abs(arr.astype(np.float32)))) if arr.size else 0.0
    info = {e.key: e.value for e in tensor.external_data}
    if base_dir is None:
        raise ValueError(f"initializer {tensor.name} is external: its folder is needed")
    path = os.path.join(os.fspath(base_dir), info["location"])
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    np_type = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    data = np.memmap(path, dtype=np_type, mode="r", offset=int(info.get("offset", 0)), shape=(count,))
    top = 0.0
    step = 1 << 20
    for start in range(0, count, step):
        piece = np.asarray(data[start : start + step]).astype(np.float32)
        top = max(top, float(np.max(np.abs(piece))) if piece.size else 0.0)
    return top


def _angle_island(model: onnx.ModelProto, types: Mapping[str, int]) -> set[str]:
    """Nodes (by output name) computing float values from integers cast to float and constants only:
    positions to rotary angles, masks. They stay float32."""
    g = model.graph
    constant = {t.name for t in g.initializer}
    island: set[str] = set()
    marked: set[int] = set()
    for i, n in enumerate(g.node):
        ins = [x for x in n.input if x]
        if n.op_type == "Constant" or (ins and all(x in constant for x in ins)):
            constant.update(n.output)
            continue
        if n.op_type == "Cast" and ins and types.get(ins[0]) not in _FLOATS:
            if types.get(n.output[0]) in _FLOATS:
                island.update(n.output)
                marked.add(i)
            continue
        if n.op_type not in _ANGLE_OPS:
            continue
        floats = [x for x in ins if types.get(x) in _FLOATS]
        if floats and any(x in island for x in floats) and all(x in island or x in constant for x in floats):
            island.update(n.output)
            marked.add(i)
    return {o for i in marked for o in g.node[i].output}


def bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The control-flow bodies (If, Loop, Scan, SequenceMap graphs) a node holds."""
    found: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            found.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            found.extend(a.graphs)
    return found


def _body_blocker(body: onnx.GraphProto) -> str | None:
    """Why a control-flow body cannot compute in the half type as a whole (it holds an op that stays
    float32), or None."""
    for n in body.node:
        if n.op_type in KEEP_FLOAT32:
            return f"control flow holding {n.op_type}"
        if n.op_type == "Mul" and len(n.input) == 2 and n.input[0] == n.input[1]:
            return "control flow holding a square"
        if n.domain not in ("", "ai.onnx", "com.microsoft"):
            return f"control flow holding an op of domain {n.domain}"
        for inner in bodies(n):
            why = _body_blocker(inner)
            if why is not None:
                return why
    return None


def outer_reads(body: onnx.GraphProto) -> set[str]:
    """Names a body (and the bodies inside it) reads from the scopes around it."""
    defined = {v.name for v in body.input} | {t.name for t in body.initializer}
    defined |= {o for n in body.node for o in n.output}
    read = {x for n in body.node for x in n.input if x}
    for n in body.node:
        for inner in bodies(n):
            read |= outer_reads(inner)
    return read - defined


def rename_reads(body: onnx.GraphProto, renamed: Mapping[str, str]) -> None:
    """Every read of a key of ``renamed`` in ``body`` and the bodies inside it made a read of its value."""
    for n in body.node:
        for i, x in enumerate(n.input):
            if x in renamed:
                n.input[i] = renamed[x]
        for inner in bodies(n):
            rename_reads(inner, renamed)
    for v in body.output:
        if v.name in renamed:  # a body returning an outer value as it is
            raise InputError(f"a control-flow body returns the outer value {v.name} unchanged")


def _to_half(body: onnx.GraphProto, half: int) -> None:
    """Every float32 tensor of ``body`` (its inputs, outputs, values, constants, Casts) in ``half``."""
    np_half = helper.tensor_dtype_to_np_dtype(half)

    def retype(v: onnx.ValueInfoProto) -> None:
        t = v.type
        if t.HasField("tensor_type") and t.tensor_type.elem_type == TensorProto.FLOAT:
            t.tensor_type.elem_type = half
        elif t.HasField("sequence_type") and t.sequence_type.elem_type.HasField("tensor_type"):
            inner = t.sequence_type.elem_type.tensor_type
            if inner.elem_type == TensorProto.FLOAT:
                inner.elem_type = half

    for v in [*body.input, *body.output, *body.value_info]:
        retype(v)
    for i, t in enumerate(body.initializer):
        if t.data_type == TensorProto.FLOAT:
            body.initializer[i].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(t).astype(np_half), t.name)
            )
    for n in body.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = half
            elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np_half), a.t.name))
        for inner in bodies(n):
            _to_half(inner, half)


def _weight_only(g: onnx.GraphProto) -> set[str]:
    """Values computed from initializers and constants only (onnxruntime folds them at load)."""
    found = {t.name for t in g.initializer}
    for n in g.node:
        ins = [x for x in n.input if x]
        if n.op_type == "Constant" or (ins and all(x in found for x in ins) and not _has_subgraph(n)):
            found.update(o for o in n.output if o)
    return found


def convert(
    model: onnx.ModelProto,
    dtype: str,
    *,
    ranges: Mapping[str, float] | None = None,
    keep_io_types: bool = False,
    base_dir: str | os.PathLike[str] | None = None,
) -> Converted:
    """``model`` (float32, its external data not loaded) computing in ``dtype`` ("fp16" / "bf16") where
    that is safe, as the module says. ``ranges``: the largest ``|value|`` per value name (record_ranges);
    for float16, without them only the ops that overflow by nature stay float32. ``keep_io_types``: the
    float32 inputs and outputs stay float32 (Casts behind and before them). ``base_dir``: the folder of
    the model's external data, to read the weights' magnitudes."""
    half = half_type(dtype)
    g = model.graph
    types = _types(model)
    sequences = _sequence_types(g)
    types.update(sequences)  # a sequence's type is its tensors' (it cannot be cast: nodes follow it)
    threshold = FLOAT16_SAFE if half == TensorProto.FLOAT16 else None
    limits: dict[str, float] = dict(ranges or {})
    init_by_name = {t.name: t for t in g.initializer}
    if threshold is not None:
        for t in g.initializer:
            if t.data_type == TensorProto.FLOAT and t.name not in limits:
                limits[t.name] = initializer_max_abs(t, base_dir)
        for n in g.node:
            if n.op_type == "Constant" and types.get(n.output[0]) == TensorProto.FLOAT:
                arr = _constant_array(n)
                if arr is not None and arr.size:
                    limits[n.output[0]] = float(np.max(np.abs(arr)))

    def too_large(name: str) -> bool:
        return threshold is not None and limits.get(name, 0.0) > threshold

    island = _angle_island(model, types)
    fp32 = TensorProto.FLOAT
    weight_only = _weight_only(g)
    # Casts of weights read by weight-only arithmetic: kept float32 with it (folded at load)
    folded_readers = {
        x
        for n in g.node
        if n.op_type not in _MOVES
        and n.op_type != "Cast"
        and n.input
        and all(i in weight_only for i in n.input if i)
        for x in n.input
    }
    # the type each value has in the converted graph
    current: dict[str, int] = dict(types)
    flexible: set[str] = {t.name for t in g.initializer if t.data_type == fp32}
    io_inputs = [v for v in g.input if types.get(v.name) == fp32 and v.name not in init_by_name]
    for v in io_inputs:
        if not keep_io_types and not too_large(v.name):
            current[v.name] = half
    nodes: list[onnx.NodeProto] = []
    kept: dict[str, str] = {}
    cast_cache: dict[tuple[str, int], str] = {}
    new_inits: list[TensorProto] = []
    constants = {n.output[0]: n for n in g.node if n.op_type == "Constant"}
    casts = 0
    taken = {o for n in g.node for o in n.output} | set(init_by_name) | {v.name for v in g.input}

    def fresh(hint: str) -> str:
        name, k = hint, 0
        while name in taken:
            k += 1
            name = f"{hint}_{k}"
        taken.add(name)
        return name

    def cast_to(name: str, to: int) -> str:
        nonlocal casts
        key = (name, to)
        if key in cast_cache:
            return cast_cache[key]
        suffix = "fp16" if to == TensorProto.FLOAT16 else "bf16" if to == TensorProto.BFLOAT16 else "fp32"
        out = fresh(f"{name}_{suffix}")
        source = init_by_name.get(name)
        const = constants.get(name)
        if source is not None and source.data_location != TensorProto.EXTERNAL and to != fp32:
            arr = numpy_helper.to_array(source).astype(helper.tensor_dtype_to_np_dtype(to))
            new_inits.append(numpy_helper.from_array(arr, out))
        elif const is not None and to != fp32 and (arr0 := _constant_array(const)) is not None:
            arr = arr0.astype(helper.tensor_dtype_to_np_dtype(to))
            nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(arr, out)))
        else:
            nodes.append(helper.make_node("Cast", [name], [out], name=fresh(f"{out}_cast"), to=to))
            casts += 1
        current[out] = to
        cast_cache[key] = out
        return out

    for n in g.node:
        ins = list(n.input)
        # the float32 values read (now float32 or half); other types (a float64 routing) as they are
        float_ins = [(i, x) for i, x in enumerate(ins) if x and types.get(x) == fp32]
        float_outs = [o for o in n.output if o and types.get(o) == fp32]
        if n.op_type == "Constant":
            nodes.append(n)  # converted where read (cast_to)
            flexible.update(n.output)
            continue
        if not float_outs and not float_ins:
            nodes.append(n)
            continue
        if n.op_type in _SHAPE_READERS:
            nodes.append(n)
            continue
        label = n.name or (n.output[0] if n.output else n.op_type)
        reason: str | None = None
        held = bodies(n)
        if held:
            blockers = [why for b in held if (why := _body_blocker(b)) is not None]
            if blockers:
                reason = blockers[0]
            elif any(too_large(x) for _, x in float_ins) or any(too_large(o) for o in float_outs):
                reason = f"range above {threshold:g}"
            target = fp32 if reason is not None else half
            fixed = {current.get(x, fp32) for _, x in float_ins if x in sequences}
            if fixed and fixed != {target}:
                target, reason = fixed.pop(), reason or "reads a float32 sequence"
            moved = onnx.NodeProto()
            moved.CopyFrom(n)
            for i, x in float_ins:
                if x not in sequences and current.get(x, types.get(x)) != target:
                    moved.input[i] = cast_to(x, target)
            outer = sorted(set().union(*(outer_reads(b) for b in bodies(moved))))
            renamed = {
                x: cast_to(x, target)
                for x in outer
                if types.get(x) in _FLOATS and x not in sequences and current.get(x, types.get(x)) != target
            }
            for b in bodies(moved):
                if target == half:
                    _to_half(b, half)
                rename_reads(b, renamed)
            for o in n.output:
                if o and types.get(o) == fp32:
                    current[o] = target
            if reason is not None:
                kept[label] = reason
            nodes.append(moved)
            continue
        if n.op_type == "Cast":
            source = ins[0]
            to = next(a.i for a in n.attribute if a.name == "to")
            if to != fp32 or types.get(source) not in _FLOATS:
                # to an integer or another type, or an integer / bool to float32 (positions, masks): as is
                nodes.append(n)
                if to == fp32:
                    kept[label] = "rotary angles / masks (from integers)"
                continue
            if too_large(source) or too_large(n.output[0]):
                kept[label] = f"range above {threshold:g}"
                nodes.append(n)
                continue
            if n.output[0] in folded_readers:
                nodes.append(n)  # read by weight-only arithmetic, which stays float32 and is folded
                continue
            # a float -> float32 Cast (a checkpoint's bfloat16 weight): to the half type instead
            moved = onnx.NodeProto()
            moved.CopyFrom(n)
            if current.get(source, types.get(source)) == half:
                moved.op_type = "Identity"
                del moved.attribute[:]
            else:
                for a in moved.attribute:
                    if a.name == "to":
                        a.i = half
            nodes.append(moved)
            current[n.output[0]] = half
            continue
        if n.op_type not in _KEEPS_TYPE and n.output[0] in weight_only:
            # arithmetic on weights only (Gemma's 1 + weight): float32, folded by onnxruntime at load
            # (its CPU has no float16 Add / Mul to fold with)
            for o in float_outs:
                current[o] = fp32
            if float_outs:
                kept[label] = "weights only (folded at load)"
            moved = onnx.NodeProto()
            moved.CopyFrom(n)
            for i, x in float_ins:
                if current.get(x, types.get(x)) != fp32 and (n.op_type, i) not in _FIXED_INPUTS:
                    moved.input[i] = cast_to(x, fp32)
            nodes.append(moved)
            continue
        if n.op_type in KEEP_FLOAT32:
            reason = KEEP_FLOAT32[n.op_type]
        elif n.op_type == "Mul" and len(ins) == 2 and ins[0] == ins[1]:
            reason = "norm (square, root)"
        elif n.domain not in ("", "ai.onnx") and n.domain != "com.microsoft":
            reason = f"op of domain {n.domain}"
        elif any(o in island for o in n.output):
            reason = "rotary angles / masks (from integers)"
        elif any(too_large(x) for _, x in float_ins) or any(too_large(o) for o in float_outs):
            reason = f"range above {threshold:g}"
        elif n.op_type in _MOVES:
            data = [x for i, x in float_ins if (n.op_type, i) not in _FIXED_INPUTS]
            if any(current.get(x) == fp32 and x not in flexible for x in data):
                reason = "reads float32 data"
        target = fp32 if reason is not None else half
        fixed = {current.get(x, fp32) for _, x in float_ins if x in sequences}
        if fixed and fixed != {target}:
            target = fixed.pop()  # a sequence cannot be cast: its readers take its type
            reason = reason or ("reads a float32 sequence" if target == fp32 else None)
        if reason is not None and float_outs:
            kept[label] = reason
        moved = onnx.NodeProto()
        moved.CopyFrom(n)
        for i, x in float_ins:
            if (n.op_type, i) in _FIXED_INPUTS or x in sequences:
                continue
            if current.get(x, types.get(x)) != target:
                moved.input[i] = cast_to(x, target)
        for o in float_outs:
            current[o] = target
        nodes.append(moved)

    # graph outputs in the type asked: half unless kept (keep_io_types) or too large for it
    out_rename: dict[str, str] = {}
    tail: list[onnx.NodeProto] = []
    for v in g.output:
        if types.get(v.name) != fp32:
            continue
        want = fp32 if keep_io_types or too_large(v.name) else half
        have = current.get(v.name, fp32)
        if have == want:
            continue
        inner = fresh(f"{v.name}_{'fp32' if have == fp32 else 'half'}")
        out_rename[v.name] = inner
        current[inner] = have
        tail.append(helper.make_node("Cast", [inner], [v.name], name=fresh(f"{v.name}_cast"), to=want))
        casts += 1
        current[v.name] = want
    if out_rename:
        for node in nodes:
            for i, x in enumerate(node.input):
                if x in out_rename:
                    node.input[i] = out_rename[x]
            for i, x in enumerate(node.output):
                if x in out_rename:
                    node.output[i] = out_rename[x]
    # inputs kept float32 by keep_io_types or their range: already float32; the others now half
    del g.node[:]
    g.node.extend(nodes + tail)
    g.initializer.extend(new_inits)
    _retype(g, current, out_rename)
    _drop_unread(g)
    return Converted(model, dtype, kept, casts, threshold)


def _retype(g: onnx.GraphProto, current: Mapping[str, int], renamed: Mapping[str, str]) -> None:
    shapes: dict[str, Any] = {}
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.HasField("tensor_type"):
            shapes[v.name] = v.type.tensor_type.shape
    for v in [*g.input, *g.output]:
        if v.type.HasField("tensor_type") and v.name in current:
            v.type.tensor_type.elem_type = current[v.name]
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.HasField("sequence_type") and v.name in current:
            inner = v.type.sequence_type.elem_type
            if inner.HasField("tensor_type"):
                inner.tensor_type.elem_type = current[v.name]
    known = set()
    for v in g.value_info:
        if v.type.HasField("tensor_type"):
            name = v.name
            for old, new in renamed.items():
                if name == old:
                    v.name = new
            if v.name in current:
                v.type.tensor_type.elem_type = current[v.name]
        known.add(v.name)
    io = {v.name for v in [*g.input, *g.output]} | {t.name for t in g.initializer}
    for n in g.node:
        if n.op_type in ("Cast", "Constant") and n.output[0] not in known and n.output[0] not in io:
            source = n.input[0] if n.input else ""
            shape = shapes.get(source)
            info = helper.make_tensor_value_info(
                n.output[0], current.get(n.output[0], TensorProto.FLOAT), None
            )
            if shape is not None:
                info.type.tensor_type.shape.CopyFrom(shape)
            g.value_info.append(info)
            known.add(n.output[0])


def _drop_unread(g: onnx.GraphProto) -> None:
    read = {x for n in g.node for x in n.input} | {v.name for v in g.output}
    keep = [t for t in g.initializer if t.name in read]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)
    nodes = [n for n in g.node if n.op_type != "Constant" or n.output[0] in read]
    if len(nodes) != len(g.node):
        del g.node[:]
        g.node.extend(nodes)


def record_ranges(
    model_path: str | os.PathLike[str],
    feeds: Iterable[Mapping[str, np.ndarray[Any, Any]]],
    *,
    skip: Iterable[str] = (),
) -> dict[str, float]:
    """The largest ``|value|`` of every float value of the float32 model at ``model_path`` over the runs
    ``feeds``: the model run in onnxruntime (graph optimizations off) with its intermediate values as
    outputs. A copy of the graph is written beside the model (its external data found there) and
    removed. ``skip``: values not to return (their magnitude known otherwise)."""
    import tempfile

    import onnxruntime as ort

    path = os.fspath(model_path)
    model = onnx.load(path, load_external_data=False)
    types = _types(model)
    g = model.graph
    skipped = set(skip)
    inits = {t.name for t in g.initializer}
    present = {v.name for v in g.output}
    # the Casts of weights: their magnitudes come from the weights (initializer_max_abs), not a copy;
    # quantized weights' (DequantizeLinear) from their scales
    weight_casts = {n.output[0] for n in g.node if n.op_type == "Cast" and n.input and n.input[0] in inits}
    dequantized = {
        n.output[0]: n
        for n in g.node
        if n.op_type == "DequantizeLinear" and n.input[0] in inits and n.input[1] in inits
    }
    weight_casts |= set(dequantized)
    wanted = [
        o
        for n in g.node
        if n.op_type != "Constant"
        for o in n.output
        if o and types.get(o) in _FLOATS and o not in present and o not in skipped and o not in weight_casts
    ]
    for o in wanted:
        g.output.append(helper.make_tensor_value_info(o, types[o], None))
    tops: dict[str, float] = {}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(suffix=".onnx", prefix=".ranges.", dir=folder)
    os.close(fd)
    try:
        onnx.save(model, tmp)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(tmp, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        for feed in feeds:
            for name, value in feed.items():
                if types.get(name) in _FLOATS:
                    tops[name] = max(tops.get(name, 0.0), _max_abs(value))
            for name, value in zip(names, session.run(names, dict(feed)), strict=True):
                if name in skipped:
                    continue
                tops[name] = max(tops.get(name, 0.0), _max_abs(value))
    finally:
        os.unlink(tmp)
    by_name = {t.name: t for t in g.initializer}
    for n in g.node:
        if n.op_type == "Cast" and n.input and n.input[0] in inits:
            tensor = by_name[n.input[0]]
            if tensor.data_type in _FLOATS:
                tops[n.output[0]] = initializer_max_abs(tensor, folder)
    for out, n in dequantized.items():
        codes, scale = by_name[n.input[0]], by_name[n.input[1]]
        bits = 4 if codes.data_type in (TensorProto.INT4, TensorProto.UINT4) else 8
        # |code - zero point| < 2^bits
        tops[out] = initializer_max_abs(scale, folder) * (1 << bits)
    return tops


def _max_abs(value: Any) -> float:
    arr = np.asarray(value)
    if arr.size == 0 or arr.dtype.kind not in "fV":
        return 0.0
    arr = arr.astype(np.float32)
    finite = np.abs(arr)
    return float(np.max(finite))


def feeds_as_session_types(session: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """``feeds`` with float arrays cast to the type the session's input takes (a half package's cache)."""
    kinds: dict[str, Any] = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
    typed = {}
    for i in session.get_inputs():
        value = feeds[i.name]
        if i.type in kinds and isinstance(value, np.ndarray) and value.dtype.kind == "f":
            value = value.astype(kinds[i.type])
        typed[i.name] = value
    return typed


def matmul_flops(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[int, int]:
    """Multiply-adds of the MatMul, Gemm, FusedMatMul and MatMulNBits nodes by the element type they run in (their
    first input's): M·K·N each (times the batch dims of a MatMul), symbolic dims taken from ``dims`` (1
    where it lacks one). The products of control-flow bodies (Mixtral's experts) count once each, at
    the sizes their values record (a routed expert's rows are symbolic: 1 unless ``dims`` names them)."""
    flops: dict[int, int] = {}
    _graph_flops(model.graph, dims, {}, {}, flops)
    return flops


def _graph_flops(
    g: onnx.GraphProto,
    dims: Mapping[str, int],
    outer_shapes: Mapping[str, list[int]],
    outer_types: Mapping[str, int],
    flops: dict[int, int],
) -> None:
    shapes: dict[str, list[int]] = dict(outer_shapes)
    types: dict[str, int] = dict(outer_types)
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.HasField("tensor_type"):
            t = v.type.tensor_type
            types[v.name] = t.elem_type
            if t.HasField("shape"):
                shapes[v.name] = [
                    d.dim_value if d.HasField("dim_value") else int(dims.get(d.dim_param, 1))
                    for d in t.shape.dim
                ]
    for t in g.initializer:
        shapes[t.name], types[t.name] = list(t.dims), t.data_type
    for n in g.node:
        for body in bodies(n):
            _graph_flops(body, dims, shapes, types, flops)
        if n.op_type == "MatMulNBits":
            a = shapes.get(n.input[0])
            attrs = {x.name: x.i for x in n.attribute}
            if a:
                rows = int(np.prod(a[:-1])) if len(a) > 1 else 1
                kind = types.get(n.input[0], TensorProto.FLOAT)
                flops[kind] = flops.get(kind, 0) + rows * attrs.get("K", a[-1]) * attrs.get("N", 1)
            continue
        if n.op_type not in ("MatMul", "Gemm", "FusedMatMul"):
            continue
        a, b = shapes.get(n.input[0]), shapes.get(n.input[1])
        if a is None or b is None or not a or not b:
            continue
        if n.op_type == "FusedMatMul":  # com.microsoft's MatMul of transposed operands, scaled
            flags = {x.name: x.i for x in n.attribute}
            if flags.get("transA") and len(a) > 1:
                a = [*a[:-2], a[-1], a[-2]]
            if flags.get("transB") and len(b) > 1:
                b = [*b[:-2], b[-1], b[-2]]
        if n.op_type == "Gemm":
            trans_a = next((x.i for x in n.attribute if x.name == "transA"), 0)
            trans_b = next((x.i for x in n.attribute if x.name == "transB"), 0)
            m, k = (a[1], a[0]) if trans_a else (a[0], a[1])
            cols = b[0] if trans_b else b[1]
            count = m * k * cols
        else:  # MatMul, FusedMatMul
            k = a[-1]
            cols = b[-1] if len(b) > 1 else 1
            rows = a[-2] if len(a) > 1 else 1
            batch = (
                int(np.prod(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))))
                if len(a) > 2 or len(b) > 2
                else 1
            )
            count = batch * rows * k * cols
        kind = types.get(n.input[0], TensorProto.FLOAT)
        flops[kind] = flops.get(kind, 0) + int(count)


def half_share(flops: Mapping[int, int], dtype: str) -> float:
    """The share of ``flops`` (matmul_flops) that runs in ``dtype``."""
    total = sum(flops.values())
    return flops.get(HALF_TYPES[dtype], 0) / total if total else 0.0


def report_section(converted: Converted, share: float | None, notes: Sequence[str] = ()) -> str:
    """The package report's account: the type, the share of MatMul work in it, what stayed float32."""
    kind = "float16" if converted.dtype == "fp16" else "bfloat16"
    lines = [f"## Half precision ({kind})", ""]
    if converted.threshold is not None:
        lines.append(
            f"Values recorded above {converted.threshold:g} (float16's largest, {FLOAT16_MAX:g}, over a margin "
            f"of {MARGIN:g}) stay float32."
        )
    if share is not None:
        lines.append(f"MatMul / Gemm multiply-adds in {kind}: {100 * share:.1f}%.")
    lines.append(
        f"Casts inserted: {converted.casts}. Nodes computing in float32 ({len(converted.kept)}), by reason:"
    )
    lines.append("")
    lines.append("| reason | nodes | e.g. |")
    lines.append("|---|---|---|")
    for reason, count in converted.reasons().items():
        example = next(k for k, v in converted.kept.items() if v == reason)
        lines.append(f"| {reason} | {count} | `{example}` |")
    ranged = [k for k, v in converted.kept.items() if v.startswith("range above")]
    if ranged:
        shown = ", ".join(f"`{k}`" for k in ranged[:50])
        more = f" and {len(ranged) - 50} more" if len(ranged) > 50 else ""
        lines.extend(["", f"Kept float32 for their recorded range: {shown}{more}."])
    lines.extend(["", *notes])
    return "\n".join(lines) + "\n"
