"""Soak under overload: a vision pipeline and signal-stream routers fed at 2x, 5x and 10x what the
model sustains alone, with memory, accounting and state isolation checked all along.

::

    python tools/soak.py --minutes 3 --json docs/soak_x86_64.json

Workloads (each run once per load level; ``--minutes`` is the total wall time of the soak runs,
split evenly across workloads x levels; the capacity measurements come on top):

- ``vision-live``: the demo model (``edge_sdk.demo_package_path()``) in a :class:`VisionPipeline`
  on a live :class:`SyntheticSource` (camera-like pacing at the offered fps), ``drop_oldest``,
  queue of 8, preprocessing on the inference worker (so the capture thread only reads).
- ``vision-file``: the same model on real JPEG files (the demo samples, decoded by
  :class:`ImageFolderSource`, looped until the run's deadline), read on a schedule at the offered
  fps, ``drop_oldest``. (The pipeline's own ``rate_mode="throttle"`` is not used to offer load: it
  times each frame from the previous one, so a late wake-up is never caught up, and on a busy
  machine it offers less than asked; a throttle is a ceiling, not a pace.)
- ``streams``: a :class:`StreamRouter` over 48 stream ids (``max_streams=32``: LRU evictions all
  along) with a stateful running-sum model, pushed by 3 producer threads, one window per push.
- ``streams-batched``: the same with a batched stateful model (``batch_size=8``, state stacked
  on its batch axis), pushed and polled by one thread.

Capacity: what the model sustains alone in the same set-up, with nothing dropped (the pipeline
with ``drop_policy="block"`` on an unpaced source; the router pushed by one thread as fast as it
takes). Offered rate = level x capacity. A source or producer that cannot reach it offers what it
can: ``offered_x`` is the achieved ratio (the capture thread and the producers share the CPU with
inference). A producer pushes up to 4 due windows of a stream in a row; a stream more than 32
windows behind skips to the newest (a sensor losing samples): it sees a gap and resets, which the
state check follows (``resets_seen``; between resets the running sums span many windows).

Checked per run (a failed check is listed under ``failures``; the exit status is 1 if any):

- memory: RSS (psutil) sampled over the run; RSS at the end within ``--rss-margin-mib`` of RSS
  after the first 20 % (warm-up); ``rss_slope_mib_per_min`` is the least-squares trend after it;
- bounds: pipeline queue depth <= queue_size at every snapshot; router streams <= max_streams and
  queued windows <= max_pending;
- accounting: every pipeline counters snapshot has ``unaccounted == 0``; at the end
  ``frames_in == processed + dropped`` and nothing in flight; for streams, every pushed window
  ends in a result or a typed error (``EdgeSDKError``), counted, and none is lost;
- state isolation: each stream's output equals the running sum of its own windows since its last
  reset (what it gives alone), checked for every window;
- errors: anything raised that is not an ``EdgeSDKError`` is a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import edge_sdk  # noqa: E402
from edge_sdk.errors import EdgeSDKError  # noqa: E402
from edge_sdk.pipelines import PipelineOptions, VisionPipeline  # noqa: E402
from edge_sdk.pipelines.sources import Capture, ImageFolderSource, SyntheticSource  # noqa: E402
from edge_sdk.streams import SignalStreamOptions, StreamRouter  # noqa: E402

WORKLOADS = ("vision-live", "vision-file", "streams", "streams-batched")
LEVELS = (2.0, 5.0, 10.0)
PROFILE = "generic-x86_64"

# Signal streams: 1 sample per ms, one window (W samples, W ms) per push.
SR_HZ = 1000
WINDOW = 16
N_IDS = 48
MAX_STREAMS = 32
PRODUCERS = 3
BATCH = 8
BURST = 4  # windows a producer pushes to one stream in a row
MAX_LAG = 32  # windows a stream may fall behind before it skips to the newest
_TABLE_ROWS = 1024


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# --- results ----------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One workload at one load level."""

    workload: str
    level: float
    capacity_per_s: float  # frames (vision) or windows (streams) per second the model sustains alone
    duration_s: float = 0.0
    offered: int = 0  # frames the source yielded / windows due at the offered rate
    offered_per_s: float = 0.0
    offered_x: float = 0.0  # achieved offered rate / capacity
    processed: int = 0  # frames reaching the sinks / windows with a result
    processed_per_s: float = 0.0
    dropped: dict[str, int] = field(default_factory=dict)  # by reason (vision) / skipped by the producers (streams)
    errors: dict[str, int] = field(default_factory=dict)  # typed errors by exception type
    snapshots: int = 0
    unaccounted_max: int = 0
    max_queue_depth: int = 0
    queue_bound: int = 0
    max_streams_open: int = 0
    state_checked: int = 0
    state_mismatches: int = 0
    resets_seen: int = 0
    rss_warm_mib: float = 0.0
    rss_end_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_growth_mib: float = 0.0
    rss_slope_mib_per_min: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 3)
        return d


class RssSampler:
    """Samples this process's RSS every ``interval_s`` on a thread of its own."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="soak-rss", daemon=True)

    def __enter__(self) -> "RssSampler":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic() - self._t0, _rss_mib()))

    def _loop(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self._t0, _rss_mib()))
            if self._stop.wait(self.interval_s):
                return

    def judge(self, r: RunResult, margin_mib: float, warmup: float = 0.2) -> None:
        """Fill the RSS figures of ``r`` and flag an upward trend after the warm-up."""
        s = self.samples
        total = s[-1][0] if s else 0.0
        after = [(t, m) for t, m in s if t >= warmup * total] or s[-1:]
        r.rss_warm_mib, r.rss_end_mib = after[0][1], s[-1][1]
        r.rss_peak_mib = max(m for _, m in s)
        r.rss_growth_mib = r.rss_end_mib - r.rss_warm_mib
        if len(after) >= 3:
            t = np.array([a[0] for a in after])
            m = np.array([a[1] for a in after])
            r.rss_slope_mib_per_min = float(np.polyfit(t, m, 1)[0] * 60.0) if np.ptp(t) > 0 else 0.0
        if r.rss_growth_mib > margin_mib:
            r.failures.append(
                f"RSS grew {r.rss_growth_mib:.1f} MiB after warm-up ({r.rss_warm_mib:.1f} -> {r.rss_end_mib:.1f}; margin {margin_mib:g})"
            )


def _error_name(e: BaseException) -> str:
    return type(e).__name__


# --- vision -------------------------------------------------------------------------------------


def _frames_until(deadline: float, pool: list[np.ndarray]) -> Callable[[int], np.ndarray | None]:
    """Frame i from a fixed pool (no allocation per frame) until ``deadline`` (monotonic s)."""

    def make(i: int) -> np.ndarray | None:
        return pool[i % len(pool)] if time.monotonic() < deadline else None

    return make


def _frame_pool(n: int = 8, shape: tuple[int, int] = (240, 320)) -> list[np.ndarray]:
    """Distinct BGR frames of a moving bar, made once."""
    h, w = shape
    base = np.empty((h, w, 3), np.uint8)
    base[:] = np.linspace(0, 255, w, dtype=np.float32).astype(np.uint8)[None, :, None]
    pool = []
    for i in range(n):
        img = base.copy()
        x = (i * w // n) % w
        img[:, x : x + 16] = (0, 0, 255)
        pool.append(img)
    return pool


class LoopingFolderSource(ImageFolderSource):
    """An :class:`ImageFolderSource` that starts over at the first file until ``deadline``
    (monotonic s), so a few real files make a file source of any length. ``fps``: file ``i`` is
    read no earlier than ``i / fps`` s after opening (a source behind that schedule reads at once
    and catches up, as SyntheticSource does); None reads as fast as decoding goes."""

    def __init__(self, path: str | Path, deadline: float, fps: float | None = None) -> None:
        super().__init__(path, name="files")
        self.deadline = deadline
        self.fps = fps
        self._count = 0
        self._t0 = time.monotonic()

    def _open(self) -> None:
        super()._open()
        self._t0 = time.monotonic()

    def _read(self) -> Capture | None:
        if self.fps is not None and not self._wait(self._t0 + self._count / self.fps - time.monotonic()):
            return None
        if time.monotonic() >= self.deadline:
            return None
        if self._next >= len(self.paths):
            self._next = 0
        self._count += 1
        return super()._read()


def _jpeg_folder(tmp: Path) -> Path:
    """The demo sample JPEGs, copied to a folder of their own."""
    from edge_sdk.assets import demo_samples

    d = tmp / "frames"
    d.mkdir(exist_ok=True)
    for i, p in enumerate(demo_samples()):
        shutil.copy(p, d / f"{i:03d}{p.suffix}")
    return d


class _Count:
    """A sink counting results (thread: the pipeline's output thread)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, fr: Any) -> None:
        self.n += 1


def _vision_source(kind: str, deadline: float, folder: Path | None, pool: list[np.ndarray], fps: float | None) -> Any:
    if kind == "vision-live":
        return SyntheticSource(_frames_until(deadline, pool), fps=fps, live=fps is not None, name="live")
    assert folder is not None
    return LoopingFolderSource(folder, deadline, fps)


def vision_capacity(model: Any, kind: str, seconds: float, folder: Path | None, pool: list[np.ndarray]) -> float:
    """Frames per second the pipeline sustains with nothing dropped (``block``, unpaced source)."""
    src = _vision_source(kind, time.monotonic() + seconds, folder, pool, None)
    opts = PipelineOptions(drop_policy="block", queue_size=8, preprocess="worker")
    t0 = time.monotonic()
    c = VisionPipeline(model, src, opts, sinks=[_Count()]).run()
    return c.processed / max(1e-9, time.monotonic() - t0)


def soak_vision(model: Any, kind: str, level: float, capacity: float, seconds: float, folder: Path | None, pool: list[np.ndarray],
                margin_mib: float) -> RunResult:  # fmt: skip
    """One vision run at ``level`` x ``capacity`` for ``seconds``."""
    r = RunResult(kind, level, capacity)
    fps = level * capacity
    queue_size = 8
    deadline = time.monotonic() + seconds
    src = _vision_source(kind, deadline, folder, pool, fps)
    opts = PipelineOptions(drop_policy="drop_oldest", queue_size=queue_size, preprocess="worker")
    errors: Counter[str] = Counter()
    err_lock = threading.Lock()

    def on_error(exc: BaseException, frame: Any) -> None:
        with err_lock:
            errors[_error_name(exc)] += 1

    sink = _Count()
    p = VisionPipeline(model, src, opts, sinks=[sink], on_error=on_error)
    t0 = time.monotonic()
    with RssSampler(0.25) as rss:
        p.start()
        while not p.join(0.05):
            c = p.counters()
            r.snapshots += 1
            r.unaccounted_max = max(r.unaccounted_max, abs(c.unaccounted))
            r.max_queue_depth = max(r.max_queue_depth, c.queued)
        if p.error is not None:
            r.failures.append(f"source failed: {p.error!r}")
    r.duration_s = time.monotonic() - t0
    c = p.counters()
    r.snapshots += 1
    r.unaccounted_max = max(r.unaccounted_max, abs(c.unaccounted))
    r.max_queue_depth = max(r.max_queue_depth, c.max_queue_depth)
    r.queue_bound = queue_size
    r.offered, r.processed = c.frames_in, c.processed
    r.dropped = {k: v for k, v in c.dropped.items() if v}
    r.errors = dict(errors)
    r.offered_per_s = c.frames_in / r.duration_s
    r.processed_per_s = c.processed / r.duration_s
    r.offered_x = r.offered_per_s / capacity
    if r.unaccounted_max:
        r.failures.append(f"unaccounted frames in a snapshot: {r.unaccounted_max}")
    if c.in_flight or c.frames_in != c.processed + c.dropped_total:
        r.failures.append(f"final accounting: {c}")
    if c.processed != sink.n:
        r.failures.append(f"processed={c.processed} but the sink got {sink.n}")
    if r.max_queue_depth > queue_size:
        r.failures.append(f"queue depth {r.max_queue_depth} > queue_size {queue_size}")
    if c.dropped.get("error", 0) != sum(errors.values()):
        r.failures.append(f"{c.dropped.get('error', 0)} frames dropped for errors, {sum(errors.values())} errors reported")
    rss.judge(r, margin_mib)
    return r


# --- signal streams ----------------------------------------------------------------------------


def _onnx_bytes(nodes: list[Any], inputs: list[Any], outputs: list[Any], initializers: list[Any] | None = None) -> bytes:
    from onnx import helper

    g = helper.make_graph(nodes, "g", inputs, outputs, initializers or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


def accumulator_package(folder: Path, window: int = WINDOW, max_batch: int | None = None) -> Path:
    """A stateful running-sum model: ``sN = s + sum(x, axis=1)``, ``y = sN``. With ``max_batch``:
    a dynamic batch in [1, max_batch] on axis 0 of ``x`` and of the state (``batch_axis=0``), so a
    StreamRouter can batch streams; else batch 1. Integer-valued inputs give exact sums."""
    from onnx import TensorProto, helper, numpy_helper

    from converters.packaging import write_package

    b: Any = "batch" if max_batch else 1
    onx = _onnx_bytes(
        [helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=1), helper.make_node("Add", ["s", "r"], ["sN"]),
         helper.make_node("Identity", ["sN"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, window]), helper.make_tensor_value_info("s", TensorProto.FLOAT, [b, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, 1]), helper.make_tensor_value_info("sN", TensorProto.FLOAT, [b, 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )  # fmt: skip
    extra: dict[str, Any] = {"dims": {"batch": [1, max_batch]}} if max_batch else {}
    pair: dict[str, Any] = {"input": "s", "output": "sN"}
    if max_batch:
        pair["batch_axis"] = 0
    name = f"soak-acc{window}" + (f"-b{max_batch}" if max_batch else "")
    manifest = {
        "schema": 1, "name": name, "version": "1", "task": "raw",
        "inputs": [dict(extra, name="x", dtype="float32", shape=[b, window]), dict(extra, name="s", dtype="float32", shape=[b, 1])],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [b, 1]}, {"name": "sN", "dtype": "float32", "shape": [b, 1]}],
        "state": [pair],
        "variants": [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"}],
    }  # fmt: skip
    write_package(folder / name, manifest, {"m.onnx": onx}, overwrite=True)
    return folder / name


class Chunks:
    """Deterministic pushes: the samples of stream ``i`` at timestamp ``ts`` (a multiple of the
    window's duration) are one row of a fixed table of small integers, so every running sum is
    exact in float32 and each window's sum is known without keeping what was pushed."""

    def __init__(self, window: int = WINDOW, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.table = rng.integers(-3, 4, size=(_TABLE_ROWS, window)).astype(np.float32)
        self.sums = self.table.sum(axis=1).astype(np.int64).tolist()
        self.window = window

    def row(self, i: int, ts: int) -> int:
        return (ts // self.window * 31 + i * 17) % _TABLE_ROWS

    def samples(self, i: int, ts: int) -> np.ndarray:
        return self.table[self.row(i, ts)]

    def total(self, i: int, ts: int) -> int:
        return self.sums[self.row(i, ts)]


class StateChecker:
    """Checks every window result against the running sum of its own stream since its last
    restart (a reset on a gap, or a fresh stream after an eviction): what the stream gives
    alone. Results of a stream must arrive in order (one producer per stream)."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks
        self._lock = threading.Lock()
        self._st: dict[Hashable, list[int]] = {}  # stream id -> [epoch, last index, running sum]
        self.checked = 0
        self.mismatches = 0
        self.restarts = 0
        self.first_mismatch: str | None = None

    def check(self, results: list[Any]) -> None:
        with self._lock:
            for w in results:
                sid = w.stream_id
                st = self._st.get(sid)
                if st is None or w.epoch != st[0] or w.index <= st[1]:
                    if st is not None:
                        self.restarts += 1
                    st = self._st[sid] = [w.epoch, -1, 0]
                st[0], st[1] = w.epoch, w.index
                st[2] += self.chunks.total(int(sid), int(round(w.timestamp_ms)))
                got = float(w.outputs["y"].reshape(-1)[0])
                self.checked += 1
                if got != st[2]:
                    self.mismatches += 1
                    if self.first_mismatch is None:
                        self.first_mismatch = f"stream {sid} window {w.index} at {w.timestamp_ms} ms: got {got}, alone {st[2]}"


def _router(model: Any, batched: bool) -> StreamRouter:
    opts = SignalStreamOptions(sample_rate_hz=SR_HZ, window=WINDOW, gap_policy="reset")
    if batched:
        return StreamRouter(model, opts, MAX_STREAMS, batch_size=BATCH, max_wait_ms=5.0)
    return StreamRouter(model, opts, MAX_STREAMS)


def streams_capacity(model: Any, batched: bool, seconds: float, chunks: Chunks) -> float:
    """Windows per second one thread pushes through a router over all ids, as fast as it takes."""
    router = _router(model, batched)
    ts = [0] * N_IDS
    n = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for i in range(N_IDS):
            router.push(i, chunks.samples(i, ts[i]), float(ts[i]))
            ts[i] += WINDOW
        n += N_IDS
    router.shutdown()
    return n / (time.monotonic() - t0)


@dataclass
class _Tally:
    due: int = 0
    pushed: int = 0
    skipped: int = 0
    lagging: int = 0
    results: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    untyped: list[str] = field(default_factory=list)


def _produce(router: StreamRouter, ids: list[int], rate_per_stream: float, deadline: float, chunks: Chunks, checker: StateChecker,
             tally: _Tally, lock: threading.Lock, poll: bool) -> None:  # fmt: skip
    """Push the windows of ``ids`` as they fall due at ``rate_per_stream`` (windows/s), up to
    ``BURST`` in a row per stream and turn. A stream more than ``MAX_LAG`` windows behind loses
    all but the newest (its timestamps jump: a gap, so it resets), as a sensor with a full
    buffer does; between gaps its windows are continuous, so its running sum keeps growing."""
    ts = {i: 0 for i in ids}
    sent = {i: 0 for i in ids}  # windows pushed or skipped
    local = _Tally()
    t0 = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        idle = True
        for i in ids:
            due = int((now - t0) * rate_per_stream) - sent[i]
            if due <= 0:
                continue
            idle = False
            if due > MAX_LAG:  # too far behind: the samples of due - 1 windows are lost
                ts[i] += (due - 1) * WINDOW
                local.skipped += due - 1
                sent[i] += due - 1
                due = 1
            for _ in range(min(due, BURST)):
                t = ts[i]
                ts[i] += WINDOW
                sent[i] += 1
                local.pushed += 1
                try:
                    out = router.push(i, chunks.samples(i, t), float(t))
                except EdgeSDKError as e:
                    local.errors[_error_name(e)] += 1
                    continue
                except Exception as e:  # noqa: BLE001 - an untyped error is what the soak looks for
                    local.untyped.append(repr(e))
                    continue
                local.results += len(out)
                checker.check(out)
        if poll:
            out = router.poll()
            local.results += len(out)
            checker.check(out)
        if idle:
            time.sleep(0.0005)
    end_due = int((deadline - t0) * rate_per_stream)
    local.lagging = sum(max(0, end_due - sent[i]) for i in ids)  # due by the deadline, never sent
    local.due = local.pushed + local.skipped + local.lagging
    with lock:
        tally.due += local.due
        tally.pushed += local.pushed
        tally.skipped += local.skipped
        tally.lagging += local.lagging
        tally.results += local.results
        tally.errors.update(local.errors)
        tally.untyped.extend(local.untyped)


def soak_streams(model: Any, batched: bool, level: float, capacity: float, seconds: float, chunks: Chunks, margin_mib: float) -> RunResult:
    """One router run at ``level`` x ``capacity`` windows/s for ``seconds``."""
    kind = "streams-batched" if batched else "streams"
    r = RunResult(kind, level, capacity)
    router = _router(model, batched)
    checker = StateChecker(chunks)
    tally = _Tally()
    lock = threading.Lock()
    producers = 1 if batched else PRODUCERS  # batched results of a stream come back through any call: one thread keeps them in order
    rate = level * capacity / N_IDS
    deadline = time.monotonic() + seconds
    threads = []
    for p in range(producers):
        args = (router, list(range(p, N_IDS, producers)), rate, deadline, chunks, checker, tally, lock, batched)
        threads.append(threading.Thread(target=_produce, args=args, name=f"soak-producer-{p}", daemon=True))
    t0 = time.monotonic()
    with RssSampler(0.25) as rss:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            r.snapshots += 1
            r.max_streams_open = max(r.max_streams_open, len(router))
            r.max_queue_depth = max(r.max_queue_depth, router.pending)
            time.sleep(0.05)
        for t in threads:
            t.join()
        out = router.shutdown()
        tally.results += len(out)
        checker.check(out)
    r.duration_s = time.monotonic() - t0
    r.queue_bound = router.max_pending if batched else 0
    r.offered, r.processed = tally.due, tally.results
    r.dropped = {k: v for k, v in (("skipped", tally.skipped), ("lagging_at_end", tally.lagging)) if v}
    r.errors = dict(tally.errors)
    r.offered_per_s = tally.due / r.duration_s
    r.processed_per_s = tally.results / r.duration_s
    r.offered_x = r.offered_per_s / capacity
    r.state_checked, r.state_mismatches, r.resets_seen = checker.checked, checker.mismatches, checker.restarts
    lost = tally.pushed - tally.results - sum(tally.errors.values())
    r.unaccounted_max = abs(lost)
    if lost:
        r.failures.append(f"{tally.pushed} windows pushed, {tally.results} results, {sum(tally.errors.values())} typed errors: {lost} lost")
    if tally.untyped:
        r.failures.append(f"{len(tally.untyped)} untyped errors, first {tally.untyped[0]}")
    if checker.mismatches:
        r.failures.append(f"{checker.mismatches} windows differ from the stream alone; first: {checker.first_mismatch}")
    if checker.checked != tally.results:
        r.failures.append(f"checked {checker.checked} of {tally.results} results")
    if r.max_streams_open > MAX_STREAMS:
        r.failures.append(f"{r.max_streams_open} streams open > max_streams {MAX_STREAMS}")
    if batched and r.max_queue_depth > router.max_pending:
        r.failures.append(f"{r.max_queue_depth} windows queued > max_pending {router.max_pending}")
    rss.judge(r, margin_mib)
    return r


# --- the soak ------------------------------------------------------------------------------------


def run_soak(
    minutes: float,
    *,
    levels: tuple[float, ...] = LEVELS,
    workloads: tuple[str, ...] = WORKLOADS,
    capacity_s: float = 2.0,
    rss_margin_mib: float = 24.0,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Run every workload at every level; ``minutes`` is the total of the soak runs. Returns the
    report (``runs``: one :meth:`RunResult.to_dict` per run; ``ok``: every check passed)."""
    per_run = minutes * 60.0 / (len(levels) * len(workloads))
    runs: list[RunResult] = []
    capacities: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edge-sdk-soak-") as tmp_s:
        tmp = Path(tmp_s)
        pool = _frame_pool()
        folder = _jpeg_folder(tmp)
        chunks = Chunks()
        for kind in workloads:
            if kind.startswith("vision"):
                ctx: Any = edge_sdk.load(edge_sdk.demo_package_path(), PROFILE, threads=1, cache_dir=tmp / "cache")
            else:
                batched = kind == "streams-batched"
                ctx = edge_sdk.load(
                    accumulator_package(tmp, max_batch=BATCH if batched else None), PROFILE, threads=1, cache_dir=tmp / "cache"
                )
            with ctx as model:
                if kind.startswith("vision"):
                    cap = vision_capacity(model, kind, capacity_s, folder, pool)
                else:
                    cap = streams_capacity(model, batched, capacity_s, chunks)
                capacities[kind] = cap
                log(f"{kind}: capacity {cap:.0f}/s")
                for level in levels:
                    if kind.startswith("vision"):
                        r = soak_vision(model, kind, level, cap, per_run, folder, pool, rss_margin_mib)
                    else:
                        r = soak_streams(model, batched, level, cap, per_run, chunks, rss_margin_mib)
                    runs.append(r)
                    log(_row(r))
    return {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "minutes": minutes,
        "seconds_per_run": round(per_run, 2),
        "capacity_per_s": {k: round(v, 1) for k, v in capacities.items()},
        "runs": [r.to_dict() for r in runs],
        "ok": all(r.ok for r in runs),
    }  # fmt: skip


_HEADER = (
    f"{'workload':<16}{'level':>6}{'cap/s':>9}{'offered/s':>11}{'x':>6}{'done/s':>9}{'dropped':>9}{'errors':>7}"
    f"{'unacc':>6}{'q max':>6}{'checked':>9}{'mism':>5}{'resets':>8}{'RSS warm':>9}{'end':>8}{'MiB/min':>8}  ok"
)


def _row(r: RunResult) -> str:
    drops = sum(r.dropped.values())
    return (
        f"{r.workload:<16}{r.level:>5g}x{r.capacity_per_s:>9.0f}{r.offered_per_s:>11.0f}{r.offered_x:>6.1f}{r.processed_per_s:>9.0f}"
        f"{drops:>9}{sum(r.errors.values()):>7}{r.unaccounted_max:>6}{r.max_queue_depth:>6}"
        f"{r.state_checked:>9}{r.state_mismatches:>5}{r.resets_seen:>8}"
        f"{r.rss_warm_mib:>9.1f}{r.rss_end_mib:>8.1f}{r.rss_slope_mib_per_min:>8.1f}  {'yes' if r.ok else 'NO'}"
    )


def format_table(report: dict[str, Any]) -> str:
    lines = [_HEADER]
    for d in report["runs"]:
        r = RunResult(**{k: v for k, v in d.items() if k != "ok"})
        lines.append(_row(r))
        lines.extend(f"    FAILED: {f}" for f in r.failures)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0, help="total time of the soak runs (split across workloads x levels)")
    ap.add_argument("--levels", type=float, nargs="+", default=list(LEVELS), help="offered load, as multiples of the capacity")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--capacity-seconds", type=float, default=2.0, help="how long each capacity measurement runs")
    ap.add_argument("--rss-margin-mib", type=float, default=24.0, help="allowed RSS growth after the warm-up")
    ap.add_argument("--json", type=Path, help="write the report here")
    a = ap.parse_args(argv)
    report = run_soak(a.minutes, levels=tuple(a.levels), workloads=tuple(a.workloads), capacity_s=a.capacity_seconds,
                      rss_margin_mib=a.rss_margin_mib, log=lambda s: print(s, file=sys.stderr, flush=True))  # fmt: skip
    print(format_table(report))
    print(f"capacity/s: {report['capacity_per_s']}  load avg: {report['machine']['load_avg']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
