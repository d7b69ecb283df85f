"""Reading a checkpoint folder: where it is (a local folder, or a Hub id in huggingface_hub's cache),
its ``config.json``, its safetensors weights (one file, or shards listed by
``model.safetensors.index.json``) and the side files a package carries (tokenizer, generation config)."""

from __future__ import annotations

import json
import os
import pathlib
import struct
from dataclasses import dataclass, field
from typing import Any

from fastonnx.errors import InputError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# copied into the package when present: what a runtime needs beside the graph to tokenize and generate
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "spk_dict.pt",  # Qwen2.5-Omni's speakers, which its text-to-audio loop reads (omni_speech_stages.py)
)


@dataclass
class CheckpointFolder:
    """A local checkpoint: its path, its raw config dict and the safetensors files of its weights."""

    path: pathlib.Path
    config: dict[str, Any]
    shards: list[pathlib.Path] = field(default_factory=list)

    @property
    def weight_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.shards)

    def side_files(self) -> list[pathlib.Path]:
        return [self.path / n for n in SIDE_FILES if (self.path / n).is_file()]

    def generation_config(self) -> dict[str, Any]:
        p = self.path / "generation_config.json"
        return _read_json(p) if p.is_file() else {}

    def stored_dtypes(self) -> set[str]:
        """The safetensors dtypes of the float weights (``F32``, ``BF16``...), read from the headers."""
        found: set[str] = set()
        for shard in self.shards:
            with open(shard, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
            found.update(
                v["dtype"]
                for k, v in header.items()
                if k != "__metadata__" and v["dtype"].startswith(("F", "BF"))
            )
        return found


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise InputError(f"{path} does not hold a JSON object")
    return data


def resolve_folder(model: str | os.PathLike[str]) -> pathlib.Path:
    """The local folder of ``model``: a folder path as it is; otherwise a Hub id (``org/name``) fetched
    through huggingface_hub's cache (config, safetensors, tokenizer and generation files only)."""
    path = pathlib.Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    text = os.fspath(model)
    if path.exists():
        raise InputError(f"{text} is a file: give the checkpoint's folder (with config.json and safetensors)")
    looks_like_id = text.count("/") <= 1 and not text.startswith((".", "/", "~")) and text.strip() != ""
    if not looks_like_id:
        raise InputError(f"no checkpoint folder at {text}")
    try:
        import huggingface_hub
    except ImportError as e:
        raise InputError(
            f"{text} is not a local folder, and resolving it as a Hub id needs huggingface_hub "
            "(pip install huggingface_hub)"
        ) from e
    patterns = ["config.json", "*.safetensors", INDEX, *SIDE_FILES]
    try:
        local = huggingface_hub.snapshot_download(text, allow_patterns=patterns)
    except Exception as e:  # offline, unknown repo, gated repo: huggingface_hub's many error types
        raise InputError(
            f"{text} is not a local folder and could not be fetched from the Hugging Face Hub "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no message'}); without a network, "
            "give the path of a downloaded checkpoint folder"
        ) from e
    return pathlib.Path(local)


def read_folder(model: str | os.PathLike[str]) -> CheckpointFolder:
    """The checkpoint at ``model``; an InputError naming what is missing (config.json, the weights)."""
    path = resolve_folder(model)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise InputError(f"{path} has no config.json: not a transformers checkpoint folder")
    config = _read_json(config_path)
    index = path / INDEX
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{index} has no weight_map")
        shards = [path / name for name in sorted(set(weight_map.values()))]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise InputError(f"{index} names shards that are not in {path}: {', '.join(missing)}")
    elif (path / SINGLE).is_file():
        shards = [path / SINGLE]
    else:
        shards = sorted(path.glob("*.safetensors"))
    if not shards:
        others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        hint = f" (it holds {', '.join(others)}: convert them to safetensors)" if others else ""
        raise InputError(f"{path} has no safetensors weights{hint}")
    return CheckpointFolder(path, config, shards)
