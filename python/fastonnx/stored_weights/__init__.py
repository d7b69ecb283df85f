"""Where a weight goes: written into the file (the writer), referenced in place in a checkpoint's
safetensors shards (checkpoints), or left as a hole of a meta-device export and filled later (attach).
The bytes of a tensor, wherever it lives, come from ``fastonnx.dtypes.tensor_bytes``."""

from fastonnx.stored_weights.attach import DEFERRED_KEY, attach_weights

__all__ = ["DEFERRED_KEY", "attach_weights"]
