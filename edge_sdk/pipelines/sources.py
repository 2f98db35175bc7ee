"""Frame sources: cameras, video files, image folders, network streams, test frames.

A source is picked from a table by URI (the jetson-utils ``videoSource`` scheme set)::

    source_from_uri("clip.mp4")                   # or file://clip.mp4  -> OpenCV, not live
    source_from_uri("shots/")                     # or file://shots/    -> image folder, not live
    source_from_uri(0)                            # or v4l2:///dev/video0 -> OpenCV device, live
    source_from_uri("rtsp://cam.local:8554/s")    # http(s):// too -> OpenCV + reconnect, live
    source_from_uri("csi://0")                    # Jetson nvarguscamerasrc -> CAP_GSTREAMER, live
    source_from_uri("videotestsrc ! videoconvert ! appsink")  # raw GStreamer (" ! ")
    source_from_uri("picamera2://0")              # Raspberry Pi camera (apt python3-picamera2)
    source_from_uri("synthetic://320x240?fps=30&frames=100")  # generated test pattern

    with source_from_uri("clip.mp4") as src:      # open() ... close()
        for item in src:                          # Frame, or FrameDrop (e.g. "decode_error")
            ...

Every source is a :class:`FrameSource`: public ``open()`` / ``read()`` / ``close()`` own the
state (NEW -> OPEN -> CLOSED) and the lock; implementations fill ``_open`` / ``_read`` /
``_close``. ``read()`` returns a :class:`Frame`, a :class:`FrameDrop` (the source produced
something that is not a usable frame: an undecodable file, an invalid array), or ``None`` at the
end of the stream. Frame indices count every item in source order, drops included.

Timestamps: ``Frame.timestamp_ms`` is taken from ``time.monotonic_ns`` when the frame is read,
in milliseconds (float), and is strictly increasing per source even when two reads land on the
same clock tick. The source's own timestamp (video position, sensor time), which may repeat or go
backwards, is kept as ``source_timestamp_ms`` (None when the source has none).

Hardware is reached through two seams that tests replace: ``capture_factory(target,
api_preference, params)`` (default ``cv2.VideoCapture``) and ``camera_factory(camera_num)``
(default ``picamera2.Picamera2``). OpenCV and picamera2 are imported when a source opens, never at
import time.
"""

from __future__ import annotations

import enum
import math
import os
import re
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence
from urllib.parse import parse_qs, unquote

import numpy as np

from .._deps import require_cv2
from ..errors import EdgeSDKError, ImageError, MissingDependencyError, OptionsError, OptionsTypeError
from ..package.archive import file_kind
from ..processing.image import MAX_IMAGE_FILE_BYTES, MAX_IMAGE_PIXELS, decode_image_bgr, read_image_file
from .errors import InvalidFrameError, SourceClosedError, SourceError, UnknownSourceError

__all__ = [
    "Backoff",
    "Capture",
    "Frame",
    "FrameDrop",
    "FrameSource",
    "GStreamerSource",
    "ImageFolderSource",
    "NetworkSource",
    "OpenCVSource",
    "Picamera2Source",
    "SourceEvent",
    "SourceOptions",
    "SourceState",
    "SyntheticSource",
    "csi_pipeline",
    "source_from_uri",
]

COLORS = ("BGR", "RGB", "GRAY")
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm", ".pbm"})
_PICAMERA2_INSTALL = (
    "picamera2:// needs the picamera2 library (libcamera), which is installed with apt, not pip: "
    "sudo apt install python3-picamera2; a virtual environment only sees it when created with "
    "python3 -m venv --system-site-packages"
)


def _cv2() -> Any:
    return require_cv2("video and image sources")


def _now_ms() -> float:
    return time.monotonic_ns() / 1e6


# ----------------------------------------------------------------------------------------------
# values


def _checked_image(image: object) -> np.ndarray:
    """The frame image contract: HxWx3 or HxWx1 uint8 (HxW becomes HxWx1), both sides >= 1.
    Returns a read-only view (the caller's array keeps its own flags). Nothing is cast."""
    if not isinstance(image, np.ndarray):
        raise InvalidFrameError(f"expected a frame as a numpy uint8 array HxWx3, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise InvalidFrameError(
            f"expected frame dtype uint8, got {image.dtype} with shape {image.shape}; nothing is cast "
            "(convert with np.clip(x * 255, 0, 255).astype(np.uint8) if it holds [0, 1] floats)"
        )
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3):
        hint = " (BGRA: drop alpha with cv2.cvtColor(img, cv2.COLOR_BGRA2BGR))" if image.ndim == 3 and image.shape[2] == 4 else ""
        raise InvalidFrameError(f"expected a frame of shape HxWx3, HxWx1 or HxW, got {image.shape}{hint}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InvalidFrameError(f"frame has an empty side: shape {image.shape}")
    view: np.ndarray = image.view()
    view.flags.writeable = False
    return view


@dataclass(frozen=True, slots=True, eq=False)
class Frame:
    """One image from a source (immutable; the image is a read-only view).

    ``index``: position in the source, counting drops. ``image``: HxWx3 (``color`` "BGR" or "RGB")
    or HxWx1 ("GRAY") uint8. ``timestamp_ms``: monotonic clock at read, strictly increasing per
    source. ``source_timestamp_ms``: the source's own time (video position, sensor time) or None.
    ``source``: the source's name. Raises InvalidFrameError for an image outside that contract.
    """

    index: int
    image: np.ndarray
    color: str
    timestamp_ms: float
    source_timestamp_ms: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        img = _checked_image(self.image)
        object.__setattr__(self, "image", img)
        if self.color not in COLORS:
            raise InvalidFrameError(f"color: expected one of {COLORS}, got {self.color!r}")
        if (img.shape[2] == 1) != (self.color == "GRAY"):
            raise InvalidFrameError(f"color {self.color!r} does not fit a frame with {img.shape[2]} channel(s)")

    @property
    def size_wh(self) -> tuple[int, int]:
        """(width, height) of the image in pixels."""
        return int(self.image.shape[1]), int(self.image.shape[0])

    def __repr__(self) -> str:
        w, h = self.size_wh
        return f"Frame(index={self.index}, {w}x{h} {self.color}, timestamp_ms={self.timestamp_ms:.3f}, source={self.source!r})"


@dataclass(frozen=True, slots=True)
class FrameDrop:
    """A frame that will not be processed, and why.

    ``reason``: "decode_error" (an image file OpenCV cannot decode), "invalid_frame" (an array
    outside the frame contract), or, from a pipeline, "queue_full", "evicted", "rate_limit",
    "error", "shutdown". ``detail``: a human-readable message. ``timestamp_ms``: when it was dropped
    (a source drop: when it was read), monotonic clock.
    """

    index: int
    reason: str
    detail: str
    timestamp_ms: float
    source: str = ""


class Capture(NamedTuple):
    """What a source implementation's ``_read`` hook returns for one item.

    Either an ``image`` (validated by ``read()``; an invalid one becomes an "invalid_frame"
    drop) with an optional ``source_timestamp_ms``, or a ``drop_reason`` and ``detail``."""

    image: Any
    source_timestamp_ms: float | None = None
    drop_reason: str | None = None
    detail: str = ""

    @classmethod
    def dropped(cls, reason: str, detail: str) -> "Capture":
        """A capture that is a drop with ``reason`` and ``detail`` (no image)."""
        return cls(None, None, reason, detail)


@dataclass(frozen=True, slots=True)
class SourceEvent:
    """Something that happened to a source (kept in ``FrameSource.events()``, passed to ``on_event``).

    ``kind``: "opened", "reconnecting" (``attempt`` 1.., ``delay_s`` before it, ``reason`` for
    it), "reconnected", "gave_up", "ended" (``reason``), "closed". ``timestamp_ms``: monotonic.
    """

    kind: str
    source: str
    timestamp_ms: float
    reason: str = ""
    attempt: int = 0
    delay_s: float = 0.0


@dataclass(frozen=True)
class Backoff:
    """Reconnect policy of network sources: exponential backoff, bounded.

    Attempt ``n`` (1-based) waits ``min(initial_delay_s * multiplier ** (n - 1), max_delay_s)``
    seconds first; after ``max_attempts`` failed attempts the source raises SourceError."""

    max_attempts: int = 6
    initial_delay_s: float = 0.5
    max_delay_s: float = 8.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 0:
            raise OptionsError(f"max_attempts: expected an int >= 0, got {self.max_attempts!r}")
        for name in ("initial_delay_s", "max_delay_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise OptionsError(f"{name}: expected a finite number >= 0, got {v!r}")
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1):
            raise OptionsError(f"multiplier: expected a number >= 1, got {self.multiplier!r}")
        if self.max_delay_s < self.initial_delay_s:
            raise OptionsError(f"max_delay_s ({self.max_delay_s}) must be >= initial_delay_s ({self.initial_delay_s})")

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (1-based): ``initial_delay_s * multiplier ** (attempt - 1)``, at most
        ``max_delay_s``."""
        return float(min(self.initial_delay_s * self.multiplier ** (attempt - 1), self.max_delay_s))


@dataclass(frozen=True)
class SourceOptions:
    """Capture settings for :func:`source_from_uri`.

    ``size_wh`` / ``fps``: what to ask a camera for (devices, csi://, picamera2://; csi defaults
    to 1280x720 at 30). ``flip_method``: nvvidconv flip-method for csi:// (0-7).
    ``reconnect``: the network sources' :class:`Backoff`. ``network_timeout_ms``: OpenCV's open and
    read timeouts for network streams (so a stalled stream becomes a reconnect, not a hang).
    ``live``: override whether the source counts as live (pipelines drop on live sources and
    back-pressure the others).
    """

    size_wh: tuple[int, int] | None = None
    fps: float | None = None
    flip_method: int = 0
    reconnect: Backoff = field(default_factory=Backoff)
    network_timeout_ms: int = 5000
    live: bool | None = None

    def __post_init__(self) -> None:
        if self.size_wh is not None:
            if len(self.size_wh) != 2 or not all(isinstance(v, int) and v > 0 for v in self.size_wh):
                raise OptionsError(f"size_wh: expected (width, height) positive ints, got {self.size_wh!r}")
        if self.fps is not None and not (isinstance(self.fps, (int, float)) and math.isfinite(self.fps) and self.fps > 0):
            raise OptionsError(f"fps: expected a number > 0, got {self.fps!r}")
        if self.flip_method not in range(8):
            raise OptionsError(f"flip_method: expected 0..7, got {self.flip_method!r}")
        if not isinstance(self.reconnect, Backoff):
            raise OptionsTypeError(f"reconnect: expected a Backoff, got {type(self.reconnect).__name__}")
        if not isinstance(self.network_timeout_ms, int) or self.network_timeout_ms <= 0:
            raise OptionsError(f"network_timeout_ms: expected an int > 0, got {self.network_timeout_ms!r}")


class SourceState(str, enum.Enum):
    """A source's lifecycle: NEW -> OPEN -> CLOSED (a source opens once)."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


# ----------------------------------------------------------------------------------------------
# the base class


class FrameSource:
    """Base of every source. Public methods own the state and the lock; subclasses fill
    ``_open()``, ``_read() -> Capture | None`` and ``_close()``.

    ``open()`` is a no-op on an open source; a closed source cannot be reopened (make a new one).
    ``read()`` raises SourceClosedError unless open, and blocks until the next item (a camera:
    one frame period). ``close()`` is idempotent and waits for a ``read()`` in progress;
    ``interrupt()`` (any thread, never blocks) makes waits inside ``read()`` (pacing, reconnect
    backoff) end at once, after which ``read()`` returns None. ``live`` sources deliver frames
    at their own pace (cameras, streams); the others can be read as slowly as needed.
    Iterating yields items until the end. Not for use from several reader threads at once
    (reads are serialised).
    """

    def __init__(
        self,
        name: str,
        *,
        color: str = "BGR",
        live: bool = False,
        on_event: Callable[[SourceEvent], None] | None = None,
    ) -> None:
        if color not in ("BGR", "RGB"):
            raise OptionsError(f"color: expected 'BGR' or 'RGB' (grey frames are detected), got {color!r}")
        self.name = name
        self.color = color
        self.live = bool(live)
        self._on_event = on_event
        self._state = SourceState.NEW
        self._lock = threading.Lock()
        self._interrupt = threading.Event()
        self._events: deque[SourceEvent] = deque(maxlen=256)
        self._index = 0
        self._last_ts_ms = -math.inf

    # -- public ----------------------------------------------------------------------------

    @property
    def state(self) -> SourceState:
        """NEW, OPEN or CLOSED."""
        return self._state

    def open(self) -> "FrameSource":
        """Open the source (a no-op if open); returns self. :class:`~edge_sdk.pipelines.errors.SourceClosedError` if it was closed;
        :class:`~edge_sdk.pipelines.errors.SourceError` if it cannot be opened."""
        with self._lock:
            if self._state is SourceState.OPEN:
                return self
            if self._state is SourceState.CLOSED:
                raise SourceClosedError(f"source {self.name!r} is closed; a source opens once, make a new one")
            try:
                self._open()
            except EdgeSDKError:
                raise
            except Exception as e:  # foreign errors translated at the seam
                raise SourceError(f"source {self.name!r} could not be opened: {e}") from e
            self._state = SourceState.OPEN
        self._emit("opened")
        return self

    def read(self) -> Frame | FrameDrop | None:
        """The next item: a :class:`Frame`, a :class:`FrameDrop` (with its reason, e.g. an invalid image) or None at the end of the
        source. Each gets the next index and a timestamp. :class:`~edge_sdk.pipelines.errors.SourceClosedError` if the source is not
        open."""
        with self._lock:
            if self._state is not SourceState.OPEN:
                raise SourceClosedError(f"source {self.name!r} is {self._state.value}; read() needs an open source")
            cap = self._read()
            if cap is None:
                return None
            ts = self._next_timestamp_ms()
            idx = self._index
            self._index += 1
        if cap.drop_reason is not None:
            return FrameDrop(idx, cap.drop_reason, cap.detail, ts, self.name)
        img = cap.image
        color = "GRAY" if isinstance(img, np.ndarray) and (img.ndim == 2 or (img.ndim == 3 and img.shape[2] == 1)) else self.color
        try:
            return Frame(idx, img, color, ts, cap.source_timestamp_ms, self.name)
        except InvalidFrameError as e:
            return FrameDrop(idx, "invalid_frame", f"frame {idx}: {e}", ts, self.name)

    def interrupt(self) -> None:
        """End the waits inside ``read()`` (pacing, reconnect backoff) at once; ``read()`` then returns None. Any thread, never
        blocks; the pipeline's ``stop()`` calls it."""
        self._interrupt.set()

    def close(self) -> None:
        """Interrupt any wait, then close the source (waiting for a ``read()`` in progress, and releasing the device or stream if it
        was open); idempotent. A closed source cannot be opened again."""
        self._interrupt.set()
        with self._lock:
            if self._state is SourceState.CLOSED:
                return
            was_open = self._state is SourceState.OPEN
            self._state = SourceState.CLOSED
            if was_open:
                self._close()
        self._emit("closed")

    def events(self) -> tuple[SourceEvent, ...]:
        """The latest events (up to 256), oldest first."""
        return tuple(self._events)

    def __enter__(self) -> "FrameSource":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Frame | FrameDrop]:
        while (item := self.read()) is not None:
            yield item

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self._state.value}, live={self.live})"

    # -- for subclasses ------------------------------------------------------------------------

    def _open(self) -> None:  # pragma: no cover - trivial default
        pass

    def _read(self) -> Capture | None:
        raise NotImplementedError

    def _close(self) -> None:  # pragma: no cover - trivial default
        pass

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; False when interrupted."""
        if seconds <= 0:
            return not self._interrupt.is_set()
        return not self._interrupt.wait(seconds)

    def _emit(self, kind: str, **fields: Any) -> None:
        ev = SourceEvent(kind, self.name, _now_ms(), **fields)
        self._events.append(ev)
        if self._on_event is not None:
            self._on_event(ev)

    def _next_timestamp_ms(self) -> float:
        ts = _now_ms()
        if ts <= self._last_ts_ms:  # same clock tick: keep strictly increasing (1 us step)
            ts = self._last_ts_ms + 0.001
        self._last_ts_ms = ts
        return ts


# ----------------------------------------------------------------------------------------------
# OpenCV captures: files, devices, GStreamer, network

CaptureFactory = Callable[[Any, int, Sequence[int]], Any]
"""``(target, api_preference, params) -> capture`` with cv2.VideoCapture's isOpened/read/get/set/release."""


def _default_capture_factory(target: Any, api: int, params: Sequence[int]) -> Any:
    cv2 = _cv2()
    return cv2.VideoCapture(target, api, list(params))


_APIS = {"any": "CAP_ANY", "v4l2": "CAP_V4L2", "gstreamer": "CAP_GSTREAMER", "ffmpeg": "CAP_FFMPEG"}


def _gstreamer_in_build(cv2: Any) -> bool | None:
    try:
        info = cv2.getBuildInformation()
    except Exception:
        return None
    m = re.search(r"GStreamer:\s*(\w+)", info)
    return None if m is None else m.group(1).upper() == "YES"


class OpenCVSource(FrameSource):
    """A ``cv2.VideoCapture``: a video file, a camera device or a GStreamer pipeline.

    ``api``: "any", "v4l2", "gstreamer" or "ffmpeg". ``device``: a camera (capture size/fps from
    ``options`` are requested, and the driver queue is cut to one buffer so frames are fresh).
    A read that returns no frame ends the stream (end of file, or a device gone: an "ended" event
    says which read failed). ``source_timestamp_ms`` is the capture position for files."""

    def __init__(
        self,
        target: str | int,
        *,
        api: str = "any",
        name: str | None = None,
        live: bool = False,
        device: bool = False,
        options: SourceOptions | None = None,
        capture_factory: CaptureFactory | None = None,
        on_event: Callable[[SourceEvent], None] | None = None,
    ) -> None:
        if api not in _APIS:
            raise OptionsError(f"api: expected one of {sorted(_APIS)}, got {api!r}")
        super().__init__(name or str(target), live=live, on_event=on_event)
        self.target = target
        self.api = api
        self.device = device
        self.options = options or SourceOptions()
        self._factory = capture_factory or _default_capture_factory
        self._cap: Any = None

    def _params(self, cv2: Any) -> list[int]:
        return []

    def _connect(self) -> Any:
        cv2 = _cv2()
        api = getattr(cv2, _APIS[self.api])
        try:
            cap = self._factory(self.target, api, self._params(cv2))
        except Exception as e:
            raise SourceError(f"OpenCV could not open {self.name!r}: {e}") from e
        if cap is None or not cap.isOpened():
            if cap is not None:
                cap.release()
            raise SourceError(self._open_failure_message(cv2))
        if self.device:
            self._configure_device(cv2, cap)
        return cap

    def _open_failure_message(self, cv2: Any) -> str:
        msg = f"OpenCV could not open {self.name!r} (api {self.api})"
        if self.api == "gstreamer" and _gstreamer_in_build(cv2) is False:
            msg += (
                "; this OpenCV build has no GStreamer support (the pip wheels are built without it): "
                "on Jetson use the JetPack OpenCV (sudo apt install python3-opencv) from a venv made with "
                "--system-site-packages"
            )
        elif isinstance(self.target, str) and not self.device and self.api in ("any", "ffmpeg") and "://" not in self.target:
            msg += "; is it a video file this OpenCV build can decode?"
        return msg

    def _configure_device(self, cv2: Any, cap: Any) -> None:
        o = self.options
        if o.size_wh is not None:
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, o.size_wh[0])
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, o.size_wh[1])
        if o.fps is not None:
            cap.set(cv2.CAP_PROP_FPS, o.fps)
        cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)  # freshest frame, not the oldest of a driver queue

    def _open(self) -> None:
        self._check_file_target()
        self._cap = self._connect()

    def _check_file_target(self) -> None:
        """A local file target (not a device, URL or pipeline) must be a regular file: OpenCV's
        open of a FIFO blocks until a writer comes, with no timeout, and a device never ends."""
        t = self.target
        if self.device or not isinstance(t, str) or self.api not in ("any", "ffmpeg") or "://" in t or " ! " in t:
            return
        kind = _nonregular_kind(Path(t))
        if kind is not None:
            raise SourceError(f"video file {t!r} is {kind}, not a regular file; refused without opening it")

    def _grab(self) -> tuple[bool, Any, str]:
        try:
            ok, img = self._cap.read()
        except Exception as e:  # cv2.error from a backend
            return False, None, f"read raised {type(e).__name__}: {e}"
        if not ok or img is None:
            return False, None, "read returned no frame"
        return True, img, ""

    def _position_ms(self) -> float | None:
        if self.live:
            return None
        try:
            v = float(self._cap.get(_cv2().CAP_PROP_POS_MSEC))
        except Exception:
            return None
        return v if math.isfinite(v) and v >= 0 else None

    def _read(self) -> Capture | None:
        ok, img, why = self._grab()
        if not ok:
            self._emit("ended", reason=why)
            return None
        return Capture(img, self._position_ms())

    def _close(self) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()


class GStreamerSource(OpenCVSource):
    """A GStreamer pipeline string opened with ``cv2.CAP_GSTREAMER`` (it must end in an appsink).
    Live unless it reads a file (``filesrc``)."""

    def __init__(self, pipeline: str, *, name: str | None = None, live: bool | None = None, **kw: Any) -> None:
        if live is None:
            live = "filesrc" not in pipeline
        super().__init__(pipeline, api="gstreamer", name=name or pipeline, live=live, **kw)


def csi_pipeline(sensor_id: int, size_wh: tuple[int, int] = (1280, 720), fps: float = 30, flip_method: int = 0) -> str:
    """The GStreamer pipeline for a Jetson CSI camera: nvarguscamerasrc (NVMM) -> nvvidconv ->
    BGR in system memory -> an appsink that keeps only the newest buffer."""
    rate = Fraction(fps).limit_denominator(1001)
    flip = f" flip-method={flip_method}" if flip_method else ""
    w, h = size_wh
    return (
        f"nvarguscamerasrc sensor-id={int(sensor_id)} ! "
        f"video/x-raw(memory:NVMM),width={w},height={h},framerate={rate.numerator}/{rate.denominator} ! "
        f"nvvidconv{flip} ! video/x-raw,format=BGRx ! videoconvert ! video/x-raw,format=BGR ! "
        "appsink drop=true max-buffers=1"
    )


class NetworkSource(OpenCVSource):
    """An RTSP/HTTP stream that reconnects.

    When opening fails or a read returns no frame, the stream is reopened after a delay from
    ``options.reconnect`` (exponential, capped), up to ``max_attempts`` attempts in a row; each
    attempt emits a "reconnecting" event with its reason, attempt number and delay, a success
    emits "reconnected", and running out emits "gave_up" and raises SourceError. A stream that
    stalls is cut by OpenCV's open/read timeouts (``options.network_timeout_ms``).
    ``sleep(seconds)`` replaces the interruptible wait (tests record the delays with it)."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        options: SourceOptions | None = None,
        capture_factory: CaptureFactory | None = None,
        sleep: Callable[[float], None] | None = None,
        on_event: Callable[[SourceEvent], None] | None = None,
        live: bool = True,
    ) -> None:
        super().__init__(url, api="ffmpeg", name=name, live=live, options=options, capture_factory=capture_factory, on_event=on_event)
        self._sleep = sleep
        self._pending: Any = None

    def _params(self, cv2: Any) -> list[int]:
        t = self.options.network_timeout_ms
        params: list[int] = []
        for prop in ("CAP_PROP_OPEN_TIMEOUT_MSEC", "CAP_PROP_READ_TIMEOUT_MSEC"):
            if hasattr(cv2, prop):
                params += [getattr(cv2, prop), t]
        return params

    def _pause(self, seconds: float) -> bool:
        if self._sleep is None:
            return self._wait(seconds)
        self._sleep(seconds)
        return not self._interrupt.is_set()

    def _recover(self, reason: str) -> bool:
        """Reconnect until a frame comes (kept in _pending). False if interrupted; SourceError when
        every attempt failed."""
        policy = self.options.reconnect
        for attempt in range(1, policy.max_attempts + 1):
            delay = policy.delay_s(attempt)
            self._emit("reconnecting", reason=reason, attempt=attempt, delay_s=delay)
            OpenCVSource._close(self)
            if not self._pause(delay):
                return False
            try:
                self._cap = self._connect()
            except SourceError as e:
                reason = f"open failed: {e}"
                continue
            ok, img, why = self._grab()
            if not ok:
                reason = f"first read after reconnect failed: {why}"
                continue
            self._pending = img
            self._emit("reconnected", attempt=attempt)
            return True
        self._emit("gave_up", reason=reason, attempt=policy.max_attempts)
        raise SourceError(f"stream {self.name!r} lost ({reason}); gave up after {policy.max_attempts} reconnect attempts")

    def _open(self) -> None:
        try:
            self._cap = self._connect()
        except SourceError as e:
            if not self._recover(f"open failed: {e}"):
                raise SourceError(f"stream {self.name!r}: interrupted while connecting") from e

    def _read(self) -> Capture | None:
        if self._pending is None:
            ok, img, why = self._grab()
            if ok:
                return Capture(img)
            if not self._recover(f"read failed: {why}"):
                return None
        img, self._pending = self._pending, None
        return Capture(img)


# ----------------------------------------------------------------------------------------------
# image folders


class ImageFolderSource(FrameSource):
    """Image files of a folder (or one image file), sorted by name, decoded to BGR with the SDK's
    bounded loader (:func:`edge_sdk.processing.image.read_image_file` and
    :func:`~edge_sdk.processing.image.decode_image_bgr`): a regular file of at most ``max_bytes``
    whose header declares at most ``max_pixels`` pixels, checked before it is read whole or
    decoded. A file that fails (truncated, not an image, over a budget, a FIFO or device, gone)
    becomes a FrameDrop with reason "decode_error" whose detail names the file and the cause; the
    source goes on with the next file. ``paths`` maps frame indices to files."""

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        on_event: Callable[[SourceEvent], None] | None = None,
        max_pixels: int = MAX_IMAGE_PIXELS,
        max_bytes: int = MAX_IMAGE_FILE_BYTES,
    ) -> None:
        super().__init__(name or str(path), live=False, on_event=on_event)
        for opt, v in (("max_pixels", max_pixels), ("max_bytes", max_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise OptionsError(f"{opt}: expected an int >= 1, got {v!r}")
        self.path = Path(path)
        self.max_pixels = max_pixels
        self.max_bytes = max_bytes
        self._paths: tuple[Path, ...] = ()
        self._next = 0

    @property
    def paths(self) -> tuple[Path, ...]:
        """The image files the source reads, in order."""
        return self._paths

    def _open(self) -> None:
        p = self.path
        if p.is_dir():
            # every entry with an image extension that is not a folder: a FIFO, device or dangling
            # link named like an image is read (and dropped with its reason), not silently skipped
            files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS and not f.is_dir())
            if not files:
                raise SourceError(f"folder {str(p)!r} holds no images (expected {', '.join(sorted(IMAGE_EXTENSIONS))})")
        elif p.is_file():
            files = [p]
        else:
            kind = _nonregular_kind(p)
            raise SourceError(
                f"image source {str(p)!r} " + ("does not exist" if kind is None else f"is {kind}, not an image file or folder")
            )
        self._cv2 = _cv2()
        self._paths = tuple(files)

    def _read(self) -> Capture | None:
        if self._next >= len(self._paths):
            return None
        f = self._paths[self._next]
        self._next += 1
        try:
            data = read_image_file(f, max_bytes=self.max_bytes, max_pixels=self.max_pixels)
            return Capture(decode_image_bgr(data, name=f.name, max_pixels=self.max_pixels))
        except ImageError as e:
            detail = str(e).replace(repr(str(f)), f.name)
            return Capture.dropped("decode_error", detail if f.name in detail else f"{f.name}: {detail}")
        except Exception as e:  # anything else a decoder raises costs this frame, not the source
            return Capture.dropped("decode_error", f"{f.name}: {type(e).__name__}: {e}")


def _nonregular_kind(p: Path) -> str | None:
    """What ``p`` is when it exists and is neither a regular file nor a folder (None otherwise)."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else f"a {file_kind(mode)}"


# ----------------------------------------------------------------------------------------------
# Raspberry Pi camera


def _picamera2_factory() -> Callable[[int], Any]:
    try:
        from picamera2 import Picamera2
    except ImportError as e:
        raise MissingDependencyError(_PICAMERA2_INSTALL) from e
    return lambda num: Picamera2(camera_num=num)


class Picamera2Source(FrameSource):
    """A Raspberry Pi camera through picamera2 (libcamera). Frames are the "main" stream in
    format RGB888, which picamera2 lays out B, G, R in memory: BGR frames. ``source_timestamp_ms``
    is the sensor timestamp. ``camera_factory(camera_num)`` replaces ``Picamera2(camera_num=...)``."""

    def __init__(
        self,
        camera_num: int = 0,
        *,
        options: SourceOptions | None = None,
        camera_factory: Callable[[int], Any] | None = None,
        name: str | None = None,
        on_event: Callable[[SourceEvent], None] | None = None,
    ) -> None:
        super().__init__(name or f"picamera2://{camera_num}", live=True, on_event=on_event)
        self.camera_num = camera_num
        self.options = options or SourceOptions()
        self._factory = camera_factory
        self._cam: Any = None

    def _open(self) -> None:
        factory = self._factory or _picamera2_factory()
        cam = factory(self.camera_num)
        try:
            controls = {"FrameRate": float(self.options.fps)} if self.options.fps else {}
            config = cam.create_video_configuration(
                main={"size": tuple(self.options.size_wh or (640, 480)), "format": "RGB888"}, controls=controls
            )
            cam.configure(config)
            cam.start()
        except Exception:
            cam.close()
            raise
        self._cam = cam

    def _read(self) -> Capture | None:
        req = self._cam.capture_request()
        try:
            img = req.make_array("main")
            meta = req.get_metadata() or {}
        finally:
            req.release()
        ts = meta.get("SensorTimestamp")
        return Capture(img, ts / 1e6 if isinstance(ts, (int, float)) else None)

    def _close(self) -> None:
        cam, self._cam = self._cam, None
        if cam is not None:
            try:
                cam.stop()
            finally:
                cam.close()


# ----------------------------------------------------------------------------------------------
# synthetic frames (tests, demos)


class SyntheticSource(FrameSource):
    """Frames from an iterable of arrays, or from ``frames(index) -> array | None`` (None ends).

    Anything is accepted as an item and checked by ``read()`` (a float or 4-channel array becomes
    an "invalid_frame" drop), so tests can feed hostile input. ``timestamps_ms``: optional
    source timestamps, one per item (they may go backwards). ``fps``: deliver at this pace
    (interruptible), like a camera. ``live``: whether pipelines treat it as a camera.
    The arrays are not copied: do not change them after handing them over."""

    def __init__(
        self,
        frames: Iterable[Any] | Callable[[int], Any],
        *,
        timestamps_ms: Iterable[float | None] | None = None,
        fps: float | None = None,
        live: bool = False,
        color: str = "BGR",
        name: str = "synthetic",
        on_event: Callable[[SourceEvent], None] | None = None,
    ) -> None:
        super().__init__(name, color=color, live=live, on_event=on_event)
        if fps is not None and not (math.isfinite(fps) and fps > 0):
            raise OptionsError(f"fps: expected a number > 0, got {fps!r}")
        self._frames = frames
        self._timestamps = timestamps_ms
        self.fps = fps
        self._i = 0

    def _open(self) -> None:
        f = self._frames
        self._iter = None if callable(f) else iter(f)
        self._ts_iter = iter(self._timestamps) if self._timestamps is not None else None
        self._t0_ms = _now_ms()

    def _read(self) -> Capture | None:
        i = self._i
        if self.fps is not None:
            if not self._wait((self._t0_ms + i * 1000.0 / self.fps - _now_ms()) / 1000.0):
                return None
        elif self._interrupt.is_set():
            return None
        if self._iter is None:
            frames = self._frames
            assert callable(frames)  # _open made no iterator: frames is the function
            item = frames(i)
            if item is None:
                return None
        else:
            try:
                item = next(self._iter)
            except StopIteration:
                return None
        self._i += 1
        ts = next(self._ts_iter, None) if self._ts_iter is not None else None
        return Capture(item, ts)


def _pattern(w: int, h: int) -> Callable[[int], np.ndarray]:
    """A cheap moving test pattern: a horizontal gradient with a bar that moves 8 px a frame."""
    base = np.empty((h, w, 3), np.uint8)
    base[:] = np.linspace(0, 255, w, dtype=np.float32).astype(np.uint8)[None, :, None]

    def make(i: int) -> np.ndarray:
        img: np.ndarray = base.copy()
        x = (i * 8) % w
        img[:, x : x + 8] = (0, 0, 255)
        return img

    return make


# ----------------------------------------------------------------------------------------------
# URI table


class _Seams(NamedTuple):
    options: SourceOptions
    capture_factory: CaptureFactory | None
    camera_factory: Callable[[int], Any] | None
    sleep: Callable[[float], None] | None
    on_event: Callable[[SourceEvent], None] | None


def _live(seams: _Seams, default: bool) -> bool:
    return default if seams.options.live is None else seams.options.live


def _int_arg(uri: str, rest: str) -> int:
    if not rest.isdigit():
        raise UnknownSourceError(f"{uri!r}: expected a camera number after the scheme, got {rest!r}")
    return int(rest)


def _from_path(uri: str, rest: str, s: _Seams) -> FrameSource:
    if rest.startswith("/dev/video"):  # a device node, not a file to decode
        return _from_v4l2(uri, rest, s)
    p = Path(unquote(rest)).expanduser()
    if p.is_dir():
        return ImageFolderSource(p, name=uri, on_event=s.on_event)
    if not p.exists():
        raise SourceError(f"no such video, image or folder: {str(p)!r}")
    kind = _nonregular_kind(p)
    if kind is not None:  # OpenCV would block opening a FIFO (until a writer comes) or read a device forever
        raise SourceError(f"{str(p)!r} is {kind}, not a video file, image or folder; refused without opening it")
    if p.suffix.lower() in IMAGE_EXTENSIONS:
        return ImageFolderSource(p, name=uri, on_event=s.on_event)
    return OpenCVSource(str(p), name=uri, live=_live(s, False), options=s.options, capture_factory=s.capture_factory, on_event=s.on_event)


def _from_v4l2(uri: str, rest: str, s: _Seams) -> FrameSource:
    target: str | int = int(rest) if rest.isdigit() else rest
    return OpenCVSource(
        target,
        api="v4l2",
        name=uri,
        live=_live(s, True),
        device=True,
        options=s.options,
        capture_factory=s.capture_factory,
        on_event=s.on_event,
    )


def _from_csi(uri: str, rest: str, s: _Seams) -> FrameSource:
    o = s.options
    pipe = csi_pipeline(_int_arg(uri, rest), o.size_wh or (1280, 720), o.fps or 30, o.flip_method)
    return GStreamerSource(pipe, name=uri, live=_live(s, True), options=o, capture_factory=s.capture_factory, on_event=s.on_event)


def _from_network(uri: str, rest: str, s: _Seams) -> FrameSource:
    return NetworkSource(uri, options=s.options, capture_factory=s.capture_factory, sleep=s.sleep, on_event=s.on_event, live=_live(s, True))


def _from_picamera2(uri: str, rest: str, s: _Seams) -> FrameSource:
    return Picamera2Source(_int_arg(uri, rest or "0"), options=s.options, camera_factory=s.camera_factory, name=uri, on_event=s.on_event)


def _from_synthetic(uri: str, rest: str, s: _Seams) -> FrameSource:
    size, _, query = rest.partition("?")
    m = re.fullmatch(r"(\d+)x(\d+)", size)
    if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise UnknownSourceError(f"{uri!r}: expected synthetic://WIDTHxHEIGHT?fps=F&frames=N, got size {size!r}")
    q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(q) - {"fps", "frames", "live"}
    if unknown:
        raise UnknownSourceError(f"{uri!r}: unknown parameter(s) {sorted(unknown)}; known: fps, frames, live")
    try:
        fps = float(q["fps"]) if "fps" in q else None
        n = int(q["frames"]) if "frames" in q else None
    except ValueError as e:
        raise UnknownSourceError(f"{uri!r}: fps must be a number and frames an int ({e})") from None
    live = q.get("live", "1" if fps else "0") not in ("0", "false", "no")
    make = _pattern(int(m.group(1)), int(m.group(2)))
    gen = make if n is None else (lambda i: make(i) if i < n else None)
    return SyntheticSource(gen, fps=fps, live=_live(s, live), name=uri, on_event=s.on_event)


_SCHEMES: dict[str, Callable[[str, str, _Seams], FrameSource]] = {
    "file": _from_path,
    "v4l2": _from_v4l2,
    "csi": _from_csi,
    "rtsp": _from_network,
    "rtsps": _from_network,
    "http": _from_network,
    "https": _from_network,
    "picamera2": _from_picamera2,
    "synthetic": _from_synthetic,
}
_KNOWN = (
    "csi://N, file://PATH, http(s)://URL, picamera2://N, rtsp(s)://URL, synthetic://WxH?fps=F&frames=N, "
    "v4l2:///dev/videoN; or a path (video file, image or folder of images), a camera index (int), "
    "or a GStreamer pipeline (elements joined by ' ! ')"
)


def source_from_uri(
    uri: str | int | os.PathLike[str],
    options: SourceOptions | None = None,
    *,
    capture_factory: CaptureFactory | None = None,
    camera_factory: Callable[[int], Any] | None = None,
    sleep: Callable[[float], None] | None = None,
    on_event: Callable[[SourceEvent], None] | None = None,
) -> FrameSource:
    """Pick the source for ``uri`` from the scheme table; it is returned NEW (not opened).

    Raises UnknownSourceError for an unknown scheme (the message lists the known ones) and
    SourceError for a path that does not exist. The keyword seams replace the hardware
    boundary (``cv2.VideoCapture``, ``Picamera2``, the reconnect wait) in tests."""
    seams = _Seams(options or SourceOptions(), capture_factory, camera_factory, sleep, on_event)
    if isinstance(uri, bool):
        raise UnknownSourceError(f"source: expected a URI, path or camera index, got {uri!r}")
    if isinstance(uri, int):
        if uri < 0:
            raise UnknownSourceError(f"camera index must be >= 0, got {uri}")
        return OpenCVSource(
            uri,
            api="any",
            name=f"camera:{uri}",
            live=_live(seams, True),
            device=True,
            options=seams.options,
            capture_factory=capture_factory,
            on_event=on_event,
        )
    if isinstance(uri, os.PathLike):  # a Path or any other path-like object
        path = os.fspath(uri)
        return _from_path(path, path, seams)
    if not isinstance(uri, str) or not uri:
        raise UnknownSourceError(f"source: expected a URI, path or camera index, got {uri!r}")
    if " ! " in uri:
        return GStreamerSource(uri, live=seams.options.live, options=seams.options, capture_factory=capture_factory, on_event=on_event)
    m = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*)://", uri)
    if m is None:
        return _from_path(uri, uri, seams)
    scheme = m.group(1).lower()
    build = _SCHEMES.get(scheme)
    if build is None:
        raise UnknownSourceError(f"unknown source scheme {scheme + '://'!r} in {uri!r}; known: {_KNOWN}")
    return build(uri, uri[m.end() :], seams)
