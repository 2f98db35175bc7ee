"""The text-generation routes of ``edge-sdk serve``: the OpenAI-compatible API (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``) and Triton's generate extension (``/v2/models/{name}/generate``,
``/generate_stream``), for decoder packages (see :mod:`edge_sdk.serve` for the endpoints).

What is served is anything that satisfies :class:`TextGenerator`: ``stream(prompt_or_messages, **kw)``
returning a text stream (an iterator of text deltas with ``cancel()``, ``close()`` and ``result``),
``encode(prompt)``, ``max_context``, ``render_chat`` and ``package.manifest.name`` / ``.version``. A
:class:`~edge_sdk.generation.DecoderModel` is one (one sequence at a time: a second stream waits for
the first); a concurrent engine with the same methods is another. Nothing else of the object is used.

Each generation runs on a thread of its model's pool (at most the model's ``capacity``: a
:class:`~edge_sdk.generation.engine.GenerationEngine`'s ``max_streams + queue_size``; for a
one-sequence model ``queue_size + 1``, one running and ``queue_size`` waiting), one delta at a time, and hands its
deltas to the event loop through an asyncio queue: the loop never blocks on a model. A request
past that bound, or one the engine refuses with :class:`~edge_sdk.errors.GenerationBusyError`, is
answered 429 (OpenAI routes: their rate-limit status) or 503 (Triton's) with ``Retry-After``. A
client that disconnects cancels its generation (the model stops before its next token); a
non-streaming generation gets ``timeout_s`` as its deadline. Errors are typed JSON: OpenAI's
``{"error": {"message", "type", "param", "code"}}`` on ``/v1``, ``{"error": message}`` on ``/v2``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence, runtime_checkable

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..errors import ContextBudgetError, GenerationBusyError, InputError, OptionsError, SessionClosedError, TemplateError
from ..remote import protocol
from ..telemetry import Sample
from .options import ServeOptions

__all__ = ["GenerateAPI", "GenerateError", "ServedDecoder", "TextGenerator", "is_text_generator", "openai_error"]

_log = logging.getLogger(__name__)

_UNKNOWN = "(unknown)"  # the model label of requests for models not served (bounded label values)
#: A non-streaming generation past its deadline normally ends itself ("deadline"); one still
#: queued behind another generation that long is answered 504 after this much more.
_DEADLINE_GRACE_S = 1.0
OWNER = "edge-sdk"
PLATFORM = "text-generation"  # the v2 metadata ``platform`` of a decoder
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@runtime_checkable
class TextGenerator(Protocol):
    """What the generation routes serve (a :class:`~edge_sdk.generation.DecoderModel`, or an engine
    with the same methods). ``stream`` returns an iterator of text deltas with ``cancel()`` (from any
    thread: stop before the next token), ``close()`` and ``result`` (``text``, ``finish_reason``,
    ``usage.prompt_tokens`` / ``completion_tokens``) once it ends; it takes ``max_new_tokens``,
    ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, ``seed``, ``stop``,
    ``ignore_eos`` and ``deadline_s``, and raises the SDK's typed errors for bad input (and
    GenerationBusyError when it cannot take more)."""

    package: Any  # .manifest.name, .manifest.version

    @property
    def max_context(self) -> int:
        """Tokens the model's context holds (prompt + generated)."""
        ...

    def stream(self, prompt: Any, /, **kw: Any) -> Any:
        """A text stream of ``prompt`` (a string, or chat messages through the template)."""
        ...

    def encode(self, prompt: Any, /) -> Sequence[int]:
        """The token ids a generation would run for ``prompt``."""
        ...

    def render_chat(self, messages: Any, /, **kw: Any) -> str:
        """The prompt the chat template makes of ``messages``."""
        ...


def is_text_generator(obj: object) -> bool:
    """True for an object the generation routes can serve (duck-typed: see :class:`TextGenerator`)."""
    return all(callable(getattr(obj, n, None)) for n in ("stream", "encode", "render_chat")) and hasattr(obj, "package")


# ----------------------------------------------------------------------------------- errors


_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error", 429: "rate_limit_error"}  # fmt: skip


class GenerateError(Exception):
    """An error answer of a generation route: status, message, OpenAI ``param`` / ``code``, and
    ``retry_after`` (seconds) for busy answers (``busy``: 429 on OpenAI routes, 503 on Triton's)."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, retry_after: int | None = None,
        busy: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.busy = busy

    def _headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}

    def openai(self) -> Response:
        """OpenAI's error shape."""
        status = 429 if self.busy else self.status
        return openai_error(status, self.message, param=self.param, code=self.code, headers=self._headers())

    def triton(self) -> Response:
        """The v2 / generate extension's ``{"error": message}``."""
        status = 503 if self.busy else self.status
        return JSONResponse({"error": self.message}, status_code=status, headers=self._headers())

    def openai_event(self) -> bytes:
        """The error as an SSE event (a stream that already began cannot change its status)."""
        return _sse({"error": _openai_error_obj(429 if self.busy else self.status, self.message, self.param, self.code)})


def _openai_error_obj(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}


def openai_error(
    status: int, message: str, *, param: str | None = None, code: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """``{"error": {"message", "type", "param", "code"}}`` with ``status`` (what OpenAI's clients parse)."""
    body = {"error": _openai_error_obj(status, message, param, code)}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


#: SDK keyword -> the OpenAI parameter a client set it with (for ``param`` of a 400).
_PARAM_NAMES = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                "repetition_penalty": "repetition_penalty", "seed": "seed", "stop": "stop", "prompt": "prompt",
                "messages": "messages"}  # fmt: skip


def _from_sdk(e: BaseException, prompt_param: str) -> GenerateError:
    """The answer to an exception of ``stream()`` / ``encode()`` or of a running generation."""
    if isinstance(e, GenerateError):
        return e
    if isinstance(e, GenerationBusyError):
        return GenerateError(429, str(e), code="rate_limit_exceeded", retry_after=max(1, int(e.retry_after_s)), busy=True)
    if isinstance(e, ContextBudgetError):
        return GenerateError(400, str(e), param=prompt_param, code="context_length_exceeded")
    if isinstance(e, (OptionsError, InputError, TemplateError)):  # SamplingError, PromptError too
        m = re.match(r"(\w+)(?:\[\d+\])?:", str(e))
        param = _PARAM_NAMES.get(m.group(1)) if m else None
        if param in ("prompt", "messages") or (param is None and isinstance(e, InputError)):  # PromptError
            param = prompt_param
        if isinstance(e, TemplateError):
            param = "messages"
        return GenerateError(400, str(e), param=param, code="invalid_value" if param else None)
    if isinstance(e, SessionClosedError):
        return GenerateError(503, f"the model is closed: {e}", code="unavailable", retry_after=1)
    return GenerateError(500, f"generation failed: {type(e).__name__}: {e}", code="server_error")


# ----------------------------------------------------------------------------------- requests


@dataclass
class _Params:
    """Generation keywords from a request (None: not given; the model's default applies)."""

    max_tokens: int | None = None
    default_max_tokens: int | None = None  # None: fill the room the context leaves
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    ignore_eos: bool | None = None

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "ignore_eos"):
            v = getattr(self, k)
            if v is not None:
                kw[k] = v
        if self.stop:
            kw["stop"] = list(self.stop)
        return kw


@dataclass
class _Request:
    model: str
    prompt: Any  # str or messages
    params: _Params
    stream: bool = False
    include_usage: bool = False


def _bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> GenerateError:
    return GenerateError(400, message, param=param, code=code if param else None)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: Mapping[str, Any], key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    try:
        ok = _is_num(v) and math.isfinite(v)
    except OverflowError:  # an int past float (a 400-digit number)
        ok = False
    if not ok:
        raise _bad(f"{key}: expected a finite number, got {_short(v)}", key)
    return float(v)


def _int(body: Mapping[str, Any], key: str, minimum: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v) or (minimum is not None and v < minimum) or abs(v) >= 1 << 63:
        raise _bad(f"{key}: expected an integer" + (f" >= {minimum}" if minimum is not None else "") + f" (64-bit), got {_short(v)}", key)
    return int(v)


def _short(v: Any) -> str:
    return protocol._short(v)


def _stop(body: Mapping[str, Any], key: str, limit: int | None = 4) -> tuple[str, ...] | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        return (v,) if v else None
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v) or (limit is not None and len(v) > limit):
        raise _bad(f"{key}: expected a string or a list of at most {limit} strings, got {v!r}", key)
    return tuple(v) or None


def _sampling(body: Mapping[str, Any], p: _Params) -> None:
    p.temperature = _number(body, "temperature") if body.get("temperature") is not None else p.temperature
    p.top_p = _number(body, "top_p") if body.get("top_p") is not None else p.top_p
    p.min_p = _number(body, "min_p")
    p.repetition_penalty = _number(body, "repetition_penalty")
    top_k = _int(body, "top_k", -1)
    p.top_k = None if top_k is None else max(top_k, 0)  # -1 (vLLM's "off") is 0 here
    p.seed = _int(body, "seed")
    ie = body.get("ignore_eos")
    if ie is not None and not isinstance(ie, bool):
        raise _bad(f"ignore_eos: expected true or false, got {ie!r}", "ignore_eos")
    p.ignore_eos = ie


# OpenAI parameters accepted and ignored (they change nothing about the text), and extensions
# (vLLM's spelling) that map onto the SDK's sampling.
_IGNORED = {
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "stream_options",
}
_EXTENSIONS = {"top_k", "min_p", "repetition_penalty", "ignore_eos"}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "presence_penalty", "frequency_penalty",
           "logprobs", "top_logprobs", "logit_bias"} | _IGNORED | _EXTENSIONS  # fmt: skip
_CHAT = _COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
                   "response_format", "modalities", "audio", "prediction", "reasoning_effort", "verbosity", "web_search_options"}  # fmt: skip
_COMPLETION = _COMMON | {"prompt", "echo", "best_of", "suffix"}


def _refusals(body: Mapping[str, Any], chat: bool) -> list[tuple[str, str]]:
    """(param, why) for every parameter whose value would change what is generated or returned in
    a way this server does not do."""
    out: list[tuple[str, str]] = []

    def refuse(key: str, ok: bool, why: str) -> None:
        if key in body and body[key] is not None and not ok:
            out.append((key, f"{key}={json.dumps(body[key])[:60]} ({why})"))

    g = body.get
    refuse("n", g("n") == 1, "only n=1 is supported")
    for k in ("presence_penalty", "frequency_penalty"):
        refuse(k, _is_num(g(k)) and g(k) == 0, f"{k} is not supported; use repetition_penalty")
    refuse("logprobs", g("logprobs") is False if chat else False, "log probabilities are not computed")
    refuse("top_logprobs", g("top_logprobs") == 0, "log probabilities are not computed")
    refuse("logit_bias", g("logit_bias") == {}, "logit bias is not supported")
    if chat:
        refuse("tools", g("tools") == [], "tool calling is not supported")
        refuse("functions", g("functions") == [], "function calling is not supported")
        refuse("tool_choice", g("tool_choice") in ("none", "auto"), "tool calling is not supported")
        refuse("function_call", g("function_call") in ("none", "auto"), "function calling is not supported")
        rf = g("response_format")
        refuse(
            "response_format", isinstance(rf, dict) and rf.get("type") == "text", "only text output is supported (no JSON mode or schema)"
        )
        refuse("modalities", g("modalities") == ["text"], "only text output is supported")
        refuse("audio", False, "audio output is not supported")
        refuse("web_search_options", False, "web search is not supported")
    else:
        refuse("echo", g("echo") is False, "echo is not supported")
        refuse("best_of", g("best_of") == 1, "only best_of=1 is supported")
        refuse("suffix", g("suffix") == "", "suffix (insertion) is not supported")
    return out


def _messages(v: object) -> list[dict[str, str]]:
    if not isinstance(v, list) or not v:
        raise _bad("messages: expected a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}]: expected an object with role and content, got {type(m).__name__}", "messages")
        role = m.get("role")
        if m.get("tool_calls") or m.get("function_call") or role == "function":
            raise _bad(f"messages[{i}]: tool and function calls are not supported", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise _bad(f"messages[{i}].content: only text parts are supported, got {kind!r}", "messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        if not isinstance(role, str) or not isinstance(content, str):
            raise _bad(f"messages[{i}]: expected a string role and string (or text parts) content, got role {role!r}, "
                       f"content {type(content).__name__}", "messages")  # fmt: skip
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse_openai(body: Mapping[str, Any], chat: bool) -> _Request:
    """Check an OpenAI chat / completions request. Raises GenerateError(400) naming the parameter."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: expected the name of a served model (GET /v1/models lists them)", "model", "missing_required_parameter")
    allowed = _CHAT if chat else _COMPLETION
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise _bad(f"unrecognized request argument(s): {', '.join(unknown)}", unknown[0], "unknown_parameter")
    refused = _refusals(body, chat)
    if refused:
        raise _bad("unsupported parameter(s): " + "; ".join(why for _, why in refused), refused[0][0], "unsupported_parameter")
    p = _Params(temperature=1.0, top_p=1.0)  # OpenAI's defaults (the SDK's own default is greedy)
    if chat:
        prompt: Any = _messages(body.get("messages"))
        mct = _int(body, "max_completion_tokens", 1)
        p.max_tokens = mct if mct is not None else _int(body, "max_tokens", 1)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad("prompt: expected a string (token-id prompts and several prompts per request are not supported)", "prompt")
        p.max_tokens = _int(body, "max_tokens", 1)
        p.default_max_tokens = 16  # the completions API's documented default
    _sampling(body, p)
    p.stop = _stop(body, "stop")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad(f"stream: expected true or false, got {stream!r}", "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise _bad(f"stream_options: expected an object, got {so!r}", "stream_options")
    include_usage = bool(so.get("include_usage")) if so else False
    return _Request(model, prompt, p, bool(stream), include_usage)


_TRITON_PARAMS = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop", "stop_words", "bad_words",
                  "ignore_eos", "stream", "exclude_input_in_output", "return_log_probs"}  # fmt: skip


def parse_triton(body: Mapping[str, Any], model: str) -> _Request:
    """Check a generate-extension request: ``text_input`` and ``parameters`` (top-level keys other
    than those two count as parameters too, as Triton's TensorRT-LLM examples send them)."""
    text = body.get("text_input")
    if not isinstance(text, str):
        raise _bad(f"text_input: expected a string, got {type(text).__name__}")
    params = body.get("parameters", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _bad(f"parameters: expected an object, got {type(params).__name__}")
    params = dict(params)
    for k, v in body.items():
        if k not in ("text_input", "parameters"):
            params.setdefault(k, v)
    unknown = sorted(k for k in params if k not in _TRITON_PARAMS)
    if unknown:
        raise _bad(f"unknown parameter(s) {unknown}; supported: {sorted(_TRITON_PARAMS)}")
    for key, ok, why in (
        ("bad_words", params.get("bad_words") in (None, "", []), "bad words are not supported"),
        ("exclude_input_in_output", params.get("exclude_input_in_output") in (None, True), "the output never includes the input"),
        ("return_log_probs", params.get("return_log_probs") in (None, False), "log probabilities are not computed"),
    ):
        if not ok:
            raise _bad(f"{key}={json.dumps(params[key])[:60]}: {why}")
    if params.get("stream") is not None and not isinstance(params["stream"], bool):
        raise _bad(f"stream: expected true or false, got {params['stream']!r}")
    p = _Params(max_tokens=_int(params, "max_tokens", 1), default_max_tokens=256)
    _sampling(params, p)
    stops = (_stop(params, "stop", None) or ()) + (_stop(params, "stop_words", None) or ())
    p.stop = stops or None
    return _Request(model, text, p)


# ----------------------------------------------------------------------------------- generation runs


class _Run:
    """One generation on a thread of its model's pool: deltas into an asyncio queue, then one
    terminal item: ("done", result) / ("error", exception) from the thread, or ("cancelled", why)
    put by :meth:`cancel` (so a consumer is not held by a generation still waiting for the model)."""

    def __init__(self, served: "ServedDecoder", stream: Any, loop: asyncio.AbstractEventLoop, t0: float) -> None:
        self.served = served
        self.stream = stream
        self.loop = loop
        self.t0 = t0
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.cancelled: str | None = None  # why, once cancel() ran
        self.finished = threading.Event()  # the thread is done with the model
        self.ttft_s: float | None = None
        self._lock = threading.Lock()

    def produce(self) -> None:
        s = self.stream
        result: Any = None
        error: BaseException | None = None
        try:
            if self.cancelled is None:  # cancelled while it waited for a thread: never start it
                for delta in s:
                    if self.ttft_s is None:
                        self.ttft_s = time.perf_counter() - self.t0
                        self.served.first_token(self.ttft_s)
                    self._push(("delta", delta))
                result = getattr(s, "result", None)
            self._push(("done", result))
        except BaseException as e:  # noqa: BLE001  # a generation's failure goes to its request
            error = e
            self._push(("error", e))
        finally:
            try:
                s.close()
            except Exception:  # noqa: BLE001
                _log.exception("serve: closing a text stream of %s failed", self.served.name)
            self.served.finished(self, result, error)
            self.finished.set()

    def _push(self, item: tuple[str, Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (the server stopped): nobody reads it
            self.cancel("shutdown")

    def cancel(self, why: str) -> None:
        """Stop the generation before its next token (any thread) and wake its consumer."""
        with self._lock:
            if self.cancelled is not None or self.finished.is_set():
                return
            self.cancelled = why
        try:
            self.stream.cancel()
        except Exception:  # noqa: BLE001
            _log.exception("serve: cancelling a text stream of %s failed", self.served.name)
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ("cancelled", why))
        except RuntimeError:
            pass

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """("delta", text)* then one of ("done", result), ("error", exc), ("cancelled", why)."""
        while True:
            kind, v = await self.queue.get()
            yield kind, v
            if kind != "delta":
                return

    async def final(self) -> tuple[str, Any]:
        """The terminal item (deltas skipped: the result holds the whole text)."""
        async for kind, v in self.events():
            if kind != "delta":
                return kind, v
        raise AssertionError("unreachable")  # pragma: no cover


async def _watch_disconnect(receive: Receive, run: _Run) -> None:
    """Cancel ``run`` when the client goes away (the request body was read already, so the next
    message is the disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            run.cancel("disconnected")
            return


class _SSEResponse(Response):
    """Server-sent events from ``body`` while watching for the client's disconnect, which cancels
    the generation (a send to a gone client fails silently in uvicorn, so the watch is what notices)."""

    media_type = "text/event-stream"

    def __init__(self, run: _Run, body: AsyncIterator[bytes]) -> None:
        self.run = run
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = asyncio.ensure_future(_watch_disconnect(receive, self.run))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                if self.run.cancelled == "disconnected":
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-send
            pass
        finally:
            watch.cancel()
            self.run.cancel("disconnected")  # a no-op once it finished
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


# ----------------------------------------------------------------------------------- served models


class ServedDecoder:
    """One text-generation model as served: admission (at most ``capacity`` generations at once),
    its generation threads, and the counters behind ``/metrics``."""

    def __init__(self, name: str, model: Any, capacity: int) -> None:
        self.name = name
        self.model = model
        manifest = model.package.manifest
        self.version = str(manifest.version)
        self.capacity = capacity
        self.created = int(time.time())
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self.runs: set[_Run] = set()
        self.in_flight = 0
        self.requests: dict[tuple[str, int], int] = {}  # (route, status) -> count (event-loop thread only)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.ttft_sum_s = 0.0
        self.ttft_count = 0
        self.duration_sum_s = 0.0
        self.generations = 0
        self.finish: dict[str, int] = {}  # finish reason (or "error") -> count
        self._mean_s: float | None = None  # recent generation duration (for Retry-After)

    @property
    def closed(self) -> bool:
        """True once the model was closed (objects without ``closed`` never are)."""
        return bool(getattr(self.model, "closed", False))

    def metadata(self) -> dict[str, Any]:
        """The v2 model metadata of a decoder: text in, text out (Triton's generate-extension models)."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": PLATFORM,
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}],
        }

    def executor(self) -> ThreadPoolExecutor:
        """The model's generation threads (made on first use, at most ``capacity``)."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.capacity, thread_name_prefix=f"edge-sdk-generate-{self.name}")
            return self._executor

    def admit(self) -> None:
        """Take a generation slot or raise the busy answer with a Retry-After estimate."""
        with self._lock:
            if self.in_flight >= self.capacity:
                waiting = self.in_flight
                per = self._mean_s if self._mean_s is not None else 1.0
                retry = max(1, min(3600, math.ceil(waiting * per)))
                raise GenerateError(
                    429, f"model {self.name}: {waiting} generations are running or waiting (the limit); retry in about {retry} s",
                    code="rate_limit_exceeded", retry_after=retry, busy=True,
                )  # fmt: skip
            self.in_flight += 1

    def unadmit(self) -> None:
        """Give back a slot taken by :meth:`admit` for a generation that never started."""
        with self._lock:
            self.in_flight -= 1

    def started(self, run: _Run) -> None:
        """Track a running generation (so that shutdown can cancel it)."""
        with self._lock:
            self.runs.add(run)

    def first_token(self, ttft_s: float) -> None:
        """Count a time to first text (generation thread)."""
        with self._lock:
            self.ttft_sum_s += ttft_s
            self.ttft_count += 1

    def finished(self, run: _Run, result: Any, error: BaseException | None) -> None:
        """Called by the generation thread when it is done with the model."""
        duration = time.perf_counter() - run.t0
        with self._lock:
            self.in_flight -= 1
            self.runs.discard(run)
            usage = getattr(result, "usage", None)
            if usage is not None:
                self.prompt_tokens += int(usage.prompt_tokens)
                self.completion_tokens += int(usage.completion_tokens)
            reason = "error" if error is not None else str(getattr(result, "finish_reason", None) or "cancelled")
            self.finish[reason] = self.finish.get(reason, 0) + 1
            self.generations += 1
            self.duration_sum_s += duration
            if error is None and reason != "cancelled":
                self._mean_s = duration if self._mean_s is None else 0.8 * self._mean_s + 0.2 * duration

    def cancel_all(self, why: str) -> None:
        """Cancel every running generation of this model (any thread)."""
        with self._lock:
            runs = list(self.runs)
        for r in runs:
            r.cancel(why)

    def shutdown(self) -> None:
        """Let the generation threads go (queued work is dropped)."""
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=False, cancel_futures=True)


# ----------------------------------------------------------------------------------- the routes


async def _read_json(request: Request, limit: int, decodes: asyncio.Semaphore | None = None) -> dict[str, Any]:
    """The request body (at most ``limit`` bytes: 413 past it) as a JSON object (400 otherwise:
    nesting past the recursion limit and numbers past Python's digit limit too); a large body is
    parsed in one of the ``decodes`` slots."""
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise _bad(f"Content-Length: expected an integer, got {cl[:40]!r}") from None
        if n > limit:
            raise GenerateError(413, f"body of {n} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise GenerateError(413, f"body is over the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise GenerateError(499, "the client went away before its body arrived") from None
    raw = b"".join(chunks)
    try:
        if len(raw) < 1 << 16:
            doc = protocol.loads_json(raw)
        elif decodes is None or len(raw) < 1 << 20:
            doc = await run_in_threadpool(protocol.loads_json, raw)
        else:
            async with decodes:
                doc = await run_in_threadpool(protocol.loads_json, raw)
    except protocol.ProtocolError as e:
        raise _bad(f"the body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise _bad(f"the body must be a JSON object, got {type(doc).__name__}")
    return doc


class GenerateAPI:
    """The state behind the generation routes (:func:`edge_sdk.serve.create_app` makes one)."""

    def __init__(self, decoders: Mapping[str, Any], options: ServeOptions, tensor_models: Sequence[str] = ()) -> None:
        self.options = options
        self.decodes: asyncio.Semaphore | None = None  # create_app shares its large-body decode slots
        self.failures: Any = None  # and its rate-limited traceback log (a TracebackLimiter)
        self.tensor_models = frozenset(tensor_models)  # the v2 (infer) models served beside, for a clear 400
        # an engine admits max_streams + its queue; a DecoderModel runs one and lets queue_size wait
        self.served = {name: ServedDecoder(name, m, int(getattr(m, "capacity", options.queue_size + 1))) for name, m in decoders.items()}
        self.stopping = False
        self._unknown: dict[tuple[str, int], int] = {}  # requests for models not served, by (route, status)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True while not stopping and no served model is closed."""
        return not self.stopping and not any(s.closed for s in self.served.values())

    def start(self) -> None:
        """Accept generations (the app's lifespan start)."""
        self.stopping = False

    def begin_shutdown(self) -> None:
        """Refuse new generations and cancel the running ones (any thread)."""
        self.stopping = True
        for s in self.served.values():
            s.cancel_all("shutdown")

    def stop(self, timeout_s: float = 5.0) -> None:
        """After :meth:`begin_shutdown`: wait (bounded) for the generation threads to let go of the models."""
        self.begin_shutdown()
        deadline = time.monotonic() + timeout_s
        while any(s.in_flight for s in self.served.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        for s in self.served.values():
            s.shutdown()

    # -- helpers -----------------------------------------------------------------------

    def _decoder(self, name: str, version: str | None = None) -> ServedDecoder:
        s = self.served.get(name)
        if s is None:
            raise GenerateError(404, f"the model {name!r} is not served here; text-generation models: {sorted(self.served)}",
                                param="model", code="model_not_found")  # fmt: skip
        if version is not None and version != s.version:
            raise GenerateError(404, f"model {name!r} has version {s.version!r}, not {version!r}", code="model_not_found")
        return s

    def _failed(self, e: BaseException, route: str, served: ServedDecoder | None) -> None:
        name = served.name if served else "?"
        if self.failures is not None:
            self.failures.exception("serve: %s on %s failed", route, name, exc=e)
        else:
            _log.error("serve: %s on %s failed", route, name, exc_info=e)

    def _count(self, served: ServedDecoder | None, route: str, status: int) -> None:
        table = served.requests if served is not None else self._unknown
        table[(route, status)] = table.get((route, status), 0) + 1

    def _open(self, served: ServedDecoder, prompt: Any, p: _Params, deadline_s: float | None) -> Any:
        """``stream()`` with the request's keywords (on the thread pool: tokenizing is CPU work)."""
        model = served.model
        kw = p.kwargs()
        max_new = p.max_tokens
        if max_new is None or p.default_max_tokens is not None:
            room = max(1, int(model.max_context) - len(model.encode(prompt)))  # 1 when full: stream() says it does not fit
            if max_new is None:
                max_new = room if p.default_max_tokens is None else min(p.default_max_tokens, room)
        kw["max_new_tokens"] = max_new
        if deadline_s is not None:
            kw["deadline_s"] = deadline_s
        return model.stream(prompt, **kw)

    async def _start(self, served: ServedDecoder, req: _Request, t0: float, prompt_param: str, deadline: float | None = None) -> _Run:
        if self.stopping:
            raise GenerateError(503, "the server is shutting down", code="unavailable", retry_after=1)
        served.admit()
        try:
            deadline_s = None if deadline is None else max(deadline - time.perf_counter(), 1e-3)
            stream = await run_in_threadpool(self._open, served, req.prompt, req.params, deadline_s)
        except BaseException as e:
            served.unadmit()
            if isinstance(e, Exception):
                raise _from_sdk(e, prompt_param) from None
            raise
        run = _Run(served, stream, asyncio.get_running_loop(), t0)
        served.started(run)
        try:
            served.executor().submit(run.produce)
        except RuntimeError:  # the pool was shut down: the server is stopping
            served.finished(run, None, None)
            raise GenerateError(503, "the server is shutting down", code="unavailable", retry_after=1) from None
        return run

    async def _complete(self, run: _Run, request: Request, deadline: float, prompt_param: str) -> Any:
        """Wait for a non-streaming generation (cancelled when the client goes away). Returns the result."""
        watch = asyncio.ensure_future(_watch_disconnect(request.receive, run))
        try:
            try:
                kind, v = await asyncio.wait_for(run.final(), max(deadline - time.perf_counter() + _DEADLINE_GRACE_S, 0.01))
            except asyncio.TimeoutError:
                run.cancel("timeout")
                raise GenerateError(504, f"no result within the server's timeout of {self.options.timeout_s:g} s", code="timeout") from None
        except BaseException:
            run.cancel("abandoned")
            raise
        finally:
            watch.cancel()
        if kind == "error":
            raise _from_sdk(v, prompt_param)
        if kind == "cancelled" or v is None or getattr(v, "finish_reason", None) == "cancelled":
            why = run.cancelled or "cancelled"
            if why == "disconnected":
                raise GenerateError(499, "the client closed the connection")
            raise GenerateError(503, f"the generation was cancelled ({why})", code="unavailable", retry_after=1)
        return v

    # -- OpenAI ------------------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        """``GET /v1/models``."""
        data = [{"id": s.name, "object": "model", "created": s.created, "owned_by": OWNER} for s in self.served.values()]
        return JSONResponse({"object": "list", "data": data})

    async def retrieve_model(self, request: Request) -> Response:
        """``GET /v1/models/{model}``."""
        try:
            s = self._decoder(request.path_params["model"])
        except GenerateError as e:
            return e.openai()
        return JSONResponse({"id": s.name, "object": "model", "created": s.created, "owned_by": OWNER})

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._openai(request, chat=True)

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._openai(request, chat=False)

    async def _openai(self, request: Request, chat: bool) -> Response:
        t0 = time.perf_counter()
        route = "chat_completions" if chat else "completions"
        prompt_param = "messages" if chat else "prompt"
        served: ServedDecoder | None = None
        status = 500
        try:
            body = await _read_json(request, self.options.max_body_bytes, self.decodes)
            name = body.get("model")
            if isinstance(name, str) and name:
                served = self._decoder(name)
            req = parse_openai(body, chat)
            served = self._decoder(req.model)
            if req.stream:
                run = await self._start(served, req, t0, prompt_param)
                status = 200
                return _SSEResponse(run, self._openai_stream(run, served, req, chat, prompt_param))
            deadline = t0 + self.options.timeout_s
            run = await self._start(served, req, t0, prompt_param, deadline)
            result = await self._complete(run, request, deadline, prompt_param)
            status = 200
            return JSONResponse(_openai_body(served, result, chat))
        except GenerateError as e:
            status = 429 if e.busy else e.status
            return e.openai()
        except Exception as e:  # a failure of the model or the server: the message, never a traceback
            self._failed(e, route, served)
            return openai_error(500, f"generation failed: {type(e).__name__}: {e}", code="server_error")
        finally:
            self._count(served, route, status)

    async def _openai_stream(self, run: _Run, served: ServedDecoder, req: _Request, chat: bool, prompt_param: str) -> AsyncIterator[bytes]:
        created = int(time.time())
        base: dict[str, Any] = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, "object": "chat.completion.chunk" if chat else
                                "text_completion", "created": created, "model": served.name}  # fmt: skip
        extra: dict[str, Any] = {"usage": None} if req.include_usage else {}

        def chunk(text: str | None, finish: str | None, role: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return _sse({**base, "choices": [choice], **extra})

        if chat:
            yield chunk(None, None, role=True)
        async for kind, v in run.events():
            if kind == "delta":
                yield chunk(v, None)
            elif kind == "done" and v is not None and v.finish_reason != "cancelled":
                yield chunk(None, _finish(v.finish_reason))
                if req.include_usage:
                    yield _sse({**base, "choices": [], "usage": _usage(v)})
                yield DONE
            elif kind == "error":
                yield _from_sdk(v, prompt_param).openai_event()
            else:  # cancelled: the server is stopping (a client that left reads nothing more)
                why = run.cancelled or "cancelled"
                yield GenerateError(503, f"the generation was cancelled ({why})", code="unavailable").openai_event()

    # -- Triton's generate extension ----------------------------------------------------

    async def generate(self, request: Request) -> Response:
        """``POST /v2/models/{name}[/versions/{v}]/generate``."""
        return await self._triton(request, stream=False)

    async def generate_stream(self, request: Request) -> Response:
        """``POST /v2/models/{name}[/versions/{v}]/generate_stream``."""
        return await self._triton(request, stream=True)

    async def _triton(self, request: Request, stream: bool) -> Response:
        t0 = time.perf_counter()
        route = "generate_stream" if stream else "generate"
        served: ServedDecoder | None = None
        status = 500
        try:
            name = request.path_params["name"]
            if name in self.tensor_models:
                raise GenerateError(400, f"model {name!r} is not a text-generation model: POST /v2/models/{name}/infer with tensors")
            served = self._decoder(name, request.path_params.get("version"))
            body = await _read_json(request, self.options.max_body_bytes, self.decodes)
            req = parse_triton(body, served.name)
            if stream:
                run = await self._start(served, req, t0, "text_input")
                status = 200
                return _SSEResponse(run, self._triton_stream(run, served))
            deadline = t0 + self.options.timeout_s
            run = await self._start(served, req, t0, "text_input", deadline)
            result = await self._complete(run, request, deadline, "text_input")
            status = 200
            return JSONResponse(
                {
                    "model_name": served.name,
                    "model_version": served.version,
                    "text_output": result.text,
                    "finish_reason": _finish(result.finish_reason),
                }
            )
        except GenerateError as e:
            status = 503 if e.busy else e.status
            return e.triton()
        except Exception as e:
            self._failed(e, route, served)
            return JSONResponse({"error": f"generation failed: {type(e).__name__}: {e}"}, status_code=500)
        finally:
            self._count(served, route, status)

    async def _triton_stream(self, run: _Run, served: ServedDecoder) -> AsyncIterator[bytes]:
        base = {"model_name": served.name, "model_version": served.version}
        async for kind, v in run.events():
            if kind == "delta":
                yield _sse({**base, "text_output": v})
            elif kind == "done" and v is not None and v.finish_reason != "cancelled":
                yield _sse({**base, "text_output": "", "finish_reason": _finish(v.finish_reason)})
            elif kind == "error":
                yield _sse({"error": _from_sdk(v, "text_input").message})
            else:
                yield _sse({"error": f"the generation was cancelled ({run.cancelled or 'cancelled'})"})

    # -- routes and metrics --------------------------------------------------------------

    def routes(self) -> list[Route]:
        """The routes to add to the app."""
        model = "/v2/models/{name}"
        version = "/v2/models/{name}/versions/{version}"
        return [
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.retrieve_model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route(model + "/generate", self.generate, methods=["POST"]),
            Route(version + "/generate", self.generate, methods=["POST"]),
            Route(model + "/generate_stream", self.generate_stream, methods=["POST"]),
            Route(version + "/generate_stream", self.generate_stream, methods=["POST"]),
        ]

    def samples(self) -> list[Sample]:
        """The generation series of ``/metrics`` (counters copied under each model's lock)."""
        out: list[Sample] = []
        req_help = "generation requests answered, by model, route and HTTP status code (499: the client left first)"
        for (route, code), n in sorted(dict(self._unknown).items()):
            out.append(
                Sample(
                    "edge_sdk_serve_generate_requests_total", n, req_help, "counter", {"model": _UNKNOWN, "route": route, "code": str(code)}
                )
            )
        for name, s in self.served.items():
            lab = {"model": name}
            for (route, code), n in sorted(dict(s.requests).items()):
                out.append(
                    Sample("edge_sdk_serve_generate_requests_total", n, req_help, "counter", {**lab, "route": route, "code": str(code)})
                )
            with s._lock:
                finish = dict(s.finish)
                figures = (s.prompt_tokens, s.completion_tokens, s.ttft_sum_s, s.ttft_count, s.duration_sum_s, s.generations, s.in_flight)
            prompt, completion, ttft_sum, ttft_n, dur_sum, gens, in_flight = figures
            for reason, n in sorted(finish.items()):
                out.append(Sample("edge_sdk_serve_generate_finish_total", n, "generations ended, by finish reason (or error)", "counter",
                                  {**lab, "reason": reason}))  # fmt: skip
            out += [
                Sample("edge_sdk_serve_generate_prompt_tokens_total", prompt, "prompt tokens run", "counter", lab),
                Sample("edge_sdk_serve_generate_completion_tokens_total", completion, "tokens generated", "counter", lab),
                Sample("edge_sdk_serve_generate_ttft_seconds_sum", ttft_sum, "arrival to the first text delta: sum", "counter", lab),
                Sample("edge_sdk_serve_generate_ttft_seconds_count", ttft_n, "generations that produced text", "counter", lab),
                Sample(
                    "edge_sdk_serve_generate_duration_seconds_sum", dur_sum, "arrival to the end of the generation: sum", "counter", lab
                ),
                Sample("edge_sdk_serve_generate_duration_seconds_count", gens, "generations ended", "counter", lab),
                Sample("edge_sdk_serve_generate_in_flight", in_flight, "generations running or waiting for the model", "gauge", lab),
                Sample("edge_sdk_serve_generate_capacity", s.capacity, "generations that may run or wait before 429/503", "gauge", lab),
                Sample("edge_sdk_serve_model_ready", 0.0 if s.closed or self.stopping else 1.0, "1 when the model is ready", "gauge", lab),
            ]
        return out


def _finish(reason: str) -> str:
    """OpenAI's finish_reason: a deadline cut the text short, as max_tokens does."""
    return "length" if reason == "deadline" else reason


def _usage(result: Any) -> dict[str, int]:
    u = result.usage
    return {"prompt_tokens": int(u.prompt_tokens), "completion_tokens": int(u.completion_tokens),
            "total_tokens": int(u.prompt_tokens) + int(u.completion_tokens)}  # fmt: skip


def _openai_body(served: ServedDecoder, result: Any, chat: bool) -> dict[str, Any]:
    finish = _finish(result.finish_reason)
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": result.text, "refusal": None}, "logprobs": None,
                                  "finish_reason": finish}  # fmt: skip
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
    return {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": served.name,
        "choices": [choice],
        "usage": _usage(result),
    }
