"""What to_onnx returns: the built graph, its stats, and ways to save, inspect and run it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from fastonnx._core import GraphBuilder
from fastonnx.errors import InputError, RuntimeCheckError
from fastonnx.interpreter import Layout

if TYPE_CHECKING:
    import onnx
    import onnxruntime


class ExportResult:
    """An exported model. ``model_proto`` and the onnxruntime session are built on first use."""

    def __init__(
        self,
        builder: GraphBuilder,
        layout: Layout,
        in_spec: Any,
        out_spec: Any,
        stats: dict[str, Any],
    ) -> None:
        self._builder = builder
        self._layout = layout
        self._in_spec = in_spec
        self._out_spec = out_spec
        self.stats = stats
        self.path: str | None = None
        self._proto: onnx.ModelProto | None = None
        self._session: onnxruntime.InferenceSession | None = None

    @property
    def input_names(self) -> list[str]:
        return self._builder.input_names()

    @property
    def output_names(self) -> list[str]:
        return self._builder.output_names()

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an onnx.ModelProto (weights inline, copied into it: meant for inspection)."""
        if self._proto is None:
            import onnx

            self._proto = onnx.load_from_string(self._builder.to_bytes())
        return self._proto

    def to_bytes(self) -> bytes:
        """The serialized model, weights inline (fails over 2 GiB: save with external data instead)."""
        return self._builder.to_bytes()

    def save(self, path: str | os.PathLike[str], external_data: bool | None = None) -> dict[str, Any]:
        """Write the model atomically; external_data=None switches to a .data file past 2 GiB."""
        info = self._builder.save(os.fspath(path), external_data)
        self.path = info["path"]
        self._session = None
        return info

    # ---- running in onnxruntime -----------------------------------------------------------------
    def session(self) -> onnxruntime.InferenceSession:
        if self._session is None:
            import onnxruntime

            opts = onnxruntime.SessionOptions()
            source: Any = self.path if self.path is not None else self._builder.to_bytes()
            try:
                self._session = onnxruntime.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
            except Exception as e:
                raise RuntimeCheckError(f"onnxruntime could not load the exported model: {e}") from e
        return self._session

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model in onnxruntime on inputs structured like the model's; returns torch tensors."""
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if self._in_spec is not None and spec != self._in_spec:
            raise InputError(f"inputs are structured as {spec}, the model was exported with {self._in_spec}")
        if len(leaves) != len(self._layout.inputs):
            raise InputError(
                f"got {len(leaves)} flattened inputs, the model takes {len(self._layout.inputs)}"
            )
        feeds = {}
        for slot, leaf in zip(self._layout.inputs, leaves):
            if slot.onnx_name is None:
                continue
            if not isinstance(leaf, torch.Tensor):
                raise InputError(f"input {slot.onnx_name} must be a tensor, got {type(leaf).__name__}")
            feeds[slot.onnx_name] = _to_numpy(leaf)
        sess = self.session()
        names = [s.onnx_name for s in self._layout.outputs if s.onnx_name is not None]
        try:
            arrays = sess.run(names, feeds)
        except Exception as e:
            raise RuntimeCheckError(f"onnxruntime failed to run the exported model: {e}") from e
        it = iter(arrays)
        flat: list[Any] = []
        for out in self._layout.outputs:
            if out.onnx_name is None:
                flat.append(out.constant)
                continue
            a = next(it)
            if a.dtype.char == "Q":  # onnxruntime's uint64 arrays are numpy ulonglong, which torch refuses
                a = a.view("uint64")
            t = torch.from_numpy(a)
            if out.is_complex:
                if t.numel() == 0:  # numpy gives empty arrays zero strides, which view_as_complex refuses
                    t = torch.empty(t.shape, dtype=t.dtype)
                t = torch.view_as_complex(t)  # the graph holds complex values as (..., 2) real
            flat.append(t.item() if out.is_scalar else t)
        if self._out_spec is None:
            return flat[0] if len(flat) == 1 else tuple(flat)
        return pytree.tree_unflatten(flat, self._out_spec)

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"ExportResult(opset={s.get('opset')}, nodes={s.get('nodes')}, "
            f"initializers={s.get('initializers')}, path={self.path!r})"
        )


def _to_numpy(t: torch.Tensor) -> Any:
    t = t.detach().cpu()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())  # the graph's layout of complex values
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
