"""Tests for tools/fixtures/train_mlp.py and the committed MLP in tools/data/.

The committed files are checked as they are (no retraining): the ONNX runs in
ONNX Runtime, its digest is the one shapes_mlp.json records, it reaches the
recorded accuracy on the committed holdout set, its graph is the MatMul/Add/Relu
form ORT's MatMulNBits quantizer handles, and ``preprocess`` reproduces the
holdout set from ``make_split``.  Training itself is exercised on a tiny run.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.fixtures import train_mlp as tm  # noqa: E402
from tools.fixtures.train_demo import make_split  # noqa: E402

DATA = REPO / "tools" / "data"
ONNX_PATH = DATA / tm.ONNX_NAME
JSON_PATH = DATA / tm.JSON_NAME
HOLDOUT_PATH = DATA / tm.HOLDOUT_NAME


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(JSON_PATH.read_text())


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return onnx.load(str(ONNX_PATH))


@pytest.fixture(scope="module")
def holdout() -> tuple[np.ndarray, np.ndarray]:
    with np.load(HOLDOUT_PATH) as z:
        assert sorted(z.files) == ["labels", "x"]
        return z["x"], z["labels"]


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(str(ONNX_PATH), providers=["CPUExecutionProvider"])


def _dims(vi) -> list:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


def test_committed_files_small_and_digest_matches(record):
    data = ONNX_PATH.read_bytes()
    assert hashlib.sha256(data).hexdigest() == record["sha256"]
    assert len(data) == record["size"] < 4_000_000
    assert HOLDOUT_PATH.stat().st_size < 1_200_000 and JSON_PATH.stat().st_size < 10_000
    assert record["model"] == tm.ONNX_NAME and record["holdout"]["file"] == tm.HOLDOUT_NAME


def test_graph_is_matmul_add_relu_with_2d_weights(model, record):
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8 and [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.producer_name == "edge_sdk tools/train_mlp.py"
    g = model.graph
    assert [n.op_type for n in g.node] == ["MatMul", "Add", "Relu"] * 2 + ["MatMul", "Add"]
    assert [i.name for i in g.input] == ["x"] and [o.name for o in g.output] == ["logits"]
    assert g.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert g.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert _dims(g.input[0]) == ["batch", 1024] and _dims(g.output[0]) == ["batch", 4]
    inits = {i.name: i for i in g.initializer}
    assert len(inits) == 6
    shapes = []
    for node in g.node:
        if node.op_type == "MatMul":
            a, b = node.input
            assert a not in inits and b in inits  # constant B: what MatMulNBits quantizes
            w = inits[b]
            assert w.data_type == TensorProto.FLOAT and len(w.dims) == 2
            shapes.append(tuple(w.dims))
        elif node.op_type == "Add":
            bias = inits[node.input[1]]
            assert bias.data_type == TensorProto.FLOAT and list(bias.dims) == [shapes[-1][1]]
    assert shapes == [(1024, 512), (512, 512), (512, 4)]
    params = sum(int(np.prod(i.dims)) for i in g.initializer)
    assert params == record["architecture"]["parameters"] == 1024 * 512 + 512 + 512 * 512 + 512 + 512 * 4 + 4
    assert all(np.isfinite(numpy_helper.to_array(i)).all() for i in g.initializer)


def test_holdout_accuracy_matches_record(holdout, record):
    x, labels = holdout
    assert x.dtype == np.float32 and x.shape == (256, 1024)
    assert labels.dtype == np.int64 and labels.shape == (256,)
    assert set(np.unique(labels)) <= {0, 1, 2, 3}
    correct, acc = tm.evaluate(ONNX_PATH.read_bytes(), x, labels)
    assert correct == record["holdout"]["correct"]
    assert abs(acc - record["holdout"]["accuracy"]) <= 1e-9
    assert record["holdout"]["n"] == 256
    assert acc >= 0.9  # a trained model (chance is 0.25)
    assert record["test"]["n"] >= 2000 and record["test"]["accuracy"] >= 0.95


def test_runs_in_ort_with_dynamic_batch(session, holdout):
    x, labels = holdout
    (y,) = session.run(["logits"], {"x": x})
    assert y.shape == (256, 4) and y.dtype == np.float32 and np.isfinite(y).all()
    for n in (1, 7):
        (yn,) = session.run(["logits"], {"x": x[:n]})
        np.testing.assert_allclose(yn, y[:n], rtol=1e-5, atol=1e-5)
    # plain numpy gives the same logits (the graph is exactly three affine layers)
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in onnx.load(str(ONNX_PATH)).graph.initializer}
    h = np.maximum(x @ w["fc1.weight"] + w["fc1.bias"], 0)
    h = np.maximum(h @ w["fc2.weight"] + w["fc2.bias"], 0)
    np.testing.assert_allclose(h @ w["fc3.weight"] + w["fc3.bias"], y, rtol=1e-4, atol=1e-4)


def test_preprocess_reproduces_holdout(holdout, record):
    x, labels = holdout
    seed = record["holdout"]["seed"]
    assert seed not in (record["training"]["seeds"]["train"], record["training"]["seeds"]["test"])
    imgs, y = make_split(seed, record["holdout"]["n"])  # same n: labels are drawn first, all at once
    np.testing.assert_array_equal(y, labels)
    for idx in (slice(0, 5), slice(100, 103), slice(250, 256)):
        np.testing.assert_array_equal(tm.preprocess(imgs[idx]), x[idx])
    np.testing.assert_array_equal(tm.preprocess(imgs[3]), x[3:4])  # one [H, W, 3] image


def test_preprocess_contract():
    import cv2

    imgs, _ = make_split(123, 4)
    out = tm.preprocess(imgs)
    assert out.dtype == np.float32 and out.shape == (4, 1024) and out.flags.c_contiguous
    assert out.min() >= -0.5 and out.max() <= 0.5
    # by hand: OpenCV gray, INTER_AREA to 32x32, /255 - 0.5
    g = cv2.resize(cv2.cvtColor(imgs[2], cv2.COLOR_RGB2GRAY), (32, 32), interpolation=cv2.INTER_AREA)
    np.testing.assert_allclose(out[2], g.reshape(-1) / 255.0 - 0.5, atol=1e-7)
    # any input size is resized to 32x32
    big = np.repeat(np.repeat(imgs[:1], 2, axis=1), 2, axis=2)
    assert tm.preprocess(big).shape == (1, 1024)
    with pytest.raises(ValueError, match="uint8"):
        tm.preprocess(imgs.astype(np.float32))
    with pytest.raises(ValueError, match="RGB"):
        tm.preprocess(imgs[..., 0])


def test_int4_matmulnbits_quantizes_every_matmul(holdout, record, tmp_path):
    """The point of the model: ORT's MatMulNBits quantizer takes all three MatMuls."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(str(ONNX_PATH)), block_size=32, is_symmetric=True)
    q.process()
    qm = q.model.model
    ops = [n.op_type for n in qm.graph.node]
    assert ops.count("MatMulNBits") == 3 and "MatMul" not in ops
    data = qm.SerializeToString()
    assert len(data) < 0.25 * ONNX_PATH.stat().st_size
    x, labels = holdout
    _, acc = tm.evaluate(data, x, labels)
    assert acc >= record["holdout"]["accuracy"] - 0.03


def test_build_onnx_rejects_bad_shapes():
    w = {"w1": np.zeros((4, 3), np.float32), "b1": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match="layer 1"):
        tm.build_onnx(w)


# Training itself needs torch, which is a tool dependency (tools/fixtures/train_mlp.py), not a test one:
# the committed outputs are what the tests above check.
