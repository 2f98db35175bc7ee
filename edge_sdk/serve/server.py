""":class:`Server`: uvicorn running an ``edge-sdk serve`` app on a background thread.

The listening socket is bound by :meth:`Server.start` in the caller's thread (so ``port=0`` gives
the real port at once and a port in use fails there), TLS files are loaded there too (a bad
certificate fails there), then uvicorn serves on its own thread and event loop until
:meth:`Server.stop` (graceful: open requests get ``graceful_s``, then the workers stop, bounded).
uvicorn is told not to configure logging (``log_config=None``): the process's logging is left alone.
"""

from __future__ import annotations

import ipaddress
import logging
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

        kw: dict[str, Any] = {}
        if self._tls is not None:
            kw = {"ssl_certfile": self._tls[0], "ssl_keyfile": self._tls[1]}
        if self._access_log is not None:
            access = logging.getLogger("uvicorn.access")
            access.setLevel(logging.INFO if self._access_log else logging.WARNING)
            access.propagate = True
        config = uvicorn.Config(
            self.app,
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
