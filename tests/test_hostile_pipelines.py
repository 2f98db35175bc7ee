"""Hostile pipelines: every exception type raised at every stage of a real VisionPipeline (the demo
model, a real MJPG video, a real FrameSource subclass, real sinks), and re-entrant calls from
sinks and callbacks.

Each run asserts: run() ends well inside the join timeout (set large, so a hang fails instead of
waiting it out), every frame is accounted for exactly (frames_in == processed + dropped, each
drop reported with its reason), no pipeline thread is left, the state is STOPPED, and the
exception reaches the caller by the documented policy: a BaseException that is not an Exception
(KeyboardInterrupt, SystemExit, GeneratorExit, others) is re-raised as is after a clean
shutdown; an ordinary one is a frame error / sink error (the run goes on) or, from the source, a
SourceError.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
import pytest
from pipeline_helpers import Collect

import edge_sdk
from edge_sdk.pipelines import (
    CallbackSink,
    FrameDrop,
    FrameResult,
    FrameSource,
    PipelineOptions,
    PipelineStateError,
    Sink,
    SourceError,
    SyntheticSource,
    VisionPipeline,
)
from edge_sdk.pipelines.sources import Capture
from tools.fixtures.train_demo import draw

JOIN_S = 60.0  # the pipelines' join timeout: large, so a hang shows as a failed bound, not a wait
BOUND_S = JOIN_S / 2  # every run must end well inside it (generous: valid on a 5x slower machine)
N = 16  # frames per run
K = 5  # the frame (or call) at which a stage raises


class CustomAbort(BaseException):
    """A BaseException of the caller's own (not an Exception)."""


FATAL = [KeyboardInterrupt, SystemExit, GeneratorExit, CustomAbort]
ORDINARY = [RuntimeError, MemoryError, OSError]
STAGES = ["source", "source_close", "prepare", "model", "sink", "governor", "on_error", "on_drop", "sink_open"]


# ----------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", cache_dir=tmp_path_factory.mktemp("hostile-cache")) as m:
        yield m


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.ascontiguousarray(draw(rng, i % 4, side=64)[:, :, ::-1]) for i in range(N)]


@pytest.fixture(scope="module")
def video(images, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile-video") / "shapes.avi"
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (64, 64))
    assert vw.isOpened()
    for f in images:
        vw.write(f)
    vw.release()
    return path


def _pipeline_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("edge-sdk-pipeline")]


@pytest.fixture(autouse=True)
def _no_leftover_threads():
    assert _pipeline_threads() == [], "pipeline threads left by an earlier test"
    yield
    assert _pipeline_threads() == [], "pipeline threads outlived the test"


def _make(exc_type: type[BaseException]) -> BaseException:
    return exc_type(3) if exc_type is SystemExit else exc_type(f"hostile {exc_type.__name__}")


class Once:
    """Raises ``exc`` at the ``at``-th call (0-based), once; thread-safe."""

    def __init__(self, exc: BaseException | None, at: int = K) -> None:
        self.exc, self.at, self.calls = exc, at, 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            n, self.calls = self.calls, self.calls + 1
        if self.exc is not None and n == self.at:
            raise self.exc


class HostileModel:
    """The real model; ``prepare`` / ``predict`` raise at their K-th call."""

    def __init__(self, model: Any, prepare: Once | None = None, predict: Once | None = None) -> None:
        self.model, self.prepare, self.predict = model, prepare or Once(None), predict or Once(None)

    def prepare_image(self, image: np.ndarray, *, color: str = "RGB") -> Any:
        self.prepare()
        return self.model.prepare_image(image, color=color)

    def predict_prepared(self, prepared: Any, **kw: Any) -> Any:
        self.predict()
        return self.model.predict_prepared(prepared, **kw)

    def predict_image(self, image: np.ndarray, *, color: str = "RGB", **kw: Any) -> Any:
        self.predict()
        return self.model.predict_image(image, color=color, **kw)


class HostileSource(FrameSource):
    """A real FrameSource subclass over arrays: ``read`` raises at item K, ``close`` may raise;
    ``drops``: item indices it delivers as FrameDrop with reason "unreadable" (the source hook)."""

    def __init__(
        self, frames: list[Any], *, read_exc: BaseException | None = None, close_exc: BaseException | None = None, drops=()
    ) -> None:
        super().__init__("hostile")
        self.frames, self.read_exc, self.close_exc, self.drops, self.i = frames, read_exc, close_exc, set(drops), 0

    def _read(self) -> Capture | None:
        i = self.i
        if self.read_exc is not None and i == K:
            raise self.read_exc
        if i >= len(self.frames):
            return None
        self.i += 1
        if i in self.drops:
            return Capture.dropped("unreadable", f"item {i}: cannot be read")
        return Capture(self.frames[i])

    def _close(self) -> None:
        if self.close_exc is not None:
            raise self.close_exc


class HostileSink(Sink):
    def __init__(self, write: Once, open_exc: BaseException | None = None) -> None:
        super().__init__()
        self.once, self.open_exc = write, open_exc

    def _open(self) -> None:
        if self.open_exc is not None:
            raise self.open_exc

    def _write(self, fr: FrameResult) -> None:
        self.once()


class HostileGovernor:
    """What the pipeline reads of a budget governor; ``state`` raises at its K-th read."""

    def __init__(self, once: Once) -> None:
        self.once = once

    @property
    def state(self) -> Any:
        self.once()
        return type("S", (), {"value": "normal"})()

    def record_inference(self, seconds: float) -> None:
        pass


class Outcome:
    def __init__(self) -> None:
        self.counters: Any = None
        self.exc: BaseException | None = None
        self.elapsed = float("nan")


def run_in_thread(p: VisionPipeline) -> Outcome:
    """``p.run()`` on a thread of the test's (so even a hang is bounded), with what it returned
    or raised and how long it took; asserts the bound."""
    out = Outcome()

    def target() -> None:
        t0 = time.monotonic()
        try:
            out.counters = p.run()
        except BaseException as e:  # noqa: BLE001 - what the caller of run() gets, whatever it is
            out.exc = e
        finally:
            out.elapsed = time.monotonic() - t0

    t = threading.Thread(target=target, name="test-runner", daemon=True)
    t.start()
    t.join(JOIN_S + 10)
    assert not t.is_alive(), f"run() hung: {p.counters()}"
    assert out.elapsed < BOUND_S, f"run() took {out.elapsed:.1f} s (join timeout {JOIN_S} s): {p.counters()}"
    return out


def assert_clean(p: VisionPipeline, reported: list[FrameDrop]) -> Any:
    """Terminal state: no thread left, STOPPED, every frame accounted and every drop reported."""
    assert _pipeline_threads() == [], "run() returned with pipeline threads alive"
    c = p.counters()
    assert c.state == "stopped" and p.state.value == "stopped", c
    assert c.in_flight == 0 and c.unaccounted == 0, c
    assert c.frames_in == c.processed + c.dropped_total, c
    assert min(c.preparing, c.waiting, c.queued, c.inferring, c.emitting) >= 0, c
    assert Counter(d.reason for d in reported) == Counter({r: n for r, n in c.dropped.items() if n}), (c, reported)
    assert p.source.state.value == "closed"
    return c


# ----------------------------------------------------------------------------------------------
# every exception type x every stage


def build(stage: str, exc: BaseException, model: Any, images: list[np.ndarray], video: Path, workers: int, live: bool, inline: bool = False):
    """A pipeline whose ``stage`` raises ``exc`` once; returns (pipeline, collect, errors, reported drops).
    ``inline``: preprocess="inline" (one thread reads, infers and runs the sinks)."""
    errors: list[tuple[BaseException, Any]] = []
    reported: list[FrameDrop] = []
    collect = Collect()
    sinks: list[Any] = [collect]
    m: Any = model
    governor = None
    on_error: Callable[..., Any] = lambda e, f: errors.append((e, f))  # noqa: E731
    on_drop: Callable[..., Any] | None = None
    preprocess = "worker"
    frames: list[Any] = list(images)
    source: Any = None
    if stage == "source":
        source = HostileSource(frames, read_exc=exc)
    elif stage == "source_close":
        source = HostileSource(frames, close_exc=exc)
    elif stage == "prepare":
        m, preprocess = HostileModel(model, prepare=Once(exc)), "capture"
    elif stage == "model":
        m = HostileModel(model, predict=Once(exc))
        preprocess = "capture" if workers > 1 else "worker"  # both inference paths
    elif stage == "sink":
        sinks.append(HostileSink(Once(exc)))
    elif stage == "governor":
        governor = HostileGovernor(Once(exc))
    elif stage == "on_error":
        m = HostileModel(model, predict=Once(RuntimeError("ordinary frame error")))

        def on_error(e: BaseException, f: Any) -> None:
            errors.append((e, f))
            raise exc

    elif stage == "on_drop":
        frames[K] = np.zeros((8, 8, 3), np.float32)  # an invalid frame: an "invalid_frame" drop

        def on_drop(d: FrameDrop) -> None:
            raise exc

    elif stage == "sink_open":
        sinks.append(HostileSink(Once(None), open_exc=exc))
    if source is None:
        if live:
            source = SyntheticSource(frames, fps=400, live=True)
        elif stage == "on_drop":
            source = SyntheticSource(frames)
        else:
            source = str(video)
    opts = PipelineOptions(workers=workers, join_timeout_s=JOIN_S, preprocess="inline" if inline else preprocess)
    p = VisionPipeline(m, source, opts, sinks=sinks, on_error=on_error, on_drop=on_drop, governor=governor)
    assert p.preprocess == ("inline" if inline else preprocess)
    p.add_drop_listener(reported.append)
    return p, collect, errors, reported


CASES = [(e, s) for s in STAGES for e in FATAL + ORDINARY]
# (workers, inline): one and three inference workers, and the one-thread pipeline; inline has no
# separate preparation stage (predict_image prepares), so "prepare" runs with workers only
RUNS = [(w, inline, e, s) for w, inline in ((1, False), (3, False), (1, True)) for e, s in CASES if not (inline and s == "prepare")]


@pytest.mark.parametrize(
    "workers,inline,exc_type,stage", RUNS, ids=[f"{'inline' if i else f'w{w}'}-{s}-{e.__name__}" for w, i, e, s in RUNS]
)
def test_every_exception_at_every_stage_ends_cleanly_and_accounts_every_frame(model, images, video, exc_type, stage, workers, inline) -> None:
    exc = _make(exc_type)
    fatal = not isinstance(exc, Exception)
    p, collect, errors, reported = build(stage, exc, model, images, video, workers, live=False, inline=inline)
    out = run_in_thread(p)
    c = assert_clean(p, reported)
    assert collect.indices == sorted(collect.indices) and len(collect.indices) == c.processed, c
    if stage == "sink_open":  # fails at start(): nothing read, the exception as it was raised
        assert out.exc is exc and c.frames_in == 0
        return
    if fatal:
        assert out.exc is exc, f"run() should re-raise the fatal {exc!r}, got {out.exc!r}"
        assert p.error is exc and c.frames_in <= N
    elif stage in ("source", "source_close"):
        assert isinstance(out.exc, SourceError) and out.exc.__cause__ is exc, out.exc
    else:
        assert out.exc is None, out.exc
        assert c.frames_in == N, c
    if stage == "source":
        assert c.frames_in == K and c.processed <= K
    if stage == "source_close" and not fatal:
        assert c.processed == N
    if stage in ("prepare", "model", "on_error"):
        assert c.dropped["error"] == 1, c
        assert len(errors) == 1 and errors[0][0] is (exc if stage != "on_error" else errors[0][0]), errors
        assert errors[0][1].index not in collect.indices
        if not fatal:
            assert c.processed == N - 1
    if stage == "sink":
        assert c.sink_errors == 1 and [e for e, _ in errors] == [exc], (c, errors)
        assert errors[0][1].index in collect.indices  # the frame counts as processed
        if not fatal:
            assert c.processed == N
    if stage == "governor":
        assert [e for e, _ in errors] == [exc] and c.sink_errors == 0
        if not fatal:
            assert c.processed == N
    if stage == "on_drop":
        assert c.dropped["invalid_frame"] == 1 and K not in collect.indices
        if not fatal:
            assert c.processed == N - 1
    if fatal and workers == 1 and stage in ("model", "sink", "governor", "on_error"):  # ("prepare" runs ahead: queued frames are discarded)
        assert c.processed >= K - 1  # frames before the failing one still reach the sinks


@pytest.mark.parametrize("exc_type", FATAL)
@pytest.mark.parametrize("stage", ["model", "sink"])
def test_fatal_exceptions_on_a_live_source_end_cleanly(model, images, video, exc_type, stage) -> None:
    exc = _make(exc_type)
    p, collect, errors, reported = build(stage, exc, model, images, video, 2, live=True)
    out = run_in_thread(p)
    c = assert_clean(p, reported)
    assert out.exc is exc and len(collect.indices) == c.processed


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_reach_a_main_thread_caller_after_cleanup(model, video, exc_type) -> None:
    exc = _make(exc_type)
    reported: list[FrameDrop] = []
    p = VisionPipeline(model, str(video), PipelineOptions(join_timeout_s=JOIN_S), sinks=[HostileSink(Once(exc, at=2))])
    p.add_drop_listener(reported.append)
    t0 = time.monotonic()
    with pytest.raises(exc_type) as info:
        p.run()
    assert time.monotonic() - t0 < BOUND_S
    assert info.value is exc
    assert_clean(p, reported)


# ----------------------------------------------------------------------------------------------
# re-entrant calls from sinks and callbacks


@pytest.mark.parametrize("workers", [1, 3, "inline"])
@pytest.mark.parametrize("call", ["close", "close-discard", "stop", "stop-discard", "exit"])
def test_close_or_stop_from_inside_a_sink_returns_promptly_and_ends_the_pipeline(model, images, call, workers) -> None:
    # "inline": one worker's worth, on the thread that reads the source and runs the sink
    opts = PipelineOptions(workers=1, join_timeout_s=JOIN_S, preprocess="inline") if workers == "inline" else PipelineOptions(workers=workers, join_timeout_s=JOIN_S)
    n_workers = 1 if workers == "inline" else workers
    took: list[float] = []
    collect = Collect()
    p: VisionPipeline

    def sink(fr: FrameResult) -> None:
        collect(fr)
        if fr.index == K:
            t0 = time.monotonic()
            name, _, mode = call.partition("-")
            if name == "exit":
                p.__exit__(None, None, None)
            else:
                getattr(p, name)(mode or None)
            took.append(time.monotonic() - t0)

    reported: list[FrameDrop] = []
    frames = list(images) * 8
    p = VisionPipeline(model, SyntheticSource(frames), opts, sinks=[sink])
    p.add_drop_listener(reported.append)
    out = run_in_thread(p)
    c = assert_clean(p, reported)
    assert out.exc is None and c.sink_errors == 0, out.exc
    assert len(took) == 1 and took[0] < 2.0, took  # did not wait for itself
    assert K in collect.indices and c.frames_in < len(frames) and len(collect.indices) == c.processed, c
    if call.endswith("discard"):
        assert c.processed <= K + 1 + 2 * n_workers  # only frames already inferred reach the sinks
    if workers == "inline":  # nothing is read ahead of the sink: the frame whose sink stopped it is the last
        assert c.frames_in == K + 1 and c.processed == K + 1, c
    assert out.elapsed < BOUND_S


@pytest.mark.parametrize("where", ["on_drop", "on_error"])
def test_close_from_a_callback_on_the_capture_or_worker_thread_returns_promptly(model, images, where) -> None:
    took: list[float] = []
    p: VisionPipeline
    frames: list[Any] = list(images)
    m: Any = model
    if where == "on_drop":
        frames[K] = None  # invalid: dropped on the capture thread
    else:
        m = HostileModel(model, predict=Once(RuntimeError("frame error")))

    def cb(*_: Any) -> None:
        t0 = time.monotonic()
        p.close()
        took.append(time.monotonic() - t0)

    reported: list[FrameDrop] = []
    kw = {where: cb}
    p = VisionPipeline(m, SyntheticSource(frames), PipelineOptions(join_timeout_s=JOIN_S), **kw)
    p.add_drop_listener(reported.append)
    out = run_in_thread(p)
    assert_clean(p, reported)
    assert out.exc is None and took and max(took) < 2.0, (out.exc, took)


def test_run_start_and_join_from_a_sink_raise_a_typed_error_and_the_run_goes_on(model, video) -> None:
    seen: dict[str, BaseException] = {}
    snapshots: list[Any] = []
    p: VisionPipeline

    def sink(fr: FrameResult) -> None:
        if fr.index == 1:
            for name in ("run", "start", "join"):
                try:
                    getattr(p, name)()
                except BaseException as e:  # noqa: BLE001
                    seen[name] = e
        snapshots.append(p.counters())
        _ = (p.processed_fps, p.state, p.error, repr(p), p.telemetry_samples())

    reported: list[FrameDrop] = []
    p = VisionPipeline(model, str(video), PipelineOptions(join_timeout_s=JOIN_S), sinks=[sink])
    p.add_drop_listener(reported.append)
    out = run_in_thread(p)
    c = assert_clean(p, reported)
    assert out.exc is None and c.processed == N and c.sink_errors == 0
    assert sorted(seen) == ["join", "run", "start"] and all(isinstance(e, PipelineStateError) for e in seen.values()), seen
    assert all(s.unaccounted == 0 and s.state == "running" for s in snapshots)
    with pytest.raises(PipelineStateError):
        p.run()  # a pipeline runs once, from any thread


def test_a_callback_sink_that_closes_itself_does_not_deadlock(model, video) -> None:
    box: dict[str, Sink] = {}

    def fn(fr: FrameResult) -> None:
        if fr.index == 2:
            box["s"].close()

    box["s"] = s = CallbackSink(fn)
    errors: list[BaseException] = []
    reported: list[FrameDrop] = []
    p = VisionPipeline(model, str(video), PipelineOptions(join_timeout_s=JOIN_S), sinks=[s], on_error=lambda e, f: errors.append(e))
    p.add_drop_listener(reported.append)
    out = run_in_thread(p)
    c = assert_clean(p, reported)
    assert out.exc is None and c.processed == N
    assert c.sink_errors == N - 3 and all(isinstance(e, PipelineStateError) for e in errors)  # writes after its close


def test_fatal_from_a_sink_while_the_pipeline_is_paused_or_blocked_ends_cleanly(model, images) -> None:
    """A slow single worker with a full "block" queue (the capture thread waiting for room) and
    a sink that raises SystemExit: the waiting frame and the queued ones are dropped as shutdown."""
    exc = SystemExit(2)
    reported: list[FrameDrop] = []

    class Slow(HostileModel):
        def predict_image(self, image, *, color="RGB", **kw):
            time.sleep(0.01)
            return self.model.predict_image(image, color=color, **kw)

    opts = PipelineOptions(queue_size=2, join_timeout_s=JOIN_S, preprocess="worker", drop_policy="block")
    p = VisionPipeline(Slow(model), SyntheticSource(list(images) * 4), opts, sinks=[HostileSink(Once(exc, at=3))])
    p.add_drop_listener(reported.append)
    out = run_in_thread(p)
    c = assert_clean(p, reported)
    assert out.exc is exc and c.frames_in < 4 * N and c.sink_errors == 1


def test_the_source_drop_hook_counts_any_reason_and_reports_it(model, images) -> None:
    """A source's ``_read`` returning ``Capture.dropped(reason, detail)`` (what a source does with
    an unreadable item) is a dropped frame with that reason: counted in frames_in and dropped,
    passed to on_drop, never a failure of the run."""
    reported: list[FrameDrop] = []
    collect = Collect()
    src = HostileSource(list(images), drops={0, 3, N - 1})
    p = VisionPipeline(model, src, PipelineOptions(workers=2, join_timeout_s=JOIN_S), sinks=[collect])
    p.add_drop_listener(reported.append)
    out = run_in_thread(p)
    c = assert_clean(p, reported)
    assert out.exc is None and c.frames_in == N and c.dropped["unreadable"] == 3 and c.processed == N - 3
    assert [d.index for d in reported] == [0, 3, N - 1] and all("cannot be read" in d.detail for d in reported)
    assert collect.indices == [i for i in range(N) if i not in (0, 3, N - 1)]
