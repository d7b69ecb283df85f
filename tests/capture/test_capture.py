"""Capture with dynamic shapes: dims exported at size 1, torch's suggested fixes, strict_dynamic, and
to_onnx from several threads at once. Every export is run in onnxruntime and compared with eager."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import fastonnx
from fastonnx.capture import TRACE_LOCK
from support.model_zoo import MLP, GRUTagger, SmallCNN, with_random_batchnorm_stats


def _input_dims(result: fastonnx.ExportResult) -> dict[str, list[Any]]:
    return {
        vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in result.model_proto.graph.input
    }


def _check_runs(result: fastonnx.ExportResult, model: torch.nn.Module, inputs: list[tuple[Any, ...]]) -> None:
    for args in inputs:
        with torch.no_grad():
            expected = model(*args)
        torch.testing.assert_close(result(*args), expected, atol=1e-4, rtol=1e-4)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- dims whose example size is 1 ------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec", ["batch", Dim("batch"), Dim.DYNAMIC, Dim.AUTO], ids=["name", "dim", "dynamic", "auto"]
)
def test_batch_of_one_stays_dynamic(spec: Any) -> None:
    model = MLP().eval()
    result = fastonnx.to_onnx(model, (_randn(1, 16),), dynamic_shapes={"x": {0: spec}})
    dims = _input_dims(result)["x"]
    assert isinstance(dims[0], str) and dims[1] == 16, dims
    _check_runs(result, model, [(_randn(1, 16),), (_randn(2, 16, seed=1),), (_randn(5, 16, seed=2),)])


def test_cnn_exported_at_batch_one() -> None:
    model = with_random_batchnorm_stats(SmallCNN()).eval()
    result = fastonnx.to_onnx(model, (_randn(1, 3, 16, 16),), dynamic_shapes=({0: "batch"},))
    assert _input_dims(result)["x"] == ["batch", 3, 16, 16]
    _check_runs(result, model, [(_randn(n, 3, 16, 16, seed=n),) for n in (1, 2, 5)])


class Padded(torch.nn.Module):
    """F.pad and a padded conv over an image whose height is dynamic."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        y = F.pad(img, (1, 2, 3, 0), mode="constant", value=0.5)
        return self.conv(y) + F.pad(self.conv(img), (1, 2, 2, 1), mode="replicate")


def test_padding_with_a_height_of_one_at_export() -> None:
    model = Padded().eval()
    shapes = {"img": {0: "batch", 2: "height"}}
    result = fastonnx.to_onnx(model, (_randn(1, 2, 1, 5),), dynamic_shapes=shapes)
    assert _input_dims(result)["img"] == ["batch", 2, "height", 5]
    _check_runs(result, model, [(_randn(1, 2, h, 5, seed=h),) for h in (1, 3, 7)] + [(_randn(4, 2, 6, 5),)])


# ---- torch's suggested fixes -------------------------------------------------------------------------
class NeedsEven(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(2, -1, 3).sum(0)


def test_dynamic_shapes_refined_with_torchs_suggested_fixes(caplog: pytest.LogCaptureFixture) -> None:
    model = NeedsEven()
    # the fix makes the program right at even sizes only: refused by default, with torch's fix named
    with pytest.raises(fastonnx.CaptureError, match="right for 4, 6, 8, .* not 3, 5, 7") as caught:
        fastonnx.to_onnx(model, (_randn(4, 3),), dynamic_shapes=({0: Dim("n", min=2, max=64)},))
    assert "torch.export suggested _n = Dim('_n', min=1, max=32); n = 2*_n" in str(caught.value)
    # torch's fix spelled by the user asks for the even sizes: no narrowing
    _n = Dim("_n", min=1, max=32)
    asked = fastonnx.to_onnx(model, (_randn(4, 3),), dynamic_shapes=({0: 2 * _n},))
    assert "dynamic_shapes_refined" not in asked.stats
    _check_runs(asked, model, [(_randn(n, 3, seed=n),) for n in (2, 6, 10)])
    with caplog.at_level("WARNING", logger="fastonnx"), pytest.warns(UserWarning, match="keep_narrowed"):
        result = fastonnx.to_onnx(
            model, (_randn(4, 3),), dynamic_shapes=({0: Dim("n", min=2, max=64)},), keep_narrowed=True
        )
    assert result.stats["dynamic_shapes_refined"] == ["_n = Dim('_n', min=1, max=32)", "n = 2*_n"]
    assert "retrying with its suggested fixes: _n = Dim('_n', min=1, max=32); n = 2*_n" in caplog.text
    assert _input_dims(result)["x"] == ["2*_n", 3]  # the root named as torch's fix names it
    _check_runs(result, model, [(_randn(n, 3, seed=n),) for n in (2, 6, 10)])


def test_independent_dims_refined_into_a_relation() -> None:
    class Shifted(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y[1:]

    model = Shifted()
    result = fastonnx.to_onnx(
        model, (_randn(4, 3), _randn(5, 3, seed=1)), dynamic_shapes=({0: Dim("a")}, {0: Dim("b")})
    )
    assert result.stats["dynamic_shapes_refined"] == ["b = a + 1"]
    dims = _input_dims(result)
    assert dims["x"][0] == "a" and dims["y"][0] == "a+1", dims
    _check_runs(result, model, [(_randn(n, 3, seed=n), _randn(n + 1, 3, seed=n + 1)) for n in (1, 7)])


def test_no_refinement_when_the_shapes_are_accepted() -> None:
    result = fastonnx.to_onnx(MLP().eval(), (_randn(3, 16),), dynamic_shapes=({0: Dim("batch")},))
    assert "dynamic_shapes_refined" not in result.stats


# ---- strict_dynamic -----------------------------------------------------------------------------------
class Reshapes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(2, 3) + 1


@pytest.mark.parametrize("spec", ["batch", Dim("batch")], ids=["name", "dim"])
def test_specialised_dim_is_an_error(spec: Any) -> None:
    with pytest.raises(
        fastonnx.CaptureError, match=r"torch.export specialised: input 'x' axis 0 to 2"
    ) as info:
        fastonnx.to_onnx(Reshapes(), (_randn(2, 3),), dynamic_shapes={"x": {0: spec}})
    assert "strict_dynamic=False" in str(info.value)
    if isinstance(spec, Dim):  # torch refused the Dim, then its fix ("batch = 2") fixed the size
        assert "specialized it to be a constant (2)" in str(info.value)


@pytest.mark.parametrize("spec", ["batch", Dim("batch")], ids=["name", "dim"])
def test_specialised_dim_warns_when_not_strict(spec: Any) -> None:
    with pytest.warns(
        UserWarning, match="input 'x' dim 0 was asked to be dynamic but torch.export specialised"
    ):
        result = fastonnx.to_onnx(
            Reshapes(), (_randn(2, 3),), dynamic_shapes={"x": {0: spec}}, strict_dynamic=False
        )
    assert _input_dims(result)["x"] == [2, 3]
    if isinstance(spec, Dim):
        assert result.stats["dynamic_shapes_refined"] == ["batch = 2"]
    _check_runs(result, Reshapes(), [(_randn(2, 3, seed=1),)])


def test_nested_input_named_in_the_error() -> None:
    class Pair(torch.nn.Module):
        def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return pair[0] + pair[1].reshape(4)

    with pytest.raises(fastonnx.CaptureError, match=r"input 'pair.1' axis 0 to 4"):
        fastonnx.to_onnx(
            Pair(), ((_randn(4), _randn(4, seed=1)),), dynamic_shapes={"pair": ({0: "n"}, {0: "m"})}
        )


# ---- threads --------------------------------------------------------------------------------------------
def _run_threads(jobs: list[Callable[[], None]]) -> None:
    """Start every job at the same moment; re-raise the first failure."""
    barrier = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def run(job: Callable[[], None]) -> None:
        try:
            barrier.wait()
            job()
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def test_four_threads_export_four_models() -> None:
    torch.manual_seed(0)
    cases: list[tuple[torch.nn.Module, tuple[Any, ...], Any, list[tuple[Any, ...]]]] = [
        (MLP().eval(), (_randn(1, 16),), {"x": {0: "batch"}}, [(_randn(3, 16),)]),
        (
            with_random_batchnorm_stats(SmallCNN()).eval(),
            (_randn(2, 3, 16, 16),),
            ({0: "batch"},),
            [(_randn(1, 3, 16, 16),)],
        ),
        (
            GRUTagger().eval(),
            (torch.randint(0, 50, (6, 2)),),
            ({0: "seq", 1: "batch"},),
            [(torch.randint(0, 50, (3, 1)),)],
        ),
        (Padded().eval(), (_randn(1, 2, 1, 5),), {"img": {2: "height"}}, [(_randn(1, 2, 4, 5),)]),
    ]
    results: dict[int, fastonnx.ExportResult] = {}

    def job(i: int) -> Callable[[], None]:
        model, args, shapes, _ = cases[i]

        def export() -> None:
            results[i] = fastonnx.to_onnx(model, args, dynamic_shapes=shapes)

        return export

    _run_threads([job(i) for i in range(len(cases))])
    for i, (model, args, _, more) in enumerate(cases):
        _check_runs(results[i], model, [args, *more])


def test_four_threads_convert_one_exported_program(tmp_path: Any) -> None:
    model = with_random_batchnorm_stats(SmallCNN()).eval()
    x = _randn(2, 3, 16, 16)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch")},), strict=False)
    reference = fastonnx.to_onnx(ep, (x,)).to_bytes()
    results: dict[int, fastonnx.ExportResult] = {}

    def job(i: int) -> Callable[[], None]:
        def convert() -> None:
            results[i] = fastonnx.to_onnx(ep, (x,), filename=tmp_path / f"m{i}.onnx")

        return convert

    _run_threads([job(i) for i in range(4)])
    for i in range(4):
        assert results[i].to_bytes() == reference
        assert (tmp_path / f"m{i}.onnx").read_bytes() == reference
        _check_runs(results[i], model, [(x,), (_randn(5, 3, 16, 16, seed=i),)])


def test_conversion_does_not_wait_for_a_capture() -> None:
    """Converting an ExportedProgram takes no lock: it finishes while another thread is tracing."""
    model = MLP().eval()
    x = _randn(2, 16)
    ep = torch.export.export(model, (x,), strict=False)
    # the first call of a process may register transformers' caches with torch's pytree, under the lock
    fastonnx.to_onnx(ep, (x,))
    done = threading.Event()

    def convert() -> None:
        fastonnx.to_onnx(ep, (x,))
        done.set()

    with TRACE_LOCK:  # as a capture in another thread would
        worker = threading.Thread(target=convert)
        worker.start()
        assert done.wait(timeout=120), "to_onnx(ExportedProgram) waited for the trace lock"
    worker.join()
