"""Typed errors of the remote client (all :class:`~edge_sdk.errors.EdgeSDKError`).

::

    RemoteError
    ├── RemoteConfigError        the client was set up wrongly (bad URL, a token for plain http, ...)
    ├── RemoteUnavailableError   the server could not be reached or answered 5xx/429 (after retries)
    │   ├── CircuitOpenError     the circuit breaker is open: failed at once, nothing was sent
    │   └── RemoteBusyError      the server asked to come back (Retry-After) later than the deadline allows
    ├── RemoteTimeoutError       the request's deadline (or a connect/read timeout) passed
    ├── RemoteProtocolError      a malformed/oversized/unexpected answer, or a redirect (never followed)
    ├── RemoteAuthError          401/403, or the server failed to authenticate itself
    │   └── RemoteTLSError       certificate/hostname verification or a pin failed
    ├── RemoteRejectedError      any other 4xx: the server refused this request (not retried)
    ├── RemoteIncompatibleError  the server's model metadata disagrees with the manifest
    └── PrivacyError             the privacy policy forbids sending this (nothing was sent)

Messages name the endpoint without credentials; a bearer token never appears in a message.
``retryable`` says whether the same request may succeed later (the router may try another
endpoint or the local model for any error).
"""

from __future__ import annotations

from ..errors import EdgeSDKError, OptionsError

__all__ = [
    "CircuitOpenError",
    "PrivacyError",
    "RemoteAuthError",
    "RemoteBusyError",
    "RemoteConfigError",
    "RemoteError",
    "RemoteIncompatibleError",
    "RemoteProtocolError",
    "RemoteRejectedError",
    "RemoteTLSError",
    "RemoteTimeoutError",
    "RemoteUnavailableError",
]


class RemoteError(EdgeSDKError):
    """Base of the remote client's errors. ``status``: the HTTP status when there was one;
    ``attempts``: how many attempts were made (0: nothing was sent)."""

    retryable = False

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class RemoteConfigError(RemoteError, OptionsError):
    """The client cannot be built as asked (the message says what to change)."""


class RemoteUnavailableError(RemoteError):
    """Connection refused/reset, 5xx, 429 or the retry budget spent: the server is not usable now."""

    retryable = True


class CircuitOpenError(RemoteUnavailableError):
    """The endpoint's circuit breaker is open (or its half-open probe is in flight): no request
    was sent. ``retry_in_s``: seconds until the breaker admits a probe."""

    def __init__(self, message: str, *, retry_in_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_in_s = retry_in_s


class RemoteBusyError(RemoteUnavailableError):
    """The server answered 429/503 with a ``Retry-After`` that ends after this request's
    deadline, so the client failed at once instead of waiting. ``retry_after_s``: what it asked."""

    def __init__(self, message: str, *, retry_after_s: float, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message, status=status, attempts=attempts)
        self.retry_after_s = retry_after_s


class RemoteTimeoutError(RemoteError, TimeoutError):
    """The deadline passed (connect, TLS, send, headers, body, retries and waits all count)."""

    retryable = True


class RemoteProtocolError(RemoteError):
    """The answer does not follow the protocol or what was asked (malformed JSON, a missing
    output, a wrong datatype or shape, a body over the size limit, a redirect). Never half-accepted."""


class RemoteAuthError(RemoteError):
    """Authentication failed: the server refused the credentials (401/403), or (subclass
    :class:`RemoteTLSError`) the server could not prove who it is."""


class RemoteTLSError(RemoteAuthError):
    """TLS certificate or hostname verification failed, or the certificate matched no pin."""


class RemoteRejectedError(RemoteError):
    """The server refused the request with a 4xx (other than 401/403/429); not retried."""


class RemoteIncompatibleError(RemoteError):
    """The server's model (name, version, inputs, outputs, datatypes, shapes) differs from the
    manifest's; the message names each difference."""


class PrivacyError(RemoteError):
    """The model's privacy policy forbids this request (mode, input or region); nothing was sent."""
