"""torch.compile(model, backend="fastonnx"): the model suites' small configs match eager in
onnxruntime, dynamic dims do not recompile, unsupported ops fall back to eager with one warning."""

from __future__ import annotations

import importlib
import importlib.metadata
import pathlib
import tomllib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

import fastonnx
from fastonnx import compile_backend
from support.matrix import sampled
from support.model_zoo import MLP, TRANSFORMERS_MODELS, SmallCNN, with_calibrated_batchnorm

# onnxruntime vs eager on these float32 models of O(1) outputs: float32 rounding (as in
# test_transformers_models / test_models)
ATOL, RTOL = 1e-5, 1e-4
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    counters.clear()


def _no_fallback(backend: fastonnx.FastOnnxBackend) -> None:
    assert backend.stats, "the backend compiled no graph"
    for s in backend.stats:
        assert not s.fell_back, f"{s.name} fell back: {s.reason}"
        assert s.onnx_nodes > 0


# ---- registration -----------------------------------------------------------------------------
def test_entry_points_are_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = project["project"]["entry-points"]["torch_dynamo_backends"]
    assert set(declared) == set(compile_backend.BACKEND_NAMES)
    for name, value in declared.items():
        module, attr = value.split(":")
        fn = getattr(importlib.import_module(module), attr)
        assert fn is getattr(compile_backend, f"{name}_backend")
    # once the package is (re)installed, the metadata holds the same entry points
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")}
    for name in compile_backend.BACKEND_NAMES:
        if name in installed:
            assert installed[name] == declared[name]


def test_backend_by_name() -> None:
    compile_backend.register_by_name()  # a no-op once the entry points are installed
    model, x = MLP().eval(), torch.randn(3, 16)
    before = len(compile_backend.default_backend().stats)
    with torch.no_grad():
        got = torch.compile(model, backend="fastonnx")(x)
        expected = model(x)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    new = compile_backend.default_backend().stats[before:]
    assert [s.fell_back for s in new] == [False]


def test_backend_options_are_checked() -> None:
    with pytest.raises(fastonnx.InputError, match="optimize"):
        fastonnx.backend(optimize="fast")
    with pytest.raises(fastonnx.InputError, match="reference evaluator"):
        fastonnx.debug_backend(optimize="onnxruntime")
    with pytest.raises(fastonnx.InputError, match="debug=True"):
        fastonnx.backend(check=True)
    with pytest.raises(fastonnx.InputError, match="unknown fastonnx backend"):
        compile_backend.default_backend("inductor")


# ---- the model suites -------------------------------------------------------------------------
def _resnet18() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = with_calibrated_batchnorm(torchvision.models.resnet18(weights=None, num_classes=10), 32)
    return model, (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def _cnn() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    model = with_calibrated_batchnorm(SmallCNN(), 16)
    return model, (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)),)


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    **{name: TRANSFORMERS_MODELS[name] for name in ("llama", "gpt2", "bert", "t5", "vit", "convnext")},
    "small_cnn": _cnn,
    "resnet18": _resnet18,
}


# T5 (an encoder-decoder through the backend) and ConvNeXt (ResNet-18 and the CNN run) under the full matrix
@pytest.mark.parametrize("name", sampled(sorted(MODELS), lambda name: name not in ("t5", "convnext")))
def test_model_matches_eager(name: str) -> None:
    model, args = MODELS[name]()
    backend = fastonnx.backend()
    with torch.no_grad():
        expected = model(*args)
        got = torch.compile(model, backend=backend)(*args)
    assert float(expected.abs().max()) > 1e-2, "eager output is ~0: the comparison could not fail"
    # a 5e-5 floor for resnet's O(1) logits through 20 convolutions (as test_models.test_resnet18)
    atol = 5e-5 if name == "resnet18" else ATOL
    torch.testing.assert_close(got, expected, atol=atol, rtol=RTOL)
    _no_fallback(backend)


# BERT (an encoder's mask: the same dynamic dims) under the full matrix
@pytest.mark.parametrize("name", sampled(["llama", "bert"], lambda name: name == "llama"))
def test_dynamic_batch_and_sequence_do_not_recompile(name: str) -> None:
    model, _ = TRANSFORMERS_MODELS[name]()
    backend = fastonnx.backend()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    g = torch.Generator().manual_seed(0)
    graphs = []
    # sizes >= 2: dynamo specialises size-1 dims whatever the backend
    for batch, seq in [(2, 8), (3, 5), (4, 11)]:
        ids = torch.randint(3, 128, (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq - 2 :] = 0
        with torch.no_grad():
            torch.testing.assert_close(compiled(ids, mask), model(ids, mask), atol=ATOL, rtol=RTOL)
        graphs.append((counters["stats"]["unique_graphs"], len(backend.stats)))
    assert graphs[0][0] >= 1
    assert graphs == [graphs[0]] * 3, f"recompiled: (dynamo graphs, backend graphs) per call {graphs}"
    _no_fallback(backend)
    assert all(s.dynamic_inputs > 0 for s in backend.stats)


def test_marked_dynamic_dim_keeps_one_session() -> None:
    model = MLP().eval()
    backend = fastonnx.backend()
    compiled = torch.compile(model, backend=backend)
    for batch in (3, 6, 9):
        x = torch.randn(batch, 16)
        torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)
    assert len(backend.stats) == 1 and backend.stats[0].dynamic_inputs == 1
    _no_fallback(backend)


def test_static_shapes_compile_one_graph_per_signature() -> None:
    model = MLP().eval()
    backend = fastonnx.backend()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    for batch in (3, 5):
        x = torch.randn(batch, 16)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)
    assert len(backend.stats) == 2 and all(s.dynamic_inputs == 0 for s in backend.stats)
    _no_fallback(backend)


def test_non_contiguous_and_bool_inputs() -> None:
    def f(x: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.where(keep, x.sin(), x)
        return y, y > 0

    backend = fastonnx.backend()
    x = torch.randn(6, 4).t()  # a transposed view: not contiguous
    keep = torch.rand(4, 6) > 0.5
    got = torch.compile(f, backend=backend)(x, keep)
    expected = f(x, keep)
    torch.testing.assert_close(got[0], expected[0], atol=ATOL, rtol=RTOL)
    assert torch.equal(got[1], expected[1])
    _no_fallback(backend)


# ---- fallback ---------------------------------------------------------------------------------
@torch.library.custom_op("fastonnx_test::backend_mystery", mutates_args=())
def backend_mystery(x: torch.Tensor) -> torch.Tensor:
    """An op fastonnx has no converter for."""
    return x * 3 + 1


@backend_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UsesMystery(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return backend_mystery(x.relu()).sum(-1)


def test_unsupported_op_falls_back_with_one_warning() -> None:
    model = UsesMystery()
    backend = fastonnx.backend()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (2, 3):  # two static graphs, both falling back
            x = torch.randn(batch, 5)
            torch.testing.assert_close(compiled(x), model(x))
    fallbacks = [w for w in caught if issubclass(w.category, compile_backend.FallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in fallbacks]
    assert "fastonnx_test.backend_mystery.default" in str(fallbacks[0].message)
    assert len(backend.stats) == 2
    for s in backend.stats:
        assert s.fell_back and s.missing_ops == ["fastonnx_test.backend_mystery.default"]


def test_fallback_false_raises_naming_the_op() -> None:
    compiled = torch.compile(UsesMystery(), backend=fastonnx.backend(fallback=False))
    with pytest.raises(Exception, match="no converter for fastonnx_test.backend_mystery.default") as info:
        compiled(torch.randn(2, 5))
    chain: list[BaseException] = []
    e: BaseException | None = info.value
    while e is not None and len(chain) < 10:
        chain.append(e)
        # dynamo wraps a backend's error (BackendCompilerFailed keeps it as inner_exception)
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    assert any(isinstance(x, fastonnx.UnsupportedOpError) for x in chain)


def test_custom_converter_avoids_the_fallback() -> None:
    def mystery_converter(ctx: Any, x: Any) -> str:
        return ctx.op("Add", ctx.op("Mul", x, ctx.const(3.0, x.dtype)), ctx.const(1.0, x.dtype))

    backend = fastonnx.backend(
        custom_converters={torch.ops.fastonnx_test.backend_mystery.default: mystery_converter}
    )
    model, x = UsesMystery(), torch.randn(4, 5)
    torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x), atol=ATOL, rtol=RTOL)
    _no_fallback(backend)


# ---- the GraphModule entry --------------------------------------------------------------------
def test_graph_module_to_onnx_with_symbolic_sizes() -> None:
    def f(w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        y = torch.ops.prims.convert_element_type.default(x @ w, torch.float64)
        return y * 2, x, x.shape[0] * 2

    w = torch.randn(4, 3)
    gm = make_fx(f, tracing_mode="symbolic")(w, torch.randn(5, 4))
    assert any(n.target is torch.ops.prims.convert_element_type.default for n in gm.graph.nodes)
    result = fastonnx.graph_module_to_onnx(gm)
    assert result.input_names == ["w_1", "x_1"]
    x = torch.randn(7, 4)
    got = result(w, x)
    expected = f(w, x)
    assert got[0].dtype == torch.float64
    torch.testing.assert_close(got[0], expected[0], atol=ATOL, rtol=RTOL)  # float32 matmul, then cast
    torch.testing.assert_close(got[1], expected[1])
    assert got[2] == expected[2] == 14


def test_graph_module_without_values_is_refused() -> None:
    gm = torch.fx.symbolic_trace(MLP())
    with pytest.raises(fastonnx.InputError, match=r"no meta\['val'\]"):
        fastonnx.graph_module_to_onnx(gm)
