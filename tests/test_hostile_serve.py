"""``edge-sdk serve`` against hostile clients, by class, each at its root: time (slowloris headers,
idle connections, half-sent and trickled bodies), descriptors (connection floods, a 256-descriptor
limit), memory (large bodies at once: the in-flight body budget and the decode slots), malformed
requests (every one a 400 with a JSON error) and the log (tracebacks rate-limited).

A real uvicorn server on 127.0.0.1 with the demo package; raw sockets for what an HTTP client
cannot send. Every loop is bounded in count and time; assertions are on orderings, counts and
bounds, never on how fast something was."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import ROOT  # noqa: E402

import edge_sdk  # noqa: E402
from edge_sdk.model import Model  # noqa: E402
from edge_sdk.remote import protocol  # noqa: E402
from edge_sdk.serve import ServeOptions, Server  # noqa: E402
from edge_sdk.serve.app import TracebackLimiter  # noqa: E402

DEMO = "shapes-classifier"
INFER = f"/v2/models/{DEMO}/infer"


# ----------------------------------------------------------------------------------- helpers


def call(
    port: int, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None, timeout: float = 10.0
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def health(port: int) -> int:
    return call(port, "GET", "/v2/health/live")[0]


def error_of(body: bytes) -> str:
    doc = json.loads(body)
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str), doc
    return str(doc["error"])


@contextlib.contextmanager
def trickling(socks: list[socket.socket], byte: bytes) -> Iterator[None]:
    """While in the block, send ``byte`` on every socket each 0.1 s (at most 100 rounds, ~10 s); errors of a
    socket the server closed are ignored. The sender stops and is joined when the block ends."""
    stop = threading.Event()

    def send() -> None:
        for _ in range(100):
            if stop.wait(0.1):
                return
            for s in socks:
                try:
                    s.send(byte)
                except OSError:
                    pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


def raw(port: int, data: bytes = b"", timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if data:
        s.sendall(data)
    return s


def read_to_close(s: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """What the server sends until it closes the connection (True) or the deadline passes (False)."""
    out = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return out, False
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return out, False
        except OSError:  # reset: closed too
            return out, True
        if not chunk:
            return out, True
        out += chunk


def status_of(data: bytes) -> int | None:
    if not data.startswith(b"HTTP/1."):
        return None
    return int(data.split(b" ", 2)[1])


def body_of(data: bytes) -> bytes:
    return data.split(b"\r\n\r\n", 1)[1]


def head(path: str = INFER, length: int | None = None, extra: str = "") -> bytes:
    cl = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{cl}{extra}\r\n".encode()


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def connections(srv: Server) -> int:
    return len(srv._server.server_state.connections)


def image(rows: int = 1) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((rows, 3, 32, 32)).astype(np.float32)


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Model]:
    m = edge_sdk.load(edge_sdk.demo_package_path(), variant="fp32-onnx", cache_dir=tmp_path_factory.mktemp("cache"), measure_backends=False)
    yield m
    m.close()


def serve(model: Model, **options: Any) -> Server:
    return Server({DEMO: model}, ServeOptions(max_queue_delay_ms=1, **options)).start()


@pytest.fixture(scope="module")
def server(model: Model) -> Iterator[Server]:
    srv = serve(model, max_body_bytes=1 << 20)
    yield srv
    assert srv.stop(10)


# ----------------------------------------------------------------------------------- time: headers and idle connections


def test_slowloris_and_idle_connections_are_closed_and_health_answers(model: Model) -> None:
    srv = serve(model, header_timeout_s=2.0, max_connections=30, reserved_connections=4)
    socks: list[socket.socket] = []
    try:
        idle = [raw(srv.port) for _ in range(30)]
        slow = [raw(srv.port, b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n") for _ in range(30)]
        socks = idle + slow
        # one header byte per connection every 0.1 s: a timeout per read would never fire
        with trickling(slow, b"X"):
            for _ in range(5):  # under the flood, health answers (a new connection evicts an idle one)
                assert health(srv.port) == 200
                assert connections(srv) <= 30 + 4 + 1
        deadline = time.monotonic() + 30
        results = [read_to_close(s, deadline) for s in socks]
        assert all(closed for _, closed in results), "a connection outlived the header timeout"
        lim = srv.limits
        assert lim.evicted >= 30 and lim.evicted + lim.timed_out >= 60
        for data, _ in results[30:]:  # a half-sent request is told why, when it was not evicted
            assert status_of(data) in (None, 408)
            if data:
                assert "did not arrive" in error_of(body_of(data))
        assert health(srv.port) == 200
    finally:
        close_all(socks)
        assert srv.stop(10)


def test_kept_alive_and_oversized_headers_are_bounded(model: Model) -> None:
    srv = serve(model, header_timeout_s=1.0, keep_alive_s=60)
    socks: list[socket.socket] = []
    try:
        # a kept-alive connection that never sends its next request: closed by the header timeout,
        # although uvicorn's own keep-alive would wait 60 s
        ka = [raw(srv.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(10)]
        # headers past 64 KiB: 431 and closed, whatever the pace
        big = [raw(srv.port, b"GET /v2 HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * (70 << 10)) for _ in range(5)]
        socks = ka + big
        deadline = time.monotonic() + 30
        for s in ka:
            data, closed = read_to_close(s, deadline)
            assert closed and status_of(data) == 200 and data.count(b"HTTP/1.1") == 1
        for s in big:
            data, closed = read_to_close(s, deadline)
            assert closed and status_of(data) in (400, 431), data[:200]  # h11 answers 400 itself, httptools gets our 431
        assert health(srv.port) == 200
    finally:
        close_all(socks)
        assert srv.stop(10)


# ----------------------------------------------------------------------------------- time: bodies


def test_half_sent_and_trickled_bodies_get_408_and_are_closed(model: Model) -> None:
    srv = serve(model, body_timeout_s=1.5, header_timeout_s=30)
    socks: list[socket.socket] = []
    try:
        half = [raw(srv.port, head(length=1000) + b'{"inputs": [') for _ in range(20)]
        chunked = [raw(srv.port, head(extra="Transfer-Encoding: chunked\r\n") + b'5\r\n{"inp\r\n') for _ in range(5)]
        trickled = [raw(srv.port, head(length=100000)) for _ in range(5)]
        socks = half + chunked + trickled
        with trickling(trickled, b" "):  # bytes keep coming, but the whole body never does within the timeout
            for _ in range(5):
                assert health(srv.port) == 200
        deadline = time.monotonic() + 30
        for s in socks:
            data, closed = read_to_close(s, deadline)
            assert closed, "a half-sent body held its connection past the body timeout"
            assert status_of(data) == 408, data[:200]
            assert "did not arrive within 1.5 s" in error_of(body_of(data))
        assert srv.app.state.serve.budget.held == 0  # every reservation was given back
        assert health(srv.port) == 200
    finally:
        close_all(socks)
        assert srv.stop(10)


# ----------------------------------------------------------------------------------- descriptors


def test_connection_cap_reserves_room_for_health(model: Model) -> None:
    srv = serve(model, max_connections=10, reserved_connections=2, body_timeout_s=60, header_timeout_s=60)
    socks: list[socket.socket] = []
    try:
        busy = [raw(srv.port, head(length=1000) + b"{") for _ in range(10)]  # being answered: never evicted
        socks += busy
        assert health(srv.port) == 200  # through the reserve
        status, headers, body = call(srv.port, "GET", "/v2")
        assert status == 503 and "health checks only" in error_of(body)
        idle = [raw(srv.port) for _ in range(6)]  # idle ones fill the reserve; each new one evicts the oldest idle
        socks += idle
        for _ in range(3):
            assert health(srv.port) == 200
        assert srv.limits.reserved_used >= 3 and srv.limits.evicted >= 4
        assert connections(srv) <= 10 + 2 + 1
    finally:
        close_all(socks)
        assert srv.stop(10)


_CHILD = r"""
import json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, max(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
import edge_sdk
from edge_sdk.serve import ServeOptions, Server
m = edge_sdk.load(edge_sdk.demo_package_path(), variant="fp32-onnx", cache_dir=sys.argv[2], measure_backends=False)
srv = Server({"shapes-classifier": m}, ServeOptions(**json.loads(sys.argv[3]))).start()
print("URL", srv.port, srv.limits.cap, flush=True)
sys.stdin.read()
srv.stop(10)
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A server in its own process, with 256 descriptors, a 8 MiB body limit (16 MiB in flight) and one decode slot."""
    pytest.importorskip("resource")
    opts = {"max_body_bytes": 8 << 20, "header_timeout_s": 30, "body_timeout_s": 60, "max_decodes": 1}
    cmd = [sys.executable, "-c", _CHILD, "256", str(tmp_path_factory.mktemp("child-cache")), json.dumps(opts)]
    p = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # bounded: the child prints or dies
        assert line.startswith("URL"), (line, p.poll(), p.stderr.read() if p.poll() is not None else "")  # type: ignore[union-attr]
        _, port, cap = line.split()
        yield p, int(port), int(cap)
    finally:
        try:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def test_descriptor_limit_300_idle_connections_and_health_answers(child: tuple[subprocess.Popen[str], int, int]) -> None:
    p, port, cap = child
    assert cap < 256
    socks: list[socket.socket] = []
    try:
        for _ in range(300):
            socks.append(raw(port))
        for _ in range(5):
            assert health(port) == 200
        # the oldest idle ones were closed to make room: at most the cap stay open
        deadline = time.monotonic() + 2
        closed = sum(read_to_close(s, deadline)[1] for s in socks[:50])
        assert closed >= 40
        assert p.poll() is None
    finally:
        close_all(socks)


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_large_bodies_at_once_are_bounded_by_the_body_budget(child: tuple[subprocess.Popen[str], int, int]) -> None:
    p, port, _ = child
    if not Path(f"/proc/{p.pid}/status").exists():
        pytest.skip("needs /proc")
    n = (7 << 20) // 6  # ~7 MiB of "0.125," : 1.2 M floats, a 400 (the shape says 1 element)
    body = b'{"inputs": [{"name": "image", "shape": [1], "datatype": "FP32", "data": [' + b"0.125," * (n - 1) + b"0.125]}]}"
    assert len(body) < 8 << 20
    before = _peak_rss(p.pid)
    socks = [raw(port, head(length=len(body))) for _ in range(6)]  # six declared at once: the budget holds two
    try:
        time.sleep(0.2)  # let the headers land (a slower machine only admits fewer at once)
        for s in socks:
            try:
                s.sendall(body)
            except OSError:  # refused early and closed: the rest of the body is not wanted
                pass
        deadline = time.monotonic() + 60
        statuses = []
        for s in socks:
            data, _ = read_to_close(s, deadline)
            statuses.append(status_of(data))
            if status_of(data) == 503:
                assert b"retry-after: 1" in data.lower()
            elif status_of(data) == 400:
                assert "needs 1 elements" in error_of(body_of(data))
        assert statuses.count(400) >= 1 and statuses.count(503) >= 3 and statuses.count(400) <= 2, statuses
        grown = _peak_rss(p.pid) - before
        # two bodies held, one decoded at a time: far less than six decoded at once (~6 x 80 MB)
        assert grown < 250 << 20, f"peak RSS grew by {grown >> 20} MiB"
        assert health(port) == 200
    finally:
        close_all(socks)


def test_content_length_over_the_limit_is_413_before_reading(server: Server) -> None:
    for extra in ("", "Content-Encoding: gzip\r\n"):
        s = raw(server.port, head(length=(1 << 20) + 1, extra=extra))  # no body sent at all
        data, closed = read_to_close(s, time.monotonic() + 10)
        s.close()
        assert closed and status_of(data) == 413 and "over the limit" in error_of(body_of(data))
    for cl in ("abc", "-5"):
        s = raw(server.port, head(extra=f"Content-Length: {cl}\r\n"))
        data, closed = read_to_close(s, time.monotonic() + 10)
        s.close()
        assert status_of(data) == 400  # uvicorn's parser or the guard: never a 500


def test_in_flight_budget_is_503_with_retry_after_before_reading(model: Model) -> None:
    srv = serve(model, max_body_bytes=1 << 20, max_inflight_body_bytes=2 << 20, body_timeout_s=30)
    socks: list[socket.socket] = []
    try:
        socks = [raw(srv.port, head(length=1 << 20)) for _ in range(2)]  # declared, not sent: 2 MiB reserved
        budget = srv.app.state.serve.budget
        deadline = time.monotonic() + 10
        while budget.held < 2 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert budget.held == 2 << 20
        for length in (1 << 20, 1024):
            # refused from the declared length before the body is read: send the headers only, as a client
            # that waits for 100-continue would (sending a 1 MiB body into a refusal races the close)
            s = raw(srv.port, head(length=length))
            data, closed = read_to_close(s, time.monotonic() + 10)
            s.close()
            assert closed and status_of(data) == 503, data[:200]
            assert b"retry-after: 1" in data.lower() and "in flight" in error_of(body_of(data))
        s = raw(srv.port, head(extra="Transfer-Encoding: chunked\r\n") + b"400\r\n" + b"x" * 1024 + b"\r\n")
        socks.append(s)
        data, closed = read_to_close(s, time.monotonic() + 10)
        assert closed and status_of(data) == 503  # a chunked body is reserved as it comes
        assert health(srv.port) == 200  # health needs no budget
        close_all(socks)
        deadline = time.monotonic() + 10
        while budget.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert budget.held == 0  # clients that left gave their reservation back
        body, hdrs = protocol.encode_request({"image": image()})
        status, _, _ = call(srv.port, "POST", INFER, body, hdrs)
        assert status == 200
    finally:
        close_all(socks)
        assert srv.stop(10)


# ----------------------------------------------------------------------------------- malformed requests: 400, never 500


def _doc(**tensor: Any) -> bytes:
    t = {"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.0] * 3072}
    t.update(tensor)
    return json.dumps({"inputs": [t]}).encode()


def _nest(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


DEEP = 100_000
MALFORMED: dict[str, bytes] = {
    # deep nesting, in each place a value can go
    "deep-top": _nest(DEEP).encode(),
    "deep-inputs": b'{"inputs": ' + _nest(DEEP).encode() + b"}",
    "deep-data": b'{"inputs": [{"name": "image", "shape": [1], "datatype": "FP32", "data": ' + _nest(DEEP).encode() + b"}]}",
    "deep-parameters": b'{"inputs": [], "parameters": {"a": ' + _nest(DEEP).encode() + b"}}",
    "deep-objects": b'{"a": ' * DEEP + b"1" + b"}" * DEEP,
    "deep-outputs": b'{"inputs": [], "outputs": ' + _nest(DEEP).encode() + b"}",
    "deep-id": b'{"inputs": [], "id": ' + _nest(DEEP).encode() + b"}",
    "nested-data-past-the-shape": _doc(shape=[2], data=[[[1.0]], [[2.0]]]),
    # wrong types, field by field
    "body-not-object": b"[1, 2]",
    "inputs-int": b'{"inputs": 5}',
    "inputs-object": b'{"inputs": {"image": 1}}',
    "input-not-object": b'{"inputs": [5]}',
    "name-int": _doc(name=5),
    "name-huge": _doc(name="n" * 10000),
    "shape-string": _doc(shape="1,3,32,32"),
    "shape-float": _doc(shape=[1.5]),
    "shape-bool": _doc(shape=[True]),
    "shape-nested": _doc(shape=[[1]]),
    "datatype-int": _doc(datatype=5),
    "datatype-list": _doc(datatype=["FP32"]),
    "datatype-unknown": _doc(datatype="FLOAT32"),
    "data-int": _doc(shape=[1], data=5),
    "data-string": _doc(shape=[1], data="1.0"),
    "data-object": _doc(shape=[1], data={"a": 1}),
    "data-null": _doc(shape=[1], data=None),
    "tensor-parameters-int": _doc(parameters=5),
    "binary-size-string": _doc(parameters={"binary_data_size": "4"}),
    "binary-size-negative": _doc(parameters={"binary_data_size": -1}),
    "binary-size-bool": _doc(parameters={"binary_data_size": True}),
    "outputs-int": b'{"inputs": [], "outputs": 5}',
    "outputs-string": b'{"inputs": [], "outputs": "logits"}',
    "outputs-object": b'{"inputs": [], "outputs": {"name": "logits"}}',
    "output-int": b'{"inputs": [], "outputs": [5]}',
    "output-name-int": b'{"inputs": [], "outputs": [{"name": 5}]}',
    "output-parameters-int": b'{"inputs": [], "outputs": [{"name": "logits", "parameters": 5}]}',
    "output-binary-string": b'{"inputs": [], "outputs": [{"name": "logits", "parameters": {"binary_data": "yes"}}]}',
    "parameters-list": b'{"inputs": [], "parameters": [1]}',
    "parameters-int": b'{"inputs": [], "parameters": 5}',
    "binary-output-string": b'{"inputs": [], "parameters": {"binary_data_output": "no"}}',
    "id-int": b'{"inputs": [], "id": 5}',
    "id-list": b'{"inputs": [], "id": ["a"]}',
    # huge numbers
    "int-400-digits": _doc(shape=[1], data=[10**400]),
    "int-400-digits-negative": _doc(shape=[1], data=[-(10**400)]),
    "int-5000-digits": b'{"inputs": [{"name": "image", "shape": [1], "datatype": "FP32", "data": [' + b"9" * 5000 + b"]}]}",
    "float-past-fp32": _doc(shape=[1], data=[1e300]),
    "float-overflows-json": b'{"inputs": [{"name": "image", "shape": [1], "datatype": "FP32", "data": [1e400]}]}',
    "nan-literal": b'{"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [NaN' + b", 0" * 3071 + b"]}]}",
    "int8-out-of-range": _doc(shape=[1], datatype="INT8", data=[300]),
    "uint8-negative": _doc(shape=[1], datatype="UINT8", data=[-1]),
    "binary-size-huge": _doc(parameters={"binary_data_size": 10**30}),
    # huge and negative shapes
    "shape-zero-times-huge": _doc(shape=[0, 10**30], data=[]),
    "shape-huge": _doc(shape=[10**30], data=[]),
    "shape-huge-product": _doc(shape=[2**31 - 1] * 3, data=[]),
    "shape-zero-times-past-int64": _doc(shape=[0, 2**62, 2**62], data=[]),
    "shape-negative": _doc(shape=[-1], data=[]),
    "shape-negative-inner": _doc(shape=[1, -3, 32, 32], data=[]),
    "shape-rank-100": _doc(shape=[1] * 100, data=[1.0]),
    "shape-4000-digits": _doc(shape=[10**3999], data=[]),
    # ragged data: never flattened into something that fits
    "ragged-short-row": _doc(shape=[3], data=[[1.0, 2.0], [3.0]]),
    "ragged-long-row": _doc(shape=[2, 2], data=[[1.0], [2.0, 3.0, 4.0]]),
    "ragged-mixed-depth": _doc(shape=[2], data=[[[1.0]], [2.0]]),
    "partly-nested": _doc(shape=[2, 2], data=[[1.0, 2.0, 3.0, 4.0]]),
    "nested-in-flat": _doc(shape=[3], data=[1.0, [2.0], 3.0]),
    "ragged-image": _doc(data=[[[[0.0] * 32] * 32] * 3, [0.0]]),
    # mismatched datatype and length
    "fp32-strings": _doc(shape=[1], data=["a"]),
    "bytes-numbers": _doc(shape=[1], datatype="BYTES", data=[1]),
    "bool-two": _doc(shape=[1], datatype="BOOL", data=[2]),
    "int64-floats": _doc(shape=[1], datatype="INT64", data=[1.5]),
    "too-few": _doc(data=[0.0] * 3071),
    "too-many": _doc(data=[0.0] * 3073),
    "wrong-dtype-for-model": _doc(datatype="FP64"),
    "wrong-shape-for-model": _doc(shape=[1, 3, 16, 64]),
    "not-json": b"{not json",
    "not-utf8": b'{"inputs": "\xff\xfe"}',
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_requests_are_400_with_a_json_error(server: Server, name: str) -> None:
    status, headers, body = call(server.port, "POST", INFER, MALFORMED[name])
    assert status == 400, (name, status, body[:300])
    msg = error_of(body)
    assert len(msg) < 2000  # names what was wrong; does not echo a hostile value


def test_binary_messages_malformed_are_400(server: Server) -> None:
    x = image()
    good, hdrs = protocol.encode_request({"image": x}, binary_inputs=True)
    n = int(hdrs[protocol.HEADER_LENGTH])
    cases = [
        (good[:-4], hdrs),  # the chunk is short
        (good + b"\0" * 4, hdrs),  # bytes no tensor claims
        (good, {**hdrs, protocol.HEADER_LENGTH: "x"}),
        (good, {**hdrs, protocol.HEADER_LENGTH: "-1"}),
        (good, {**hdrs, protocol.HEADER_LENGTH: str(10**30)}),
        (good, {**hdrs, protocol.HEADER_LENGTH: str(n - 1)}),
        (good.replace(b"[1,3,32,32]", b"[1,3,32,33]"), hdrs),  # the size does not match the shape
        (good.replace(b'"FP32"', b'"BOOL"'), hdrs),
    ]
    for body, h in cases:
        status, _, resp = call(server.port, "POST", INFER, body, h)
        assert status == 400, (h, resp[:300])
        error_of(resp)
    status, _, resp = call(server.port, "POST", INFER, good, hdrs)
    assert status == 200


def test_a_client_that_leaves_mid_body_is_not_a_logged_failure(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        for _ in range(10):
            s = raw(server.port, head(length=5000) + b'{"inputs": [')
            s.close()
        assert health(server.port) == 200
        deadline = time.monotonic() + 10
        while server.app.state.serve.budget.held and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not [r for r in caplog.records if r.exc_info]


# ----------------------------------------------------------------------------------- the log


class _Failing:
    """A session whose every call fails (a model that cannot run)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise RuntimeError("the accelerator fell off")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_failures_log_a_bounded_number_of_tracebacks(model: Model, caplog: pytest.LogCaptureFixture) -> None:
    failing = Model(model.package, model.variant, _Failing(model.session), model.selection, model.detection, model.options)  # type: ignore[arg-type]
    srv = Server({DEMO: failing}, ServeOptions(max_queue_delay_ms=1, max_batch_size=1)).start()
    try:
        body, hdrs = protocol.encode_request({"image": image()})
        with caplog.at_level(logging.INFO):
            for _ in range(40):
                status, _, resp = call(srv.port, "POST", INFER, body, hdrs)
                assert status == 500 and "fell off" in error_of(resp)
        tracebacks = [r for r in caplog.records if r.exc_info]
        assert 1 <= len(tracebacks) <= 5
        text = "\n".join(r.getMessage() for r in caplog.records)
        assert text.count("Traceback") == 0 and "counted, not logged" in text
        assert sum("the next ones are counted" in r.getMessage() for r in caplog.records) == 1
        assert srv.app.state.serve.failures.total == 40
    finally:
        assert srv.stop(10)


def test_traceback_limiter_windows_and_summary() -> None:
    log = logging.getLogger("test_hostile_serve.limiter")
    records: list[logging.LogRecord] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    h = H()
    log.addHandler(h)
    log.propagate = False
    now = [0.0]
    lim = TracebackLimiter(log, burst=3, window_s=60, clock=lambda: now[0])
    try:
        for window in range(3):
            for i in range(1000):
                try:
                    raise ValueError(f"boom {window}.{i}")
                except ValueError as e:
                    lim.exception("serve: case %d failed", i, exc=e)
            now[0] += 61
        full = [r for r in records if r.exc_info]
        assert len(full) == 3 * 3  # burst per window, whatever the rate
        summaries = [r.getMessage() for r in records if "were counted" in r.getMessage()]
        assert len(summaries) == 2 and all("997 more failure(s)" in m for m in summaries)
        assert "boom 0.999" in summaries[0]
        assert len(records) <= 3 * (3 + 2)
        assert lim.total == 3000
    finally:
        log.removeHandler(h)


def test_an_exception_escaping_a_route_is_a_json_500_and_rate_limited(model: Model, caplog: pytest.LogCaptureFixture) -> None:
    from starlette.routing import Route

    srv = Server({DEMO: model}, ServeOptions())
    app = srv.app

    async def broken(request: Any) -> Any:
        raise KeyError("escaped")

    app.router.routes.append(Route("/broken", broken))
    srv.start()
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(20):
                status, _, body = call(srv.port, "GET", "/broken")
                assert status == 500 and "KeyError" in error_of(body)
        assert 1 <= len([r for r in caplog.records if r.exc_info]) <= 5
        assert health(srv.port) == 200
    finally:
        assert srv.stop(10)


def test_options_of_the_bounds_are_checked() -> None:
    from edge_sdk.errors import OptionsError

    for kw in ({"header_timeout_s": 0}, {"body_timeout_s": -1}, {"keep_alive_s": float("nan")}, {"max_connections": 0},
               {"reserved_connections": 0}, {"max_decodes": 0}, {"max_inflight_body_bytes": 1024, "max_body_bytes": 4096},
               {"header_timeout_s": True}):  # fmt: skip
        with pytest.raises(OptionsError):
            ServeOptions(**kw)  # type: ignore[arg-type]
    assert ServeOptions(max_body_bytes=4096).inflight_budget == 8192


if os.name != "posix":  # pragma: no cover
    pytestmark = pytest.mark.skip("raw-socket tests need POSIX sockets")
