"""Dependency-free inspection of model files, run before any runtime reads a byte.

Nothing here imports ``onnx``, ``onnxruntime``, ``flatbuffers`` or numpy: the
package validator needs to know what a file is, what it declares and which
other files it will make a runtime open, using only the standard library.

* :func:`sniff_format` -- what kind of file this is (``"onnx"``, ``"tflite"``,
  ``"ort"``, ``"pickle"``, ``"zip"`` or ``"unknown"``).
* :func:`scan_onnx` -- a minimal protobuf wire-format walker over ONNX's
  ``ModelProto`` (field numbers from ``onnx/onnx.proto``) returning the opsets,
  the graph signature, the op types and *every* external-data reference.
* :func:`inspect_tflite` -- checks a TFLite flatbuffer's header, root table,
  vtables and top-level vectors lie inside the buffer.

The walker follows protobuf's own parsing rules, so that what it reports is
what a runtime's protobuf parser will see: unknown fields and fields with an
unexpected wire type are skipped by wire type (never recursed into); a
singular sub-message that occurs twice is *merged* (external data hidden in a
first ``graph`` chunk is still found); repeated fields accumulate; and every
sub-message onnx.proto declares is checked even where nothing is extracted
from it (``_SCHEMA``), so bytes protobuf rejects are never accepted here.  It
is stricter than protobuf in a few places, all of which raise
:class:`~edge_sdk.errors.ModelFormatError`: groups (wire types 3/4), strings
that are not UTF-8, nesting deeper than ``max_depth``, duplicate opset
domains, and malformed external-data entries (``data_location=EXTERNAL``
without a location, a repeated key, a non-decimal offset/length).

Every loop advances by at least one byte and only the messages the walker
understands are entered, each at a bounded depth, so hostile input can neither
hang it nor exhaust the stack.  Large payloads (``raw_data``, doc strings,
unknown fields) are skipped by length without being copied.
"""

from __future__ import annotations

import io
import math
import re
import struct
from dataclasses import field
from typing import Iterator, TypedDict, Union

from .._record import frozen
from ..errors import ModelFormatError, OptionsError, OptionsTypeError

__all__ = [
    "PICKLE_SCAN_BYTES",
    "ExternalRef",
    "OnnxInfo",
    "TFLiteInfo",
    "TensorSig",
    "inspect_tflite",
    "looks_pickled",
    "precision_mismatch",
    "scan_onnx",
    "sniff_format",
    "weight_precisions",
]

Buffer = Union[bytes, bytearray, memoryview]
#: What the walkers index: :func:`_as_buffer`'s result (a memoryview is cast to bytes "B").
_Buf = Union[bytes, memoryview]

#: Highest ``max_depth`` accepted.  A message level costs at most two Python
#: frames, so this stays far below the interpreter's recursion limit (protobuf
#: itself refuses nesting deeper than 100 by default).
MAX_DEPTH_LIMIT = 200

_MASK64 = (1 << 64) - 1

# TensorProto.DataType -> numpy-style dtype name (ml_dtypes names for the
# types numpy itself lacks).  Unknown / UNDEFINED map to None.
#: ONNX TensorProto element type -> numpy dtype name (the types the SDK can feed).
ONNX_DTYPE_NAMES: dict[int, str] = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    14: "complex64",
    15: "complex128",
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
    25: "uint2",
    26: "int2",
    27: "float6_e2m3fn",
    28: "float6_e3m2fn",
}

_DEFAULT_DOMAINS = ("", "ai.onnx")
_DATA_LOCATION_EXTERNAL = 1
_DECIMAL = re.compile(r"[0-9]+\Z")


# --- results ----------------------------------------------------------------------


@frozen
class TensorSig:
    """A graph input or output as the model declares it.

    ``elem_type`` is the raw ``TensorProto.DataType`` (0 when the value is not a
    tensor or declares no type); ``dtype`` its numpy-style name or ``None``.
    ``dims`` is ``None`` when the rank is unknown (no shape), otherwise one
    entry per axis: an ``int`` (fixed), a ``str`` (symbolic ``dim_param``) or
    ``None`` (unnamed dynamic axis).
    """

    name: str
    elem_type: int
    dtype: str | None
    dims: tuple[int | str | None, ...] | None


@frozen
class ExternalRef:
    """A tensor whose bytes live in another file, exactly as the model names it.

    ``location`` is *not* normalised or checked here: deciding whether it stays
    inside the package is the caller's job.
    """

    tensor_name: str
    location: str
    offset: int | None
    length: int | None


@frozen
class OnnxInfo:
    """What :func:`scan_onnx` found.

    ``opsets`` maps domain to version, the default domain spelled ``"ai.onnx"``.
    ``inputs`` are the main graph's inputs that are not initializers.
    ``external_data`` lists every external tensor wherever it sits (graph and
    sparse initializers, node attributes, nested subgraphs, functions, training
    graphs), in file order.  ``op_types`` holds every operator used in the main
    graph, its nested subgraphs and the model's functions, prefixed with the
    domain unless it is the default one (``"com.microsoft.MatMulNBits"``).
    ``node_count`` counts the main graph's top-level nodes (``len(graph.node)``).
    """

    ir_version: int
    opsets: dict[str, int]
    producer_name: str
    graph_name: str
    inputs: tuple[TensorSig, ...]
    outputs: tuple[TensorSig, ...]
    external_data: tuple[ExternalRef, ...]
    op_types: frozenset[str]
    node_count: int
    #: ``(elem_type, total elements, largest tensor's elements)`` per element type of every
    #: initializer (dense and sparse values, main graph and subgraphs): what the weights are stored as.
    weights: tuple[tuple[int, int, int], ...] = field(default=(), compare=False)


@frozen
class TFLiteInfo:
    """``version`` is the TFLite schema version; ``size`` the buffer length in bytes.
    ``weights``: ``(TensorType, total elements, largest tensor's elements)`` per tensor type of the
    constant tensors (those whose buffer holds data)."""

    version: int
    size: int
    weights: tuple[tuple[int, int, int], ...] = field(default=(), compare=False)


# --- input handling ---------------------------------------------------------------


def _as_buffer(data: Buffer) -> bytes | memoryview:
    """Return something indexable by byte without copying ``data``."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        mv = memoryview(data)
        if not mv.c_contiguous:
            raise TypeError("model data must be a C-contiguous buffer")
        if mv.ndim != 1 or mv.format != "B":
            mv = mv.cast("B")  # bytes-like view indexed as ints, no copy
        return mv
    raise TypeError(f"model data must be bytes, bytearray or memoryview, not {type(data).__name__}")


# --- protobuf wire format --------------------------------------------------------


def _read_varint(buf: _Buf, pos: int, end: int, what: str) -> tuple[int, int]:
    """Decode the varint at ``pos`` (which must end before ``end``)."""
    start = pos
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ModelFormatError(
                f"truncated varint ({what}) at byte {start}: the enclosing data ends at byte {end} before the varint's last byte"
            )
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise ModelFormatError(f"varint ({what}) at byte {start} is longer than 10 bytes")


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v


def _int32(v: int) -> int:
    """An int32/enum field: protobuf keeps the low 32 bits of the varint."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def _fields(buf: _Buf, pos: int, end: int, ctx: str) -> Iterator[tuple[int, int, int, int]]:
    """Walk the fields of one message occupying ``buf[pos:end]``.

    Yields ``(field_number, wire_type, a, b)``: for a varint ``a`` is its value
    and ``b`` is 0; for a length-delimited field ``a:b`` is its payload.
    Fixed 32/64-bit fields are checked and skipped (nothing here needs them).
    Each step consumes at least the tag byte, so the loop always terminates.
    """
    while pos < end:
        tag_pos = pos
        b = buf[pos]
        if b < 0x80:
            tag = b
            pos += 1
        else:
            tag, pos = _read_varint(buf, pos, end, f"field tag in {ctx}")
            if tag > 0xFFFFFFFF or pos - tag_pos > 5:
                raise ModelFormatError(f"field tag at byte {tag_pos} in {ctx} does not fit in a 5-byte varint32")
        field = tag >> 3
        wire = tag & 7
        if field == 0:
            raise ModelFormatError(f"invalid field number 0 at byte {tag_pos} in {ctx}")
        if wire == 0:
            if pos < end and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
            else:
                value, pos = _read_varint(buf, pos, end, f"value of field {field} in {ctx}")
            yield field, 0, value, 0
        elif wire == 2:
            if pos < end and buf[pos] < 0x80:
                length = buf[pos]
                pos += 1
            else:
                length, pos = _read_varint(buf, pos, end, f"length of field {field} in {ctx}")
            if length > end - pos:
                raise ModelFormatError(
                    f"length-delimited field {field} at byte {tag_pos} in {ctx} declares "
                    f"{length} bytes but only {end - pos} remain before byte {end}"
                )
            start = pos
            pos += length
            yield field, 2, start, pos
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            if size > end - pos:
                raise ModelFormatError(
                    f"fixed{size * 8} field {field} at byte {tag_pos} in {ctx} needs "
                    f"{size} bytes but only {end - pos} remain before byte {end}"
                )
            pos += size
        elif wire == 3 or wire == 4:
            raise ModelFormatError(
                f"field {field} at byte {tag_pos} in {ctx} uses wire type {wire} (protobuf group), which ONNX never uses"
            )
        else:
            raise ModelFormatError(f"field {field} at byte {tag_pos} in {ctx} has invalid wire type {wire}")


# Every message-typed and packable repeated-number field of onnx.proto, so that
# the sub-messages the walker does not extract from are still checked the way
# protobuf checks them (a model protobuf rejects must not pass here).  Kinds:
# a message name, or "varints" / "fixed32s" / "fixed64s" for a packed payload.
# Strings, bytes and single scalars are only skipped.
_SSE = "StringStringEntryProto"
_SCHEMA: dict[str, dict[int, tuple[str, str]]] = {
    "ModelProto": {
        7: ("graph", "GraphProto"),
        8: ("opset_import", "OperatorSetIdProto"),
        14: ("metadata_props", _SSE),
        20: ("training_info", "TrainingInfoProto"),
        25: ("functions", "FunctionProto"),
        26: ("configuration", "DeviceConfigurationProto"),
    },
    "GraphProto": {
        1: ("node", "NodeProto"),
        5: ("initializer", "TensorProto"),
        15: ("sparse_initializer", "SparseTensorProto"),
        11: ("input", "ValueInfoProto"),
        12: ("output", "ValueInfoProto"),
        13: ("value_info", "ValueInfoProto"),
        14: ("quantization_annotation", "TensorAnnotation"),
        16: ("metadata_props", _SSE),
    },
    "NodeProto": {
        5: ("attribute", "AttributeProto"),
        9: ("metadata_props", _SSE),
        10: ("device_configurations", "NodeDeviceConfigurationProto"),
    },
    "AttributeProto": {
        5: ("t", "TensorProto"),
        6: ("g", "GraphProto"),
        7: ("floats", "fixed32s"),
        8: ("ints", "varints"),
        10: ("tensors", "TensorProto"),
        11: ("graphs", "GraphProto"),
        14: ("tp", "TypeProto"),
        15: ("type_protos", "TypeProto"),
        22: ("sparse_tensor", "SparseTensorProto"),
        23: ("sparse_tensors", "SparseTensorProto"),
    },
    "ValueInfoProto": {2: ("type", "TypeProto"), 4: ("metadata_props", _SSE)},
    "NodeDeviceConfigurationProto": {2: ("sharding_spec", "ShardingSpecProto")},
    "ShardingSpecProto": {
        2: ("device", "varints"),
        3: ("index_to_device_group_map", "IntIntListEntryProto"),
        4: ("sharded_dim", "ShardedDimProto"),
    },
    "IntIntListEntryProto": {2: ("value", "varints")},
    "ShardedDimProto": {2: ("simple_sharding", "SimpleShardedDimProto")},
    "SimpleShardedDimProto": {},
    "TrainingInfoProto": {
        1: ("initialization", "GraphProto"),
        2: ("algorithm", "GraphProto"),
        3: ("initialization_binding", _SSE),
        4: ("update_binding", _SSE),
    },
    "DeviceConfigurationProto": {},
    _SSE: {},
    "TensorAnnotation": {2: ("quant_parameter_tensor_names", _SSE)},
    "TensorProto": {
        1: ("dims", "varints"),
        3: ("segment", "TensorProto.Segment"),
        4: ("float_data", "fixed32s"),
        5: ("int32_data", "varints"),
        7: ("int64_data", "varints"),
        10: ("double_data", "fixed64s"),
        11: ("uint64_data", "varints"),
        13: ("external_data", _SSE),
        16: ("metadata_props", _SSE),
    },
    "TensorProto.Segment": {},
    "SparseTensorProto": {
        1: ("values", "TensorProto"),
        2: ("indices", "TensorProto"),
        3: ("dims", "varints"),
    },
    "TensorShapeProto": {1: ("dim", "TensorShapeProto.Dimension")},
    "TensorShapeProto.Dimension": {},
    "TypeProto": {
        1: ("tensor_type", "TypeProto.Tensor"),
        4: ("sequence_type", "TypeProto.Sequence"),
        5: ("map_type", "TypeProto.Map"),
        7: ("opaque_type", "TypeProto.Opaque"),
        8: ("sparse_tensor_type", "TypeProto.SparseTensor"),
        9: ("optional_type", "TypeProto.Optional"),
    },
    "TypeProto.Tensor": {2: ("shape", "TensorShapeProto")},
    "TypeProto.Sequence": {1: ("elem_type", "TypeProto")},
    "TypeProto.Map": {2: ("value_type", "TypeProto")},
    "TypeProto.Optional": {1: ("elem_type", "TypeProto")},
    "TypeProto.SparseTensor": {2: ("shape", "TensorShapeProto")},
    "TypeProto.Opaque": {},
    "OperatorSetIdProto": {},
    "FunctionProto": {
        7: ("node", "NodeProto"),
        9: ("opset_import", "OperatorSetIdProto"),
        11: ("attribute_proto", "AttributeProto"),
        12: ("value_info", "ValueInfoProto"),
        14: ("metadata_props", _SSE),
    },
}

_OVERLONG_VARINT = re.compile(rb"[\x80-\xff]{10}")
_PACKED_SIZE = {"fixed32s": 4, "fixed64s": 8}


class _TypeState(TypedDict):
    """What :meth:`_Walker.type_proto` has decoded so far: the oneof member set
    (``"tensor"``, another member's field number, or None), and for a tensor its
    element type and dims (None until a shape chunk is seen)."""

    kind: int | str | None
    elem: int
    dims: list[int | str | None] | None


class _GraphSignature(TypedDict):
    """What :meth:`_Walker.graph` collects from the top-level graph."""

    name: str
    inputs: list[TensorSig]
    outputs: list[TensorSig]
    initializers: set[str]
    node_count: int


class _Walker:
    """State of one :func:`scan_onnx` call: the buffer and what was collected.

    Methods named after a message extract what :class:`OnnxInfo` needs; every
    other known field goes through :meth:`other`, which checks it like protobuf
    would without collecting anything.  ``depth`` is the nesting level of the
    message being entered (ModelProto is 0).
    """

    def __init__(self, buf: _Buf, max_depth: int) -> None:
        self.buf = buf
        self.max_depth = max_depth
        self.external: list[ExternalRef] = []
        self.op_types: set[str] = set()
        self.weights: dict[int, list[int]] = {}  # elem_type -> [total elements, largest tensor]

    # helpers

    def enter(self, depth: int, start: int, ctx: str) -> None:
        if depth > self.max_depth:
            raise ModelFormatError(f"{ctx} at byte {start} is nested deeper than max_depth={self.max_depth}")

    def text(self, start: int, end: int, ctx: str) -> str:
        try:
            return str(self.buf[start:end], "utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(f"{ctx} at bytes {start}..{end} is not valid UTF-8 (byte {start + exc.start})") from None

    def other(self, msg: str, f: int, w: int, a: int, b: int, depth: int, ctx: str) -> None:
        """A field the caller does not extract: check it if it is a known
        message or packed list, skip it otherwise (never recursing into an
        unknown field)."""
        if w != 2:
            return
        entry = _SCHEMA[msg].get(f)
        if entry is None:
            return
        name, kind = entry
        if kind == "varints":
            if a < b and self.buf[b - 1] >= 0x80:
                raise ModelFormatError(f"truncated varint in packed {ctx}.{name} ending at byte {b}")
            bad = _OVERLONG_VARINT.search(self.buf, a, b)
            if bad is not None:
                raise ModelFormatError(f"varint in packed {ctx}.{name} at byte {bad.start()} is longer than 10 bytes")
        elif kind in _PACKED_SIZE:
            size = _PACKED_SIZE[kind]
            if (b - a) % size:
                raise ModelFormatError(f"packed {ctx}.{name} at byte {a} is {b - a} bytes, not a multiple of {size}")
        else:
            self.skim(kind, a, b, depth, f"{ctx}.{name}")

    def skim(self, msg: str, s: int, e: int, depth: int, ctx: str) -> None:
        """Check a sub-message's wire format (and its known sub-messages')."""
        self.enter(depth, s, ctx)
        d = depth + 1
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            self.other(msg, f, w, a, b, d, ctx)

    # messages holding tensors or subgraphs

    def graph(self, s: int, e: int, depth: int, ctx: str, main: _GraphSignature | None = None) -> None:
        """GraphProto: node=1, name=2, initializer=5, sparse_initializer=15,
        input=11, output=12.  ``main`` collects the top-level graph's signature."""
        self.enter(depth, s, ctx)
        d = depth + 1
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if w != 2:
                continue
            if f == 1:
                self.node(a, b, d, ctx + ".node")
                if main is not None:
                    main["node_count"] += 1
            elif f == 5:
                name = self.tensor(a, b, d, ctx + ".initializer", weight=True)
                if main is not None:
                    main["initializers"].add(name)
            elif f == 15:
                name = self.sparse_tensor(a, b, d, ctx + ".sparse_initializer")
                if main is not None:
                    main["initializers"].add(name)
            elif main is not None and f == 2:
                main["name"] = self.text(a, b, ctx + ".name")
            elif main is not None and f == 11:
                main["inputs"].append(self.value_info(a, b, d, ctx + ".input"))
            elif main is not None and f == 12:
                main["outputs"].append(self.value_info(a, b, d, ctx + ".output"))
            elif w == 2 and f in _SCHEMA["GraphProto"]:
                self.other("GraphProto", f, w, a, b, d, ctx)

    def node(self, s: int, e: int, depth: int, ctx: str) -> None:
        """NodeProto: op_type=4, domain=7, attribute=5."""
        self.enter(depth, s, ctx)
        d = depth + 1
        op_type = ""
        domain = ""
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 4 and w == 2:
                op_type = self.text(a, b, ctx + ".op_type")
            elif f == 7 and w == 2:
                domain = self.text(a, b, ctx + ".domain")
            elif f == 5 and w == 2:
                self.attribute(a, b, d, ctx + ".attribute")
            elif w == 2 and f in _SCHEMA["NodeProto"]:
                self.other("NodeProto", f, w, a, b, d, ctx)
        self.op_types.add(op_type if domain in _DEFAULT_DOMAINS else f"{domain}.{op_type}")

    def attribute(self, s: int, e: int, depth: int, ctx: str) -> None:
        """AttributeProto: t=5, g=6, tensors=10, graphs=11, sparse_tensor=22, sparse_tensors=23.

        All of them are walked whatever ``type`` (20) says: protobuf keeps them
        all, so a runtime might read any of them.
        """
        self.enter(depth, s, ctx)
        d = depth + 1
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if w != 2:
                continue
            if f == 5 or f == 10:
                self.tensor(a, b, d, ctx + (".t" if f == 5 else ".tensors"))
            elif f == 6 or f == 11:
                self.graph(a, b, d, ctx + (".g" if f == 6 else ".graphs"))
            elif f == 22 or f == 23:
                self.sparse_tensor(a, b, d, ctx + (".sparse_tensor" if f == 22 else ".sparse_tensors"))
            elif w == 2 and f in _SCHEMA["AttributeProto"]:
                self.other("AttributeProto", f, w, a, b, d, ctx)

    def sparse_tensor(self, s: int, e: int, depth: int, ctx: str) -> str:
        """SparseTensorProto: values=1, indices=2.  Returns the values' name."""
        self.enter(depth, s, ctx)
        d = depth + 1
        name = ""
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 1 and w == 2:
                name = self.tensor(a, b, d, ctx + ".values", weight=True)
            elif f == 2 and w == 2:
                self.tensor(a, b, d, ctx + ".indices")
            elif w == 2 and f in _SCHEMA["SparseTensorProto"]:
                self.other("SparseTensorProto", f, w, a, b, d, ctx)
        return name

    def tensor(self, s: int, e: int, depth: int, ctx: str, *, weight: bool = False) -> str:
        """TensorProto: dims=1, data_type=2, name=8, external_data=13, data_location=14.  Returns the name.

        ``raw_data`` (9) and the typed data lists are skipped by length. A ``weight`` (an
        initializer) adds its element type and count to :attr:`weights`.
        """
        self.enter(depth, s, ctx)
        d = depth + 1
        name = ""
        location_flag = 0
        data_type = 0
        elems = 1
        entries: list[tuple[str, str, int]] = []
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 1 and w == 0:
                elems = min(elems * max(_signed64(a), 0), _MASK64)
            elif f == 1 and w == 2:  # packed dims: checked like protobuf (other), then counted
                self.other("TensorProto", f, w, a, b, d, ctx)
                pos = a
                while pos < b:
                    v, pos = _read_varint(self.buf, pos, b, ctx + ".dims")
                    elems = min(elems * max(_signed64(v), 0), _MASK64)
            elif f == 2 and w == 0:
                data_type = _int32(a)
            elif f == 8 and w == 2:
                name = self.text(a, b, ctx + ".name")
            elif f == 13 and w == 2:
                key, value = self.string_entry(a, b, d, ctx + ".external_data")
                entries.append((key, value, a))
            elif f == 14 and w == 0:
                if _int32(a) in (0, 1):
                    # closed proto2 enum: protobuf files an unknown value away as
                    # an unknown field and keeps the previous one; do the same
                    location_flag = _int32(a)
            elif w == 2 and f in _SCHEMA["TensorProto"]:
                self.other("TensorProto", f, w, a, b, d, ctx)
        if location_flag or entries:
            self.external_ref(name, location_flag, entries, s, ctx)
        if weight and data_type:
            acc = self.weights.setdefault(data_type, [0, 0])
            acc[0] = min(acc[0] + elems, _MASK64)
            acc[1] = max(acc[1], elems)
        return name

    def external_ref(self, name: str, flag: int, entries: list[tuple[str, str, int]], start: int, ctx: str) -> None:
        info: dict[str, str] = {}
        for key, value, at in entries:
            if key in ("location", "offset", "length"):
                if key in info:
                    raise ModelFormatError(f"{ctx}.external_data of tensor {name!r} repeats key {key!r} at byte {at}")
                info[key] = value
        if flag != _DATA_LOCATION_EXTERNAL and "location" not in info:
            return  # runtimes only read external data when data_location=EXTERNAL
        if "location" not in info:
            raise ModelFormatError(f"tensor {name!r} ({ctx}) at byte {start} has data_location=EXTERNAL but no 'location' in external_data")
        numbers: dict[str, int | None] = {}
        for key in ("offset", "length"):
            raw = info.get(key)
            if raw is None:
                numbers[key] = None
            elif _DECIMAL.match(raw):
                numbers[key] = int(raw)
            else:
                raise ModelFormatError(
                    f"tensor {name!r} ({ctx}) at byte {start}: external_data {key!r} must be a non-negative decimal integer, got {raw!r}"
                )
        self.external.append(ExternalRef(name, info["location"], numbers["offset"], numbers["length"]))

    def string_entry(self, s: int, e: int, depth: int, ctx: str) -> tuple[str, str]:
        """StringStringEntryProto: key=1, value=2."""
        self.enter(depth, s, ctx)
        key = value = ""
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if w == 2 and f == 1:
                key = self.text(a, b, ctx + ".key")
            elif w == 2 and f == 2:
                value = self.text(a, b, ctx + ".value")
        return key, value

    def function(self, s: int, e: int, depth: int, ctx: str) -> None:
        """FunctionProto: node=7, attribute_proto=11 (default values may hold tensors)."""
        self.enter(depth, s, ctx)
        d = depth + 1
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 7 and w == 2:
                self.node(a, b, d, ctx + ".node")
            elif f == 11 and w == 2:
                self.attribute(a, b, d, ctx + ".attribute_proto")
            elif w == 2 and f in _SCHEMA["FunctionProto"]:
                self.other("FunctionProto", f, w, a, b, d, ctx)

    def training_info(self, s: int, e: int, depth: int, ctx: str) -> None:
        """TrainingInfoProto: initialization=1, algorithm=2 -- graphs that may hold
        external tensors; their operators do not run at inference time."""
        self.enter(depth, s, ctx)
        d = depth + 1
        ops = self.op_types
        self.op_types = set()
        try:
            for f, w, a, b in _fields(self.buf, s, e, ctx):
                if w == 2 and f in (1, 2):
                    self.graph(a, b, d, ctx + (".initialization" if f == 1 else ".algorithm"))
                elif w == 2 and f in _SCHEMA["TrainingInfoProto"]:
                    self.other("TrainingInfoProto", f, w, a, b, d, ctx)
        finally:
            self.op_types = ops

    # signatures

    def value_info(self, s: int, e: int, depth: int, ctx: str) -> TensorSig:
        """ValueInfoProto: name=1, type=2."""
        self.enter(depth, s, ctx)
        d = depth + 1
        name = ""
        state: _TypeState = {"kind": None, "elem": 0, "dims": None}
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 1 and w == 2:
                name = self.text(a, b, ctx + ".name")
            elif f == 2 and w == 2:
                self.type_proto(a, b, d, ctx + ".type", state)
            elif w == 2 and f in _SCHEMA["ValueInfoProto"]:
                self.other("ValueInfoProto", f, w, a, b, d, ctx)
        if state["kind"] != "tensor":
            return TensorSig(name, 0, None, None)
        elem = state["elem"]
        dims = state["dims"]
        return TensorSig(name, elem, ONNX_DTYPE_NAMES.get(elem), None if dims is None else tuple(dims))

    def type_proto(self, s: int, e: int, depth: int, ctx: str, state: _TypeState) -> None:
        """TypeProto: oneof value {tensor_type=1, sequence_type=4, map_type=5,
        opaque_type=7, sparse_tensor_type=8, optional_type=9}; only tensor_type
        is decoded.  Chunks merge as in protobuf: a later oneof member clears
        the earlier one."""
        self.enter(depth, s, ctx)
        d = depth + 1
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 1 and w == 2:
                if state["kind"] != "tensor":
                    state.update({"kind": "tensor", "elem": 0, "dims": None})
                self.tensor_type(a, b, d, ctx + ".tensor_type", state)
            else:
                if w == 2 and f in (4, 5, 7, 8, 9):
                    state.update({"kind": f, "elem": 0, "dims": None})
                self.other("TypeProto", f, w, a, b, d, ctx)

    def tensor_type(self, s: int, e: int, depth: int, ctx: str, state: _TypeState) -> None:
        """TypeProto.Tensor: elem_type=1, shape=2 (repeated chunks append dims)."""
        self.enter(depth, s, ctx)
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 1 and w == 0:
                state["elem"] = _int32(a)
            elif f == 2 and w == 2:
                dims = state["dims"]
                if dims is None:
                    dims = state["dims"] = []
                self.shape(a, b, depth + 1, ctx + ".shape", dims)

    def shape(self, s: int, e: int, depth: int, ctx: str, dims: list[int | str | None]) -> None:
        """TensorShapeProto: dim=1 (Dimension: oneof dim_value=1 / dim_param=2)."""
        self.enter(depth, s, ctx)
        dctx = ctx + ".dim"
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f != 1 or w != 2:
                continue
            self.enter(depth + 1, a, dctx)
            dim: int | str | None = None
            for g, x, c, d in _fields(self.buf, a, b, dctx):
                if g == 1 and x == 0:
                    dim = _signed64(c)
                elif g == 2 and x == 2:
                    dim = self.text(c, d, dctx + ".dim_param")
            dims.append(dim)

    # the model

    def opset(self, s: int, e: int, depth: int, ctx: str) -> tuple[str, int]:
        """OperatorSetIdProto: domain=1, version=2."""
        self.enter(depth, s, ctx)
        domain = ""
        version = 0
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 1 and w == 2:
                domain = self.text(a, b, ctx + ".domain")
            elif f == 2 and w == 0:
                version = _signed64(a)
        return domain, version

    def model(self, s: int, e: int) -> OnnxInfo:
        """ModelProto: ir_version=1, producer_name=2, graph=7, opset_import=8,
        training_info=20, functions=25."""
        ctx = "ModelProto"
        ir_version = 0
        producer = ""
        opsets: dict[str, int] = {}
        graph_seen = False
        main: _GraphSignature = {"name": "", "inputs": [], "outputs": [], "initializers": set(), "node_count": 0}
        for f, w, a, b in _fields(self.buf, s, e, ctx):
            if f == 1 and w == 0:
                ir_version = _signed64(a)
            elif f == 2 and w == 2:
                producer = self.text(a, b, ctx + ".producer_name")
            elif f == 7 and w == 2:
                # protobuf merges a singular message that occurs twice: parse
                # every chunk into the same accumulator so nothing hides in one
                graph_seen = True
                self.graph(a, b, 1, ctx + ".graph", main)
            elif f == 8 and w == 2:
                domain, version = self.opset(a, b, 1, ctx + ".opset_import")
                key = "ai.onnx" if domain in _DEFAULT_DOMAINS else domain
                if key in opsets:
                    raise ModelFormatError(f"opset_import at byte {a} repeats domain {key!r} (versions {opsets[key]} and {version})")
                opsets[key] = version
            elif f == 25 and w == 2:
                self.function(a, b, 1, ctx + ".functions")
            elif f == 20 and w == 2:
                self.training_info(a, b, 1, ctx + ".training_info")
            elif w == 2 and f in _SCHEMA["ModelProto"]:
                self.other("ModelProto", f, w, a, b, 1, ctx)
        if not graph_seen:
            raise ModelFormatError(f"not an ONNX model: no graph (ModelProto field 7) in {e - s} bytes")
        initializers = main["initializers"]
        return OnnxInfo(
            ir_version=ir_version,
            opsets=opsets,
            producer_name=producer,
            graph_name=main["name"],
            inputs=tuple(sig for sig in main["inputs"] if sig.name not in initializers),
            outputs=tuple(main["outputs"]),
            external_data=tuple(self.external),
            op_types=frozenset(self.op_types),
            node_count=main["node_count"],
            weights=tuple((t, n, big) for t, (n, big) in sorted(self.weights.items())),
        )


def scan_onnx(data: Buffer, *, max_depth: int = 64) -> OnnxInfo:
    """Walk an ONNX ``ModelProto`` without onnx or protobuf installed.

    ``max_depth`` bounds message nesting (ModelProto is depth 0, its graph 1,
    a node 2, an attribute 3, a subgraph 4, ...).  Raises
    :class:`ModelFormatError` naming what was expected and the byte offset when
    the bytes are not a well-formed ONNX model; ``TypeError``/``ValueError``
    only for a wrong argument.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int):
        raise OptionsTypeError(f"max_depth: expected an int, got {type(max_depth).__name__}")
    if not 1 <= max_depth <= MAX_DEPTH_LIMIT:
        raise OptionsError(f"max_depth must be between 1 and {MAX_DEPTH_LIMIT}, got {max_depth}")
    buf = _as_buffer(data)
    if len(buf) == 0:
        raise ModelFormatError("empty file: expected an ONNX ModelProto")
    return _Walker(buf, max_depth).model(0, len(buf))


# --- pickles --------------------------------------------------------------------------

#: Bytes of a file's head that :func:`looks_pickled` looks at.
PICKLE_SCAN_BYTES = 1 << 16
#: Opcodes a protocol 0/1 pickle can begin with (``pickletools``: MARK, EMPTY_DICT/LIST/TUPLE,
#: GLOBAL, INST, NONE, the int/float/string/unicode loaders, PERSID, PUT/GET).
_PICKLE_TEXT_START = frozenset(b"(}])cNIJKLMFGSTUVXPipg")
#: What pickletools says when the data stop in the middle of a well-formed opcode stream.
_PICKLE_TRUNCATED = ("exhausted before seeing STOP", "remain", "no newline found")


def looks_pickled(head: Buffer, *, whole: bool | None = None) -> bool:
    """Whether ``head`` (a file's first bytes) is a Python pickle of any protocol 0-5.

    Protocols 2-5 (and a hand-made PROTO 0/1) start with the PROTO opcode ``0x80`` and the
    protocol number. Protocols 0 and 1 have no header: ``head`` counts as one when it starts with
    an opcode and :func:`pickletools.dis` (which checks the stack and memo as it goes, and runs
    nothing) parses it up to STOP, or, when ``head`` is only the start of the file (``whole``
    false; default: shorter than :data:`PICKLE_SCAN_BYTES` means whole), up to its end.  Text
    (JSON, labels, READMEs) fails those checks within a few opcodes.
    """
    raw = bytes(_as_buffer(head)[:PICKLE_SCAN_BYTES])
    if whole is None:
        whole = len(raw) < PICKLE_SCAN_BYTES
    if len(raw) >= 2 and raw[0] == 0x80 and raw[1] <= 5:
        return True
    if not raw or raw[0] not in _PICKLE_TEXT_START:
        return False
    if whole and raw[0] == 0x53 and b"\n" in raw and raw[1:2] not in (b'"', b"'"):
        # STRING ('S') whose line does not start with a quote: pickletools refuses it at once ("no string
        # quotes around ..."), so a whole file is no pickle. Every manifest starts so (``schema = 1``):
        # this spares the import of pickletools (2 ms) on each load.
        return False
    import pickletools
    import warnings

    try:
        with warnings.catch_warnings():  # pickletools decodes STRING arguments: bad escapes warn
            warnings.simplefilter("ignore")
            pickletools.dis(raw, out=io.StringIO())
    except Exception as e:  # noqa: BLE001 - any complaint: not a (complete) pickle
        return not whole and any(m in str(e) for m in _PICKLE_TRUNCATED)
    return True


# --- weight precision ------------------------------------------------------------------

#: Element types of weights by the precision label they stand for (ONNX TensorProto.DataType).
_ONNX_PRECISION = {1: "fp32", 11: "fp32", 10: "fp16", 16: "fp16", 2: "int8", 3: "int8", 21: "int4", 22: "int4"}
#: The same for TFLite TensorType (0 FLOAT32, 10 FLOAT64, 1 FLOAT16, 18 BFLOAT16, 3 UINT8, 9 INT8, 17 INT4).
_TFLITE_PRECISION = {0: "fp32", 10: "fp32", 1: "fp16", 18: "fp16", 3: "int8", 9: "int8", 17: "int4"}
#: A tensor this large (elements) counts as a weight for the precision check: zero points and
#: scales are scalars or per-channel vectors, so they cannot pass an fp32 model off as int8.
_WEIGHT_MIN_ELEMENTS = 64


def weight_precisions(weights: tuple[tuple[int, int, int], ...], fmt: str) -> dict[str, int]:
    """Precision label -> elements of the largest weight stored at it, from :attr:`OnnxInfo.weights`
    (``fmt = "onnx"``) or :attr:`TFLiteInfo.weights` (``"tflite"``); other types (int32 biases,
    int64 shapes, bool) are left out."""
    table = _ONNX_PRECISION if fmt == "onnx" else _TFLITE_PRECISION
    out: dict[str, int] = {}
    for t, _n, big in weights:
        p = table.get(t)
        if p is not None:
            out[p] = max(out.get(p, 0), big)
    return out


#: Operators that read n-bit weights packed into uint8 (ONNX Runtime contrib ops), by name suffix.
_NBIT_OPS = ("NBits", "Bnb4", "BlockQuantized", "4Bits")
_PRECISION_BITS = {"fp32": 32, "fp16": 16, "int8": 8, "int4": 4}


def precision_mismatch(
    label: str, weights: tuple[tuple[int, int, int], ...], fmt: str, op_types: frozenset[str] = frozenset()
) -> str | None:
    """Why the file's weights contradict precision ``label``, or None when they agree (or the file
    has no weights to judge by).

    A label claims the weights are stored in at most its bits, so a file passes when some weight of
    at least ``min(64, largest weight)`` elements is stored at the label's precision or lower (an
    fp32 file labelled int8, which selection would prefer as the cheap variant, fails; an fp32 label
    always passes, as a model with fp16 weights dequantized to fp32 is common). An int4 label also
    accepts uint8/int8 packed weights read by an n-bit operator (``MatMulNBits``,
    ``MatMulBnb4``, ``GatherBlockQuantized``), not plain int8 ones.
    """
    bits = _PRECISION_BITS.get(label)
    found = weight_precisions(weights, fmt)
    if bits is None or bits >= 32 or not found:
        return None
    need = min(_WEIGHT_MIN_ELEMENTS, max(found.values()))
    accept = {p for p, b in _PRECISION_BITS.items() if b <= bits}
    if label == "int4" and any(op.endswith(_NBIT_OPS) for op in op_types):
        accept.add("int8")
    if any(found.get(p, 0) >= need for p in accept):
        return None
    have = ", ".join(f"{p} (largest {n} elements)" for p, n in sorted(found.items(), key=lambda kv: -kv[1]))
    return f"labelled precision {label!r}, but no weight of {need}+ elements is stored in {bits} bits or fewer; its weights are {have}"


# --- format sniffing -----------------------------------------------------------------

_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_CENTRAL = b"PK\x01\x02"


def _zip_member_names(buf: _Buf) -> set[bytes]:
    """Member names from the central directory (via zipfile) *and* from every
    local/central header signature found, so a damaged archive still shows them."""
    import zipfile  # lazily: only zip-shaped files (a torch checkpoint) get here

    names: set[bytes] = set()
    raw = bytes(buf)
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            names.update(n.encode("utf-8", "surrogateescape") for n in zf.namelist())
    except Exception:  # noqa: BLE001 - any damage: fall back to the header scan
        pass
    for sig, len_at, name_at in ((_ZIP_LOCAL, 26, 30), (_ZIP_CENTRAL, 28, 46)):
        pos = raw.find(sig)
        while pos != -1:
            if pos + name_at <= len(raw):
                (n,) = struct.unpack_from("<H", raw, pos + len_at)
                names.add(raw[pos + name_at : pos + name_at + n])
            pos = raw.find(sig, pos + 1)
    return names


def sniff_format(data: Buffer) -> str:
    """Say what ``data`` is: ``"onnx"``, ``"tflite"``, ``"ort"``, ``"pickle"``,
    ``"zip"`` or ``"unknown"``.

    Checked in this order: flatbuffer identifiers ``TFL3`` / ``ORTM`` at bytes
    4..8; a zip archive (``"pickle"`` when a member name ends in ``data.pkl``, as
    in a PyTorch checkpoint); a pickle of any protocol 0..5 (:func:`looks_pickled`); finally ONNX, which
    is only reported when :func:`scan_onnx` parses the whole file and finds a
    graph.  Never raises for any bytes.
    """
    buf = _as_buffer(data)
    if len(buf) == 0:
        return "unknown"
    ident = bytes(buf[4:8])
    if ident == b"TFL3":
        return "tflite"
    if ident == b"ORTM":
        return "ort"
    if bytes(buf[:4]) == _ZIP_LOCAL:
        if any(name.endswith(b"data.pkl") for name in _zip_member_names(buf)):
            return "pickle"
        return "zip"
    if looks_pickled(buf[:PICKLE_SCAN_BYTES], whole=len(buf) <= PICKLE_SCAN_BYTES):
        return "pickle"
    try:
        scan_onnx(buf)
    except ModelFormatError:
        return "unknown"
    return "onnx"


# --- TFLite -------------------------------------------------------------------------

# Model table fields (schema.fbs): 0 version:uint, 1 operator_codes:[OperatorCode],
# 2 subgraphs:[SubGraph], 3 description:string, 4 buffers:[Buffer],
# 5 metadata_buffer:[int], 6 metadata:[Metadata], 7 signature_defs:[SignatureDef].
_TFL_TABLE_VECTORS = {1: "operator_codes", 2: "subgraphs", 4: "buffers", 6: "metadata", 7: "signature_defs"}
#: More elements than any real model has in one top-level vector (buffers are
#: a few thousand even for LLMs); checking each costs a few microseconds, so
#: this bounds the work a hostile file can cause.
_TFL_MAX_ELEMENTS = 1 << 18


class _FlatBuffer:
    """Bounds-checked reads over a flatbuffer; every failure is a ModelFormatError."""

    def __init__(self, buf: _Buf) -> None:
        self.buf = buf
        self.n = len(buf)

    def need(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or pos + size > self.n:
            raise ModelFormatError(
                f"TFLite {what} at byte {pos} needs {size} bytes but the file has {self.n} (truncated or corrupt flatbuffer)"
            )

    def u16(self, pos: int, what: str) -> int:
        self.need(pos, 2, what)
        value: int = struct.unpack_from("<H", self.buf, pos)[0]
        return value

    def u32(self, pos: int, what: str) -> int:
        self.need(pos, 4, what)
        value: int = struct.unpack_from("<I", self.buf, pos)[0]
        return value

    def u64(self, pos: int, what: str) -> int:
        self.need(pos, 8, what)
        value: int = struct.unpack_from("<Q", self.buf, pos)[0]
        return value

    def table(self, pos: int, what: str) -> tuple[int, int, int]:
        """Check a table and its vtable; return (table_pos, vtable_pos, table_size)."""
        if pos % 4:
            raise ModelFormatError(f"TFLite {what} at byte {pos} is not 4-byte aligned")
        soffset = struct.unpack("<i", struct.pack("<I", self.u32(pos, what)))[0]
        vt = pos - soffset
        if vt % 2:
            raise ModelFormatError(f"TFLite vtable of {what} at byte {vt} is not 2-byte aligned")
        vsize = self.u16(vt, f"vtable of {what}")
        tsize = self.u16(vt + 2, f"vtable of {what}")
        if vsize < 4 or vsize % 2:
            raise ModelFormatError(f"TFLite vtable of {what} at byte {vt} has invalid size {vsize}")
        self.need(vt, vsize, f"vtable of {what}")
        if tsize < 4:
            raise ModelFormatError(f"TFLite {what} at byte {pos} declares invalid size {tsize}")
        self.need(pos, tsize, what)
        return pos, vt, tsize

    def field(self, tbl: tuple[int, int, int], index: int, size: int, what: str) -> int | None:
        """Absolute position of field ``index`` (``size`` bytes), or None when absent."""
        pos, vt, tsize = tbl
        slot = 4 + 2 * index
        if slot + 2 > self.u16(vt, f"vtable of {what}"):
            return None
        off = self.u16(vt + slot, f"vtable of {what}")
        if off == 0:
            return None
        if off + size > tsize:
            raise ModelFormatError(f"TFLite field {what} at byte {pos + off} lies outside its table ({tsize} bytes from byte {pos})")
        return pos + off

    def vector(self, tbl: tuple[int, int, int], index: int, elem_size: int, what: str) -> tuple[int, int] | None:
        """(first_element_pos, count) of a vector field, bounds-checked."""
        at = self.field(tbl, index, 4, what)
        if at is None:
            return None
        target = at + self.u32(at, what)
        count = self.u32(target, f"length of {what}")
        self.need(target + 4, count * elem_size, f"{what} ({count} elements)")
        return target + 4, count


def inspect_tflite(data: Buffer) -> TFLiteInfo:
    """Check a TFLite flatbuffer's structure without the runtime.

    Checks the ``TFL3`` identifier, that the root table and its vtable lie in
    the buffer, the top-level vectors (operator codes, subgraphs, buffers,
    metadata, signature defs) and each element table, each buffer's data vector
    and any ``offset``/``size`` data appended after the flatbuffer.  Because
    flatbuffers are built back to front, the buffers sit at the end of the file,
    so following them is what catches a truncated file.
    """
    buf = _as_buffer(data)
    fb = _FlatBuffer(buf)
    if fb.n < 8:
        raise ModelFormatError(f"not a TFLite model: {fb.n} bytes is shorter than the 8-byte header")
    ident = bytes(buf[4:8])
    if ident != b"TFL3":
        raise ModelFormatError(f"not a TFLite model: file identifier at bytes 4..8 is {ident!r}, expected b'TFL3'")
    root = fb.table(fb.u32(0, "root offset"), "root table (Model)")
    at = fb.field(root, 0, 4, "Model.version")
    version = 0 if at is None else fb.u32(at, "Model.version")
    desc = fb.vector(root, 3, 1, "Model.description")
    if desc is not None:
        fb.need(desc[0] + desc[1], 1, "Model.description terminator")
    fb.vector(root, 5, 4, "Model.metadata_buffer")
    filled: set[int] = set()  # buffers that hold data (constant tensors)
    tensors: list[tuple[int, int, int]] = []  # (TensorType, elements, buffer index) of every tensor
    for index, name in _TFL_TABLE_VECTORS.items():
        vec = fb.vector(root, index, 4, f"Model.{name}")
        if vec is None:
            continue
        first, count = vec
        if count > _TFL_MAX_ELEMENTS:
            raise ModelFormatError(
                f"TFLite Model.{name} at byte {first - 4} declares {count} elements, "
                f"more than the {_TFL_MAX_ELEMENTS} this inspector accepts"
            )
        for i in range(count):
            elem = first + 4 * i
            tbl = fb.table(elem + fb.u32(elem, f"Model.{name}[{i}]"), f"Model.{name}[{i}]")
            if index == 4:  # Buffer: data=0 [ubyte], offset=1 ulong, size=2 ulong
                data_vec = fb.vector(tbl, 0, 1, f"Model.buffers[{i}].data")
                off_at = fb.field(tbl, 1, 8, f"Model.buffers[{i}].offset")
                size_at = fb.field(tbl, 2, 8, f"Model.buffers[{i}].size")
                offset = 0 if off_at is None else fb.u64(off_at, "Buffer.offset")
                size = 0 if size_at is None else fb.u64(size_at, "Buffer.size")
                if offset > 1:  # "only valid if > 1" (schema.fbs)
                    fb.need(offset, size, f"Model.buffers[{i}] external data")
                if (data_vec is not None and data_vec[1] > 0) or (offset > 1 and size > 0):
                    filled.add(i)
            elif index == 2:
                tensors += _check_tflite_quant_scales(fb, tbl, i)
    weights: dict[int, list[int]] = {}
    for ttype, elems, buffer in tensors:
        if buffer in filled:
            acc = weights.setdefault(ttype, [0, 0])
            acc[0] += elems
            acc[1] = max(acc[1], elems)
    return TFLiteInfo(version=version, size=fb.n, weights=tuple((t, n, big) for t, (n, big) in sorted(weights.items())))


def _check_tflite_quant_scales(fb: _FlatBuffer, subgraph: tuple[int, int, int], sg: int) -> list[tuple[int, int, int]]:
    """Refuse NaN, infinite or negative quantization scales in subgraph ``sg``'s tensors; return
    ``(TensorType, elements, buffer index)`` of each tensor (Tensor fields 0 shape, 1 type, 2 buffer).

    SubGraph field 0 is ``tensors:[Tensor]``; Tensor field 4 is
    ``quantization:QuantizationParameters``, whose field 2 is ``scale:[float]``.
    A non-finite scale turns every dequantized value into NaN/Inf (or, for the
    runtime's requantization multipliers, undefined behaviour).
    """
    out: list[tuple[int, int, int]] = []
    vec = fb.vector(subgraph, 0, 4, f"SubGraph[{sg}].tensors")
    if vec is None:
        return out
    first, count = vec
    if count > _TFL_MAX_ELEMENTS:
        raise ModelFormatError(f"TFLite SubGraph[{sg}].tensors declares {count} tensors, more than the {_TFL_MAX_ELEMENTS} accepted")
    for t in range(count):
        elem = first + 4 * t
        what = f"SubGraph[{sg}].tensors[{t}]"
        tensor = fb.table(elem + fb.u32(elem, what), what)
        type_at = fb.field(tensor, 1, 1, f"{what}.type")
        buf_at = fb.field(tensor, 2, 4, f"{what}.buffer")
        shape = fb.vector(tensor, 0, 4, f"{what}.shape")
        elems = 1
        if shape is not None:
            for (dim,) in struct.iter_unpack("<i", bytes(fb.buf[shape[0] : shape[0] + 4 * min(shape[1], 16)])):
                elems *= max(dim, 0)
        out.append((0 if type_at is None else fb.buf[type_at], elems, 0 if buf_at is None else fb.u32(buf_at, f"{what}.buffer")))
        q_at = fb.field(tensor, 4, 4, f"{what}.quantization")
        if q_at is None:
            continue
        quant = fb.table(q_at + fb.u32(q_at, f"{what}.quantization"), f"{what}.quantization")
        scales = fb.vector(quant, 2, 4, f"{what}.quantization.scale")
        if scales is None:
            continue
        start, n = scales
        for k, (value,) in enumerate(struct.iter_unpack("<f", bytes(fb.buf[start : start + 4 * n]))):
            if not math.isfinite(value) or value < 0:
                raise ModelFormatError(
                    f"TFLite {what}.quantization.scale[{k}] is {value}; expected a finite scale >= 0 (NaN/Inf/negative scales are corrupt)"
                )
    return out
