"""The face pipeline end to end: a real detector (MediaPipe's BlazeFace short-range, fp32 TFLite,
out of the pinned mediapipe wheel), real photographs (scikit-image's astronaut and coffee) and a
real video file (MJPG .avi written with cv2.VideoWriter), through VisionPipeline and its sinks.

The clip (tools/fixtures/face_clip.py, shared with the benchmark): a 320x320 head-and-shoulders crop
of the astronaut pasted at native scale on a grey 640x480 canvas at an offset that moves every
frame, and coffee (no face) on two frames in every ten. Each face frame's expected box is the
hand-read face box of the 512x512 photo, (182, 82, 270, 176), moved by the paste offset.

- block policy on the file: every frame processed, in order, one face per face frame where it was
  pasted (IoU >= 0.6), no face on coffee, frame accounting exact in every snapshot;
- overload: the same frames replayed as a live source much faster than inference; frames are
  evicted (and only evicted), the queue stays within bounds, traced memory stays bounded while
  ~276 MB of pixels pass through, the accounting holds, and every result that comes out is right.
"""

from __future__ import annotations

import json
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")
pytest.importorskip("skimage")  # the dev extra installs it
pytest.importorskip("ai_edge_litert")

import edge_sdk  # noqa: E402
from edge_sdk.pipelines import (  # noqa: E402
    CallbackSink,
    FrameDrop,
    JsonLinesSink,
    PipelineCounters,
    PipelineOptions,
    SyntheticSource,
    VisionPipeline,
)
from edge_sdk.processing.detection import Detections  # noqa: E402
from tools.fixtures.face_clip import ClipFrame, box_iou, read_clip, write_clip  # noqa: E402
from tools.fixtures.face_package import MODEL_NAME, write_face_package  # noqa: E402

N_FRAMES = 60
MIN_IOU = 0.6
JOIN_S = 30.0
OVERLOAD_FRAMES = 300
#: Replay rate of the live source: a 0.33 ms frame period. BlazeFace on a 640x480 frame through
#: predict_image (colour, resize, normalise, inference, decode) takes well over that on a CPU
#: (about 3 ms on the 2-core development box), so the source is always faster than inference.
OVERLOAD_FPS = 3000.0
FRAME_BYTES = 640 * 480 * 3
#: What the traced heap may grow by while OVERLOAD_FRAMES fresh frames (276 MB) pass through:
#: about 40 frames' worth; the pipeline holds at most queue_size + a few in flight.
MEMORY_BOUND = 40 * 2**20


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faces")


@pytest.fixture(scope="module")
def face_model(work: Path):
    # Module scope: runs before conftest's per-test cache, so the fetch uses the normal model cache.
    from tools.fixtures.fetch_pretrained import fetch

    pkg = write_face_package(work / "face-pkg", fetch(MODEL_NAME))
    with edge_sdk.load(pkg, "generic-x86_64", threads=1, delegates=(), cache_dir=work / "cache") as m:
        yield m


@pytest.fixture(scope="module")
def clip(work: Path) -> tuple[Path, list[ClipFrame]]:
    path = work / "faces.avi"
    plan = write_clip(path, N_FRAMES, fps=30.0)
    return path, plan


@pytest.fixture(scope="module")
def clip_frames(clip: tuple[Path, list[ClipFrame]]) -> list[np.ndarray]:
    """The clip's frames as decoded from the file (BGR), i.e. what a camera replaying it would give."""
    frames = read_clip(clip[0])
    assert len(frames) == N_FRAMES
    return frames


def check_frame(cf: ClipFrame, boxes: list[list[float]], scores: list[float], labels: list[str]) -> None:
    """One face where the crop was pasted, or nothing on a coffee frame."""
    if cf.face_box is None:
        assert boxes == [], f"frame {cf.index} (coffee): expected no face, got {boxes}"
        return
    assert len(boxes) == 1, f"frame {cf.index}: expected one face near {cf.face_box}, got {boxes}"
    iou = box_iou(boxes[0], cf.face_box)
    assert iou >= MIN_IOU, f"frame {cf.index}: box {boxes[0]} vs expected {cf.face_box}: IoU {iou:.3f}"
    assert labels == ["face"] and 0.5 <= scores[0] <= 1.0


class Snapshots:
    """Polls ``pipeline.counters()`` from another thread while it runs; every snapshot must balance."""

    def __init__(self, pipeline: VisionPipeline) -> None:
        self.pipeline = pipeline
        self.bad: list[PipelineCounters] = []
        self.n = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            c = self.pipeline.counters()
            self.n += 1
            if c.unaccounted != 0 or c.frames_in != c.processed + c.dropped_total + c.in_flight:
                self.bad.append(c)
            self._stop.wait(0.0005)

    def __enter__(self) -> "Snapshots":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)


def _final_checks(c: PipelineCounters) -> None:
    assert c.state == "stopped"
    assert c.in_flight == 0 and c.unaccounted == 0
    assert c.frames_in == c.processed + c.dropped_total


# ----------------------------------------------------------------------------------------------
# every frame of the file, block policy


@pytest.mark.parametrize("workers", [1, 2])
def test_video_file_block_policy_finds_each_face(face_model: Any, clip: tuple[Path, list[ClipFrame]], tmp_path: Path, workers: int) -> None:
    path, plan = clip
    assert sum(cf.has_face for cf in plan) == 48 and sum(not cf.has_face for cf in plan) == 12
    results: list[tuple[int, Detections]] = []
    drops: list[FrameDrop] = []
    out = tmp_path / "faces.jsonl"
    with JsonLinesSink(out) as jsonl:
        pl = VisionPipeline(
            face_model,
            str(path),
            PipelineOptions(drop_policy="block", queue_size=4, workers=workers, join_timeout_s=JOIN_S),
            sinks=[jsonl, CallbackSink(lambda fr: results.append((fr.index, fr.result.decoded)))],
            on_drop=drops.append,
        )
        assert not pl.source.live and pl.drop_policy == "block"
        with Snapshots(pl) as snaps:
            c = pl.run()
    assert snaps.n > 0 and snaps.bad == [], f"unbalanced snapshots: {snaps.bad[:3]}"
    _final_checks(c)
    assert (c.frames_in, c.processed, c.dropped_total, drops) == (N_FRAMES, N_FRAMES, 0, [])
    assert 1 <= c.max_queue_depth <= 4 and c.sink_errors == 0

    # the sinks saw every frame, in order, and agree with each other
    assert [i for i, _ in results] == list(range(N_FRAMES))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(N_FRAMES))
    for cf, rec, (_, det) in zip(plan, records, results):
        assert isinstance(det, Detections)
        assert rec["model"] == "face" and rec["backend"] == "litert" and rec["latency_ms"] > 0
        boxes = [d["xyxy"] for d in rec["detections"]]
        check_frame(cf, boxes, [d["score"] for d in rec["detections"]], [d["label"] for d in rec["detections"]])
        np.testing.assert_allclose(np.asarray(det.xyxy, np.float64).reshape(-1, 4), np.asarray(boxes, np.float64).reshape(-1, 4), atol=1e-3)
        if rec["source_timestamp_ms"] is not None:  # the video position: frame i at i / 30 s
            assert rec["source_timestamp_ms"] == pytest.approx(cf.index * 1000 / 30, abs=1.0)


# ----------------------------------------------------------------------------------------------
# overload: the clip replayed as a live camera faster than inference


@pytest.mark.parametrize("policy", ["latest", "drop_oldest"])
def test_live_overload_drops_bounded_and_correct(
    face_model: Any, clip: tuple[Path, list[ClipFrame]], clip_frames: list[np.ndarray], policy: str
) -> None:
    _, plan = clip
    queue_size = 4

    def frame(i: int) -> np.ndarray | None:
        # a fresh array per frame, as a camera delivers: a pipeline that kept them would show in the heap
        return clip_frames[i % N_FRAMES].copy() if i < OVERLOAD_FRAMES else None

    src = SyntheticSource(frame, fps=OVERLOAD_FPS, live=True, name="replay")
    assert VisionPipeline(face_model, SyntheticSource([], live=True)).drop_policy == "latest"  # the live default
    got: list[tuple[int, list[list[float]], list[float], tuple[str, ...]]] = []
    drops: list[FrameDrop] = []

    def sink(fr: Any) -> None:  # keep the numbers, not the frames
        d = fr.result.decoded
        got.append((fr.index, np.asarray(d.xyxy, np.float64).reshape(-1, 4).tolist(), [float(s) for s in d.scores], tuple(d.labels or ())))

    pl = VisionPipeline(
        face_model,
        src,
        PipelineOptions(drop_policy=policy, queue_size=queue_size, workers=1, join_timeout_s=JOIN_S),
        sinks=[CallbackSink(sink)],
        on_drop=drops.append,
    )
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with Snapshots(pl) as snaps:
            c = pl.run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    growth = peak - base

    assert snaps.n > 0 and snaps.bad == [], f"unbalanced snapshots: {snaps.bad[:3]}"
    _final_checks(c)
    assert c.frames_in == OVERLOAD_FRAMES
    evicted = c.dropped.get("evicted", 0)
    assert evicted > 0, f"the source was not faster than inference: {c}"
    assert {k for k, v in c.dropped.items() if v} == {"evicted"}, c.dropped
    assert c.processed + evicted == OVERLOAD_FRAMES and c.processed >= 5, c
    assert len(drops) == evicted and {d.reason for d in drops} == {"evicted"}
    assert c.max_queue_depth <= (1 if policy == "latest" else queue_size)
    assert growth < MEMORY_BOUND, (
        f"traced memory grew by {growth / 2**20:.1f} MiB while {OVERLOAD_FRAMES} frames "
        f"({OVERLOAD_FRAMES * FRAME_BYTES / 2**20:.0f} MiB of pixels) passed; bound {MEMORY_BOUND / 2**20:.0f} MiB"
    )

    # every result that came out is in order and right for the frame it belongs to
    idx = [i for i, *_ in got]
    assert len(got) == c.processed and idx == sorted(idx) and len(set(idx)) == len(idx)
    assert set(idx).isdisjoint(d.index for d in drops)
    for i, boxes, scores, labels in got:
        check_frame(plan[i % N_FRAMES], boxes, scores, list(labels))


# ----------------------------------------------------------------------------------------------
# decode on the output thread (PipelineOptions.decode)


def _detections(model: Any, path: Path, **opts: Any) -> tuple[VisionPipeline, PipelineCounters, list[tuple[int, list[list[float]], list[float]]]]:
    got: list[tuple[int, list[list[float]], list[float]]] = []

    def sink(fr: Any) -> None:
        d = fr.result.decoded
        assert fr.result.timings.decode_ms >= 0 and fr.latency_ms > 0
        got.append((fr.index, np.asarray(d.xyxy, np.float64).reshape(-1, 4).tolist(), [float(s) for s in d.scores]))

    opts.setdefault("model_threads", "keep")
    pl = VisionPipeline(model, str(path), PipelineOptions(drop_policy="block", queue_size=4, join_timeout_s=JOIN_S, **opts), sinks=[CallbackSink(sink)])
    return pl, pl.run(), got


def test_decode_on_the_output_thread_gives_the_workers_results(face_model: Any, clip: tuple[Path, list[ClipFrame]]) -> None:
    path, plan = clip
    runs = {}
    for mode in ("output", "worker"):
        pl, c, got = _detections(face_model, path, workers=1, preprocess="capture", decode=mode)
        assert pl.decode == mode
        _final_checks(c)
        assert (c.processed, c.dropped_total) == (N_FRAMES, 0)
        assert [i for i, *_ in got] == list(range(N_FRAMES))
        assert pl.wait_model_idle(face_model, timeout=1.0)
        runs[mode] = got
    assert runs["output"] == runs["worker"]  # the same arrays decoded on another thread
    for cf, (_, boxes, scores) in zip(plan, runs["output"]):
        check_frame(cf, boxes, scores, ["face"] * len(boxes))

    # what "auto" picks: the output thread for one worker with capture-side preprocessing only
    def mode_of(**opts: Any) -> str:
        return VisionPipeline(face_model, str(path), PipelineOptions(model_threads="keep", **opts)).decode

    assert mode_of(workers=1, preprocess="capture") == "output"
    assert mode_of(workers=2, preprocess="capture") == "worker"
    assert mode_of(workers=1, preprocess="worker") == "worker"
    assert mode_of(workers=1, preprocess="inline", decode="output") == "worker"  # inline has no output thread
    assert mode_of(workers=2, preprocess="worker", decode="output") == "output"
    with pytest.raises(edge_sdk.errors.OptionsError, match="decode: expected one of"):
        PipelineOptions(decode="sink")


class _FailingDecode:
    """The real face model, whose decode raises on the ``bad``-th call (frames decode in order)."""

    def __init__(self, model: Any, bad: int) -> None:
        self._m, self._bad, self.calls = model, bad, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    def decode_inferred(self, inferred: Any, **kw: Any) -> Any:
        n, self.calls = self.calls, self.calls + 1
        if n == self._bad:
            raise ValueError("decoder broke on this frame")
        return self._m.decode_inferred(inferred, **kw)


def test_a_decode_error_on_the_output_thread_drops_that_frame_only(face_model: Any, clip: tuple[Path, list[ClipFrame]]) -> None:
    path, plan = clip
    flaky = _FailingDecode(face_model, bad=7)
    errors: list[tuple[int | None, str]] = []
    drops: list[FrameDrop] = []
    got: list[int] = []
    pl = VisionPipeline(
        flaky,
        str(path),
        PipelineOptions(drop_policy="block", queue_size=4, workers=1, preprocess="capture", decode="output", model_threads="keep", join_timeout_s=JOIN_S),
        sinks=[CallbackSink(lambda fr: got.append(fr.index))],
        on_error=lambda e, fr: errors.append((None if fr is None else fr.index, str(e))),
        on_drop=drops.append,
    )
    assert pl.decode == "output"
    with Snapshots(pl) as snaps:
        c = pl.run()
    assert snaps.bad == []
    _final_checks(c)
    assert flaky.calls == N_FRAMES
    assert (c.processed, dict(c.dropped)) == (N_FRAMES - 1, {**{k: 0 for k in c.dropped}, "error": 1})
    assert [(d.index, d.reason) for d in drops] == [(7, "error")] and "decoder broke" in drops[0].detail
    assert errors == [(7, "decoder broke on this frame")]
    assert got == [i for i in range(N_FRAMES) if i != 7]
    assert pl.wait_model_idle(flaky, timeout=1.0)


def test_swap_to_a_model_without_the_deferred_api_decodes_on_the_worker(face_model: Any, clip: tuple[Path, list[ClipFrame]]) -> None:
    """A model object with only predict_image (a user's wrapper) swapped in mid-run keeps working."""
    path, plan = clip

    class PlainModel:
        def __init__(self) -> None:
            self.calls = 0

        def predict_image(self, image: Any, color: str = "BGR", **kw: Any) -> Any:
            self.calls += 1
            return face_model.predict_image(image, color=color, **kw)

    plain = PlainModel()
    got: list[tuple[int, Any]] = []
    pl: VisionPipeline

    def sink(fr: Any) -> None:
        got.append((fr.index, fr.result.decoded))
        if fr.index == 10:
            pl.swap_model(plain)

    pl = VisionPipeline(
        face_model,
        str(path),
        PipelineOptions(drop_policy="block", queue_size=4, workers=1, preprocess="capture", decode="output", model_threads="keep", join_timeout_s=JOIN_S),
        sinks=[CallbackSink(sink)],
    )
    c = pl.run()
    _final_checks(c)
    # frames the worker takes after the swap go to the plain model; frame 11 may have been taken before
    assert c.processed == N_FRAMES and plain.calls in (N_FRAMES - 12, N_FRAMES - 11)
    assert [i for i, _ in got] == list(range(N_FRAMES))
    for cf, (_, d) in zip(plan, got):
        check_frame(cf, np.asarray(d.xyxy, np.float64).reshape(-1, 4).tolist(), [float(s) for s in d.scores], list(d.labels or ()))
    assert pl.wait_model_idle(face_model, timeout=1.0) and pl.wait_model_idle(plain, timeout=1.0)
