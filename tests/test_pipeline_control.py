"""VisionPipeline control while running (what the budget governor acts through): set_max_fps,
pause / resume (live and non-live sources), swap_model (worker and capture preprocessing) and
wait_model_idle, on the real demo model and SyntheticSource frames, with exact frame accounting
(frames_in == processed + dropped + in_flight) and every wait bounded."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np
import pytest
from pipeline_helpers import Collect

import edge_sdk
from edge_sdk.pipelines import DROP_REASONS, FrameResult, PipelineOptions, SyntheticSource, VisionPipeline
from edge_sdk.pipelines.vision import PipelineCounters
from tools.fixtures.train_demo import LABELS, draw

JOIN_S = 15.0  # every wait on a pipeline is bounded by this


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("control-cache")


@pytest.fixture(scope="module")
def model(cache):
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", cache_dir=cache, variant="int8-onnx") as m:
        yield m


@pytest.fixture(scope="module")
def fp32(cache):
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", cache_dir=cache, variant="fp32-onnx") as m:
        yield m


@pytest.fixture(autouse=True)
def _no_leftover_threads():
    yield
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and _pipeline_threads():
        time.sleep(0.01)
    assert _pipeline_threads() == [], "pipeline threads outlived the test"


def _pipeline_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("edge-sdk-pipeline")]


def shapes(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    rng = np.random.default_rng(seed)
    imgs = [np.ascontiguousarray(draw(rng, i % 4, side=64)[:, :, ::-1]) for i in range(n)]
    return imgs, [LABELS[i % 4] for i in range(n)]


def assert_accounted(c: PipelineCounters, *, done: bool = False) -> None:
    assert c.unaccounted == 0, c
    assert c.frames_in == c.processed + c.dropped_total + c.in_flight, c
    assert min(c.preparing, c.waiting, c.queued, c.inferring, c.emitting) >= 0, c
    if done:
        assert c.in_flight == 0, c


def wait_until(p: VisionPipeline, cond: Callable[[PipelineCounters], bool], what: str, timeout: float = JOIN_S) -> PipelineCounters:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = p.counters()
        assert_accounted(c)
        if cond(c):
            return c
        time.sleep(0.002)
    raise AssertionError(f"not reached within {timeout} s: {what}; {p.counters()}")


def finish(p: VisionPipeline, timeout: float = JOIN_S) -> PipelineCounters:
    assert p.join(timeout), f"pipeline did not finish within {timeout} s: {p.counters()}"
    c = p.counters()
    assert_accounted(c, done=True)
    return c


def test_options_and_reasons() -> None:
    assert "paused" in DROP_REASONS and "rate_limit" in DROP_REASONS
    assert PipelineOptions().priority == "normal" and PipelineOptions(priority="low").priority == "low"
    with pytest.raises(ValueError, match="priority: expected one of"):
        PipelineOptions(priority="high")
    with pytest.raises(TypeError, match="predict_image"):
        VisionPipeline(object(), SyntheticSource([]))


def test_set_max_fps_is_validated_and_read_back(model) -> None:
    p = VisionPipeline(model, SyntheticSource([np.zeros((8, 8, 3), np.uint8)], live=True))
    assert p.max_fps is None and not p.throttle
    for bad in (0, -1, float("nan"), float("inf"), True, "10"):
        with pytest.raises(ValueError, match="max_fps"):
            p.set_max_fps(bad)  # type: ignore[arg-type]
    p.set_max_fps(12)
    assert p.max_fps == 12.0 and not p.throttle  # live: frames over the rate are dropped, not throttled
    f = VisionPipeline(model, SyntheticSource([np.zeros((8, 8, 3), np.uint8)]))
    f.set_max_fps(5)
    assert f.throttle  # a non-live source is throttled
    f.set_max_fps(None)
    assert not f.throttle and f.max_fps is None
    p.stop(), f.stop()


def test_set_max_fps_while_running_drops_live_frames_then_lifting_it_stops_the_drops(model) -> None:
    n = 160
    imgs, labels = shapes(n, seed=1)
    out, drops = Collect(), []
    p = VisionPipeline(model, SyntheticSource(imgs, fps=200, live=True), sinks=[out], on_drop=drops.append)
    p.start()
    c0 = wait_until(p, lambda c: c.frames_in >= 30, "30 frames unlimited")
    p.set_max_fps(20)
    t_set = time.monotonic_ns() / 1e6
    assert c0.dropped["rate_limit"] == 0
    wait_until(p, lambda c: c.frames_in >= 110, "80 frames at 20 fps")
    p.set_max_fps(None)
    t_lift = time.monotonic_ns() / 1e6
    c1 = p.counters()
    c = finish(p)
    assert c.frames_in == n
    limited = c1.dropped["rate_limit"]
    assert limited >= 40, c1  # 80+ frames at 200 fps offered, ~1 in 10 passes
    assert c.dropped["rate_limit"] - limited <= 1  # lifted: at most the frame being checked at the call
    assert {d.reason for d in drops} <= {"rate_limit", "evicted"}
    assert sum(d.reason == "rate_limit" for d in drops) == c.dropped["rate_limit"]
    during = [r.timestamp_ms for r in out.results if t_set + 1 < r.timestamp_ms < t_lift - 1]
    assert len(during) >= 2
    assert np.diff(during).min() >= 1000 / 20 * 0.8 - 1e-6  # 20 fps (20 % camera-jitter tolerance)
    assert all(r.result.top1.label == labels[r.index] for r in out.results)


def test_set_max_fps_throttles_a_file_and_a_long_wait_is_cut_short(model) -> None:
    imgs, _ = shapes(30, seed=2)
    reads: list[float] = []

    def frames(i: int) -> np.ndarray | None:
        reads.append(time.monotonic())
        return imgs[i] if i < len(imgs) else None

    # 0.1 fps: without re-reading the rate each frame this run would take ~5 min, and without
    # cutting the wait in progress short it would take 10 s more
    p = VisionPipeline(model, SyntheticSource(frames), PipelineOptions(max_fps=0.1))
    assert p.throttle
    p.start()
    wait_until(p, lambda c: c.frames_in >= 1, "first frame")
    time.sleep(0.05)
    assert p.counters().frames_in == 1  # held back by the throttle
    p.set_max_fps(25)  # the 10 s wait in progress is cut short and re-timed
    t0 = time.monotonic()
    c = finish(p, 8)
    elapsed = time.monotonic() - t0
    assert (c.frames_in, c.processed, c.dropped_total) == (30, 30, 0)  # throttled: nothing dropped
    assert 29 / 25 * 0.9 <= elapsed < 6, elapsed
    gaps = np.diff(reads[1:30])
    assert gaps.mean() >= 1 / 25 * 0.9


def test_pause_on_a_live_source_drops_paused_frames_and_resume_serves_again(model) -> None:
    n = 150
    imgs, labels = shapes(n, seed=3)
    out, drops = Collect(), []
    p = VisionPipeline(model, SyntheticSource(imgs, fps=250, live=True), sinks=[out], on_drop=drops.append)
    assert not p.paused
    p.start()
    wait_until(p, lambda c: c.frames_in >= 30, "30 frames")
    p.pause()
    assert p.paused
    at_pause = p.counters()
    c1 = wait_until(p, lambda c: c.dropped["paused"] >= 40, "40 paused drops")
    # nothing new was admitted: at most what was in flight and the frame being read at the call
    assert c1.processed <= at_pause.processed + at_pause.in_flight + 1, (at_pause, c1)
    processed_paused = c1.processed
    p.resume()
    assert not p.paused
    c = finish(p)
    assert c.frames_in == n and c.dropped["paused"] >= 40
    assert c.processed > processed_paused  # frames after resume were served
    assert out.indices[-1] == n - 1
    paused_idx = [d.index for d in drops if d.reason == "paused"]
    assert len(paused_idx) == c.dropped["paused"] and paused_idx == sorted(paused_idx)
    assert not set(paused_idx) & set(out.indices)
    assert all(r.result.top1.label == labels[r.index] for r in out.results)


def test_pause_on_a_non_live_source_stops_reading_and_drops_nothing(model) -> None:
    imgs, labels = shapes(30, seed=4)
    calls: list[int] = []
    box: dict[str, VisionPipeline] = {}

    def frames(i: int) -> np.ndarray | None:
        calls.append(i)
        if i == 10:
            box["p"].pause()  # paused while frame 10 is being read: 10 is admitted, 11 is not read
        return imgs[i] if i < len(imgs) else None

    out = Collect()
    p = box["p"] = VisionPipeline(model, SyntheticSource(frames), PipelineOptions(queue_size=2), sinks=[out])
    p.start()
    wait_until(p, lambda c: c.processed == 11, "the 11 frames read before the pause")
    time.sleep(0.2)
    c = p.counters()
    assert (c.frames_in, c.processed, c.dropped_total, c.in_flight) == (11, 11, 0, 0), c
    assert calls == list(range(11))  # the source is not read while paused
    p.resume()
    c = finish(p)
    assert (c.frames_in, c.processed, c.dropped_total) == (30, 30, 0)
    assert out.indices == list(range(30)) and [r.result.top1.label for r in out.results] == labels


def test_a_pipeline_paused_before_start_reads_nothing_until_resumed(model) -> None:
    imgs, _ = shapes(5, seed=5)
    p = VisionPipeline(model, SyntheticSource(imgs))
    p.pause()
    p.start()
    time.sleep(0.1)
    assert p.counters().frames_in == 0
    p.resume()
    c = finish(p)
    assert (c.frames_in, c.processed) == (5, 5)


@pytest.mark.parametrize("live", [True, False])
def test_stop_while_paused_ends_promptly(model, live) -> None:
    imgs, _ = shapes(400, seed=6)
    p = VisionPipeline(model, SyntheticSource(imgs, fps=50 if live else None, live=live), PipelineOptions(queue_size=2))
    p.start()
    wait_until(p, lambda c: c.frames_in >= 3, "3 frames")
    p.pause()
    time.sleep(0.1)
    t0 = time.monotonic()
    p.stop()
    c = finish(p, 2.0)
    assert time.monotonic() - t0 < 2.0
    assert c.frames_in < 400 and p.state.value == "stopped"
    if not live:
        assert c.dropped_total == 0


class GatedSink:
    """Blocks on its first frame until released, so frames pile up behind it (bounded wait)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.out = Collect()

    def __call__(self, fr: FrameResult) -> None:
        assert self.release.wait(JOIN_S)
        self.out(fr)


class PredictImageOnly:
    """The real model behind predict_image only (no prepare_image / predict_prepared)."""

    def __init__(self, m: Any) -> None:
        self.m = m

    def predict_image(self, image: np.ndarray, *, color: str = "RGB"):
        return self.m.predict_image(image, color=color)


@pytest.mark.parametrize("preprocess", ["capture", "worker"])
def test_swap_model_applies_to_frames_taken_after_the_call(model, fp32, preprocess) -> None:
    imgs, labels = shapes(20, seed=7)
    gate = GatedSink()
    p = VisionPipeline(model, SyntheticSource(imgs), PipelineOptions(queue_size=4, preprocess=preprocess), sinks=[gate])
    assert p.preprocess == preprocess and p.model is model
    p.start()
    # frame 0 in the sink, frame 1 inferred and waiting for it, 2-5 queued, 6 waiting for room
    c = wait_until(p, lambda c: c.emitting == 2 and c.queued == 4 and c.waiting == 1, "frames piled up behind the sink")
    assert c.frames_in == 7
    assert p.swap_model(fp32) is model and p.model is fp32
    gate.release.set()
    c = finish(p)
    assert (c.frames_in, c.processed, c.dropped_total) == (20, 20, 0), c  # no frame ran a tensor made for the other model
    variants = [r.result.variant_id for r in gate.out.results]
    assert variants == ["int8-onnx"] * 2 + ["fp32-onnx"] * 18
    assert [r.result.top1.label for r in gate.out.results] == labels
    # capture path: the 5 frames prepared for the old model (4 queued, 1 waiting) were prepared again
    assert c.reprepared == (5 if preprocess == "capture" else 0)
    assert not model.closed and not fp32.closed  # the pipeline closes neither model


def test_swap_to_a_model_without_the_split_api_on_the_capture_path(model, fp32) -> None:
    imgs, labels = shapes(12, seed=8)
    gate = GatedSink()
    p = VisionPipeline(model, SyntheticSource(imgs), PipelineOptions(queue_size=3, preprocess="capture"), sinks=[gate])
    p.start()
    wait_until(p, lambda c: c.emitting == 2 and c.queued == 3, "frames piled up")
    with pytest.raises(TypeError, match="predict_image"):
        p.swap_model(object())
    p.swap_model(PredictImageOnly(fp32))
    gate.release.set()
    c = finish(p)
    assert (c.processed, c.dropped_total) == (12, 0) and c.reprepared >= 3
    assert [r.result.variant_id for r in gate.out.results][2:] == ["fp32-onnx"] * 10
    assert [r.result.top1.label for r in gate.out.results] == labels


def test_wait_model_idle_waits_for_the_frame_inferring_on_it(model, fp32) -> None:
    entered, release = threading.Event(), threading.Event()

    class Held:  # the real model, held inside inference until released
        def predict_image(self, image, *, color="RGB"):
            entered.set()
            assert release.wait(JOIN_S)
            return model.predict_image(image, color=color)

    held = Held()
    imgs, _ = shapes(3, seed=9)
    out = Collect()
    p = VisionPipeline(held, SyntheticSource(imgs), sinks=[out])
    p.start()
    assert entered.wait(JOIN_S)
    p.swap_model(fp32)
    assert p.wait_model_idle(fp32, 0.01)  # nothing runs on the new model yet
    assert not p.wait_model_idle(held, 0.05)  # frame 0 is still inferring on the old one
    threading.Timer(0.05, release.set).start()
    assert p.wait_model_idle(held, JOIN_S)
    c = finish(p)
    assert [r.result.variant_id for r in out.results] == ["int8-onnx", "fp32-onnx", "fp32-onnx"]
    assert c.processed == 3
