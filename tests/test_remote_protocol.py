"""The v2 protocol module: every datatype through JSON and the binary extension, the spec's own
worked example, routes, and malformed messages refused with a message naming what was expected."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from edge_sdk.remote.protocol import (
    HEADER_LENGTH,
    ProtocolError,
    Route,
    datatype_of,
    decode_request,
    decode_response,
    dtype_of,
    encode_request,
    encode_response,
    error_message,
    model_path,
    parse_route,
)

RNG = np.random.default_rng(0)
ARRAYS = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": RNG.integers(0, 256, (2, 3), dtype=np.uint8),
    "UINT16": np.array([0, 65535], np.uint16),
    "UINT32": np.array([[1, 2], [3, 4]], np.uint32),
    "UINT64": np.array([2**64 - 1, 0], np.uint64),
    "INT8": np.array([-128, 127], np.int8),
    "INT16": np.array([-32768, 5], np.int16),
    "INT32": np.array([-(2**31), 2**31 - 1], np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
    "FP16": np.array([1.5, -0.0, np.nan, 65504], np.float16),
    "FP32": RNG.standard_normal((1, 3, 4, 4)).astype(np.float32),
    "FP64": np.array([1e300, np.nan, -2.5]),
    "BYTES": np.array([b"", b"hello", "caf\u00e9".encode()], dtype=object),
}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object:
        return a.shape == b.shape and list(a.reshape(-1)) == list(b.reshape(-1))
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips_in_requests_and_responses(binary: bool) -> None:
    body, headers = encode_request(ARRAYS, outputs=["y"], binary_inputs=binary, binary_outputs=binary, request_id="r1")
    assert (HEADER_LENGTH in headers) is binary
    req = decode_request(body, headers)
    assert req.id == "r1" and list(req.inputs) == list(ARRAYS) and req.wants_binary("y") is binary
    for k, v in ARRAYS.items():
        assert same(req.inputs[k], v), k
        assert datatype_of(req.inputs[k].dtype) == k
    body, headers = encode_response("m", ARRAYS, model_version="3", request_id="r1", binary=binary)
    resp = decode_response(body, headers, expected={k: (k, v.shape) for k, v in ARRAYS.items()})
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "3", "r1")
    for k, v in ARRAYS.items():
        assert same(resp.outputs[k], v), k


def test_the_binary_extension_matches_the_documented_example() -> None:
    # extension_binary_data.md: input0 UINT32 [2,2] -> binary_data_size 16, input1 BOOL [3] -> 3
    ins = {"input0": np.array([[1, 2], [3, 4]], np.uint32), "input1": np.array([True, False, True])}
    body, headers = encode_request(ins, binary_inputs=True)
    n = int(headers[HEADER_LENGTH])
    doc = json.loads(body[:n])
    assert [i["parameters"]["binary_data_size"] for i in doc["inputs"]] == [16, 3]
    assert len(body) == n + 19 and body[n:] == struct.pack("<4I", 1, 2, 3, 4) + b"\x01\x00\x01"
    assert headers["Content-Type"] == "application/octet-stream"
    # BYTES: 4-byte little-endian length, then the bytes
    b2, h2 = encode_request({"s": np.array([b"ab", b""], dtype=object)}, binary_inputs=True)
    assert b2[int(h2[HEADER_LENGTH]) :] == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


def test_json_accepts_nested_data_null_for_nan_and_no_content_type() -> None:
    doc = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, None], [3, 4]]}], "outputs": [{"name": "y"}]}
    req = decode_request(json.dumps(doc).encode(), {})  # tritonclient sends JSON with no Content-Type
    assert np.isnan(req.inputs["x"][0, 1]) and req.inputs["x"][1, 0] == 3 and req.wants_binary("y") is False
    body, _ = encode_request({"x": np.array([np.nan, 1.0], np.float32)})
    assert json.loads(body)["inputs"][0]["data"] == [None, 1.0]


@pytest.mark.parametrize(
    "doc,match",
    [
        ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0]}]}, "needs 2 elements, data has 1"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP128", "data": [1.0]}]}, "datatype 'FP128': expected one of"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [300]}]}, "out of range for INT8"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}]}, "must be integers"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["1"]}]}, "must be numbers"),
        ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, [2]]}]}, "must be numbers"),
        ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [True, 2]}]}, "must be numbers"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [2]}]}, "BOOL data"),
        ({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]}, "shape: expected a list of ints >= 0"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "no 'data'"),
        ({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}, "string 'name'"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}] * 2}, "given twice"),
        ({"inputs": {"x": 1}}, "expected a list"),
        ({"outputs": []}, "no 'inputs'"),
        ([1, 2], "expected a JSON object"),
        ({"id": 5, "inputs": []}, "request.id: expected a string"),
    ],
)
def test_malformed_requests_are_refused_naming_what_was_expected(doc, match) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_request(json.dumps(doc).encode(), {"Content-Type": "application/json"})


def test_malformed_binary_framing_is_refused() -> None:
    body, headers = encode_request({"x": np.arange(4, dtype=np.float32)}, binary_inputs=True)
    n = int(headers[HEADER_LENGTH])
    for h, b, match in [
        ({HEADER_LENGTH: str(len(body) + 1)}, body, "outside the"),
        ({HEADER_LENGTH: "abc"}, body, "expected an integer"),
        ({HEADER_LENGTH: str(n)}, body[:-1], "runs past the body"),
        ({HEADER_LENGTH: str(n)}, body + b"\x00", "no tensor claims"),
        ({}, body, "does not parse"),
    ]:
        with pytest.raises(ProtocolError, match=match):
            decode_request(b, h)
    with pytest.raises(ProtocolError, match="over the limit"):
        decode_request(body, headers, max_bytes=len(body) - 1)
    bad = json.dumps({"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]}).encode()
    with pytest.raises(ProtocolError, match="5 bytes declared, 2 left"):
        decode_request(bad + b"\x05\x00\x00\x00ab", {HEADER_LENGTH: str(len(bad))})
    b3 = json.dumps({"inputs": [{"name": "b", "shape": [2], "datatype": "BOOL", "parameters": {"binary_data_size": 2}}]}).encode()
    with pytest.raises(ProtocolError, match="BOOL bytes must be 0 or 1"):
        decode_request(b3 + b"\x01\x07", {HEADER_LENGTH: str(len(b3))})


def test_responses_are_checked_against_what_was_expected() -> None:
    body, headers = encode_response("m", {"y": np.zeros((1, 4), np.float32)})
    with pytest.raises(ProtocolError, match="output 'z' is missing"):
        decode_response(body, headers, expected={"z": ("FP32", (1, 4))})
    with pytest.raises(ProtocolError, match="is FP32, expected INT64"):
        decode_response(body, headers, expected={"y": ("INT64", (1, 4))})
    with pytest.raises(ProtocolError, match=r"shape \[1, 4\], expected \[1, 5\]"):
        decode_response(body, headers, expected={"y": ("FP32", (1, 5))})
    assert decode_response(body, headers, expected={"y": ("FP32", (None, 4))}).outputs["y"].shape == (1, 4)
    with pytest.raises(ProtocolError, match="model_name"):
        decode_response(b'{"outputs": []}', {})
    with pytest.raises(ProtocolError, match="JSON cannot carry infinity"):
        encode_response("m", {"y": np.array([np.inf], np.float32)})
    with pytest.raises(ProtocolError, match="not UTF-8"):
        encode_request({"s": np.array([b"\xff"], dtype=object)})


def test_datatypes_errors_and_routes() -> None:
    assert datatype_of(np.float32) == "FP32" and datatype_of(np.dtype("U3")) == "BYTES" and dtype_of("INT64") == np.int64
    with pytest.raises(ProtocolError, match="complex64 has no v2 datatype"):
        datatype_of(np.complex64)
    assert error_message(400, b'{"error": "bad shape"}') == "HTTP 400: bad shape"
    assert error_message(422, b'{"detail": [{"msg": "x"}]}').startswith('HTTP 422: [{"msg": "x"}]')
    assert error_message(502, b"<html>Bad Gateway</html>") == "HTTP 502: <html>Bad Gateway</html>"
    assert error_message(500, b"") == "HTTP 500: (empty body)"
    assert parse_route("/v2/health/live") == Route("live") and parse_route("/v2/health/ready/") == Route("ready")
    assert parse_route("/v2") == Route("server")
    assert parse_route("/v2/models/m") == Route("model", "m")
    assert parse_route("/v2/models/m/versions/1.2/ready") == Route("model_ready", "m", "1.2")
    assert parse_route("/v2/models/m/infer?x=1") == Route("infer", "m")
    assert parse_route("/v2/models/m/versions/1/other") is None and parse_route("/v1/models/m") is None
    assert model_path("m", "2", "/infer") == "/v2/models/m/versions/2/infer"
    with pytest.raises(ProtocolError, match="without '/'"):
        model_path("a/b")
