"""Stopping an export: Ctrl-C and SIGTERM during the write of a multi-GiB model stop it, keep the old
files and leave no temporary; the temporaries of a killed export are swept by the next one.

The exports run in a subprocess (tests/zeros_export.py: zero weights that cost no memory) that imports
the fastonnx these tests import (the checkout's in a development install, site-packages' from a
wheel). The model is sized from this machine's write speed, measured first, so that its write lasts
seconds; the signal is sent once the temporary data file has bytes and at most half of them, and the
file is looked at again after it: still short of its size, the write had not reached its end, where it
looks for signals a last time (it does every 100 ms before), so the export had to stop. An attempt that
missed that window (a loaded machine may not run the test in time) is killed, its files removed, and
made again with a larger model. The latency is measured in benches/interrupt.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import fastonnx
from fastonnx import dtypes
from fastonnx._core import GraphBuilder

TESTS = Path(__file__).parent
OLD = {"m.onnx": b"the old model", "m.onnx.data": b"the old weights"}
PIECE_BYTES = 256 << 20  # zeros_export.py's weights come in pieces of this size
# the write should last this long at the speed of a plain write measured just before it (0.03 to 1.1
# GiB/s on a 2-core VM, with the machine's other work; the export's own, seen over its first tens of MB,
# ran at 0.02x to 9x that one): the signal is sent in its first half, a missed window is made again
WRITE_SECONDS = 5.0
MIN_BYTES = 2 << 30
MAX_BYTES = 16 << 30  # and a quarter of the free disk: an export the signal failed to stop writes it all
ATTEMPTS = 3


def measured_write_speed(folder: Path, n_bytes: int = 256 << 20) -> float:
    """Bytes per second of one plain write() of zero pages (what the export writes from) into
    ``folder``, the file removed."""
    data = np.zeros(n_bytes, np.uint8)
    path = folder / "speed"
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.write(memoryview(data))
    seconds = time.perf_counter() - start
    path.unlink()
    return n_bytes / seconds


def model_bytes(folder: Path, bytes_per_second: float) -> int:
    """Weights whose write lasts WRITE_SECONDS at ``bytes_per_second``, in whole pieces, within
    [MIN_BYTES, the disk's bound]."""
    bound = min(MAX_BYTES, shutil.disk_usage(folder).free // 4)
    n = min(max(bytes_per_second * WRITE_SECONDS, MIN_BYTES), bound)
    return max(PIECE_BYTES, int(n) // PIECE_BYTES * PIECE_BYTES)


# The child runs zeros_export.py with Ctrl-C and SIGTERM as a terminal's program has them, whatever this
# process inherited: a shell starts a background job (`pytest ... &`) with SIGINT ignored, and a Python
# started so never installs its KeyboardInterrupt handler (the export then ignores Ctrl-C and finishes).
CHILD = (
    "import runpy, signal, sys; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "signal.signal(signal.SIGTERM, signal.SIG_DFL); "
    "sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def start_export(folder: Path, n_bytes: int) -> subprocess.Popen[str]:
    env = dict(os.environ)
    # the folder holding the fastonnx imported here: a fresh clone with fastonnx installed from a wheel
    # has no compiled extension in its python/ folder, which would fail the child's import
    package_parent = str(Path(fastonnx.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(TESTS / "zeros_export.py"), str(n_bytes), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def data_temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob("m.onnx.data.tmp-*"))


def data_temporary_size(folder: Path) -> int | None:
    """The size of the data file's temporary, None when there is none."""
    for tmp in data_temporaries(folder):
        try:
            return tmp.stat().st_size
        except FileNotFoundError:  # removed between the listing and the stat
            pass
    return None


@dataclass
class Write:
    """What was seen of an export's write: whether the signal was sent, whether it is known to have
    been sent before the write's end, the largest size the data temporary was seen at, the speed it
    was seen growing at (bytes per second, 0 when unknown)."""

    sent: bool
    during: bool
    largest: int
    speed: float


def signal_during_write(proc: subprocess.Popen[str], folder: Path, sig: int, n_bytes: int) -> Write:
    """Sends ``sig`` once the data temporary has bytes and at most half of ``n_bytes``, then looks at
    it again: there and still short of ``n_bytes``, the signal was pending before the write's end. An
    export past its first half before it was seen is killed (SIGKILL) unsignalled. Polls every few
    milliseconds until the process ends."""
    largest = 0
    sent = during = False
    first: tuple[float, int] | None = None
    last: tuple[float, int] | None = None
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the export neither wrote nor ended within 300 s"
        size = data_temporary_size(folder)
        if size:
            now = time.monotonic()
            first = first or (now, size)
            last = (now, size)
            largest = max(largest, size)
            if not sent and size <= n_bytes // 2:
                proc.send_signal(sig)
                sent = True
                after = data_temporary_size(folder)
                during = after is not None and after < n_bytes
                largest = max(largest, after or 0)
            elif not sent:
                proc.kill()
        time.sleep(0.005)
    speed = 0.0
    if first and last and last[0] > first[0]:
        speed = (last[1] - first[1]) / (last[0] - first[0])
    return Write(sent, during, largest, speed)


def write_old_files(folder: Path) -> None:
    for name, data in OLD.items():
        (folder / name).write_bytes(data)


def assert_old_files_only(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(OLD)
    for name, data in OLD.items():
        assert (folder / name).read_bytes() == data


def export_signalled_during_its_write(
    folder: Path, sig: int
) -> tuple[subprocess.Popen[str], str, str, Write, int]:
    """Writes the old files into ``folder``, then exports a model of zeros into it and sends ``sig``
    during its write (see signal_during_write). Returns the ended process, its stdout and stderr, what
    was seen of the write and the model's size."""
    speed = measured_write_speed(folder)
    n_bytes = model_bytes(folder, speed)
    missed = []
    for _ in range(ATTEMPTS):
        write_old_files(folder)
        proc = start_export(folder, n_bytes)
        write = signal_during_write(proc, folder, sig, n_bytes)
        out, err = proc.communicate()
        if write.sent and write.during:
            # shown with a failure's report (and -rP)
            print(f"plain write {speed / 2**30:.2f} GiB/s, {n_bytes} bytes: {write}; missed: {missed}")
            return proc, out, err, write, n_bytes
        # missed: killed unsignalled (-SIGKILL), ended on its own (0), or signalled but gone before the
        # second look (stopped already or finished: not known which); anything else is the export's failure
        assert proc.returncode in (0, -signal.SIGKILL, -sig, -signal.SIGINT), (proc.returncode, err)
        missed.append(f"{n_bytes} bytes: {write}, exit {proc.returncode}")
        for path in folder.iterdir():  # what the missed attempt wrote or left
            path.unlink()
        n_bytes = max(2 * n_bytes, model_bytes(folder, write.speed))
        n_bytes = min(n_bytes, model_bytes(folder, float("inf")))
    raise AssertionError(f"no signal sent before the write's end in {ATTEMPTS} attempts: {missed}")


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, its large files removed after the test even when it fails (pytest keeps a failed
    test's folder: an export the signal did not stop leaves GiBs there)."""
    yield tmp_path
    for path in tmp_path.iterdir():
        if path.is_file() and path.stat().st_size > 1 << 20:
            path.unlink()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_write_stops_it_and_keeps_the_old_files(folder: Path, sig: int) -> None:
    proc, out, err, write, n_bytes = export_signalled_during_its_write(folder, sig)
    # Python ends a process whose KeyboardInterrupt nobody caught by the SIGINT signal itself
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert "KeyboardInterrupt" in err.splitlines()[-1], err
    assert "finished" not in out
    assert 0 < write.largest < n_bytes
    assert_old_files_only(folder)


def test_the_temporaries_of_a_killed_export_are_swept_by_the_next(folder: Path, caplog) -> None:
    proc, _, _, _, _ = export_signalled_during_its_write(folder, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    # what a killed process cannot remove: the data file's temporary, and the model file's when the
    # thread writing it alongside had begun (a thread just started may wait for a core)
    left = sorted(folder.glob("m.onnx*.tmp-*"))
    targets = sorted(p.name.split(".tmp-")[0] for p in left)
    assert targets in (["m.onnx", "m.onnx.data"], ["m.onnx.data"]), left
    assert all(f"-{proc.pid}-" in p.name for p in left)
    # a temporary of a live process (this one) and one of another host stay
    import socket

    alive = folder / f"x.onnx.tmp-{socket.gethostname()}-{os.getpid()}-0123456789abcdef"
    elsewhere = folder / f"x.onnx.tmp-elsewhere.invalid-{proc.pid}-0123456789abcdef"
    for keep in (alive, elsewhere):
        keep.write_bytes(b"")

    with caplog.at_level(logging.WARNING, logger="fastonnx"):
        result = fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(3),), filename=folder / "other.onnx")
    assert sorted(result.stats["file"]["swept"]) == [str(p) for p in left]
    for p in left:
        assert any(str(p) in r.getMessage() and "killed" in r.getMessage() for r in caplog.records)
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([*OLD, "other.onnx", alive.name, elsewhere.name])
    for name, data in OLD.items():
        assert (folder / name).read_bytes() == data


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
