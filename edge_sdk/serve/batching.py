"""One worker thread per served model: a bounded queue, dynamic batching, and the counters
``/metrics`` reports.

Requests arrive already decoded and validated (a dict of arrays). :meth:`ModelWorker.submit` puts
one in the queue and returns a :class:`concurrent.futures.Future` of its outputs, or raises
:class:`QueueFullError` (with a Retry-After estimate) when ``queue_size`` requests already wait.

The worker takes the oldest request. When the model's batch dim is dynamic and ``max_batch > 1``
it then waits up to ``max_delay_s`` for more, taking requests from the front of the queue while
they stack with the first (same input names and trailing dims) and the rows fit in
``max_batch``; it concatenates the rows, runs the model once and splits each output's axis 0
back per request. A request that does not fit ends the gathering and starts the next batch, so
requests are served in arrival order. Otherwise (fixed batch dim, or ``max_batch`` 1) requests
run one at a time.

A request whose caller gave up (timeout) is dropped from the queue (:meth:`ModelWorker.discard`)
or, when it is already running, its result is thrown away.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..errors import EdgeSDKError, OptionsError

__all__ = ["BatchSplitError", "Job", "ModelWorker", "QueueFullError", "WorkerStats", "WorkerStoppedError"]

_log = logging.getLogger(__name__)

Runner = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
StackKey = tuple[tuple[str, tuple[int, ...]], ...]


class QueueFullError(EdgeSDKError):
    """The model's queue is full; ``retry_after_s`` estimates when it will have room."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class WorkerStoppedError(EdgeSDKError):
    """The model's worker is stopped (the server is shutting down)."""


class BatchSplitError(EdgeSDKError):
    """A batched call returned an output whose axis 0 is not the batch, so it cannot be split."""


@dataclass
class Job:
    """One queued request: validated feeds, its rows (axis 0; 1 for a model without a dynamic
    batch), what it must match to stack with others, and the future of its outputs."""

    feeds: Mapping[str, np.ndarray]
    rows: int
    key: StackKey
    future: Future[dict[str, np.ndarray]] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class WorkerStats:
    """A snapshot of a worker's counters (all since it was made)."""

    executions: int  # model calls
    rows: int  # rows inferred (the batch size sum)
    jobs: int  # requests that ran
    failures: int  # requests whose model call raised
    compute_s: float  # time in model calls
    queue_s: float  # time requests waited in the queue before their call
    queue_depth: int
    queue_capacity: int
    max_batch: int
    running: bool


def stack_key(feeds: Mapping[str, np.ndarray]) -> StackKey:
    """Requests stack when they have the same inputs with the same dims after axis 0."""
    return tuple((k, tuple(v.shape[1:])) for k, v in feeds.items())


class ModelWorker:
    """Runs ``run(feeds) -> outputs`` for queued requests on one thread (see the module docstring).

    ``max_batch``: rows per call (1: no batching). ``max_delay_s``: how long to wait for more
    requests once one is taken. ``queue_size``: requests that may wait (running ones excluded).
    """

    def __init__(self, name: str, run: Runner, *, max_batch: int, max_delay_s: float, queue_size: int) -> None:
        if max_batch < 1 or queue_size < 1 or max_delay_s < 0:
            raise OptionsError(f"worker {name}: expected max_batch >= 1, queue_size >= 1, max_delay_s >= 0, got max_batch={max_batch!r}, queue_size={queue_size!r}, max_delay_s={max_delay_s!r}")
        self.name = name
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.queue_size = queue_size
        self._run = run
        self._pending: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # counters, under _cond
        self._executions = 0
        self._rows = 0
        self._jobs = 0
        self._failures = 0
        self._compute_s = 0.0
        self._queue_s = 0.0
        self._job_s: float | None = None  # EWMA of service time per request (call time / requests in it)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the worker thread runs and is not stopping."""
        t = self._thread
        return t is not None and t.is_alive() and not self._stopping

    def start(self) -> None:
        """Start the thread (again after :meth:`stop`); a no-op while it runs."""
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                if not self._stopping:
                    return
                raise WorkerStoppedError(f"model {self.name}: the worker is still stopping")
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name=f"edge-sdk-serve-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Fail the waiting requests (WorkerStoppedError), let the running call finish and join
        the thread for at most ``timeout_s``. True when the thread ended."""
        with self._cond:
            self._stopping = True
            dropped = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
            t = self._thread
        for j in dropped:
            if j.future.set_running_or_notify_cancel():
                j.future.set_exception(WorkerStoppedError(f"model {self.name}: the server is shutting down"))
        if t is None:
            return True
        t.join(timeout_s)
        if t.is_alive():
            _log.warning("serve: model %s: a model call is still running after %.1f s; leaving its thread behind", self.name, timeout_s)
            return False
        return True

    # -- queue -----------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests waiting in the queue now."""
        return len(self._pending)

    def submit(self, job: Job) -> Future[dict[str, np.ndarray]]:
        """Queue ``job``; its future gets the outputs (or the model's exception)."""
        with self._cond:
            if self._stopping:
                raise WorkerStoppedError(f"model {self.name}: the server is shutting down")
            if len(self._pending) >= self.queue_size:
                raise QueueFullError(
                    f"model {self.name}: {len(self._pending)} requests already wait (queue size {self.queue_size}); retry later",
                    self._retry_after_locked(),
                )
            self._pending.append(job)
            self._cond.notify()
        if self._thread is None:
            self.start()  # used without a lifespan (create_app's startup starts it otherwise)
        return job.future

    def discard(self, job: Job) -> None:
        """Drop ``job`` from the queue (its caller gave up) and cancel its future."""
        with self._cond:
            try:
                self._pending.remove(job)
            except ValueError:
                pass
        job.future.cancel()

    def retry_after_s(self) -> int:
        """Seconds a client told to come back (``Retry-After``) should wait: the queue's estimated drain time, at least 1."""
        with self._cond:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        """Seconds until the queue is likely to have room: the waiting requests times the recent
        service time per request, plus one batching delay; at least 1."""
        per_job = self._job_s if self._job_s is not None else 0.1
        est = (len(self._pending) + 1) * per_job + self.max_delay_s
        return max(1, math.ceil(est))

    def stats(self) -> WorkerStats:
        """A :class:`WorkerStats` snapshot of the counters."""
        with self._cond:
            return WorkerStats(
                self._executions, self._rows, self._jobs, self._failures, self._compute_s, self._queue_s,
                len(self._pending), self.queue_size, self.max_batch, self.running,
            )  # fmt: skip

    # -- the thread ------------------------------------------------------------------

    def _next_batch(self) -> list[Job] | None:
        """The next batch to run (None when stopping)."""
        with self._cond:
            while True:
                while not self._pending and not self._stopping:
                    self._cond.wait(0.5)
                if self._stopping:
                    return None
                first = self._pending.popleft()
                if first.future.set_running_or_notify_cancel():
                    break
        batch, rows = [first], first.rows
        if self.max_batch <= 1 or rows >= self.max_batch:
            return batch
        deadline = time.monotonic() + self.max_delay_s
        with self._cond:
            while rows < self.max_batch and not self._stopping:
                blocked = False
                while self._pending:
                    nxt = self._pending[0]
                    if nxt.key != first.key or rows + nxt.rows > self.max_batch:
                        blocked = True  # keep arrival order: it starts the next batch
                        break
                    self._pending.popleft()
                    if nxt.future.set_running_or_notify_cancel():
                        batch.append(nxt)
                        rows += nxt.rows
                        if rows >= self.max_batch:
                            break
                remaining = deadline - time.monotonic()
                if blocked or rows >= self.max_batch or remaining <= 0:
                    break
                self._cond.wait(remaining)
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._execute(batch)
            except BaseException as e:  # never let the thread die with requests waiting on it
                _log.exception("serve: model %s: worker error", self.name)
                for j in batch:
                    if not j.future.done():
                        j.future.set_exception(e)

    def _execute(self, batch: list[Job]) -> None:
        start = time.perf_counter()
        total = sum(j.rows for j in batch)
        if len(batch) == 1:
            feeds = batch[0].feeds
        else:
            feeds = {k: np.concatenate([j.feeds[k] for j in batch], axis=0) for k in batch[0].feeds}
        error: BaseException | None = None
        outs: Mapping[str, np.ndarray] = {}
        try:
            outs = self._run(feeds)
        except Exception as e:
            error = e
        end = time.perf_counter()
        if error is None and len(batch) > 1:
            bad = [f"{k} {list(v.shape)}" for k, v in outs.items() if v.ndim == 0 or v.shape[0] != total]
            if bad:
                error = BatchSplitError(f"model {self.name}: batched call of {total} rows returned outputs without that batch axis: {bad}")
        dt = end - start
        with self._cond:
            self._executions += 1
            self._rows += total
            self._jobs += len(batch)
            self._compute_s += dt
            self._queue_s += sum(start - j.enqueued for j in batch)
            per_job = dt / len(batch)
            self._job_s = per_job if self._job_s is None else 0.8 * self._job_s + 0.2 * per_job
            if error is not None:
                self._failures += len(batch)
        if error is not None:
            for j in batch:
                j.future.set_exception(error)
            return
        if len(batch) == 1:
            batch[0].future.set_result(dict(outs))
            return
        off = 0
        for j in batch:
            j.future.set_result({k: v[off : off + j.rows] for k, v in outs.items()})
            off += j.rows
