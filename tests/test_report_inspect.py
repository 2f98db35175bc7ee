"""`edge-convert inspect` (converters.inspect_model) on real ONNX/TFLite models built here,
and the conversion report (converters.report) written into a package folder."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.inspect_model import InspectError, ModelInspection, format_inspection, inspect_model
from converters.report import validate_report, write_report

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# --------------------------------------------------------------------------
# models


def _model(nodes, name, inputs, outputs, weights: dict[str, np.ndarray], opset: int = 17) -> bytes:
    g = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(w, k) for k, w in weights.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="edge-tests", producer_version="1.0")
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m.SerializeToString()


@pytest.fixture(scope="module")
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def cnn_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    f = np.float32
    return {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(f) * 0.3, "b1": rng.standard_normal(8).astype(f),
        "w2": rng.standard_normal((16, 8, 3, 3)).astype(f) * 0.2, "b2": rng.standard_normal(16).astype(f),
        "wfc": rng.standard_normal((10, 16)).astype(f) * 0.3, "bfc": rng.standard_normal(10).astype(f),
    }  # fmt: skip


def cnn_onnx(weights: dict[str, np.ndarray]) -> bytes:
    """image[batch,3,16,16] -> Conv/Relu x2 -> GlobalAveragePool -> Flatten -> Gemm -> logits[batch,10]."""
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wfc", "bfc"], ["logits"], transB=1),
    ]
    return _model(
        nodes, "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        weights,
    )  # fmt: skip


def mlp_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    f = np.float32
    return {
        "W1": rng.standard_normal((64, 96)).astype(f), "b1": rng.standard_normal(96).astype(f),
        "W2": rng.standard_normal((96, 32)).astype(f), "b2": rng.standard_normal(32).astype(f),
    }  # fmt: skip


def mlp_onnx(weights: dict[str, np.ndarray]) -> bytes:
    """x[batch,64] -> MatMul(64x96) -> Add -> Relu -> MatMul(96x32) -> Add -> Softmax (a classifier head)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["a"]),
        helper.make_node("MatMul", ["a", "W2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["ob"]),
        helper.make_node("Softmax", ["ob"], ["probs"], axis=-1),
    ]
    return _model(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 32])],
        weights,
    )  # fmt: skip


def attention_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    f = np.float32
    w = {"E": rng.standard_normal((100, 32)).astype(f)}
    for k in ("Wq", "Wk", "Wv", "Wo"):
        w[k] = (rng.standard_normal((32, 32)) / 6).astype(f)
    w["gamma"] = np.ones(32, f)
    w["beta"] = np.zeros(32, f)
    return w


def attention_onnx(weights: dict[str, np.ndarray]) -> bytes:
    """ids -> Gather(embedding) -> single-head self-attention (MatMul, Softmax feeding MatMul) -> residual -> LayerNormalization. No Conv."""
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["x"]),
        helper.make_node("MatMul", ["x", "Wq"], ["q"]),
        helper.make_node("MatMul", ["x", "Wk"], ["k"]),
        helper.make_node("MatMul", ["x", "Wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),  # B is an activation: not an int4 candidate
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["ctx"]),  # the attention pattern
        helper.make_node("MatMul", ["ctx", "Wo"], ["o"]),
        helper.make_node("Add", ["o", "x"], ["res"]),
        helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["y"], axis=-1),
    ]
    return _model(
        nodes, "attention",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])],
        weights,
    )  # fmt: skip


def lstm_onnx(rng: np.random.Generator) -> tuple[bytes, int]:
    """x[seq,batch,8] -> LSTM(hidden 16) -> Y: recurrent, no MatMul at all."""
    f = np.float32
    w = {"W": rng.standard_normal((1, 64, 8)).astype(f), "R": rng.standard_normal((1, 64, 16)).astype(f), "B": np.zeros((1, 128), f)}
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], hidden_size=16)
    data = _model(
        [node], "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["seq", 1, "batch", 16])],
        w,
    )  # fmt: skip
    return data, sum(a.size for a in w.values())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, rng: np.random.Generator) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("models")
    out: dict[str, Any] = {"dir": d}
    for name, wf, build in (("cnn", cnn_weights, cnn_onnx), ("mlp", mlp_weights, mlp_onnx), ("attention", attention_weights, attention_onnx)):
        w = wf(rng)
        (d / f"{name}.onnx").write_bytes(build(w))
        out[name] = w
    data, n = lstm_onnx(rng)
    (d / "lstm.onnx").write_bytes(data)
    out["lstm_params"] = n
    return out


# --------------------------------------------------------------------------
# ONNX


def test_cnn(models: dict[str, Any]) -> None:
    info = inspect_model(models["dir"] / "cnn.onnx")
    data = (models["dir"] / "cnn.onnx").read_bytes()
    assert info.format == "onnx" and info.size_bytes == len(data)
    import hashlib

    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.opsets == {"ai.onnx": 17} and info.ir_version == 8 and info.schema_version is None
    assert info.producer == "edge-tests 1.0"
    assert info.op_counts == {"Conv": 2, "Relu": 2, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}
    assert info.node_count == 7
    assert info.parameter_count == sum(w.size for w in models["cnn"].values()) == 8 * 27 + 8 + 16 * 72 + 16 + 160 + 10
    assert info.weight_dtypes == {"float32": info.parameter_count}
    assert [(t.name, t.dtype, t.shape) for t in info.inputs] == [("image", "float32", ("batch", 3, 16, 16))]
    assert [(t.name, t.dtype, t.shape) for t in info.outputs] == [("logits", "float32", ("batch", 10))]
    assert not info.quantized and info.quantization == ()
    modes = {m.mode: m for m in info.modes}
    assert list(modes) == ["int8-static", "int8-dynamic", "int4", "fp16"]
    assert modes["int8-static"].applies and "Conv x2" in modes["int8-static"].why and "static QDQ suits CNN-like graphs" in modes["int8-static"].why
    assert modes["int8-dynamic"].applies and "Gemm x1" in modes["int8-dynamic"].why
    # Gemm is not what MatMulNBits converts, and there is no MatMul
    assert not modes["int4"].applies and "Gemm x1 is not converted" in modes["int4"].why and info.int4_matmuls == 0
    assert modes["fp16"].applies and str(info.parameter_count) in modes["fp16"].why
    assert info.recommended_int8 == "static" and "Conv x2" in info.recommended_reason
    # a mode is also a plain (mode, applies, why) tuple
    mode, applies, why = info.mode("int8-static")
    assert (mode, applies) == ("int8-static", True) and why


def test_mlp_int4_candidates_and_softmax_head_stays_static(models: dict[str, Any]) -> None:
    info = inspect_model(models["dir"] / "mlp.onnx")
    assert info.op_counts == {"MatMul": 2, "Add": 2, "Relu": 1, "Softmax": 1}
    assert info.parameter_count == sum(w.size for w in models["mlp"].values()) == 64 * 96 + 96 + 96 * 32 + 32
    assert info.int4_matmuls == 2 and info.int4_gathers == 0
    int4 = info.mode("int4")
    assert int4.applies and "2 of 2 MatMul nodes have a constant 2-D fp32 B" in int4.why and "MatMulNBits" in int4.why
    assert info.mode("int8-dynamic").applies and "MatMul x2" in info.mode("int8-dynamic").why
    # the Softmax only ends the classifier: no attention, no LayerNorm -> MLP-like, dynamic
    assert info.recommended_int8 == "dynamic" and "MLP-like" in info.recommended_reason and "transformer" not in info.recommended_reason


def test_attention_graph_recommends_dynamic(models: dict[str, Any]) -> None:
    info = inspect_model(models["dir"] / "attention.onnx")
    assert info.op_counts == {"Gather": 1, "MatMul": 6, "Transpose": 1, "Softmax": 1, "Add": 1, "LayerNormalization": 1}
    assert "Conv" not in info.op_counts
    assert info.parameter_count == sum(w.size for w in models["attention"].values())
    assert [(t.name, t.dtype, t.shape) for t in info.inputs] == [("ids", "int64", ("batch", "seq"))]
    # the four projections have constant 2-D fp32 B; q@k^T and p@v multiply activations
    assert info.int4_matmuls == 4 and info.int4_gathers == 1
    why = info.mode("int4").why
    assert "4 of 6 MatMul nodes" in why and "1 Gather of a 2-D fp32 initializer" in why
    assert info.recommended_int8 == "dynamic"
    assert "LayerNormalization x1 with 6 MatMul-like nodes" in info.recommended_reason
    assert "Softmax feeding a MatMul" in info.recommended_reason


def test_lstm_recommends_dynamic(models: dict[str, Any]) -> None:
    info = inspect_model(models["dir"] / "lstm.onnx")
    assert info.op_counts == {"LSTM": 1} and info.parameter_count == models["lstm_params"]
    assert info.mode("int8-dynamic").applies and "LSTM x1" in info.mode("int8-dynamic").why
    assert not info.mode("int8-static").applies
    assert not info.mode("int4").applies
    assert info.recommended_int8 == "dynamic" and "LSTM x1" in info.recommended_reason


def test_domain_prefix_subgraphs_and_overridable_initializers(tmp_path: Path) -> None:
    """com.microsoft ops keep their domain; If branches are counted; an initializer
    that is also a graph input can be overridden, so it is no int4 candidate."""
    f = np.float32
    w_const = np.ones((32, 32), f)
    w_over = np.ones((32, 32), f)
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "Wc"], ["t"])], "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("If", ["cond"], ["branch"], then_branch=then_g, else_branch=else_g),
        helper.make_node("MatMul", ["branch", "Wo"], ["m"]),
        helper.make_node("FastGelu", ["m"], ["y"], domain="com.microsoft"),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32]),
         helper.make_tensor_value_info("Wo", TensorProto.FLOAT, [32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array(w_const, "Wc"), numpy_helper.from_array(w_over, "Wo")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    p = tmp_path / "sub.onnx"
    p.write_bytes(m.SerializeToString())
    info = inspect_model(p)
    assert info.opsets == {"ai.onnx": 17, "com.microsoft": 1}
    assert info.op_counts == {"If": 1, "MatMul": 2, "Identity": 1, "com.microsoft.FastGelu": 1}
    # the If branch's MatMul reads the outer graph's constant Wc; the outer MatMul's Wo is overridable
    assert info.int4_matmuls == 1 and "1 of 2 MatMul nodes" in info.mode("int4").why
    assert [t.name for t in info.inputs] == ["cond", "x"]  # Wo is an initializer, not a data input
    assert info.parameter_count == 2 * 32 * 32


def test_external_data_is_counted_not_opened(tmp_path: Path, models: dict[str, Any]) -> None:
    m = onnx.load(str(models["dir"] / "mlp.onnx"))
    onnx.save_model(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.weights", size_threshold=0)
    (tmp_path / "ext.weights").unlink()  # never read: inspection still works from the declared dims
    info = inspect_model(tmp_path / "ext.onnx")
    assert info.external_data == ("ext.weights",)
    assert info.parameter_count == sum(w.size for w in models["mlp"].values()) and info.int4_matmuls == 2
    assert "external data (not opened): ext.weights" in format_inspection(info)


def test_qdq_quantized_cnn(models: dict[str, Any], tmp_path: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            r = np.random.default_rng(0)
            self.batches = iter([{"image": r.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    out = tmp_path / "cnn_int8.onnx"
    quantize_static(str(models["dir"] / "cnn.onnx"), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8, per_channel=True)  # fmt: skip
    info = inspect_model(out)
    assert info.quantized
    assert info.op_counts["QuantizeLinear"] >= 1 and info.op_counts["DequantizeLinear"] >= 3
    assert info.op_counts["Conv"] == 2 and info.op_counts["Gemm"] == 1  # QDQ keeps the float ops
    assert any(e.startswith("QuantizeLinear x") for e in info.quantization)
    # int8: the three weight tensors plus their per-channel zero points (one per output channel)
    w = models["cnn"]
    assert info.weight_dtypes["int8"] == sum(w[k].size + w[k].shape[0] for k in ("w1", "w2", "wfc"))
    m = onnx.load(str(out))
    assert info.parameter_count == sum(numpy_helper.to_array(t).size for t in m.graph.initializer)
    for mode in info.modes:
        assert not mode.applies and "already quantized" in mode.why, mode
    assert info.recommended_int8 == "static"
    text = format_inspection(info)
    assert "quantized  yes: " in text and "QuantizeLinear" in text


def test_text_and_dict(models: dict[str, Any]) -> None:
    info = inspect_model(models["dir"] / "attention.onnx")
    text = format_inspection(info)
    for s in ("ONNX", info.sha256, "ai.onnx 17", "ids  int64  [batch, seq]", "MatMul x6", "recommended int8: dynamic", "int4"):
        assert s in text, s
    d = info.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["op_counts"]["MatMul"] == 6 and d["modes"][2]["mode"] == "int4" and d["modes"][2]["applies"] is True
    assert d["inputs"][0]["shape"] == ["batch", "seq"] and d["recommended_int8"] == "dynamic"
    assert isinstance(info, ModelInspection)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.format = "tflite"  # type: ignore[misc]  # frozen


def test_unnamed_dynamic_dim_is_minus_one(tmp_path: Path) -> None:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    p = tmp_path / "relu.onnx"
    p.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    info = inspect_model(p)
    assert info.inputs[0].shape == (-1, 4) and info.outputs[0].shape is None
    assert info.parameter_count == 0 and info.mode("fp16").applies  # float model, no weights
    assert not info.mode("int8-static").applies and not info.mode("int8-dynamic").applies


# --------------------------------------------------------------------------
# TFLite


def test_tflite_float(tmp_path: Path, rng: np.random.Generator) -> None:
    from converters.tflite_writer import TFLiteBuilder

    w_conv = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b_conv = rng.standard_normal(4).astype(np.float32)
    w_fc = rng.standard_normal((5, 4)).astype(np.float32)
    b_fc = rng.standard_normal(5).astype(np.float32)
    b = TFLiteBuilder(description="tiny cnn")
    x = b.input("image", (1, 8, 8, 3), shape_signature=(-1, 8, 8, 3))
    y = b.conv2d(x, w_conv, b_conv, activation="RELU")
    y = b.mean(y, axes=(1, 2))  # adds an int32 axes constant of 2 elements
    y = b.fully_connected(y, w_fc, b_fc)
    b.output(b.softmax(y), "probs")
    p = tmp_path / "cnn.tflite"
    p.write_bytes(b.build())
    info = inspect_model(p)
    assert info.format == "tflite" and info.schema_version == 3 and info.producer == "tiny cnn" and info.opsets == {}
    assert info.op_counts == {"CONV_2D": 1, "MEAN": 1, "FULLY_CONNECTED": 1, "SOFTMAX": 1}
    floats = w_conv.size + b_conv.size + w_fc.size + b_fc.size
    assert info.parameter_count == floats + 2
    assert info.weight_dtypes == {"float32": floats, "int32": 2}
    assert [(t.name, t.dtype, t.shape) for t in info.inputs] == [("image", "float32", (-1, 8, 8, 3))]
    assert [(t.name, t.dtype, t.shape) for t in info.outputs] == [("probs", "float32", (-1, 5))]
    assert not info.quantized
    assert info.mode("int8-static").applies and "CONV_2D x1" in info.mode("int8-static").why
    assert not info.mode("int4").applies and "ONNX Runtime" in info.mode("int4").why
    assert info.recommended_int8 == "static"
    assert json.loads(json.dumps(info.to_dict()))["schema_version"] == 3


def test_tflite_int8(tmp_path: Path, rng: np.random.Generator) -> None:
    from converters.tflite_writer import TFLiteBuilder

    w = rng.standard_normal((8, 16)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    b = TFLiteBuilder()
    x = b.input("x", (1, 16), "int8", quant=(0.05, 3))
    y = b.fully_connected(x, w, bias, out_quant=(0.1, -2), name="fc")
    b.output(b.dequantize(y), "y")
    p = tmp_path / "fc_int8.tflite"
    p.write_bytes(b.build())
    info = inspect_model(p)
    assert info.op_counts == {"FULLY_CONNECTED": 1, "DEQUANTIZE": 1}
    assert info.quantized and any("int8" in e for e in info.quantization)
    assert info.weight_dtypes == {"int8": w.size, "int32": bias.size} and info.parameter_count == w.size + bias.size
    inp = info.inputs[0]
    assert inp.dtype == "int8" and inp.quant is not None and inp.quant[0] == pytest.approx(0.05) and inp.quant[1] == 3
    assert all(not m.applies for m in info.modes)
    assert "scale 0.05" in format_inspection(info)


# --------------------------------------------------------------------------
# refusals


def _pytorch_like_zip(p: Path, _models: Path) -> None:
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": [1.0]}, protocol=2))


def _plain_zip(p: Path, _models: Path) -> None:
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("model.onnx", b"not really")


REFUSALS = [
    ("weights.onnx", lambda p, m: p.write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=4)), "pickle"),  # a pickle, whatever its name says
    ("model.pt", _pytorch_like_zip, "pickle"),  # a PyTorch checkpoint: zip holding data.pkl
    ("bundle.zip", _plain_zip, "zip archive"),  # a zip, e.g. a package archive
    ("noise.bin", lambda p, m: p.write_bytes(np.random.default_rng(3).bytes(4096)), "not an ONNX or TFLite model"),  # random bytes
    ("half.onnx", lambda p, m: p.write_bytes((m / "cnn.onnx").read_bytes()[: (m / "cnn.onnx").stat().st_size // 2]), "truncated or corrupt"),  # truncated ONNX
    ("half.tflite", lambda p, m: p.write_bytes(_tiny_tflite()[:200]), "not a valid TFLite model"),  # truncated TFLite
    ("model.ort", lambda p, m: p.write_bytes(b"\x10\x00\x00\x00ORTM" + bytes(64)), "ORT-format"),  # ORT flatbuffer
    ("empty.onnx", lambda p, m: p.write_bytes(b""), "truncated or corrupt"),  # empty file
    ("missing.onnx", lambda p, m: None, "no such file"),  # missing path
    ("a_dir", lambda p, m: p.mkdir(), "not a regular file"),  # a directory
]


def _tiny_tflite() -> bytes:
    from converters.tflite_writer import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.input("x", (1, 64))
    b.output(b.fully_connected(x, np.ones((64, 64), np.float32)), "y")
    return b.build()


@pytest.mark.parametrize("name,make,msg", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals(tmp_path: Path, models: dict[str, Any], name: str, make: Any, msg: str) -> None:
    p = tmp_path / name
    make(p, models["dir"])
    with pytest.raises(InspectError, match=msg) as exc:
        inspect_model(p)
    assert name in str(exc.value)  # the message names the file
    assert isinstance(exc.value, ValueError)


def test_onnx_without_opsets_is_refused(tmp_path: Path, models: dict[str, Any]) -> None:
    """Cutting a serialized model right after its graph leaves valid protobuf without opset_import."""
    m = onnx.load(str(models["dir"] / "cnn.onnx"))
    del m.opset_import[:]
    p = tmp_path / "cut.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(InspectError, match="cut.onnx.*no opset_import"):
        inspect_model(p)


# --------------------------------------------------------------------------
# report


def full_report() -> dict[str, Any]:
    th = {"cosine": 0.99, "max_abs_error": 0.5, "top1_agreement": 0.95}
    return {
        "model": {"name": "shapes", "version": "2.0", "task": "classification", "source": "model_fp32.onnx", "source_sha256": "ab" * 32},
        "machine": {"profile": "generic-x86_64", "machine": "x86_64 Linux, 16 cores", "threads": 4, "python": "3.11.9"},
        "reference": "fp32-onnx",
        "gate": th,
        "created_by": "edge-convert test",  # extra top-level context is kept in report.json
        "calibration": {"source": "calib/ (images)", "samples": 128},
        "validation": {"source": "val/ (labelled images)", "samples": 500},
        "variants": [
            {
                "id": "fp32-onnx", "backend": "onnxruntime", "precision": "fp32", "file": "model_fp32.onnx", "size": 96181,
                "method": "reference (unchanged)", "written": True, "quality": {"metric": "accuracy", "value": 0.962},
                "gate": {"passed": True}, "latency_ms": 1.84, "reference_latency_ms": 1.84, "slower_than_reference": False,
                "kept_float_nodes": [], "notes": [],
            },
            {
                "id": "int8-onnx", "backend": "onnxruntime", "precision": "int8", "file": "model_int8.onnx", "size": 31128,
                "method": "static QDQ, per-channel, 128 calibration images", "written": True,
                "quality": {"cosine": 0.99871, "max_abs_error": 0.118, "top1_agreement": 0.994, "top5_agreement": 1.0,
                            "metric": "accuracy", "value": 0.958},
                "gate": {"passed": True, "thresholds": th, "failures": [], "forced": False},
                "latency_ms": 0.71, "reference_latency_ms": 1.84, "slower_than_reference": False,
                "kept_float_nodes": ["/head/Gemm"], "notes": ["first Conv kept float for accuracy"],
            },
            {
                "id": "int4-onnx", "backend": "onnxruntime", "precision": "int4", "file": "model_int4.onnx", "size": 70210,
                "method": "MatMulNBits block 32", "written": True,
                "quality": {"cosine": 0.9123, "max_abs_error": 1.73, "top1_agreement": 0.81, "top5_agreement": 0.97,
                            "metric": "accuracy", "value": 0.79},
                "gate": {"passed": False, "thresholds": th, "forced": True,
                         "failures": ["cosine 0.9123 < 0.99", "max_abs_error 1.73 > 0.5", "top1_agreement 0.81 < 0.95"]},
                "latency_ms": 2.31, "reference_latency_ms": 1.84, "slower_than_reference": True,
                "kept_float_nodes": [], "notes": ["only 1 of 12 nodes could use MatMulNBits | Gemm stays float"],
            },
        ],
    }  # fmt: skip


def test_write_full_report(tmp_path: Path) -> None:
    report = full_report()
    before = copy.deepcopy(report)
    paths = write_report(tmp_path, report)
    assert report == before  # not modified
    assert paths == {"json": tmp_path / "report.json", "md": tmp_path / "report.md", "png": tmp_path / "report.png"}
    # report.json: the mapping, sorted and pretty
    text = paths["json"].read_text()
    assert json.loads(text) == report
    assert text.index('"calibration"') < text.index('"machine"') < text.index('"variants"') and "\n  " in text
    # report.md
    md = paths["md"].read_text()
    for s in ("# Conversion report: shapes 2.0", "x86_64 Linux, 16 cores", "generic-x86_64", "4 threads",
              "calib/ (images) (128 samples)", "val/ (labelled images) (500 samples)", "sha256 `" + "ab" * 32,
              "4 threads, python 3.11.9)", "Quality gate**: cosine ≥ 0.99, max_abs_error ≤ 0.5, top1_agreement ≥ 0.95"):
        assert s in md, s  # fmt: skip
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert len(rows) == 1 + 3  # header + one per variant
    for vid in ("fp32-onnx", "int8-onnx", "int4-onnx"):
        assert sum(vid in r for r in rows) == 1, vid
    ref_row, int8_row, int4_row = rows[1:]
    assert "(reference)" in ref_row and "**PASS**" in ref_row and "1.00×" in ref_row
    assert "**PASS**" in int8_row and "0.998710" in int8_row and "2.59×" in int8_row and "99.4%" in int8_row and "30.4" in int8_row
    assert "**FORCED**: cosine 0.9123 < 0.99; max_abs_error 1.73 > 0.5; top1_agreement 0.81 < 0.95" in int4_row
    assert "0.80×" in int4_row and "slower than the reference" in int4_row
    assert "Gemm stays float" in int4_row and "\\|" in int4_row  # the pipe in the note is escaped
    cells = {len(re.findall(r"(?<!\\)\|", r)) for r in rows}
    assert cells == {17}  # 16 columns on every row
    detail = md.split("## Gate failures and notes", 1)[1]
    assert "### `int4-onnx` — FORCED" in detail and "- Failed: max_abs_error 1.73 > 0.5" in detail
    assert "cosine ≥ 0.99, max_abs_error ≤ 0.5, top1_agreement ≥ 0.95" in detail
    assert "only because the conversion was forced" in detail and "2.310 ms vs 1.840 ms" in detail
    assert "### `int8-onnx` — PASS" in detail and "`/head/Gemm`" in detail
    assert detail.index("int4-onnx") < detail.index("int8-onnx")  # failures first
    assert "fp32-onnx" not in detail  # nothing to explain
    # report.png
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    cv2 = pytest.importorskip("cv2")
    img = cv2.imread(str(paths["png"]))
    assert img is not None and img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 900
    assert img.std() > 10  # not a blank canvas


def test_report_fail_nan_and_missing_latency(tmp_path: Path) -> None:
    report = full_report()
    report["calibration"] = None
    del report["validation"]
    fail = copy.deepcopy(report["variants"][2])
    fail.update(id="fp16-onnx", precision="fp16", written=False, latency_ms=None, reference_latency_ms=None, notes=[])
    fail["gate"] = {"passed": False, "thresholds": {"cosine": 0.99}, "failures": ["outputs are NaN"]}
    fail["quality"] = {"cosine": float("nan")}
    del fail["slower_than_reference"]
    report["variants"].append(fail)
    never = {  # quantization itself failed: no file, nothing measured
        "id": "int4-matmul", "backend": "onnxruntime", "precision": "int4", "file": None, "size": 0, "method": "not made",
        "written": False, "quality": {}, "gate": {"passed": False, "failures": ["MatMulNBits: no MatMul with a constant B"]},
        "latency_ms": None, "reference_latency_ms": None, "slower_than_reference": False, "kept_float_nodes": [], "notes": [],
    }  # fmt: skip
    report["variants"].append(never)
    paths = write_report(tmp_path, report)
    md = paths["md"].read_text()
    assert "### `int4-matmul` — FAIL" in md and "no MatMul with a constant B" in md and "Not made (no file)" in md
    never_row = next(ln for ln in md.splitlines() if ln.startswith("| `int4-matmul`"))
    assert never_row.split(" | ")[4] == "—"  # no size for a file that was never made
    md = paths["md"].read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| `fp16-onnx`"))
    assert "**FAIL**: outputs are NaN" in row and "NaN" in row and "| no |" in row
    assert "### `fp16-onnx` — FAIL" in md and "Not written to the package." in md
    assert "Calibration data**: none" in md and "Validation data**: none" in md
    loaded = json.loads(paths["json"].read_text())
    assert loaded["variants"][3]["quality"]["cosine"] is None  # strict JSON: NaN becomes null
    assert ": NaN" not in paths["json"].read_text()
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_plot(tmp_path: Path) -> None:
    paths = write_report(tmp_path, full_report(), plot=False)
    assert set(paths) == {"json", "md"} and not (tmp_path / "report.png").exists()
    with pytest.raises(NotADirectoryError):
        write_report(tmp_path / "nope", full_report())


def _without(path: str):
    def f(r: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        d: Any = r
        for p in parents:
            d = d[int(p)] if p.isdigit() else d[p]
        del d[last]

    return f


def _set(path: str, value: Any):
    def f(r: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        d: Any = r
        for p in parents:
            d = d[int(p)] if p.isdigit() else d[p]
        d[int(last) if last.isdigit() else last] = value

    return f


BAD_REPORTS = [
    (_without("model"), "'model'"),  # no model section
    (_without("model.name"), "'model.name'"),  # model without a name
    (_without("model.source_sha256"), "'model.source_sha256'"),  # provenance left out (None is allowed, absent is not)
    (_without("machine.threads"), "'machine.threads'"),
    (_without("reference"), "'reference'"),
    (_without("variants"), "'variants'"),
    (_without("variants.1.gate.passed"), r"'variants\[1\].gate.passed'"),  # a gate without a verdict
    (_without("variants.0.written"), r"'variants\[0\].written'"),
    (_without("variants.2.quality"), r"'variants\[2\].quality'"),
    (_set("variants.1.latency", 1.0), r"'variants\[1\].latency'"),  # misspelt key is refused, not dropped
    (_set("variants.1.size", True), r"'variants\[1\].size' must be int"),  # bool is no size
    (_set("variants.1.quality.cosine", "0.99"), r"'variants\[1\].quality.cosine'"),
    (_set("variants.1.gate.thresholds", {"speed": 2}), r"'variants\[1\].gate.thresholds.speed'"),
    (_set("variants.2.gate.forced", False), r"'variants\[2\].gate' failed"),  # failed yet written, not forced
    (_set("variants.1.latency_ms", 0), r"'variants\[1\].latency_ms' must be > 0"),
    (_set("variants.2.id", "int8-onnx"), r"'variants\[2\].id' repeats"),
    (_set("reference", "nope"), "'reference' names 'nope'"),
    (_set("variants", []), "'variants' must list at least one"),
    (_set("calibration", {"source": "x"}), "'calibration.samples'"),
    (_set("machine", "x86"), "machine: expected a mapping"),
    (_set("variants.1.quality.cosin", 0.9), r"'variants\[1\].quality.cosin'"),  # typo inside a variant
    (_set("variants.1.gate.force", True), r"'variants\[1\].gate.force'"),
    (_set("gate", {"cosine": "high"}), "'gate.cosine' must be"),  # the default thresholds are checked too
    (_set("variants.1.file", 3), r"'variants\[1\].file' must be str or None"),
]


@pytest.mark.parametrize("mutate,msg", BAD_REPORTS)
def test_bad_report_mappings(tmp_path: Path, mutate: Any, msg: str) -> None:
    report = full_report()
    mutate(report)
    with pytest.raises(ValueError, match=msg):
        validate_report(report)
    with pytest.raises(ValueError, match=msg):
        write_report(tmp_path, report)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_report_module_does_not_pick_a_matplotlib_backend() -> None:
    """Importing converters.report, or writing a report, neither imports pyplot nor switches the backend."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    script = (
        "import sys, tempfile, json\n"
        "import converters.report as r\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at import time'\n"
        f"rep = json.loads({json.dumps(json.dumps(full_report()))})\n"
        "r.write_report(tempfile.mkdtemp(), rep)\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "import matplotlib\n"
        "print(matplotlib.get_backend())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="svg")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "svg"  # the user's backend choice is untouched
