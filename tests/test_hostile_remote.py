"""The remote client against hostile and odd v2 servers, all on 127.0.0.1:

- malformed answers (deep nesting, wrong field types, 400-digit numbers, huge shapes, ragged data,
  wrong datatype/length, binary header lies) are a typed RemoteProtocolError, never retried, and
  counted by the circuit breaker until it opens;
- the router's local latency estimate recovers (a cold first call, a slow spell, long idle);
- a server without versioned routes still works with ``remote_model`` (and the client remembers);
- a server that takes binary tensors without listing the extension gets binary after one probe.

Loops are bounded; time is an injected clock where the code takes one; no wall-clock thresholds.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pytest

import edge_sdk
from edge_sdk.errors import OptionsError
from edge_sdk.remote import protocol
from edge_sdk.remote.breaker import OPEN, CircuitBreaker, RemoteEvent
from edge_sdk.remote.client import RemoteClient
from edge_sdk.remote.errors import (
    CircuitOpenError,
    RemoteBusyError,
    RemoteProtocolError,
    RemoteRejectedError,
    RemoteUnavailableError,
)
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.remote.retry import RetryPolicy, parse_retry_after
from edge_sdk.remote.router import TRIGGERS, Router, RouterOptions
from edge_sdk.remote.session import RemoteSession, remote_model
from edge_sdk.serve import Server
from tests.remote_faults import Fault, FaultServer, package_model

ALLOWED = PrivacyPolicy("allowed")
PKG = edge_sdk.demo_package_path()
X = np.arange(8, dtype=np.float32).reshape(2, 4)
ONE_TRY = RetryPolicy(max_attempts=1)
Answer = tuple[int, bytes, Mapping[str, str]]


# ----------------------------------------------------------------------------------- a scripted server


class Scripted:
    """A v2 server on 127.0.0.1 whose every answer comes from ``answer(method, path, headers, body)``."""

    def __init__(self, answer: Callable[[str, str, Mapping[str, str], bytes], Answer]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10.0

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner._lock:
                    owner.requests.append((method, self.path, headers, body))
                status, data, hs = owner.answer(method, self.path, headers, body)
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **hs}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def infers(self) -> list[tuple[str, str, dict[str, str], bytes]]:
        with self._lock:
            return [r for r in self.requests if r[1].endswith("/infer")]

    def paths(self) -> list[str]:
        with self._lock:
            return [r[1] for r in self.requests]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> "Scripted":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SERVER_META = json.dumps({"name": "scripted", "version": "1", "extensions": []}).encode()
MLP_META = json.dumps(
    {"name": "mlp", "versions": ["1.0"], "platform": "t", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
     "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]}
).encode()  # fmt: skip


def canned(infer: Callable[[Mapping[str, str], bytes], Answer], meta: bytes = MLP_META, server: bytes = SERVER_META):
    """An answer function: GET /v2 -> ``server``, model metadata -> ``meta``, infer -> ``infer(headers, body)``."""

    def answer(method: str, path: str, headers: Mapping[str, str], body: bytes) -> Answer:
        if path == "/v2":
            return 200, server, {}
        if path.endswith("/infer"):
            return infer(headers, body)
        if path.startswith("/v2/models/"):
            return 200, meta, {}
        return 404, b'{"error": "no route"}', {}

    return answer


def fixed(body: bytes | str, headers: Mapping[str, str] | None = None, status: int = 200):
    data = body.encode() if isinstance(body, str) else body
    return canned(lambda h, b: (status, data, dict(headers or {})))


def out(**fields: Any) -> str:
    """A response with one output ``y`` (FP32 [2, 3] unless overridden)."""
    t = {"name": "y", "datatype": "FP32", "shape": [2, 3], "data": [0.0] * 6}
    t.update(fields)
    return json.dumps({"model_name": "mlp", "outputs": [t]})


DEEP = 100_000
BIG = "9" * 400
HUGE = "9" * 5000  # past Python's int-string conversion limit: json.loads raises ValueError
GOOD_BIN_HEAD = json.dumps(
    {"model_name": "mlp", "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}]}
).encode()
GOOD_BIN = GOOD_BIN_HEAD + np.zeros(6, np.float32).tobytes()

#: class -> malformed infer answers (body, headers); each one must be a RemoteProtocolError.
MALFORMED: dict[str, list[tuple[bytes | str, Mapping[str, str]]]] = {
    "deep_nesting": [
        ('{"model_name": "mlp", "outputs": ' + "[" * DEEP + "]" * DEEP + "}", {}),
        (out(data="[" * DEEP + "]" * DEEP).replace('"' + "[" * DEEP, "[" * DEEP).replace("]" * DEEP + '"', "]" * DEEP), {}),
        ('{"model_name": "mlp", "outputs": [], "parameters": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}", {}),
        ("[" * DEEP, {}),
    ],
    "wrong_types": [
        ('{"model_name": "mlp", "outputs": "y"}', {}),
        ('{"model_name": "mlp", "outputs": [1, 2]}', {}),
        ('{"model_name": 5, "outputs": []}', {}),
        ('["model_name", "mlp"]', {}),
        (out(shape="2x3"), {}),
        (out(shape=[2.0, 3.0]), {}),
        (out(shape=[True, 3]), {}),
        (out(datatype=["FP32"]), {}),
        (out(datatype=None), {}),
        (out(data={"a": 1}), {}),
        (out(data=["a"] * 6), {}),
        (out(parameters=[1]), {}),
        (out(name=7), {}),
        (json.dumps({"model_name": "mlp", "outputs": [], "id": 5}), {}),
        (json.dumps({"model_name": "mlp", "outputs": [], "id": {"a": [1]}}), {}),
    ],
    "big_numbers": [
        (out(data=None).replace("null", "[" + ", ".join([BIG] * 6) + "]"), {}),
        (out(datatype="INT64", data=None).replace("null", "[" + ", ".join([BIG] * 6) + "]"), {}),
        (out(shape=None).replace("null", f"[{BIG}, 3]"), {}),
        (out(data=None).replace("null", "[" + ", ".join([HUGE] * 6) + "]"), {}),
        ('{"model_name": "mlp", "outputs": [], "model_version": ' + HUGE + "}", {}),
    ],
    "huge_shapes": [
        (out(shape=[2**40, 2**40], data=[]), {}),
        (out(shape=[0, 10**30], data=[]), {}),
        (out(shape=[1] * 100, data=[0.0]), {}),
        (out(shape=[2**62, 4], data=[0.0] * 6), {}),
        (out(shape=[-1, 3]), {}),
    ],
    "ragged": [
        (out(data=[[0.0, 1.0, 2.0], [3.0, 4.0]]), {}),
        (out(data=[0.0, [1.0, 2.0], 3.0, 4.0, 5.0, 6.0]), {}),
        (out(data=[[0.0, 1.0], [2.0, [3.0]], [4.0, 5.0]]), {}),
        (out(data=[[[]], [[]]]), {}),
    ],
    "wrong_datatype_or_length": [
        (out(datatype="FP33"), {}),
        (out(datatype="FP64"), {}),
        (out(data=[0.0] * 5), {}),
        (out(data=[0.0] * 7), {}),
        (out(datatype="BOOL", data=[2, 0, 0, 0, 0, 0]), {}),
        (out(datatype="UINT8", data=[256, 0, 0, 0, 0, 0]), {}),
        (out(datatype="BYTES", data=[1, 2, 3, 4, 5, 6]), {}),
        (GOOD_BIN_HEAD + b"\0" * 20, {protocol.HEADER_LENGTH: str(len(GOOD_BIN_HEAD))}),
    ],
    "binary_header_lies": [
        (GOOD_BIN, {protocol.HEADER_LENGTH: str(len(GOOD_BIN) + 1)}),
        (GOOD_BIN, {protocol.HEADER_LENGTH: "-1"}),
        (GOOD_BIN, {protocol.HEADER_LENGTH: "1e3"}),
        (GOOD_BIN, {protocol.HEADER_LENGTH: BIG}),
        (GOOD_BIN, {protocol.HEADER_LENGTH: HUGE}),
        (GOOD_BIN, {protocol.HEADER_LENGTH: str(len(GOOD_BIN_HEAD) - 3)}),
        (GOOD_BIN, {protocol.HEADER_LENGTH: str(len(GOOD_BIN_HEAD) + 4)}),
        (GOOD_BIN, {}),  # binary data but no header length
        (GOOD_BIN_HEAD.replace(b"24", BIG.encode()) + np.zeros(6, np.float32).tobytes(), {protocol.HEADER_LENGTH: "?"}),
        (GOOD_BIN + b"extra", {protocol.HEADER_LENGTH: str(len(GOOD_BIN_HEAD))}),
    ],
}
CASES = [(cls, i, body, headers) for cls, items in MALFORMED.items() for i, (body, headers) in enumerate(items)]


def _fix_placeholders(body: bytes | str, headers: Mapping[str, str]) -> tuple[bytes | str, Mapping[str, str]]:
    if headers.get(protocol.HEADER_LENGTH) == "?":  # the lying binary_data_size case: its own (honest) header length
        b = body if isinstance(body, bytes) else body.encode()
        return b, {protocol.HEADER_LENGTH: str(len(b) - 24)}
    return body, headers


@pytest.mark.parametrize(("cls", "i", "body", "headers"), CASES, ids=[f"{c}-{i}" for c, i, _, _ in CASES])
def test_every_malformed_answer_is_a_typed_protocol_error_and_is_not_retried(cls, i, body, headers) -> None:
    body, headers = _fix_placeholders(body, headers)
    with Scripted(fixed(body, headers)) as srv:
        c = RemoteClient(srv.url, wire="json", privacy=ALLOWED, breaker=CircuitBreaker(failure_threshold=100))
        with pytest.raises(RemoteProtocolError) as ei:
            c.infer("mlp", {"x": X}, outputs=["y"], expected={"y": ("FP32", [2, 3])})
        assert type(ei.value).__name__ in ("RemoteProtocolError", "_WireRefused")
        assert ei.value.attempts == 1 and ei.value.status == 200
        assert len(srv.infers()) == 1  # the request ran: never sent again
        assert len(str(ei.value)) < 2000  # no 100 000-character echo of the answer


def test_twelve_malformed_answers_in_a_row_open_the_breaker() -> None:
    bodies = [b for b, h in (_fix_placeholders(b, h) for items in MALFORMED.values() for b, h in items[:2]) if not h]
    assert len(bodies) >= 12
    n = iter(range(10**6))
    now = [0.0]
    with Scripted(
        canned(lambda h, b: (200, (lambda x: x if isinstance(x, bytes) else x.encode())(bodies[next(n) % len(bodies)]), {}))
    ) as srv:
        events: list[RemoteEvent] = []
        breaker = CircuitBreaker(failure_threshold=5, clock=lambda: now[0])
        c = RemoteClient(srv.url, wire="json", privacy=ALLOWED, breaker=breaker, on_event=events.append)
        errors = []
        for _ in range(12):
            try:
                c.infer("mlp", {"x": X})
            except (RemoteProtocolError, CircuitOpenError) as e:
                errors.append(type(e))
        assert errors == [RemoteProtocolError] * 5 + [CircuitOpenError] * 7
        assert breaker.state == OPEN and len(srv.infers()) == 5
        assert [e.new_state for e in events if e.kind == "breaker"] == ["open"]
        assert not [e for e in events if e.kind == "retry"]  # a malformed answer is never retried


def test_malformed_metadata_and_error_bodies_are_typed() -> None:
    deep = "[" * DEEP + "]" * DEEP
    for meta in (
        '{"name": "mlp", "inputs": ' + deep + "}",
        '{"name": "mlp", "inputs": [{"name": "x", "datatype": "FP32", "shape": [' + BIG + "]}]}",
        '{"name": "mlp", "inputs": [{"name": "x", "datatype": "FP32", "shape": [' + HUGE + "]}]}",
        '{"name": "mlp", "inputs": [{"name": "x", "datatype": "FP32", "shape": ' + json.dumps([1] * 65) + "}]}",
        '{"name": "mlp", "inputs": {"x": 1}}',
        '{"name": ["mlp"]}',
        "[" * DEEP,
    ):
        with Scripted(canned(lambda h, b: (200, b"{}", {}), meta=meta.encode(), server=("[" * DEEP).encode())) as srv:
            c = RemoteClient(srv.url, privacy=ALLOWED, breaker=CircuitBreaker(failure_threshold=100))
            with pytest.raises(RemoteProtocolError):
                c.model_metadata("mlp")
            with pytest.raises(RemoteProtocolError):
                c.server_metadata()
    for status, cls in ((500, RemoteUnavailableError), (400, RemoteRejectedError), (404, RemoteRejectedError)):
        with Scripted(fixed("[" * DEEP + '{"error": 1}', status=status)) as srv:
            c = RemoteClient(srv.url, wire="json", privacy=ALLOWED, retry=ONE_TRY)
            with pytest.raises(cls) as ei:
                c.infer("mlp", {"x": X})
            assert type(ei.value) is cls and ei.value.status == status


@pytest.mark.parametrize("value", [BIG, HUGE, "²", "١٢", "Wed, 21 Oct 99999 07:28:00 GMT", "-5", "1.5"])
def test_a_hostile_retry_after_is_typed(value: str) -> None:
    ra = parse_retry_after(value, now=0.0)
    assert ra is None or ra >= 0
    with Scripted(fixed('{"error": "busy"}', {"Retry-After": value}, status=503)) as srv:
        c = RemoteClient(srv.url, wire="json", privacy=ALLOWED, sleep=lambda s: None, retry=RetryPolicy(max_attempts=2))
        with pytest.raises(RemoteUnavailableError) as ei:
            c.infer("mlp", {"x": X})
        if ra is not None and ra > 1000:
            assert isinstance(ei.value, RemoteBusyError) and len(srv.infers()) == 1


def test_a_malformed_binary_answer_after_binary_worked_is_not_sent_again() -> None:
    answers = iter([GOOD_BIN, b'{"model_name": "mlp", "outputs": [{"name": "y"'])
    listing = json.dumps({"name": "s", "version": "1", "extensions": [protocol.BINARY_EXTENSION]}).encode()
    with Scripted(canned(lambda h, b: (200, next(answers), {protocol.HEADER_LENGTH: str(len(GOOD_BIN_HEAD))}), server=listing)) as srv:
        c = RemoteClient(srv.url, privacy=ALLOWED)
        assert c.infer("mlp", {"x": X}).outputs["y"].shape == (2, 3) and c.wire == "binary"
        with pytest.raises(RemoteProtocolError):
            c.infer("mlp", {"x": X})
        assert len(srv.infers()) == 2 and c.wire == "binary"  # confirmed binary: a broken answer is not a wire refusal


# ----------------------------------------------------------------------------------- the router's estimate


class Clocked:
    """The real demo model, with an injected clock advanced by each call: the first ``cold`` calls
    take ``cold_ms``, then ``warm_ms`` (or whatever ``ms`` is set to)."""

    def __init__(self, model: Any, now: list[float], cold_ms: float, warm_ms: float, cold: int = 1) -> None:
        self.model, self.now, self.cold_ms, self.warm_ms, self.cold = model, now, cold_ms, warm_ms, cold
        self.calls = 0
        self.ms: float | None = None

    def predict_image(self, image: Any, **kw: Any) -> Any:
        r = self.model.predict_image(image, **kw)
        self.calls += 1
        ms = self.cold_ms if self.calls <= self.cold else self.warm_ms if self.ms is None else self.ms
        self.now[0] += ms / 1e3
        return r


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with edge_sdk.load(PKG, "generic-x86_64", variant="fp32-onnx", cache_dir=tmp_path_factory.mktemp("local")) as m:
        yield m


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with edge_sdk.load(PKG, "generic-x86_64", variant="fp32-onnx", cache_dir=tmp_path_factory.mktemp("srv")) as m:
        with Server([m]) as srv:
            yield srv


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    from edge_sdk.assets import demo_samples
    from edge_sdk.processing.image import load_image

    return load_image(demo_samples()[0])


def remote_for(url: str) -> Any:
    return remote_model(PKG, RemoteClient(url), privacy=ALLOWED, profile="generic-x86_64")


def test_a_cold_first_call_does_not_offload_everything(local, served, image) -> None:
    now = [0.0]
    slow_first = Clocked(local, now, cold_ms=500, warm_ms=2)
    router = Router(slow_first, remote_for(served.url), RouterOptions(latency_objective_ms=50, probe_every=5, probe_interval_s=None),
                    clock=lambda: now[0])  # fmt: skip
    where = [router.predict_image(image) for _ in range(30)]
    triggers = [router_trigger(r) for r in where]
    assert triggers[0] == "local_first" and triggers[1:6] == ["latency_objective"] * 5 and triggers[6] == "latency_probe"
    assert triggers[7:] == ["local_first"] * 23
    assert router.local_service_ms == pytest.approx(2.0)
    assert router.requests_by_trigger == {("local", "local_first"): 24, ("remote", "latency_objective"): 5, ("local", "latency_probe"): 1}
    assert where[1].top1.label == where[0].top1.label  # the remote is the same model


def router_trigger(r: Any) -> str:
    if r.served_by == "remote":
        return "latency_objective" if r.reason.startswith("latency objective at risk") else r.reason
    return "latency_probe" if r.reason.startswith("latency probe") else "local_first" if r.reason == "local first" else r.reason


def test_without_cold_handling_or_probes_the_router_offloads_for_good(local, served, image) -> None:
    now = [0.0]
    slow_first = Clocked(local, now, cold_ms=500, warm_ms=2)
    opts = RouterOptions(latency_objective_ms=50, cold_calls=0, probe_every=None, probe_interval_s=None)
    router = Router(slow_first, remote_for(served.url), opts, clock=lambda: now[0])
    served_by = [router.predict_image(image).served_by for _ in range(20)]
    now[0] += 12.0  # idle: nothing changes without a probe
    served_by.append(router.predict_image(image).served_by)
    assert served_by == ["local"] + ["remote"] * 20  # the bug the options above fix: what the defaults avoid


def test_the_estimate_recovers_after_a_slow_spell_by_time(local, served, image) -> None:
    now = [0.0]
    model = Clocked(local, now, cold_ms=5, warm_ms=5, cold=0)
    opts = RouterOptions(latency_objective_ms=50, probe_every=None, probe_interval_s=10.0)
    router = Router(model, remote_for(served.url), opts, clock=lambda: now[0])
    assert router.predict_image(image).served_by == "local"
    model.ms = 400.0  # a slow spell: thermal throttling, a noisy neighbour
    for _ in range(6):
        router.predict_image(image)  # local (at 5 ms predicted) until the estimate crosses 50 ms
    assert router.local_service_ms > 50
    offloaded = [router.predict_image(image).served_by for _ in range(10)]
    assert offloaded == ["remote"] * 10  # no time passed: no probe
    model.ms = 2.0  # fast again
    probes = 0
    for _ in range(10):  # bounded: each round is 12 s of idle, then one request
        now[0] += 12.0
        r = router.predict_image(image)
        if r.reason.startswith("latency probe"):
            probes += 1
            assert r.served_by == "local" and "s old" in r.reason
        elif r.served_by == "local":
            break
    else:
        pytest.fail("the estimate never recovered")
    assert 1 <= probes <= 6 and router.local_service_ms < 50
    assert [router.predict_image(image).served_by for _ in range(5)] == ["local"] * 5


def test_a_probe_that_fails_frees_the_next_probe(local, served, image) -> None:
    now = [0.0]

    class Flaky(Clocked):
        fail = False

        def predict_image(self, image: Any, **kw: Any) -> Any:
            if self.fail:
                raise RuntimeError("local runtime hiccup")
            return super().predict_image(image, **kw)

    model = Flaky(local, now, cold_ms=500, warm_ms=2)
    router = Router(model, remote_for(served.url), RouterOptions(latency_objective_ms=50, probe_every=2, probe_interval_s=None),
                    clock=lambda: now[0])  # fmt: skip
    router.predict_image(image)
    assert [router.predict_image(image).served_by for _ in range(2)] == ["remote"] * 2
    model.fail = True
    r = router.predict_image(image)  # the probe fails locally: offloaded (local_error), the probe slot is freed
    assert r.served_by == "remote" and r.reason.startswith("local failed (RuntimeError")
    model.fail = False
    seq = [router_trigger(router.predict_image(image)) for _ in range(5)]
    assert "latency_probe" in seq[:3] and seq[-1] == "local_first"


def test_router_probe_options_are_checked() -> None:
    assert "latency_probe" in TRIGGERS
    for bad in ({"probe_every": 0}, {"probe_every": 1.5}, {"probe_interval_s": 0}, {"probe_interval_s": float("nan")}, {"cold_calls": -1}):
        with pytest.raises(OptionsError):
            RouterOptions(**bad)


# ----------------------------------------------------------------------------------- unversioned servers


class Unversioned:
    """A third-party v2 server serving the demo model (onnxruntime) on unversioned routes only:
    every ``/versions/`` path gets ``status``; its metadata lists no versions."""

    def __init__(self, status: int) -> None:
        self.model = package_model(PKG)
        meta = self.model.metadata()
        del meta["versions"]
        self.meta = json.dumps(meta).encode()
        self.status = status
        self.srv = Scripted(self.answer)

    def answer(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Answer:
        if "/versions/" in path:
            return self.status, b'{"detail": "Not Found"}', {}
        if path == "/v2":
            return 200, SERVER_META, {}
        if path == f"/v2/models/{self.model.name}":
            return 200, self.meta, {}
        if path == f"/v2/models/{self.model.name}/infer" and method == "POST":
            req = protocol.decode_request(body, headers)
            data, hs = protocol.encode_response(self.model.name, self.model.fn(req.inputs), request_id=req.id)
            return 200, data, hs
        return 404, b'{"detail": "Not Found"}', {}


@pytest.mark.parametrize("status", [501, 404, 405, 400])
def test_a_server_without_versioned_routes_serves_remote_model(local, image, status: int) -> None:
    u = Unversioned(status)
    with u.srv as srv:
        c = RemoteClient(srv.url, retry=ONE_TRY)
        with remote_model(PKG, c, privacy=ALLOWED, profile="generic-x86_64") as remote:
            for _ in range(3):
                assert remote.predict_image(image).top1.label == local.predict_image(image).top1.label
            assert not c.serves_versions(remote.manifest.name)
            again = RemoteSession(c, remote.manifest, privacy=ALLOWED)  # a second session on the same client
            again.run({"image": local.prepare_image(image).feeds["image"]})
        paths = srv.paths()
        assert sum("/versions/" in p for p in paths) == 1  # asked once, then remembered
        assert [p for p in paths if p.endswith("/infer")] == ["/v2/models/shapes-classifier/infer"] * 4


def test_a_server_failing_the_versioned_route_for_other_reasons_is_not_taken_for_unversioned(image) -> None:
    u = Unversioned(503)
    with u.srv as srv:
        c = RemoteClient(srv.url, retry=ONE_TRY)
        with remote_model(PKG, c, privacy=ALLOWED, profile="generic-x86_64") as remote:
            with pytest.raises(RemoteUnavailableError):
                remote.predict_image(image)
            assert c.serves_versions(remote.manifest.name) and srv.infers() == []


# ----------------------------------------------------------------------------------- binary not listed


def kinds(srv: FaultServer) -> list[str]:
    return ["binary" if r.header(protocol.HEADER_LENGTH) else "json" for r in srv.infer_requests()]


def test_a_server_taking_binary_without_listing_it_gets_binary_after_one_probe() -> None:
    with FaultServer(binary=False) as srv:  # lists no extension, decodes binary requests, answers JSON
        events: list[RemoteEvent] = []
        c = RemoteClient(srv.url, privacy=ALLOWED, on_event=events.append)
        want = c.infer("mlp", {"x": X}).outputs["y"]
        assert c.wire == "json"
        for _ in range(5):
            np.testing.assert_allclose(c.infer("mlp", {"x": X}).outputs["y"], want, rtol=1e-6)
        assert c.wire == "binary" and kinds(srv) == ["json"] + ["binary"] * 5
        assert [(e.kind, e.details.get("wire")) for e in events] == [("wire", "binary")]
        assert [r.path for r in srv.requests].count("/v2") == 1


def test_a_probe_refused_falls_back_once_and_json_is_kept() -> None:
    with FaultServer(binary=False) as srv:
        srv.set_fault(Fault("binary_refused"))
        events: list[RemoteEvent] = []
        c = RemoteClient(srv.url, privacy=ALLOWED, on_event=events.append)
        for _ in range(5):
            assert c.infer("mlp", {"x": X}).outputs["y"].shape == (2, 3)
        assert c.wire == "json" and kinds(srv) == ["json", "binary", "json", "json", "json", "json"]
        assert [(e.kind, e.details.get("wire")) for e in events] == [("wire", "json")] and "415" in events[0].reason


def test_a_probe_refused_with_500_like_mlserver_falls_back() -> None:
    with Scripted(canned(lambda h, b: (500, b'{"detail": "boom"}', {}) if protocol.HEADER_LENGTH.lower() in h else
                         (200, out().encode(), {}))) as srv:  # fmt: skip
        c = RemoteClient(srv.url, privacy=ALLOWED)
        for _ in range(4):
            c.infer("mlp", {"x": X})
        got = ["binary" if protocol.HEADER_LENGTH.lower() in h else "json" for _, _, h, _ in srv.infers()]
        assert c.wire == "json" and got == ["json", "binary", "json", "json", "json"]


def test_an_inconclusive_probe_is_tried_again_and_forced_json_never_probes() -> None:
    with FaultServer(binary=False) as srv:
        c = RemoteClient(srv.url, privacy=ALLOWED, retry=ONE_TRY)
        c.infer("mlp", {"x": X})
        srv.set_fault(Fault("queue_full", times=1))
        with pytest.raises(RemoteUnavailableError):
            c.infer("mlp", {"x": X})  # the probe met a 503: nothing learnt
        assert c.wire == "json"
        c.infer("mlp", {"x": X})
        assert c.wire == "binary" and kinds(srv) == ["json", "binary", "binary"]
    with FaultServer(binary=False) as srv:
        c = RemoteClient(srv.url, privacy=ALLOWED, wire="json")
        for _ in range(4):
            c.infer("mlp", {"x": X})
        assert c.wire == "json" and kinds(srv) == ["json"] * 4
