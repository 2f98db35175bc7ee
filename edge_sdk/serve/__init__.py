"""``edge-sdk serve``: edge_sdk packages over the Open Inference Protocol (KServe v2 REST, with
Triton's binary tensor data extension), and text-generation (decoder) packages over the
OpenAI-compatible API and Triton's generate extension too, on Starlette + uvicorn
(``pip install 'edge-sdk[server]'``).

::

    from edge_sdk.serve import Server, ServeOptions
    with Server([edge_sdk.load(pkg)], ServeOptions(max_queue_delay_ms=2)) as srv:   # port 0: a free port
        print(srv.url)                                                               # http://127.0.0.1:<port>

Endpoints (``{v}``, the version segment, is optional; when given it must be the manifest version):

- ``GET /v2/health/live`` 200; ``GET /v2/health/ready`` 200 when every model's worker runs, else
  503 (also while shutting down). Empty bodies.
- ``GET /v2``: ``{"name": "edge-sdk", "version", "extensions": ["binary_tensor_data"]}`` (plus
  ``"generate"`` when a text-generation model is served).
- ``GET /v2/models/{name}[/versions/{v}]``: ``name``, ``versions`` ([manifest version]),
  ``platform`` (``onnxruntime_onnx``, ``tensorflow_lite``), ``inputs`` / ``outputs`` with v2
  datatypes and shapes (-1 for a dynamic dim), for the variant that was loaded.
- ``GET /v2/models/{name}[/versions/{v}]/ready``: 200 / 503.
- ``POST /v2/models/{name}[/versions/{v}]/infer``: JSON or binary request (Content-Type is not
  required; ``Content-Encoding`` gzip / deflate accepted); ``outputs`` selects outputs; outputs come
  back binary or JSON as asked (``binary_data_output``, per-output ``binary_data``). Outputs are the
  model's raw tensors (no decoding). Errors are ``{"error": message}``: 400 malformed request or an
  input the model's strict validation refuses (nothing is cast), 404 unknown model or version,
  413 body too large, 503 queue full (``Retry-After``), 504 past ``timeout_s``, 500 model failure.
- ``GET /metrics``: Prometheus text (:mod:`edge_sdk.telemetry`): ``edge_sdk_serve_requests_total``
  by model and status code, success / failure counts, request duration, queue duration and
  compute duration sums, inference (rows) and execution (model call) counts, batch size sum /
  count, queue depth and capacity, readiness; and the served models' runtime telemetry
  (``edge_sdk_model_*``: provenance, requests, errors by type, and the ``inference`` stage latency
  histogram, one observation per model call).

Text generation (:mod:`edge_sdk.serve.generate_api`; a :class:`~edge_sdk.generation.DecoderModel`,
or any object with its ``stream`` / ``encode`` / ``render_chat`` / ``max_context`` / ``package``):

- ``POST /v1/chat/completions``: OpenAI's chat request (``messages``, text content or text parts;
  role ``developer`` is ``system``) with ``max_completion_tokens`` / ``max_tokens`` (default: the
  room the context leaves), ``temperature`` (default 1, OpenAI's; 0 is greedy), ``top_p``, ``seed``,
  ``stop`` (a string or up to 4), ``stream``, ``stream_options.include_usage``; extensions ``top_k``,
  ``min_p``, ``repetition_penalty``, ``ignore_eos``. Accepted when they change nothing: ``n`` 1,
  ``presence_penalty`` / ``frequency_penalty`` 0, ``logprobs`` false, ``top_logprobs`` 0, empty
  ``logit_bias`` / ``tools`` / ``functions``, ``tool_choice`` none/auto, ``response_format`` text,
  ``modalities`` [text]; ``user``, ``metadata``, ``store``, ``service_tier``, ``parallel_tool_calls``,
  ``prediction``, ``reasoning_effort``, ``verbosity``, ``safety_identifier``, ``prompt_cache_key`` are
  ignored. Any other value of those (``logprobs: true``, tools, JSON mode ...) and any unknown field is
  a 400 naming it. The answer is a ``chat.completion`` (``finish_reason`` "stop" or "length"; a
  deadline also ends as "length"), or with ``stream`` server-sent events ``data: {chat.completion.chunk}``:
  the role first, content deltas, a chunk with ``finish_reason``, the usage chunk (``choices: []``)
  when asked for, then ``data: [DONE]``.
- ``POST /v1/completions``: the same for a ``prompt`` string (default ``max_tokens`` 16, as OpenAI's);
  ``choices[0].text``; streams ``text_completion`` chunks. ``GET /v1/models[/{model}]``: the
  text-generation models served.
- ``POST /v2/models/{name}[/versions/{v}]/generate``: ``{"text_input", "parameters": {max_tokens,
  temperature, top_p, top_k, min_p, repetition_penalty, seed, stop / stop_words, ignore_eos}}`` (top-level
  keys count as parameters too; defaults: the SDK's, greedy, 256 tokens at most) ->
  ``{"model_name", "model_version", "text_output", "finish_reason"}``; ``/generate_stream``: SSE
  events ``data: {"text_output": delta, "model_name", "model_version"}``, the last with
  ``finish_reason``; an error after the stream began is an event ``{"error": message}``. For a decoder,
  ``GET /v2/models/{name}`` answers ``platform`` "text-generation" with ``text_input`` /
  ``text_output`` BYTES, ``/ready`` as for any model, and ``/infer`` a 400 pointing to ``/generate``.
- Errors: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` on ``/v1`` (401 included),
  ``{"error": message}`` on ``/v2``: 400 bad parameters or prompt (the SDK's OptionsError,
  SamplingError, PromptError, TemplateError; ContextBudgetError has code
  ``context_length_exceeded``), 404 unknown model, 413 body too large, 429 (``/v1``) / 503 (``/v2``)
  with ``Retry-After`` when the model has ``queue_size`` generations waiting besides the running one
  or the engine raises GenerationBusyError, 504 still queued past ``timeout_s``, 500 model failure.
- Each generation runs on a thread of its model's pool, one delta at a time, so the event loop never
  waits on a model; a non-streaming generation gets ``timeout_s`` as its deadline (the text so far
  comes back); a client that disconnects cancels its generation before the next token; stopping the
  server cancels the running ones (their streams end with an error event).
- ``/metrics``: ``edge_sdk_serve_generate_requests_total`` by model, route (``chat_completions``,
  ``completions``, ``generate``, ``generate_stream``) and code (499: the client left first),
  ``..._prompt_tokens_total``, ``..._completion_tokens_total``, ``..._ttft_seconds_sum`` / ``_count``
  (arrival to the first text delta), ``..._duration_seconds_sum`` / ``_count``, ``..._finish_total``
  by reason (``error`` too), ``..._in_flight`` and ``..._capacity``, ``edge_sdk_serve_model_ready``;
  and a DecoderModel's own ``edge_sdk_generation_*`` series.

Queueing and batching (:mod:`edge_sdk.serve.batching`): each model has a worker thread and a queue
of at most ``queue_size`` waiting requests; when full the answer is 503 with ``Retry-After``
(seconds, at least 1: the waiting requests times the recent service time per request). A model
whose batch dim is dynamic (``Model._max_batch() > 1`` and outputs batched too) gets dynamic
batching: the worker takes the oldest request and waits up to ``max_queue_delay_ms`` for more,
stacking requests (each may carry several rows) while the rows fit in ``max_batch_size``; one
model call, then each request gets its rows back. Other models run one request at a time. A model
whose results depend on what else is in the batch (dynamic quantization computes its scales over
the whole batch) should be served with ``max_batch_size=1``. Models run off the event loop, so
health checks and metrics answer while a model is busy.

Limits (:class:`ServeOptions`): a request's headers must arrive within ``header_timeout_s`` and be
under 64 KiB, its body within ``body_timeout_s`` (408); idle kept-alive connections close after
``keep_alive_s``; at most ``max_connections`` are open, with ``reserved_connections`` kept for the
health checks; a declared body over ``max_body_bytes`` is a 413 before it is read, bodies in flight
hold at most ``max_inflight_body_bytes`` (503), large bodies are decoded ``max_decodes`` at a time;
malformed JSON, types, numbers, shapes and ragged data are 400s; 500 tracebacks are rate-limited.

Security: the server binds 127.0.0.1 unless told otherwise. With ``ServeOptions.token`` every
endpoint except ``/v2/health/live`` and ``/v2/health/ready`` needs ``Authorization: Bearer <token>``
(401 with ``WWW-Authenticate: Bearer`` otherwise; compared in constant time; never logged). Health
checks stay open so that orchestrator probes need no secret and reveal nothing but liveness;
``/metrics``, model metadata and ``/v1`` are protected (they name the models; the OpenAI client's
``api_key`` is the token). TLS: ``Server(tls_cert=,
tls_key=)`` (PEM files, passed to uvicorn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .options import ServeOptions

__all__ = ["ServeError", "ServeOptions", "Server", "create_app"]

_LAZY = {"create_app": "app", "Server": "server", "ServeError": "server"}

if TYPE_CHECKING:  # pragma: no cover
    from .app import create_app
    from .server import ServeError, Server


def __getattr__(name: str) -> Any:
    """Import the web stack only when it is used, with an error naming the extra."""
    if name not in _LAZY:
        raise AttributeError(f"module 'edge_sdk.serve' has no attribute {name!r}")
    import importlib

    from ..errors import MissingDependencyError

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError(f"edge-sdk serve needs Starlette and uvicorn: pip install 'edge-sdk[server]' ({e})") from e
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
