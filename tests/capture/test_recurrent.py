"""nn.LSTM / GRU / RNN and their cells match eager PyTorch in onnxruntime at opsets 17 and MAX_OPSET under
every optimization setting: one ONNX LSTM / GRU / RNN per layer with weights laid out at export, Scans
where ONNX's ops fall short (LSTM projections, float64), batch and sequence dynamic through the
fastonnx:: custom ops (capture/rnn_custom_ops.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx
import pytest
import torch
from torch.export import Dim

import fastonnx
from fastonnx._core import GraphBuilder
from fastonnx.capture.rnn_custom_ops import rnn_as_custom_ops
from fastonnx.context import ConversionContext
from fastonnx.converters import recurrent
from support.export_check import ENDS, check_export
from support.model_zoo import GRUTagger, SpeechEncoder

SETTINGS: tuple[bool | str, ...] = (False, True, "onnxruntime")


def _nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Every node, those of subgraphs (Scan bodies) included."""
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                out.extend(_nodes(attr.g))
    return out


def _check_graphs(results: list[fastonnx.ExportResult], op_type: str | None, count: int) -> None:
    """Valid ONNX; in the optimized graphs the recurrent ops' W, R, B and every Gemm's weights are
    initializers (laid out at export, nothing reshuffles them at run time), and ``count`` nodes of
    ``op_type`` (LSTM / GRU / RNN / Scan) remain."""
    for r in results:
        proto = r.model_proto
        if not any(n.domain == "com.microsoft" for n in proto.graph.node):
            onnx.checker.check_model(proto, full_check=True)
        if not r.stats["optimize"]:
            continue  # optimize=False: the graph as converted, torch's weights still in the file
        weights = {i.name for i in proto.graph.initializer}
        nodes = _nodes(proto.graph)
        read = [
            (n.op_type, name)
            for n in nodes
            if n.op_type in ("LSTM", "GRU", "RNN", "Gemm")
            for name in n.input[1 : 4 if n.op_type != "Gemm" else 3]
        ]
        computed = [(op, name) for op, name in read if name and name not in weights]
        assert not computed, f"weights computed at run time: {computed}"
        if op_type is not None:
            assert sum(n.op_type == op_type for n in proto.graph.node) == count, [n.op_type for n in nodes]


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# (module factory, input args factory, ONNX op type and count in the optimized graph)
Case = tuple[Callable[[], torch.nn.Module], Callable[[], tuple[Any, ...]], str, int]

CASES: dict[str, Case] = {
    "lstm": (lambda: torch.nn.LSTM(4, 5), lambda: (_randn(6, 3, 4),), "LSTM", 1),
    "lstm_2layer_bidirectional_batch_first_state": (
        lambda: torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True),
        lambda: (_randn(3, 6, 4), (_randn(4, 3, 5), _randn(4, 3, 5))),
        "LSTM",
        2,
    ),
    "lstm_3layer_no_bias_dropout": (
        lambda: torch.nn.LSTM(4, 5, num_layers=3, bias=False, dropout=0.5),
        lambda: (_randn(6, 2, 4),),
        "LSTM",
        3,
    ),
    "lstm_unbatched_state": (
        lambda: torch.nn.LSTM(4, 5, num_layers=2),
        lambda: (_randn(6, 4), (_randn(2, 5), _randn(2, 5))),
        "LSTM",
        2,
    ),
    "lstm_proj_state": (
        lambda: torch.nn.LSTM(4, 6, proj_size=3),
        lambda: (_randn(5, 2, 4), (_randn(1, 2, 3), _randn(1, 2, 6))),
        "Scan",
        1,
    ),
    "lstm_proj_2layer_bidirectional_batch_first": (
        lambda: torch.nn.LSTM(4, 6, num_layers=2, bidirectional=True, proj_size=3, batch_first=True),
        lambda: (_randn(2, 5, 4),),
        "Scan",
        4,
    ),
    "lstm_proj_no_bias_bidirectional_state": (
        lambda: torch.nn.LSTM(4, 6, bias=False, bidirectional=True, proj_size=2),
        lambda: (_randn(5, 3, 4), (_randn(2, 3, 2), _randn(2, 3, 6))),
        "Scan",
        2,
    ),
    "gru": (lambda: torch.nn.GRU(4, 5), lambda: (_randn(6, 3, 4),), "GRU", 1),
    "gru_2layer_bidirectional_batch_first_state": (
        lambda: torch.nn.GRU(4, 5, num_layers=2, bidirectional=True, batch_first=True),
        lambda: (_randn(3, 6, 4), _randn(4, 3, 5)),
        "GRU",
        2,
    ),
    "gru_3layer_no_bias_dropout": (
        lambda: torch.nn.GRU(4, 5, num_layers=3, bias=False, dropout=0.5),
        lambda: (_randn(6, 2, 4),),
        "GRU",
        3,
    ),
    "gru_unbatched_state": (
        lambda: torch.nn.GRU(4, 5, bidirectional=True),
        lambda: (_randn(6, 4), _randn(2, 5)),
        "GRU",
        1,
    ),
    "rnn_tanh": (lambda: torch.nn.RNN(4, 5), lambda: (_randn(6, 3, 4),), "RNN", 1),
    "rnn_tanh_3layer_bidirectional_no_bias_dropout": (
        lambda: torch.nn.RNN(4, 5, num_layers=3, bidirectional=True, bias=False, dropout=0.5),
        lambda: (_randn(6, 2, 4),),
        "RNN",
        3,
    ),
    "rnn_relu": (lambda: torch.nn.RNN(4, 5, nonlinearity="relu"), lambda: (_randn(6, 3, 4),), "RNN", 1),
    "rnn_relu_2layer_bidirectional_batch_first_state": (
        lambda: torch.nn.RNN(4, 5, num_layers=2, nonlinearity="relu", bidirectional=True, batch_first=True),
        lambda: (_randn(3, 6, 4), _randn(4, 3, 5)),
        "RNN",
        2,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_recurrent_module(case: str) -> None:
    make, inputs, op_type, count = CASES[case]
    # check_export compares the whole output structure: (output, h_n) or (output, (h_n, c_n))
    results = check_export(make(), inputs(), optimize=SETTINGS)
    _check_graphs(results, op_type, count)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True),
        lambda: torch.nn.LSTM(4, 6, proj_size=3, batch_first=True),
        lambda: torch.nn.GRU(4, 5, bidirectional=True, bias=False),
        lambda: torch.nn.RNN(4, 5, num_layers=2, nonlinearity="relu"),
    ],
    ids=["lstm", "lstm_proj", "gru", "rnn_relu"],
)
def test_float64_runs_as_scan(make: Callable[[], torch.nn.Module]) -> None:
    # onnxruntime's LSTM / GRU / RNN kernels are float32 only ("does not support double yet")
    results = check_export(
        make().double(), (_randn(5, 3, 4, dtype=torch.float64),), optimize=SETTINGS, atol=1e-10, rtol=1e-10
    )
    _check_graphs(results, None, 0)
    assert not {"LSTM", "GRU", "RNN"} & {n.op_type for r in results for n in r.model_proto.graph.node}


class _Cells(torch.nn.Module):
    """LSTMCell, GRUCell and RNNCells (tanh without bias, relu) stepped in a Python loop."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTMCell(4, 5)
        self.gru = torch.nn.GRUCell(4, 5)
        self.tanh = torch.nn.RNNCell(4, 5, bias=False)
        self.relu = torch.nn.RNNCell(4, 5, nonlinearity="relu")

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h, c = h0, torch.zeros_like(h0)
        g, t, r = h0, None, None
        for step in range(x.shape[0]):
            h, c = self.lstm(x[step], (h, c))
            g = self.gru(x[step], g)
            t = self.tanh(x[step], t)
            r = self.relu(x[step], r)
        return h, c, g, t, r  # type: ignore[return-value]


def test_cells_in_a_loop_with_dynamic_batch() -> None:
    results = check_export(
        _Cells(),
        (_randn(4, 3, 4), _randn(3, 5)),
        optimize=SETTINGS,
        dynamic_shapes=({1: Dim("batch")}, {0: Dim("batch")}),
        run_args=[(_randn(4, 1, 4), _randn(1, 5)), (_randn(4, 7, 4), _randn(7, 5))],
    )
    _check_graphs(results, None, 0)


def test_unbatched_cells() -> None:
    class Unbatched(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTMCell(4, 5)
            self.gru = torch.nn.GRUCell(4, 5)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h, _ = self.lstm(x)
            return h, self.gru(x, h)

    check_export(Unbatched(), (_randn(4),), optimize=SETTINGS)


def test_weights_computed_in_the_graph_are_reordered_at_run_time() -> None:
    """Weights that are not initializers (scaled here) take the Split / Concat path."""

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 5, bidirectional=True)
            self.gru = torch.nn.GRU(4, 5)

        def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
            lw = [w * 0.5 for w in self.lstm._flat_weights]
            gw = [w * 2.0 for w in self.gru._flat_weights]
            y, hn, cn = torch.lstm(x, (h, c), lw, True, 1, 0.0, False, True, False)
            z, gn = torch.gru(x, h[:1], gw, True, 1, 0.0, False, False, False)
            return y, hn, cn, z, gn

    check_export(Scaled(), (_randn(5, 3, 4), _randn(2, 3, 5), _randn(2, 3, 5)), optimize=SETTINGS)


def test_meta_device_weights_are_reordered_at_run_time(tmp_path: Any) -> None:
    """A model exported without weights: the reordering runs in the graph on the weights
    attach_weights writes later."""
    import onnxruntime

    real = torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True).eval()
    with torch.device("meta"):
        meta = torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True).eval()
    x = _randn(3, 2, 4)
    path = tmp_path / "lstm.onnx"
    result = fastonnx.to_onnx(meta, (x.to("meta"),), filename=path)
    assert result.stats["deferred_weights"] == 16
    fastonnx.attach_weights(path, real)
    session = onnxruntime.InferenceSession(str(path))
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        y, (h, c) = real(x)
    torch.testing.assert_close([torch.from_numpy(g) for g in got], [y, h, c])


def test_module_called_twice_stores_its_reordered_weights_once() -> None:
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = torch.nn.GRU(4, 5)

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.gru(a)[0], self.gru(b)[0]

    (result,) = check_export(Twice(), (_randn(3, 2, 4), _randn(5, 2, 4)), opsets=(17,))
    grus = [n for n in result.model_proto.graph.node if n.op_type == "GRU"]
    assert len(grus) == 2 and grus[0].input[1:4] == grus[1].input[1:4]


# ---- dynamic batch and sequence -------------------------------------------------------------------
def _check_dynamic(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    dynamic_shapes: Any,
    runs: Sequence[tuple[Any, ...]],
    op_type: str,
    count: int,
    atol: float = 1e-4,
) -> None:
    """Captured through the custom ops, converted per opset and setting, run at other sizes."""
    model = model.eval()
    with rnn_as_custom_ops():
        ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
    assert any(str(n.target).startswith("fastonnx.") for n in ep.graph.nodes)
    with torch.no_grad():
        expected = [model(*a) for a in [args, *runs]]
    for opset in ENDS:
        results = []
        for optimize in SETTINGS:
            result = fastonnx.to_onnx(ep, args, opset=opset, optimize=optimize)
            for a, exp in zip([args, *runs], expected, strict=True):
                torch.testing.assert_close(
                    result(*a),
                    exp,
                    atol=atol,
                    rtol=atol,
                    msg=lambda m, o=optimize, v=opset: f"opset={v} {o}: {m}",
                )
            results.append(result)
        _check_graphs(results, op_type, count)


def test_lstm_dynamic_batch_and_sequence() -> None:
    batch, seq = Dim("batch"), Dim("seq")
    _check_dynamic(
        torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True),
        (_randn(3, 6, 4), (_randn(4, 3, 5), _randn(4, 3, 5))),
        ({0: batch, 1: seq}, ({1: batch}, {1: batch})),
        [
            (_randn(1, 2, 4), (_randn(4, 1, 5), _randn(4, 1, 5))),
            (_randn(5, 11, 4), (_randn(4, 5, 5), _randn(4, 5, 5))),
        ],
        "LSTM",
        2,
    )


def test_lstm_proj_dynamic_batch_and_sequence() -> None:
    _check_dynamic(
        torch.nn.LSTM(4, 6, proj_size=3, bidirectional=True),
        (_randn(6, 3, 4),),
        ({0: Dim("seq"), 1: Dim("batch")},),
        [(_randn(2, 1, 4),), (_randn(9, 4, 4),)],
        "Scan",
        2,
    )


def test_gru_and_rnn_dynamic_batch_and_sequence() -> None:
    class Both(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = torch.nn.GRU(4, 5, num_layers=2)
            self.rnn = torch.nn.RNN(5, 3, nonlinearity="relu", bidirectional=True, batch_first=True)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            y, h = self.gru(x)
            z, hz = self.rnn(y.transpose(0, 1))
            return y, h, z, hz

    _check_dynamic(
        Both(),
        (_randn(6, 3, 4),),
        ({0: Dim("seq"), 1: Dim("batch")},),
        [(_randn(2, 1, 4),), (_randn(13, 5, 4),)],
        "GRU",
        2,
    )


def test_to_onnx_keeps_the_sequence_dynamic() -> None:
    """to_onnx(module) captures through the custom ops by itself; the file's dims are named."""
    model = torch.nn.GRU(4, 5, batch_first=True).eval()
    result = fastonnx.to_onnx(model, (_randn(2, 7, 4),), dynamic_shapes={"input": {0: "batch", 1: "seq"}})
    dims = [d.dim_param or d.dim_value for d in result.model_proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq", 4]
    for shape in [(1, 3), (4, 12)]:
        x = _randn(*shape, 4)
        with torch.no_grad():
            torch.testing.assert_close(result(x), model(x))


@pytest.mark.parametrize(
    "make",
    [lambda: torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True), lambda: torch.nn.LSTM(4, 6, proj_size=3)],
    ids=["lstm", "lstm_proj"],
)
def test_custom_op_and_aten_captures_give_identical_files(make: Callable[[], torch.nn.Module]) -> None:
    model, x = make().eval(), _randn(3, 2, 4)
    ep = torch.export.export(model, (x,), strict=False)  # aten.lstm.input
    # the graphs are the same; the node metadata is not, as it names the FX op each came from
    a = fastonnx.to_onnx(model, (x,), metadata=False).to_bytes()
    assert a == fastonnx.to_onnx(ep, (x,), metadata=False).to_bytes()


def test_torch_export_alone_specialises_the_sequence() -> None:
    """Why the custom ops exist: if this starts passing, torch.export no longer needs them."""
    with pytest.raises(Exception, match="specialized"):
        torch.export.export(
            torch.nn.LSTM(4, 5), (_randn(6, 2, 4),), dynamic_shapes=({0: Dim("seq")},), strict=False
        )


def test_capture_context_restores_torch() -> None:
    before = torch._VF.lstm
    with rnn_as_custom_ops():
        assert torch._VF.lstm is not before
    assert torch._VF.lstm is before and "lstm" not in vars(torch._VF)


# ---- models ---------------------------------------------------------------------------------------
def test_speech_encoder() -> None:
    model = SpeechEncoder()
    features = _randn(2, 16, 20)
    _check_graphs(check_export(model, (features,), optimize=SETTINGS), "LSTM", 2)
    # frames and batch dynamic: the strided front end halves the frame count symbolically
    _check_dynamic(
        model,
        (features,),
        ({0: Dim("batch"), 2: Dim("frames", min=3)},),
        [(_randn(1, 16, 9),), (_randn(3, 16, 41),)],
        "LSTM",
        2,
    )


def test_gru_tagger_with_dynamic_sequence_length() -> None:
    model = GRUTagger()
    tokens = torch.randint(0, 50, (7, 2))
    runs = [(torch.randint(0, 50, (3, 2)),), (torch.randint(0, 50, (20, 4)),)]
    _check_dynamic(model, (tokens,), ({0: Dim("seq"), 1: Dim("batch")},), runs, "GRU", 2)


# ---- errors -------------------------------------------------------------------------------------
def test_training_mode_dropout_is_refused() -> None:
    model = torch.nn.LSTM(4, 5, num_layers=2, dropout=0.3).train()
    with pytest.raises(fastonnx.ConversionError, match=r"training mode with dropout=0\.3.*model\.eval\(\)"):
        fastonnx.to_onnx(model, (_randn(3, 2, 4),))


def test_float16_is_refused() -> None:
    model = torch.nn.GRU(4, 5).half().eval()
    with pytest.raises(fastonnx.ConversionError, match=r"GRU in torch\.float16 is not supported"):
        fastonnx.to_onnx(model, (_randn(3, 2, 4).half(),))


def test_packed_sequences_cannot_be_captured() -> None:
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 5)

        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            y, _ = self.lstm(pack_padded_sequence(x, lengths, enforce_sorted=False))
            return pad_packed_sequence(y)[0]

    # torch.export's own message: "zeros(): argument 'size' failed to unpack ... got FakeTensor"
    with pytest.raises(fastonnx.CaptureError, match="torch.export.export failed on Packed"):
        fastonnx.to_onnx(Packed().eval(), (_randn(3, 2, 4), torch.tensor([3, 2])))


def test_packed_overloads_raise_a_clear_error() -> None:
    # no capture reaches aten.lstm.data today; its converter still names the problem
    ctx = ConversionContext(GraphBuilder(17, 8), 17)
    with pytest.raises(fastonnx.ConversionError, match="packed sequence"):
        recurrent.CONVERTERS["aten.lstm.data"](ctx)
