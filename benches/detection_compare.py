"""fastonnx against the official exporter (torch.onnx.export(..., dynamo=True)) on torchvision detection
models: the same ExportedProgram (captured with fastonnx's traceable batched_nms / roi_align), the time
each takes to write the ONNX file, and whether onnxruntime's outputs match eager.

    PYTHONPATH=python python benches/detection_compare.py [model ...]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import onnxruntime as ort
import torch
import torchvision

import fastonnx
from fastonnx.capture.traceable_detection import traceable_detection_ops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from support.model_zoo import with_random_batchnorm_stats

MODELS = {"fasterrcnn_mobilenet_v3_large_320_fpn": 300.0, "retinanet_resnet50_fpn": 1.0}
OPSET = 20


def _model(name: str, scale: float) -> torch.nn.Module:
    kwargs: dict = {"weights": None, "weights_backbone": None, "min_size": 320, "max_size": 320}
    kwargs["score_thresh" if name.startswith("retinanet") else "box_score_thresh"] = 0.0
    torch.manual_seed(0)
    model = with_random_batchnorm_stats(torchvision.models.get_model(name, **kwargs)).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "cls_score" in pname or "cls_logits" in pname:
                p.mul_(scale)
    return model


def _matches(path: str, image: torch.Tensor, expected: dict[str, torch.Tensor]) -> str:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: image.numpy()}
    outs = session.run(None, feed)
    by_name = dict(zip([o.name for o in session.get_outputs()], outs, strict=True))
    got = {}
    for key in expected:
        found = [v for k, v in by_name.items() if key in k]
        got[key] = torch.from_numpy(found[0]) if found else torch.from_numpy(outs[list(expected).index(key)])
    try:
        torch.testing.assert_close(got["boxes"], expected["boxes"], atol=5e-3, rtol=2e-5)
        torch.testing.assert_close(got["scores"], expected["scores"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["labels"], expected["labels"], atol=0, rtol=0)
    except AssertionError as e:
        return "MISMATCH " + str(e).splitlines()[0]
    return "matches eager"


def main(names: list[str]) -> None:
    image = torch.rand(3, 320, 320, generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model = _model(name, MODELS.get(name, 1.0))
            with torch.no_grad():
                (expected,) = model([image])
            t = time.perf_counter()
            with traceable_detection_ops():
                ep = torch.export.export(model, ([image],), strict=False)
            print(f"{name}: torch.export {time.perf_counter() - t:.1f} s, {len(expected['boxes'])} boxes")

            path = os.path.join(tmp, "fastonnx.onnx")
            t = time.perf_counter()
            fastonnx.to_onnx(ep, ([image],), opset=OPSET, filename=path)
            print(f"  fastonnx        {time.perf_counter() - t:6.2f} s  {_matches(path, image, expected)}")

            path = os.path.join(tmp, "official.onnx")
            t = time.perf_counter()
            try:
                torch.onnx.export(ep, ([image],), path, dynamo=True, opset_version=OPSET, verbose=False)
                seconds = f"{time.perf_counter() - t:6.2f} s"
                print(f"  torch.onnx      {seconds}  {_matches(path, image, expected)}")
            except Exception as e:  # report what the official exporter says, then go on
                print(
                    f"  torch.onnx      failed after {time.perf_counter() - t:.2f} s: {str(e).splitlines()[0]}"
                )


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
