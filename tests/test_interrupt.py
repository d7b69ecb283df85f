"""Stopping an export: Ctrl-C and SIGTERM during the write of a multi-GiB model stop it, keep the old
files and leave no temporary; the temporaries of a killed export are swept by the next one.

The exports run in a subprocess (tests/zeros_export.py: zero weights that cost no memory). The signal
is sent once the temporary data file starts growing; the latency is measured in benches/interrupt.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fastonnx
from fastonnx import dtypes
from fastonnx._core import GraphBuilder

TESTS = Path(__file__).parent
N_BYTES = 2 << 30
OLD = {"m.onnx": b"the old model", "m.onnx.data": b"the old weights"}


def start_export(folder: Path) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS.parent / "python"), env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, str(TESTS / "zeros_export.py"), str(N_BYTES), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def data_temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob("m.onnx.data.tmp-*"))


def signal_when_writing(proc: subprocess.Popen[str], folder: Path, sig: int) -> int:
    """Sends ``sig`` once the temporary data file has bytes; waits for the process to end. Returns the
    largest size the temporary was seen at (polled every few milliseconds until the process ended)."""
    largest = 0
    sent = False
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the export neither wrote nor ended within 300 s"
        for tmp in data_temporaries(folder):
            try:
                largest = max(largest, tmp.stat().st_size)
            except FileNotFoundError:  # removed between the listing and the stat
                pass
        if largest > 0 and not sent:
            proc.send_signal(sig)
            sent = True
        time.sleep(0.005)
    assert sent, "the export ended before its data file was seen growing"
    return largest


def write_old_files(folder: Path) -> None:
    for name, data in OLD.items():
        (folder / name).write_bytes(data)


def assert_old_files_only(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(OLD)
    for name, data in OLD.items():
        assert (folder / name).read_bytes() == data


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_write_stops_it_and_keeps_the_old_files(tmp_path: Path, sig: int) -> None:
    write_old_files(tmp_path)
    proc = start_export(tmp_path)
    largest = signal_when_writing(proc, tmp_path, sig)
    out, err = proc.communicate()
    # Python ends a process whose KeyboardInterrupt nobody caught by the SIGINT signal itself
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert "KeyboardInterrupt" in err.splitlines()[-1], err
    assert "finished" not in out
    assert 0 < largest < N_BYTES
    assert_old_files_only(tmp_path)


def test_the_temporaries_of_a_killed_export_are_swept_by_the_next(tmp_path: Path, caplog) -> None:
    write_old_files(tmp_path)
    proc = start_export(tmp_path)
    signal_when_writing(proc, tmp_path, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    # what a killed process cannot remove: the data file's temporary, and the model file's when the
    # thread writing it alongside had begun (a thread just started may wait for a core)
    left = sorted(tmp_path.glob("m.onnx*.tmp-*"))
    targets = sorted(p.name.split(".tmp-")[0] for p in left)
    assert targets in (["m.onnx", "m.onnx.data"], ["m.onnx.data"]), left
    assert all(f"-{proc.pid}-" in p.name for p in left)
    # a temporary of a live process (this one) and one of another host stay
    import socket

    alive = tmp_path / f"x.onnx.tmp-{socket.gethostname()}-{os.getpid()}-0123456789abcdef"
    elsewhere = tmp_path / f"x.onnx.tmp-elsewhere.invalid-{proc.pid}-0123456789abcdef"
    for keep in (alive, elsewhere):
        keep.write_bytes(b"")

    with caplog.at_level(logging.WARNING, logger="fastonnx"):
        result = fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(3),), filename=tmp_path / "other.onnx")
    assert sorted(result.stats["file"]["swept"]) == [str(p) for p in left]
    for p in left:
        assert any(str(p) in r.getMessage() and "killed" in r.getMessage() for r in caplog.records)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([*OLD, "other.onnx", alive.name, elsewhere.name])
    for name, data in OLD.items():
        assert (tmp_path / name).read_bytes() == data


def test_sigterm_is_handed_back_after_the_export(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(3),), filename=tmp_path / "m.onnx")
    assert signal.getsignal(signal.SIGTERM) is before

    def mine(signum: int, frame: object) -> None:
        raise RuntimeError("the program's own")

    signal.signal(signal.SIGTERM, mine)
    try:
        from fastonnx.interrupt import sigterm_as_interrupt

        with sigterm_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is mine  # never replaced
    finally:
        signal.signal(signal.SIGTERM, before)


def test_ctrl_c_during_the_conversion_is_not_wrapped() -> None:
    """A KeyboardInterrupt raised inside a converter (where a Ctrl-C lands during the conversion) comes
    out as itself, not as a ConversionError."""

    def interrupted(ctx, x):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fastonnx.to_onnx(
            torch.nn.ReLU(), (torch.randn(3),), custom_converters={torch.ops.aten.relu.default: interrupted}
        )


class Stop(Exception):
    """What a progress callback (or a signal handler it ran) raised."""


def weighted_builder(n_bytes: int) -> GraphBuilder:
    g = GraphBuilder(20, 9)
    x = g.add_input("x", dtypes.FLOAT, [n_bytes // 4])
    w = g.add_initializer("w", np.zeros(n_bytes, np.uint8), dtypes.FLOAT, [n_bytes // 4])
    (y,) = g.add_node("Add", [x, w])
    g.set_type(y, dtypes.FLOAT, [n_bytes // 4])
    g.add_output(y)
    return g


@pytest.mark.parametrize("n_bytes", [4096, 16 << 20], ids=["at the end", "between pieces"])
def test_an_exception_raised_during_the_write_comes_out_unchanged(tmp_path: Path, n_bytes: int) -> None:
    write_old_files(tmp_path)
    g = weighted_builder(n_bytes)
    seen: list[tuple[int, int]] = []

    def stop(done: int, total: int) -> None:
        seen.append((done, total))
        if done > 0:
            raise Stop(done)

    with pytest.raises(Stop):
        g.save(str(tmp_path / "m.onnx"), True, progress=stop)
    assert seen and seen[-1][0] > 0
    if n_bytes > 4096:
        assert seen[-1][0] < seen[-1][1]  # stopped mid-write, not at the last call
    assert_old_files_only(tmp_path)
    info = g.save(str(tmp_path / "m.onnx"), True, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (info["model_bytes"] + info["data_bytes"],) * 2


def test_an_exception_raised_between_passes_comes_out_unchanged() -> None:
    g = weighted_builder(64)
    calls: list[tuple[int, int]] = []

    def stop(done: int, total: int) -> None:
        calls.append((done, total))
        raise Stop

    with pytest.raises(Stop):
        g.optimize("default", stop)
    assert len(calls) == 1 and calls[0][0] == 0 and calls[0][1] > 1


def chain_builder(n_nodes: int) -> GraphBuilder:
    """A chain of ``n_nodes`` unary nodes: ~1 ms of passes per 1000 nodes."""
    g = GraphBuilder(20, 9)
    y = g.add_input("x", dtypes.FLOAT, [4])
    for i in range(n_nodes):
        (y,) = g.add_node("Neg" if i % 2 else "Abs", [y])
        g.set_type(y, dtypes.FLOAT, [4])
    g.add_output(y)
    return g


def test_an_exception_raised_alongside_the_passes_stops_them_and_comes_out_unchanged() -> None:
    """optimize(alongside=...): the callable runs on a second thread while the passes run on the calling
    one; its exception stops the passes at their next stage and is raised as it was."""
    g = chain_builder(100_000)  # ~0.1 s of passes: the callable fails long before they end
    calls: list[tuple[int, int]] = []

    def compose() -> None:
        raise Stop

    with pytest.raises(Stop):
        g.optimize("default", lambda done, total: calls.append((done, total)), alongside=compose)
    assert all(done < total for done, total in calls), "the passes were stopped before their end"
    # the builder is whole: the passes run again, with the callable this time returning
    ran: list[bool] = []
    g.optimize("default", alongside=lambda: ran.append(True))
    assert ran == [True]
    assert g.num_nodes == 100_000
