""":class:`Server`: uvicorn running an ``edge-sdk serve`` app on a background thread.

The listening socket is bound by :meth:`Server.start` in the caller's thread (so ``port=0`` gives
the real port at once and a port in use fails there), TLS files are loaded there too (a bad
certificate fails there), then uvicorn serves on its own thread and event loop until
:meth:`Server.stop` (graceful: open requests get ``graceful_s``, then the workers stop, bounded).
uvicorn is told not to configure logging (``log_config=None``): the process's logging is left alone.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import EdgeSDKError, OptionsError, OptionsTypeError
from ..model import Model
from .options import ServeOptions

__all__ = ["ServeError", "Server"]

_log = logging.getLogger(__name__)


class ServeError(EdgeSDKError, RuntimeError):
    """``edge-sdk serve`` could not start (address in use, bad TLS files, app startup failed)."""


class Server:
    """Serve ``app`` (a Starlette app from :func:`create_app`, or models -- Models and
    DecoderModels -- to make one from with ``options``) on ``host:port`` (``port=0``: a free port,
    see :attr:`port` and :attr:`url`). :meth:`stop` cancels running generations first.

    ``tls_cert`` / ``tls_key``: PEM files; both or neither. ``access_log``: request lines go to
    uvicorn's ``uvicorn.access`` logger (request line and status only: headers, hence tokens, are
    never logged). That logger is process-wide: None leaves it as the process configured it, True
    sets it to INFO (propagating), False to WARNING (silent). Use as a context manager, or
    :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        app: Any,
        options: ServeOptions | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        access_log: bool | None = None,
        graceful_s: int = 5,
    ) -> None:
        from .app import create_app
        from .generate_api import is_text_generator

        if isinstance(app, (Mapping, Sequence, Model)) or is_text_generator(app):
            app = create_app([app] if isinstance(app, Model) or is_text_generator(app) else app, options)
        elif options is not None:
            raise OptionsTypeError("Server: options go with models; an app was already made with its own")
        if (tls_cert is None) != (tls_key is None):
            raise OptionsError("tls_cert and tls_key: give both or neither")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise OptionsError(f"port: expected an int in [0, 65535], got {port!r}")
        self.app = app
        self.host = host
        self._port = port
        self.tls = tls_cert is not None
        self._tls = (str(tls_cert), str(tls_key)) if tls_cert is not None else None
        self._access_log = access_log
        self._graceful_s = graceful_s
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._error: BaseException | None = None

    # -- addresses -------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (the one asked for until :meth:`start`)."""
        return int(self._sock.getsockname()[1]) if self._sock is not None else self._port

    @property
    def url(self) -> str:
        """``http(s)://host:port`` to reach the server (a wildcard bind is reached on loopback)."""
        host = self.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if _is_ipv6(host):
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the server thread runs."""
        return self._thread is not None and self._thread.is_alive()

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> "Server":
        """Bind, start uvicorn on a thread and wait (at most ``timeout_s``) until it serves.
        Raises ServeError (and leaves nothing running) when it cannot."""
        if self._thread is not None:
            raise ServeError("this Server was already started; make a new one")
        import uvicorn

        options = self._options()
        cap, reserve = connection_limits(options)
        limits = _Limits(cap, reserve, options.header_timeout_s)
        self.limits = limits
        kw: dict[str, Any] = {
            "http": guarded_protocol(limits),
            "timeout_keep_alive": options.keep_alive_s,  # uvicorn's: an idle kept-alive connection (typed int, a float works)
            "limit_concurrency": 2 * (cap + reserve),  # uvicorn's 503 (health too): only a backstop past our own cap
            "h11_max_incomplete_event_size": MAX_HEADER_BYTES,  # h11's header bound (httptools: our MAX_HEADER_BYTES check)
        }
        if self._tls is not None:
            kw = {"ssl_certfile": self._tls[0], "ssl_keyfile": self._tls[1]}
        if self._access_log is not None:
            access = logging.getLogger("uvicorn.access")
            access.setLevel(logging.INFO if self._access_log else logging.WARNING)
            access.propagate = True
        config = uvicorn.Config(
            ErrorGuard(self.app, self._failures()),
            host=self.host,
            port=self._port,
            log_config=None,
            access_log=True,  # False would strip the process-wide uvicorn.access logger's handlers
            lifespan="on",
            timeout_graceful_shutdown=self._graceful_s,
            server_header=False,
            **kw,
        )
        try:
            config.load()  # loads the TLS files here: a bad certificate is an error now, not on a thread
        except Exception as e:
            raise ServeError(f"cannot start the server: {type(e).__name__}: {e}") from e
        self._sock = _bind(self.host, self._port)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="edge-sdk-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                why = "did not start within %.0f s" % timeout_s if self._thread.is_alive() else "stopped while starting"
                err = self._error
                self.stop(5.0)
                raise ServeError(f"the server {why}" + (f": {type(err).__name__}: {err}" if err else " (see the log)"))
            time.sleep(0.01)
        _log.info("serve: listening on %s", self.url)
        return self

    def _options(self) -> ServeOptions:
        st = getattr(getattr(self.app, "state", None), "serve", None)
        opts = getattr(st, "options", None)
        return opts if isinstance(opts, ServeOptions) else ServeOptions()

    def _failures(self) -> Any:
        st = getattr(getattr(self.app, "state", None), "serve", None)
        lim = getattr(st, "failures", None)
        if lim is None:
            from .app import TracebackLimiter

            lim = TracebackLimiter(_log)
        return lim

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as e:  # SystemExit from uvicorn when the app's startup fails
            self._error = e

    def stop(self, timeout_s: float = 15.0) -> bool:
        """Stop serving: graceful, then forced; at most about ``timeout_s``. True when the
        server thread ended. Safe to call more than once."""
        ended = True
        if self._server is not None and self._thread is not None:
            state = getattr(getattr(self.app, "state", None), "serve", None)
            begin = getattr(state, "begin_shutdown", None)
            if callable(begin):  # cancel running generations: an open stream would hold the graceful shutdown
                try:
                    begin()
                except Exception:  # noqa: BLE001  # stopping must go on
                    _log.exception("serve: cancelling the running generations failed")
            self._server.should_exit = True
            self._thread.join(timeout_s * 0.8)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout_s * 0.2)
            ended = not self._thread.is_alive()
            if not ended:
                _log.warning("serve: the server thread did not end within %.1f s", timeout_s)
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        return ended

    def wait(self, stop: threading.Event | None = None, poll_s: float = 0.5) -> None:
        """Block until the server thread ends or ``stop`` is set (the CLI's main loop)."""
        while self.running:
            if stop is not None:
                if stop.wait(poll_s):
                    return
            elif self._thread is not None:
                self._thread.join(poll_s)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------- hostile clients

#: The most bytes a request's line and headers may take (431 past it; h11 gets it as its own limit).
MAX_HEADER_BYTES = 64 << 10
_DEFAULT_CONNECTIONS = 1000
_FD_HEADROOM = 32  # descriptors kept free for the process (model files, logs, the thread pool)


def connection_limits(options: ServeOptions) -> tuple[int, int]:
    """(cap, reserve): open connections at most, and the health-only ones past the cap. Without
    ``max_connections`` the cap comes from the descriptor limit (``RLIMIT_NOFILE`` less the
    descriptors open now, a headroom and the reserve; at most 1000), so accepting can never run the
    process out of descriptors; a given ``max_connections`` is clamped to the same bound."""
    reserve = options.reserved_connections
    bound = _DEFAULT_CONNECTIONS
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            try:
                used = len(os.listdir("/proc/self/fd"))
            except OSError:
                used = 64
            bound = soft - used - _FD_HEADROOM - reserve
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        pass
    want = options.max_connections if options.max_connections is not None else _DEFAULT_CONNECTIONS
    cap = max(1, min(want, bound))
    if options.max_connections is not None and cap < options.max_connections:
        _log.warning("serve: max_connections %d is past what the descriptor limit allows; using %d", options.max_connections, cap)
    if bound < 1:
        reserve = max(1, reserve + bound - 1)
    return cap, reserve


class _Limits:
    """The connection cap and header timeout shared by every connection of one server (event loop only)."""

    def __init__(self, cap: int, reserve: int, header_timeout_s: float) -> None:
        self.cap = cap
        self.reserve = reserve
        self.header_timeout_s = header_timeout_s
        self.evicted = 0  # idle / header-phase connections closed to make room
        self.refused = 0  # connections answered 503 at the cap and the reserve
        self.timed_out = 0  # connections closed by the header timeout
        self.reserved_used = 0  # connections admitted into the health-only reserve


def _raw(status: int, reason: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n{extra}"
            f"content-length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


def guarded_protocol(limits: _Limits, base: type | None = None) -> type:
    """uvicorn's HTTP protocol class (httptools when installed, else h11; or ``base``) with what
    uvicorn lacks: a header timeout (``header_timeout_s`` from the connection's opening or its
    previous response to the end of the next request's headers; 408 and close when part of a
    request came, close when none did), a header byte cap (:data:`MAX_HEADER_BYTES`, 431) and the
    connection cap of :class:`_Limits` (at the cap: close the oldest connection that is idle or
    still sending headers; else admit into the health-only reserve; else 503 and close). A request
    being answered is never closed by these; its body is bounded by :class:`~edge_sdk.serve.app.RequestGuard`."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol
    from .app import HEALTH_PATHS

    def health_only(app: Any) -> Any:
        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["path"].rstrip("/") in HEALTH_PATHS:
                await app(scope, receive, send)
                return
            body = json.dumps({"error": "the server is at its connection limit; this connection answers health checks only"}).encode()
            headers = [(b"content-type", b"application/json"), (b"retry-after", b"1"), (b"connection", b"close"),
                       (b"content-length", str(len(body)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return guarded

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._g_phase = "idle"  # idle | headers | active
            self._g_bytes = 0
            self._g_timer: Any = None
            self._g_since = self.loop.time()
            self._g_reserved = False
            self._admit()
            if not self.transport.is_closing():
                self._g_arm()

        def _admit(self) -> None:
            normal, reserved = 0, 0
            idle_normal: list[Any] = []
            idle_reserved: list[Any] = []
            for c in self.connections:
                if c is self or not hasattr(c, "_g_phase") or c.transport.is_closing():
                    continue
                if c._g_reserved:
                    reserved += 1
                else:
                    normal += 1
                if c._g_phase != "active":
                    (idle_reserved if c._g_reserved else idle_normal).append(c)
            if normal < limits.cap:
                return
            if idle_normal:  # the oldest connection that is not being answered makes room
                self._g_evict(idle_normal)
                return
            if reserved < limits.reserve or idle_reserved:
                if reserved >= limits.reserve:
                    self._g_evict(idle_reserved)
                limits.reserved_used += 1
                self._g_reserved = True
                self.app = health_only(self.app)  # type: ignore[has-type]  # uvicorn reads self.app when it dispatches
                return
            limits.refused += 1
            self._g_close(_raw(503, "Service Unavailable", "the server is at its connection limit", "retry-after: 1\r\n"))

        def _g_evict(self, candidates: list[Any]) -> None:
            victim = min(candidates, key=lambda c: c._g_since)
            limits.evicted += 1
            victim._g_close(None)

        def _g_arm(self) -> None:
            self._g_cancel()
            self._g_timer = self.loop.call_later(limits.header_timeout_s, self._g_expire)

        def _g_cancel(self) -> None:
            if self._g_timer is not None:
                self._g_timer.cancel()
                self._g_timer = None

        def _g_close(self, raw: bytes | None) -> None:
            self._g_cancel()
            if self.transport.is_closing():
                return
            if raw:
                self.transport.write(raw)
            self.transport.close()

        def _g_answering(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _g_expire(self) -> None:
            self._g_timer = None
            if self._g_answering():
                self._g_phase = "active"
                return
            limits.timed_out += 1
            msg = f"the request headers did not arrive within {limits.header_timeout_s:g} s"
            self._g_close(_raw(408, "Request Timeout", msg) if self._g_phase == "headers" else None)

        def data_received(self, data: bytes) -> None:
            counting = self._g_phase != "active"
            super().data_received(data)
            if not counting or self.transport.is_closing():
                return
            if self._g_answering():
                self._g_phase = "active"
                self._g_cancel()
                return
            self._g_phase = "headers"
            self._g_since = min(self._g_since, self.loop.time())
            self._g_bytes += len(data)
            if self._g_bytes > MAX_HEADER_BYTES:
                self._g_close(
                    _raw(431, "Request Header Fields Too Large", f"the request headers are over the limit of {MAX_HEADER_BYTES} bytes")
                )

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                self._g_cancel()
                return
            if self._g_answering():  # a pipelined request started
                self._g_phase = "active"
                return
            self._g_phase, self._g_bytes, self._g_since = "idle", 0, self.loop.time()
            self._g_arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._g_cancel()
            super().connection_lost(exc)

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{base.__name__}"
    return GuardedProtocol


class ErrorGuard:
    """The outermost ASGI layer: an exception that escapes the app (Starlette has sent its 500 and
    re-raises it for the server to log) is logged through the app's
    :class:`~edge_sdk.serve.app.TracebackLimiter` rather than by uvicorn with a full traceback each
    time; a 500 is sent when no answer began."""

    def __init__(self, app: Any, failures: Any) -> None:
        self.app = app
        self.failures = failures

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, guarded_send)
        except Exception as e:  # noqa: BLE001  # logged, rate-limited
            self.failures.exception("serve: %s %s failed", scope.get("method"), scope.get("path"), exc=e)
            if not started:
                body = json.dumps({"error": f"the server failed: {type(e).__name__}"}).encode()
                headers = [(b"content-type", b"application/json"), (b"connection", b"close"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 500, "headers": headers})
                await send({"type": "http.response.body", "body": body})


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ServeError(f"cannot resolve host {host!r}: {e}") from None
    family, _, _, _, addr = infos[0]
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and
    # accepted sockets inherit it; with proto 0, Nagle + the client's delayed ACK held every small
    # response on a kept-alive connection for ~40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(addr)
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {e}") from None
    return sock
