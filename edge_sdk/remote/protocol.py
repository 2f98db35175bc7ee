"""The Open Inference Protocol (KServe v2 REST) and Triton's binary tensor data extension: one
module for the client and the server (KServe's Open Inference Protocol, https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/, and Triton's binary tensor extension, https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md).

Pure functions over bytes, dicts and numpy arrays; no HTTP here. Every decoder checks what it is
given and raises :class:`ProtocolError` naming what was expected (a wrong datatype, a shape that
does not match the data, a binary chunk of the wrong size, a header length past the body), so a
malformed message is never half-accepted.

Tensors:

- JSON: ``{"name", "shape", "datatype", "data"}``; ``data`` row-major, nested or flat; ``null``
  is accepted for NaN in FP16/FP32/FP64 (JSON has no NaN; encoders write ``null`` for NaN and
  refuse infinities); BYTES elements are UTF-8 strings (bytes that are not UTF-8 need binary).
- Binary: the JSON header (its length in ``Inference-Header-Content-Length``), then each binary
  tensor's raw bytes in the order the tensors appear in the JSON, little-endian, row-major, no
  padding; ``parameters.binary_data_size`` on each binary tensor. BOOL is one byte per element;
  each BYTES element is a 4-byte little-endian length and the bytes.
- Requesting binary outputs: ``parameters.binary_data_output`` on the request (all outputs) or
  ``parameters.binary_data`` per requested output (which wins).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import EdgeSDKError

__all__ = [
    "BINARY_EXTENSION",
    "DATATYPES",
    "HEADER_LENGTH",
    "InferRequest",
    "InferResponse",
    "ProtocolError",
    "RequestedOutput",
    "Route",
    "datatype_of",
    "decode_request",
    "decode_response",
    "dtype_of",
    "encode_request",
    "encode_response",
    "error_body",
    "error_message",
    "parse_route",
]

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_EXTENSION = "binary_tensor_data"
JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"

#: v2 datatype -> numpy dtype (little-endian); BYTES is an object array of ``bytes``.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_BY_KIND = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items() if name != "BYTES"}


class ProtocolError(EdgeSDKError, ValueError):
    """A message that does not follow the protocol (what was expected, what came)."""


def datatype_of(dtype: Any) -> str:
    """The v2 datatype of a numpy dtype (object/str/bytes arrays are BYTES)."""
    dt = np.dtype(dtype)
    if dt.kind in ("O", "S", "U"):
        return "BYTES"
    name = _BY_KIND.get((dt.kind, dt.itemsize))
    if name is None:
        raise ProtocolError(f"numpy dtype {dt} has no v2 datatype (expected one of bool, u/int8-64, float16/32/64, bytes)")
    return name


def dtype_of(datatype: str) -> np.dtype:
    """The numpy dtype of a v2 datatype name (``FP32``, ``INT64``, ...); :class:`ProtocolError` for an unknown one."""
    try:
        return DATATYPES[datatype]
    except (KeyError, TypeError):
        raise ProtocolError(f"datatype {_short(datatype)}: expected one of {sorted(DATATYPES)}") from None


# ----------------------------------------------------------------------------------- tensors


#: The most dims a tensor may have (numpy's own limit is 32 in numpy 1, 64 in numpy 2).
MAX_RANK = 32
#: The largest dim, and the most elements a tensor may have (a zero dim does not excuse the others:
#: numpy refuses ``[0, 10**30]`` too). Far past any body the server accepts, so only a bound.
MAX_DIM = (1 << 31) - 1
MAX_ELEMENTS = 1 << 40


def _shape(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v):
        raise ProtocolError(f"{where}.shape: expected a list of ints >= 0, got {_short(v)}")
    if len(v) > MAX_RANK:
        raise ProtocolError(f"{where}.shape: {len(v)} dims, at most {MAX_RANK}")
    n = 1
    for d in v:
        if d > MAX_DIM:
            raise ProtocolError(f"{where}.shape: dim {_short(d)} is over the limit of {MAX_DIM}")
        n *= max(d, 1)
        if n > MAX_ELEMENTS:
            raise ProtocolError(f"{where}.shape: {_short(v)} is over the limit of {MAX_ELEMENTS} elements")
    return tuple(v)


def _short(v: Any, limit: int = 80) -> str:
    """``repr(v)`` cut to ``limit`` characters (a hostile value may be a 400-digit number or a
    megabyte list: an error message names it, it does not echo it)."""
    try:
        r = repr(v) if not isinstance(v, int) or v.bit_length() < 256 else f"<an int of {v.bit_length()} bits>"
    except (RecursionError, ValueError):
        r = f"<a {type(v).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _count(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _flatten(data: Any, shape: Sequence[int], where: str) -> list[Any]:
    """``data`` as a flat row-major list: flat already (what most clients send) or nested exactly as
    ``shape`` says (each list at depth ``i`` has ``shape[i]`` items, scalars below the last dim):
    ragged or partly nested data is an error, never flattened into something that fits."""
    if not isinstance(data, list):
        raise ProtocolError(f"{where}.data: expected a list, got {type(data).__name__}")
    if not data or not isinstance(data[0], list):
        return data  # flat; a nested list further in fails the element type check
    level: list[Any] = [data]
    for i, d in enumerate(shape):  # breadth first, iterative: deep hostile nesting cannot overflow the stack
        nxt: list[Any] = []
        for x in level:
            if not isinstance(x, list) or len(x) != d:
                got = f"a list of {len(x)}" if isinstance(x, list) else type(x).__name__
                raise ProtocolError(
                    f"{where}.data: nested data must follow shape {list(shape)}; at depth {i} expected a list of {d}, got {got}"
                )
            nxt.extend(x)
        level = nxt
    if any(type(x) is list for x in level):
        raise ProtocolError(f"{where}.data: nested deeper than shape {list(shape)}")
    return level


def _bytes_element(x: Any, where: str) -> bytes:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, np.str_):
        return str(x).encode("utf-8")
    raise ProtocolError(f"{where}: BYTES elements must be bytes or str, got {type(x).__name__}")


def _as_array(arr: Any, where: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise ProtocolError(f"{where}: expected a numpy array, got {type(arr).__name__}")
    return arr


def tensor_to_json(name: str, arr: np.ndarray) -> dict[str, Any]:
    """``{"name", "shape", "datatype", "data"}`` with flat row-major data (NaN as null)."""
    arr = _as_array(arr, name)
    dt = datatype_of(arr.dtype)
    flat = arr.reshape(-1)
    if dt == "BYTES":
        data: list[Any] = []
        for x in flat:
            b = _bytes_element(x, name)
            try:
                data.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                raise ProtocolError(f"{name}: a BYTES element is not UTF-8; JSON cannot carry it, use the binary extension") from None
    elif dt in ("FP16", "FP32", "FP64"):
        f = flat.astype(np.float64)
        if np.isinf(f).any():
            raise ProtocolError(f"{name}: JSON cannot carry infinity; use the binary extension")
        nan = np.isnan(f)
        data = [None if math.isnan(v) else v for v in f.tolist()] if nan.any() else f.tolist()
    else:
        data = flat.tolist()
    return {"name": name, "shape": list(arr.shape), "datatype": dt, "data": data}


def tensor_to_bytes(arr: np.ndarray, name: str = "tensor") -> bytes:
    """Raw little-endian row-major bytes (BYTES: 4-byte length + bytes per element)."""
    arr = _as_array(arr, name)
    dt = datatype_of(arr.dtype)
    if dt == "BYTES":
        parts = []
        for x in arr.reshape(-1):
            b = _bytes_element(x, name)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=DATATYPES[dt]).tobytes()


def tensor_from_json(t: Any, where: str) -> np.ndarray:
    shape = _shape(t.get("shape"), where)
    datatype = t.get("datatype")
    dt = dtype_of(datatype)
    if "data" not in t:
        raise ProtocolError(f"{where}: no 'data' and no binary_data_size")
    flat = _flatten(t["data"], shape, where)
    n = _count(shape)
    if len(flat) != n:
        raise ProtocolError(f"{where}: shape {list(shape)} needs {n} elements, data has {len(flat)}")
    if datatype == "BYTES":
        return np.array([_bytes_element(x, where) for x in flat] or [], dtype=object).reshape(shape)
    types = set(map(type, flat))  # one C-level pass: a type check costs ~20 ns per element
    if datatype == "BOOL":
        if not types <= {bool, int} or (int in types and not set(flat) <= {0, 1}):
            raise ProtocolError(f"{where}: BOOL data must be true/false (or 0/1)")
        return np.array(flat, dtype=dt).reshape(shape)
    if datatype.startswith("FP"):
        if not types <= {int, float, type(None)}:
            raise ProtocolError(f"{where}: {datatype} data must be numbers (null for NaN)")
        try:
            wide = np.array(flat, dtype=np.float64)  # None -> NaN
        except OverflowError:  # an int past float64 (a 400-digit number)
            raise ProtocolError(f"{where}: a value is out of range for {datatype}") from None
        with np.errstate(over="ignore"):
            out = wide.astype(dt)
        if out.size and np.isinf(out).any() and (np.isinf(out) & ~np.isinf(wide)).any():
            raise ProtocolError(f"{where}: a value is out of range for {datatype} (its largest is {float(np.finfo(dt).max):g})")
        return out.reshape(shape)
    if not types <= {int}:
        raise ProtocolError(f"{where}: {datatype} data must be integers")
    info = np.iinfo(dt)
    if flat and (min(flat) < info.min or max(flat) > info.max):
        raise ProtocolError(f"{where}: a value is out of range for {datatype} [{info.min}, {info.max}]")
    return np.array(flat, dtype=dt).reshape(shape)


def tensor_from_bytes(buf: bytes | memoryview, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    dt = dtype_of(datatype)
    n = _count(shape)
    if datatype == "BYTES":
        items, pos, mv = [], 0, memoryview(buf)
        for i in range(n):
            if pos + 4 > len(mv):
                raise ProtocolError(f"{where}: BYTES element {i} of {n}: length prefix past the end of the {len(mv)}-byte chunk")
            (ln,) = struct.unpack_from("<I", mv, pos)
            pos += 4
            if pos + ln > len(mv):
                raise ProtocolError(f"{where}: BYTES element {i}: {ln} bytes declared, {len(mv) - pos} left")
            items.append(bytes(mv[pos : pos + ln]))
            pos += ln
        if pos != len(mv):
            raise ProtocolError(f"{where}: {len(mv) - pos} bytes left after {n} BYTES elements")
        return np.array(items or [], dtype=object).reshape(tuple(shape))
    want = n * dt.itemsize
    if len(buf) != want:
        raise ProtocolError(f"{where}: {datatype} {list(shape)} needs {want} bytes, binary_data_size gives {len(buf)}")
    arr = np.frombuffer(buf, dtype=dt).reshape(tuple(shape))
    if datatype == "BOOL" and arr.size and not np.isin(np.frombuffer(buf, np.uint8), (0, 1)).all():
        raise ProtocolError(f"{where}: BOOL bytes must be 0 or 1")
    out: np.ndarray = arr.copy()
    return out


# ----------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class RequestedOutput:
    """An output asked for in a request; ``binary``: its ``binary_data`` parameter (None: the request's default decides)."""

    name: str
    binary: bool | None = None  # None: the request-level binary_data_output decides


@dataclass(frozen=True)
class InferRequest:
    """A v2 infer request: the input tensors by name, the outputs asked for (empty: all), an optional id and parameters, and whether
    outputs come as binary data by default."""

    inputs: Mapping[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...] = ()
    id: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    binary_output_default: bool = False

    def wants_binary(self, name: str) -> bool:
        """Whether output ``name`` should be sent as binary data: its own setting if the request names it with one, else the request's
        default."""
        for o in self.outputs:
            if o.name == name and o.binary is not None:
                return o.binary
        return self.binary_output_default


@dataclass(frozen=True)
class InferResponse:
    """A v2 infer response: model name and version, the output tensors by name, the request id and parameters."""

    model_name: str
    outputs: Mapping[str, np.ndarray]
    model_version: str | None = None
    id: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


def _split_body(body: bytes, headers: Mapping[str, str], max_bytes: int) -> tuple[dict[str, Any], memoryview]:
    if len(body) > max_bytes:
        raise ProtocolError(f"body of {len(body)} bytes is over the limit of {max_bytes}")
    hl = _header(headers, HEADER_LENGTH)
    mv = memoryview(body)
    if hl is None:
        head, rest = mv, mv[len(mv) :]
    else:
        try:
            n = int(hl)
        except ValueError:
            raise ProtocolError(f"{HEADER_LENGTH}: expected an integer, got {hl!r}") from None
        if not 0 <= n <= len(body):
            raise ProtocolError(f"{HEADER_LENGTH} {n} is outside the {len(body)}-byte body")
        head, rest = mv[:n], mv[n:]
    doc = loads_json(bytes(head), "the JSON part of the message")
    if not isinstance(doc, dict):
        raise ProtocolError(f"expected a JSON object, got {type(doc).__name__}")
    return doc, rest


def loads_json(raw: bytes, what: str = "the body") -> Any:
    """``json.loads`` with every way it fails as a :class:`ProtocolError`: not JSON, not UTF-8, a
    number past Python's digit limit (ValueError), nesting past the recursion limit (RecursionError)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ProtocolError(f"{what} is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise ProtocolError(f"{what} does not parse: {str(e)[:200]}") from None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    low = name.lower()
    for k, v in headers.items():
        if k.lower() == low:
            return v
    return None


def _tensors(items: Any, rest: memoryview, where: str) -> tuple[dict[str, np.ndarray], dict[str, Mapping[str, Any]]]:
    if not isinstance(items, list):
        raise ProtocolError(f"{where}: expected a list, got {type(items).__name__}")
    out: dict[str, np.ndarray] = {}
    params: dict[str, Mapping[str, Any]] = {}
    pos = 0
    for i, t in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ProtocolError(f"{w}: expected an object with a string 'name'")
        name = t["name"]
        if len(name) > 256:
            raise ProtocolError(f"{w}: a name of {len(name)} characters, at most 256")
        w = f"{where} {name!r}"
        if name in out:
            raise ProtocolError(f"{w}: given twice")
        p = t.get("parameters")
        p = {} if p is None else p
        if not isinstance(p, dict):
            raise ProtocolError(f"{w}.parameters: expected an object, got {type(p).__name__}")
        size = p.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError(f"{w}.parameters.binary_data_size: expected an int >= 0, got {_short(size)}")
            if pos + size > len(rest):
                raise ProtocolError(f"{w}: binary_data_size {size} runs past the body ({len(rest) - pos} bytes left)")
            if "data" in t:
                raise ProtocolError(f"{w}: both 'data' and binary_data_size")
            datatype: Any = t.get("datatype")  # unchecked JSON, as in tensor_from_json: dtype_of refuses a non-name
            out[name] = tensor_from_bytes(rest[pos : pos + size], datatype, _shape(t.get("shape"), w), w)
            pos += size
        else:
            out[name] = tensor_from_json(t, w)
        params[name] = p
    if pos != len(rest):
        raise ProtocolError(f"{where}: {len(rest) - pos} bytes of binary data that no tensor claims")
    return out, params


def _body(doc: dict[str, Any], chunks: list[bytes]) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if not chunks:
        return head, {"Content-Type": JSON_CONTENT_TYPE}
    return head + b"".join(chunks), {"Content-Type": BINARY_CONTENT_TYPE, HEADER_LENGTH: str(len(head))}


def encode_request(
    inputs: Mapping[str, np.ndarray],
    *,
    outputs: Sequence[str] | None = None,
    binary_inputs: bool = False,
    binary_outputs: bool = False,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of an infer request. ``binary_inputs``: send tensors with the binary
    extension; ``binary_outputs``: ask for binary outputs (``binary_data_output``)."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    params = dict(parameters or {})
    if binary_outputs:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    chunks: list[bytes] = []
    ins = []
    for name, arr in inputs.items():
        arr = _as_array(arr, f"input {name!r}")
        if binary_inputs:
            raw = tensor_to_bytes(arr, name)
            ins.append(
                {"name": name, "shape": list(arr.shape), "datatype": datatype_of(arr.dtype), "parameters": {"binary_data_size": len(raw)}}
            )
            chunks.append(raw)
        else:
            ins.append(tensor_to_json(name, arr))
    doc["inputs"] = ins
    if outputs is not None:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": True}} if binary_outputs else {"name": n} for n in outputs]
    return _body(doc, chunks)


def decode_request(body: bytes, headers: Mapping[str, str], *, max_bytes: int = 256 << 20) -> InferRequest:
    """Parse an infer request (JSON or binary). Content-Type is not required (tritonclient sends
    JSON without one)."""
    doc, rest = _split_body(body, headers, max_bytes)
    if "inputs" not in doc:
        raise ProtocolError("request: no 'inputs'")
    inputs, _ = _tensors(doc["inputs"], rest, "inputs")
    params = doc.get("parameters")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise ProtocolError(f"request.parameters: expected an object, got {type(params).__name__}")
    default_binary = _flag(params.get("binary_data_output"), "request.parameters.binary_data_output")
    outputs = doc.get("outputs")
    outputs = [] if outputs is None else outputs
    if not isinstance(outputs, list):
        raise ProtocolError(f"request.outputs: expected a list, got {type(outputs).__name__}")
    outs = []
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise ProtocolError(f"outputs[{i}]: expected an object with a string 'name'")
        op = o.get("parameters")
        op = {} if op is None else op
        if not isinstance(op, dict):
            raise ProtocolError(f"outputs[{i}].parameters: expected an object, got {type(op).__name__}")
        outs.append(RequestedOutput(o["name"], _flag(op.get("binary_data"), f"outputs[{i}].parameters.binary_data")))
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(f"request.id: expected a string, got {type(rid).__name__}")
    return InferRequest(inputs, tuple(outs), rid, params, bool(default_binary))


def _flag(v: Any, where: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    raise ProtocolError(f"{where}: expected true or false, got {_short(v)}")


def encode_response(
    model_name: str,
    outputs: Mapping[str, np.ndarray],
    *,
    model_version: str | None = None,
    request_id: str | None = None,
    binary: Iterable[str] | bool = False,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of an infer response; ``binary``: True for all outputs, or the names."""
    names = set(outputs) if binary is True else set() if binary is False else set(binary)
    doc: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        doc["model_version"] = model_version
    doc["id"] = request_id or ""
    if parameters:
        doc["parameters"] = dict(parameters)
    chunks, outs = [], []
    for name, arr in outputs.items():
        if name in names:
            raw = tensor_to_bytes(arr, name)
            outs.append(
                {"name": name, "shape": list(arr.shape), "datatype": datatype_of(arr.dtype), "parameters": {"binary_data_size": len(raw)}}
            )
            chunks.append(raw)
        else:
            outs.append(tensor_to_json(name, arr))
    doc["outputs"] = outs
    return _body(doc, chunks)


def decode_response(
    body: bytes,
    headers: Mapping[str, str],
    *,
    expected: Mapping[str, tuple[str, Sequence[int | None]]] | None = None,
    max_bytes: int = 256 << 20,
) -> InferResponse:
    """Parse an infer response. ``expected``: output name -> (datatype, shape with None for a
    free dim): every expected output must be there with that datatype and a matching shape."""
    doc, rest = _split_body(body, headers, max_bytes)
    if not isinstance(doc.get("model_name"), str):
        raise ProtocolError("response: expected a string 'model_name'")
    if "outputs" not in doc:
        raise ProtocolError("response: no 'outputs'")
    outputs, _ = _tensors(doc["outputs"], rest, "outputs")
    for name, (dt, shape) in (expected or {}).items():
        if name not in outputs:
            raise ProtocolError(f"response: output {name!r} is missing (got {sorted(outputs)})")
        got = outputs[name]
        if datatype_of(got.dtype) != dt:
            raise ProtocolError(f"response: output {name!r} is {datatype_of(got.dtype)}, expected {dt}")
        if len(got.shape) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got.shape)):
            raise ProtocolError(f"response: output {name!r} has shape {list(got.shape)}, expected {list(shape)}")
    mv = doc.get("model_version")
    return InferResponse(doc["model_name"], outputs, None if mv is None else str(mv), doc.get("id"), doc.get("parameters") or {})


# ----------------------------------------------------------------------------------- errors and routes


def error_body(message: str) -> bytes:
    """A v2 error response body: ``{"error": message}`` as JSON bytes."""
    return json.dumps({"error": message}).encode()


def error_message(status: int, body: bytes, content_type: str | None = None) -> str:
    """A readable message from an error response: ``{"error": ...}`` (v2), ``{"detail": ...}``
    (FastAPI-based servers such as MLServer), or the text itself (cut to 500 characters)."""
    text = body[: 64 << 10].decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            if key in doc:
                v = doc[key]
                return f"HTTP {status}: {v if isinstance(v, str) else json.dumps(v)[:500]}"
    return f"HTTP {status}: {text.strip()[:500] or '(empty body)'}"


_NAME = r"[^/]+"
_ROUTE_RE = re.compile(rf"^/v2/models/(?P<name>{_NAME})(?:/versions/(?P<version>{_NAME}))?(?P<tail>/ready|/infer)?$")


@dataclass(frozen=True)
class Route:
    """What a v2 path asks for: ``kind`` in live | ready | server | model | model_ready | infer."""

    kind: str
    model: str | None = None
    version: str | None = None


def parse_route(path: str) -> Route | None:
    """The v2 route of ``path`` (query string ignored), or None for a path outside the protocol."""
    p = path.split("?", 1)[0].rstrip("/") or "/"
    if p == "/v2/health/live":
        return Route("live")
    if p == "/v2/health/ready":
        return Route("ready")
    if p == "/v2":
        return Route("server")
    m = _ROUTE_RE.match(p)
    if m is None:
        return None
    kind = {None: "model", "/ready": "model_ready", "/infer": "infer"}[m.group("tail")]
    return Route(kind, m.group("name"), m.group("version"))


def model_path(name: str, version: str | None = None, tail: str = "") -> str:
    """``/v2/models/{name}[/versions/{v}]{tail}`` with the name and version checked."""
    for what, v in (("model name", name), ("model version", version)):
        if v is not None and (not v or "/" in v or "?" in v or "#" in v):
            raise ProtocolError(f"{what} {v!r}: expected a non-empty string without '/', '?' or '#'")
    return f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + tail
