"""Detection and segmentation decoders declared in the manifest, run by
Model.predict_image on real models: results come back typed, in source pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from converters.packaging import write_package
from edge_sdk import errors
from edge_sdk.processing.detection import BLAZEFACE_SHORT_RANGE_ANCHORS, Detections
from edge_sdk.processing.segmentation import SegmentationMask

FACE_BOX = (182, 82, 270, 176)  # the astronaut's face, read off by hand (tests/test_detection.py)


def _face_manifest(decoder: dict) -> dict:
    return {
        "schema": 1, "name": "face", "version": "0.10.21", "task": "detection", "labels": ["face"], "decoder": decoder,
        "inputs": [{"name": "input", "dtype": "float32", "shape": [1, 128, 128, 3], "layout": "NHWC",
                    "preprocess": {"kind": "image", "size_hw": [128, 128], "resize": "letterbox", "mean": [0.5] * 3, "std": [0.5] * 3, "pad_value": 0}}],
        "outputs": [{"name": "regressors", "dtype": "float32", "shape": [1, 896, 16]}, {"name": "classificators", "dtype": "float32", "shape": [1, 896, 1]}],
        "variants": [{"id": "fp32-tflite", "file": "face.tflite", "backend": "litert", "precision": "fp32"}],
    }  # fmt: skip


ANCHORS = {k: (list(v) if isinstance(v, tuple) else v) for k, v in BLAZEFACE_SHORT_RANGE_ANCHORS.items()}


def test_blazeface_decoder_from_manifest(tmp_path: Path) -> None:
    skimage = pytest.importorskip("skimage")  # the dev extra installs it; a missing one fails CI's install, not this test
    from tools.fixtures.fetch_pretrained import fetch

    dec = {"kind": "detection", "format": "blazeface", "outputs": ["regressors", "classificators"], "score_threshold": 0.5,
           "iou_threshold": 0.3, "nms": "weighted", "anchors": ANCHORS}  # fmt: skip
    write_package(tmp_path / "face", _face_manifest(dec), {"face.tflite": fetch("mediapipe-face-detection-short-range")})
    img = skimage.data.astronaut()  # RGB 512x512
    with edge_sdk.load(tmp_path / "face", "raspberry-pi-5", delegates=()) as m:
        r = m.predict_image(img)
        assert isinstance(r.decoded, Detections) and len(r.decoded) == 1
        box = r.decoded.boxes()[0]
        from edge_sdk.processing.detection import BBox

        assert box.iou(BBox(*FACE_BOX)) >= 0.75 and r.decoded.labels == ("face",)
        d = r.to_dict()
        assert d["detections"][0]["label"] == "face" and len(d["detections"][0]["xyxy"]) == 4
        # a wide frame (letterbox pads top/bottom): the same face, mapped back to the wide frame's pixels
        wide = np.zeros((512, 576, 3), np.uint8)
        wide[:, 32:544] = img
        b2 = m.predict_image(wide).decoded.boxes()
        assert len(b2) == 1 and abs(b2[0].xmin - 32 - box.xmin) < 6 and abs(b2[0].ymin - box.ymin) < 6
        assert len(m.predict_image(skimage.data.coffee()).decoded) == 0  # no face
        with pytest.raises(ValueError, match="classification"):
            _ = r.top1


# (decoder table, message) — misconfigured decoders are manifest errors, at open time
BAD = [
    ({"kind": "detection", "outputs": ["regressors", "classificators"]}, "needs format"),
    ({"kind": "detection", "format": "ssd", "outputs": ["regressors", "classificators"]}, "expected one of"),
    ({"kind": "detection", "format": "blazeface", "outputs": ["regressors"]}, "blazeface needs"),
    ({"kind": "detection", "format": "blazeface", "outputs": ["regressors", "nope"]}, "not outputs"),
    ({"kind": "detection", "format": "yolo", "layout": "xywh"}, "yolo needs"),
    ({"kind": "detection", "format": "blazeface", "outputs": ["regressors", "classificators"], "score_treshold": 0.5}, "unknown key"),
    ({"kind": "detection", "format": "blazeface", "outputs": ["regressors", "classificators"], "iou_threshold": 3}, "expected 0..1"),
]


@pytest.mark.parametrize("decoder,msg", BAD)
def test_bad_decoder_tables(decoder: dict, msg: str) -> None:
    m = _face_manifest(decoder)
    m["variants"][0].update(sha256="a" * 64, size=1)
    with pytest.raises(errors.ManifestError, match=msg):
        edge_sdk.Manifest.from_dict(m)


def _seg_onnx() -> bytes:
    """x[1,3,32,32] -> 2-class logits [1,2,16,16]: class 1 where the red channel is bright."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.zeros((2, 3, 2, 2), np.float32)
    w[1, 0] = 1.0  # class 1 logit = mean red over a 2x2 patch (stride 2)
    w[0, 0] = -1.0
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], kernel_shape=[2, 2])],
        "seg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 16])], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_segmentation_decoder_from_manifest(tmp_path: Path) -> None:
    write_package(
        tmp_path / "seg",
        {
            "schema": 1, "name": "seg", "version": "1", "task": "segmentation", "labels": ["background", "red"],
            "decoder": {"kind": "segmentation", "layout": "NCHW", "activation": "softmax", "upsample": "nearest"},
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 32, 32], "layout": "NCHW",
                        "preprocess": {"kind": "image", "size_hw": [32, 32], "resize": "letterbox", "mean": [0.5] * 3, "std": [0.5] * 3, "pad_value": 0}}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 2, 16, 16]}],
            "variants": [{"id": "fp32", "file": "s.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },  # fmt: skip
        {"s.onnx": _seg_onnx()},
    )
    img = np.zeros((64, 128, 3), np.uint8)
    img[:, 64:96, 0] = 255  # a red vertical band (RGB)
    with edge_sdk.load(tmp_path / "seg", "generic-x86_64") as m:
        r = m.predict_image(img)
        assert isinstance(r.decoded, SegmentationMask) and r.decoded.class_map.shape == (64, 128)
        red = r.decoded.mask("red")
        assert red[:, 66:94].all() and not red[:, :60].any() and not red[:, 100:].any()


def test_predict_batch_of_a_segmentation_model_with_a_dynamic_batch(tmp_path: Path) -> None:
    """A per-image decoder over a batchable model: predict_batch gives each item its own mask, the
    same as predict (stacking rows into one call would hand the decoder a batch it cannot split)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.zeros((2, 3, 2, 2), np.float32)
    w[1, 0], w[0, 0] = 1.0, -1.0
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], kernel_shape=[2, 2])],
        "seg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 16, 16])], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    write_package(
        tmp_path / "seg",
        {
            "schema": 1, "name": "seg", "version": "1", "task": "segmentation", "labels": ["background", "red"],
            "decoder": {"kind": "segmentation", "layout": "NCHW", "activation": "softmax", "upsample": "nearest"},
            "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 3, 32, 32], "layout": "NCHW", "dims": {"batch": [1, 4]}}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 2, 16, 16]}],
            "variants": [{"id": "fp32", "file": "s.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },  # fmt: skip
        {"s.onnx": m.SerializeToString()},
    )
    items = []
    for col in (0, 8, 16):  # a bright red band at a different place in each item
        x = np.zeros((1, 3, 32, 32), np.float32)
        x[0, 0, :, col : col + 8] = 1.0
        items.append(x)
    with edge_sdk.load(tmp_path / "seg", "generic-x86_64") as model:
        batch = model.predict_batch(items)
        single = [model.predict(x) for x in items]
    assert len(batch) == 3
    for b, s in zip(batch, single):
        assert isinstance(b.decoded, SegmentationMask) and b.batch_size == 1
        assert np.array_equal(b.decoded.class_map, s.decoded.class_map)
    maps = [b.decoded.class_map for b in batch]
    assert not np.array_equal(maps[0], maps[1]) and not np.array_equal(maps[1], maps[2])
