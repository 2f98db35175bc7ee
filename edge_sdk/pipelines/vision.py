"""VisionPipeline: a frame source, a model and sinks, as overlapping threads.

::

    import edge_sdk
    from edge_sdk.pipelines import VisionPipeline, PipelineOptions, JsonLinesSink

    with edge_sdk.load("shapes-classifier/") as model, JsonLinesSink("out.jsonl") as out:
        counters = VisionPipeline(model, "clip.mp4", sinks=[out]).run()
        print(counters)   # frames_in=... processed=... dropped={...}

Stages::

    capture thread --> bounded queue --> inference worker(s) --> reorder --> output thread --> sinks
    (source.read,      (drop policy)     (model.predict_prepared           (one thread, frame order;
     rate limit,                          or run_prepared, GIL released     decode_inferred with
     model.prepare_image)                 in the runtime)                   decode="output")

Preprocessing (``PipelineOptions.preprocess``): "capture" runs ``model.prepare_image`` (resize,
colour, normalise, layout, validation) on the capture thread, so frame k+1 is decoded and
preprocessed while frame k is inferred; "worker" runs the whole ``predict_image`` on the inference
worker. "auto" (default) picks "capture" when the CPUs outnumber the inference threads
(``model.session.info.threads`` x ``workers``), so the capture thread has a core of its own, and
"worker" otherwise: measured on 2 cores (docs/benchmarks.md), "capture" made a 1-thread model 1.25x
faster and a 2-thread one 0.92x as fast. A model without ``prepare_image``/``predict_prepared``
always gets "worker". A model whose session takes all N CPUs leaves none to the capture thread:
``model_threads="auto"`` (default) then runs ``model.for_threads(N - 1)`` (a copy with one thread
fewer, shared, closed with the model) when the pipeline runs flat out (a non-live source, one
worker, ``preprocess`` "auto", N >= 2, a model small enough to hold twice), and "auto" preprocessing
picks "capture" for it: 1.13x the frames of the model's own 2 threads on 2 cores
(docs/benchmarks.md). ``model_threads="keep"`` runs the model as given.

Decoding (``PipelineOptions.decode``): "output" has the worker stop at the model's outputs
(``model.run_prepared``) and the output thread decode them (``model.decode_inferred``: boxes, NMS,
labels) before the sinks, so the worker starts the next frame's inference while this one is
decoded; the model counts as busy with a frame (``wait_model_idle``) until it is decoded, and a
decoder that raises drops that frame as "error", like a failed inference. "worker" decodes inside
the inference call. "auto" (default) picks "output" for one worker, "capture" preprocessing and a
model with a decoder: the capture, inference and output threads then each take one stage of a
frame (docs/benchmarks.md has the figures); with more workers, decoding on them already overlaps.
A model without ``run_prepared``/``decode_inferred`` and "inline" preprocessing always decode on
the worker; a model swapped in decodes where its API allows.

"inline" runs everything on one thread: read a frame, ``predict_image``, hand the result to the
sinks, read the next (no queue, no handoff between threads: the loop a user would write, with the
pipeline's accounting, rate limit, pause and stop). "auto" picks it for a file or other non-live
source when the process may use one CPU (``usable_cpus()``: the affinity mask and cgroup quota)
and ``workers`` is 1: with one core nothing overlaps, so the queue and the handoffs between three
threads can only cost (a few percent of a BlazeFace frame at most, within the run-to-run noise of
the measurements in docs/benchmarks.md). A live source keeps its capture thread,
so frames arriving during an inference are seen and dropped by the policy, with a reason, rather
than lost in the driver unseen; pass preprocess="inline" to trade that for the CPU.

Drop policies (``PipelineOptions.drop_policy``), applied when a frame arrives and the queue is
full:

- ``"block"`` (default for files, folders and other non-live sources): never drop; the capture
  thread waits for room, so the source is read only as fast as inference keeps up.
- ``"latest"`` (default for live sources): keep only the newest frame; a new frame evicts the
  one waiting (reason "evicted"), so the queue holds at most one frame whatever ``queue_size``.
- ``"drop_oldest"``: evict the oldest queued frame (reason "evicted").
- ``"drop_newest"``: drop the arriving frame (reason "queue_full").

``max_fps``: with ``rate_mode="auto"`` a live source's frames over the rate are dropped with reason
"rate_limit", and a non-live source (file, folder) is throttled instead: it is read no faster
than ``max_fps`` and nothing is dropped. ``"drop"`` / ``"throttle"`` force one behaviour.

Control while running (thread-safe; what the budget governor acts through, see
:mod:`edge_sdk.budget.governor`). Each takes effect at the next frame the capture thread reads or
a worker takes; frames already past that point are not touched:

- :meth:`VisionPipeline.set_max_fps` changes the rate limit (None: unlimited) under the same
  drop/throttle rule as ``max_fps``; a throttle wait in progress is cut short and re-timed from
  the last frame that passed the limit.
- :meth:`VisionPipeline.pause` / :meth:`VisionPipeline.resume`: while paused, a live source is
  still read (a camera must be drained) and each frame is dropped with reason "paused" (counted in
  ``frames_in``); a non-live source is not read at all (nothing is dropped, nothing is lost).
  Frames already queued are still inferred. ``stop()`` ends a paused pipeline as promptly as a
  running one. ``PipelineOptions.priority`` ("normal" or "low") tells the governor which
  pipelines it may pause.
- :meth:`VisionPipeline.swap_model`: frames a worker takes after the call run on the new model;
  frames already inferring finish on the old one. With preprocess="capture", a frame prepared
  for the old model but taken after the swap is prepared again for the new one on the worker
  (``reprepared`` counts them): a prepared tensor belongs to the model that made it (its size,
  layout and dtype may differ), and the old model may be closed right after the swap.
  :meth:`VisionPipeline.wait_model_idle` waits until no frame is inferring on a model, so a caller
  can close it safely. The pipeline never closes a model.

Order: results reach the sinks in frame-index order, on one thread. With ``workers > 1``, frames
are inferred concurrently and may finish out of order; a reorder buffer holds a finished result
until every earlier frame has finished (or failed), so a slow frame delays the ones behind it.
At most ``2 * workers`` results wait for the sinks; when the sinks fall behind, the workers stop
taking frames and the drop policy applies at the queue.

Accounting: every item a source yields is counted once in ``frames_in`` and ends up in exactly
one of ``processed`` (result handed to the sinks), ``dropped[reason]``, or, while it moves,
``in_flight`` (waiting for queue room, queued, inferring, or waiting for the sinks). All counters
change under one lock and :meth:`VisionPipeline.counters` copies them under it, so every snapshot
satisfies ``frames_in == processed + sum(dropped.values()) + in_flight``. After the pipeline has
stopped, ``in_flight == 0``.

Errors: a frame whose ``predict_image`` (or ``prepare_image``) raises is dropped with reason
"error" and the exception is passed to ``on_error(exc, frame)``; the pipeline goes on. An exception
from a sink is passed to ``on_error(exc, frame)`` too (the frame stays processed; ``sink_errors``
counts them). A source that fails (a stream that cannot be reconnected) ends the capture; what was
queued is finished, and ``run()`` raises the SourceError (``pipeline.error`` holds it after
``start()``/``join()``). An exception from ``on_error``, ``on_drop`` or a drop listener is logged and
ignored.

Fatal exceptions: a ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
``SystemExit``, ``GeneratorExit``, ...) raised by the source, the model, a sink, the governor or a
callback is accounted like an ordinary one at that stage (the frame is dropped with reason "error",
or counted processed with a sink error, the sinks after that sink skipping the frame), and passed
to ``on_error``; then it ends the pipeline: ``stop("discard")``, every
thread ends, and ``run()`` re-raises that same exception to its caller once the pipeline has
stopped (``pipeline.error`` holds it; the first one wins). It never leaves a thread behind or a
frame unaccounted.

Terminal state: once ``run()`` returns or raises, ``join()`` returns True or ``close()`` returns
(from the caller's thread), every pipeline thread has ended, ``state`` is STOPPED and
``in_flight == 0``, whatever was raised and where.

Re-entrant calls from a sink or callback (they run on pipeline threads): ``stop()``, ``pause()``,
``resume()``, ``set_max_fps()``, ``swap_model()``, ``counters()`` and the properties are safe.
``close()`` on a pipeline thread only stops (it cannot wait for the thread it runs on) and
returns at once; the pipeline ends after the sink returns. ``join()`` and ``run()`` /
``start()`` on a pipeline thread raise :class:`~edge_sdk.pipelines.errors.PipelineStateError`.

Source drops (the hook for per-frame source failures such as an unreadable or undecodable file):
a source's ``read()`` returns a :class:`~edge_sdk.pipelines.sources.FrameDrop` (a ``_read`` hook
returns ``Capture.dropped(reason, detail)``) for an item it read but cannot deliver; the pipeline
counts it in ``frames_in`` and ``dropped[reason]`` (any reason string, e.g. "decode_error") and
passes it to ``on_drop``. Raising from ``read()`` means the source failed (see Errors).
"""

from __future__ import annotations

import enum
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from ..errors import OptionsError, OptionsTypeError
from ..profiles.facts import usable_cpus
from ..telemetry.core import Sample
from .errors import PipelineError, PipelineStateError, SourceError
from .sinks import CallbackSink, Sink
from .sources import Frame, FrameDrop, FrameSource, SourceOptions, SourceState, source_from_uri

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from ..model import Result

__all__ = ["DROP_POLICIES", "DROP_REASONS", "FrameResult", "PipelineCounters", "PipelineOptions", "PipelineState", "VisionPipeline"]

_log = logging.getLogger(__name__)

DROP_POLICIES = ("latest", "block", "drop_oldest", "drop_newest")
DROP_REASONS = ("queue_full", "evicted", "rate_limit", "decode_error", "invalid_frame", "error", "shutdown", "paused")
RATE_MODES = ("auto", "drop", "throttle")
STOP_MODES = ("drain", "discard")
PREPROCESS_MODES = ("auto", "capture", "worker", "inline")
PRIORITIES = ("normal", "low")
MODEL_THREADS = ("auto", "keep")
DECODE_MODES = ("auto", "worker", "output")
#: The largest model file ``model_threads="auto"`` loads a second session of (its weights are held twice).
RETHREAD_MAX_BYTES = 64 << 20


def _now_ms() -> float:
    return time.monotonic_ns() / 1e6


def _check_fps(fps: Any) -> None:
    if fps is not None and not (isinstance(fps, (int, float)) and not isinstance(fps, bool) and math.isfinite(fps) and fps > 0):
        raise OptionsError(f"max_fps: expected a number > 0 or None, got {fps!r}")


def _has_split_api(model: Any) -> bool:
    return callable(getattr(model, "prepare_image", None)) and callable(getattr(model, "predict_prepared", None))


def _has_deferred_api(model: Any) -> bool:
    """``run_prepared`` / ``decode_inferred`` (an edge_sdk Model): the decode can run on another thread."""
    return _has_split_api(model) and callable(getattr(model, "run_prepared", None)) and callable(getattr(model, "decode_inferred", None))


@dataclass(frozen=True)
class PipelineOptions:
    """How a :class:`VisionPipeline` runs (validated on construction).

    ``drop_policy``: one of DROP_POLICIES, or None for "latest" on live sources and "block"
    otherwise. ``queue_size``: frames the queue between capture and inference holds (>= 1).
    ``max_fps``: None for unlimited. ``rate_mode``: "auto" (drop on live sources, throttle others),
    "drop" (reason "rate_limit") or "throttle" (read the source no faster). ``workers``:
    inference threads (>= 1). ``stop_mode``: what ``stop()`` does with frames not yet inferred:
    "drain" (stop reading, finish every frame already read) or "discard" (drop them with reason
    "shutdown"; frames already inferring still finish and reach the sinks). ``top_k``: passed to
    predict_image (None: the manifest's). ``join_timeout_s``: how long ``close()``/``run()`` wait
    for the threads after a stop before raising PipelineError. ``preprocess``: "capture" (prepare
    each frame on the capture thread, overlapping inference) or "worker" (inside the inference
    worker, as one ``predict_image`` call) or "inline" (one thread reads, infers and runs the sinks)
    or "auto" (see the module docs). ``priority``: "normal"
    or "low"; the budget governor's PauseLowPriority action pauses "low" pipelines under load.
    ``model_threads``: "auto" runs ``model.for_threads(N - 1)`` instead of a model whose session
    would take all N CPUs the process may use, when the pipeline runs flat out on one worker (see
    the module docs); "keep" runs the model as given. ``decode``: "output" decodes each result
    (``model.decode_inferred``: boxes, NMS, labels) on the output thread, so the worker goes on to
    the next frame's inference at once; "worker" decodes it inside the inference call; "auto" picks
    "output" for one worker on a model with a decoder when preprocessing runs on the capture thread
    (see the module docs).
    """

    drop_policy: str | None = None
    queue_size: int = 8
    max_fps: float | None = None
    rate_mode: str = "auto"
    workers: int = 1
    stop_mode: str = "drain"
    top_k: int | None = None
    join_timeout_s: float = 30.0
    preprocess: str = "auto"
    priority: str = "normal"
    model_threads: str = "auto"
    decode: str = "auto"

    def __post_init__(self) -> None:
        if self.drop_policy is not None and self.drop_policy not in DROP_POLICIES:
            raise OptionsError(f"drop_policy: expected one of {DROP_POLICIES} or None, got {self.drop_policy!r}")
        for name, hi in (("queue_size", 100_000), ("workers", 64)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
                raise OptionsError(f"{name}: expected an int in [1, {hi}], got {v!r}")
        _check_fps(self.max_fps)
        if self.rate_mode not in RATE_MODES:
            raise OptionsError(f"rate_mode: expected one of {RATE_MODES}, got {self.rate_mode!r}")
        if self.stop_mode not in STOP_MODES:
            raise OptionsError(f"stop_mode: expected one of {STOP_MODES}, got {self.stop_mode!r}")
        if self.preprocess not in PREPROCESS_MODES:
            raise OptionsError(f"preprocess: expected one of {PREPROCESS_MODES}, got {self.preprocess!r}")
        if self.preprocess == "inline" and self.workers != 1:
            raise OptionsError(f"preprocess='inline' runs on one thread: expected workers=1, got {self.workers}")
        if self.priority not in PRIORITIES:
            raise OptionsError(f"priority: expected one of {PRIORITIES}, got {self.priority!r}")
        if self.model_threads not in MODEL_THREADS:
            raise OptionsError(f"model_threads: expected one of {MODEL_THREADS}, got {self.model_threads!r}")
        if self.decode not in DECODE_MODES:
            raise OptionsError(f"decode: expected one of {DECODE_MODES}, got {self.decode!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise OptionsError(f"top_k: expected an int >= 1 or None, got {self.top_k!r}")
        if not (math.isfinite(self.join_timeout_s) and self.join_timeout_s > 0):
            raise OptionsError(f"join_timeout_s: expected a number > 0, got {self.join_timeout_s!r}")


@dataclass(frozen=True, slots=True, eq=False)
class FrameResult:
    """One frame's result. ``timestamp_ms``: the frame's capture time (monotonic, strictly
    increasing per source); ``latency_ms``: from capture to the model's result; ``frame``: the
    frame itself (sinks draw on copies of its image). ``budget_state``: with a governor attached
    (``VisionPipeline(governor=...)``), its state ("normal", "constrained", "critical") when the
    result reached the sinks, else None."""

    index: int
    timestamp_ms: float
    result: "Result"
    latency_ms: float
    frame: Frame
    budget_state: str | None = None  # the attached governor's state when the result was emitted

    @property
    def source_timestamp_ms(self) -> float | None:
        """The timestamp the source gave the frame (e.g. a video's position), or None."""
        return self.frame.source_timestamp_ms

    def draw(self, **options: Any) -> np.ndarray:
        """A new BGR uint8 image: this frame (its own colour order) with its result drawn on it
        (:func:`edge_sdk.processing.draw.draw`; ``options`` as there, ``color`` excepted). The frame is
        not modified."""
        from ..processing.draw import draw

        return draw(self.frame.image, self.result, color=self.frame.color, **options)


@dataclass(frozen=True)
class PipelineCounters:
    """A consistent snapshot of a pipeline's frame accounting (copied under the pipeline lock).

    In-flight stages: ``preparing`` (read, being preprocessed on the capture thread), ``waiting``
    (prepared, waiting for queue room; "block" only), ``queued``, ``inferring``, ``emitting``
    (inferred, waiting for or inside the sinks).
    ``max_queue_depth``: the most frames the queue ever held. ``sink_errors``: exceptions raised by
    sinks (those frames still count as processed). ``reprepared``: frames prepared on the capture
    thread for a model that was swapped out before a worker took them, so prepared again for the
    new model (see :meth:`VisionPipeline.swap_model`).
    """

    frames_in: int
    processed: int
    dropped: Mapping[str, int]
    waiting: int
    queued: int
    inferring: int
    emitting: int
    max_queue_depth: int
    sink_errors: int
    state: str
    preparing: int = 0
    reprepared: int = 0
    timestamp_ms: float = field(default_factory=_now_ms)

    @property
    def in_flight(self) -> int:
        """Frames taken in but neither processed nor dropped yet (preparing, waiting, queued, inferring or emitting)."""
        return self.preparing + self.waiting + self.queued + self.inferring + self.emitting

    @property
    def dropped_total(self) -> int:
        """Frames dropped, all reasons together."""
        return sum(self.dropped.values())

    @property
    def unaccounted(self) -> int:
        """``frames_in - processed - dropped - in_flight``: 0 in every snapshot."""
        return self.frames_in - self.processed - self.dropped_total - self.in_flight

    def __str__(self) -> str:
        drops = {k: v for k, v in self.dropped.items() if v}
        return f"frames_in={self.frames_in} processed={self.processed} dropped={drops} in_flight={self.in_flight} ({self.state})"


class PipelineState(str, enum.Enum):
    """A pipeline's lifecycle: NEW -> RUNNING -> STOPPING -> STOPPED."""

    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


def _pipeline_model(opts: PipelineOptions, model: Any, live: bool) -> Any:
    """What ``model_threads`` gives a pipeline: for "auto", ``model.for_threads(N - 1)`` when the
    model's session would take every one of the N >= 2 CPUs this process may use
    (``usable_cpus()``), the pipeline runs flat out on one worker (a non-live source, ``workers``
    1, ``preprocess`` "auto"), and the model is an edge_sdk Model small enough to hold twice (no
    per-stream state, at most RETHREAD_MAX_BYTES and 1/16 of the memory budget); else ``model``."""
    if opts.model_threads != "auto" or live or opts.workers != 1 or opts.preprocess != "auto":
        return model
    if not (callable(getattr(model, "for_threads", None)) and _has_split_api(model)):
        return model
    try:
        threads = int(model.session.info.threads)
        size = int(model.variant.size)
        stateful = bool(model.manifest.state)
        budget = model.detection.memory_budget_mb
    except (AttributeError, TypeError, ValueError):
        return model
    cpus = usable_cpus()
    if cpus < 2 or threads < cpus or stateful or size > RETHREAD_MAX_BYTES or (budget and size * 16 > budget * 2**20):
        return model
    try:
        return model.for_threads(cpus - 1)
    except Exception as e:  # a copy that cannot be loaded costs the speed-up, not the pipeline
        _log.warning("model_threads='auto': no %d-thread copy of %r (%s: %s); running it as loaded", cpus - 1, model, type(e).__name__, e)
        return model


def _preprocess_mode(requested: str, model: Any, workers: int, live: bool) -> str:
    """ "capture", "worker" or "inline" for PipelineOptions.preprocess (see the module docs)."""
    if requested == "inline":
        return "inline"
    if requested != "auto":
        return requested if _has_split_api(model) else "worker"
    cpus = usable_cpus()  # the CPU budget decides "auto" only (it reads the affinity mask and cgroup quota)
    if cpus <= 1 and workers == 1 and not live:
        return "inline"
    if not _has_split_api(model):
        return "worker"
    try:
        threads = int(model.session.info.threads)
    except (AttributeError, TypeError, ValueError):
        threads = 1
    return "capture" if threads * workers < cpus else "worker"


def _decode_mode(requested: str, model: Any, workers: int, preprocess: str) -> str:
    """ "output" or "worker" for PipelineOptions.decode (see the module docs)."""
    if preprocess == "inline" or not _has_deferred_api(model):
        return "worker"
    if requested != "auto":
        return requested
    return "output" if workers == 1 and preprocess == "capture" and getattr(model, "decodes", False) is True else "worker"


class VisionPipeline:
    """Run ``model.predict_image`` over a source's frames and hand results to sinks.

    ``model``: anything with ``predict_image(image, *, color=...)`` (an edge_sdk Model).
    ``source``: a FrameSource, or a URI / path / camera index for :func:`source_from_uri` (with
    ``source_options``). The pipeline opens the source if needed and closes it when capture ends
    (a source is read once). ``sinks``: Sink objects or plain callables ``fn(FrameResult)``; the
    pipeline opens sinks that are not open yet at ``start()`` (so a bad path fails there) and never
    closes them: they belong to the caller. ``on_error(exc, frame)``: frame and sink errors;
    ``on_drop(FrameDrop)``: every drop with its reason and message. Both are called on pipeline
    threads (keep them quick and thread-safe); an exception they raise is logged and ignored.
    ``governor``: a budget :class:`~edge_sdk.budget.governor.Governor` (or None): each
    FrameResult carries its state (``budget_state``) and each result's busy time feeds its energy
    per inference estimate. Attaching does not make the governor act on this pipeline: pass the
    pipeline in ``Governor(pipelines=...)`` for that.

    ``run()`` blocks until the source ends (or ``stop()`` from another thread) and returns the
    final counters. ``start()`` / ``stop()`` return at once; ``join(timeout)`` waits for the
    threads. A pipeline runs once. As a context manager, leaving it stops (``stop_mode``, or
    "discard" when an exception is propagating) and joins.

    While it runs: :meth:`set_max_fps`, :meth:`pause` / :meth:`resume` and :meth:`swap_model`
    (see the module docs, "Control while running").
    """

    def __init__(
        self,
        model: Any,
        source: FrameSource | str | int | os.PathLike[str],  # what source_from_uri takes
        options: PipelineOptions | None = None,
        *,
        sinks: Iterable[Sink | Callable[[FrameResult], Any]] = (),
        on_error: Callable[[BaseException, Frame | None], Any] | None = None,
        on_drop: Callable[[FrameDrop], Any] | None = None,
        source_options: SourceOptions | None = None,
        governor: Any = None,
    ) -> None:
        if not callable(getattr(model, "predict_image", None)):
            raise TypeError(f"model: expected an object with predict_image(image, color=...), got {type(model).__name__}")
        self.options = opts = options or PipelineOptions()
        self.source = source if isinstance(source, FrameSource) else source_from_uri(source, source_options)
        if self.source.state is SourceState.CLOSED:
            raise PipelineStateError(f"source {self.source.name!r} is closed; a source is read once")
        self.sinks: tuple[Sink, ...] = tuple(s if isinstance(s, Sink) else CallbackSink(s) for s in sinks)
        self.drop_policy = opts.drop_policy or ("latest" if self.source.live else "block")
        self._rate_throttles = opts.rate_mode == "throttle" or (opts.rate_mode == "auto" and not self.source.live)
        self._max_fps: float | None = opts.max_fps
        self._paused = False
        model = _pipeline_model(opts, model, self.source.live)
        self._active: tuple[Any, bool, bool] = (model, _has_split_api(model), False)  # (model, has prepare_image/predict_prepared, decodes on the output thread)
        self._on_error = on_error
        self._on_drop = on_drop
        self._drop_listeners: list[Callable[[FrameDrop], Any]] = []  # add_drop_listener (telemetry EventLog)
        self.governor = governor  # a budget Governor: its state on every FrameResult, inference time for its energy estimate
        self._predict_kw = {"top_k": opts.top_k} if opts.top_k is not None else {}
        self.preprocess = _preprocess_mode(opts.preprocess, model, opts.workers, self.source.live)
        self._capture_prep = self.preprocess == "capture"
        self._inline = self.preprocess == "inline"
        self.decode = _decode_mode(opts.decode, model, opts.workers, self.preprocess)
        self._active = (model, self._active[1], self.decode == "output")

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._state = PipelineState.NEW
        self._queue: deque[tuple[Frame, Any, Any]] = deque()  # (frame, prepared or None, the model that prepared it)
        self._frames_in = 0
        self._processed = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._preparing = 0
        self._waiting = 0
        self._inferring = 0
        self._emitting = 0
        self._max_depth = 0
        self._sink_errors = 0
        self._reprepared = 0
        self._busy: dict[int, int] = {}  # id(model) -> frames inferring on it
        self._started_ms: float | None = None
        self._stop_reading = False
        self._discard = False
        self._capture_done = False
        self._workers_alive = 0
        self._next_take = 0  # order number given to a frame when a worker takes it
        # (frame, result, done ms, None) by order number (None: failed); with decode "output" the
        # InferredImage and the model that ran it in place of the result and None: the output
        # thread decodes it with that model
        self._done: dict[int, tuple[Frame, Any, float, Any] | None] = {}
        self._out_capacity = 2 * opts.workers
        self._wake = threading.Event()  # set by stop / pause / resume / set_max_fps: the capture thread re-reads them
        self._finished = threading.Event()
        self._threads: list[threading.Thread] = []
        self._threads_alive = 0  # pipeline threads not yet ended; the last one to end sets STOPPED
        self._error: BaseException | None = None  # the source's failure (an Exception)
        self._fatal_error: BaseException | None = None  # the first non-Exception BaseException raised anywhere

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def state(self) -> PipelineState:
        """NEW, RUNNING, STOPPING or STOPPED."""
        return self._state

    @property
    def model(self) -> Any:
        """The model workers take new frames to (see :meth:`swap_model`): the one given, or its
        ``for_threads`` copy (``PipelineOptions.model_threads``)."""
        return self._active[0]

    @property
    def throttle(self) -> bool:
        """True when the rate limit slows the source down instead of dropping frames (a rate is
        set and ``rate_mode`` is "throttle", or "auto" on a non-live source)."""
        return self._rate_throttles and self._max_fps is not None

    @property
    def max_fps(self) -> float | None:
        """The rate limit in effect (None: unlimited)."""
        return self._max_fps

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused

    @property
    def processed_fps(self) -> float | None:
        """Frames handed to the sinks per second since ``start()``; None before the first one."""
        with self._lock:
            t0, n = self._started_ms, self._processed
        if t0 is None or n == 0:
            return None
        return n / max((_now_ms() - t0) / 1000.0, 1e-3)

    def set_max_fps(self, fps: float | None) -> None:
        """Change the rate limit (frames per second, None: unlimited), effective at the next frame
        read; the drop/throttle rule is ``rate_mode``'s. Thread-safe; allowed in any state."""
        _check_fps(fps)
        with self._lock:
            self._max_fps = None if fps is None else float(fps)
        self._wake.set()

    def pause(self) -> None:
        """Stop admitting frames: a live source's frames are dropped with reason "paused", a
        non-live source is not read until :meth:`resume`. Frames already queued still run.
        Idempotent and thread-safe."""
        with self._lock:
            self._paused = True
        self._wake.set()

    def resume(self) -> None:
        """Undo :meth:`pause` (idempotent)."""
        with self._lock:
            self._paused = False
        self._wake.set()

    def swap_model(self, model: Any) -> Any:
        """Run frames that a worker takes from now on on ``model``; returns the model replaced.
        Frames already inferring finish on the old model; frames prepared for the old model on
        the capture thread are prepared again for the new one. The pipeline closes neither
        (use :meth:`wait_model_idle` before closing the old one). The preprocess mode chosen at
        construction is kept; a model without the prepare_image/predict_prepared API runs
        ``predict_image`` on the worker."""
        if not callable(getattr(model, "predict_image", None)):
            raise TypeError(f"model: expected an object with predict_image(image, color=...), got {type(model).__name__}")
        with self._cond:
            old = self._active[0]
            self._active = (model, _has_split_api(model), self.decode == "output" and _has_deferred_api(model))
            self._cond.notify_all()
        return old

    def wait_model_idle(self, model: Any, timeout: float | None = None) -> bool:
        """Wait until no frame is inferring on ``model``; True when none is (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        key = id(model)
        with self._cond:
            while self._busy.get(key):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the pipeline early: the first fatal one (a BaseException that
        is not an Exception, from any stage), else the source's failure, else None."""
        return self._fatal_error or self._error

    def _on_pipeline_thread(self) -> bool:
        return threading.current_thread() in self._threads

    def add_drop_listener(self, callback: Callable[[FrameDrop], Any]) -> Callable[[], None]:
        """Call ``callback(drop)`` for every drop too, like ``on_drop`` (on pipeline threads; keep it
        quick; exceptions are logged and ignored). Returns a function that removes it."""
        if not callable(callback):
            raise OptionsTypeError(f"callback: expected a callable, got {type(callback).__name__}")
        self._drop_listeners.append(callback)
        return lambda: self._drop_listeners.remove(callback) if callback in self._drop_listeners else None

    def start(self) -> "VisionPipeline":
        """Open the source and sinks and start the threads; returns at once. PipelineStateError
        unless the pipeline is new (a pipeline runs once)."""
        with self._lock:
            if self._state is not PipelineState.NEW:
                raise PipelineStateError(f"pipeline is {self._state.value}; a pipeline runs once, make a new one")
            self._state = PipelineState.RUNNING
            self._started_ms = _now_ms()
        try:
            self.source.open()
            for s in self.sinks:
                s.open()
        except BaseException:
            with self._lock:
                self._state = PipelineState.STOPPED
            self.source.close()
            self._finished.set()
            raise
        n = 0 if self._inline else self.options.workers
        self._workers_alive = n
        if self._inline:
            bodies: list[tuple[Callable[[], None], str]] = [(self._capture_loop, "edge-sdk-pipeline-inline")]
        else:
            bodies = [(self._capture_loop, "edge-sdk-pipeline-capture")]
            bodies += [(self._worker_loop, f"edge-sdk-pipeline-infer-{i}") for i in range(n)]
            bodies.append((self._output_loop, "edge-sdk-pipeline-output"))
        threads = [threading.Thread(target=self._thread_main, args=(body,), name=name, daemon=True) for body, name in bodies]
        with self._lock:
            self._threads = threads
            self._threads_alive = len(threads)
        started = 0
        try:
            for t in threads:
                t.start()
                started += 1
        except BaseException as e:  # a thread could not start (RuntimeError: can't start new thread)
            self._fatal(e)
            with self._cond:  # the threads that never ran will not end: count them out
                self._threads_alive -= len(threads) - started
                if started == 0:
                    self._capture_done = True
                self._workers_alive -= n - min(max(started - 1, 0), n)
                self._cond.notify_all()
                last = self._threads_alive == 0
            if last:
                self._finish()
            raise
        return self

    def stop(self, mode: str | None = None) -> None:
        """Ask the pipeline to stop; returns at once (``join()`` waits). ``mode``: "drain" or
        "discard" (default ``options.stop_mode``). Idempotent; a later "discard" upgrades a
        "drain" in progress."""
        mode = mode or self.options.stop_mode
        if mode not in STOP_MODES:
            raise OptionsError(f"mode: expected one of {STOP_MODES}, got {mode!r}")
        drops: list[FrameDrop] = []
        with self._cond:
            if self._state is PipelineState.NEW:
                self._state = PipelineState.STOPPED
                self._finished.set()
                close_source = True
            else:
                close_source = False
                if self._state is PipelineState.RUNNING:
                    self._state = PipelineState.STOPPING
                self._stop_reading = True
                if mode == "discard" and not self._discard:
                    self._discard = True
                    while self._queue:
                        f = self._queue.popleft()[0]
                        drops.append(self._drop_locked(f.index, "shutdown", "discarded by stop()"))
                self._cond.notify_all()
        self._wake.set()
        self.source.interrupt()
        if close_source:
            self.source.close()
        self._report_drops(drops)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the threads to end; True when they have (then ``in_flight == 0`` and the state
        is STOPPED). PipelineStateError on a pipeline thread (a sink or callback): it would wait
        for itself."""
        if self._on_pipeline_thread():
            raise PipelineStateError("join() called on one of the pipeline's own threads (a sink or callback) would wait for itself")
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def run(self) -> PipelineCounters:
        """Start, wait until the source ends or ``stop()`` is called, and return the counters.
        Raises the SourceError of a source that failed, and re-raises a fatal exception (a
        BaseException that is not an Exception, e.g. KeyboardInterrupt or SystemExit) raised by
        any stage, once every thread has ended. On a KeyboardInterrupt (or any exception) in the
        caller's own wait, discards, stops, joins and re-raises it. PipelineStateError unless the
        pipeline is new, or on a pipeline thread."""
        if self._on_pipeline_thread():
            raise PipelineStateError("run() called on one of the pipeline's own threads (a sink or callback); a pipeline runs once")
        self.start()
        try:
            while not self._finished.wait(0.2):
                pass
        except BaseException:
            self.stop("discard")
            self.join(self.options.join_timeout_s)
            raise
        if not self.join(self.options.join_timeout_s):
            raise PipelineError(f"pipeline threads did not end within {self.options.join_timeout_s} s")
        if self._fatal_error is not None:
            raise self._fatal_error
        if self._error is not None:
            if isinstance(self._error, PipelineError):  # a SourceError, or a pipeline thread's failure
                raise self._error
            raise SourceError(f"source {self.source.name!r} failed: {self._error!r}") from self._error
        return self.counters()

    def close(self, mode: str | None = None) -> None:
        """Stop and join (idempotent). Raises PipelineError if the threads outlive ``join_timeout_s``.
        On a pipeline thread (a sink or callback) it only stops and returns at once: the pipeline
        ends after that sink or callback returns."""
        self.stop(mode)
        if self._on_pipeline_thread():
            return
        if not self.join(self.options.join_timeout_s):
            raise PipelineError(f"pipeline threads did not end within {self.options.join_timeout_s} s")

    def __enter__(self) -> "VisionPipeline":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close("discard" if exc_type is not None else None)

    def counters(self) -> PipelineCounters:
        """A consistent snapshot of the frame accounting: frames in, processed, dropped by reason, and how many are at each stage now."""
        with self._lock:
            return PipelineCounters(
                frames_in=self._frames_in,
                processed=self._processed,
                dropped=MappingProxyType(dict(self._dropped)),
                waiting=self._waiting,
                queued=len(self._queue),
                inferring=self._inferring,
                emitting=self._emitting,
                max_queue_depth=self._max_depth,
                sink_errors=self._sink_errors,
                state=self._state.value,
                preparing=self._preparing,
                reprepared=self._reprepared,
            )

    # -- telemetry: edge_sdk.telemetry Registry.track / EventLog.watch --------------------------------

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "pipeline", label ``name`` or the source's name."""
        return "pipeline", name or self.source.name

    def telemetry_samples(self, label: str | None = None) -> list[Sample]:
        """Prometheus samples of the frame accounting (:meth:`counters`), label ``pipeline``."""
        lab = {"pipeline": label or self.source.name}
        c = self.counters()
        out = [
            Sample("edge_sdk_pipeline_frames_in_total", c.frames_in, "frames the source yielded", "counter", lab),
            Sample("edge_sdk_pipeline_frames_processed_total", c.processed, "frames whose result reached the sinks", "counter", lab),
            Sample("edge_sdk_pipeline_frames_in_flight", c.in_flight, "frames read and not yet processed or dropped", "gauge", lab),
            Sample("edge_sdk_pipeline_max_queue_depth", c.max_queue_depth, "the most frames the queue ever held", "gauge", lab),
        ]
        out += [
            Sample("edge_sdk_pipeline_frames_dropped_total", n, "frames dropped, by reason", "counter", {**lab, "reason": r})
            for r, n in c.dropped.items()
        ]
        return out

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Sequence[Any] | None = None) -> Callable[[], None]:
        """``EventLog.watch``: every drop, with its reason and the current model's provenance. Returns the unsubscribe."""
        label = name or self.source.name

        def on_drop(d: FrameDrop) -> None:
            emit(
                "pipeline",
                "drop",
                pipeline=label,
                reason=d.reason,
                frame=d.index,
                detail=d.detail,
                provenance=getattr(self.model, "provenance", None),
            )

        return self.add_drop_listener(on_drop)

    def __repr__(self) -> str:
        return f"VisionPipeline({self.source!r}, policy={self.drop_policy!r}, workers={self.options.workers}, preprocess={self.preprocess!r}, {self._state.value})"

    # -- accounting helpers (call with the lock held) ------------------------------------------------

    def _drop_locked(self, index: int, reason: str, detail: str) -> FrameDrop:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        return FrameDrop(index, reason, detail, _now_ms(), self.source.name)

    # -- errors and callbacks (call without the lock) -------------------------------------------------

    def _fatal(self, exc: BaseException) -> None:
        """A BaseException that is not an Exception reached a stage: keep the first one (run()
        re-raises it after the threads end) and stop at once, discarding what is queued."""
        with self._lock:
            if self._fatal_error is None:
                self._fatal_error = exc
        try:
            self.stop("discard")
        except BaseException:  # a source whose interrupt() raises: the stop flags are set before it
            _log.exception("stopping after %s raised", type(exc).__name__)

    def _callback_raised(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, Exception):
            _log.exception("%s callback raised (ignored)", what)
        else:
            self._fatal(exc)

    def _report_drops(self, drops: list[FrameDrop]) -> None:
        if not drops or (self._on_drop is None and not self._drop_listeners):
            return
        callbacks = ([self._on_drop] if self._on_drop is not None else []) + list(self._drop_listeners)
        for d in drops:
            for cb in callbacks:
                try:
                    cb(d)
                except BaseException as e:
                    self._callback_raised("on_drop", e)

    def _report_error(self, exc: BaseException, frame: Frame | None) -> None:
        """Pass ``exc`` to ``on_error``; a fatal ``exc`` then stops the pipeline (see the module docs)."""
        try:
            if self._on_error is None:
                _log.warning("frame %s: %s: %s", None if frame is None else frame.index, type(exc).__name__, exc)
            else:
                self._on_error(exc, frame)
        except BaseException as e:
            self._callback_raised("on_error", e)
        finally:
            if not isinstance(exc, Exception):
                self._fatal(exc)

    # -- threads -----------------------------------------------------------------------------------

    def _thread_main(self, body: Callable[[], None]) -> None:
        """Run one stage; whatever it raises (a bug in the pipeline itself) stops the pipeline
        instead of leaving the other threads waiting, and the last thread to end finishes it."""
        try:
            body()
        except Exception as e:
            name = threading.current_thread().name
            _log.exception("pipeline thread %s failed", name)
            with self._lock:
                if self._error is None:
                    err = PipelineError(f"pipeline thread {name} failed: {type(e).__name__}: {e}")
                    err.__cause__ = e
                    self._error = err
            try:
                self.stop("discard")
            except BaseException:
                _log.exception("stopping after a pipeline thread failed")
        except BaseException as e:
            self._fatal(e)
        finally:
            with self._cond:
                self._threads_alive -= 1
                last = self._threads_alive == 0
                self._cond.notify_all()
            if last:
                self._finish()

    def _finish(self) -> None:
        """Every thread has ended: account what a failed stage left behind as "shutdown" (nothing
        in a normal run), set STOPPED and wake run()."""
        drops: list[FrameDrop] = []
        with self._cond:
            while self._queue:
                f = self._queue.popleft()[0]
                drops.append(self._drop_locked(f.index, "shutdown", "pipeline ended before it was inferred"))
            for done in self._done.values():
                if done is not None:
                    self._emitting -= 1
                    if done[3] is not None:  # run, not decoded: its model is no longer busy with it
                        self._release_locked(id(done[3]))
                    drops.append(self._drop_locked(done[0].index, "shutdown", "pipeline ended before it reached the sinks"))
            self._done.clear()
            for name in ("_preparing", "_waiting", "_inferring", "_emitting"):
                n = getattr(self, name)
                if n:  # a stage died holding a frame it had not accounted: cannot happen short of a bug
                    _log.error("pipeline ended with %s=%d; counted as shutdown drops", name.lstrip("_"), n)
                    self._dropped["shutdown"] += n
                    setattr(self, name, 0)
            self._state = PipelineState.STOPPED
            self._cond.notify_all()
        try:
            self._report_drops(drops)
        finally:
            self._finished.set()

    # -- stages ------------------------------------------------------------------------------------

    def _wait_wake(self, timeout_s: float) -> None:
        """Sleep up to ``timeout_s`` or until stop / pause / resume / set_max_fps; the caller
        re-reads them afterwards (the event is cleared before that, so no change is missed)."""
        self._wake.wait(timeout_s)
        self._wake.clear()

    def _count_source_drop(self, item: FrameDrop) -> None:
        with self._lock:
            self._frames_in += 1
            self._dropped[item.reason] = self._dropped.get(item.reason, 0) + 1
        self._report_drops([item])

    def _capture_loop(self) -> None:
        src = self.source
        live = src.live
        fps_seen = self._max_fps
        next_due_ms: float | None = None  # when the next frame may pass the rate limit
        last_passed_ms: float | None = None  # timestamp of the last frame that passed it
        error: BaseException | None = None
        try:
            while not self._stop_reading:
                if self._paused and not live:
                    self._wait_wake(1.0)  # not read while paused: nothing is dropped
                    continue
                fps = self._max_fps
                if fps != fps_seen:  # set_max_fps: re-time from the last frame that passed
                    fps_seen = fps
                    next_due_ms = None if fps is None or last_passed_ms is None else last_passed_ms + 1000.0 / fps
                throttle = fps is not None and self._rate_throttles
                if throttle and next_due_ms is not None:
                    delay_s = (next_due_ms - _now_ms()) / 1000.0
                    if delay_s > 0:
                        self._wait_wake(delay_s)
                        continue  # re-check stop, pause and the rate (a wake may come early)
                item = src.read()
                if item is None:
                    break
                if isinstance(item, FrameDrop):
                    self._count_source_drop(item)
                    continue
                if live and self._paused:
                    with self._lock:
                        self._frames_in += 1
                        d = self._drop_locked(item.index, "paused", "pipeline paused")
                    self._report_drops([d])
                    continue
                fps = self._max_fps  # again: a rate set while the source was being read applies to this frame
                if fps != fps_seen:
                    fps_seen = fps
                    next_due_ms = None if fps is None or last_passed_ms is None else last_passed_ms + 1000.0 / fps
                throttle = fps is not None and self._rate_throttles
                ts = item.timestamp_ms
                if fps is not None:
                    interval_ms = 1000.0 / fps
                    tolerance_ms = 0.0 if throttle else interval_ms * 0.2  # camera jitter
                    if not throttle and next_due_ms is not None and ts < next_due_ms - tolerance_ms:
                        with self._lock:
                            self._frames_in += 1
                            d = self._drop_locked(item.index, "rate_limit", f"over max_fps={fps:g}")
                        self._report_drops([d])
                        continue
                    next_due_ms = (ts if next_due_ms is None else max(next_due_ms, ts - tolerance_ms)) + interval_ms
                last_passed_ms = ts
                if self._inline:
                    self._run_inline(item)
                    continue
                model, split, _ = self._active
                if not (self._capture_prep and split):
                    self._admit(item, None, None)
                    continue
                with self._lock:
                    self._frames_in += 1
                    self._preparing += 1
                try:
                    prepared = model.prepare_image(item.image, color=item.color)
                except BaseException as e:  # the frame's error; a fatal one also stops the pipeline
                    with self._lock:
                        self._preparing -= 1
                        d = self._drop_locked(item.index, "error", f"frame {item.index}: {type(e).__name__}: {e}")
                    self._report_error(e, item)
                    self._report_drops([d])
                    continue
                self._admit(item, prepared, model, counted=True)
        except Exception as e:  # a failed source ends the capture; run() raises it
            error = e
        except BaseException as e:  # fatal: run() re-raises it once everything has stopped
            self._fatal(e)
        finally:
            try:
                src.close()
            except Exception as e:
                error = error or e
            except BaseException as e:
                self._fatal(e)
            finally:
                with self._cond:
                    self._capture_done = True
                    if error is not None and self._error is None:
                        self._error = error
                    self._cond.notify_all()

    def _admit(self, frame: Frame, prepared: Any, prepared_by: Any, counted: bool = False) -> None:
        """Queue ``(frame, prepared, prepared_by)`` under the drop policy. ``counted``: frames_in
        was already incremented (and ``preparing`` is released here)."""
        drops: list[FrameDrop] = []
        q, cap = self._queue, self.options.queue_size
        item = (frame, prepared, prepared_by)
        with self._cond:
            if counted:
                self._preparing -= 1
            else:
                self._frames_in += 1
            policy = self.drop_policy
            if self._discard:
                drops.append(self._drop_locked(frame.index, "shutdown", "discarded by stop()"))
            elif policy == "latest":
                while q:
                    old = q.popleft()[0]
                    drops.append(self._drop_locked(old.index, "evicted", f"replaced by newer frame {frame.index}"))
                q.append(item)
            elif len(q) < cap:
                q.append(item)
            elif policy == "drop_newest":
                drops.append(self._drop_locked(frame.index, "queue_full", f"queue full ({cap} frames)"))
            elif policy == "drop_oldest":
                old = q.popleft()[0]
                drops.append(self._drop_locked(old.index, "evicted", f"queue full ({cap} frames), oldest evicted"))
                q.append(item)
            else:  # block: back-pressure the source
                self._waiting += 1
                try:
                    while len(q) >= cap and not self._discard and self._workers_alive:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                if self._discard or not self._workers_alive:
                    drops.append(self._drop_locked(frame.index, "shutdown", "discarded by stop()"))
                else:
                    q.append(item)
            if len(q) > self._max_depth:
                self._max_depth = len(q)
            self._cond.notify_all()
        self._report_drops(drops)

    def _run_inline(self, frame: Frame) -> None:
        """preprocess="inline": infer ``frame`` on this (the capture) thread and hand its result to
        the sinks, with the accounting a worker and the output thread keep."""
        busy = self._busy
        with self._cond:
            self._frames_in += 1
            if self._discard:
                d = self._drop_locked(frame.index, "shutdown", "discarded by stop()")
                model = None
            else:
                model = self._active[0]  # taken now: a swap_model() before this point applies
                key = id(model)
                busy[key] = busy.get(key, 0) + 1
                self._inferring += 1
        if model is None:
            self._report_drops([d])
            return
        fr, err = self._infer(model, frame, None)
        with self._cond:
            drop = self._inferred_locked(key, frame, fr, err)
        self._report_failure(frame, err, drop)
        if fr is not None:
            self._emit(*fr)

    def _infer(
        self, model: Any, frame: Frame, prepared: Any, defer: bool = False
    ) -> tuple[tuple[Frame, Any, float] | None, BaseException | None]:
        """Run ``model`` on ``frame`` (``prepared``: its prepare_image result, or None): the
        ``(frame, result, done ms)`` to emit, or the exception the frame raised. With ``defer`` the
        result is ``model.run_prepared``'s InferredImage, for the output thread to decode."""
        try:
            if defer:
                if prepared is None:
                    prepared = model.prepare_image(frame.image, color=frame.color)
                result = model.run_prepared(prepared)
            elif prepared is not None:
                result = model.predict_prepared(prepared, **self._predict_kw)
            else:
                result = model.predict_image(frame.image, color=frame.color, **self._predict_kw)
            return (frame, result, _now_ms()), None
        except BaseException as e:  # the frame's error; a fatal one also stops the pipeline
            return None, e

    def _inferred_locked(
        self, key: int, frame: Frame, fr: tuple[Frame, Any, float] | None, err: BaseException | None, release: bool = True
    ) -> FrameDrop | None:
        """With the lock held: the frame has left inference (on the model ``key``); it waits for the
        sinks, or is an "error" drop (returned, to report without the lock). ``release`` False: the
        model stays busy with it until the output thread has decoded it (:meth:`_release_locked`)."""
        self._inferring -= 1
        if release or fr is None:
            self._release_locked(key)
        self._cond.notify_all()  # wait_model_idle, room for the workers
        if fr is not None:
            self._emitting += 1
            return None
        return self._drop_locked(frame.index, "error", f"frame {frame.index}: {type(err).__name__}: {err}")

    def _release_locked(self, key: int) -> None:
        busy = self._busy
        n = busy[key] - 1
        if n:
            busy[key] = n
        else:
            del busy[key]

    def _report_failure(self, frame: Frame, err: BaseException | None, drop: FrameDrop | None) -> None:
        if err is not None:
            self._report_error(err, frame)
        if drop is not None:  # set exactly when err is
            self._report_drops([drop])

    def _worker_loop(self) -> None:
        busy = self._busy
        try:
            while True:
                with self._cond:
                    while not (self._queue and self._inferring + self._emitting < self._out_capacity):
                        if not self._queue and self._capture_done:
                            return
                        self._cond.wait()
                    frame, prepared, prepared_by = self._queue.popleft()
                    model, _, defer = self._active  # taken now: a swap_model() before this point applies
                    key = id(model)
                    busy[key] = busy.get(key, 0) + 1
                    if prepared is not None and prepared_by is not model:
                        prepared = None  # prepared for a model swapped out since: prepare again
                        self._reprepared += 1
                    seq = self._next_take
                    self._next_take += 1
                    self._inferring += 1
                    self._cond.notify_all()  # room in the queue
                fr, err = self._infer(model, frame, prepared, defer)
                with self._cond:
                    drop = self._inferred_locked(key, frame, fr, err, release=not defer)
                    # the output thread hands it on in order (None: failed), decoding it first with defer
                    self._done[seq] = None if fr is None else (*fr, model if defer else None)
                self._report_failure(frame, err, drop)
        finally:
            with self._cond:
                self._workers_alive -= 1
                self._cond.notify_all()

    def _emit(self, frame: Frame, result: Any, t_done: float) -> None:
        """Hand one result to the sinks; it counts as processed whatever they raise."""
        failures: list[BaseException] = []
        try:
            state = None
            gov = self.governor
            if gov is not None:
                try:
                    state = gov.state.value
                    timings = getattr(result, "timings", None)
                    if timings is not None:
                        gov.record_inference(timings.total_ms / 1e3)
                except BaseException as e:  # reported like a sink's error, not counted as one
                    self._report_error(e, frame)
            fr = FrameResult(frame.index, frame.timestamp_ms, result, t_done - frame.timestamp_ms, frame, state)
            for sink in self.sinks:
                try:
                    sink.write(fr)
                except BaseException as e:
                    failures.append(e)
                    if not isinstance(e, Exception):
                        break  # fatal: the sinks after it do not get this frame
        finally:
            with self._cond:
                self._emitting -= 1
                self._processed += 1
                self._sink_errors += len(failures)
                self._cond.notify_all()
        for err in failures:
            self._report_error(err, frame)

    def _output_loop(self) -> None:
        next_seq = 0
        while True:
            with self._cond:
                while next_seq not in self._done:
                    if self._workers_alive == 0:
                        return
                    self._cond.wait()
                done = self._done.pop(next_seq)
            next_seq += 1
            if done is None:
                continue
            frame, result, t_done, model = done
            if model is not None:  # decode "output": the worker ran the model, the decode is this thread's
                err: BaseException | None = None
                try:
                    result = model.decode_inferred(result, **self._predict_kw)
                    t_done = _now_ms()
                except BaseException as e:  # the frame's error; a fatal one also stops the pipeline
                    err = e
                with self._cond:
                    self._release_locked(id(model))
                    drop = None
                    if err is not None:
                        self._emitting -= 1
                        drop = self._drop_locked(frame.index, "error", f"frame {frame.index}: {type(err).__name__}: {err}")
                    self._cond.notify_all()  # wait_model_idle, room for the workers
                if err is not None:
                    self._report_failure(frame, err, drop)
                    continue
            self._emit(frame, result, t_done)
