"""Remote inference over the Open Inference Protocol (KServe v2 REST).

- :mod:`edge_sdk.remote.protocol`: messages, tensors (JSON and the binary extension), routes and
  errors -- shared by the client and ``edge-sdk serve`` (:mod:`edge_sdk.serve`).
- :mod:`edge_sdk.remote.client`: :class:`RemoteClient` (health, metadata, infer; timeouts and a
  per-request deadline, retries inside a retry budget, ``Retry-After``, TLS with optional pinning,
  binary/JSON negotiation), with :mod:`~edge_sdk.remote.retry`, :mod:`~edge_sdk.remote.breaker`
  (circuit breaker) and :mod:`~edge_sdk.remote.privacy` (what may leave the device).
- :mod:`edge_sdk.remote.session`: :class:`RemoteSession`, a backend session over the client, and
  :func:`remote_model`, an edge_sdk Model that validates and decodes like a local one.
- :mod:`edge_sdk.remote.router`: :class:`Router`, local first, offload when local capacity is
  exceeded; every result says where it was served and why.
- :mod:`edge_sdk.remote.openai_client`: :class:`OpenAIClient`, the same transport for
  OpenAI-compatible generation servers (chat and completions, streamed as server-sent events).
- :mod:`edge_sdk.remote.generation_router`: :class:`GenerationRouter`, local generation first,
  offload (of a running stream too) to an OpenAI-compatible server.
- :mod:`edge_sdk.remote.errors`: the ``RemoteError`` tree.

The names below are importable from here (``from edge_sdk.remote import Router, RemoteClient,
PrivacyPolicy, remote_model``); each module loads on first use. The wire format stays a module:
``from edge_sdk.remote import protocol``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # for type checkers and readers: the same names, imported eagerly
    from .breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, RemoteEvent
    from .client import ModelMetadata, RemoteClient, RemoteEndpoint, ServerMetadata, TensorMetadata
    from .errors import (
        CircuitOpenError,
        PrivacyError,
        RemoteAuthError,
        RemoteBusyError,
        RemoteConfigError,
        RemoteError,
        RemoteIncompatibleError,
        RemoteProtocolError,
        RemoteRejectedError,
        RemoteTimeoutError,
        RemoteTLSError,
        RemoteUnavailableError,
    )
    from .generation_router import GenerationRouter, GenerationRouterOptions
    from .openai_client import (
        OpenAIClient,
        OpenAIResult,
        OpenAIStream,
        StreamInterruptedError,
        StreamProtocolError,
        StreamTimeoutError,
        StreamUnavailableError,
    )
    from .privacy import MODES, PrivacyPolicy
    from .protocol import InferRequest, InferResponse, ProtocolError
    from .retry import RETRY_STATUSES, RetryBudget, RetryPolicy, parse_retry_after
    from .router import TRIGGERS, RoutedResult, Router, RouterError, RouterEvent, RouterOptions, RouterTimeoutError
    from .session import RemoteSession, check_compatible, remote_model

_LAZY = {
    "CLOSED": "breaker",
    "CircuitBreaker": "breaker",
    "CircuitOpenError": "errors",
    "GenerationRouter": "generation_router",
    "GenerationRouterOptions": "generation_router",
    "HALF_OPEN": "breaker",
    "InferRequest": "protocol",
    "InferResponse": "protocol",
    "MODES": "privacy",
    "ModelMetadata": "client",
    "OPEN": "breaker",
    "OpenAIClient": "openai_client",
    "OpenAIResult": "openai_client",
    "OpenAIStream": "openai_client",
    "PrivacyError": "errors",
    "PrivacyPolicy": "privacy",
    "ProtocolError": "protocol",
    "RETRY_STATUSES": "retry",
    "RemoteAuthError": "errors",
    "RemoteBusyError": "errors",
    "RemoteClient": "client",
    "RemoteConfigError": "errors",
    "RemoteEndpoint": "client",
    "RemoteError": "errors",
    "RemoteEvent": "breaker",
    "RemoteIncompatibleError": "errors",
    "RemoteProtocolError": "errors",
    "RemoteRejectedError": "errors",
    "RemoteSession": "session",
    "RemoteTLSError": "errors",
    "RemoteTimeoutError": "errors",
    "RemoteUnavailableError": "errors",
    "RetryBudget": "retry",
    "RetryPolicy": "retry",
    "RoutedResult": "router",
    "Router": "router",
    "RouterError": "router",
    "RouterEvent": "router",
    "RouterOptions": "router",
    "RouterTimeoutError": "router",
    "ServerMetadata": "client",
    "StreamInterruptedError": "openai_client",
    "StreamProtocolError": "openai_client",
    "StreamTimeoutError": "openai_client",
    "StreamUnavailableError": "openai_client",
    "TRIGGERS": "router",
    "TensorMetadata": "client",
    "check_compatible": "session",
    "parse_retry_after": "retry",
    "remote_model": "session",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
