"""A circuit breaker per endpoint: closed -> open -> half-open -> closed.

- **closed**: requests pass. Each attempt's outcome is recorded. The breaker opens after
  ``failure_threshold`` consecutive failures, **or** when, over the last ``window_s`` seconds,
  at least ``min_calls`` attempts were recorded and the share of failures reached
  ``failure_ratio`` (a server failing every other request never gets 5 in a row, but 50 % of
  its answers are failures).
- **open**: requests fail at once with :class:`~edge_sdk.remote.errors.CircuitOpenError`,
  without touching the network, for ``open_s`` seconds.
- **half-open**: after ``open_s`` one request (the probe) is admitted; the others keep failing
  at once. The probe's success closes the breaker (counts reset), its failure opens it again
  for another ``open_s``. A probe whose outcome is never recorded (its caller vanished) is
  given up after ``probe_timeout_s`` and another probe is admitted.

What counts as a failure is the client's call: no answer (refused, reset, timeout, TLS), a
5xx, a 429, or a malformed answer. A well-formed 4xx is the server working as it should and
counts as a success.

Every transition is a :class:`RemoteEvent` (kind ``"breaker"``) given to ``on_event`` with the
wall-clock time, the old and new state and the reason. ``on_event`` runs outside the lock; an
exception it raises is logged and dropped (an observer must not break requests).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import OptionsError
from .errors import CircuitOpenError

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "CircuitBreaker", "RemoteEvent"]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
_log = logging.getLogger("edge_sdk.remote")


@dataclass(frozen=True)
class RemoteEvent:
    """Something the client or its breaker did, for ``on_event`` observers.

    ``kind``: ``"breaker"`` (``old_state`` -> ``new_state``), ``"retry"`` (``attempt`` that
    failed, ``delay_s`` before the next), ``"wire"`` (switched to JSON after a refused binary
    request). ``time``: Unix time (wall clock). ``endpoint``: the URL, without credentials."""

    kind: str
    time: float
    endpoint: str
    reason: str
    old_state: str | None = None
    new_state: str | None = None
    attempt: int | None = None
    delay_s: float | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


def emit(on_event: Callable[[RemoteEvent], None] | None, event: RemoteEvent) -> None:
    """Give ``event`` to ``on_event``; a failing observer is logged, never raised."""
    if on_event is None:
        return
    try:
        on_event(event)
    except Exception:  # noqa: BLE001 - an observer must not break a request
        _log.exception("remote on_event observer failed on a %s event", event.kind)


class CircuitBreaker:
    """Thread-safe breaker (see the module docs). ``clock``/``wallclock`` are injectable for tests.

    Use: ``allow()`` before an attempt (raises CircuitOpenError), then exactly one of
    ``record_success()`` / ``record_failure(reason)`` / ``release()`` (the attempt never
    reached the server, e.g. it was refused locally) for each admitted attempt."""

    def __init__(
        self,
        failure_threshold: int = 5,
        failure_ratio: float = 0.5,
        window_s: float = 30.0,
        min_calls: int = 10,
        open_s: float = 5.0,
        probe_timeout_s: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
    ) -> None:
        if failure_threshold < 1 or min_calls < 1:
            raise OptionsError(f"failure_threshold and min_calls: expected ints >= 1, got {failure_threshold!r} and {min_calls!r}")
        if not 0.0 < failure_ratio <= 1.0:
            raise OptionsError(f"failure_ratio: expected 0 < r <= 1, got {failure_ratio}")
        for name, v in (("window_s", window_s), ("open_s", open_s), ("probe_timeout_s", probe_timeout_s)):
            if not (math.isfinite(v) and v > 0):
                raise OptionsError(f"{name}: expected a finite number > 0, got {v}")
        self.failure_threshold = failure_threshold
        self.failure_ratio = failure_ratio
        self.window_s = window_s
        self.min_calls = min_calls
        self.open_s = open_s
        self.probe_timeout_s = probe_timeout_s
        self._clock = clock
        self._wallclock = wallclock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._consecutive = 0
        self._window: deque[tuple[float, bool]] = deque()  # (time, failed)
        self._failed = 0  # failures in _window
        self._opened_at = 0.0
        self._probe_since: float | None = None
        self.endpoint = ""
        self.on_event: Callable[[RemoteEvent], None] | None = None

    # -- state ---------------------------------------------------------------------

    @property
    def state(self) -> str:
        """closed | open | half_open (an open breaker whose time is up reads half_open)."""
        with self._lock:
            if self._state == OPEN and self._clock() - self._opened_at >= self.open_s:
                return HALF_OPEN
            return self._state

    def _transition(self, new: str, reason: str, out: list[RemoteEvent]) -> None:
        old, self._state = self._state, new
        if new == OPEN:
            self._opened_at = self._clock()
        if new in (OPEN, CLOSED):
            self._probe_since = None
        if new == CLOSED:
            self._consecutive = 0
            self._window.clear()
            self._failed = 0
        out.append(RemoteEvent("breaker", self._wallclock(), self.endpoint, reason, old_state=old, new_state=new))

    def _flush(self, events: list[RemoteEvent]) -> None:
        for e in events:
            _log.info("circuit %s -> %s for %s: %s", e.old_state, e.new_state, e.endpoint, e.reason)
            emit(self.on_event, e)

    # -- the protocol ----------------------------------------------------------------

    def allow(self) -> None:
        """Admit one attempt or raise CircuitOpenError (no network is touched)."""
        events: list[RemoteEvent] = []
        try:
            with self._lock:
                now = self._clock()
                if self._state == OPEN:
                    left = self.open_s - (now - self._opened_at)
                    if left > 0:
                        raise CircuitOpenError(f"circuit open for {self.endpoint}: failing fast for {left:.2f} s more", retry_in_s=left)
                    self._transition(HALF_OPEN, f"open for {self.open_s:g} s: admitting one probe", events)
                if self._state == HALF_OPEN:
                    if self._probe_since is not None and now - self._probe_since < self.probe_timeout_s:
                        raise CircuitOpenError(f"circuit half-open for {self.endpoint}: a probe is in flight", retry_in_s=0.0)
                    self._probe_since = now
        finally:
            self._flush(events)

    def record_success(self) -> None:
        """Record a successful attempt: a successful half-open probe closes the circuit; when closed, it resets the consecutive-failure
        count."""
        events: list[RemoteEvent] = []
        with self._lock:
            if self._state == HALF_OPEN:
                self._transition(CLOSED, "probe succeeded", events)
            elif self._state == CLOSED:
                self._consecutive = 0
                self._add(False)
        self._flush(events)

    def record_failure(self, reason: str) -> None:
        """Record a failed attempt: a failed half-open probe reopens the circuit; when closed, it opens after ``failure_threshold``
        consecutive failures or a failure ratio of ``failure_ratio`` over at least ``min_calls`` attempts in ``window_s``."""
        events: list[RemoteEvent] = []
        with self._lock:
            if self._state == HALF_OPEN:
                self._transition(OPEN, f"probe failed: {reason}", events)
            elif self._state == CLOSED:
                self._consecutive += 1
                n, failed = self._add(True)
                if self._consecutive >= self.failure_threshold:
                    self._transition(OPEN, f"{self._consecutive} consecutive failures (last: {reason})", events)
                elif n >= self.min_calls and failed / n >= self.failure_ratio:
                    self._transition(OPEN, f"{failed} of {n} attempts failed in {self.window_s:g} s (last: {reason})", events)
        self._flush(events)

    def release(self) -> None:
        """The admitted attempt did not reach the server: free the probe slot, record nothing."""
        with self._lock:
            if self._state == HALF_OPEN:
                self._probe_since = None

    def _add(self, failed: bool) -> tuple[int, int]:
        now = self._clock()
        w = self._window
        w.append((now, failed))
        self._failed += failed
        while w and (now - w[0][0] > self.window_s or len(w) > 10_000):
            self._failed -= w.popleft()[1]
        return len(w), self._failed
