"""Write TensorFlow Lite (``.tflite``) models from numpy weights, without TensorFlow.

:class:`TFLiteBuilder` is a small graph builder: declare inputs, chain builtin
operators on numpy weights, mark outputs, and :meth:`TFLiteBuilder.build`
returns the serialized flatbuffer (file identifier ``TFL3``, schema version 3)
that LiteRT's ``Interpreter(model_content=...)`` loads directly.  The object
API of the schema that ships with ``ai-edge-litert``
(``ai_edge_litert.schema_py_generated``: ``ModelT``, ``TensorT``, ... with
``.Pack(builder)``) does the encoding, the same way TensorFlow's
``flatbuffer_utils.convert_object_to_bytearray`` does.

Layouts (the ones TFLite kernels expect; nothing is transposed for you):

* activations: NHWC (batch, height, width, channels);
* ``conv2d`` weights: OHWI (out_channels, kernel_h, kernel_w, in_channels);
* ``depthwise_conv2d`` weights: 1HWO (1, kernel_h, kernel_w,
  in_channels * depth_multiplier), output channel ``c * m + j`` reads input
  channel ``c``;
* ``fully_connected`` weights: OI (out_features, in_features);
* biases: one value per output channel, shape ``(O,)``.

Strides, dilations and pool sizes are in elements of the H and W axes, given as
``(h, w)`` or a single int for both.

Quantization follows the TFLite int8 spec
(https://ai.google.dev/edge/litert/models/quantization_spec):

* activations: int8, asymmetric, one ``(scale, zero_point)`` per tensor, with
  ``real = scale * (q - zero_point)``;
* weights: int8, symmetric (zero point 0, values in [-127, 127]), per output
  channel (axis 0 for conv/fully-connected OHWI/OI weights, axis 3 for
  depthwise 1HWO weights) or per tensor;
* biases: int32, zero point 0, ``scale = input_scale * weight_scale`` (per
  channel when the weights are).

An op runs quantized when its input is an int8 tensor: pass float weights and
they are quantized for you (or pass int8 weights plus ``weight_scale``), give
the output ``out_quant=(scale, zero_point)``, and the operator version is set to
the one TFLite's own converter would write (e.g. ``CONV_2D`` v3 for int8).
``quantize``/``dequantize`` switch between float and int8 so a model can take
and return either.

Example::

    b = TFLiteBuilder(description="tiny classifier")
    x = b.input("image", (1, 32, 32, 3), shape_signature=(-1, 32, 32, 3))
    y = b.conv2d(x, w_ohwi, bias, stride=1, padding="SAME", activation="RELU")
    y = b.max_pool2d(y, size=2, stride=2)
    y = b.mean(y, axes=(1, 2))
    y = b.fully_connected(y, w_oi, fc_bias)
    b.output(b.softmax(y), "probs")
    tflite_bytes = b.build()
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence, Tuple, Union

import flatbuffers
import numpy as np
import numpy.typing as npt

from .errors import ConverterError

try:
    from ai_edge_litert import schema_py_generated as _schema
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "converters.tflite_writer needs the TFLite flatbuffer schema shipped with "
        "ai-edge-litert (ai_edge_litert.schema_py_generated); install the "
        "'converter' extra: pip install 'edge-sdk[converter]'"
    ) from exc

__all__ = [
    "QuantParams",
    "TFLiteBuildError",
    "TFLiteBuilder",
    "Tensor",
]

_BuiltinOp = _schema.BuiltinOperator
_Options = _schema.BuiltinOptions
_TensorType = _schema.TensorType

#: Schema version written into ``Model.version`` (the current TFLite schema).
SCHEMA_VERSION = 3
#: ``deprecated_builtin_code`` is an int8 field; codes above it live only in
#: ``builtin_code`` and the deprecated field holds this placeholder.
_PLACEHOLDER_FOR_GREATER_OP_CODES = _BuiltinOp.PLACEHOLDER_FOR_GREATER_OP_CODES
#: Constant buffers start on this boundary, as the TFLite converter writes them,
#: so kernels (and mmap'ed files) see naturally aligned weights.
_BUFFER_ALIGNMENT = 16
#: A flatbuffer cannot exceed 2 GiB; leave room for the graph itself.
_MAX_CONSTANT_BYTES = 2**31 - 2**24

_DTYPES: dict[str, tuple[int, np.dtype]] = {
    "float32": (_TensorType.FLOAT32, np.dtype("<f4")),
    "float16": (_TensorType.FLOAT16, np.dtype("<f2")),
    "int8": (_TensorType.INT8, np.dtype("i1")),
    "uint8": (_TensorType.UINT8, np.dtype("u1")),
    "int16": (_TensorType.INT16, np.dtype("<i2")),
    "int32": (_TensorType.INT32, np.dtype("<i4")),
    "int64": (_TensorType.INT64, np.dtype("<i8")),
    "bool": (_TensorType.BOOL, np.dtype("?")),
}
#: Integer range of each quantized activation type.
_QUANT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
}
_ACTIVATIONS: dict[str, int] = {
    "NONE": _schema.ActivationFunctionType.NONE,
    "RELU": _schema.ActivationFunctionType.RELU,
    "RELU_N1_TO_1": _schema.ActivationFunctionType.RELU_N1_TO_1,
    "RELU6": _schema.ActivationFunctionType.RELU6,
}
_PADDINGS: dict[str, int] = {"SAME": _schema.Padding.SAME, "VALID": _schema.Padding.VALID}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_builder_ids = itertools.count(1)  # tells handles of different builders apart

IntPair = Union[int, Tuple[int, int]]
QuantLike = Union["QuantParams", Tuple[float, int]]
TensorOrArray = Union["Tensor", npt.ArrayLike]


class TFLiteBuildError(ConverterError, ValueError):
    """The requested graph cannot be expressed as a valid TFLite model."""


@dataclass(frozen=True)
class QuantParams:
    """Affine quantization of a tensor: ``real = scale * (q - zero_point)``.

    ``scale`` and ``zero_point`` hold one entry for per-tensor quantization or
    one entry per slice along ``axis`` for per-channel quantization (TFLite's
    ``quantized_dimension``).
    """

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0

    @property
    def per_channel(self) -> bool:
        """True when there is more than one scale."""
        return len(self.scale) > 1


@dataclass(frozen=True)
class Tensor:
    """Handle to a tensor of a :class:`TFLiteBuilder` graph.

    ``shape`` is the concrete shape the model is allocated with;
    ``shape_signature`` has ``-1`` for dimensions that may be resized at run
    time (``Interpreter.resize_tensor_input``).  Handles are snapshots: the
    name shown here is the one the tensor had when the handle was made.
    """

    index: int
    name: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    dtype: str
    quant: QuantParams | None
    _builder_id: int = field(default=0, repr=False, compare=False)

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)


@dataclass
class _TensorRecord:
    name: str
    shape: tuple[int, ...]
    signature: tuple[int, ...]
    dtype: str
    quant: QuantParams | None
    data: bytes | None = None  # little-endian C-order payload of a constant


@dataclass
class _OperatorRecord:
    op: int
    version: int
    inputs: list[int]
    outputs: list[int]
    options_type: int = _Options.NONE
    options: object | None = None


class _AlignedBufferT(_schema.BufferT):
    """``BufferT`` whose data vector starts on a ``_BUFFER_ALIGNMENT`` boundary.

    The generated ``BufferT.Pack`` aligns raw bytes to 1; float weights then
    land on arbitrary addresses.  Flatbuffers align relative to the end of the
    buffer and ``Finish`` pads the whole buffer to the largest alignment used,
    so the data is aligned from the start of the file as well.
    """

    def __init__(self, payload: bytes) -> None:
        super().__init__()
        self._payload = payload

    def Pack(self, builder: flatbuffers.Builder) -> int:  # noqa: N802 - flatbuffers API
        array = np.frombuffer(self._payload, dtype=np.uint8)
        builder.Prep(_BUFFER_ALIGNMENT, array.size)
        data = builder.CreateNumpyVector(array)
        _schema.BufferStart(builder)
        _schema.BufferAddData(builder, data)
        return _schema.BufferEnd(builder)


# --------------------------------------------------------------------------
# small validation / shape helpers
# --------------------------------------------------------------------------


def _pair(value: IntPair, what: str) -> tuple[int, int]:
    """``(h, w)`` from an int or a pair of positive ints."""
    if isinstance(value, (int, np.integer)):
        pair = (int(value), int(value))
    else:
        items = tuple(value)
        if len(items) != 2:
            raise TFLiteBuildError(f"{what} must be an int or an (h, w) pair, got {value!r}")
        pair = (int(items[0]), int(items[1]))
    if pair[0] < 1 or pair[1] < 1:
        raise TFLiteBuildError(f"{what} must be positive, got {value!r}")
    return pair


def _padding(padding: str) -> int:
    try:
        return _PADDINGS[padding.upper()]
    except (KeyError, AttributeError):
        raise TFLiteBuildError(f"padding must be 'SAME' or 'VALID', got {padding!r}") from None


def _activation(activation: str | None) -> int:
    key = "NONE" if activation is None else str(activation).upper()
    try:
        return _ACTIVATIONS[key]
    except KeyError:
        raise TFLiteBuildError(
            f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
        ) from None


def _dtype_name(dtype: str | np.dtype | type) -> str:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in _DTYPES:
        raise TFLiteBuildError(f"unsupported tensor dtype {dtype!r}; supported: {sorted(_DTYPES)}")
    return name


def _window_out(size: int, kernel: int, stride: int, dilation: int, padding: int) -> int:
    """Output length of a conv/pool window along one axis (-1 stays -1)."""
    if size < 0:
        return -1
    if padding == _schema.Padding.SAME:
        return -(-size // stride)
    effective = (kernel - 1) * dilation + 1
    return (size - effective) // stride + 1 if size >= effective else 0


def _per_tensor_quant(quant: QuantLike, dtype: str, what: str) -> QuantParams:
    """Validate a per-tensor ``(scale, zero_point)`` for an activation of ``dtype``."""
    if dtype not in _QUANT_RANGES:
        raise TFLiteBuildError(f"{what}: dtype {dtype} cannot be quantized; use one of {sorted(_QUANT_RANGES)}")
    if isinstance(quant, QuantParams):
        if quant.per_channel:
            raise TFLiteBuildError(f"{what}: activations take per-tensor quantization, got {quant}")
        scale, zero_point = quant.scale[0], quant.zero_point[0]
    else:
        try:
            scale, zero_point = quant
        except (TypeError, ValueError):
            raise TFLiteBuildError(f"{what}: quantization must be (scale, zero_point), got {quant!r}") from None
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0.0):
        raise TFLiteBuildError(f"{what}: scale must be a positive finite float, got {scale!r}")
    if float(zero_point) != int(zero_point):
        raise TFLiteBuildError(f"{what}: zero_point must be an integer, got {zero_point!r}")
    zero_point = int(zero_point)
    low, high = _QUANT_RANGES[dtype]
    if dtype == "int16" and zero_point != 0:
        raise TFLiteBuildError(f"{what}: int16 activations are symmetric (zero_point 0), got {zero_point}")
    if not low <= zero_point <= high:
        raise TFLiteBuildError(f"{what}: zero_point {zero_point} is outside the {dtype} range [{low}, {high}]")
    # Stored as float32 in the flatbuffer; keep exactly that value.
    return QuantParams(scale=(float(np.float32(scale)),), zero_point=(zero_point,), axis=0)


def _broadcast(a: Sequence[int], b: Sequence[int], what: str) -> tuple[int, ...]:
    """Numpy broadcasting of two shapes in which -1 means "unknown"."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for da, db in zip(a, b):
        if da == db:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif db == 1:
            out.append(da)
        elif da == -1 or db == -1:
            out.append(db if da == -1 else da)
        else:
            raise TFLiteBuildError(f"{what}: shapes {tuple(a)} and {tuple(b)} do not broadcast")
    return tuple(out)


def _quantize_weights(
    weights: np.ndarray,
    axis: int,
    weight_scale: npt.ArrayLike | None,
    per_channel: bool,
    what: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights and their float32 scales (length 1 or ``shape[axis]``)."""
    channels = weights.shape[axis]
    if weight_scale is not None:
        scales = np.asarray(weight_scale, dtype=np.float64).reshape(-1)
        if scales.size not in (1, channels):
            raise TFLiteBuildError(
                f"{what}: weight_scale needs 1 or {channels} entries (axis {axis}), got {scales.size}"
            )
        if not per_channel and scales.size != 1:
            raise TFLiteBuildError(f"{what}: per_channel=False takes a single weight_scale")
        if not np.all(np.isfinite(scales) & (scales > 0)):
            raise TFLiteBuildError(f"{what}: weight scales must be positive and finite")
    elif weights.dtype == np.int8:
        raise TFLiteBuildError(f"{what}: int8 weights need weight_scale (one per output channel or one)")
    else:
        magnitude = np.abs(weights.astype(np.float64))
        if per_channel:
            reduce_axes = tuple(i for i in range(weights.ndim) if i != axis)
            max_abs = magnitude.max(axis=reduce_axes)
        else:
            max_abs = np.array([magnitude.max()])
        # An all-zero channel quantizes to zeros under any scale; pick the one
        # of a unit-range channel so the bias keeps a usable resolution.
        scales = np.where(max_abs > 0, max_abs / 127.0, 1.0 / 127.0)
    scales = scales.astype(np.float32)

    if weights.dtype == np.int8:
        if np.any(weights == -128):
            raise TFLiteBuildError(f"{what}: int8 weights are symmetric and must lie in [-127, 127]")
        return np.ascontiguousarray(weights), scales
    if weights.dtype.kind not in "fiu":
        raise TFLiteBuildError(f"{what}: weights must be float or int8, got {weights.dtype}")
    if not np.all(np.isfinite(weights)):
        raise TFLiteBuildError(f"{what}: weights contain NaN or inf")
    shape = [1] * weights.ndim
    if scales.size > 1:
        shape[axis] = channels
    quantized = np.rint(weights.astype(np.float64) / scales.astype(np.float64).reshape(shape))
    return np.clip(quantized, -127, 127).astype(np.int8), scales


def _quantize_bias(bias: npt.ArrayLike | None, channels: int, scales: np.ndarray, what: str) -> np.ndarray:
    """int32 bias for ``scales`` (= input_scale * weight_scale, float64)."""
    if bias is None:
        return np.zeros(channels, dtype=np.int32)
    values = np.asarray(bias)
    if values.shape != (channels,):
        raise TFLiteBuildError(f"{what}: bias must have shape ({channels},), got {values.shape}")
    if values.dtype == np.int32:
        return np.ascontiguousarray(values)
    if values.dtype.kind != "f":
        raise TFLiteBuildError(f"{what}: a quantized op takes a float bias or an already quantized int32 bias")
    quantized = np.rint(values.astype(np.float64) / scales)
    if np.any(quantized < _INT32_MIN) or np.any(quantized > _INT32_MAX):
        raise TFLiteBuildError(
            f"{what}: bias does not fit int32 at scale input_scale*weight_scale; "
            "use a larger input or weight scale"
        )
    return quantized.astype(np.int32)


# --------------------------------------------------------------------------
# the builder
# --------------------------------------------------------------------------


class TFLiteBuilder:
    """Builds a single-subgraph TFLite model operator by operator.

    Every op method takes :class:`Tensor` handles made by this builder and
    returns the handle of its output.  Ops run in float32 when their input is
    float32 and in int8 when it is a quantized int8 tensor.  ``name`` arguments
    name the op's output tensor (made unique if needed); constants are named
    ``<name>/weights``, ``<name>/bias`` and so on.
    """

    def __init__(self, description: str = "edge_sdk tflite_writer", *, signature_key: str = "serving_default"):
        """``description`` goes into ``Model.description``; ``signature_key``
        names the model's single SignatureDef (usable with
        ``Interpreter.get_signature_runner``)."""
        self.description = description
        self.signature_key = signature_key
        self._id = next(_builder_ids)
        self._tensors: list[_TensorRecord] = []
        self._operators: list[_OperatorRecord] = []
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._names: set[str] = set()
        self._op_counts: dict[str, int] = {}

    # ---- graph inputs / outputs / constants ------------------------------

    def input(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str = "float32",
        *,
        shape_signature: Sequence[int] | None = None,
        quant: QuantLike | None = None,
    ) -> Tensor:
        """Declare a graph input.

        ``shape`` is the allocated shape (all positive); ``shape_signature``
        repeats it with ``-1`` for resizable dimensions, e.g. ``(-1, 224, 224,
        3)`` for a dynamic batch.  Quantized inputs (int8/uint8/int16) need
        ``quant=(scale, zero_point)``.
        """
        dtype = _dtype_name(dtype)
        shape_t = tuple(int(d) for d in shape)
        if any(d < 1 for d in shape_t):
            raise TFLiteBuildError(f"input {name!r}: shape dimensions must be positive, got {shape_t}")
        signature = shape_t if shape_signature is None else tuple(int(d) for d in shape_signature)
        if len(signature) != len(shape_t) or any(s not in (d, -1) for s, d in zip(signature, shape_t)):
            raise TFLiteBuildError(
                f"input {name!r}: shape_signature {signature} must match shape {shape_t} except for -1 entries"
            )
        if quant is not None:
            q = _per_tensor_quant(quant, dtype, f"input {name!r}")
        elif dtype in ("int8", "int16"):
            raise TFLiteBuildError(f"input {name!r}: {dtype} inputs need quant=(scale, zero_point)")
        else:
            q = None
        if name in self._names:
            raise TFLiteBuildError(f"tensor name {name!r} is already used")
        index = self._new_tensor(name, shape_t, signature, dtype, q)
        self._inputs.append(index)
        return self._handle(index)

    def constant(
        self,
        value: npt.ArrayLike,
        *,
        dtype: str | None = None,
        quant: QuantLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Add a constant tensor.

        Without ``dtype``, floats become float32, bools bool, uint8 stays
        uint8 and other integers become int32 (int8/int16 arrays must come
        with ``quant``).  With
        ``quant=(scale, zero_point)`` the tensor is a quantized activation-like
        constant (default dtype int8): float values are quantized with that
        scale and zero point, integer values are taken as already quantized.
        """
        array = np.asarray(value)
        what = f"constant {name or ''}".strip()
        if quant is not None:
            dtype = _dtype_name(dtype or "int8")
            q = _per_tensor_quant(quant, dtype, what)
            if array.dtype.kind == "f":
                low, high = _QUANT_RANGES[dtype]
                scaled = np.rint(array.astype(np.float64) / q.scale[0]) + q.zero_point[0]
                array = np.clip(scaled, low, high).astype(_DTYPES[dtype][1])
            elif array.dtype.kind not in "iu":
                raise TFLiteBuildError(f"{what}: cannot quantize values of dtype {array.dtype}")
        else:
            q = None
            if dtype is None:
                kind = array.dtype.kind
                if kind == "f":
                    dtype = "float32"
                elif kind == "b":
                    dtype = "bool"
                elif array.dtype.name in ("int8", "uint8", "int16"):
                    dtype = array.dtype.name
                elif kind in "iu":
                    dtype = "int32"
                else:
                    raise TFLiteBuildError(f"{what}: unsupported constant dtype {array.dtype}")
            dtype = _dtype_name(dtype)
            if dtype in ("int8", "int16"):
                raise TFLiteBuildError(f"{what}: {dtype} constants need quant=(scale, zero_point)")
        index = self._const(self._fresh_name(name, "const"), array, dtype, q)
        return self._handle(index)

    def output(self, tensor: Tensor, name: str | None = None) -> Tensor:
        """Mark ``tensor`` as a graph output, optionally renaming it to ``name``."""
        index = self._index(tensor)
        record = self._tensors[index]
        if record.data is not None:
            raise TFLiteBuildError(f"constant tensor {record.name!r} cannot be a graph output")
        if index in self._outputs:
            raise TFLiteBuildError(f"tensor {record.name!r} is already an output")
        if name is not None and name != record.name:
            if name in self._names:
                raise TFLiteBuildError(f"tensor name {name!r} is already used")
            self._names.discard(record.name)
            self._names.add(name)
            record.name = name
        self._outputs.append(index)
        return self._handle(index)

    # ---- convolution / dense ---------------------------------------------

    def conv2d(
        self,
        x: Tensor,
        weights: npt.ArrayLike,
        bias: npt.ArrayLike | None = None,
        *,
        stride: IntPair = 1,
        padding: str = "SAME",
        activation: str | None = "NONE",
        dilation: IntPair = 1,
        out_quant: QuantLike | None = None,
        weight_scale: npt.ArrayLike | None = None,
        per_channel: bool = True,
        name: str | None = None,
    ) -> Tensor:
        """2-D convolution (``CONV_2D``) of an NHWC input with OHWI ``weights``.

        ``bias`` has shape ``(O,)`` (zeros when omitted).  For an int8 input,
        float weights are quantized symmetrically per output channel (axis 0)
        unless ``per_channel=False``; int8 weights need ``weight_scale``.  A
        float bias is quantized to int32 at ``input_scale * weight_scale``;
        ``out_quant=(scale, zero_point)`` is required.
        """
        xi = self._index(x)
        xr = self._tensors[xi]
        self._require_rank(xr, 4, "conv2d")
        w = np.asarray(weights)
        if w.ndim != 4:
            raise TFLiteBuildError(f"conv2d weights must be OHWI (4-D), got shape {w.shape}")
        out_c, kh, kw, in_c = w.shape
        if in_c != xr.shape[3]:
            raise TFLiteBuildError(
                f"conv2d: weights take {in_c} input channels (OHWI), input has {xr.shape[3]} (NHWC)"
            )
        return self._windowed(
            "conv2d", xi, xr, w, bias, out_c, (kh, kw), 0, _schema.Conv2DOptionsT(), _BuiltinOp.CONV_2D,
            _Options.Conv2DOptions, stride=stride, padding=padding, activation=activation, dilation=dilation,
            out_quant=out_quant, weight_scale=weight_scale, per_channel=per_channel, name=name, dilated_float_version=1,
        )  # fmt: skip

    def depthwise_conv2d(
        self,
        x: Tensor,
        weights: npt.ArrayLike,
        bias: npt.ArrayLike | None = None,
        *,
        stride: IntPair = 1,
        padding: str = "SAME",
        activation: str | None = "NONE",
        dilation: IntPair = 1,
        out_quant: QuantLike | None = None,
        weight_scale: npt.ArrayLike | None = None,
        per_channel: bool = True,
        name: str | None = None,
    ) -> Tensor:
        """Depthwise convolution (``DEPTHWISE_CONV_2D``) with 1HWO ``weights``.

        ``O = in_channels * depth_multiplier``; output channel ``c * m + j``
        filters input channel ``c``.  Quantization as in :meth:`conv2d`, with
        per-channel weight scales along axis 3.
        """
        xi = self._index(x)
        xr = self._tensors[xi]
        self._require_rank(xr, 4, "depthwise_conv2d")
        w = np.asarray(weights)
        if w.ndim != 4 or w.shape[0] != 1:
            raise TFLiteBuildError(f"depthwise_conv2d weights must be 1HWO, got shape {w.shape}")
        _, kh, kw, out_c = w.shape
        in_c = xr.shape[3]
        if out_c % in_c:
            raise TFLiteBuildError(
                f"depthwise_conv2d: {out_c} output channels is not a multiple of {in_c} input channels"
            )
        multiplier = out_c // in_c
        options = _schema.DepthwiseConv2DOptionsT()
        options.depthMultiplier = multiplier
        return self._windowed(
            "depthwise_conv2d", xi, xr, w, bias, out_c, (kh, kw), 3, options, _BuiltinOp.DEPTHWISE_CONV_2D,
            _Options.DepthwiseConv2DOptions, stride=stride, padding=padding, activation=activation, dilation=dilation,
            out_quant=out_quant, weight_scale=weight_scale, per_channel=per_channel, name=name, dilated_float_version=2,
        )  # fmt: skip

    def _windowed(
        self,
        op_name: str,
        xi: int,
        xr: _TensorRecord,
        w: np.ndarray,
        bias: npt.ArrayLike | None,
        out_c: int,
        kernel_hw: tuple[int, int],
        weight_axis: int,
        options: Any,
        builtin: int,
        options_type: int,
        *,
        stride: IntPair,
        padding: str,
        activation: str | None,
        dilation: IntPair,
        out_quant: QuantLike | None,
        weight_scale: npt.ArrayLike | None,
        per_channel: bool,
        name: str | None,
        dilated_float_version: int,
    ) -> Tensor:
        """The part CONV_2D and DEPTHWISE_CONV_2D share: window geometry, weights
        and bias (quantized along ``weight_axis`` for int8), the output tensor, the
        stride/padding/dilation/activation options and the op version (int8: 3;
        float: ``dilated_float_version`` when dilated, else 1)."""
        kh, kw = kernel_hw
        sh, sw = _pair(stride, "stride")
        dh, dw = _pair(dilation, "dilation")
        pad = _padding(padding)
        act = _activation(activation)
        name = self._fresh_name(name, op_name)

        def out_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
            return (
                shape[0],
                _window_out(shape[1], kh, sh, dh, pad),
                _window_out(shape[2], kw, sw, dw, pad),
                out_c,
            )

        w_index, b_index, out_q, quantized = self._weights_and_bias(
            xr, w, bias, weight_axis, out_c, weight_scale, per_channel, out_quant, name
        )
        out = self._op_output(name, out_shape(xr.shape), out_shape(xr.signature), xr.dtype, out_q)
        options.padding = pad
        options.strideH, options.strideW = sh, sw
        options.dilationHFactor, options.dilationWFactor = dh, dw
        options.fusedActivationFunction = act
        if quantized:
            version = 3
        else:
            version = dilated_float_version if (dh, dw) != (1, 1) else 1
        self._add_op(builtin, version, [xi, w_index, b_index], [out], options_type, options)
        return self._handle(out)

    def fully_connected(
        self,
        x: Tensor,
        weights: npt.ArrayLike,
        bias: npt.ArrayLike | None = None,
        *,
        activation: str | None = "NONE",
        keep_num_dims: bool = False,
        out_quant: QuantLike | None = None,
        weight_scale: npt.ArrayLike | None = None,
        per_channel: bool = True,
        name: str | None = None,
    ) -> Tensor:
        """Dense layer (``FULLY_CONNECTED``): ``y = x @ weights.T + bias``.

        ``weights`` are OI; the last input dimension must equal I.  The output
        is ``(prod(leading dims), O)``, or ``leading dims + (O,)`` with
        ``keep_num_dims``.  Quantization as in :meth:`conv2d` (per-channel
        scales along axis 0).
        """
        xi = self._index(x)
        xr = self._tensors[xi]
        w = np.asarray(weights)
        if w.ndim != 2:
            raise TFLiteBuildError(f"fully_connected weights must be OI (2-D), got shape {w.shape}")
        out_f, in_f = w.shape
        if xr.shape[-1:] != (in_f,):
            raise TFLiteBuildError(
                f"fully_connected: weights take {in_f} input features, input shape is {xr.shape}"
            )
        act = _activation(activation)
        name = self._fresh_name(name, "fully_connected")

        def out_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
            leading = shape[:-1]
            if keep_num_dims:
                return leading + (out_f,)
            batch = -1 if any(d < 0 for d in leading) else int(np.prod(leading, dtype=np.int64))
            return (batch, out_f)

        w_index, b_index, out_q, quantized = self._weights_and_bias(
            xr, w, bias, 0, out_f, weight_scale, per_channel, out_quant, name
        )
        out = self._op_output(name, out_shape(xr.shape), out_shape(xr.signature), xr.dtype, out_q)
        options = _schema.FullyConnectedOptionsT()
        options.fusedActivationFunction = act
        options.keepNumDims = bool(keep_num_dims)
        version = 4 if quantized else 1
        if keep_num_dims:
            version = max(version, 5)
        self._add_op(
            _BuiltinOp.FULLY_CONNECTED,
            version,
            [xi, w_index, b_index],
            [out],
            _Options.FullyConnectedOptions,
            options,
        )
        return self._handle(out)

    # ---- pooling / reductions --------------------------------------------

    def max_pool2d(
        self,
        x: Tensor,
        size: IntPair,
        stride: IntPair | None = None,
        *,
        padding: str = "VALID",
        activation: str | None = "NONE",
        name: str | None = None,
    ) -> Tensor:
        """Max pooling (``MAX_POOL_2D``) over ``size`` windows; ``stride`` defaults to ``size``.

        int8 outputs keep the input's quantization (the kernel requires it).
        """
        return self._pool(_BuiltinOp.MAX_POOL_2D, "max_pool2d", x, size, stride, padding, activation, name)

    def avg_pool2d(
        self,
        x: Tensor,
        size: IntPair,
        stride: IntPair | None = None,
        *,
        padding: str = "VALID",
        activation: str | None = "NONE",
        name: str | None = None,
    ) -> Tensor:
        """Average pooling (``AVERAGE_POOL_2D``); with SAME padding the padded
        positions are left out of the average (TensorFlow semantics)."""
        return self._pool(_BuiltinOp.AVERAGE_POOL_2D, "avg_pool2d", x, size, stride, padding, activation, name)

    def mean(
        self,
        x: Tensor,
        axes: int | Sequence[int],
        keepdims: bool = False,
        *,
        out_quant: QuantLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Mean over ``axes`` (``MEAN``); e.g. ``axes=(1, 2)`` is global average pooling.

        int8 outputs default to the input's quantization.
        """
        xi = self._index(x)
        xr = self._tensors[xi]
        rank = len(xr.shape)
        raw_axes = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
        norm = sorted({int(a) + rank if int(a) < 0 else int(a) for a in raw_axes})
        if not norm or any(not 0 <= a < rank for a in norm):
            raise TFLiteBuildError(f"mean: axes {raw_axes} are invalid for rank {rank}")
        name = self._fresh_name(name, "mean")
        out_q = self._same_or_given_quant(xr, out_quant, "mean")

        def out_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
            if keepdims:
                return tuple(1 if i in norm else d for i, d in enumerate(shape))
            return tuple(d for i, d in enumerate(shape) if i not in norm)

        axes_index = self._const(f"{name}/axes", np.array(norm, dtype=np.int32), "int32", None)
        out = self._op_output(name, out_shape(xr.shape), out_shape(xr.signature), xr.dtype, out_q)
        options = _schema.ReducerOptionsT()
        options.keepDims = bool(keepdims)
        self._add_op(
            _BuiltinOp.MEAN,
            self._int8_version(xr),
            [xi, axes_index],
            [out],
            _Options.ReducerOptions,
            options,
        )
        return self._handle(out)

    # ---- elementwise -----------------------------------------------------

    def add(
        self,
        a: Tensor,
        b: TensorOrArray,
        *,
        activation: str | None = "NONE",
        out_quant: QuantLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Elementwise ``a + b`` (``ADD``) with numpy broadcasting.

        ``b`` may be a numpy array for float graphs (it becomes a constant); for
        int8 graphs pass a quantized tensor (see :meth:`constant`).  int8 adds
        need ``out_quant``.
        """
        ai = self._index(a)
        ar = self._tensors[ai]
        if isinstance(b, Tensor):
            bi = self._index(b)
        else:
            if ar.dtype != "float32":
                raise TFLiteBuildError(
                    "add: for a quantized graph make the constant operand with constant(value, quant=...)"
                )
            bi = self._const(self._fresh_name(None, "add_constant"), np.asarray(b), "float32", None)
        br = self._tensors[bi]
        if ar.dtype != br.dtype:
            raise TFLiteBuildError(f"add: operand dtypes differ ({ar.dtype} vs {br.dtype})")
        self._check_compute_dtype(ar, "add")
        self._check_compute_dtype(br, "add")
        act = _activation(activation)
        out_q = self._required_out_quant(ar, out_quant, "add")
        name = self._fresh_name(name, "add")
        shape = _broadcast(ar.shape, br.shape, "add")
        signature = _broadcast(ar.signature, br.signature, "add")
        out = self._op_output(name, shape, signature, ar.dtype, out_q)
        options = _schema.AddOptionsT()
        options.fusedActivationFunction = act
        self._add_op(_BuiltinOp.ADD, self._int8_version(ar), [ai, bi], [out], _Options.AddOptions, options)
        return self._handle(out)

    def relu(self, x: Tensor, *, out_quant: QuantLike | None = None, name: str | None = None) -> Tensor:
        """``max(x, 0)`` (``RELU``); int8 outputs default to the input's quantization."""
        return self._unary(_BuiltinOp.RELU, "relu", x, out_quant, name)

    def relu6(self, x: Tensor, *, out_quant: QuantLike | None = None, name: str | None = None) -> Tensor:
        """``min(max(x, 0), 6)`` (``RELU6``); int8 outputs default to the input's quantization."""
        return self._unary(_BuiltinOp.RELU6, "relu6", x, out_quant, name)

    def softmax(self, x: Tensor, beta: float = 1.0, *, name: str | None = None) -> Tensor:
        """Softmax over the last axis (``SOFTMAX``) of ``beta * x``.

        An int8 softmax always outputs scale 1/256, zero point -128 (required by
        the TFLite kernel and the quantization spec).
        """
        xi = self._index(x)
        xr = self._tensors[xi]
        self._check_compute_dtype(xr, "softmax")
        out_q = None
        if xr.dtype == "int8":
            out_q = QuantParams(scale=(1.0 / 256.0,), zero_point=(-128,))
        name = self._fresh_name(name, "softmax")
        out = self._op_output(name, xr.shape, xr.signature, xr.dtype, out_q)
        options = _schema.SoftmaxOptionsT()
        options.beta = float(beta)
        self._add_op(_BuiltinOp.SOFTMAX, self._int8_version(xr), [xi], [out], _Options.SoftmaxOptions, options)
        return self._handle(out)

    # ---- shape -----------------------------------------------------------

    def reshape(self, x: Tensor, new_shape: Sequence[int], *, name: str | None = None) -> Tensor:
        """Reshape (``RESHAPE``); one entry of ``new_shape`` may be -1.

        With a dynamic input (``-1`` in its shape signature) write the
        resizable dimension as -1, e.g. ``(-1, features)``; the -1 is carried
        into the output's shape signature.  Quantization passes through.
        """
        xi = self._index(x)
        xr = self._tensors[xi]
        target = tuple(int(d) for d in new_shape)
        if target.count(-1) > 1 or any(d < -1 or d == 0 for d in target):
            raise TFLiteBuildError(f"reshape: new_shape {target} may hold positive sizes and at most one -1")
        total = int(np.prod(xr.shape, dtype=np.int64))
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if -1 in target:
            if total % known:
                raise TFLiteBuildError(f"reshape: cannot reshape {xr.shape} to {target}")
            resolved = tuple(total // known if d == -1 else d for d in target)
        else:
            if known != total:
                raise TFLiteBuildError(f"reshape: cannot reshape {xr.shape} ({total} elements) to {target}")
            resolved = target
        dynamic = any(d < 0 for d in xr.signature)
        signature = target if dynamic else resolved
        name = self._fresh_name(name, "reshape")
        shape_index = self._const(f"{name}/shape", np.array(target, dtype=np.int32), "int32", None)
        out = self._op_output(name, resolved, signature, xr.dtype, xr.quant)
        options = _schema.ReshapeOptionsT()
        options.newShape = list(target)
        self._add_op(_BuiltinOp.RESHAPE, 1, [xi, shape_index], [out], _Options.ReshapeOptions, options)
        return self._handle(out)

    # ---- quantization ----------------------------------------------------

    def quantize(
        self,
        x: Tensor,
        scale: float,
        zero_point: int,
        dtype: str = "int8",
        *,
        name: str | None = None,
    ) -> Tensor:
        """``QUANTIZE`` to int8: ``q = clamp(round(x / scale) + zero_point, -128, 127)``.

        The input is float32, or a quantized int8/uint8 tensor that is
        requantized (e.g. a uint8 camera-frame input feeding an int8 graph).
        """
        xi = self._index(x)
        xr = self._tensors[xi]
        if dtype != "int8":
            raise TFLiteBuildError(f"quantize: only int8 outputs are supported, got {dtype!r}")
        if xr.dtype not in ("float32", "int8", "uint8"):
            raise TFLiteBuildError(f"quantize: input must be float32, int8 or uint8, got {xr.dtype}")
        if xr.dtype != "float32" and (xr.quant is None or xr.quant.per_channel):
            raise TFLiteBuildError(f"quantize: {xr.dtype} input {xr.name!r} needs per-tensor quantization")
        out_q = _per_tensor_quant((scale, zero_point), dtype, "quantize")
        name = self._fresh_name(name, "quantize")
        out = self._op_output(name, xr.shape, xr.signature, dtype, out_q)
        self._add_op(_BuiltinOp.QUANTIZE, 1, [xi], [out], _Options.QuantizeOptions, _schema.QuantizeOptionsT())
        return self._handle(out)

    def dequantize(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``DEQUANTIZE`` an int8 tensor to float32: ``scale * (q - zero_point)``."""
        xi = self._index(x)
        xr = self._tensors[xi]
        if xr.dtype != "int8":
            raise TFLiteBuildError(f"dequantize: input must be int8, got {xr.dtype}")
        self._check_compute_dtype(xr, "dequantize")
        name = self._fresh_name(name, "dequantize")
        out = self._op_output(name, xr.shape, xr.signature, "float32", None)
        self._add_op(
            _BuiltinOp.DEQUANTIZE, 2, [xi], [out], _Options.DequantizeOptions, _schema.DequantizeOptionsT()
        )
        return self._handle(out)

    # ---- serialization ---------------------------------------------------

    def build(self) -> bytes:
        """Serialize the graph to ``.tflite`` bytes (callable more than once)."""
        if not self._inputs:
            raise TFLiteBuildError("the graph has no inputs; call input() first")
        if not self._outputs:
            raise TFLiteBuildError("the graph has no outputs; call output() first")
        constant_bytes = sum(len(r.data) for r in self._tensors if r.data is not None)
        if constant_bytes > _MAX_CONSTANT_BYTES:
            raise TFLiteBuildError(
                f"{constant_bytes} bytes of weights do not fit a flatbuffer (2 GiB limit)"
            )

        buffers: list[_schema.BufferT] = [_schema.BufferT()]  # buffer 0: the empty sentinel
        tensors: list[_schema.TensorT] = []
        for record in self._tensors:
            tensor = _schema.TensorT()
            tensor.name = record.name
            tensor.type = _DTYPES[record.dtype][0]
            tensor.shape = list(record.shape)
            if record.signature != record.shape:
                tensor.shapeSignature = list(record.signature)
            tensor.hasRank = True
            if record.data is not None:
                buffers.append(_AlignedBufferT(record.data))
                tensor.buffer = len(buffers) - 1
            if record.quant is not None:
                q = _schema.QuantizationParametersT()
                q.scale = [float(s) for s in record.quant.scale]
                q.zeroPoint = [int(z) for z in record.quant.zero_point]
                q.quantizedDimension = record.quant.axis
                tensor.quantization = q
            tensors.append(tensor)

        opcode_index: dict[tuple[int, int], int] = {}
        operator_codes: list[_schema.OperatorCodeT] = []
        operators: list[_schema.OperatorT] = []
        for record in self._operators:
            key = (record.op, record.version)
            if key not in opcode_index:
                code = _schema.OperatorCodeT()
                code.builtinCode = record.op
                code.deprecatedBuiltinCode = min(record.op, _PLACEHOLDER_FOR_GREATER_OP_CODES)
                code.version = record.version
                opcode_index[key] = len(operator_codes)
                operator_codes.append(code)
            op = _schema.OperatorT()
            op.opcodeIndex = opcode_index[key]
            op.inputs = list(record.inputs)
            op.outputs = list(record.outputs)
            op.builtinOptionsType = record.options_type
            op.builtinOptions = record.options
            operators.append(op)

        subgraph = _schema.SubGraphT()
        subgraph.name = "main"
        subgraph.tensors = tensors
        subgraph.inputs = list(self._inputs)
        subgraph.outputs = list(self._outputs)
        subgraph.operators = operators

        signature = _schema.SignatureDefT()
        signature.signatureKey = self.signature_key
        signature.subgraphIndex = 0
        signature.inputs = [self._tensor_map(i) for i in self._inputs]
        signature.outputs = [self._tensor_map(i) for i in self._outputs]

        model = _schema.ModelT()
        model.version = SCHEMA_VERSION
        model.description = self.description
        model.operatorCodes = operator_codes
        model.subgraphs = [subgraph]
        model.buffers = buffers
        model.signatureDefs = [signature]

        builder = flatbuffers.Builder(1024 + constant_bytes)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())

    # ---- internals -------------------------------------------------------

    def _handle(self, index: int) -> Tensor:
        r = self._tensors[index]
        return Tensor(index, r.name, r.shape, r.signature, r.dtype, r.quant, self._id)

    def _index(self, tensor: Tensor) -> int:
        if not isinstance(tensor, Tensor):
            raise TFLiteBuildError(f"expected a Tensor made by this builder, got {type(tensor).__name__}")
        if tensor._builder_id != self._id or not 0 <= tensor.index < len(self._tensors):
            raise TFLiteBuildError(f"tensor {tensor.name!r} belongs to another builder")
        return tensor.index

    def _tensor_map(self, index: int) -> _schema.TensorMapT:
        entry = _schema.TensorMapT()
        entry.name = self._tensors[index].name
        entry.tensorIndex = index
        return entry

    def _fresh_name(self, name: str | None, kind: str) -> str:
        """A tensor name not used yet: ``name`` if free, else ``name_1``, ``name_2`` ..."""
        if name is None:
            count = self._op_counts.get(kind, 0)
            self._op_counts[kind] = count + 1
            name = f"{kind}_{count}"
        candidate, suffix = name, 1
        while candidate in self._names:
            candidate = f"{name}_{suffix}"
            suffix += 1
        return candidate

    def _new_tensor(
        self,
        name: str,
        shape: tuple[int, ...],
        signature: tuple[int, ...],
        dtype: str,
        quant: QuantParams | None,
        data: bytes | None = None,
    ) -> int:
        name = self._fresh_name(name, "tensor")
        self._names.add(name)
        self._tensors.append(_TensorRecord(name, shape, signature, dtype, quant, data))
        return len(self._tensors) - 1

    def _op_output(
        self,
        name: str,
        shape: tuple[int, ...],
        signature: tuple[int, ...],
        dtype: str,
        quant: QuantParams | None,
    ) -> int:
        if any(d == 0 for d in shape):
            raise TFLiteBuildError(f"{name}: output shape {shape} is empty (input too small for the window?)")
        return self._new_tensor(name, shape, signature, dtype, quant)

    def _const(self, name: str, array: np.ndarray, dtype: str, quant: QuantParams | None) -> int:
        np_dtype = _DTYPES[dtype][1]
        if array.size == 0:
            raise TFLiteBuildError(f"{name}: constants cannot be empty")
        if array.dtype.kind == "f" and np_dtype.kind != "f":
            raise TFLiteBuildError(f"{name}: refusing to truncate float values to {dtype}")
        if array.dtype.kind in "iu" and np_dtype.kind in "iu":
            info = np.iinfo(np_dtype)
            if array.min() < info.min or array.max() > info.max:
                raise TFLiteBuildError(f"{name}: values do not fit {dtype}")
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise TFLiteBuildError(f"{name}: constant contains NaN or inf")
        data = np.ascontiguousarray(array, dtype=np_dtype)
        shape = tuple(int(d) for d in data.shape)
        return self._new_tensor(name, shape, shape, dtype, quant, data.tobytes())

    def _add_op(
        self,
        op: int,
        version: int,
        inputs: list[int],
        outputs: list[int],
        options_type: int = _Options.NONE,
        options: object | None = None,
    ) -> None:
        self._operators.append(_OperatorRecord(op, version, inputs, outputs, options_type, options))

    @staticmethod
    def _require_rank(record: _TensorRecord, rank: int, what: str) -> None:
        if len(record.shape) != rank:
            raise TFLiteBuildError(f"{what}: input must be rank {rank} (NHWC), got shape {record.shape}")

    @staticmethod
    def _check_compute_dtype(record: _TensorRecord, what: str) -> None:
        """Ops compute in float32 or in per-tensor quantized int8."""
        if record.dtype == "float32":
            return
        if record.dtype != "int8":
            raise TFLiteBuildError(f"{what}: tensors must be float32 or int8, {record.name!r} is {record.dtype}")
        if record.quant is None or record.quant.per_channel:
            raise TFLiteBuildError(f"{what}: int8 tensor {record.name!r} needs per-tensor quantization")

    @staticmethod
    def _int8_version(record: _TensorRecord) -> int:
        """Version 2 is where the pooling/add/mean/softmax/relu kernels gained int8."""
        return 2 if record.dtype == "int8" else 1

    def _required_out_quant(self, record: _TensorRecord, out_quant: QuantLike | None, what: str) -> QuantParams | None:
        if record.dtype == "float32":
            if out_quant is not None:
                raise TFLiteBuildError(f"{what}: out_quant applies to int8 ops only; the input is float32")
            return None
        if out_quant is None:
            raise TFLiteBuildError(f"{what}: an int8 op needs out_quant=(scale, zero_point)")
        return _per_tensor_quant(out_quant, "int8", f"{what} output")

    def _same_or_given_quant(
        self, record: _TensorRecord, out_quant: QuantLike | None, what: str
    ) -> QuantParams | None:
        """Output quantization of a shape-preserving op: the input's unless given."""
        self._check_compute_dtype(record, what)
        if out_quant is None:
            return record.quant
        return self._required_out_quant(record, out_quant, what)

    def _unary(self, op: int, kind: str, x: Tensor, out_quant: QuantLike | None, name: str | None) -> Tensor:
        xi = self._index(x)
        xr = self._tensors[xi]
        out_q = self._same_or_given_quant(xr, out_quant, kind)
        name = self._fresh_name(name, kind)
        out = self._op_output(name, xr.shape, xr.signature, xr.dtype, out_q)
        self._add_op(op, self._int8_version(xr), [xi], [out])
        return self._handle(out)

    def _pool(
        self,
        op: int,
        kind: str,
        x: Tensor,
        size: IntPair,
        stride: IntPair | None,
        padding: str,
        activation: str | None,
        name: str | None,
    ) -> Tensor:
        xi = self._index(x)
        xr = self._tensors[xi]
        self._require_rank(xr, 4, kind)
        self._check_compute_dtype(xr, kind)
        kh, kw = _pair(size, "size")
        sh, sw = _pair(size if stride is None else stride, "stride")
        pad = _padding(padding)
        act = _activation(activation)
        name = self._fresh_name(name, kind)

        def out_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
            return (
                shape[0],
                _window_out(shape[1], kh, sh, 1, pad),
                _window_out(shape[2], kw, sw, 1, pad),
                shape[3],
            )

        out = self._op_output(name, out_shape(xr.shape), out_shape(xr.signature), xr.dtype, xr.quant)
        options = _schema.Pool2DOptionsT()
        options.padding = pad
        options.strideH, options.strideW = sh, sw
        options.filterHeight, options.filterWidth = kh, kw
        options.fusedActivationFunction = act
        self._add_op(op, self._int8_version(xr), [xi], [out], _Options.Pool2DOptions, options)
        return self._handle(out)

    def _weights_and_bias(
        self,
        xr: _TensorRecord,
        weights: np.ndarray,
        bias: npt.ArrayLike | None,
        channel_axis: int,
        channels: int,
        weight_scale: npt.ArrayLike | None,
        per_channel: bool,
        out_quant: QuantLike | None,
        name: str,
    ) -> tuple[int, int, QuantParams | None, bool]:
        """Add weight and bias constants; returns (weights, bias, output quant, quantized?)."""
        self._check_compute_dtype(xr, name)
        if xr.dtype == "float32":
            if out_quant is not None:
                raise TFLiteBuildError(f"{name}: out_quant applies to int8 ops only; the input is float32")
            if weights.dtype == np.int8 or weight_scale is not None:
                raise TFLiteBuildError(
                    f"{name}: a float32 input takes float weights (hybrid int8-weight ops are not supported)"
                )
            if weights.dtype.kind not in "fiu":
                raise TFLiteBuildError(f"{name}: weights must be numeric, got {weights.dtype}")
            b = np.zeros(channels, dtype=np.float32) if bias is None else np.asarray(bias)
            if b.shape != (channels,):
                raise TFLiteBuildError(f"{name}: bias must have shape ({channels},), got {b.shape}")
            if b.dtype.kind not in "fiu":
                raise TFLiteBuildError(f"{name}: bias must be numeric, got {b.dtype}")
            w_index = self._const(f"{name}/weights", weights.astype(np.float32), "float32", None)
            b_index = self._const(f"{name}/bias", b.astype(np.float32), "float32", None)
            return w_index, b_index, None, False

        out_q = self._required_out_quant(xr, out_quant, name)
        assert xr.quant is not None  # _check_compute_dtype guarantees it
        q_weights, w_scales = _quantize_weights(weights, channel_axis, weight_scale, per_channel, name)
        # The kernel accumulates in units of (float32 input scale) x (float32 weight scale).
        bias_scales = float(np.float32(xr.quant.scale[0])) * w_scales.astype(np.float64)
        q_bias = _quantize_bias(bias, channels, bias_scales, name)
        zeros = (0,) * w_scales.size
        w_quant = QuantParams(tuple(float(s) for s in w_scales), zeros, channel_axis if w_scales.size > 1 else 0)
        b_quant = QuantParams(tuple(float(np.float32(s)) for s in bias_scales), zeros, 0)
        w_index = self._const(f"{name}/weights", q_weights, "int8", w_quant)
        b_index = self._const(f"{name}/bias", q_bias, "int32", b_quant)
        return w_index, b_index, out_q, True
