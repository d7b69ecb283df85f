"""Weights attached after the export: a model built on the meta device (or under FakeTensorMode)
exports its graph without weights, in a time that does not depend on their size. The file is written
with external data whose holes ``attach_weights`` later fills from a real instance's tensors.

    with torch.device("meta"):
        model = MyModel(config)
    fastonnx.to_onnx(model, meta_args, filename="model.onnx")   # graph only; model.onnx.data has holes
    fastonnx.attach_weights("model.onnx", MyModel(config).load_state_dict(...) or module)

The initializers to fill are listed in the model's metadata (key ``fastonnx.deferred_weights``:
initializer name -> state-dict key of the exported module).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.errors import InputError, SerializationError

DEFERRED_KEY = "fastonnx.deferred_weights"


def _tensors_of(weights: Mapping[str, torch.Tensor] | torch.nn.Module) -> Mapping[str, torch.Tensor]:
    if isinstance(weights, torch.nn.Module):
        # non-persistent buffers (e.g. rotary frequencies) are not in state_dict() but are weights here
        found = dict(weights.named_buffers())
        found.update(weights.state_dict())
        return found
    if isinstance(weights, Mapping):
        return weights
    raise InputError(
        f"weights must be an nn.Module or a mapping of name -> tensor, got {type(weights).__name__}"
    )


def attach_weights(
    path: str | os.PathLike[str], weights: Mapping[str, torch.Tensor] | torch.nn.Module
) -> int:
    """Writes the weights of a model exported on the meta device into its external data file.

    ``weights`` is a module with the exported module's structure, or its state dict (plus any
    non-persistent buffers). Each tensor is checked against the initializer's dtype and shape and
    written at its offset, straight from torch's memory. Returns the number of tensors written.
    """
    import onnx

    path = os.fspath(path)
    model = onnx.load(path, load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if DEFERRED_KEY not in meta:
        raise InputError(f"{path} has no deferred weights: it was not exported from a meta-device model")
    wanted: dict[str, str] = json.loads(meta[DEFERRED_KEY])
    tensors = _tensors_of(weights)
    missing = sorted(key for key in wanted.values() if key not in tensors)
    if missing:
        raise InputError(f"attach_weights: no tensor for {len(missing)} weights: {', '.join(missing[:10])}")
    folder = os.path.dirname(os.path.abspath(path))
    by_name = {t.name: t for t in model.graph.initializer}
    handles: dict[str, Any] = {}
    try:
        for name, key in wanted.items():
            init = by_name.get(name)
            if init is None:
                raise SerializationError(
                    f"{path}: initializer {name!r} listed as deferred is not in the graph"
                )
            entry = {e.key: e.value for e in init.external_data}
            t = tensors[key].detach()
            if t.is_meta:
                raise InputError(f"attach_weights: {key!r} is still on the meta device")
            if t.is_complex():
                t = torch.view_as_real(t.resolve_conj())  # complex weights are stored as (..., 2) reals
            dims = dtypes.onnx_dims(t.dtype, list(t.shape))  # float4's last dim doubles
            if dims != list(init.dims) or dtypes.to_onnx_dtype(t.dtype) != init.data_type:
                raise InputError(
                    f"attach_weights: {key!r} is {t.dtype} {tuple(t.shape)}, the model expects element type "
                    f"{init.data_type} with shape {tuple(init.dims)}"
                )
            data = dtypes.tensor_bytes(t)  # copied to the host there when t is on a device
            if data.nbytes != int(entry["length"]):
                raise SerializationError(
                    f"{path}: {name!r} has {entry['length']} bytes reserved, {data.nbytes} given"
                )
            location = os.path.join(folder, entry["location"])
            f = handles.get(location)
            if f is None:
                f = handles[location] = open(location, "r+b")
            f.seek(int(entry["offset"]))
            # .data (the array's memoryview): numpy's stubs give ndarray the buffer protocol only on
            # Python >= 3.12
            f.write(data.data)
    finally:
        for f in handles.values():
            f.close()
    return len(wanted)
