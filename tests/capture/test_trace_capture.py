"""to_onnx(capture="trace"): the aten ops of one eager run recorded on the real inputs.

Every export here runs in onnxruntime and is compared with eager PyTorch. The trace must give the
graph torch.export gives (op types, node names, inputs / outputs) where it runs, and must refuse,
loudly, wherever it could specialise what torch.export would capture: each refusal has a model here.
"""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest
import torch

import fastonnx
from fastonnx.errors import CaptureError, InputError
from support import export_check
from support.model_zoo import MLP, GRUTagger, SmallCNN, tiny_llama, with_random_batchnorm_stats

ATOL, RTOL = 1e-5, 1e-5


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _traced(model: torch.nn.Module, args: tuple[Any, ...], **kw: Any) -> fastonnx.ExportResult:
    result = fastonnx.to_onnx(model, args, capture="trace", **kw)
    assert result.stats["capture"] == "trace", result.stats.get("trace_refused")
    return result


def _matches_eager(result: fastonnx.ExportResult, model: torch.nn.Module, args: tuple[Any, ...]) -> None:
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(result(*args), expected, atol=ATOL, rtol=RTOL)


def _graph(result: fastonnx.ExportResult) -> tuple[list[str], list[str], list[str], list[str]]:
    g = result.model_proto.graph
    return (
        [n.op_type for n in g.node],
        [n.name for n in g.node],
        [i.name for i in g.input],
        [o.name for o in g.output],
    )


# ---- the trace gives torch.export's graph ---------------------------------------------------------
@pytest.mark.parametrize("build", [MLP, lambda: with_random_batchnorm_stats(SmallCNN())], ids=["mlp", "cnn"])
def test_same_graph_as_torch_export(build: Any) -> None:
    model = build().eval()
    x = _randn(2, 16) if isinstance(model, MLP) else _randn(2, 3, 16, 16)
    traced = _traced(model, (x,))
    _matches_eager(traced, model, (x,))
    exported = fastonnx.to_onnx(model, (x,), capture="export")
    assert exported.stats["capture"] == "export"
    # op types, module-path node names (node_metadata.py), input and output names all as torch.export's
    assert _graph(traced) == _graph(exported)


def test_tiny_llama_matches_eager_with_torch_exports_graph() -> None:
    model, ids = tiny_llama(), torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    traced = _traced(model, (ids,))
    _matches_eager(traced, model, (ids,))
    ops, names, inputs, outputs = _graph(traced)
    e_ops, e_names, e_inputs, e_outputs = _graph(fastonnx.to_onnx(model, (ids,), capture="export"))
    assert (inputs, outputs) == (e_inputs, e_outputs) == (["input_ids"], ["logits"])
    # the same fused graph: attention, RMS norm, rotary embedding as the optimizer finds them in
    # torch.export's capture
    assert sorted(ops) == sorted(e_ops)
    assert sorted(names) == sorted(e_names)


def test_node_metadata_points_at_the_users_code() -> None:
    model = MLP().eval()
    result = _traced(model, (_randn(2, 16),))
    gemm = next(n for n in result.model_proto.graph.node if n.name == "/net/0/Gemm")
    props = {p.key: p.value for p in gemm.metadata_props}
    stack = props["pkg.torch.onnx.stack_trace"]
    # the forward methods from the model's (model_zoo.py) down to nn.Linear's, as torch.export records them
    assert stack.startswith('File "') and "model_zoo.py" in stack and "return self.net(x)" in stack
    assert "container.py" in stack and "input = module(input)" in stack
    assert stack.endswith("return F.linear(input, self.weight, self.bias)")
    assert props["pkg.torch.onnx.name_scopes"].startswith("['', 'net', 'net.0', ")
    assert "torch.nn.modules.linear.Linear" in props["pkg.torch.onnx.class_hierarchy"]


class _Structured(torch.nn.Module):
    """Nested and keyword inputs, a dict output, a constant tensor attribute and one made in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.tensor([1.0, 2.0, 3.0, 4.0])  # not a buffer: lifted as a constant

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor], *, bias: torch.Tensor) -> dict[str, Any]:
        a, b = pair
        shift = torch.tensor(0.5)  # made in forward: a lifted constant too
        return {"sum": self.lin(a) * self.scale + b + shift, "bias": bias * 2}


def test_nested_inputs_keywords_constants_and_dict_outputs() -> None:
    model = _Structured().eval()
    args = ((_randn(3, 4, seed=1), _randn(3, 4, seed=2)),)
    kwargs = {"bias": _randn(4, seed=3)}
    traced = fastonnx.to_onnx(model, args, kwargs, capture="trace")
    assert traced.stats["capture"] == "trace"
    with torch.no_grad():
        expected = model(*args, **kwargs)
    torch.testing.assert_close(traced(*args, **kwargs), expected, atol=ATOL, rtol=RTOL)
    exported = fastonnx.to_onnx(model, args, kwargs, capture="export")
    assert _graph(traced)[2:] == _graph(exported)[2:]


class _WritesIntermediates(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.add_(1.0)  # in place on a value the forward made: the walker writes it (aliasing.py)
        y[:, 0] = -y[:, 1]  # a write through a view
        return torch.relu_(y * 2)


def test_in_place_writes_to_intermediates_are_traced() -> None:
    model, x = _WritesIntermediates(), _randn(3, 4)
    _matches_eager(_traced(model, (x,)), model, (x,))


class _AppendsToItsInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, seen: list[torch.Tensor]) -> torch.Tensor:
        seen.append(x)  # Python state of an input (as a cache object's update): not the caller's
        return x * len(seen)


def test_the_callers_input_containers_are_left_untouched() -> None:
    seen: list[torch.Tensor] = []
    x = _randn(2, 3)
    result = _traced(_AppendsToItsInput(), (x, seen))
    assert seen == []
    torch.testing.assert_close(result(x, []), x)


def test_a_fresh_process_loads_neither_dynamo_nor_sympy() -> None:
    # torch._dynamo (~1 s) and sympy (~0.7 s) are most of torch.export's start-up; the trace needs neither
    code = textwrap.dedent(
        """
        import sys, torch, fastonnx
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        result = fastonnx.to_onnx(model, (torch.randn(2, 4),), capture="trace")
        assert result.stats["capture"] == "trace"
        print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- refusals: torch.export captures these models instead, with a warning ----------------------------
class _Item(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item()


class _NonZero(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0)


class _BoolMask(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 2


class _WritesBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x.sum(0))
        return x * self.total


class _WritesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1


class _Cond(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))


class _TrainingBatchNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


_REFUSED = {
    "item": (_Item, "reads a tensor's value into Python"),
    "nonzero": (_NonZero, "aten.nonzero.default's output shape depends on the input's values"),
    "bool_mask": (_BoolMask, "output shape depends on the input's values"),
    "buffer_write": (_WritesBuffer, "writes in place into the weight 'total'"),
    "input_write": (_WritesInput, "writes in place into the user input 'x'"),
    "cond": (_Cond, "higher-order op cond"),
}


@pytest.mark.parametrize("name", sorted(_REFUSED))
def test_refusals_fall_back_to_torch_export(name: str, caplog: pytest.LogCaptureFixture) -> None:
    cls, reason = _REFUSED[name]
    x = _randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="fastonnx"):
        result = fastonnx.to_onnx(cls().eval(), (x.clone(),), capture="trace")
    assert result.stats["capture"] == "export"
    assert reason in result.stats["trace_refused"]
    # the user's line that made the trace refuse is named
    assert "test_trace_capture.py" in result.stats["trace_refused"]
    assert any("capture='trace' refused" in r.message and reason in r.message for r in caplog.records)
    with torch.no_grad():
        expected = cls().eval()(x.clone())  # a fresh model: _WritesBuffer's state was not touched
    torch.testing.assert_close(result(x.clone()), expected, atol=ATOL, rtol=RTOL)


def test_batchnorm_in_training_mode_falls_back() -> None:
    # its running statistics are buffers written in place
    model, x = _TrainingBatchNorm().train(), _randn(5, 4)
    with pytest.warns(UserWarning, match="training mode"):
        result = fastonnx.to_onnx(model, (x,), capture="trace")
    assert "writes in place into the weight 'bn." in result.stats["trace_refused"]


def test_tolist_falls_back_and_torch_exports_own_error_follows(caplog: pytest.LogCaptureFixture) -> None:
    class ToList(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + sum(1 for v in x[0].tolist() if v > 0)

    # data-dependent control flow: the trace refuses it, and torch.export cannot capture it either
    with caplog.at_level(logging.WARNING, logger="fastonnx"), pytest.raises(CaptureError):
        fastonnx.to_onnx(ToList(), (_randn(2, 4),), capture="trace")
    assert any("Tensor.tolist()" in r.message for r in caplog.records)


def test_recurrent_layers_fall_back() -> None:
    model = GRUTagger().eval()
    x = torch.randint(0, 50, (6, 2), generator=torch.Generator().manual_seed(0))
    result = fastonnx.to_onnx(model, (x,), capture="trace")
    assert result.stats["capture"] == "export"
    assert "holds a GRU" in result.stats["trace_refused"]
    _matches_eager(result, model, (x,))


def test_weights_on_the_meta_device_are_traced() -> None:
    """Recorded on meta tensors (capture/meta_cache.py; more in test_meta_trace.py)."""
    with torch.device("meta"):
        model = MLP().eval()
    result = fastonnx.to_onnx(model, (torch.empty(2, 16, device="meta"),), capture="trace")
    assert result.stats["capture"] == "trace"
    assert result.stats["deferred_weights"] == 6


# ---- capture="auto", the default: the trace where it can, torch.export quietly otherwise -----------------
def test_auto_is_the_default_and_traces_a_static_module() -> None:
    model, x = with_random_batchnorm_stats(SmallCNN()).eval(), _randn(2, 3, 16, 16)
    result = fastonnx.to_onnx(model, (x,))
    assert result.stats["capture"] == "trace" and "trace_refused" not in result.stats
    _matches_eager(result, model, (x,))


def _quiet_auto(
    model: torch.nn.Module, args: tuple[Any, ...], caplog: pytest.LogCaptureFixture, **kw: Any
) -> Any:
    """to_onnx with the default capture: no warning of fastonnx's, an INFO line naming the reason."""
    with caplog.at_level(logging.INFO, logger="fastonnx"), warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" falling back is no warning (the trace was not asked for)
        result = fastonnx.to_onnx(model, args, **kw)
    assert result.stats["capture"] == "export"
    assert not [r for r in caplog.records if r.name == "fastonnx" and r.levelno >= logging.WARNING]
    assert any("capture='auto'" in r.message and r.levelno == logging.INFO for r in caplog.records)
    return result


@pytest.mark.parametrize("name", sorted(_REFUSED))
def test_auto_falls_back_to_torch_export_quietly(name: str, caplog: pytest.LogCaptureFixture) -> None:
    cls, reason = _REFUSED[name]
    x = _randn(3, 4)
    result = _quiet_auto(cls().eval(), (x.clone(),), caplog)
    assert reason in result.stats["trace_refused"]
    with torch.no_grad():
        expected = cls().eval()(x.clone())
    torch.testing.assert_close(result(x.clone()), expected, atol=ATOL, rtol=RTOL)


def test_auto_uses_torch_export_for_dynamic_shapes(caplog: pytest.LogCaptureFixture) -> None:
    model = MLP().eval()
    result = _quiet_auto(model, (_randn(2, 16),), caplog, dynamic_shapes=({0: "batch"},))
    assert "dynamic_shapes" in result.stats["trace_refused"]
    _matches_eager(result, model, (_randn(5, 16, seed=1),))  # the batch dim stayed dynamic


def test_auto_uses_torch_export_for_decompositions(caplog: pytest.LogCaptureFixture) -> None:
    model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU()).eval(), _randn(2, 4)
    silu = {k: v for k, v in torch.export.default_decompositions().items() if "silu" in str(k)}
    result = _quiet_auto(model, (x,), caplog, decompositions=silu)
    assert "decompositions=" in result.stats["trace_refused"]
    assert "Sigmoid" in {n.op_type for n in result.model_proto.graph.node}
    _matches_eager(result, model, (x,))


def test_auto_uses_torch_export_for_a_model_training_dropout_or_norms(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _TrainingBatchNorm().train()
    with pytest.warns(UserWarning, match="training mode"):  # the training-mode warning, not a capture one
        result = fastonnx.to_onnx(model, (_randn(5, 4),))
    assert result.stats["capture"] == "export"
    assert "training mode with BatchNorm1d" in result.stats["trace_refused"]
    # a module in training mode without such layers computes the same either way: traced
    plain = MLP().train()
    assert fastonnx.to_onnx(plain, (_randn(2, 16),)).stats["capture"] == "trace"


def test_auto_traces_with_the_options_that_read_the_program(tmp_path: Any) -> None:
    # report, verify, intermediate verification and local functions read the traced program as they
    # read torch.export's: none of them makes "auto" use torch.export
    model, x = with_random_batchnorm_stats(SmallCNN()).eval(), _randn(2, 3, 16, 16)
    result = fastonnx.to_onnx(
        model, (x,), report=tmp_path / "r.md", verify=True, export_modules_as_functions={torch.nn.Conv2d}
    )
    assert result.stats["capture"] == "trace"
    assert (tmp_path / "r.md").exists() and result.model_proto.functions
    checked = result.verify(x, intermediate=True)
    assert checked.intermediate is not None and checked.intermediate.first_divergence is None
    assert checked.intermediate.checks
    _matches_eager(result, model, (x,))


def test_auto_with_an_exported_program_converts_it() -> None:
    model, x = MLP().eval(), _randn(2, 16)
    result = fastonnx.to_onnx(torch.export.export(model, (x,), strict=False), (x,))
    assert result.stats["capture"] == "export" and "trace_refused" not in result.stats
    _matches_eager(result, model, (x,))


# ---- refused outright -----------------------------------------------------------------------------
def test_dynamic_shapes_are_refused() -> None:
    with pytest.raises(InputError, match="capture='trace' records one run.*dynamic_shapes"):
        fastonnx.to_onnx(MLP(), (_randn(2, 16),), dynamic_shapes=({0: "batch"},), capture="trace")


def test_an_exported_program_is_refused() -> None:
    model, x = MLP().eval(), _randn(2, 16)
    ep = torch.export.export(model, (x,), strict=False)
    with pytest.raises(InputError, match="ExportedProgram, which is captured already"):
        fastonnx.to_onnx(ep, (x,), capture="trace")


def test_unknown_capture_is_refused() -> None:
    with pytest.raises(InputError, match="capture must be one of 'auto', 'export', 'trace', got 'jit'"):
        fastonnx.to_onnx(MLP(), (_randn(2, 16),), capture="jit")


# ---- the model suites: export_check.check_export traces every static-shape model too ------------------
@pytest.mark.parametrize(
    "name,reason",
    # transformers' MoE experts run its own custom op (torch.export asks its fake kernel for the sizes)
    [
        ("mixtral", "transformers.grouped_mm_fallback.default is a custom op"),
        ("llava", "_local_scalar_dense"),
    ],
)
def test_transformers_models_the_trace_refuses(
    name: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    pytest.importorskip("transformers")
    # the suite's own test, loaded from its file (tests are no package: pytest imports them by path)
    path = pathlib.Path(__file__).parents[1] / "models" / "test_transformers_models.py"
    spec = importlib.util.spec_from_file_location("suite_transformers_models", path)
    assert spec is not None and spec.loader is not None
    test_transformers_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_transformers_models)
    monkeypatch.setattr(export_check, "REFUSED", [])
    test_transformers_models.test_matches_eager(name)  # checked through torch.export only
    assert len(export_check.REFUSED) == 1 and reason in export_check.REFUSED[0][1]


def test_node_metadata_is_torch_exports() -> None:
    # every node's metadata_props (module path and classes, FX node text, stack trace) as under
    # torch.export, for a model whose torch calls all map to one aten op each
    torchvision = pytest.importorskip("torchvision")
    model, x = torchvision.models.resnet18(weights=None).eval(), _randn(1, 3, 32, 32)
    traced, exported = _traced(model, (x,)), fastonnx.to_onnx(model, (x,), capture="export")

    def props(r: fastonnx.ExportResult) -> list[dict[str, str]]:
        return [{p.key: p.value for p in n.metadata_props} for n in r.model_proto.graph.node]

    assert props(traced) == props(exported)


class _WritesThroughAView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 0] = 0.0  # a write into the input through a view of it
        return x * 2


def test_writes_through_views_of_an_input_fall_back() -> None:
    base = _randn(4, 6)
    x = base[:, :3]  # the input is itself a view of the caller's tensor
    for arg in (x.clone(), x):
        result = fastonnx.to_onnx(_WritesThroughAView(), (arg,), capture="trace")
        assert "writes in place into the user input 'x'" in result.stats["trace_refused"]
    torch.testing.assert_close(result(x.clone()), _WritesThroughAView()(x.clone()), atol=ATOL, rtol=RTOL)


class _ReturnsWhatItHolds(torch.nn.Module):
    """Outputs that are the input, a parameter, a view of the input and a tensor attribute; an unused
    tensor input and Python-value inputs (specialised, as torch.export does)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(_randn(3, seed=4))
        self.c = torch.arange(3.0)
        self.tied = torch.nn.Linear(3, 3)
        self.other = torch.nn.Linear(3, 3)
        self.other.weight = self.tied.weight  # one parameter under two names

    def forward(self, x: torch.Tensor, unused: torch.Tensor, n: int, flag: bool = True) -> Any:
        y = self.other(self.tied(x))
        return x, self.w, x[0], self.c, (y * n if flag else y)


def test_outputs_that_are_inputs_weights_views_or_attributes() -> None:
    model = _ReturnsWhatItHolds().eval()
    args = (_randn(2, 3), _randn(1), 3)
    traced, exported = _traced(model, args), fastonnx.to_onnx(model, args, capture="export")
    _matches_eager(traced, model, args)
    assert _graph(traced) == _graph(exported)
    initializers = sorted(i.name for i in traced.model_proto.graph.initializer)
    assert initializers == sorted(i.name for i in exported.model_proto.graph.initializer)


def test_modules_as_local_functions_from_a_trace() -> None:
    # export_modules_as_functions reads the nn_module_stack the trace records: the same functions
    model, ids = tiny_llama(), torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    traced = _traced(model, (ids,), export_modules_as_functions=True)
    exported = fastonnx.to_onnx(model, (ids,), export_modules_as_functions=True, capture="export")
    assert traced.stats["functions"] == exported.stats["functions"]
    assert [f.name for f in traced.model_proto.functions] == [f.name for f in exported.model_proto.functions]
    _matches_eager(traced, model, (ids,))
