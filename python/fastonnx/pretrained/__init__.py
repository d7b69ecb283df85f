"""From a checkpoint folder to a package a runtime loads: ``fastonnx.export_pretrained`` and the
``fastonnx export`` command (docs/guides/pretrained.md).

Modules: folder.py (the checkpoint folder), tasks.py (tasks and classes), meta_init.py (parameters on
meta, buffers real), task_inputs.py (each task's graph inputs and outputs), genai_config.py
(onnxruntime-genai's config), package_check.py (onnxruntime vs transformers), package_export.py (the steps), cli.py.
"""

from fastonnx.pretrained.package_export import PretrainedExport, export_pretrained
from fastonnx.pretrained.tasks import TASKS

__all__ = ["TASKS", "PretrainedExport", "export_pretrained"]
