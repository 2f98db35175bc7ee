"""Tests for converters.tflite_writer: build .tflite models and run them in LiteRT.

Every model is executed with ``ai_edge_litert.interpreter.Interpreter`` and
compared against numpy reference implementations written here (NHWC
activations, OHWI conv weights, 1HWO depthwise weights, OI dense weights).
Float graphs run on three op resolvers: the default (XNNPACK delegate), the
optimized builtin kernels without delegates, and the reference kernels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("flatbuffers")
litert_interpreter = pytest.importorskip("ai_edge_litert.interpreter")
schema = pytest.importorskip("ai_edge_litert.schema_py_generated")

from converters.tflite_writer import QuantParams, Tensor, TFLiteBuilder, TFLiteBuildError  # noqa: E402

Interpreter = litert_interpreter.Interpreter
OpResolverType = litert_interpreter.OpResolverType

RESOLVERS = [
    pytest.param(OpResolverType.AUTO, id="xnnpack"),
    pytest.param(OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, id="builtin"),
    pytest.param(OpResolverType.BUILTIN_REF, id="reference"),
]
FLOAT_TOL = {"rtol": 1e-5, "atol": 1e-5}


# --------------------------------------------------------------------------
# numpy reference implementations (float64)
# --------------------------------------------------------------------------


def _window_geometry(size: int, kernel: int, stride: int, dilation: int, padding: str) -> tuple[int, int, int]:
    """(output size, padding before, padding after) with TensorFlow's SAME/VALID rules."""
    effective = (kernel - 1) * dilation + 1
    if padding == "SAME":
        out = math.ceil(size / stride)
        total = max((out - 1) * stride + effective - size, 0)
        return out, total // 2, total - total // 2
    return (size - effective) // stride + 1, 0, 0


def _patches(x, kh, kw, stride, dilation, padding, pad_value=0.0):
    """Yield (i, j, patch) with patch[n, oh, ow, c] = padded input under tap (i, j)."""
    (sh, sw), (dh, dw) = stride, dilation
    n, h, w, c = x.shape
    oh, top, bottom = _window_geometry(h, kh, sh, dh, padding)
    ow, left, right = _window_geometry(w, kw, sw, dw, padding)
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=pad_value)
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw, :]


def activate(y, activation: str):
    if activation == "RELU":
        return np.maximum(y, 0.0)
    if activation == "RELU6":
        return np.clip(y, 0.0, 6.0)
    assert activation == "NONE"
    return y


def ref_conv2d(x, w_ohwi, bias, stride=(1, 1), padding="SAME", dilation=(1, 1), activation="NONE"):
    x = np.asarray(x, np.float64)
    w = np.asarray(w_ohwi, np.float64)
    out = 0.0
    for i, j, patch in _patches(x, w.shape[1], w.shape[2], stride, dilation, padding):
        out = out + np.einsum("nhwc,oc->nhwo", patch, w[:, i, j, :])
    return activate(out + np.asarray(bias, np.float64), activation)


def ref_depthwise_conv2d(x, w_1hwo, bias, stride=(1, 1), padding="SAME", dilation=(1, 1), activation="NONE"):
    x = np.asarray(x, np.float64)
    w = np.asarray(w_1hwo, np.float64)
    multiplier = w.shape[3] // x.shape[3]
    out = 0.0
    for i, j, patch in _patches(x, w.shape[1], w.shape[2], stride, dilation, padding):
        out = out + np.repeat(patch, multiplier, axis=3) * w[0, i, j, :]
    return activate(out + np.asarray(bias, np.float64), activation)


def ref_max_pool2d(x, size, stride, padding):
    x = np.asarray(x, np.float64)
    out = -np.inf
    for _, _, patch in _patches(x, size[0], size[1], stride, (1, 1), padding, pad_value=-np.inf):
        out = np.maximum(out, patch)
    return out


def ref_avg_pool2d(x, size, stride, padding):
    """Average over the valid (unpadded) positions of each window, as TFLite does."""
    x = np.asarray(x, np.float64)
    total, count = 0.0, 0.0
    ones = np.ones_like(x)
    for (_, _, patch), (_, _, mask) in zip(
        _patches(x, size[0], size[1], stride, (1, 1), padding),
        _patches(ones, size[0], size[1], stride, (1, 1), padding),
    ):
        total, count = total + patch, count + mask
    return total / count


def ref_fully_connected(x, w_oi, bias, activation="NONE"):
    x = np.asarray(x, np.float64)
    return activate(x.reshape(-1, w_oi.shape[1]) @ np.asarray(w_oi, np.float64).T + bias, activation)


def ref_softmax(x, beta=1.0):
    z = beta * np.asarray(x, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def quantize(x, scale, zero_point):
    return np.clip(np.rint(np.asarray(x, np.float64) / scale) + zero_point, -128, 127).astype(np.int8)


def dequantize(q, scale, zero_point):
    return (q.astype(np.float64) - zero_point) * scale


def choose_qparams(values, margin=1.1) -> tuple[float, int]:
    """Asymmetric int8 (scale, zero_point) covering ``values`` (and 0) with some headroom."""
    low = min(float(np.min(values)) * margin, 0.0)
    high = max(float(np.max(values)) * margin, 0.0)
    scale = (high - low) / 255.0
    return scale, int(np.clip(round(-128 - low / scale), -128, 127))


def spec_weight_quant(w, axis):
    """Per-channel symmetric int8 as the quantization spec defines it."""
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis)
    scales = (np.abs(w).max(axis=reduce_axes) / 127.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    return np.clip(np.rint(w / scales.astype(np.float64).reshape(shape)), -127, 127).astype(np.int8), scales


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def make_interpreter(model: bytes, resolver=OpResolverType.AUTO) -> Interpreter:
    interpreter = Interpreter(model_content=model, experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    return interpreter


def run(model: bytes, *inputs: np.ndarray, resolver=OpResolverType.AUTO) -> list[np.ndarray]:
    interpreter = make_interpreter(model, resolver)
    details = interpreter.get_input_details()
    assert len(details) == len(inputs)
    for detail, value in zip(details, inputs):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]


def run_single(build, x: np.ndarray, resolver=OpResolverType.AUTO) -> np.ndarray:
    """Build a one-input model with ``build(builder, input) -> output`` and run it on ``x``."""
    b = TFLiteBuilder()
    inp = b.input("x", x.shape, str(x.dtype))
    out = b.output(build(b, inp), "y")
    (y,) = run(b.build(), x, resolver=resolver)
    assert out.shape == y.shape, "the shape the builder declared differs from the one LiteRT computed"
    return y


def read_model(model: bytes):
    return schema.ModelT.InitFromPackedBuf(bytearray(model), 0)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# --------------------------------------------------------------------------
# the references themselves
# --------------------------------------------------------------------------


def test_reference_conv_matches_naive_loops(rng):
    """The oracle is checked against a direct 7-loop convolution (SAME, stride 2, dilation 2)."""
    x = rng.normal(size=(2, 7, 6, 3))
    w = rng.normal(size=(4, 3, 2, 3))
    b = rng.normal(size=4)
    stride, dilation = (2, 1), (2, 2)
    got = ref_conv2d(x, w, b, stride, "SAME", dilation)
    oh, top, _ = _window_geometry(7, 3, 2, 2, "SAME")
    ow, left, _ = _window_geometry(6, 2, 1, 2, "SAME")
    want = np.zeros((2, oh, ow, 4))
    for n in range(2):
        for r in range(oh):
            for c in range(ow):
                for o in range(4):
                    acc = b[o]
                    for i in range(3):
                        for j in range(2):
                            hi, wj = r * 2 + i * 2 - top, c * 1 + j * 2 - left
                            if 0 <= hi < 7 and 0 <= wj < 6:
                                acc += x[n, hi, wj, :] @ w[o, i, j, :]
                    want[n, r, c, o] = acc
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------
# float32 ops
# --------------------------------------------------------------------------


@pytest.mark.parametrize("resolver", RESOLVERS)
@pytest.mark.parametrize(
    "stride,padding,dilation,activation",
    [
        ((1, 1), "SAME", (1, 1), "NONE"),
        ((2, 1), "SAME", (1, 1), "RELU"),
        ((2, 2), "VALID", (1, 1), "RELU6"),
        ((1, 1), "SAME", (2, 1), "NONE"),
    ],
)
def test_conv2d_matches_numpy(rng, resolver, stride, padding, dilation, activation):
    x = rng.normal(size=(2, 9, 8, 3)).astype(np.float32)
    w = rng.normal(scale=0.5, size=(5, 3, 2, 3)).astype(np.float32)  # non-square kernel: H/W mix-ups show
    bias = rng.normal(size=5).astype(np.float32)
    y = run_single(
        lambda b, t: b.conv2d(
            t, w, bias, stride=stride, padding=padding, dilation=dilation, activation=activation
        ),
        x,
        resolver,
    )
    want = ref_conv2d(x, w, bias, stride, padding, dilation, activation)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, **FLOAT_TOL)
    if activation == "RELU6":
        assert (want > 6).any() or (want <= 0).any()  # the clamp is exercised


@pytest.mark.parametrize("resolver", RESOLVERS)
@pytest.mark.parametrize(
    "multiplier,stride,padding,dilation",
    [(1, (1, 1), "SAME", (1, 1)), (2, (2, 2), "SAME", (1, 1)), (3, (1, 2), "VALID", (1, 1)), (1, (1, 1), "SAME", (2, 2))],
)
def test_depthwise_conv2d_matches_numpy(rng, resolver, multiplier, stride, padding, dilation):
    x = rng.normal(size=(2, 8, 7, 4)).astype(np.float32)
    w = rng.normal(size=(1, 3, 2, 4 * multiplier)).astype(np.float32)
    bias = rng.normal(size=4 * multiplier).astype(np.float32)
    y = run_single(
        lambda b, t: b.depthwise_conv2d(
            t, w, bias, stride=stride, padding=padding, dilation=dilation, activation="RELU6"
        ),
        x,
        resolver,
    )
    want = ref_depthwise_conv2d(x, w, bias, stride, padding, dilation, "RELU6")
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, **FLOAT_TOL)


@pytest.mark.parametrize("resolver", RESOLVERS)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("size,stride,padding", [((2, 2), (2, 2), "VALID"), ((3, 2), (2, 1), "SAME")])
def test_pooling_matches_numpy(rng, resolver, kind, size, stride, padding):
    x = rng.normal(size=(2, 7, 6, 3)).astype(np.float32)
    if kind == "max":
        y = run_single(lambda b, t: b.max_pool2d(t, size, stride, padding=padding), x, resolver)
        want = ref_max_pool2d(x, size, stride, padding)
    else:
        y = run_single(lambda b, t: b.avg_pool2d(t, size, stride, padding=padding), x, resolver)
        want = ref_avg_pool2d(x, size, stride, padding)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, **FLOAT_TOL)


@pytest.mark.parametrize("resolver", RESOLVERS)
@pytest.mark.parametrize("axes,keepdims", [((1, 2), False), ((1, 2), True), ((-1,), False), ((0, 3), True)])
def test_mean_matches_numpy(rng, resolver, axes, keepdims):
    x = rng.normal(size=(2, 5, 4, 3)).astype(np.float32)
    y = run_single(lambda b, t: b.mean(t, axes, keepdims), x, resolver)
    want = np.asarray(x, np.float64).mean(axis=axes, keepdims=keepdims)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, **FLOAT_TOL)


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_add_broadcast_activation_and_two_inputs(rng, resolver):
    a = rng.normal(size=(2, 4, 4, 3)).astype(np.float32) * 5
    c = rng.normal(size=(3,)).astype(np.float32)
    d = rng.normal(size=(2, 4, 4, 3)).astype(np.float32)
    b = TFLiteBuilder()
    ta = b.input("a", a.shape)
    td = b.input("d", d.shape)
    s = b.add(ta, c, activation="RELU6")  # numpy constant, broadcast on the channel axis
    b.output(b.add(s, td), "sum")
    b.output(b.relu(td), "relu")
    b.output(b.relu6(ta), "relu6")
    out_sum, out_relu, out_relu6 = run(b.build(), a, d, resolver=resolver)
    np.testing.assert_allclose(out_sum, np.clip(a + c, 0, 6) + d, **FLOAT_TOL)
    np.testing.assert_allclose(out_relu, np.maximum(d, 0), **FLOAT_TOL)
    np.testing.assert_allclose(out_relu6, np.clip(a, 0, 6), **FLOAT_TOL)
    assert (a > 6).any() and (a < 0).any()


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_fully_connected_reshape_softmax(rng, resolver):
    x = rng.normal(size=(3, 2, 2, 5)).astype(np.float32)
    w = rng.normal(size=(7, 20)).astype(np.float32)
    bias = rng.normal(size=7).astype(np.float32)
    w2 = rng.normal(size=(4, 7)).astype(np.float32)

    def build(b, t):
        flat = b.reshape(t, (3, -1))
        hidden = b.fully_connected(flat, w, bias, activation="RELU")
        logits = b.fully_connected(hidden, w2)  # no bias: zeros
        return b.softmax(logits, beta=0.5)

    y = run_single(build, x, resolver)
    hidden = ref_fully_connected(x.reshape(3, 20), w, bias, "RELU")
    want = ref_softmax(ref_fully_connected(hidden, w2, np.zeros(4)), beta=0.5)
    assert y.shape == (3, 4)
    np.testing.assert_allclose(y, want, **FLOAT_TOL)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_fully_connected_keep_num_dims(rng, resolver):
    x = rng.normal(size=(2, 3, 6)).astype(np.float32)
    w = rng.normal(size=(4, 6)).astype(np.float32)
    b = TFLiteBuilder()
    b.output(b.fully_connected(b.input("x", x.shape), w, keep_num_dims=True), "y")
    model = b.build()
    (code,) = read_model(model).operatorCodes
    assert (code.builtinCode, code.version) == (schema.BuiltinOperator.FULLY_CONNECTED, 5)  # keep_num_dims
    (y,) = run(model, x, resolver=resolver)
    assert y.shape == (2, 3, 4)
    np.testing.assert_allclose(y, np.asarray(x, np.float64) @ w.T, **FLOAT_TOL)


def small_cnn(b: TFLiteBuilder, x: Tensor, p: dict[str, np.ndarray]) -> Tensor:
    """conv(RELU) -> maxpool -> depthwise(RELU6) + residual add -> mean -> fc -> softmax."""
    y = b.conv2d(x, p["w1"], p["b1"], stride=1, padding="SAME", activation="RELU")
    y = b.max_pool2d(y, size=(2, 2), stride=(2, 2), padding="VALID")
    z = b.depthwise_conv2d(y, p["wd"], p["bd"], padding="SAME", activation="RELU6")
    y = b.add(y, z)
    y = b.mean(y, axes=(1, 2), keepdims=False)
    y = b.fully_connected(y, p["wf"], p["bf"], activation="NONE")
    y = b.reshape(y, (-1, p["wf"].shape[0]))
    return b.softmax(y)


def ref_small_cnn(x, p):
    y = ref_conv2d(x, p["w1"], p["b1"], activation="RELU")
    y = ref_max_pool2d(y, (2, 2), (2, 2), "VALID")
    y = y + ref_depthwise_conv2d(y, p["wd"], p["bd"], activation="RELU6")
    y = y.mean(axis=(1, 2))
    return ref_softmax(ref_fully_connected(y, p["wf"], p["bf"]))


@pytest.fixture
def cnn_params(rng) -> dict[str, np.ndarray]:
    return {
        "w1": rng.normal(scale=0.4, size=(8, 3, 3, 3)).astype(np.float32),
        "b1": rng.normal(scale=0.1, size=8).astype(np.float32),
        "wd": rng.normal(scale=0.4, size=(1, 3, 3, 8)).astype(np.float32),
        "bd": rng.normal(scale=0.1, size=8).astype(np.float32),
        "wf": rng.normal(scale=0.5, size=(10, 8)).astype(np.float32),
        "bf": rng.normal(scale=0.1, size=10).astype(np.float32),
    }


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_small_cnn_end_to_end(rng, resolver, cnn_params):
    x = rng.normal(size=(1, 16, 16, 3)).astype(np.float32)
    b = TFLiteBuilder(description="small cnn")
    inp = b.input("image", (1, 16, 16, 3), dtype="float32")
    b.output(small_cnn(b, inp, cnn_params), "probs")
    (y,) = run(b.build(), x, resolver=resolver)
    np.testing.assert_allclose(y, ref_small_cnn(x, cnn_params), **FLOAT_TOL)


def test_layout_mistake_is_detected(rng):
    """Negative control: HWIO weights fed as OHWI produce a model that does not match.

    Proves the float comparisons have the power to catch layout bugs.
    """
    x = rng.normal(size=(1, 6, 6, 3)).astype(np.float32)
    w_ohwi = rng.normal(size=(3, 3, 3, 3)).astype(np.float32)
    bias = np.zeros(3, np.float32)
    wrong = np.ascontiguousarray(w_ohwi.transpose(1, 2, 3, 0))  # HWIO, same shape here
    y = run_single(lambda b, t: b.conv2d(t, wrong, bias), x)
    assert not np.allclose(y, ref_conv2d(x, w_ohwi, bias), **FLOAT_TOL)


# --------------------------------------------------------------------------
# dynamic batch
# --------------------------------------------------------------------------


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_dynamic_batch_resize(rng, resolver, cnn_params):
    b = TFLiteBuilder()
    inp = b.input("image", (1, 16, 16, 3), shape_signature=(-1, 16, 16, 3))
    out = b.output(small_cnn(b, inp, cnn_params), "probs")
    assert out.shape == (1, 10) and out.shape_signature == (-1, 10)
    model = b.build()

    interpreter = make_interpreter(model, resolver)
    detail = interpreter.get_input_details()[0]
    assert list(detail["shape"]) == [1, 16, 16, 3]
    assert list(detail["shape_signature"]) == [-1, 16, 16, 3]
    assert list(interpreter.get_output_details()[0]["shape_signature"]) == [-1, 10]

    x = rng.normal(size=(5, 16, 16, 3)).astype(np.float32)
    interpreter.resize_tensor_input(detail["index"], [5, 16, 16, 3], strict=True)
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    y = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    assert y.shape == (5, 10)
    np.testing.assert_allclose(y, ref_small_cnn(x, cnn_params), **FLOAT_TOL)

    # Only the -1 dimension may be resized in strict mode (LiteRT raises RuntimeError,
    # although the docstring promises ValueError).
    with pytest.raises((ValueError, RuntimeError), match="unknown dimensions"):
        interpreter.resize_tensor_input(detail["index"], [5, 8, 16, 3], strict=True)


def test_static_input_has_no_signature_override(rng):
    b = TFLiteBuilder()
    b.output(b.relu(b.input("x", (2, 3))), "y")
    detail = make_interpreter(b.build()).get_input_details()[0]
    assert list(detail["shape_signature"]) == [2, 3]


# --------------------------------------------------------------------------
# int8
# --------------------------------------------------------------------------


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_int8_fully_connected_per_channel_is_bit_accurate(rng, resolver):
    """int8 in -> FC (per-channel int8 weights, int32 bias) -> int8 out, vs. integer arithmetic."""
    in_scale, in_zp = 0.04, 7
    x_q = rng.integers(-128, 128, size=(4, 16)).astype(np.int8)
    w = rng.normal(size=(6, 16)) * np.array([0.1, 1.0, 3.0, 0.5, 0.02, 2.0])[:, None]  # very different ranges
    bias = rng.normal(size=6)
    float_ref = ref_fully_connected(dequantize(x_q, in_scale, in_zp), w, bias)
    out_scale, out_zp = choose_qparams(float_ref)

    b = TFLiteBuilder()
    x = b.input("x", (4, 16), dtype="int8", quant=(in_scale, in_zp))
    y = b.fully_connected(x, w, bias, out_quant=(out_scale, out_zp), name="fc")
    b.output(y, "y")
    model = b.build()
    interpreter = make_interpreter(model, resolver)

    in_detail = interpreter.get_input_details()[0]
    assert in_detail["dtype"] == np.int8
    scale, zp = in_detail["quantization"]
    assert scale == pytest.approx(in_scale, rel=1e-7) and zp == in_zp
    out_detail = interpreter.get_output_details()[0]
    assert out_detail["dtype"] == np.int8
    assert out_detail["quantization"][0] == pytest.approx(out_scale, rel=1e-7)
    assert out_detail["quantization"][1] == out_zp

    # Weights/bias stored the way the quantization spec says.
    tensors = {t["name"]: t for t in interpreter.get_tensor_details()}
    w_want, w_scales = spec_weight_quant(w, axis=0)
    w_detail = tensors["fc/weights"]
    assert w_detail["dtype"] == np.int8
    np.testing.assert_array_equal(interpreter.get_tensor(w_detail["index"]), w_want)
    np.testing.assert_allclose(w_detail["quantization_parameters"]["scales"], w_scales, rtol=1e-7)
    np.testing.assert_array_equal(w_detail["quantization_parameters"]["zero_points"], 0)
    assert w_detail["quantization_parameters"]["quantized_dimension"] == 0
    b_detail = tensors["fc/bias"]
    assert b_detail["dtype"] == np.int32
    bias_scales = np.float32(in_scale).astype(np.float64) * w_scales.astype(np.float64)
    np.testing.assert_allclose(b_detail["quantization_parameters"]["scales"], bias_scales, rtol=1e-6)
    b_q = interpreter.get_tensor(b_detail["index"])
    np.testing.assert_array_equal(b_q, np.rint(bias / bias_scales).astype(np.int32))

    interpreter.set_tensor(in_detail["index"], x_q)
    interpreter.invoke()
    y_q = interpreter.get_tensor(out_detail["index"])

    acc = (x_q.astype(np.int64) - in_zp) @ w_want.astype(np.int64).T + b_q
    int_ref = np.clip(np.rint(acc * bias_scales / np.float32(out_scale)) + out_zp, -128, 127)
    assert np.abs(y_q.astype(np.int64) - int_ref).max() <= 1  # fixed-point multiplier rounding only
    # Against the float model: one output step (rounding + multiplier) plus the
    # worst case the int8 weights and int32 bias can add.
    x_f = dequantize(x_q, in_scale, in_zp)
    tol = out_scale + np.abs(x_f) @ np.broadcast_to(w_scales[:, None] / 2, w.shape).T + bias_scales / 2
    err = np.abs(dequantize(y_q, out_scale, out_zp) - float_ref)
    assert np.all(err <= tol), (err.max(), out_scale)
    assert err.max() <= 2.0 * out_scale, (err.max(), out_scale)


@pytest.mark.parametrize("resolver", RESOLVERS)
@pytest.mark.parametrize("kind", ["conv2d", "depthwise_conv2d"])
def test_int8_conv_per_channel_is_bit_accurate(rng, resolver, kind):
    in_scale, in_zp = 0.05, -3
    x_q = rng.integers(-128, 128, size=(2, 7, 6, 4)).astype(np.int8)
    x_f = dequantize(x_q, in_scale, in_zp)
    if kind == "conv2d":
        w = rng.normal(size=(5, 3, 2, 4)) * np.array([0.1, 1.0, 2.0, 0.3, 0.05])[:, None, None, None]
        axis, stride = 0, (2, 1)
        ref = ref_conv2d
    else:
        w = rng.normal(size=(1, 3, 2, 8)) * np.linspace(0.05, 2.0, 8)
        axis, stride = 3, (1, 2)
        ref = ref_depthwise_conv2d
    channels = w.shape[axis]
    bias = rng.normal(size=channels)
    float_ref = ref(x_f, w, bias, stride, "SAME", (1, 1), "RELU")
    out_scale, out_zp = choose_qparams(float_ref)

    b = TFLiteBuilder()
    x = b.input("x", x_q.shape, dtype="int8", quant=(in_scale, in_zp))
    op = getattr(b, kind)
    b.output(op(x, w, bias, stride=stride, activation="RELU", out_quant=(out_scale, out_zp), name="op"), "y")
    interpreter = make_interpreter(b.build(), resolver)

    tensors = {t["name"]: t for t in interpreter.get_tensor_details()}
    w_want, w_scales = spec_weight_quant(w, axis)
    params = tensors["op/weights"]["quantization_parameters"]
    assert params["quantized_dimension"] == axis
    np.testing.assert_allclose(params["scales"], w_scales, rtol=1e-7)
    np.testing.assert_array_equal(interpreter.get_tensor(tensors["op/weights"]["index"]), w_want)
    b_q = interpreter.get_tensor(tensors["op/bias"]["index"]).astype(np.int64)

    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x_q)
    interpreter.invoke()
    y_q = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])

    # Integer reference: integer accumulation, then one requantization.
    bias_scales = np.float32(in_scale).astype(np.float64) * w_scales.astype(np.float64)
    acc = ref(x_q.astype(np.float64) - in_zp, w_want.astype(np.float64), b_q, stride, "SAME")
    # (SAME padding pads with the input zero point, i.e. real 0, as ref pads x_q - zp with 0.)
    int_ref = np.clip(np.rint(acc * bias_scales / np.float32(out_scale)) + out_zp, out_zp, 127)  # fused RELU
    assert y_q.shape == float_ref.shape
    assert np.abs(y_q.astype(np.int64) - int_ref).max() <= 1
    # Against the float model: one output step plus the worst case of the int8 weights and int32 bias.
    scale_shape = [1, 1, 1, 1]
    scale_shape[axis] = -1
    half_steps = np.broadcast_to(w_scales.astype(np.float64).reshape(scale_shape) / 2, w.shape)
    tol = out_scale + ref(np.abs(x_f), half_steps, bias_scales / 2, stride, "SAME")
    err = np.abs(dequantize(y_q, out_scale, out_zp) - float_ref)
    assert np.all(err <= tol), (err.max(), out_scale)
    assert err.max() <= 3.0 * out_scale, (err.max(), out_scale)


def test_int8_model_end_to_end_int8_io(rng, cnn_params):
    """int8 input -> int8 conv/pool/depthwise/add/mean/fc -> int8 logits, vs. the float model."""
    x_f = rng.uniform(-1.0, 1.0, size=(1, 16, 16, 3))
    in_scale, in_zp = 2.0 / 255.0, 0
    x_q = quantize(x_f, in_scale, in_zp)
    x_deq = dequantize(x_q, in_scale, in_zp)

    # Calibrate activation ranges on the float reference.
    p = cnn_params
    a1 = ref_conv2d(x_deq, p["w1"], p["b1"], activation="RELU")
    pooled = ref_max_pool2d(a1, (2, 2), (2, 2), "VALID")
    dw = ref_depthwise_conv2d(pooled, p["wd"], p["bd"], activation="RELU6")
    summed = pooled + dw
    avg = summed.mean(axis=(1, 2))
    logits = ref_fully_connected(avg, p["wf"], p["bf"])
    q1, qd, qs, qf = (choose_qparams(v) for v in (a1, dw, summed, logits))

    b = TFLiteBuilder(description="int8 cnn")
    x = b.input("image", (1, 16, 16, 3), dtype="int8", quant=(in_scale, in_zp))
    y = b.conv2d(x, p["w1"], p["b1"], activation="RELU", out_quant=q1)
    y = b.max_pool2d(y, 2)
    z = b.depthwise_conv2d(y, p["wd"], p["bd"], activation="RELU6", out_quant=qd)
    y = b.add(y, z, out_quant=qs)
    y = b.mean(y, axes=(1, 2))
    y = b.fully_connected(y, p["wf"], p["bf"], out_quant=qf)
    b.output(y, "logits")
    interpreter = make_interpreter(b.build())

    detail = interpreter.get_input_details()[0]
    assert detail["dtype"] == np.int8
    assert detail["quantization"][0] == pytest.approx(in_scale, rel=1e-7)
    assert detail["quantization"][1] == in_zp
    interpreter.set_tensor(detail["index"], x_q)
    interpreter.invoke()
    out = interpreter.get_output_details()[0]
    assert out["dtype"] == np.int8 and out["quantization"][1] == qf[1]
    y_q = interpreter.get_tensor(out["index"])
    err = np.abs(dequantize(y_q, *qf) - logits).max()
    # Several requantizations and int8 weights: a few output steps, far below the logit range.
    assert err <= 4.0 * qf[0], (err, qf[0])
    assert np.argmax(y_q) == np.argmax(logits)


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_float_io_quantize_int8_dequantize(rng, resolver, cnn_params):
    """float in -> QUANTIZE -> int8 conv/pool/mean/fc -> DEQUANTIZE -> float out, dynamic batch."""
    p = cnn_params
    calib = rng.uniform(-1.0, 1.0, size=(8, 16, 16, 3))
    in_q = choose_qparams(calib, margin=1.0)
    a1 = ref_conv2d(calib, p["w1"], p["b1"], activation="RELU6")
    avg = ref_max_pool2d(a1, (2, 2), (2, 2), "VALID").mean(axis=(1, 2))
    logits = ref_fully_connected(avg, p["wf"], p["bf"])
    q1, qa, qf = choose_qparams(a1), choose_qparams(avg), choose_qparams(logits)

    b = TFLiteBuilder()
    x = b.input("image", (1, 16, 16, 3), shape_signature=(-1, 16, 16, 3))
    y = b.quantize(x, *in_q)
    y = b.conv2d(y, p["w1"], p["b1"], activation="RELU6", out_quant=q1)
    y = b.max_pool2d(y, 2)
    y = b.mean(y, axes=(1, 2), out_quant=qa)
    y = b.fully_connected(y, p["wf"], p["bf"], out_quant=qf)
    b.output(b.dequantize(y), "logits")
    interpreter = make_interpreter(b.build(), resolver)

    in_detail = interpreter.get_input_details()[0]
    out_detail = interpreter.get_output_details()[0]
    assert in_detail["dtype"] == np.float32 and out_detail["dtype"] == np.float32
    int8_tensors = [t for t in interpreter.get_tensor_details() if t["dtype"] == np.int8]
    assert len(int8_tensors) >= 6  # the middle of the graph really is int8

    x = rng.uniform(-1.0, 1.0, size=(3, 16, 16, 3)).astype(np.float32)
    interpreter.resize_tensor_input(in_detail["index"], [3, 16, 16, 3], strict=True)
    interpreter.allocate_tensors()
    interpreter.set_tensor(in_detail["index"], x)
    interpreter.invoke()
    y = interpreter.get_tensor(out_detail["index"])
    assert y.shape == (3, 10)
    want = ref_fully_connected(
        ref_max_pool2d(ref_conv2d(x, p["w1"], p["b1"], activation="RELU6"), (2, 2), (2, 2), "VALID").mean(axis=(1, 2)),
        p["wf"],
        p["bf"],
    )
    err = np.abs(y - want).max()
    assert err <= 4.0 * qf[0], (err, qf[0])
    # the float output lies on the int8 grid of the last quantized op
    steps = y.astype(np.float64) / np.float32(qf[0])
    np.testing.assert_allclose(steps, np.rint(steps), atol=1e-3)


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_int8_softmax_relu6_and_requantize(rng, resolver):
    x = rng.normal(scale=3.0, size=(2, 10))
    in_q = (0.05, 3)
    b = TFLiteBuilder()
    t = b.input("x", (2, 10), shape_signature=(-1, 10))
    q = b.quantize(t, *in_q)
    b.output(b.dequantize(b.softmax(q)), "probs")
    r6 = b.relu6(q)
    b.output(b.dequantize(b.quantize(r6, 0.03, -100)), "relu6")  # int8 -> int8 requantize
    probs, relu6 = run(b.build(), x.astype(np.float32), resolver=resolver)
    x_deq = dequantize(quantize(x, *in_q), *in_q)
    np.testing.assert_allclose(probs, ref_softmax(x_deq), atol=1.5 / 256)
    np.testing.assert_allclose(relu6, np.clip(x_deq, 0, 6), atol=0.03 * 0.51 + 0.05 * 0.51)


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_uint8_input_requantized_to_int8(rng, resolver):
    """A uint8 image input (scale 1/255, zp 0) feeding an int8 graph through QUANTIZE."""
    x = rng.integers(0, 256, size=(1, 4, 4, 3)).astype(np.uint8)
    b = TFLiteBuilder()
    t = b.input("frame", x.shape, dtype="uint8", quant=(1 / 255, 0))
    q = b.quantize(t, 1 / 255, -128)
    b.output(q, "q")
    b.output(b.dequantize(q), "y")
    q_out, y = run(b.build(), x, resolver=resolver)
    np.testing.assert_array_equal(q_out, x.astype(np.int16) - 128)
    np.testing.assert_allclose(y, x / 255.0, atol=1e-6)


def test_int8_constant_operand_add(rng):
    x = rng.normal(size=(1, 4, 4, 2))
    c = rng.normal(size=(2,))
    b = TFLiteBuilder()
    t = b.quantize(b.input("x", x.shape), 0.03, 0)
    const = b.constant(c, quant=(0.02, 0), name="offset")
    y = b.add(t, const, out_quant=(0.05, 0))
    b.output(b.dequantize(y), "y")
    (out,) = run(b.build(), x.astype(np.float32))
    np.testing.assert_allclose(out, x + c, atol=0.03 + 0.02 + 0.05)


# --------------------------------------------------------------------------
# the flatbuffer itself
# --------------------------------------------------------------------------


def build_mixed_model(rng) -> bytes:
    b = TFLiteBuilder(description="mixed")
    x = b.input("x", (1, 8, 8, 3))
    f = b.conv2d(x, rng.normal(size=(4, 3, 3, 3)), None)  # float conv
    q = b.quantize(f, 0.1, 0)
    q = b.conv2d(q, rng.normal(size=(4, 3, 3, 4)), None, out_quant=(0.1, 0))
    q = b.depthwise_conv2d(q, rng.normal(size=(1, 3, 3, 4)), None, out_quant=(0.1, 0))
    q = b.mean(q, (1, 2))
    q = b.fully_connected(q, rng.normal(size=(2, 4)), None, out_quant=(0.1, 0))
    b.output(b.dequantize(q), "y")
    return b.build()


def test_operator_codes_and_versions(rng):
    model = build_mixed_model(rng)
    assert model[4:8] == b"TFL3"
    m = read_model(model)
    assert m.version == 3
    assert m.description == b"mixed"
    ops = schema.BuiltinOperator
    versions = sorted((c.builtinCode, c.version) for c in m.operatorCodes)
    assert versions == sorted(
        [
            (ops.CONV_2D, 1),  # float conv
            (ops.CONV_2D, 3),  # int8 per-channel conv
            (ops.QUANTIZE, 1),
            (ops.DEPTHWISE_CONV_2D, 3),
            (ops.MEAN, 2),
            (ops.FULLY_CONNECTED, 4),
            (ops.DEQUANTIZE, 2),
        ]
    )
    for code in m.operatorCodes:
        assert code.deprecatedBuiltinCode == min(code.builtinCode, ops.PLACEHOLDER_FOR_GREATER_OP_CODES)
        assert code.customCode is None
    # The interpreter accepts the graph.
    (y,) = run(model, rng.normal(size=(1, 8, 8, 3)).astype(np.float32))
    assert y.shape == (1, 2) and np.isfinite(y).all()


def test_buffers_sentinel_alignment_and_signature(rng):
    model = build_mixed_model(rng)
    root = schema.Model.GetRootAs(model, 0)
    assert root.Buffers(0).DataLength() == 0  # buffer 0 is the empty sentinel
    constant_buffers = 0
    for i in range(1, root.BuffersLength()):
        buf = root.Buffers(i)
        if buf.DataLength():
            constant_buffers += 1
            start = buf._tab.Vector(buf._tab.Offset(4))  # absolute offset of the data bytes
            assert start % 16 == 0, (i, start)
    assert constant_buffers >= 8
    m = read_model(model)
    graph = m.subgraphs[0]
    for tensor in graph.tensors:
        if tensor.buffer:
            assert len(m.buffers[tensor.buffer].data) == np.prod(tensor.shape) * {
                schema.TensorType.FLOAT32: 4,
                schema.TensorType.INT8: 1,
                schema.TensorType.INT32: 4,
            }[tensor.type]
    (sig,) = m.signatureDefs
    assert sig.signatureKey == b"serving_default"
    assert [t.name for t in sig.inputs] == [b"x"] and [t.name for t in sig.outputs] == [b"y"]


def test_signature_runner(rng):
    b = TFLiteBuilder()
    x = b.input("features", (1, 4))
    b.output(b.fully_connected(x, np.eye(3, 4, dtype=np.int64), np.ones(3)), "scores")
    interpreter = Interpreter(model_content=b.build())
    runner = interpreter.get_signature_runner("serving_default")
    value = rng.normal(size=(1, 4)).astype(np.float32)
    out = runner(features=value)
    np.testing.assert_allclose(out["scores"], value[:, :3] + 1, **FLOAT_TOL)


def test_build_is_repeatable_and_deterministic(rng):
    b = TFLiteBuilder()
    b.output(b.conv2d(b.input("x", (1, 4, 4, 2)), rng.normal(size=(2, 1, 1, 2))), "y")
    assert b.build() == b.build()


# --------------------------------------------------------------------------
# misuse is reported at build time, not by the interpreter
# --------------------------------------------------------------------------


def test_builder_rejects_bad_graphs():
    b = TFLiteBuilder()
    x = b.input("x", (1, 8, 8, 3))
    with pytest.raises(TFLiteBuildError, match="input channels"):
        b.conv2d(x, np.zeros((4, 3, 3, 5), np.float32))  # HWIO-looking weights
    with pytest.raises(TFLiteBuildError, match="1HWO"):
        b.depthwise_conv2d(x, np.zeros((3, 3, 3, 1), np.float32))
    with pytest.raises(TFLiteBuildError, match="input features"):
        b.fully_connected(b.reshape(x, (1, -1)), np.zeros((10, 100), np.float32))
    with pytest.raises(TFLiteBuildError, match="out_quant applies to int8"):
        b.conv2d(x, np.zeros((4, 3, 3, 3), np.float32), out_quant=(0.1, 0))
    with pytest.raises(TFLiteBuildError, match="padding"):
        b.max_pool2d(x, 2, padding="FULL")
    with pytest.raises(TFLiteBuildError, match="activation"):
        b.conv2d(x, np.zeros((4, 3, 3, 3), np.float32), activation="GELU")
    with pytest.raises(TFLiteBuildError, match="cannot reshape"):
        b.reshape(x, (7, -1))
    with pytest.raises(TFLiteBuildError, match="shape_signature"):
        b.input("y", (1, 4), shape_signature=(-1, 5))
    with pytest.raises(TFLiteBuildError, match="already used"):
        b.input("x", (1, 4))
    with pytest.raises(TFLiteBuildError, match="need quant"):
        b.input("q", (1, 4), dtype="int8")
    with pytest.raises(TFLiteBuildError, match="no outputs"):
        b.build()

    q = b.quantize(x, 0.1, 0)
    with pytest.raises(TFLiteBuildError, match="needs out_quant"):
        b.conv2d(q, np.ones((4, 3, 3, 3), np.float32))
    with pytest.raises(TFLiteBuildError, match="weight_scale"):
        b.conv2d(q, np.ones((4, 3, 3, 3), np.int8), out_quant=(0.1, 0))
    with pytest.raises(TFLiteBuildError, match=r"\[-127, 127\]"):
        b.conv2d(q, np.full((4, 3, 3, 3), -128, np.int8), weight_scale=0.1, out_quant=(0.1, 0))
    with pytest.raises(TFLiteBuildError, match="dtypes differ"):
        b.add(q, x)
    with pytest.raises(TFLiteBuildError, match="zero_point"):
        b.quantize(x, 0.1, 200)
    with pytest.raises(TFLiteBuildError, match="per-tensor quantization"):
        b.quantize(b.input("raw", (1, 4), dtype="uint8"), 0.1, 0)
    with pytest.raises(TFLiteBuildError, match="scale"):
        b.quantize(x, 0.0, 0)

    other = TFLiteBuilder()
    with pytest.raises(TFLiteBuildError, match="another builder"):
        other.relu(x)


def test_int8_weights_with_explicit_scales_are_used_verbatim(rng):
    w_q = rng.integers(-127, 128, size=(3, 5)).astype(np.int8)
    scales = np.array([0.01, 0.02, 0.03], np.float32)
    b = TFLiteBuilder()
    x = b.input("x", (1, 5), dtype="int8", quant=(0.1, 0))
    b.output(b.fully_connected(x, w_q, np.zeros(3, np.int32), weight_scale=scales, out_quant=(0.5, 0), name="fc"))
    interpreter = make_interpreter(b.build())
    detail = next(t for t in interpreter.get_tensor_details() if t["name"] == "fc/weights")
    np.testing.assert_array_equal(interpreter.get_tensor(detail["index"]), w_q)
    np.testing.assert_allclose(detail["quantization_parameters"]["scales"], scales)


def test_float_weights_with_explicit_scale_saturate_symmetrically(rng):
    w = np.array([[1.0, -1.0, 0.5], [2.0, -3.0, 0.0]])
    b = TFLiteBuilder()
    x = b.input("x", (1, 3), dtype="int8", quant=(0.1, 0))
    b.output(b.fully_connected(x, w, weight_scale=[0.004, 0.01], out_quant=(0.5, 0), name="fc"))
    model = read_model(b.build())
    (weights,) = [t for t in model.subgraphs[0].tensors if t.name == b"fc/weights"]
    stored = np.frombuffer(bytes(model.buffers[weights.buffer].data), np.int8).reshape(2, 3)
    np.testing.assert_array_equal(stored, [[127, -127, 125], [127, -127, 0]])  # never -128


def test_per_tensor_weight_quantization(rng):
    w = rng.normal(size=(4, 6))
    b = TFLiteBuilder()
    x = b.input("x", (2, 6), dtype="int8", quant=(0.05, 0))
    b.output(b.fully_connected(x, w, None, per_channel=False, out_quant=(0.2, 0), name="fc"))
    model = b.build()
    # Read the file, not the interpreter: once XNNPACK has taken the node,
    # get_tensor_details() reports per-tensor weight scales expanded per channel.
    (weights,) = [t for t in read_model(model).subgraphs[0].tensors if t.name == b"fc/weights"]
    assert list(weights.quantization.scale) == pytest.approx([np.abs(w).max() / 127], rel=1e-6)
    assert list(weights.quantization.zeroPoint) == [0]
    interpreter = make_interpreter(model)
    x_q = rng.integers(-128, 128, size=(2, 6)).astype(np.int8)
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x_q)
    interpreter.invoke()
    y = dequantize(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), 0.2, 0)
    want = ref_fully_connected(dequantize(x_q, 0.05, 0), w, np.zeros(4))
    assert np.abs(y - np.clip(want, -128 * 0.2, 127 * 0.2)).max() <= 2 * 0.2


def test_quant_params_dataclass():
    q = QuantParams(scale=(0.1, 0.2), zero_point=(0, 0), axis=3)
    assert q.per_channel
    assert not QuantParams(scale=(0.1,), zero_point=(0,)).per_channel
