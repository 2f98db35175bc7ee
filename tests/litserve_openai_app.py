"""A third-party OpenAI-compatible server for tests/test_openai_client.py: LitServe's ``OpenAISpec``.

Run as ``python tests/litserve_openai_app.py PORT`` (the test does, in a subprocess on 127.0.0.1).
LitServe (https://lightning.ai/docs/litserve, package ``litserve``) owns the HTTP side: FastAPI
routes, pydantic parsing of the ``/v1/chat/completions`` request, the JSON answer, the SSE
``chat.completion.chunk`` events, the usage summed into the last chunk, ``data: [DONE]``, and the
error event it sends mid-stream. This file only supplies the "model", a word echo:

- the answer is ``"echo:"`` then the words of the last user message, one word (one "token") per
  streamed delta; ``max_tokens`` cuts it after that many words; a ``stop`` string cuts it before
  the stop string (the stop string is not sent), as an OpenAI server does;
- usage: ``prompt_tokens`` = the words of every message, ``completion_tokens`` = words sent;
- a bearer token (``$EDGE_SDK_TEST_TOKEN``) is required when that variable is set;
- a last user message of ``"raise"`` makes the model fail (LitServe then sends an error event).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, Iterator

import litserve as ls
from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from litserve.specs.openai import ChatCompletionRequest, OpenAISpec

TOKEN = os.environ.get("EDGE_SDK_TEST_TOKEN") or None
_bearer = HTTPBearer(auto_error=False)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(getattr(p, "text", "") for p in content)
    return ""


class EchoAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.device = device

    def decode_request(self, request: ChatCompletionRequest, context: dict[str, Any]) -> ChatCompletionRequest:
        return request

    def predict(self, request: ChatCompletionRequest, context: dict[str, Any]) -> Iterator[dict[str, Any]]:
        prompt_words = sum(len(_text(m.content).split()) for m in request.messages)
        last = next((_text(m.content) for m in reversed(request.messages) if m.role == "user"), "")
        if last.strip() == "raise":
            raise HTTPException(500, "the echo model was asked to fail")
        words = ["echo:", *last.split()]
        limit = request.max_completion_tokens or request.max_tokens
        if limit is not None:
            words = words[: max(0, limit)]
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        full = "".join(pieces)
        cut = min((j for j in (full.find(s) for s in stops if s) if j >= 0), default=len(full))
        n = 0
        at = 0
        for piece in pieces:
            if at >= cut:
                break
            piece = piece[: cut - at]
            at += len(piece)
            n += 1
            yield {"role": "assistant", "content": piece}
        # the usage rides on the last delta (LitServe reads it from there when streaming and sums it otherwise)
        yield {"role": "assistant", "content": "", "prompt_tokens": prompt_words, "completion_tokens": n, "total_tokens": prompt_words + n}

    def encode_response(self, output: Iterator[dict[str, Any]], context: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield from output

    def authorize(self, auth: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        if TOKEN is None:
            return
        if auth is None or auth.scheme.lower() != "bearer" or auth.credentials != TOKEN:
            raise HTTPException(401, "a valid bearer token is required")


def main() -> None:
    port = int(sys.argv[1])
    server = ls.LitServer(EchoAPI(spec=OpenAISpec()), accelerator="cpu", workers_per_device=1, timeout=30)
    server.run(
        host="127.0.0.1", port=port, generate_client_file=False, num_api_servers=1, api_server_worker_type="thread", log_level="warning"
    )


if __name__ == "__main__":
    main()
