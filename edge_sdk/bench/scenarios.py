"""The four MLPerf Inference scenarios, as harness loops over :class:`~edge_sdk.bench.targets.Target`.

Every query becomes one record ``(rep, issue, start, end, pre, val, inf, dec, rows, stream)``: ``issue``
is when the query arrived (its due time, scheduled arrival or the offline issue time; perf
counter seconds), ``start``/``end`` bracket the call, the four stage times are the call's (ms; per
row for a batched call; ``rows``: rows in the call; ``stream``: the multi-stream stream, else 0).
Latency is ``end - issue``, the queue stage ``start - issue``. Records
are appended as one tuple (atomic under the GIL), so several threads share a :class:`Log`.

- **single-stream**: one query at a time, the next issued when the previous completes.
- **multi-stream**: ``streams`` threads, each with frames due every ``1/fps`` s (all streams'
  frames due at the same instants, as MLPerf issues a multi-stream query's samples together). A
  stream free at time *now* starts the newest frame already due; the older due frames it skips are
  *dropped* (a frame not started before its next frame was due). A started frame that ends more
  than ``deadline`` after its due time is *late*. Frames due per stream = ceil(duration x fps).
- **server**: Poisson arrivals at a rate (seeded exponential gaps), open loop: a generator thread
  enqueues each query at its scheduled time whatever the workers do; ``workers`` threads serve
  the queue. Latency counts from the *scheduled* arrival (the harness's own lag is charged to the
  system, never hidden). After the window, the queue drains for at most ``drain_s``; what is still
  waiting then is *dropped* (unserved).
- **offline**: all queries issued at time 0; batched calls of ``batch`` rows (``predict_batch``)
  when ``batch > 1``, else ``workers`` threads drain the queue; throughput = completed / time to
  the last completion. A block that runs past its time cap stops; the queries left are dropped.

Blocks are bounded in count and time; every thread join has a timeout.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .targets import Target

__all__ = ["Block", "Log", "WarmUp", "multi_stream_block", "offline_block", "server_block", "single_stream_block", "warm_up"]

_pc = time.perf_counter
_MAX_ERROR_MESSAGES = 5
_JOIN_GRACE_S = 30.0  # a call in flight when a block ends gets this long to return


@dataclass
class Block:
    """One repetition of one target: its wall window and what was issued in it."""

    rep: int
    begin: float
    end: float
    issued: int = 0
    dropped: int = 0


@dataclass
class Log:
    """Everything one target did in one scenario."""

    label: str
    records: list[tuple[int, float, float, float, float, float, float, float, int, int]] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)
    dropped_per_stream: list[int] = field(default_factory=list)
    issued_per_stream: list[int] = field(default_factory=list)
    arrival_lag_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def error(self, e: BaseException) -> None:
        """Count a failed query; the first few messages are kept (each cut to 300 characters)."""
        with self._lock:
            self.errors += 1
            if len(self.error_messages) < _MAX_ERROR_MESSAGES:
                self.error_messages.append(f"{type(e).__name__}: {e}"[:300])

    @property
    def issued(self) -> int:
        """Queries issued over all blocks."""
        return sum(b.issued for b in self.blocks)

    @property
    def dropped(self) -> int:
        """Queries dropped over all blocks."""
        return sum(b.dropped for b in self.blocks)

    def array(self) -> np.ndarray:
        """Records as a float64 array (n, 10), ordered by issue time."""
        if not self.records:
            return np.zeros((0, 10))
        a = np.asarray(self.records, dtype=np.float64)
        return a[np.argsort(a[:, 1], kind="stable")]


@dataclass(frozen=True)
class WarmUp:
    """The warm-up queries of a target before a scenario (excluded from every count)."""

    queries: int
    seconds: float
    first_ms: float | None
    median_ms: float | None
    per_query_s: float | None  # the service time estimate later steps use (rates, offline counts)


def warm_up(target: Target, queries: int, *, batch: int = 1, time_cap_s: float = 30.0) -> WarmUp:
    """``queries`` calls (``batch`` rows each when > 1), stopping early after ``time_cap_s``.
    Always at least one call, so the estimate exists (unless the target fails)."""
    times: list[float] = []
    rows = 0
    t_begin = _pc()
    n = max(1, queries if batch <= 1 else math.ceil(queries / batch))
    for k in range(n):
        t0 = _pc()
        if batch > 1:
            target.batch(list(range(k * batch, (k + 1) * batch)))
            rows += batch
        else:
            target.one(k)
            rows += 1
        times.append(_pc() - t0)
        if _pc() - t_begin > time_cap_s:
            break
    secs = _pc() - t_begin
    med = float(np.median(times))
    return WarmUp(rows, secs, times[0] * 1e3, med * 1e3 / max(1, batch), med / max(1, batch))


def _call(target: Target, log: Log, rep: int, i: int, issue: float, stream: int = 0) -> bool:
    start = _pc()
    try:
        st = target.one(i)
    except Exception as e:
        log.error(e)
        return False
    end = _pc()
    log.records.append((rep, issue, start, end, st[0], st[1], st[2], st[3], 1, stream))
    return True


# ------------------------------------------------------------------------------------- single-stream


def single_stream_block(target: Target, log: Log, rep: int, duration_s: float, count: int | None, offset: int = 0) -> None:
    """Queries one after another for ``duration_s`` or ``count`` queries, whichever comes first."""
    begin = _pc()
    stop = begin + duration_s
    block = Block(rep, begin, begin)
    limit = count if count is not None else 1 << 62
    k = 0
    while k < limit:
        now = _pc()
        if now >= stop:
            break
        block.issued += 1
        _call(target, log, rep, offset + k, now)
        k += 1
    block.end = _pc()
    log.blocks.append(block)


# ------------------------------------------------------------------------------------- multi-stream


def multi_stream_block(target: Target, log: Log, rep: int, duration_s: float, streams: int, fps: float) -> None:
    """``streams`` threads, frames due every ``1/fps`` s for ``duration_s`` (see the module docs)."""
    period = 1.0 / fps
    frames = max(1, math.ceil(duration_s * fps - 1e-9))
    dropped = [0] * streams
    origin = _pc() + 0.002  # every stream starts from the same instant

    def stream(s: int) -> None:
        k = 0
        while k < frames:
            now = _pc() - origin
            due = k * period
            if now < due:
                time.sleep(min(due - now, period))
                continue
            newest = min(frames - 1, int(now / period))
            if newest > k:  # frames k..newest-1: their next frame was due before they could start
                dropped[s] += newest - k
                k = newest
            _call(target, log, rep, s * frames + k, origin + k * period, s)
            k += 1

    threads = [threading.Thread(target=stream, args=(s,), name=f"bench-stream-{s}", daemon=True) for s in range(streams)]
    for t in threads:
        t.start()
    deadline = origin + duration_s + _JOIN_GRACE_S
    for t in threads:
        t.join(max(0.0, deadline - _pc()))
    hung = sum(t.is_alive() for t in threads)
    if hung:
        log.notes.append(f"repetition {rep}: {hung} stream thread(s) still in a call {_JOIN_GRACE_S:g} s after the window")
    log.blocks.append(Block(rep, origin, _pc(), frames * streams, sum(dropped)))
    if not log.issued_per_stream:
        log.issued_per_stream = [0] * streams
        log.dropped_per_stream = [0] * streams
    for s in range(streams):
        log.issued_per_stream[s] += frames
        log.dropped_per_stream[s] += dropped[s]


# ------------------------------------------------------------------------------------------- server


def poisson_arrivals(rate_qps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival offsets (s) in [0, duration_s) with exponential gaps of mean ``1/rate_qps``."""
    out: list[np.ndarray] = []
    t = 0.0
    chunk = max(16, int(rate_qps * duration_s * 1.2) + 16)
    for _ in range(1000):  # bounded: each chunk covers ~1.2 windows on average
        gaps = rng.exponential(1.0 / rate_qps, size=chunk)
        times = t + np.cumsum(gaps)
        out.append(times[times < duration_s])
        if times[-1] >= duration_s:
            break
        t = float(times[-1])
    return np.concatenate(out) if out else np.zeros(0)


def server_block(
    target: Target,
    log: Log,
    rep: int,
    rate_qps: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    workers: int = 1,
    drain_s: float = 1.0,
    offset: int = 0,
) -> None:
    """Open-loop Poisson arrivals at ``rate_qps`` for ``duration_s``, served by ``workers`` threads."""
    arrivals = poisson_arrivals(rate_qps, duration_s, rng)
    q: queue.SimpleQueue[tuple[int, float]] = queue.SimpleQueue()
    generated = threading.Event()
    abort = threading.Event()
    origin = _pc() + 0.002
    lags: list[float] = []

    def generate() -> None:
        for j, a in enumerate(arrivals):
            due = origin + float(a)
            now = _pc()
            if due > now:
                time.sleep(due - now)
                now = _pc()
            lags.append(now - due)
            q.put((offset + j, due))
            if abort.is_set():
                break
        generated.set()

    def work() -> None:
        while not abort.is_set():
            try:
                i, due = q.get(timeout=0.02)
            except queue.Empty:
                if generated.is_set():
                    return
                continue
            _call(target, log, rep, i, due)

    gen = threading.Thread(target=generate, name="bench-arrivals", daemon=True)
    pool = [threading.Thread(target=work, name=f"bench-server-{w}", daemon=True) for w in range(workers)]
    gen.start()
    for t in pool:
        t.start()
    gen.join(duration_s + 5.0)
    if gen.is_alive():  # cannot happen unless the process is starved; bounded anyway
        abort.set()
        gen.join(_JOIN_GRACE_S)
        log.notes.append(f"repetition {rep}: the arrival generator overran its window")
    hard_stop = max(_pc(), origin + duration_s) + drain_s
    for t in pool:
        t.join(max(0.0, hard_stop - _pc()))
    abort.set()  # workers take nothing new; a call in flight finishes
    for t in pool:
        t.join(_JOIN_GRACE_S)
    left = 0
    while True:
        try:
            q.get_nowait()
            left += 1
        except queue.Empty:
            break
    log.blocks.append(Block(rep, origin, _pc(), len(lags), left))
    log.arrival_lag_s.extend(lags)


# ------------------------------------------------------------------------------------------ offline


def offline_block(
    target: Target, log: Log, rep: int, queries: int, *, batch: int, workers: int, time_cap_s: float, offset: int = 0
) -> None:
    """``queries`` issued at once; batched calls (``batch`` > 1) or a pool of ``workers``."""
    issue = _pc()
    stop = issue + time_cap_s
    block = Block(rep, issue, issue, queries)
    done = [0]
    done_lock = threading.Lock()
    if batch > 1:
        for first in range(0, queries, batch):
            if _pc() >= stop:
                break
            idx = list(range(offset + first, offset + min(queries, first + batch)))
            start = _pc()
            try:
                st = target.batch(idx)
            except Exception as e:
                log.error(e)
                for _ in idx[1:]:
                    log.errors += 1
                done[0] += len(idx)
                continue
            end = _pc()
            n = len(idx)
            for _ in idx:
                log.records.append((rep, issue, start, end, st[0] / n, st[1] / n, st[2] / n, st[3] / n, n, 0))
            done[0] += n
    else:
        counter = itertools.count()

        def work() -> None:
            while _pc() < stop:
                k = next(counter)
                if k >= queries:
                    return
                _call(target, log, rep, offset + k, issue)
                with done_lock:
                    done[0] += 1

        pool = [threading.Thread(target=work, name=f"bench-offline-{w}", daemon=True) for w in range(workers)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(max(0.0, stop - _pc()) + _JOIN_GRACE_S)
    block.dropped = max(0, queries - done[0])
    if block.dropped:
        log.notes.append(f"repetition {rep}: stopped at the time cap ({time_cap_s:.1f} s) with {block.dropped} queries not run")
    block.end = _pc()
    log.blocks.append(block)


def rotate(items: Sequence[Target], k: int) -> list[Target]:
    """``items`` rotated left by ``k`` (the order of the arms changes every repetition)."""
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def guarded(log: Log, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """``fn(*args, **kwargs)``; an unexpected harness failure is recorded on ``log``, not raised."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # pragma: no cover - a harness bug guard
        log.error(e)
        log.notes.append("harness error: " + "".join(traceback.format_exception_only(type(e), e)).strip())
