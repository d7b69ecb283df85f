"""A file is right at every size it accepts (capture/guards.py): a dim asked to be dynamic that the
captured program is right for at some sizes only (torch.export narrowed its range, or a guard ties it
to the example's value of a derived size) is a CaptureError naming the input, the axis, the guard, the
model's line and the sizes it admits; asked with those bounds, the export succeeds, the file's metadata
holds them and the result refuses other sizes. Also an ExportedProgram exported with and without args.

The two modules are the issue's: a loop over 64-token chunks (torch.export narrows the length to
[2, 64]) and the same over a padded length (torch.export keeps [2, inf) and records the guard
``(s + (64 - s % 64) % 64) // 64 == 1``). Each export is checked against eager at sizes inside."""

from __future__ import annotations

import inspect
import json
import warnings
from typing import Any

import pytest
import torch
from torch.export import Dim

import fastonnx
from fastonnx.capture.guards import METADATA_KEY
from fastonnx.errors import CaptureError, InputError, SizeGuardError


class Chunks(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = (x.shape[1] + 63) // 64
        return torch.cat([x[:, i * 64 : (i + 1) * 64].sum(-1, keepdim=True) for i in range(n)], -1)


class PaddedChunks(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(x, (0, (64 - x.shape[1] % 64) % 64))
        y = x.reshape(x.shape[0], x.shape[1] // 64, 64)
        acc = torch.zeros_like(y[:, 0])
        for i in range(y.shape[1]):
            acc = acc + y[:, i]
        return acc


class ChunkLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n = (h.shape[1] + 63) // 64
        parts = [h[:, i * 64 : (i + 1) * 64].mean(1, keepdim=True) for i in range(n)]
        return h + self.proj(torch.cat(parts, 1).sum(1, keepdim=True))


class ChunkStack(torch.nn.Module):
    """Three like layers: captured by stamping under capture="auto"."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(ChunkLayer() for _ in range(3))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h)
        return h


MODULES = {"chunks": Chunks, "padded": PaddedChunks}
SPELLINGS = ("dim", "dynamic", "strings", "dynamic_axes")


def _lines(cls: type) -> list[str]:
    """``file:line`` of each line of ``cls``'s forward: torch records a guard at the first line that
    needs it, which the retries of the capture may change (the loop, or the reshape before it)."""
    lines, start = inspect.getsourcelines(cls.forward)
    return [f"{__file__}:{start + i}" for i in range(1, len(lines))]


GUARD_LINES = {"chunks": _lines(Chunks), "padded": _lines(PaddedChunks), "stack": _lines(ChunkLayer)}


def _x(length: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, length, generator=torch.Generator().manual_seed(seed))


def _spec(spelling: str, length: Any = None) -> Any:
    if spelling == "dim":
        return ({0: Dim("batch"), 1: length or Dim("sequence")},)
    if spelling == "dynamic":
        return ({0: Dim.DYNAMIC, 1: length or Dim.DYNAMIC},)
    return {"x": {0: "batch", 1: "sequence"}}


def _export(model: torch.nn.Module, spelling: str, example: torch.Tensor, **options: Any) -> Any:
    if spelling == "dynamic_axes":
        return fastonnx.export(model, (example,), dynamic_axes={"x": {0: "batch", 1: "sequence"}}, **options)
    return fastonnx.to_onnx(model, (example,), dynamic_shapes=_spec(spelling), **options)


def _assert_names_the_guard(message: str, key: str, axis_input: str = "x") -> None:
    assert f"input {axis_input!r} axis 1" in message, message
    assert f"{axis_input}.shape[1]" in message, message  # the guard, in the user's terms
    assert any(f"{line}: " in message for line in GUARD_LINES[key]), message  # the line that made it
    assert "right for 2 to 64 of the sizes tried" in message, message
    assert "not any size above 64" in message, message
    assert "min=2, max=64)" in message, message  # the fix


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("key", sorted(MODULES))
def test_a_narrowed_dim_is_refused_with_its_guard(key: str, spelling: str) -> None:
    with pytest.raises(CaptureError) as caught:
        _export(MODULES[key]().eval(), spelling, _x(9))
    _assert_names_the_guard(str(caught.value), key)


@pytest.mark.parametrize("key", sorted(MODULES))
def test_the_capture_export_refuses_as_auto_does(key: str) -> None:
    with pytest.raises(CaptureError) as caught:
        fastonnx.to_onnx(MODULES[key]().eval(), (_x(9),), dynamic_shapes=_spec("dynamic"), capture="export")
    _assert_names_the_guard(str(caught.value), key)


def test_a_stamped_capture_refuses_too() -> None:
    torch.manual_seed(0)
    model = ChunkStack().eval()
    h = torch.randn(2, 9, 8, generator=torch.Generator().manual_seed(1))
    with pytest.raises(CaptureError) as caught:
        fastonnx.to_onnx(model, (h,), dynamic_shapes=({0: Dim.DYNAMIC, 1: Dim.DYNAMIC},))
    message = str(caught.value)
    assert "input 'h' axis 1" in message and "h.shape[1]" in message, message
    assert any(line in message for line in GUARD_LINES["stack"]), message
    assert "not any size above 64" in message, message
    # asked with the bound, the stack is stamped and right inside it
    result = fastonnx.to_onnx(
        model, (h,), dynamic_shapes=({0: Dim.DYNAMIC, 1: Dim("sequence", min=2, max=64)},)
    )
    assert result.stats["capture"] == "stamped", result.stats.get("stamp_refused")
    for length in (5, 64):
        x = torch.randn(3, length, 8, generator=torch.Generator().manual_seed(length))
        torch.testing.assert_close(result(x), model(x))
    with pytest.raises(SizeGuardError, match="input 'h' axis 1 has size 65"):
        result(torch.randn(3, 65, 8))


@pytest.mark.parametrize("key", sorted(MODULES))
def test_asked_bounds_export_and_are_kept(key: str) -> None:
    model = MODULES[key]().eval()
    result = fastonnx.to_onnx(
        model, (_x(9),), dynamic_shapes=_spec("dim", Dim("sequence", min=2, max=64)), filename=None
    )
    for length, batch in ((9, 2), (2, 1), (64, 3), (33, 4)):
        x = _x(length, batch, seed=length)
        torch.testing.assert_close(result(x), model(x))
    for length in (65, 70):
        with pytest.raises(SizeGuardError, match=f"input 'x' axis 1 has size {length}: .*\\[2, 64\\]"):
            result(_x(length))
    with pytest.raises(SizeGuardError):
        result.verify(_x(70))
    props = {p.key: p.value for p in result.model_proto.metadata_props}
    kept = json.loads(props[METADATA_KEY])
    assert kept["dims"] == {"x[1]": [2, 64]}, kept
    assert result.stats["dynamic_ranges"]["x[1]"] == [2, 64]


def test_the_bounds_are_in_the_report(tmp_path: Any) -> None:
    report = tmp_path / "report.md"
    fastonnx.to_onnx(
        Chunks().eval(),
        (_x(9),),
        dynamic_shapes=_spec("dynamic", Dim("sequence", max=64)),
        report=str(report),
    )
    text = report.read_text()
    assert "x[1]" in text and "[2, 64]" in text, text


def test_keep_narrowed_keeps_the_narrowed_sizes() -> None:
    model = PaddedChunks().eval()
    with pytest.warns(UserWarning, match="keeps the narrowed sizes"):
        result = fastonnx.to_onnx(model, (_x(9),), dynamic_shapes=_spec("dynamic"), keep_narrowed=True)
    assert "right for 2 to 64" in result.stats["narrowed"]
    assert result.stats["guards_kept"], result.stats
    torch.testing.assert_close(result(_x(40, 3)), model(_x(40, 3)))
    with pytest.raises(SizeGuardError, match="input 'x' axis 1 has size 70"):
        result(_x(70))  # the range the guards narrowed it to
    props = {p.key: p.value for p in result.model_proto.metadata_props}
    kept = json.loads(props[METADATA_KEY])
    assert kept["dims"]["x[1]"] == [2, 64] and kept["guards"], kept
    assert any(line in kept["guards"][0]["where"] for line in GUARD_LINES["padded"]), kept


def test_a_guard_that_is_no_range_is_kept_and_checked() -> None:
    # pairs of values: right at even lengths only, which no range says
    class Pairs(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(x.shape[0], x.shape[1] // 2, 2).sum(-1)

    model = Pairs().eval()
    with pytest.raises(CaptureError, match="right for 2, 4, 6") as caught:
        fastonnx.to_onnx(model, (_x(8),), dynamic_shapes=_spec("dynamic"))
    assert "the sizes it is right for are no range" in str(caught.value)
    with pytest.warns(UserWarning, match="keep_narrowed=True"):
        result = fastonnx.to_onnx(model, (_x(8),), dynamic_shapes=_spec("dynamic"), keep_narrowed=True)
    torch.testing.assert_close(result(_x(30, 3)), model(_x(30, 3)))
    with pytest.raises(SizeGuardError, match="fail the guard .*x.shape\\[1\\]"):
        result(_x(9))


def test_the_drop_in_keeps_the_sizes_when_asked(tmp_path: Any) -> None:
    # fastonnx.export's own keep_narrowed (refused by default above, as to_onnx refuses)
    model = Chunks().eval()
    with pytest.warns(UserWarning, match="right for 2 to 64"):
        program = fastonnx.export(
            model,
            (_x(9),),
            str(tmp_path / "m.onnx"),
            dynamic_axes={"x": {0: "batch", 1: "sequence"}},
            keep_narrowed=True,
        )
    torch.testing.assert_close(program(_x(30))[0], model(_x(30)))
    with pytest.raises(SizeGuardError):
        program(_x(70))


def test_guards_that_restate_the_request_stay_silent() -> None:
    # s >= 2 and s != 1 restate a dynamic dim (0 and 1 are left out as torch.export leaves them out)
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] != 1:
                return x * 2
            return x

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = fastonnx.to_onnx(Model(), (_x(9),), dynamic_shapes=_spec("dynamic"))
    assert result.proven is None or not result.proven.guards
    torch.testing.assert_close(result(_x(300)), _x(300) * 2)


def test_a_lower_bound_torch_proves_is_a_narrowing() -> None:
    # a convolution needs at least its kernel: the program is captured for sizes >= 3 only
    model = torch.nn.Conv1d(2, 2, 3).eval()
    x = torch.randn(1, 2, 9)
    with pytest.raises(CaptureError, match="any size below 3") as caught:
        fastonnx.to_onnx(model, (x,), dynamic_shapes=({2: Dim.DYNAMIC},))
    assert "min=3)" in str(caught.value)
    result = fastonnx.to_onnx(model, (x,), dynamic_shapes=({2: Dim("length", min=3)},))
    z = torch.randn(1, 2, 5)
    torch.testing.assert_close(result(z), model(z))


def test_a_guard_on_a_derived_dims_root_is_a_narrowing() -> None:
    # asked as 9 * b only, b's specialisation (one_hot takes its class count as an int) leaves the
    # input dim symbolic and the range torch keeps for b whole: the guard b == 9 alone says the program
    # holds 9 classes (Gemma 4's vision pooler, one_hot(idx, patches // 9))
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(idx, x.shape[1] // 9).float().sum(0)

    b = Dim("b", min=1, max=1000)
    args = (torch.randn(3, 81), torch.tensor([0, 4, 8]))
    with pytest.raises(CaptureError, match=r"right for 81 of the sizes tried.*not 18 to 72, 90 to 9000"):
        fastonnx.to_onnx(Model(), args, dynamic_shapes=({1: 9 * b}, None))


def test_a_derived_dim_is_checked_at_its_own_sizes() -> None:
    # every size 2 * b takes is right: the odd sizes between its bounds are not asked, nor refused
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(x.shape[0], -1, 2).sum(-1)

    b = Dim("b", min=2, max=500)
    result = fastonnx.to_onnx(Model(), (torch.randn(3, 8),), dynamic_shapes=({1: 2 * b},))
    z = torch.randn(3, 26)
    torch.testing.assert_close(result(z), Model()(z))


# ---- an ExportedProgram alone ---------------------------------------------------------------------


def test_an_exported_program_needs_no_args() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch", max=64)},))
    alone = fastonnx.to_onnx(ep)
    given = fastonnx.to_onnx(ep, (x,))
    assert alone.to_bytes() == given.to_bytes()
    assert fastonnx.export(ep).model_proto == alone.model_proto
    y = torch.randn(5, 4)
    torch.testing.assert_close(alone(y), model(y))
    with pytest.raises(SizeGuardError, match="input 'input' axis 0 has size 65"):
        alone(torch.randn(65, 4))  # the program's own range
    with pytest.raises(InputError, match="the inputs flatten to 2 values but the exported program takes 1"):
        fastonnx.to_onnx(ep, (x, x))


def test_an_exported_program_that_narrows_is_refused() -> None:
    # torch.export keeps [2, inf) for Dim.DYNAMIC and records the guard; ep.module() checks it
    ep = torch.export.export(PaddedChunks(), (_x(9),), dynamic_shapes=_spec("dynamic"))
    with pytest.raises(CaptureError) as caught:
        fastonnx.to_onnx(ep)
    assert "input 'x' axis 1" in str(caught.value) and "not any size above 64" in str(caught.value)
