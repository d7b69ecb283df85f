"""Real clients of torch.onnx.export, run unchanged under fastonnx.patch_torch_onnx(): ultralytics'
own YOLO exporter (detection and segmentation, static and dynamic, loaded back through ultralytics),
timm's onnx_export, and a plain user script with dynamic_axes. Needs the ``clients`` extra.

Nothing is downloaded: models are built from the yaml files and timm configs the packages ship, with
random weights; ultralytics runs offline (YOLO_OFFLINE, settings in a temporary folder) and every
test runs with sockets refused, so a fetch would fail the test instead of reaching the network.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import runpy
import shutil
import socket
import tempfile
from typing import Any

os.environ["YOLO_OFFLINE"] = "1"  # ultralytics: no update checks, no analytics, no downloads
if "YOLO_CONFIG_DIR" not in os.environ:
    # ultralytics writes its settings there: a folder of this process, removed when it exits
    _settings = tempfile.mkdtemp(prefix="fastonnx-yolo-settings-")
    atexit.register(shutil.rmtree, _settings, ignore_errors=True)
    os.environ["YOLO_CONFIG_DIR"] = _settings

import onnx
import onnxruntime as ort
import pytest
import timm
import torch
from timm.utils.onnx import onnx_export
from ultralytics import YOLO

import fastonnx
from support.matrix import FULL, sampled

HERE = pathlib.Path(__file__).parent
TORCH_EXPORT = torch.onnx.export


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(f"test_clients: network access attempted ({args[1:] if len(args) > 1 else args})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _exported_by_fastonnx(path: str | pathlib.Path) -> bool:
    return onnx.load(str(path), load_external_data=False).producer_name.startswith("fastonnx")


def _ort(path: str | pathlib.Path, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(o) for o in sess.run(None, {k: v.numpy() for k, v in feeds.items()})]


# ---- ultralytics ----------------------------------------------------------------------------------
def _yolo(cfg: str) -> YOLO:
    """A YOLO model from the package's yaml with random weights. The classification biases are drawn
    from N(-1, 2) instead of ultralytics' prior (-11.5 for every class), which makes every score
    ~1e-5 and the boxes' order a matter of ties: with spread scores the predictions can be compared."""
    torch.manual_seed(0)
    yolo = YOLO(cfg)
    head = yolo.model.model[-1]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for branch in head.cv3:
            bias = branch[-1].bias
            bias.copy_(torch.randn(bias.shape, generator=g) * 2 - 1)
    return yolo


def _raw(yolo: YOLO, x: torch.Tensor) -> list[torch.Tensor]:
    """The PyTorch model's outputs in the order of the ONNX file's (detections, then mask prototypes)."""
    with torch.no_grad():
        out = yolo.model.eval()(x)[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _compare_predictions(yolo: YOLO, onnx_path: str, task: str, x: Any, imgsz: int | None = None) -> int:
    """ultralytics' own pipeline on the ONNX file vs on the PyTorch model, on the same input (a tensor
    goes in without letterboxing, so both see the same pixels)."""
    conf = 0.05
    size = {} if imgsz is None else {"imgsz": imgsz}
    (theirs,) = yolo.predict(x, conf=conf, verbose=False, **size)
    (ours,) = YOLO(onnx_path, task=task).predict(x, conf=conf, verbose=False, **size)
    assert len(theirs.boxes) > 0
    assert len(ours.boxes) == len(theirs.boxes)
    torch.testing.assert_close(ours.boxes.cls, theirs.boxes.cls)
    torch.testing.assert_close(ours.boxes.xyxy, theirs.boxes.xyxy, rtol=0, atol=1e-3)
    torch.testing.assert_close(ours.boxes.conf, theirs.boxes.conf, rtol=1e-4, atol=1e-5)
    return len(ours.boxes)


# CI: detection static, segmentation dynamic; every pair under FASTONNX_FULL_MATRIX=1
@pytest.mark.parametrize(
    ("cfg", "task", "dynamic"),
    sampled(
        [
            (c, t, d)
            for c, t in (("yolo11n.yaml", "detect"), ("yolo11n-seg.yaml", "segment"))
            for d in (False, True)
        ],
        # CI: the segmenting model (the detecting one's head and its masks) with dynamic sizes
        lambda case: case[1] == "segment" and case[2],
    ),
    ids=lambda v: {False: "static", True: "dynamic"}.get(v, str(v)) if isinstance(v, bool) else str(v),
)
def test_ultralytics_export_under_the_patch(cfg, task, dynamic, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ultralytics writes the file beside the yaml's name, in the cwd
    yolo = _yolo(cfg)
    # CI checks the refusal on the detection model only (a torch.export of its own): the segmentation
    # model's backbone and neck are the same, refused at the same line
    if dynamic and (FULL or task == "detect"):
        # its strided feature maps concatenate at some heights and widths only (25 to 32, 57 to 64,
        # ...: the multiples of 32 and below): refused by default, naming the line that decides
        with fastonnx.patch_torch_onnx(), pytest.raises(Exception) as caught:
            yolo.export(format="onnx", imgsz=160, dynamic=True, simplify=True)
        refusal = caught.value
        while refusal is not None and not isinstance(refusal, fastonnx.CaptureError):
            refusal = refusal.__cause__ or refusal.__context__
        assert refusal is not None, caught.value
        assert "input 'x' axis 2" in str(refusal) and "ultralytics/nn/modules/conv.py:" in str(refusal)
        assert "right for 25 to 32, 57 to 64" in str(refusal), refusal
    with fastonnx.patch_torch_onnx(keep_narrowed=dynamic):
        path = yolo.export(format="onnx", imgsz=160, dynamic=dynamic, simplify=True)
    assert torch.onnx.export is TORCH_EXPORT  # restored
    assert _exported_by_fastonnx(path)
    model = onnx.load(path)
    assert {o.domain: o.version for o in model.opset_import}[""] == 18  # the opset ultralytics asks for
    names = [o.name for o in model.graph.output]
    assert names == (["output0", "output1"] if task == "segment" else ["output0"])
    if dynamic:
        dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["batch", 3, "height", "width"]

    g = torch.Generator().manual_seed(2)
    sizes = [(1, 160, 160), (2, 192, 224)] if dynamic else [(1, 160, 160)]
    for batch, h, w in sizes:
        x = torch.rand(batch, 3, h, w, generator=g)
        for got, want in zip(_ort(path, {"images": x}), _raw(yolo, x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for _, h, w in sizes:
        _compare_predictions(yolo, path, task, torch.rand(1, 3, h, w, generator=g))
    if dynamic:
        # an HWC uint8 image through ultralytics' own letterboxing: a dynamic model gets the same
        # rectangular padding as the PyTorch model, so both see the same pixels
        image = (torch.rand(200, 260, 3, generator=g) * 255).to(torch.uint8).numpy()
        _compare_predictions(yolo, path, task, image, imgsz=192)


# ---- timm ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "size", "use_dynamo"),
    [
        ("resnet10t", 96, False),  # TorchScript-era call: dynamic_axes on batch, height, width
        ("mobilenetv3_small_050", 96, True),  # dynamo-era call: dynamic_shapes with dim names
        ("vit_tiny_patch16_224", 224, False),  # fixed image size: height/width stay static, batch dynamic
    ],
)
def test_timm_onnx_export_under_the_patch(name, size, use_dynamo, tmp_path):
    model = timm.create_model(name, pretrained=False).eval()
    g = torch.Generator().manual_seed(0)
    example = torch.randn(2, 3, size, size, generator=g)
    path = tmp_path / f"{name}.onnx"
    with fastonnx.patch_torch_onnx():
        # check=True: timm runs onnx.checker (full_check) on the file
        onnx_export(
            model, str(path), example_input=example, use_dynamo=use_dynamo, dynamic_size=True, check=True
        )
    assert _exported_by_fastonnx(path)
    x = torch.randn(3, 3, size, size, generator=g)
    (got,) = _ort(path, {"input0": x})
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ---- a user's script ---------------------------------------------------------------------------------
def test_plain_user_script_runs_unchanged_under_the_patch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with fastonnx.patch_torch_onnx():
        scope = runpy.run_path(str(HERE / "clients" / "user_script.py"), run_name="__main__")
    path = tmp_path / "classifier.onnx"
    assert _exported_by_fastonnx(path)
    model = onnx.load(path)
    dims = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.input, *model.graph.output]
    }
    assert dims == {"pixels": ["batch", 3, "height", "width"], "probs": ["batch", 5]}
    g = torch.Generator().manual_seed(0)
    for batch, h, w in [(1, 32, 32), (4, 20, 48)]:
        x = torch.randn(batch, 3, h, w, generator=g)
        (got,) = _ort(path, {"pixels": x})
        with torch.no_grad():
            want = scope["model"](x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
