"""Options of ``edge-sdk serve`` (no web framework imported here: the CLI parser and the generated
reference read this module without the ``server`` extra)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from ..cli_args import add_device_arguments, add_load_arguments
from ..errors import OptionsError

__all__ = ["ServeOptions", "add_arguments"]


@dataclass(frozen=True)
class ServeOptions:
    """How :func:`edge_sdk.serve.create_app` queues, batches, times out and authenticates requests.

    max_batch_size: rows per model call when the model's batch dim is dynamic (None: the model's own
    upper bound; 1 turns dynamic batching off). max_queue_delay_ms: how long the worker waits for
    more requests to fill a batch once it holds one. queue_size: requests waiting per model before
    the server answers 503 with Retry-After (a text-generation model: ``queue_size`` generations
    waiting besides the running one; past that 429 on ``/v1``, 503 on ``/v2``). timeout_s: the most
    one infer request may spend queued and running before a 504; for a non-streaming generation, its
    deadline (the text so far comes back, finish_reason "length"). max_body_bytes: the largest
    request body (413 past it, after decompression too; a Content-Length past it is refused before
    any byte is read). token: the bearer token every endpoint but ``/v2/health/*`` requires (None:
    no auth); it is left out of ``repr`` and never logged.

    Hostile clients (each bound enforced where noted; see :mod:`edge_sdk.serve`):

    - header_timeout_s: a connection must complete a request's headers within this from its opening
      (or from the end of its previous response); past it the connection is closed (408 when part
      of a request came). Slowloris and idle connections. Enforced by the server's HTTP protocol
      (uvicorn has no header timeout; its ``h11_max_incomplete_event_size`` and a 64 KiB header cap
      of ours bound the header bytes, 431 past them).
    - keep_alive_s: uvicorn's ``timeout_keep_alive``: an idle kept-alive connection is closed after it.
    - body_timeout_s: the whole request body must arrive within this once the headers did; past it
      the answer is 408 and the connection is closed (ASGI middleware of :func:`create_app`).
    - max_connections: open connections at most (None: from the process's descriptor limit, at most
      1000). At the cap, a new connection closes the oldest one that is idle or still sending
      headers; when none is, it takes one of the ``reserved_connections`` that answer only
      ``/v2/health/*`` (anything else: 503); past those it gets 503 and is closed. Health stays
      reachable while the server is flooded.
    - max_inflight_body_bytes: the request bytes all requests in flight may hold together (their
      bodies, reserved from Content-Length before reading, plus ``max_body_bytes`` for a compressed
      body), held until the request is answered; past it the answer is 503 with Retry-After before
      the body is read (None: 2 x ``max_body_bytes``). max_decodes: bodies of 1 MiB or more decoded
      (JSON parsed, tensors built) at once; the others wait their turn (503 past ``timeout_s``).
    """

    max_batch_size: int | None = None
    max_queue_delay_ms: float = 5.0
    queue_size: int = 64
    timeout_s: float = 30.0
    max_body_bytes: int = 64 << 20
    token: str | None = field(default=None, repr=False)
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    body_timeout_s: float = 60.0
    max_connections: int | None = None
    reserved_connections: int = 8
    max_inflight_body_bytes: int | None = None
    max_decodes: int = 1

    def __post_init__(self) -> None:
        if self.max_batch_size is not None and (not _is_int(self.max_batch_size) or self.max_batch_size < 1):
            raise OptionsError(f"max_batch_size: expected None or an int >= 1, got {self.max_batch_size!r}")
        if not _is_num(self.max_queue_delay_ms) or not 0 <= self.max_queue_delay_ms <= 10_000:
            raise OptionsError(f"max_queue_delay_ms: expected a number in [0, 10000], got {self.max_queue_delay_ms!r}")
        if not _is_int(self.queue_size) or self.queue_size < 1:
            raise OptionsError(f"queue_size: expected an int >= 1, got {self.queue_size!r}")
        if not _is_num(self.timeout_s) or self.timeout_s <= 0:
            raise OptionsError(f"timeout_s: expected a number > 0, got {self.timeout_s!r}")
        if not _is_int(self.max_body_bytes) or self.max_body_bytes < 1024:
            raise OptionsError(f"max_body_bytes: expected an int >= 1024, got {self.max_body_bytes!r}")
        for key in ("header_timeout_s", "keep_alive_s", "body_timeout_s"):
            v = getattr(self, key)
            if not _is_num(v) or not 0 < v <= 86_400:
                raise OptionsError(f"{key}: expected a number in (0, 86400], got {v!r}")
        if self.max_connections is not None and (not _is_int(self.max_connections) or self.max_connections < 1):
            raise OptionsError(f"max_connections: expected None or an int >= 1, got {self.max_connections!r}")
        if not _is_int(self.reserved_connections) or self.reserved_connections < 1:
            raise OptionsError(f"reserved_connections: expected an int >= 1, got {self.reserved_connections!r}")
        mib = self.max_inflight_body_bytes
        if mib is not None and (not _is_int(mib) or mib < self.max_body_bytes):
            raise OptionsError(f"max_inflight_body_bytes: expected None or an int >= max_body_bytes ({self.max_body_bytes}), got {mib!r}")
        if not _is_int(self.max_decodes) or self.max_decodes < 1:
            raise OptionsError(f"max_decodes: expected an int >= 1, got {self.max_decodes!r}")
        if self.token is not None:
            t = self.token
            if not isinstance(t, str) or not t or not t.isascii() or any(c.isspace() or not c.isprintable() for c in t):
                raise OptionsError("token: expected a non-empty ASCII string without spaces or control characters")

    @property
    def inflight_budget(self) -> int:
        """``max_inflight_body_bytes``, its default resolved."""
        return self.max_inflight_body_bytes if self.max_inflight_body_bytes is not None else 2 * self.max_body_bytes


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``edge-sdk serve`` arguments (the command itself is :func:`edge_sdk.serve.command.run`)."""
    d = ServeOptions()
    p.add_argument("packages", nargs="+", metavar="PACKAGE", help="model package(s); each is served under its manifest name")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 exposes the server to the network)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one, printed on stdout)")
    add_device_arguments(p)
    add_load_arguments(p, variant_help="force this variant id (every package must have it)")  # no --result-cache: workers run the session
    p.add_argument("--context", type=int, metavar="N",
                   help="text-generation packages: KV tokens to allocate (default: from the memory budget)")  # fmt: skip
    p.add_argument("--max-streams", type=int, default=4, metavar="N",
                   help="text-generation packages: conversations decoded together by one engine (continuous batching; "
                        "default 4; 1: one at a time through the model's own loop)")  # fmt: skip
    p.add_argument("--speculative", choices=["prompt-lookup"],
                   help="text-generation packages: speculative decoding while one stream runs (drafts from the prompt)")  # fmt: skip
    p.add_argument("--max-batch", type=int, help="rows per model call when the batch dim is dynamic (default: the model's bound; 1: off)")
    p.add_argument("--max-delay-ms", type=float, default=d.max_queue_delay_ms,
                   help=f"how long to wait for more requests to fill a batch (default {d.max_queue_delay_ms:g})")  # fmt: skip
    p.add_argument("--queue-size", type=int, default=d.queue_size,
                   help=f"waiting requests per model before 503 (429 on /v1; default {d.queue_size})")  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=d.timeout_s,
                   help=f"per-request limit (queued + running) before 504; a non-streaming generation's deadline (default {d.timeout_s:g})")  # fmt: skip
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--token-env", metavar="VAR", help="require 'Authorization: Bearer <token>', the token in this environment variable")
    auth.add_argument("--token-file", metavar="F", help="require 'Authorization: Bearer <token>', the token read from this file")
    p.add_argument("--tls-cert", metavar="F", help="serve HTTPS with this PEM certificate (chain) file; needs --tls-key")
    p.add_argument("--tls-key", metavar="F", help="the PEM private key of --tls-cert")
    p.add_argument("--access-log", action="store_true", help="log every request line (never headers, so never the token)")
