"""The v2 REST client: wire formats, metadata check, retries, budget, breaker, TLS, tokens, privacy,
and RemoteSession / remote_model against a local model. Every server is tests/remote_faults.py on
127.0.0.1."""

from __future__ import annotations

import email.utils
import hashlib
import logging
import ssl
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from remote_faults import MLP_B, MLP_W, Fault, FaultServer, ServedModel, package_model, tls_context

from edge_sdk.package import Manifest
from edge_sdk.remote import protocol
from edge_sdk.remote.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, RemoteEvent
from edge_sdk.remote.client import RemoteClient, RemoteEndpoint
from edge_sdk.remote.errors import (
    CircuitOpenError,
    PrivacyError,
    RemoteAuthError,
    RemoteBusyError,
    RemoteConfigError,
    RemoteError,
    RemoteIncompatibleError,
    RemoteProtocolError,
    RemoteRejectedError,
    RemoteTLSError,
    RemoteUnavailableError,
)
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.remote.retry import RetryBudget, RetryPolicy, parse_retry_after
from edge_sdk.remote.session import RemoteSession, check_compatible, remote_model

ALLOWED = PrivacyPolicy("allowed")
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
Y = X @ MLP_W + MLP_B


@pytest.fixture
def server():
    with FaultServer() as srv:
        yield srv


def client(srv: FaultServer, **kw: Any) -> RemoteClient:
    kw.setdefault("privacy", ALLOWED)
    kw.setdefault("deadline_s", 5.0)
    return RemoteClient(srv.url, **kw)


def mlp_manifest(**changes: Any) -> Manifest:
    d: dict[str, Any] = {
        "schema": 1,
        "name": "mlp",
        "version": "1.0",
        "task": "raw",
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4], "dims": {"batch": [1, 8]}}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 3]}],
        "variants": [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32", "sha256": "0" * 64, "size": 1}],
    }
    d.update(changes)
    return Manifest.from_dict(d)


# ----------------------------------------------------------------------------------- happy path


def test_health_and_metadata(server: FaultServer) -> None:
    c = client(server)
    assert c.live() and c.ready() and c.model_ready("mlp") and c.model_ready("mlp", "1.0")
    assert not c.model_ready("nope") and not c.model_ready("mlp", "9")
    server.ready = False
    assert not c.ready()
    meta = c.server_metadata()
    assert meta.name == "fault-server" and protocol.BINARY_EXTENSION in meta.extensions
    m = c.model_metadata("mlp")
    assert (m.name, m.versions, m.inputs[0].name, m.inputs[0].datatype, m.inputs[0].shape) == ("mlp", ("1.0",), "x", "FP32", (-1, 4))
    with pytest.raises(RemoteRejectedError) as ei:
        c.model_metadata("nope")
    assert ei.value.status == 404 and "not found" in str(ei.value)


@pytest.mark.parametrize("binary_server", [True, False])
def test_infer_binary_when_offered_else_json(binary_server: bool) -> None:
    with FaultServer(binary=binary_server) as srv:
        c = client(srv)
        r = c.infer("mlp", {"x": X}, version="1.0", outputs=["y"], expected={"y": ("FP32", [2, 3])})
        np.testing.assert_allclose(r.outputs["y"], Y, rtol=1e-6)
        assert r.model_name == "mlp" and r.model_version == "1.0"
        assert c.wire == ("binary" if binary_server else "json")
        inf = srv.infer_requests()[-1]
        assert inf.path == "/v2/models/mlp/versions/1.0/infer"
        if binary_server:
            assert inf.header("Content-Type") == "application/octet-stream" and inf.header(protocol.HEADER_LENGTH)
            assert X.tobytes() in inf.body
        else:
            assert inf.header("Content-Type") == "application/json" and inf.header(protocol.HEADER_LENGTH) is None
        # one negotiation (GET /v2), then infers only; keep-alive: one connection
        c.infer("mlp", {"x": X})
        assert [r.path for r in srv.requests].count("/v2") == 1
        assert srv.connections == 1


def test_binary_refused_falls_back_to_json_once_and_remembers(server: FaultServer) -> None:
    events: list[RemoteEvent] = []
    server.set_fault(Fault("binary_refused"))
    c = client(server, on_event=events.append)
    np.testing.assert_allclose(c.infer("mlp", {"x": X}).outputs["y"], Y, rtol=1e-6)
    first = server.infer_requests()
    assert [r.header("Content-Type") for r in first] == ["application/octet-stream", "application/json"]
    assert c.wire == "json" and [e.kind for e in events] == ["wire"] and "415" in events[0].reason
    c.infer("mlp", {"x": X})
    assert [r.header("Content-Type") for r in server.infer_requests()[2:]] == ["application/json"]


def test_binary_answer_that_does_not_parse_falls_back_but_a_wrong_shape_does_not(server: FaultServer) -> None:
    server.set_fault(Fault("malformed_json", times=1))
    c = client(server)
    np.testing.assert_allclose(c.infer("mlp", {"x": X}).outputs["y"], Y, rtol=1e-6)
    assert c.wire == "json"
    server.set_fault(Fault("wrong_shape", times=1))
    c2 = client(server)
    with pytest.raises(RemoteProtocolError, match="shape"):
        c2.infer("mlp", {"x": X}, expected={"y": ("FP32", [2, 3])})
    assert c2.wire == "binary"


def test_forced_json_wire_skips_negotiation(server: FaultServer) -> None:
    c = client(server, wire="json")
    c.infer("mlp", {"x": X})
    assert [r.path for r in server.requests] == ["/v2/models/mlp/infer"]


# ----------------------------------------------------------------------------------- metadata check


def test_check_compatible_accepts_the_served_model(server: FaultServer) -> None:
    meta = check_compatible(client(server), mlp_manifest())
    assert meta.name == "mlp"


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"version": "2.0"}, "version: manifest '2.0' is not among"),
        ({"name": "other"}, "not found"),
        (
            {"inputs": [{"name": "x", "dtype": "float64", "shape": ["batch", 4], "dims": {"batch": [1, 8]}}]},
            "datatype: manifest float64 (FP64), server FP32",
        ),
        (
            {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 5], "dims": {"batch": [1, 8]}}]},
            "input 'x' dim 1: manifest 5, server 4",
        ),
        ({"inputs": [{"name": "x", "dtype": "float32", "shape": [4]}]}, "input 'x' rank"),
        ({"inputs": [{"name": "z", "dtype": "float32", "shape": [1, 4]}]}, "inputs ['z'] of the manifest are not served"),
        ({"outputs": [{"name": "w", "dtype": "float32", "shape": ["batch", 3]}]}, "outputs ['w'] of the manifest are not served"),
    ],
)
def test_check_compatible_names_the_difference(server: FaultServer, changes: dict[str, Any], needle: str) -> None:
    with pytest.raises((RemoteIncompatibleError, RemoteRejectedError), match=None) as ei:
        check_compatible(client(server), mlp_manifest(**changes))
    assert needle in str(ei.value)


def test_check_compatible_server_fixed_dim_against_a_bounded_input() -> None:
    served = ServedModel(
        "mlp",
        "1.0",
        [{"name": "x", "datatype": "FP32", "shape": [1, 4]}],
        [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
        lambda i: {},
    )
    with FaultServer(model=served) as srv:
        with pytest.raises(RemoteIncompatibleError, match=r"dynamic batch in \[1, 8\], server fixes it at 1"):
            check_compatible(client(srv), mlp_manifest())
        fixed = {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4], "dims": {"batch": [1, 1]}}]}
        check_compatible(client(srv), mlp_manifest(**fixed))


# ----------------------------------------------------------------------------------- retries


def test_backoff_full_jitter_bounds() -> None:
    p = RetryPolicy(base_s=0.1, cap_s=1.0)
    assert [p.backoff_cap(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    rng = np.random.default_rng(0)
    for n in range(8):
        draws = [p.backoff(n, lambda: float(rng.random())) for _ in range(200)]
        assert all(0.0 <= d < p.backoff_cap(n) for d in draws)
        assert max(draws) > 0.8 * p.backoff_cap(n) and min(draws) < 0.2 * p.backoff_cap(n)  # full jitter: the whole range
    assert p.backoff(3, lambda: 0.0) == 0.0


def test_client_waits_full_jitter_backoff_between_retries(server: FaultServer) -> None:
    server.set_fault(Fault("queue_full", times=3))
    slept: list[float] = []
    draws = iter([0.5, 0.25, 0.75])
    events: list[RemoteEvent] = []
    c = client(
        server,
        wire="json",
        retry=RetryPolicy(max_attempts=4, base_s=0.1, cap_s=1.0),
        sleep=slept.append,
        rand=lambda: next(draws),
        on_event=events.append,
    )
    np.testing.assert_allclose(c.infer("mlp", {"x": X}).outputs["y"], Y, rtol=1e-6)
    assert slept == pytest.approx([0.5 * 0.1, 0.25 * 0.2, 0.75 * 0.4])
    assert len(server.infer_requests()) == 4
    assert [(e.kind, e.attempt) for e in events] == [("retry", 1), ("retry", 2), ("retry", 3)]


def test_retry_budget_accounting() -> None:
    now = [0.0]
    b = RetryBudget(ratio=0.1, min_retries=3, window_s=10.0, clock=lambda: now[0])
    assert [b.try_withdraw() for _ in range(4)] == [True, True, True, False]  # a quiet client: the minimum
    for _ in range(100):
        b.deposit()
    assert sum(b.try_withdraw() for _ in range(50)) == 10  # 3 + 10 % of 100 = 13 in the window, 3 spent
    assert b.snapshot() == {"requests": 100, "retries": 13, "available": 0}
    now[0] = 10.5  # the window slides past everything
    assert b.snapshot()["requests"] == 0 and b.try_withdraw()


def test_retry_budget_limits_a_client_in_an_outage(server: FaultServer) -> None:
    server.set_fault("queue_full")
    policy = RetryPolicy(max_attempts=5, base_s=0.001, cap_s=0.001, budget_ratio=0.1, budget_min_retries=2)
    c = client(server, wire="json", retry=policy, breaker=CircuitBreaker(failure_threshold=1000, min_calls=1000))
    for _ in range(20):
        with pytest.raises(RemoteUnavailableError):
            c.infer("mlp", {"x": X})
    assert len(server.infer_requests()) <= 20 + 2 + 2  # 20 requests + at most 2 + 10 % of 20 retries
    assert c.retry_budget.snapshot()["retries"] == 4


def test_retry_after_both_forms(server: FaultServer) -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(email.utils.formatdate(1_000_030.0, usegmt=True), now=1_000_000.0) == pytest.approx(30.0)
    assert parse_retry_after(email.utils.formatdate(1_000_030.0), now=1_000_000.0) == pytest.approx(30.0)  # "-0000" form
    assert parse_retry_after(email.utils.formatdate(999_000.0, usegmt=True), now=1_000_000.0) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after("-3") is None and parse_retry_after(None) is None

    wall = 1_800_000_000.0
    for value, wait in (("2", 2.0), (email.utils.formatdate(wall + 3, usegmt=True), 3.0)):
        server.set_fault(Fault("rate_limited", retry_after=value, times=1))
        slept: list[float] = []
        c = client(server, wire="json", sleep=slept.append, wallclock=lambda: wall)
        c.infer("mlp", {"x": X})
        assert slept == pytest.approx([wait])


def test_retry_after_past_the_deadline_fails_fast(server: FaultServer) -> None:
    server.set_fault(Fault("rate_limited", retry_after="60"))
    slept: list[float] = []
    c = client(server, wire="json", sleep=slept.append)
    t = time.monotonic()
    with pytest.raises(RemoteBusyError) as ei:
        c.infer("mlp", {"x": X}, deadline_s=5.0)
    assert time.monotonic() - t < 1.0 and slept == []
    assert ei.value.retry_after_s == 60.0 and ei.value.status == 429 and len(server.infer_requests()) == 1


@pytest.mark.parametrize(("kind", "cls", "status"), [("unauthorized", RemoteAuthError, 401), ("malformed_json", RemoteProtocolError, 200)])
def test_never_retried(server: FaultServer, kind: str, cls: type, status: int) -> None:
    server.set_fault(kind)
    with pytest.raises(cls) as ei:
        client(server, wire="json").infer("mlp", {"x": X})
    assert ei.value.status == status and ei.value.attempts == 1 and len(server.infer_requests()) == 1


def test_a_bad_request_is_rejected_not_retried(server: FaultServer) -> None:
    with pytest.raises(RemoteRejectedError) as ei:
        client(server, wire="json").infer("mlp", {"nope": X})
    assert ei.value.status == 400 and len(server.infer_requests()) == 1


# ----------------------------------------------------------------------------------- breaker


def test_breaker_transitions_and_events() -> None:
    now, wall = [0.0], [1000.0]
    events: list[RemoteEvent] = []
    b = CircuitBreaker(failure_threshold=3, open_s=5.0, clock=lambda: now[0], wallclock=lambda: wall[0])
    b.endpoint, b.on_event = "http://x", events.append
    for _ in range(2):
        b.allow()
        b.record_failure("boom")
    b.allow()
    b.record_success()  # resets the consecutive count
    for _ in range(3):
        b.allow()
        b.record_failure("HTTP 503")
    assert b.state == OPEN and [(e.old_state, e.new_state) for e in events] == [(CLOSED, OPEN)]
    assert "3 consecutive failures" in events[0].reason and events[0].time == 1000.0 and events[0].endpoint == "http://x"
    now[0] = 4.9
    with pytest.raises(CircuitOpenError) as ei:
        b.allow()
    assert ei.value.retry_in_s == pytest.approx(0.1)
    now[0], wall[0] = 5.0, 1005.0
    b.allow()  # the probe
    assert b.state == HALF_OPEN and events[-1].new_state == HALF_OPEN and events[-1].time == 1005.0
    with pytest.raises(CircuitOpenError, match="probe is in flight"):
        b.allow()
    b.record_failure("still down")
    assert b.state == OPEN and "probe failed: still down" in events[-1].reason
    now[0] = 10.0
    b.allow()
    b.record_success()
    assert b.state == CLOSED and [e.new_state for e in events] == [OPEN, HALF_OPEN, OPEN, HALF_OPEN, CLOSED]
    assert all(e.kind == "breaker" and e.reason for e in events)


def test_breaker_opens_on_failure_ratio() -> None:
    now = [0.0]
    b = CircuitBreaker(failure_threshold=100, failure_ratio=0.5, min_calls=10, window_s=30.0, clock=lambda: now[0])
    for i in range(9):
        b.allow()
        if i % 2 == 0:
            b.record_failure("x")
        else:
            b.record_success()
    assert b.state == CLOSED  # 5 of 9: under min_calls
    b.allow()
    b.record_success()
    assert b.state == CLOSED  # 5 of 10, but only a failure can open it
    b.allow()
    b.record_failure("HTTP 500")
    assert b.state == OPEN


def test_breaker_probe_released_when_it_never_reached_the_server() -> None:
    now = [0.0]
    b = CircuitBreaker(failure_threshold=1, open_s=1.0, clock=lambda: now[0])
    b.allow()
    b.record_failure("x")
    now[0] = 2.0
    b.allow()
    b.release()
    b.allow()  # another probe may go


def test_open_breaker_fails_fast_without_network(server: FaultServer) -> None:
    server.set_fault("queue_full")
    events: list[RemoteEvent] = []
    c = client(
        server,
        wire="json",
        retry=RetryPolicy(max_attempts=1),
        breaker=CircuitBreaker(failure_threshold=2, open_s=0.3),
        on_event=events.append,
    )
    for _ in range(2):
        with pytest.raises(RemoteUnavailableError):
            c.infer("mlp", {"x": X})
    n_req, n_conn = len(server.requests), server.connections
    t = time.monotonic()
    for _ in range(20):
        with pytest.raises(CircuitOpenError):
            c.infer("mlp", {"x": X})
    assert time.monotonic() - t < 0.2
    assert (len(server.requests), server.connections) == (n_req, n_conn)
    server.set_fault(None)
    time.sleep(0.35)
    c.infer("mlp", {"x": X})  # the probe closes it
    assert c.breaker.state == CLOSED
    assert [(e.old_state, e.new_state) for e in events if e.kind == "breaker"] == [(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]


def test_a_failing_observer_does_not_break_requests(server: FaultServer) -> None:
    def bad(_: RemoteEvent) -> None:
        raise RuntimeError("observer bug")

    server.set_fault(Fault("queue_full", times=1))
    client(server, wire="json", on_event=bad, sleep=lambda s: None).infer("mlp", {"x": X})


# ----------------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Any:
    trustme = pytest.importorskip("trustme", reason="trustme is in the dev extra")
    ca = trustme.CA()
    ca.path = tmp_path_factory.mktemp("ca") / "ca.pem"  # type: ignore[attr-defined]
    ca.cert_pem.write_to_path(str(ca.path))  # type: ignore[attr-defined]
    return ca


def test_tls_verified_and_token_sent(ca: Any) -> None:
    with FaultServer(ssl_context=tls_context(ca, "127.0.0.1"), token="s3cret-token") as srv:
        c = client(srv, ca_file=str(ca.path), token="s3cret-token")
        np.testing.assert_allclose(c.infer("mlp", {"x": X}).outputs["y"], Y, rtol=1e-6)
        assert srv.requests[-1].header("Authorization") == "Bearer s3cret-token"
        with pytest.raises(RemoteTLSError, match="certificate verification failed"):
            client(srv, token="s3cret-token").live()  # the system CAs do not know this one
        assert c.live()


def test_tls_wrong_host_refused_before_any_byte(ca: Any) -> None:
    with FaultServer(ssl_context=tls_context(ca, "wrong.example")) as srv:
        with pytest.raises(RemoteTLSError, match="not valid for '127.0.0.1'") as ei:
            client(srv, ca_file=str(ca.path), token="tok").infer("mlp", {"x": X})
        assert isinstance(ei.value, RemoteAuthError) and srv.requests == []


def test_tls_pinning(ca: Any) -> None:
    with FaultServer(ssl_context=tls_context(ca, "127.0.0.1")) as srv:
        der = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", srv.port)))
        pin = hashlib.sha256(der).hexdigest()
        coloned = ":".join(pin[i : i + 2] for i in range(0, 64, 2)).upper()
        assert client(srv, ca_file=str(ca.path), pins_sha256=[coloned]).ready()
        srv.clear()
        other = hashlib.sha256(b"another certificate").hexdigest()
        with pytest.raises(RemoteTLSError, match="matches none of the pins"):
            client(srv, ca_file=str(ca.path), pins_sha256=[other]).infer("mlp", {"x": X})
        assert srv.requests == []
        with pytest.raises(RemoteConfigError):
            client(srv, ca_file=str(ca.path), pins_sha256=["abc"])


# ----------------------------------------------------------------------------------- tokens


def test_token_only_over_tls_or_loopback() -> None:
    for url in ("http://example.com", "http://10.0.0.5:8000", "http://127.0.0.1.example.com"):
        with pytest.raises(RemoteConfigError, match="refusing to send a bearer token") as ei:
            RemoteClient(url, token="tok-123")
        assert "tok-123" not in str(ei.value)
    for url in ("https://example.com", "http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "http://127.0.0.2"):
        RemoteClient(url, token="tok-123")
    with pytest.raises(RemoteConfigError, match="credentials in the URL"):
        RemoteClient("https://user:pw@example.com")
    with pytest.raises(RemoteConfigError):
        RemoteClient("http://127.0.0.1", token="a\r\nX-Evil: 1")
    assert "tok-123" not in repr(RemoteClient("https://example.com", token="tok-123"))
    assert RemoteEndpoint.parse("https://h.example/prefix/v2/").base_path == "/prefix"


def test_token_never_in_logs_or_errors(server: FaultServer, caplog: pytest.LogCaptureFixture) -> None:
    token = "tok-SECRET-1234567890"
    server.token = token
    caplog.set_level(logging.DEBUG, logger="edge_sdk")
    events: list[RemoteEvent] = []
    c = client(server, token=token, on_event=events.append, sleep=lambda s: None, retry=RetryPolicy(max_attempts=2))
    c.infer("mlp", {"x": X})
    texts: list[str] = []
    for kind in ("echo_auth", "queue_full", "redirect", "malformed_json", "unauthorized", "wrong_dtype"):
        server.set_fault(kind)
        with pytest.raises(RemoteError) as ei:
            c.infer("mlp", {"x": X}, expected={"y": ("FP32", [2, 3])})
        texts += [str(ei.value), repr(ei.value), repr(ei.value.__cause__), repr(ei.value.__context__)]
    assert any("Bearer ***" in t for t in texts)  # the echoing server was scrubbed
    texts += [r.getMessage() for r in caplog.records] + [repr(e) for e in events] + [repr(c)]
    assert caplog.records and all(token not in t for t in texts)
    assert all(r.header("Authorization") == f"Bearer {token}" for r in server.requests)  # it was sent, to this server only


def test_redirect_is_never_followed(server: FaultServer) -> None:
    server.set_fault(Fault("redirect", routes=None))
    c = client(server, token="tok")
    with pytest.raises(RemoteProtocolError, match="redirects are never followed"):
        c.infer("mlp", {"x": X})
    with pytest.raises(RemoteProtocolError):
        c.live()
    assert [r.path for r in server.requests] == ["/v2", "/v2/health/live"]  # the redirect target was never asked


# ----------------------------------------------------------------------------------- privacy


def test_privacy_never_sends_nothing(server: FaultServer, demo_package: Path) -> None:
    c = RemoteClient(server.url)  # no policy given: "never"
    with pytest.raises(PrivacyError, match="'never'"):
        c.infer("mlp", {"x": X})
    with pytest.raises(PrivacyError):
        client(server, privacy={"other": ALLOWED}).infer("mlp", {"x": X})
    with FaultServer(model=package_model(demo_package)) as demo_srv:
        with remote_model(demo_package, RemoteClient(demo_srv.url), privacy=PrivacyPolicy()) as model:
            with pytest.raises(PrivacyError):
                model.predict(np.zeros((1, 3, 32, 32), np.float32))
        assert demo_srv.requests == [] and demo_srv.connections == 0
    assert server.requests == [] and server.connections == 0


def test_privacy_allowlist_sends_only_the_allowed_input() -> None:
    served = ServedModel(
        "faces",
        "1",
        [{"name": "embedding", "datatype": "FP32", "shape": [1, 4]}],
        [{"name": "id", "datatype": "FP32", "shape": [1, 1]}],
        lambda ins: {"id": ins["embedding"].sum(axis=1, keepdims=True)},
    )
    frame = np.full((1, 8, 8, 3), 201, np.uint8)
    emb = np.array([[0.25, 0.5, 0.75, 1.0]], np.float32)
    policy = PrivacyPolicy("allowlist", allow_inputs=("embedding",))
    with FaultServer(model=served) as srv:
        c = client(srv, privacy={"faces": policy})
        with pytest.raises(PrivacyError, match=r"input\(s\) \['frame'\] may not leave the device"):
            c.infer("faces", {"embedding": emb, "frame": frame})
        assert srv.requests == [] and srv.connections == 0
        assert c.infer("faces", {"embedding": emb}).outputs["id"][0, 0] == pytest.approx(2.5)
        sent = srv.infer_requests()
        assert len(sent) == 1
        assert set(protocol.decode_request(sent[0].body, sent[0].headers).inputs) == {"embedding"}
        assert all(frame.tobytes()[:32] not in r.body for r in srv.requests)


def test_privacy_region() -> None:
    eu = PrivacyPolicy("allowed", regions=("eu-west", "eu-central"))
    with FaultServer() as srv:
        with pytest.raises(PrivacyError, match="declares none"):
            client(srv, privacy=eu).infer("mlp", {"x": X})
        with pytest.raises(PrivacyError, match="'us-east' is not one of"):
            client(srv, privacy=eu, region="us-east").infer("mlp", {"x": X})
        assert srv.connections == 0
        client(srv, privacy=eu, region="eu-central").infer("mlp", {"x": X})
    with pytest.raises(ValueError):
        PrivacyPolicy("allowlist")
    with pytest.raises(ValueError):
        PrivacyPolicy("sometimes")


# ----------------------------------------------------------------------------------- the backend


@pytest.mark.parametrize("binary", [True, False])
def test_remote_model_predicts_like_a_local_model(demo_package: Path, binary: bool) -> None:
    import edge_sdk
    from edge_sdk.assets import demo_samples

    with FaultServer(model=package_model(demo_package), binary=binary) as srv:
        c = RemoteClient(srv.url, deadline_s=10.0)
        with edge_sdk.load(demo_package, variant="fp32-onnx", threads=1) as local, remote_model(demo_package, c, privacy=ALLOWED) as remote:
            assert remote.session.info.backend == "remote" and remote.session.info.runtime == "kserve-v2"
            assert remote.describe()["backend"] == "remote" and remote.selection.chosen.backend == "remote"
            for path in demo_samples()[:4]:
                a, b = local.predict_image(path), remote.predict_image(path)
                np.testing.assert_allclose(b.outputs["logits"], a.outputs["logits"], rtol=1e-4, atol=1e-5)
                assert b.top1.label == a.top1.label and b.backend == "remote" and b.model_version == a.model_version
            batch = [local.prepare_image(p).feeds["image"] for p in demo_samples()[:3]]
            got = remote.predict_batch(batch)
            want = local.predict_batch(batch)
            assert [r.top1.index for r in got] == [r.top1.index for r in want] and got[0].batch_size == 3
        paths = [r.path for r in srv.requests]
        assert paths[0] == "/v2/models/shapes-classifier" and paths.count("/v2/models/shapes-classifier") == 1  # checked once, first
        assert all(p.endswith("/versions/1.0.0/infer") for p in paths if p.endswith("/infer"))
        # a server that takes binary tensors without listing the extension is probed once and switched to binary
        assert c.wire == "binary"


def test_remote_session_refuses_an_incompatible_server(demo_package: Path) -> None:
    from edge_sdk.package import ModelPackage

    manifest = ModelPackage.open(demo_package).manifest
    with FaultServer() as srv:  # serves "mlp", not the demo model
        s = RemoteSession(RemoteClient(srv.url), manifest, privacy=ALLOWED)
        with pytest.raises(RemoteRejectedError, match="not found"):
            s.run({"image": np.zeros((1, 3, 32, 32), np.float32)})
        assert srv.infer_requests() == []
    odd = package_model(demo_package)
    odd.outputs = [{"name": "logits", "datatype": "FP32", "shape": [-1, 5]}]
    with FaultServer(model=odd) as srv:
        s = RemoteSession(RemoteClient(srv.url), manifest, privacy=ALLOWED)
        with pytest.raises(RemoteIncompatibleError, match="output 'logits' dim 1: manifest 4, server 5"):
            s.run({"image": np.zeros((1, 3, 32, 32), np.float32)})
        assert srv.infer_requests() == []


def test_remote_session_checks_answers_against_the_manifest(demo_package: Path) -> None:
    from edge_sdk.package import ModelPackage

    manifest = ModelPackage.open(demo_package).manifest
    with FaultServer(model=package_model(demo_package)) as srv:
        s = RemoteSession(RemoteClient(srv.url, wire="json"), manifest, privacy=ALLOWED)
        x = np.zeros((2, 3, 32, 32), np.float32)
        assert s.run({"image": x})["logits"].shape == (2, 4)
        srv.set_fault("wrong_shape")
        with pytest.raises(RemoteProtocolError, match=r"expected \[2, 4\]"):
            s.run({"image": x})
        srv.set_fault("wrong_dtype")
        with pytest.raises(RemoteProtocolError, match="FP64, expected FP32"):
            s.run({"image": x})
        s.close()
        with pytest.raises(Exception, match="closed"):
            s.run({"image": x})
