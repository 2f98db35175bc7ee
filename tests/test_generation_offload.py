"""Generation at scale beyond the device: ``edge-sdk serve`` running a GenerationEngine (concurrent
OpenAI-client streams batched, each equal to the stream alone; a full engine is a 429), and the
GenerationRouter offloading to a real OpenAI-compatible server on 127.0.0.1 (our own serve over
the same tiny package): at the start when the device is hot, forced or full, mid-stream when the
governor turns CRITICAL (one stream to the caller, parts that say where and why), back to local
when the remote fails before or during a stream, and never when the privacy policy forbids it."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

openai = pytest.importorskip("openai")

import edge_sdk  # noqa: E402
from edge_sdk.errors import GenerationBusyError, OptionsError  # noqa: E402
from edge_sdk.generation import EngineOptions, GenerationEngine  # noqa: E402
from edge_sdk.remote import GenerationRouter, GenerationRouterOptions, OpenAIClient, PrivacyPolicy  # noqa: E402
from edge_sdk.serve import ServeOptions, Server  # noqa: E402

NAME = "tiny_llm"
MSGS = [{"role": "user", "content": "Tell me a story about a list"}]
PROMPTS = ["The quick brown fox", "def foo(x):\n    return", "import os\nimport sys\n\n", "class A:\n    def"]


@pytest.fixture(scope="module")
def local(tiny_llm_package: Path) -> Iterator[Any]:
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32", threads=1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def remote_server(tiny_llm_package: Path) -> Iterator[Server]:
    """The 'bigger server': the same package (fp32) in an engine behind edge-sdk serve on 127.0.0.1."""
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32", threads=1)
    eng = GenerationEngine(m, EngineOptions(max_streams=4))
    srv = Server({NAME: eng}, ServeOptions(timeout_s=60)).start()
    yield srv
    assert srv.stop(10)
    eng.close()
    m.close()


def _gov(value: str = "normal") -> Any:
    return SimpleNamespace(state=SimpleNamespace(value=value))


def _client(url: str, privacy: str = "allowed") -> OpenAIClient:
    return OpenAIClient(url + "/v1", privacy=PrivacyPolicy(privacy), deadline_s=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------------- serving an engine


def test_served_engine_batches_concurrent_openai_streams_each_equal_alone(local: Any) -> None:
    want = {p: local.generate(p, max_new_tokens=24, ignore_eos=True).text for p in PROMPTS}
    with GenerationEngine(local, EngineOptions(max_streams=4)) as eng:
        srv = Server({NAME: eng}).start()
        try:
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
            got: dict[str, str] = {}

            def one(p: str) -> None:
                chunks = c.completions.create(
                    model=NAME, prompt=p, max_tokens=24, temperature=0, stream=True, extra_body={"ignore_eos": True}
                )
                got[p] = "".join(ch.choices[0].text for ch in chunks if ch.choices)

            threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert got == want
            assert sum(eng.stats()["batch_histogram"][2:]) > 0  # the four were decoded together
        finally:
            assert srv.stop(10)


def test_a_full_engine_answers_429_with_retry_after(tiny_llm_package: Path) -> None:
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32", threads=1)
    m.attach_governor(_gov("constrained"), constrained_tokens_per_s=50)  # long enough to stay busy
    eng = GenerationEngine(m, EngineOptions(max_streams=1, queue_size=0))
    srv = Server({NAME: eng}).start()
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        first = c.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=400, stream=True, extra_body={"ignore_eos": True})
        next(iter(first))
        with pytest.raises(openai.RateLimitError) as ei:
            c.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=4)
        assert int(ei.value.response.headers["retry-after"]) >= 1
        first.close()
    finally:
        assert srv.stop(10)
        eng.close()
        m.close()


# ----------------------------------------------------------------------------------- the router


def test_local_first_then_offload_when_hot_or_forced_and_back_at_the_next_turn(local: Any, remote_server: Server) -> None:
    gov = _gov()
    with GenerationEngine(local, EngineOptions(max_streams=2)) as eng:
        router = GenerationRouter(eng, _client(remote_server.url), governor=gov)
        r = router.chat(MSGS, max_new_tokens=12, ignore_eos=True)
        assert r.details["parts"] == [
            {"where": "local", "trigger": "local_first", "why": "local first", "chars": len(r.text), "tokens": 12}
        ]
        gov.state.value = "critical"
        r2 = router.chat(MSGS, max_new_tokens=12)
        p = r2.details["parts"]
        assert [x["where"] for x in p] == ["remote"] and p[0]["trigger"] == "governor_critical" and r2.text
        assert r2.details["served_by"] == "remote"
        gov.state.value = "normal"
        router.set_offload(True)
        assert router.chat(MSGS, max_new_tokens=4).details["parts"][0]["trigger"] == "forced"
        router.set_offload(False)
        r4 = router.chat(MSGS, max_new_tokens=12, ignore_eos=True)  # cooled down: the next turn is local again
        assert r4.details["served_by"] == "local" and r4.text == r.text
        assert router.requests_by_trigger[("remote", "governor_critical")] == 1


def test_a_running_stream_moves_mid_generation_and_the_caller_sees_one_stream(local: Any, remote_server: Server) -> None:
    gov = _gov()
    alone = local.chat(MSGS, max_new_tokens=30, ignore_eos=True)
    # the local engine paced to 100 tokens/s (its model's governor hook), so the stream still runs when the router acts
    detach = local.attach_governor(_gov("constrained"), constrained_tokens_per_s=100)
    with GenerationEngine(local, EngineOptions(max_streams=2)) as eng:
        router = GenerationRouter(eng, _client(remote_server.url), governor=gov)
        events: list[Any] = []
        router.subscribe(events.append)
        s = router.stream(MSGS, max_new_tokens=30, ignore_eos=True)
        deltas = []
        for d in s:
            deltas.append(d)
            if len(deltas) == 5:
                gov.state.value = "critical"  # the device got hot while this stream ran
        r = s.result
        assert r is not None and "".join(deltas) == r.text
        parts = r.details["parts"]
        assert [x["where"] for x in parts] == ["local", "remote"]
        assert parts[0]["tokens"] >= 5 and parts[1]["trigger"] == "governor_critical" and parts[1]["why"].startswith("moved at token")
        assert r.text.startswith("".join(deltas[:5])) and len(r.text) > len("".join(deltas[:5]))
        assert r.usage.completion_tokens <= 30 and router.moves["to_remote"] == 1
        assert [e.kind for e in events] == ["offload"]
        # the remote continued the same text: the same fp32 model, greedy, from the prompt plus the text so far
        assert r.text[: len(alone.text) // 2] == alone.text[: len(alone.text) // 2]
    detach()


def test_privacy_never_keeps_the_prompt_on_the_device(local: Any, remote_server: Server) -> None:
    gov = _gov("critical")
    with GenerationEngine(local, EngineOptions(max_streams=2)) as eng:
        router = GenerationRouter(eng, _client(remote_server.url, privacy="never"), governor=gov)
        r = router.chat(MSGS, max_new_tokens=6, ignore_eos=True)  # the engine's own governor is not attached: it runs
        p = r.details["parts"]
        assert [x["where"] for x in p] == ["local"] and p[0]["trigger"] == "privacy" and "privacy policy" in p[0]["why"]


def test_remote_down_serves_locally_and_a_full_local_engine_offloads(local: Any, remote_server: Server) -> None:
    gov = _gov("critical")
    with GenerationEngine(local, EngineOptions(max_streams=1, queue_size=0)) as eng:
        down = GenerationRouter(eng, _client(f"http://127.0.0.1:{_free_port()}"), governor=gov)
        r = down.chat(MSGS, max_new_tokens=6, ignore_eos=True)
        assert [x["trigger"] for x in r.details["parts"]] == ["remote_failed"] and r.details["served_by"] == "local"
        router = GenerationRouter(eng, _client(remote_server.url))
        busy = eng.stream(PROMPTS[0], max_new_tokens=2000 if eng.max_context > 2000 else eng.max_context - 16, ignore_eos=True)
        next(busy)
        with pytest.raises(GenerationBusyError):
            eng.stream(PROMPTS[1], max_new_tokens=4)
        r2 = router.chat(MSGS, max_new_tokens=6)
        assert r2.details["parts"][0]["trigger"] == "queue_full" and r2.details["served_by"] == "remote"
        busy.cancel()
        busy.until_done()


class _Dropper(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible stream that sends two deltas and then drops the connection."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("Once", " upon"):
            chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


def test_a_remote_stream_that_drops_is_continued_locally(local: Any) -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dropper)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        with GenerationEngine(local, EngineOptions(max_streams=1)) as eng:
            router = GenerationRouter(
                eng, _client(f"http://127.0.0.1:{httpd.server_address[1]}"), GenerationRouterOptions(move_running=False)
            )
            router.set_offload(True)
            s = router.stream(PROMPTS[0], max_new_tokens=10, ignore_eos=True)
            text = "".join(s)
            r = s.result
            assert r is not None and text == r.text and text.startswith("Once upon")
            parts = r.details["parts"]
            assert [x["where"] for x in parts] == ["remote", "local"] and parts[1]["trigger"] == "remote_failed"
            assert parts[0]["chars"] == len("Once upon") and r.usage.completion_tokens <= 10
            assert router.moves["to_local"] == 1
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_ttft_objective_at_risk_offloads_once_the_local_rates_are_known(local: Any, remote_server: Server) -> None:
    with GenerationEngine(local, EngineOptions(max_streams=1)) as eng:
        router = GenerationRouter(eng, _client(remote_server.url), GenerationRouterOptions(ttft_objective_ms=1e-6))
        first = router.chat(MSGS, max_new_tokens=4)  # nothing measured yet: local, and the rates are learnt from it
        assert first.details["parts"][0]["trigger"] == "local_first"
        second = router.chat(MSGS, max_new_tokens=4)
        p = second.details["parts"][0]
        assert p["where"] == "remote" and p["trigger"] == "latency_objective" and "predicted local TTFT" in p["why"]
    with pytest.raises(OptionsError, match="ttft_objective_ms"):
        GenerationRouterOptions(ttft_objective_ms=0)
