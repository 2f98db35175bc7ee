"""Make the variants of a float ONNX model with ONNX Runtime's own tooling.

- int8 static: ``quant_pre_process`` then ``quantize_static`` (QDQ, per-channel;
  activation/weight types and calibration method selectable) — for CNN-like graphs.
- int8 dynamic: ``quantize_dynamic`` — for RNN/transformer-like graphs.
- int4 weight-only: ``MatMulNBitsQuantizer`` (MatMulNBits, block size selectable,
  ``accuracy_level=4`` by default: the int8 compute path on CPUs with
  VNNI / dot-product instructions).
- fp16: ``onnxruntime.transformers.float16.convert_float_to_float16`` with fp32
  inputs/outputs kept, so every variant shares the package's tensor specs.

Defaults follow what was measured (docs/benchmarks.md), not folklore: static
QDQ with uint8 activations and int8 weights was the fastest int8 form for a
MobileNetV2-class CNN on x86 with VNNI.
"""

from __future__ import annotations

import functools
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .errors import ConverterError


class QuantizeError(ConverterError, ValueError):
    """A variant could not be made; the message says which and why."""


@dataclass(frozen=True)
class Int8Options:
    """``method``: auto | static | dynamic. ``activation_type``/``weight_type``:
    uint8 | int8. ``calibration``: minmax | entropy | percentile (static only)."""

    method: str = "auto"
    activation_type: str = "uint8"
    weight_type: str = "int8"
    calibration: str = "minmax"
    per_channel: bool = True
    #: 7-bit weights: ONNX Runtime's U8S8 kernels on x86 without VNNI multiply with VPMADDUBSW, whose 16-bit
    #: pair sums can saturate; ORT recommends reduce_range (or U8U8) there
    #: (https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html, "When and why do I need to try U8U8?").
    #: None (auto): on for int8 weights where this machine's int8 kernels saturate (:func:`host_int8_saturates`), so
    #: that what the gate measures is what ships; True/False force it
    reduce_range: bool | None = None
    nodes_to_exclude: tuple[str, ...] = ()
    #: dynamic only: quantize just these op types (``op_types_to_quantize``), e.g. ("MatMul", "Gemm") to keep
    #: convolutions in float (ONNX Runtime's dynamic ConvInteger path can lose a model: PP-OCRv4's recognizer); () = all
    op_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("method", self.method, ("auto", "static", "dynamic")),
            ("activation_type", self.activation_type, ("uint8", "int8")),
            ("weight_type", self.weight_type, ("uint8", "int8")),
            ("calibration", self.calibration, ("minmax", "entropy", "percentile")),
        ):
            if value not in allowed:
                raise QuantizeError(f"int8 {name}: expected one of {list(allowed)}, got {value!r}")
        if self.reduce_range not in (None, True, False):
            raise QuantizeError(f"int8 reduce_range: expected None (auto), True or False, got {self.reduce_range!r}")

    def resolved_reduce_range(self) -> tuple[bool, str]:
        """Whether weights are quantized to 7 bits, and a note when auto turned it on."""
        if self.reduce_range is not None:
            return self.reduce_range, ""
        if self.weight_type == "int8" and host_int8_saturates():
            return True, " (auto: this CPU's u8s8 kernels can saturate)"
        return False, ""


@functools.lru_cache(maxsize=1)
def host_int8_saturates() -> bool:
    """:attr:`edge_sdk.profiles.HardwareFacts.int8_saturates` for the machine the converter runs on."""
    from edge_sdk.profiles import read_facts

    return read_facts("/").int8_saturates


@dataclass(frozen=True)
class Int4Options:
    """``block_size``: weights per scale (a power of two >= 16). ``accuracy_level``:
    ONNX Runtime's MatMulNBits compute type (4 = int8 activations, the fast path
    on CPUs with VNNI/dot product; 0/None = fp32 dequantize + GEMM)."""

    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int | None = 4

    def __post_init__(self) -> None:
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise QuantizeError(f"int4 block_size: expected a power of two >= 16, got {self.block_size}")
        if self.accuracy_level not in (None, 0, 1, 2, 3, 4):
            raise QuantizeError(f"int4 accuracy_level: expected 0..4, got {self.accuracy_level}")


def choose_int8_method(model_path: Path) -> tuple[str, str]:
    """("static" | "dynamic", why): ``edge-convert inspect``'s recommendation
    (:func:`converters.inspect_model.inspect_model`, one rule for both): static with a
    convolution or without any MatMul-like node, dynamic for MatMul-only graphs
    (transformer/RNN-like or MLP-like)."""
    from .inspect_model import inspect_model

    info = inspect_model(model_path)
    return info.recommended_int8, info.recommended_reason


MIN_QDQ_OPSET = 13  # per-channel DequantizeLinear (axis attribute) needs opset 13
# ORT's MatMulNBitsQuantizer adds Shape/Gather/... helper nodes "valid from opset 11 onward"
# (onnxruntime/quantization/matmul_nbits_quantizer.py)
MIN_INT4_OPSET = 11


def upgrade_opset(src: Path, dst: Path, target: int = MIN_QDQ_OPSET) -> Path:
    """``src`` with its default-domain opset raised to ``target`` (ONNX's version
    converter) when it is lower; otherwise ``src`` itself."""
    import onnx
    from onnx import version_converter

    m = onnx.load(str(src))
    cur = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)
    if cur >= target:
        return src
    try:
        up = version_converter.convert_version(m, target)
    except Exception as e:  # the converter raises plain RuntimeErrors for unsupported ops
        raise QuantizeError(f"int8 needs opset >= {target} (per-channel QDQ); converting this opset-{cur} model failed: {e}") from e
    onnx.save(up, str(dst))
    return dst


def preprocess(src: Path, dst: Path, notes: list[str] | None = None) -> Path:
    """ORT's recommended pre-processing (symbolic shape inference, graph
    optimisation) before quantization, on a model raised to opset 13 if older;
    falls back to symbolic inference with ``auto_merge``, to ONNX shape inference
    only, then to the model as it is, when the model defeats symbolic shape
    inference (:func:`converters.normalize.infer_shapes`, run in a child process
    whose cwd is ``dst``'s folder, so no temp file lands in the caller's cwd).
    What happened is appended to ``notes``."""
    from .normalize import infer_shapes

    src = upgrade_opset(src, dst.with_name(dst.stem + ".opset.onnx"))
    got, note = infer_shapes(src, dst, dst.parent)
    if got != dst:
        shutil.copyfile(got, dst)
    if notes is not None:
        notes.append(note)
    name_nodes(dst)
    return dst


def name_nodes(path: Path) -> int:
    """Give every unnamed node a unique name (``<op>_<index>``), in place: nodes
    are kept in float by name, and exporters (e.g. paddle2onnx) leave some unnamed."""
    import onnx

    m = onnx.load(str(path))
    k = _name_nodes(m)
    if k:
        onnx.save(m, str(path))
    return k


def _name_nodes(m: Any) -> int:
    """:func:`name_nodes` on a loaded ModelProto; how many nodes got a name."""
    used = {n.name for n in m.graph.node if n.name}
    k = 0
    for i, n in enumerate(m.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in used:
                name += "_"
            n.name = name
            used.add(name)
            k += 1
    return k


def _qtype(name: str) -> Any:
    from onnxruntime.quantization import QuantType

    return {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}[name]


def quantize_int8(src: Path, dst: Path, opts: Int8Options, reader_factory: Any = None) -> str:
    """Write an int8 model; returns a one-line description of the method used.

    ``reader_factory()`` must return a fresh ``CalibrationDataReader`` (static only).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_dynamic, quantize_static

    method = opts.method
    why = ""
    if method == "auto":
        method, why = choose_int8_method(src)
    excl = list(opts.nodes_to_exclude)
    rr, rr_why = opts.resolved_reduce_range()
    rr_desc = f", reduce_range (7-bit weights){rr_why}" if rr else ""
    if method == "static":
        if reader_factory is None:
            raise QuantizeError("int8 static needs calibration data (--calibration)")
        cm = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy, "percentile": CalibrationMethod.Percentile}[
            opts.calibration
        ]
        extra = {"ActivationSymmetric": opts.activation_type == "int8"}
        quantize_static(
            str(src), str(dst), reader_factory(), quant_format=QuantFormat.QDQ, per_channel=opts.per_channel,
            activation_type=_qtype(opts.activation_type), weight_type=_qtype(opts.weight_type), calibrate_method=cm,
            nodes_to_exclude=excl or None, extra_options=extra, reduce_range=rr,
        )  # fmt: skip
        a = "U8" if opts.activation_type == "uint8" else "S8"
        w = "S8" if opts.weight_type == "int8" else "U8"
        desc = f"int8 static QDQ {a}{w} ({opts.activation_type} activations, {opts.weight_type} weights), {opts.calibration} calibration"
        desc += ", per-channel" if opts.per_channel else ", per-tensor"
        desc += rr_desc
    else:
        quantize_dynamic(
            str(src), str(dst), weight_type=_qtype(opts.weight_type), per_channel=opts.per_channel, nodes_to_exclude=excl or None,
            op_types_to_quantize=list(opts.op_types) or None, reduce_range=rr,
        )  # fmt: skip
        desc = f"int8 dynamic ({opts.weight_type} weights{', per-channel' if opts.per_channel else ''})" + rr_desc
        if opts.op_types:
            desc += f", only {'/'.join(opts.op_types)} quantized (the rest float)"
    if excl:
        desc += f", {len(excl)} node(s) kept in float"
    return desc + (f" [auto: {why}]" if why else "")


_PASS_THROUGH = ("Transpose", "Reshape", "Identity")  # weight paths folded into an initializer for int4


def _const_value(name: str, inits: dict[str, Any], producers: dict[str, Any], depth: int = 0) -> Any:
    """The numpy value of ``name`` if it is an initializer, or a Transpose / Reshape / Identity
    chain of one with constant parameters; else None."""
    import numpy as np
    from onnx import helper, numpy_helper

    if name in inits:
        return numpy_helper.to_array(inits[name])
    n = producers.get(name)
    if n is None or depth > 8 or n.op_type not in _PASS_THROUGH or n.domain not in ("", "ai.onnx"):
        return None
    x = _const_value(n.input[0], inits, producers, depth + 1)
    if x is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    if n.op_type == "Identity":
        return x
    if n.op_type == "Transpose":
        return np.transpose(x, attrs.get("perm") or None)
    if len(n.input) < 2 or n.input[1] not in inits:
        return None
    shape = [int(v) for v in numpy_helper.to_array(inits[n.input[1]]).reshape(-1)]
    if not attrs.get("allowzero", 0):  # ONNX Reshape: 0 copies the input's dim
        shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    try:
        return x.reshape(shape)
    except ValueError:
        return None


def prepare_for_int4(model: Any) -> tuple[Any, list[str], dict[str, str]]:
    """Rewrite ``model`` (in place) so that MatMulNBits can reach every constant weight:
    a MatMul whose B is a Transpose/Reshape/Identity of an initializer gets the folded
    weight as a new initializer; a Gemm (``transA`` 0, constant B) becomes MatMul on
    ``alpha * (B or B^T)`` plus an Add of ``beta * C``. Returns (model, notes,
    {node: why it cannot be quantized} for MatMul/Gemm that keep an activation weight)."""
    import numpy as np
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    used = {i.name for i in g.initializer}
    notes: list[str] = []
    skipped: dict[str, str] = {}
    folded = gemms = 0

    def fresh(base: str) -> str:
        name = base
        while name in used or name in producers:
            name += "_"
        used.add(name)
        return name

    def add_init(arr: Any, base: str) -> str:
        name = fresh(base)
        t = numpy_helper.from_array(np.ascontiguousarray(arr), name)
        g.initializer.append(t)
        inits[name] = t
        return name

    new_nodes = []
    for n in g.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in ("MatMul", "Gemm"):
            new_nodes.append(n)
            continue
        label = n.name or n.output[0]
        b = n.input[1]
        w = _const_value(b, inits, producers)
        if w is None:
            skipped[label] = "its weight B is computed from activations (e.g. attention scores), not a constant"
            new_nodes.append(n)
            continue
        if w.dtype != np.float32:
            skipped[label] = f"its weight is {w.dtype}, MatMulNBits quantizes float32 weights"
            new_nodes.append(n)
            continue
        if n.op_type == "MatMul":
            if b not in inits:
                n.input[1] = add_init(w, f"{b}_folded")
                folded += 1
            new_nodes.append(n)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if attrs.get("transA", 0):
            skipped[label] = "Gemm with transA=1 (its input, not its weight, is transposed)"
            new_nodes.append(n)
            continue
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        wt = w.T if attrs.get("transB", 0) else w
        if alpha != 1.0:
            wt = wt * np.float32(alpha)
        c = n.input[2] if len(n.input) > 2 and n.input[2] else None
        c_val = _const_value(c, inits, producers) if c else None
        if c and c_val is None and beta != 1.0:
            skipped[label] = "Gemm with an activation bias C and beta != 1"
            new_nodes.append(n)
            continue
        wname = add_init(wt.astype(np.float32), f"{b}_matmul")
        mm_out = n.output[0] if c is None else fresh(f"{n.output[0]}_matmul")
        new_nodes.append(helper.make_node("MatMul", [n.input[0], wname], [mm_out], name=fresh(f"{label}_matmul")))
        if c is not None:
            cname = c if c_val is None else add_init((c_val * np.float32(beta)).astype(np.float32), f"{c}_bias")
            new_nodes.append(helper.make_node("Add", [mm_out, cname], [n.output[0]], name=fresh(f"{label}_bias")))
        gemms += 1
    del g.node[:]
    g.node.extend(new_nodes)
    # drop the Transpose/Reshape nodes (and initializers) nothing reads any more
    while True:
        read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        dead = [n for n in g.node if n.op_type in _PASS_THROUGH and not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            g.node.remove(n)
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for t in [t for t in g.initializer if t.name not in read]:
        g.initializer.remove(t)
    if folded:
        notes.append(f"int4: {folded} MatMul weight(s) folded from a Transpose/Reshape of an initializer")
    if gemms:
        notes.append(f"int4: {gemms} Gemm(s) rewritten as MatMul (+ Add of the bias) so that MatMulNBits applies")
    return model, notes, skipped


def quantize_int4(src: Path, dst: Path, opts: Int4Options, notes: list[str] | None = None) -> str:
    """MatMulNBits weight-only int4 on every MatMul (and Gemm, rewritten as MatMul) whose
    weight is constant: an initializer, or a Transpose/Reshape of one
    (:func:`prepare_for_int4`). Raises QuantizeError when the model has none (nothing
    would change). The MatMul/Gemm left in float, and why, are appended to ``notes``."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    model = onnx.load(str(src))
    total = sum(1 for nd in model.graph.node if nd.op_type in ("MatMul", "Gemm") and nd.domain in ("", "ai.onnx"))
    model, prep_notes, skipped = prepare_for_int4(model)
    cfg = DefaultWeightOnlyQuantConfig(block_size=opts.block_size, is_symmetric=opts.symmetric, accuracy_level=opts.accuracy_level)
    q = MatMulNBitsQuantizer(model, algo_config=cfg)
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)  # it logs one INFO line per node it skips
    try:
        q.process()
    finally:
        log.setLevel(level)
    out = q.model.model if hasattr(q.model, "model") else q.model
    n = sum(1 for nd in out.graph.node if nd.op_type == "MatMulNBits")
    if n == 0:
        why = f" ({len(skipped)} MatMul/Gemm, each with a weight computed from activations or not float32)" if skipped else ""
        raise QuantizeError(f"no MatMul or Gemm with a constant 2-D fp32 weight to quantize (MatMulNBits covers only those){why}")
    left = [nd.name or nd.output[0] for nd in out.graph.node if nd.op_type in ("MatMul", "Gemm") and nd.domain in ("", "ai.onnx")]
    for name in left:
        skipped.setdefault(name, "MatMulNBits did not take it (a weight that is not 2-D, or N-D with non-unit leading dims)")
    onnx.save(out, str(dst))
    if notes is not None:
        notes.extend(prep_notes)
        notes.append(f"int4: {n} of {total} MatMul/Gemm quantized to MatMulNBits; {len(left)} kept in float")
        notes.extend(f"int4: {k} kept in float: {v}" for k, v in skipped.items() if k in left)
    return (
        f"int4 weight-only MatMulNBits on {n} of {total} MatMul/Gemm, block {opts.block_size}, "
        f"{'symmetric' if opts.symmetric else 'asymmetric'}, accuracy_level {opts.accuracy_level}"
    )


#: ``convert_float_to_float16`` clamps every float constant into [-max_finite_val, max_finite_val] (default 1e4)
#: before the cast (onnxruntime/python/tools/transformers/float16.py, ``convert_np_to_float16``): a weight beyond it
#: is silently changed, not just rounded.
FP16_CLAMP = 1e4


def fp16_unsafe_nodes(model: Any) -> dict[str, str]:
    """Nodes (by name) that read a float initializer beyond :data:`FP16_CLAMP` in magnitude, with why: fp16 would
    clamp that weight (PP-OCRv4's detector has a BatchNormalization running variance of 9.8e7; clamped to 1e4 its
    probability map moved by up to 1.0). They are kept in fp32."""
    import numpy as np
    from onnx import numpy_helper

    big: dict[str, float] = {}
    for t in model.graph.initializer:
        if t.data_type in (1, 11):  # FLOAT, DOUBLE
            a = numpy_helper.to_array(t)
            if a.size:
                m = float(np.abs(a[np.isfinite(a)]).max()) if np.isfinite(a).any() else 0.0
                if m > FP16_CLAMP:
                    big[t.name] = m
    out: dict[str, str] = {}
    for n in model.graph.node:
        hit = [i for i in n.input if i in big]
        if hit:
            out[n.name] = f"{n.op_type} reads {hit[0]} (|x| up to {big[hit[0]]:.3g}, beyond fp16's clamp {FP16_CLAMP:g})"
    return out


def convert_fp16(src: Path, dst: Path, notes: list[str] | None = None) -> str:
    """fp16 weights and compute, fp32 inputs/outputs kept (one Cast at each end); a node whose constant input fp16
    cannot hold (:func:`fp16_unsafe_nodes`) stays in fp32, with a note saying which and why."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = onnx.load(str(src))
    _name_nodes(m)  # the block list is by node name
    unsafe = fp16_unsafe_nodes(m)
    m = convert_float_to_float16(m, keep_io_types=True, node_block_list=sorted(unsafe) or None)
    onnx.save(m, str(dst))
    desc = "fp16 weights and activations, fp32 inputs/outputs kept"
    if unsafe:
        desc += f", {len(unsafe)} node(s) kept in fp32"
        if notes is not None:
            notes.append(f"fp16: {len(unsafe)} node(s) kept in fp32 because a constant they read is out of fp16's range: " + "; ".join(f"{k}: {v}" for k, v in sorted(unsafe.items())))
    return desc


TARGETS = ("int8", "int4", "fp16")


def parse_targets(text: str) -> tuple[str, ...]:
    """Parse ``--to`` (``"int8,int4,fp16"``) into a tuple of targets; :class:`QuantizeError` for an empty list or an
    unknown target."""
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in items if t not in TARGETS]
    if bad or not items:
        raise QuantizeError(f"--to: expected a comma list of {list(TARGETS)}, got {text!r}")
    return items


def quantize_target(
    target: str, src: Path, dst: Path, *, int8: Int8Options, int4: Int4Options, reader_factory: Any, notes: list[str] | None = None
) -> str:
    """Dispatch one target (a table, not an if-chain); ``notes`` collects what the target's step reports."""
    table = {
        "int8": lambda: quantize_int8(src, dst, int8, reader_factory),
        "int4": lambda: quantize_int4(src, dst, int4, notes),
        "fp16": lambda: convert_fp16(src, dst, notes),
    }
    return table[target]()


def describe_exclusions(nodes: Sequence[str]) -> str:
    """Node names kept in float, for a report: comma separated, or ``none``."""
    return ", ".join(nodes) if nodes else "none"
