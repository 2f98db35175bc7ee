"""A client for OpenAI-compatible text generation servers, standard library only.

llama.cpp's ``llama-server``, vLLM, Ollama, LitServe's ``OpenAISpec`` and ``edge-sdk serve`` speak
the same two routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``, with ``GET
/v1/models`` to list what is served. The remote fallback router uses this client to offload a
generation, including one whose stream was already running locally: the remote continues from
the prompt plus the text so far (:func:`continuation_messages`, or ``prompt + text`` for
:meth:`OpenAIClient.complete_stream`).

::

    client = OpenAIClient("http://127.0.0.1:8080/v1", token=os.environ["TOKEN"], privacy=PrivacyPolicy("allowed"))
    r = client.chat("qwen", [{"role": "user", "content": "Hi"}], max_tokens=64, temperature=0.0)
    r.text, r.finish_reason, r.completion_tokens

    with client.chat_stream("qwen", messages, max_tokens=256) as stream:
        for delta in stream:
            print(delta, end="")
    stream.result.completion_tokens

**Wire format** (the primary sources):

- Chat completions: https://platform.openai.com/docs/api-reference/chat/create -- the answer's
  ``choices[0].message.content``, ``finish_reason``, ``usage.prompt_tokens`` /
  ``completion_tokens``, ``model``, ``id``. Completions (``choices[0].text``):
  https://platform.openai.com/docs/api-reference/completions/create. Models:
  https://platform.openai.com/docs/api-reference/models/list (``data[].id``).
- Streaming (``"stream": true``): https://platform.openai.com/docs/api-reference/chat-streaming
  -- a ``text/event-stream`` of ``data: {chunk}`` events, the text in
  ``choices[0].delta.content`` (``choices[0].text`` for completions), ended by ``data: [DONE]``.
  The client asks for ``stream_options: {"include_usage": true}``; the usage then comes in a
  last chunk (its ``choices`` empty), read when the server sends it.
- Server-sent events: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
  -- :class:`SSEDecoder` follows it: CRLF, LF or CR line ends; ``:`` comment lines (keepalives)
  skipped; several ``data:`` lines joined by a newline; ``event:``, ``id:``, ``retry:``; a leading
  BOM dropped; an event not ended by a blank line is not dispatched. A line over
  ``max_line_bytes`` or an event over ``max_event_bytes`` is a :class:`StreamProtocolError`.
  Tolerated beyond the spec: an ``error:`` field (llama.cpp's server reports stream errors as
  one), and a JSON (non-stream) answer to a stream request (one delta).

**Transport** is :class:`~edge_sdk.remote.client.RemoteClient`'s, reused, not copied: the
connect/read timeouts and the per-call ``deadline_s`` (a watchdog cuts a trickling server at the
deadline, in a stream too), TLS verification with ``ca_file`` and ``pins_sha256``, a bearer
``token`` only for https or loopback and never logged nor in a message, no redirects, retries
inside the retry budget with ``Retry-After`` (429/502/503/504, connection refused, a connect
timeout), the circuit breaker, and the typed errors of :mod:`edge_sdk.remote.errors`.

**Streams are never retried once the server answered** (the tokens may have been seen): a
stream that fails after its 200 raises a :class:`StreamInterruptedError` subclass --
:class:`StreamUnavailableError` (connection dropped, or the server sent an error event),
:class:`StreamTimeoutError` (deadline or read timeout), :class:`StreamProtocolError` (a malformed
or oversized event) -- whose ``partial`` holds the text, the deltas and the characters that had
arrived, so a caller can continue elsewhere. Each is also the matching ``Remote*Error``. The
breaker records a stream's outcome when it ends (a stream closed by the caller is a success).
``close()`` cancels a stream from any thread (the socket is shut down; the iteration then ends
and ``result.cancelled`` is True). A stream that ended with ``data: [DONE]`` and a clean end of
its body leaves its connection for the next call (keep-alive); any other end closes it.

**Privacy** (:mod:`edge_sdk.remote.privacy`): a prompt is user data. ``chat``/``complete`` check
the model's policy (the ``privacy`` argument, else the client's, else "never": nothing is sent)
before any byte leaves; an ``allowlist`` policy must name ``"messages"`` (chat) or ``"prompt"``
(completions).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import math
import random
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn, Sequence, TypeVar, Union
from urllib.parse import urlsplit

from .breaker import CircuitBreaker, RemoteEvent
from .client import (
    _TRANSPORT,
    _WATCHDOG,
    RemoteClient,
    RemoteEndpoint,
    _Arm,
    _Failed,
    _Response,
    _scrub,
    _StaleConnection,
)
from .errors import (
    RemoteConfigError,
    RemoteError,
    RemoteProtocolError,
    RemoteTimeoutError,
    RemoteUnavailableError,
)
from .privacy import PrivacyPolicy
from .retry import RetryBudget, RetryPolicy

__all__ = [
    "OpenAIClient",
    "OpenAIResult",
    "OpenAIStream",
    "SSEDecoder",
    "SSEError",
    "SSEEvent",
    "StreamInterruptedError",
    "StreamProtocolError",
    "StreamTimeoutError",
    "StreamUnavailableError",
    "continuation_messages",
]

_log = logging.getLogger("edge_sdk.remote")
T = TypeVar("T")
_CHUNK = 64 << 10
_ERROR_BODY_MAX = 64 << 10
_EOL = re.compile(rb"[\r\n]")
_BOM = b"\xef\xbb\xbf"
# Keys the client writes itself: ``extra`` may not set them (a typed argument exists, or the call decides).
_OWN_KEYS = frozenset(
    {"model", "messages", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop", "n"}
)


# ----------------------------------------------------------------------------------- results and errors


@dataclass(frozen=True)
class OpenAIResult:
    """A finished (or, as ``partial``, an interrupted) generation.

    ``text``: the generated text. ``finish_reason``: the server's (``"stop"``, ``"length"``, ...;
    None when it gave none or the stream did not end). ``prompt_tokens`` / ``completion_tokens``
    / ``total_tokens``: the server's usage, None when not reported. ``model`` / ``id``: as the
    server answered ("" if absent). ``elapsed_s``: from the call to the end. ``deltas``: text
    pieces received (1 for a non-stream answer with text). ``first_delta_s``: time to the first
    text piece (None: none came). ``attempts``: HTTP attempts made. ``cancelled``: the caller
    closed the stream before its end."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    model: str
    id: str
    elapsed_s: float
    deltas: int = 0
    first_delta_s: float | None = None
    attempts: int = 1
    cancelled: bool = False


class StreamInterruptedError(RemoteError):
    """A stream failed after the server had answered 200: never retried. ``partial``: what had
    arrived (``partial.text``, ``partial.deltas``, ``len(partial.text)`` characters, usage if the
    server had sent it), for a caller that continues the generation elsewhere."""

    def __init__(self, message: str, *, partial: OpenAIResult, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message, status=status, attempts=attempts)
        self.partial = partial

    @property
    def chars(self) -> int:
        """Characters of text received before the failure."""
        return len(self.partial.text)

    @property
    def deltas(self) -> int:
        """Text pieces (usually one token each) received before the failure."""
        return self.partial.deltas


class StreamUnavailableError(StreamInterruptedError, RemoteUnavailableError):
    """The connection dropped mid-stream, the stream ended before ``data: [DONE]``, or the server sent an error event."""


class StreamTimeoutError(StreamInterruptedError, RemoteTimeoutError):
    """The deadline passed, or no byte came for ``read_timeout_s``, mid-stream."""


class StreamProtocolError(StreamInterruptedError, RemoteProtocolError):
    """A stream event is malformed (not JSON, wrong types) or over a size limit."""


def continuation_messages(messages: Sequence[Mapping[str, Any]], text_so_far: str) -> list[dict[str, Any]]:
    """Messages that ask a chat server to continue ``text_so_far``: the conversation with the
    partial answer appended as a final assistant message (merged into one if the last message
    already is the assistant's). llama.cpp's server and Ollama continue a final assistant
    message as it is; vLLM needs ``extra={"continue_final_message": True, "add_generation_prompt": False}``.
    A server that does neither answers anew: for exact continuation use :meth:`OpenAIClient.complete_stream`
    with the prompt plus the text so far."""
    out = [dict(m) for m in messages]
    if out and out[-1].get("role") == "assistant" and isinstance(out[-1].get("content"), str):
        out[-1]["content"] = out[-1]["content"] + text_so_far
    else:
        out.append({"role": "assistant", "content": text_so_far})
    return out


# ----------------------------------------------------------------------------------- server-sent events


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: ``data`` (its ``data:`` lines joined by newlines), ``event`` (the type,
    ``"message"`` by default; ``"error"`` for the non-standard ``error:`` field), ``id`` (the last event id)."""

    data: str
    event: str = "message"
    id: str = ""


class SSEError(RemoteProtocolError):
    """A line or an event over its limit. ``events``: those completed by the same ``feed`` before it."""

    def __init__(self, message: str, events: list[SSEEvent]) -> None:
        super().__init__(message)
        self.events = events


class SSEDecoder:
    """An incremental ``text/event-stream`` parser (WHATWG HTML, "Event stream interpretation").

    ``feed(bytes)`` returns the events completed by those bytes; bytes may be split anywhere (in a
    UTF-8 sequence, between CR and LF). ``pending_data``: the data of an event not yet ended by a
    blank line (at the end of the stream it is discarded, as the spec says). A line longer than
    ``max_line_bytes`` or an event's data over ``max_event_bytes`` raises :class:`SSEError` (a
    RemoteProtocolError that holds the events completed before it)."""

    def __init__(self, *, max_line_bytes: int = 1 << 20, max_event_bytes: int = 4 << 20) -> None:
        if max_line_bytes < 1 or max_event_bytes < 1:
            raise RemoteConfigError("max_line_bytes and max_event_bytes: expected ints >= 1")
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self.last_event_id = ""
        self.retry_ms: int | None = None
        self._buf = bytearray()
        self._scan = 0  # no line end in _buf before this offset
        self._skip_lf = False  # the previous feed ended on CR: a leading LF belongs to it
        self._started = False  # the BOM check is done
        self._data: list[str] = []
        self._size = 0
        self._event = ""
        self._error: str | None = None

    @property
    def pending_data(self) -> str:
        """The data of the event in progress, joined, with a last ``data:`` (or ``error:``) line that
        has no line end yet (empty when none). For diagnostics only: at the end of a stream such an
        event is not dispatched."""
        data = list(self._data)
        tail = bytes(self._buf[: self.max_line_bytes]).decode("utf-8", "replace")
        field, colon, value = tail.partition(":")
        if colon and field in ("data", "error"):
            data.append(value[1:] if value[:1] == " " else value)
        if not data and self._error is not None:
            data.append(self._error)
        return "\n".join(data)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse ``chunk``; return the events it completed (in order)."""
        out: list[SSEEvent] = []
        if not chunk:
            return out
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        try:
            self._feed(chunk, out)
        except RemoteProtocolError as e:
            raise SSEError(str(e), out) from None
        return out

    def _feed(self, chunk: bytes, out: list[SSEEvent]) -> None:
        buf = self._buf
        buf.extend(chunk)
        if not self._started:
            if len(buf) < len(_BOM) and _BOM.startswith(bytes(buf)):
                return  # maybe a BOM: wait for more
            if buf.startswith(_BOM):
                del buf[: len(_BOM)]
            self._started = True
        start = 0
        scan = self._scan
        n = len(buf)
        while True:
            m = _EOL.search(buf, scan)
            if m is None:
                break
            i = m.start()
            if i - start > self.max_line_bytes:
                raise RemoteProtocolError(f"event stream: a line of {i - start} bytes is over the limit of {self.max_line_bytes}")
            if buf[i] == 0x0D:  # CR: CRLF, or CR alone
                if i + 1 < n:
                    end = i + 2 if buf[i + 1] == 0x0A else i + 1
                else:
                    end = i + 1
                    self._skip_lf = True
            else:
                end = i + 1
            self._line(bytes(buf[start:i]), out)
            start = scan = end
        del buf[:start]
        self._scan = len(buf)
        if len(buf) > self.max_line_bytes:
            raise RemoteProtocolError(f"event stream: a line of over {self.max_line_bytes} bytes (no line end yet)")

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        if not raw:
            self._dispatch(out)
            return
        line = raw.decode("utf-8", "replace")
        if line[0] == ":":
            return  # a comment: keepalives
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._size += len(raw) + 1
            if self._size > self.max_event_bytes:
                raise RemoteProtocolError(f"event stream: an event's data is over the limit of {self.max_event_bytes} bytes")
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif field == "retry":
            if value and value.isascii() and value.isdigit():
                self.retry_ms = int(value)
        elif field == "error":  # not in the spec: llama.cpp's server sends "error: {json}" then a blank line
            self._size += len(raw)
            if self._size > self.max_event_bytes:
                raise RemoteProtocolError(f"event stream: an event is over the limit of {self.max_event_bytes} bytes")
            self._error = value
        # any other field is ignored (the spec)

    def _dispatch(self, out: list[SSEEvent]) -> None:
        data, event, error = self._data, self._event, self._error
        self._data, self._size, self._event, self._error = [], 0, "", None
        if error is not None:
            out.append(SSEEvent(error, "error", self.last_event_id))
        elif data:
            out.append(SSEEvent("\n".join(data), event or "message", self.last_event_id))


# ----------------------------------------------------------------------------------- answer checks


_Usage = tuple[Union[int, None], Union[int, None], Union[int, None]]
_Answer = tuple[str, Union[str, None], _Usage, str, str]  # text, finish_reason, usage, model, id


def _opt_int(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise RemoteProtocolError(f"{where}: expected an int >= 0, got {v!r}"[:300])
    return v


def _usage(u: Any, where: str) -> _Usage:
    if u is None:
        return None, None, None
    if not isinstance(u, dict):
        raise RemoteProtocolError(f"{where}: usage: expected an object, got {type(u).__name__}")
    return (
        _opt_int(u.get("prompt_tokens"), f"{where}: usage.prompt_tokens"),
        _opt_int(u.get("completion_tokens"), f"{where}: usage.completion_tokens"),
        _opt_int(u.get("total_tokens"), f"{where}: usage.total_tokens"),
    )


def _opt_str(v: Any, where: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise RemoteProtocolError(f"{where}: expected a string, got {type(v).__name__}")
    return v


def _error_text(err: Any) -> str:
    """The message of an OpenAI error object (``{"message": ..., "type": ..., "code": ...}``)."""
    if isinstance(err, dict):
        msg = err.get("message")
        if isinstance(msg, str):
            extra = [str(err[k]) for k in ("type", "code") if isinstance(err.get(k), (str, int)) and not isinstance(err.get(k), bool)]
            return f"{msg} ({', '.join(extra)})" if extra else msg
        return json.dumps(err)[:500]
    return str(err)[:500]


def _parse_answer(body: bytes, what: str, chat: bool) -> _Answer:
    """(text, finish_reason, usage, model, id) of a non-stream answer, checked."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RemoteProtocolError(f"{what}: the body is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise RemoteProtocolError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    if "error" in doc and "choices" not in doc:
        raise RemoteProtocolError(f"{what}: the server answered 200 with an error: {_error_text(doc['error'])}")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RemoteProtocolError(f"{what}: expected 'choices', a non-empty list of objects")
    c0 = choices[0]
    if chat:
        msg = c0.get("message")
        if not isinstance(msg, dict):
            raise RemoteProtocolError(f"{what}: choices[0].message: expected an object")
        text = _opt_str(msg.get("content"), f"{what}: choices[0].message.content") or ""
    else:
        text = _opt_str(c0.get("text"), f"{what}: choices[0].text") or ""
    finish = _opt_str(c0.get("finish_reason"), f"{what}: choices[0].finish_reason")
    usage = _usage(doc.get("usage"), what)
    model = _opt_str(doc.get("model"), f"{what}: model") or ""
    rid = _opt_str(doc.get("id"), f"{what}: id") or ""
    return text, finish, usage, model, rid


# ----------------------------------------------------------------------------------- the client


def _check_number(name: str, v: Any, lo: float, hi: float, *, integer: bool = False) -> None:
    if v is None:
        return
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or not (math.isfinite(v) and lo <= v <= hi):
        kind = "an int" if integer else "a number"
        raise RemoteConfigError(f"{name}: expected {kind} in [{lo:g}, {hi:g}], got {v!r}")


@dataclass
class _Open:
    """A stream request answered 200 with an event stream: the live connection."""

    conn: http.client.HTTPConnection
    sock: socket.socket
    resp: http.client.HTTPResponse
    arm: _Arm


class OpenAIClient:
    """A thread-safe client for one OpenAI-compatible server (module docs).

    ``base_url``: ``http(s)://host[:port][/prefix][/v1]`` (a trailing ``/v1`` is optional).
    ``token``: a bearer token (https or loopback only). ``ca_file`` / ``pins_sha256``: TLS trust
    and certificate pins. ``connect_timeout_s``: TCP + TLS. ``read_timeout_s``: each wait for bytes
    (the time to the first token of a stream, or the whole generation of a non-stream call, must
    fit). ``deadline_s``: a whole call, retries and a stream to its end included (per call:
    ``deadline_s=``). ``retry``: :class:`RetryPolicy`. ``breaker``: :class:`CircuitBreaker`.
    ``on_event``: retry and breaker events. ``privacy`` / ``region``: what may be sent (module
    docs). ``max_response_bytes``: a non-stream answer larger is refused; ``max_stream_bytes``,
    ``max_line_bytes``, ``max_event_bytes``: the same for a whole stream, one line, one event.
    ``clock`` / ``wallclock`` / ``sleep`` / ``rand``: injectable for tests."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        pins_sha256: Sequence[str] = (),
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 30.0,
        deadline_s: float = 120.0,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        on_event: Callable[[RemoteEvent], None] | None = None,
        privacy: PrivacyPolicy | Mapping[str, PrivacyPolicy] | None = None,
        region: str | None = None,
        max_response_bytes: int = 16 << 20,
        max_stream_bytes: int = 64 << 20,
        max_line_bytes: int = 1 << 20,
        max_event_bytes: int = 4 << 20,
        max_idle_connections: int = 4,
        idle_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        ep = RemoteEndpoint.parse(base_url)  # checks scheme, credentials, query, host
        path = urlsplit(base_url.strip()).path.rstrip("/")
        if path.endswith("/v1"):
            path = path[:-3]
        for name, v in (
            ("max_line_bytes", max_line_bytes),
            ("max_event_bytes", max_event_bytes),
            ("max_response_bytes", max_response_bytes),
            ("max_stream_bytes", max_stream_bytes),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RemoteConfigError(f"{name}: expected an int >= 1, got {v!r}")
        # The transport: RemoteClient checks the token/TLS/timeouts and owns connections, retries and the breaker.
        self._http = RemoteClient(
            f"{ep.scheme}://{ep.host_header}",
            token=token,
            ca_file=ca_file,
            pins_sha256=pins_sha256,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            deadline_s=deadline_s,
            retry=retry,
            breaker=breaker,
            on_event=on_event,
            wire="json",
            max_response_bytes=max_response_bytes,
            max_idle_connections=max_idle_connections,
            idle_timeout_s=idle_timeout_s,
            clock=clock,
            wallclock=wallclock,
            sleep=sleep,
            rand=rand,
        )
        self._http.endpoint = dataclasses.replace(self._http.endpoint, base_path=path)
        self.endpoint: RemoteEndpoint = self._http.endpoint
        self._http.breaker.endpoint = self.endpoint.url
        self._token = token
        self._clock = clock
        self.region = region
        self._privacy = privacy
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self.max_stream_bytes = max_stream_bytes

    def __repr__(self) -> str:
        return f"OpenAIClient({self.endpoint.url!r}, token={'set' if self._token else None}, region={self.region!r})"

    # -- settings shared with the transport ---------------------------------------------------

    @property
    def breaker(self) -> CircuitBreaker:
        """The client's circuit breaker."""
        return self._http.breaker

    @property
    def retry(self) -> RetryPolicy:
        """The client's retry policy."""
        return self._http.retry

    @property
    def retry_budget(self) -> RetryBudget:
        """The client's retry budget (shared by every call)."""
        return self._http.retry_budget

    @property
    def connect_timeout_s(self) -> float:
        """TCP connect + TLS handshake limit (seconds)."""
        return self._http.connect_timeout_s

    @property
    def read_timeout_s(self) -> float:
        """The limit on each wait for bytes (seconds)."""
        return self._http.read_timeout_s

    @property
    def deadline_s(self) -> float:
        """The default limit on a whole call, retries and a stream included (seconds)."""
        return self._http.deadline_s

    def privacy_for(self, model: str) -> PrivacyPolicy:
        """The client's policy for ``model`` ("never" when none was given)."""
        p = self._privacy
        if isinstance(p, PrivacyPolicy):
            return p
        if isinstance(p, Mapping) and model in p:
            return p[model]
        return PrivacyPolicy()

    def close(self) -> None:
        """Close idle connections (the client stays usable). Streams are closed with their own ``close()``."""
        self._http.close()

    def __enter__(self) -> "OpenAIClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public calls --------------------------------------------------------------------------

    def models(self, *, deadline_s: float | None = None) -> list[str]:
        """``GET /v1/models``: the ids of the models served (retries and breaker as any call)."""
        deadline = self._http._deadline(deadline_s)
        where = f"GET {self.endpoint.url}/v1/models"

        def decode(r: _Response) -> list[str]:
            try:
                doc = json.loads(r.body)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise RemoteProtocolError(f"{where}: the body is not JSON ({e})") from None
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
                raise RemoteProtocolError(f"{where}: expected {{'data': [{{'id': str, ...}}, ...]}}")
            return [m["id"] for m in data]

        return self._http._call("GET", "/v1/models", None, {"Accept": "application/json"}, deadline, decode)

    def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
        deadline_s: float | None = None,
        privacy: PrivacyPolicy | None = None,
    ) -> OpenAIResult:
        """``POST /v1/chat/completions``: the answer's text, finish reason, usage, model and id.
        ``extra``: more request fields (e.g. ``{"top_k": 40}``; not the ones the arguments set).
        Raises PrivacyError, CircuitOpenError, RemoteUnavailableError, RemoteBusyError,
        RemoteTimeoutError, RemoteProtocolError, RemoteAuthError, RemoteRejectedError."""
        body = self._body(model, "messages", self._messages(messages), max_tokens, temperature, top_p, seed, stop, extra, False, False)
        return self._complete_call(model, "/v1/chat/completions", "messages", body, True, deadline_s, privacy)

    def chat_stream(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
        include_usage: bool = True,
        deadline_s: float | None = None,
        privacy: PrivacyPolicy | None = None,
    ) -> "OpenAIStream":
        """``POST /v1/chat/completions`` with ``"stream": true``: an :class:`OpenAIStream` of text
        deltas, ``result`` at its end. Errors before the server answered are raised here (after
        retries); errors after it, while iterating, as :class:`StreamInterruptedError`.
        ``include_usage``: ask for the usage chunk (``stream_options``)."""
        body = self._body(
            model, "messages", self._messages(messages), max_tokens, temperature, top_p, seed, stop, extra, True, include_usage
        )
        return self._stream_call(model, "/v1/chat/completions", "messages", body, True, deadline_s, privacy)

    def complete(
        self,
        model: str,
        prompt: str | Sequence[int],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
        deadline_s: float | None = None,
        privacy: PrivacyPolicy | None = None,
    ) -> OpenAIResult:
        """``POST /v1/completions`` (``choices[0].text``); ``prompt``: text, or token ids for servers that take them."""
        body = self._body(model, "prompt", self._prompt(prompt), max_tokens, temperature, top_p, seed, stop, extra, False, False)
        return self._complete_call(model, "/v1/completions", "prompt", body, False, deadline_s, privacy)

    def complete_stream(
        self,
        model: str,
        prompt: str | Sequence[int],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
        include_usage: bool = True,
        deadline_s: float | None = None,
        privacy: PrivacyPolicy | None = None,
    ) -> "OpenAIStream":
        """``POST /v1/completions`` with ``"stream": true`` (like :meth:`chat_stream`)."""
        body = self._body(model, "prompt", self._prompt(prompt), max_tokens, temperature, top_p, seed, stop, extra, True, include_usage)
        return self._stream_call(model, "/v1/completions", "prompt", body, False, deadline_s, privacy)

    # -- requests ------------------------------------------------------------------------------

    @staticmethod
    def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
            raise RemoteConfigError("messages: expected a non-empty list of {'role': ..., 'content': ...} mappings")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not m["role"]:
                raise RemoteConfigError(f"messages[{i}]: expected a mapping with a non-empty string 'role'")
            c = m.get("content")
            if c is not None and not isinstance(c, (str, list)):
                raise RemoteConfigError(f"messages[{i}].content: expected a string, a list of content parts or None")
            out.append(dict(m))
        return out

    @staticmethod
    def _prompt(prompt: str | Sequence[int]) -> str | list[int]:
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, Sequence) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return [int(t) for t in prompt]
        raise RemoteConfigError("prompt: expected a string or a non-empty list of token ids (ints >= 0)")

    @staticmethod
    def _body(
        model: str,
        key: str,
        value: Any,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        stop: str | Sequence[str] | None,
        extra: Mapping[str, Any] | None,
        stream: bool,
        include_usage: bool,
    ) -> dict[str, Any]:
        if not isinstance(model, str) or not model:
            raise RemoteConfigError("model: expected a non-empty string")
        _check_number("max_tokens", max_tokens, 1, 2**31 - 1, integer=True)
        _check_number("temperature", temperature, 0.0, 2.0)
        _check_number("top_p", top_p, 0.0, 1.0)
        _check_number("seed", seed, -(2**63), 2**63 - 1, integer=True)
        body: dict[str, Any] = {"model": model, key: value}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens  # the field every compatible server reads (OpenAI's own also takes max_completion_tokens)
        if temperature is not None:
            body["temperature"] = temperature
        if top_p is not None:
            body["top_p"] = top_p
        if seed is not None:
            body["seed"] = seed
        if stop is not None:
            stops = [stop] if isinstance(stop, str) else list(stop)
            if not stops or not all(isinstance(s, str) and s for s in stops):
                raise RemoteConfigError("stop: expected a non-empty string or a list of them")
            body["stop"] = stops if not isinstance(stop, str) else stop
        if extra:
            if not isinstance(extra, Mapping) or not all(isinstance(k, str) for k in extra):
                raise RemoteConfigError("extra: expected a mapping of request field names to JSON values")
            clash = sorted(set(extra) & _OWN_KEYS)
            if clash:
                raise RemoteConfigError(f"extra: {clash} are set by the client (use the arguments)")
            body.update(extra)
        if stream:
            body["stream"] = True
            if include_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def _encode(self, body: Mapping[str, Any]) -> bytes:
        try:
            return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise RemoteConfigError(f"the request is not JSON-serialisable: {e}") from None

    def _check_privacy(self, model: str, what: str, privacy: PrivacyPolicy | None) -> None:
        policy = privacy if privacy is not None else self.privacy_for(model)
        policy.check(model, [what], self.region)

    def _attempts(self, path: str, deadline: float, once: Callable[[], tuple[T, bool]]) -> tuple[T, int]:
        """``once()`` with retries through the breaker, as RemoteClient's request loop; returns its value and
        the attempts made. ``once`` says whether its success is settled (False: an open stream, whose
        outcome the stream records when it ends)."""
        tr = self._http
        tr.retry_budget.deposit()
        attempt = 0
        while True:
            tr.breaker.allow()
            attempt += 1
            try:
                value, settled = once()
            except _Failed as f:
                e = f.error
                e.attempts = attempt
                if f.breaker:
                    tr.breaker.record_failure(_scrub(str(e), self._token))
                else:
                    tr.breaker.release()
                tr._retry_or_raise(f, attempt, deadline, "POST", path)
                continue
            except BaseException:
                tr.breaker.release()  # never reached a verdict: free a probe slot
                raise
            if settled:
                tr.breaker.record_success()
            return value, attempt

    def _complete_call(
        self, model: str, path: str, what: str, body: Mapping[str, Any], chat: bool, deadline_s: float | None, privacy: PrivacyPolicy | None
    ) -> OpenAIResult:
        self._check_privacy(model, what, privacy)
        raw = self._encode(body)
        t0 = self._clock()
        deadline = self._http._deadline(deadline_s)
        where = f"POST {self.endpoint.url}{path}"
        tr = self._http

        def once() -> tuple[_Answer, bool]:
            r = tr._exchange("POST", path, raw, _JSON_HEADERS, deadline)
            return tr._judge(r, "POST", path, lambda r: _parse_answer(r.body, where, chat)), True

        (text, finish, usage, rmodel, rid), attempts = self._attempts(path, deadline, once)
        return OpenAIResult(text, finish, *usage, rmodel, rid, self._clock() - t0, 1 if text else 0, None, attempts)

    # -- streams -------------------------------------------------------------------------------

    def _stream_call(
        self, model: str, path: str, what: str, body: Mapping[str, Any], chat: bool, deadline_s: float | None, privacy: PrivacyPolicy | None
    ) -> "OpenAIStream":
        self._check_privacy(model, what, privacy)
        raw = self._encode(body)
        t0 = self._clock()
        deadline = self._http._deadline(deadline_s)
        where = f"POST {self.endpoint.url}{path}"
        tr = self._http

        def once() -> tuple[_Open | _Answer, bool]:
            got = self._open(path, raw, deadline)
            if isinstance(got, _Open):
                return got, False
            # a whole answer: an error status raises here; a 2xx JSON answer is the text as one delta
            return tr._judge(got, "POST", path, lambda r: _parse_answer(r.body, where, chat)), True

        got, attempts = self._attempts(path, deadline, once)
        if isinstance(got, _Open):
            return OpenAIStream(self, got, where, chat, t0, deadline, attempts)
        text, finish, usage, rmodel, rid = got
        now = self._clock()
        result = OpenAIResult(text, finish, *usage, rmodel, rid, now - t0, 1 if text else 0, now - t0 if text else None, attempts)
        return OpenAIStream._finished(result)

    def _open(self, path: str, body: bytes, deadline: float) -> _Open | _Response:
        """One attempt: an open event stream, or a whole non-stream answer (any status) to judge."""
        tr = self._http
        for fresh_try in (False, True):
            idle = None if fresh_try else tr._take_idle()
            reused = idle is not None
            conn, sock = idle if idle is not None else tr._connect(deadline)
            try:
                return self._send(conn, sock, path, body, deadline)
            except _StaleConnection:
                if not reused:
                    raise _Failed(
                        RemoteUnavailableError(f"POST {self.endpoint.url}{path}: connection closed before a response"), retry=True
                    ) from None
        raise AssertionError("unreachable")

    def _send(self, conn: http.client.HTTPConnection, sock: socket.socket, path: str, body: bytes, deadline: float) -> _Open | _Response:
        tr = self._http
        where = f"POST {self.endpoint.url}{path}"
        arm = _WATCHDOG.arm(sock, deadline - self._clock())
        phase = "send"
        keep_open = False

        def budget() -> None:
            left = deadline - self._clock()
            if left <= 0:
                raise socket.timeout("deadline")
            sock.settimeout(min(tr.read_timeout_s, left))

        try:
            budget()
            conn.request("POST", self.endpoint.base_path + path, body=body, headers=tr._headers(_SSE_HEADERS))
            phase = "wait"
            budget()
            resp = conn.getresponse()
            if arm.fired:
                raise socket.timeout("deadline")
            ctype = (resp.getheader("content-type") or "").split(";", 1)[0].strip().lower()
            if 200 <= resp.status < 300 and ctype == "text/event-stream":
                keep_open = True
                return _Open(conn, sock, resp, arm)
            phase = "body"
            hdrs: dict[str, str] = {}
            for k, v in resp.getheaders():
                k = k.lower()
                hdrs[k] = f"{hdrs[k]}, {v}" if k in hdrs else v
            ok = 200 <= resp.status < 300
            if ok and ctype not in ("application/json", ""):
                raise _Failed(
                    RemoteProtocolError(f"{where}: expected text/event-stream or application/json, got {ctype!r}", status=resp.status),
                    retry=False,
                )
            limit = tr.max_response_bytes if ok else _ERROR_BODY_MAX
            parts: list[bytes] = []
            total = 0
            while True:
                budget()
                chunk = resp.read1(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    if not ok:
                        break  # an error's text: the start is enough
                    raise _Failed(RemoteProtocolError(f"{where}: answer over the limit of {limit} bytes", status=resp.status), retry=False)
                parts.append(chunk)
            if arm.fired:
                raise socket.timeout("deadline")
            return _Response(resp.status, hdrs, b"".join(parts))
        except _Failed:
            raise
        except _TRANSPORT as e:
            raise tr._transport_failure(e, where, phase, arm.fired, deadline) from None
        finally:
            if not keep_open:
                _WATCHDOG.disarm(arm)
                conn.close()
                try:
                    sock.close()
                except OSError:
                    pass


_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
_SSE_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}

_RUNNING, _DONE, _FAILED, _CANCELLED = "running", "done", "failed", "cancelled"


class OpenAIStream:
    """The text deltas of a streamed generation (an iterator of non-empty strings).

    ``result``: the :class:`OpenAIResult` once the stream has ended (raises the stream's error if
    it failed, RuntimeError before the end). ``partial``: what has arrived so far, at any time.
    ``close()``: cancel (from any thread; idempotent); the iteration then stops and
    ``result.cancelled`` is True (its text: the deltas iteration returned). A context manager:
    leaving the ``with`` closes it. Errors while iterating are :class:`StreamInterruptedError`
    subclasses, raised after every delta that came before them has been returned, so the text
    iterated equals ``error.partial.text``; after one, iteration stops."""

    def __init__(
        self, client: OpenAIClient | None, opened: _Open | None, where: str, chat: bool, t0: float, deadline: float, attempts: int
    ):
        self._client = client
        self._opened = opened
        self._where = where
        self._chat = chat
        self._t0 = t0
        self._deadline = deadline
        self._attempts = attempts
        self._clock: Callable[[], float] = client._clock if client is not None else time.monotonic
        self._token = client._token if client is not None else None
        self._pending: deque[str] = deque()
        self._parts: list[str] = []  # every delta that arrived
        self._delivered: list[str] = []  # those iteration has returned
        self._deferred: StreamInterruptedError | None = None
        self._first: float | None = None
        self._finish: str | None = None
        self._usage: _Usage = (None, None, None)
        self._model = ""
        self._id = ""
        self._got_done = False
        self._bytes = 0
        self._state = _RUNNING
        self._error: StreamInterruptedError | None = None
        self._result: OpenAIResult | None = None
        self._cancel = False
        self._reader = threading.Lock()  # one iteration step at a time
        self._lock = threading.Lock()  # the socket's state between close() and the reader
        self._sock_closed = False
        if client is not None:
            self._decoder = SSEDecoder(max_line_bytes=client.max_line_bytes, max_event_bytes=client.max_event_bytes)
            self._limit = client.max_stream_bytes
            self._read_timeout_s = client.read_timeout_s

    @classmethod
    def _finished(cls, result: OpenAIResult) -> "OpenAIStream":
        s = cls(None, None, "", True, 0.0, 0.0, result.attempts)
        if result.text:
            s._pending.append(result.text)
        s._parts = [result.text]
        s._state = _DONE
        s._result = result
        return s

    # -- public --------------------------------------------------------------------------

    def __iter__(self) -> "OpenAIStream":
        return self

    def __next__(self) -> str:
        with self._reader:
            while True:
                if self._cancel:
                    self._pending.clear()  # close() drops what was not read, even what a racing step had parsed
                if self._pending:
                    piece = self._pending.popleft()
                    self._delivered.append(piece)
                    return piece
                if self._deferred is not None:
                    err, self._deferred = self._deferred, None
                    raise err
                if self._state != _RUNNING:
                    raise StopIteration
                try:
                    self._step()
                except StreamInterruptedError as e:
                    if not self._pending:
                        raise
                    self._deferred = e  # the deltas that came before the failure are given first: iterated text == partial.text

    @property
    def result(self) -> OpenAIResult:
        """The final result (see the class docs)."""
        if self._state == _FAILED and self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the stream has not ended: iterate it to the end, or close() it")
        return self._result

    @property
    def partial(self) -> OpenAIResult:
        """What has arrived so far (``finish_reason`` None until the end)."""
        if self._result is not None:
            return self._result
        return self._snapshot(False)

    @property
    def done(self) -> bool:
        """True once the stream has ended (finished, failed or cancelled)."""
        return self._state != _RUNNING

    def close(self) -> None:
        """Cancel the stream: shut its socket down at once (any thread); deltas not yet read are dropped."""
        self._cancel = True
        self._pending.clear()
        with self._lock:
            if self._opened is not None and not self._sock_closed:
                try:
                    socket.socket.shutdown(self._opened.sock, socket.SHUT_RDWR)  # the plain socket, like the watchdog
                except OSError:
                    pass
        if self._reader.acquire(blocking=False):  # nobody is iterating: end it here
            try:
                if self._state == _RUNNING:
                    self._end(_CANCELLED)
            finally:
                self._reader.release()

    def __enter__(self) -> "OpenAIStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._state == _RUNNING:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    # -- reading -------------------------------------------------------------------------

    def _snapshot(self, final: bool, cancelled: bool = False) -> OpenAIResult:
        parts = self._delivered if cancelled else self._parts  # a cancelled stream: what the caller got
        return OpenAIResult(
            "".join(parts),
            self._finish if final else None,
            *self._usage,
            self._model,
            self._id,
            self._clock() - self._t0,
            len(parts),
            self._first,
            self._attempts,
            cancelled,
        )

    def _step(self) -> None:
        """Read once and handle what came; ends the stream (raising on failure) when it is over."""
        op = self._opened
        assert op is not None
        if self._cancel:
            self._end(_CANCELLED)
            return
        left = self._deadline - self._clock()
        if left <= 0 or op.arm.fired:
            self._fail(StreamTimeoutError, "the deadline passed")
        try:
            op.sock.settimeout(min(self._read_timeout_s, left))
            data = op.resp.read1(_CHUNK)
        except (socket.timeout, TimeoutError):
            if self._cancel:
                self._end(_CANCELLED)
                return
            if op.arm.fired or self._deadline - self._clock() <= 0.001:
                self._fail(StreamTimeoutError, "the deadline passed")
            self._fail(StreamTimeoutError, f"no bytes for {self._read_timeout_s:g} s")
        except (http.client.HTTPException, OSError, ValueError) as e:  # IncompleteRead, resets, a closed file
            if self._cancel:
                self._end(_CANCELLED)
                return
            if op.arm.fired:
                self._fail(StreamTimeoutError, "the deadline passed")
            what = (
                "the connection was cut mid-chunk" if isinstance(e, http.client.IncompleteRead) else f"connection lost ({type(e).__name__})"
            )
            self._fail(StreamUnavailableError, what)
        if not data:
            self._at_eof()
            return
        self._bytes += len(data)
        if self._bytes > self._limit:
            self._fail(StreamProtocolError, f"the stream is over the limit of {self._limit} bytes")
        error: SSEError | None = None
        try:
            events = self._decoder.feed(data)
        except SSEError as e:
            events, error = e.events, e
        for ev in events:
            self._on_event(ev)
            if self._got_done:
                self._end(_DONE)
                return
        if error is not None:
            self._fail(StreamProtocolError, str(error))

    def _at_eof(self) -> None:
        op = self._opened
        assert op is not None
        if self._cancel:
            self._end(_CANCELLED)
        elif op.arm.fired:
            self._fail(StreamTimeoutError, "the deadline passed")
        elif self._finish is not None:
            self._end(_DONE)  # ended without [DONE] after a finish_reason: the generation is complete
        else:
            pending = self._decoder.pending_data
            if pending:
                err = _json_error(pending)
                if err is not None:
                    self._fail(StreamUnavailableError, f"the server reported an error: {err}")
            self._fail(StreamUnavailableError, "the stream ended before data: [DONE]")

    def _on_event(self, ev: SSEEvent) -> None:
        if ev.event == "error":
            err = _json_error(ev.data)
            self._fail(StreamUnavailableError, f"the server reported an error: {err if err is not None else ev.data[:500]}")
        data = ev.data
        if data.strip() == "[DONE]":
            self._got_done = True
            return
        try:
            doc = json.loads(data)
        except json.JSONDecodeError as e:
            self._fail(StreamProtocolError, f"an event is not JSON ({e}): {data[:200]!r}")
        if not isinstance(doc, dict):
            self._fail(StreamProtocolError, f"an event is not a JSON object: {data[:200]!r}")
        if "error" in doc:
            self._fail(StreamUnavailableError, f"the server reported an error: {_error_text(doc['error'])}")
        try:
            self._chunk(doc)
        except RemoteProtocolError as e:
            self._fail(StreamProtocolError, str(e))

    def _chunk(self, doc: dict[str, Any]) -> None:
        where = "a stream chunk"
        if not self._model:
            self._model = _opt_str(doc.get("model"), f"{where}: model") or ""
        if not self._id:
            self._id = _opt_str(doc.get("id"), f"{where}: id") or ""
        usage = doc.get("usage")
        if usage is not None:
            self._usage = _usage(usage, where)
        choices = doc.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            raise RemoteProtocolError(f"{where}: choices: expected a list")
        for c in choices:
            if not isinstance(c, dict):
                raise RemoteProtocolError(f"{where}: choices: expected objects")
            if c.get("index", 0) != 0:
                continue  # only one choice is asked for
            if self._chat:
                delta = c.get("delta")
                if delta is None:
                    piece = None
                elif isinstance(delta, dict):
                    piece = _opt_str(delta.get("content"), f"{where}: choices[0].delta.content")
                else:
                    raise RemoteProtocolError(f"{where}: choices[0].delta: expected an object")
            else:
                piece = _opt_str(c.get("text"), f"{where}: choices[0].text")
            fr = _opt_str(c.get("finish_reason"), f"{where}: choices[0].finish_reason")
            if fr:
                self._finish = fr
            if piece:
                if self._first is None:
                    self._first = self._clock() - self._t0
                self._parts.append(piece)
                self._pending.append(piece)

    def _fail(self, cls: type[StreamInterruptedError], what: str) -> NoReturn:
        partial = self._snapshot(False)
        chars = len(partial.text)
        usage = f"; {partial.completion_tokens} completion tokens reported" if partial.completion_tokens is not None else ""
        msg = _scrub(
            f"{self._where}: stream interrupted after {partial.deltas} delta{'s' if partial.deltas != 1 else ''} "
            f"({chars} character{'s' if chars != 1 else ''}{usage}): {what}",
            self._token,
        )
        err = cls(msg, partial=partial, status=self._opened.resp.status if self._opened else None, attempts=self._attempts)
        self._error = err
        self._end(_FAILED, reason=msg)
        raise err

    def _end(self, state: str, reason: str = "") -> None:
        """Release the connection, record the breaker outcome, set the result (once)."""
        if self._state != _RUNNING:
            return
        op = self._opened
        assert op is not None and self._client is not None
        self._state = state
        with self._lock:
            self._sock_closed = True  # close() no longer touches the socket
        reuse = state == _DONE and self._got_done and not self._cancel and self._drained()
        _WATCHDOG.disarm(op.arm)
        if reuse:
            self._client._http._put_idle(op.conn, op.sock)  # the body ended cleanly: keep-alive, like any answer
        else:
            try:
                op.resp.close()
            except Exception:  # noqa: BLE001 - closing a broken response
                pass
            op.conn.close()
            try:
                op.sock.close()
            except OSError:
                pass
        breaker = self._client.breaker
        if state == _FAILED:
            breaker.record_failure(reason)
        else:
            breaker.record_success()
            self._result = self._snapshot(state == _DONE, cancelled=state == _CANCELLED)
        _log.debug("%s: stream %s after %d deltas (%.1f ms)", self._where, state, len(self._parts), (self._clock() - self._t0) * 1e3)

    def _drained(self) -> bool:
        """After ``data: [DONE]``: read what is left of the body (at most 4 KiB, for at most 50 ms).
        True when the body then ended cleanly, so the connection can serve another request."""
        op = self._opened
        assert op is not None
        if op.resp.will_close:
            return False
        t_end = min(self._deadline, self._clock() + 0.05)
        total = 0
        try:
            while True:
                left = t_end - self._clock()
                if left <= 0 or op.arm.fired:
                    return False
                op.sock.settimeout(left)
                data = op.resp.read1(_CHUNK)
                if not data:
                    return op.resp.isclosed() and not op.arm.fired
                total += len(data)
                if total > 4096:
                    return False
        except (OSError, http.client.HTTPException, ValueError):
            return False


def _json_error(text: str) -> str | None:
    """The error message in ``{"error": ...}`` (None when ``text`` is not such an object)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(doc, dict) and "error" in doc:
        return _error_text(doc["error"])
    return None
