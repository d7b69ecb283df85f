"""The door to torch's internals (``fastonnx.torch_internals``): every name it offers, exercised against the
installed torch, failing with what changed; and no other module of the package using torch's private API."""

from __future__ import annotations

import dataclasses
import io
import pathlib
import re
import sys
import tokenize
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fastonnx import torch_internals as ti

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "fastonnx"


def _changed(name: str, relies_on: str, what: str) -> str:
    return f"torch changed {relies_on}: fastonnx.torch_internals.{name} relies on it ({what})"


def _check(ok: bool, name: str, relies_on: str, what: str) -> None:
    if not ok:
        pytest.fail(_changed(name, relies_on, what))


# ---- re-exported names ----------------------------------------------------------------------------


def test_pytree() -> None:
    used = ("tree_flatten", "tree_flatten_with_path", "tree_leaves", "tree_map", "tree_unflatten")
    used += ("register_pytree_node", "SUPPORTED_NODES", "SequenceKey", "TreeSpec")
    missing = [n for n in used if not hasattr(ti.pytree, n)]
    _check(not missing, "pytree", "torch.utils._pytree", f"missing {missing}")
    leaves, spec = ti.pytree.tree_flatten({"a": [1, 2], "b": (3,)})
    _check(
        leaves == [1, 2, 3] and isinstance(spec, ti.pytree.TreeSpec), "pytree", "tree_flatten", str(leaves)
    )
    _check(ti.pytree.tree_unflatten(leaves, spec) == {"a": [1, 2], "b": (3,)}, "pytree", "tree_unflatten", "")
    paths = [p for p, _ in ti.pytree.tree_flatten_with_path([[5]])[0]]
    _check(paths == [(ti.pytree.SequenceKey(0), ti.pytree.SequenceKey(0))], "pytree", "key paths", str(paths))


def test_OpOverload() -> None:
    _check(isinstance(torch.ops.aten.add.Tensor, ti.OpOverload), "OpOverload", "torch._ops.OpOverload", "")


def test_OpOverloadPacket() -> None:
    ok = isinstance(torch.ops.aten.add, ti.OpOverloadPacket)
    _check(ok, "OpOverloadPacket", "torch._ops.OpOverloadPacket", "")


def test_HigherOrderOperator() -> None:
    ok = isinstance(torch.ops.higher_order.cond, ti.HigherOrderOperator)
    _check(ok, "HigherOrderOperator", "torch._ops.HigherOrderOperator", "torch.ops.higher_order.cond")


def test_FakeTensor() -> None:
    with ti.FakeTensorMode():
        t = torch.empty(2, 3)
    _check(
        isinstance(t, ti.FakeTensor),
        "FakeTensor",
        "torch._subclasses.fake_tensor.FakeTensor",
        type(t).__name__,
    )


def test_FakeTensorMode() -> None:
    mode = ti.FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        t = torch.ones(2) + torch.zeros(2, device="cpu")
    _check(isinstance(t, ti.FakeTensor) and t.shape == (2,), "FakeTensorMode", "FakeTensorMode", str(t))


def test_unset_fake_temporarily() -> None:
    with ti.FakeTensorMode():
        with ti.unset_fake_temporarily():
            real = torch.zeros(1)
    _check(not isinstance(real, ti.FakeTensor), "unset_fake_temporarily", "unset_fake_temporarily", "")


class _Recording(ti.TorchDispatchMode):  # type: ignore[no-untyped-call, misc]
    """Records the ops dispatched while it is on."""

    def __init__(self, seen: list[Any]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def test_TorchDispatchMode() -> None:
    seen: list[Any] = []

    with _Recording(seen):
        torch.ones(2) + 1
    ok = torch.ops.aten.add.Tensor in seen
    _check(ok, "TorchDispatchMode", "torch.utils._python_dispatch.TorchDispatchMode", str(seen))


def test_is_traceable_wrapper_subclass() -> None:
    ok = ti.is_traceable_wrapper_subclass(torch.zeros(1)) is False
    _check(ok, "is_traceable_wrapper_subclass", "torch.utils._python_dispatch", "a plain tensor")


def test_DimHint() -> None:
    auto, dynamic = torch.export.Dim.AUTO, torch.export.Dim.DYNAMIC
    ok = isinstance(auto, ti.DimHint) and isinstance(dynamic, ti.DimHint)
    _check(ok, "DimHint", "torch.export.dynamic_shapes._DimHint", "Dim.AUTO / Dim.DYNAMIC")


def test_DimHintType() -> None:
    auto, dynamic = torch.export.Dim.AUTO, torch.export.Dim.DYNAMIC
    ok = auto.type == ti.DimHintType.AUTO and dynamic.type == ti.DimHintType.DYNAMIC
    _check(ok, "DimHintType", "torch.export.dynamic_shapes._DimHintType", "Dim.AUTO.type")


def test_DerivedDim() -> None:
    n = torch.export.Dim("n")
    ok = isinstance(2 * n, ti.DerivedDim) and not isinstance(n, ti.DerivedDim)
    _check(ok, "DerivedDim", "torch.export.dynamic_shapes._DerivedDim", "2 * Dim('n')")


def test_LazyGraphModule() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.neg.default, (x,)))
    gm = ti.LazyGraphModule(torch.nn.Module(), graph)
    ok = isinstance(gm, torch.fx.GraphModule) and bool(gm(torch.ones(1)) == -1)
    _check(ok, "LazyGraphModule", "torch.fx._lazy_graph_module._LazyGraphModule", "")


def test_SLoc() -> None:
    fields = {f.name for f in dataclasses.fields(ti.SLoc)}
    ok = "maybe_user_loc" in fields and ti.SLoc.__dataclass_params__.frozen  # type: ignore[attr-defined]
    _check(ok, "SLoc", "torch._guards.SLoc", f"a frozen dataclass with maybe_user_loc: {fields}")


def test_TensorType() -> None:
    returns = ti.op_schema(torch.ops.aten.add.Tensor).returns
    ok = all(isinstance(r.type, ti.TensorType) for r in returns)
    _check(ok, "TensorType", "torch._C.TensorType", "aten.add.Tensor's return type")


def test_DropoutNd() -> None:
    kinds = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.AlphaDropout)
    ok = all(issubclass(k, ti.DropoutNd) for k in kinds)
    _check(ok, "DropoutNd", "torch.nn.modules.dropout._DropoutNd", "the base of nn.Dropout and its kin")


def test_NormBase() -> None:
    kinds = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.InstanceNorm2d)
    ok = all(issubclass(k, ti.NormBase) for k in kinds)
    _check(ok, "NormBase", "torch.nn.modules.batchnorm._NormBase", "the base of the batch / instance norms")


def test_VARIABLE_FUNCTIONS() -> None:
    missing = [
        n
        for n in ("lstm", "gru", "rnn_tanh", "rnn_relu")
        if not callable(getattr(ti.VARIABLE_FUNCTIONS, n, None))
    ]
    _check(not missing, "VARIABLE_FUNCTIONS", "torch._C._VariableFunctions", f"missing {missing}")


def test_DispatchModeWithoutDynamo() -> None:
    _check(
        hasattr(ti.TorchDispatchMode, "_should_skip_dynamo"),
        "DispatchModeWithoutDynamo",
        "TorchDispatchMode._should_skip_dynamo",
        "gone",
    )

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))

    mode = type("Mode", (ti.DispatchModeWithoutDynamo,), {"__torch_dispatch__": dispatch})
    ok = mode.__dict__["__torch_dispatch__"] is dispatch  # not wrapped in torch._dynamo.disable
    _check(ok, "DispatchModeWithoutDynamo", "TorchDispatchMode.__init_subclass__", "wrapped anyway")


# ---- operators ----------------------------------------------------------------------------------------


def test_op_schema() -> None:
    schema = ti.op_schema(torch.ops.aten.add.Tensor)
    names = [a.name for a in schema.arguments]
    ok = names == ["self", "other", "alpha"] and not schema.is_mutable
    ok = ok and ti.op_schema(torch.ops.aten.add_.Tensor).is_mutable
    _check(ok, "op_schema", "OpOverload._schema", str(schema))


def test_op_name() -> None:
    name = ti.op_name(torch.ops.aten.add.Tensor)
    _check(name == "add", "op_name", "OpOverload._opname", repr(name))


def test_op_overload_name() -> None:
    names = ti.op_overload_name(torch.ops.aten.add.Tensor), ti.op_overload_name(torch.ops.aten.neg.default)
    _check(names == ("Tensor", "default"), "op_overload_name", "OpOverload._overloadname", str(names))


def test_has_schema() -> None:
    ok = ti.has_schema("aten::add", "Tensor") and ti.has_schema("aten::neg", "")
    ok = ok and not ti.has_schema("aten::no_such_op", "")
    _check(ok, "has_schema", "torch._C._get_schema", "")


def test_has_composite_implicit_kernel() -> None:
    ok = ti.has_composite_implicit_kernel("aten::linear") and not ti.has_composite_implicit_kernel(
        "aten::add.Tensor"
    )
    _check(ok, "has_composite_implicit_kernel", "torch._C._dispatch_has_kernel_for_dispatch_key", "")
    with pytest.raises(RuntimeError):
        ti.has_composite_implicit_kernel("aten::no_such_op")


def test_no_dispatch() -> None:
    seen: list[Any] = []

    with _Recording(seen):
        with ti.no_dispatch():
            torch.empty_strided((2,), (1,), device="meta")
    _check(not seen, "no_dispatch", "torch._C._DisableTorchDispatch", f"the mode saw {seen}")


def test_vf_module() -> None:
    vf = ti.vf_module()
    ok = callable(getattr(vf, "lstm", None)) and "lstm" not in vf.__dict__
    vf.lstm = len  # shadows the C function; deleting restores it (capture/rnn_custom_ops.py)
    try:
        ok = ok and vf.lstm is len
    finally:
        del vf.lstm
    ok = ok and getattr(vf, "lstm", None) is not len and callable(vf.lstm)
    _check(ok, "vf_module", "torch._VF (attributes falling through to the C functions)", "")


# ---- tensors and modules -----------------------------------------------------------------------------


def test_storage_id() -> None:
    for device in ("cpu", "meta"):
        x = torch.empty(4, device=device)
        ok = ti.storage_id(x) == ti.storage_id(x[1:]) != ti.storage_id(torch.empty(4, device=device))
        _check(ok, "storage_id", "UntypedStorage._cdata", f"one id per storage on {device}")


def test_view_base() -> None:
    x = torch.ones(4)
    ok = ti.view_base(x.view(2, 2)) is x and ti.view_base(x) is None
    _check(ok, "view_base", "Tensor._base", "")


def test_module_buffers() -> None:
    bn = torch.nn.BatchNorm1d(2)
    buffers = ti.module_buffers(bn)
    ok = isinstance(buffers, dict) and buffers.get("running_mean") is bn.running_mean
    buffers["running_mean"] = torch.full((2,), 7.0)
    ok = ok and float(bn.running_mean[0]) == 7.0
    _check(ok, "module_buffers", "nn.Module._buffers (the live dict)", "")


def test_module_parameters() -> None:
    lin = torch.nn.Linear(2, 2)
    params = ti.module_parameters(lin)
    ok = isinstance(params, dict) and params.get("weight") is lin.weight
    new = torch.nn.Parameter(torch.zeros(2, 2))
    params["weight"] = new
    _check(ok and lin.weight is new, "module_parameters", "nn.Module._parameters (the live dict)", "")


def test_non_persistent_buffer_names() -> None:
    m = torch.nn.Module()
    m.register_buffer("kept", torch.zeros(1))
    m.register_buffer("dropped", torch.zeros(1), persistent=False)
    names = ti.non_persistent_buffer_names(m)
    _check(
        names == {"dropped"},
        "non_persistent_buffer_names",
        "nn.Module._non_persistent_buffers_set",
        str(names),
    )


def test_swap_child_modules() -> None:
    stack = torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.Tanh(), torch.nn.GELU()])
    kept = ti.swap_child_modules(stack, {"0": stack[2]})
    ok = (
        len(stack) == 1
        and isinstance(stack[0], torch.nn.GELU)
        and [type(m) for m in stack] == [torch.nn.GELU]
    )
    ti.swap_child_modules(stack, kept)
    ok = ok and len(stack) == 3 and isinstance(stack[1], torch.nn.Tanh)
    _check(ok, "swap_child_modules", "nn.Module._modules (what a ModuleList indexes and counts)", "")


# ---- FX graphs ---------------------------------------------------------------------------------------


def test_graph_used_names() -> None:
    graph = torch.fx.Graph()
    graph.placeholder("x")
    used = ti.graph_used_names(graph)
    ok = isinstance(used, set) and "x" in used
    used.discard("x")
    ok = ok and graph.placeholder("x").name == "x"  # the live set: a discarded name is free again
    _check(ok, "graph_used_names", "Graph._graph_namespace._used_names", str(used))


def test_rename_node() -> None:
    graph = torch.fx.Graph()
    graph.placeholder("a")
    b = graph.placeholder("b")
    ti.rename_node(b, "c")
    ti.rename_node(graph.placeholder("d"), "a")  # taken: suffixed
    names = [n.name for n in graph.nodes]
    ok = names[:2] == ["a", "c"] and names[2] != "a" and names[2].startswith("a")
    _check(ok, "rename_node", "Node._rename", str(names))


def test_set_plain_codegen() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.neg.default, (x,)))
    ti.set_plain_codegen(graph)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    ok = type(graph._codegen) is torch.fx.graph.CodeGen and bool(gm(torch.ones(1)) == -1)
    _check(ok, "set_plain_codegen", "Graph._codegen", "")


def _exported(dynamic: bool = False) -> torch.export.ExportedProgram:
    shapes = ({0: torch.export.Dim("n", min=2, max=64)},) if dynamic else None
    return torch.export.export(torch.nn.ReLU(), (torch.ones(3, 2),), dynamic_shapes=shapes, strict=False)


def test_set_graph_module() -> None:
    ep = _exported()
    gm = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph)
    ti.set_graph_module(ep, gm)
    _check(ep.graph_module is gm, "set_graph_module", "ExportedProgram._graph_module", "")


# ---- flags and configuration ------------------------------------------------------------------------


def _flags() -> tuple[bool, bool]:
    return torch.compiler.is_compiling(), torch.compiler.is_exporting()


def test_as_under_export() -> None:
    before = _flags()
    with ti.as_under_export():
        inside = _flags()
    ok = inside == (True, True) and _flags() == before
    _check(ok, "as_under_export", "torch.compiler._is_compiling_flag / _is_exporting_flag", str(inside))


def test_compiling_state() -> None:
    before = _flags()
    with ti.compiling_state():
        inside = _flags()
    ok = inside == (True, True) and _flags() == before
    _check(ok, "compiling_state", "torch._export.utils._compiling_state_context", str(inside))


def test_backed_size_oblivious() -> None:
    import torch.fx.experimental._config as config

    with ti.backed_size_oblivious():
        inside = config.backed_size_oblivious
    ok = inside is True and config.backed_size_oblivious is False
    _check(ok, "backed_size_oblivious", "torch.fx.experimental._config.backed_size_oblivious", "")


def test_onnx_exporting() -> None:
    with ti.onnx_exporting():
        inside = torch.onnx.is_in_onnx_export()
    ok = inside and not torch.onnx.is_in_onnx_export()
    _check(ok, "onnx_exporting", "torch.onnx._internal.exporter._flags._is_onnx_exporting", "")


# ---- symbolic shapes ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def symbolic() -> Iterator[tuple[torch.SymInt, Any]]:
    ep = _exported(dynamic=True)
    val = next(n for n in ep.graph.nodes if n.op == "placeholder").meta["val"]
    d = val.shape[0]
    assert isinstance(d, torch.SymInt)
    yield d, ti.shape_env_of_symint(d)


def test_shape_env_of_symint(symbolic: tuple[torch.SymInt, Any]) -> None:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    ok = isinstance(symbolic[1], ShapeEnv)
    _check(ok, "shape_env_of_symint", "SymInt.node.shape_env", type(symbolic[1]).__name__)


def test_symint_expr(symbolic: tuple[torch.SymInt, Any]) -> None:
    import sympy

    expr = ti.symint_expr(symbolic[0])
    ok = isinstance(expr, sympy.Symbol) and ti.symint_expr(symbolic[0] * 2 + 1) == 2 * expr + 1
    _check(ok, "symint_expr", "SymInt.node.expr (a sympy expression over the ShapeEnv's symbols)", repr(expr))


def test_symint_hint(symbolic: tuple[torch.SymInt, Any]) -> None:
    d = symbolic[0]
    ok = ti.symint_hint(d) == 3 and ti.symint_hint(d + 2) == 5
    _check(ok, "symint_hint", "SymInt.node.hint (the traced example value)", repr(ti.symint_hint(d)))


def test_input_guards() -> None:
    class Chunked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :4] if x.shape[1] > 4 else x  # a guard over x's length

    x = torch.randn(2, 6)
    ep = torch.export.export(Chunked(), (x,), dynamic_shapes=({1: torch.export.Dim.DYNAMIC},), strict=False)
    d = next(n for n in ep.graph.nodes if n.op == "placeholder").meta["val"].shape[1]
    env = ti.shape_env_of_symint(d)
    found = ti.input_guards(env)
    symbol = ti.symint_expr(d)
    ok = any(symbol in expr.free_symbols and isinstance(where, str) and where for expr, where in found)
    _check(ok, "input_guards", "ShapeEnv.guards (.expr, .sloc), ShapeEnv.replace", repr(found))


def test_scan() -> None:
    def step(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return carry + x, carry * x

    carry, ys = ti.scan(step, torch.zeros(3), torch.arange(12.0).reshape(4, 3))
    ok = (
        carry.tolist() == [18.0, 22.0, 26.0]
        and tuple(ys.shape) == (4, 3)
        and ys[1].tolist() == [0.0, 4.0, 10.0]
    )
    _check(ok, "scan", "torch._higher_order_ops.scan.scan(combine, init, xs)", f"{carry} {ys}")


def test_backed_values(symbolic: tuple[torch.SymInt, Any]) -> None:
    d, env = symbolic
    values = ti.backed_values(env)
    ok = int(values[d.node.expr]) == 3
    _check(ok, "backed_values", "ShapeEnv.backed_var_to_val", str(dict(values)))


def test_check_size() -> None:
    # a size fact told under torch.export becomes the dim's range (the upper bound the model declares)
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            ti.check_size(x.shape[0] <= 8)
            return x * 2

    ep = torch.export.export(Model(), (torch.randn(3),), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    ranges = [(int(r.lower), int(r.upper)) for r in ep.range_constraints.values()]
    _check(ranges == [(2, 8)], "check_size", "torch._check", str(ranges))


def test_value_ranges(symbolic: tuple[torch.SymInt, Any]) -> None:
    d, env = symbolic
    r = ti.value_ranges(env)[d.node.expr]
    ok = int(r.lower) == 2 and int(r.upper) == 64
    _check(ok, "value_ranges", "ShapeEnv.var_to_range (ValueRanges .lower / .upper)", str(r))


def test_guard_namespace() -> None:
    import math

    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod

    a = sympy.Symbol("a", integer=True, positive=True)
    code = ti.sympy_python(FloorDiv(a, 2) + Mod(a, 3))
    fn = eval(f"lambda a: {code}", {**ti.guard_namespace(), "math": math})
    _check(fn(7) == 4, "guard_namespace", "torch.fx.experimental.symbolic_shapes.SYMPY_INTERP", code)


def test_sympy_python() -> None:
    import sympy

    a, b = sympy.symbols("a b", integer=True, positive=True)
    text = ti.sympy_python(sympy.Max(a, 2) + b)
    ok = ("max(" in text or "Max(" in text) and "b" in text
    _check(ok, "sympy_python", "torch.utils._sympy.printers.PythonPrinter", text)


def test_user_guard_locations() -> None:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    frames: list[Any] = []

    def user_line(frame: Any) -> str | None:
        frames.append(frame)
        return "model.py:1"

    env = ShapeEnv()
    plain = env._get_sloc()
    with ti.user_guard_locations(user_line):
        sloc = env._get_sloc()
    after = env._get_sloc()
    ok = isinstance(sloc, ti.SLoc) and sloc.maybe_user_loc == "model.py:1" and frames
    ok = ok and frames[0].f_code is test_user_guard_locations.__code__  # the caller's frame
    ok = ok and after.maybe_user_loc == plain.maybe_user_loc
    _check(bool(ok), "user_guard_locations", "ShapeEnv._get_sloc(framework_loc) -> SLoc", str(sloc))


def test_fake_mode_with_shape_env() -> None:
    mode = ti.fake_mode_with_shape_env()
    with mode:
        t = torch.zeros(2, 3) + torch.ones(3)  # a real tensor taken too
    ok = mode.shape_env is not None and isinstance(t, ti.FakeTensor)
    _check(
        ok, "fake_mode_with_shape_env", "FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)", ""
    )


# ---- torch.compile -----------------------------------------------------------------------------------


def test_aot_autograd() -> None:
    def compiler(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        return gm

    backend = ti.aot_autograd(fw_compiler=compiler)
    _check(callable(backend), "aot_autograd", "torch._dynamo.backends.common.aot_autograd", repr(backend))


def test_core_aten_decompositions() -> None:
    table = ti.core_aten_decompositions()
    ok = len(table) > 100 and all(isinstance(k, (ti.OpOverload, ti.OpOverloadPacket)) for k in table)
    _check(ok, "core_aten_decompositions", "torch._decomp.core_aten_decompositions", f"{len(table)} entries")


def test_mark_boxed_call() -> None:
    from torch._functorch.aot_autograd import make_boxed_func

    def fn(args: list[Any]) -> Any:
        return args

    ti.mark_boxed_call(fn)
    torch_marked = make_boxed_func(lambda *a: a)
    ok = getattr(fn, "_boxed_call", False) is True and getattr(torch_marked, "_boxed_call", False) is True
    _check(ok, "mark_boxed_call", "aot_autograd's _boxed_call mark (make_boxed_func)", "")


def test_dynamo_backend_registered() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    name = "fastonnx_test_registered_backend"
    absent = ti.dynamo_backend_registered(name)
    register_backend(lambda gm, inputs: gm, name=name)
    try:
        ok = not absent and ti.dynamo_backend_registered(name)
    finally:
        _COMPILER_FNS.pop(name, None)
    _check(ok, "dynamo_backend_registered", "torch._dynamo.backends.registry._COMPILER_FNS", "")


def test_register_dynamo_backend() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, lookup_backend

    name = "fastonnx_test_internals_backend"

    def backend(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        return gm

    ti.register_dynamo_backend(backend, name)
    try:
        ok = ti.dynamo_backend_registered(name) and lookup_backend(name) is backend
    finally:
        _COMPILER_FNS.pop(name, None)
    _check(ok, "register_dynamo_backend", "torch._dynamo.backends.registry.register_backend", "")


def test_every_name_has_a_test() -> None:
    tested = {name[len("test_") :] for name in globals() if name.startswith("test_")}
    missing = sorted(set(ti.__all__) - tested)
    assert not missing, f"fastonnx.torch_internals names without a test here: {missing}"
    public = {n for n in vars(ti) if not n.startswith("_")} - {"annotations", "Any"}
    public -= {n for n, v in vars(ti).items() if type(v) is type(sys)}  # modules: torch, contextlib...
    public -= {"Callable", "Iterator", "Mapping", "Sequence", "FrameType"}
    unlisted = sorted(public - set(ti.__all__))
    assert not unlisted, f"fastonnx.torch_internals names missing from __all__: {unlisted}"


# ---- the door stays the only one ---------------------------------------------------------------------

# In code (strings and comments blanked): a private torch module or attribute spelled out
# (torch._C, torch.utils._pytree, torch.compiler._is_exporting_flag; torch.ops.aten._foo is an op, public)
_PRIVATE_PATH = re.compile(r"\btorch\.(?!ops\.)(?:[A-Za-z]\w*\.)*_[A-Za-z]")
# private names imported from a torch module: from torch.export.dynamic_shapes import _DimHint
_PRIVATE_IMPORT = re.compile(r"\bfrom\s+torch[\w.]*\s+import\s+(\([^)]*\)|[^\n]*)")
# private attributes of torch objects fastonnx has used (each now behind a door function)
_PRIVATE_ATTRIBUTES = re.compile(
    r"(?<!self)\.(_modules|_buffers|_parameters|_non_persistent_buffers_set|_base|_schema|_opname|_overloadname"
    r"|_codegen|_graph_module|_graph_namespace|_used_names|_rename|_get_sloc|_cdata|_boxed_call|_VF"
    r"|_is_compiling_flag|_is_exporting_flag|_is_onnx_exporting|backed_var_to_val|var_to_val"
    r"|var_to_range|shape_env|sloc|maybe_user_loc)\b|\.node\.(expr|hint)\b|\benv\.(guards|replace)\b"
    r"|\bdef _should_skip_dynamo\b"
)
# strings: op names that start with an underscore (registry keys), not private uses
_STRING_PATH = re.compile(r"^torch(\.\w+)+$")
ALLOWED_STRINGS = {"torch._sym_sqrt"}  # the FX target of torch.sym_sqrt, a key of converters/symbolic.py
DOOR = PACKAGE / "torch_internals.py"


def _code_and_strings(source: str) -> tuple[str, list[tuple[int, str]]]:
    """``source`` with its strings and comments blanked (f-strings' expressions kept), and the strings."""
    lines = source.splitlines(keepends=True)
    blank = [list(line) for line in lines]
    strings = []
    kinds = {tokenize.STRING, tokenize.COMMENT}
    kinds |= {getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in kinds:
            continue
        if tok.type == tokenize.STRING:
            strings.append((tok.start[0], tok.string))
        (r0, c0), (r1, c1) = tok.start, tok.end
        for r in range(r0, r1 + 1):
            row = blank[r - 1]
            start, stop = (c0 if r == r0 else 0), (c1 if r == r1 else len(row))
            for c in range(start, min(stop, len(row))):
                if row[c] != "\n":
                    row[c] = " "
    return "".join("".join(row) for row in blank), strings


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, text) of each private torch use in ``source`` (see the patterns above)."""
    code, strings = _code_and_strings(source)
    found = []
    for pattern in (_PRIVATE_PATH, _PRIVATE_ATTRIBUTES):
        found += [(code.count("\n", 0, m.start()) + 1, m.group(0)) for m in pattern.finditer(code)]
    for m in _PRIVATE_IMPORT.finditer(code):
        names = [n.strip().split(" ")[0] for n in m.group(1).strip("()").split(",")]
        if any(n.startswith("_") for n in names):
            found.append((code.count("\n", 0, m.start()) + 1, m.group(0).strip()))
    for line, text in strings:
        value = text.strip("'\"")
        if _STRING_PATH.match(value) and _PRIVATE_PATH.search(value) and value not in ALLOWED_STRINGS:
            found.append((line, text))
    return sorted(set(found))


def test_scanner_finds_private_uses() -> None:
    sample = (
        "import torch.utils._pytree as pytree\n"
        "from torch.export.dynamic_shapes import (\n    Dim,\n    _DimHint,\n)\n"
        "x = torch._C._get_schema  # torch._C in a comment is fine\n"
        "y = t._base\n"
        "z = 'aten._to_copy.default'\n"
        "w = torch.ops.aten._to_copy.default\n"
        "k = 'torch._sym_sqrt'\n"
        "m = 'torch._dynamo'\n"
        "e = d.node.expr + shape_env.guards[0].sloc\n"
        "n = fx_node.name\n"
    )
    lines = sorted({line for line, _ in private_uses(sample)})
    assert lines == [1, 2, 6, 7, 11, 12], private_uses(sample)


def test_no_private_torch_use_outside_the_door() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != DOOR
        for line, text in private_uses(path.read_text())
    ]
    assert not found, (
        "private torch uses outside fastonnx/torch_internals.py (add a door there):\n" + "\n".join(found)
    )
