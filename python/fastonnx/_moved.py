"""The module paths of earlier releases, still importable: ``import fastonnx.trace_capture`` gives
``fastonnx.capture.trace``. One table, resolved lazily by an import hook (nothing is imported until an
old path is), so user code and entry points written against an old path keep working without a file
per old module."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

MOVED = {
    "fastonnx.trace_capture": "fastonnx.capture.trace",
    "fastonnx.detection_capture": "fastonnx.capture.detection",
    "fastonnx.recurrent_capture": "fastonnx.capture.recurrent",
    "fastonnx.dynamic": "fastonnx.capture.dynamic_shapes",
    "fastonnx.transformers_caches": "fastonnx.capture.transformers_caches",
    "fastonnx.input_tensors": "fastonnx.capture.input_tensors",
    "fastonnx.report": "fastonnx.diagnostics.report",
    "fastonnx.verification": "fastonnx.diagnostics.verification",
    "fastonnx.verdicts": "fastonnx.diagnostics.verdicts",
    "fastonnx.debug": "fastonnx.diagnostics.debug",
    "fastonnx.inplace": "fastonnx.weights.checkpoints",
    "fastonnx.interpreter": "fastonnx.conversion.interpreter",
    "fastonnx.aliasing": "fastonnx.conversion.aliasing",
    "fastonnx.metadata": "fastonnx.conversion.metadata",
    "fastonnx.functions": "fastonnx.conversion.functions",
    "fastonnx.graph_module": "fastonnx.conversion.graph_module",
}
"""old path -> where the module lives now"""


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder: exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        # the import system returns what sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
