"""Sinks: where a pipeline's results go.

A :class:`Sink` has public ``open()`` / ``write(frame_result)`` / ``close()`` that own the state
(NEW -> OPEN -> CLOSED) and a lock; implementations fill ``_open`` / ``_write`` / ``_close``.
``write()`` opens a NEW sink first; writing to a closed sink raises PipelineStateError; ``close()``
is idempotent. Every sink is a context manager. A pipeline calls its sinks on one thread, in
frame order, and never closes them (the caller does)::

    with JsonLinesSink("results.jsonl") as out, AnnotatedVideoSink("annotated.avi", fps=30) as video:
        VisionPipeline(model, "clip.mp4", sinks=[out, video, print]).run()
"""

from __future__ import annotations

import enum
import json
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .._deps import require_cv2
from ..errors import OptionsError, OptionsTypeError
from .errors import PipelineStateError, SinkError

if TYPE_CHECKING:  # pragma: no cover
    from .vision import FrameResult

__all__ = ["AnnotatedVideoSink", "CallbackSink", "JsonLinesSink", "Sink", "SinkState", "frame_result_record"]


def _cv2() -> Any:
    return require_cv2("AnnotatedVideoSink")


class SinkState(str, enum.Enum):
    """A sink's lifecycle: NEW -> OPEN -> CLOSED (a sink opens once)."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class Sink:
    """Base of every sink (see the module docstring for the contract)."""

    def __init__(self) -> None:
        self._state = SinkState.NEW
        self._lock = threading.RLock()  # re-entrant: a CallbackSink's fn may close its own sink

    @property
    def state(self) -> SinkState:
        """NEW, OPEN or CLOSED."""
        return self._state

    def open(self) -> "Sink":
        """Open the sink if it is new (a no-op if open); returns self. :class:`~edge_sdk.pipelines.errors.PipelineStateError` if closed."""
        with self._lock:
            self._open_locked()
        return self

    def _open_locked(self) -> None:
        if self._state is SinkState.CLOSED:
            raise PipelineStateError(f"{type(self).__name__} is closed; a sink opens once")
        if self._state is SinkState.NEW:
            self._open()
            self._state = SinkState.OPEN

    def write(self, fr: "FrameResult") -> None:
        """Write one frame's result, opening the sink first if it is new; :class:`~edge_sdk.pipelines.errors.PipelineStateError` after
        close."""
        with self._lock:
            self._open_locked()
            self._write(fr)

    def close(self) -> None:
        """Close the sink, finishing and releasing its output if it was open; idempotent. It cannot be opened again."""
        with self._lock:
            if self._state is SinkState.CLOSED:
                return
            was_open = self._state is SinkState.OPEN
            self._state = SinkState.CLOSED
            if was_open:
                self._close()

    def __enter__(self) -> "Sink":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # hooks
    def _open(self) -> None:
        pass

    def _write(self, fr: "FrameResult") -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


class CallbackSink(Sink):
    """Calls ``fn(frame_result)`` for each result."""

    def __init__(self, fn: Callable[["FrameResult"], Any]) -> None:
        if not callable(fn):
            raise OptionsTypeError(f"CallbackSink: expected a callable, got {type(fn).__name__}")
        super().__init__()
        self.fn = fn

    def _write(self, fr: "FrameResult") -> None:
        self.fn(fr)


# ----------------------------------------------------------------------------------------------
# duck-typed views of a Result's decoded field


def _top_classes(decoded: Any) -> tuple[Any, ...] | None:
    """The first row of a classification result (objects with index/label/score), else None."""
    if isinstance(decoded, tuple) and decoded and isinstance(decoded[0], tuple) and decoded[0]:
        c = decoded[0][0]
        if all(hasattr(c, a) for a in ("index", "label", "score")):
            return decoded[0]
    return None


def _detections(decoded: Any) -> Any | None:
    """An object with ``xyxy`` / ``scores`` / ``labels`` arrays (or the first row of a tuple of them)."""
    for d in (decoded, decoded[0] if isinstance(decoded, (tuple, list)) and decoded else None):
        if d is not None and all(hasattr(d, a) for a in ("xyxy", "scores", "labels")):
            return d
    return None


def _boxes(det: Any) -> list[tuple[tuple[float, float, float, float], float, str]]:
    xyxy = np.asarray(det.xyxy, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(det.scores, dtype=np.float64).reshape(-1)
    names = det.labels if det.labels is not None else getattr(det, "class_ids", None)  # no names: class ids
    labels = list(names) if names is not None else []
    out = []
    for i, box in enumerate(xyxy):
        if not np.isfinite(box).all():
            continue
        s = float(scores[i]) if i < len(scores) else float("nan")
        lab = labels[i] if i < len(labels) else ""
        x1, y1, x2, y2 = (float(v) for v in box)
        out.append(((x1, y1, x2, y2), s, str(lab.item() if isinstance(lab, np.generic) else lab)))
    return out


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def frame_result_record(fr: "FrameResult") -> dict[str, Any]:
    """The JSON-ready dict JsonLinesSink writes for one result: index, timestamp_ms,
    source_timestamp_ms, latency_ms, model, version, variant, backend, sha256, ``provenance`` (the
    result's :class:`~edge_sdk.telemetry.Provenance`: model, version, sha256, variant, backend,
    runtime and its version, profile, SDK version; None for a result without one),
    ``budget_state`` (with a governor attached), then ``classes`` (top-k of a
    classification: index, label, score), ``detections`` (xyxy, score, label), and, when neither
    is there, ``output_shapes`` (name -> shape)."""
    r = fr.result
    prov: Any = getattr(r, "provenance", None)
    rec: dict[str, Any] = {
        "index": fr.index,
        "timestamp_ms": fr.timestamp_ms,
        "source_timestamp_ms": _num(fr.frame.source_timestamp_ms),
        "latency_ms": fr.latency_ms,
        "model": getattr(r, "model_name", None),
        "version": getattr(r, "model_version", None),
        "variant": getattr(r, "variant_id", None),
        "backend": getattr(r, "backend", None),
        "sha256": getattr(r, "model_sha256", None),
        "provenance": prov.to_dict() if hasattr(prov, "to_dict") else None,
    }
    if getattr(fr, "budget_state", None) is not None:
        rec["budget_state"] = fr.budget_state
    decoded = getattr(r, "decoded", None)
    classes = _top_classes(decoded)
    det = _detections(decoded) if classes is None else None
    if classes is not None:
        rec["classes"] = [{"index": int(c.index), "label": str(c.label), "score": _num(float(c.score))} for c in classes]
    if det is not None:
        rec["detections"] = [{"xyxy": list(b), "score": _num(s), "label": lab} for b, s, lab in _boxes(det)]
    if classes is None and det is None:
        rec["output_shapes"] = {k: list(np.shape(v)) for k, v in (getattr(r, "outputs", None) or {}).items()}
    return rec


class JsonLinesSink(Sink):
    """One JSON object per result (:func:`frame_result_record`), one per line, flushed per line.
    ``append``: add to an existing file instead of replacing it."""

    def __init__(self, path: str | Path, *, append: bool = False) -> None:
        super().__init__()
        self.path = Path(path)
        self.append = append
        self._f: Any = None

    def _open(self) -> None:
        try:
            self._f = open(self.path, "a" if self.append else "w", encoding="utf-8")
        except OSError as e:
            raise SinkError(f"JsonLinesSink cannot open {str(self.path)!r} for writing: {e}") from e

    def _write(self, fr: "FrameResult") -> None:
        self._f.write(json.dumps(frame_result_record(fr), allow_nan=False) + "\n")
        self._f.flush()

    def _close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            f.close()


class AnnotatedVideoSink(Sink):
    """Writes each frame, annotated, with ``cv2.VideoWriter`` (``fourcc``, default MJPG for .avi).

    Draws the top-1 class and score of a classification, and boxes with label and score for a
    result whose ``decoded`` (or its first row) carries ``xyxy`` / ``scores`` / ``labels`` arrays in
    source-image pixels. The video takes the first frame's size (or ``size_wh``); frames of
    another size are drawn on, then resized to it. Grey and RGB frames are converted to BGR.
    ``frames_written`` counts frames written."""

    def __init__(self, path: str | Path, fps: float, *, fourcc: str = "MJPG", size_wh: tuple[int, int] | None = None) -> None:
        if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise OptionsError(f"fps: expected a number > 0, got {fps!r}")
        if len(fourcc) != 4:
            raise OptionsError(f"fourcc: expected 4 characters, got {fourcc!r}")
        super().__init__()
        self.path = Path(path)
        self.fps = float(fps)
        self.fourcc = fourcc
        self.size_wh = size_wh
        self.frames_written = 0
        self._writer: Any = None

    def _open(self) -> None:
        self._cv = _cv2()

    def _start_writer(self, size_wh: tuple[int, int]) -> None:
        cv2 = self._cv
        w = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*self.fourcc), self.fps, size_wh)
        if not w.isOpened():
            w.release()
            raise SinkError(f"OpenCV cannot write {str(self.path)!r} with fourcc {self.fourcc!r} at {size_wh[0]}x{size_wh[1]}")
        self._writer = w
        self.size_wh = size_wh

    def _write(self, fr: "FrameResult") -> None:
        cv2 = self._cv
        f = fr.frame
        img = f.image
        if f.color == "GRAY":
            img = cv2.cvtColor(np.ascontiguousarray(img[:, :, 0]), cv2.COLOR_GRAY2BGR)
        elif f.color == "RGB":
            img = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2BGR)
        else:
            img = np.array(img, copy=True, order="C")  # frames are read-only; draw on a copy
        self._annotate(img, fr)
        if self._writer is None:
            self._start_writer(self.size_wh or (img.shape[1], img.shape[0]))
        assert self.size_wh is not None  # _start_writer set it with the writer
        w, h = self.size_wh
        if (img.shape[1], img.shape[0]) != (w, h):
            img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
        self._writer.write(img)
        self.frames_written += 1

    def _annotate(self, img: np.ndarray, fr: "FrameResult") -> None:
        cv2 = self._cv
        h, w = img.shape[:2]
        scale = max(0.3, min(w, h) / 640)
        thick = max(1, round(scale * 2))
        decoded = getattr(fr.result, "decoded", None)
        classes = _top_classes(decoded)
        if classes is not None:
            c = classes[0]
            text = f"{c.label} {float(c.score):.2f}"
            (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)
            cv2.rectangle(img, (0, 0), (tw + 4, th + base + 4), (0, 0, 0), -1)
            cv2.putText(img, text, (2, th + 2), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), thick, cv2.LINE_AA)
        det = _detections(decoded) if classes is None else None
        if det is not None:
            for (x0, y0, x1, y1), s, lab in _boxes(det):
                p0 = (int(round(x0)), int(round(y0)))
                cv2.rectangle(img, p0, (int(round(x1)), int(round(y1))), (0, 255, 0), thick)
                cv2.putText(
                    img, f"{lab} {s:.2f}", (p0[0], max(p0[1] - 3, 10)), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 255, 0), thick, cv2.LINE_AA
                )

    def _close(self) -> None:
        w, self._writer = self._writer, None
        if w is not None:
            w.release()
