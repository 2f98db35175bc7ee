"""The converter on what real exported models do (found by the corpus, tools/fixtures/corpus.py), on small built
graphs: an fp16 variant that overflows is refused with a gate failure (no NaN reaches the manifest); fp16 keeps a node
whose constant fp16 cannot hold in fp32; a leading dim that is not a batch; an image input's named H/W fixed by the
preprocess; raw detection heads (YOLOv8, YOLOv5, SSD, BlazeFace) decoded before boxes are compared; int8 dynamic on
the MatMuls only; reference statistics over inputs whose width varies."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.calibration import CalibrationError, batch_axis, load_data
from converters.packaging import SignatureError, onnx_tensor_specs
from converters.pipeline import ConvertOptions, convert
from converters.quantize import Int8Options, convert_fp16, fp16_unsafe_nodes, quantize_int8
from converters.validate import DetectionFormat, ValidationError, check_gate, compare, default_gate, detection_format
from edge_sdk.package import ImagePreprocess, ModelPackage, TensorSpec


def _save(path: Path, nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 13) -> Path:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


# ------------------------------------------------------------------ 1. fp16 overflow: refused, never NaN in a manifest


def test_fp16_that_overflows_is_refused_with_a_gate_failure(tmp_path: Path) -> None:
    # y = (x * x)^T^T / 1000, openWakeWord's power spectrum in miniature: x ~ 300 gives 9e4 in the square, beyond fp16's
    # 65504 (the reference's 90 is finite). ONNX Runtime's CPU runs Mul and Div in fp32 (casts in between), and the
    # Transposes (fp16 kernels) store the square in fp16: inf
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    k = numpy_helper.from_array(np.array(1000.0, np.float32), "k")
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Transpose", ["sq"], ["t"]), helper.make_node("Transpose", ["t"], ["t2"]),
        helper.make_node("Div", ["t2", "k"], ["y"]),
    ]  # fmt: skip
    model = _save(tmp_path / "sq.onnx", nodes, [x], [y], [k])
    rng = np.random.default_rng(0)
    data = (rng.uniform(250, 350, (12, 1, 8)) * rng.choice([-1, 1], (12, 1, 8))).astype(np.float32)
    data[:6] /= 100  # half the samples stay within fp16's range
    np.savez(tmp_path / "d.npz", x=data)
    res = convert(model, tmp_path / "d.npz", tmp_path / "pkg", ConvertOptions(targets=("fp16",), dims={"batch": (1, 1)}, holdout=0.5, progress=False))
    assert res.refused == ("fp16-onnx",) and res.written == ("fp32-onnx",)
    row = next(r for r in res.report["variants"] if r["id"] == "fp16-onnx")
    fails = row["gate"]["failures"]
    assert any(f.startswith("fp16 outputs non-finite in ") and " of 6 samples" in f for f in fails), fails
    assert 1 <= row["quality"]["nonfinite_samples"] <= 6
    json.loads((res.package / "report.json").read_text(), parse_constant=lambda c: pytest.fail(f"report.json holds {c}"))
    for v in row["quality"].values():
        assert not isinstance(v, float) or math.isfinite(v)
    # with --force it is written, marked, and the manifest holds no non-finite figure
    res = convert(
        model, tmp_path / "d.npz", tmp_path / "forced", ConvertOptions(targets=("fp16",), dims={"batch": (1, 1)}, holdout=0.5, progress=False, force=True)
    )  # fmt: skip
    v = ModelPackage.open(res.package).manifest.variant("fp16-onnx")
    assert v.gate is not None and not v.gate.passed and v.quality is not None and v.quality.nonfinite_samples
    toml = (res.package / "edge-model.toml").read_text()
    assert "nonfinite_samples" in toml and not any(w in toml.split() for w in ("nan", "inf", "+inf", "-inf"))


def test_compare_counts_non_finite_samples_and_keeps_figures_finite() -> None:
    ref = {"y": np.ones((4, 3), np.float32)}
    got = {"y": np.ones((4, 3), np.float32)}
    got["y"][1, 0] = np.inf
    got["y"][3, 2] = np.nan
    c = compare(ref, got, task="raw", class_output=None, labels=None, reference_id="fp32", dataset="d")
    assert c.quality.nonfinite_samples == 2 and c.quality.cosine == 1.0  # cosine over the values finite in both
    ok, fails = check_gate(c.quality, {"cosine": 0.99}, "fp16")
    assert not ok and fails == ("fp16 outputs non-finite in 2 of 4 samples (the reference's are finite)",)
    # the reference's own non-finite values are not the variant's fault
    ref["y"][1, 0] = np.inf
    ref["y"][3, 2] = np.nan
    c = compare(ref, got, task="raw", class_output=None, labels=None, reference_id="fp32", dataset="d")
    assert c.quality.nonfinite_samples is None and check_gate(c.quality, {"cosine": 0.99})[0]


# ------------------------------------------------------------------ 5. fp16: a constant beyond fp16's clamp stays fp32


def test_fp16_keeps_a_batchnorm_with_a_huge_variance_in_fp32(tmp_path: Path) -> None:
    # PP-OCRv4's detector: a BatchNormalization running variance of 9.8e7; ORT's converter clamps constants to 1e4
    c = 4
    var = np.array([9.8e7, 4e7, 1.0, 2.0], np.float32)
    mean = np.array([300.0, -200.0, 0.1, 0.0], np.float32)
    inits = [
        numpy_helper.from_array(np.ones(c, np.float32), "s"), numpy_helper.from_array(np.zeros(c, np.float32), "b"),
        numpy_helper.from_array(mean, "m"), numpy_helper.from_array(var, "v"),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 4, 4])
    src = _save(tmp_path / "bn.onnx", [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")], [x], [y], inits)
    assert set(fp16_unsafe_nodes(onnx.load(str(src)))) == {"bn"}
    feeds = {"x": (np.random.default_rng(1).normal(0, 1, (1, c, 4, 4)) * np.array([3e3, 3e3, 1, 1])[None, :, None, None]).astype(np.float32)}
    want = _run(src, feeds)[0]
    notes: list[str] = []
    desc = convert_fp16(src, tmp_path / "bn16.onnx", notes)
    got = _run(tmp_path / "bn16.onnx", feeds)[0]
    assert "1 node(s) kept in fp32" in desc and any("bn" in n and "beyond fp16" in n for n in notes)
    assert np.abs(got - want).max() < 1e-2 * np.abs(want).max()
    # what ORT's converter alone makes of it (the bug): the variance clamped to 1e4
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(tmp_path / "plain16.onnx"))
    plain = _run(tmp_path / "plain16.onnx", feeds)[0]
    assert np.abs(plain - want).max() > 10 * np.abs(got - want).max()


# ------------------------------------------------------------------ 2. a leading dim that is not a batch


def test_leading_dim_named_like_a_sequence_is_not_a_batch(tmp_path: Path) -> None:
    seq = TensorSpec("input", "float32", ("seq_len", 8), None, (("seq_len", 5, 5),))
    assert batch_axis(seq)[0] is False
    np.savez(tmp_path / "a.npz", input=np.zeros((3, 5, 8), np.float32))
    ds = load_data(tmp_path / "a.npz", [seq], progress=False)
    assert len(ds) == 3 and all(s["input"].shape == (5, 8) for s in ds.samples)
    assert any("read as 3 samples of shape [5, 8]" in n and "seq_len" in n for n in ds.notes)
    # bounds above 1 say the same for a name that says nothing
    anon = TensorSpec("input", "float32", ("d0", 8), None, (("d0", 31, 31),))
    assert batch_axis(anon)[0] is False
    np.savez(tmp_path / "b.npz", input=np.zeros((2, 31, 8), np.float32))
    assert [s["input"].shape for s in load_data(tmp_path / "b.npz", [anon], progress=False).samples] == [(31, 8), (31, 8)]
    # one array of the input's rank is one sample, not 5 of batch 1
    np.save(tmp_path / "c.npy", np.zeros((5, 8), np.float32))
    assert [s["input"].shape for s in load_data(tmp_path / "c.npy", [seq], progress=False).samples] == [(5, 8)]
    # a real batch axis still wants batch-1 samples
    bat = TensorSpec("input", "float32", ("batch", 8), None, (("batch", 1, 4),))
    assert batch_axis(bat)[0] is True
    np.savez(tmp_path / "d.npz", input=np.zeros((3, 2, 8), np.float32))
    with pytest.raises(CalibrationError, match="holds samples of batch 2.*'batch': a batch axis"):
        load_data(tmp_path / "d.npz", [bat], progress=False)
    assert batch_axis(TensorSpec("x", "float32", ("x_dim0", 8), None, (("x_dim0", 1, 1),)))[0] is True  # bounded like a batch


# ------------------------------------------------------------------ 3. --preprocess fixes an image input's named H and W


def test_preprocess_size_resolves_named_height_and_width(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    path = _save(tmp_path / "id.onnx", [helper.make_node("Relu", ["images"], ["y"])], [x], [y])
    pre = ImagePreprocess((32, 48), resize="letterbox")
    ins, _ = onnx_tensor_specs(path.read_bytes(), {"batch": (1, 1)}, pre)
    assert ins[0].shape == ("batch", 3, 32, 48) and ins[0].bounds("batch") == (1, 1)
    with pytest.raises(SignatureError, match=r"height.*gives 32, outside its --dim height=64:64"):
        onnx_tensor_specs(path.read_bytes(), {"batch": (1, 1), "height": (64, 64)}, pre)
    # the whole conversion from an image folder: the manifest takes the preprocess's (H, W)
    import cv2

    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        cv2.imwrite(str(folder / f"{i}.png"), rng.integers(0, 255, (40 + i, 60, 3), dtype=np.uint8))
    res = convert(path, folder, tmp_path / "pkg", ConvertOptions(targets=("fp16",), dims={"batch": (1, 1)}, preprocess=pre, progress=False))
    spec = ModelPackage.open(res.package).manifest.inputs[0]
    assert spec.shape == ("batch", 3, 32, 48) and spec.preprocess is not None and "fp16-onnx" in res.written


# ------------------------------------------------------------------ 4. raw detection heads


def _yolov8_head(boxes: np.ndarray, classes: int = 3, n: int = 40, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """[1, 4 + C, N]: rows of (cx, cy, w, h) with one confident class each, the rest low-score clutter."""
    rng = np.random.default_rng(seed)
    head = np.zeros((4 + classes, n), np.float32)
    head[:4] = rng.uniform(20, 200, (4, n))
    head[4:] = rng.uniform(0, 0.05, (classes, n))
    for i, (cx, cy, w, h, c) in enumerate(boxes):
        for j in range(3):  # three overlapping candidates per object: NMS keeps one
            k = 3 * i + j
            head[:4, k] = (cx + j, cy, w, h)
            head[4 + int(c), k] = 0.9 - 0.1 * j
    head[:4] += rng.normal(0, noise, head[:4].shape).astype(np.float32)
    return head[None]


def test_yolov8_head_is_decoded_not_read_as_rows() -> None:
    objs = np.array([[60, 60, 40, 30, 0], [150, 100, 50, 60, 2]], np.float32)
    ref = {"output0": np.concatenate([_yolov8_head(objs, seed=s) for s in range(3)])}
    close = {"output0": np.concatenate([_yolov8_head(objs, noise=0.3, seed=s) for s in range(3)])}
    fmt = detection_format({"output0": ref["output0"][:1]})
    assert fmt is not None and fmt.kind == "yolov8" and "[B, 4 + 3 classes, 40 boxes]" in fmt.why
    assert len(fmt.decode({"output0": ref["output0"][:1]})) == 2  # score threshold, then NMS: one box per object
    c = compare(ref, close, task="detection", class_output=None, labels=None, reference_id="fp32", dataset="d")
    assert c.quality.box_recall == 1.0 and c.quality.box_iou is not None and c.quality.box_iou > 0.95
    assert check_gate(c.quality, default_gate("detection"))[0]
    assert any("yolov8" in n and "6 reference box(es)" in n for n in c.notes)
    moved = {"output0": ref["output0"].copy()}
    moved["output0"][:, 0, :] += 45  # every box 45 px to the right: IoU < 0.5
    c = compare(ref, moved, task="detection", class_output=None, labels=None, reference_id="fp32", dataset="d")
    assert c.quality.box_recall == 0.0 and not check_gate(c.quality, default_gate("detection"))[0]
    # the same head transposed, [1, N, 4 + C], with --detection-format yolov8
    t = {"output0": ref["output0"].transpose(0, 2, 1).copy()}
    assert detection_format({"output0": t["output0"][:1]}, "yolov8").kind == "yolov8"
    c = compare(t, t, task="detection", class_output=None, labels=None, reference_id="fp32", dataset="d", detection="yolov8")
    assert c.quality.box_recall == 1.0 and any("6 reference box(es)" in n for n in c.notes)


def test_detection_format_auto_and_explicit() -> None:
    z = np.zeros
    assert detection_format({"o": z((1, 100, 6))}).kind == "rows"
    assert detection_format({"o": z((1, 100, 85))}).kind == "yolov5"
    assert detection_format({"o": z((1, 84, 8400))}).kind == "yolov8"
    assert detection_format({"b": z((1, 50, 4)), "s": z((1, 50, 3))}).kind == "ssd"
    bf = detection_format({"regressors": z((1, 896, 16)), "classificators": z((1, 896, 1))}, input_hw=(128, 128))
    assert bf is not None and bf.kind == "blazeface" and bf.outputs == ("regressors", "classificators") and bf.score_threshold == 0.5
    assert detection_format({"o": z((1, 10))}) is None
    with pytest.raises(ValidationError, match="ssd: expected two outputs"):
        detection_format({"o": z((1, 84, 8400))}, "ssd")
    with pytest.raises(ValidationError, match="expected one of"):
        detection_format({"o": z((1, 84, 8400))}, "yolov9")


def test_ssd_and_yolov5_heads_decode_with_nms() -> None:
    boxes = np.array([[[10, 10, 50, 50], [11, 10, 51, 50], [100, 100, 150, 160], [0, 0, 5, 5]]], np.float32)
    logits = np.array([[[4.0, -4.0], [3.0, -4.0], [-4.0, 5.0], [-6.0, -6.0]]], np.float32)  # sigmoid applied: logits
    rows = DetectionFormat("ssd", ("b", "s")).decode({"b": boxes, "s": logits})
    assert len(rows) == 2 and sorted(rows[:, 5].tolist()) == [0.0, 1.0]  # the duplicate suppressed, the clutter dropped
    v5 = np.zeros((1, 5, 7), np.float32)  # cx, cy, w, h, obj, 2 classes
    v5[0, 0] = (30, 30, 20, 20, 0.9, 0.9, 0.1)
    v5[0, 1] = (31, 30, 20, 20, 0.8, 0.9, 0.1)
    v5[0, 2] = (90, 90, 20, 20, 0.2, 0.9, 0.1)  # objectness x class 0.18 < 0.25
    rows = DetectionFormat("yolov5", ("o",)).decode({"o": v5})
    assert rows.shape == (1, 6) and rows[0, :4].tolist() == [20, 20, 40, 40]


# ------------------------------------------------------------------ 6. int8 dynamic on the MatMuls only


def test_int8_dynamic_on_matmuls_only_keeps_convs_float(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    mm = numpy_helper.from_array(rng.normal(0, 0.3, (10, 16)).astype(np.float32), "mm")
    shape = numpy_helper.from_array(np.array([1, 4, -1], np.int64), "shape")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 10])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 1], strides=[2, 1]),
        helper.make_node("MaxPool", ["p"], ["q"], kernel_shape=[2, 1], strides=[2, 1]),
        helper.make_node("Reshape", ["q", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "mm"], ["y"], name="matmul"),
    ]
    inits = [w, mm, shape]
    src = _save(tmp_path / "cm.onnx", nodes, [x], [y], inits)
    desc = quantize_int8(src, tmp_path / "all.onnx", Int8Options(method="dynamic"))
    ops_all = {n.op_type for n in onnx.load(str(tmp_path / "all.onnx")).graph.node}
    desc_mm = quantize_int8(src, tmp_path / "mm.onnx", Int8Options(method="dynamic", op_types=("MatMul", "Gemm")))
    ops_mm = {n.op_type for n in onnx.load(str(tmp_path / "mm.onnx")).graph.node}
    assert "ConvInteger" in ops_all and "ConvInteger" not in ops_mm and "Conv" in ops_mm and "MatMulInteger" in ops_mm
    assert "only MatMul/Gemm quantized" in desc_mm and "only" not in desc
    feeds = {"x": rng.normal(0, 1, (1, 3, 4, 10)).astype(np.float32)}
    assert np.allclose(_run(tmp_path / "mm.onnx", feeds)[0], _run(src, feeds)[0], atol=0.1)
    # the converter makes it a candidate of its own when a graph has both and plain dynamic fails its gate
    # (a gate no dynamic int8 meets here); where plain dynamic passes, it is not made (it would quantize less)
    np.savez(tmp_path / "d.npz", x=rng.normal(0, 1, (8, 1, 3, 4, 10)).astype(np.float32))

    def candidates(gate: dict[str, float] | None, out: str) -> list[dict]:
        opts = ConvertOptions(targets=("int8",), progress=False, max_keep_float=2, gate=gate, force=True)
        res = convert(src, tmp_path / "d.npz", tmp_path / out, opts)
        return next(r for r in res.report["variants"] if r["id"] == "int8-onnx")["candidates"]

    strict = candidates({"cosine": 0.999999999}, "strict")
    assert len(strict) <= 4 and any("only MatMul/Gemm quantized" in c["method"] for c in strict), strict
    loose = candidates({"cosine": 0.5}, "loose")
    assert not any("only MatMul/Gemm quantized" in c["method"] for c in loose), loose


# ------------------------------------------------------------------ 8. reference statistics over a varying width


def test_reference_builder_takes_inputs_whose_width_varies() -> None:
    from edge_sdk.package import DecoderSpec
    from edge_sdk.package.reference_stats import Extractor, ReferenceBuilder

    spec = TensorSpec("x", "float32", (1, 3, 48, "w"), "NCHW", (("w", 16, 320),))
    out = TensorSpec("y", "float32", (1, "t", 10))
    b = ReferenceBuilder(Extractor([spec], [out], DecoderSpec()))
    means = np.array([0.1, -0.5, 2.0])
    for w in (16, 40, 320):
        x = np.broadcast_to(means[None, :, None, None], (1, 3, 48, w)).astype(np.float32)
        b.add({"x": x}, {"y": np.zeros((1, w // 8, 10), np.float32)})
    rs = b.build("t")
    feats = rs.inputs["x"]["features"]
    assert len(feats) == 3 and rs.inputs["x"]["feature_axis"] == 1
    assert [round(f["mean"], 5) for f in feats] == [0.1, -0.5, 2.0]
    assert json.loads(rs.to_json())["samples"] == 3
    # a fixed last axis keeps its per-column features (what packages made before hold)
    fixed = ReferenceBuilder(Extractor([TensorSpec("x", "float32", ("b", 8), None, (("b", 1, 4),))], [out], DecoderSpec()))
    fixed.add({"x": np.arange(16, dtype=np.float32).reshape(2, 8)}, {"y": np.zeros((2, 1, 10), np.float32)})
    info = fixed.build().inputs["x"]
    assert len(info["features"]) == 8 and "feature_axis" not in info
