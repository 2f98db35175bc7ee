"""tools/fixtures/tflite_to_onnx.py: the ONNX translation computes what the TFLite model computes.

- MediaPipe's BlazeFace short-range (the real .tflite, fetched and sha256-pinned): LiteRT and ONNX
  Runtime on real photographs (scikit-image), preprocessed as the face package's manifest says;
  the raw outputs agree to float32 rounding and the decoded faces are the same;
- small models written with converters.tflite_writer exercising what BlazeFace does not: SAME
  padding on odd sizes with stride 2 (TF puts the extra pixel at the end), dilation, depthwise
  with a channel multiplier, fused RELU6 / RELU_N1_TO_1, a broadcast constant ADD, RESHAPE of a
  4-D tensor (NHWC element order), a rank-4 graph output (NHWC again), a dynamic batch;
- unsupported ops, quantized models and files that are not TFLite raise the typed errors, naming
  what was found and what is supported; the CLI reports them with exit status 2.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
cv2 = pytest.importorskip("cv2")
skimage_data = pytest.importorskip("skimage.data")

from ai_edge_litert.interpreter import Interpreter  # noqa: E402
from conftest import ROOT  # noqa: E402

from converters.tflite_writer import TFLiteBuilder  # noqa: E402
from tools.fixtures.tflite_to_onnx import SUPPORTED_OPS, TFLiteToOnnxError, UnsupportedOpError, convert_file, translate  # noqa: E402


@pytest.fixture(scope="module")
def blazeface() -> Path:
    # Module scope: runs before conftest's per-test cache, so the fetch uses the normal model cache.
    from tools.fixtures.face_package import MODEL_NAME
    from tools.fixtures.fetch_pretrained import fetch

    return fetch(MODEL_NAME)


def run_tflite(model: bytes | Path, feeds: list[np.ndarray]) -> dict[str, np.ndarray]:
    it = Interpreter(model_path=str(model)) if isinstance(model, Path) else Interpreter(model_content=model)
    ins = it.get_input_details()
    for d, x in zip(ins, feeds):
        if tuple(d["shape"]) != x.shape:
            it.resize_tensor_input(d["index"], x.shape)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]).copy() for d in it.get_output_details()}


def run_onnx(model, feeds: list[np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), feeds)})
    return {o.name: v for o, v in zip(sess.get_outputs(), outs)}


def face_input(img_rgb: np.ndarray) -> np.ndarray:
    """The face manifest's preprocessing: letterbox to 128x128 (pad 0), RGB, (x - 127.5) / 127.5."""
    h, w = img_rgb.shape[:2]
    s = 128 / max(h, w)
    nh, nw = round(h * s), round(w * s)
    canvas = np.zeros((128, 128, 3), np.float32)
    top, left = (128 - nh) // 2, (128 - nw) // 2
    canvas[top : top + nh, left : left + nw] = cv2.resize(img_rgb, (nw, nh), interpolation=cv2.INTER_AREA).astype(np.float32) / 127.5 - 1.0
    return canvas[None]


# ----------------------------------------------------------------------------- BlazeFace


def test_blazeface_onnx_equals_tflite_on_real_images(blazeface: Path) -> None:
    from edge_sdk.processing.detection import decode_blazeface

    model = translate(blazeface)
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["regressors", "classificators"]
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "MaxPool", "Pad", "Add", "Relu", "Reshape", "Concat", "Transpose"} <= ops
    images = {
        "astronaut": skimage_data.astronaut(),
        "coffee": skimage_data.coffee(),
        "chelsea": skimage_data.chelsea(),
        "camera": np.repeat(skimage_data.camera()[:, :, None], 3, axis=2),
    }
    faces = {}
    for name, img in images.items():
        x = face_input(img)
        ref = run_tflite(blazeface, [x])
        got = run_onnx(model, [x])
        for out in ("regressors", "classificators"):
            assert got[out].shape == ref[out].shape and got[out].dtype == np.float32
            scale = float(np.abs(ref[out]).max())
            diff = float(np.abs(got[out] - ref[out]).max())
            # Float32 rounding only: different kernels sum in a different order. The outputs reach
            # ~100-200 (box offsets in pixels, logits), where one float32 ulp is ~1e-5, so the
            # bound is 1e-4 per unit of output magnitude; a wrong weight layout, pad or axis gives
            # differences of the order of the outputs themselves.
            assert diff <= 1e-4 * max(1.0, scale / 10), f"{name}/{out}: max |onnx - tflite| {diff} (outputs up to {scale})"
            assert scale > 1.0  # not a degenerate all-zero comparison
        kw = dict(input_size=(128, 128), score_threshold=0.5, iou_threshold=0.3)  # short-range anchors by default
        d_ref = decode_blazeface(ref["regressors"][0], ref["classificators"][0], **kw)
        d_got = decode_blazeface(got["regressors"][0], got["classificators"][0], **kw)
        np.testing.assert_allclose(np.asarray(d_got.xyxy), np.asarray(d_ref.xyxy), atol=1e-3)
        np.testing.assert_allclose(np.asarray(d_got.scores), np.asarray(d_ref.scores), atol=1e-5)
        faces[name] = len(d_ref.scores)
    assert faces["astronaut"] == 1 and faces["coffee"] == 0, faces  # the comparison covers a real face


def test_convert_file_and_cli(blazeface: Path, tmp_path: Path) -> None:
    import onnx

    out = convert_file(blazeface, tmp_path / "sub" / "face.onnx")
    assert out.is_file() and not (tmp_path / "sub" / "face.onnx.tmp").exists()
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fixtures" / "tflite_to_onnx.py"), str(blazeface), str(tmp_path / "cli.onnx")],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "cli.onnx").read_bytes() == out.read_bytes()  # deterministic


# ----------------------------------------------------------------------------- small graphs


def _check_equal(tfl: bytes, feeds: list[np.ndarray], atol: float = 1e-5) -> dict[str, np.ndarray]:
    ref = run_tflite(tfl, feeds)
    got = run_onnx(translate(tfl), feeds)
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
        np.testing.assert_allclose(got[k], ref[k], atol=atol, rtol=1e-5, err_msg=k)
    return ref


def test_conv_padding_stride_dilation_and_fused_activations() -> None:
    rng = np.random.default_rng(1)
    b = TFLiteBuilder()
    x = b.input("x", (1, 16, 14, 3))
    # stride 2 SAME, kernel 3 on 16x14: one pixel of padding in all, which TF puts at the bottom/right
    y = b.conv2d(x, rng.normal(size=(8, 3, 3, 3)), rng.normal(size=8), stride=2, padding="SAME", activation="RELU6")
    z = b.conv2d(x, rng.normal(size=(4, 3, 3, 3)), rng.normal(size=4), dilation=2, padding="SAME", activation="RELU_N1_TO_1")
    v = b.conv2d(x, rng.normal(size=(5, 4, 2, 3)), None, stride=(1, 2), padding="VALID")
    b.output(y, "y")
    b.output(z, "z")  # rank-4 outputs come back NHWC
    b.output(v, "v")
    ref = _check_equal(b.build(), [rng.normal(size=(1, 16, 14, 3)).astype(np.float32)])
    assert ref["y"].shape == (1, 8, 7, 8) and ref["v"].shape == (1, 13, 7, 5)
    assert ref["y"].max() <= 6.0 and ref["y"].max() > 1.0 and np.abs(ref["z"]).max() <= 1.0


def test_depthwise_multiplier_pool_add_reshape() -> None:
    rng = np.random.default_rng(2)
    b = TFLiteBuilder()
    x = b.input("x", (1, 9, 11, 4), shape_signature=(-1, 9, 11, 4))
    d = b.depthwise_conv2d(x, rng.normal(size=(1, 3, 3, 8)), rng.normal(size=8), stride=2, padding="SAME")  # multiplier 2
    p = b.max_pool2d(d, 3, 2, padding="SAME")
    a = b.add(p, rng.normal(size=(8,)).astype(np.float32), activation="RELU")  # a channel-wise constant, broadcast
    r = b.reshape(a, (-1, 3 * 3 * 8))  # NHWC element order
    b.output(r, "flat")
    b.output(b.relu(d), "dw")
    tfl = b.build()
    model = translate(tfl)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"  # dynamic batch kept
    ref = _check_equal(tfl, [rng.normal(size=(1, 9, 11, 4)).astype(np.float32)])
    assert ref["flat"].shape == (1, 72) and ref["dw"].shape == (1, 5, 6, 8)
    _check_equal(tfl, [rng.normal(size=(3, 9, 11, 4)).astype(np.float32)])  # batch 3 through both


# ----------------------------------------------------------------------------- errors


def test_unsupported_op_is_named() -> None:
    b = TFLiteBuilder()
    x = b.input("x", (1, 8, 8, 3))
    y = b.conv2d(x, np.ones((2, 1, 1, 3), np.float32))
    b.output(b.softmax(b.reshape(y, (1, 128))), "probs")
    with pytest.raises(UnsupportedOpError) as ei:
        translate(b.build())
    e = ei.value
    assert isinstance(e, TFLiteToOnnxError) and isinstance(e, ValueError)
    assert e.op == "SOFTMAX" and e.index == 2
    assert "unsupported TFLite op SOFTMAX at operator 2" in str(e) and "supported: " + ", ".join(SUPPORTED_OPS) in str(e)

    b = TFLiteBuilder()
    x = b.input("x", (1, 8, 8, 3))
    b.output(b.avg_pool2d(x, 2), "y")
    with pytest.raises(UnsupportedOpError, match="AVERAGE_POOL_2D at operator 0"):
        translate(b.build())


def test_quantized_model_is_refused() -> None:
    b = TFLiteBuilder()
    x = b.input("x", (1, 8, 8, 3), "int8", quant=(0.02, 0))
    b.output(b.conv2d(x, np.ones((2, 1, 1, 3), np.float32), out_quant=(0.05, 0)), "y")
    with pytest.raises(TFLiteToOnnxError, match="quantized"):
        translate(b.build())


def test_not_a_tflite_file(tmp_path: Path, blazeface: Path) -> None:
    with pytest.raises(TFLiteToOnnxError, match="TFL3"):
        translate(b"\x08\x01" + b"\x00" * 40)  # an ONNX-like protobuf start
    data = blazeface.read_bytes()
    with pytest.raises(TFLiteToOnnxError, match="not a readable TFLite model"):
        translate(data[: len(data) // 3])  # truncated: the bounds check refuses it, nothing crashes
    bad = tmp_path / "bad.tflite"
    b = TFLiteBuilder()
    x = b.input("x", (1, 4))
    b.output(b.softmax(x), "y")
    bad.write_bytes(b.build())
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fixtures" / "tflite_to_onnx.py"), str(bad), str(tmp_path / "bad.onnx")],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "unsupported TFLite op SOFTMAX" in p.stderr
    assert not (tmp_path / "bad.onnx").exists()
