"""Recurrent networks: nn.LSTM / nn.GRU / nn.RNN as ONNX LSTM / GRU / RNN; their cells as compositions.

Forms converted:

- ``aten.lstm.input`` / ``gru.input`` / ``rnn_tanh.input`` / ``rnn_relu.input``, what torch.export records
  for the modules (with a static sequence length), and ``fastonnx::lstm`` / ``gru`` / ``rnn_tanh`` /
  ``rnn_relu``, the same ops with symbolic batch and sequence dims, which ``to_onnx`` captures through
  ``fastonnx.capture.rnn_custom_ops`` (see there). Both have one schema and one converter.
- One ONNX op per layer (a multi-layer network is a chain), ``direction="bidirectional"`` for
  bidirectional ones. onnxruntime runs ``layout=0`` only, so ``batch_first`` is a Transpose before and
  after the chain. GRU uses ``linear_before_reset=1``: torch applies the reset gate after the hidden
  state's linear map. Dropout between layers exists in training mode only; training-mode dropout is
  refused.
- The weights are laid out once, at export: the gate blocks reordered (torch LSTM i, f, g, o → ONNX
  i, o, f, c; GRU r, z, n → z, r, h), the directions stacked, input and hidden biases concatenated, all
  written as new initializers from the torch tensors. The graph holds no Slice / Concat of weights.
  Only weights that are not plain initializers (computed in the graph, or on the meta device) are
  reordered by Split / Concat nodes at run time.
- What ONNX's ops cannot do runs as a ``Scan`` over time steps per layer and direction, its body doing
  the cell math: LSTM with ``proj_size`` (ONNX LSTM has no projection; ``h = W_hr (o * tanh(c))``) and
  float64 (onnxruntime's LSTM / GRU / RNN kernels are float32 only). The input projection of every
  step is one Gemm before the Scan; the body reads the weights as they are (Gemm ``transB=1``).
- ``aten.lstm_cell`` / ``gru_cell`` / ``rnn_tanh_cell`` / ``rnn_relu_cell`` (LSTMCell & co. called in a
  Python loop, unrolled by torch.export): the Scan bodies' cell math, weights read as they are.
- Packed sequences (the ``.data`` overloads) are refused: ``pack_padded_sequence`` cannot be captured by
  torch.export, and ONNX's ``sequence_lens`` input would be the only way to express them.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import split, squeeze, unsqueeze
from fastonnx.torch_internals import FakeTensor

# ONNX's gate blocks as indices into torch's: LSTM torch (i, f, g, o) -> ONNX (i, o, f, c),
# GRU torch (r, z, n) -> ONNX (z, r, h)
_ONNX_ORDER: dict[str, tuple[int, ...]] = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2), "RNN": (0,)}

# float32 runs as ONNX LSTM / GRU / RNN (onnxruntime's kernels take nothing else), float64 as a Scan
_DTYPES = (torch.float32, torch.float64)

# per conversion: (op type, weight names) -> the initializer already laid out for them, so that a
# module called twice stores its reordered weights once
_LAID_OUT: weakref.WeakKeyDictionary[ConversionContext, dict[tuple[str, ...], str]] = (
    weakref.WeakKeyDictionary()
)


# ---- weights ------------------------------------------------------------------------------------
def _tensor(ctx: ConversionContext, v: Value) -> torch.Tensor | None:
    """The torch tensor behind an initializer, or None when its bytes are not here (computed in the
    graph, meta device)."""
    t = ctx.weights.get(v.name)
    if t is None or t.is_meta or isinstance(t, FakeTensor):
        return None
    return t


def _reordered(t: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    """``t`` (gates * hidden, ...) with its gate blocks in ``order``."""
    blocks = t.reshape(len(order), t.shape[0] // len(order), *t.shape[1:])
    return blocks[list(order)].reshape(t.shape)


def _initializer(ctx: ConversionContext, hint: str, t: torch.Tensor) -> str:
    t = t.contiguous()
    # the builder holds the numpy view, which holds the tensor: no copy beyond the reordering
    data = t.reshape(-1).view(torch.uint8).numpy()
    return ctx.g.add_initializer(hint, data, dtypes.to_onnx_dtype(t.dtype), list(t.shape))


def _runtime_reordered(ctx: ConversionContext, v: Value | str, order: Sequence[int], hidden: int) -> str:
    name = v.name if isinstance(v, Value) else v
    if len(order) == 1:
        return name
    pieces = split(ctx, name, [hidden] * len(order), axis=0)
    return ctx.op("Concat", *[pieces[i] for i in order], axis=0)


def _stacked(
    ctx: ConversionContext, op_type: str, per_direction: list[list[Value]], hidden: int, hint: str
) -> str:
    """(directions, gates * hidden, ...) from one list of torch tensors per direction, each tensor's
    gate blocks in ONNX's order, the tensors of one direction concatenated (a bias: W_b then R_b)."""
    order = _ONNX_ORDER[op_type]
    key = (op_type, *(v.name for vs in per_direction for v in vs))
    cache = _LAID_OUT.setdefault(ctx, {})
    if key in cache and ctx.g.has_value(cache[key]):
        return cache[key]
    tensors = [[_tensor(ctx, v) for v in vs] for vs in per_direction]
    if all(t is not None for ts in tensors for t in ts):
        rows = [torch.cat([_reordered(t, order) for t in ts if t is not None]) for ts in tensors]
        name = _initializer(ctx, hint, torch.stack(rows))
    else:
        # weights without bytes here: reordered at run time, still correct
        rows_rt = []
        for vs in per_direction:
            parts = [_runtime_reordered(ctx, v, order, hidden) for v in vs]
            row = parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=0)
            rows_rt.append(unsqueeze(ctx, row, [0]))
        name = rows_rt[0] if len(rows_rt) == 1 else ctx.op("Concat", *rows_rt, axis=0)
    cache[key] = name
    return name


# ---- full sequences -----------------------------------------------------------------------------
def _check_input(ctx: ConversionContext, what: str, x: Value) -> None:
    if x.rank != 3:
        raise ctx.error(f"{what} expects a 3-D input (the module adds the batch dim), got rank {x.rank}")
    if x.dtype not in _DTYPES:
        raise ctx.error(
            f"{what} in {x.dtype} is not supported (float32 and float64 are); convert the module "
            "with .float()"
        )


def _state_rows(ctx: ConversionContext, state: Value, start: int, count: int, total: int) -> str:
    """Rows start:start+count of an initial state (layers * directions, batch, features)."""
    if count == total:
        return state.name
    return ctx.op("Slice", state, ctx.i64([start]), ctx.i64([start + count]), ctx.i64([0]))


def _onnx_layer(
    ctx: ConversionContext,
    op_type: str,
    activation: str | None,
    x: str,
    groups: list[list[Value]],
    has_biases: bool,
    hidden: int,
    h0: str,
    c0: str | None,
    layer: int,
) -> tuple[str, str, str | None]:
    """One layer as one ONNX op: its output sequence (seq, batch, directions * hidden), h and c
    (directions, batch, hidden)."""
    directions = len(groups)
    kind = op_type.lower()
    w = _stacked(ctx, op_type, [[g[0]] for g in groups], hidden, f"{kind}.l{layer}.W")
    r = _stacked(ctx, op_type, [[g[1]] for g in groups], hidden, f"{kind}.l{layer}.R")
    b = (
        _stacked(ctx, op_type, [[g[2], g[3]] for g in groups], hidden, f"{kind}.l{layer}.B")
        if has_biases
        else None
    )
    attrs: dict[str, Any] = {
        "hidden_size": hidden,
        "direction": "bidirectional" if directions == 2 else "forward",
    }
    if op_type == "GRU":
        attrs["linear_before_reset"] = 1
    if op_type == "RNN":
        attrs["activations"] = [activation] * directions
    if op_type == "LSTM":
        y, y_h, y_c = ctx.op(op_type, x, w, r, b, None, h0, c0, outputs=3, **attrs)
    else:
        y, y_h = ctx.op(op_type, x, w, r, b, None, h0, outputs=2, **attrs)
        y_c = None
    # Y is (seq, directions, batch, hidden); the next layer reads (seq, batch, directions * hidden)
    if directions == 1:
        seq = squeeze(ctx, y, [1])
    else:
        seq = ctx.op(
            "Reshape", ctx.op("Transpose", y, perm=[0, 2, 1, 3]), ctx.i64([0, 0, directions * hidden])
        )
    return seq, y_h, y_c


# ---- the cell math, shared by the Scan bodies and the cell converters ---------------------------
def _lstm_step(
    ctx: ConversionContext, x_gates: str, h: str, c: str, w_hh: Value, b_hh: Value | None, w_hr: Value | None
) -> tuple[str, str]:
    """One LSTM step from the input's gate pre-activations (x W_ih^T + b_ih): the next h and c."""
    hidden = w_hh.shape[0] // 4
    pre = ctx.op("Add", x_gates, ctx.op("Gemm", h, w_hh, b_hh, transB=1))
    i, f, cell, o = split(ctx, pre, [hidden] * 4, axis=1)
    c_next = ctx.op(
        "Add",
        ctx.op("Mul", ctx.op("Sigmoid", f), c),
        ctx.op("Mul", ctx.op("Sigmoid", i), ctx.op("Tanh", cell)),
    )
    h_next = ctx.op("Mul", ctx.op("Sigmoid", o), ctx.op("Tanh", c_next))
    if w_hr is not None:
        h_next = ctx.op("Gemm", h_next, w_hr, transB=1)
    return h_next, c_next


def _gru_step(ctx: ConversionContext, x_gates: str, h: str, w_hh: Value, b_hh: Value | None) -> str:
    hidden = w_hh.shape[1]
    i_r, i_z, i_n = split(ctx, x_gates, [hidden] * 3, axis=1)
    h_r, h_z, h_n = split(ctx, ctx.op("Gemm", h, w_hh, b_hh, transB=1), [hidden] * 3, axis=1)
    r = ctx.op("Sigmoid", ctx.op("Add", i_r, h_r))
    z = ctx.op("Sigmoid", ctx.op("Add", i_z, h_z))
    # the reset gate scales the hidden state's linear map, bias included (linear_before_reset)
    n = ctx.op("Tanh", ctx.op("Add", i_n, ctx.op("Mul", r, h_n)))
    # (1 - z) * n + z * h, written with one Mul fewer
    return ctx.op("Add", n, ctx.op("Mul", z, ctx.op("Sub", h, n)))


def _rnn_step(
    ctx: ConversionContext, activation: str, x_gates: str, h: str, w_hh: Value, b_hh: Value | None
) -> str:
    return ctx.op(activation, ctx.op("Add", x_gates, ctx.op("Gemm", h, w_hh, b_hh, transB=1)))


def _scan_direction(
    ctx: ConversionContext,
    op_type: str,
    activation: str | None,
    x: str,
    group: list[Value],
    has_biases: bool,
    h0: str,
    c0: str | None,
    reverse: bool,
) -> tuple[str, str, str | None]:
    """One direction of a layer as a Scan over time steps doing the cell math: the output sequence
    (seq, batch, h features), the last h and (LSTM) c. For what ONNX's ops cannot do: an LSTM
    projection, dtypes onnxruntime's kernels lack."""
    w_ih, w_hh = group[0], group[1]
    b_ih, b_hh = (group[2], group[3]) if has_biases else (None, None)
    w_hr = group[-1] if len(group) in (3, 5) else None
    dt = w_ih.dtype
    onnx_dt = dtypes.to_onnx_dtype(dt)
    gates, features = w_ih.shape[0], w_hh.shape[1]
    # every step's input projection at once, outside the loop
    flat = ctx.op("Reshape", x, ctx.i64([-1, w_ih.shape[1]]))
    projected = ctx.op("Gemm", flat, w_ih, b_ih, transB=1)
    seq_batch = ctx.op("Shape", x, start=0, end=2)
    x_gates = ctx.op("Reshape", projected, ctx.op("Concat", seq_batch, ctx.i64([gates]), axis=0))

    g = ctx.g
    body = g.subgraph(g.unique_name(f"{op_type.lower()}_step"))
    h = body.add_input(g.unique_name("h"), onnx_dt, [None, features])
    c = body.add_input(g.unique_name("c"), onnx_dt, [None, gates // 4]) if c0 is not None else None
    xg = body.add_input(g.unique_name("x_gates"), onnx_dt, [None, gates])
    ctx.g = body
    try:
        # the body reads the outer weights by name
        if op_type == "LSTM":
            assert c is not None
            h_next, c_next = _lstm_step(ctx, xg, h, c, w_hh, b_hh, w_hr)
            state = [(h_next, "h_out", features), (c_next, "c_out", gates // 4)]
        elif op_type == "GRU":
            state = [(_gru_step(ctx, xg, h, w_hh, b_hh), "h_out", features)]
        else:
            assert activation is not None
            state = [(_rnn_step(ctx, activation, xg, h, w_hh, b_hh), "h_out", features)]
        # a value cannot be two graph outputs: the scanned copy of h goes through an Identity
        for value, hint, width in [*state, (ctx.op("Identity", state[0][0]), "y_out", features)]:
            out = body.add_output(value, g.unique_name(hint))
            body.set_type(out, onnx_dt, [None, width])
    finally:
        ctx.g = g
    directions = [1] if reverse else None
    states = [h0] if c0 is None else [h0, c0]
    outs = ctx.op(
        "Scan",
        *states,
        x_gates,
        outputs=len(state) + 1,
        body=body,
        num_scan_inputs=1,
        scan_input_directions=directions,
        scan_output_directions=directions,
    )
    if op_type == "LSTM":
        return outs[2], outs[0], outs[1]
    return outs[1], outs[0], None


def _scan_layer(
    ctx: ConversionContext,
    op_type: str,
    activation: str | None,
    x: str,
    groups: list[list[Value]],
    has_biases: bool,
    hx: Sequence[Value],
    layer: int,
) -> tuple[str, str, str | None]:
    """A layer of Scans (one per direction): output sequence, h and c as _onnx_layer gives them."""
    directions = len(groups)
    ys, hs, cs = [], [], []
    for d, group in enumerate(groups):
        row = ctx.i64(layer * directions + d)
        h0 = ctx.op("Gather", hx[0], row, axis=0)
        c0 = ctx.op("Gather", hx[1], row, axis=0) if op_type == "LSTM" else None
        y, h, c = _scan_direction(ctx, op_type, activation, x, group, has_biases, h0, c0, d == 1)
        ys.append(y)
        hs.append(unsqueeze(ctx, h, [0]))
        if c is not None:
            cs.append(unsqueeze(ctx, c, [0]))
    if directions == 1:
        return ys[0], hs[0], cs[0] if cs else None
    return (
        ctx.op("Concat", *ys, axis=2),
        ctx.op("Concat", *hs, axis=0),
        ctx.op("Concat", *cs, axis=0) if cs else None,
    )


def _sequence(
    ctx: ConversionContext,
    op_type: str,
    activation: str | None,
    input: Value,
    hx: Sequence[Value],
    params: Sequence[Value],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> list[str]:
    what = f"{op_type}" if activation is None else f"RNN ({activation.lower()})"
    _check_input(ctx, what, input)
    if train and dropout > 0 and num_layers > 1:
        raise ctx.error(
            f"{what} in training mode with dropout={dropout} between layers cannot be exported "
            "(its random masks are not reproducible); call model.eval() first"
        )
    directions = 2 if bidirectional else 1
    base = 4 if has_biases else 2
    per, rest = divmod(len(params), num_layers * directions)
    projected = op_type == "LSTM" and per == base + 1
    if rest or (per != base and not projected):
        raise ctx.error(
            f"{what}: {len(params)} weights for {num_layers} layer(s) x {directions} direction(s) "
            f"with has_biases={has_biases} do not match torch's layout"
        )
    hidden = params[0].shape[0] // len(_ONNX_ORDER[op_type])
    # onnxruntime's LSTM / GRU / RNN kernels are float32 only; other dtypes compute in a Scan
    scan = projected or input.dtype != torch.float32
    x = ctx.op("Transpose", input, perm=[1, 0, 2]) if batch_first else input.name
    h_parts: list[str] = []
    c_parts: list[str] = []
    for layer in range(num_layers):
        first = layer * directions
        groups = [list(params[(first + d) * per : (first + d + 1) * per]) for d in range(directions)]
        if scan:
            x, h, c = _scan_layer(ctx, op_type, activation, x, groups, has_biases, hx, layer)
        else:
            total = num_layers * directions
            h0 = _state_rows(ctx, hx[0], first, directions, total)
            c0 = _state_rows(ctx, hx[1], first, directions, total) if op_type == "LSTM" else None
            x, h, c = _onnx_layer(ctx, op_type, activation, x, groups, has_biases, hidden, h0, c0, layer)
        h_parts.append(h)
        if c is not None:
            c_parts.append(c)
    output = ctx.op("Transpose", x, perm=[1, 0, 2]) if batch_first else x
    h_n = h_parts[0] if len(h_parts) == 1 else ctx.op("Concat", *h_parts, axis=0)
    if op_type != "LSTM":
        return [output, h_n]
    c_n = c_parts[0] if len(c_parts) == 1 else ctx.op("Concat", *c_parts, axis=0)
    return [output, h_n, c_n]


def _sequence_op(op_type: str, activation: str | None, name: str) -> Converter:
    """lstm.input / gru.input / rnn_tanh.input / rnn_relu.input: LSTM's hx is [h0, c0], the others' h0."""

    def convert(
        ctx: ConversionContext,
        input: Value,
        hx: Value | Sequence[Value],
        params: Sequence[Value],
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> list[str]:
        return _sequence(
            ctx,
            op_type,
            activation,
            input,
            [hx] if isinstance(hx, Value) else hx,
            params,
            has_biases,
            num_layers,
            dropout,
            train,
            bidirectional,
            batch_first,
        )

    convert.__name__ = name
    return convert


lstm_input = _sequence_op("LSTM", None, "lstm_input")
gru_input = _sequence_op("GRU", None, "gru_input")
rnn_tanh_input = _sequence_op("RNN", "Tanh", "rnn_tanh_input")
rnn_relu_input = _sequence_op("RNN", "Relu", "rnn_relu_input")


def packed_sequence(ctx: ConversionContext, *args: Any, **kwargs: Any) -> Any:
    raise ctx.error(
        f"{ctx.node.target if ctx.node is not None else 'a recurrent op'} runs on a packed sequence "
        "(pack_padded_sequence / PackedSequence), which fastonnx does not export: pass the padded "
        "tensor instead (torch.export cannot capture pack_padded_sequence either)"
    )


# ---- cells --------------------------------------------------------------------------------------
def _input_gates(
    ctx: ConversionContext, what: str, x: Value, h: Value, w_ih: Value, b_ih: Value | None
) -> str:
    """x W_ih^T + b_ih, one Gemm reading the weight as it is."""
    if x.rank != 2 or h.rank != 2:
        raise ctx.error(f"{what} expects 2-D input and state (the module adds the batch dim)")
    return ctx.op("Gemm", x, w_ih, b_ih, transB=1)


def lstm_cell(
    ctx: ConversionContext,
    input: Value,
    hx: Sequence[Value],
    w_ih: Value,
    w_hh: Value,
    b_ih: Value | None = None,
    b_hh: Value | None = None,
) -> list[str]:
    h, c = hx
    x_gates = _input_gates(ctx, "lstm_cell", input, h, w_ih, b_ih)
    return list(_lstm_step(ctx, x_gates, h.name, c.name, w_hh, b_hh, None))


def gru_cell(
    ctx: ConversionContext,
    input: Value,
    hx: Value,
    w_ih: Value,
    w_hh: Value,
    b_ih: Value | None = None,
    b_hh: Value | None = None,
) -> str:
    return _gru_step(ctx, _input_gates(ctx, "gru_cell", input, hx, w_ih, b_ih), hx.name, w_hh, b_hh)


def rnn_tanh_cell(
    ctx: ConversionContext,
    input: Value,
    hx: Value,
    w_ih: Value,
    w_hh: Value,
    b_ih: Value | None = None,
    b_hh: Value | None = None,
) -> str:
    x_gates = _input_gates(ctx, "rnn_tanh_cell", input, hx, w_ih, b_ih)
    return _rnn_step(ctx, "Tanh", x_gates, hx.name, w_hh, b_hh)


def rnn_relu_cell(
    ctx: ConversionContext,
    input: Value,
    hx: Value,
    w_ih: Value,
    w_hh: Value,
    b_ih: Value | None = None,
    b_hh: Value | None = None,
) -> str:
    x_gates = _input_gates(ctx, "rnn_relu_cell", input, hx, w_ih, b_ih)
    return _rnn_step(ctx, "Relu", x_gates, hx.name, w_hh, b_hh)


CONVERTERS: dict[str, Converter] = {
    "aten.lstm.input": lstm_input,
    "aten.gru.input": gru_input,
    "aten.rnn_tanh.input": rnn_tanh_input,
    "aten.rnn_relu.input": rnn_relu_input,
    "aten.lstm.data": packed_sequence,
    "aten.gru.data": packed_sequence,
    "aten.rnn_tanh.data": packed_sequence,
    "aten.rnn_relu.data": packed_sequence,
    "fastonnx.lstm.default": lstm_input,
    "fastonnx.gru.default": gru_input,
    "fastonnx.rnn_tanh.default": rnn_tanh_input,
    "fastonnx.rnn_relu.default": rnn_relu_input,
    "aten.lstm_cell.default": lstm_cell,
    "aten.gru_cell.default": gru_cell,
    "aten.rnn_tanh_cell.default": rnn_tanh_cell,
    "aten.rnn_relu_cell.default": rnn_relu_cell,
}
