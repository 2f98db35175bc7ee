"""``edge-sdk run``: one command from a model package to an annotated video.

::

    edge-sdk run PKG --source 0                                  # camera 0, /dev/video0, csi://0 ...
    edge-sdk run PKG --source clip.mp4 --save out.mp4 --jsonl results.jsonl
    edge-sdk run PKG --source shots/ --save annotated/           # an image folder -> a folder
    edge-sdk run PKG --source rtsp://cam.local:8554/s --show --max-fps 10

It is :class:`~edge_sdk.pipelines.vision.VisionPipeline` with sinks: the source is
:func:`~edge_sdk.pipelines.sources.source_from_uri`'s (a camera index, ``/dev/videoN``,
``csi://N``, a video file, an RTSP/HTTP URL, an image or a folder of images); each result is drawn
on its frame with :func:`edge_sdk.processing.draw.draw` (boxes, labels, scores, keypoints, masks,
top classes) and written by :class:`~edge_sdk.pipelines.sinks.AnnotatedVideoSink` (``--save
out.mp4``: fourcc ``mp4v``; ``.avi``: ``MJPG``), as images into a folder (``--save DIR``), shown
with ``cv2.imshow`` (``--show``) and written as JSON lines (``--jsonl``: one object per frame,
:meth:`Result.to_dict <edge_sdk.model.Result.to_dict>` with the frame's index, timestamps and
budget state). A budget :class:`~edge_sdk.budget.governor.Governor` (``--no-governor`` turns it
off) samples the device's sensors and acts on the pipeline by its ladder (lower rate, lighter
variant, pause); its state is on each result and on the status line.

While it runs, a status line on stderr: frames per second over the last two seconds, frames
processed, dropped (by reason), in flight, and the governor's state; redrawn in place on a
terminal, one line a second otherwise. At the end (also after Ctrl-C, which stops the capture and
discards frames not yet inferred, or SIGTERM) the pipeline's accounting: every frame the source
gave was processed, dropped with its reason, or is in flight (0 once stopped).

Exit status: 0 when at least one frame was processed; 1 when none was, when the source failed, or
for an edge_sdk error (a bad source names its path or URL); 2 for bad usage.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any, Callable

import numpy as np

from .._deps import require_cv2
from ..cli_args import add_device_arguments, add_load_arguments, load_kwargs
from ..errors import OptionsError
from .errors import SinkError
from .sinks import AnnotatedVideoSink, Sink
from .sources import Capture, FrameDrop, FrameSource, ImageFolderSource, OpenCVSource, SourceOptions, source_from_uri
from .vision import DROP_POLICIES, FrameResult, PipelineCounters, PipelineOptions, VisionPipeline

__all__ = ["DisplayUnavailableError", "add_arguments", "frame_record", "run"]

VIDEO_FOURCC = {".mp4": "mp4v", ".avi": "MJPG"}  # OpenCV's VideoWriter fourcc per container
_WRITABLE_IMAGES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
_SHOW_NEEDS = "--show needs a display and an OpenCV build with GUI support (opencv-python, not -headless)"
_UNKNOWN_POLICIES = ("degrade", "hold", "ignore")
_MAX_ERROR_LINES = 10


class DisplayUnavailableError(SinkError):
    """``--show`` cannot open a window: OpenCV was built without a GUI (opencv-python-headless), or
    there is no display to open it on."""


# ----------------------------------------------------------------------------------------------
# arguments


def _number(cast: Callable[[str], float], ok: Callable[[float], bool], expected: str) -> Callable[[str], Any]:
    """An argparse ``type=``: ``cast`` the text, and an ArgumentTypeError saying ``expected`` unless ``ok``."""

    def parse(s: str) -> Any:
        try:
            v = cast(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}") from None
        if not (math.isfinite(v) and ok(v)):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}")
        return v

    return parse


_positive_float = _number(float, lambda v: v > 0, "a number > 0")
_positive_int = _number(int, lambda v: v >= 1, "an int >= 1")
_unit_float = _number(float, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``edge-sdk run`` (see the module docs)."""
    p.add_argument("package", metavar="PKG", help="model package: a folder, .zip or .tar")
    p.add_argument("--source", required=True, metavar="SRC",
                   help="camera index (0), /dev/videoN, csi://N, a video file, rtsp:// or http(s):// URL, an image or a folder of images, "
                        "synthetic://WxH?fps=F&frames=N, or a GStreamer pipeline")  # fmt: skip
    p.add_argument("--save", metavar="OUT",
                   help="write the annotated frames: a .mp4 (fourcc mp4v) or .avi (MJPG) video, or a folder (an existing one, a path "
                        "ending in / or one without a suffix) of annotated images")  # fmt: skip
    p.add_argument(
        "--save-fps",
        type=_positive_float,
        metavar="F",
        help="frame rate of the --save video (default: the video file's own, else --max-fps, else 30)",
    )
    p.add_argument("--show", action="store_true", help="show the annotated frames in a window (cv2.imshow; q or Esc stops)")
    p.add_argument("--jsonl", metavar="FILE", help="write one JSON object per processed frame to FILE ('-': standard output)")
    p.add_argument(
        "--max-fps",
        type=_positive_float,
        metavar="N",
        help="rate limit: a file or folder is read no faster, a live source's extra frames are dropped (reason rate_limit)",
    )
    p.add_argument("--max-frames", type=_positive_int, metavar="N", help="read at most N frames from the source, then finish")
    p.add_argument(
        "--drop-policy",
        choices=DROP_POLICIES,
        help="what a full queue does to a new frame (default: latest for live sources, block for files and folders)",
    )
    p.add_argument("--queue-size", type=_positive_int, default=8, metavar="N", help="frames the queue before inference holds (default 8)")
    p.add_argument("--workers", type=_positive_int, default=1, metavar="N", help="inference threads (default 1)")
    p.add_argument("--top-k", type=_positive_int, metavar="K", help="classes per classification result (default: the package's)")
    p.add_argument("--conf", type=_unit_float, default=0.0, metavar="T",
                   help="leave detections scoring under T out of the drawing and the JSON lines, and classes under T out of the drawing "
                        "(default 0: the package's own threshold alone)")  # fmt: skip
    p.add_argument("--no-labels", dest="labels", action="store_false", help="draw no class names (nor the segmentation legend)")
    p.add_argument("--no-scores", dest="scores", action="store_false", help="draw no scores")
    p.add_argument("--no-masks", dest="masks", action="store_false", help="do not blend segmentation masks")
    p.add_argument("--no-keypoints", dest="keypoints", action="store_false", help="draw no keypoints")
    p.add_argument("--governor", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the device's thermal/power budget: a governor samples the sensors and lowers the rate, picks a lighter "
                        "variant or pauses (default on; docs/budgets.md)")  # fmt: skip
    p.add_argument("--unknown-readings", choices=_UNKNOWN_POLICIES, default="degrade",
                   help="what the governor makes of a temperature or power it cannot read: degrade (count it as hot, the default), "
                        "hold, ignore")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no live status line (the summary at the end is still printed)")
    add_device_arguments(p)
    add_load_arguments(p)


def _source_arg(s: str) -> str | int:
    """A camera index for a string of digits ("0"), else the string (a path, URI or pipeline)."""
    return int(s) if s.isdigit() else s


# ----------------------------------------------------------------------------------------------
# records and sinks


def frame_record(fr: FrameResult, conf: float = 0.0) -> dict[str, Any]:
    """The JSON object ``--jsonl`` writes for one frame: ``index``, ``timestamp_ms`` (capture,
    monotonic), ``source_timestamp_ms`` (the video's position; None for cameras), ``latency_ms``
    (capture to result), ``budget_state`` (the governor's state, None without one), then the
    result's :meth:`~edge_sdk.model.Result.to_dict` (model, version, variant, backend, sha256,
    ``timings_ms``, provenance, and ``classes``, ``detections`` or the segmentation summary);
    detections scoring under ``conf`` are left out. For a raw model ``outputs`` gives each
    output's shape and dtype (not its values)."""
    from ..processing.detection import Detections

    r = fr.result
    raw = getattr(r, "decoded", None) is None
    d: dict[str, Any] = r._replace(outputs={}).to_dict() if raw and hasattr(r, "_replace") else r.to_dict()
    if raw:
        d["outputs"] = {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in r.outputs.items()}
    dec = getattr(r, "decoded", None)
    if conf > 0 and isinstance(dec, Detections):
        d.update(dec[dec.scores >= conf].to_dict())
    src_ts = fr.frame.source_timestamp_ms
    return {
        "index": fr.index,
        "timestamp_ms": fr.timestamp_ms,
        "source_timestamp_ms": src_ts if src_ts is not None and math.isfinite(src_ts) else None,
        "latency_ms": fr.latency_ms,
        "budget_state": fr.budget_state,
        **d,
    }


class _JsonLines(Sink):
    """:func:`frame_record` per frame, one per line, flushed per line; ``-`` is standard output."""

    def __init__(self, target: str, conf: float) -> None:
        super().__init__()
        self.target, self.conf, self.lines = target, conf, 0
        self._f: IO[str] | None = None

    def _open(self) -> None:
        if self.target == "-":
            self._f = sys.stdout
            return
        try:
            self._f = open(self.target, "w", encoding="utf-8")
        except OSError as e:
            raise SinkError(f"--jsonl: cannot open {self.target!r} for writing: {e}") from e

    def _write(self, fr: FrameResult) -> None:
        assert self._f is not None  # opened before the first write
        self._f.write(json.dumps(frame_record(fr, self.conf), allow_nan=False) + "\n")
        self._f.flush()
        self.lines += 1

    def _close(self) -> None:
        f, self._f = self._f, None
        if f is not None and f is not sys.stdout:
            f.close()


class _DrawnVideo(AnnotatedVideoSink):
    """AnnotatedVideoSink with :func:`edge_sdk.processing.draw.draw` as its annotation."""

    def __init__(self, path: Path, fps: float, fourcc: str, draw_kw: dict[str, Any]) -> None:
        super().__init__(path, fps, fourcc=fourcc)
        self._draw_kw = draw_kw

    def _annotate(self, img: np.ndarray, fr: FrameResult) -> None:
        from ..processing.draw import draw

        img[...] = draw(img, fr.result, **self._draw_kw)  # the sink hands over its own BGR copy


class _DrawnFolder(Sink):
    """Each annotated frame as an image in ``folder``: the source file's name for an image folder,
    ``frame_NNNNNN.jpg`` otherwise."""

    def __init__(self, folder: Path, names: Callable[[int], str], draw_kw: dict[str, Any]) -> None:
        super().__init__()
        self.folder, self._names, self._draw_kw = folder, names, draw_kw
        self.written = 0

    def _open(self) -> None:
        self._cv = require_cv2("--save to a folder")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SinkError(f"--save: cannot create the folder {str(self.folder)!r}: {e}") from e

    def _write(self, fr: FrameResult) -> None:
        path = self.folder / self._names(fr.index)
        if not self._cv.imwrite(str(path), fr.draw(**self._draw_kw)):
            raise SinkError(f"--save: OpenCV could not write {str(path)!r}")
        self.written += 1


class _Display:
    """``--show``: the output thread hands the newest annotated frame over; the main thread shows it."""

    WINDOW = "edge-sdk run"

    def __init__(self, draw_kw: dict[str, Any]) -> None:
        self._cv = _check_display()
        self._draw_kw = draw_kw
        self._lock = threading.Lock()
        self._latest: np.ndarray | None = None
        self._opened = False

    def offer(self, fr: FrameResult) -> None:
        img = fr.draw(**self._draw_kw)
        with self._lock:
            self._latest = img

    def pump(self) -> bool:
        """Show the newest frame and handle window events; True when the user asked to stop."""
        cv2 = self._cv
        with self._lock:
            img, self._latest = self._latest, None
        if img is not None:
            cv2.imshow(self.WINDOW, img)
            self._opened = True
        if not self._opened:
            return False
        key = cv2.waitKey(1) & 0xFF
        if key in (27, ord("q")):
            return True
        try:
            return bool(cv2.getWindowProperty(self.WINDOW, cv2.WND_PROP_VISIBLE) < 1)  # closed with the mouse
        except Exception:  # cv2.error on backends without the property
            return False

    def close(self) -> None:
        if self._opened:
            try:
                self._cv.destroyWindow(self.WINDOW)
                self._cv.waitKey(1)
            except Exception:  # the window is gone already
                pass


def _check_display() -> Any:
    """cv2, or DisplayUnavailableError saying why no window can be opened."""
    cv2 = require_cv2("--show")
    try:
        info = cv2.getBuildInformation()
    except Exception:
        info = ""
    gui = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.strip().startswith("GUI:")), None)
    if gui is not None and gui.upper() in ("NONE", "NO", ""):
        raise DisplayUnavailableError(f"{_SHOW_NEEDS}: this OpenCV {cv2.__version__} was built without a GUI backend (GUI: {gui})")
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise DisplayUnavailableError(f"{_SHOW_NEEDS}: there is no display ($DISPLAY and $WAYLAND_DISPLAY are unset)")
    try:
        cv2.namedWindow(_Display.WINDOW, cv2.WINDOW_NORMAL)
    except Exception as e:  # cv2.error: no GUI backend after all, or the display refused
        raise DisplayUnavailableError(f"{_SHOW_NEEDS}: cv2.namedWindow failed: {e}") from e
    return cv2


class _FirstFrames(FrameSource):
    """The first ``limit`` items (frames and drops) of ``inner``, then the end (``--max-frames``)."""

    def __init__(self, inner: FrameSource, limit: int) -> None:
        super().__init__(inner.name, color=inner.color, live=inner.live)
        self.inner, self.limit, self._taken = inner, limit, 0

    def _open(self) -> None:
        self.inner.open()

    def _read(self) -> Capture | None:
        if self._taken >= self.limit:
            return None
        item = self.inner.read()
        if item is None:
            return None
        self._taken += 1
        if isinstance(item, FrameDrop):
            return Capture.dropped(item.reason, item.detail)
        return Capture(item.image, item.source_timestamp_ms)

    def interrupt(self) -> None:
        """Interrupt this source and the one it reads."""
        super().interrupt()
        self.inner.interrupt()

    def _close(self) -> None:
        self.inner.close()


# ----------------------------------------------------------------------------------------------
# the status line


class _Status:
    """The live status line on ``stream``: redrawn in place on a terminal (every 0.25 s), one line
    a second otherwise. ``message`` prints a line of its own (any thread) above it."""

    def __init__(self, stream: IO[str], enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.period_s = 0.25 if self.tty else 1.0
        self._lock = threading.Lock()
        self._shown = False  # a status line is on the terminal's last row
        self._next = time.monotonic() + self.period_s

    def due(self) -> bool:
        return self.enabled and time.monotonic() >= self._next

    def update(self, text: str) -> None:
        self._next = time.monotonic() + self.period_s
        with self._lock:
            if self.tty:
                self.stream.write("\r" + text + "\x1b[K")
                self._shown = True
            else:
                self.stream.write(text + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        with self._lock:
            self.stream.write(("\r\x1b[K" if self._shown else "") + text + "\n")
            self._shown = False
            self.stream.flush()

    def clear(self) -> None:
        with self._lock:
            if self._shown:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._shown = False


def _drops_text(c: PipelineCounters) -> str:
    drops = {k: v for k, v in c.dropped.items() if v}
    return f"dropped {c.dropped_total}" + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(drops.items())) + ")" if drops else "")


def _status_text(c: PipelineCounters, fps: float | None, gov: Any, elapsed_s: float) -> str:
    g = "off" if gov is None else gov.state.value + (f" [{', '.join(a.name for a in gov.applied)}]" if gov.applied else "")
    f = "   -" if fps is None else f"{fps:5.1f}"
    return f"{elapsed_s:6.1f} s  {f} fps  processed {c.processed}  {_drops_text(c)}  in flight {c.in_flight}  governor {g}"


class _Rate:
    """Frames per second over the last ``window_s`` from (time, processed) samples."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, t: float, n: int) -> float | None:
        s = self._samples
        s.append((t, n))
        while len(s) > 2 and t - s[1][0] >= self.window_s:
            s.popleft()
        (t0, n0) = s[0]
        return (n - n0) / (t - t0) if t - t0 > 0.05 else None


# ----------------------------------------------------------------------------------------------
# the command


def _save_target(save: str) -> tuple[str, Path, str | None]:
    """("video", path, fourcc) or ("folder", path, None) for ``--save``; OptionsError otherwise."""
    p = Path(save).expanduser()
    if p.is_dir() or save.endswith(("/", os.sep)) or not p.suffix:
        if p.exists() and not p.is_dir():
            raise OptionsError(f"--save: {str(p)!r} exists and is not a folder")
        return "folder", p, None
    fourcc = VIDEO_FOURCC.get(p.suffix.lower())
    if fourcc is None:
        raise OptionsError(f"--save: expected a .mp4 or .avi video file or a folder, got {save!r} (suffix {p.suffix!r})")
    return "video", p, fourcc


def _file_fps(src: FrameSource) -> float | None:
    """The frame rate a video file declares (probed with its own cv2.VideoCapture), else None."""
    if not isinstance(src, OpenCVSource) or src.live or src.device or not isinstance(src.target, str) or "://" in src.target:
        return None
    cv2 = require_cv2("--save")
    cap = cv2.VideoCapture(src.target)
    try:
        fps = float(cap.get(cv2.CAP_PROP_FPS)) if cap.isOpened() else 0.0
    finally:
        cap.release()
    return fps if math.isfinite(fps) and 0 < fps <= 1000 else None


def _frame_names(src: FrameSource, out: Path) -> Callable[[int], str]:
    """File names for ``--save DIR``: an image folder's own names, else ``frame_NNNNNN.jpg``."""
    base = src.inner if isinstance(src, _FirstFrames) else src
    if isinstance(base, ImageFolderSource):
        folder = base.path if base.path.is_dir() else base.path.parent
        if out.resolve() == folder.resolve():
            raise OptionsError(f"--save: {str(out)!r} is the source folder; the annotated images would replace the originals")
        paths = base.paths

        def name(i: int) -> str:
            p = paths[i]
            suffix = p.suffix.lower()
            return p.name if suffix in _WRITABLE_IMAGES else p.stem + ".png"

        return name
    return lambda i: f"frame_{i:06d}.jpg"


def _summary(c: PipelineCounters, elapsed_s: float, src: str, variants: collections.Counter[str], extra: list[str]) -> list[str]:
    rate = f"{c.processed / elapsed_s:.1f} fps over {elapsed_s:.2f} s" if elapsed_s > 0 else ""
    out = [
        f"edge-sdk run: {c.frames_in} frames from {src!r}: processed {c.processed}, {_drops_text(c)}, in flight {c.in_flight}; {rate}",
        f"summary: {c}",
    ]
    if variants:
        out.append("variants: " + ", ".join(f"{v} ({n} frames)" for v, n in variants.most_common()))
    if c.sink_errors:
        out.append(f"sink errors: {c.sink_errors}")
    return out + extra


def run(args: argparse.Namespace) -> int:
    """``edge-sdk run``: run the package over the source with the sinks the options ask for and
    print the accounting; returns the exit status (see the module docs)."""
    from ..model import load_model

    err = sys.stderr
    draw_kw = {"labels": args.labels, "scores": args.scores, "masks": args.masks, "keypoints": args.keypoints, "conf": args.conf}
    save = _save_target(args.save) if args.save else None
    display = _Display(draw_kw) if args.show else None  # fails before anything is loaded
    status = _Status(err, enabled=not args.quiet)
    source: FrameSource = source_from_uri(_source_arg(args.source), SourceOptions())
    if args.max_frames is not None:
        source = _FirstFrames(source, args.max_frames)
    sinks: list[Sink | Callable[[FrameResult], Any]] = []
    closers: list[Sink] = []
    variants: collections.Counter[str] = collections.Counter()
    errors = [0]

    def on_error(exc: BaseException, frame: Any) -> None:
        errors[0] += 1
        if errors[0] <= _MAX_ERROR_LINES:
            where = "" if frame is None else f"frame {frame.index}: "
            status.message(f"edge-sdk run: {where}{type(exc).__name__}: {exc}")
        if errors[0] == _MAX_ERROR_LINES:
            status.message("edge-sdk run: further errors are counted in the summary only")

    gov: Any = None
    pipe: VisionPipeline | None = None
    interrupted = False
    old_term: Any = None
    try:
        source.open()  # a camera that cannot be opened or an unreadable video fails here, before the model loads
        if save is not None:
            kind, path, fourcc = save
            if kind == "video":
                assert fourcc is not None  # _save_target gives a video its fourcc
                if not path.parent.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                fps = args.save_fps or _file_fps(source.inner if isinstance(source, _FirstFrames) else source) or args.max_fps or 30.0
                closers.append(_DrawnVideo(path, fps, fourcc, draw_kw))
            else:
                closers.append(_DrawnFolder(path, _frame_names(source, path), draw_kw))
        if args.jsonl:
            closers.append(_JsonLines(args.jsonl, args.conf))
        with load_model(args.package, args.profile, **load_kwargs(args)) as model:
            sinks.append(lambda fr: variants.update((fr.result.variant_id,)))
            sinks += closers
            if display is not None:
                sinks.append(display.offer)
            opts = PipelineOptions(
                drop_policy=args.drop_policy, queue_size=args.queue_size, max_fps=args.max_fps, workers=args.workers, top_k=args.top_k
            )
            pipe = VisionPipeline(model, source, opts, sinks=sinks, on_error=on_error)
            if args.governor:
                from ..budget.governor import Budget, Governor
                from ..budget.sensors import SensorReader

                profile = model.detection.profile
                budget = Budget.from_profile(profile, unknown_policy=args.unknown_readings)
                gov = Governor(SensorReader(profile, args.root).read, budget, pipelines=[pipe])
                pipe.governor = gov
                lines = _GovernorLines()
                gov.subscribe(lambda ev: status.message(lines(ev)))
            status.message(
                f"edge-sdk run: {model.manifest.name} {model.manifest.version} ({model.variant.id} on {model.session.info.backend}) "
                f"on {source.name!r}" + ("" if gov is None else f"; governor on ({model.detection.profile.name})")
            )
            old_term = _sigterm_as_interrupt()
            t0 = time.monotonic()
            rate = _Rate()
            try:
                pipe.start()
                if gov is not None:
                    gov.start()  # after the pipeline: the ladder acts on a running one
                tick = 0.03 if display is not None else 0.1
                showing = display is not None
                while not pipe.join(tick):
                    if showing and display is not None and display.pump():
                        status.message("edge-sdk run: stop asked in the window; stopping")
                        pipe.stop("discard")
                        showing = False
                    if status.due():
                        now = time.monotonic()
                        c = pipe.counters()
                        status.update(_status_text(c, rate.add(now, c.processed), gov, now - t0))
            except BaseException as e:  # Ctrl-C, SIGTERM, or a failure here: the pipeline stops either way
                interrupted = isinstance(e, KeyboardInterrupt)
                if interrupted:
                    status.message("edge-sdk run: interrupted; stopping (frames not yet inferred are discarded)")
                pipe.stop("discard")
                pipe.join(opts.join_timeout_s)
                if not interrupted:
                    raise
            finally:
                elapsed = time.monotonic() - t0
                if gov is not None:  # the ladder's steps undone (a lighter model closed) before the model closes
                    gov.stop()
                    gov.restore("edge-sdk run finished")
                status.clear()
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if display is not None:
            display.close()
        for s in closers:
            try:
                s.close()
            except Exception as e:  # finishing a file can fail (disk full): say so, go on closing
                print(f"edge-sdk run: closing {type(s).__name__}: {type(e).__name__}: {e}", file=err)
        if pipe is None:
            source.close()
    c = pipe.counters()
    extra = []
    for s in closers:
        if isinstance(s, _DrawnVideo):
            extra.append(f"saved: {s.path} ({s.frames_written} frames, {s.fourcc}, {s.fps:g} fps)")
        elif isinstance(s, _DrawnFolder):
            extra.append(f"saved: {s.folder}/ ({s.written} images)")
        elif isinstance(s, _JsonLines):
            extra.append(f"jsonl: {'standard output' if s.target == '-' else s.target} ({s.lines} lines)")
    if gov is not None:
        extra.append(f"governor: {gov.state.value} at the end; events {sum(1 for _ in gov.events)}")
    for line in _summary(c, elapsed, source.name, variants, extra):
        print(line, file=err)
    failure = pipe.error
    if failure is not None and not isinstance(failure, Exception):
        raise failure  # a fatal BaseException from a stage (SystemExit from a sink ...)
    if failure is not None:
        print(f"edge-sdk run: the source failed: {type(failure).__name__}: {failure}", file=err)
        return 1
    if c.processed == 0:
        why = "; ".join(f"{k} {v}" for k, v in c.dropped.items() if v) or "the source gave no frame"
        print(f"edge-sdk run: no frame was processed ({why})" + (" before the interrupt" if interrupted else ""), file=err)
        return 1
    return 0


class _GovernorLines:
    """One line per governor event; its reason (why the governor is in its state: often a long sensor account)
    is left out when it only repeats the last one printed, so a step of the ladder reads as one short line."""

    def __init__(self) -> None:
        self._last_reason: str | None = None

    def __call__(self, ev: Any) -> str:
        what = ev.kind if ev.action is None else f"{ev.kind} {ev.action}"
        detail = f": {ev.detail}" if ev.detail else ""
        if self._last_reason and self._last_reason in ev.reason:  # an action names the state and the reason already shown
            return f"governor: {what}{detail}"
        self._last_reason = ev.reason
        return f"governor: {what}{detail} ({ev.reason})"


def _sigterm_as_interrupt() -> Any:
    """Make SIGTERM stop the run like Ctrl-C (a service manager's stop); returns the old handler,
    or None when this is not the main thread (signals can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
