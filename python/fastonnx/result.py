"""What to_onnx returns: the built graph, its stats, and ways to save, inspect and run it."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from fastonnx._core import GraphBuilder
from fastonnx.errors import InputError, RuntimeCheckError
from fastonnx.interrupt import sigterm_as_interrupt
from fastonnx.ort_io import FLOAT8_ONNX_TYPES, FLOAT8_TYPE_STRINGS, from_numpy, run_bound, to_numpy
from fastonnx.progress_bars import Progress
from fastonnx.torch_internals import pytree
from fastonnx.walker.interpreter import Layout

if TYPE_CHECKING:
    import onnx
    import onnxruntime

    from fastonnx.capture.guards import Proven
    from fastonnx.diagnostics.debug import Trace
    from fastonnx.diagnostics.verdicts import Verification

log = logging.getLogger("fastonnx")


class ExportResult:
    """An exported model. ``model_proto`` and the onnxruntime session are built on first use."""

    def __init__(
        self,
        builder: GraphBuilder,
        layout: Layout,
        in_spec: Any,
        out_spec: Any,
        stats: dict[str, Any],
        *,
        exported_program: torch.export.ExportedProgram | None = None,
        model: Any = None,
        trace: Trace | None = None,
        proven: Proven | None = None,
    ) -> None:
        """``exported_program``, ``model``, ``trace`` and ``proven`` are given by to_onnx (pipeline.run)
        and left None otherwise (graph_module_to_onnx): the program the graph was converted from, the
        model eager runs for ``verify()``, the FX -> ONNX trace of ``verify(intermediate=True)`` and the
        sizes the program is right for (capture/guards.py: inputs outside are refused)."""
        self._builder = builder
        self._layout = layout
        self._in_spec = in_spec
        self._out_spec = out_spec
        self.stats = stats
        self.path: str | None = None
        self.exported_program = exported_program
        self._proto: onnx.ModelProto | None = None
        self._session: onnxruntime.InferenceSession | None = None
        self._model = model
        self._trace = trace
        self.proven = proven
        # to_onnx(dtype=): the file at ``path`` was converted after the write; it, not the builder's
        # float32 graph, is the model
        self.converted_file = False

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

            if self.converted_file and self.path is not None:
                self._proto = onnx.load(self.path)
            else:
                self._proto = onnx.load_from_string(self._builder.to_bytes())
        return self._proto

    def to_bytes(self) -> bytes:
        """The serialized model, weights inline (fails over 2 GiB: save with external data instead)."""
        return self._builder.to_bytes()

    def save(
        self,
        path: str | os.PathLike[str],
        external_data: bool | None = None,
        *,
        durable: bool = False,
        progress: bool | None = None,
    ) -> dict[str, Any]:
        """Write the model atomically; external_data=None switches to a .data file past 2 GiB.

        ``durable=True`` flushes the data file and the model file to the disk before they are renamed
        into place, and the folder after. Ctrl-C (and SIGTERM, see ``fastonnx.interrupt``) stops the
        write between two 2 MiB pieces: KeyboardInterrupt, temporaries removed, old files untouched.
        Temporaries that killed exports of this host left in the folder are removed first
        (``info["swept"]``, logged). A model referencing checkpoint shards (``to_onnx(weights=)``) saved
        outside their folder gets them hard-linked beside it (``info["linked"]``). ``progress`` as in
        ``to_onnx``.
        """
        bars = Progress(progress)
        with sigterm_as_interrupt(), bars.stage("write", unit="B", byte_counts=True) as stage:
            info = self._builder.save(
                os.fspath(path),
                external_data,
                durable=durable,
                progress=stage.update if stage.enabled else None,
            )
        if info["swept"]:
            log.warning(
                "removed %d temporary files that killed exports left: %s",
                len(info["swept"]),
                ", ".join(info["swept"]),
            )
        self.path = info["path"]
        self._session = None
        return info

    def reset_caches(self) -> None:
        """Forget the ``model_proto`` and the onnxruntime session built so far, for one built anew on
        next use: after the graph or the saved file changed (``ONNXProgram.optimize`` /
        ``apply_weights``)."""
        self._proto = None
        self._session = None

    def run_passes(self, level: str) -> dict[str, int]:
        """The optimization passes at ``level`` ("default", "onnxruntime") on the graph, for a model
        converted without them (``ONNXProgram.optimize`` after an export with optimize=False):
        ``stats["optimize"]`` and ``stats["nodes"]`` updated, the caches reset. Returns the passes'
        counts."""
        counts = self._builder.optimize(level)
        self.stats["optimize"] = counts
        self.stats["nodes"] = self._builder.num_nodes
        self.reset_caches()
        return counts

    # ---- running in onnxruntime -----------------------------------------------------------------
    def use_session(self, session: onnxruntime.InferenceSession | None) -> None:
        """Run through ``session`` from now on (one the caller built: torch's ``initializer`` hook of
        ``ONNXProgram.initialize_inference_session``); None drops the current one (``release``), the
        next run builds a new one."""
        self._session = session

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

    def _feeds(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The graph inputs' tensors, by ONNX name, from inputs structured like the model's."""
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if self._in_spec is not None and spec != self._in_spec:
            raise InputError(f"inputs are structured as {spec}, the model was exported with {self._in_spec}")
        if len(leaves) != len(self._layout.inputs):
            raise InputError(
                f"got {len(leaves)} flattened inputs, the model takes {len(self._layout.inputs)}"
            )
        if self.proven is not None:
            self.proven.check(leaves)
        tensors: dict[str, torch.Tensor] = {}
        for slot, leaf in zip(self._layout.inputs, leaves):
            if slot.onnx_name is None:
                continue
            if not isinstance(leaf, torch.Tensor):
                raise InputError(f"input {slot.onnx_name} must be a tensor, got {type(leaf).__name__}")
            tensors[slot.onnx_name] = leaf
        return tensors

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model in onnxruntime on inputs structured like the model's; returns torch tensors."""
        tensors = self._feeds(args, kwargs)
        sess = self.session()
        names = [s.onnx_name for s in self._layout.outputs if s.onnx_name is not None]
        float8_io = any(t.dtype in FLOAT8_ONNX_TYPES for t in tensors.values()) or any(
            o.type in FLOAT8_TYPE_STRINGS for o in sess.get_outputs()
        )
        try:
            if float8_io:
                outputs = run_bound(sess, names, tensors)
            else:
                feeds = {k: to_numpy(v) for k, v in tensors.items()}
                if self.converted_file:  # a half graph's inputs: the float ones cast to its types
                    from fastonnx.half_precision import feeds_as_session_types

                    feeds = feeds_as_session_types(sess, feeds)
                outputs = [from_numpy(a) for a in sess.run(names, feeds)]
        except Exception as e:
            raise RuntimeCheckError(f"onnxruntime failed to run the exported model: {e}") from e
        it = iter(outputs)
        flat: list[Any] = []
        for out in self._layout.outputs:
            if out.onnx_name is None:
                flat.append(out.constant)
                continue
            t = next(it)
            if out.is_complex:
                if t.numel() == 0:  # numpy gives empty arrays zero strides, which view_as_complex refuses
                    t = torch.empty(t.shape, dtype=t.dtype)
                t = torch.view_as_complex(t)  # the graph holds complex values as (..., 2) real
            flat.append(t.item() if out.is_scalar else t)
        if self._out_spec is None:
            return flat[0] if len(flat) == 1 else tuple(flat)
        return pytree.tree_unflatten(flat, self._out_spec)

    def eager_model(self) -> Any:
        """The model this was exported from, as eager PyTorch runs it (an ExportedProgram through
        ``module()``): what verification compares onnxruntime with."""
        eager = self._model
        if eager is None and self.exported_program is not None:
            eager = self.exported_program
        if eager is None:
            raise InputError(
                "this ExportResult does not hold the model it was exported from: nothing to compare"
            )
        return eager.module() if isinstance(eager, torch.export.ExportedProgram) else eager

    def verify(
        self,
        *args: Any,
        atol: float | None = None,
        rtol: float | None = None,
        intermediate: bool = False,
        **kwargs: Any,
    ) -> Verification:
        """Compare onnxruntime with eager PyTorch on these inputs, per output (see verification.py).

        Eager is the model given to to_onnx (an ExportedProgram runs through ``ep.module()``); the
        tolerances default per dtype (``verdicts.DEFAULT_TOLERANCES``). ``intermediate=True`` also
        compares the value of every FX node that survives in the ONNX graph and names the first one
        that diverges (``.intermediate.first_divergence``). The model's own keyword arguments named
        ``atol``, ``rtol`` or ``intermediate`` cannot be passed here.
        """
        from fastonnx.diagnostics import verdicts, verification

        eager = self.eager_model()
        result = verdicts.Verification(verification.verify_outputs(self, eager, args, kwargs, atol, rtol))
        if intermediate:
            result.intermediate = verification.verify_intermediate(self, args, kwargs, atol, rtol)
        return result

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"ExportResult(opset={s.get('opset')}, nodes={s.get('nodes')}, "
            f"initializers={s.get('initializers')}, path={self.path!r})"
        )


# float8 tensors pass to and from onnxruntime as their bytes with an ONNX element type: numpy has no
# float8 dtypes (onnxruntime's own numpy conversion gives e4m3fn as uint8 and refuses the others)
