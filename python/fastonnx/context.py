"""What a converter sees: the builder, the node being converted, and helpers to emit ONNX nodes.

A converter is a plain function ``convert_x(ctx, *args, **kwargs) -> str | Sequence[str | None]``. The
interpreter passes the FX node's args and kwargs as they are, except that every FX node in them
(also inside lists) is replaced by the ``Value`` it was converted to. A converter returns the ONNX value
name(s) holding the node's result; the interpreter records their dtype and shape from the FX metadata.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, overload

import numpy as np
import torch

from fastonnx import dtypes
from fastonnx._core import GraphBuilder, TensorAttr
from fastonnx.errors import ConversionError, OpsetError
from fastonnx.torch_internals import symint_expr

Dim = int | str | None
# fn(ctx, *args, **kwargs) -> the ONNX value name(s) of the op's result (see fastonnx.registry)
Converter = Callable[..., Any]


class Value:
    """An ONNX value produced for an FX node, with the dtype and shape torch recorded for it.

    ``shape`` holds ints for static dims and ``torch.SymInt`` for dynamic ones, as in ``node.meta["val"]``.
    Symbolic scalars (SymInt / SymFloat / SymBool results) are 0-d tensors of int64 / float32 / bool.
    """

    __slots__ = ("dtype", "name", "shape")

    def __init__(self, name: str, dtype: torch.dtype, shape: tuple[Any, ...]) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    def static_shape(self) -> tuple[int, ...] | None:
        """The shape as ints, or None when a dim is symbolic."""
        if all(isinstance(d, int) for d in self.shape):
            return tuple(self.shape)
        return None

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.dtype}, {tuple(self.shape)})"


Operand = Value | str | None


def _name(x: Operand) -> str:
    if x is None:
        return ""
    if isinstance(x, Value):
        return x.name
    if isinstance(x, str):
        return x
    raise TypeError(f"expected an ONNX value (Value or name), got {type(x).__name__}: {x!r}")


def sym_to_dim(d: Any, names: dict[str, str] | None = None) -> Dim:
    """A torch dim (int or SymInt) as a builder dim: int when known, else its expression over the
    readable names of the symbols ("batch", "seq+1")."""
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt):
        expr = symint_expr(d)
        if expr.is_number:
            return int(expr)
        if names:
            import sympy

            expr = expr.xreplace(
                {s: sympy.Symbol(names[str(s)]) for s in expr.free_symbols if str(s) in names}
            )
        return str(expr).replace(" ", "")
    return None


# Complex tensors are stored as real tensors with a trailing dim of 2 (real, imag): torch.view_as_real's
# layout. onnxruntime has no complex kernels, so a complex dtype never reaches the ONNX graph.
COMPLEX_PARTS: dict[torch.dtype, torch.dtype] = {
    torch.complex32: torch.float16,
    torch.complex64: torch.float32,
    torch.complex128: torch.float64,
}


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of ``dtype`` has in the ONNX graph: the part dtype of a complex one."""
    return COMPLEX_PARTS.get(dtype, dtype)


def val_dtype(val: Any) -> torch.dtype:
    """The dtype of what torch recorded for a value: a tensor's, or the tensor type of a scalar."""
    if isinstance(val, torch.Tensor):
        return val.dtype
    if isinstance(val, (torch.SymBool, bool)):
        return torch.bool
    if isinstance(val, (torch.SymInt, int)):
        return torch.int64
    if isinstance(val, (torch.SymFloat, float)):
        return torch.float32
    raise TypeError(f"no dtype for {type(val).__name__} {val!r}")


class ConversionContext:
    """Passed to every converter: the builder, the opset, the current FX node, emit helpers."""

    def __init__(self, builder: GraphBuilder, opset: int) -> None:
        self.g = builder
        self.opset = opset
        self.node: torch.fx.Node | None = None
        # When the node's first argument is a view (or another alias: an in-place op's result, a split
        # piece) of a base tensor, the walker's alias tracking gives the base FX node and its current
        # value here, set for the node being converted (None otherwise): ops that read the storage
        # rather than the view (as_strided) work from the base's layout (base_node.meta["val"]).
        self.base_node: torch.fx.Node | None = None
        self.base: Value | None = None
        # symbol text ("s17") -> readable dim name ("batch"); see dynamic.py
        self.dim_names: dict[str, str] = {}
        # symbol text -> (graph input, axis) it is read from; filled by the interpreter per input dim
        self.sym_sources: dict[str, tuple[str, int]] = {}
        # symbol text -> ONNX 0-d int64 value holding it, created on first use
        self.sym_values: dict[str, str] = {}
        # the walker's search for a dim no table holds: a top-graph value computed so far that has a
        # dim of that text (data-dependent sizes such as "Min(150, u2)" are no graph input's dims)
        self.find_dim: Callable[[str], tuple[str, int] | None] | None = None
        # initializer name -> the torch tensor it borrows, for converters that lay a weight out anew
        # at export (recurrent gate orders) instead of reshuffling it at every run
        self.weights: dict[str, torch.Tensor] = {}

    def dim(self, d: Any) -> Dim:
        """A torch dim as written in the ONNX graph: int, or a readable symbolic name/expression."""
        return sym_to_dim(d, self.dim_names)

    def require_dtype(self, dtype: torch.dtype | None) -> None:
        """OpsetError when the target opset predates ``dtype`` (float8 types exist from opset 19,
        float4 e2m1 from 23)."""
        minimum = dtypes.MIN_OPSET_OF.get(dtype) if dtype is not None else None
        if minimum is not None and self.opset < minimum:
            kind = "float4" if dtype in dtypes.PACKED_X2 else "float8"
            raise OpsetError(
                f"{dtype} tensors need opset >= {minimum} (the first opset defining ONNX's {kind} "
                f"types), the export targets opset {self.opset}"
            )

    def onnx_type(self, dtype: torch.dtype, shape: Sequence[Any]) -> tuple[int, list[Dim]]:
        """The ONNX element type and dims of a torch value; a complex one gets a trailing dim of 2, a
        float4_e2m1fn_x2 one (two 4-bit values per torch element) a last dim twice torch's."""
        self.require_dtype(dtype)
        dims = [self.dim(d) for d in shape]
        if dtype in COMPLEX_PARTS:
            return dtypes.to_onnx_dtype(COMPLEX_PARTS[dtype]), [*dims, 2]
        if dtype in dtypes.PACKED_X2:
            try:
                dims = dtypes.onnx_dims(dtype, dims)
            except TypeError as e:
                raise ConversionError(str(e)) from None
        return dtypes.to_onnx_dtype(dtype), dims

    # ---- the node being converted -------------------------------------------------------------
    @property
    def out(self) -> Any:
        """``node.meta["val"]`` of the node being converted (FakeTensor, tuple of them, SymInt…)."""
        assert self.node is not None
        return self.node.meta.get("val")

    @property
    def out_dtype(self) -> torch.dtype:
        val = self.out
        if isinstance(val, (list, tuple)):
            val = val[0]
        try:
            return val_dtype(val)
        except TypeError:
            raise self.error(f"no dtype recorded for the output (meta val {val!r})") from None

    @property
    def out_shape(self) -> tuple[Any, ...]:
        val = self.out
        if isinstance(val, (list, tuple)):
            val = val[0]
        if isinstance(val, torch.Tensor):
            return tuple(val.shape)
        return ()

    def error(self, message: str) -> ConversionError:
        """A ConversionError for the current node (the interpreter adds node name and source line)."""
        return ConversionError(message)

    def require_opset(self, minimum: int, what: str) -> None:
        if self.opset < minimum:
            raise OpsetError(f"{what} needs opset >= {minimum}, the export targets opset {self.opset}")

    # ---- emitting -------------------------------------------------------------------------------
    # one output name without ``outputs``, a list of names with it
    @overload
    def op(
        self, op_type: str, *inputs: Operand, outputs: None = None, domain: str = "", **attrs: Any
    ) -> str: ...
    @overload
    def op(
        self, op_type: str, *inputs: Operand, outputs: int | Sequence[str], domain: str = "", **attrs: Any
    ) -> list[str]: ...
    def op(
        self,
        op_type: str,
        *inputs: Operand,
        outputs: int | Sequence[str] | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> str | list[str]:
        """Add one node. Returns its output name, or a list of names when ``outputs`` is given.

        Trailing ``None`` inputs are dropped, inner ones become "" (omitted optional input).
        """
        names = [_name(x) for x in inputs]
        while names and names[-1] == "":
            names.pop()
        clean = {k: v for k, v in attrs.items() if v is not None}
        result = self.g.add_node(op_type, names, 1 if outputs is None else outputs, clean, domain)
        return result[0] if outputs is None else result

    def const(self, value: Any, dtype: torch.dtype, hint: str = "const") -> str:
        """A constant (scalar → 0-d, nested lists / arrays → their shape) of ``dtype``, deduplicated."""
        self.require_dtype(dtype)
        if isinstance(value, torch.Tensor):
            t = value.detach().to(dtype).contiguous()
        else:
            t = torch.tensor(value, dtype=dtype)
        raw = dtypes.tensor_bytes(t).tobytes()
        return self.g.add_constant(raw, dtypes.to_onnx_dtype(dtype), list(t.shape), hint)

    def i64(self, values: int | Sequence[int]) -> str:
        """An int64 constant: an int gives a 0-d tensor, a sequence a 1-D tensor."""
        if isinstance(values, int):
            return self.const(values, torch.int64)
        return self.g.add_constant(
            np.asarray(list(values), dtype=np.int64).tobytes(), dtypes.INT64, [len(values)], "const"
        )

    def tensor_attr(self, value: float | int | bool, dtype: torch.dtype) -> TensorAttr:
        """A one-element tensor attribute (ConstantOfShape's value). A float4 e2m1 one is one ONNX
        element (its code in the low nibble of one byte): torch has no float4 scalar to convert."""
        if dtype in dtypes.PACKED_X2:
            self.require_dtype(dtype)
            try:
                code = dtypes.e2m1_code(value)
            except ValueError as e:
                raise self.error(str(e)) from None
            return TensorAttr(bytes([code]), dtypes.to_onnx_dtype(dtype), [1])
        t = torch.tensor([value], dtype=dtype)
        return TensorAttr(dtypes.tensor_bytes(t).tobytes(), dtypes.to_onnx_dtype(dtype), [1])

    # ---- what is known about a value ----------------------------------------------------------
    def dtype(self, x: Operand) -> torch.dtype | None:
        if isinstance(x, Value):
            return x.dtype
        dt = self.g.dtype(_name(x))
        return None if not dt else dtypes.to_torch_dtype(dt)

    def rank(self, x: Operand) -> int | None:
        if isinstance(x, Value):
            return x.rank
        return self.g.rank(_name(x))

    def cast(self, x: Operand, dtype: torch.dtype) -> str:
        """``x`` as ``dtype``: the same name when it already is, a Cast node otherwise."""
        if self.dtype(x) == dtype:
            return _name(x)
        self.require_dtype(dtype)
        self.require_dtype(self.dtype(x))  # a float8 weight read at an opset without float8
        return self.op("Cast", x, to=dtypes.to_onnx_dtype(dtype))

    def operand(self, x: Any, dtype: torch.dtype) -> str:
        """A tensor or Python scalar as an ONNX value of ``dtype`` (explicit type promotion)."""
        if isinstance(x, (Value, str)):
            return self.cast(x, dtype)
        if isinstance(x, (bool, int, float)):
            return self.const(x, dtype)
        raise self.error(f"cannot use {type(x).__name__} {x!r} as a tensor operand")

    # ---- shapes as tensors ----------------------------------------------------------------------
    def shape_tensor(self, dims: Sequence[Any]) -> str:
        """A 1-D int64 tensor from ints and symbolic scalars (Values of SymInt nodes)."""
        if all(isinstance(d, int) for d in dims):
            return self.i64([int(d) for d in dims])
        return self.concat_dims(
            [d if isinstance(d, int) else self.unsqueeze0(self.sym_value(d)) for d in dims]
        )

    def concat_dims(self, parts: Sequence[int | str]) -> str:
        """One 1-D int64 shape tensor from ints and 1-element 1-D int64 values: the one place shape
        tensors are assembled (runs of ints become one constant, a single part is used as it is)."""
        pieces: list[str] = []
        run: list[int] = []
        for p in parts:
            if isinstance(p, int):
                run.append(p)
                continue
            if run:
                pieces.append(self.i64(run))
                run = []
            pieces.append(p)
        if run:
            pieces.append(self.i64(run))
        return pieces[0] if len(pieces) == 1 else self.op("Concat", *pieces, axis=0)

    def unsqueeze0(self, x: Operand) -> str:
        """A 0-d value as a 1-element 1-D tensor (a 1-D one is returned as it is)."""
        if self.rank(x) == 1:
            return _name(x)
        return self.op("Unsqueeze", x, self.i64([0]))

    def sym_value(self, d: Any) -> str:
        """The ONNX value (0-d int64) of a symbolic dim: a Value of a SymInt node or a torch.SymInt."""
        if isinstance(d, Value):
            return self.cast(d, torch.int64)
        if isinstance(d, str):
            return d
        if isinstance(d, torch.SymInt):
            key = str(self.dim(d))
            if key in self.sym_values:
                return self.sym_values[key]
            if key not in self.sym_sources and self.find_dim is not None:
                found = self.find_dim(key)
                if found is not None:
                    self.sym_sources[key] = found
            if key in self.sym_sources:
                source, axis = self.sym_sources[key]
                value = self.op("Squeeze", self.op("Shape", source, start=axis, end=axis + 1), self.i64([0]))
                self.sym_values[key] = value
                return value
            raise self.error(
                f"symbolic dimension {key!r} is not available as a value; it is not a dim of any graph "
                "input nor of any value computed before this node"
            )
        raise self.error(f"expected a symbolic dimension, got {type(d).__name__} {d!r}")

    def dims_of(self, x: Value) -> str:
        """The runtime shape of ``x`` (1-D int64): a constant when static, a Shape node otherwise."""
        static = x.static_shape()
        if static is not None:
            return self.i64(list(static))
        return self.op("Shape", x)


class Walker(Protocol):
    """The interpreter as the converters of higher-order ops (control flow) use it: they convert their
    subgraphs through it, so they are called as ``fn(walker, node)`` instead of ``fn(ctx, *args)``."""

    ctx: ConversionContext
    g: GraphBuilder
    env: dict[torch.fx.Node, Any]

    def map_arg(self, a: Any) -> Any:
        """An FX argument with every node replaced by what it was converted to."""
        ...

    def run_subgraph(self, graph: torch.fx.Graph, operands: Sequence[Any]) -> Any:
        """Convert ``graph`` in place, its placeholders bound to ``operands``; returns its outputs."""
        ...

    def emitting_into(self, sub: GraphBuilder) -> contextlib.AbstractContextManager[None]:
        """Converters emit into ``sub`` (a subgraph builder) inside the block."""
        ...
