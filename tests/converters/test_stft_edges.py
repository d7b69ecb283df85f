"""stft with center=True under every padding mode, and istft (c2r and c2c, centered or not, trimmed or
zero-padded to ``length``, partial windows, dynamic frame counts), against eager torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from support.export_check import check_export

PAD_MODES = ["reflect", "constant", "replicate", "circular"]


class Stft(torch.nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        return torch.stft(x, window=window, return_complex=True, **self.kwargs)


@pytest.mark.parametrize("pad_mode", PAD_MODES)
@pytest.mark.parametrize("batched", [False, True])
def test_stft_center_pad_modes(pad_mode: str, batched: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*((3,) if batched else ()), 61, generator=g)
    model = Stft(n_fft=16, hop_length=5, win_length=12, center=True, pad_mode=pad_mode)
    check_export(model, (x, torch.hann_window(12)), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pad_mode", PAD_MODES)
def test_stft_center_dynamic_length(pad_mode: str) -> None:
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 64, generator=g), torch.hann_window(16)
    # a free length makes torch.export guard on (2 % (2 + 2*(n // 4))) != 0 and refuse it; a multiple
    # of the hop exports
    n = 4 * torch.export.Dim("k", min=8, max=1024)
    check_export(
        Stft(n_fft=16, hop_length=4, center=True, pad_mode=pad_mode, onesided=False, normalized=True),
        (x, w),
        dynamic_shapes=({1: n}, None),
        run_args=[(torch.randn(2, 100, generator=g), w), (torch.randn(2, 40, generator=g), w)],
        atol=1e-4,
        rtol=1e-4,
    )


class Istft(torch.nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, spec: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        return torch.istft(spec, window=window, **self.kwargs)


def _spectrum(
    batch: tuple[int, ...], length: int, n_fft: int, hop: int, onesided: bool = True
) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(*batch, length, generator=g)
    return torch.stft(
        x, n_fft, hop, window=torch.hann_window(n_fft), return_complex=True, onesided=onesided, center=True
    )


# a window whose overlap-added square is nowhere zero, so that center=False is defined too
def _window(n: int) -> torch.Tensor:
    return torch.hann_window(n) + 0.1


ISTFT_CASES: dict[str, tuple[dict[str, Any], tuple[int, ...], bool]] = {
    # name: (istft kwargs, batch shape, one-sided spectrum)
    "centered": ({"center": True}, (2,), True),
    "not_centered": ({"center": False}, (2,), True),
    "unbatched": ({"center": True}, (), True),
    "length_shorter": ({"center": True, "length": 50}, (2,), True),
    "length_longer": ({"center": True, "length": 75}, (2,), True),
    "length_longer_not_centered": ({"center": False, "length": 80}, (2,), True),
    "partial_window_normalized": ({"center": True, "win_length": 12, "normalized": True}, (2,), True),
    "two_sided_real": ({"center": True, "onesided": False}, (2,), False),
    "return_complex": ({"center": True, "onesided": False, "return_complex": True}, (2,), False),
    "return_complex_length": (
        {"center": False, "onesided": False, "return_complex": True, "length": 70},
        (),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(ISTFT_CASES))
def test_istft(name: str) -> None:
    kwargs, batch, onesided = ISTFT_CASES[name]
    n_fft, hop = 16, 4
    spec = _spectrum(batch, 64, n_fft, hop, onesided)
    window = _window(kwargs.get("win_length", n_fft))
    model = Istft(n_fft=n_fft, hop_length=hop, **kwargs)
    check_export(model, (spec, window), atol=1e-5, rtol=1e-5)


def test_istft_dynamic_frames() -> None:
    # center=True with a dynamic frame count makes torch.export guard on sym_min(...) and refuse it;
    # center=False exports
    n_fft, hop = 32, 8
    spec, window = _spectrum((3,), 128, n_fft, hop), _window(n_fft)
    frames = torch.export.Dim("frames", min=4, max=512)
    check_export(
        Istft(n_fft=n_fft, hop_length=hop, center=False),
        (spec, window),
        dynamic_shapes=({2: frames}, None),
        run_args=[(_spectrum((3,), 300, n_fft, hop), window), (_spectrum((3,), 50, n_fft, hop), window)],
        atol=1e-5,
        rtol=1e-5,
    )


def test_istft_without_window() -> None:
    class NoWindow(torch.nn.Module):
        def forward(self, spec: torch.Tensor) -> torch.Tensor:
            return torch.istft(spec, 16, 4, center=True)

    check_export(NoWindow(), (_spectrum((2,), 64, 16, 4),), atol=1e-5, rtol=1e-5)
