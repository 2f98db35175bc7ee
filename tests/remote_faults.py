"""A fault-injecting Open Inference Protocol (v2 REST) server for tests, on 127.0.0.1.

It serves one model correctly (JSON and the binary extension) and can be switched, per test,
to misbehave::

    with FaultServer() as srv:                      # serves "mlp": y = x @ W + b
        srv.set_fault(Fault("queue_full", times=2)) # the first 2 infer requests get 503
        ...
        srv.requests                                # every request: method, path, headers, body

Faults (``Fault.kind``; each applies to the route kinds in ``routes``, default infer only, and
to the first ``times`` matching requests, default all):

- ``blackhole``: read the request, never answer (held until the server stops, 30 s at most)
- ``slow``: answer correctly after ``delay_s``
- ``slow_body``: send the headers at once, then the body one byte every ``interval_s``
- ``slow_headers``: send the status line and headers one byte every ``interval_s``
- ``flaky_500``: every other matching request (the 1st, 3rd, ...) gets 500
- ``queue_full``: 503 ``{"error": "queue full"}`` (with ``Retry-After`` when ``retry_after`` is set)
- ``rate_limited``: 429 with ``Retry-After: <retry_after>`` (delta-seconds or an HTTP-date)
- ``malformed_json``: 200 with a body that is not JSON
- ``wrong_shape`` / ``wrong_dtype`` / ``missing_output``: 200 with a plausible but wrong answer
- ``huge_body``: 200 declaring ``size`` bytes in Content-Length and streaming them
- ``huge_chunked``: 200 with chunked transfer encoding and no end (until the client leaves)
- ``unauthorized``: 401
- ``redirect``: 302 to ``http://127.0.0.1:<port>/elsewhere`` (plain http)
- ``binary_refused``: 415 for any request carrying binary tensors (the server still lists the
  binary extension: the list is not to be trusted alone)
- ``reset``: close the connection without an answer (RST)
- ``echo_auth``: 400 whose error message echoes the request's Authorization header

Connection refused: :func:`closed_port`. TLS: pass ``ssl_context`` (see :func:`tls_context`,
e.g. a trustme certificate for the wrong host name).
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

import numpy as np

from edge_sdk.remote import protocol

KINDS = (
    "none",
    "blackhole",
    "slow",
    "slow_body",
    "slow_headers",
    "flaky_500",
    "queue_full",
    "rate_limited",
    "malformed_json",
    "wrong_shape",
    "wrong_dtype",
    "missing_output",
    "huge_body",
    "huge_chunked",
    "unauthorized",
    "redirect",
    "binary_refused",
    "reset",
    "echo_auth",
)
MAX_HOLD_S = 30.0  # nothing the server does outlives this


@dataclass(frozen=True)
class Fault:
    kind: str = "none"
    times: int | None = None
    routes: tuple[str, ...] | None = ("infer",)
    delay_s: float = 1.0
    interval_s: float = 0.05
    retry_after: str | None = None
    size: int = 512 << 20

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r}: expected one of {KINDS}")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    time: float

    def header(self, name: str) -> str | None:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None


@dataclass
class ServedModel:
    """One model: metadata (v2 datatypes, -1 for a free dim) and ``fn(inputs) -> outputs``."""

    name: str
    version: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    fn: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    platform: str = "test"

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "versions": [self.version], "platform": self.platform, "inputs": self.inputs, "outputs": self.outputs}


MLP_W = (np.arange(12, dtype=np.float32).reshape(4, 3) / 10).astype(np.float32)
MLP_B = np.array([0.1, 0.2, 0.3], dtype=np.float32)


def mlp_model() -> ServedModel:
    """``mlp`` 1.0: x FP32 [-1, 4] -> y FP32 [-1, 3] = x @ W + b."""
    return ServedModel(
        "mlp",
        "1.0",
        [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
        lambda ins: {"y": (ins["x"] @ MLP_W + MLP_B).astype(np.float32)},
    )


def package_model(path: Any) -> ServedModel:
    """The reference ONNX variant of an edge_sdk package, run by onnxruntime in the server."""
    import onnxruntime as ort

    from edge_sdk.package import ModelPackage

    pkg = ModelPackage.open(path)
    m = pkg.manifest
    v = m.reference_variant
    sess = ort.InferenceSession(pkg.read_verified(v).data, providers=["CPUExecutionProvider"])
    types = {
        "tensor(float)": "FP32",
        "tensor(double)": "FP64",
        "tensor(int64)": "INT64",
        "tensor(int32)": "INT32",
        "tensor(uint8)": "UINT8",
    }

    def meta(args: Any) -> list[dict[str, Any]]:
        return [{"name": a.name, "datatype": types[a.type], "shape": [d if isinstance(d, int) else -1 for d in a.shape]} for a in args]

    names = [o.name for o in sess.get_outputs()]
    return ServedModel(
        m.name,
        m.version,
        meta(sess.get_inputs()),
        meta(sess.get_outputs()),
        lambda ins: dict(zip(names, sess.run(None, dict(ins)))),
        platform="onnx_onnxv1",
    )


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tls_context(ca: Any, *hostnames: str) -> ssl.SSLContext:
    """A server context with a trustme certificate for ``hostnames`` from ``ca``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*hostnames).configure_cert(ctx)
    return ctx


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: "FaultServer"

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.owner._count_connection()
        return True

    def finish_request(self, request: Any, client_address: Any) -> None:
        ctx = self.owner.ssl_context
        if ctx is not None:
            request.settimeout(5.0)
            try:
                request = ctx.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return  # the client refused our certificate (or went away): nothing to serve
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hanging up mid-answer is what these tests do


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10.0  # an idle keep-alive connection is dropped after this
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle + delayed-ACK stalls

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    # -- plumbing ---------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        hs = {"Content-Type": "application/json", **(headers or {})}
        for k, v in hs.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        self._send(status, protocol.error_body(message), headers)

    def _handle(self, method: str) -> None:
        srv = self.server.owner
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        srv._record(RecordedRequest(method, self.path, dict(self.headers.items()), body, time.time()))
        if srv.token is not None and self.headers.get("Authorization") != f"Bearer {srv.token}":
            self._error(401, "missing or wrong bearer token")
            return
        route = protocol.parse_route(self.path)
        fault = srv._take_fault(route.kind if route else None)
        try:
            if fault is not None and self._fault(fault, method, route, body):
                return
            self._send(*self._answer(method, route, body))
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True

    # -- the correct server --------------------------------------------------------

    def _answer(self, method: str, route: protocol.Route | None, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        srv = self.server.owner
        model = srv.model
        if route is None:
            return 404, protocol.error_body(f"no route {self.path}"), {}
        if route.kind == "live":
            return 200, b"", {}
        if route.kind == "ready":
            return (200 if srv.ready else 503), b"", {}
        if route.kind == "server":
            ext = [protocol.BINARY_EXTENSION] if srv.binary else []
            return 200, json.dumps({"name": "fault-server", "version": "1", "extensions": ext}).encode(), {}
        if route.model != model.name or route.version not in (None, model.version):
            return 404, protocol.error_body(f"model {route.model!r} version {route.version!r} not found"), {}
        if route.kind == "model_ready":
            return 200, b"", {}
        if route.kind == "model":
            return 200, json.dumps(model.metadata()).encode(), {}
        if method != "POST":
            return 405, protocol.error_body("infer needs POST"), {}
        try:
            req = protocol.decode_request(body, dict(self.headers.items()))
        except protocol.ProtocolError as e:
            return 400, protocol.error_body(str(e)), {}
        want = {t["name"] for t in model.inputs}
        if set(req.inputs) != want:
            return 400, protocol.error_body(f"expected inputs {sorted(want)}, got {sorted(req.inputs)}"), {}
        outs = model.fn(req.inputs)
        if req.outputs:
            outs = {o.name: outs[o.name] for o in req.outputs if o.name in outs}
        binary = [n for n in outs if req.wants_binary(n)] if srv.binary else []
        data, headers = protocol.encode_response(model.name, outs, model_version=model.version, request_id=req.id, binary=binary)
        return 200, data, headers

    # -- faults ------------------------------------------------------------------------

    def _hold(self, seconds: float) -> None:
        self.server.owner._stop.wait(min(seconds, MAX_HOLD_S))

    def _fault(self, f: Fault, method: str, route: protocol.Route | None, body: bytes) -> bool:
        """Apply ``f``; True when it answered (or chose not to), False to serve normally."""
        srv = self.server.owner
        k = f.kind
        if k == "blackhole":
            self._hold(MAX_HOLD_S)
            self.close_connection = True
            return True
        if k == "slow":
            self._hold(f.delay_s)
            return False
        if k == "slow_body":
            status, data, headers = self._answer(method, route, body)
            self.send_response(status)
            for hk, hv in {"Content-Type": "application/json", **headers}.items():
                self.send_header(hk, hv)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.flush()
            for i in range(len(data)):
                if srv._stop.is_set():
                    break
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
                self._hold(f.interval_s)
            return True
        if k == "slow_headers":
            status, data, headers = self._answer(method, route, body)
            head = f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            head += "".join(f"{hk}: {hv}\r\n" for hk, hv in headers.items()) + "X-Padding: " + "p" * 200 + "\r\n\r\n"
            for ch in head.encode():
                if srv._stop.is_set():
                    break
                self.wfile.write(bytes([ch]))
                self.wfile.flush()
                self._hold(f.interval_s)
            self.wfile.write(data)
            self.close_connection = True
            return True
        if k == "flaky_500":
            if srv._flaky_count() % 2 == 1:
                self._error(500, "internal error (injected)")
                return True
            return False
        if k == "queue_full":
            self._error(503, "queue full", {"Retry-After": f.retry_after} if f.retry_after else None)
            return True
        if k == "rate_limited":
            self._error(429, "too many requests", {"Retry-After": f.retry_after or "1"})
            return True
        if k == "malformed_json":
            self._send(200, b'{"model_name": "mlp", "outputs": [{"name": "y", "shape": [1, 3], "data": [1.0, 2.0')
            return True
        if k in ("wrong_shape", "wrong_dtype", "missing_output"):
            req = protocol.decode_request(body, dict(self.headers.items()))
            outs = srv.model.fn(req.inputs)
            if k == "wrong_shape":
                outs = {n: v.reshape(-1) for n, v in outs.items()}
            elif k == "wrong_dtype":
                outs = {n: v.astype(np.float64) for n, v in outs.items()}
            else:
                outs = {"not_" + n: v for n, v in outs.items()}
            data, headers = protocol.encode_response(srv.model.name, outs, model_version=srv.model.version, request_id=req.id)
            self._send(200, data, headers)
            return True
        if k == "huge_body":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(f.size))
            self.end_headers()
            block = b" " * (64 << 10)
            sent = 0
            while sent < f.size and not srv._stop.is_set():
                self.wfile.write(block[: f.size - sent])
                sent += len(block)
            self.close_connection = True
            return True
        if k == "huge_chunked":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b" " * (64 << 10)
            for _ in range(f.size // len(block)):
                if srv._stop.is_set():
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            self.close_connection = True
            return True
        if k == "unauthorized":
            self._error(401, "unauthorized")
            return True
        if k == "redirect":
            self._send(302, b"", {"Location": f"http://127.0.0.1:{srv.port}/elsewhere{self.path}"})
            return True
        if k == "binary_refused":
            if self.headers.get(protocol.HEADER_LENGTH) is not None or self.headers.get("Content-Type") == "application/octet-stream":
                self._error(415, "binary tensor data is not supported")
                return True
            return False
        if k == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return True
        if k == "echo_auth":
            self._error(400, f"bad request; you sent Authorization: {self.headers.get('Authorization')}")
            return True
        return False


@dataclass
class FaultServer:
    """The server (module docs). ``token``: require this bearer token (401 otherwise).
    ``binary``: list and speak the binary extension. ``ssl_context``: serve https."""

    model: ServedModel = field(default_factory=mlp_model)
    token: str | None = None
    binary: bool = True
    ssl_context: ssl.SSLContext | None = None
    ready: bool = True

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._fault: Fault | None = None
        self._fault_left: int | None = None
        self._flaky = 0
        self._requests: list[RecordedRequest] = []
        self._connections = 0
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    def set_fault(self, fault: Fault | str | None) -> None:
        if isinstance(fault, str):
            fault = Fault(fault)
        with self._lock:
            self._fault = None if fault is None or fault.kind == "none" else fault
            self._fault_left = None if self._fault is None else self._fault.times
            self._flaky = 0

    def _take_fault(self, route_kind: str | None) -> Fault | None:
        with self._lock:
            f = self._fault
            if f is None or (f.routes is not None and route_kind not in f.routes):
                return None
            if self._fault_left is not None:
                if self._fault_left <= 0:
                    return None
                self._fault_left -= 1
            return f

    def _flaky_count(self) -> int:
        with self._lock:
            self._flaky += 1
            return self._flaky

    def _record(self, r: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(r)

    def _count_connection(self) -> None:
        with self._lock:
            self._connections += 1

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def connections(self) -> int:
        """TCP connections accepted so far."""
        with self._lock:
            return self._connections

    def infer_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/infer")]

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()
            self._connections = 0

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> "FaultServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
