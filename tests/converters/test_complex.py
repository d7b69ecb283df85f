"""Complex values (stored as (..., 2) real) and FFTs against torch's OpInfo samples and hand-written cases."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fastonnx
from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import assert_case_converts, assert_op_converts, opinfo_cases

FFT_OPS = [
    "fft.fft",
    "fft.ifft",
    "fft.rfft",
    "fft.irfft",
    "fft.hfft",
    "fft.ihfft",
    "fft.fft2",
    "fft.ifft2",
    "fft.rfft2",
    "fft.irfft2",
    "fft.hfft2",
    "fft.ihfft2",
    "fft.fftn",
    "fft.ifftn",
    "fft.rfftn",
    "fft.irfftn",
    "fft.hfftn",
    "fft.ihfftn",
    "fft.fftshift",
    "fft.ifftshift",
    "stft",
]
COMPLEX_OPS = [
    "view_as_complex",
    "complex",
    "polar",
    "real",
    "angle",
    "conj",
    "conj_physical",
    "resolve_conj",
    "cfloat",
    "cdouble",
    "chalf",
]
OPS = FFT_OPS + COMPLEX_OPS
# complex inputs: the samples of the ops that take them (rfft / ihfft and their n-D forms take real ones)
COMPLEX_INPUT_OPS = [
    "fft.fft",
    "fft.ifft",
    "fft.irfft",
    "fft.hfft",
    "fft.fft2",
    "fft.ifft2",
    "fft.irfft2",
    "fft.hfft2",
    "fft.fftn",
    "fft.ifftn",
    "fft.irfftn",
    "fft.hfftn",
    "fft.fftshift",
    "fft.ifftshift",
    "view_as_real",
    "real",
    "imag",
    "angle",
    "abs",
    "conj",
    "conj_physical",
    "resolve_conj",
    "cfloat",
    "cdouble",
    "chalf",
    "add",
    "sub",
    "mul",
    "neg",
    "stft",
    "div.no_rounding_mode",
    "true_divide",
    "__rdiv__",
    "reciprocal",
    "exp",
    "sum",
    "mean",
    # layout ops: a torch dim is the same ONNX axis, shapes get the trailing (real, imag) dim
    "reshape",
    "view",
    "flatten",
    "permute",
    "transpose",
    "unsqueeze",
    "squeeze",
    "squeeze.multiple",
    "select",
    "narrow",
    "cat",
    "stack",
    "expand",
    "nn.functional.pad.constant",
    "nn.functional.pad.reflect",
    "nn.functional.pad.replicate",
]
# torch's CPU FFTs have no float16 kernels: only the ops below declare float16
HALF_OPS = [
    "fft.fftshift",
    "fft.ifftshift",
    "view_as_complex",
    "complex",
    "polar",
    "real",
    "angle",
    "cfloat",
    "cdouble",
    "chalf",
    "conj_physical",
]
INT_OPS = [
    "fft.fft",
    "fft.rfft2",
    "fft.irfftn",
    "fft.hfft",
    "fft.ihfftn",
    "fft.fftshift",
    "real",
    "angle",
    "cfloat",
    "chalf",
]


@pytest.mark.parametrize(
    ("op_name", "dtype"), opinfo_cases(OPS, complex64=COMPLEX_INPUT_OPS, float16=HALF_OPS, int64=INT_OPS)
)
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


@pytest.mark.parametrize("op_name", ["fft.fft", "fft.irfft", "fft.fftshift", "real", "angle", "chalf"])
def test_bool(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, dtype=torch.bool, limit=2)


# ---- hand-written cases: norm modes, lengths, complex graph inputs and outputs ----------------

NORMS = [None, "backward", "forward", "ortho"]


@pytest.mark.parametrize("norm", NORMS)
def test_norm_modes_1d(norm: str | None) -> None:
    x = torch.randn(3, 10)
    z = torch.randn(3, 10, dtype=torch.complex64)

    def fn(a: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.fft.fft(a, norm=norm),
            torch.fft.fft(c, n=16, norm=norm),  # zero-padded
            torch.fft.ifft(c, n=7, dim=0, norm=norm),  # trimmed along the first dim
            torch.fft.rfft(a, n=12, norm=norm),
            torch.fft.irfft(c, norm=norm),
            torch.fft.irfft(c, n=9, norm=norm),  # odd output length
            torch.fft.irfft(c, n=30, norm=norm),  # half spectrum shorter than needed: zero-padded
            torch.fft.hfft(c, n=8, norm=norm),
            torch.fft.ihfft(a, n=11, norm=norm),
        )

    check_export(Fn(fn), (x, z), opsets=ENDS)


@pytest.mark.parametrize("norm", NORMS)
def test_norm_modes_nd(norm: str | None) -> None:
    x = torch.randn(2, 5, 6)
    z = torch.randn(2, 5, 6, dtype=torch.complex64)

    def fn(a: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.fft.fft2(c, s=(4, 8), norm=norm),
            torch.fft.ifftn(c, dim=(0, 2), norm=norm),
            torch.fft.rfft2(a, norm=norm),
            torch.fft.rfftn(a, s=(3, 7), dim=(0, 1), norm=norm),
            torch.fft.irfftn(c, s=(5, 9), norm=norm),
            torch.fft.irfft2(c, s=(-1, 6), norm=norm),
            torch.fft.hfftn(c, norm=norm),
            torch.fft.ihfft2(a, s=(4, 5), norm=norm),
            torch.fft.ihfftn(a, norm=norm),
        )

    check_export(Fn(fn), (x, z), opsets=ENDS)


def test_round_trips_and_long_signals() -> None:
    # 400 (an STFT window) is not a power of two: onnxruntime's float32 DFT is a direct sum there
    x = torch.randn(2, 400)
    fn = Fn(
        lambda a: (
            torch.fft.irfft(torch.fft.rfft(a), n=400),
            torch.fft.ifft(torch.fft.fft(a)).real,
            torch.fft.rfft(a).abs(),
            torch.fft.fftshift(torch.fft.fft(a[:, :64]), dim=-1),
        )
    )
    check_export(fn, (x,), opsets=ENDS, atol=1e-4, rtol=1e-4)


class ComplexModel(torch.nn.Module):
    """A complex graph input and output, a complex buffer, and arithmetic between complex values."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("filt", torch.randn(8, dtype=torch.complex64))

    def forward(self, z: torch.Tensor, gain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spectrum = torch.fft.fft(z) * self.filt
        out = torch.fft.ifft(spectrum * gain + 1j) - z.conj()
        return out, torch.view_as_real(out * out), (-z).abs()


def test_complex_inputs_outputs_and_buffers() -> None:
    z = torch.randn(3, 8, dtype=torch.complex64)
    gain = torch.rand(8) + 0.5
    results = check_export(ComplexModel(), (z, gain), opsets=ENDS)
    out = results[0](z, gain)
    assert out[0].dtype == torch.complex64 and out[0].shape == (3, 8)
    # the ONNX graph itself is real: complex values are (..., 2) float tensors
    graph = results[0].model_proto.graph
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [3, 8, 2]
    assert graph.input[0].type.tensor_type.elem_type == 1  # FLOAT
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim] == [3, 8, 2]


class RotaryEmbedding(torch.nn.Module):
    """Llama's reference rotary embedding: a complex buffer from torch.polar, complex views and products."""

    freqs_cis: torch.Tensor

    def __init__(self, seq: int = 6, dim: int = 8) -> None:
        super().__init__()
        freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        freqs = self.freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
        out = torch.view_as_real(xq_ * freqs).flatten(3).type_as(xq)
        part = xq_[:, :, :1].transpose(1, 2).permute(0, 2, 1, 3)
        joined = torch.cat([xq_, part], dim=-2).unsqueeze(0).squeeze(0)
        stacked = torch.stack([xq_[..., 0], xq_.select(-1, 1)], dim=1).expand(2, 2, 6, 3)
        return out, joined, stacked


def test_rotary_embedding_with_complex_views() -> None:
    check_export(RotaryEmbedding(), (torch.randn(2, 6, 3, 8),), opsets=ENDS)


def test_complex_padding() -> None:
    z = torch.randn(2, 3, 5, dtype=torch.complex64)
    fn = Fn(
        lambda c: (
            torch.nn.functional.pad(c, (2, 1), mode="reflect"),
            torch.nn.functional.pad(c, (1, -2, 1, 1)),
            torch.nn.functional.pad(c, (1, 2), mode="circular"),
            torch.ops.aten.constant_pad_nd(c, [1, 1], 2.5),
        )
    )
    check_export(fn, (z,), opsets=ENDS)


def test_complex128_and_conversions() -> None:
    z = torch.randn(4, 6, dtype=torch.complex128)
    x = torch.randn(4, 6)

    def fn(c: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.fft.fft2(c),
            c.to(torch.complex64),
            a.to(torch.complex64) + c.to(torch.complex64),
            c.real.float(),
            torch.complex(a, a * 2).to(torch.complex128) * c,
            torch.polar(a.abs(), a),
            # (c.angle() is left out: onnxruntime has no float64 Atan kernel; the graph stays float64
            # like elementwise's atan2, valid ONNX that keeps torch's precision)
            torch.view_as_complex(torch.stack([a, -a], dim=-1)),
        )

    check_export(Fn(fn), (z, x), opsets=ENDS, atol=1e-6, rtol=1e-6)


def test_angle_and_abs_special_values() -> None:
    inf, nan = math.inf, math.nan
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0, nan, -inf, inf])
    z = torch.complex(
        torch.tensor([1e30, -1e30, 0.0, -0.0, inf, 3.0, -1.0]),
        torch.tensor([1e30, 2.0, -0.0, 0.0, 1.0, -inf, 0.0]),
    )
    check_export(Fn(lambda a, c: (a.angle(), c.abs(), c.angle(), torch.fft.fftshift(c))), (x, z), opsets=ENDS)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_fft": 16, "hop_length": 5, "win_length": 10, "normalized": True},
        {"n_fft": 12, "onesided": False, "center": False},
        {"n_fft": 8, "hop_length": 8, "center": False, "return_complex": False},
        {"n_fft": 20, "win_length": 15, "center": True, "pad_mode": "constant"},
    ],
    ids=["short_window_normalized", "two_sided", "real_output", "constant_pad"],
)
def test_stft_arguments(kwargs: dict[str, Any]) -> None:
    x = torch.randn(2, 90)
    win = kwargs.get("win_length", kwargs["n_fft"])
    window = torch.hann_window(win)
    check_export(Fn(lambda a, w: torch.stft(a, window=w, **{"return_complex": True, **kwargs})), (x, window))


def test_stft_complex_input_and_dynamic_batch() -> None:
    z = torch.randn(50, dtype=torch.complex64)
    check_export(Fn(lambda c: torch.stft(c, 8, hop_length=3, center=False, return_complex=True)), (z,))
    # (a dynamic signal length is refused by torch.export itself: stft's meta adds unprovable guards)
    x = torch.randn(2, 64)
    batch = torch.export.Dim("batch")
    fn = Fn(
        lambda a: torch.stft(a, 16, hop_length=4, window=torch.ones(16), center=False, return_complex=True)
    )
    check_export(fn, (x,), dynamic_shapes=(({0: batch},),), run_args=[(torch.randn(3, 64),)])


def test_stft_real_input_complex_window() -> None:
    window = torch.polar(torch.hann_window(12), torch.linspace(0, 3, 12))
    fn = Fn(lambda a, w: torch.stft(a, 16, hop_length=4, win_length=12, window=w, return_complex=True))
    check_export(fn, (torch.randn(2, 70), window))


def test_complex_division_special_values() -> None:
    # huge parts (|c|² + |d|² overflows float32), zero divisors, real and complex operands on either side
    num = torch.complex(
        torch.tensor([1e30, 1.0, 3.0, -2.0, 0.0, 1.0]), torch.tensor([1e30, 2.0, -1.0, 5.0, 0.0, 0.0])
    )
    den = torch.complex(
        torch.tensor([3e30, 0.0, 1e-3, -4.0, 2.0, 0.0]), torch.tensor([-1e30, 4.0, 2.0, 0.0, 0.0, 0.0])
    )
    real = torch.tensor([2.0, -3.0, 0.5, 1e30, 1.0, 0.0])
    fn = Fn(
        lambda a, b, r: (
            a / b,
            a / r,
            r / b,
            1 / b,
            a / 2.5,
            (a[1:] * b[1:]).sum(),
            a.mean(),
            torch.exp(a * 1e-30),
        )
    )
    check_export(fn, (num, den, real), opsets=ENDS)


def test_fft_primitives_after_decomposition() -> None:
    # a decomposition table turns fft_* into aten._fft_r2c / _fft_c2c / _fft_c2r
    x = torch.randn(4, 6)

    def fn(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.fft.fft(a, norm="ortho"),
            torch.fft.irfft(torch.fft.rfft(a), n=7),
            torch.fft.ifft2(a.to(torch.complex64), norm="forward"),
            torch.fft.hfft(a),
            torch.fft.ihfft(a),
        )

    ep = torch.export.export(Fn(fn), (x,)).run_decompositions()
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"aten._fft_r2c.default", "aten._fft_c2c.default", "aten._fft_c2r.default"} <= targets
    for opset in ENDS:
        got = fastonnx.to_onnx(ep, (x,), opset=opset)(x)
        torch.testing.assert_close(got, fn(x), atol=1e-4, rtol=1e-4)


def test_dynamic_batch() -> None:
    x = torch.randn(3, 16)
    batch = torch.export.Dim("batch")
    fn = Fn(lambda a: (torch.fft.rfft(a, norm="ortho"), torch.fft.fftshift(a, dim=0), torch.fft.ifft(a).imag))
    check_export(fn, (x,), dynamic_shapes=(({0: batch},),), run_args=[(torch.randn(5, 16),)], opsets=ENDS)


def test_dynamic_signal_length() -> None:
    # the FFT length is only known at run time: the normalization and the shift are computed in the graph
    x = torch.randn(2, 12)
    length = torch.export.Dim("length", min=2)
    fn = Fn(lambda a: (torch.fft.fft(a, norm="ortho"), torch.fft.ifftshift(a, dim=1), torch.fft.rfft(a)))
    check_export(fn, (x,), dynamic_shapes=(({1: length},),), run_args=[(torch.randn(2, 7),)], opsets=ENDS)


def test_dynamic_complex_input() -> None:
    # sizes read from a complex value (sym_size / numel) exclude the trailing (real, imag) dim
    z = torch.randn(3, 8, dtype=torch.complex64)
    batch = torch.export.Dim("batch")
    fn = Fn(lambda c: (torch.fft.ifft(c) * c.shape[0], torch.fft.fft(c) * c.numel(), c.real))
    check_export(
        fn, (z,), dynamic_shapes=(({0: batch},),), run_args=[(torch.randn(5, 8, dtype=torch.complex64),)]
    )


@pytest.mark.parametrize(
    "fn, op",
    [
        (lambda z: torch.sin(z), "aten.sin.default"),
        (lambda z: z.prod(dim=0), "aten.prod.dim_int"),
        (lambda z: z.log(), "aten.log.default"),
        (lambda z: torch.fft.fft(z).sqrt(), "aten.sqrt.default"),
    ],
    ids=["sin", "prod", "log", "sqrt_of_fft"],
)
def test_unsupported_op_on_complex_is_refused(fn: Callable[..., Any], op: str) -> None:
    z = torch.randn(2, 4, dtype=torch.complex64)
    ep = torch.export.export(Fn(fn), (z,))
    with pytest.raises(fastonnx.UnsupportedOpError, match=f"complex inputs are not supported by {op}"):
        fastonnx.to_onnx(ep, (z,))


def test_op_producing_complex_is_refused() -> None:
    x = torch.randn(2, 4)
    ep = torch.export.export(Fn(lambda a: torch.zeros(2, 4, dtype=torch.complex64) + a), (x,))
    with pytest.raises(fastonnx.UnsupportedOpError, match="complex outputs are not supported by aten.zeros"):
        fastonnx.to_onnx(ep, (x,))


def test_bad_norm_is_refused() -> None:
    x = torch.randn(8)
    ep = torch.export.export(Fn(lambda a: torch.ops.aten.fft_fft.default(a, None, -1, "backward")), (x,))
    fastonnx.to_onnx(ep, (x,))  # the valid spelling converts
    graph = ep.graph_module.graph
    for node in graph.nodes:
        if node.target == torch.ops.aten.fft_fft.default:
            node.args = (node.args[0], None, -1, "sideways")
    with pytest.raises(fastonnx.ConversionError, match="norm must be"):
        fastonnx.to_onnx(ep, (x,))
