"""Do two builds of fastonnx write the same files, byte for byte? For refactors that must not change the
output: a Llama, a CNN, torch.cond, and every model of the transformers suite.

    python scripts/compare_builds.py --reference /path/to/other/checkout

The other checkout needs its extension built (``python/fastonnx/_core.abi3.so``; a git worktree of an
older commit with ``cargo build --release -p fastonnx-python`` and the library copied there). Both
builds export the same models in fresh processes, with the same ``tests/support/model_zoo.py`` (stack traces
name its file; the checkouts' own paths are normalised); exits 1 naming each file that differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = ROOT / "tests"  # model_zoo.py

EXPORT_MODELS = textwrap.dedent(
    """
    import sys
    import torch
    import fastonnx
    from support.model_zoo import SmallCNN, tiny_llama, with_random_batchnorm_stats

    folder = sys.argv[1]
    torch.manual_seed(1)
    llama = tiny_llama(layers=2)
    ids = torch.randint(0, 256, (2, 6))
    fastonnx.to_onnx(llama, (ids,), filename=f"{folder}/llama.onnx")
    fastonnx.to_onnx(llama, (ids,), filename=f"{folder}/llama23.onnx", opset=23)
    cnn = with_random_batchnorm_stats(SmallCNN()).eval()
    fastonnx.to_onnx(cnn, (torch.randn(2, 3, 16, 16),), filename=f"{folder}/cnn.onnx")

    class Cond(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t.sin() * 2, lambda t: t.cos() - 1, (x,))

    fastonnx.to_onnx(Cond(), (torch.rand(4),), filename=f"{folder}/cond.onnx", optimize=False)

    # every static-shape model of the transformers suite (tests/support/export_check.py's), default capture
    from support.model_zoo import TRANSFORMERS_MODELS

    for name, build in TRANSFORMERS_MODELS.items():
        model, args = build()
        fastonnx.to_onnx(model, args, filename=f"{folder}/suite_{name}.onnx")
    """
)


def export_with(python_dir: Path, folder: Path) -> dict[str, bytes]:
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), str(python_dir)])}
    subprocess.run([sys.executable, "-c", EXPORT_MODELS, str(folder)], check=True, env=env, cwd=folder)
    return {p.name: normalised(p.read_bytes(), python_dir) for p in sorted(folder.glob("*.onnx"))}


def normalised(data: bytes, python_dir: Path) -> bytes:
    """The file with the path of the checkout's package in its metadata (a stack trace may name
    fastonnx's own source files) replaced by a placeholder, so that two checkouts compare equal where
    they export the same graph; model_zoo.py is this checkout's for both."""
    root = str(python_dir).encode()
    if root not in data:
        return data
    import onnx

    model = onnx.load_from_string(data)
    for node in model.graph.node:
        for prop in node.metadata_props:
            prop.value = prop.value.replace(root.decode(), "<fastonnx>")
    return model.SerializeToString()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, type=Path, help="the other checkout")
    ref = parser.parse_args().reference.resolve()
    if not (ref / "python/fastonnx/_core.abi3.so").exists():
        parser.error(f"{ref} has no built extension (python/fastonnx/_core.abi3.so)")
    with tempfile.TemporaryDirectory() as tmp:
        theirs = export_with(ref / "python", Path(tmp) / "reference")
        ours = export_with(ROOT / "python", Path(tmp) / "this")
    differ = [name for name in ours if ours[name] != theirs.get(name)]
    for name in ours:
        print(f"{name}: {'DIFFERS' if name in differ else 'identical'} ({len(ours[name])} bytes)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
