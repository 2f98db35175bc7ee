"""Retries: which failures, how long to wait, and how many a client may spend.

- :class:`RetryPolicy`: attempts per request, capped exponential backoff with *full jitter*
  (the wait before retry ``n`` is uniform in ``[0, min(cap_s, base_s * 2**n))``), and the
  retry budget's settings.
- :class:`RetryBudget`: retries may be at most ``budget_ratio`` of the requests started over a
  sliding window of ``budget_window_s`` seconds, **plus** ``budget_min_retries`` per window, so
  a quiet client (a request every few seconds) can still retry while a busy one cannot turn an
  outage into a retry storm: with the defaults (10 %, 3 per 10 s) 100 requests in 10 s allow
  3 + 10 = 13 retries in that window. The window is kept in ten buckets (constant memory).
- :func:`parse_retry_after`: ``Retry-After`` as delta-seconds or an HTTP-date.

Which failures are retried is decided by the client (``edge_sdk.remote.client``): connection
refused/reset before a response, a connect timeout, 502/503/504 and 429 -- never 4xx, a read
timeout after the request was sent, or a malformed 200.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import OptionsError

__all__ = ["RETRY_STATUSES", "RetryBudget", "RetryPolicy", "parse_retry_after"]

#: HTTP statuses that are retried (the request did not run, or the server asks to come back).
RETRY_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries.

    ``max_attempts``: attempts per request, the first included (1: never retry).
    ``base_s`` / ``cap_s``: backoff before retry ``n`` (0-based) is ``rand() * min(cap_s, base_s * 2**n)``.
    ``budget_ratio`` / ``budget_min_retries`` / ``budget_window_s``: the retry budget (module docs).
    """

    max_attempts: int = 3
    base_s: float = 0.05
    cap_s: float = 2.0
    budget_ratio: float = 0.1
    budget_min_retries: int = 3
    budget_window_s: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise OptionsError(f"max_attempts: expected an int >= 1, got {self.max_attempts!r}")
        for name in ("base_s", "cap_s", "budget_window_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise OptionsError(f"{name}: expected a finite number > 0, got {v!r}")
        if not 0.0 <= self.budget_ratio <= 1.0:
            raise OptionsError(f"budget_ratio: expected 0..1, got {self.budget_ratio!r}")
        if not isinstance(self.budget_min_retries, int) or self.budget_min_retries < 0:
            raise OptionsError(f"budget_min_retries: expected an int >= 0, got {self.budget_min_retries!r}")

    def backoff_cap(self, retry: int) -> float:
        """The upper bound of the wait before retry ``retry`` (0-based)."""
        return min(self.cap_s, self.base_s * (2.0 ** min(retry, 62)))

    def backoff(self, retry: int, rand: Callable[[], float]) -> float:
        """Full jitter: uniform in ``[0, backoff_cap(retry))`` given ``rand()`` in [0, 1)."""
        return max(0.0, min(1.0, rand())) * self.backoff_cap(retry)


class RetryBudget:
    """Counts requests and retries over a sliding window (thread-safe, constant memory).

    ``deposit()`` once per request started; ``try_withdraw()`` before each retry: True (and
    counted) when ``retries < min_retries + ratio * requests`` over the last ``window_s``."""

    BUCKETS = 10

    def __init__(
        self, ratio: float = 0.1, min_retries: int = 3, window_s: float = 10.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (isinstance(ratio, (int, float)) and 0.0 <= ratio <= 1.0):
            raise OptionsError(f"RetryBudget ratio: expected 0..1, got {ratio!r}")
        if not isinstance(min_retries, int) or isinstance(min_retries, bool) or min_retries < 0:
            raise OptionsError(f"RetryBudget min_retries: expected an int >= 0, got {min_retries!r}")
        if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
            raise OptionsError(f"RetryBudget window_s: expected a finite number > 0, got {window_s!r}")
        self.ratio = ratio
        self.min_retries = min_retries
        self.window_s = window_s
        self._width = window_s / self.BUCKETS
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, list[int]] = {}  # bucket index -> [requests, retries]

    @classmethod
    def from_policy(cls, policy: RetryPolicy, *, clock: Callable[[], float] = time.monotonic) -> "RetryBudget":
        """A budget with the ratio, minimum retries and window of ``policy``."""
        return cls(policy.budget_ratio, policy.budget_min_retries, policy.budget_window_s, clock=clock)

    def _bucket(self) -> list[int]:
        idx = int(self._clock() // self._width)
        for k in [k for k in self._buckets if k <= idx - self.BUCKETS]:
            del self._buckets[k]
        return self._buckets.setdefault(idx, [0, 0])

    def _totals(self) -> tuple[int, int]:
        return sum(b[0] for b in self._buckets.values()), sum(b[1] for b in self._buckets.values())

    def deposit(self) -> None:
        """Count one request started."""
        with self._lock:
            self._bucket()[0] += 1

    def try_withdraw(self) -> bool:
        """Before a retry: True (and the retry is counted) if the window's retries are below ``min_retries + ratio * requests``, else
        False."""
        with self._lock:
            b = self._bucket()
            requests, retries = self._totals()
            if retries < self.min_retries + self.ratio * requests:
                b[1] += 1
                return True
            return False

    def snapshot(self) -> dict[str, float]:
        """``requests`` and ``retries`` in the window and ``available`` retries now."""
        with self._lock:
            self._bucket()
            requests, retries = self._totals()
        allowed = self.min_retries + self.ratio * requests
        return {"requests": requests, "retries": retries, "available": max(0, math.ceil(allowed - retries))}


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds (``"120"``) or an HTTP-date
    (``"Wed, 21 Oct 2015 07:28:00 GMT"``, relative to ``now``, a Unix time, default the wall
    clock; a date in the past is 0). None for a missing or unreadable value."""
    if not isinstance(value, str):
        return None
    v = value.strip()
    if v.isascii() and v.isdigit():
        # a hostile 400-digit value is "a very long time", not an OverflowError; past ~31 years, all the same
        return float(int(v)) if len(v) <= 9 else 1e9
    try:
        dt = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if dt is None:
        return None
    if dt.tzinfo is None:  # "-0000": RFC 9110 HTTP-dates are always GMT
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    try:
        ts = dt.timestamp()
    except (OverflowError, ValueError, OSError):
        return None
    return max(0.0, ts - (time.time() if now is None else now))
