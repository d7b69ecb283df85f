"""``ONNXProgram``: what fastonnx.export returns, with the surface of torch.onnx.ONNXProgram that callers
use (``model_proto``, ``model``, ``exported_program``, ``save``, ``__call__``, ``optimize``,
``apply_weights``, ``call_reference``, ``initialize_inference_session``, ``release``). ``result`` is
fastonnx's own ExportResult (stats, structured outputs)."""

from __future__ import annotations

import logging
import os
from typing import IO, TYPE_CHECKING, Any

import torch

from fastonnx.errors import InputError
from fastonnx.result import ExportResult
from fastonnx.stored_weights.attach import attach_weights
from fastonnx.torch_internals import pytree

if TYPE_CHECKING:
    import onnx

log = logging.getLogger("fastonnx")

Destination = str | os.PathLike[str] | IO[bytes]


class ONNXProgram:
    """An exported model, usable where torch.onnx.export's ONNXProgram is."""

    def __init__(self, result: ExportResult, optimized: bool) -> None:
        self.result = result
        self._optimized = optimized

    # ---- what the model is ----------------------------------------------------------------------
    @property
    def exported_program(self) -> torch.export.ExportedProgram | None:
        """The torch.export program the graph was converted from."""
        return self.result.exported_program

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an onnx.ModelProto (weights inline)."""
        return self.result.model_proto

    @property
    def model(self) -> Any:
        """The model as an ``onnx_ir.Model``, as torch's ONNXProgram.model is (a copy: edits to it do not
        change this program). Needs the onnx-ir package, which torch's own exporter depends on."""
        try:
            import onnx_ir
        except ImportError as e:
            raise ImportError(
                "ONNXProgram.model is an onnx_ir.Model: install onnx-ir, or use model_proto (onnx.ModelProto)"
            ) from e
        return onnx_ir.from_proto(self.model_proto)

    @property
    def stats(self) -> dict[str, Any]:
        return self.result.stats

    # ---- writing ----------------------------------------------------------------------------------
    def save(
        self,
        destination: Destination,
        *,
        include_initializers: bool = True,
        keep_initializers_as_inputs: bool = False,
        external_data: bool | None = None,
    ) -> None:
        """Write the model to a path (atomically; ``external_data=None`` moves the weights to a .data file
        only past 2 GiB) or to a binary file object (weights inline)."""
        if not include_initializers:
            raise InputError(
                "save(include_initializers=False) is not supported: export from the meta device to get a "
                "file whose weights are filled later (fastonnx.attach_weights)"
            )
        if keep_initializers_as_inputs:
            raise InputError(
                "save(keep_initializers_as_inputs=True) is not supported: fastonnx writes weights as "
                "initializers only (IR >= 4 does not list them as inputs)"
            )
        write_program(self.result, destination, external_data)

    # ---- running ----------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """Run the model in onnxruntime; returns the flattened outputs as a tuple, as torch's does."""
        out = self.result(*args, **kwargs)
        return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))

    def call_reference(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """Run the model with onnx's reference evaluator (slow; for checking onnxruntime)."""
        import onnx.reference

        leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        names = self.result.input_names
        if len(leaves) != len(names):
            raise InputError(f"got {len(leaves)} input tensors, the model takes {len(names)} ({names})")
        feeds = {n: t.detach().cpu().numpy() for n, t in zip(names, leaves)}
        outputs = onnx.reference.ReferenceEvaluator(self.model_proto).run(None, feeds)
        return tuple(torch.from_numpy(o) for o in outputs)

    def initialize_inference_session(self, initializer: Any = None) -> None:
        """Create the onnxruntime session now (CPU). ``initializer`` is torch's hook to build the session
        itself: it gets the model's path, or its bytes when not saved."""
        if initializer is None:
            self.result.session()
            return
        source = self.result.path if self.result.path is not None else self.result.to_bytes()
        self.result.use_session(initializer(source))

    def release(self) -> None:
        """Drop the onnxruntime session."""
        self.result.use_session(None)

    # ---- changing -----------------------------------------------------------------------------------
    def optimize(self) -> None:
        """Run fastonnx's standard passes, when the export was made with optimize=False (a no-op
        otherwise: they already ran)."""
        if self._optimized:
            return
        self.result.run_passes("default")
        self._optimized = True

    def apply_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Fill the weights of a model exported from the meta device, once saved to a path (the weights
        go into its .data file: fastonnx.attach_weights). Replacing the weights of a model exported
        with real ones is not supported: export the model with those weights instead."""
        if not self.result.stats.get("deferred_weights"):
            raise InputError(
                "apply_weights: this model was exported with its weights; only a model exported from the "
                "meta device has weights to fill"
            )
        if self.result.path is None:
            raise InputError("apply_weights: save the model to a path first (the weights go into its .data)")
        attach_weights(self.result.path, state_dict)
        self.result.reset_caches()

    def __repr__(self) -> str:
        return f"fastonnx.ONNXProgram({self.result!r})"


def write_program(result: ExportResult, destination: Destination, external_data: bool | None) -> None:
    """A path or PathLike is written by the builder; a binary file object gets the bytes."""
    if isinstance(destination, (str, os.PathLike)):
        result.save(destination, external_data)
        return
    check_file_object(destination, external_data)
    write_bytes(result, destination)


def check_file_object(
    destination: Any,
    external_data: bool | None,
    kinds: str = "a path, an os.PathLike or a binary file object",
) -> None:
    """``destination``, not a path, must be a binary file object (``kinds`` says what ``f`` may be),
    and takes the weights inline: external_data=True needs a path to write the .data file beside."""
    if not callable(getattr(destination, "write", None)):
        raise InputError(f"f must be {kinds}, got {type(destination).__name__}")
    if external_data:
        raise InputError("external_data=True needs a path to write the .data file beside: f is a file object")


def write_bytes(result: ExportResult, destination: IO[bytes]) -> None:
    """The model's bytes (weights inline) written into a binary file object checked by
    ``check_file_object``."""
    try:
        destination.write(result.to_bytes())
    except TypeError as e:
        raise InputError(f"f must be opened in binary mode ('wb'): {e}") from e
