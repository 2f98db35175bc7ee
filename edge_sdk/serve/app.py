"""The Starlette application of ``edge-sdk serve`` (see :mod:`edge_sdk.serve` for the endpoints).

Every message goes through :mod:`edge_sdk.remote.protocol`; every input through the model's own
strict validation (:class:`edge_sdk.validation.InputValidator` over the variant's inputs: nothing is
cast); the model runs on its worker thread (:mod:`edge_sdk.serve.batching`), so the event loop
keeps answering health checks and metrics while a model is busy. Decoding, validation and
encoding of large bodies run on the thread pool for the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Sequence

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._version import __version__
from ..errors import InputError, OptionsError
from ..model import Model
from ..remote import protocol
from ..telemetry import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..telemetry import Registry, Sample, Trackable, model_samples
from ..validation import InputValidator
from .batching import Job, ModelWorker, QueueFullError, WorkerStoppedError, stack_key
from .generate_api import GenerateAPI, is_text_generator, openai_error
from .options import ServeOptions

__all__ = ["PLATFORMS", "SERVER_NAME", "BodyBudget", "RequestGuard", "ServedModel", "TracebackLimiter", "create_app"]

_log = logging.getLogger(__name__)

SERVER_NAME = "edge-sdk"
#: backend -> v2 ``platform`` (Triton's spelling for ONNX Runtime and TFLite models).
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "litert": "tensorflow_lite"}
HEALTH_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
GENERATE_EXTENSION = "generate"  # Triton's generate extension, listed when a text-generation model is served
_UNKNOWN = "(unknown)"  # the model label of requests for models not served (bounded label values)
LARGE_BODY = 1 << 20  # bodies this large decode one ServeOptions.max_decodes slot at a time


class TracebackLimiter:
    """Failures logged with their traceback, at most ``burst`` per ``window_s``; past that each is
    counted, not logged (one line says so when it begins), and the next window opens with one line
    giving the count and the last failure. A client that can make the server fail cannot flood its
    log. Thread-safe."""

    def __init__(self, logger: logging.Logger, burst: int = 5, window_s: float = 60.0, clock: Any = time.monotonic) -> None:
        self.logger = logger
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._start = -float("inf")
        self._n = 0
        self._suppressed = 0
        self._last = ""
        self.total = 0  # failures seen, logged or not

    def exception(self, msg: str, *args: Any, exc: BaseException | None = None) -> None:
        """Log ``msg % args`` with the traceback of ``exc`` (default: the one being handled), or count it."""
        now = self._clock()
        with self._lock:
            self.total += 1
            summary = None
            if now - self._start >= self.window_s:
                if self._suppressed:
                    summary = (self._suppressed, self._last)
                self._start, self._n, self._suppressed = now, 0, 0
            self._n += 1
            full = self._n <= self.burst
            first_cut = self._n == self.burst + 1
            if not full:
                self._suppressed += 1
                try:
                    text = msg % args
                except (TypeError, ValueError):
                    text = msg
                e = exc
                self._last = (text + (f": {type(e).__name__}: {e}" if e is not None else ""))[:300]
        if summary is not None:
            self.logger.warning("serve: %d more failure(s) in the last %.0f s were counted, not logged (the last: %s)",
                                summary[0], self.window_s, summary[1])  # fmt: skip
        if full:
            self.logger.error(msg, *args, exc_info=exc if exc is not None else True)
        elif first_cut:
            self.logger.warning("serve: over %d failures within %.0f s: the next ones are counted, not logged, until the window ends",
                                self.burst, self.window_s)  # fmt: skip


class BodyBudget:
    """The request bytes all requests in flight may hold together (event-loop thread only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0  # requests answered 503 for it

    def try_reserve(self, n: int) -> bool:
        """Hold ``n`` more bytes if the limit allows (True), else hold nothing (False)."""
        if n <= 0:
            return True
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def release(self, n: int) -> None:
        """Give back ``n`` bytes held by :meth:`try_reserve`."""
        self.held = max(0, self.held - n)


def _raw_error(scope: Scope, status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """An error answer in the format of the path (OpenAI's on /v1, v2's elsewhere), closing the connection."""
    h = {**dict(headers or {}), "Connection": "close"}
    if _is_openai_path(scope.get("path", "")):
        return openai_error(status, message, headers=h)
    return _error(status, message, h)


class RequestGuard:
    """ASGI middleware (inside :class:`BearerAuth`, outside the routes) that bounds what a request
    may hold before any route reads it:

    - a ``Content-Length`` past ``max_body_bytes`` is 413 before a byte is read; one that is not a
      number is 400;
    - the request's bytes (Content-Length, or the chunks as they come, plus ``max_body_bytes`` for a
      compressed body: it may inflate to that) are reserved from :class:`BodyBudget` until the
      request is answered; past the budget, 503 with Retry-After (before reading, when the length
      was declared);
    - the whole body must arrive within ``body_timeout_s`` of the headers: past it the guard answers
      408 with ``Connection: close`` (uvicorn then closes the connection) and the route sees a
      client disconnect. Once the body is in, ``receive`` passes through (a streaming response waits
      on it for the disconnect).
    Every answer of the guard closes the connection (an unread body is left unread)."""

    def __init__(self, app: ASGIApp, options: ServeOptions, budget: BodyBudget) -> None:
        self.app = app
        self.options = options
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.options.max_body_bytes
        cl: bytes | None = None
        chunked = False
        compressed = False
        for k, v in scope["headers"]:
            if k == b"content-length":
                cl = v
            elif k == b"transfer-encoding":
                chunked = True
            elif k == b"content-encoding":
                compressed = v.strip().lower() not in (b"", b"identity")
        declared = 0
        if cl is not None:
            try:
                declared = int(cl)
                if declared < 0:
                    raise ValueError
            except ValueError:
                await _raw_error(scope, 400, f"Content-Length: expected an integer >= 0, got {cl[:40]!r}")(scope, receive, send)
                return
            if declared > limit:
                await _raw_error(scope, 413, f"body of {declared} bytes is over the limit of {limit}")(scope, receive, send)
                return
        extra = limit if compressed and (declared or chunked) else 0
        held = min(declared + extra, self.budget.limit)
        if not self.budget.try_reserve(held):
            self.budget.refused += 1
            await self._busy(scope, receive, send, held)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.body_timeout_s
        body_done = not (declared or chunked)
        answered = False  # the guard sent the answer: the route's own is dropped
        started = False
        got = 0

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def answer(status: int, message: str, headers: Mapping[str, str] | None = None) -> Any:
            nonlocal answered
            if not started and not answered:
                answered = True
                await _raw_error(scope, status, message, headers)(scope, receive, send)
            answered = True
            return {"type": "http.disconnect"}

        async def guarded_receive() -> Any:
            nonlocal body_done, held, got
            if answered:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                what = f"{got} of {declared} bytes" if declared else f"{got} bytes"
                return await answer(408, f"the request body did not arrive within {self.options.body_timeout_s:g} s ({what} came)")
            if message["type"] == "http.request":
                got += len(message.get("body", b""))
                if got + extra > held:  # a chunked body, or more than declared: reserve as it comes
                    more = got + extra - held
                    if not self.budget.try_reserve(more):
                        self.budget.refused += 1
                        return await answer(503, self._busy_message(), {"Retry-After": "1"})
                    held += more
                if not message.get("more_body", False):
                    body_done = True
            elif message["type"] == "http.disconnect":
                body_done = True
            return message

        try:
            await self.app(scope, guarded_receive, guarded_send)
        finally:
            self.budget.release(held)

    def _busy_message(self) -> str:
        return f"the server holds {self.budget.held} bytes of request bodies in flight (at most {self.budget.limit}); retry later"

    async def _busy(self, scope: Scope, receive: Receive, send: Send, n: int) -> None:
        await _raw_error(scope, 503, self._busy_message() + f" (this request needs {n})", {"Retry-After": "1"})(scope, receive, send)


class _Reply(Exception):
    """An error answer: status, message (sent as ``{"error": message}``) and extra headers."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(protocol.error_body(message), status_code=status, headers=dict(headers or {}), media_type="application/json")


@dataclass
class ServedModel:
    """One model as served: its name, the model, its worker and request counters."""

    name: str
    model: Model
    worker: ModelWorker
    batching: bool
    validator: InputValidator
    output_names: tuple[str, ...]
    requests: dict[int, int] = field(default_factory=dict)  # status code -> count (event-loop thread only)
    duration_s: float = 0.0  # successful requests, arrival to response ready
    succeeded: int = 0

    @property
    def version(self) -> str:
        """The package's version."""
        return self.model.manifest.version

    def metadata(self) -> dict[str, Any]:
        """The v2 model metadata (name, versions, platform, inputs, outputs) as a JSON-able dict."""
        backend = self.model.session.info.backend
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": PLATFORMS.get(backend, backend),
            "inputs": [_tensor_meta(s) for s in self.model.inputs],
            "outputs": [_tensor_meta(s) for s in self.model.outputs],
        }

    @property
    def ready(self) -> bool:
        """True while the model is open and its worker thread runs."""
        return not self.model.closed and self.worker.running

    def prepare(self, body: bytes, headers: Mapping[str, str], max_bytes: int) -> tuple[protocol.InferRequest, Job]:
        """Decode and validate one infer request (on the thread pool). Raises _Reply(400/413/415)."""
        body = _decompress(body, headers.get("content-encoding", ""), max_bytes)
        try:
            req = protocol.decode_request(body, headers, max_bytes=max_bytes)
        except protocol.ProtocolError as e:
            raise _Reply(400, str(e)) from None
        unknown = [o.name for o in req.outputs if o.name not in self.output_names]
        if unknown:
            raise _Reply(400, f"requested output(s) {unknown}: model {self.name} has outputs {list(self.output_names)}")
        try:
            feeds = self.validator(req.inputs, finite=self.model.options.check_finite)
        except InputError as e:
            raise _Reply(400, f"model {self.name}: {e}") from None
        rows = 1
        if self.batching:
            sizes = {k: v.shape[0] for k, v in feeds.items()}
            if len(set(sizes.values())) > 1:
                raise _Reply(400, f"model {self.name}: every input's axis 0 is the batch and must agree, got {sizes}")
            rows = next(iter(sizes.values()))
        return req, Job(feeds, rows, stack_key(feeds))


def _tensor_meta(spec: Any) -> dict[str, Any]:
    return {
        "name": spec.name,
        "datatype": protocol.datatype_of(np.dtype(spec.dtype)),
        "shape": [d if isinstance(d, int) else -1 for d in spec.shape],
    }


def _decompress(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """Undo ``Content-Encoding`` gzip / deflate (tritonclient can send either), bounded."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(enc)
    if wbits is None:
        raise _Reply(415, f"Content-Encoding {encoding!r}: expected gzip, deflate or none")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, max_bytes + 1)
    except zlib.error as e:
        raise _Reply(400, f"the {enc} body does not decompress: {e}") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise _Reply(413, f"the decompressed body is over the limit of {max_bytes} bytes")
    return out


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (413 past it); a client that leaves (or a body that
    :class:`RequestGuard` timed out) is a 499 that nobody reads, never a logged failure."""
    try:
        return await _read_body_chunks(request, limit)
    except ClientDisconnect:
        raise _Reply(499, "the client went away before its body arrived") from None


async def _read_body_chunks(request: Request, limit: int) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise _Reply(400, f"Content-Length: expected an integer, got {cl!r}") from None
        if n > limit:
            raise _Reply(413, f"body of {n} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _Reply(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class BearerAuth:
    """ASGI middleware: every HTTP request but the health checks needs ``Authorization: Bearer
    <token>``. The token is compared in constant time (as SHA-256 digests, so its length does not
    leak either) and never logged; a failure is 401 with ``WWW-Authenticate: Bearer``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(token.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") in HEALTH_PATHS:
            await self.app(scope, receive, send)
            return
        given = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                given = v
                break
        ok = False
        if given is not None:
            scheme, _, cred = given.strip().partition(b" ")
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(hashlib.sha256(cred.strip()).digest(), self._digest)
        if ok:
            await self.app(scope, receive, send)
            return
        challenge = 'Bearer realm="edge-sdk"' + (', error="invalid_token"' if given is not None else "")
        msg = "a valid 'Authorization: Bearer <token>' header is required" if given is None else "the bearer token is not valid"
        headers = {"WWW-Authenticate": challenge}
        if _is_openai_path(scope["path"]):
            code = "missing_api_key" if given is None else "invalid_api_key"
            await openai_error(401, msg, code=code, headers=headers)(scope, receive, send)
            return
        await _error(401, msg, headers)(scope, receive, send)


def _is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def _name_of(m: Any) -> str:
    """The manifest name of a Model (``.manifest``) or a text generator (``.package.manifest``)."""
    manifest = getattr(m, "manifest", None) or getattr(getattr(m, "package", None), "manifest", None)
    if manifest is None:
        raise TypeError(f"expected an edge_sdk Model or DecoderModel, got {type(m).__name__}")
    return str(manifest.name)


class _App:
    """The state behind the routes."""

    def __init__(self, models: Mapping[str, Any] | Sequence[Any], options: ServeOptions) -> None:
        self.options = options
        self.served: dict[str, ServedModel] = {}
        decoders: dict[str, Any] = {}
        items = list(models.items()) if isinstance(models, Mapping) else [(_name_of(m), m) for m in models]
        if not items:
            raise ValueError("create_app: expected at least one model")
        for name, m in items:
            if not isinstance(m, Model) and not is_text_generator(m):
                raise TypeError(f"model {name!r}: expected an edge_sdk Model or DecoderModel, got {type(m).__name__}")
            protocol.model_path(name)  # a usable URL segment (no '/', '?', '#')
            if name in self.served or name in decoders:
                raise OptionsError(f"two models are named {name!r}; pass a mapping name -> model to serve them under different names")
            if not isinstance(m, Model):  # text generation: /v1 and the generate extension
                decoders[name] = m
                continue
            model_max = m._max_batch()
            outputs_batched = all(s.shape and not isinstance(s.shape[0], int) for s in m.outputs)
            cap = model_max if options.max_batch_size is None else min(options.max_batch_size, model_max)
            batching = model_max > 1 and outputs_batched
            max_batch = cap if batching else 1
            delay_s = options.max_queue_delay_ms / 1000
            tm = m.telemetry  # each model call lands in the model's inference-stage histogram, failures in its error counts
            run = m.session.run if tm is None else tm.timed(m.session.run)
            worker = ModelWorker(name, run, max_batch=max_batch, max_delay_s=delay_s, queue_size=options.queue_size)
            self.served[name] = ServedModel(name, m, worker, batching, InputValidator(m.inputs), tuple(s.name for s in m.outputs))
        self.budget = BodyBudget(options.inflight_budget)
        self.decodes = asyncio.Semaphore(options.max_decodes)  # large bodies decoded at once (binds to its loop on first use)
        self.failures = TracebackLimiter(_log)
        self.generation = GenerateAPI(decoders, options, tensor_models=list(self.served))
        self.generation.decodes = self.decodes
        self.generation.failures = self.failures
        self.registry = Registry()
        self.registry.add(self.samples)
        self.registry.add(self.generation.samples)
        self.registry.add(model_samples([s.model for s in self.served.values()]))  # runtime histograms of the served models
        for name, d in decoders.items():  # a decoder's own generation series (TTFT / TPOT histograms ...), when it has them
            if isinstance(d, Trackable):
                try:
                    self.registry.track(d, name)
                except OptionsError:  # one model served under two names: its series once
                    pass
        self._unknown_requests: dict[int, int] = {}  # requests for models not served, by status code
        self._started = False
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        for s in self.served.values():
            s.worker.start()
        self.generation.start()
        self._started, self._stopping = True, False
        names = [f"{n} {s.version}" for n, s in self.served.items()] + [f"{n} {s.version}" for n, s in self.generation.served.items()]
        _log.info("serve: %d model(s) ready: %s", len(names), ", ".join(names))
        try:
            yield
        finally:
            self.begin_shutdown()
            await run_in_threadpool(self._stop_workers)

    def begin_shutdown(self) -> None:
        """Answer not-ready and cancel the running generations, so open streams end now rather than
        holding the graceful shutdown (any thread; :meth:`Server.stop` calls it first)."""
        self._stopping = True
        self.generation.begin_shutdown()

    def _stop_workers(self) -> None:
        for s in self.served.values():
            s.worker.stop(5.0)
        self.generation.stop(5.0)

    @property
    def ready(self) -> bool:
        return self._started and not self._stopping and all(s.ready for s in self.served.values()) and self.generation.ready

    def _decoder_reply(self, request: Request) -> Response | None:
        """The answer of a v2 metadata / ready / infer route for a text-generation model (None: not one)."""
        name = request.path_params["name"]
        d = self.generation.served.get(name)
        if d is None:
            return None
        version = request.path_params.get("version")
        if version is not None and version != d.version:
            return _error(404, f"model {name!r} has version {d.version!r}, not {version!r}")
        path = request.url.path
        if path.endswith("/infer"):
            return _error(400, f"model {name!r} is a text-generation model: POST /v2/models/{name}/generate or /generate_stream "
                               f"(Triton's generate extension) or /v1/chat/completions; /infer takes tensors")  # fmt: skip
        if path.endswith("/ready"):
            return Response(status_code=200 if self.generation.ready and not d.closed and not self._stopping else 503)
        return JSONResponse(d.metadata())

    def _model(self, request: Request) -> ServedModel:
        name = request.path_params["name"]
        version = request.path_params.get("version")
        s = self.served.get(name)
        if s is None:
            known = sorted(self.served) + sorted(self.generation.served)
            raise _Reply(404, f"model {name!r} is not served here; models: {known}")
        if version is not None and version != s.version:
            raise _Reply(404, f"model {name!r} has version {s.version!r}, not {version!r}")
        return s

    # -- routes ----------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready_route(self, request: Request) -> Response:
        return Response(status_code=200 if self.ready else 503)

    async def server_metadata(self, request: Request) -> Response:
        extensions = [protocol.BINARY_EXTENSION] + ([GENERATE_EXTENSION] if self.generation.served else [])
        return JSONResponse({"name": SERVER_NAME, "version": __version__, "extensions": extensions})

    async def model_metadata(self, request: Request) -> Response:
        decoder = self._decoder_reply(request)
        if decoder is not None:
            return decoder
        try:
            return JSONResponse(self._model(request).metadata())
        except _Reply as r:
            return _error(r.status, r.message, r.headers)

    async def model_ready(self, request: Request) -> Response:
        decoder = self._decoder_reply(request)
        if decoder is not None:
            return decoder
        try:
            s = self._model(request)
        except _Reply as r:
            return _error(r.status, r.message, r.headers)
        return Response(status_code=200 if s.ready and not self._stopping else 503)

    async def metrics(self, request: Request) -> Response:
        return Response(self.registry.render(), media_type=METRICS_CONTENT_TYPE)

    async def infer(self, request: Request) -> Response:
        t0 = time.perf_counter()
        deadline = t0 + self.options.timeout_s
        served: ServedModel | None = None
        status = 500
        try:
            decoder = self._decoder_reply(request)
            if decoder is not None:
                status = decoder.status_code
                return decoder
            served = self._model(request)
            body = await _read_body(request, self.options.max_body_bytes)
            headers = {k.lower(): v for k, v in request.headers.items()}
            req, job = await self._prepare(served, body, headers, deadline)
            outputs = await self._run(served, job, deadline)
            response = await run_in_threadpool(self._encode, served, req, outputs)
            status = 200
            served.succeeded += 1
            served.duration_s += time.perf_counter() - t0
            return response
        except _Reply as r:
            status = r.status
            return _error(r.status, r.message, r.headers)
        except Exception as e:  # a model or encoding failure: the message, never a traceback (and the log's tracebacks are rate-limited)
            self.failures.exception("serve: infer on %s failed", served.name if served else "?", exc=e)
            status = 500
            return _error(500, f"inference failed: {type(e).__name__}: {e}")
        finally:
            key = served.requests if served is not None else self._unknown_requests
            key[status] = key.get(status, 0) + 1

    async def _prepare(
        self, served: ServedModel, body: bytes, headers: Mapping[str, str], deadline: float
    ) -> tuple[protocol.InferRequest, Job]:
        """Decode and validate on the thread pool; a large body waits for one of the
        ``max_decodes`` slots (JSON parsing holds several times the body in Python objects)."""
        if len(body) < LARGE_BODY:
            return await run_in_threadpool(served.prepare, body, headers, self.options.max_body_bytes)
        async with self.decodes:  # waiters are bounded by the body budget: each holds >= LARGE_BODY of it
            if time.perf_counter() > deadline:
                raise _Reply(
                    503, f"model {served.name}: the server was busy decoding other large bodies; retry later", {"Retry-After": "1"}
                )
            return await run_in_threadpool(served.prepare, body, headers, self.options.max_body_bytes)

    async def _run(self, served: ServedModel, job: Job, deadline: float) -> Mapping[str, np.ndarray]:
        try:
            fut = served.worker.submit(job)
        except QueueFullError as e:
            raise _Reply(503, str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except WorkerStoppedError as e:
            raise _Reply(503, str(e), {"Retry-After": "1"}) from None
        remaining = deadline - time.perf_counter()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), max(remaining, 0.0))
        except asyncio.CancelledError:  # the client went away
            served.worker.discard(job)
            raise
        except asyncio.TimeoutError:
            served.worker.discard(job)
            raise _Reply(504, f"model {served.name}: no result within the server's timeout of {self.options.timeout_s:g} s") from None
        except WorkerStoppedError as e:
            raise _Reply(503, str(e), {"Retry-After": "1"}) from None
        except InputError as e:
            raise _Reply(400, f"model {served.name}: {e}") from None

    def _encode(self, served: ServedModel, req: protocol.InferRequest, outputs: Mapping[str, np.ndarray]) -> Response:
        names = [o.name for o in req.outputs] if req.outputs else list(served.output_names)
        chosen = {n: outputs[n] for n in names}
        binary = [n for n in names if req.wants_binary(n)]
        try:
            body, headers = protocol.encode_response(served.name, chosen, model_version=served.version, request_id=req.id, binary=binary)
        except protocol.ProtocolError as e:  # e.g. an infinity asked for as JSON
            raise _Reply(500, f"model {served.name}: the outputs cannot be encoded as asked: {e}") from None
        return Response(body, status_code=200, headers=headers)

    # -- metrics ---------------------------------------------------------------------

    def samples(self) -> list[Sample]:
        """The collector behind ``/metrics`` (copies the counters first: a registry may be
        rendered from another thread than the event loop that updates them)."""
        out: list[Sample] = [
            Sample("edge_sdk_serve_inflight_body_bytes", self.budget.held, "request bytes held by requests in flight", "gauge"),
            Sample("edge_sdk_serve_inflight_body_capacity_bytes", self.budget.limit, "request bytes requests in flight may hold", "gauge"),
            Sample("edge_sdk_serve_body_budget_refused_total", self.budget.refused, "requests answered 503: body budget spent", "counter"),
            Sample(
                "edge_sdk_serve_failures_total", self.failures.total, "requests answered 500 (tracebacks logged rate-limited)", "counter"
            ),
        ]
        req_help = "infer requests answered, by model and HTTP status code"
        for code, n in sorted(dict(self._unknown_requests).items()):
            out.append(Sample("edge_sdk_serve_requests_total", n, req_help, "counter", {"model": _UNKNOWN, "code": str(code)}))
        for name, s in self.served.items():
            lab = {"model": name}
            requests = dict(s.requests)
            for code, n in sorted(requests.items()):
                out.append(Sample("edge_sdk_serve_requests_total", n, req_help, "counter", {**lab, "code": str(code)}))
            st = s.worker.stats()
            failed = sum(n for code, n in requests.items() if code != 200)
            out += [
                Sample("edge_sdk_serve_request_success_total", s.succeeded, "infer requests answered 200", "counter", lab),
                Sample("edge_sdk_serve_request_failure_total", failed, "infer requests answered with an error status", "counter", lab),
                Sample(
                    "edge_sdk_serve_request_duration_seconds_sum", s.duration_s, "successful requests, arrival to response", "counter", lab
                ),  # fmt: skip
                Sample("edge_sdk_serve_request_duration_seconds_count", s.succeeded, "successful requests timed", "counter", lab),
                Sample("edge_sdk_serve_inference_count_total", st.rows, "rows inferred (a batch of n rows counts n)", "counter", lab),
                Sample("edge_sdk_serve_execution_count_total", st.executions, "model calls", "counter", lab),
                Sample("edge_sdk_serve_batch_size_sum", st.rows, "rows per model call: sum", "counter", lab),
                Sample("edge_sdk_serve_batch_size_count", st.executions, "rows per model call: count", "counter", lab),
                Sample("edge_sdk_serve_compute_duration_seconds_sum", st.compute_s, "time in model calls", "counter", lab),
                Sample("edge_sdk_serve_queue_duration_seconds_sum", st.queue_s, "time waited before the model call", "counter", lab),
                Sample("edge_sdk_serve_queue_duration_seconds_count", st.jobs, "requests that reached a model call", "counter", lab),
                Sample("edge_sdk_serve_model_failures_total", st.failures, "requests whose model call raised", "counter", lab),
                Sample("edge_sdk_serve_queue_depth", st.queue_depth, "requests waiting", "gauge", lab),
                Sample("edge_sdk_serve_queue_capacity", st.queue_capacity, "requests that may wait before 503", "gauge", lab),
                Sample("edge_sdk_serve_max_batch_size", st.max_batch, "rows per model call at most", "gauge", lab),
                Sample("edge_sdk_serve_model_ready", 1.0 if s.ready else 0.0, "1 when the model is ready", "gauge", lab),
            ]
        return out


def create_app(models: Mapping[str, Any] | Sequence[Any], options: ServeOptions | None = None) -> Starlette:
    """A Starlette app serving ``models`` (a sequence: each under its manifest name; a mapping:
    under the given names) over the Open Inference Protocol; text-generation models (a
    :class:`~edge_sdk.generation.DecoderModel`, or anything with its ``stream`` / ``encode`` /
    ``render_chat`` / ``max_context`` / ``package``) over the OpenAI-compatible API and Triton's
    generate extension too. Model workers start with the app's lifespan and stop with it
    (bounded; running generations are cancelled); the models stay open (the caller closes them).

    ``app.state.serve`` is the state behind the routes; ``app.state.registry`` the telemetry
    :class:`~edge_sdk.telemetry.Registry` behind ``/metrics`` (add collectors to it)."""
    options = options or ServeOptions()
    st = _App(models, options)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if _is_openai_path(request.url.path):
            return openai_error(
                exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", headers=getattr(exc, "headers", None)
            )
        return _error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> Response:  # JSON, not Starlette's text; the server logs (rate-limited)
        if _is_openai_path(request.url.path):
            return openai_error(500, f"the server failed: {type(exc).__name__}", code="server_error")
        return _error(500, f"the server failed: {type(exc).__name__}")

    model = "/v2/models/{name}"
    version = "/v2/models/{name}/versions/{version}"
    routes = [
        Route("/v2/health/live", st.live, methods=["GET"]),
        Route("/v2/health/ready", st.ready_route, methods=["GET"]),
        Route("/v2", st.server_metadata, methods=["GET"]),
        Route("/metrics", st.metrics, methods=["GET"]),
        Route(model, st.model_metadata, methods=["GET"]),
        Route(version, st.model_metadata, methods=["GET"]),
        Route(model + "/ready", st.model_ready, methods=["GET"]),
        Route(version + "/ready", st.model_ready, methods=["GET"]),
        Route(model + "/infer", st.infer, methods=["POST"]),
        Route(version + "/infer", st.infer, methods=["POST"]),
        *st.generation.routes(),
    ]
    middleware = [Middleware(BearerAuth, token=options.token)] if options.token else []
    middleware.append(Middleware(RequestGuard, options=options, budget=st.budget))
    handlers: dict[Any, Any] = {HTTPException: http_error, Exception: server_error}
    app = Starlette(routes=routes, middleware=middleware, lifespan=st.lifespan, exception_handlers=handlers)
    app.state.serve = st
    app.state.registry = st.registry
    return app
