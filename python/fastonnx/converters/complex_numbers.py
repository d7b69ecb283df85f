"""Complex values and FFTs.

onnxruntime has no complex kernels, so fastonnx stores a complex tensor as a real one with a trailing
dim of 2 (real, imag): torch.view_as_real's layout. A ``Value`` keeps torch's complex dtype and shape;
its ONNX tensor has the part dtype (complex64 -> float32) and one more dim. Torch dims therefore index
the same ONNX axes, and the trailing 2 broadcasts like any dim.

The interpreter routes every node that reads or produces a complex value here: to ``CONVERTERS`` (ops
only this family converts) or to ``COMPLEX_OVERRIDES`` (ops other families convert for real tensors:
abs, mul, to...). Any other op on a complex value is refused with an error naming it.

FFTs use ONNX DFT (opset 17+; its axis is an attribute before opset 20, an input from 20). DFT pads or
trims to ``dft_length`` and scales its inverse by 1/n; torch's norm modes are applied on top of that.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import torch

from fastonnx.context import ConversionContext, Converter, Value, storage_dtype
from fastonnx.converters.lib.ops import atan2, hypot, normalize_axis, reduce, unsqueeze
from fastonnx.converters.lib.shape_graphs import INT64_MAX, dim_scalar, slice_axis

aten = torch.ops.aten

# torch's fft_norm_mode: the scaling of the raw sum is n ** -(mode / 2)
_NONE, _BY_ROOT_N, _BY_N = 0, 1, 2


# ---- the (..., 2) layout ------------------------------------------------------------------------


def _is_complex(x: Any) -> TypeGuard[Value]:
    return isinstance(x, Value) and x.dtype.is_complex


def _part(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex dtype's parts; a real dtype as it is."""
    return storage_dtype(dtype)


def _math(dtype: torch.dtype) -> torch.dtype:
    """float16 parts are computed in float32, as torch's CPU kernels do."""
    part = _part(dtype)
    return torch.float32 if part in (torch.float16, torch.bfloat16) else part


def _dft_dtype(dtype: torch.dtype, sizes: Sequence[Any]) -> torch.dtype:
    """The dtype a DFT runs in. onnxruntime's float32 DFT is a radix-2 FFT for powers of two (as accurate
    as torch's) but a direct sum otherwise, off by up to 1e-5 (n=60) to 2e-4 (n=1000) relative to the
    largest output: other lengths run in float64 so that the result matches torch's float32 FFT."""
    dt = _math(dtype)
    if dt == torch.float64:
        return dt
    if all(isinstance(n, int) and n > 0 and n & (n - 1) == 0 for n in sizes):
        return dt
    return torch.float64


def _real_part(ctx: ConversionContext, x: Value) -> str:
    return ctx.op("Gather", x, ctx.i64(0), axis=-1)


def _imag_part(ctx: ConversionContext, x: Value) -> str:
    return ctx.op("Gather", x, ctx.i64(1), axis=-1)


def _pack(ctx: ConversionContext, re: str, im: str) -> str:
    """Real and imaginary parts of the same shape as one complex value."""
    return ctx.op("Concat", unsqueeze(ctx, re, [-1]), unsqueeze(ctx, im, [-1]), axis=-1)


def _conj(ctx: ConversionContext, x: str, dtype: torch.dtype) -> str:
    """Negated imaginary parts of a complex value stored in ``dtype``."""
    return ctx.op("Mul", x, ctx.const([1.0, -1.0], dtype))


def _as_complex(ctx: ConversionContext, x: Any, dtype: torch.dtype) -> str:
    """A complex value, real tensor or Python number in the (..., 2) layout with ``dtype`` parts."""
    if isinstance(x, complex):
        return ctx.const([x.real, x.imag], dtype)
    if isinstance(x, (bool, int, float)):
        return ctx.const([float(x), 0.0], dtype)
    if _is_complex(x):
        return ctx.cast(x.name, dtype)
    if not isinstance(x, Value):
        raise ctx.error(f"cannot use {type(x).__name__} {x!r} as a complex operand")
    # a zero imaginary part appended by Pad: exact for every value (0 * inf would be NaN)
    column = unsqueeze(ctx, ctx.cast(x, dtype), [-1])
    rank = x.rank + 1
    pads = [0] * rank + [0] * (rank - 1) + [1]
    return ctx.op("Pad", column, ctx.i64(pads))


def _expand_to_out(ctx: ConversionContext, x: str, shape: tuple[Any, ...], out: tuple[Any, ...]) -> str:
    if [ctx.dim(d) for d in shape] == [ctx.dim(d) for d in out]:
        return x
    return ctx.op("Expand", x, ctx.shape_tensor(list(out)))


# ---- FFT building blocks ------------------------------------------------------------------------


def _norm_mode(ctx: ConversionContext, norm: str | None, forward: bool) -> int:
    """torch's norm argument as the absolute scaling of the raw sum (forward: 'backward' is none)."""
    modes = {None: _NONE, "backward": _NONE, "ortho": _BY_ROOT_N, "forward": _BY_N}
    if norm not in modes:
        raise ctx.error(f"norm must be 'backward', 'forward' or 'ortho', got {norm!r}")
    mode = modes[norm]
    return mode if forward else _BY_N - mode


def _i64_scalar(ctx: ConversionContext, n: Any) -> str:
    return ctx.i64(int(n)) if isinstance(n, int) else ctx.sym_value(n)


def _same(ctx: ConversionContext, a: Any, b: Any) -> bool:
    # compare dims as the graph writes them: comparing SymInts would add guards to torch's shape env
    return ctx.dim(a) == ctx.dim(b)


def _dft(
    ctx: ConversionContext,
    x: str,
    axis: int,
    length: Any = None,
    *,
    inverse: bool = False,
    onesided: bool = False,
) -> str:
    """One DFT along ``axis`` of a (..., 1) real or (..., 2) complex value; ``length`` pads or trims."""
    n = None if length is None else _i64_scalar(ctx, length)
    if ctx.opset >= 20:
        return ctx.op("DFT", x, n, ctx.i64(axis), inverse=int(inverse), onesided=int(onesided))
    return ctx.op("DFT", x, n, axis=axis, inverse=int(inverse), onesided=int(onesided))


def _scale(ctx: ConversionContext, y: str, sizes: Sequence[Any], exponent: float, dtype: torch.dtype) -> str:
    """``y * prod(sizes) ** exponent``: a constant for static sizes, computed from them otherwise."""
    if exponent == 0:
        return y
    if all(isinstance(s, int) for s in sizes):
        total = math.prod(int(s) for s in sizes)
        return ctx.op("Mul", y, ctx.const(float(total) ** exponent, dtype))
    count = ctx.cast(ctx.op("ReduceProd", ctx.shape_tensor(list(sizes)), keepdims=0), dtype)
    return ctx.op("Mul", y, ctx.op("Pow", count, ctx.const(float(exponent), dtype)))


def _fft_dims(ctx: ConversionContext, x: Value, s: Sequence[Any] | None, dim: Any) -> list[int]:
    """The transformed dims (normalized) of an n-D FFT: ``dim``, else the last len(s) dims, else all."""
    rank = x.rank
    if dim is None:
        dims = list(range(rank - len(s), rank)) if s is not None else list(range(rank))
    else:
        dims = [normalize_axis(d, rank) for d in ([dim] if isinstance(dim, int) else dim)]
    if s is not None and len(s) != len(dims):
        raise ctx.error(f"s has {len(s)} sizes for {len(dims)} dims")
    if len(set(dims)) != len(dims) or any(not 0 <= d < rank for d in dims):
        raise ctx.error(f"invalid FFT dims {dim!r} for a tensor of rank {rank}")
    return dims


def _sizes(x: Value, dims: Sequence[int], s: Sequence[Any] | None) -> list[Any]:
    """Signal lengths: s[i] when given (-1 keeps the input's), else the input's size."""
    if s is None:
        return [x.shape[d] for d in dims]
    return [x.shape[d] if isinstance(n, int) and n == -1 else n for d, n in zip(dims, s)]


def _c2c(
    ctx: ConversionContext, x: Value, dims: Sequence[int], sizes: Sequence[Any], inverse: bool, mode: int
) -> str:
    """Complex FFT over ``dims`` (a real input is read as complex with a zero imaginary part)."""
    if not dims:
        return _as_complex(ctx, x, _part(ctx.out_dtype))
    dt = _dft_dtype(ctx.out_dtype, sizes)
    y = ctx.cast(x.name, dt) if _is_complex(x) else unsqueeze(ctx, ctx.cast(x, dt), [-1])
    for d, n in zip(dims, sizes):
        y = _dft(ctx, y, d, None if _same(ctx, n, x.shape[d]) else n, inverse=inverse)
    y = _scale(ctx, y, sizes, -mode / 2 + (1 if inverse else 0), dt)
    return ctx.cast(y, _part(ctx.out_dtype))


def _r2c(
    ctx: ConversionContext, x: Value, dims: Sequence[int], sizes: Sequence[Any], mode: int, conj: bool = False
) -> str:
    """One-sided FFT of a real input: half spectrum along the last dim, full along the others."""
    if _is_complex(x):
        raise ctx.error("a real-to-complex FFT needs a real input, got a complex one")
    if not dims:
        raise ctx.error("a real-to-complex FFT needs at least one dim")
    dt = _dft_dtype(ctx.out_dtype, sizes)
    y = unsqueeze(ctx, ctx.cast(x, dt), [-1])
    last, n = dims[-1], sizes[-1]
    y = _dft(ctx, y, last, None if _same(ctx, n, x.shape[last]) else n, onesided=True)
    for d, m in zip(dims[:-1], sizes[:-1]):
        y = _dft(ctx, y, d, None if _same(ctx, m, x.shape[d]) else m)
    y = _scale(ctx, y, sizes, -mode / 2, dt)
    if conj:
        y = _conj(ctx, y, dt)
    return ctx.cast(y, _part(ctx.out_dtype))


def _c2r(
    ctx: ConversionContext, x: Value, dims: Sequence[int], sizes: Sequence[Any], mode: int, conj: bool = False
) -> str:
    """Real output of a Hermitian half spectrum: ``sizes[-1]`` is the output length of the last dim.

    The full spectrum X[k] = conj(X[n - k]) is rebuilt and inverse-transformed; its real part is what
    torch's c2r returns (the imaginary parts of X[0] and X[n/2] are ignored, as there).
    """
    if not dims:
        raise ctx.error("a complex-to-real FFT needs at least one dim")
    dt = _dft_dtype(ctx.out_dtype, sizes)
    y = _as_complex(ctx, x, dt)
    if conj:
        y = _conj(ctx, y, dt)
    for d, m in zip(dims[:-1], sizes[:-1]):
        y = _dft(ctx, y, d, None if _same(ctx, m, x.shape[d]) else m, inverse=True)
    last, n, have = dims[-1], sizes[-1], x.shape[dims[-1]]
    if not isinstance(n, int) or not isinstance(have, int):
        raise ctx.error("a complex-to-real FFT needs a static signal length along its last dim")
    if n < 1:
        raise ctx.error(f"invalid output length {n} for a complex-to-real FFT")
    half = n // 2 + 1
    if have > half:
        y = ctx.op("Slice", y, ctx.i64([0]), ctx.i64([half]), ctx.i64([last]))
    elif have < half:
        pads = [0] * (x.rank + 1) * 2
        pads[x.rank + 1 + last] = half - have
        y = ctx.op("Pad", y, ctx.i64(pads))
    if n - half > 0:
        # X[n - half], ..., X[1] conjugated complete the spectrum
        mirror = ctx.op("Slice", y, ctx.i64([n - half]), ctx.i64([0]), ctx.i64([last]), ctx.i64([-1]))
        y = ctx.op("Concat", y, _conj(ctx, mirror, dt), axis=last)
    y = _dft(ctx, y, last, inverse=True)
    y = ctx.op("Gather", y, ctx.i64(0), axis=-1)
    y = _scale(ctx, y, sizes, -mode / 2 + 1, dt)
    return ctx.cast(y, ctx.out_dtype)


def _half_length(ctx: ConversionContext, x: Value, d: int) -> int:
    """The default output length of a c2r transform: 2 * (input length - 1)."""
    m = x.shape[d]
    if not isinstance(m, int):
        raise ctx.error("a complex-to-real FFT without n needs a static input length")
    return 2 * (m - 1)


# ---- torch.fft --------------------------------------------------------------------------------


def _nd_args(
    ctx: ConversionContext, x: Value, s: Sequence[Any] | None, dim: Any
) -> tuple[list[int], list[Any]]:
    dims = _fft_dims(ctx, x, s, dim)
    return dims, _sizes(x, dims, s)


def _one_dim(n: Any) -> list[Any] | None:
    return None if n is None else [n]


def _c2c_fft(inverse: bool) -> Callable[..., str]:
    def convert(
        ctx: ConversionContext, x: Value, s: Any = None, dim: Any = -1, norm: str | None = None
    ) -> str:
        s = _one_dim(s) if not isinstance(s, (list, tuple)) else s
        dims, sizes = _nd_args(ctx, x, s, dim)
        return _c2c(ctx, x, dims, sizes, inverse, _norm_mode(ctx, norm, not inverse))

    convert.__name__ = "convert_ifft" if inverse else "convert_fft"
    return convert


def _r2c_fft(hermitian: bool) -> Callable[..., str]:
    """rfft*, and ihfft* (the conjugate of the one-sided forward FFT, normalized as an inverse)."""

    def convert(
        ctx: ConversionContext, x: Value, s: Any = None, dim: Any = -1, norm: str | None = None
    ) -> str:
        s = _one_dim(s) if not isinstance(s, (list, tuple)) else s
        dims, sizes = _nd_args(ctx, x, s, dim)
        return _r2c(ctx, x, dims, sizes, _norm_mode(ctx, norm, not hermitian), conj=hermitian)

    convert.__name__ = "convert_ihfft" if hermitian else "convert_rfft"
    return convert


def _c2r_fft(hermitian: bool) -> Callable[..., str]:
    """irfft*, and hfft* (the inverse one-sided FFT of the conjugate, normalized as a forward FFT)."""

    def convert(
        ctx: ConversionContext, x: Value, s: Any = None, dim: Any = -1, norm: str | None = None
    ) -> str:
        s = _one_dim(s) if not isinstance(s, (list, tuple)) else s
        dims, sizes = _nd_args(ctx, x, s, dim)
        if s is None or (isinstance(s[-1], int) and s[-1] == -1):
            sizes[-1] = _half_length(ctx, x, dims[-1])
        return _c2r(ctx, x, dims, sizes, _norm_mode(ctx, norm, hermitian), conj=hermitian and _is_complex(x))

    convert.__name__ = "convert_hfft" if hermitian else "convert_irfft"
    return convert


def _with_dims(convert: Callable[..., str], default: Any) -> Callable[..., str]:
    """fft2-style signatures (self, s, dim=default, norm) on top of the n-D converter."""

    def convert_nd(
        ctx: ConversionContext, x: Value, s: Any = None, dim: Any = default, norm: str | None = None
    ) -> str:
        return convert(ctx, x, s, dim, norm)

    convert_nd.__name__ = convert.__name__ + "_nd"
    return convert_nd


def _shift(inverse: bool) -> Callable[..., str]:
    """fftshift / ifftshift: a roll by n // 2 (forward) or -(n // 2) along each dim, as two slices."""

    def convert(ctx: ConversionContext, x: Value, dim: Any = None) -> str:
        dims = list(range(x.rank)) if dim is None else _fft_dims(ctx, x, None, dim)
        y = x.name
        for d in dims:
            n = x.shape[d]
            if isinstance(n, int):
                if n <= 1:
                    continue
                cut = ctx.i64([n // 2 if inverse else n - n // 2])
            else:
                size = ctx.sym_value(n)
                half = ctx.op("Div", size, ctx.i64(2))
                cut = ctx.unsqueeze0(half if inverse else ctx.op("Sub", size, half))
            big = ctx.i64([2**62])
            tail = ctx.op("Slice", y, cut, big, ctx.i64([d]))
            head = ctx.op("Slice", y, ctx.i64([0]), cut, ctx.i64([d]))
            y = ctx.op("Concat", tail, head, axis=d)
        return y

    convert.__name__ = "convert_ifftshift" if inverse else "convert_fftshift"
    return convert


# ---- short-time Fourier transform -------------------------------------------------------------


def _frame_index(ctx: ConversionContext, length: Any, n_fft: int, hop: int) -> str:
    """[n_frames, n_fft] int64 positions t * hop + k of every frame's samples, built by Range: a
    constant would hold n_frames * n_fft integers (millions for a long recording)."""
    if isinstance(length, int):
        if length < n_fft:
            raise ctx.error(f"stft input of length {length} is shorter than n_fft={n_fft}")
        count = ctx.i64(1 + (length - n_fft) // hop)
    else:
        count = ctx.op("Sub", ctx.sym_value(length), ctx.i64(n_fft))
        count = ctx.op("Add", ctx.op("Div", count, ctx.i64(hop)), ctx.i64(1))
    starts = ctx.op("Mul", ctx.op("Range", ctx.i64(0), count, ctx.i64(1)), ctx.i64(hop))
    offsets = ctx.op("Range", ctx.i64(0), ctx.i64(n_fft), ctx.i64(1))
    return ctx.op("Add", unsqueeze(ctx, starts, [1]), offsets)


def convert_stft(
    ctx: ConversionContext,
    x: Value,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Value | None = None,
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    align_to_window: bool | None = None,
) -> str:
    """Frames gathered at t * hop, windowed (the window zero-padded to n_fft, centered), one DFT over
    them; output (batch, freq, frames). center=True reaches here as an explicit pad before the op."""
    if align_to_window:
        raise ctx.error("stft with align_to_window=True is not converted")
    if x.rank not in (1, 2):
        raise ctx.error(f"stft takes a 1-D or 2-D input, got rank {x.rank}")
    hop = hop_length if hop_length is not None else n_fft // 4
    win = win_length if win_length is not None else n_fft
    out_dtype = ctx.out_dtype  # complex, or real with return_complex=False: the same (..., 2) layout
    dt = _dft_dtype(out_dtype, [n_fft])
    axis = x.rank - 1
    # the length read from x itself: after center=True's pad it is an expression of the input's dims
    index = _frame_index(ctx, dim_scalar(ctx, x, axis), n_fft, hop)
    frames = ctx.op("Gather", ctx.cast(x.name, dt), index, axis=axis)
    complex_window = window is not None and _is_complex(window)
    if window is not None and complex_window:
        # (..., 2) frames times the (n_fft, 2) window, padded to n_fft along its first axis
        w = ctx.cast(window.name, dt)
        if win < n_fft:
            left = (n_fft - win) // 2
            w = ctx.op("Pad", w, ctx.i64([left, 0, n_fft - win - left, 0]))
        framed = Value(frames, x.dtype, (*x.shape[:-1], -1, n_fft))  # (only its rank and dtype are read)
        frames = _mul_values(ctx, _as_complex(ctx, framed, dt), False, w, False)
    elif window is not None or win < n_fft:
        w = ctx.cast(window, dt) if window is not None else ctx.const([1.0] * win, dt)
        if win < n_fft:
            left = (n_fft - win) // 2
            w = ctx.op("Pad", w, ctx.i64([left, n_fft - win - left]))
        frames = ctx.op("Mul", frames, unsqueeze(ctx, w, [-1]) if _is_complex(x) else w)
    # frames: (batch?, n_frames, n_fft[, 2]); one DFT over the n_fft axis
    is_complex = _is_complex(x) or complex_window
    one_sided = not is_complex if onesided is None else onesided
    if is_complex and one_sided:
        raise ctx.error("stft of a complex input or with a complex window cannot be one-sided")
    signal = frames if is_complex else unsqueeze(ctx, frames, [-1])
    y = _dft(ctx, signal, x.rank, onesided=one_sided)
    if normalized:
        y = ctx.op("Mul", y, ctx.const(n_fft**-0.5, dt))
    perm = [1, 0, 2] if x.rank == 1 else [0, 2, 1, 3]
    return ctx.cast(ctx.op("Transpose", y, perm=perm), _part(out_dtype))


# ONNX Pad's mode for each of stft's pad modes; "circular" is two slices around the signal instead
_CENTER_PAD_MODES = {"reflect": "reflect", "constant": "constant", "replicate": "edge", "circular": None}


def convert_stft_center(
    ctx: ConversionContext,
    x: Value,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Value | None = None,
    center: bool = True,
    pad_mode: str = "reflect",
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    align_to_window: bool | None = None,
) -> str:
    """aten.stft.center (torch 2.14): stft with the centering inside the op. center=True pads the
    signal by n_fft // 2 on both sides of its last axis with ``pad_mode`` (what torch.stft does in
    Python before calling the default overload), then frames it as stft.default does."""
    if center:
        if align_to_window is not None:
            raise ctx.error("stft: align_to_window is only defined for center=False")
        if pad_mode not in _CENTER_PAD_MODES:
            raise ctx.error(f"stft pad_mode {pad_mode!r} is not one of {', '.join(_CENTER_PAD_MODES)}")
        x = _center_pad(ctx, x, n_fft // 2, pad_mode)
    return convert_stft(
        ctx, x, n_fft, hop_length, win_length, window, normalized, onesided, return_complex, align_to_window
    )


def _center_pad(ctx: ConversionContext, x: Value, pad: int, mode: str) -> Value:
    """``x`` padded by ``pad`` on both sides of its last torch axis (the ONNX axis before the trailing
    2 of a complex signal), with torch's length: the input's plus 2 * pad (a SymInt expression when the
    input's length is symbolic, found again from the padded value's own Shape)."""
    if pad == 0:
        return x
    axis = x.rank - 1
    rank = x.rank + (1 if _is_complex(x) else 0)  # the ONNX rank
    onnx_mode = _CENTER_PAD_MODES[mode]
    if onnx_mode is None:  # circular: the signal's tail before it, its head after it
        tail = slice_axis(ctx, x, axis, -pad, INT64_MAX)
        head = slice_axis(ctx, x, axis, 0, pad)
        padded = ctx.op("Concat", tail, x, head, axis=axis)
    else:
        pads = [0] * (2 * rank)
        pads[axis] = pads[rank + axis] = pad
        fill = ctx.const(0, _part(x.dtype)) if onnx_mode == "constant" else None
        padded = ctx.op("Pad", x, ctx.i64(pads), fill, mode=onnx_mode)
    return Value(padded, x.dtype, (*x.shape[:-1], x.shape[-1] + 2 * pad))


def _overlap_add(ctx: ConversionContext, frames: str, index: str, total: str, trailing: list[int]) -> str:
    """Sums (batch, n_frames, n_fft, *trailing) frames into (batch, total, *trailing) at the positions
    ``index`` (n_frames, n_fft): one ScatterElements with reduction="add" along axis 1."""
    flat_shape = ctx.concat_dims([ctx.op("Shape", frames, start=0, end=1), -1, *trailing])
    updates = ctx.op("Reshape", frames, flat_shape)
    idx = ctx.op("Reshape", index, ctx.i64([1, -1, *([1] * len(trailing))]))
    idx = ctx.op("Expand", idx, ctx.op("Shape", updates))
    zeros_shape = ctx.concat_dims([ctx.op("Shape", frames, start=0, end=1), ctx.unsqueeze0(total), *trailing])
    zeros = ctx.op(
        "ConstantOfShape", zeros_shape, value=ctx.tensor_attr(0.0, ctx.dtype(frames) or torch.float32)
    )
    return ctx.op("ScatterElements", zeros, idx, updates, axis=1, reduction="add")


def convert_istft(
    ctx: ConversionContext,
    x: Value,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Value | None = None,
    center: bool = True,
    normalized: bool = False,
    onesided: bool | None = None,
    length: Any = None,
    return_complex: bool = False,
) -> str:
    """Inverse STFT as torch computes it: an inverse DFT of every frame (c2r, or c2c with
    return_complex), times the window (zero-padded to n_fft, centered), overlap-added, divided by the
    overlap-added squared window, trimmed by n_fft // 2 on each side when centered (or to ``length``,
    zero-padded past the signal). torch's check that the window envelope is nowhere below 1e-11 is a
    runtime check on the window's values; it is not repeated here (such a window gives inf / NaN)."""
    if not _is_complex(x):
        raise ctx.error("istft takes a complex input (freq, frames), as torch requires")
    if x.rank not in (2, 3):
        raise ctx.error(f"istft takes a 2-D or 3-D complex input, got rank {x.rank}")
    if window is not None and _is_complex(window):
        raise ctx.error("istft with a complex window is not converted")
    hop = hop_length if hop_length is not None else n_fft // 4
    win = win_length if win_length is not None else n_fft
    if not 0 < win <= n_fft or hop <= 0:
        raise ctx.error(f"istft: invalid win_length={win} or hop_length={hop} for n_fft={n_fft}")
    fft_size, n_frames = x.shape[-2], x.shape[-1]
    if not isinstance(fft_size, int):
        raise ctx.error("istft needs a static number of frequency bins")
    one_sided = fft_size != n_fft if onesided is None else onesided
    if one_sided and fft_size != n_fft // 2 + 1:
        raise ctx.error(f"one-sided istft expects n_fft // 2 + 1 = {n_fft // 2 + 1} bins, got {fft_size}")
    if not one_sided and fft_size != n_fft:
        raise ctx.error(f"two-sided istft expects n_fft = {n_fft} bins, got {fft_size}")
    if return_complex and one_sided:
        raise ctx.error("istft with return_complex=True needs a two-sided input (onesided=False)")
    mode = _BY_ROOT_N if normalized else _BY_N
    spec = x.name if x.rank == 3 else unsqueeze(ctx, x.name, [0])
    spec = ctx.op("Transpose", spec, perm=[0, 2, 1, 3])  # (batch, frames, freq, 2)
    batch = x.shape[0] if x.rank == 3 else 1
    framed = Value(spec, x.dtype, (batch, n_frames, fft_size))
    if return_complex:
        frames = _c2c(ctx, framed, [2], [n_fft], True, mode)  # (batch, frames, n_fft, 2)
    else:
        frames = _c2r(ctx, framed, [2], [n_fft], mode)  # (batch, frames, n_fft)
    dt = ctx.dtype(frames) or torch.float32
    w = ctx.cast(window, dt) if window is not None else ctx.const([1.0] * win, dt)
    if win < n_fft:
        left = (n_fft - win) // 2
        w = ctx.op("Pad", w, ctx.i64([left, n_fft - win - left]))
    trailing = [2] if return_complex else []
    frames = ctx.op("Mul", frames, unsqueeze(ctx, w, [-1]) if return_complex else w)
    count = _i64_scalar(ctx, dim_scalar(ctx, x, x.rank - 1))
    starts = ctx.op("Mul", ctx.op("Range", ctx.i64(0), count, ctx.i64(1)), ctx.i64(hop))
    index = ctx.op(
        "Add", unsqueeze(ctx, starts, [1]), ctx.op("Range", ctx.i64(0), ctx.i64(n_fft), ctx.i64(1))
    )
    # expected_output_signal_len = n_fft + hop * (n_frames - 1)
    total = ctx.op("Add", ctx.op("Mul", ctx.op("Sub", count, ctx.i64(1)), ctx.i64(hop)), ctx.i64(n_fft))
    y = _overlap_add(ctx, frames, index, total, trailing)
    squared = ctx.op("Mul", w, w)
    tiled = ctx.op(
        "Expand", unsqueeze(ctx, squared, [0, 1]), ctx.concat_dims([1, ctx.unsqueeze0(count), n_fft])
    )
    envelope = _overlap_add(ctx, tiled, index, total, [])  # (1, total)
    start = n_fft // 2 if center else 0
    if length is not None:
        end = ctx.op("Add", _i64_scalar(ctx, length), ctx.i64(start))
    elif center:
        end = ctx.op("Sub", total, ctx.i64(n_fft // 2))
    else:
        end = total
    begin, stop, axis = ctx.i64([start]), ctx.unsqueeze0(end), ctx.i64([1])
    y = ctx.op("Slice", y, begin, stop, axis)
    envelope = ctx.op("Slice", envelope, begin, stop, axis)
    y = ctx.op("Div", y, unsqueeze(ctx, envelope, [-1]) if return_complex else envelope)
    if length is not None:
        # a requested length past the signal is zero-padded, after the division
        short = ctx.op("Max", ctx.op("Sub", end, total), ctx.i64(0))
        pads = ctx.concat_dims(
            [0, 0, *([0] * len(trailing)), 0, ctx.unsqueeze0(short), *([0] * len(trailing))]
        )
        y = ctx.op("Pad", y, pads)
    if x.rank == 2:
        y = ctx.op("Squeeze", y, ctx.i64([0]))
    return ctx.cast(y, _part(ctx.out_dtype))


# ---- aten's FFT primitives (what decomposition tables produce) -------------------------------


def convert_fft_r2c(
    ctx: ConversionContext, x: Value, dim: Sequence[int], normalization: int, onesided: bool
) -> str:
    dims = [normalize_axis(d, x.rank) for d in dim]
    sizes = [x.shape[d] for d in dims]
    if onesided:
        return _r2c(ctx, x, dims, sizes, normalization)
    return _c2c(ctx, x, dims, sizes, False, normalization)


def convert_fft_c2c(
    ctx: ConversionContext, x: Value, dim: Sequence[int], normalization: int, forward: bool
) -> str:
    dims = [normalize_axis(d, x.rank) for d in dim]
    return _c2c(ctx, x, dims, [x.shape[d] for d in dims], not forward, normalization)


def convert_fft_c2r(
    ctx: ConversionContext, x: Value, dim: Sequence[int], normalization: int, last_dim_size: Any
) -> str:
    dims = [normalize_axis(d, x.rank) for d in dim]
    sizes = [x.shape[d] for d in dims[:-1]] + [last_dim_size]
    return _c2r(ctx, x, dims, sizes, normalization)


# ---- complex construction and parts -----------------------------------------------------------


def convert_view_as_complex(ctx: ConversionContext, x: Value) -> str:
    return x.name  # (..., 2) real is already the layout


def convert_view_as_real(ctx: ConversionContext, x: Value) -> str:
    if not _is_complex(x):
        raise ctx.error("view_as_real needs a complex input")
    return x.name


def convert_complex(ctx: ConversionContext, real: Value, imag: Value) -> str:
    dt, out = _part(ctx.out_dtype), ctx.out_shape
    re = _expand_to_out(ctx, ctx.cast(real, dt), real.shape, out)
    im = _expand_to_out(ctx, ctx.cast(imag, dt), imag.shape, out)
    return _pack(ctx, re, im)


def convert_polar(ctx: ConversionContext, magnitude: Value, angle: Value) -> str:
    part, dt, out = _part(ctx.out_dtype), _math(ctx.out_dtype), ctx.out_shape
    r, theta = ctx.cast(magnitude, dt), ctx.cast(angle, dt)
    re = ctx.op("Mul", r, ctx.op("Cos", theta))
    im = ctx.op("Mul", r, ctx.op("Sin", theta))
    shape = torch.broadcast_shapes(magnitude.shape, angle.shape)
    re = _expand_to_out(ctx, ctx.cast(re, part), tuple(shape), out)
    im = _expand_to_out(ctx, ctx.cast(im, part), tuple(shape), out)
    return _pack(ctx, re, im)


def convert_real(ctx: ConversionContext, x: Value) -> str:
    return _real_part(ctx, x) if _is_complex(x) else x.name


def convert_imag(ctx: ConversionContext, x: Value) -> str:
    if not _is_complex(x):
        raise ctx.error("imag is only defined for complex tensors")
    return _imag_part(ctx, x)


def convert_conj(ctx: ConversionContext, x: Value) -> str:
    """conj / _conj / conj_physical: the imaginary part negated; real tensors are their own conjugate."""
    if not _is_complex(x):
        return x.name
    return _conj(ctx, x.name, _part(x.dtype))


def convert_angle(ctx: ConversionContext, x: Value) -> str:
    """atan2(imag, real); for a real input pi where it is negative, 0 elsewhere, NaN kept."""
    out = ctx.out_dtype
    dt = _math(out)
    if _is_complex(x):
        re, im = ctx.cast(_real_part(ctx, x), dt), ctx.cast(_imag_part(ctx, x), dt)
        return ctx.cast(atan2(ctx, im, re, dt), out)
    v = ctx.cast(x, dt)
    zero = ctx.const(0.0, dt)
    result = ctx.op("Where", ctx.op("Less", v, zero), ctx.const(math.pi, dt), zero)
    if x.dtype.is_floating_point:
        result = ctx.op("Where", ctx.op("IsNaN", v), v, result)
    return ctx.cast(result, out)


def convert_abs(ctx: ConversionContext, x: Value) -> str:
    """|z| = hypot(real, imag) (no overflow of the squares)."""
    if not _is_complex(x):
        raise ctx.error("the complex abs converter got a real input")
    dt = _part(x.dtype)
    return ctx.cast(hypot(ctx, _real_part(ctx, x), _imag_part(ctx, x), dt), ctx.out_dtype)


def convert_to_complex_aware(ctx: ConversionContext, x: Any, *args: Any, **kwargs: Any) -> str:
    """to / _to_copy / chalf with a complex input or output: real -> complex appends a zero imaginary part,
    complex -> real keeps the real part (as torch does, with a warning)."""
    out = ctx.out_dtype
    if out.is_complex:
        return _as_complex(ctx, x, _part(out))
    if _is_complex(x):
        return ctx.cast(_real_part(ctx, x), out)
    # device, layout, copy and memory_format have no meaning in an ONNX graph
    return ctx.cast(x, out)


def convert_sym_size(ctx: ConversionContext, x: Value, dim: int) -> Any:
    """A torch dim indexes the same ONNX axis of the (..., 2) layout."""
    return dim_scalar(ctx, x, normalize_axis(dim, x.rank))


def convert_identity_complex(ctx: ConversionContext, x: Any, *args: Any, **kwargs: Any) -> str:
    """clone / alias / detach / resolve_conj...: the same value (conjugation is never lazy here)."""
    if _is_complex(x):
        return x.name
    return ctx.cast(ctx.operand(x, ctx.out_dtype), ctx.out_dtype)


# ---- arithmetic on complex values (what FFT pipelines use) ----------------------------------


def _operand(ctx: ConversionContext, x: Any, dt: torch.dtype) -> tuple[str, bool]:
    """An operand in the complex layout, or a real one broadcasting over (real, imag): (name, is_real)."""
    if _is_complex(x) or isinstance(x, complex):
        return _as_complex(ctx, x, dt), False
    if isinstance(x, (bool, int, float)):
        return ctx.const(float(x), dt), True
    if isinstance(x, Value):
        return unsqueeze(ctx, ctx.cast(x, dt), [-1]), True
    raise ctx.error(f"cannot use {type(x).__name__} {x!r} as an operand of a complex op")


def _add_sub(op_type: str) -> Callable[..., str]:
    def convert(ctx: ConversionContext, a: Any, b: Any, alpha: Any = 1) -> str:
        dt = _part(ctx.out_dtype)
        x = _as_complex(ctx, a, dt)
        y = _as_complex(ctx, b, dt)
        if alpha != 1:
            y = _mul_values(ctx, y, False, *_operand(ctx, alpha, dt))
        return ctx.op(op_type, x, y)

    convert.__name__ = f"convert_complex_{op_type.lower()}"
    return convert


def _mul_values(ctx: ConversionContext, a: str, a_real: bool, b: str, b_real: bool) -> str:
    if a_real or b_real:
        return ctx.op("Mul", a, b)
    ar, ai = (ctx.op("Gather", a, ctx.i64(i), axis=-1) for i in (0, 1))
    br, bi = (ctx.op("Gather", b, ctx.i64(i), axis=-1) for i in (0, 1))
    re = ctx.op("Sub", ctx.op("Mul", ar, br), ctx.op("Mul", ai, bi))
    im = ctx.op("Add", ctx.op("Mul", ar, bi), ctx.op("Mul", ai, br))
    return _pack(ctx, re, im)


def convert_mul(ctx: ConversionContext, a: Any, b: Any) -> str:
    dt = _part(ctx.out_dtype)
    return _mul_values(ctx, *_operand(ctx, a, dt), *_operand(ctx, b, dt))


def _parts_of(ctx: ConversionContext, x: str) -> tuple[str, str]:
    return ctx.op("Gather", x, ctx.i64(0), axis=-1), ctx.op("Gather", x, ctx.i64(1), axis=-1)


def _complex_div(ctx: ConversionContext, a: str, b: str, dt: torch.dtype) -> str:
    """(a + bi) / (c + di) scaled by the larger of |c|, |d| (Smith's method, as c10::complex does): the
    naive formula overflows |c|² + |d|² long before the quotient does."""
    (ar, ai), (br, bi) = _parts_of(ctx, a), _parts_of(ctx, b)
    wide = ctx.op("GreaterOrEqual", ctx.op("Abs", br), ctx.op("Abs", bi))
    # wide: r = d / c, s = c + d r, re = (a + b r) / s, im = (b - a r) / s
    r1 = ctx.op("Div", bi, br)
    s1 = ctx.op("Add", br, ctx.op("Mul", bi, r1))
    re1 = ctx.op("Div", ctx.op("Add", ar, ctx.op("Mul", ai, r1)), s1)
    im1 = ctx.op("Div", ctx.op("Sub", ai, ctx.op("Mul", ar, r1)), s1)
    # tall: r = c / d, s = d + c r, re = (a r + b) / s, im = (b r - a) / s
    r2 = ctx.op("Div", br, bi)
    s2 = ctx.op("Add", bi, ctx.op("Mul", br, r2))
    re2 = ctx.op("Div", ctx.op("Add", ctx.op("Mul", ar, r2), ai), s2)
    im2 = ctx.op("Div", ctx.op("Sub", ctx.op("Mul", ai, r2), ar), s2)
    # a zero divisor gives a / 0 per part (inf or NaN), as torch
    zero = ctx.const(0.0, dt)
    both_zero = ctx.op("And", ctx.op("Equal", br, zero), ctx.op("Equal", bi, zero))
    re = ctx.op("Where", both_zero, ctx.op("Div", ar, zero), ctx.op("Where", wide, re1, re2))
    im = ctx.op("Where", both_zero, ctx.op("Div", ai, zero), ctx.op("Where", wide, im1, im2))
    return _pack(ctx, re, im)


def convert_div(ctx: ConversionContext, a: Any, b: Any, rounding_mode: str | None = None) -> str:
    if rounding_mode is not None:
        raise ctx.error(f"div with rounding_mode={rounding_mode!r} is not defined for complex values")
    dt = _part(ctx.out_dtype)
    x, x_real = _operand(ctx, a, dt)
    y, y_real = _operand(ctx, b, dt)
    if y_real:
        # a real divisor divides both parts (torch's complex division by c + 0i gives the same)
        return ctx.op("Div", x if not x_real else _as_complex(ctx, a, dt), y)
    return _complex_div(ctx, _as_complex(ctx, a, dt) if x_real else x, y, dt)


def convert_reciprocal(ctx: ConversionContext, x: Value) -> str:
    dt = _part(ctx.out_dtype)
    return _complex_div(ctx, ctx.const([1.0, 0.0], dt), _as_complex(ctx, x, dt), dt)


def convert_exp(ctx: ConversionContext, x: Value) -> str:
    """exp(a + bi) = e^a (cos b + i sin b)."""
    dt = _math(ctx.out_dtype)
    re, im = _parts_of(ctx, ctx.cast(x.name, dt))
    scale = ctx.op("Exp", re)
    out = _pack(ctx, ctx.op("Mul", scale, ctx.op("Cos", im)), ctx.op("Mul", scale, ctx.op("Sin", im)))
    return ctx.cast(out, _part(ctx.out_dtype))


def _reduce(op_type: str) -> Callable[..., str]:
    """sum / mean over torch dims (all of them by default); the (real, imag) axis is never reduced."""

    def convert(
        ctx: ConversionContext, x: Value, dims: Any = None, keepdim: bool = False, *, dtype: Any = None
    ) -> str:
        if isinstance(dims, int):
            dims = [dims]
        y = ctx.cast(x.name, _part(ctx.out_dtype))
        if x.rank == 0:
            return y  # torch accepts dims 0 and -1 of a 0-d tensor
        axes = list(range(x.rank)) if not dims else [_axis(ctx, d, x.rank) for d in dims]
        if not axes:
            return y
        return reduce(ctx, op_type, y, axes, keepdim)

    convert.__name__ = f"convert_complex_{op_type.lower()}"
    return convert


def convert_neg(ctx: ConversionContext, x: Value) -> str:
    return ctx.op("Neg", x.name)


def convert_sym_numel(ctx: ConversionContext, x: Value) -> Any:
    """numel of a complex value: its (..., 2) storage holds twice as many numbers."""
    static = x.static_shape()
    if static is not None:
        return math.prod(static)
    return ctx.op("ReduceProd", ctx.op("Shape", x.name, end=-1), keepdims=0)


# ---- layout ops: a torch dim is the same ONNX axis; shapes get the trailing 2 ------------------


def _axis(ctx: ConversionContext, dim: int, rank: int) -> int:
    axis = normalize_axis(dim, rank)
    if not 0 <= axis < rank:
        raise ctx.error(f"dim {dim} is out of range for rank {rank}")
    return axis


def _out_shape_tensor(ctx: ConversionContext, sizes: Sequence[Any] | None = None) -> str:
    """The output's shape plus the (real, imag) dim: from FX metadata when static, else from ``sizes``
    (the op's own size list: ints and SymInt values; -1 is left to Reshape)."""
    out = list(ctx.out_shape)
    if all(isinstance(d, int) for d in out) or sizes is None:
        return ctx.shape_tensor([*out, 2])
    return ctx.shape_tensor([*sizes, 2])


def convert_reshape(ctx: ConversionContext, x: Value, sizes: Sequence[Any] | None = None, *args: Any) -> str:
    """view / reshape / _unsafe_view / flatten of a complex value."""
    return ctx.op(
        "Reshape", x.name, _out_shape_tensor(ctx, sizes if isinstance(sizes, (list, tuple)) else None)
    )


def convert_expand(ctx: ConversionContext, x: Value, sizes: Sequence[Any], implicit: bool = False) -> str:
    return ctx.op("Expand", x.name, ctx.shape_tensor([*ctx.out_shape, 2]))


def convert_permute(ctx: ConversionContext, x: Value, dims: Sequence[int]) -> str:
    return ctx.op("Transpose", x.name, perm=[_axis(ctx, d, x.rank) for d in dims] + [x.rank])


def convert_transpose(ctx: ConversionContext, x: Value, a: int, b: int) -> str:
    if x.rank == 0:
        return x.name  # torch accepts dims 0 and -1 of a 0-d tensor
    perm = list(range(x.rank + 1))
    i, j = _axis(ctx, a, x.rank), _axis(ctx, b, x.rank)
    perm[i], perm[j] = perm[j], perm[i]
    return ctx.op("Transpose", x.name, perm=perm)


def convert_unsqueeze(ctx: ConversionContext, x: Value, dim: int) -> str:
    return unsqueeze(ctx, x.name, [_axis(ctx, dim, x.rank + 1)])


def convert_squeeze(ctx: ConversionContext, x: Value, dims: Any = None) -> str:
    """squeeze / squeeze.dim / squeeze.dims: the named (or all) dims of static size 1; torch leaves the
    others as they are."""
    if x.rank == 0:
        return x.name  # torch accepts dims 0 and -1 of a 0-d tensor
    wanted = (
        range(x.rank)
        if dims is None
        else [_axis(ctx, d, x.rank) for d in ([dims] if isinstance(dims, int) else dims)]
    )
    axes = sorted({d for d in wanted if isinstance(x.shape[d], int) and x.shape[d] == 1})
    if not axes:
        return x.name
    return ctx.op("Squeeze", x.name, ctx.i64(axes))


def _index(ctx: ConversionContext, v: Any) -> str:
    return ctx.i64([int(v)]) if isinstance(v, int) else ctx.unsqueeze0(ctx.sym_value(v))


def convert_slice(
    ctx: ConversionContext, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> str:
    begin = 0 if start is None else start
    stop = 2**62 if end is None else end
    axis = _axis(ctx, dim, x.rank)
    return ctx.op("Slice", x.name, _index(ctx, begin), _index(ctx, stop), ctx.i64([axis]), ctx.i64([step]))


def convert_narrow(ctx: ConversionContext, x: Value, dim: int, start: Any, length: Any) -> str:
    if isinstance(start, int) and isinstance(length, int):
        return convert_slice(ctx, x, dim, start, start + length)
    begin = _index(ctx, start)
    stop = ctx.op("Add", begin, _index(ctx, length))
    axis = _axis(ctx, dim, x.rank)
    return ctx.op("Slice", x.name, begin, stop, ctx.i64([axis]))


def convert_pad(
    ctx: ConversionContext, x: Value, pad: Sequence[int], mode: str = "constant", value: Any = None
) -> str:
    """Pad of the torch dims (the pad list names the last dims first); the (real, imag) axis gets none.
    A constant pads the real part with its real part and the imaginary part with its imaginary part."""
    rank = x.rank
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise ctx.error(f"pad list {list(pad)} does not fit a tensor of rank {rank}")
    if any(not isinstance(p, int) for p in pad):
        raise ctx.error("padding a complex tensor needs static amounts")
    begins, ends = [0] * (rank + 1), [0] * (rank + 1)
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if any(p < 0 for p in pad):
        if mode == "circular":
            raise ctx.error("circular padding of a complex tensor with negative amounts is not converted")
        # negative amounts crop first: the remaining padding reads the cropped edges, as torch does
        axes = [a for a in range(rank) if begins[a] < 0 or ends[a] < 0]
        starts = [max(-begins[a], 0) for a in axes]
        stops = [ends[a] if ends[a] < 0 else 2**62 for a in axes]
        y = ctx.op("Slice", x.name, ctx.i64(starts), ctx.i64(stops), ctx.i64(axes))
        # only the rank of the cropped value matters below
        return convert_pad(ctx, Value(y, x.dtype, x.shape), [max(p, 0) for p in pad], mode, value)
    pads = ctx.i64(begins + ends)
    if mode == "constant":
        fill = complex(0 if value is None else value)
        if fill == 0:
            return ctx.op("Pad", x.name, pads)
        dt = _part(x.dtype)
        part_pads = ctx.i64(begins[:-1] + ends[:-1])
        re = ctx.op("Pad", _real_part(ctx, x), part_pads, ctx.const(fill.real, dt))
        im = ctx.op("Pad", _imag_part(ctx, x), part_pads, ctx.const(fill.imag, dt))
        return _pack(ctx, re, im)
    if mode in ("reflect", "replicate"):
        return ctx.op("Pad", x.name, pads, mode="reflect" if mode == "reflect" else "edge")
    if mode == "circular":
        y = x.name
        for axis in range(rank):
            lo, hi = begins[axis], ends[axis]
            parts = [convert_slice(ctx, Value(y, x.dtype, x.shape), axis, -lo)] if lo else []
            parts.append(y)
            if hi:
                parts.append(convert_slice(ctx, Value(y, x.dtype, x.shape), axis, 0, hi))
            if len(parts) > 1:
                y = ctx.op("Concat", *parts, axis=axis)
        return y
    raise ctx.error(f"pad mode {mode!r} is not supported (constant, reflect, replicate, circular)")


def convert_constant_pad_nd(ctx: ConversionContext, x: Value, pad: Sequence[int], value: Any = 0) -> str:
    return convert_pad(ctx, x, pad, "constant", value)


def convert_select(ctx: ConversionContext, x: Value, dim: int, index: Any) -> str:
    i = ctx.i64(int(index)) if isinstance(index, int) else ctx.sym_value(index)
    return ctx.op("Gather", x.name, i, axis=_axis(ctx, dim, x.rank))


def convert_cat(ctx: ConversionContext, tensors: Sequence[Value], dim: int = 0) -> str:
    dt, rank = _part(ctx.out_dtype), len(ctx.out_shape)
    # torch lets 1-D empty tensors join any cat; they hold nothing
    parts = [t for t in tensors if not (t.rank == 1 and isinstance(t.shape[0], int) and t.shape[0] == 0)]
    values = [_as_complex(ctx, t, dt) for t in parts or tensors[:1]]
    return values[0] if len(values) == 1 else ctx.op("Concat", *values, axis=_axis(ctx, dim, rank))


def convert_stack(ctx: ConversionContext, tensors: Sequence[Value], dim: int = 0) -> str:
    dt = _part(ctx.out_dtype)
    axis = _axis(ctx, dim, len(ctx.out_shape))
    values = [unsqueeze(ctx, _as_complex(ctx, t, dt), [axis]) for t in tensors]
    return values[0] if len(values) == 1 else ctx.op("Concat", *values, axis=axis)


# every converter of this family understands the (..., 2) layout of complex values
COMPLEX_NATIVE = True

CONVERTERS: dict[str, Converter] = {
    "aten.fft_fft.default": _c2c_fft(False),
    "aten.fft_fft2.default": _with_dims(_c2c_fft(False), [-2, -1]),
    "aten.fft_fftn.default": _with_dims(_c2c_fft(False), None),
    "aten.fft_ifft.default": _c2c_fft(True),
    "aten.fft_ifft2.default": _with_dims(_c2c_fft(True), [-2, -1]),
    "aten.fft_ifftn.default": _with_dims(_c2c_fft(True), None),
    "aten.fft_rfft.default": _r2c_fft(False),
    "aten.fft_rfft2.default": _with_dims(_r2c_fft(False), [-2, -1]),
    "aten.fft_rfftn.default": _with_dims(_r2c_fft(False), None),
    "aten.fft_ihfft.default": _r2c_fft(True),
    "aten.fft_ihfft2.default": _with_dims(_r2c_fft(True), [-2, -1]),
    "aten.fft_ihfftn.default": _with_dims(_r2c_fft(True), None),
    "aten.fft_irfft.default": _c2r_fft(False),
    "aten.fft_irfft2.default": _with_dims(_c2r_fft(False), [-2, -1]),
    "aten.fft_irfftn.default": _with_dims(_c2r_fft(False), None),
    "aten.fft_hfft.default": _c2r_fft(True),
    "aten.fft_hfft2.default": _with_dims(_c2r_fft(True), [-2, -1]),
    "aten.fft_hfftn.default": _with_dims(_c2r_fft(True), None),
    "aten.stft.default": convert_stft,
    "aten.stft.center": convert_stft_center,
    "aten.istft.default": convert_istft,
    "aten.fft_fftshift.default": _shift(False),
    "aten.fft_ifftshift.default": _shift(True),
    "aten._fft_r2c.default": convert_fft_r2c,
    "aten._fft_c2c.default": convert_fft_c2c,
    "aten._fft_c2r.default": convert_fft_c2r,
    "aten.view_as_complex.default": convert_view_as_complex,
    "aten.view_as_real.default": convert_view_as_real,
    "aten.complex.default": convert_complex,
    "aten.polar.default": convert_polar,
    "aten.real.default": convert_real,
    "aten.imag.default": convert_imag,
    "aten.angle.default": convert_angle,
    "aten.conj.default": convert_conj,
    "aten._conj.default": convert_conj,
    "aten.conj_physical.default": convert_conj,
    "aten.chalf.default": convert_to_complex_aware,
}
COMPLEX_CONVERTERS: dict[str, Converter] = {
    "aten.abs.default": convert_abs,
    "aten.neg.default": convert_neg,
    "aten.to.dtype": convert_to_complex_aware,
    "aten.to.device": convert_to_complex_aware,
    "aten.to.dtype_layout": convert_to_complex_aware,
    "aten.to.other": convert_to_complex_aware,
    "aten._to_copy.default": convert_to_complex_aware,
    "aten.alias.default": convert_identity_complex,
    "aten.clone.default": convert_identity_complex,
    "aten.contiguous.default": convert_identity_complex,
    "aten.detach.default": convert_identity_complex,
    "aten.lift_fresh_copy.default": convert_identity_complex,
    "aten.lift_fresh.default": convert_identity_complex,
    "aten.alias_copy.default": convert_identity_complex,
    "aten.resolve_conj.default": convert_identity_complex,
    "aten.resolve_neg.default": convert_identity_complex,
    "aten.add.Tensor": _add_sub("Add"),
    "aten.add.Scalar": _add_sub("Add"),
    "aten.sub.Tensor": _add_sub("Sub"),
    "aten.sub.Scalar": _add_sub("Sub"),
    "aten.view.default": convert_reshape,
    "aten.reshape.default": convert_reshape,
    "aten._unsafe_view.default": convert_reshape,
    "aten.flatten.using_ints": convert_reshape,
    "aten.expand.default": convert_expand,
    "aten.permute.default": convert_permute,
    "aten.transpose.int": convert_transpose,
    "aten.unsqueeze.default": convert_unsqueeze,
    "aten.squeeze.default": convert_squeeze,
    "aten.squeeze.dim": convert_squeeze,
    "aten.squeeze.dims": convert_squeeze,
    "aten.slice.Tensor": convert_slice,
    "aten.select.int": convert_select,
    "aten.narrow.default": convert_narrow,
    "aten.pad.default": convert_pad,
    "aten.constant_pad_nd.default": convert_constant_pad_nd,
    "aten.cat.default": convert_cat,
    "aten.stack.default": convert_stack,
    "aten.sym_size.int": convert_sym_size,
    "aten.sym_numel.default": convert_sym_numel,
    "aten.div.Tensor": convert_div,
    "aten.div.Scalar": convert_div,
    "aten.div.Tensor_mode": convert_div,
    "aten.true_divide.Tensor": convert_div,
    "aten.reciprocal.default": convert_reciprocal,
    "aten.exp.default": convert_exp,
    "aten.sum.default": _reduce("ReduceSum"),
    "aten.sum.dim_IntList": _reduce("ReduceSum"),
    "aten.mean.default": _reduce("ReduceMean"),
    "aten.mean.dim": _reduce("ReduceMean"),
    "aten.mul.Tensor": convert_mul,
    "aten.mul.Scalar": convert_mul,
}
