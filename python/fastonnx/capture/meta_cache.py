"""The trace on the meta device: output metadata of meta kernels cached per op and input metadata.

A model built under ``torch.device("meta")`` has no values, so recording its aten ops costs only the
meta kernels that compute each output's dtype, shape and strides. Most of them are Python reference
implementations (``torch._refs`` / ``torch._meta_registrations``): 0.2-2 ms an elementwise op, ~10 ms
for ``scaled_dot_product_attention``, where recording the node costs ~30 us. A transformer runs the
same ops on the same shapes in every layer, so :class:`MetaCache` keeps, per (op, metadata of every
tensor argument, every other argument), the metadata of the outputs, and builds later outputs from it
with ``torch.empty_strided``: one kernel call per distinct call instead of one per layer.

A call is cached only where its outputs' metadata is a function of that key and nothing else:

- every tensor among the arguments and the outputs is a plain meta tensor (a CPU tensor has values an
  op may read; a meta tensor has none, so a meta kernel sees only metadata), and the key holds each
  one's dtype, shape, strides, storage offset, layout and conjugate / negative bits;
- the other arguments are values the key can hold exactly: None, bool, int, float, complex, str,
  dtype, device, layout, memory format and lists / tuples of these and tensors (a generator, a SymInt
  or an object make the call uncached); the default dtype is part of the key (factory ops read it);
- the op returns tensors only (an op returning nothing runs for its effect: ``_assert_async``);
- the op neither writes (``is_mutable`` schema: in-place and out= ops) nor returns an alias of an input
  (a view, ``alias``, ``split``: its output must stay a view of that input for the recorder's
  write checks and for the ops that follow), nor is random (``nondeterministic_seeded``: each call
  is a draw of its own; ``scaled_dot_product_attention`` draws for its dropout only, so it is cached
  with ``dropout_p`` 0), nor has a data-dependent output (the recorder refuses those before);
- what the first call returned is fresh: tensors whose storage is no argument's (not an argument
  itself, as eval-mode ``dropout`` returns its input, nor a view of one or of its base), no two
  sharing one; a view of the kernel's own intermediate is fresh (it is built again as a tensor of its
  own with the same strides and offset: its base was no tensor of the model's).

The functions the trace records whole (``linear``, ``scaled_dot_product_attention``...: trace.py's
``_KEPT``) are cached the same way, keyed by the Python function and its arguments; the recorded op's
schema decides whether they may be (``flatten`` is a view: not cached).

What a meta trace cannot do is read values: ``.item()`` / ``bool(t)`` / ``tolist()`` are refused by
the recorder as on a real run, and a copy out of the meta device (``.cpu()``, ``.to("cpu")``,
``.numpy()``) is refused here with its own reason (torch.export's fake tensors would take that copy
and go on with unknown values).
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.capture.refusal import TraceRefused
from fastonnx.torch_internals import OpOverload, TensorType, no_dispatch, op_schema, storage_id

_META = torch.device("meta")

_PLAIN_VALUES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


class _NotKeyable(Exception):
    """An argument the key cannot hold exactly (the call runs uncached)."""


_UNCACHEABLE = object()  # an entry for a key whose first call returned no fresh meta tensors


def _arg_key(value: Any) -> Any:
    kind = type(value)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        if not value.is_meta:
            raise _NotKeyable
        return (
            value.dtype,
            value.shape,
            value.stride(),
            value.storage_offset(),
            value.layout,
            value.is_conj(),
            value.is_neg(),
        )
    if kind in _PLAIN_VALUES:
        return (kind, value)
    if kind is list or kind is tuple:
        return (kind, *(_arg_key(v) for v in value))
    raise _NotKeyable


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _storage(t: torch.Tensor) -> int:
    return storage_id(t)  # the storage itself (a meta storage has no data pointer)


def _spec(out: Any, args: Any, kwargs: Any) -> Any:
    """How to build ``out`` again from nothing (its tensors' metadata), or _UNCACHEABLE."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    inputs = _tensors((args, kwargs))
    storages = {_storage(t) for t in inputs if t.is_meta}
    seen: set[int] = set()
    specs: list[Any] = []
    for o in outs:
        if o is None:
            specs.append(None)
            continue
        if (
            type(o) is not torch.Tensor
            or not o.is_meta
            or o.layout != torch.strided
            or o.is_conj()
            or o.is_neg()
            or o.requires_grad
            or _storage(o) in storages  # an input, a view of one or of its base: an alias
            or _storage(o) in seen  # two outputs sharing memory
        ):
            return _UNCACHEABLE
        seen.add(_storage(o))
        # a fresh tensor (a view of the kernel's own intermediate at most: its base is no input, so
        # it is built again as a tensor of its own, with the same strides and offset)
        specs.append((tuple(o.shape), o.stride(), o.storage_offset(), o.dtype))
    return (type(out) if isinstance(out, (tuple, list)) else None, tuple(specs))


def _build(spec: Any) -> Any:
    container, specs = spec
    with no_dispatch():  # made outside the recorder: no node for them
        outs = [None if s is None else _empty(*s) for s in specs]
    return outs[0] if container is None else container(outs)


def _empty(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, dtype: torch.dtype) -> torch.Tensor:
    if not offset:
        return torch.empty_strided(shape, stride, dtype=dtype, device=_META)
    # at an offset in a storage of its own (a view of a fresh intermediate, as the kernel returned it)
    size = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0) if all(shape) else offset
    return torch.empty(size, dtype=dtype, device=_META).as_strided(shape, stride, offset)


_NO_DRAW_WITHOUT_DROPOUT = {"aten::scaled_dot_product_attention"}
"""Ops tagged random for their dropout only: with ``dropout_p`` 0 (its 5th argument) nothing is drawn."""

_SEEDED = "seeded"  # random, unless no dropout is asked for (_NO_DRAW_WITHOUT_DROPOUT)


def _op_cacheable(op: OpOverload) -> bool | str:
    schema = op_schema(op)
    tags = op.tags
    if (
        not schema.returns  # run for what it does (an assert, a print): nothing to build from a key
        or not all(isinstance(r.type, TensorType) for r in schema.returns)  # lists, optionals
        or schema.is_mutable
        or any(r.alias_info is not None for r in schema.returns)
        or torch.Tag.data_dependent_output in tags
        or torch.Tag.dynamic_output_shape in tags
    ):
        return False
    if torch.Tag.nondeterministic_seeded in tags:
        return _SEEDED if schema.name in _NO_DRAW_WITHOUT_DROPOUT and schema.overload_name == "" else False
    return True


def _draws(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
    return not (type(p) in (int, float) and p == 0)


class MetaCache:
    """Output metadata of meta-kernel calls, per (op, input metadata); see the module's docstring."""

    def __init__(self) -> None:
        self.entries: dict[Any, Any] = {}
        self.hits = 0
        self.misses = 0
        self.uncached = 0  # calls that ran their kernel because they may not be cached
        self._ops: dict[Any, bool | str] = {}

    def call(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        op: OpOverload | None = None,
    ) -> Any:
        """``func(*args, **kwargs)``, or its outputs rebuilt from the cache;
        ``op`` is the aten op whose schema says whether ``func`` may be cached (``func`` itself when it is
        an op overload)."""
        schema_op = op if op is not None else func
        allowed = self._ops.get(schema_op)
        if allowed is None:
            allowed = self._ops[schema_op] = isinstance(schema_op, OpOverload) and _op_cacheable(schema_op)
        if not allowed or (allowed is _SEEDED and _draws(args, kwargs)):
            self.uncached += 1
            return self._run(func, args, kwargs)
        try:
            key = (
                func,
                torch.get_default_dtype(),
                tuple(_arg_key(a) for a in args),
                tuple((k, _arg_key(v)) for k, v in kwargs.items()),
            )
            spec = self.entries.get(key)
        except _NotKeyable:
            self.uncached += 1
            return self._run(func, args, kwargs)
        except TypeError:  # an unhashable value inside a key part (a list in a float's place, say)
            self.uncached += 1
            return self._run(func, args, kwargs)
        if spec is not None and spec is not _UNCACHEABLE:
            self.hits += 1
            return _build(spec)
        out = self._run(func, args, kwargs)
        if spec is None:
            self.misses += 1
            self.entries[key] = _spec(out, args, kwargs)
        else:
            self.uncached += 1
        return out

    @staticmethod
    def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        reason = meta_copy_reason(func, args, kwargs)
        if reason is not None:
            raise TraceRefused(reason)
        return func(*args, **kwargs)


_COPIES = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "to"}


def meta_copy_reason(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why ``func`` cannot run in a meta-device trace, or None: a copy of a meta tensor's values to
    another device (``.cpu()``, ``.to("cpu")``), which have none to copy."""
    name = getattr(func, "_opname", None)
    if name not in _COPIES or not args:
        return None
    if name in ("copy_", "_copy_from", "_copy_from_and_resize"):
        # copy_(self=destination, src); _copy_from(self=source, dst)
        if len(args) < 2:
            return None
        source, destination = (args[1], args[0]) if name == "copy_" else (args[0], args[1])
        if not isinstance(source, torch.Tensor) or not isinstance(destination, torch.Tensor):
            return None
        target: torch.device | None = destination.device
    else:
        source = args[0]
        device = kwargs.get("device")
        target = torch.device(device) if isinstance(device, (str, torch.device)) else None
    if not isinstance(source, torch.Tensor) or not source.is_meta or target is None or target.type == "meta":
        return None
    return (
        f"{func} copies a meta tensor's values to {target} (.cpu(), .to(device), .numpy()): a meta-device "
        "trace holds no values to copy"
    )


def meta_cache_for(weights: list[torch.Tensor], inputs: list[Any]) -> MetaCache | None:
    """A cache for a trace whose weights or inputs are on the meta device (None for a real run: its
    ops read values, which no metadata key holds)."""
    if any(t.is_meta for t in weights) or any(isinstance(v, torch.Tensor) and v.is_meta for v in inputs):
        return MetaCache()
    return None
