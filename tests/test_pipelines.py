"""Pipelines: sources picked by URI, the threaded VisionPipeline (drop policies, rate limits,
stop, errors, hostile frames, frame accounting) and sinks — on the real demo model, real MJPG
videos and image files written here. Hardware (cv2.VideoCapture targets that need a camera,
GStreamer, Picamera2, a network stream, the reconnect wait) is replaced at its seam only."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest
from pipeline_helpers import Collect

import edge_sdk
from edge_sdk.errors import EdgeSDKError, MissingDependencyError
from edge_sdk.pipelines import (
    DROP_POLICIES,
    AnnotatedVideoSink,
    Backoff,
    CallbackSink,
    Frame,
    GStreamerSource,
    ImageFolderSource,
    InvalidFrameError,
    JsonLinesSink,
    NetworkSource,
    OpenCVSource,
    Picamera2Source,
    PipelineOptions,
    PipelineStateError,
    SourceClosedError,
    SourceError,
    SourceOptions,
    SyntheticSource,
    UnknownSourceError,
    VisionPipeline,
    csi_pipeline,
    source_from_uri,
)
from tools.fixtures.train_demo import LABELS, draw

JOIN_S = 15.0  # every wait on a pipeline is bounded by this


# ----------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", cache_dir=tmp_path_factory.mktemp("pipe-cache")) as m:
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


def shapes(n: int, seed: int = 0, side: int = 64) -> tuple[list[np.ndarray], list[str]]:
    """n BGR images of drawn shapes and their labels (label i % 4)."""
    rng = np.random.default_rng(seed)
    imgs, labels = [], []
    for i in range(n):
        rgb = draw(rng, i % 4, side=side)
        imgs.append(np.ascontiguousarray(rgb[:, :, ::-1]))
        labels.append(LABELS[i % 4])
    return imgs, labels


def write_video(path: Path, frames: list[np.ndarray], fps: float = 30) -> Path:
    h, w = frames[0].shape[:2]
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (w, h))
    assert vw.isOpened()
    for f in frames:
        vw.write(f)
    vw.release()
    return path


def run_bounded(p: VisionPipeline, timeout: float = JOIN_S):
    p.start()
    assert p.join(timeout), f"pipeline did not finish within {timeout} s: {p.counters()}"
    return p.counters()


def assert_accounted(c, *, done: bool = False) -> None:
    assert c.unaccounted == 0, c
    assert c.frames_in == c.processed + c.dropped_total + c.in_flight, c
    assert min(c.preparing, c.waiting, c.queued, c.inferring, c.emitting) >= 0, c
    if done:
        assert c.in_flight == 0, c


class SlowModel:
    """The real model behind the same predict_image signature, with a sleep (inference slower than
    the source)."""

    def __init__(self, model: Any, delay_s: float) -> None:
        self.model, self.delay_s = model, delay_s

    def predict_image(self, image: np.ndarray, *, color: str = "RGB"):
        time.sleep(self.delay_s)
        return self.model.predict_image(image, color=color)


class Snapshotter:
    """Takes counters snapshots as fast as it can on its own thread while a pipeline runs."""

    def __init__(self, p: VisionPipeline) -> None:
        self.p, self.snaps, self._stop = p, [], threading.Event()
        self._t = threading.Thread(target=self._loop, name="test-snapshotter", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.snaps.append(self.p.counters())
            time.sleep(0.0005)

    def __enter__(self) -> "Snapshotter":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)


# ----------------------------------------------------------------------------------------------
# VisionPipeline on real files


@pytest.mark.parametrize("workers", [1, 3])
def test_block_policy_on_a_video_file_processes_every_frame_in_order(model, tmp_path, workers) -> None:
    imgs, labels = shapes(24)
    path = write_video(tmp_path / "shapes.avi", imgs)
    out = Collect()
    p = VisionPipeline(model, str(path), PipelineOptions(workers=workers, queue_size=3), sinks=[out])
    assert p.drop_policy == "block" and not p.source.live  # files back-pressure by default
    c = run_bounded(p)
    assert_accounted(c, done=True)
    assert (c.frames_in, c.processed, c.dropped_total) == (24, 24, 0)
    assert c.max_queue_depth <= 3
    assert out.indices == list(range(24))  # in order, also with 3 workers
    assert [r.result.top1.label for r in out.results] == labels
    ts = [r.timestamp_ms for r in out.results]
    assert all(b > a for a, b in zip(ts, ts[1:]))
    src_ts = [r.source_timestamp_ms for r in out.results]
    assert all(b > a for a, b in zip(src_ts, src_ts[1:]))  # video positions
    assert all(r.latency_ms >= 0 and r.frame.color == "BGR" for r in out.results)
    assert p.state.value == "stopped" and p.source.state.value == "closed"


@pytest.mark.parametrize("workers", [1, 2])
def test_preprocessing_on_the_capture_thread_gives_the_worker_path_results(model, tmp_path, workers) -> None:
    imgs, labels = shapes(20, seed=4)
    path = write_video(tmp_path / "prep.avi", imgs)
    runs = {}
    for mode in ("capture", "worker", "inline") if workers == 1 else ("capture", "worker"):
        out = Collect()
        p = VisionPipeline(model, str(path), PipelineOptions(preprocess=mode, workers=workers, queue_size=2), sinks=[out])
        assert p.preprocess == mode
        c = run_bounded(p)
        assert_accounted(c, done=True)
        assert (c.frames_in, c.processed, c.dropped_total) == (20, 20, 0)
        assert out.indices == list(range(20))
        runs[mode] = out.results
    for mode in runs.keys() - {"worker"}:
        for a, b in zip(runs[mode], runs["worker"]):
            np.testing.assert_array_equal(a.result.outputs["logits"], b.result.outputs["logits"])
            assert a.result.timings.preprocess_ms > 0 and a.result.timings.total_ms >= a.result.timings.inference_ms
    assert [r.result.top1.label for r in runs["capture"]] == labels


def test_preprocess_auto_gives_capture_a_core_of_its_own_and_needs_the_split_api(model, monkeypatch) -> None:
    import edge_sdk.pipelines.vision as vision

    src = lambda: SyntheticSource([np.zeros((8, 8, 3), np.uint8)])  # noqa: E731
    threads = model.session.info.threads
    monkeypatch.setattr(vision.os, "sched_getaffinity", lambda pid: set(range(threads + 1)), raising=False)
    assert VisionPipeline(model, src()).preprocess == "capture"  # a core left for the capture thread
    assert VisionPipeline(model, src(), PipelineOptions(workers=2)).preprocess == "worker"  # 2 x threads > threads + 1 CPUs
    monkeypatch.setattr(vision.os, "sched_getaffinity", lambda pid: set(range(threads)), raising=False)
    keep = PipelineOptions(model_threads="keep")  # "auto" would run a copy with a thread fewer (the next test)
    assert VisionPipeline(model, src(), keep).preprocess == "worker"  # inference threads fill the CPUs
    assert VisionPipeline(model, src(), PipelineOptions(preprocess="capture")).preprocess == "capture"
    assert VisionPipeline(SlowModel(model, 0), src(), PipelineOptions(preprocess="capture")).preprocess == "worker"  # no split API
    with pytest.raises(ValueError, match="preprocess: expected one of"):
        PipelineOptions(preprocess="gpu")


def test_model_threads_auto_leaves_the_capture_thread_a_core(tmp_path, monkeypatch) -> None:
    """A model whose session would take all N CPUs: a pipeline running flat out (a file, one worker,
    preprocess "auto") runs ``model.for_threads(N - 1)`` with preprocessing on the capture thread.
    The copy is a real session with N - 1 threads, shared by every such pipeline, gives the model's
    results, and closes with the model; "keep", a live source, two workers, an explicit preprocess,
    a model with threads to spare or one CPU run the model as given."""
    import edge_sdk.pipelines.vision as vision

    imgs, labels = shapes(6, seed=3)
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", threads=2, cache_dir=tmp_path / "cache") as m:
        monkeypatch.setattr(vision.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # 2 CPUs, both the model's
        out = Collect()
        p = VisionPipeline(m, SyntheticSource(imgs), sinks=[out])
        light = p.model
        assert light is not m and light is m.for_threads(1) and light.session.info.threads == 1
        assert (light.variant.id, light.package) == (m.variant.id, m.package)
        assert p.preprocess == "capture"  # the CPU the model gave up goes to the capture thread
        c = run_bounded(p)
        assert_accounted(c, done=True)
        assert c.processed == 6 and [r.result.top1.label for r in out.results] == labels
        for fr, img in zip(out.results, imgs):
            np.testing.assert_allclose(fr.result.outputs["logits"], m.predict_image(img, color="BGR").outputs["logits"], rtol=1e-5, atol=1e-6)
        assert VisionPipeline(m, SyntheticSource(imgs)).model is light  # one copy for every pipeline
        assert m.for_threads(2) is m
        for opts, live in (
            (PipelineOptions(model_threads="keep"), False),
            (PipelineOptions(workers=2), False),
            (PipelineOptions(preprocess="worker"), False),
            (PipelineOptions(), True),
        ):
            assert VisionPipeline(m, SyntheticSource(imgs, fps=30, live=live), opts).model is m
        monkeypatch.setattr(vision.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)  # a CPU to spare
        assert VisionPipeline(m, SyntheticSource(imgs)).model is m
        monkeypatch.setattr(vision.os, "sched_getaffinity", lambda pid: {0}, raising=False)
        assert VisionPipeline(m, SyntheticSource(imgs)).model is m
        with pytest.raises(ValueError, match="threads: expected an int >= 1, got 0"):
            m.for_threads(0)
    assert light.closed  # closed with the model that made it
    with pytest.raises(ValueError, match="model_threads: expected one of"):
        PipelineOptions(model_threads="2")


def test_preprocess_auto_runs_inline_on_one_cpu_for_a_file_and_keeps_threads_for_a_live_source(model, monkeypatch) -> None:
    import edge_sdk.pipelines.vision as vision

    frames = [np.zeros((8, 8, 3), np.uint8)]
    monkeypatch.setattr(vision.os, "sched_getaffinity", lambda pid: {0}, raising=False)  # what taskset -c 0 gives
    assert VisionPipeline(model, SyntheticSource(frames)).preprocess == "inline"
    assert VisionPipeline(SlowModel(model, 0), SyntheticSource(frames)).preprocess == "inline"  # needs no split API
    assert VisionPipeline(model, SyntheticSource(frames, fps=30, live=True)).preprocess == "worker"  # drops stay visible
    assert VisionPipeline(model, SyntheticSource(frames), PipelineOptions(workers=2)).preprocess == "worker"
    assert VisionPipeline(model, SyntheticSource(frames), PipelineOptions(preprocess="capture")).preprocess == "capture"
    monkeypatch.setattr(vision.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert VisionPipeline(model, SyntheticSource(frames)).preprocess != "inline"
    live = VisionPipeline(model, SyntheticSource(frames, fps=30, live=True), PipelineOptions(preprocess="inline"))
    assert live.preprocess == "inline"  # asked for: any source, any CPU count
    with pytest.raises(ValueError, match="inline.*workers=1"):
        PipelineOptions(preprocess="inline", workers=2)


def test_an_inline_pipeline_runs_the_model_and_the_sinks_on_the_thread_that_reads(model) -> None:
    imgs, labels = shapes(12, seed=9)
    names: set[str] = set()
    out = Collect()

    def sink(fr: Any) -> None:
        names.add(threading.current_thread().name)
        out(fr)

    p = VisionPipeline(model, SyntheticSource(imgs), PipelineOptions(preprocess="inline"), sinks=[sink])
    c = run_bounded(p)
    assert_accounted(c, done=True)
    assert (c.frames_in, c.processed, c.dropped_total, c.max_queue_depth) == (12, 12, 0, 0)
    assert out.indices == list(range(12)) and [r.result.top1.label for r in out.results] == labels
    assert names == {"edge-sdk-pipeline-inline"} and len(p._threads) == 1


def test_a_frame_that_fails_preprocessing_on_the_capture_thread_is_an_error_drop(model) -> None:
    imgs = [np.full((32, 32, 3), i, np.uint8) for i in range(10)]
    imgs[4] = np.zeros((32, 32, 1), np.uint8)  # grey: a valid frame, refused by color='BGR' preprocessing
    seen: list[int] = []

    class Counting:  # the real model's split API, watching the preparing counter
        def __init__(self) -> None:
            self.p: VisionPipeline | None = None
            self.session = model.session

        def prepare_image(self, image, *, color="RGB"):
            c = self.p.counters()
            assert c.preparing == 1 and c.unaccounted == 0, c
            seen.append(c.frames_in)
            if image.shape[2] == 1:
                raise edge_sdk.errors.ImageError("expected 3 channels for this test")
            return model.prepare_image(image, color=color)

        def predict_prepared(self, prepared, **kw):
            return model.predict_prepared(prepared, **kw)

        def predict_image(self, image, **kw):  # pragma: no cover - not used with preprocess="capture"
            raise AssertionError("the capture path must not call predict_image")

    errors, drops, out = [], [], Collect()
    m = Counting()
    p = VisionPipeline(m, SyntheticSource(imgs), PipelineOptions(preprocess="capture"), sinks=[out], on_error=lambda e, f: errors.append(f.index), on_drop=drops.append)
    m.p = p
    c = run_bounded(p)
    assert_accounted(c, done=True)
    assert seen == list(range(1, 11))  # counted in frames_in while being prepared
    assert c.dropped["error"] == 1 and c.processed == 9 and errors == [4]
    assert [(d.index, d.reason) for d in drops] == [(4, "error")] and "ImageError" in drops[0].detail
    assert out.indices == [i for i in range(10) if i != 4]


def test_several_workers_finish_out_of_order_but_sinks_see_frame_order_on_one_thread(model) -> None:
    imgs, labels = shapes(18, seed=9)
    finished: list[int] = []

    class Uneven:  # every third frame is slow, so later frames finish first
        def predict_image(self, image, *, color="RGB"):
            i = next(k for k, im in enumerate(imgs) if im is image.base or np.shares_memory(im, image))
            time.sleep(0.03 if i % 3 == 0 else 0.001)
            finished.append(i)
            return model.predict_image(image, color=color)

    out, sink_threads = Collect(), set()
    sinks = [out, lambda fr: sink_threads.add(threading.get_ident())]
    c = run_bounded(VisionPipeline(Uneven(), SyntheticSource(imgs), PipelineOptions(workers=3, queue_size=6), sinks=sinks))
    assert_accounted(c, done=True)
    assert finished != sorted(finished)  # inference really completed out of order ...
    assert out.indices == list(range(18))  # ... and the sinks still got frame order
    assert [r.result.top1.label for r in out.results] == labels
    assert len(sink_threads) == 1 and threading.get_ident() not in sink_threads


def test_run_blocks_until_the_end_and_returns_counters(model, tmp_path) -> None:
    imgs, labels = shapes(8, seed=3)
    out = Collect()
    box: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: box.setdefault("c", VisionPipeline(model, write_video(tmp_path / "v.avi", imgs), sinks=[out]).run())
    )
    t.start()
    t.join(JOIN_S)
    assert not t.is_alive()
    assert box["c"].processed == 8 and [r.result.top1.label for r in out.results] == labels


def test_image_folder_with_a_truncated_jpeg_drops_it_as_decode_error(model, tmp_path) -> None:
    imgs, labels = shapes(6, seed=1)
    folder = tmp_path / "shots"
    folder.mkdir()
    for i, img in enumerate(imgs):
        ext = ".jpg" if i % 2 else ".png"
        assert cv2.imwrite(str(folder / f"{i:03d}{ext}"), img, [cv2.IMWRITE_JPEG_QUALITY, 95] if ext == ".jpg" else [])
    data = (folder / "003.jpg").read_bytes()
    (folder / "003.jpg").write_bytes(data[: len(data) // 2])  # truncated mid-scan
    (folder / "notes.txt").write_text("not an image")  # ignored: not an image extension
    out, drops = Collect(), []
    p = VisionPipeline(model, f"file://{folder}/", sinks=[out], on_drop=drops.append)
    assert isinstance(p.source, ImageFolderSource)
    c = run_bounded(p)
    assert_accounted(c, done=True)
    assert c.frames_in == 6 and c.processed == 5 and c.dropped["decode_error"] == 1
    assert [d.index for d in drops] == [3] and "003.jpg" in drops[0].detail and drops[0].reason == "decode_error"
    assert out.indices == [0, 1, 2, 4, 5]
    assert [r.result.top1.label for r in out.results] == [labels[i] for i in out.indices]


def test_truncated_jpeg_header_only_and_garbage_are_decode_errors(tmp_path) -> None:
    ok, buf = cv2.imencode(".jpg", shapes(1)[0][0])
    (tmp_path / "a.jpg").write_bytes(buf.tobytes()[:40])  # header only
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)  # broken PNG
    (tmp_path / "c.jpg").write_bytes(b"")  # empty file
    with ImageFolderSource(tmp_path) as src:
        items = list(src)
    assert [(i.index, i.reason) for i in items] == [(0, "decode_error"), (1, "decode_error"), (2, "decode_error")]
    assert "truncated" in items[0].detail and "b.png" in items[1].detail and "empty" in items[2].detail


# ----------------------------------------------------------------------------------------------
# overload, drop policies and the accounting invariant


EXPECTED_DROPS = {
    "block": set(),  # never drops: the source waits
    "latest": {"evicted"},
    "drop_oldest": {"evicted"},
    "drop_newest": {"queue_full"},
}


@pytest.mark.parametrize("policy", DROP_POLICIES)
def test_overload_drops_by_policy_with_bounded_queue_and_exact_accounting(model, policy) -> None:
    imgs, labels = shapes(60, seed=2)
    src = SyntheticSource(imgs, fps=250, live=True)  # a frame every 4 ms ...
    out = Collect()
    p = VisionPipeline(
        SlowModel(model, 0.012), src, PipelineOptions(drop_policy=policy, queue_size=4), sinks=[out]
    )  # ... inferred in 12+ ms
    with Snapshotter(p) as snap:
        c = run_bounded(p)
    assert len(snap.snaps) > 50
    for s in snap.snaps:  # every snapshot, taken concurrently, balances
        assert_accounted(s)
        assert s.queued <= 4 and s.inferring <= 1
    assert_accounted(c, done=True)
    assert c.frames_in == 60 and c.max_queue_depth <= (1 if policy == "latest" else 4)
    drops = {k for k, v in c.dropped.items() if v}
    assert drops == EXPECTED_DROPS[policy], c
    if policy == "block":
        assert c.processed == 60 and max(s.waiting for s in snap.snaps) == 1  # the source was held back
    else:
        assert c.processed < 45
    assert out.indices == sorted(out.indices) and len(out.indices) == c.processed
    assert all(r.result.top1.label == labels[r.index] for r in out.results)


def test_latest_policy_is_the_default_for_live_sources_and_serves_fresh_frames(model) -> None:
    imgs, _ = shapes(40, seed=4)
    out = Collect()
    p = VisionPipeline(SlowModel(model, 0.015), SyntheticSource(imgs, fps=300, live=True), sinks=[out])
    assert p.drop_policy == "latest"
    c = run_bounded(p)
    assert_accounted(c, done=True)
    assert c.dropped["evicted"] > 0 and c.max_queue_depth <= 1
    assert out.indices[-1] == 39  # the newest frame is never the one dropped


def test_slow_sinks_back_pressure_into_the_drop_policy(model) -> None:
    imgs, _ = shapes(30, seed=5)
    slow_sink = lambda fr: time.sleep(0.01)  # noqa: E731
    p = VisionPipeline(
        model,
        SyntheticSource(imgs, fps=400, live=True),
        PipelineOptions(drop_policy="drop_newest", queue_size=2, workers=2),
        sinks=[slow_sink],
    )
    with Snapshotter(p) as snap:
        c = run_bounded(p)
    assert all(s.emitting <= 4 and s.unaccounted == 0 for s in snap.snaps)  # at most 2 * workers wait for sinks
    assert_accounted(c, done=True)
    assert c.dropped["queue_full"] > 0


# ----------------------------------------------------------------------------------------------
# max_fps


def test_max_fps_drops_frames_of_a_live_source_with_rate_limit(model) -> None:
    imgs, _ = shapes(50, seed=6)
    out = Collect()
    p = VisionPipeline(model, SyntheticSource(imgs, fps=100, live=True), PipelineOptions(max_fps=20), sinks=[CallbackSink(out)])
    assert not p.throttle  # a live source is not slowed down: frames over the rate are dropped
    t0 = time.monotonic()
    c = run_bounded(p)
    elapsed = time.monotonic() - t0
    assert_accounted(c, done=True)
    assert c.dropped["rate_limit"] > 0 and c.dropped["rate_limit"] + c.processed == 50
    assert 5 <= c.processed <= elapsed * 20 + 2, (c, elapsed)
    gaps = np.diff([r.timestamp_ms for r in out.results])
    assert gaps.mean() >= 1000 / 20 * 0.8


def test_max_fps_throttles_a_file_instead_of_dropping(model, tmp_path) -> None:
    imgs, _ = shapes(12, seed=7)
    p = VisionPipeline(model, write_video(tmp_path / "t.avi", imgs), PipelineOptions(max_fps=40))
    assert p.throttle
    t0 = time.monotonic()
    c = run_bounded(p)
    assert time.monotonic() - t0 >= 11 / 40 * 0.95
    assert_accounted(c, done=True)
    assert c.processed == 12 and c.dropped_total == 0


# ----------------------------------------------------------------------------------------------
# stop, errors, hostile frames, timestamps


@pytest.mark.parametrize("mode", ["discard", "drain"])
def test_stop_mid_stream_accounts_everything_and_joins_threads(model, mode) -> None:
    img = shapes(1)[0][0]
    src = SyntheticSource(lambda i: img, live=True)  # endless
    p = VisionPipeline(SlowModel(model, 0.01), src, PipelineOptions(drop_policy="block", queue_size=4))
    p.start()
    assert _pipeline_threads()
    deadline = time.monotonic() + JOIN_S
    while not (p.counters().processed >= 5 and p.counters().waiting == 1) and time.monotonic() < deadline:
        time.sleep(0.005)  # the source outruns inference: a full queue and a frame waiting for room
    assert time.monotonic() < deadline
    p.stop(mode)
    p.stop(mode)  # idempotent
    assert p.join(JOIN_S)
    c = p.counters()
    assert_accounted(c, done=True)
    assert c.state == "stopped" and src.state.value == "closed"
    if mode == "discard":
        assert c.dropped["shutdown"] >= 3  # the queued frames and the one waiting for room
    else:
        assert c.dropped_total == 0 and c.processed == c.frames_in
    assert _pipeline_threads() == []
    with pytest.raises(PipelineStateError, match="runs once"):
        p.start()


def test_context_manager_stops_and_joins_on_exit(model) -> None:
    img = shapes(1)[0][0]
    with VisionPipeline(model, SyntheticSource(lambda i: img, fps=200, live=True), PipelineOptions(stop_mode="discard")) as p:
        p.start()
        time.sleep(0.1)
    assert _pipeline_threads() == []
    assert_accounted(p.counters(), done=True)
    p.close()  # idempotent


def test_an_error_for_frame_k_is_counted_reported_and_the_rest_processed(model) -> None:
    imgs = [np.full((32, 32, 3), i, np.uint8) for i in range(12)]

    class FailOn7:
        def predict_image(self, image, *, color="RGB"):
            if image[0, 0, 0] == 7:
                raise RuntimeError("sensor glitch on frame 7")
            return model.predict_image(image, color=color)

    errors, drops, out = [], [], Collect()
    p = VisionPipeline(FailOn7(), SyntheticSource(imgs), sinks=[out], on_error=lambda e, f: errors.append((e, f)), on_drop=drops.append)
    c = run_bounded(p)
    assert_accounted(c, done=True)
    assert c.dropped["error"] == 1 and c.processed == 11
    assert len(errors) == 1 and errors[0][1].index == 7 and "glitch" in str(errors[0][0])
    assert [(d.index, d.reason) for d in drops] == [(7, "error")] and "RuntimeError: sensor glitch" in drops[0].detail
    assert out.indices == [i for i in range(12) if i != 7]


def test_a_raising_sink_is_reported_and_does_not_stop_the_pipeline(model) -> None:
    imgs, _ = shapes(5)

    def bad_sink(fr):
        if fr.index == 2:
            raise OSError("disk full")

    errors, out = [], Collect()
    c = run_bounded(
        VisionPipeline(model, SyntheticSource(imgs), sinks=[bad_sink, out], on_error=lambda e, f: errors.append((str(e), f.index)))
    )
    assert_accounted(c, done=True)
    assert c.processed == 5 and c.sink_errors == 1 and errors == [("disk full", 2)] and out.indices == list(range(5))


# (frame, processed?, drop message fragment) — one hostile input per row
HOSTILE = [
    (shapes(1)[0][0], True, None),  # a normal 64x64 frame
    (np.zeros((0, 0, 3), np.uint8), False, "empty side"),
    (np.zeros((0, 5, 3), np.uint8), False, "empty side"),
    (np.full((1, 1, 3), 200, np.uint8), True, None),  # 1x1 is valid: stretched to 32x32
    (np.zeros((4000, 4000, 3), np.uint8), True, None),  # huge: resized
    (np.zeros((48, 48, 4), np.uint8), False, "BGRA"),  # 4 channels
    (np.zeros((48, 48, 2), np.uint8), False, "HxWx3"),  # 2 channels
    (np.zeros((48, 48, 3), np.float32), False, "dtype uint8, got float32"),
    (np.zeros((48, 48, 3), np.float64) + np.nan, False, "got float64"),
    (np.zeros((8, 8, 3, 1), np.uint8), False, "HxWx3"),  # rank 4
    (np.zeros((30, 90), np.uint8), True, None),  # grey HxW: processed as GRAY
    (shapes(1, side=120)[0][0], True, None),  # the size changes mid-stream
    ([[1, 2, 3]], False, "got list"),
    (None, False, "got NoneType"),
]


def test_hostile_frames_are_processed_or_dropped_never_crash_or_hang(model) -> None:
    frames = [row[0] for row in HOSTILE]
    drops, out = [], Collect()
    p = VisionPipeline(model, SyntheticSource(frames), sinks=[out], on_drop=drops.append)
    c = run_bounded(p, timeout=20)
    assert_accounted(c, done=True)
    assert c.frames_in == len(HOSTILE)
    assert out.indices == [i for i, row in enumerate(HOSTILE) if row[1]]
    by_index = {d.index: d for d in drops}
    for i, (_, ok, msg) in enumerate(HOSTILE):
        if not ok:
            assert by_index[i].reason == "invalid_frame" and msg in by_index[i].detail, (i, by_index[i])
    assert c.dropped["invalid_frame"] == sum(not row[1] for row in HOSTILE) and c.dropped["error"] == 0
    assert out.results[out.indices.index(10)].frame.color == "GRAY"


def test_timestamps_stay_strictly_increasing_when_the_source_goes_backwards(model) -> None:
    imgs, _ = shapes(6)
    src_ts = [100.0, 50.0, 50.0, 10.0, 200.0, 0.0]
    out = Collect()
    run_bounded(VisionPipeline(model, SyntheticSource(imgs, timestamps_ms=src_ts), sinks=[out]))
    ts = [r.timestamp_ms for r in out.results]
    assert all(b > a for a, b in zip(ts, ts[1:]))
    assert [r.source_timestamp_ms for r in out.results] == src_ts  # kept as the source gave them


def test_frame_source_timestamps_are_strictly_increasing_on_a_tight_loop() -> None:
    img = np.zeros((2, 2, 3), np.uint8)
    with SyntheticSource([img] * 2000) as src:
        ts = [f.timestamp_ms for f in src]
    assert all(b > a for a, b in zip(ts, ts[1:]))


def test_a_failing_source_ends_the_run_with_its_error_after_the_frames_it_gave(model) -> None:
    imgs, _ = shapes(3)

    def gen():
        yield from imgs
        raise OSError("USB camera unplugged")

    out = Collect()
    p = VisionPipeline(model, SyntheticSource(gen()), sinks=[out])
    box: dict[str, Any] = {}

    def target():
        try:
            p.run()
        except BaseException as e:
            box["e"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(JOIN_S)
    assert isinstance(box["e"], SourceError) and "unplugged" in str(box["e"])
    assert out.indices == [0, 1, 2]
    assert_accounted(p.counters(), done=True)


# ----------------------------------------------------------------------------------------------
# options and misuse


# (options kwargs, message fragment)
BAD_OPTIONS = [
    ({"drop_policy": "newest"}, "drop_policy"),
    ({"queue_size": 0}, "queue_size"),
    ({"workers": 0}, "workers"),
    ({"max_fps": 0}, "max_fps"),
    ({"max_fps": float("inf")}, "max_fps"),
    ({"rate_mode": "skip"}, "rate_mode"),
    ({"stop_mode": "kill"}, "stop_mode"),
    ({"top_k": 0}, "top_k"),
]


@pytest.mark.parametrize("kw,msg", BAD_OPTIONS)
def test_bad_options_are_refused_on_construction(kw, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        PipelineOptions(**kw)


def test_options_are_frozen_and_model_is_checked(model) -> None:
    with pytest.raises(AttributeError):
        PipelineOptions().queue_size = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="predict_image"):
        VisionPipeline(object(), SyntheticSource([]))


def test_a_pipeline_on_a_source_that_cannot_open_fails_at_start(model, tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    p = VisionPipeline(model, empty)
    with pytest.raises(SourceError, match="holds no images"):
        p.start()
    assert p.state.value == "stopped" and _pipeline_threads() == []


# ----------------------------------------------------------------------------------------------
# sinks


def test_jsonl_and_annotated_video_sinks_match_the_results(model, tmp_path) -> None:
    imgs, labels = shapes(10, seed=8)
    out = Collect()
    with JsonLinesSink(tmp_path / "r.jsonl") as js, AnnotatedVideoSink(tmp_path / "a.avi", fps=10) as vid:
        c = run_bounded(VisionPipeline(model, write_video(tmp_path / "in.avi", imgs), sinks=[js, vid, out]))
        assert vid.frames_written == 10
    assert c.processed == 10
    recs = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["index"] for r in recs] == list(range(10))
    for rec, fr in zip(recs, out.results):
        assert rec["timestamp_ms"] == fr.timestamp_ms and rec["latency_ms"] == fr.latency_ms
        assert rec["variant"] == fr.result.variant_id and rec["classes"][0]["label"] == fr.result.top1.label
        assert len(rec["classes"]) == 3 and abs(rec["classes"][0]["score"] - fr.result.top1.score) < 1e-9
    assert [r["classes"][0]["label"] for r in recs] == labels
    cap = cv2.VideoCapture(str(tmp_path / "a.avi"))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    assert n == 10


def test_annotated_video_draws_duck_typed_detections_and_keeps_the_first_size(tmp_path) -> None:
    class Detector:  # a detection model's result: decoded carries xyxy/scores/labels arrays
        def predict_image(self, image, *, color="RGB"):
            det = SimpleNamespace(xyxy=np.array([[10, 10, 50, 40]], np.float32), scores=np.array([0.9]), labels=np.array(["cat"]))
            return SimpleNamespace(decoded=det, outputs={"boxes": np.zeros((1, 4))}, variant_id="v", backend="b", model_name="m")

    frames = [np.zeros((60, 80, 3), np.uint8), np.zeros((120, 160, 3), np.uint8)]  # the size changes
    with AnnotatedVideoSink(tmp_path / "d.avi", fps=5) as vid, JsonLinesSink(tmp_path / "d.jsonl") as js:
        run_bounded(VisionPipeline(Detector(), SyntheticSource(frames), sinks=[vid, js]))
    cap = cv2.VideoCapture(str(tmp_path / "d.avi"))
    ok, first = cap.read()
    ok2, second = cap.read()
    cap.release()
    assert ok and ok2 and first.shape == second.shape == (60, 80, 3)
    assert first[25, 10, 1] > 150 and first[25, 10, 2] < 100  # the green box's left edge
    rec = json.loads((tmp_path / "d.jsonl").read_text().splitlines()[0])
    assert rec["detections"] == [{"xyxy": [10.0, 10.0, 50.0, 40.0], "score": 0.9, "label": "cat"}]


def test_sink_lifecycle_close_is_idempotent_and_write_after_close_fails(tmp_path) -> None:
    s = JsonLinesSink(tmp_path / "x.jsonl")
    s.close()
    s.close()
    with pytest.raises(PipelineStateError, match="closed"):
        s.write(None)  # type: ignore[arg-type]
    with pytest.raises(EdgeSDKError, match="cannot open"):
        JsonLinesSink(tmp_path / "missing" / "x.jsonl").open()


# ----------------------------------------------------------------------------------------------
# sources: URI table and lifecycle


class FakeCapture:
    """cv2.VideoCapture's interface over a script: opened or not, then frames, then failures."""

    def __init__(self, opened: bool = True, frames: int = 0, shape=(6, 8, 3)) -> None:
        self.opened, self.left, self.shape = opened, frames, shape
        self.props: dict[int, float] = {}
        self.released = False

    def isOpened(self) -> bool:  # noqa: N802 - OpenCV's name
        return self.opened

    def read(self):
        if self.left <= 0:
            return False, None
        self.left -= 1
        return True, np.full(self.shape, self.left, np.uint8)

    def get(self, prop: int) -> float:
        return 0.0

    def set(self, prop: int, value: float) -> bool:
        self.props[prop] = value
        return True

    def release(self) -> None:
        self.released = True


class Factory:
    """A capture factory that records its calls and hands out scripted captures."""

    def __init__(self, *captures: FakeCapture) -> None:
        self.captures = list(captures)
        self.calls: list[tuple[Any, int, list[int]]] = []

    def __call__(self, target, api, params):
        self.calls.append((target, api, list(params)))
        return self.captures.pop(0)


def test_csi_uri_opens_the_nvargus_pipeline_with_gstreamer() -> None:
    fac = Factory(FakeCapture(frames=2))
    src = source_from_uri("csi://1", SourceOptions(size_wh=(1920, 1080), fps=30, flip_method=2), capture_factory=fac)
    assert isinstance(src, GStreamerSource) and src.live
    with src:
        frames = list(src)
    target, api, _ = fac.calls[0]
    assert api == cv2.CAP_GSTREAMER
    assert target == (
        "nvarguscamerasrc sensor-id=1 ! video/x-raw(memory:NVMM),width=1920,height=1080,framerate=30/1 ! "
        "nvvidconv flip-method=2 ! video/x-raw,format=BGRx ! videoconvert ! video/x-raw,format=BGR ! "
        "appsink drop=true max-buffers=1"
    )
    assert [f.index for f in frames] == [0, 1] and frames[0].color == "BGR"
    assert csi_pipeline(0, fps=29.97).count("framerate=2997/100") == 1
    assert "flip-method" not in csi_pipeline(0)


def test_raw_gstreamer_string_and_missing_gstreamer_support() -> None:
    fac = Factory(FakeCapture(frames=1))
    pipe = "videotestsrc num-buffers=1 ! videoconvert ! appsink"
    with source_from_uri(pipe, capture_factory=fac) as src:
        assert isinstance(src, GStreamerSource) and len(list(src)) == 1
    assert fac.calls[0][:2] == (pipe, cv2.CAP_GSTREAMER)
    assert not source_from_uri("filesrc location=a.mp4 ! decodebin ! videoconvert ! appsink").live
    if "GStreamer:                   NO" in cv2.getBuildInformation():  # the real OpenCV here: explain
        with pytest.raises(SourceError, match="no GStreamer support"):
            source_from_uri(pipe).open()


def test_v4l2_and_camera_index_open_devices_with_fresh_frame_settings() -> None:
    fac = Factory(FakeCapture(frames=1), FakeCapture(frames=1))
    with source_from_uri("v4l2:///dev/video2", SourceOptions(size_wh=(640, 480), fps=15), capture_factory=fac) as src:
        assert src.live and len(list(src)) == 1
    with source_from_uri(0, capture_factory=fac) as cam:
        assert cam.live
    assert fac.calls[0][:2] == ("/dev/video2", cv2.CAP_V4L2) and fac.calls[1][:2] == (0, cv2.CAP_ANY)


def test_device_settings_are_requested() -> None:
    cap = FakeCapture(frames=0)
    with source_from_uri("v4l2:///dev/video0", SourceOptions(size_wh=(640, 480), fps=15), capture_factory=Factory(cap)):
        pass
    assert cap.props == {cv2.CAP_PROP_FRAME_WIDTH: 640, cv2.CAP_PROP_FRAME_HEIGHT: 480, cv2.CAP_PROP_FPS: 15, cv2.CAP_PROP_BUFFERSIZE: 1}
    assert cap.released


def test_network_source_reconnects_with_bounded_exponential_backoff() -> None:
    # open fails twice, 3 frames, stream drops, one failed reopen, 2 frames, then gone for good
    fac = Factory(
        FakeCapture(opened=False), FakeCapture(opened=False), FakeCapture(frames=3),
        FakeCapture(opened=False), FakeCapture(frames=2),
        FakeCapture(opened=False), FakeCapture(opened=False), FakeCapture(opened=False),
    )  # fmt: skip
    made = list(fac.captures)
    delays: list[float] = []
    events = []
    policy = Backoff(max_attempts=3, initial_delay_s=0.1, max_delay_s=0.25, multiplier=2)
    src = source_from_uri(
        "rtsp://cam.local:8554/live",
        SourceOptions(reconnect=policy, network_timeout_ms=2000),
        capture_factory=fac,
        sleep=delays.append,
        on_event=events.append,
    )
    assert isinstance(src, NetworkSource) and src.live
    src.open()
    got = []
    with pytest.raises(SourceError, match="gave up after 3 reconnect attempts"):
        while (f := src.read()) is not None:
            got.append(f.index)
    src.close()
    assert got == [0, 1, 2, 3, 4]
    assert delays == [0.1, 0.2, 0.1, 0.2, 0.1, 0.2, 0.25]
    kinds = [(e.kind, e.attempt) for e in events if e.kind not in ("opened", "closed")]
    assert kinds == [
        ("reconnecting", 1), ("reconnecting", 2), ("reconnected", 2),
        ("reconnecting", 1), ("reconnecting", 2), ("reconnected", 2),
        ("reconnecting", 1), ("reconnecting", 2), ("reconnecting", 3), ("gave_up", 3),
    ]  # fmt: skip
    reasons = [e.reason for e in events if e.kind == "reconnecting"]
    assert reasons[0].startswith("open failed") and reasons[2].startswith("read failed") and reasons[3].startswith("open failed")
    assert all(c[0] == "rtsp://cam.local:8554/live" and c[1] == cv2.CAP_FFMPEG for c in fac.calls)
    if hasattr(cv2, "CAP_PROP_OPEN_TIMEOUT_MSEC"):
        assert fac.calls[0][2] == [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 2000, cv2.CAP_PROP_READ_TIMEOUT_MSEC, 2000]
    assert all(c.released for c in made)  # every capture, failed or lost, was released


def test_network_reconnect_wait_is_interruptible() -> None:
    src = NetworkSource(
        "http://cam/stream.mjpg",
        options=SourceOptions(reconnect=Backoff(initial_delay_s=5, max_delay_s=5)),
        capture_factory=lambda *a: FakeCapture(opened=False),
    )
    threading.Timer(0.1, src.interrupt).start()
    t0 = time.monotonic()
    with pytest.raises(SourceError, match="interrupted"):
        src.open()
    assert time.monotonic() - t0 < 2


def test_network_source_in_a_pipeline_processes_across_a_reconnect(model) -> None:
    img = shapes(1)[0][0]

    class Cap(FakeCapture):
        def read(self):
            ok, _ = super().read()
            return ok, (img.copy() if ok else None)

    fac = Factory(Cap(frames=3), Cap(frames=2), Cap(opened=False))
    src = NetworkSource(
        "rtsp://x/y", options=SourceOptions(reconnect=Backoff(max_attempts=1, initial_delay_s=0, max_delay_s=0)), capture_factory=fac
    )
    out = Collect()
    p = VisionPipeline(model, src, PipelineOptions(drop_policy="block"), sinks=[out])
    p.start()
    assert p.join(JOIN_S)
    assert isinstance(p.error, SourceError) and out.indices == [0, 1, 2, 3, 4]
    assert [e.kind for e in src.events()].count("reconnected") == 1


class FakeRequest:
    def __init__(self, img, ts_ns):
        self.img, self.ts_ns, self.released = img, ts_ns, False

    def make_array(self, name):
        assert name == "main"
        return self.img

    def get_metadata(self):
        return {"SensorTimestamp": self.ts_ns}

    def release(self):
        self.released = True


class FakePicamera2:
    """Picamera2's interface (create_video_configuration/configure/start/capture_request/stop/close)."""

    def __init__(self, num):
        self.num, self.calls, self.n = num, [], 0

    def create_video_configuration(self, main, controls):
        self.calls.append(("config", main, controls))
        return {"main": main}

    def configure(self, cfg):
        self.calls.append(("configure", cfg))

    def start(self):
        self.calls.append(("start",))

    def capture_request(self):
        self.n += 1
        return FakeRequest(np.full((4, 6, 3), self.n, np.uint8), 1_000_000 * self.n)

    def stop(self):
        self.calls.append(("stop",))

    def close(self):
        self.calls.append(("close",))


def test_picamera2_source_configures_reads_bgr_with_sensor_time_and_closes() -> None:
    cams = []
    src = source_from_uri(
        "picamera2://1", SourceOptions(size_wh=(1280, 720), fps=20), camera_factory=lambda n: cams.append(FakePicamera2(n)) or cams[-1]
    )
    assert isinstance(src, Picamera2Source) and src.live
    with src:
        f1, f2 = src.read(), src.read()
    cam = cams[0]
    assert cam.num == 1 and cam.calls[0] == ("config", {"size": (1280, 720), "format": "RGB888"}, {"FrameRate": 20.0})
    assert (f1.color, f1.source_timestamp_ms, f2.source_timestamp_ms) == ("BGR", 1.0, 2.0)
    assert cam.calls[-2:] == [("stop",), ("close",)]


def test_picamera2_missing_names_the_apt_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "picamera2", None)  # import picamera2 -> ImportError
    src = source_from_uri("picamera2://0")
    with pytest.raises(MissingDependencyError, match=r"apt install python3-picamera2.*--system-site-packages"):
        src.open()
    assert src.state.value == "new"


def test_uri_table(tmp_path) -> None:
    video = write_video(tmp_path / "v.avi", shapes(2)[0])
    (tmp_path / "imgs").mkdir()
    cv2.imwrite(str(tmp_path / "imgs" / "a.png"), shapes(1)[0][0])
    # (uri, class, live) — one row per way in
    rows = [
        (str(video), OpenCVSource, False),
        (f"file://{video}", OpenCVSource, False),
        (video, OpenCVSource, False),  # a Path
        (str(tmp_path / "imgs"), ImageFolderSource, False),
        (f"file://{tmp_path / 'imgs'}/", ImageFolderSource, False),
        (str(tmp_path / "imgs" / "a.png"), ImageFolderSource, False),  # one image
        (0, OpenCVSource, True),
        ("v4l2:///dev/video0", OpenCVSource, True),
        ("/dev/video1", OpenCVSource, True),  # a device node path
        ("rtsp://10.0.0.2:554/stream", NetworkSource, True),
        ("https://example.org/cam.mjpg", NetworkSource, True),
        ("csi://0", GStreamerSource, True),
        ("picamera2://0", Picamera2Source, True),
        ("synthetic://16x8?fps=30&frames=3", SyntheticSource, True),
        ("synthetic://16x8?frames=3", SyntheticSource, False),
    ]
    for uri, cls, live in rows:
        src = source_from_uri(uri)
        assert type(src) is cls and src.live is live, uri
    assert source_from_uri(str(video), SourceOptions(live=True)).live  # overridable


# (uri, error, message fragment)
BAD_URIS = [
    ("webrtc://@:8554/my_input", UnknownSourceError, r"unknown source scheme 'webrtc://'.*csi://N.*rtsp"),
    ("rtp://@:1234", UnknownSourceError, "known:"),
    ("csi://front", UnknownSourceError, "camera number"),
    ("synthetic://big", UnknownSourceError, "WIDTHxHEIGHT"),
    ("synthetic://4x4?speed=2", UnknownSourceError, "unknown parameter"),
    ("/no/such/clip.mp4", SourceError, "no such video"),
    (-1, UnknownSourceError, ">= 0"),
    ("", UnknownSourceError, "expected a URI"),
]


@pytest.mark.parametrize("uri,exc,msg", BAD_URIS)
def test_bad_uris_are_clear_errors(uri, exc, msg) -> None:
    with pytest.raises(exc, match=msg):
        source_from_uri(uri)


def test_synthetic_uri_yields_sized_frames() -> None:
    with source_from_uri("synthetic://16x8?frames=3") as src:
        frames = list(src)
    assert [f.size_wh for f in frames] == [(16, 8)] * 3 and frames[0].color == "BGR"
    assert not np.array_equal(frames[0].image, frames[1].image)  # the bar moves


def test_source_lifecycle_states() -> None:
    src = SyntheticSource([np.zeros((2, 2, 3), np.uint8)])
    with pytest.raises(SourceClosedError, match="new"):
        src.read()
    with src:
        assert src.state.value == "open" and src.open() is src  # open twice: no-op
        assert isinstance(src.read(), Frame) and src.read() is None
    src.close()  # idempotent
    assert src.state.value == "closed"
    with pytest.raises(SourceClosedError, match="closed"):
        src.read()
    with pytest.raises(SourceClosedError, match="make a new one"):
        src.open()
    assert [e.kind for e in src.events()] == ["opened", "closed"]


def test_frames_are_immutable_and_validated() -> None:
    img = np.zeros((4, 4, 3), np.uint8)
    f = Frame(0, img, "BGR", 1.0)
    with pytest.raises(ValueError):
        f.image[0, 0, 0] = 1  # a read-only view ...
    img[0, 0, 0] = 1  # ... the caller's array stays writable
    with pytest.raises(AttributeError):
        f.index = 3  # type: ignore[misc]
    with pytest.raises(InvalidFrameError, match="does not fit"):
        Frame(0, img, "GRAY", 1.0)
    with pytest.raises(InvalidFrameError, match="color"):
        Frame(0, img, "HSV", 1.0)


def test_importing_pipelines_loads_no_opencv_or_runtime() -> None:
    import subprocess

    code = "import sys, edge_sdk.pipelines; print([m for m in ('cv2', 'onnxruntime', 'picamera2') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "[]", out.stderr


def test_any_path_like_names_a_source_as_a_path_does(tmp_path: Path) -> None:
    for i in range(2):
        cv2.imwrite(str(tmp_path / f"{i}.png"), np.full((8, 8, 3), 40 * i, np.uint8))

    class PathLike:  # an os.PathLike that is not a pathlib.Path
        def __fspath__(self) -> str:
            return str(tmp_path)

    a, b = source_from_uri(PathLike()), source_from_uri(tmp_path)
    assert type(a) is type(b) and a.name == b.name
    with a, b:
        fa, fb = [f.image for f in a], [f.image for f in b]
    assert len(fa) == len(fb) == 2 and all(np.array_equal(x, y) for x, y in zip(fa, fb))
