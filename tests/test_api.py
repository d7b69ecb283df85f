"""The to_onnx contract: stats, saving (inline and external), model_proto, names, decompositions."""

from __future__ import annotations

import onnx
import onnxruntime
import pytest
import torch

import fastonnx
from support.model_zoo import MLP


def test_stats_report_every_stage(tmp_path) -> None:
    model = MLP().eval()
    x = torch.randn(2, 16)
    result = fastonnx.to_onnx(model, (x,), filename=tmp_path / "m.onnx")
    s = result.stats
    for key in ("capture_s", "convert_s", "optimize_s", "write_s"):
        assert isinstance(s[key], float) and s[key] >= 0
    assert s["nodes"] == len(result.model_proto.graph.node)
    assert s["initializers"] == len(result.model_proto.graph.initializer) == 6
    assert s["opset"] == 20
    assert "decompositions" not in s and "functionalized" not in s


def test_saved_file_runs_in_onnxruntime(tmp_path) -> None:
    model = MLP().eval()
    x = torch.randn(5, 16)
    path = tmp_path / "mlp.onnx"
    fastonnx.to_onnx(model, (x,), filename=path)
    onnx.checker.check_model(str(path), full_check=True)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), model(x), atol=1e-5, rtol=1e-5)


def test_external_data_round_trip(tmp_path) -> None:
    model = MLP().eval()
    x = torch.randn(5, 16)
    path = tmp_path / "mlp.onnx"
    result = fastonnx.to_onnx(model, (x,), filename=path, external_data=True)
    info = result.stats["file"]
    assert info["external_data"] is True and (tmp_path / "mlp.onnx.data").exists()
    loaded = onnx.load(str(path))
    by_name = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert any(a.shape == (32, 16) for a in by_name.values())
    torch.testing.assert_close(result(x), model(x), atol=1e-5, rtol=1e-5)


def test_durable_saves_write_the_same_model(tmp_path) -> None:
    model = MLP().eval()
    x = torch.randn(5, 16)
    plain = fastonnx.to_onnx(model, (x,), filename=tmp_path / "a.onnx", external_data=True)
    durable = fastonnx.to_onnx(model, (x,), filename=tmp_path / "b.onnx", external_data=True, durable=True)
    assert (tmp_path / "a.onnx.data").read_bytes() == (tmp_path / "b.onnx.data").read_bytes()
    torch.testing.assert_close(durable(x), model(x), atol=1e-5, rtol=1e-5)
    plain.save(tmp_path / "c.onnx", durable=True)
    assert (tmp_path / "c.onnx").read_bytes() == plain.to_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.onnx",
        "a.onnx.data",
        "b.onnx",
        "b.onnx.data",
        "c.onnx",
    ]


def test_input_and_output_names(tmp_path) -> None:
    model = MLP().eval()
    x = torch.randn(2, 16)
    result = fastonnx.to_onnx(model, (x,), input_names=["features"], output_names=["scores"])
    assert result.input_names == ["features"] and result.output_names == ["scores"]
    torch.testing.assert_close(result(x), model(x))


class WithKwargs(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
        return x * scale + shift


def test_kwargs_are_inputs() -> None:
    x, s = torch.randn(3), torch.randn(3)
    result = fastonnx.to_onnx(WithKwargs(), (x,), {"scale": s, "shift": 2.0})
    assert result.input_names == ["x", "scale"]
    torch.testing.assert_close(result(x, scale=s, shift=2.0), x * s + 2.0)


def test_decompositions_are_applied_and_reported() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU()).eval()
    x = torch.randn(2, 4)
    table = torch.export.default_decompositions()
    silu = {k: v for k, v in table.items() if "silu" in str(k)}
    result = fastonnx.to_onnx(model, (x,), decompositions=silu)
    assert result.stats["decompositions"] == len(silu)
    assert "Sigmoid" in {n.op_type for n in result.model_proto.graph.node}
    torch.testing.assert_close(result(x), model(x))


def test_import_does_not_load_onnx_or_onnxruntime() -> None:
    """Nor onnxscript: it is imported only once a translation function is given (fastonnx.onnxscript_converters)."""
    import subprocess
    import sys

    code = (
        "import sys, fastonnx; "
        "print(sorted(m for m in ('onnx', 'onnxruntime', 'onnxscript') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_import_adds_only_fastonnx_own_modules_to_torch() -> None:
    """A one-model job pays torch's import anyway; ``import fastonnx`` on top of it must stay at its own
    modules (~30 ms, benches/end_to_end.py): torch.export's tracing stack (torch.export._trace,
    aot_autograd, dynamo), onnx, transformers or torchvision are imported only when an export needs
    them."""
    import subprocess
    import sys

    code = (
        "import sys, torch; before = set(sys.modules); import fastonnx; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] != 'fastonnx'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_callers_heap_is_handed_back_to_the_collector() -> None:
    """to_onnx sets the caller's objects aside from the garbage collector while it converts (see
    api._heap_set_aside) and hands them back; a caller's own frozen set is left as it was."""
    import gc

    model = torch.nn.Linear(3, 2)
    x = torch.randn(1, 3)
    assert gc.get_freeze_count() == 0
    fastonnx.to_onnx(model, (x,))
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        result = fastonnx.to_onnx(model, (x,))
        # still frozen (objects that died meanwhile leave it): to_onnx did not unfreeze the caller's set
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    torch.testing.assert_close(result(x), model(x))


def test_the_optimize_levels_have_one_spelling_everywhere() -> None:
    # "none" / "default" / "onnxruntime", as the CLI and Rust's Level name them; False / True are the
    # first two; the CLI's earlier "standard" stays an alias of "default"
    from fastonnx.pretrained.cli import OPTIMIZE

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Identity()).eval()
    x = torch.randn(2, 4)
    for name, same in (("none", False), ("default", True)):
        assert fastonnx.to_onnx(model, (x,), optimize=name).to_bytes() == (
            fastonnx.to_onnx(model, (x,), optimize=same).to_bytes()
        )
    assert OPTIMIZE["default"] is OPTIMIZE["standard"] is True
    assert {k for k, v in OPTIMIZE.items() if v is not True} == {"none", "onnxruntime"}
    with pytest.raises(fastonnx.InputError, match="optimize must be False / 'none', True / 'default'"):
        fastonnx.to_onnx(model, (x,), optimize="standard")


@pytest.mark.parametrize(
    ("keyword", "value", "expected"),
    [
        ("external_data", "yes", "external_data must be None, True or False"),
        ("input_names", "x", "input_names must be None or a sequence of strings"),
        ("decompositions", [1], "decompositions must be None or a dict of op overload -> function"),
        ("strict_dynamic", None, "strict_dynamic must be True or False"),
        ("keep_narrowed", 1, "keep_narrowed must be True or False"),
        ("capture", "jit", "capture must be one of 'auto', 'export', 'trace'"),
    ],
)
def test_every_keyword_is_checked_before_the_capture(keyword: str, value: object, expected: str) -> None:
    class Refuses(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("captured before the options were checked")

    with pytest.raises(fastonnx.InputError, match=expected):
        fastonnx.to_onnx(Refuses(), (torch.randn(2),), **{keyword: value})


def test_the_options_check_takes_to_onnx_keywords_with_its_defaults() -> None:
    # every entry point taking to_onnx's keywords checks them with ExportOptions.from_keywords, which
    # must then mean what to_onnx means by each keyword left out
    import inspect

    from fastonnx.pipeline.options import ExportOptions

    own = ("model", "args", "kwargs", "report", "verify", "verbose")  # to_onnx's, not the options'
    params = inspect.signature(fastonnx.to_onnx).parameters
    defaults = {name: p.default for name, p in params.items() if name not in own}
    assert ExportOptions.from_keywords(**defaults) == ExportOptions.from_keywords()
    for name, p in inspect.signature(ExportOptions.from_keywords).parameters.items():
        if p.kind is p.KEYWORD_ONLY:
            assert p.default == defaults[name], name
    with pytest.raises(fastonnx.InputError, match="to_onnx has no keyword 'optimise'"):
        ExportOptions.from_keywords(optimise=True)


# a value to_onnx refuses before capturing, per keyword, and the entry points taking that keyword
BAD_VALUES = {
    "opset": 5,
    "optimize": "fast",
    "custom_converters": [1],
    "decompositions": "core",
    "quantize": "int3",
    "metadata": "yes",
    "capture": "jit",
    "progress": "always",
}
ENTRY_KEYWORDS = {
    "backend": ("opset", "optimize", "custom_converters", "decompositions"),
    "graph_module_to_onnx": ("opset", "optimize", "custom_converters"),
    "export_pretrained": tuple(BAD_VALUES),
}


@pytest.mark.parametrize(("entry", "keyword"), [(e, k) for e, ks in ENTRY_KEYWORDS.items() for k in ks])
def test_every_entry_point_refuses_a_keyword_as_to_onnx_does_before_any_work(
    entry: str, keyword: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from fastonnx.pipeline import stages
    from fastonnx.pretrained import package_export

    calls: list[torch.Tensor] = []

    class Counting(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(x)
            return x * 2

    bad = {keyword: BAD_VALUES[keyword]}
    with pytest.raises(fastonnx.FastOnnxError) as by_to_onnx:
        fastonnx.to_onnx(Counting(), (torch.randn(2),), **bad)
    gm = make_fx(lambda x: x * 2)(torch.randn(2))

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started before the keywords were checked")

    monkeypatch.setattr(stages, "run_convert", never)  # graph_module_to_onnx's conversion
    monkeypatch.setattr(package_export.folder_mod, "read_folder", never)  # export_pretrained's first step
    with pytest.raises(type(by_to_onnx.value)) as refused:
        if entry == "backend":
            torch.compile(Counting(), backend=fastonnx.backend(**bad))(torch.randn(2))
        elif entry == "graph_module_to_onnx":
            fastonnx.graph_module_to_onnx(gm, **bad)
        else:
            fastonnx.export_pretrained(tmp_path / "checkpoint", tmp_path / "package", **bad)
    assert refused.value.args == by_to_onnx.value.args
    assert calls == []  # neither to_onnx nor the entry point ran the model
    assert not (tmp_path / "package").exists()
