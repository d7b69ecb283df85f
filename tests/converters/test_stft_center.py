"""aten.stft.center, torch 2.14's overload of stft taking center and pad_mode (what
``torch.ops.aten.stft(..., center=...)`` records; onnxscript's test_aten_stft_4): the signal padded by
n_fft // 2 on both sides with pad_mode, then framed as stft.default. The combinations of center,
pad_mode, window, win_length, normalized, onesided and return_complex, against eager torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from support.export_check import check_export


class StftCenter(torch.nn.Module):
    """torch.ops.aten.stft with center / pad_mode: the stft.center overload."""

    def __init__(self, n_fft: int, window: str | None = "input", **kwargs: Any) -> None:
        super().__init__()
        self.n_fft, self.window, self.kwargs = n_fft, window, kwargs
        self.register_buffer("hann", torch.hann_window(kwargs.get("win_length") or n_fft))

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        window = {"input": w, "buffer": self.hann, "ones": torch.ones(w.shape[0]), None: None}[self.window]
        return torch.ops.aten.stft(x, self.n_fft, window=window, **self.kwargs)


# name: (n_fft, window, stft keywords)
CASES: dict[str, tuple[int, str | None, dict[str, Any]]] = {
    # onnxscript's test_aten_stft_4: every keyword given
    "onnxscript_4": (
        4,
        "ones",
        dict(
            hop_length=1,
            win_length=4,
            center=True,
            pad_mode="reflect",
            normalized=True,
            onesided=True,
            return_complex=True,
        ),
    ),
    "center_reflect": (16, "input", dict(hop_length=4, center=True, pad_mode="reflect", return_complex=True)),
    "center_constant": (
        16,
        "input",
        dict(hop_length=5, center=True, pad_mode="constant", return_complex=True),
    ),
    "center_replicate": (
        16,
        "buffer",
        dict(hop_length=4, center=True, pad_mode="replicate", return_complex=False),
    ),
    "center_circular": (
        16,
        "input",
        dict(hop_length=3, center=True, pad_mode="circular", return_complex=True),
    ),
    "center_two_sided_normalized": (
        8,
        "input",
        dict(center=True, pad_mode="reflect", normalized=True, onesided=False, return_complex=True),
    ),
    "center_no_window_real_out": (8, None, dict(hop_length=2, center=True, return_complex=False)),
    "center_short_window": (
        16,
        "input",
        dict(hop_length=4, win_length=10, center=True, pad_mode="constant", return_complex=True),
    ),
    "center_odd_n_fft": (
        15,
        "input",
        dict(hop_length=4, center=True, pad_mode="reflect", return_complex=True),
    ),
    "not_centered": (16, "input", dict(hop_length=4, center=False, return_complex=True)),
    "not_centered_two_sided_real_out": (
        8,
        None,
        dict(center=False, normalized=True, onesided=False, return_complex=False),
    ),
    "not_centered_pad_mode_ignored": (
        8,
        "buffer",
        dict(hop_length=3, center=False, pad_mode="constant", onesided=True, return_complex=True),
    ),
}


@pytest.mark.filterwarnings("ignore:stft with return_complex=False is deprecated")
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_stft_center(case: str, batched: bool) -> None:
    n_fft, window, kwargs = CASES[case]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*((3,) if batched else ()), 40, generator=g)
    w = torch.hann_window(kwargs.get("win_length") or n_fft) + 0.1
    model = StftCenter(n_fft, window, **kwargs)
    ep = torch.export.export(model, (x, w), strict=False)
    assert torch.ops.aten.stft.center in {n.target for n in ep.graph.nodes}  # the overload under test
    check_export(model, (x, w), atol=1e-4, rtol=1e-4)


def test_stft_center_of_a_complex_signal() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 33, dtype=torch.complex64, generator=g)
    model = StftCenter(8, "input", hop_length=2, center=True, pad_mode="reflect", return_complex=True)
    check_export(model, (x, torch.hann_window(8)), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pad_mode", ["reflect", "circular"])
def test_stft_center_dynamic_length(pad_mode: str) -> None:
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 64, generator=g), torch.hann_window(16)
    # a length that is a multiple of the hop: a free one makes torch.export guard on a remainder
    n = 4 * torch.export.Dim("k", min=8, max=1024)
    check_export(
        StftCenter(16, "input", hop_length=4, center=True, pad_mode=pad_mode, return_complex=True),
        (x, w),
        dynamic_shapes=({1: n}, None),
        run_args=[(torch.randn(2, 100, generator=g), w), (torch.randn(2, 40, generator=g), w)],
        atol=1e-4,
        rtol=1e-4,
    )
