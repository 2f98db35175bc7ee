"""``edge-convert inspect MODEL``: what a model file is and which quantization modes suit it.

:func:`inspect_model` reads an ONNX or TFLite file and returns a
:class:`ModelInspection`: format, size and sha256, opsets / schema version,
producer, the graph signature, op counts, parameter count and weight dtypes,
whether the model is already quantized, and for each quantization mode
edge-convert knows (``int8-static``, ``int8-dynamic``, ``int4``, ``fp16``)
whether it applies to this graph and why.  :func:`format_inspection` renders it
for a terminal; :meth:`ModelInspection.to_dict` gives a JSON-able dict.

Nothing here runs the model.  ONNX files are parsed with ``onnx`` from the
bytes that were hashed (``onnx.load_model_from_string``, which like
``load_model(load_external_data=False)`` never opens external data: external
weights are counted from their declared dims); TFLite files with the flatbuffer
accessors of ``ai_edge_litert.schema_py_generated`` after
:func:`edge_sdk.package.modelfile.inspect_tflite` has bounds-checked the buffer.
Pickles (PyTorch checkpoints), zip archives, ORT-format models, unknown or
truncated files and missing paths raise :class:`InspectError` naming the file.

Op counts
    ONNX: every node of the main graph and of its nested subgraphs
    (``If``/``Loop``/``Scan`` bodies), keyed by op type, prefixed with the
    domain unless it is the default one (``com.microsoft.MatMulNBits``).
    Model-local function bodies are not counted (their call sites are).
    TFLite: every operator of every subgraph, keyed by builtin op name
    (``CONV_2D``), custom ops as ``custom:<code>``.

Parameters
    ONNX: elements of every initializer (main graph and subgraphs, sparse
    initializers at their dense size) plus ``Constant`` nodes' tensor values.
    TFLite: elements of every tensor backed by a non-empty constant buffer,
    each buffer counted once.  ``weight_dtypes`` splits that count by dtype.

The int8 recommendation (``recommended_int8``; ``edge-convert quantize --int8-method auto`` uses it)
    ``"static"`` when the graph has a convolution (Conv/ConvTranspose/
    QLinearConv/ConvInteger; TFLite CONV_2D, DEPTHWISE_CONV_2D,
    TRANSPOSE_CONV, CONV_3D) or no MatMul-like node at all; otherwise
    ``"dynamic"``, and the reason says which kind of graph it is:

    * transformer/RNN-like: a recurrent or attention op (LSTM, GRU, RNN,
      Attention, MultiHeadAttention, GroupQueryAttention, ...; TFLite's
      LSTM/RNN ops), a layer normalization with at least two MatMul-like
      nodes, or a Softmax whose output feeds a MatMul (``softmax(Q K^T) V``):
      activation ranges change from input to input;
    * MLP-like: MatMul-like nodes (MatMul/Gemm/...; TFLite FULLY_CONNECTED,
      BATCH_MATMUL) and no convolution.  Measured on the repository's MLP
      (``tools/data/shapes_mlp_fp32.onnx``): static int8 failed the cosine
      gate until repair had kept all three MatMuls in float, while dynamic
      int8 passed at cosine 0.99996.

    CNN-like graphs have stable activation ranges and run fastest with
    calibrated static QDQ int8.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

from edge_sdk.errors import ModelFormatError
from edge_sdk.package.modelfile import ONNX_DTYPE_NAMES, inspect_tflite, scan_onnx, sniff_format

from .errors import ConverterError

__all__ = [
    "InspectError",
    "ModeCheck",
    "ModelInspection",
    "TensorInfo",
    "format_inspection",
    "inspect_model",
]

MODES = ("int8-static", "int8-dynamic", "int4", "fp16")


class InspectError(ConverterError, ValueError):
    """The file cannot be inspected: missing, not a model, refused or corrupt."""


class ModeCheck(NamedTuple):
    """Whether quantization ``mode`` applies to the model, and why (one line)."""

    mode: str
    applies: bool
    why: str


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output.

    ``shape`` has one entry per axis: an int for a fixed size, the dim's name
    for a named dynamic axis (ONNX ``dim_param``) or ``-1`` for an unnamed
    dynamic one; ``None`` when the rank is unknown.  ``quant`` is the
    per-tensor ``(scale, zero_point)`` of a quantized TFLite tensor.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...] | None
    quant: tuple[float, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: name, dtype, shape (None if unknown) and ``quant`` where the tensor is quantized."""
        d: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}
        if self.quant is not None:
            d["quant"] = list(self.quant)
        return d


@dataclass(frozen=True)
class ModelInspection:
    """What :func:`inspect_model` found in one model file.

    ``opsets`` (ONNX: domain -> version, the default domain as ``"ai.onnx"``)
    and ``ir_version`` are empty/None for TFLite; ``schema_version`` is None
    for ONNX.  ``quantization`` lists the evidence behind ``quantized``
    (e.g. ``"QuantizeLinear x4"``, ``"int8 weights"``).  ``modes`` has one
    :class:`ModeCheck` per mode in :data:`MODES` order.  ``int4_matmuls`` /
    ``int4_gathers`` count the nodes ONNX Runtime's MatMulNBits quantizer
    would convert.  ``external_data`` names the files holding external ONNX
    weights (not opened).
    """

    path: str
    format: str
    size_bytes: int
    sha256: str
    producer: str
    opsets: dict[str, int]
    ir_version: int | None
    schema_version: int | None
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    op_counts: dict[str, int]
    parameter_count: int
    weight_dtypes: dict[str, int]
    quantized: bool
    quantization: tuple[str, ...]
    modes: tuple[ModeCheck, ...]
    recommended_int8: str
    recommended_reason: str
    int4_matmuls: int = 0
    int4_gathers: int = 0
    external_data: tuple[str, ...] = ()

    @property
    def node_count(self) -> int:
        """Number of nodes in the graph."""
        return sum(self.op_counts.values())

    def mode(self, name: str) -> ModeCheck:
        """The :class:`ModeCheck` of precision mode ``name``; ``KeyError`` if there is none."""
        for m in self.modes:
            if m.mode == name:
                return m
        raise KeyError(f"no mode {name!r}; modes are {list(MODES)}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field (plus ``node_count``)."""
        return {
            "path": self.path,
            "format": self.format,
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "producer": self.producer,
            "opsets": dict(self.opsets),
            "ir_version": self.ir_version,
            "schema_version": self.schema_version,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "op_counts": dict(self.op_counts),
            "node_count": self.node_count,
            "parameter_count": self.parameter_count,
            "weight_dtypes": dict(self.weight_dtypes),
            "quantized": self.quantized,
            "quantization": list(self.quantization),
            "modes": [{"mode": m.mode, "applies": m.applies, "why": m.why} for m in self.modes],
            "recommended_int8": self.recommended_int8,
            "recommended_reason": self.recommended_reason,
            "int4_matmuls": self.int4_matmuls,
            "int4_gathers": self.int4_gathers,
            "external_data": list(self.external_data),
        }


# --------------------------------------------------------------------------
# op families (ONNX names without domain; TFLite builtin names)

_CONV = frozenset({"Conv", "ConvTranspose", "QLinearConv", "ConvInteger", "FusedConv", "NhwcConv",
                   "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D", "CONV_3D_TRANSPOSE"})  # fmt: skip
_MATMUL = frozenset({"MatMul", "Gemm", "FusedMatMul", "QLinearMatMul", "MatMulInteger", "MatMulNBits", "QGemm",
                     "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "FULLY_CONNECTED", "BATCH_MATMUL"})  # fmt: skip
_RECURRENT_ATTENTION = frozenset({
    "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention", "GroupQueryAttention", "QAttention",
    "DynamicQuantizeLSTM", "PackedAttention", "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention",
    "SparseAttention", "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM",
    "UNIDIRECTIONAL_SEQUENCE_RNN", "BIDIRECTIONAL_SEQUENCE_RNN",
})  # fmt: skip
_LAYERNORM = frozenset({"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                        "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "RMSNormalization"})  # fmt: skip
_SOFTMAX_CONSUMERS = frozenset({"MatMul", "FusedMatMul", "Einsum", "BATCH_MATMUL"})
# what int8-static / int8-dynamic work on (the brief's families)
_STATIC_TARGETS = frozenset({"Conv", "Gemm", "MatMul", "ConvTranspose", "CONV_2D", "DEPTHWISE_CONV_2D",
                             "TRANSPOSE_CONV", "FULLY_CONNECTED", "BATCH_MATMUL"})  # fmt: skip
_DYNAMIC_TARGETS = frozenset({"MatMul", "Gemm", "LSTM", "GRU", "Attention", "MultiHeadAttention",
                              "FULLY_CONNECTED", "BATCH_MATMUL", "UNIDIRECTIONAL_SEQUENCE_LSTM",
                              "BIDIRECTIONAL_SEQUENCE_LSTM"})  # fmt: skip
# ops that only exist in quantized ONNX graphs
_QUANT_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "MatMulNBits", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "GatherBlockQuantized",
    "QAttention", "QGemm", "QEmbedLayerNormalization", "MatMulBnb4", "MatMulFpQ4", "DequantizeBFP", "QuantizeBFP",
})  # fmt: skip
_INT_WEIGHT_DTYPES = frozenset({"int8", "uint8", "int4", "uint4", "int2", "uint2", "int16", "uint16"})
_QUANT_WEIGHT_DTYPES = frozenset({"int8", "uint8", "int4", "uint4", "int2", "uint2"})
_FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})


def _bare(op: str) -> str:
    """Op type without its domain prefix (``com.microsoft.Attention`` -> ``Attention``)."""
    return op.rsplit(".", 1)[-1]


def _family_count(op_counts: dict[str, int], family: frozenset[str]) -> dict[str, int]:
    return {op: n for op, n in op_counts.items() if _bare(op) in family}


def _list_ops(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _is_quant_op(op: str) -> bool:
    b = _bare(op)
    return b in _QUANT_OPS or b.startswith("QLinear") or b.startswith("QOrdered")


# --------------------------------------------------------------------------
# entry point


def inspect_model(path: str | Path) -> ModelInspection:
    """Inspect the ONNX or TFLite model at ``path`` (nothing is executed).

    Raises :class:`InspectError` (a ``ValueError``) naming the file when it is
    missing, a directory, a pickle, a zip archive, an ORT-format model, a
    truncated/corrupt ONNX or TFLite file, or anything else.
    """
    p = Path(path)
    if not p.exists():
        raise InspectError(f"{p}: no such file")
    if not p.is_file():
        raise InspectError(f"{p}: not a regular file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InspectError(f"{p}: cannot read: {e}") from e
    fmt = sniff_format(data)
    if fmt == "pickle":
        raise InspectError(
            f"{p}: is a Python pickle (e.g. a PyTorch checkpoint); pickles run code when loaded and are refused. "
            "Export the model to ONNX (torch.onnx.export) and inspect that."
        )
    if fmt == "zip":
        raise InspectError(f"{p}: is a zip archive, not a model file (a packaged model? use `edge-convert verify`)")
    if fmt == "ort":
        raise InspectError(f"{p}: is an ORT-format model (.ort); inspect the .onnx it was made from")
    if fmt == "unknown":
        try:
            scan_onnx(data)
            detail = "unrecognised content"
        except ModelFormatError as e:
            detail = str(e)
        kind = "a valid ONNX model (truncated or corrupt?)" if p.suffix.lower() == ".onnx" else "an ONNX or TFLite model"
        raise InspectError(f"{p}: not {kind}: {detail}")
    common = {"path": str(p), "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if fmt == "tflite":
        return _inspect_tflite(p, data, common)
    return _inspect_onnx(p, data, common)


# --------------------------------------------------------------------------
# ONNX


def _onnx_dtype(elem_type: int) -> str:
    name = ONNX_DTYPE_NAMES.get(elem_type)
    if name:
        return name
    import onnx

    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type{elem_type}"


def _onnx_sig(vi: Any) -> TensorInfo:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        kind = t.WhichOneof("value") or "untyped"
        return TensorInfo(vi.name, kind.replace("_type", ""), None)
    tt = t.tensor_type
    shape: tuple[int | str, ...] | None = None
    if tt.HasField("shape"):
        dims: list[int | str] = []
        for d in tt.shape.dim:
            which = d.WhichOneof("value")
            if which == "dim_value":
                dims.append(int(d.dim_value))
            elif which == "dim_param" and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(-1)
        shape = tuple(dims)
    return TensorInfo(vi.name, _onnx_dtype(tt.elem_type), shape)


def _n_elements(dims: Iterable[int]) -> int:
    return math.prod(int(d) for d in dims)


def _subgraphs(node: Any) -> Iterator[Any]:
    import onnx

    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _walk_graphs(graph: Any, outer: tuple[dict[str, Any], ...] = ()) -> Iterator[tuple[Any, tuple[dict[str, Any], ...]]]:
    """Yield (graph, initializer scopes innermost first) for the graph and every nested subgraph."""
    inputs = {vi.name for vi in graph.input}
    # an initializer that is also a graph input is a default value the caller may override: not constant
    scope = {t.name: t for t in graph.initializer if t.name not in inputs}
    scopes = (scope, *outer)
    yield graph, scopes
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _walk_graphs(sub, scopes)


def _lookup(name: str, scopes: tuple[dict[str, Any], ...]) -> Any:
    for s in scopes:
        if name in s:
            return s[name]
    return None


def _inspect_onnx(p: Path, data: bytes, common: dict[str, Any]) -> ModelInspection:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        # parse the bytes already read and hashed; external data is never loaded from a string
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise InspectError(f"{p}: not a readable ONNX model: {e}") from e
    g = model.graph
    opsets = {("ai.onnx" if o.domain in ("", "ai.onnx") else o.domain): int(o.version) for o in model.opset_import}
    if not opsets:
        raise InspectError(f"{p}: ONNX model declares no opset_import (truncated or corrupt?)")

    op_counts: Counter[str] = Counter()
    weight_dtypes: Counter[str] = Counter()
    params = 0
    int4_mm = int4_gather = mm_total = 0
    softmax_feeds_matmul = False
    external: list[str] = []

    def add_tensor(t: Any) -> None:
        nonlocal params
        n = _n_elements(t.dims)
        params += n
        weight_dtypes[_onnx_dtype(t.data_type)] += n
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            if loc and loc not in external:
                external.append(loc)

    for graph, scopes in _walk_graphs(g):
        for t in graph.initializer:
            add_tensor(t)
        for st in graph.sparse_initializer:
            n = _n_elements(st.dims)
            params += n
            weight_dtypes[_onnx_dtype(st.values.data_type)] += n
        consumers: dict[str, list[str]] = {}
        for node in graph.node:
            for i in node.input:
                consumers.setdefault(i, []).append(node.op_type)
        for node in graph.node:
            dom = node.domain if node.domain not in ("", "ai.onnx") else ""
            op_counts[f"{dom}.{node.op_type}" if dom else node.op_type] += 1
            if node.op_type == "Constant" and not dom:
                for a in node.attribute:
                    if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        add_tensor(a.t)
            if dom:
                continue
            if node.op_type == "MatMul":
                mm_total += 1
                b = _lookup(node.input[1], scopes) if len(node.input) > 1 else None
                if b is not None and len(b.dims) == 2 and b.data_type == onnx.TensorProto.FLOAT:
                    int4_mm += 1
            elif node.op_type == "Gather" and node.input:
                d = _lookup(node.input[0], scopes)
                if d is not None and len(d.dims) == 2 and d.data_type == onnx.TensorProto.FLOAT:
                    int4_gather += 1
            elif node.op_type == "Softmax":
                if any(c in _SOFTMAX_CONSUMERS for o in node.output for c in consumers.get(o, ())):
                    softmax_feeds_matmul = True

    counts = dict(sorted(op_counts.items()))
    evidence = [f"{op} x{n}" for op, n in counts.items() if _is_quant_op(op)]
    qw = {dt: n for dt, n in weight_dtypes.items() if dt in _QUANT_WEIGHT_DTYPES}
    evidence += [f"{dt} weights ({n} elements)" for dt, n in sorted(qw.items())]
    quantized = bool(evidence)
    float_params = sum(n for dt, n in weight_dtypes.items() if dt == "float32")
    fp16_params = sum(n for dt, n in weight_dtypes.items() if dt in ("float16", "bfloat16"))
    float_io = any(t.dtype == "float32" for t in (*map(_onnx_sig, g.input), *map(_onnx_sig, g.output)))

    modes = _modes(counts, quantized, onnx_extras={
        "int4_mm": int4_mm, "int4_gather": int4_gather, "mm_total": mm_total,
        "float_params": float_params, "fp16_params": fp16_params, "float_io": float_io,
    })  # fmt: skip
    rec, why = _recommend(counts, softmax_feeds_matmul)
    init_names = {t.name for t in g.initializer}
    producer = " ".join(x for x in (model.producer_name, model.producer_version) if x)
    return ModelInspection(
        format="onnx",
        producer=producer,
        opsets=opsets,
        ir_version=int(model.ir_version),
        schema_version=None,
        inputs=tuple(_onnx_sig(vi) for vi in g.input if vi.name not in init_names),
        outputs=tuple(_onnx_sig(vi) for vi in g.output),
        op_counts=counts,
        parameter_count=params,
        weight_dtypes=dict(sorted(weight_dtypes.items())),
        quantized=quantized,
        quantization=tuple(evidence),
        modes=modes,
        recommended_int8=rec,
        recommended_reason=why,
        int4_matmuls=int4_mm,
        int4_gathers=int4_gather,
        external_data=tuple(external),
        **common,
    )


# --------------------------------------------------------------------------
# TFLite


def _tflite_tables() -> tuple[Any, dict[int, str], dict[int, str]]:
    from ai_edge_litert import schema_py_generated as s

    ops = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}
    types = {v: k.lower() for k, v in vars(s.TensorType).items() if not k.startswith("_") and isinstance(v, int)}
    return s, ops, types


def _inspect_tflite(p: Path, data: bytes, common: dict[str, Any]) -> ModelInspection:
    try:
        info = inspect_tflite(data)  # bounds-checks the flatbuffer before the accessors read it
    except ModelFormatError as e:
        raise InspectError(f"{p}: not a valid TFLite model: {e}") from e
    s, op_names, type_names = _tflite_tables()
    try:
        return _read_tflite(s, op_names, type_names, data, info.version, common)
    except InspectError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt flatbuffer fails in the accessors in many ways
        raise InspectError(f"{p}: not a readable TFLite model: {type(e).__name__}: {e}") from e


def _read_tflite(
    s: Any, op_names: dict[int, str], type_names: dict[int, str], data: bytes, version: int, common: dict[str, Any]
) -> ModelInspection:
    model = s.Model.GetRootAs(data, 0)
    codes: list[str] = []
    for i in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())  # as TFLite's GetBuiltinCode reads it
        if op_names.get(code) == "CUSTOM":
            cc = oc.CustomCode()
            codes.append(f"custom:{cc.decode('utf-8', 'replace') if cc else '?'}")
        else:
            codes.append(op_names.get(code, f"builtin_{code}"))

    def buffer_elements(buf_index: int) -> bool:
        if buf_index <= 0 or buf_index >= model.BuffersLength():
            return False
        b = model.Buffers(buf_index)
        return b.DataLength() > 0 or (b.Offset() > 1 and b.Size() > 0)

    def sig(sg: Any, index: int) -> TensorInfo:
        t = sg.Tensors(index)
        shape_sig = [int(x) for x in t.ShapeSignatureAsNumpy()] if t.ShapeSignatureLength() else None
        shape = [int(x) for x in t.ShapeAsNumpy()] if t.ShapeLength() else []
        dims = shape_sig if shape_sig is not None else shape
        q = t.Quantization()
        quant = None
        if q is not None and q.ScaleLength() == 1:
            quant = (float(q.Scale(0)), int(q.ZeroPoint(0)) if q.ZeroPointLength() else 0)
        name = t.Name().decode("utf-8", "replace") if t.Name() else f"tensor_{index}"
        return TensorInfo(name, type_names.get(t.Type(), f"type{t.Type()}"), tuple(dims), quant)

    op_counts: Counter[str] = Counter()
    weight_dtypes: Counter[str] = Counter()
    params = 0
    seen_buffers: set[int] = set()
    quant_tensors: Counter[str] = Counter()
    softmax_feeds_matmul = False
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    for si in range(model.SubgraphsLength()):
        sg = model.Subgraphs(si)
        if si == 0:
            inputs = tuple(sig(sg, int(i)) for i in sg.InputsAsNumpy()) if sg.InputsLength() else ()
            outputs = tuple(sig(sg, int(i)) for i in sg.OutputsAsNumpy()) if sg.OutputsLength() else ()
        for ti in range(sg.TensorsLength()):
            t = sg.Tensors(ti)
            dtype = type_names.get(t.Type(), f"type{t.Type()}")
            q = t.Quantization()
            if dtype in _INT_WEIGHT_DTYPES and q is not None and q.ScaleLength() > 0:
                quant_tensors[dtype] += 1
            bi = t.Buffer()
            if bi not in seen_buffers and buffer_elements(bi):
                seen_buffers.add(bi)
                n = _n_elements(t.ShapeAsNumpy()) if t.ShapeLength() else 1
                params += n
                weight_dtypes[dtype] += n
        producers: dict[int, str] = {}
        consumers: dict[int, list[str]] = {}
        for oi in range(sg.OperatorsLength()):
            op = sg.Operators(oi)
            idx = op.OpcodeIndex()
            name = codes[idx] if 0 <= idx < len(codes) else f"opcode_{idx}"
            op_counts[name] += 1
            for j in range(op.OutputsLength()):
                producers[op.Outputs(j)] = name
            for j in range(op.InputsLength()):
                consumers.setdefault(op.Inputs(j), []).append(name)
        for tensor, prod in producers.items():
            if prod == "SOFTMAX" and any(c in _SOFTMAX_CONSUMERS for c in consumers.get(tensor, ())):
                softmax_feeds_matmul = True

    counts = dict(sorted(op_counts.items()))
    evidence = [f"{n} quantized {dt} tensor{'s' if n != 1 else ''}" for dt, n in sorted(quant_tensors.items())]
    quantized = bool(evidence)
    modes = _modes(counts, quantized, onnx_extras=None)
    rec, why = _recommend(counts, softmax_feeds_matmul)
    desc = model.Description()
    return ModelInspection(
        format="tflite",
        producer=desc.decode("utf-8", "replace") if desc else "",
        opsets={},
        ir_version=None,
        schema_version=int(version),
        inputs=inputs,
        outputs=outputs,
        op_counts=counts,
        parameter_count=params,
        weight_dtypes=dict(sorted(weight_dtypes.items())),
        quantized=quantized,
        quantization=tuple(evidence),
        modes=modes,
        recommended_int8=rec,
        recommended_reason=why,
        **common,
    )


# --------------------------------------------------------------------------
# modes and the int8 recommendation


def _modes(counts: dict[str, int], quantized: bool, onnx_extras: dict[str, Any] | None) -> tuple[ModeCheck, ...]:
    static = _family_count(counts, _STATIC_TARGETS)
    dynamic = _family_count(counts, _DYNAMIC_TARGETS)
    done = "already quantized; quantize the float model instead"
    static_kind = "static int8" if onnx_extras is None else "static QDQ"
    out: list[ModeCheck] = []
    # int8-static
    if quantized:
        out.append(ModeCheck("int8-static", False, done))
    elif static:
        out.append(
            ModeCheck("int8-static", True, f"{_list_ops(static)} present: {static_kind} suits CNN-like graphs (needs calibration data)")
        )
    else:
        out.append(ModeCheck("int8-static", False, "no Conv/Gemm/MatMul: nothing static int8 would speed up"))
    # int8-dynamic
    if quantized:
        out.append(ModeCheck("int8-dynamic", False, done))
    elif dynamic:
        out.append(
            ModeCheck(
                "int8-dynamic",
                True,
                f"{_list_ops(dynamic)} present: weights int8 ahead of time, activations per call (no calibration data)",
            )
        )
    else:
        out.append(ModeCheck("int8-dynamic", False, "no MatMul/Gemm/LSTM/GRU/Attention: dynamic int8 has nothing to quantize"))
    if onnx_extras is None:  # TFLite
        out.append(
            ModeCheck("int4", False, "int4 weight-only quantization (MatMulNBits) is an ONNX Runtime format; quantize the ONNX model")
        )
        out.append(ModeCheck("fp16", False, "fp16 conversion is done on the ONNX model"))
        return tuple(out)
    mm, ga, total = onnx_extras["int4_mm"], onnx_extras["int4_gather"], onnx_extras["mm_total"]
    # int4
    if quantized:
        out.append(ModeCheck("int4", False, done))
    elif mm or ga:
        parts = []
        if mm:
            parts.append(
                f"{mm} of {total} MatMul node{'s' if total != 1 else ''} have a constant 2-D fp32 B (ONNX Runtime's MatMulNBits quantizes only those)"
            )
        if ga:
            parts.append(f"{ga} Gather of a 2-D fp32 initializer (embedding tables, GatherBlockQuantized)")
        out.append(ModeCheck("int4", True, "; ".join(parts)))
    elif total:
        out.append(
            ModeCheck(
                "int4", False, f"none of {total} MatMul node{'s' if total != 1 else ''} has a constant 2-D fp32 B; MatMulNBits needs one"
            )
        )
    else:
        gemm = counts.get("Gemm", 0)
        extra = f" (Gemm x{gemm} is not converted to MatMulNBits)" if gemm else ""
        out.append(ModeCheck("int4", False, f"no MatMul with a constant 2-D fp32 B and no Gather of a 2-D fp32 initializer{extra}"))
    # fp16
    fp, fp16 = onnx_extras["float_params"], onnx_extras["fp16_params"]
    if quantized:
        out.append(ModeCheck("fp16", False, done))
    elif fp:
        out.append(ModeCheck("fp16", True, f"float32 model ({fp} fp32 weight elements): fp16 halves the weights' size"))
    elif fp16:
        out.append(ModeCheck("fp16", False, f"weights are already 16-bit floats ({fp16} elements)"))
    elif onnx_extras["float_io"]:
        out.append(ModeCheck("fp16", True, "float32 model without weights: fp16 halves activation memory"))
    else:
        out.append(ModeCheck("fp16", False, "no float32 weights or tensors to convert"))
    return tuple(out)


def _recommend(counts: dict[str, int], softmax_feeds_matmul: bool) -> tuple[str, str]:
    conv = _family_count(counts, _CONV)
    mm = sum(_family_count(counts, _MATMUL).values())
    rnn = _family_count(counts, _RECURRENT_ATTENTION)
    ln = _family_count(counts, _LAYERNORM)
    if conv:
        return "static", f"{_list_ops(conv)} present (CNN-like): calibrated static QDQ int8 is fastest and holds accuracy"
    signals = []
    if rnn:
        signals.append(_list_ops(rnn))
    if ln and mm >= 2:
        signals.append(f"{_list_ops(ln)} with {mm} MatMul-like nodes")
    if softmax_feeds_matmul:
        signals.append("Softmax feeding a MatMul (attention)")
    if signals:
        return (
            "dynamic",
            f"transformer/RNN-like, no convolution ({'; '.join(signals)}): activation ranges vary per input, so quantize them per call",
        )
    if mm:
        return "dynamic", (
            f"{mm} MatMul-like node(s) and no convolution (MLP-like): activations quantized per call keep the thin "
            "margins of dense layers that calibrated static ranges can lose"
        )
    return "static", "no convolution and no MatMul-like node: calibrated static int8"


# --------------------------------------------------------------------------
# text


def _shape_text(shape: tuple[int | str, ...] | None) -> str:
    return "?" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.2f} MiB"


def format_inspection(info: ModelInspection) -> str:
    """Human-readable, multi-line description of ``info`` for a terminal."""
    lines = [f"{info.path}: {info.format.upper()}, {_kib(info.size_bytes)} ({info.size_bytes} bytes)", f"  sha256    {info.sha256}"]
    if info.format == "onnx":
        ops = ", ".join(f"{d} {v}" for d, v in info.opsets.items())
        lines.append(f"  producer  {info.producer or '(none)'} | IR {info.ir_version} | opsets {ops}")
    else:
        lines.append(f"  producer  {info.producer or '(none)'} | schema version {info.schema_version}")
    for title, tensors in (("inputs", info.inputs), ("outputs", info.outputs)):
        lines.append(f"  {title}:")
        for t in tensors:
            q = f"  (scale {t.quant[0]:.6g}, zero point {t.quant[1]})" if t.quant else ""
            lines.append(f"    {t.name}  {t.dtype}  {_shape_text(t.shape)}{q}")
    dts = ", ".join(f"{dt} {n:,}" for dt, n in info.weight_dtypes.items())
    lines.append(f"  parameters {info.parameter_count:,}" + (f" ({dts})" if dts else ""))
    if info.external_data:
        lines.append(f"  external data (not opened): {', '.join(info.external_data)}")
    lines.append(f"  ops ({info.node_count} nodes): " + (_list_ops(info.op_counts) or "none"))
    lines.append(f"  quantized  {'yes: ' + ', '.join(info.quantization) if info.quantized else 'no'}")
    lines.append("  modes:")
    width = max(len(m.mode) for m in info.modes)
    for m in info.modes:
        lines.append(f"    {m.mode:<{width}}  {'yes' if m.applies else 'no ':<3}  {m.why}")
    lines.append(f"  recommended int8: {info.recommended_int8} -- {info.recommended_reason}")
    return "\n".join(lines)
