"""Translate a float TFLite model (MediaPipe's BlazeFace, selfie segmentation, face landmark and models
like them) into ONNX, so ``edge-convert quantize`` can take a ``.tflite`` as its input.

Why: MediaPipe ships its models only as ``.tflite``; the converter quantizes ONNX (ONNX Runtime's
quantizer), and ONNX Runtime's CUDA/TensorRT providers run ONNX, not TFLite. This is a small, exact
translator for the ops such convolutional networks use, not a general converter.

How: the flatbuffer is read with the schema shipped in ``ai-edge-litert``
(``ai_edge_litert.schema_py_generated``, object API: ops, their builtin options, tensors, constant
buffers), and every operator of subgraph 0 becomes one or a few ONNX nodes built with
``onnx.helper``:

=============================  ================================================================
TFLite                         ONNX
=============================  ================================================================
CONV_2D                        Conv (OHWI -> OIHW weights; TF SAME padding as explicit pads)
DEPTHWISE_CONV_2D              Conv with ``group`` = input channels (1HWC -> C1HW weights)
MAX_POOL_2D / AVERAGE_POOL_2D  MaxPool / AveragePool (explicit pads; SAME averages leave the
                               padding out, ``count_include_pad=0``, as TensorFlow does)
ADD / MUL                      Add / Mul (a constant operand laid out NCHW)
RELU / RELU6 / LOGISTIC        Relu / Clip(0, 6) / Sigmoid
HARD_SWISH                     ``x * Clip(x + 3, 0, 6) / 6``: the reference kernel's arithmetic
                               (tensorflow/lite/kernels/internal/reference/hard_swish.h, float path)
PRELU                          PRelu (alpha a constant, laid out NCHW)
MEAN                           ReduceMean (axes mapped to NCHW; without keep_dims the result is
                               put back in NHWC order before the reduced axes are squeezed)
RESIZE_BILINEAR                Resize ``mode=linear``; ``align_corners`` -> coordinate mode
                               ``align_corners``, ``half_pixel_centers`` -> ``half_pixel``, neither
                               -> ``asymmetric`` (see :meth:`_Translator.op_resize_bilinear`)
PAD                            Pad (paddings permuted to NCHW)
RESHAPE                        Transpose to NHWC, Reshape (and back to NCHW when the result is 4-D)
CONCATENATION                  Concat (axis mapped to NCHW for 4-D tensors)
DEQUANTIZE                     folded: an fp16 constant becomes an fp32 initializer
FULLY_CONNECTED                Gemm (``transB``; OI weights, optional bias); the input flattened to
                               ``[-1, in]`` in NHWC element order, or MatMul + Add with
                               ``keep_num_dims`` (tensorflow/lite/kernels/fully_connected.cc)
STRIDED_SLICE                  Slice (begin/end masks and negative indices as
                               tensorflow/lite/kernels/internal/strided_slice_logic.h; axes mapped to
                               NCHW), + Squeeze for ``shrink_axis_mask``; ellipsis / new-axis masks refused
CUSTOM Convolution2DTransposeBias  ConvTranspose with bias (MediaPipe's custom op; OHWI -> IOHW
                               weights, its SAME padding cropped as the op does)
=============================  ================================================================

Fused activations (NONE, RELU, RELU6, RELU_N1_TO_1, TANH) become a node after the op.

Layout: TFLite activations are NHWC; ONNX Conv/MaxPool/Pad want NCHW. Every 4-D activation is
kept NCHW inside the graph: one Transpose after a 4-D graph input, one before a 4-D graph output
and around RESHAPE (whose element order is NHWC's). The model's inputs and outputs keep their
TFLite names, shapes and layouts, so the ONNX model is a drop-in variant for the same manifest.

Anything else raises :class:`UnsupportedOpError` (a :class:`TFLiteToOnnxError`, a
:class:`~converters.errors.ConverterError` and a ValueError) naming the op, its index and the
supported set; quantized (int8/uint8) tensors and sparse (DENSIFY) weights raise
:class:`TFLiteToOnnxError` too. Nothing is approximated: the ONNX model computes what the TFLite
model computes, to float32 rounding (``tests/test_tflite_to_onnx.py`` checks it against LiteRT on
real images and on small graphs for every op and mode).

Usage::

    python -m converters.tflite_import model.tflite model.onnx
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import ConverterError

__all__ = ["OPSET", "SUPPORTED_OPS", "TFLiteToOnnxError", "UnsupportedOpError", "convert_file", "translate", "main"]

#: Opset of the emitted model (Clip with min/max inputs, Pad with a pads input, Squeeze with an axes input).
OPSET = 13

#: MediaPipe's transpose convolution with bias (mediapipe/util/tflite/operations/transpose_conv_bias.cc).
TRANSPOSE_CONV_BIAS = "CUSTOM:Convolution2DTransposeBias"

SUPPORTED_OPS = (
    "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEQUANTIZE", "FULLY_CONNECTED", "HARD_SWISH",
    "LOGISTIC", "MAX_POOL_2D", "MEAN", "MUL", "PAD", "PRELU", "RELU", "RELU6", "RESHAPE", "RESIZE_BILINEAR", "STRIDED_SLICE",
    TRANSPOSE_CONV_BIAS,
)  # fmt: skip

#: NHWC axis -> NCHW axis.
_NHWC_TO_NCHW_AXIS = {0: 0, 1: 2, 2: 3, 3: 1}


class TFLiteToOnnxError(ConverterError, ValueError):
    """The TFLite model cannot be translated (bad file, quantized tensors, unsupported options)."""


class UnsupportedOpError(TFLiteToOnnxError):
    """An operator the translator does not handle; ``op`` is its TFLite name, ``index`` its position."""

    def __init__(self, op: str, index: int, detail: str = "") -> None:
        self.op, self.index = op, index
        extra = f" ({detail})" if detail else ""
        super().__init__(f"unsupported TFLite op {op} at operator {index}{extra}; supported: {', '.join(SUPPORTED_OPS)}")


def _schema() -> Any:
    try:
        from ai_edge_litert import schema_py_generated as s
    except ImportError as e:  # pragma: no cover - the litert extra installs it
        raise TFLiteToOnnxError("reading .tflite needs ai-edge-litert (pip install 'edge_sdk[litert]')") from e
    return s


@dataclass
class _Act:
    """An activation in the ONNX graph: its value name and whether it is held NCHW (4-D only)."""

    name: str
    nchw: bool


class _Translator:
    def __init__(self, data: bytes) -> None:
        import onnx  # noqa: F401 - fail early with ImportError if missing
        from onnx import helper

        self.h = helper
        s = _schema()
        self.s = s
        if len(data) < 8 or data[4:8] != b"TFL3":
            raise TFLiteToOnnxError(f"not a TFLite flatbuffer: expected file identifier 'TFL3' at bytes 4..8, got {bytes(data[4:8])!r}")
        from edge_sdk.package.modelfile import inspect_tflite

        try:
            inspect_tflite(data)  # bounds-checks the flatbuffer before the object API reads it
            self.m = s.ModelT.InitFromPackedBuf(data, 0)
        except Exception as e:  # noqa: BLE001 - a corrupt flatbuffer fails in many ways
            raise TFLiteToOnnxError(f"not a readable TFLite model: {type(e).__name__}: {e}") from e
        self.data = data
        if not self.m.subgraphs:
            raise TFLiteToOnnxError("the TFLite model has no subgraph")
        self.sg = self.m.subgraphs[0]
        self.op_names = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}
        self.type_names = {v: k for k, v in vars(s.TensorType).items() if not k.startswith("_") and isinstance(v, int)}
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.acts: dict[int, _Act] = {}
        self.consts: dict[int, np.ndarray] = {}
        self._n = 0

    # ------------------------------------------------------------------ tensors

    def tensor(self, i: int) -> Any:
        return self.sg.tensors[i]

    def tname(self, i: int) -> str:
        n = self.tensor(i).name
        return n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n)

    def shape(self, i: int) -> list[int]:
        t = self.tensor(i)
        return [int(d) for d in t.shape] if t.shape is not None else []

    def signature(self, i: int) -> list[int]:
        """The tensor's shape with -1 where a dim is dynamic (``shape_signature``; else its shape)."""
        t = self.tensor(i)
        sig = t.shapeSignature
        return [int(d) for d in sig] if sig is not None and len(sig) else self.shape(i)

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def _buffer_bytes(self, i: int) -> bytes | None:
        t = self.tensor(i)
        if t.buffer <= 0 or t.buffer >= len(self.m.buffers):
            return None
        b = self.m.buffers[t.buffer]
        if b.data is not None and len(b.data):
            return np.asarray(b.data, np.uint8).tobytes()
        if b.offset > 1 and b.size > 0:  # large models keep buffers after the flatbuffer
            return bytes(self.data[b.offset : b.offset + b.size])
        return None

    def load_constants(self) -> None:
        dtypes = {"FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "INT64": np.int64}
        for i, t in enumerate(self.sg.tensors):
            raw = self._buffer_bytes(i)
            if raw is None:
                continue
            tn = self.type_names.get(t.type, str(t.type))
            q = t.quantization
            if tn not in dtypes or (q is not None and q.scale is not None and len(q.scale) > 0):
                raise TFLiteToOnnxError(
                    f"constant tensor {self.tname(i)!r} is {tn.lower()}{' quantized' if q is not None and q.scale is not None and len(q.scale) else ''}; "
                    "expected a float32/float16/int32/int64 model (quantized TFLite models are not supported)"
                )
            if t.sparsity is not None:
                raise TFLiteToOnnxError(f"constant tensor {self.tname(i)!r} is stored sparse; expected dense weights (sparse TFLite models are not supported)")
            self.consts[i] = np.frombuffer(raw, dtypes[tn]).reshape(self.shape(i)).copy()

    def const(self, i: int, what: str, op: str, index: int) -> np.ndarray:
        if i not in self.consts:
            raise UnsupportedOpError(op, index, f"{what} must be a constant tensor")
        return self.consts[i]

    def act(self, i: int, op: str, index: int) -> _Act:
        if i in self.acts:
            return self.acts[i]
        if i in self.consts:  # a constant used as an activation: materialise it in ONNX layout
            c = self.consts[i].astype(np.float32) if self.consts[i].dtype == np.float16 else self.consts[i]
            nchw = c.ndim == 4
            name = self.init(np.transpose(c, (0, 3, 1, 2)) if nchw else c, "const")
            self.acts[i] = _Act(name, nchw)
            return self.acts[i]
        raise TFLiteToOnnxError(f"operator {index} ({op}) reads tensor {self.tname(i)!r} before anything produced it")

    def init(self, value: np.ndarray, hint: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], hint: str, **attrs: Any) -> str:
        out = self.fresh(hint)
        self.nodes.append(self.h.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    # ------------------------------------------------------------------ helpers

    def fused(self, name: str, fn: int, op: str, index: int) -> str:
        A = self.s.ActivationFunctionType
        if fn == A.NONE:
            return name
        if fn == A.RELU:
            return self.node("Relu", [name], "relu")
        if fn == A.RELU6:
            return self.clip(name, 0.0, 6.0)
        if fn == A.RELU_N1_TO_1:
            return self.clip(name, -1.0, 1.0)
        if fn == A.TANH:
            return self.node("Tanh", [name], "tanh")
        raise UnsupportedOpError(op, index, f"fused activation {fn}")

    def clip(self, name: str, lo: float, hi: float) -> str:
        return self.node("Clip", [name, self.init(np.array(lo, np.float32), "lo"), self.init(np.array(hi, np.float32), "hi")], "clip")

    @staticmethod
    def same_pads(size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
        """TF 'SAME': output ceil(size / stride), the extra pixel of an odd total goes at the end."""
        out = -(-size // stride)
        total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
        return total // 2, total - total // 2

    def window_pads(self, in_idx: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, padding: int) -> list[int]:
        if padding == self.s.Padding.VALID:
            return [0, 0, 0, 0]
        shp = self.shape(in_idx)
        if len(shp) != 4 or shp[1] <= 0 or shp[2] <= 0:
            raise TFLiteToOnnxError(f"SAME padding needs a static NHWC input shape, got {shp} for {self.tname(in_idx)!r}")
        t, b = self.same_pads(shp[1], kh, sh, dh)
        l, r = self.same_pads(shp[2], kw, sw, dw)
        return [t, l, b, r]

    def to_nchw(self, a: _Act) -> str:
        return a.name if a.nchw else self.node("Transpose", [a.name], "to_nchw", perm=[0, 3, 1, 2])

    def to_nhwc(self, a: _Act) -> str:
        return self.node("Transpose", [a.name], "to_nhwc", perm=[0, 2, 3, 1]) if a.nchw else a.name

    def opts(self, op: Any, name: str, index: int) -> Any:
        o = op.builtinOptions
        if o is None:
            raise TFLiteToOnnxError(f"operator {index} ({name}) has no builtin options")
        return o

    def four_d(self, i: int, op: str, index: int) -> _Act:
        a = self.act(i, op, index)
        if len(self.shape(i)) != 4:
            raise UnsupportedOpError(op, index, f"expected a 4-D NHWC input, got shape {self.shape(i)}")
        if not a.nchw:
            a = _Act(self.to_nchw(a), True)
        return a

    def nchw_const(self, c: np.ndarray, rank: int) -> np.ndarray:
        """A constant operand of a ``rank``-D op as float32; for rank 4, broadcast in NHWC and laid out NCHW."""
        c = c.astype(np.float32)
        if rank == 4:
            c = np.transpose(c.reshape((1,) * (4 - c.ndim) + c.shape), (0, 3, 1, 2))
        return c

    # ------------------------------------------------------------------ ops

    def op_conv(self, op: Any, name: str, index: int, depthwise: bool) -> None:
        o = self.opts(op, name, index)
        x = self.four_d(op.inputs[0], name, index)
        w = self.const(op.inputs[1], "the filter", name, index).astype(np.float32)
        if w.ndim != 4:
            raise UnsupportedOpError(name, index, f"filter of shape {w.shape}")
        cin = self.shape(op.inputs[0])[3]
        if depthwise:  # 1HW(C*M) -> (C*M)1HW, one group per input channel
            kh, kw = w.shape[1], w.shape[2]
            w_onnx = np.transpose(w, (3, 0, 1, 2))
            group = cin
        else:  # OHWI -> OIHW
            kh, kw = w.shape[1], w.shape[2]
            w_onnx = np.transpose(w, (0, 3, 1, 2))
            group = 1
            if w.shape[3] != cin:
                raise UnsupportedOpError(name, index, f"grouped convolution (input {cin} channels, filter {w.shape[3]})")
        sh, sw = int(o.strideH), int(o.strideW)
        dh, dw = int(o.dilationHFactor or 1), int(o.dilationWFactor or 1)
        ins = [x.name, self.init(w_onnx, "w")]
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            ins.append(self.init(self.const(op.inputs[2], "the bias", name, index).astype(np.float32), "b"))
        y = self.node(
            "Conv", ins, "conv", kernel_shape=[kh, kw], strides=[sh, sw], dilations=[dh, dw], group=group,
            pads=self.window_pads(op.inputs[0], kh, kw, sh, sw, dh, dw, o.padding),
        )  # fmt: skip
        self.acts[op.outputs[0]] = _Act(self.fused(y, o.fusedActivationFunction, name, index), True)

    def op_pool(self, op: Any, name: str, index: int) -> None:
        o = self.opts(op, name, index)
        x = self.four_d(op.inputs[0], name, index)
        kh, kw, sh, sw = int(o.filterHeight), int(o.filterWidth), int(o.strideH), int(o.strideW)
        pads = self.window_pads(op.inputs[0], kh, kw, sh, sw, 1, 1, o.padding)
        if name == "MAX_POOL_2D":
            y = self.node("MaxPool", [x.name], "maxpool", kernel_shape=[kh, kw], strides=[sh, sw], pads=pads)
        else:  # TensorFlow's SAME average leaves the padded positions out of the count
            y = self.node("AveragePool", [x.name], "avgpool", kernel_shape=[kh, kw], strides=[sh, sw], pads=pads, count_include_pad=0)
        self.acts[op.outputs[0]] = _Act(self.fused(y, o.fusedActivationFunction, name, index), True)

    def op_binary(self, op: Any, name: str, index: int) -> None:
        o = self.opts(op, name, index)
        out_rank = len(self.shape(op.outputs[0]))
        names = []
        for i in op.inputs:
            if i in self.consts and i not in self.acts:
                names.append(self.init(self.nchw_const(self.consts[i], out_rank), "const"))
                continue
            a = self.act(i, name, index)
            if out_rank == 4 and len(self.shape(i)) != 4:
                raise UnsupportedOpError(name, index, f"broadcast of a {len(self.shape(i))}-D activation against a 4-D one")
            names.append(self.to_nchw(a) if out_rank == 4 else a.name)
        y = self.node("Add" if name == "ADD" else "Mul", names, name.lower())
        self.acts[op.outputs[0]] = _Act(self.fused(y, o.fusedActivationFunction, name, index), out_rank == 4)

    def op_unary(self, op: Any, name: str, index: int) -> None:
        a = self.act(op.inputs[0], name, index)
        if name == "RELU":
            y = self.node("Relu", [a.name], "relu")
        elif name == "RELU6":
            y = self.clip(a.name, 0.0, 6.0)
        elif name == "HARD_SWISH":  # x * min(6, max(0, x + 3)) / 6, in the reference kernel's order
            three, six = self.init(np.array(3.0, np.float32), "three"), self.init(np.array(6.0, np.float32), "six")
            relu6 = self.clip(self.node("Add", [a.name, three], "hs_add"), 0.0, 6.0)
            y = self.node("Div", [self.node("Mul", [a.name, relu6], "hs_mul"), six], "hard_swish")
        else:
            y = self.node("Sigmoid", [a.name], "sigmoid")
        self.acts[op.outputs[0]] = _Act(y, a.nchw)

    def op_prelu(self, op: Any, name: str, index: int) -> None:
        """PRELU: ``x if x >= 0 else alpha * x`` (TFLite), ONNX PRelu's definition; alpha broadcast in NHWC."""
        rank = len(self.shape(op.inputs[0]))
        alpha = self.const(op.inputs[1], "alpha", name, index)
        if alpha.ndim > rank:
            raise UnsupportedOpError(name, index, f"alpha of shape {alpha.shape} for a {rank}-D input")
        a = self.four_d(op.inputs[0], name, index) if rank == 4 else self.act(op.inputs[0], name, index)
        y = self.node("PRelu", [a.name, self.init(self.nchw_const(alpha, rank), "alpha")], "prelu")
        self.acts[op.outputs[0]] = _Act(y, rank == 4)

    def op_mean(self, op: Any, name: str, index: int) -> None:
        o = self.opts(op, name, index)
        keep = bool(o.keepDims)
        rank = len(self.shape(op.inputs[0]))
        raw = self.const(op.inputs[1], "the axes", name, index).astype(np.int64).reshape(-1)
        if not rank or not raw.size or any(not -rank <= int(a) < rank for a in raw):
            raise UnsupportedOpError(name, index, f"axes {raw.tolist()} for a {rank}-D input")
        axes = sorted({int(a) % rank for a in raw})
        if rank != 4:
            y = self.node("ReduceMean", [self.act(op.inputs[0], name, index).name], "mean", axes=axes, keepdims=int(keep))
            self.acts[op.outputs[0]] = _Act(y, False)
            return
        x = self.four_d(op.inputs[0], name, index)
        nchw_axes = sorted(_NHWC_TO_NCHW_AXIS[a] for a in axes)
        if keep:
            self.acts[op.outputs[0]] = _Act(self.node("ReduceMean", [x.name], "mean", axes=nchw_axes, keepdims=1), True)
            return
        left = [_NHWC_TO_NCHW_AXIS[a] for a in range(4) if a not in axes]  # the kept NHWC axes, where NCHW holds them
        if left == sorted(left):  # the same order either way (e.g. H, W reduced: [N, C]): reduce straight to it
            self.acts[op.outputs[0]] = _Act(self.node("ReduceMean", [x.name], "mean", axes=nchw_axes, keepdims=0), False)
            return
        y = self.node("ReduceMean", [x.name], "mean", axes=nchw_axes, keepdims=1)
        y = self.to_nhwc(_Act(y, True))  # NHWC order, then drop the reduced axes
        self.acts[op.outputs[0]] = _Act(self.node("Squeeze", [y, self.init(np.asarray(axes, np.int64), "axes")], "squeeze"), False)

    def op_resize_bilinear(self, op: Any, name: str, index: int) -> None:
        """RESIZE_BILINEAR as ONNX Resize (linear). TFLite's kernel (tensorflow/lite/kernels/internal/reference/
        resize_bilinear.h, ``ComputeInterpolationValues``) maps output pixel ``x`` to input ``x * scale`` with
        ``scale = in / out``, or ``(in - 1) / (out - 1)`` with ``align_corners`` (output > 1), or ``(x + 0.5) * scale - 0.5``
        with ``half_pixel_centers``, and clamps the two neighbours to the image. The ONNX Resize spec's
        coordinate_transformation_mode ``asymmetric`` (``x / (out / in)``), ``align_corners``
        (``x * (in - 1) / (out - 1)``) and ``half_pixel`` (``(x + 0.5) / (out / in) - 0.5``, no special case for an
        output of 1, unlike ``pytorch_half_pixel``) are the same three maps; ONNX Runtime clamps the same way. TFLite
        refuses both flags at once (its Prepare), and so does this."""
        o = self.opts(op, name, index)
        if o.alignCorners and o.halfPixelCenters:
            raise UnsupportedOpError(name, index, "align_corners and half_pixel_centers together (TFLite's kernel refuses them too)")
        mode = "align_corners" if o.alignCorners else "half_pixel" if o.halfPixelCenters else "asymmetric"
        x = self.four_d(op.inputs[0], name, index)
        hw = self.const(op.inputs[1], "the output size", name, index).astype(np.int64).reshape(-1)
        if hw.shape != (2,) or (hw <= 0).any():
            raise UnsupportedOpError(name, index, f"output size {hw.tolist()}; expected [height, width] > 0")
        sig = self.signature(op.inputs[0])
        if all(d > 0 for d in sig):
            sizes = self.init(np.asarray([sig[0], sig[3], hw[0], hw[1]], np.int64), "sizes")
        else:  # a dynamic batch: N and C from the tensor's own shape
            shp = self.node("Shape", [x.name], "shape")
            nc = self.node("Slice", [shp, self.init(np.array([0], np.int64), "start"), self.init(np.array([2], np.int64), "end")], "nc")
            sizes = self.node("Concat", [nc, self.init(hw, "hw")], "sizes", axis=0)
        y = self.node("Resize", [x.name, "", "", sizes], "resize", mode="linear", coordinate_transformation_mode=mode)
        self.acts[op.outputs[0]] = _Act(y, True)

    def op_transpose_conv_bias(self, op: Any, name: str, index: int) -> None:
        """MediaPipe's ``Convolution2DTransposeBias`` (mediapipe/util/tflite/operations/transpose_conv_bias.cc): inputs
        (data NHWC, weights OHWI, bias [O]); custom options: the raw ``TfLiteTransposeConvParams`` struct (int32
        padding, stride_width, stride_height). With SAME padding the op makes ``s * (in - 1) + k - p`` outputs with
        ``p = max(0, k - (in - 1) % s - 1)`` and starts ``p // 2`` into the full transpose convolution: ONNX
        ConvTranspose with pads ``[p // 2, p - p // 2]`` per axis computes exactly that."""
        raw = bytes(np.asarray(op.customOptions if op.customOptions is not None else [], np.uint8).tobytes())
        if len(raw) < 12:
            raise UnsupportedOpError(name, index, f"custom options of {len(raw)} bytes; expected the 12-byte TfLiteTransposeConvParams")
        padding, stride_w, stride_h = struct.unpack("<iii", raw[:12])
        if padding not in (0, 1, 2) or stride_w < 1 or stride_h < 1:
            raise UnsupportedOpError(name, index, f"padding {padding}, strides {stride_w}x{stride_h}")
        if len(op.inputs) != 3:
            raise UnsupportedOpError(name, index, f"{len(op.inputs)} inputs; expected data, weights, bias")
        x = self.four_d(op.inputs[0], name, index)
        w = self.const(op.inputs[1], "the weights", name, index).astype(np.float32)
        b = self.const(op.inputs[2], "the bias", name, index).astype(np.float32).reshape(-1)
        shp = self.shape(op.inputs[0])
        if w.ndim != 4 or w.shape[3] != shp[3] or b.shape != (w.shape[0],):
            raise UnsupportedOpError(name, index, f"weights {w.shape} / bias {b.shape} for input {shp}")
        kh, kw = int(w.shape[1]), int(w.shape[2])
        ph = pw = 0
        if padding == 1:  # kTfLitePaddingSame
            ph = max(0, kh - (shp[1] - 1) % stride_h - 1)
            pw = max(0, kw - (shp[2] - 1) % stride_w - 1)
        y = self.node(
            "ConvTranspose", [x.name, self.init(np.transpose(w, (3, 0, 1, 2)), "w"), self.init(b, "b")], "deconv",
            kernel_shape=[kh, kw], strides=[stride_h, stride_w], pads=[ph // 2, pw // 2, ph - ph // 2, pw - pw // 2],
        )  # fmt: skip
        self.acts[op.outputs[0]] = _Act(y, True)

    def op_pad(self, op: Any, name: str, index: int) -> None:
        a = self.act(op.inputs[0], name, index)
        p = self.const(op.inputs[1], "the paddings", name, index).astype(np.int64)
        if p.ndim != 2 or p.shape[1] != 2:
            raise UnsupportedOpError(name, index, f"paddings of shape {p.shape}")
        if a.nchw:
            p = p[[0, 3, 1, 2]]
        y = self.node("Pad", [a.name, self.init(np.concatenate([p[:, 0], p[:, 1]]), "pads")], "pad", mode="constant")
        self.acts[op.outputs[0]] = _Act(y, a.nchw)

    def op_reshape(self, op: Any, name: str, index: int) -> None:
        a = self.act(op.inputs[0], name, index)
        o = op.builtinOptions
        if o is not None and getattr(o, "newShape", None) is not None and len(o.newShape):
            shape = np.asarray(o.newShape, np.int64)
        elif len(op.inputs) > 1 and op.inputs[1] >= 0:
            shape = self.const(op.inputs[1], "the new shape", name, index).astype(np.int64).reshape(-1)
        else:
            shape = np.asarray(self.shape(op.outputs[0]), np.int64)
        y = self.node("Reshape", [self.to_nhwc(a), self.init(shape, "shape")], "reshape")  # TFLite's element order is NHWC's
        if len(shape) == 4:
            y = self.node("Transpose", [y], "to_nchw", perm=[0, 3, 1, 2])
        self.acts[op.outputs[0]] = _Act(y, len(shape) == 4)

    def op_concat(self, op: Any, name: str, index: int) -> None:
        o = self.opts(op, name, index)
        rank = len(self.shape(op.outputs[0]))
        axis = int(o.axis) % rank if rank else 0
        ins = [self.act(i, name, index) for i in op.inputs]
        if rank == 4:
            names, axis = [self.to_nchw(a) for a in ins], _NHWC_TO_NCHW_AXIS[axis]
        else:
            names = [a.name for a in ins]
        y = self.node("Concat", names, "concat", axis=axis)
        self.acts[op.outputs[0]] = _Act(self.fused(y, o.fusedActivationFunction, name, index), rank == 4)

    def op_fully_connected(self, op: Any, name: str, index: int) -> None:
        """FULLY_CONNECTED (tensorflow/lite/kernels/fully_connected.cc; TFLite builtin op docs): weights ``[out, in]``
        (OI), optional bias ``[out]`` (input index -1 when absent), ``y = x @ W.T + b`` then the fused activation.
        Without ``keep_num_dims`` the input, of any rank, is read as ``[-1, in]`` in its own (NHWC) element order
        and the output is ``[batch, out]``; with it the leading dims are kept (the last input dim must be ``in``).
        A 4-D NCHW activation is put back in NHWC order first, as for RESHAPE."""
        o = self.opts(op, name, index)
        A = self.s.ActivationFunctionType
        if o.fusedActivationFunction not in (A.NONE, A.RELU, A.RELU_N1_TO_1, A.RELU6):  # as the kernel's Prepare checks
            act = {v: k for k, v in vars(A).items() if not k.startswith("_")}.get(o.fusedActivationFunction, o.fusedActivationFunction)
            raise UnsupportedOpError(name, index, f"fused activation {act}; TFLite's kernel takes NONE, RELU, RELU_N1_TO_1, RELU6")
        if int(getattr(o, "weightsFormat", 0) or 0) != 0:
            raise UnsupportedOpError(name, index, f"weights_format {o.weightsFormat}; only DEFAULT (0) is supported")
        w = self.const(op.inputs[1], "the weights", name, index).astype(np.float32)
        if w.ndim != 2:
            raise UnsupportedOpError(name, index, f"weights of shape {w.shape}; expected [out, in]")
        n_out, n_in = int(w.shape[0]), int(w.shape[1])
        bias = None
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            bias = self.const(op.inputs[2], "the bias", name, index).astype(np.float32).reshape(-1)
            if bias.shape != (n_out,):
                raise UnsupportedOpError(name, index, f"bias of shape {bias.shape} for {n_out} outputs")
        shp = self.shape(op.inputs[0])
        x = self.to_nhwc(self.act(op.inputs[0], name, index))
        keep = bool(getattr(o, "keepNumDims", False))
        if keep:
            if not shp or shp[-1] != n_in:
                raise UnsupportedOpError(name, index, f"keep_num_dims with input {shp} and weights {w.shape}")
            y = self.node("MatMul", [x, self.init(np.ascontiguousarray(w.T), "w")], "fc")
            if bias is not None:
                y = self.node("Add", [y, self.init(bias, "b")], "fc_bias")
        else:
            if all(d > 0 for d in shp) and int(np.prod(shp)) % n_in:
                raise UnsupportedOpError(name, index, f"input {shp} does not split into rows of {n_in}")
            if len(shp) != 2 or self.signature(op.inputs[0])[-1] != n_in:
                x = self.node("Reshape", [x, self.init(np.array([-1, n_in], np.int64), "shape")], "fc_flat")
            ins = [x, self.init(w, "w")] + ([self.init(bias, "b")] if bias is not None else [])
            y = self.node("Gemm", ins, "fc", transB=1)
        self.acts[op.outputs[0]] = _Act(self.fused(y, o.fusedActivationFunction, name, index), False)

    def op_strided_slice(self, op: Any, name: str, index: int) -> None:
        """STRIDED_SLICE (tensorflow/lite/kernels/strided_slice.cc and kernels/internal/strided_slice_logic.h,
        ``StartForAxis`` / ``StopForAxis``): per axis ``i`` given by begin/end/strides, ``begin_mask`` bit ``i`` makes
        the start the first element in the stride's direction, ``end_mask`` the stop the last; negative indices
        count from the end and are clamped to ``[0, dim]`` (stride > 0) or ``[-1, dim - 1]`` (stride < 0); a
        ``shrink_axis_mask`` axis takes one element (stop = start + 1) and is removed. Axes past the given ones are
        kept whole. ONNX Slice normalises and clamps the same way, with a very negative end for TFLite's -1 stop;
        a start below ``-dim`` with a negative stride (TFLite: empty, ONNX would clamp to 0) needs the static dim."""
        o = self.opts(op, name, index)
        if o.ellipsisMask or o.newAxisMask:
            raise UnsupportedOpError(name, index, f"ellipsis_mask {o.ellipsisMask} / new_axis_mask {o.newAxisMask}; only 0 is supported")
        if getattr(o, "offset", False):
            raise UnsupportedOpError(name, index, "offset=true (end relative to begin) is not supported")
        if len(op.inputs) != 4:
            raise UnsupportedOpError(name, index, f"{len(op.inputs)} inputs; expected input, begin, end, strides")
        begin, end, strides = (self.const(op.inputs[k], what, name, index).astype(np.int64).reshape(-1) for k, what in ((1, "begin"), (2, "end"), (3, "strides")))
        sig = self.signature(op.inputs[0])
        rank = len(sig)
        if not begin.shape == end.shape == strides.shape or begin.size > rank:
            raise UnsupportedOpError(name, index, f"begin {begin.tolist()}, end {end.tolist()}, strides {strides.tolist()} for a {rank}-D input")
        lo, hi = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
        spans: list[tuple[int, int, int, int]] = []
        shrink: list[int] = []
        for i in range(begin.size):
            b, e, st, dim = int(begin[i]), int(end[i]), int(strides[i]), sig[i]
            if st == 0:
                raise UnsupportedOpError(name, index, f"stride 0 on axis {i}")
            if o.shrinkAxisMask >> i & 1:
                if st < 0:
                    raise UnsupportedOpError(name, index, f"shrink_axis_mask on axis {i} with a negative stride")
                if o.beginMask >> i & 1:
                    b = 0
                if dim > 0 and not -dim <= b < dim:
                    raise UnsupportedOpError(name, index, f"shrink index {b} out of range for axis {i} of size {dim}")
                shrink.append(i)
                spans.append((i, b, b + 1 if b + 1 != 0 else hi, 1))
                continue
            if o.beginMask >> i & 1:
                b = lo if st > 0 else hi
            elif st < 0 and b < 0:
                if dim <= 0:
                    raise UnsupportedOpError(name, index, f"a negative begin with a negative stride on dynamic axis {i}")
                if b < -dim:  # TFLite clamps the start to -1: nothing is taken
                    b, e = 0, 0
            if o.endMask >> i & 1:
                e = hi if st > 0 else lo
            elif st < 0 and e < 0 and dim > 0 and e + dim < 0:
                e = lo
            if st == 1 and b in (0, lo) and e == hi:
                continue  # the whole axis
            spans.append((i, b, e, st))
        axes, starts, ends, steps = ([sp[k] for sp in spans] for k in range(4))
        a = self.act(op.inputs[0], name, index)
        if rank == 4 and a.nchw and not shrink:
            x, axes = a.name, [_NHWC_TO_NCHW_AXIS[i] for i in axes]
        else:
            x = self.to_nhwc(a)
        if axes:
            vec = [self.init(np.asarray(v, np.int64), k) for v, k in ((starts, "starts"), (ends, "ends"), (axes, "axes"), (steps, "steps"))]
            y = self.node("Slice", [x, *vec], "slice")
        else:
            y = self.node("Identity", [x], "slice")
        if shrink:
            y = self.node("Squeeze", [y, self.init(np.asarray(shrink, np.int64), "axes")], "squeeze")
        self.acts[op.outputs[0]] = _Act(y, rank == 4 and a.nchw and not shrink)

    def op_dequantize(self, op: Any, name: str, index: int) -> None:
        i = op.inputs[0]
        if i in self.consts and self.consts[i].dtype == np.float16:  # fp16 weights: fold to fp32
            self.consts[op.outputs[0]] = self.consts[i].astype(np.float32)
            return
        raise UnsupportedOpError(name, index, "only the dequantization of float16 constants is supported")

    # ------------------------------------------------------------------ graph

    def run(self) -> Any:
        from onnx import TensorProto

        table = {
            "CONV_2D": lambda op, n, k: self.op_conv(op, n, k, depthwise=False),
            "DEPTHWISE_CONV_2D": lambda op, n, k: self.op_conv(op, n, k, depthwise=True),
            "MAX_POOL_2D": self.op_pool, "AVERAGE_POOL_2D": self.op_pool,
            "ADD": self.op_binary, "MUL": self.op_binary,
            "RELU": self.op_unary, "RELU6": self.op_unary, "LOGISTIC": self.op_unary, "HARD_SWISH": self.op_unary,
            "PRELU": self.op_prelu,
            "MEAN": self.op_mean,
            "RESIZE_BILINEAR": self.op_resize_bilinear,
            TRANSPOSE_CONV_BIAS: self.op_transpose_conv_bias,
            "PAD": self.op_pad,
            "RESHAPE": self.op_reshape,
            "CONCATENATION": self.op_concat,
            "DEQUANTIZE": self.op_dequantize,
            "FULLY_CONNECTED": self.op_fully_connected,
            "STRIDED_SLICE": self.op_strided_slice,
        }  # fmt: skip
        self.load_constants()
        # Check every op first, so the error names the first unsupported one before any work.
        ops = []
        for k, op in enumerate(self.sg.operators):
            code = self.m.operatorCodes[op.opcodeIndex]
            name = self.op_names.get(max(code.builtinCode, code.deprecatedBuiltinCode), f"builtin_{code.builtinCode}")
            if name == "CUSTOM":
                cc = code.customCode
                name = f"CUSTOM:{cc.decode() if isinstance(cc, bytes) else cc}"
            if name not in table:
                raise UnsupportedOpError(name, k, "sparse weights (DENSIFY) are not supported" if name == "DENSIFY" else "")
            ops.append((k, op, name))

        graph_inputs = []
        for i in self.sg.inputs:
            t = self.tensor(i)
            tn = self.type_names.get(t.type, str(t.type))
            if tn != "FLOAT32":
                raise TFLiteToOnnxError(f"input {self.tname(i)!r} is {tn.lower()}; expected float32 (quantized inputs are not supported)")
            sig = self.signature(i)
            dims = [d if d >= 0 else ("batch" if k == 0 else f"d{k}") for k, d in enumerate(sig)]
            graph_inputs.append(self.h.make_tensor_value_info(self.tname(i), TensorProto.FLOAT, dims))
            self.acts[i] = _Act(self.tname(i), False)
            if len(sig) == 4:
                self.acts[i] = _Act(self.to_nchw(self.acts[i]), True)
        for k, op, name in ops:
            table[name](op, name, k)

        graph_outputs = []
        for i in self.sg.outputs:
            a = self.act(i, "output", -1)
            out_name = self.tname(i)
            src = self.to_nhwc(a)
            self.nodes.append(self.h.make_node("Identity", [src], [out_name], name=f"out_{out_name}"))
            dims = [d if d >= 0 else "batch" for d in self.shape(i)]
            graph_outputs.append(self.h.make_tensor_value_info(out_name, TensorProto.FLOAT, dims))
        graph = self.h.make_graph(self.nodes, "tflite_to_onnx", graph_inputs, graph_outputs, initializer=self.inits)
        model = self.h.make_model(graph, opset_imports=[self.h.make_opsetid("", OPSET)], producer_name="edge_sdk converters/tflite_import.py")
        model.ir_version = 8  # readable by onnxruntime >= 1.10
        desc = self.m.description
        if desc:
            model.doc_string = f"translated from TFLite: {desc.decode('utf-8', 'replace') if isinstance(desc, bytes) else desc}"
        import onnx

        onnx.checker.check_model(model, full_check=True)
        return model


def translate(tflite: bytes | bytearray | str | os.PathLike[str]) -> Any:
    """Translate a float TFLite model (its bytes, or a path) into an ``onnx.ModelProto`` (checked with
    ``onnx.checker``, full check). Inputs and outputs keep their TFLite names, shapes and layouts.

    Raises UnsupportedOpError for an op outside SUPPORTED_OPS, TFLiteToOnnxError for anything
    else that cannot be translated exactly (quantized or sparse tensors, a corrupt file)."""
    data = tflite if isinstance(tflite, (bytes, bytearray)) else Path(tflite).read_bytes()
    return _Translator(bytes(data)).run()


def convert_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Translate ``src`` (.tflite) and write ``dst`` (.onnx, atomically); returns ``dst``."""
    import onnx

    model = translate(src)
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, dst)
    return dst


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m converters.tflite_import SRC DST``: exit 0 and ``wrote DST``, or 2 and ``error: ...`` on stderr."""
    ap = argparse.ArgumentParser(description="Translate a float TFLite model (MediaPipe-style convnets) to ONNX.")
    ap.add_argument("src", help="the .tflite model")
    ap.add_argument("dst", help="the .onnx file to write")
    args = ap.parse_args(argv)
    try:
        out = convert_file(args.src, args.dst)
    except (TFLiteToOnnxError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
