"""Model: strict input validation, preprocessing, decoding, results, lifecycle,
batches, streams and thread safety — on real ONNX Runtime / LiteRT sessions."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_manifest

import edge_sdk
from converters.packaging import write_package
from edge_sdk import errors
from edge_sdk.package import ImagePreprocess, TensorSpec
from edge_sdk.processing.image import preprocess_image

X = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
F64 = np.ones((1, 8), np.float64)

# (bad input, expected error, message fragment) — each row one misuse
BAD_INPUTS = [
    (F64, errors.InputDTypeError, "expected dtype float32, got float64"),  # no silent cast
    (np.ones((1, 8), np.int32), errors.InputDTypeError, "got int32"),
    (np.ones(8, np.float32), errors.InputShapeError, "expected rank 2"),  # rank
    (np.ones((1, 1, 8), np.float32), errors.InputShapeError, "expected rank 2"),
    (np.ones((1, 7), np.float32), errors.InputShapeError, "expected dim 1 = 8"),  # fixed dim
    (np.ones((9, 8), np.float32), errors.InputShapeError, r"must be in \[1, 8\]"),  # over the bound
    (np.ones((0, 8), np.float32), errors.InputShapeError, r"must be in \[1, 8\].*got 0"),  # batch 0
    (np.array([[np.nan] + [0.0] * 7], np.float32), errors.NonFiniteInputError, "got 1 NaN/Inf of 8"),
    (np.array([[np.inf, -np.inf] * 4], np.float32), errors.NonFiniteInputError, "8 NaN/Inf"),
    (np.ones((8, 2), np.float32).T, errors.NonContiguousInputError, "C-contiguous"),  # a transposed view
    (np.ones((2, 16), np.float32)[:, ::2], errors.NonContiguousInputError, "ascontiguousarray"),
    ([[1.0] * 8], errors.InputTypeError, "got list"),  # lists are not arrays
    ({"x": X, "z": X}, errors.UnexpectedInputError, "unexpected input"),
    ({}, errors.MissingInputError, "missing input 'x'"),
]


@pytest.fixture
def mlp(mlp_package: Path):
    with edge_sdk.load(mlp_package, "generic-x86_64") as m:
        yield m


@pytest.mark.parametrize("x,exc,msg", BAD_INPUTS)
def test_bad_inputs_are_typed_errors(mlp, x, exc, msg) -> None:
    with pytest.raises(exc, match=msg):
        mlp.predict(x)
    assert issubclass(exc, errors.InputError)


def test_bad_input_leaves_caller_array_untouched(mlp) -> None:
    x = F64.copy()
    with pytest.raises(errors.InputDTypeError):
        mlp.predict(x)
    assert x.dtype == np.float64 and (x == 1).all()


def test_predict_matches_numpy_reference(mlp) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    r = mlp.predict(X)
    np.testing.assert_allclose(r.outputs["y"], np.maximum(X @ w + b, 0), rtol=1e-5, atol=1e-6)
    assert r.decoded is None and r.variant_id == "fp32" and r.model_name == "mlp" and r.model_version == "0.1"
    assert len(r.model_sha256) == 64
    t = r.timings
    assert 0 < t.inference_ms <= t.total_ms and t.validate_ms >= 0 and t.preprocess_ms == 0
    assert r.to_dict()["outputs"]["y"]["shape"] == [2, 4]


def test_dict_input_and_memmap_subclass(mlp, tmp_path: Path) -> None:
    mm = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(2, 8))
    mm[:] = X
    a = mlp.predict({"x": X}).outputs["y"]
    b = mlp.predict(mm).outputs["y"]
    np.testing.assert_array_equal(a, b)


def test_close_twice_and_use_after_close(mlp_package: Path) -> None:
    m = edge_sdk.load(mlp_package, "generic-x86_64")
    m.close()
    m.close()
    assert m.closed and m.session.closed
    with pytest.raises(errors.SessionClosedError):
        m.predict(X)
    with pytest.raises(errors.SessionClosedError):
        m.stream()


def test_thread_safe_predict(mlp) -> None:
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(20)]
    want = [mlp.predict(x).outputs["y"] for x in xs]
    errs: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(60):
                j = (i + k) % len(xs)
                np.testing.assert_array_equal(mlp.predict(xs[j]).outputs["y"], want[j])
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errs


def test_predict_batch_stacks_rows(mlp) -> None:
    rng = np.random.default_rng(2)
    items = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(11)]
    res = mlp.predict_batch(items)
    assert [r.batch_size for r in res] == [8] * 8 + [3] * 3  # max batch bound is 8
    for x, r in zip(items, res):
        np.testing.assert_allclose(r.outputs["y"], mlp.predict(x).outputs["y"], rtol=1e-5, atol=1e-6)
    with pytest.raises(errors.InputError, match="empty"):
        mlp.predict_batch([])
    with pytest.raises(errors.InputError, match="batch 1"):
        mlp.predict_batch([X])  # items are single rows
    with pytest.raises(errors.InputDTypeError):
        mlp.predict_batch([items[0], F64])


# -- the demo classifier: preprocessing + classification decoder --------------------------


def test_demo_classifies_bundled_images(demo_package: Path) -> None:
    from edge_sdk.assets import demo_samples

    samples = demo_samples()
    assert len(samples) >= 8
    for vid in ("fp32-onnx", "int8-onnx", "fp32-tflite"):
        with edge_sdk.load(demo_package, "generic-x86_64", variant=vid) as m:
            correct = 0
            for p in samples:
                r = m.predict_image(p)
                assert r.variant_id == vid
                assert len(r.decoded[0]) == 3  # top_k from the manifest
                scores = [c.score for c in r.decoded[0]]
                assert scores == sorted(scores, reverse=True) and 0 <= scores[-1] <= scores[0] <= 1
                correct += r.top1.label == p.stem.rsplit("_", 1)[0]
                assert r.timings.preprocess_ms > 0
            assert correct >= len(samples) - 2, (vid, correct)


def test_demo_backends_agree(demo_package: Path) -> None:
    # The same trained weights in NCHW ONNX and NHWC TFLite give the same logits.
    from edge_sdk.assets import demo_samples

    img = demo_samples()[0]
    with edge_sdk.load(demo_package, "generic-x86_64", variant="fp32-onnx") as a, edge_sdk.load(
        demo_package, "generic-x86_64", variant="fp32-tflite"
    ) as b:
        np.testing.assert_allclose(a.predict_image(img).outputs["logits"], b.predict_image(img).outputs["logits"], rtol=1e-4, atol=1e-4)


def test_predict_image_color_order_and_errors(demo_package: Path) -> None:
    from edge_sdk.assets import demo_samples
    from edge_sdk.processing.image import load_image

    rgb = load_image(demo_samples()[0])
    with edge_sdk.load(demo_package, "generic-x86_64", variant="fp32-onnx") as m:
        a = m.predict_image(rgb).outputs["logits"]
        b = m.predict_image(np.ascontiguousarray(rgb[:, :, ::-1]), color="BGR").outputs["logits"]
        np.testing.assert_allclose(a, b, rtol=1e-6)
        with pytest.raises(errors.ImageError, match="dtype uint8"):
            m.predict_image(rgb.astype(np.float32))
        with pytest.raises(errors.ImageError, match="HxWx3"):
            m.predict_image(np.zeros((4, 4, 5), np.uint8))
        with pytest.raises(errors.ImageError, match="does not exist"):
            m.predict_image("/nonexistent.png")
        with pytest.raises(errors.InputShapeError):
            m.predict(np.zeros((1, 3, 31, 32), np.float32))


def test_prepare_then_predict_prepared_is_predict_image(demo_package: Path) -> None:
    from edge_sdk.assets import demo_samples
    from edge_sdk.processing.image import load_image_bgr

    bgr = load_image_bgr(demo_samples()[1])
    with edge_sdk.load(demo_package, "generic-x86_64", variant="fp32-onnx") as m, edge_sdk.load(
        demo_package, "generic-x86_64", variant="fp32-tflite"
    ) as other:
        prepared = m.prepare_image(bgr, color="BGR")
        assert isinstance(prepared, edge_sdk.PreparedImage) and prepared.model is m
        assert prepared.preprocess_ns > 0 and prepared.validate_ns >= 0
        a, b = m.predict_prepared(prepared), m.predict_image(bgr, color="BGR")
        np.testing.assert_array_equal(a.outputs["logits"], b.outputs["logits"])
        assert a.top1 == b.top1 and a.transform == b.transform
        t = a.timings
        assert t.preprocess_ms > 0 and t.total_ms >= t.preprocess_ms + t.inference_ms
        assert m.predict_prepared(prepared).top1 == a.top1  # reusable
        with pytest.raises(errors.InputError, match="made by another model"):
            other.predict_prepared(prepared)
        with pytest.raises(errors.InputError, match="expected a PreparedImage"):
            m.predict_prepared({"image": prepared.feeds})
        with pytest.raises(errors.ImageError, match="HxWx3"):
            m.prepare_image(np.zeros((4, 4, 5), np.uint8))



def test_run_prepared_then_decode_inferred_is_predict_prepared(demo_package: Path) -> None:
    """The two halves the pipeline's decode="output" uses give predict_prepared's result."""
    from edge_sdk.assets import demo_samples
    from edge_sdk.processing.image import load_image_bgr

    bgr = load_image_bgr(demo_samples()[1])
    with edge_sdk.load(demo_package, "generic-x86_64", variant="fp32-onnx") as m, edge_sdk.load(
        demo_package, "generic-x86_64", variant="fp32-tflite"
    ) as other:
        assert m.decodes is True
        prepared = m.prepare_image(bgr, color="BGR")
        inferred = m.run_prepared(prepared)
        assert isinstance(inferred, edge_sdk.InferredImage) and inferred.model is m
        assert inferred.t0 <= inferred.t_ready <= inferred.t_ran and not inferred.hit
        a, b = m.decode_inferred(inferred, top_k=2), m.predict_prepared(prepared, top_k=2)
        np.testing.assert_array_equal(a.outputs["logits"], b.outputs["logits"])
        assert a.top1 == b.top1 and a.transform == b.transform
        assert a.decoded == b.decoded and len(a.decoded[0]) == 2  # top_k applied
        t = a.timings
        assert t.preprocess_ms > 0 and t.inference_ms > 0 and t.decode_ms >= 0
        time.sleep(0.05)  # a wait between run and decode is not counted
        late = m.decode_inferred(inferred).timings
        assert late.total_ms < 50 and late.total_ms == pytest.approx(
            late.preprocess_ms + late.validate_ms + late.inference_ms + late.decode_ms, abs=0.01
        )
        with pytest.raises(errors.InputError, match="made by another model"):
            other.run_prepared(prepared)
        with pytest.raises(errors.InputError, match="run by another model"):
            other.decode_inferred(inferred)
        with pytest.raises(errors.InputError, match="expected a PreparedImage"):
            m.run_prepared(inferred)
        with pytest.raises(errors.InputError, match="expected an InferredImage"):
            m.decode_inferred(prepared)


# (resize mode, source shape, expected transform scale, pad)
RESIZE = [
    ("stretch", (40, 80), (32 / 80, 32 / 40), (0.0, 0.0)),
    ("letterbox", (40, 80), (0.4, 0.4), (0.0, 8.0)),  # 80x40 -> 32x16, 8 px bars top and bottom
    ("center_crop", (40, 80), None, None),
]


@pytest.mark.parametrize("mode,src,scale,pad", RESIZE)
def test_preprocess_modes(mode, src, scale, pad) -> None:
    spec = TensorSpec(
        "img", "float32", (1, 3, 32, 32), "NCHW", preprocess=ImagePreprocess((32, 32), resize=mode, mean=(0.5,) * 3, std=(0.5,) * 3, pad_value=0)
    )
    img = np.full((*src, 3), 255, np.uint8)
    x, tf = preprocess_image(img, spec)
    assert x.shape == (1, 3, 32, 32) and x.dtype == np.float32 and x.flags.c_contiguous
    if scale is not None:
        assert tf.scale_xy == pytest.approx(scale) and tf.pad_xy == pytest.approx(pad)
    if mode == "letterbox":
        assert x[0, :, :8].max() == pytest.approx(-1.0) and x[0, :, 8:24].min() == pytest.approx(1.0)
    else:
        assert np.allclose(x, 1.0)


def test_preprocess_quantized_dtypes_and_layouts() -> None:
    pre = ImagePreprocess((4, 4))
    img = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    u8, _ = preprocess_image(img, TensorSpec("i", "uint8", (1, 4, 4, 3), "NHWC", preprocess=pre))
    np.testing.assert_array_equal(u8[0], img)  # same size: pixels untouched
    i8, _ = preprocess_image(img, TensorSpec("i", "int8", (1, 3, 4, 4), "NCHW", preprocess=pre))
    np.testing.assert_array_equal(i8[0], (img.astype(np.int16) - 128).astype(np.int8).transpose(2, 0, 1))


# -- streaming state ------------------------------------------------------------------------


def _accumulator_onnx() -> bytes:
    """y = x + h_in; h_out = h_in + x (a running sum)."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Add", ["x", "h_in"], ["y"]), helper.make_node("Identity", ["y"], ["h_out"])],
        "acc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]), helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]), helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_streams_keep_state_apart(tmp_path: Path) -> None:
    t = {"dtype": "float32", "shape": [1, 4]}
    write_package(
        tmp_path / "acc",
        {
            "name": "acc", "version": "1", "task": "raw",
            "inputs": [dict(t, name="x"), dict(t, name="h_in")],
            "outputs": [dict(t, name="y"), dict(t, name="h_out")],
            "state": [{"input": "h_in", "output": "h_out", "initial": 0.0}],
            "variants": [{"id": "fp32", "file": "a.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },  # fmt: skip
        {"a.onnx": _accumulator_onnx()},
    )
    with edge_sdk.load(tmp_path / "acc", "generic-x86_64") as m:
        s1, s2 = m.stream(), m.stream()
        one = np.ones((1, 4), np.float32)
        for _ in range(3):
            s1.predict(one)
        r2 = s2.predict(one * 10)
        r1 = s1.predict(one)
        np.testing.assert_array_equal(r1.outputs["y"], one * 4)
        np.testing.assert_array_equal(r2.outputs["y"], one * 10)
        s1.reset()
        np.testing.assert_array_equal(s1.predict(one).outputs["y"], one)
        with pytest.raises(errors.InputError, match="fed by the stream"):
            s1.predict({"x": one, "h_in": one})
        # without a stream, the state input is an ordinary (required) input
        with pytest.raises(errors.MissingInputError, match="h_in"):
            m.predict({"x": one})


def test_load_options_are_validated(mlp_package: Path) -> None:
    with pytest.raises(TypeError):
        edge_sdk.load(mlp_package, "generic-x86_64", thread=2)  # typo: unknown option
    with pytest.raises(ValueError, match="threads"):
        edge_sdk.load(mlp_package, "generic-x86_64", threads=0)


def test_fp16_model_validation(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])],
        "sq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4])],
    )
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mp.ir_version = 8
    m = mlp_manifest(4, 4)
    m["inputs"] = [{"name": "x", "dtype": "float16", "shape": [1, 4]}]
    m["outputs"] = [{"name": "y", "dtype": "float16", "shape": [1, 4]}]
    m["variants"][0]["precision"] = "fp16"
    write_package(tmp_path / "p", m, {"m.onnx": mp.SerializeToString()})
    prof = edge_sdk.load_profile("jetson-orin-nano")  # a profile that lists fp16
    with edge_sdk.load(tmp_path / "p", prof) as model:
        y = model.predict(np.full((1, 4), 3, np.float16)).outputs["y"]
        assert y.dtype == np.float16 and (y == 9).all()
        with pytest.raises(errors.InputDTypeError, match="float16"):
            model.predict(np.full((1, 4), 3, np.float32))
        with pytest.raises(errors.NonFiniteInputError):
            model.predict(np.array([[np.inf, 0, 0, 0]], np.float16))


@pytest.mark.parametrize("classes", [2, 4, 31, 32, 33, 100])  # both sides of the Python/numpy switch
@pytest.mark.parametrize("apply_softmax", [True, False])
def test_classification_decoder(classes: int, apply_softmax: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_sdk.processing import decoders as d

    rng = np.random.default_rng(classes)
    x = rng.standard_normal((3, classes)).astype(np.float32)
    x[0, 1] = x[0, 0] = x[0].max() + 1  # a tie at the top: the lower index comes first
    labels = [f"c{i}" for i in range(classes - 1)]  # one class without a label
    got = d.decode_classification(x, labels, top_k=5, apply_softmax=apply_softmax)
    p = np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True) if apply_softmax else x
    for row, pr in zip(got, p):
        assert len(row) == min(5, classes)
        want = sorted(range(classes), key=lambda i: (-pr[i], i))[: len(row)]
        assert [c.index for c in row] == want
        assert [c.score for c in row] == pytest.approx([float(pr[i]) for i in want], rel=1e-5)
        assert [c.label for c in row] == [labels[i] if i < len(labels) else str(i) for i in want]
    assert [c.index for c in got[0][:2]] == [0, 1]
    monkeypatch.setattr(d, "_SMALL", 0)  # the numpy path gives the same answer
    other = d.decode_classification(x, labels, top_k=5, apply_softmax=apply_softmax)
    assert [[c.index for c in r] for r in other] == [[c.index for c in r] for r in got]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_finite_check_is_exact_when_the_sum_overflows(dtype: str) -> None:
    # The fast path sums the input; a sum that overflows must not reject finite values,
    # and NaN/Inf anywhere must still be caught (no warnings either way).
    import warnings

    from edge_sdk.validation import InputValidator

    v = InputValidator([TensorSpec("x", dtype, (1, 4))])
    big = np.finfo(dtype).max
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v(np.array([[big, big, big, 1]], dtype))
        for bad in (np.nan, np.inf, -np.inf):
            with pytest.raises(errors.NonFiniteInputError, match="got 1 NaN/Inf of 4"):
                v(np.array([[1, bad, 2, 3]], dtype))


def test_check_finite_opt_out(mlp_package: Path) -> None:
    nan = np.array([[np.nan] + [0.0] * 7], np.float32)
    with edge_sdk.load(mlp_package, "generic-x86_64", check_finite=False) as m:
        assert m.predict(nan).outputs["y"].shape == (1, 4)  # runs: the caller vouched for its inputs
        with pytest.raises(errors.InputDTypeError):
            m.predict(F64)  # every other check still applies
    with edge_sdk.load(mlp_package, "generic-x86_64") as m:
        with pytest.raises(errors.NonFiniteInputError):
            m.predict(nan)


@pytest.mark.parametrize("interp,cv_flag", [("linear", "INTER_LINEAR"), ("area", "INTER_AREA"), ("nearest", "INTER_NEAREST"), ("cubic", "INTER_CUBIC")])
def test_preprocess_interpolation_is_the_manifests(interp: str, cv_flag: str) -> None:
    import cv2

    img = np.random.default_rng(3).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    spec = TensorSpec("i", "uint8", (1, 20, 20, 3), "NHWC", preprocess=ImagePreprocess((20, 20), interpolation=interp))
    x, _ = preprocess_image(img, spec)
    np.testing.assert_array_equal(x[0], cv2.resize(img, (20, 20), interpolation=getattr(cv2, cv_flag)))
    f = TensorSpec("i", "float32", (1, 3, 20, 20), "NCHW", preprocess=ImagePreprocess((20, 20), interpolation=interp, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4)))
    y, _ = preprocess_image(img, f)
    ref = (cv2.resize(img, (20, 20), interpolation=getattr(cv2, cv_flag)).astype(np.float64) / 255 - [0.5, 0.4, 0.3]) / [0.2, 0.3, 0.4]
    np.testing.assert_allclose(y[0], ref.transpose(2, 0, 1), rtol=1e-5, atol=1e-5)
