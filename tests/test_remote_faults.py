"""Every fault of tests/remote_faults.py against the client: no request outlives its deadline
(wall time asserted), no malformed answer is accepted, and retries, the retry budget and the
breaker behave as documented. All on 127.0.0.1; every wait is bounded."""

from __future__ import annotations

import email.utils
import threading
import time
from typing import Any

import numpy as np
import pytest
from remote_faults import MLP_B, MLP_W, Fault, FaultServer, closed_port, tls_context

from edge_sdk.remote.breaker import CLOSED, OPEN, CircuitBreaker
from edge_sdk.remote.client import RemoteClient
from edge_sdk.remote.errors import (
    CircuitOpenError,
    RemoteAuthError,
    RemoteBusyError,
    RemoteError,
    RemoteProtocolError,
    RemoteTimeoutError,
    RemoteTLSError,
    RemoteUnavailableError,
)
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.remote.retry import RetryPolicy

X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
Y = X @ MLP_W + MLP_B
EXPECTED = {"y": ("FP32", [2, 3])}
DEADLINE = 0.6
MARGIN = 0.4  # scheduling slack on a loaded 2-core machine


@pytest.fixture(scope="module")
def server():
    with FaultServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _reset(server: FaultServer):
    server.set_fault(None)
    server.token = None
    server.clear()
    yield
    server.set_fault(None)


def client(url: str, **kw: Any) -> RemoteClient:
    kw.setdefault("privacy", PrivacyPolicy("allowed"))
    kw.setdefault("deadline_s", DEADLINE)
    kw.setdefault("read_timeout_s", 5.0)
    kw.setdefault("retry", RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.05))
    return RemoteClient(url, **kw)


def timed(fn: Any) -> tuple[float, Any]:
    t = time.monotonic()
    try:
        out: Any = fn()
    except RemoteError as e:
        out = e
    return time.monotonic() - t, out


# ----------------------------------------------------------------------------------- the sweep

# kind -> (error class, attempts made) for a client with deadline DEADLINE and 3 attempts
SWEEP: dict[str, tuple[type, int | None]] = {
    "blackhole": (RemoteTimeoutError, 1),
    "slow": (RemoteTimeoutError, 1),
    "slow_body": (RemoteTimeoutError, 1),
    "slow_headers": (RemoteTimeoutError, 1),
    "queue_full": (RemoteUnavailableError, 3),
    "rate_limited": (RemoteBusyError, 1),
    "malformed_json": (RemoteProtocolError, 1),
    "wrong_shape": (RemoteProtocolError, 1),
    "wrong_dtype": (RemoteProtocolError, 1),
    "missing_output": (RemoteProtocolError, 1),
    "huge_body": (RemoteProtocolError, 1),
    "huge_chunked": (RemoteProtocolError, 1),
    "unauthorized": (RemoteAuthError, 1),
    "redirect": (RemoteProtocolError, 1),
    "reset": (RemoteUnavailableError, 3),
}


@pytest.mark.parametrize("wire", ["json", "binary"])
@pytest.mark.parametrize("kind", sorted(SWEEP))
def test_every_fault_ends_by_the_deadline_with_a_typed_error(server: FaultServer, kind: str, wire: str) -> None:
    cls, attempts = SWEEP[kind]
    server.set_fault(Fault(kind, delay_s=10 * DEADLINE, interval_s=0.05, retry_after="30" if kind == "rate_limited" else None))
    c = client(server.url, wire=wire, max_response_bytes=1 << 20)
    took, out = timed(lambda: c.infer("mlp", {"x": X}, outputs=["y"], expected=EXPECTED))
    assert isinstance(out, cls), f"{kind}: got {out!r}"
    assert took < DEADLINE + MARGIN, f"{kind}: took {took:.3f} s, deadline {DEADLINE} s"
    assert out.attempts == attempts, f"{kind}: {out.attempts} attempts"
    refused_binary = kind == "malformed_json" and wire == "binary"  # sent again once as JSON, then refused
    assert len(server.infer_requests()) == attempts * (2 if refused_binary else 1)


def test_connection_refused_is_retried_within_the_deadline() -> None:
    slept: list[float] = []
    c = client(f"http://127.0.0.1:{closed_port()}", wire="json", sleep=slept.append)
    took, out = timed(lambda: c.infer("mlp", {"x": X}))
    assert isinstance(out, RemoteUnavailableError) and "connection refused" in str(out) and out.attempts == 3
    assert len(slept) == 2 and took < DEADLINE
    with pytest.raises(RemoteUnavailableError):  # health calls raise too: no answer is not "not ready"
        c.live()


def test_read_timeout_is_not_retried(server: FaultServer) -> None:
    server.set_fault(Fault("blackhole"))
    c = client(server.url, wire="json", deadline_s=5.0, read_timeout_s=0.3)
    took, out = timed(lambda: c.infer("mlp", {"x": X}))
    assert isinstance(out, RemoteTimeoutError) and "no bytes for 0.3 s" in str(out)
    assert 0.25 < took < 0.3 + MARGIN and len(server.infer_requests()) == 1


def test_ten_times_slow_server_is_cut_at_the_deadline_then_recovers(server: FaultServer) -> None:
    server.set_fault(Fault("slow", delay_s=10 * DEADLINE, times=1))
    c = client(server.url, wire="json")
    took, out = timed(lambda: c.infer("mlp", {"x": X}))
    assert isinstance(out, RemoteTimeoutError) and took < DEADLINE + MARGIN
    np.testing.assert_allclose(c.infer("mlp", {"x": X}).outputs["y"], Y, rtol=1e-6)  # the cut connection was not reused


def test_trickling_body_is_cut_at_the_deadline_not_the_read_timeout(server: FaultServer) -> None:
    server.set_fault(Fault("slow_body", interval_s=0.02))  # a byte every 20 ms: no read timeout ever fires
    c = client(server.url, wire="json", deadline_s=0.5, read_timeout_s=0.2)
    took, out = timed(lambda: c.infer("mlp", {"x": X}))
    assert isinstance(out, RemoteTimeoutError) and "deadline passed" in str(out)
    assert 0.45 < took < 0.5 + MARGIN


def test_server_errors_open_the_breaker_on_failure_ratio(server: FaultServer) -> None:
    server.set_fault("flaky_500")  # every other request: 500 (never retried)
    breaker = CircuitBreaker(failure_threshold=100, failure_ratio=0.5, min_calls=6, open_s=30.0)
    c = client(server.url, wire="json", breaker=breaker)
    outcomes = []
    for _ in range(10):
        try:
            c.infer("mlp", {"x": X}, expected=EXPECTED)
            outcomes.append("ok")
        except CircuitOpenError:
            outcomes.append("open")
        except RemoteUnavailableError as e:
            assert e.status == 500 and e.attempts == 1
            outcomes.append("500")
    assert outcomes[:7] == ["500", "ok", "500", "ok", "500", "ok", "500"]  # 4 of 7 failed: open
    assert set(outcomes[7:]) == {"open"} and breaker.state == OPEN
    assert len(server.infer_requests()) == 7


def test_queue_full_retried_then_served(server: FaultServer) -> None:
    server.set_fault(Fault("queue_full", times=2))
    c = client(server.url, wire="json", deadline_s=2.0)
    np.testing.assert_allclose(c.infer("mlp", {"x": X}).outputs["y"], Y, rtol=1e-6)
    assert len(server.infer_requests()) == 3


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_rate_limited_waits_as_told(server: FaultServer, form: str) -> None:
    value = "1" if form == "seconds" else email.utils.formatdate(time.time() + 2, usegmt=True)
    server.set_fault(Fault("rate_limited", retry_after=value, times=1))
    c = client(server.url, wire="json", deadline_s=4.0)
    took, out = timed(lambda: c.infer("mlp", {"x": X}))
    assert not isinstance(out, RemoteError), out
    assert 0.9 < took < 2.5  # waited what the server asked (an HTTP-date has 1 s resolution)
    assert len(server.infer_requests()) == 2


def test_retry_budget_caps_retries_under_sustained_failure(server: FaultServer) -> None:
    server.set_fault("queue_full")
    policy = RetryPolicy(max_attempts=4, base_s=0.001, cap_s=0.002, budget_ratio=0.1, budget_min_retries=3)
    c = client(server.url, wire="json", retry=policy, breaker=CircuitBreaker(failure_threshold=10_000, min_calls=10_000))
    took, _ = timed(lambda: [timed(lambda: c.infer("mlp", {"x": X})) for _ in range(30)])
    retries = len(server.infer_requests()) - 30
    assert retries == 3 + 3  # min 3 + 10 % of 30 (without a budget: 30 x 3 = 90)
    assert took < 5.0


def test_blackholed_server_under_concurrency_all_bounded(server: FaultServer) -> None:
    server.set_fault(Fault("blackhole"))
    c = client(server.url, wire="json", breaker=CircuitBreaker(failure_threshold=100))
    results: list[tuple[float, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(timed(lambda: c.infer("mlp", {"x": X})))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE + 5.0)
    assert len(results) == 6
    assert all(isinstance(out, RemoteTimeoutError) and took < DEADLINE + MARGIN for took, out in results)


def test_half_open_admits_one_probe_among_concurrent_callers(server: FaultServer) -> None:
    server.set_fault(Fault("slow", delay_s=0.3, routes=("infer",)))
    breaker = CircuitBreaker(failure_threshold=1, open_s=0.05)
    c = client(server.url, wire="json", deadline_s=2.0, breaker=breaker)
    breaker.allow()
    breaker.record_failure("forced open")
    time.sleep(0.06)
    outcomes: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        try:
            c.infer("mlp", {"x": X})
            r = "ok"
        except CircuitOpenError:
            r = "open"
        with lock:
            outcomes.append(r)

    threads = [threading.Thread(target=call) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5.0)
    assert sorted(outcomes) == ["ok", "open", "open", "open", "open"]
    assert breaker.state == CLOSED and len(server.infer_requests()) == 1


def test_tls_wrong_host_sends_nothing_and_is_not_retried(tmp_path: Any) -> None:
    trustme = pytest.importorskip("trustme", reason="trustme is in the dev extra")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    with FaultServer(ssl_context=tls_context(ca, "wrong.example")) as srv:
        c = client(srv.url, ca_file=str(tmp_path / "ca.pem"), token="tok")
        took, out = timed(lambda: c.infer("mlp", {"x": X}))
        assert isinstance(out, RemoteTLSError) and out.attempts == 1 and took < DEADLINE
        assert srv.requests == [] and srv.connections == 1


def test_unauthorized_is_not_retried_and_does_not_open_the_breaker(server: FaultServer) -> None:
    server.token = "right"
    c = client(server.url, wire="json", token="wrong", breaker=CircuitBreaker(failure_threshold=1))
    for _ in range(3):
        with pytest.raises(RemoteAuthError) as ei:
            c.infer("mlp", {"x": X})
        assert ei.value.status == 401 and ei.value.attempts == 1
    assert c.breaker.state == CLOSED and len(server.infer_requests()) == 3
