"""A client for the Open Inference Protocol (KServe v2 REST), standard library + numpy only.

::

    client = RemoteClient("https://infer.example:8443", token=os.environ["TOKEN"], region="eu-west")
    resp = client.infer("shapes-classifier", {"image": x}, version="1.0.0",
                        privacy=PrivacyPolicy("allowed", regions=("eu-west",)))
    resp.outputs["logits"]

**Time.** ``connect_timeout_s`` bounds the TCP connect and the TLS handshake, ``read_timeout_s``
each wait for bytes, and ``deadline_s`` (per client, or per call) the whole request: connect,
TLS, send, headers, body, every retry and every backoff wait. A process-wide watchdog thread
shuts the socket down when the deadline passes, so a server that trickles a byte at a time (in
the handshake, the headers or the body) is cut at the deadline too. Only name resolution
(``getaddrinfo``) is outside the deadline's reach: use an IP address or a local resolver where
that matters.

**Retries** (:mod:`edge_sdk.remote.retry`): only where the request did not run or the server
asks to come back -- connection refused or reset before a response, a connect timeout,
502/503/504, 429 -- with capped exponential backoff and full jitter, inside the retry budget;
``Retry-After`` (delta-seconds or an HTTP-date) is honoured, and one that ends after the
deadline fails at once with :class:`RemoteBusyError`. Never retried: 4xx, a read timeout
after the request was sent, a malformed answer, TLS failures, redirects. A keep-alive
connection that turns out to be closed by the server is replaced once at no cost to the budget.

**Circuit breaker** (:mod:`edge_sdk.remote.breaker`): one per client; every attempt of
``infer``/``server_metadata``/``model_metadata`` passes it. The health calls (``live``,
``ready``, ``model_ready``) bypass it (one attempt, no retries), so a router can always poll.

**Wire format.** ``wire="auto"`` (default): before the first infer the client reads
``GET /v2`` and sends binary tensors (the binary extension) when the server lists
``binary_tensor_data``, JSON otherwise. The list is not trusted alone, either way:

- *Listed but refused*: a binary request answered with a 4xx (other than 401/403/404/429), or --
  while no binary request has yet succeeded against this server -- a 200 that does not parse or
  a 500/501 (MLServer 1.7 answers binary bodies with a 500) is sent again once as JSON, and the
  client keeps JSON for that server (a ``"wire"`` event, ``details["wire"] == "json"``).
- *Not listed but taken*: once a JSON infer has succeeded, the next infer is sent binary once
  (the probe; one at a time, other requests stay JSON meanwhile). A success switches the client
  to binary for good (a ``"wire"`` event, ``details["wire"] == "binary"``); a refusal (the rules
  above) is sent again once as JSON and the client keeps JSON for good (a ``"wire"`` event); any
  other failure (timeout, 503, breaker open, ...) is raised as usual and the probe is tried again
  on a later infer.

``wire="json"`` / ``"binary"`` force a format (no probe; a refused binary request still falls
back). :attr:`RemoteClient.wire` says what infer uses now.

**Versioned routes.** A server may not serve ``/versions/{v}`` routes at all (several third-party
v2 servers do not); :func:`edge_sdk.remote.session.check_compatible` finds that out and calls
:meth:`RemoteClient.use_unversioned`, after which every path for that model is unversioned.

**TLS and credentials.** https always verifies the certificate chain and the host name
(``ssl.create_default_context``, plus ``ca_file``); ``pins_sha256`` additionally requires the
SHA-256 of the server certificate (DER) to be one of the pins, failing closed. A bearer
``token`` is only accepted for https or a loopback host (``localhost``, 127.0.0.0/8, ::1); it is
never logged and is scrubbed from every exception message (a hostile server echoing it
included). Redirects are never followed: a 3xx is a :class:`RemoteProtocolError`.

**Answers are checked** before anything is returned: status, size (``max_response_bytes``,
checked on Content-Length and while reading), JSON, every expected output with its datatype
and shape, the model name and the request id. Nothing half-accepted. Whatever is wrong with a
2xx answer (deep nesting, wrong field types, a 400-digit number, a huge or ragged shape, a binary
header that lies, ...) is a :class:`RemoteProtocolError`, never another exception; it counts as a
server failure for the circuit breaker and is never retried (the request ran).

**Privacy** (:mod:`edge_sdk.remote.privacy`): ``infer`` checks the model's policy (the
``privacy`` argument, else the client's ``privacy`` for that model, else "never") before any
byte leaves -- before the breaker, the wire negotiation and the connection.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import http.client
import ipaddress
import itertools
import json
import logging
import random
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import quote, urlsplit

import numpy as np

from . import protocol
from .breaker import OPEN, CircuitBreaker, RemoteEvent, emit
from .errors import (
    RemoteAuthError,
    RemoteBusyError,
    RemoteConfigError,
    RemoteError,
    RemoteProtocolError,
    RemoteRejectedError,
    RemoteTimeoutError,
    RemoteTLSError,
    RemoteUnavailableError,
)
from .privacy import PrivacyPolicy
from .retry import RETRY_STATUSES, RetryBudget, RetryPolicy, parse_retry_after

__all__ = [
    "ModelMetadata",
    "RemoteClient",
    "RemoteEndpoint",
    "ServerMetadata",
    "TensorMetadata",
]

_log = logging.getLogger("edge_sdk.remote")
T = TypeVar("T")

WIRES = ("auto", "json", "binary")
_USER_AGENT = "edge-sdk-remote/1"
_CHUNK = 64 << 10
_HEALTH_MAX_BYTES = 64 << 10
_REDACTED = "***"


# ----------------------------------------------------------------------------------- endpoint


@dataclass(frozen=True)
class RemoteEndpoint:
    """A parsed server URL: ``scheme`` http | https, ``host``, ``port``, ``base_path`` (a prefix
    before ``/v2``, "" for none). No credentials, query or fragment are accepted in the URL."""

    scheme: str
    host: str
    port: int
    base_path: str = ""

    @classmethod
    def parse(cls, url: str) -> "RemoteEndpoint":
        """Parse an ``http://`` or ``https://`` URL (no credentials, query or fragment; a trailing ``/v2`` is dropped) into an
        endpoint; :class:`~edge_sdk.remote.errors.RemoteConfigError` for anything else."""
        if not isinstance(url, str):
            raise RemoteConfigError(f"url: expected a string, got {type(url).__name__}")
        try:
            u = urlsplit(url.strip())
            port = u.port
        except ValueError as e:
            raise RemoteConfigError(f"url {url!r}: {e}") from None
        if u.scheme not in ("http", "https"):
            raise RemoteConfigError(f"url {url!r}: expected an http:// or https:// URL")
        if u.username is not None or u.password is not None:
            raise RemoteConfigError("url: credentials in the URL are not accepted; pass token= (sent as a bearer token)")
        if u.query or u.fragment:
            raise RemoteConfigError(f"url {url!r}: expected no query string or fragment")
        if not u.hostname:
            raise RemoteConfigError(f"url {url!r}: no host")
        base = u.path.rstrip("/")
        if base.endswith("/v2"):
            base = base[:-3]
        return cls(u.scheme, u.hostname, port or (443 if u.scheme == "https" else 80), base)

    @property
    def tls(self) -> bool:
        """True for ``https``."""
        return self.scheme == "https"

    @property
    def is_loopback(self) -> bool:
        """``localhost`` or a loopback IP literal (127.0.0.0/8, ::1)."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def host_header(self) -> str:
        """The ``Host`` header value: the host (bracketed if IPv6), with the port unless it is the scheme's default."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        return h if self.port == (443 if self.tls else 80) else f"{h}:{self.port}"

    @property
    def url(self) -> str:
        """The URL for messages and events (never holds credentials)."""
        return f"{self.scheme}://{self.host_header}{self.base_path}"

    def __str__(self) -> str:
        return self.url


# ----------------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class TensorMetadata:
    """``$metadata_tensor``: shape uses -1 for a variable dim."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ServerMetadata:
    """A server's v2 metadata: name, version and the protocol extensions it supports."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True)
class ModelMetadata:
    """A server's v2 model metadata: name, versions, platform, and its inputs and outputs."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError, MemoryError) as e:  # JSONDecodeError, UnicodeDecodeError, the int-digits limit, deep nesting
        raise RemoteProtocolError(f"{what}: the body is not usable JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(doc, dict):
        raise RemoteProtocolError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    return doc


def _strs(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RemoteProtocolError(f"{where}: expected a list of strings")
    return tuple(v)


_MAX_RANK = 64  # numpy's limit


def _is_dim(d: Any) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and -1 <= d < 2**63


def _short(v: Any, n: int = 200) -> str:
    """``repr(v)`` cut to ``n`` characters, whatever ``v`` is (deeply nested, huge ints, ...)."""
    try:
        text = repr(v)
    except (ValueError, RecursionError, MemoryError):
        return f"<{type(v).__name__}>"
    return text if len(text) <= n else text[: n - 3] + "..."


def _tensor_meta(v: Any, where: str) -> tuple[TensorMetadata, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise RemoteProtocolError(f"{where}: expected a list")
    out = []
    for i, t in enumerate(v):
        w = f"{where}[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("datatype"), str):
            raise RemoteProtocolError(f"{w}: expected an object with string 'name' and 'datatype'")
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > _MAX_RANK or not all(_is_dim(d) for d in shape):
            raise RemoteProtocolError(
                f"{w} {t['name']!r}: shape: expected a list of at most {_MAX_RANK} ints in [-1, 2**63), got {_short(shape)}"
            )
        out.append(TensorMetadata(t["name"], t["datatype"], tuple(shape)))
    return tuple(out)


def parse_server_metadata(body: bytes) -> ServerMetadata:
    doc = _json_object(body, "server metadata")
    name, version = doc.get("name"), doc.get("version", "")
    if not isinstance(name, str) or not isinstance(version, str):
        raise RemoteProtocolError("server metadata: expected string 'name' and 'version'")
    return ServerMetadata(name, version, _strs(doc.get("extensions"), "server metadata extensions"))


def parse_model_metadata(body: bytes) -> ModelMetadata:
    doc = _json_object(body, "model metadata")
    name, platform = doc.get("name"), doc.get("platform", "")
    if not isinstance(name, str) or not isinstance(platform, str):
        raise RemoteProtocolError("model metadata: expected string 'name' and 'platform'")
    return ModelMetadata(
        name,
        _strs(doc.get("versions"), "model metadata versions"),
        platform,
        _tensor_meta(doc.get("inputs"), "model metadata inputs"),
        _tensor_meta(doc.get("outputs"), "model metadata outputs"),
    )


# ----------------------------------------------------------------------------------- the watchdog


class _Arm:
    __slots__ = ("sock", "fired", "cancelled")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fired = False
        self.cancelled = False


class _Watchdog:
    """One daemon thread for the process: shuts a socket down when its deadline passes, so a
    blocked connect/handshake/recv returns at once. ``disarm`` and firing share a lock: after
    ``disarm`` returns the socket is never touched again."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Arm]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._cancelled = 0

    def arm(self, sock: socket.socket, timeout_s: float) -> _Arm:
        a = _Arm(sock)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, timeout_s), next(self._seq), a))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="edge-sdk-remote-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return a

    def disarm(self, a: _Arm) -> None:
        with self._cond:
            if not a.fired and not a.cancelled:
                a.cancelled = True
                self._cancelled += 1
                if self._cancelled > 256 and self._cancelled * 2 > len(self._heap):
                    self._heap = [e for e in self._heap if not e[2].cancelled]
                    heapq.heapify(self._heap)
                    self._cancelled = 0

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                    self._cancelled = max(0, self._cancelled - 1)
                if not self._heap:
                    self._cond.wait(30.0)
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(min(wait, 30.0))
                    continue
                _, _, a = heapq.heappop(self._heap)
                a.fired = True
                try:
                    socket.socket.shutdown(a.sock, socket.SHUT_RDWR)  # the plain socket: leave the SSL object alone
                except OSError:
                    pass


_WATCHDOG = _Watchdog()


# ----------------------------------------------------------------------------------- one exchange


@dataclass(frozen=True)
class _Response:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


class _Failed(Exception):
    """One attempt failed: ``error`` to raise, whether a retry may help, whether the breaker
    counts it, and the server's Retry-After (seconds)."""

    def __init__(self, error: RemoteError, *, retry: bool, breaker: bool = True, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry = retry
        self.breaker = breaker
        self.retry_after = retry_after


class _WireRefused(RemoteProtocolError):
    """A binary request's answer did not parse at all (as opposed to a wrong shape/dtype)."""


_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
#: What the transport turns into typed failures (``RemoteClient._transport_failure``).
_TRANSPORT = (*_STALE, socket.timeout, TimeoutError, http.client.HTTPException, ssl.SSLError, OSError)


class RemoteClient:
    """A thread-safe v2 REST client for one endpoint (module docs).

    ``url``: ``http(s)://host[:port][/prefix]``. ``token``: bearer token (https or loopback
    only). ``ca_file``: extra CA bundle for https. ``pins_sha256``: allowed SHA-256 digests of
    the server certificate (hex, colons allowed). ``connect_timeout_s`` / ``read_timeout_s`` /
    ``deadline_s``: see the module docs. ``retry``: :class:`RetryPolicy`. ``breaker``: a
    :class:`CircuitBreaker` for this client alone (a new one by default). ``region``: where the
    endpoint runs, for privacy policies. ``on_event``: called with every :class:`RemoteEvent`.
    ``privacy``: the policy for every model, or a mapping model name -> policy (missing: never).
    ``wire``: auto | json | binary. ``max_response_bytes``: larger answers are refused.
    ``clock`` / ``wallclock`` / ``sleep`` / ``rand``: injectable for tests.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        pins_sha256: Sequence[str] = (),
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 10.0,
        deadline_s: float = 15.0,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        region: str | None = None,
        on_event: Callable[[RemoteEvent], None] | None = None,
        privacy: PrivacyPolicy | Mapping[str, PrivacyPolicy] | None = None,
        wire: str = "auto",
        max_response_bytes: int = 64 << 20,
        max_idle_connections: int = 4,
        idle_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.endpoint = RemoteEndpoint.parse(url)
        ep = self.endpoint
        for name, v in (("connect_timeout_s", connect_timeout_s), ("read_timeout_s", read_timeout_s), ("deadline_s", deadline_s)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or v == float("inf"):
                raise RemoteConfigError(f"{name}: expected a finite number > 0, got {v!r}")
        if wire not in WIRES:
            raise RemoteConfigError(f"wire: expected one of {list(WIRES)}, got {wire!r}")
        if token is not None:
            if not isinstance(token, str) or not token or any(c in token for c in "\r\n\0"):
                raise RemoteConfigError("token: expected a non-empty string without line breaks")
            if not ep.tls and not ep.is_loopback:
                raise RemoteConfigError(
                    f"refusing to send a bearer token over plain http to {ep.url}: use https (or a loopback host for local testing)"
                )
        pins = tuple(_norm_pin(p) for p in pins_sha256)
        if (pins or ca_file) and not ep.tls:
            raise RemoteConfigError(f"ca_file / pins_sha256 need an https URL, got {ep.url}")
        self._token = token
        self._pins = pins
        self._ssl: ssl.SSLContext | None = None
        if ep.tls:
            try:
                self._ssl = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as e:
                raise RemoteConfigError(f"ca_file {ca_file!r}: cannot be loaded ({e})") from None
            # create_default_context verifies chain and host name; make it explicit and permanent
            self._ssl.check_hostname = True
            self._ssl.verify_mode = ssl.CERT_REQUIRED
        self.connect_timeout_s = float(connect_timeout_s)
        self.read_timeout_s = float(read_timeout_s)
        self.deadline_s = float(deadline_s)
        self.retry = retry or RetryPolicy()
        self.region = region
        self.on_event = on_event
        self.max_response_bytes = int(max_response_bytes)
        self._privacy = privacy
        self._wire: str | None = None if wire == "auto" else wire
        self._binary_confirmed = False  # a binary infer has succeeded against this server
        self._json_ok = False  # a JSON infer has succeeded (the binary probe waits for one)
        # the binary probe (module docs): "pending" (auto and JSON chosen), "in_flight", None (no probe)
        self._probe: str | None = None
        self._unversioned: set[str] = set()  # models whose server serves no /versions/{v} routes
        self._clock, self._wallclock, self._sleep, self._rand = clock, wallclock, sleep, rand
        self._budget = RetryBudget.from_policy(self.retry, clock=clock)
        self.breaker = breaker or CircuitBreaker(clock=clock, wallclock=wallclock)
        self.breaker.endpoint = ep.url
        self.breaker.on_event = on_event
        self._lock = threading.Lock()
        self._idle: list[tuple[http.client.HTTPConnection, socket.socket, float]] = []
        self._max_idle = max_idle_connections
        self._idle_timeout_s = idle_timeout_s

    def __repr__(self) -> str:
        return f"RemoteClient({self.endpoint.url!r}, token={'set' if self._token else None}, region={self.region!r})"

    @property
    def wire(self) -> str | None:
        """The wire format infer uses now: ``"binary"``, ``"json"``, or None (not negotiated yet)."""
        return self._wire

    def use_unversioned(self, name: str) -> None:
        """Address model ``name`` without ``/versions/{v}`` from now on (its server does not serve
        versioned routes; :func:`~edge_sdk.remote.session.check_compatible` finds that out)."""
        with self._lock:
            self._unversioned.add(name)

    def serves_versions(self, name: str) -> bool:
        """False once :meth:`use_unversioned` was called for ``name``."""
        return name not in self._unversioned

    @property
    def retry_budget(self) -> RetryBudget:
        """The client's retry budget (shared by every request it makes)."""
        return self._budget

    def close(self) -> None:
        """Close idle connections (the client can still be used; it reconnects)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _, _ in idle:
            conn.close()

    def __enter__(self) -> "RemoteClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public calls ------------------------------------------------------------------

    def live(self, *, deadline_s: float | None = None) -> bool:
        """``GET /v2/health/live``: True on 200, False on any other status (one attempt, no
        breaker). Raises RemoteUnavailableError / RemoteTimeoutError / RemoteTLSError when
        there is no answer."""
        return self._health("/v2/health/live", deadline_s)

    def ready(self, *, deadline_s: float | None = None) -> bool:
        """``GET /v2/health/ready`` (like :meth:`live`)."""
        return self._health("/v2/health/ready", deadline_s)

    def model_ready(self, name: str, version: str | None = None, *, deadline_s: float | None = None) -> bool:
        """``GET /v2/models/{name}[/versions/{version}]/ready`` (like :meth:`live`)."""
        return self._health(self._model_path(name, version, "/ready"), deadline_s)

    def server_metadata(self, *, deadline_s: float | None = None) -> ServerMetadata:
        """``GET /v2``, checked (name, version, extensions)."""
        deadline = self._deadline(deadline_s)
        return self._call("GET", "/v2", None, {}, deadline, lambda r: parse_server_metadata(r.body))

    def model_metadata(self, name: str, version: str | None = None, *, deadline_s: float | None = None) -> ModelMetadata:
        """``GET /v2/models/{name}[/versions/{version}]``, checked."""
        deadline = self._deadline(deadline_s)
        return self._call("GET", self._model_path(name, version), None, {}, deadline, lambda r: parse_model_metadata(r.body))

    def infer(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
        deadline_s: float | None = None,
        expected: Mapping[str, tuple[str, Sequence[int | None]]] | None = None,
        privacy: PrivacyPolicy | None = None,
    ) -> protocol.InferResponse:
        """``POST /v2/models/{name}[/versions/{version}]/infer``.

        ``outputs``: the outputs to ask for (default: the server's choice); each one asked
        for must come back. ``expected``: output -> (v2 datatype, shape with None for a free
        dim), checked on the answer. ``privacy``: this model's policy (default: the client's
        for ``name``, else "never"); checked before anything is sent. Raises PrivacyError,
        CircuitOpenError, RemoteUnavailableError, RemoteBusyError, RemoteTimeoutError,
        RemoteProtocolError, RemoteAuthError, RemoteRejectedError."""
        policy = privacy if privacy is not None else self.privacy_for(name)
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs: expected a mapping name -> numpy array, got {type(inputs).__name__}")
        policy.check(name, inputs.keys(), self.region)
        path = self._model_path(name, version, "/infer")
        deadline = self._deadline(deadline_s)
        request_id = uuid.uuid4().hex
        wire = self._negotiate(deadline)
        probing = wire == "json" and self._start_probe()
        if probing:
            wire = "binary"
        try:
            resp = self._infer_as(wire, path, name, version, inputs, outputs, expected, request_id, deadline)
        except RemoteError as e:
            if wire != "binary" or not _binary_refused(e, self._binary_confirmed):
                if probing:
                    with self._lock:
                        self._probe = "pending"  # inconclusive (timeout, 503, breaker open, ...): probe again later
                raise
            with self._lock:
                self._wire = "json"
                self._probe = None
            what = "binary probe" if probing else "binary request"
            self._wire_event(f"{what} refused ({e}); using JSON for this server", "json")
            resp = self._infer_as("json", path, name, version, inputs, outputs, expected, request_id, deadline)
            self._json_ok = True
            return resp
        if wire == "binary":
            self._binary_confirmed = True
            if probing:
                with self._lock:
                    self._wire = "binary"
                    self._probe = None
                self._wire_event(f"binary tensors accepted although {protocol.BINARY_EXTENSION!r} is not listed; using binary", "binary")
        else:
            self._json_ok = True
        return resp

    def _start_probe(self) -> bool:
        """True (and the probe is in flight) when this infer should probe binary (module docs)."""
        if self._probe != "pending" or not self._json_ok:
            return False
        with self._lock:
            if self._probe != "pending" or self._wire != "json":
                return False
            self._probe = "in_flight"
            return True

    def _wire_event(self, reason: str, wire: str) -> None:
        _log.info("%s: %s", self.endpoint.url, reason)
        emit(self.on_event, RemoteEvent("wire", self._wallclock(), self.endpoint.url, reason, details={"wire": wire}))

    def privacy_for(self, name: str) -> PrivacyPolicy:
        """The client's policy for model ``name`` ("never" when none was given)."""
        p = self._privacy
        if isinstance(p, PrivacyPolicy):
            return p
        if isinstance(p, Mapping) and name in p:
            return p[name]
        return PrivacyPolicy()

    # -- infer internals ----------------------------------------------------------------

    def _negotiate(self, deadline: float) -> str:
        wire = self._wire
        if wire is not None:
            return wire
        try:
            meta = self.server_metadata(deadline_s=max(1e-3, deadline - self._clock()))
            wire = "binary" if protocol.BINARY_EXTENSION in meta.extensions else "json"
        except (RemoteRejectedError, RemoteProtocolError) as e:
            if e.status is not None and 300 <= e.status < 400:
                raise  # a redirect is an error everywhere, not a hint about the wire format
            wire = "json"  # no usable server metadata: JSON is what every server speaks
        with self._lock:
            if self._wire is None:
                self._wire = wire
                if wire == "json":
                    self._probe = "pending"  # not listed (or no metadata): probe binary once (module docs)
            return self._wire

    def _infer_as(
        self,
        wire: str,
        path: str,
        name: str,
        version: str | None,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None,
        expected: Mapping[str, tuple[str, Sequence[int | None]]] | None,
        request_id: str,
        deadline: float,
    ) -> protocol.InferResponse:
        binary = wire == "binary"
        try:
            body, headers = protocol.encode_request(
                inputs, outputs=outputs, binary_inputs=binary, binary_outputs=binary, request_id=request_id
            )
        except protocol.ProtocolError as e:
            raise RemoteProtocolError(f"cannot encode the request for {name!r}: {e}") from None

        def decode(r: _Response) -> protocol.InferResponse:
            try:
                resp = protocol.decode_response(r.body, r.headers, expected=expected, max_bytes=self.max_response_bytes)
            except Exception as e:  # noqa: BLE001 - a hostile answer may raise anything: typed here, nothing escapes
                msg = _unreadable(e)
                if binary:
                    try:
                        protocol.decode_response(r.body, r.headers, max_bytes=self.max_response_bytes)
                    except Exception:  # noqa: BLE001 - it does not parse at all
                        raise _WireRefused(f"infer {name!r}: {msg}") from None
                raise RemoteProtocolError(f"infer {name!r}: {msg}") from None
            if resp.model_name and resp.model_name != name:
                raise RemoteProtocolError(f"infer {name!r}: the answer is for model {_short(resp.model_name)}")
            if version is not None and resp.model_version not in (None, "", version):
                raise RemoteProtocolError(f"infer {name!r}: asked for version {version!r}, the answer is from {_short(resp.model_version)}")
            if resp.id and resp.id != request_id:
                raise RemoteProtocolError(f"infer {name!r}: the answer's id {_short(resp.id)} is not this request's")
            missing = [o for o in (outputs or ()) if o not in resp.outputs]
            if missing:
                raise RemoteProtocolError(f"infer {name!r}: output(s) {missing} asked for and missing (got {sorted(resp.outputs)})")
            return resp

        return self._call("POST", path, body, headers, deadline, decode)

    # -- the request loop -----------------------------------------------------------------

    def _deadline(self, deadline_s: float | None) -> float:
        d = self.deadline_s if deadline_s is None else deadline_s
        if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 < d < float("inf"):
            raise RemoteConfigError(f"deadline_s: expected a finite number > 0, got {d!r}")
        return self._clock() + d

    def _model_path(self, name: str, version: str | None, tail: str = "") -> str:
        if not isinstance(name, str) or (version is not None and not isinstance(version, str)):
            raise RemoteConfigError("model name and version must be strings")
        if version is not None and name in self._unversioned:
            version = None  # the server serves no versioned routes (use_unversioned)
        try:
            return protocol.model_path(quote(name, safe=""), None if version is None else quote(version, safe=""), tail)
        except protocol.ProtocolError as e:
            raise RemoteConfigError(str(e)) from None

    def _call(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str], deadline: float, decode: Callable[[_Response], T]
    ) -> T:
        """Attempts with retries, through the breaker; returns ``decode(response)`` of a 2xx."""
        self._budget.deposit()
        attempt = 0
        while True:
            self.breaker.allow()
            attempt += 1
            try:
                r = self._exchange(method, path, body, headers, deadline)
                result = self._judge(r, method, path, decode)
            except _Failed as f:
                e = f.error
                e.attempts = attempt
                if f.breaker:
                    self.breaker.record_failure(_scrub(str(e), self._token))
                else:
                    self.breaker.release()
                self._retry_or_raise(f, attempt, deadline, method, path)
                continue
            except BaseException:
                self.breaker.release()  # never reached a verdict (a bug or an interrupt): free a probe slot
                raise
            self.breaker.record_success()
            return result

    def _judge(self, r: _Response, method: str, path: str, decode: Callable[[_Response], T]) -> T:
        where = f"{method} {self.endpoint.url}{path}"
        s = r.status
        if 200 <= s < 300:
            try:
                return decode(r)
            except RemoteError as e:
                e.status = s
                _scrub_error(e, self._token)
                raise _Failed(e, retry=False) from None
            except Exception as e:  # noqa: BLE001 - a malformed answer is a typed, counted server failure
                bad = RemoteProtocolError(_scrub(f"{where}: {_unreadable(e)}", self._token), status=s)
                raise _Failed(bad, retry=False) from None
        if 300 <= s < 400:
            loc = r.headers.get("location", "")
            target = loc.split("?", 1)[0][:200]
            err: RemoteError = RemoteProtocolError(
                f"{where}: HTTP {s} redirect to {target!r} refused (redirects are never followed)", status=s
            )
            raise _Failed(_scrub_error(err, self._token), retry=False, breaker=False)
        msg = _scrub(f"{where}: {_error_text(s, r.body[:_HEALTH_MAX_BYTES], r.headers.get('content-type'))}", self._token)
        if s in (401, 403):
            raise _Failed(RemoteAuthError(msg, status=s), retry=False, breaker=False)
        if s in RETRY_STATUSES:
            ra = parse_retry_after(r.headers.get("retry-after"), now=self._wallclock()) if s in (429, 503) else None
            raise _Failed(RemoteUnavailableError(msg, status=s), retry=True, retry_after=ra)
        if 400 <= s < 500:
            raise _Failed(RemoteRejectedError(msg, status=s), retry=False, breaker=False)
        if 500 <= s < 600:
            raise _Failed(RemoteUnavailableError(msg, status=s), retry=False)
        raise _Failed(RemoteProtocolError(f"{where}: unexpected HTTP status {s}", status=s), retry=False)

    def _retry_or_raise(self, f: _Failed, attempt: int, deadline: float, method: str, path: str) -> None:
        e = f.error
        if not f.retry:
            raise e from None
        if attempt >= self.retry.max_attempts:
            _suffix(e, f" (after {attempt} attempt{'s' if attempt > 1 else ''})")
            raise e from None
        if self.breaker.state == OPEN:
            _suffix(e, " (not retried: the circuit breaker opened)")
            raise e from None
        remaining = deadline - self._clock()
        if f.retry_after is not None:
            if f.retry_after > remaining:
                raise RemoteBusyError(
                    f"{e} -- the server asks to retry in {f.retry_after:g} s, "
                    f"after this request's deadline ({max(0.0, remaining):.3f} s left)",
                    retry_after_s=f.retry_after,
                    status=e.status,
                    attempts=attempt,
                ) from None
            delay = f.retry_after
        else:
            delay = self.retry.backoff(attempt - 1, self._rand)
        if delay >= remaining:
            _suffix(e, f" (no time left to retry: {max(0.0, remaining):.3f} s to the deadline)")
            raise e from None
        if not self._budget.try_withdraw():
            _suffix(e, " (retry budget spent: retries are limited to a share of recent requests)")
            raise e from None
        reason = _scrub(str(e), self._token)
        _log.debug("%s %s%s: attempt %d failed (%s); retrying in %.3f s", method, self.endpoint.url, path, attempt, reason, delay)
        emit(self.on_event, RemoteEvent("retry", self._wallclock(), self.endpoint.url, reason, attempt=attempt, delay_s=delay))
        if delay > 0:
            self._sleep(delay)

    # -- health -------------------------------------------------------------------------

    def _health(self, path: str, deadline_s: float | None) -> bool:
        deadline = self._deadline(deadline_s)
        try:
            r = self._exchange("GET", path, None, {}, deadline, max_bytes=_HEALTH_MAX_BYTES)
        except _Failed as f:
            raise f.error from None
        if 300 <= r.status < 400:
            raise RemoteProtocolError(f"GET {self.endpoint.url}{path}: HTTP {r.status} redirect refused (redirects are never followed)")
        return r.status == 200

    # -- connections ----------------------------------------------------------------------

    def _headers(self, extra: Mapping[str, str]) -> dict[str, str]:
        h = {"Host": self.endpoint.host_header, "User-Agent": _USER_AGENT, "Accept": "application/json, application/octet-stream"}
        h.update(extra)
        if self._token is not None:
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def _take_idle(self) -> tuple[http.client.HTTPConnection, socket.socket] | None:
        now = self._clock()
        with self._lock:
            while self._idle:
                conn, sock, since = self._idle.pop()
                if now - since < self._idle_timeout_s:
                    return conn, sock
                conn.close()
        return None

    def _put_idle(self, conn: http.client.HTTPConnection, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append((conn, sock, self._clock()))
                return
        conn.close()

    def _connect(self, deadline: float) -> tuple[http.client.HTTPConnection, socket.socket]:
        ep = self.endpoint
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise _Failed(RemoteTimeoutError(f"{ep.url}: the deadline passed before connecting"), retry=False, breaker=False)
        timeout = min(self.connect_timeout_s, remaining)
        where = f"connect to {ep.url}"
        try:
            raw = socket.create_connection((ep.host, ep.port), timeout=timeout)
        except ConnectionRefusedError:
            raise _Failed(RemoteUnavailableError(f"{where}: connection refused"), retry=True) from None
        except (socket.timeout, TimeoutError):
            deadline_hit = timeout < self.connect_timeout_s
            what = "the deadline passed" if deadline_hit else f"no connection within {self.connect_timeout_s:g} s"
            raise _Failed(RemoteTimeoutError(f"{where}: {what}"), retry=not deadline_hit) from None
        except socket.gaierror as e:
            raise _Failed(RemoteUnavailableError(f"{where}: cannot resolve {ep.host!r} ({e.strerror})"), retry=True) from None
        except OSError as e:
            raise _Failed(RemoteUnavailableError(f"{where}: {e.strerror or e}"), retry=True) from None
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        sock: socket.socket = raw
        if self._ssl is not None:
            arm = _WATCHDOG.arm(raw, deadline - self._clock())
            try:
                raw.settimeout(min(self.connect_timeout_s, max(1e-3, deadline - self._clock())))
                sock = self._ssl.wrap_socket(raw, server_hostname=ep.host)
            except ssl.SSLCertVerificationError as e:
                raw.close()
                raise _Failed(RemoteTLSError(f"{where}: certificate verification failed ({e.verify_message})"), retry=False) from None
            except (ssl.SSLError, OSError) as e:
                raw.close()
                if arm.fired or isinstance(e, (socket.timeout, TimeoutError)):
                    raise _Failed(RemoteTimeoutError(f"{where}: TLS handshake not done within the time allowed"), retry=False) from None
                raise _Failed(RemoteTLSError(f"{where}: TLS handshake failed ({type(e).__name__})"), retry=False) from None
            finally:
                _WATCHDOG.disarm(arm)
            if self._pins:
                der = sock.getpeercert(binary_form=True) or b""
                got = hashlib.sha256(der).hexdigest()
                if not any(hmac.compare_digest(got, p) for p in self._pins):
                    sock.close()
                    raise _Failed(RemoteTLSError(f"{where}: the server certificate (sha256 {got}) matches none of the pins"), retry=False)
        conn = http.client.HTTPConnection(ep.host, ep.port)
        conn.sock = sock
        return conn, sock

    def _exchange(
        self, method: str, path: str, body: bytes | None, extra: Mapping[str, str], deadline: float, *, max_bytes: int | None = None
    ) -> _Response:
        """One HTTP exchange within ``deadline`` (a stale keep-alive connection is replaced once)."""
        headers = self._headers(extra)
        limit = self.max_response_bytes if max_bytes is None else max_bytes
        for fresh_try in (False, True):
            idle = None if fresh_try else self._take_idle()
            reused = idle is not None
            conn, sock = idle if idle is not None else self._connect(deadline)
            try:
                return self._send_and_read(conn, sock, method, path, body, headers, deadline, limit)
            except _StaleConnection:
                if not reused:
                    raise _Failed(
                        RemoteUnavailableError(f"{method} {self.endpoint.url}{path}: connection closed before a response"), retry=True
                    ) from None
        raise AssertionError("unreachable")

    def _send_and_read(
        self,
        conn: http.client.HTTPConnection,
        sock: socket.socket,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str],
        deadline: float,
        limit: int,
    ) -> _Response:
        where = f"{method} {self.endpoint.url}{path}"
        t0 = self._clock()
        arm = _WATCHDOG.arm(sock, deadline - t0)
        keep = False
        phase = "send"

        def budget() -> float:
            left = deadline - self._clock()
            if left <= 0:
                raise socket.timeout("deadline")
            sock.settimeout(min(self.read_timeout_s, left))
            return left

        try:
            budget()
            conn.request(method, self.endpoint.base_path + path, body=body, headers=dict(headers))
            phase = "wait"
            budget()
            resp = conn.getresponse()
            if arm.fired:
                raise socket.timeout("deadline")  # the watchdog cut the headers: what was parsed may be partial
            phase = "body"
            hdrs: dict[str, str] = {}
            for k, v in resp.getheaders():
                k = k.lower()
                hdrs[k] = f"{hdrs[k]}, {v}" if k in hdrs else v
            declared = resp.length
            if declared is not None and declared > limit:
                raise _Failed(
                    RemoteProtocolError(f"{where}: answer of {declared} bytes is over the limit of {limit}", status=resp.status),
                    retry=False,
                )
            parts: list[bytes] = []
            total = 0
            while True:
                budget()
                chunk = resp.read1(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    raise _Failed(RemoteProtocolError(f"{where}: answer over the limit of {limit} bytes", status=resp.status), retry=False)
                parts.append(chunk)
            if declared is not None and total < declared:
                raise http.client.IncompleteRead(b"", declared - total)
            if arm.fired and declared is None and not resp.chunked:
                raise socket.timeout("deadline")  # read-to-close cut by the watchdog: the body may be short
            resp.close()
            keep = not resp.will_close
            _log.debug("%s -> %d (%d bytes, %.1f ms)", where, resp.status, total, (self._clock() - t0) * 1e3)
            return _Response(resp.status, hdrs, b"".join(parts))
        except _Failed:
            raise
        except _TRANSPORT as e:
            raise self._transport_failure(e, where, phase, arm.fired, deadline) from None
        finally:
            _WATCHDOG.disarm(arm)
            if keep and not arm.fired:
                self._put_idle(conn, sock)
            else:
                conn.close()
                try:
                    sock.close()
                except OSError:
                    pass

    def _transport_failure(self, e: BaseException, where: str, phase: str, fired: bool, deadline: float) -> Exception:
        """The typed failure for a transport exception ``e`` raised in ``phase`` ("connect", "send", "wait",
        "body"): a timeout when the watchdog fired (or for a socket timeout), a stale keep-alive
        connection (:class:`_StaleConnection`, replaced at no cost) for a send/wait failure, else
        RemoteUnavailableError / RemoteProtocolError, never retried once the answer began."""
        if isinstance(e, (socket.timeout, TimeoutError)):
            return self._timeout(where, phase, deadline_hit=fired or deadline - self._clock() <= 0.001)
        if fired:
            return self._timeout(where, phase)
        stale = isinstance(e, _STALE)
        if isinstance(e, http.client.IncompleteRead):
            return _Failed(RemoteUnavailableError(f"{where}: the answer was cut short"), retry=False)
        if isinstance(e, http.client.HTTPException) and not stale:
            return _Failed(RemoteProtocolError(f"{where}: not a valid HTTP answer ({type(e).__name__})"), retry=False)
        if phase in ("send", "wait"):
            return _StaleConnection()
        if stale:
            return _Failed(RemoteUnavailableError(f"{where}: connection lost while reading the answer ({type(e).__name__})"), retry=False)
        return _Failed(RemoteUnavailableError(f"{where}: connection failed ({type(e).__name__})"), retry=False)

    def _timeout(self, where: str, phase: str, deadline_hit: bool = True) -> _Failed:
        what = {"send": "sending the request", "wait": "waiting for the answer", "body": "reading the answer"}[phase]
        if deadline_hit:
            return _Failed(RemoteTimeoutError(f"{where}: the deadline passed while {what}"), retry=False)
        return _Failed(RemoteTimeoutError(f"{where}: no bytes for {self.read_timeout_s:g} s while {what}"), retry=False)


class _StaleConnection(Exception):
    """The connection failed before any answer: a closed keep-alive, or a reset."""


# ----------------------------------------------------------------------------------- helpers


def _norm_pin(p: str) -> str:
    h = p.replace(":", "").strip().lower() if isinstance(p, str) else ""
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise RemoteConfigError(f"pins_sha256: expected SHA-256 digests as 64 hex digits, got {p!r}")
    return h


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, _REDACTED) if token else text


def _scrub_error(e: RemoteError, token: str | None) -> RemoteError:
    if token and e.args and isinstance(e.args[0], str) and token in e.args[0]:
        e.args = (_scrub(e.args[0], token),) + e.args[1:]
    return e


def _suffix(e: RemoteError, text: str) -> None:
    if e.args and isinstance(e.args[0], str):
        e.args = (e.args[0] + text,) + e.args[1:]


def _unreadable(e: BaseException) -> str:
    """What went wrong reading an answer, as a message (the protocol's own, or the exception's type and text, cut short)."""
    if isinstance(e, (protocol.ProtocolError, RemoteError)):
        text = str(e)  # a protocol message may quote the answer: cut it short
        return text if len(text) <= 500 else text[:497] + "..."
    if isinstance(e, RecursionError):
        return "the answer is nested too deeply to read"
    if isinstance(e, MemoryError):
        return "the answer needs more memory than it can be given"
    try:
        text = str(e)
    except Exception:  # noqa: BLE001
        text = ""
    return f"the answer could not be read ({type(e).__name__}: {text[:200]})"


def _error_text(status: int, body: bytes, content_type: str | None) -> str:
    """``protocol.error_message``, but never raising (a hostile error body may be nested or odd)."""
    try:
        return protocol.error_message(status, body, content_type)
    except Exception:  # noqa: BLE001
        return f"HTTP {status}: (an error body that cannot be read)"


def _binary_refused(e: RemoteError, confirmed: bool) -> bool:
    """A binary request refused in a way JSON may fix: a 4xx other than 401/403/404/429, or --
    until a binary request has succeeded against this server -- an answer that did not parse
    at all or a 500/501 (MLServer 1.7 answers a binary body with a 500 from its error handler).
    Once binary has worked, an answer that does not parse is a malformed answer (the request ran)."""
    if isinstance(e, _WireRefused):
        return not confirmed
    if isinstance(e, RemoteRejectedError):
        return e.status != 404
    return not confirmed and type(e) is RemoteUnavailableError and e.status in (500, 501)
