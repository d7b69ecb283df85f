"""The module sweep: torch.nn modules and torchvision ops that OpInfo does not sample, each exported by
fastonnx at opsets 17 and 26, run in onnxruntime and compared with eager PyTorch. Writes the "modules"
section of docs/coverage.md (between its markers; scripts/sweep.py keeps the section when it rewrites
the rest), stamped with the commit it was generated from.

    python scripts/module_sweep.py               # every case, rewrite the section
    python scripts/module_sweep.py --only lstm   # cases whose name contains "lstm" (prints, no write)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COVERAGE = os.path.join(ROOT, "docs", "coverage.md")
SECTION = "modules"
OPSETS = (17, 26)


@dataclass
class Case:
    name: str
    build: Callable[[], Any]  # () -> (module, args)
    atol: float = 1e-4
    rtol: float = 1e-4


def _cases() -> list[Case]:
    import torch
    import torchvision.ops as tv
    from torch import nn

    def g(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape) * scale

    class Fn(nn.Module):
        def __init__(self, fn: Callable[..., Any]) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *xs: Any) -> Any:
            return self.fn(*xs)

    class Cell(nn.Module):
        """A cell stepped over a sequence, its state carried from step to step."""

        def __init__(self, cell: nn.Module, lstm: bool = False) -> None:
            super().__init__()
            self.cell, self.lstm = cell, lstm

        def forward(self, xs: torch.Tensor, h: torch.Tensor) -> Any:
            state: Any = (h, torch.zeros_like(h)) if self.lstm else h
            outs = []
            for x in xs.unbind(0):
                state = self.cell(x, state)
                outs.append(state[0] if self.lstm else state)
            return torch.stack(outs)

    class Mha(nn.Module):
        def __init__(self, **kw: Any) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(16, 4, **kw)

        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor) -> Any:
            kpm = mask[0] if mask else None
            return self.mha(q, k, v, key_padding_mask=kpm)

    def boxes(n: int, size: float = 32.0) -> torch.Tensor:
        xy = torch.rand(n, 2) * size
        wh = torch.rand(n, 2) * size / 2 + 1
        return torch.cat([xy, xy + wh], 1)

    def rois(n: int, batch: int, size: float = 16.0) -> torch.Tensor:
        return torch.cat([torch.randint(0, batch, (n, 1)).float(), boxes(n, size)], 1)

    def enc(**kw: Any) -> nn.Module:
        return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, **kw)

    def dec(**kw: Any) -> nn.Module:
        return nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, **kw)

    def encoder_stack(**kw: Any) -> nn.Module:
        return nn.TransformerEncoder(enc(batch_first=True), 2, enable_nested_tensor=False, **kw)

    return [
        Case("nn.LSTM", lambda: (nn.LSTM(8, 16), (g(5, 3, 8),))),
        Case(
            "nn.LSTM (2 layers, bidirectional, batch_first)",
            lambda: (nn.LSTM(8, 16, 2, batch_first=True, bidirectional=True), (g(3, 5, 8),)),
        ),
        Case("nn.LSTM (proj_size)", lambda: (nn.LSTM(8, 16, proj_size=4), (g(5, 3, 8),))),
        Case("nn.GRU", lambda: (nn.GRU(8, 16), (g(5, 3, 8),))),
        Case(
            "nn.GRU (2 layers, bidirectional)", lambda: (nn.GRU(8, 16, 2, bidirectional=True), (g(5, 3, 8),))
        ),
        Case("nn.RNN (tanh)", lambda: (nn.RNN(8, 16), (g(5, 3, 8),))),
        Case("nn.RNN (relu, 2 layers)", lambda: (nn.RNN(8, 16, 2, nonlinearity="relu"), (g(5, 3, 8),))),
        Case("nn.LSTMCell", lambda: (Cell(nn.LSTMCell(8, 16), lstm=True), (g(4, 3, 8), g(3, 16)))),
        Case("nn.GRUCell", lambda: (Cell(nn.GRUCell(8, 16)), (g(4, 3, 8), g(3, 16)))),
        Case("nn.RNNCell", lambda: (Cell(nn.RNNCell(8, 16)), (g(4, 3, 8), g(3, 16)))),
        Case("nn.MultiheadAttention", lambda: (Mha(), (g(5, 2, 16), g(7, 2, 16), g(7, 2, 16)))),
        Case(
            "nn.MultiheadAttention (batch_first, key_padding_mask)",
            lambda: (
                Mha(batch_first=True),
                (
                    g(2, 5, 16),
                    g(2, 7, 16),
                    g(2, 7, 16),
                    torch.tensor([[False] * 5 + [True] * 2, [False] * 7]),
                ),
            ),
        ),
        Case(
            "nn.MultiheadAttention (kdim, vdim, bias_k)",
            lambda: (
                Fn(nn.MultiheadAttention(16, 2, kdim=8, vdim=12, add_bias_kv=True, add_zero_attn=True)),
                (g(5, 2, 16), g(7, 2, 8), g(7, 2, 12)),
            ),
        ),
        Case("nn.TransformerEncoderLayer", lambda: (enc(), (g(6, 2, 16),))),
        Case(
            "nn.TransformerEncoderLayer (norm_first, gelu, batch_first)",
            lambda: (enc(norm_first=True, activation="gelu", batch_first=True), (g(2, 6, 16),)),
        ),
        Case("nn.TransformerEncoder (2 layers)", lambda: (encoder_stack(), (g(2, 6, 16),))),
        Case("nn.TransformerDecoderLayer", lambda: (dec(), (g(5, 2, 16), g(6, 2, 16)))),
        Case(
            "nn.TransformerDecoderLayer (norm_first, batch_first)",
            lambda: (dec(norm_first=True, batch_first=True), (g(2, 5, 16), g(2, 6, 16))),
        ),
        Case(
            "nn.Transformer",
            lambda: (
                nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, batch_first=True),
                (g(2, 6, 16), g(2, 5, 16)),
            ),
        ),
        Case("nn.Bilinear", lambda: (nn.Bilinear(6, 5, 4), (g(3, 6), g(3, 5)))),
        Case(
            "nn.EmbeddingBag (mean, offsets)",
            lambda: (
                Fn(nn.EmbeddingBag(20, 6, mode="mean")),
                (torch.randint(0, 20, (9,)), torch.tensor([0, 4, 6])),
            ),
        ),
        Case("nn.Fold", lambda: (nn.Fold((5, 6), (2, 3)), (g(2, 12, 16),))),
        Case("nn.Unfold", lambda: (nn.Unfold((2, 3), dilation=1, padding=1, stride=2), (g(2, 3, 6, 7),))),
        Case("nn.PixelShuffle", lambda: (nn.PixelShuffle(2), (g(2, 8, 3, 4),))),
        Case("nn.ChannelShuffle", lambda: (nn.ChannelShuffle(2), (g(2, 6, 3, 4),))),
        Case(
            "nn.Upsample (bicubic, align_corners)",
            lambda: (nn.Upsample(scale_factor=2, mode="bicubic", align_corners=True), (g(1, 2, 5, 6),)),
        ),
        Case(
            "nn.AdaptiveLogSoftmaxWithLoss.log_prob",
            lambda: (Fn(nn.AdaptiveLogSoftmaxWithLoss(16, 30, [10, 20]).log_prob), (g(4, 16),)),
        ),
        Case(
            "torchvision.ops.nms", lambda: (Fn(lambda b, s: tv.nms(b, s, 0.5)), (boxes(40), torch.rand(40)))
        ),
        Case(
            "torchvision.ops.batched_nms",
            lambda: (
                Fn(lambda b, s, c: tv.batched_nms(b, s, c, 0.5)),
                (boxes(40), torch.rand(40), torch.randint(0, 3, (40,))),
            ),
        ),
        Case(
            "torchvision.ops.roi_align",
            lambda: (
                Fn(lambda x, r: tv.roi_align(x, r, (3, 3), 0.5, 2, True)),
                (g(2, 4, 12, 12), rois(6, 2)),
            ),
        ),
        Case(
            "torchvision.ops.roi_pool",
            lambda: (Fn(lambda x, r: tv.roi_pool(x, r, (3, 3), 0.5)), (g(2, 4, 12, 12), rois(6, 2))),
        ),
        Case(
            "torchvision.ops.ps_roi_align",
            lambda: (Fn(lambda x, r: tv.ps_roi_align(x, r, (2, 2), 0.5, 2)), (g(2, 8, 12, 12), rois(6, 2))),
        ),
        Case(
            "torchvision.ops.ps_roi_pool",
            lambda: (Fn(lambda x, r: tv.ps_roi_pool(x, r, (2, 2), 0.5)), (g(2, 8, 12, 12), rois(6, 2))),
        ),
        Case(
            "torchvision.ops.deform_conv2d",
            lambda: (
                Fn(lambda x, o, w, m: tv.deform_conv2d(x, o, w, padding=1, mask=m)),
                (g(2, 4, 7, 7), g(2, 18, 7, 7), g(6, 4, 3, 3), torch.rand(2, 9, 7, 7)),
            ),
        ),
        Case("torchvision.ops.box_iou", lambda: (Fn(tv.box_iou), (boxes(7), boxes(5)))),
        Case(
            "torchvision.ops.sigmoid_focal_loss",
            lambda: (
                Fn(lambda a, b: tv.sigmoid_focal_loss(a, b, reduction="mean")),
                (g(8, 3), torch.rand(8, 3)),
            ),
        ),
    ]


def run_case(case: Case) -> dict[str, Any]:
    """Export at each opset through fastonnx.to_onnx (its own capture), compare with eager."""
    import torch

    import fastonnx
    from fastonnx.errors import CaptureError, FastOnnxError

    torch.manual_seed(0)
    model, args = case.build()
    model = model.eval()
    with torch.no_grad():
        expected = model(*args)
    record: dict[str, Any] = {"name": case.name, "per_opset": {}, "problem": ""}
    for opset in OPSETS:
        t0 = time.perf_counter()
        try:
            result = fastonnx.to_onnx(model, args, opset=opset)
            got = result(*args)
            torch.testing.assert_close(got, expected, atol=case.atol, rtol=case.rtol, equal_nan=True)
            status = "pass"
        except CaptureError as e:
            status, record["problem"] = "not capturable", str(e)
        except AssertionError as e:
            status, record["problem"] = "wrong", str(e)
        except FastOnnxError as e:
            status, record["problem"] = type(e).__name__, str(e)
        except Exception as e:  # a bug: report it with its place
            status = "crash"
            record["problem"] = f"{type(e).__name__}: {e} at {traceback.format_exc(limit=-1).strip()}"
        record["per_opset"][opset] = (status, time.perf_counter() - t0)
    return record


def _commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(
            ["git", *a], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    sha = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return sha + ("+uncommitted changes" if dirty else "")


def render(records: list[dict[str, Any]]) -> str:
    import onnxruntime
    import torch
    import torchvision

    passing = sum(all(s == "pass" for s, _ in r["per_opset"].values()) for r in records)
    lines = [
        "## modules",
        "",
        "Generated by `python scripts/module_sweep.py`; do not edit by hand. torch.nn modules and "
        "torchvision ops that OpInfo does not sample, each exported by `fastonnx.to_onnx` (its own "
        "capture) at each opset, run in onnxruntime and compared with eager PyTorch (atol = rtol = 1e-4; "
        "integer outputs exactly).",
        "",
        f"Generated from commit `{_commit()}` with torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}, onnxruntime {onnxruntime.__version__}. "
        f"{passing} of {len(records)} cases pass at every opset.",
        "",
        "| module | " + " | ".join(f"opset {o}" for o in OPSETS) + " | first problem |",
        "|---|" + "---|" * len(OPSETS) + "---|",
    ]
    for r in records:
        cells = [s for s, _ in (r["per_opset"][o] for o in OPSETS)]
        problem = r["problem"].replace("|", "\\|").replace("\n", " ")[:200]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {problem} |")
    return "\n".join(lines)


def write_section(body: str) -> None:
    """Replaces (or appends) this script's section of docs/coverage.md, leaving the rest as it is."""
    sys.path.insert(0, os.path.join(ROOT, "benches"))
    import ledger

    ledger.write_section(SECTION, body, path=COVERAGE, header="# Converter coverage\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=None, help="run the cases whose name contains this text; no write")
    a = p.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import warnings

    warnings.filterwarnings("ignore")
    cases = [c for c in _cases() if a.only is None or a.only.lower() in c.name.lower()]
    records = []
    for case in cases:
        rec = run_case(case)
        states = ", ".join(f"{o}: {s} ({t:.1f}s)" for o, (s, t) in rec["per_opset"].items())
        print(f"{case.name}: {states} {rec['problem'][:200]}", flush=True)
        records.append(rec)
    if a.only is None:
        write_section(render(records))
        print(f"wrote the {SECTION} section of {COVERAGE}")


if __name__ == "__main__":
    main()
