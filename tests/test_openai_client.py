"""edge_sdk.remote.openai_client: the SSE decoder, a fault server written here, and LitServe.

- :class:`SSEDecoder` against the WHATWG spec's own examples, and a stream fed at every split point.
- A small HTTP server (``http.server``, 127.0.0.1, a free port) whose behaviour is chosen by the
  request's ``model``: SSE split across TCP writes at odd byte boundaries (chunked framing cut
  mid-line and mid-UTF-8 sequence, CRLF/CR/LF, a BOM, keepalive comments, multi-line data), a drop
  mid-stream (read-to-close, mid-chunk, reset), 503 + Retry-After then success, 429, a trickle cut
  by the deadline, headers too slow, 401 without a token, a malformed chunk, oversized lines and
  events, error events (vLLM's ``data: {"error": ...}`` and llama.cpp's ``error:`` field).
- A third-party OpenAI-compatible server, LitServe's ``OpenAISpec`` (tests/litserve_openai_app.py),
  in a subprocess on a free 127.0.0.1 port.

Every server loop is bounded in count and time; every test stops by itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import trustme
from remote_faults import closed_port, tls_context

from edge_sdk.remote.breaker import CircuitBreaker, RemoteEvent
from edge_sdk.remote.errors import (
    CircuitOpenError,
    PrivacyError,
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
from edge_sdk.remote.openai_client import (
    OpenAIClient,
    OpenAIResult,
    SSEDecoder,
    SSEEvent,
    StreamInterruptedError,
    StreamProtocolError,
    StreamTimeoutError,
    StreamUnavailableError,
    continuation_messages,
)
from edge_sdk.remote.privacy import PrivacyPolicy

ALLOWED = PrivacyPolicy("allowed")
TOKEN = "tok-Secret-123"
MSGS = [{"role": "user", "content": "hello"}]


# ----------------------------------------------------------------------------------- the SSE decoder


def events(stream: bytes, *, pieces: list[int] | None = None, **kw: int) -> list[SSEEvent]:
    d = SSEDecoder(**kw)
    if pieces is None:
        return d.feed(stream)
    out: list[SSEEvent] = []
    at = 0
    for n in pieces:
        out += d.feed(stream[at : at + n])
        at += n
    return out + d.feed(stream[at:])


def test_sse_whatwg_examples() -> None:
    # https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation (the examples)
    assert [e.data for e in events(b"data: YHOO\ndata: +2\ndata: 10\n\n")] == ["YHOO\n+2\n10"]
    got = events(b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n")
    assert [(e.data, e.id) for e in got] == [("first event", "1"), ("second event", ""), (" third event", "")]
    d = SSEDecoder()
    assert [e.data for e in d.feed(b"data\n\ndata\ndata\n\ndata:")] == ["", "\n"]
    assert d.pending_data == ""  # the last block has no blank line: never dispatched
    assert [e.data for e in events(b"data:test\n\ndata: test\n\n")] == ["test", "test"]


def test_sse_fields_comments_and_types() -> None:
    d = SSEDecoder()
    got = d.feed(b"retry: 1500\nevent: update\nid: 7\ndata: x\nunknown: y\n\n: keepalive\n\ndata: z\n\nretry: soon\n\n")
    assert got == [SSEEvent("x", "update", "7"), SSEEvent("z", "message", "7")]
    assert d.retry_ms == 1500 and d.last_event_id == "7"
    assert d.feed(b"id: a\0b\ndata: q\n\n") == [SSEEvent("q", "message", "7")]  # an id with NUL is ignored
    # llama.cpp's server reports a stream error as an "error:" field (not in the spec)
    assert d.feed(b'error: {"message": "boom"}\n\n') == [SSEEvent('{"message": "boom"}', "error", "7")]


STREAM = (
    b"\xef\xbb\xbf: hello\r\n\r\n"
    b'data: {"choices": [{"index": 0,\r\ndata:  "delta": {"content": "caf\xc3\xa9 \xf0\x9f\x99\x82"}}]}\r\n\r\n'
    b'event: message\rid: 3\rdata: {"choices": []}\r\r'
    b": keepalive\n\n"
    b"data: [DONE]\n\n"
)


def test_sse_every_split_point_gives_the_same_events() -> None:
    whole = events(STREAM)
    assert [e.data for e in whole] == [
        '{"choices": [{"index": 0,\n "delta": {"content": "café 🙂"}}]}',
        '{"choices": []}',
        "[DONE]",
    ]
    assert whole[1].id == "3" and whole[2].id == "3"
    for cut in range(len(STREAM) + 1):  # bounded: one split per byte offset
        assert events(STREAM, pieces=[cut]) == whole, cut
    assert events(STREAM, pieces=[1] * len(STREAM)) == whole  # a byte at a time
    assert events(STREAM, pieces=[3, 5, 7, 11, 13, 17, 19, 23] * 4) == whole


def test_sse_limits() -> None:
    with pytest.raises(RemoteProtocolError, match="line of 2006 bytes"):
        events(b"data: " + b"x" * 2000 + b"\n\n", max_line_bytes=1024)
    with pytest.raises(RemoteProtocolError, match="no line end yet"):
        events(b"data: " + b"x" * 2000, pieces=[100] * 20, max_line_bytes=1024)
    with pytest.raises(RemoteProtocolError, match="event's data is over"):
        events(b"data: 0123456789\n" * 200 + b"\n", max_event_bytes=1000)
    assert len(events(b"data: 0123456789\n" * 50 + b"\n", max_event_bytes=1000)) == 1


# ----------------------------------------------------------------------------------- the fault server


def chunk(model: str, content: str | None = None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    doc: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model, "choices": []}
    if content is not None or finish is not None:
        doc["choices"] = [{"index": 0, "delta": {} if content is None else {"content": content}, "finish_reason": finish}]
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def text_chunk(model: str, text: str, finish: str | None = None) -> bytes:
    doc = {"id": "cmpl-1", "object": "text_completion", "model": model, "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def good_stream(model: str) -> bytes:
    return (
        b'data: {"id":"chatcmpl-1","model":"'
        + model.encode()
        + b'","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
        + chunk(model, "Hel")
        + chunk(model, "lo ")
        + chunk(model, "wörld")
        + chunk(model, None, "stop")
        + chunk(model, usage=USAGE)
        + b"data: [DONE]\n\n"
    )


def split_stream(model: str) -> bytes:
    """The good stream with CRLF and CR line ends, a BOM, comments, multi-line data and other fields."""
    return (
        b"\xef\xbb\xbf: keepalive\r\n\r\n"
        + b"retry: 3000\r\nid: 1\r\n"
        + b'data: {"id":"chatcmpl-1","model":"'
        + model.encode()
        + b'",\r\ndata: "choices":[{"index":0,"delta":{"content":"Hel"}}]}\r\n\r\n'
        + chunk(model, "lo ").replace(b"\n", b"\r")
        + b":\n\n"
        + chunk(model, "wörld 🙂")
        + chunk(model, None, "length").replace(b"\n", b"\r\n")
        + chunk(model, usage=USAGE)
        + b"data: [DONE]\n\n"
    )


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FaultServer"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- helpers -----------------------------------------------------------------------

    def send_json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def start_sse(self, *, chunked: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")  # read to close: the end of the body is the end of the connection
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def dribble(self, raw: bytes, sizes: list[int]) -> None:
        """Write ``raw`` in pieces of the given sizes (cycled), each its own TCP segment."""
        at, i = 0, 0
        while at < len(raw):
            n = sizes[i % len(sizes)]
            self.connection.sendall(raw[at : at + n])
            at += n
            i += 1
            time.sleep(0.0005)

    # -- routes ------------------------------------------------------------------------

    def do_GET(self) -> None:
        self.server.record(self, None)
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "ok", "object": "model"}, {"id": "tiny", "object": "model"}]})
        else:
            self.send_json(404, {"error": {"message": "no such route", "type": "invalid_request_error"}})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n))
        count = self.server.record(self, body)
        model = body.get("model", "")
        stream = bool(body.get("stream"))
        chat = self.path.endswith("/chat/completions")
        if self.server.require_token and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_json(401, {"error": {"message": "invalid api key", "type": "invalid_request_error", "code": "invalid_api_key"}})
            return
        getattr(self, "m_" + model.replace("-", "_"), self.m_ok)(body, stream, chat, count)

    def m_ok(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        model = body["model"]
        if not stream:
            if chat:
                choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": "Hello wörld"}, "finish_reason": "stop"}
                self.send_json(200, {"id": "chatcmpl-9", "object": "chat.completion", "model": model, "choices": [choice], "usage": USAGE})
            else:
                choice = {"index": 0, "text": " and more", "finish_reason": "length"}
                self.send_json(200, {"id": "cmpl-9", "object": "text_completion", "model": model, "choices": [choice], "usage": USAGE})
            return
        self.start_sse()
        if chat:
            self.send_chunk(good_stream(model))
        else:
            self.send_chunk(
                text_chunk(model, " and") + text_chunk(model, " more", "length") + chunk(model, usage=USAGE) + b"data: [DONE]\n\n"
            )
        self.end_chunks()

    def m_split(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        """Chunked framing written at odd byte boundaries: chunk headers, lines and UTF-8 sequences are cut."""
        raw = split_stream(body["model"])
        framed = b""
        at, i = 0, 0
        for n in (1, 2, 3, 5, 7, 11, 13, 17, 4, 9) * 100:
            if at >= len(raw):
                break
            piece = raw[at : at + n]
            framed += b"%x\r\n%s\r\n" % (len(piece), piece)
            at += n
            i += 1
        framed += b"0\r\n\r\n"
        self.start_sse()
        self.dribble(framed, [1, 3, 2, 7, 5, 11, 4])

    def m_close_framed(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        """Read-to-close framing, odd TCP writes."""
        self.start_sse(chunked=False)
        self.dribble(split_stream(body["model"]), [2, 5, 1, 8, 3])

    def m_drop(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse(chunked=False)
        self.wfile.write(chunk(body["model"], "one ") + chunk(body["model"], "two"))
        self.wfile.flush()
        self.close_connection = True  # gone: no [DONE]

    def m_drop_chunked(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(chunk(body["model"], "one ") + chunk(body["model"], "two"))
        self.wfile.write(b"64\r\n" + b'data: {"choi')  # 100 bytes promised, 12 sent
        self.wfile.flush()
        self.close_connection = True

    def m_reset(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(chunk(body["model"], "one"))
        time.sleep(0.05)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
        self.close_connection = True

    def m_flaky503(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        if count == 1:
            self.send_json(503, {"error": {"message": "loading model", "type": "unavailable"}}, {"Retry-After": "1"})
            return
        self.m_ok(body, stream, chat, count)

    def m_busy(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.send_json(503, {"error": {"message": "overloaded"}}, {"Retry-After": "3600"})

    def m_ratelimit(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        if count <= 2:
            self.send_json(429, {"error": {"message": "rate limited", "type": "rate_limit_exceeded"}})
            return
        self.m_ok(body, stream, chat, count)

    def m_always429(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.send_json(429, {"error": {"message": "rate limited", "type": "rate_limit_exceeded"}})

    def m_trickle(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        """One delta, then a keepalive comment every 50 ms (at most 200: 10 s), never [DONE]."""
        self.start_sse()
        self.send_chunk(chunk(body["model"], "first"))
        for _ in range(200):
            time.sleep(0.05)
            try:
                self.send_chunk(b": ping\n\n")
            except OSError:
                break
        self.close_connection = True

    def m_stall(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        """One delta, then nothing for 2 s (then the connection closes)."""
        self.start_sse()
        self.send_chunk(chunk(body["model"], "first"))
        time.sleep(2.0)
        self.close_connection = True

    def m_slow_headers(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        time.sleep(1.5)
        self.close_connection = True

    def m_malformed(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(chunk(body["model"], "fine") + b"data: {not json\n\n" + chunk(body["model"], "never"))
        self.end_chunks()

    def m_wrong_types(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(chunk(body["model"], "fine") + b'data: {"choices": [{"index": 0, "delta": {"content": 42}}]}\n\n')
        self.end_chunks()

    def m_longline(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(chunk(body["model"], "fine") + b"data: " + b"x" * 5000 + b"\n\n")
        self.end_chunks()

    def m_bigevent(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(chunk(body["model"], "fine") + b"data: 0123456789012345678901234567890123456789\n" * 200 + b"\n")
        self.end_chunks()

    def m_error_event(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        err = {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}
        self.send_chunk(chunk(body["model"], "so far") + b"data: " + json.dumps(err).encode() + b"\n\n")
        self.end_chunks()

    def m_llamacpp_error(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(
            chunk(body["model"], "so far") + b'error: {"code":500,"message":"context shift is disabled","type":"server_error"}\n\n'
        )
        self.end_chunks()

    def m_json_for_stream(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        choice = {"index": 0, "message": {"role": "assistant", "content": "all at once"}, "finish_reason": "stop"}
        self.send_json(200, {"id": "x", "model": body["model"], "choices": [choice], "usage": USAGE})

    def m_no_done(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.start_sse()
        self.send_chunk(chunk(body["model"], "done") + chunk(body["model"], None, "stop"))
        self.end_chunks()  # a clean end of the body after a finish_reason, without [DONE]

    def m_echo_auth(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.send_json(
            400, {"error": {"message": f"bad request from {self.headers.get('Authorization')}", "type": "invalid_request_error"}}
        )

    def m_bad_answer(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.send_json(200, {"id": "x", "model": body["model"], "choices": []})

    def m_redirect(self, body: dict[str, Any], stream: bool, chat: bool, count: int) -> None:
        self.send_response(307)
        self.send_header("Location", "http://elsewhere.invalid/v1/chat/completions")
        self.send_header("Content-Length", "0")
        self.end_headers()


class FaultServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.scheme = "http"
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True)
            self.scheme = "https"
        self.lock = threading.Lock()
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.counts: dict[str, int] = {}
        self.peers: list[int] = []  # the client port of each request: the same port is a reused connection
        self.require_token = False

    def record(self, h: BaseHTTPRequestHandler, body: Any) -> int:
        key = body.get("model", "") if isinstance(body, dict) else h.path
        with self.lock:
            self.requests.append((h.path, dict(h.headers), body))
            self.peers.append(h.client_address[1])
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key]

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return  # a client that cancelled a stream, or closed with bytes unread: expected here
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def serving(ssl_context: ssl.SSLContext | None = None) -> Iterator[FaultServer]:
    s = FaultServer(ssl_context)
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()
        t.join(5)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with serving() as s:
        yield s


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, s: float) -> None:
        self.calls.append(s)


def client(server: FaultServer, **kw: Any) -> OpenAIClient:
    kw.setdefault("privacy", ALLOWED)
    kw.setdefault("deadline_s", 10.0)
    kw.setdefault("read_timeout_s", 5.0)
    return OpenAIClient(server.url + "/v1", **kw)


# ----------------------------------------------------------------------------------- calls that succeed


def test_chat_and_complete(server: FaultServer) -> None:
    c = client(server, token=TOKEN)
    r = c.chat("ok", MSGS, max_tokens=16, temperature=0.0, top_p=0.9, seed=7, stop=["\n\n", "END"], extra={"top_k": 40})
    assert (r.text, r.finish_reason, r.model, r.id) == ("Hello wörld", "stop", "ok", "chatcmpl-9")
    assert (r.prompt_tokens, r.completion_tokens, r.total_tokens, r.attempts) == (5, 3, 8, 1)
    path, headers, body = server.requests[-1]
    assert path == "/v1/chat/completions" and headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "model": "ok",
        "messages": MSGS,
        "max_tokens": 16,
        "temperature": 0.0,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["\n\n", "END"],
        "top_k": 40,
    }
    r = c.complete("ok", "Once upon a time", max_tokens=2, stop="\n")
    assert (r.text, r.finish_reason, r.completion_tokens) == (" and more", "length", 3)
    assert server.requests[-1][0] == "/v1/completions" and server.requests[-1][2]["prompt"] == "Once upon a time"
    assert server.requests[-1][2]["stop"] == "\n"
    c.complete("ok", [1, 2, 3])
    assert server.requests[-1][2]["prompt"] == [1, 2, 3]
    assert c.models() == ["ok", "tiny"]


def test_chat_stream(server: FaultServer) -> None:
    c = client(server)
    s = c.chat_stream("ok", MSGS, max_tokens=8)
    with pytest.raises(RuntimeError, match="not ended"):
        _ = s.result
    assert list(s) == ["Hel", "lo ", "wörld"]
    r = s.result
    assert (r.text, r.finish_reason, r.deltas, r.model, r.id) == ("Hello wörld", "stop", 3, "ok", "chatcmpl-1")
    assert (r.prompt_tokens, r.completion_tokens, r.total_tokens, r.cancelled) == (5, 3, 8, False)
    assert r.first_delta_s is not None and 0 <= r.first_delta_s <= r.elapsed_s
    _, headers, body = server.requests[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 8
    assert headers["Accept"].startswith("text/event-stream")
    assert list(s) == [] and s.done  # exhausted
    c.chat("ok", MSGS)
    assert server.peers[-1] == server.peers[-2]  # a stream ended by [DONE] and a clean body end: its connection is reused
    s = c.chat_stream("ok", MSGS, include_usage=False)
    assert "".join(s) == "Hello wörld" and "stream_options" not in server.requests[-1][2]


def test_complete_stream(server: FaultServer) -> None:
    s = client(server).complete_stream("ok", "Once upon a time")
    assert list(s) == [" and", " more"]
    assert (s.result.text, s.result.finish_reason, s.result.completion_tokens) == (" and more", "length", 3)
    assert server.requests[-1][0] == "/v1/completions"


@pytest.mark.parametrize("model", ["split", "close_framed"])
def test_stream_at_odd_byte_boundaries(server: FaultServer, model: str) -> None:
    s = client(server).chat_stream(model, MSGS)
    assert list(s) == ["Hel", "lo ", "wörld 🙂"]
    assert (s.result.finish_reason, s.result.completion_tokens, s.result.model) == ("length", 3, model)


def test_json_answer_to_a_stream_request_is_one_delta(server: FaultServer) -> None:
    s = client(server).chat_stream("json_for_stream", MSGS)
    assert list(s) == ["all at once"] and s.result.completion_tokens == 3 and s.result.finish_reason == "stop"


def test_a_clean_end_after_finish_reason_without_done(server: FaultServer) -> None:
    s = client(server).chat_stream("no_done", MSGS)
    assert list(s) == ["done"] and s.result.finish_reason == "stop"


@pytest.mark.parametrize("base", ["", "/", "/v1", "/v1/"])
def test_base_url_forms(server: FaultServer, base: str) -> None:
    c = OpenAIClient(server.url + base, privacy=ALLOWED)
    assert c.chat("ok", MSGS).text == "Hello wörld"
    assert server.requests[-1][0] == "/v1/chat/completions"


def test_base_url_with_a_prefix(server: FaultServer) -> None:
    c = OpenAIClient(server.url + "/openai/v1", privacy=ALLOWED)
    c.chat("ok", MSGS)
    assert server.requests[-1][0] == "/openai/v1/chat/completions"


def test_continuation_messages(server: FaultServer) -> None:
    msgs = continuation_messages(MSGS, "Hel")
    assert msgs == [*MSGS, {"role": "assistant", "content": "Hel"}] and MSGS == [{"role": "user", "content": "hello"}]
    assert continuation_messages(msgs, "lo")[-1] == {"role": "assistant", "content": "Hello"}
    client(server).chat("ok", msgs, extra={"continue_final_message": True, "add_generation_prompt": False})
    body = server.requests[-1][2]
    assert body["messages"][-1] == {"role": "assistant", "content": "Hel"} and body["continue_final_message"] is True


# ----------------------------------------------------------------------------------- retries, never once streaming


def test_503_retry_after_then_success(server: FaultServer) -> None:
    sleeps = Sleeps()
    seen: list[RemoteEvent] = []
    s = client(server, sleep=sleeps, on_event=seen.append).chat_stream("flaky503", MSGS)
    assert "".join(s) == "Hello wörld" and s.result.attempts == 2
    assert sleeps.calls == [1.0]  # the server's Retry-After, honoured
    assert [e.kind for e in seen] == ["retry"] and "loading model" in seen[0].reason
    assert server.counts["flaky503"] == 2


def test_retry_after_past_the_deadline_fails_at_once(server: FaultServer) -> None:
    sleeps = Sleeps()
    with pytest.raises(RemoteBusyError) as e:
        client(server, sleep=sleeps).chat("busy", MSGS)
    assert e.value.retry_after_s == 3600 and e.value.status == 503 and sleeps.calls == []


def test_429_is_retried_within_max_attempts(server: FaultServer) -> None:
    sleeps = Sleeps()
    r = client(server, sleep=sleeps, rand=lambda: 0.5).chat("ratelimit", MSGS)
    assert r.text == "Hello wörld" and r.attempts == 3 and len(sleeps.calls) == 2
    with pytest.raises(RemoteUnavailableError) as e:
        client(server, sleep=Sleeps(), rand=lambda: 0.0).chat_stream("always429", MSGS)
    assert e.value.status == 429 and e.value.attempts == 3 and "after 3 attempts" in str(e.value)
    assert not isinstance(e.value, StreamInterruptedError)


def test_connection_refused_is_retried() -> None:
    c = OpenAIClient(f"http://127.0.0.1:{closed_port()}", privacy=ALLOWED, sleep=Sleeps(), rand=lambda: 0.0)
    with pytest.raises(RemoteUnavailableError, match="connection refused") as e:
        c.chat_stream("ok", MSGS)
    assert e.value.attempts == 3


@pytest.mark.parametrize(
    ("model", "text"),
    [("drop", "one two"), ("drop_chunked", "one two"), ("reset", "one")],
)
def test_a_drop_mid_stream_says_what_arrived_and_is_not_retried(server: FaultServer, model: str, text: str) -> None:
    s = client(server).chat_stream(model, MSGS)
    got: list[str] = []
    with pytest.raises(StreamUnavailableError) as e:
        for d in s:
            got.append(d)
    err = e.value
    assert "".join(got) == text == err.partial.text
    assert err.deltas == len(got) and err.chars == len(text) and err.partial.finish_reason is None
    assert f"after {len(got)} delta" in str(err) and f"({len(text)} characters" in str(err)
    assert isinstance(err, RemoteUnavailableError) and err.retryable and err.attempts == 1
    assert server.counts[model] == 1  # never retried once the stream had started
    assert list(s) == [] and s.done
    with pytest.raises(StreamUnavailableError):
        _ = s.result


def test_breaker_counts_stream_failures_and_opens(server: FaultServer) -> None:
    c = client(server, breaker=CircuitBreaker(failure_threshold=2, open_s=60.0))
    for _ in range(2):
        with pytest.raises(StreamUnavailableError):
            list(c.chat_stream("drop", MSGS))
    with pytest.raises(CircuitOpenError):
        c.chat_stream("ok", MSGS)
    assert server.counts["drop"] == 2 and "ok" not in server.counts


# ----------------------------------------------------------------------------------- time


def test_trickle_is_cut_by_the_deadline(server: FaultServer) -> None:
    c = client(server, read_timeout_s=5.0)
    t0 = time.monotonic()
    s = c.chat_stream("trickle", MSGS, deadline_s=0.6)
    with pytest.raises(StreamTimeoutError, match="deadline") as e:
        list(s)
    took = time.monotonic() - t0
    assert 0.5 <= took < 2.5, took
    assert e.value.partial.text == "first" and isinstance(e.value, RemoteTimeoutError)


def test_read_timeout_mid_stream(server: FaultServer) -> None:
    c = client(server, read_timeout_s=0.3, deadline_s=1.0)
    s = c.chat_stream("trickle", MSGS)  # keepalives every 50 ms: the read timeout never fires, the deadline does
    with pytest.raises(StreamTimeoutError, match="deadline"):
        list(s)
    t0 = time.monotonic()
    with pytest.raises(StreamTimeoutError, match="no bytes for 0.3 s") as e:
        list(c.chat_stream("stall", MSGS))
    assert time.monotonic() - t0 < 0.9 and e.value.partial.text == "first"


def test_headers_too_slow_is_a_timeout_not_retried(server: FaultServer) -> None:
    t0 = time.monotonic()
    with pytest.raises(RemoteTimeoutError) as e:
        client(server, read_timeout_s=0.3).chat_stream("slow_headers", MSGS)
    assert time.monotonic() - t0 < 1.4
    assert not isinstance(e.value, StreamInterruptedError) and e.value.attempts == 1
    assert server.counts["slow_headers"] == 1


def test_close_cancels_a_stream_from_another_thread(server: FaultServer) -> None:
    s = client(server).chat_stream("trickle", MSGS)
    assert next(s) == "first"
    timer = threading.Timer(0.3, s.close)
    t0 = time.monotonic()
    timer.start()
    try:
        assert list(s) == []  # blocked reading keepalives until close() shut the socket
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 2.0
    r = s.result
    assert r.cancelled and r.text == "first" and r.finish_reason is None


def test_close_after_some_deltas_and_with(server: FaultServer) -> None:
    c = client(server)
    with c.chat_stream("trickle", MSGS) as s:
        assert next(s) == "first"
    assert s.done and s.result.cancelled
    assert c.breaker.state == "closed"
    s = c.chat_stream("ok", MSGS)
    s.close()
    s.close()  # idempotent
    assert list(s) == [] and s.result.cancelled and s.result.text == ""


# ----------------------------------------------------------------------------------- malformed answers


@pytest.mark.parametrize(
    ("model", "match", "kw"),
    [
        ("malformed", "not JSON", {}),
        ("wrong_types", "delta.content: expected a string", {}),
        ("longline", "line of", {"max_line_bytes": 1024}),
        ("bigevent", "over the limit", {"max_event_bytes": 4096}),
    ],
)
def test_malformed_stream(server: FaultServer, model: str, match: str, kw: dict[str, int]) -> None:
    s = client(server, **kw).chat_stream(model, MSGS)
    got: list[str] = []
    with pytest.raises(StreamProtocolError, match=match) as e:
        for d in s:  # the good delta came in the same read as the bad event: it is given first, then the error
            got.append(d)
    assert got == ["fine"] and e.value.partial.text == "fine" and isinstance(e.value, RemoteProtocolError)


@pytest.mark.parametrize(("model", "message"), [("error_event", "CUDA out of memory"), ("llamacpp_error", "context shift is disabled")])
def test_error_event_mid_stream(server: FaultServer, model: str, message: str) -> None:
    got: list[str] = []
    with pytest.raises(StreamUnavailableError, match=message) as e:
        for d in client(server).chat_stream(model, MSGS):
            got.append(d)
    assert got == ["so far"] and e.value.partial.text == "so far" and e.value.deltas == 1


def test_bad_answers(server: FaultServer) -> None:
    c = client(server)
    with pytest.raises(RemoteProtocolError, match="choices"):
        c.chat("bad_answer", MSGS)
    with pytest.raises(RemoteProtocolError, match="redirect"):
        c.chat("redirect", MSGS)
    with pytest.raises(RemoteRejectedError, match="no such route"):
        OpenAIClient(server.url + "/nope/v1", privacy=ALLOWED).models()


# ----------------------------------------------------------------------------------- credentials, privacy, settings


def test_401_without_token_and_the_token_never_shows(server: FaultServer) -> None:
    server.require_token = True
    with pytest.raises(RemoteAuthError, match="invalid api key") as e:
        client(server).chat_stream("ok", MSGS)
    assert e.value.status == 401 and e.value.attempts == 1
    c = client(server, token=TOKEN)
    assert "".join(c.chat_stream("ok", MSGS)) == "Hello wörld"
    assert TOKEN not in repr(c) and "token=set" in repr(c)
    with pytest.raises(RemoteRejectedError) as e2:
        c.chat("echo_auth", MSGS)  # a server echoing the header back
    assert TOKEN not in str(e2.value) and "***" in str(e2.value)


def test_tls_stream_verified_pinned_and_cancelled(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    with serving(tls_context(ca, "127.0.0.1")) as srv:
        server_cert = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", srv.server_address[1])))
        pin = hashlib.sha256(server_cert).hexdigest()
        c = OpenAIClient(srv.url + "/v1", token=TOKEN, ca_file=str(ca_path), pins_sha256=[pin], privacy=ALLOWED)
        assert "".join(c.chat_stream("split", MSGS)) == "Hello wörld 🙂"
        assert srv.requests[-1][1]["Authorization"] == f"Bearer {TOKEN}"
        s = c.chat_stream("trickle", MSGS)
        assert next(s) == "first"
        threading.Timer(0.2, s.close).start()
        t0 = time.monotonic()
        assert list(s) == [] and s.result.cancelled and time.monotonic() - t0 < 2.0
        n = len(srv.requests)
        with pytest.raises(RemoteTLSError, match="certificate verification failed"):
            OpenAIClient(srv.url, token=TOKEN, privacy=ALLOWED).chat_stream("ok", MSGS)  # the system CAs do not know this CA
        with pytest.raises(RemoteTLSError, match="none of the pins"):
            OpenAIClient(srv.url, ca_file=str(ca_path), pins_sha256=["ab" * 32], privacy=ALLOWED).chat_stream("ok", MSGS)
        assert len(srv.requests) == n  # nothing was sent


def test_privacy_is_checked_before_anything_is_sent(server: FaultServer) -> None:
    c = OpenAIClient(server.url)
    with pytest.raises(PrivacyError, match="never"):
        c.chat("ok", MSGS)
    with pytest.raises(PrivacyError):
        c.chat_stream("ok", MSGS)
    only_prompt = OpenAIClient(server.url, privacy={"ok": PrivacyPolicy("allowlist", allow_inputs=("prompt",))})
    with pytest.raises(PrivacyError, match="messages"):
        only_prompt.chat("ok", MSGS)
    assert server.requests == []
    assert only_prompt.complete("ok", "x").text == " and more"
    regional = OpenAIClient(server.url, privacy=PrivacyPolicy("allowed", regions=("eu",)), region="us")
    with pytest.raises(PrivacyError, match="region"):
        regional.complete("ok", "x")


def test_settings_are_checked() -> None:
    with pytest.raises(RemoteConfigError, match="plain http"):
        OpenAIClient("http://example.com/v1", token=TOKEN)
    with pytest.raises(RemoteConfigError):
        OpenAIClient("ftp://127.0.0.1/v1")
    with pytest.raises(RemoteConfigError, match="credentials"):
        OpenAIClient("http://user:pw@127.0.0.1/v1")
    with pytest.raises(RemoteConfigError, match="https"):
        OpenAIClient("http://127.0.0.1/v1", pins_sha256=["0" * 64])
    c = OpenAIClient("http://127.0.0.1:9/v1", privacy=ALLOWED)
    for kw in ({"temperature": -1.0}, {"top_p": 1.5}, {"max_tokens": 0}, {"seed": 1.5}, {"stop": ""}, {"extra": {"stream": False}}):
        with pytest.raises(RemoteConfigError):
            c.chat("m", MSGS, **kw)  # type: ignore[arg-type]
    for bad in ([], "hi", [{"content": "no role"}], [{"role": "user", "content": 3}]):
        with pytest.raises(RemoteConfigError):
            c.chat("m", bad)  # type: ignore[arg-type]
    with pytest.raises(RemoteConfigError):
        c.complete("m", [])
    with pytest.raises(RemoteConfigError):
        c.chat("m", MSGS, extra={"x": float("nan")})


# ----------------------------------------------------------------------------------- a third-party server: LitServe


APP = Path(__file__).with_name("litserve_openai_app.py")
START_TIMEOUT_S = 60.0
LIT_TOKEN = "lit-Token-42"
HELLO = [{"role": "user", "content": "hello there big world"}]


def _free_port() -> int:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


@pytest.fixture(scope="module")
def litserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """LitServe's OpenAISpec in a subprocess on 127.0.0.1 (its own process group, always killed)."""
    import litserve as ls  # noqa: F401 - a dev dependency: fail here, clearly, if it is missing

    root = tmp_path_factory.mktemp("litserve")
    port = _free_port()
    log_path = root / "litserve.log"
    env = dict(os.environ, EDGE_SDK_TEST_TOKEN=LIT_TOKEN, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(APP), str(port)],
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        t_end = time.monotonic() + START_TIMEOUT_S
        health = f"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {LIT_TOKEN}\r\nConnection: close\r\n\r\n".encode()
        while True:  # bounded readiness poll: LitServe's /health answers 200 once its worker is up (its auth applies)
            if proc.poll() is not None:
                pytest.fail(f"litserve exited with {proc.returncode} while starting:\n{log_path.read_text(errors='replace')[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(health)
                    s.settimeout(1.0)
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            if time.monotonic() > t_end:
                pytest.fail(f"litserve not ready after {START_TIMEOUT_S} s:\n{log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(0.1)
        yield url
    finally:
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue


def lit(url: str, **kw: Any) -> OpenAIClient:
    return OpenAIClient(url + "/v1", token=LIT_TOKEN, privacy=ALLOWED, deadline_s=20.0, **kw)


def test_litserve_chat(litserve: str) -> None:
    r = lit(litserve).chat("echo", HELLO, temperature=0.0, seed=1)
    assert (r.text, r.finish_reason, r.model) == ("echo: hello there big world", "stop", "echo")
    assert (r.prompt_tokens, r.completion_tokens, r.total_tokens) == (4, 5, 9)
    assert r.id.startswith("chatcmpl-")


def test_litserve_chat_stream(litserve: str) -> None:
    s = lit(litserve).chat_stream("echo", HELLO)
    deltas = list(s)
    assert deltas == ["echo:", " hello", " there", " big", " world"]
    r = s.result
    assert (r.text, r.finish_reason, r.deltas) == ("echo: hello there big world", "stop", 5)
    assert (r.prompt_tokens, r.completion_tokens) == (4, 5)  # LitServe's last chunk carries the usage


def test_litserve_max_tokens_and_stop(litserve: str) -> None:
    c = lit(litserve)
    s = c.chat_stream("echo", HELLO, max_tokens=3)
    assert list(s) == ["echo:", " hello", " there"] and s.result.completion_tokens == 3
    r = c.chat("echo", HELLO, stop=["big"])
    assert r.text == "echo: hello there " and r.completion_tokens == 4
    s = c.chat_stream("echo", HELLO, stop="there")
    assert "".join(s) == "echo: hello " and s.result.completion_tokens == 3


def test_litserve_concurrent_streams(litserve: str) -> None:
    c = lit(litserve)
    out: dict[int, str] = {}

    def run(i: int) -> None:
        out[i] = "".join(c.chat_stream("echo", [{"role": "user", "content": f"n{i} x"}]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == {i: f"echo: n{i} x" for i in range(4)}


def test_litserve_errors(litserve: str) -> None:
    with pytest.raises(RemoteAuthError) as e:
        OpenAIClient(litserve, privacy=ALLOWED).chat("echo", HELLO)
    assert e.value.status == 401
    with pytest.raises(StreamUnavailableError, match="asked to fail"):  # LitServe's error event, mid-stream
        list(lit(litserve).chat_stream("echo", [{"role": "user", "content": "raise"}]))
    with pytest.raises(RemoteRejectedError) as e2:  # a bad request, refused by LitServe's own request model
        lit(litserve).chat("echo", [{"role": "user", "content": [{"type": "nope"}]}])
    assert e2.value.status == 422
    # LitServe serves chat completions only: no /v1/models, no /v1/completions
    with pytest.raises(RemoteRejectedError) as e3:
        lit(litserve).models()
    assert e3.value.status == 404
    with pytest.raises(RemoteRejectedError):
        lit(litserve).complete("echo", "x")


def test_results_are_plain_data() -> None:
    r = OpenAIResult("t", "stop", 1, 2, 3, "m", "i", 0.1)
    assert r.deltas == 0 and r.attempts == 1 and not r.cancelled
    assert issubclass(StreamTimeoutError, RemoteTimeoutError) and issubclass(StreamTimeoutError, TimeoutError)
    assert issubclass(StreamProtocolError, RemoteError) and not StreamProtocolError.retryable
