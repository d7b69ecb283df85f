"""Capturing nn.LSTM / nn.GRU / nn.RNN with their batch and sequence dims left symbolic.

torch.export specialises the sequence dim of ``aten.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu``
whatever the mode ("You marked S as dynamic but your code specialized it to be a constant"): the
problem is in those ops' fake kernels, not in the modules' Python code. So while ``to_onnx`` captures a
module, ``rnn_as_custom_ops()`` routes the four functions the modules call (``torch._VF.lstm``, ``gru``,
``rnn_tanh``, ``rnn_relu``, padded form only) to the custom ops ``fastonnx::lstm`` / ``gru`` /
``rnn_tanh`` / ``rnn_relu`` defined here. Their schemas are those of the aten ``.input`` overloads,
their eager kernels call the aten ops (same numbers as eager), and their fake kernels give the output
shapes symbolically. fastonnx converts them exactly like the aten ops (converters/recurrent.py).

This is automatic in ``fastonnx.to_onnx(module, ...)``. To export an ExportedProgram yourself with
dynamic sequence lengths, capture it inside the context manager::

    with fastonnx.capture.rnn_custom_ops.rnn_as_custom_ops():
        ep = torch.export.export(model, args, dynamic_shapes=...)

A program holding these ops needs this module imported (``import fastonnx`` does) to be loaded or run.
Packed sequences (``pack_padded_sequence``) are passed through untouched: torch.export cannot capture
them anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from fastonnx.torch_internals import VARIABLE_FUNCTIONS, vf_module

# The real functions, looked up on the C class so that a patched torch._VF never recurses into itself.
_VARIABLE_FUNCTIONS = VARIABLE_FUNCTIONS


def _output_like(input: Tensor, h: Tensor, bidirectional: bool) -> Tensor:
    """The output sequence: (seq, batch) or (batch, seq) as the input's leading dims, and one
    hidden state (h's last dim: proj_size or hidden_size) per direction."""
    directions = 2 if bidirectional else 1
    return input.new_empty((input.shape[0], input.shape[1], directions * h.shape[2]))


@torch.library.custom_op("fastonnx::lstm", mutates_args=())
def lstm(
    input: Tensor,
    hx: list[Tensor],
    params: list[Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """aten.lstm.input with symbolic batch and sequence dims under torch.export."""
    out, h, c = _VARIABLE_FUNCTIONS.lstm(
        input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first
    )
    return out, h, c


@lstm.register_fake
def _lstm_fake(
    input: Tensor,
    hx: list[Tensor],
    params: list[Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    h, c = hx
    return _output_like(input, h, bidirectional), h.new_empty(h.shape), c.new_empty(c.shape)


def _single_state_op(name: str) -> Any:
    """fastonnx::gru / rnn_tanh / rnn_relu: the aten op of that name, with a symbolic fake kernel."""
    real = getattr(_VARIABLE_FUNCTIONS, name)

    def kernel(
        input: Tensor,
        hx: Tensor,
        params: list[Tensor],
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> tuple[Tensor, Tensor]:
        out, h = real(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        return out, h

    kernel.__name__ = name
    op = torch.library.custom_op(f"fastonnx::{name}", mutates_args=())(kernel)

    def fake(
        input: Tensor,
        hx: Tensor,
        params: list[Tensor],
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> tuple[Tensor, Tensor]:
        return _output_like(input, hx, bidirectional), hx.new_empty(hx.shape)

    op.register_fake(fake)
    return op


gru = _single_state_op("gru")
rnn_tanh = _single_state_op("rnn_tanh")
rnn_relu = _single_state_op("rnn_relu")


def _routed(name: str, custom: Any, is_padded: Callable[[tuple[Any, ...]], bool]) -> Callable[..., Any]:
    real = getattr(_VARIABLE_FUNCTIONS, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        # the packed-sequence overload (data, batch_sizes, ...) keeps the real function
        if kwargs or len(args) != 9 or not is_padded(args):
            return real(*args, **kwargs)
        return custom(*args)

    return call


# padded overloads: lstm(input, hx: list, params: list, ...), gru(input, hx, params: list, ...); the packed
# ones have batch_sizes (a Tensor) second, and for lstm hx (a list) third
_ROUTES: dict[str, Callable[..., Any]] = {
    "lstm": _routed("lstm", lstm, lambda a: isinstance(a[1], (list, tuple))),
    "gru": _routed("gru", gru, lambda a: isinstance(a[2], (list, tuple))),
    "rnn_tanh": _routed("rnn_tanh", rnn_tanh, lambda a: isinstance(a[2], (list, tuple))),
    "rnn_relu": _routed("rnn_relu", rnn_relu, lambda a: isinstance(a[2], (list, tuple))),
}


@contextlib.contextmanager
def rnn_as_custom_ops() -> Iterator[None]:
    """Inside the block, nn.LSTM / GRU / RNN call fastonnx's custom ops instead of the aten ones.

    torch._VF is a module object whose attributes fall through to the C functions: setting one
    shadows it, deleting it restores the C function. Not thread-safe, like torch.export itself.
    """
    vf = vf_module()
    saved = {name: vf.__dict__.get(name) for name in _ROUTES}
    for name, fn in _ROUTES.items():
        setattr(vf, name, fn)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                delattr(vf, name)
            else:
                setattr(vf, name, old)
