"""Progress bars as a person sees them: an export in a subprocess whose stderr is a terminal (a pty),
the screen read back; with stderr a pipe, nothing is printed."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import torch

import fastonnx

TESTS = Path(__file__).parents[1]

# exports a small MLP; argv: FOLDER PROGRESS (None | True | False) SLOW_CONVERT (0 | 1)
SCRIPT = """
import sys, time, torch, fastonnx
folder, progress, slow = sys.argv[1], eval(sys.argv[2]), sys.argv[3] == "1"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
x = torch.randn(2, 64)
fastonnx.to_onnx(model, (x,), progress=progress)  # warms capture up: its first run takes seconds
def slow_relu(ctx, x):
    time.sleep(1.5)  # a conversion that runs past the automatic bar's one second
    return ctx.op("Relu", x)
custom = {torch.ops.aten.relu.default: slow_relu} if slow else None
fastonnx.to_onnx(model, (x,), filename=folder + "/m.onnx", progress=progress, custom_converters=custom)
print("exported", flush=True)
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS.parent / "python"), e.get("PYTHONPATH")) if p)
    return e


def run_on_terminal(folder: Path, progress: str, slow: bool) -> str:
    """Runs the script with stderr on a 120-column pty; returns what the terminal received."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(folder), progress, "1" if slow else "0"],
            stdout=subprocess.PIPE,
            stderr=side,
            env=env(),
            text=True,
            timeout=300,
        )
    finally:
        os.close(side)
        reader.join(timeout=10)
        os.close(main)
    assert proc.returncode == 0 and "exported" in proc.stdout, proc.stdout
    return b"".join(chunks).decode("utf-8", "replace")


def last_drawing(screen: str, stage: str) -> str | None:
    """The last state of a stage's bar: tqdm redraws a line in place after a carriage return."""
    drawings = [
        part for part in re.split(r"[\r\n]", screen) if part.lstrip("\x1b[A ").startswith(f"{stage}:")
    ]
    return drawings[-1] if drawings else None


def test_every_stage_shows_a_bar_that_ends_at_100_percent(tmp_path: Path) -> None:
    screen = run_on_terminal(tmp_path, "True", slow=False)
    for stage in ("capture", "convert", "optimize", "write"):
        bar = last_drawing(screen, stage)
        assert bar is not None, f"no {stage} bar on {screen!r}"
        assert "100%|" in bar, bar
    # the write counts bytes (tqdm's SI scaling): all of the file's, out of as many
    write = last_drawing(screen, "write")
    counts = re.search(r"\| ([\d.]+)k/([\d.]+)k ", write or "")
    size_k = (tmp_path / "m.onnx").stat().st_size / 1000
    assert counts is not None and counts[1] == counts[2], write
    assert abs(float(counts[1]) - size_k) < 0.1, (write, size_k)


def test_automatic_bars_show_only_stages_that_run_past_a_second(tmp_path: Path) -> None:
    screen = run_on_terminal(tmp_path, "None", slow=True)
    bar = last_drawing(screen, "convert")
    assert bar is not None and "100%|" in bar, screen
    # every node counted, and the time from the stage's start (not from when the bar appeared)
    assert re.search(r"\| (\d+)/\1 \[00:0[1-9]<", bar), bar
    # optimizing and writing a small MLP take milliseconds: no bar
    assert last_drawing(screen, "optimize") is None and last_drawing(screen, "write") is None, screen


def test_quick_stages_and_progress_false_print_nothing_on_a_terminal(tmp_path: Path) -> None:
    screen = run_on_terminal(tmp_path, "False", slow=True)
    assert "%|" not in screen, screen


def test_nothing_is_printed_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), "None", "1"],
        capture_output=True,
        env=env(),
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "exported" in proc.stdout
    assert proc.stderr == ""


def test_progress_must_be_none_true_or_false() -> None:
    with pytest.raises(fastonnx.InputError, match="progress must be None"):
        fastonnx.to_onnx(torch.nn.ReLU(), (torch.randn(2),), progress="yes")  # type: ignore[arg-type]
