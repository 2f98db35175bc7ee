"""``edge-sdk serve`` for text generation: a real uvicorn server on 127.0.0.1 serving the real tiny
decoder package (``tiny_llm_package``: a 4-layer Llama converted by ``edge-convert llm``) over the
OpenAI-compatible API, checked with the official ``openai`` client, and over Triton's generate
extension; SSE framing, disconnects that cancel, the bounded queue, deadlines, auth, limits,
metrics and the CLI. Slow generations are the real model paced by its governor hook (CONSTRAINED:
a tokens/s cap), so nothing here is timed: every wait is bounded and nothing asserts a duration."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Mapping
from urllib.parse import urlsplit

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from conftest import ROOT  # noqa: E402

import edge_sdk  # noqa: E402
from edge_sdk.errors import GenerationBusyError  # noqa: E402
from edge_sdk.serve import ServeOptions, Server  # noqa: E402
from edge_sdk.telemetry import parse  # noqa: E402

NAME = "tiny_llm"  # the package's manifest name
MSGS = [{"role": "user", "content": "Tell me a story"}]
PROMPT = "Once upon a time"
DEMO = "shapes-classifier"


# ----------------------------------------------------------------------------------- helpers


def call(
    method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None, *, context: ssl.SSLContext | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """One HTTP request (a dict body goes as JSON): (status, lower-cased headers, body)."""
    u = urlsplit(url)
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port, context=context, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    try:
        conn.request(method, u.path, body=data, headers={"Content-Type": "application/json", **dict(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def sse_events(body: bytes) -> list[str]:
    """The ``data:`` payloads of a whole SSE body, checking the framing: every event is one
    ``data: <payload>`` line ended by a blank line."""
    text = body.decode()
    assert text.endswith("\n\n"), text[-200:]
    events = text[:-2].split("\n\n")
    for e in events:
        assert e.startswith("data: ") and "\n" not in e, repr(e)
    return [e[len("data: ") :] for e in events]


class OpenStream:
    """A streaming request whose events are read one at a time; :meth:`close` drops the
    connection (what a client that goes away does)."""

    def __init__(self, url: str, path: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> None:
        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json", **dict(headers or {})})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        assert self.resp.getheader("content-type", "").startswith("text/event-stream")

    def next_event(self) -> str:
        for _ in range(10_000):
            line = self.resp.readline()
            assert line, "the stream ended"
            if line.startswith(b"data: "):
                return line[len(b"data: ") :].decode().rstrip("\n")
        raise AssertionError("no event")

    def rest(self) -> bytes:
        return self.resp.read()

    def close(self) -> None:
        self.conn.sock.close() if self.conn.sock is not None else None  # type: ignore[func-returns-value]
        self.conn.close()


def metrics(url: str, headers: Mapping[str, str] | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, _, body = call("GET", url + "/metrics", headers=headers)
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value) for s in parse(body.decode())}  # type: ignore[arg-type]


def metric(url: str, name: str, headers: Mapping[str, str] | None = None, **labels: str) -> float:
    return metrics(url, headers).get((name, tuple(sorted(labels.items()))), 0.0)


def wait_until(cond: Any, timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def client(srv: Server, token: str = "unused") -> Any:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=token, max_retries=0, timeout=60)


class Only:
    """Exactly the protocol the routes may use (stream, encode, render_chat, max_context,
    package) over a real DecoderModel; ``mode`` "busy" refuses every stream as a full engine would,
    "fail" breaks the stream after its first delta."""

    def __init__(self, model: Any, mode: str = "") -> None:
        self._m = model
        self._mode = mode
        self.package = model.package

    @property
    def max_context(self) -> int:
        return int(self._m.max_context)

    def encode(self, prompt: Any) -> list[int]:
        return list(self._m.encode(prompt))

    def render_chat(self, messages: Any, **kw: Any) -> str:
        return str(self._m.render_chat(messages, **kw))

    def stream(self, prompt: Any, **kw: Any) -> Any:
        if self._mode == "busy":
            raise GenerationBusyError("the engine's queue is full (4 waiting)", retry_after_s=7)
        s = self._m.stream(prompt, **kw)
        return _Failing(s) if self._mode == "fail" else s


class _Failing:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.result = None
        self.n = 0

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self.n == 1:
            raise RuntimeError("the accelerator fell over")
        self.n += 1
        return str(next(self.inner))

    def cancel(self) -> None:
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def decoder(tiny_llm_package: Path) -> Any:
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", threads=1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def paced(tiny_llm_package: Path) -> Any:
    """The same package loaded again, its tokens paced to 50/s by a governor held in CONSTRAINED:
    a generation that lasts long enough to be disconnected from, queued behind, or cut by a deadline."""
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", threads=1)
    m.attach_governor(SimpleNamespace(state=SimpleNamespace(value="constrained")), constrained_tokens_per_s=50)
    yield m
    m.close()


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    m = edge_sdk.load(edge_sdk.demo_package_path(), variant="fp32-onnx", cache_dir=tmp_path_factory.mktemp("c"), measure_backends=False)
    yield m
    m.close()


@pytest.fixture(scope="module")
def server(decoder: Any, demo_model: Any) -> Iterator[Server]:
    """The decoder under its manifest name beside a tensor model, and protocol-only wrappers."""
    models = {NAME: decoder, DEMO: demo_model, "tiny-only": Only(decoder), "tiny-busy": Only(decoder, "busy"),
              "tiny-fail": Only(decoder, "fail")}  # fmt: skip
    srv = Server(models, ServeOptions(timeout_s=60)).start()
    yield srv
    assert srv.stop(10)


# ----------------------------------------------------------------------------------- OpenAI API


def test_models_list_and_retrieve(server: Server) -> None:
    assert server.url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
    c = client(server)
    page = c.models.list()
    assert [m.id for m in page.data] == [NAME, "tiny-only", "tiny-busy", "tiny-fail"]  # decoders only, not the tensor model
    assert all(m.object == "model" and m.owned_by == "edge-sdk" and m.created > 0 for m in page.data)
    assert c.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")


@pytest.mark.parametrize("name", [NAME, "tiny-only"])
def test_chat_greedy_equals_the_model_direct(server: Server, decoder: Any, name: str) -> None:
    r = client(server).chat.completions.create(model=name, messages=MSGS, max_tokens=24, temperature=0)
    want = decoder.chat(MSGS, max_new_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == name and r.created > 0
    assert len(r.choices) == 1 and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text and want.text
    assert r.choices[0].finish_reason == want.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (want.usage.prompt_tokens, want.usage.completion_tokens)
    assert r.usage.total_tokens == want.usage.prompt_tokens + want.usage.completion_tokens


def test_chat_sampling_stop_and_default_length_equal_the_model(server: Server, decoder: Any) -> None:
    c = client(server)
    r = c.chat.completions.create(model=NAME, messages=MSGS, max_completion_tokens=24, temperature=0.9, top_p=0.95, seed=5)
    assert r.choices[0].message.content == decoder.chat(MSGS, max_new_tokens=24, temperature=0.9, top_p=0.95, seed=5).text
    r = c.chat.completions.create(model=NAME, messages=MSGS, max_tokens=40, temperature=0, stop=["if"])
    want = decoder.chat(MSGS, max_new_tokens=40, stop=["if"])
    assert want.finish_reason == "stop" and r.choices[0].finish_reason == "stop" and r.choices[0].message.content == want.text
    # no max_tokens: the room the context leaves (OpenAI's default), still token-for-token the model's
    r = c.chat.completions.create(model=NAME, messages=MSGS, temperature=0)
    want = decoder.chat(MSGS, max_new_tokens=decoder.max_context - len(decoder.encode(MSGS)))
    assert r.choices[0].message.content == want.text and r.usage.completion_tokens == want.usage.completion_tokens
    # harmless extras that clients send are accepted
    r = c.chat.completions.create(model=NAME, messages=[{"role": "developer", "content": "Be brief."}, *MSGS], max_tokens=4, temperature=0,
                                  n=1, logprobs=False, presence_penalty=0, frequency_penalty=0, user="u-1", store=False,
                                  response_format={"type": "text"}, tool_choice="none", metadata={"k": "v"})  # fmt: skip
    assert r.choices[0].message.content == decoder.chat([{"role": "system", "content": "Be brief."}, *MSGS], max_new_tokens=4).text


def test_chat_stream_equals_the_model_direct(server: Server, decoder: Any) -> None:
    chunks = list(client(server).chat.completions.create(model=NAME, messages=MSGS, max_tokens=24, temperature=0, stream=True,
                                                        stream_options={"include_usage": True}))  # fmt: skip
    want = decoder.chat(MSGS, max_new_tokens=24)
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    assert len({ch.id for ch in chunks}) == 1 and all(ch.object == "chat.completion.chunk" and ch.model == NAME for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == want.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == want.usage.completion_tokens == 24
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_and_stream_equal_generate(server: Server, decoder: Any) -> None:
    c = client(server)
    want = decoder.generate(PROMPT, max_new_tokens=20)
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=20, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == want.text and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == want.usage.prompt_tokens and r.usage.completion_tokens == 20
    chunks = list(c.completions.create(model=NAME, prompt=[PROMPT], max_tokens=20, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length" and all(ch.choices[0].finish_reason is None for ch in chunks[:-1])
    r = c.completions.create(model=NAME, prompt=PROMPT, temperature=0)  # the completions API's default: 16 tokens
    assert r.usage.completion_tokens == 16 and r.choices[0].text == decoder.generate(PROMPT, max_new_tokens=16).text


def test_sse_framing(server: Server) -> None:
    body = {"model": NAME, "messages": MSGS, "max_tokens": 6, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    status, h, raw = call("POST", server.url + "/v1/chat/completions", body)
    assert status == 200 and h["content-type"].startswith("text/event-stream") and h["cache-control"] == "no-cache"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    assert docs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert docs[-2]["choices"][0]["delta"] == {} and docs[-2]["choices"][0]["finish_reason"] == "length"
    assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 6
    assert all("usage" in d and d["usage"] is None for d in docs[:-1])
    status, _, raw = call("POST", server.url + "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stream": True})  # greedy: sampled, EOS could come first
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in d and d["object"] == "text_completion" for d in docs)  # no usage unless asked for
    assert docs[-1]["choices"][0]["finish_reason"] == "length"


def test_openai_errors_are_typed(server: Server) -> None:
    c = client(server)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"n": 2}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 1.0}, "frequency_penalty"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ]
    for extra, param in bad:
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=NAME, messages=MSGS, **extra)
        err = ei.value.body
        assert ei.value.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == param, (extra, err)
        assert param in err["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model=NAME, messages=MSGS, max_tokens=10_000)
    assert ei.value.body["code"] == "context_length_exceeded" and "10000" in ei.value.body["message"]
    for messages in ([], [{"role": "user"}], [{"role": "robot", "content": "hi"}],
                     [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=NAME, messages=messages)  # type: ignore[arg-type]
        assert ei.value.body["param"] == "messages", ei.value.body
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(model=NAME, prompt=[[1, 2, 3]])
    assert ei.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=NAME, prompt=PROMPT, echo=True)
    with pytest.raises(openai.NotFoundError) as ei:
        c.chat.completions.create(model="nope", messages=MSGS)
    assert ei.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):  # a tensor model is not a text-generation model
        c.chat.completions.create(model=DEMO, messages=MSGS)
    status, _, raw = call("POST", server.url + "/v1/chat/completions", b"{not json")
    assert status == 400 and set(json.loads(raw)["error"]) == {"message", "type", "param", "code"}
    status, _, raw = call("GET", server.url + "/v1/nothing-here")
    assert status == 404 and json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_busy_engine_is_429_or_503_with_retry_after_and_failures_500(server: Server) -> None:
    c = client(server)
    with pytest.raises(openai.RateLimitError) as ei:
        c.chat.completions.create(model="tiny-busy", messages=MSGS, max_tokens=4)
    assert ei.value.status_code == 429 and ei.value.response.headers["retry-after"] == "7"
    assert ei.value.body["code"] == "rate_limit_exceeded" and "queue is full" in ei.value.body["message"]
    status, h, raw = call("POST", server.url + "/v2/models/tiny-busy/generate", {"text_input": PROMPT})
    assert status == 503 and h["retry-after"] == "7" and "queue is full" in json.loads(raw)["error"]
    with pytest.raises(openai.InternalServerError) as ei:
        c.chat.completions.create(model="tiny-fail", messages=MSGS, max_tokens=8)
    assert "accelerator fell over" in ei.value.body["message"] and ei.value.body["type"] == "server_error"
    with pytest.raises(openai.APIError, match="accelerator fell over"):  # mid-stream: an error event
        list(c.chat.completions.create(model="tiny-fail", messages=MSGS, max_tokens=8, stream=True))
    status, _, raw = call(
        "POST", server.url + "/v2/models/tiny-fail/generate_stream", {"text_input": PROMPT, "parameters": {"max_tokens": 8}}
    )
    docs = [json.loads(e) for e in sse_events(raw)]
    assert status == 200 and "text_output" in docs[0] and "accelerator fell over" in docs[-1]["error"]


# ----------------------------------------------------------------------------------- Triton's generate extension


def test_triton_generate_and_stream(server: Server, decoder: Any) -> None:
    want = decoder.generate(PROMPT, max_new_tokens=12)  # the SDK's defaults: greedy
    version = decoder.package.manifest.version
    for path in (f"/v2/models/{NAME}/generate", f"/v2/models/{NAME}/versions/{version}/generate"):
        status, h, raw = call("POST", server.url + path, {"text_input": PROMPT, "parameters": {"max_tokens": 12}})
        assert status == 200 and h["content-type"] == "application/json", raw
        doc = json.loads(raw)
        assert doc == {"model_name": NAME, "model_version": version, "text_output": want.text, "finish_reason": "length"}
    status, _, raw = call("POST", server.url + f"/v2/models/{NAME}/generate", {"text_input": PROMPT, "max_tokens": 12})  # TRT-LLM style
    assert status == 200 and json.loads(raw)["text_output"] == want.text
    status, h, raw = call(
        "POST", server.url + f"/v2/models/{NAME}/generate_stream", {"text_input": PROMPT, "parameters": {"max_tokens": 12}}
    )
    assert status == 200 and h["content-type"].startswith("text/event-stream")
    docs = [json.loads(e) for e in sse_events(raw)]
    assert all(d["model_name"] == NAME and d["model_version"] == version for d in docs)
    assert "".join(d["text_output"] for d in docs) == want.text and docs[-1]["finish_reason"] == "length"
    params = {"max_tokens": 30, "temperature": 0.8, "top_k": 20, "seed": 11, "stop": ["if"], "stream": False}
    status, _, raw = call("POST", server.url + f"/v2/models/{NAME}/generate", {"text_input": PROMPT, "parameters": params})
    assert (
        json.loads(raw)["text_output"] == decoder.generate(PROMPT, max_new_tokens=30, temperature=0.8, top_k=20, seed=11, stop=["if"]).text
    )
    for body, status_want, needle in (
        ({"text_input": PROMPT, "parameters": {"beam_width": 4}}, 400, "beam_width"),
        ({"text_input": 7}, 400, "text_input"),
        ({"text_input": PROMPT, "parameters": {"temperature": -2}}, 400, "temperature"),
        ({"text_input": PROMPT, "parameters": {"max_tokens": 10_000}}, 400, "10000"),
    ):
        status, _, raw = call("POST", server.url + f"/v2/models/{NAME}/generate", body)
        assert status == status_want and needle in json.loads(raw)["error"], raw
    assert call("POST", server.url + f"/v2/models/{NAME}/versions/9/generate", {"text_input": PROMPT})[0] == 404
    status, _, raw = call("POST", server.url + "/v2/models/nope/generate", {"text_input": PROMPT})
    assert status == 404 and isinstance(json.loads(raw)["error"], str)
    status, _, raw = call("POST", server.url + f"/v2/models/{DEMO}/generate", {"text_input": PROMPT})
    assert status == 400 and "not a text-generation model" in json.loads(raw)["error"]


def test_v2_endpoints_answer_clearly_for_a_decoder(server: Server, decoder: Any) -> None:
    status, _, raw = call("GET", server.url + "/v2")
    assert status == 200 and json.loads(raw)["extensions"] == ["binary_tensor_data", "generate"]
    status, _, raw = call("GET", server.url + f"/v2/models/{NAME}")
    meta = json.loads(raw)
    assert status == 200 and meta["name"] == NAME and meta["platform"] == "text-generation"
    assert meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]
    assert call("GET", server.url + f"/v2/models/{NAME}/ready")[0] == 200
    assert call("GET", server.url + f"/v2/models/{NAME}/versions/9/ready")[0] == 404
    status, _, raw = call("POST", server.url + f"/v2/models/{NAME}/infer", {"inputs": []})
    assert status == 400 and "text-generation model" in json.loads(raw)["error"] and "/generate" in json.loads(raw)["error"]
    assert call("GET", server.url + "/v2/health/ready")[0] == 200
    status, _, raw = call("GET", server.url + f"/v2/models/{DEMO}")  # the tensor model beside it is untouched
    assert status == 200 and json.loads(raw)["platform"] == "onnxruntime_onnx"


def test_metrics_count_generation(server: Server, decoder: Any) -> None:
    def m(name: str, **labels: str) -> float:
        return metric(server.url, name, **labels)

    before = {
        k: m(f"edge_sdk_serve_generate_{k}", model=NAME) for k in ("prompt_tokens_total", "completion_tokens_total", "ttft_seconds_count")
    }
    ok = m("edge_sdk_serve_generate_requests_total", model=NAME, route="chat_completions", code="200")
    bad = m("edge_sdk_serve_generate_requests_total", model=NAME, route="chat_completions", code="400")
    gen = m("edge_sdk_serve_generate_requests_total", model=NAME, route="generate", code="200")
    c = client(server)
    r1 = c.chat.completions.create(model=NAME, messages=MSGS, max_tokens=7, temperature=0)
    r2 = c.chat.completions.create(
        model=NAME, messages=MSGS, max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    u2 = list(r2)[-1].usage
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=NAME, messages=MSGS, n=3)
    assert call("POST", server.url + f"/v2/models/{NAME}/generate", {"text_input": PROMPT, "max_tokens": 3})[0] == 200
    # the stream's thread records its tokens as it lets go of the model, just after the last event
    wait_until(lambda: m("edge_sdk_serve_generate_in_flight", model=NAME) == 0, what="the generations to end")
    prompt3 = len(decoder.encode(PROMPT))
    assert m("edge_sdk_serve_generate_prompt_tokens_total", model=NAME) - before["prompt_tokens_total"] == (
        r1.usage.prompt_tokens + u2.prompt_tokens + prompt3
    )
    assert m("edge_sdk_serve_generate_completion_tokens_total", model=NAME) - before["completion_tokens_total"] == 7 + 5 + 3
    assert m("edge_sdk_serve_generate_ttft_seconds_count", model=NAME) - before["ttft_seconds_count"] == 3
    assert m("edge_sdk_serve_generate_ttft_seconds_sum", model=NAME) > 0
    assert m("edge_sdk_serve_generate_requests_total", model=NAME, route="chat_completions", code="200") == ok + 2
    assert m("edge_sdk_serve_generate_requests_total", model=NAME, route="chat_completions", code="400") == bad + 1
    assert m("edge_sdk_serve_generate_requests_total", model=NAME, route="generate", code="200") == gen + 1
    assert m("edge_sdk_serve_generate_finish_total", model=NAME, reason="length") >= 3
    assert m("edge_sdk_serve_generate_capacity", model=NAME) == ServeOptions().queue_size + 1
    assert m("edge_sdk_serve_model_ready", model=NAME) == 1
    assert metrics(server.url), "the decoder's own generation series are exported too"
    assert any(k[0] == "edge_sdk_generation_generated_tokens_total" for k in metrics(server.url))


# ----------------------------------------------------------------------------------- disconnects, queueing, deadlines


STREAMS = {
    "chat": ("/v1/chat/completions", {"model": NAME, "messages": MSGS, "stream": True}),
    "completions": ("/v1/completions", {"model": NAME, "prompt": PROMPT, "stream": True}),
    "generate_stream": (f"/v2/models/{NAME}/generate_stream", {"text_input": PROMPT}),
}


@pytest.mark.parametrize("route", ["chat", "completions", "generate_stream", "chat-non-streaming"])
def test_a_client_that_disconnects_cancels_its_generation(paced: Any, route: str) -> None:
    long = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}
    with Server([paced]) as srv:
        if route == "chat-non-streaming":
            path, body = "/v1/chat/completions", {"model": NAME, "messages": MSGS, **long}
            u = urlsplit(srv.url)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            wait_until(lambda: metric(srv.url, "edge_sdk_serve_generate_ttft_seconds_count", model=NAME) == 1, what="the first token")
            conn.sock.close()  # type: ignore[union-attr]
            conn.close()
        else:
            path, body = STREAMS[route]
            if route == "generate_stream":
                body = {**body, "parameters": long}
            else:
                body = {**body, **long}
            s = OpenStream(srv.url, path, body)
            for _ in range(3):
                s.next_event()
            s.close()
        wait_until(lambda: metric(srv.url, "edge_sdk_serve_generate_finish_total", model=NAME, reason="cancelled") == 1,
                   what="the generation to be cancelled")  # fmt: skip
        wait_until(lambda: metric(srv.url, "edge_sdk_serve_generate_in_flight", model=NAME) == 0, what="the model to be free")
        assert metric(srv.url, "edge_sdk_serve_generate_completion_tokens_total", model=NAME) < 400  # it stopped early
        # the model is free for the next request at once
        r = client(srv).chat.completions.create(model=NAME, messages=MSGS, max_tokens=3, temperature=0)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
        if route == "chat-non-streaming":
            assert metric(srv.url, "edge_sdk_serve_generate_requests_total", model=NAME, route="chat_completions", code="499") == 1


def test_queue_full_is_429_on_openai_and_503_on_triton(paced: Any) -> None:
    long = {"max_tokens": 400, "ignore_eos": True}
    with Server([paced], ServeOptions(queue_size=1)) as srv:

        def in_flight() -> float:
            return metric(srv.url, "edge_sdk_serve_generate_in_flight", model=NAME)

        a = OpenStream(srv.url, "/v1/chat/completions", {"model": NAME, "messages": MSGS, "stream": True, **long})
        a.next_event()
        a.next_event()  # generating
        b = OpenStream(srv.url, f"/v2/models/{NAME}/generate_stream", {"text_input": PROMPT, "parameters": long})  # waits for the model
        wait_until(lambda: in_flight() == 2, what="two generations admitted")
        try:
            with pytest.raises(openai.RateLimitError) as ei:
                client(srv).chat.completions.create(model=NAME, messages=MSGS, max_tokens=3)
            assert int(ei.value.response.headers["retry-after"]) >= 1 and ei.value.body["type"] == "rate_limit_error"
            status, h, raw = call("POST", srv.url + f"/v2/models/{NAME}/generate", {"text_input": PROMPT})
            assert status == 503 and int(h["retry-after"]) >= 1 and "limit" in json.loads(raw)["error"]
            assert call("GET", srv.url + "/v2/health/ready")[0] == 200  # the loop still answers while the model is busy
        finally:
            a.close()
            b.close()
        wait_until(lambda: in_flight() == 0, what="both generations to end")
        assert metric(srv.url, "edge_sdk_serve_generate_finish_total", model=NAME, reason="cancelled") == 2
        assert metric(srv.url, "edge_sdk_serve_generate_requests_total", model=NAME, route="chat_completions", code="429") == 1
        assert client(srv).chat.completions.create(model=NAME, messages=MSGS, max_tokens=2).usage.completion_tokens == 2


def test_timeout_s_is_the_deadline_of_a_non_streaming_generation(paced: Any) -> None:
    with Server([paced], ServeOptions(timeout_s=0.4)) as srv:
        r = client(srv).chat.completions.create(model=NAME, messages=MSGS, max_tokens=300, temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length" and 0 < r.usage.completion_tokens < 300  # cut by the deadline
        status, _, raw = call(
            "POST", srv.url + f"/v2/models/{NAME}/generate", {"text_input": PROMPT, "max_tokens": 300, "ignore_eos": True}
        )
        doc = json.loads(raw)
        assert status == 200 and doc["finish_reason"] == "length" and doc["text_output"]
        assert metric(srv.url, "edge_sdk_serve_generate_finish_total", model=NAME, reason="deadline") == 2
        # queued behind a stream (which has no deadline) past timeout_s + grace: 504, and it never runs long
        a = OpenStream(srv.url, "/v1/completions", {"model": NAME, "prompt": PROMPT, "stream": True, "max_tokens": 400, "ignore_eos": True})
        a.next_event()
        try:
            status, _, raw = call("POST", srv.url + "/v1/chat/completions", {"model": NAME, "messages": MSGS, "max_tokens": 5})
            assert status == 504 and json.loads(raw)["error"]["code"] == "timeout"
        finally:
            a.close()
        wait_until(lambda: metric(srv.url, "edge_sdk_serve_generate_in_flight", model=NAME) == 0, what="the model to be free")


def test_stop_cancels_open_streams(paced: Any) -> None:
    srv = Server([paced]).start()
    try:
        s = OpenStream(
            srv.url, "/v1/chat/completions", {"model": NAME, "messages": MSGS, "stream": True, "max_tokens": 400, "ignore_eos": True}
        )
        s.next_event()
        s.next_event()
    finally:
        assert srv.stop(10)
    rest = s.rest().decode()
    s.close()
    assert "shutdown" in rest and "[DONE]" not in rest  # an error event, not a normal end
    r = paced.generate(PROMPT, max_new_tokens=2)  # the model was let go
    assert r.usage.completion_tokens == 2


# ----------------------------------------------------------------------------------- auth, limits, TLS


def test_bearer_auth_and_body_limit(decoder: Any) -> None:
    token = "gen-s3cret_9"
    with Server([decoder], ServeOptions(token=token, max_body_bytes=4096)) as srv:
        with pytest.raises(openai.AuthenticationError) as ei:
            client(srv, "wrong").chat.completions.create(model=NAME, messages=MSGS, max_tokens=2)
        assert ei.value.body["code"] == "invalid_api_key"
        status, h, raw = call("POST", srv.url + "/v1/chat/completions", {"model": NAME, "messages": MSGS})
        assert status == 401 and h["www-authenticate"].startswith("Bearer") and json.loads(raw)["error"]["code"] == "missing_api_key"
        status, _, raw = call("POST", srv.url + f"/v2/models/{NAME}/generate", {"text_input": PROMPT})
        assert status == 401 and isinstance(json.loads(raw)["error"], str)
        assert call("GET", srv.url + "/v1/models")[0] == 401
        assert call("GET", srv.url + "/v2/health/ready")[0] == 200
        c = client(srv, token)
        assert c.chat.completions.create(model=NAME, messages=MSGS, max_tokens=2).usage.completion_tokens == 2
        big = [{"role": "user", "content": "x" * 5000}]
        with pytest.raises(openai.APIStatusError) as ei:
            c.chat.completions.create(model=NAME, messages=big, max_tokens=2)
        assert ei.value.status_code == 413 and "4096" in ei.value.body["message"]
        good = {"Authorization": f"Bearer {token}"}
        status, _, raw = call("POST", srv.url + f"/v2/models/{NAME}/generate", {"text_input": "x" * 5000}, good)
        assert status == 413 and "4096" in json.loads(raw)["error"]
        body = json.dumps({"text_input": "x" * 5000}).encode()  # no Content-Length: the limit holds while reading
        u = urlsplit(srv.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", f"/v2/models/{NAME}/generate", body=iter([body[:3000], body[3000:]]), headers=good, encode_chunked=True)
        assert conn.getresponse().status == 413
        conn.close()


def test_tls(tmp_path: Path, decoder: Any) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    with Server(decoder, tls_cert=cert_file, tls_key=key_file) as srv:  # one model, not in a list
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        body = {"model": NAME, "messages": MSGS, "max_tokens": 6, "temperature": 0, "stream": True}
        status, _, raw = call("POST", srv.url + "/v1/chat/completions", body, context=ctx)
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in sse_events(raw)[:-1])
        assert srv.url.startswith("https://") and status == 200 and text == decoder.chat(MSGS, max_new_tokens=6).text


# ----------------------------------------------------------------------------------- CLI


def test_cli_serves_a_decoder_package_beside_a_tensor_package(tmp_path: Path, tiny_llm_package: Path, decoder: Any) -> None:
    env = dict(os.environ, EDGE_SDK_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "edge_sdk.cli", "serve", str(tiny_llm_package), str(edge_sdk.demo_package_path()), "--port", "0",
           "--no-measure", "--profile", "generic-x86_64", "--threads", "1", "--context", "128"]  # fmt: skip
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in p.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    seen: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline and p.poll() is None:
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                continue
            m = re.search(r"listening on (https?://\S+)", seen[-1])
            url = m.group(1) if m else None
        assert url is not None, f"no URL printed (rc={p.poll()}): {seen}"
        assert any("text generation" in ln and "128 KV tokens" in ln for ln in seen), seen
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
        assert [m.id for m in c.models.list().data] == [NAME]
        r = c.chat.completions.create(model=NAME, messages=MSGS, max_tokens=8, temperature=0)
        assert r.choices[0].message.content == decoder.chat(MSGS, max_new_tokens=8).text
        assert call("GET", url + f"/v2/models/{DEMO}")[0] == 200
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
            raise
        reader.join(5)
        err = p.stderr.read()  # type: ignore[union-attr]
    assert rc == 0, err
