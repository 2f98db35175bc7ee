"""Build MobileNetV2-class ONNX models from scratch with ``onnx.helper``.

The models carry **random, untrained** weights: they exist for benchmarks and
tests that need a realistic graph (operator mix, tensor sizes, FLOPs, parameter
count) without downloading anything.  Their logits mean nothing.

Architecture: Sandler et al., "MobileNetV2: Inverted Residuals and Linear
Bottlenecks", CVPR 2018, table 2::

    input      operator      t     c     n  s
    224x224x3  conv2d 3x3    -     32    1  2
    112x112x32 bottleneck    1     16    1  1
    112x112x16 bottleneck    6     24    2  2
    56x56x24   bottleneck    6     32    3  2
    28x28x32   bottleneck    6     64    4  2
    14x14x64   bottleneck    6     96    3  1
    14x14x96   bottleneck    6    160    3  2
    7x7x160    bottleneck    6    320    1  1
    7x7x320    conv2d 1x1    -   1280    1  1
    7x7x1280   avgpool 7x7   -      -    1  -
    1x1x1280   conv2d 1x1    -      k    -  -

A bottleneck is ``1x1 expand -> ReLU6 -> 3x3 depthwise (stride s) -> ReLU6 ->
1x1 linear projection``, with a residual ``Add`` when the stride is 1 and the
input and output channel counts are equal (the expansion is skipped when
t = 1).  Channel counts under a width multiplier are rounded to multiples of 8
as in the reference implementation; the last conv keeps 1280 channels for
width <= 1.  The classifier is ``GlobalAveragePool -> Flatten -> Gemm``.

Weights: every conv gets He-normal weights (std ``sqrt(2 / fan_in)``; LeCun
``sqrt(1 / fan_in)`` for the linear projections, which no ReLU follows) and a
BatchNorm with near-identity statistics drawn from the seed; the BatchNorm is
then folded into the conv's weight and bias, so the graph holds no
BatchNormalization nodes -- as an exported, deployed model would.  Activations
stay in the range a trained network shows (checked by the tests through every
intermediate tensor).

Usage::

    python tools/mobilenetv2.py OUT.onnx [--width 1.0] [--hw 224] [--classes 1000]
                                         [--seed 0] [--batch N] [--opset 17]
    python tools/mobilenetv2.py OUT.onnx --trivial 16
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "INVERTED_RESIDUAL_SETTING",
    "build_mobilenetv2",
    "build_trivial",
    "count_parameters",
    "save",
    "main",
]

#: (expansion t, output channels c, repeats n, first stride s) -- table 2 of the paper.
INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)

FIRST_CHANNELS = 32
LAST_CHANNELS = 1280
BN_EPS = 1e-5
MIN_OPSET = 11  # Clip takes min/max as inputs from opset 11 on

Batch = Union[str, int]


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to the nearest multiple of ``divisor``, never dropping
    more than 10 % (the rule of the reference MobileNetV2 implementation)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


class _GraphBuilder:
    """Collects nodes and initializers; draws weights from one seeded RNG."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        # np.ascontiguousarray would turn a 0-d array into 1-d; Clip needs true scalars.
        self.initializers.append(numpy_helper.from_array(np.require(array, requirements='C'), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    def conv_bn(
        self,
        x: str,
        prefix: str,
        in_ch: int,
        out_ch: int,
        kernel: int,
        stride: int,
        groups: int,
        relu6: bool,
    ) -> str:
        """Conv (+ folded BatchNorm) (+ ReLU6 as Clip(0, 6))."""
        fan_in = (in_ch // groups) * kernel * kernel
        gain = 2.0 if relu6 else 1.0  # He for ReLU-followed convs, LeCun for linear ones
        w = self.rng.normal(0.0, np.sqrt(gain / fan_in), size=(out_ch, in_ch // groups, kernel, kernel))
        # BatchNorm statistics as a trained net would carry them for an output
        # whose scale the init already normalises: near-identity with some spread.
        gamma = self.rng.uniform(0.8, 1.2, size=out_ch)
        beta = self.rng.normal(0.0, 0.05, size=out_ch)
        mean = self.rng.normal(0.0, 0.05, size=out_ch)
        var = self.rng.uniform(0.8, 1.2, size=out_ch)
        w_folded, b_folded = fold_batchnorm(w, np.zeros(out_ch), gamma, beta, mean, var, BN_EPS)
        pad = kernel // 2
        y = self.node(
            "Conv",
            [x, self.const(f"{prefix}.weight", w_folded.astype(np.float32)),
             self.const(f"{prefix}.bias", b_folded.astype(np.float32))],
            f"{prefix}.conv_out" if relu6 else f"{prefix}.out",
            name=f"{prefix}.conv",
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad, pad, pad, pad],
            dilations=[1, 1],
            group=groups,
        )
        if relu6:
            y = self.node("Clip", [y, "relu6.min", "relu6.max"], f"{prefix}.out", name=f"{prefix}.relu6")
        return y


def fold_batchnorm(
    w: np.ndarray,
    b: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float = BN_EPS,
) -> tuple[np.ndarray, np.ndarray]:
    """Fold ``BN(conv(x, w, b))`` into one conv: returns ``(w', b')`` with
    ``w' = w * s`` and ``b' = (b - mean) * s + beta`` where ``s = gamma / sqrt(var + eps)``."""
    scale = gamma / np.sqrt(var + eps)
    return w * scale.reshape(-1, *([1] * (w.ndim - 1))), (b - mean) * scale + beta


def _check_batch(batch: Batch) -> Batch:
    if isinstance(batch, bool) or not isinstance(batch, (str, int)):
        raise TypeError(f"batch must be a symbolic name (str) or a positive int, got {batch!r}")
    if isinstance(batch, int) and batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if isinstance(batch, str) and not batch:
        raise ValueError("batch name must not be empty")
    return batch


def _check_opset(opset: int) -> int:
    latest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= latest:
        raise ValueError(f"opset must be in [{MIN_OPSET}, {latest}] for this onnx, got {opset}")
    return opset


def _make_model(graph: onnx.GraphProto, opset: int, doc: str) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="edge_sdk.tools")
    # The oldest IR version that carries this opset, so older runtimes load it.
    model.ir_version = helper.find_min_ir_version_for(opsets)
    model.doc_string = doc
    return model


def build_mobilenetv2(
    width_mult: float = 1.0,
    input_hw: int = 224,
    num_classes: int = 1000,
    seed: int = 0,
    batch: Batch = "N",
    opset: int = 17,
) -> onnx.ModelProto:
    """Return a MobileNetV2 (random weights, BatchNorm folded) as an ONNX model.

    Input ``"input"``: float32 ``[batch, 3, input_hw, input_hw]`` (NCHW); output
    ``"logits"``: float32 ``[batch, num_classes]``.  ``batch`` is a symbolic
    dimension name (str) or a fixed size (int).  The same arguments always give
    the same bytes.
    """
    if width_mult <= 0:
        raise ValueError(f"width_mult must be > 0, got {width_mult}")
    if input_hw < 32:
        raise ValueError(f"input_hw must be >= 32 (five stride-2 stages), got {input_hw}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    batch = _check_batch(batch)
    opset = _check_opset(opset)

    g = _GraphBuilder(np.random.default_rng(seed))
    g.const("relu6.min", np.array(0.0, dtype=np.float32))
    g.const("relu6.max", np.array(6.0, dtype=np.float32))

    in_ch = _make_divisible(FIRST_CHANNELS * width_mult)
    last_ch = _make_divisible(LAST_CHANNELS * max(1.0, width_mult))

    x = g.conv_bn("input", "features.0", 3, in_ch, kernel=3, stride=2, groups=1, relu6=True)
    block = 1
    for t, c, n, s in INVERTED_RESIDUAL_SETTING:
        out_ch = _make_divisible(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            p = f"features.{block}"
            hidden = in_ch * t
            h = x
            if t != 1:
                h = g.conv_bn(h, f"{p}.expand", in_ch, hidden, kernel=1, stride=1, groups=1, relu6=True)
            h = g.conv_bn(h, f"{p}.dw", hidden, hidden, kernel=3, stride=stride, groups=hidden, relu6=True)
            h = g.conv_bn(h, f"{p}.project", hidden, out_ch, kernel=1, stride=1, groups=1, relu6=False)
            if stride == 1 and in_ch == out_ch:
                h = g.node("Add", [x, h], f"{p}.out", name=f"{p}.residual")
            x, in_ch = h, out_ch
            block += 1

    x = g.conv_bn(x, f"features.{block}", in_ch, last_ch, kernel=1, stride=1, groups=1, relu6=True)
    x = g.node("GlobalAveragePool", [x], "pool.out", name="pool")
    x = g.node("Flatten", [x], "flatten.out", name="flatten", axis=1)
    w = g.rng.normal(0.0, np.sqrt(1.0 / last_ch), size=(num_classes, last_ch)).astype(np.float32)
    g.node(
        "Gemm",
        [x, g.const("classifier.weight", w), g.const("classifier.bias", np.zeros(num_classes, np.float32))],
        "logits",
        name="classifier",
        transB=1,
    )

    graph = helper.make_graph(
        g.nodes,
        f"mobilenetv2_w{width_mult:g}_{input_hw}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, input_hw, input_hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, num_classes])],
        initializer=g.initializers,
    )
    model = _make_model(
        graph,
        opset,
        "MobileNetV2 (Sandler et al. 2018) with RANDOM, UNTRAINED weights "
        "(He init, BatchNorm folded) for benchmarks and tests; the logits mean nothing.",
    )
    for key, value in {
        "architecture": "mobilenetv2",
        "weights": "random-untrained",
        "width_mult": f"{width_mult:g}",
        "input_hw": str(input_hw),
        "num_classes": str(num_classes),
        "seed": str(seed),
    }.items():
        model.metadata_props.add(key=key, value=value)
    return model


def build_trivial(n: int = 16, opset: int = 17) -> onnx.ModelProto:
    """The smallest useful model: ``y = x + bias`` with input ``"x"`` float32
    ``[1, n]``, a constant ``bias = [0, 1, ..., n-1]`` and output ``"y"`` float32 ``[1, n]``.
    For measuring per-call overhead."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    opset = _check_opset(opset)
    bias = numpy_helper.from_array(np.arange(n, dtype=np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"], name="add")],
        f"trivial_add_{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=[bias],
    )
    return _make_model(graph, opset, f"Trivial model: y = x + arange({n}); for overhead benchmarks.")


def count_parameters(model: onnx.ModelProto) -> int:
    """Number of scalar values in the model's float initializers (the weights)."""
    total = 0
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT and len(init.dims) > 0:
            total += int(np.prod(init.dims))
    return total


def save(
    path: Union[str, pathlib.Path],
    width_mult: float = 1.0,
    input_hw: int = 224,
    num_classes: int = 1000,
    seed: int = 0,
    batch: Batch = "N",
    opset: int = 17,
) -> pathlib.Path:
    """Build a MobileNetV2, check it with ``onnx.checker`` and write it to ``path``."""
    model = build_mobilenetv2(width_mult, input_hw, num_classes, seed, batch, opset)
    return _write(model, path)


def _write(model: onnx.ModelProto, path: Union[str, pathlib.Path]) -> pathlib.Path:
    onnx.checker.check_model(model, full_check=True)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)
    return path


def _batch_arg(text: str) -> Batch:
    return int(text) if text.isdigit() else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a MobileNetV2 (random weights) or a trivial ONNX model.")
    parser.add_argument("out", type=pathlib.Path, help="output .onnx path")
    parser.add_argument("--width", type=float, default=1.0, help="width multiplier (default 1.0)")
    parser.add_argument("--hw", type=int, default=224, help="input height = width (default 224)")
    parser.add_argument("--classes", type=int, default=1000, help="number of classes (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--batch", type=_batch_arg, default="N", help="batch: a symbolic name or an int (default N)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    parser.add_argument("--trivial", type=int, metavar="N", help="write build_trivial(N) instead")
    args = parser.parse_args(argv)
    try:
        if args.trivial is not None:
            path = _write(build_trivial(args.trivial, opset=args.opset), args.out)
            params = count_parameters(onnx.load(str(path)))
        else:
            path = save(args.out, args.width, args.hw, args.classes, args.seed, args.batch, args.opset)
            params = count_parameters(onnx.load(str(path)))
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    print(f"{path} ({params:,} parameters, {path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
