"""fastonnx.export as a drop-in for torch.onnx.export: every keyword of the pinned torch handled by name,
dynamic_axes kept with their names, f as path / PathLike / file object / None, the ONNXProgram surface,
and patch_torch_onnx restoring torch's functions."""

from __future__ import annotations

import inspect
import io
import logging
import pathlib
import threading

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.torch_compat import KEYWORDS
from fastonnx.torch_compat.patching import _originals

TORCH_EXPORT = torch.onnx.export
TORCH_UTILS_EXPORT = torch.onnx.utils.export


class TwoOut(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 6)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.drop(self.lin(x))
        return h @ y.T, h.sum(1)


def _inputs(rows: int = 3, cols: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 10 + cols)
    return torch.randn(rows, 4, generator=g), torch.randn(cols, 6, generator=g)


def _run(path_or_bytes, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    sess = ort.InferenceSession(path_or_bytes, providers=["CPUExecutionProvider"])
    return [torch.from_numpy(o) for o in sess.run(None, {k: v.numpy() for k, v in feeds.items()})]


def _dims(proto: onnx.ModelProto) -> dict[str, list[str | int]]:
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*proto.graph.input, *proto.graph.output]
    }


# ---- every keyword of torch's signature ---------------------------------------------------------
def test_every_torch_keyword_is_handled_by_name():
    torch_params = set(inspect.signature(TORCH_EXPORT).parameters) - {"model", "args", "f"}
    assert torch_params == set(KEYWORDS), (
        f"torch.onnx.export's keywords changed: new {sorted(torch_params - set(KEYWORDS))}, "
        f"gone {sorted(set(KEYWORDS) - torch_params)}: decide each one in torch_compat/onnx_export.py"
    )
    ours = set(inspect.signature(fastonnx.export).parameters)
    assert torch_params | {"model", "args", "f"} <= ours
    # the TorchScript-era entry point's keywords are all accepted too
    assert set(inspect.signature(TORCH_UTILS_EXPORT).parameters) <= ours


def test_keywords_table_is_in_the_readme():
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Switching from torch.onnx.export", 1)[1].split("\n## ", 1)[0]
    for name in KEYWORDS:
        assert f"`{name}`" in section, f"README's keyword table misses {name}"


# ---- mapped keywords --------------------------------------------------------------------------------
def test_dynamic_axes_keep_their_names_and_outputs_match_eager(tmp_path):
    model = TwoOut().eval()
    path = tmp_path / "m.onnx"
    fastonnx.export(
        model,
        _inputs(),
        str(path),
        input_names=["a", "b"],
        output_names=["prod", "total"],
        opset_version=18,
        dynamic_axes={"a": {0: "rows"}, "b": [0], "prod": {0: "rows", 1: "cols"}, "total": {0: "rows"}},
    )
    proto = onnx.load(path)
    assert proto.opset_import[0].version == 18
    assert _dims(proto) == {
        "a": ["rows", 4],
        "b": ["b_dynamic_axes_1", 6],  # torch's name for the list form
        "prod": ["rows", "cols"],
        "total": ["rows"],
    }
    for rows, cols in [(3, 5), (7, 2), (1, 9)]:
        x, y = _inputs(rows, cols)
        got = _run(str(path), {"a": x, "b": y})
        with torch.no_grad():
            want = model(x, y)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_dynamic_axes_by_parameter_name_without_input_names():
    prog = fastonnx.export(TwoOut().eval(), _inputs(), dynamic_axes={"x": {0: "n"}})
    assert _dims(prog.model_proto)["x"] == ["n", 4]


def test_dynamic_axes_naming_nothing_known_is_refused():
    with pytest.raises(fastonnx.InputError, match=r"dynamic_axes names \['images'\]"):
        fastonnx.export(TwoOut().eval(), _inputs(), input_names=["a", "b"], dynamic_axes={"images": {0: "n"}})


def test_dynamic_axes_and_dynamic_shapes_together_are_refused():
    with pytest.raises(fastonnx.InputError, match="not both"):
        fastonnx.export(TwoOut(), _inputs(), dynamic_axes={"x": [0]}, dynamic_shapes={"x": {0: "n"}})


def test_dynamic_shapes_dynamo_era_form(tmp_path):
    model = TwoOut().eval()
    prog = fastonnx.export(
        model, _inputs(), tmp_path / "d.onnx", dynamic_shapes={"x": {0: "n"}, "y": None}, dynamo=True
    )
    assert _dims(prog.model_proto)["x"] == ["n", 4]
    x, y = _inputs(6, 5)
    with torch.no_grad():
        want = model(x, y)
    for g, w in zip(prog(x, y), want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_single_tensor_args_and_trailing_dict_as_kwargs():
    class Scaled(torch.nn.Module):
        def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
            return x * 2 if scale is None else x * scale

    x, s = torch.randn(2, 3), torch.randn(2, 3)
    one = fastonnx.export(Scaled(), x)  # a bare tensor, as timm passes it
    torch.testing.assert_close(one(x)[0], x * 2)
    both = fastonnx.export(Scaled(), (x, {"scale": s}))  # TorchScript-era kwargs
    assert [i.name for i in both.model_proto.graph.input] == ["x", "scale"]
    torch.testing.assert_close(both(x, scale=s)[0], x * s)


def test_models_see_is_in_onnx_export_during_the_export():
    class ExportPath(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if torch.onnx.is_in_onnx_export() else x * 3

    x = torch.randn(4)
    prog = fastonnx.export(ExportPath(), (x,))
    torch.testing.assert_close(prog(x)[0], x * 2)
    assert not torch.onnx.is_in_onnx_export()


def test_f_as_pathlike_str_file_object_and_none(tmp_path):
    model, args = TwoOut().eval(), _inputs()
    fastonnx.export(model, args, tmp_path / "p.onnx")
    fastonnx.export(model, args, str(tmp_path / "s.onnx"))
    buf = io.BytesIO()
    prog = fastonnx.export(model, args, buf)
    assert prog.result.path is None
    assert (tmp_path / "p.onnx").read_bytes() == (tmp_path / "s.onnx").read_bytes() == buf.getvalue()
    with open(tmp_path / "f.onnx", "wb") as fh:
        fastonnx.export(model, args, fh)
    assert (tmp_path / "f.onnx").read_bytes() == buf.getvalue()
    none = fastonnx.export(model, args, None)
    assert none.model_proto.SerializeToString() == onnx.load_from_string(buf.getvalue()).SerializeToString()


def test_f_of_a_wrong_kind_and_text_mode_are_refused(tmp_path):
    with pytest.raises(fastonnx.InputError, match="binary file object"):
        fastonnx.export(TwoOut(), _inputs(), 42)  # type: ignore[arg-type]
    with open(tmp_path / "t.onnx", "w") as fh, pytest.raises(fastonnx.InputError, match="binary mode"):
        fastonnx.export(TwoOut(), _inputs(), fh)  # type: ignore[arg-type]
    with pytest.raises(fastonnx.InputError, match="does not exist"):
        fastonnx.export(TwoOut(), _inputs(), tmp_path / "no" / "such" / "m.onnx")
    with pytest.raises(fastonnx.InputError, match="needs a path"):
        fastonnx.export(TwoOut(), _inputs(), io.BytesIO(), external_data=True)


def test_external_data_true_writes_the_weights_beside(tmp_path):
    model, x = torch.nn.Linear(64, 32).eval(), torch.randn(2, 64)
    fastonnx.export(model, (x,), tmp_path / "e.onnx", external_data=True)
    assert (tmp_path / "e.onnx.data").stat().st_size >= 64 * 32 * 4  # tensors of 1 KiB and more
    fastonnx.export(model, (x,), tmp_path / "i.onnx")  # the default: one file under 2 GiB
    assert not (tmp_path / "i.onnx.data").exists()
    for name in ("e.onnx", "i.onnx"):
        (got,) = _run(str(tmp_path / name), {"input": x})
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


def test_f_is_written_by_the_write_stage_with_stats_file_as_to_onnx(tmp_path, monkeypatch):
    # a path f is to_onnx's filename: checked once before the capture, written by the pipeline's write
    # stage (stats["file"] where to_onnx has it), the outputs' dims named by dynamic_axes before that
    from fastonnx.pipeline import options

    checked: list[str] = []
    check_writable = options.check_writable
    monkeypatch.setattr(options, "check_writable", lambda p: checked.append(p) or check_writable(p))
    model, path = TwoOut().eval(), tmp_path / "m.onnx"
    axes = {"a": {0: "rows"}, "prod": {0: "rows"}, "total": {0: "rows"}}
    prog = fastonnx.export(
        model, _inputs(), path, input_names=["a", "b"], output_names=["prod", "total"], dynamic_axes=axes
    )
    assert checked == [str(path)]
    info = prog.stats["file"]
    assert info["path"] == str(path) == prog.result.path
    assert info["model_bytes"] == path.stat().st_size and info["external_data"] is False
    assert list(prog.stats)[-2:] == ["write_s", "file"]
    same = fastonnx.to_onnx(model, _inputs(), filename=tmp_path / "t.onnx", input_names=["a", "b"])
    assert list(same.stats["file"]) == list(info)
    assert _dims(onnx.load(path)) == {"a": ["rows", 4], "b": [5, 6], "prod": ["rows", 5], "total": ["rows"]}
    for rows in (3, 8):
        x, y = _inputs(rows)
        got = _run(str(path), {"a": x, "b": y})
        with torch.no_grad():
            want = model(x, y)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_file_object_with_external_data_is_refused_before_the_capture():
    class Refuses(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("captured before f was checked")

    with pytest.raises(fastonnx.InputError, match="needs a path"):
        fastonnx.export(Refuses(), (torch.randn(2),), io.BytesIO(), external_data=True)


def test_training_eval_exports_in_eval_mode_and_restores_the_mode():
    model = TwoOut().train()
    x, y = _inputs()
    prog = fastonnx.export(model, (x, y))  # TrainingMode.EVAL by default: dropout is off in the graph
    assert model.training and model.drop.training
    model.eval()
    with torch.no_grad():
        want = model(x, y)
    torch.testing.assert_close(prog(x, y)[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"training": torch.onnx.TrainingMode.TRAINING}, "inference graphs"),
        ({"operator_export_type": torch.onnx.OperatorExportTypes.ONNX_ATEN_FALLBACK}, "standard ONNX"),
        ({"export_params": False}, "meta device"),
        ({"keep_initializers_as_inputs": True}, "initializers only"),
    ],
)
def test_refused_keywords_say_why(kwargs, match):
    with pytest.raises(fastonnx.InputError, match=match):
        fastonnx.export(TwoOut(), _inputs(), **kwargs)


def test_preserve_needs_an_eval_model():
    with pytest.raises(fastonnx.InputError, match="inference graphs"):
        fastonnx.export(TwoOut().train(), _inputs(), training=torch.onnx.TrainingMode.PRESERVE)
    fastonnx.export(TwoOut().eval(), _inputs(), training=torch.onnx.TrainingMode.PRESERVE)


def test_harmless_values_of_refused_keywords_pass():
    fastonnx.export(
        TwoOut().eval(),
        _inputs(),
        operator_export_type=torch.onnx.OperatorExportTypes.ONNX,
        export_modules_as_functions=False,
        keep_initializers_as_inputs=None,
        export_params=True,
        custom_translation_table={},
    )


def test_opset_below_the_range_is_an_opset_error():
    with pytest.raises(fastonnx.OpsetError, match=f"{fastonnx.MIN_OPSET} to {fastonnx.MAX_OPSET}"):
        fastonnx.export(TwoOut(), _inputs(), opset_version=13)


def test_ignored_keywords_log_one_line_each(caplog):
    with caplog.at_level(logging.INFO, logger="fastonnx"):
        fastonnx.export(
            TwoOut().eval(),
            _inputs(),
            do_constant_folding=False,
            custom_opsets={"custom": 1},
            autograd_inlining=False,
            profile=True,
        )
    for word in ["do_constant_folding", "custom_opsets", "autograd_inlining", "profile"]:
        assert sum(word in r.getMessage() for r in caplog.records) == 1, word


def test_report_and_verify_are_fastonnx_s(tmp_path):
    """torch's report=True writes a markdown report into artifacts_dir; verify=True checks the outputs."""
    program = fastonnx.export(
        TwoOut().eval(), _inputs(), report=True, verify=True, artifacts_dir=tmp_path / "art"
    )
    (report,) = (tmp_path / "art").glob("onnx_export_*_fastonnx_report.md")
    text = report.read_text()
    assert "## Op inventory" in text and "## Verification (onnxruntime vs eager PyTorch)" in text
    rows = program.stats["verify"]
    assert rows and all(r.passed for r in rows), rows


def test_dump_exported_program_goes_to_artifacts_dir(tmp_path):
    fastonnx.export(TwoOut().eval(), _inputs(), dump_exported_program=True, artifacts_dir=tmp_path / "art")
    (dumped,) = (tmp_path / "art").glob("onnx_export_*.pt2")
    ep = torch.export.load(dumped)
    model = TwoOut().eval()
    model.load_state_dict({k: v for k, v in ep.state_dict.items()})
    x, y = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x, y)[0], model(x, y)[0])


def test_verbose_logs_the_export(caplog):
    # verbose=True is to_onnx's (one format; stderr only when no handler shows the logger, which
    # tests/diagnostics/test_debug.py checks in a fresh process)
    with caplog.at_level(logging.DEBUG, logger="fastonnx"):
        fastonnx.export(TwoOut().eval(), _inputs(), verbose=True, dynamo=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "fastonnx"]
    assert any(m.startswith("dynamo=False: capture='trace'") for m in messages), messages
    assert any(m.startswith("fastonnx.export:") for m in messages), messages
    assert any(m.startswith("convert:") for m in messages), messages
    assert logging.getLogger("fastonnx").level == logging.NOTSET  # restored


def test_optimize_false_then_program_optimize():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    model[1].running_mean.uniform_(-1, 1)
    model[1].running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 8, 8)
    prog = fastonnx.export(model, (x,), optimize=False)
    assert [n.op_type for n in prog.model_proto.graph.node].count("BatchNormalization") == 1
    prog.optimize()  # the conv-batchnorm fusion runs now
    assert "BatchNormalization" not in [n.op_type for n in prog.model_proto.graph.node]
    with torch.no_grad():
        torch.testing.assert_close(prog(x)[0], model(x), rtol=1e-4, atol=1e-5)


# ---- the ONNXProgram surface ---------------------------------------------------------------------------
def test_program_surface(tmp_path):
    model, args = TwoOut().eval(), _inputs()
    prog = fastonnx.export(model, args, input_names=["a", "b"])
    assert [v.name for v in prog.model.graph.inputs] == ["a", "b"]  # onnx_ir, as torch's
    assert isinstance(prog.exported_program, torch.export.ExportedProgram)
    out = prog(*args)
    assert isinstance(out, tuple) and len(out) == 2
    prog.save(tmp_path / "s.onnx")
    buf = io.BytesIO()
    prog.save(buf)
    assert (tmp_path / "s.onnx").read_bytes() == buf.getvalue()
    with pytest.raises(fastonnx.InputError, match="include_initializers"):
        prog.save(tmp_path / "x.onnx", include_initializers=False)
    with pytest.raises(fastonnx.InputError, match="meta device"):
        prog.apply_weights(model.state_dict())
    prog.release()
    seen = []
    prog.initialize_inference_session(lambda src: seen.append(src) or ort.InferenceSession(src))
    assert seen == [str(tmp_path / "s.onnx")]
    torch.testing.assert_close(prog(*args)[1], out[1])
    for ref, got in zip(prog.call_reference(*args), out, strict=True):
        torch.testing.assert_close(ref, got, rtol=1e-5, atol=1e-5)


def test_apply_weights_fills_a_meta_export(tmp_path):
    with torch.device("meta"):
        meta = torch.nn.Linear(4, 3)
    prog = fastonnx.export(meta, (torch.empty(2, 4, device="meta"),), tmp_path / "w.onnx")
    real = torch.nn.Linear(4, 3)
    prog.apply_weights(real.state_dict())
    x = torch.randn(2, 4)
    got = _run(str(tmp_path / "w.onnx"), {prog.result.input_names[0]: x})[0]
    with torch.no_grad():
        torch.testing.assert_close(got, real(x), rtol=1e-5, atol=1e-5)


# ---- the patch ---------------------------------------------------------------------------------------
def test_patch_routes_keeps_the_signature_and_restores(tmp_path):
    torch_sig = inspect.signature(TORCH_EXPORT)
    with fastonnx.patch_torch_onnx() as patch:
        assert torch.onnx.export is not TORCH_EXPORT
        assert inspect.signature(torch.onnx.export) == torch_sig
        assert inspect.signature(torch.onnx.utils.export) == inspect.signature(TORCH_UTILS_EXPORT)
        assert "dynamo" in inspect.signature(torch.onnx.export).parameters  # what timm checks
        prog = torch.onnx.export(TwoOut().eval(), _inputs(), tmp_path / "p.onnx", dynamo=False)
        assert isinstance(prog, fastonnx.ONNXProgram)
        torch.onnx.utils.export(TwoOut().eval(), _inputs(), str(tmp_path / "u.onnx"))
        assert "fastonnx" in onnx.load(tmp_path / "u.onnx").producer_name
        with pytest.raises(TypeError):
            torch.onnx.export(TwoOut(), _inputs(), None, no_such_keyword=1)  # torch's own refusal
        assert patch.active
    assert not patch.active
    assert torch.onnx.export is TORCH_EXPORT and torch.onnx.utils.export is TORCH_UTILS_EXPORT
    assert not _originals


def test_patch_as_a_plain_call_and_nesting_in_any_order():
    outer = fastonnx.patch_torch_onnx()
    inner = fastonnx.patch_torch_onnx()
    patched = torch.onnx.export
    assert patched is not TORCH_EXPORT
    outer.restore()  # out of order: the inner patch still holds
    assert torch.onnx.export is patched
    inner.restore()
    inner.restore()  # idempotent
    assert torch.onnx.export is TORCH_EXPORT
    with fastonnx.patch_torch_onnx():
        with fastonnx.patch_torch_onnx():
            pass
        assert torch.onnx.export is not TORCH_EXPORT
    assert torch.onnx.export is TORCH_EXPORT


def test_patch_restores_on_error_and_across_threads():
    with pytest.raises(RuntimeError), fastonnx.patch_torch_onnx():
        raise RuntimeError("boom")
    assert torch.onnx.export is TORCH_EXPORT

    barrier = threading.Barrier(4)
    unpatched_inside: list[int] = []

    def work() -> None:
        barrier.wait()
        for i in range(50):
            with fastonnx.patch_torch_onnx():
                if torch.onnx.export is TORCH_EXPORT:
                    unpatched_inside.append(i)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert unpatched_inside == []
    assert torch.onnx.export is TORCH_EXPORT


def test_file_is_loadable_by_onnx_checker(tmp_path):
    fastonnx.export(TwoOut().eval(), _inputs(), tmp_path / "c.onnx", opset_version=18)
    onnx.checker.check_model(str(tmp_path / "c.onnx"), full_check=True)


def test_dynamic_axes_on_nested_and_keyword_inputs():
    class Nested(torch.nn.Module):
        def forward(self, pair: list[torch.Tensor], *, bias: torch.Tensor) -> torch.Tensor:
            return pair[0] * pair[1] + bias

    a, b, bias = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    prog = fastonnx.export(
        Nested(),
        ([a, b],),
        kwargs={"bias": bias},
        input_names=["a", "b", "bias"],
        dynamic_axes={"a": {0: "n"}, "b": {0: "n"}, "bias": {0: "n"}},
    )
    assert {k: v for k, v in _dims(prog.model_proto).items() if k != prog.result.output_names[0]} == {
        "a": ["n", 4],
        "b": ["n", 4],
        "bias": ["n", 4],
    }
    a, b, bias = torch.randn(6, 4), torch.randn(6, 4), torch.randn(6, 4)
    torch.testing.assert_close(prog([a, b], bias=bias)[0], a * b + bias)


def test_dynamo_false_traces_as_the_torchscript_exporter_did():
    """dynamo=False: the real-tensor trace (static shapes); with dynamic axes, torch.export; dynamo=True
    as to_onnx's default capture="auto"."""
    model = TwoOut().eval()
    a, b = _inputs()
    static = fastonnx.export(model, (a, b), dynamo=False)
    assert static.stats["capture"] == "trace"
    dynamic = fastonnx.export(model, (a, b), dynamo=False, input_names=["a", "b"], dynamic_axes={"a": [0]})
    assert dynamic.stats.get("capture", "export") == "export"
    # dynamo=True (torch's default): to_onnx's capture="auto", the trace for static shapes as well
    assert fastonnx.export(model, (a, b)).stats["capture"] == "trace"
    dynamo = fastonnx.export(model, (a, b), input_names=["a", "b"], dynamic_axes={"a": [0]})
    assert dynamo.stats["capture"] == "export" and "dynamic_shapes" in dynamo.stats["trace_refused"]
    with torch.no_grad():
        expected = model(a, b)
    for program in (static, dynamic):
        for got, want in zip(program(a, b), expected):
            torch.testing.assert_close(torch.as_tensor(got), want)


def test_dynamo_false_falls_back_to_torch_export_where_the_trace_would_specialise(caplog):
    class Counts(torch.nn.Module):  # a buffer written in place: a trace would bake in one step
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.add_(x)
            return x * 2

    x = torch.arange(3.0)
    with caplog.at_level(logging.WARNING, logger="fastonnx"):
        program = fastonnx.export(Counts(), (x,), dynamo=False)
    assert program.stats["capture"] == "export"
    assert program.stats["trace_refused"]
    assert any("torch.export instead" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(torch.as_tensor(program(x)[0]), x * 2)
