"""Windowed signal streams: audio and other sampled sensors over a :class:`~edge_sdk.model.Model`.

A :class:`SignalStream` takes samples as they arrive, in chunks of any size, each with
the timestamp of its first sample, and runs the model on every full window::

    opts = SignalStreamOptions(sample_rate_hz=16000, window=576, hop=512, prefill=64)
    stream = SignalStream(model, opts, constants={"sr": np.array(16000, np.int64)})
    for w in stream.push(chunk, timestamp_ms=t):        # chunk: float32 [n] or [n, channels]
        print(w.timestamp_ms, w.outputs["output"])

Windows are ``window`` samples long and start every ``hop`` samples (``hop > window``
skips samples). ``prefill`` zero samples sit in front of the first window, for models
that take left context (Silero VAD takes 64 samples of the previous chunk in front of
each 512 new ones: window 576, hop 512, prefill 64).

The sample clock is the reference: the timestamp of a window is the timestamp of the
push that anchored the clock plus (samples since then) / ``sample_rate_hz``. Each push's
timestamp is checked against that clock; a difference within
``timestamp_tolerance_ms`` is jitter and ignored, beyond it the timestamps say samples
are missing (a gap) or repeated (an overlap), and the stream applies its policies:

========================  ==================================================================
gap, ``"reset"``          drop the buffer, reset the model state, re-anchor at the new push
gap, ``"fill"``           feed zeros for the missing samples (at most ``max_gap_ms``; a longer
                          gap resets), windows that hold zeros say so in ``filled_samples``
gap, ``"error"``          raise :class:`GapError`; the stream is left as it was
overlap, ``"drop"``       drop the push's samples the stream already has, keep the rest
timestamp <= previous     out of order or duplicate: ``"drop"`` drops the whole push,
                          ``"error"`` raises :class:`TimestampError`
========================  ==================================================================

Every decision is recorded as a :class:`StreamEvent` (``pop_events()``); the windows
themselves carry ``epoch``, which changes whenever the stream restarted, so a consumer can
tell continuity without reading events.

Memory per stream is fixed by the options: one buffer of ``max_buffer_samples`` x
``channels`` samples (default: one window), whatever the size of a push, plus a bounded
event log. A :class:`StreamRouter` keeps one stream per id, at most ``max_streams``
(least-recently-pushed evicted, or refused), each with its own model state, and can run
windows of several streams as one batch: any model with a dynamic batch dim, stateful ones
too when the manifest's state pairs declare ``batch_axis`` (each stream's state is stacked on
that axis for the call and split back after it; one window per stream per call).

A server of many streams that gets every stream's chunk at once pushes them in one call,
``router.push_block(ids, chunks, timestamps)`` (``chunks``: [k, n] mono): the same windows,
states and results as a ``push`` per chunk, with the clocks, cuts and states of the steady
streams handled as arrays, returned as one :class:`WindowBlock` of columns::

    block = router.push_block(ids, chunks, timestamps)
    speech[block.position] = block.outputs["output"][:, 0, 0]   # row i: stream block.stream_ids[i]

Nothing here starts a thread: a router's bounded wait is enforced when ``push``/``poll``
is called (call ``poll()`` from your loop at least every ``max_wait_ms``).
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import (
    EdgeSDKError,
    InputDTypeError,
    InputError,
    InputShapeError,
    InputTypeError,
    NonFiniteInputError,
    OptionsError,
    SessionClosedError,
)
from ..validation import InputValidator, _probably_finite

if TYPE_CHECKING:  # pragma: no cover
    from ..model import Model, Result

# Builds a NamedTuple instance straight from a tuple of all its fields, as NamedTuple._make does, without the
# Python-level ``__new__`` a NamedTuple call goes through (~0.3 us): the hot path makes one _Frame and _Pending
# per window and one Result and WindowResult per batch row.
_tnew = tuple.__new__
_NO_LOCK = contextlib.nullcontext()

__all__ = [
    "SignalStreamOptions",
    "SignalStream",
    "StreamRouter",
    "WindowResult",
    "StreamEvent",
    "SignalConfigError",
    "SignalDTypeError",
    "SignalShapeError",
    "NonFiniteSignalError",
    "TimestampError",
    "GapError",
    "StreamClosedError",
    "StreamLimitError",
    "DuplicateStreamError",
    "StreamRouterOwnedError",
    "BlockPushError",
    "WindowBlock",
]


# --- errors ---------------------------------------------------------------------------


class SignalConfigError(OptionsError):
    """Stream options, or options and model, do not fit together (raised on construction)."""


class SignalDTypeError(InputDTypeError):
    """Pushed samples have another dtype than ``SignalStreamOptions.dtype``; nothing is cast."""


class SignalShapeError(InputShapeError):
    """Pushed samples are not ``[n]`` (mono) or ``[n, channels]``."""


class NonFiniteSignalError(NonFiniteInputError):
    """Pushed samples hold NaN or Inf; the push is refused and the stream is unchanged."""


class TimestampError(InputError):
    """A push's timestamp is not finite, goes backwards, repeats, or overlaps samples
    the stream already has (with ``out_of_order_policy="error"``)."""


class GapError(TimestampError):
    """Samples are missing before a push (with ``gap_policy="error"``). The stream is
    unchanged; ``reset()`` and push again to start over at the new timestamp."""


class StreamClosedError(SessionClosedError):
    """A call on a stream (or router) after ``close()``."""


class StreamLimitError(EdgeSDKError, RuntimeError):
    """A router already has ``max_streams`` open streams and ``eviction="error"``."""


class DuplicateStreamError(EdgeSDKError, ValueError):
    """``StreamRouter.open`` for a stream id that is already open, or an id twice in one
    ``StreamRouter.push_block``."""


class StreamRouterOwnedError(EdgeSDKError, RuntimeError):
    """``SignalStream.push`` on a stream of a batching StreamRouter: push through the router,
    which keeps the stream's windows in order with those queued for a batch."""


class BlockPushError(EdgeSDKError):
    """Some chunks of a :meth:`StreamRouter.push_block` were refused, or the model call that had
    their windows failed; every other chunk of the block was pushed and run. ``errors`` maps each
    such chunk's stream id to its error: the typed error ``push()`` raises for it
    (NonFiniteSignalError, TimestampError, GapError, StreamClosedError, ...) or the call's
    (SessionError, ...); ``results`` holds the WindowBlock of the windows that ran, which the call
    would have returned."""

    def __init__(self, errors: dict[Hashable, Exception], results: "WindowBlock", chunks: int) -> None:
        self.errors = errors
        self.results = results
        first_id, first = next(iter(errors.items()))
        ids = list(errors)
        shown = ", ".join(repr(i) for i in ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        super().__init__(
            f"push_block: {len(ids)} of {chunks} chunks refused or their call failed (stream {shown}); the other {chunks - len(ids)} were "
            f"pushed, and the {len(results)} windows this call ran are in .results. Stream {first_id!r}: {first}"
        )


# --- options ------------------------------------------------------------------------------

GAP_POLICIES = ("reset", "fill", "error")
OUT_OF_ORDER_POLICIES = ("drop", "error")
EVICTIONS = ("lru", "error")

# How a window (a fresh [window, channels] array) becomes the model's input.
# N: batch of 1, T: time (samples), C: channels.
_LAYOUTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "T": lambda w: w[:, 0],
    "TC": lambda w: w,
    "CT": lambda w: w.T,
    "NT": lambda w: w[:, 0][None],
    "NTC": lambda w: w[None],
    "NCT": lambda w: w.T[None],
}


def _pos_int(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SignalConfigError(f"{name}: expected an int >= 1, got {v!r}")


def _number(name: str, v: Any, *, positive: bool) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise SignalConfigError(f"{name}: expected a finite number {'> 0' if positive else '>= 0'}, got {v!r}")


def _finite(x: np.ndarray) -> bool:
    """True when the float array ``x`` holds no NaN/Inf: validation's cheapest pass for its size and
    dtype (one ``np.vdot`` above 64 float32/float64 elements, no floating-point warning), and the
    exact element-wise check where that pass cannot tell (a sum of squares that overflowed)."""
    return _probably_finite(x) or bool(np.isfinite(x).all())


@dataclass(frozen=True)
class SignalStreamOptions:
    """How a sampled signal is cut into model windows, and what to do when it is not clean.

    sample_rate_hz: samples per second per channel. window: samples per model call.
    hop: samples between window starts (default ``window``; ``< window`` overlaps,
    ``> window`` skips). channels: samples per time step. dtype: the dtype pushes must
    have (never cast). layout: how a window is fed (N batch of 1, T time, C channels):
    "NT" (default, mono), "T", "TC", "CT", "NTC", "NCT". prefill: zero samples in front of
    the first window (left context; < window). gap_policy: "reset" | "fill" | "error".
    max_gap_ms: the longest gap "fill" zero-fills; longer gaps reset.
    out_of_order_policy: "drop" | "error" for timestamps that go backwards, repeat or overlap.
    timestamp_tolerance_ms: push timestamps within this of the sample clock are jitter.
    max_buffer_samples: buffer per stream, in samples (>= window; default window): pushes of
    any size pass through it. max_events: events kept per stream (older ones are dropped).
    """

    sample_rate_hz: float
    window: int
    hop: int | None = None
    channels: int = 1
    dtype: str = "float32"
    layout: str = "NT"
    prefill: int = 0
    gap_policy: str = "reset"
    max_gap_ms: float = 1000.0
    out_of_order_policy: str = "drop"
    timestamp_tolerance_ms: float = 2.0
    max_buffer_samples: int | None = None
    max_events: int = 256

    def __post_init__(self) -> None:
        _number("sample_rate_hz", self.sample_rate_hz, positive=True)
        _pos_int("window", self.window)
        if self.hop is not None:
            _pos_int("hop", self.hop)
        _pos_int("channels", self.channels)
        _pos_int("max_events", self.max_events)
        try:
            dt = np.dtype(self.dtype)
        except TypeError as e:
            raise SignalConfigError(f"dtype: {self.dtype!r} is not a numpy dtype") from e
        if dt.kind not in "fiu":
            raise SignalConfigError(f"dtype: expected a numeric dtype (float/int), got {self.dtype!r}")
        if self.layout not in _LAYOUTS:
            raise SignalConfigError(f"layout: expected one of {sorted(_LAYOUTS)}, got {self.layout!r}")
        if "C" not in self.layout and self.channels != 1:
            raise SignalConfigError(f"layout {self.layout!r} has no channel axis, so channels must be 1, got {self.channels}")
        if isinstance(self.prefill, bool) or not isinstance(self.prefill, int) or not 0 <= self.prefill < self.window:
            raise SignalConfigError(f"prefill: expected an int in [0, window={self.window}), got {self.prefill!r}")
        if self.gap_policy not in GAP_POLICIES:
            raise SignalConfigError(f"gap_policy: expected one of {GAP_POLICIES}, got {self.gap_policy!r}")
        if self.out_of_order_policy not in OUT_OF_ORDER_POLICIES:
            raise SignalConfigError(f"out_of_order_policy: expected one of {OUT_OF_ORDER_POLICIES}, got {self.out_of_order_policy!r}")
        _number("max_gap_ms", self.max_gap_ms, positive=False)
        _number("timestamp_tolerance_ms", self.timestamp_tolerance_ms, positive=False)
        if self.max_buffer_samples is not None:
            _pos_int("max_buffer_samples", self.max_buffer_samples)
            if self.max_buffer_samples < self.window:
                raise SignalConfigError(f"max_buffer_samples: must hold one window ({self.window}), got {self.max_buffer_samples}")

    @property
    def hop_samples(self) -> int:
        """Samples between window starts: ``hop``, or ``window`` (no overlap) if unset."""
        return self.hop if self.hop is not None else self.window

    @property
    def buffer_samples(self) -> int:
        """Samples the stream may buffer: ``max_buffer_samples``, or one window if unset."""
        return self.max_buffer_samples if self.max_buffer_samples is not None else self.window

    @property
    def window_ms(self) -> float:
        """The window length in milliseconds."""
        return self.window * 1000.0 / self.sample_rate_hz

    @property
    def hop_ms(self) -> float:
        """The hop in milliseconds."""
        return self.hop_samples * 1000.0 / self.sample_rate_hz

    def window_shape(self) -> tuple[int, ...]:
        """The shape one window is fed to the model with (per ``layout``)."""
        dims = {"N": 1, "T": self.window, "C": self.channels}
        return tuple(dims[a] for a in self.layout)


# --- results and events -----------------------------------------------------------------


class StreamEvent(NamedTuple):
    """Something a stream decided about its input.

    kind: "gap" | "overlap" | "out_of_order" | "duplicate" | "reset" | "evicted".
    action: "reset" | "fill" | "drop" | "close" (what was done about it).
    timestamp_ms: the push's timestamp (for "reset"/"evicted": when known, else NaN).
    samples: how many samples were missing, zero-filled or dropped (per channel).
    """

    kind: str
    action: str
    stream_id: Hashable
    timestamp_ms: float
    samples: int
    detail: str


class WindowResult(NamedTuple):
    """The model's result for one window of one stream.

    index: windows of this stream before this one (counted from open, across resets).
    start_sample: index of the window's first sample in the stream's sample clock (0 =
    first sample pushed; zero-fills count, ``prefill`` samples are negative).
    timestamp_ms: time of that first sample. epoch: changes whenever the stream restarted
    (gap reset, ``reset()``): windows with equal epochs are continuous.
    filled_samples: samples of this window that are zero-fill for a gap.
    """

    stream_id: Hashable
    index: int  # type: ignore[assignment]  # shadows tuple.index; the public field name stays
    start_sample: int
    timestamp_ms: float
    duration_ms: float
    epoch: int
    filled_samples: int
    result: "Result"

    @property
    def outputs(self) -> Mapping[str, np.ndarray]:
        """The model's raw outputs for this window, by name."""
        return self.result.outputs

    @property
    def end_ms(self) -> float:
        """Time just after the window's last sample: ``timestamp_ms + duration_ms``."""
        return self.timestamp_ms + self.duration_ms


class _Batch(NamedTuple):
    """The windows of one model call of a router, as columns (row i: a window of stream
    ``stream_ids[i]``), before they become WindowResults or part of a WindowBlock: lists
    (``push()``'s path, turned into WindowResults as they are) or arrays (a block's)."""

    stream_ids: tuple[Hashable, ...]
    index: Sequence[int]  # type: ignore[assignment]  # shadows tuple.index, as WindowResult's does
    start_sample: Sequence[int]
    timestamp_ms: Sequence[float]
    epoch: Sequence[int]
    filled_samples: Sequence[int]
    outputs: "_Columns"
    result: "Result"


def _windows(
    ids: Sequence[Hashable], index: Sequence[int], start: Sequence[int], ts: Sequence[float], dur: float, epoch: Sequence[int], filled: Sequence[int], part: tuple["Result", "_Columns"]
) -> list[WindowResult]:
    """One :class:`WindowResult` per row of one call (``part``: its Result and output columns), as
    ``push()`` returns them."""
    r, cols = part
    R = type(r)
    rest = r[2:]
    names = list(cols)
    dec = r.decoded
    assert dec is None or isinstance(dec, tuple)  # a router refuses detection and segmentation decoders
    decs = [None] * len(ids) if dec is None else [(d,) for d in dec]
    return [
        _tnew(WindowResult, (sid, i, s0, t, dur, e, f, _tnew(R, (dict(zip(names, vals)), d, *rest))))
        for sid, i, s0, t, e, f, vals, d in zip(ids, index, start, ts, epoch, filled, zip(*(cols[k] for k in names)), decs)
    ]


def _batch_windows(b: _Batch, dur: float) -> list[WindowResult]:
    return _windows(b.stream_ids, b.index, b.start_sample, b.timestamp_ms, dur, b.epoch, b.filled_samples, (b.result, b.outputs))


class WindowBlock:
    """The windows one :meth:`StreamRouter.push_block` call ran, as columns: row ``i`` is a window
    of stream ``stream_ids[i]``; per stream, rows are in order.

    ``index``, ``start_sample``, ``epoch``, ``filled_samples`` (int64) and ``timestamp_ms``
    (float64) are arrays of the rows' :class:`WindowResult` fields, ``duration_ms`` their
    window length. ``outputs[name]`` is an array of every row's output, stacked on a new axis 0
    (``outputs[name][i]`` is row i's output as its WindowResult has it: size 1 on the batch
    axis); it is put together when first asked for. ``results`` holds one Result per model call
    (timings, variant, ``batch_size``: that call's rows), in row order. :meth:`windows` gives the
    WindowResult list ``push()`` would have returned. ``position`` (int64) is each row's stream's
    position in the ``stream_ids`` the block was pushed with (-1 for a stream not in the block:
    windows it had queued from earlier pushes), so ``out[block.position] = block.outputs[name]``
    lines results up with the chunks that made them.
    """

    __slots__ = (
        "stream_ids", "position", "index", "start_sample", "timestamp_ms", "duration_ms", "epoch", "filled_samples", "results", "_parts", "_stacked",
    )  # fmt: skip

    def __init__(
        self,
        stream_ids: tuple[Hashable, ...],
        position: np.ndarray,
        index: np.ndarray,
        start_sample: np.ndarray,
        timestamp_ms: np.ndarray,
        duration_ms: float,
        epoch: np.ndarray,
        filled_samples: np.ndarray,
        parts: "list[tuple[Result, _Columns]]",
    ) -> None:
        self.stream_ids = stream_ids
        self.position = position
        self.index = index
        self.start_sample = start_sample
        self.timestamp_ms = timestamp_ms
        self.duration_ms = duration_ms
        self.epoch = epoch
        self.filled_samples = filled_samples
        self.results: tuple["Result", ...] = tuple(r for r, _ in parts)
        self._parts = parts
        self._stacked: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.stream_ids)

    def __repr__(self) -> str:
        return f"WindowBlock({len(self.stream_ids)} windows of {len(set(self.stream_ids))} streams, {len(self.results)} model calls)"

    @property
    def outputs(self) -> Mapping[str, np.ndarray]:
        """The rows' outputs by name, stacked on axis 0 (each put together once, when asked for)."""
        return _Stacked(self)

    def _output(self, name: str) -> np.ndarray:
        v = self._stacked.get(name)
        if v is None:
            parts = self._parts
            if not parts:
                raise KeyError(name)
            v = parts[0][1][name] if len(parts) == 1 else _Columns.stack(name, [cols for _, cols in parts])
            self._stacked[name] = v
        return v

    def windows(self) -> list[WindowResult]:
        """One :class:`WindowResult` per row, as ``push()`` returns them."""
        ids, index, start, ts, epoch, filled = (
            self.stream_ids, self.index.tolist(), self.start_sample.tolist(), self.timestamp_ms.tolist(), self.epoch.tolist(), self.filled_samples.tolist()
        )  # fmt: skip
        out: list[WindowResult] = []
        a = 0
        for r, cols in self._parts:
            e = a + r.batch_size
            out += _windows(ids[a:e], index[a:e], start[a:e], ts[a:e], self.duration_ms, epoch[a:e], filled[a:e], (r, cols))
            a = e
        return out


class _Stacked(Mapping[str, np.ndarray]):
    """A WindowBlock's outputs by name (see WindowBlock.outputs)."""

    __slots__ = ("_block",)

    def __init__(self, block: WindowBlock) -> None:
        self._block = block

    def __getitem__(self, name: str) -> np.ndarray:
        return self._block._output(name)

    def __iter__(self) -> Iterator[str]:
        parts = self._block._parts
        return iter(parts[0][1] if parts else ())

    def __len__(self) -> int:
        parts = self._block._parts
        return len(parts[0][1]) if parts else 0


class _Columns(Mapping[str, np.ndarray]):
    """A call's outputs by name, each as [rows, *row shape]: ``columns[name][i]`` is row i's output
    as unbatched (size 1 on the batch axis), a view of the call's output (made when asked for)."""

    __slots__ = ("_outs", "_axes")

    def __init__(self, outs: Mapping[str, np.ndarray], axes: Mapping[str, int] | None) -> None:
        self._outs = outs
        self._axes = axes  # outputs whose rows are not on axis 0 (states): that axis; None: one unbatched row

    def __getitem__(self, name: str) -> np.ndarray:
        v = self._outs[name]
        if self._axes is None:
            return v[None]
        ax = self._axes.get(name, 0)
        if not ax:
            return v[:, None]
        rows: np.ndarray = v.transpose(ax, *(i for i in range(v.ndim) if i != ax))[(slice(None),) * (ax + 1) + (None,)]
        return rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._outs)

    def __len__(self) -> int:
        return len(self._outs)

    @staticmethod
    def stack(name: str, calls: "list[_Columns]") -> np.ndarray:
        """Output ``name`` of several calls, their rows one after the other (as ``columns[name]``): the
        calls' outputs joined with one concatenation, then given the row view once."""
        first = calls[0]
        if first._axes is None:  # unbatched calls: one row each
            return np.stack([c._outs[name] for c in calls])
        joined = _Columns({name: np.concatenate([c._outs[name] for c in calls], axis=first._axes.get(name, 0))}, first._axes)
        return joined[name]


def _one_row(w: WindowResult) -> _Batch:
    """An unbatched window as a _Batch of one row (``push_block`` on a router with batch_size 1)."""
    return _tnew(
        _Batch,
        (
            (w.stream_id,),
            [w.index],
            [w.start_sample],
            [w.timestamp_ms],
            [w.epoch],
            [w.filled_samples],
            _Columns(w.result.outputs, None),
            w.result,
        ),
    )


class _Frame(NamedTuple):
    window: int  # WindowResult.index (not "index": that would shadow tuple.index)
    start_sample: int
    timestamp_ms: float
    epoch: int
    filled: int
    data: np.ndarray  # model-ready (layout applied, C-contiguous, owned)


class _Plan(NamedTuple):
    reset: bool  # the model state must be reset before these frames
    frames: list[_Frame]


# --- the framer: samples -> windows, timestamps, policies (no model) -------------------------


class _Framer:
    """Cuts pushes into windows through a fixed buffer and applies the timestamp policies.

    :meth:`push` is the general path. :meth:`push_steady` is the one a live source takes almost
    always, made cheap: a push of exactly ``hop`` samples (hop <= window) that continues the sample
    clock within the tolerance, onto a buffer that holds window - hop .. window - 1 samples and no
    zero fill, makes exactly one window and leaves the buffer as full as before; it checks only
    what that case needs and builds the window with one concatenation. Anything else goes to :meth:`push`, which gives the
    same windows (tests/test_streams.py compares both on random push sequences)."""

    def __init__(
        self, opts: SignalStreamOptions, stream_id: Hashable, emit: Callable[[StreamEvent], None], buf: np.ndarray | None = None
    ) -> None:
        self.o = opts
        self.stream_id = stream_id
        self._emit = emit
        self._dtype = np.dtype(opts.dtype)
        self._is_float = self._dtype.kind == "f"
        self._sr = float(opts.sample_rate_hz)
        self._ms_per_sample = 1000.0 / self._sr
        self._tol = float(opts.timestamp_tolerance_ms)
        self._window = opts.window
        self._hop = opts.hop_samples
        self._layout = _LAYOUTS[opts.layout]
        # The sample buffer: its own, or a batching router's slab row (_Slab), of shape [buffer_samples, channels].
        self._buf = np.zeros((opts.buffer_samples, opts.channels), dtype=self._dtype) if buf is None else buf
        # The steady state (push_steady): the buffer holds window - hop .. window - 1 samples (then a push of
        # hop samples completes exactly one window and leaves as many); hop > window (skips) is never steady.
        # Pushes of these shapes qualify; mono "T"/"NT" windows are cut from 1-D arrays (no layout step).
        self._steady_min = opts.window - self._hop if self._hop <= opts.window else opts.window
        self._steady_shapes = frozenset({(self._hop, opts.channels)} | ({(self._hop,)} if opts.channels == 1 else set()))
        self._mono_1d = opts.channels == 1 and opts.layout in ("T", "NT")
        self._win_shape = opts.window_shape()
        self._head_views(0)
        self._index = 0
        self._in_idx = 0  # sample index of the next sample entering the stream
        self.epoch = -1
        self._restart()  # epoch 0

    # -- state ----------------------------------------------------------------------

    def _restart(self) -> None:
        p = self.o.prefill
        self._buf[:p] = 0
        self._fill = p  # samples in the buffer
        self._skip = 0  # samples still to skip before the next window (hop > window)
        self._filled: list[tuple[int, int]] = []  # [start, end) zero-filled sample ranges still buffered
        self._anchor_ts: float | None = None
        self._anchor_idx = self._in_idx
        self._last_ts: float | None = None
        self.epoch += 1

    def restart(self) -> None:
        self._restart()

    def _head_views(self, fill: int) -> None:
        """Views of the buffer's first ``fill`` samples, as push_steady reads and rewrites them (kept
        while the fill stays the same, as it does in the steady state)."""
        self._head_n = fill
        self._head2 = self._buf[:fill]
        self._head1 = self._buf[:fill, 0]

    def rebind(self, buf: np.ndarray) -> None:
        """Use ``buf`` (a copy of the buffer, moved to a grown slab) from now on."""
        self._buf = buf
        self._head_views(self._head_n)

    @property
    def buffered_samples(self) -> int:
        return self._fill

    @property
    def nbytes(self) -> int:
        return self._buf.nbytes

    def expected_timestamp_ms(self) -> float | None:
        """Where the sample clock says the next push starts (None before the first push)."""
        if self._anchor_ts is None:
            return None
        return self._anchor_ts + (self._in_idx - self._anchor_idx) * self._ms_per_sample

    # -- input checks ----------------------------------------------------------------

    def check(self, samples: Any) -> np.ndarray:
        """The samples as an [n, channels] view; raises typed errors naming expected vs actual."""
        o = self.o
        if not isinstance(samples, np.ndarray):
            raise InputTypeError(f"stream {self.stream_id!r}: expected samples as a numpy.ndarray of {o.dtype}, got {type(samples).__name__}")
        if samples.dtype != self._dtype:
            raise SignalDTypeError(f"stream {self.stream_id!r}: expected samples of dtype {o.dtype}, got {samples.dtype} (nothing is cast)")
        want = "[n]" if o.channels == 1 else f"[n, {o.channels}]"
        if samples.ndim == 1:
            if o.channels != 1:
                raise SignalShapeError(f"stream {self.stream_id!r}: expected samples of shape [n, {o.channels}] ({o.channels} channels), got shape {samples.shape}")
            x = samples.reshape(-1, 1)
        elif samples.ndim == 2:
            if samples.shape[1] != o.channels:
                raise SignalShapeError(
                    f"stream {self.stream_id!r}: expected {o.channels} channel(s), shape {want} or [n, {o.channels}], got shape {samples.shape}"
                )
            x = samples
        else:
            raise SignalShapeError(f"stream {self.stream_id!r}: expected samples of shape {want}, got rank {samples.ndim} shape {samples.shape}")
        if self._is_float and x.size and not _finite(x):
            bad = int(np.count_nonzero(~np.isfinite(x)))
            raise NonFiniteSignalError(f"stream {self.stream_id!r}: expected finite samples, got {bad} NaN/Inf of {x.size}; the push was refused")
        return x

    @staticmethod
    def check_timestamp(stream_id: Hashable, timestamp_ms: Any) -> float:
        if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, (int, float, np.integer, np.floating)):
            raise InputTypeError(f"stream {stream_id!r}: expected timestamp_ms as a number, got {type(timestamp_ms).__name__}")
        ts = float(timestamp_ms)
        if not math.isfinite(ts):
            raise TimestampError(f"stream {stream_id!r}: expected a finite timestamp_ms, got {ts}")
        return ts

    # -- the push ----------------------------------------------------------------------

    def push_steady(self, samples: Any, timestamp_ms: Any) -> _Frame | None:
        """The push's one window if it is a steady-state push (see the class), else None with
        nothing changed (call :meth:`push`, which also raises whatever the push deserves)."""
        fill = self._fill
        if not self._steady_min <= fill < self._window or self._filled or type(timestamp_ms) is not float:
            return None
        if type(samples) is not np.ndarray or samples.dtype != self._dtype or samples.shape not in self._steady_shapes:
            return None
        anchor_ts, last_ts = self._anchor_ts, self._last_ts
        if anchor_ts is None or last_ts is None or timestamp_ms <= last_ts:
            return None
        i = self._in_idx
        delta = timestamp_ms - (anchor_ts + (i - self._anchor_idx) * self._ms_per_sample)  # as push() computes it
        if not -self._tol <= delta <= self._tol:
            return None
        if self._is_float and not _finite(samples):
            return None
        if fill != self._head_n:
            self._head_views(fill)
        w = self._window
        if self._mono_1d:
            flat = np.concatenate((self._head1, samples if samples.ndim == 1 else samples[:, 0]))  # fill + hop >= window
            data = (flat if fill + self._hop == w else flat[:w]).reshape(self._win_shape)
            self._head1[:] = flat[self._hop :]
        else:
            win = np.concatenate((self._head2, samples if samples.ndim == 2 else samples[:, None]))
            data = self._layout(win if fill + self._hop == w else win[:w])
            if not data.flags.c_contiguous:
                data = data.copy()
            self._head2[:] = win[self._hop :]
        start = i - fill
        self._in_idx = i + self._hop
        self._last_ts = timestamp_ms
        k = self._index
        self._index = k + 1
        return _tnew(_Frame, (k, start, anchor_ts + (start - self._anchor_idx) * self._ms_per_sample, self.epoch, 0, data))

    def push(self, samples: Any, timestamp_ms: Any) -> _Plan:
        x = self.check(samples)
        ts = self.check_timestamp(self.stream_id, timestamp_ms)
        n = x.shape[0]
        if n == 0:
            return _Plan(False, [])
        o = self.o
        reset = False
        frames: list[_Frame] = []
        if self._anchor_ts is None:
            self._anchor_ts, self._anchor_idx = ts, self._in_idx
        else:
            expected = self._anchor_ts + (self._in_idx - self._anchor_idx) * self._ms_per_sample
            last_ts = self._last_ts
            assert last_ts is not None  # set with the anchor
            delta = ts - expected
            tol = o.timestamp_tolerance_ms
            if ts <= last_ts:
                kind = "duplicate" if ts == last_ts else "out_of_order"
                what = "repeats" if kind == "duplicate" else "goes back from"
                msg = f"stream {self.stream_id!r}: timestamp {ts:.3f} ms {what} the previous push's {last_ts:.3f} ms"
                if o.out_of_order_policy == "error":
                    raise TimestampError(msg + "; out_of_order_policy='error'")
                self._emit(StreamEvent(kind, "drop", self.stream_id, ts, n, msg + f"; dropped {n} samples"))
                return _Plan(False, [])
            if delta > tol:
                missing = int(round(delta * self._sr / 1000.0))
                if missing > 0:
                    msg = (
                        f"stream {self.stream_id!r}: gap of {delta:.3f} ms ({missing} samples at {self._sr:g} Hz) before this push: "
                        f"expected timestamp {expected:.3f} ms, got {ts:.3f} ms"
                    )
                    policy = o.gap_policy
                    if policy == "error":
                        raise GapError(msg + "; gap_policy='error' (reset() to start over at the new timestamp)")
                    if policy == "fill" and delta <= o.max_gap_ms:
                        self._emit(StreamEvent("gap", "fill", self.stream_id, ts, missing, msg + f"; zero-filled {missing} samples"))
                        self._filled.append((self._in_idx, self._in_idx + missing))
                        zeros = np.zeros((min(missing, self._buf.shape[0]), o.channels), self._dtype)  # bounded, whatever the gap
                        for k in range(0, missing, zeros.shape[0]):
                            self._append(zeros[: missing - k], frames)
                        self._anchor_ts, self._anchor_idx = ts, self._in_idx  # re-anchor: no rounding drift across fills
                    else:
                        why = f" (longer than max_gap_ms={o.max_gap_ms:g})" if policy == "fill" else ""
                        self._emit(StreamEvent("gap", "reset", self.stream_id, ts, missing, msg + f"; state and buffer reset{why}"))
                        self._restart()
                        self._anchor_ts, self._anchor_idx = ts, self._in_idx
                        reset = True
            elif delta < -tol:
                extra = int(round(-delta * self._sr / 1000.0))
                if extra > 0:
                    msg = (
                        f"stream {self.stream_id!r}: push at {ts:.3f} ms overlaps {-delta:.3f} ms ({extra} samples) the stream already has "
                        f"(expected {expected:.3f} ms)"
                    )
                    if o.out_of_order_policy == "error":
                        raise TimestampError(msg + "; out_of_order_policy='error'")
                    k = min(extra, n)
                    self._emit(StreamEvent("overlap", "drop", self.stream_id, ts, k, msg + f"; dropped the first {k} samples"))
                    x = x[k:]
        self._last_ts = ts
        if x.shape[0]:
            self._append(x, frames)
        return _Plan(reset, frames)

    def _append(self, x: np.ndarray, frames: list[_Frame]) -> None:
        """Copy ``x`` through the buffer, cutting every full window into ``frames``."""
        buf, window, hop = self._buf, self._window, self._hop
        anchor_ts = self._anchor_ts
        assert anchor_ts is not None  # push() anchors the clock before it appends
        cap = buf.shape[0]
        n = x.shape[0]
        i = 0
        while i < n:
            if self._skip:  # hop > window: samples between windows are never buffered
                k = min(self._skip, n - i)
                self._skip -= k
                self._in_idx += k
                i += k
                continue
            k = min(cap - self._fill, n - i)
            buf[self._fill : self._fill + k] = x[i : i + k]
            self._fill += k
            self._in_idx += k
            i += k
            base = self._in_idx - self._fill  # sample index of buf[0]
            off = 0
            while self._fill - off >= window:
                start = base + off
                data = self._layout(buf[off : off + window]).copy()  # a copy in C order: contiguous, owned
                frames.append(
                    _Frame(
                        self._index,
                        start,
                        anchor_ts + (start - self._anchor_idx) * self._ms_per_sample,
                        self.epoch,
                        self._filled_in(start, start + window) if self._filled else 0,
                        data,
                    )
                )
                self._index += 1
                off += hop
            if off:
                if off >= self._fill:
                    self._skip = off - self._fill
                    self._fill = 0
                else:
                    rest = self._fill - off
                    buf[:rest] = buf[off : self._fill]
                    self._fill = rest
                if self._filled:
                    keep_from = self._in_idx - self._fill
                    self._filled = [(a, b) for a, b in self._filled if b > keep_from]

    def _filled_in(self, a: int, b: int) -> int:
        return sum(max(0, min(b, e) - max(a, s)) for s, e in self._filled) if self._filled else 0

    def close(self) -> None:
        self._buf = np.zeros((0, self.o.channels), dtype=self._dtype)
        self._fill = 0
        self._filled = []
        self._steady_min = self._window  # never steady
        self._head_views(0)


# --- binding a model's inputs to windows -----------------------------------------------------


class _Binding:
    """Which input gets the window, which get constants, and whether the model carries state.
    Checked once, on construction."""

    def __init__(self, model: "Model", opts: SignalStreamOptions, input_name: str | None, constants: Mapping[str, np.ndarray] | None) -> None:
        self.model = model
        self.opts_layout = opts.layout
        specs = {s.name: s for s in model.inputs}
        state_inputs = {p.input for p in model.manifest.state}
        consts: dict[str, np.ndarray] = {}
        for name, value in (constants or {}).items():
            if name not in specs:
                raise SignalConfigError(f"constants: model has no input {name!r}; its inputs are {list(specs)}")
            if name in state_inputs:
                raise SignalConfigError(f"constants: {name!r} is a state input, fed by the stream from the previous call")
            try:
                (arr,) = InputValidator([specs[name]])(value).values()
            except InputError as e:
                raise SignalConfigError(f"constants: {e}") from e
            arr = arr.copy()
            arr.setflags(write=False)
            consts[name] = arr
        free = [n for n in specs if n not in state_inputs and n not in consts]
        if input_name is None:
            if len(free) != 1:
                raise SignalConfigError(
                    f"the model's inputs other than state and constants are {free}; exactly one must take the signal "
                    f"(pass input_name=..., and constants={{name: array}} for the others)"
                )
            input_name = free[0]
        elif input_name not in free:
            raise SignalConfigError(f"input_name {input_name!r} is not a free input of the model (free: {free}; state: {sorted(state_inputs)})")
        else:
            others = [n for n in free if n != input_name]
            if others:
                raise SignalConfigError(f"inputs {others} get neither the signal nor a constant; pass constants={{name: array}}")
        spec = specs[input_name]
        if np.dtype(spec.dtype) != np.dtype(opts.dtype):
            raise SignalConfigError(f"options.dtype is {opts.dtype}, the model's input {input_name!r} takes {spec.dtype}")
        try:
            InputValidator([spec])(np.zeros(opts.window_shape(), dtype=opts.dtype))
        except InputError as e:
            raise SignalConfigError(
                f"a window fed as layout {opts.layout!r} has shape {opts.window_shape()}, which the model's input does not take: {e}"
            ) from e
        self.input_name = input_name
        self.constants = consts
        self.stateful = bool(model.manifest.state)
        # (state input, state output, batch axis) per pair, and each state's initial value
        # for one stream (size 1 on its batch axis; read-only: states are replaced, never written)
        self.pairs = tuple((p.input, p.output, p.batch_axis) for p in model.manifest.state)
        self.row_init: dict[str, np.ndarray] = {}
        for p in model.manifest.state:
            shape = list(specs[p.input].min_shape())
            if p.batch_axis is not None:
                shape[p.batch_axis] = 1
            a = np.full(shape, p.initial, dtype=specs[p.input].dtype)
            a.setflags(write=False)
            self.row_init[p.input] = a
        self.max_batch, self._batch_limit = self._batch_bound(model, opts, specs)

    def _batch_bound(self, model: "Model", opts: SignalStreamOptions, specs: Mapping[str, Any]) -> tuple[int, str]:
        """How many streams one call can take: the smallest upper bound of the batch dims
        (axis 0 of the signal input, ``batch_axis`` of each state input; constants are fed
        as they are), and what sets it."""
        if not opts.layout.startswith("N"):
            return 1, f"layout {opts.layout!r} has no batch axis: batches of at most 1"
        axes = [(self.input_name, 0)] + [(i, ax) for i, _, ax in self.pairs if ax is not None]
        best, why = 2**31 - 1, ""
        for name, ax in axes:
            d = specs[name].shape[ax]
            lo, hi = (d, d) if isinstance(d, int) else (specs[name].bounds(d) or (1, 1))
            dim = f"fixed dim {ax} = {d}" if isinstance(d, int) else f"dim {ax} ({d}) in [{lo}, {hi}]"
            n = hi if lo == 1 else 1  # a partial batch may hold one stream's row alone
            if n < best:
                best, why = n, f"the model's input {name!r} has {dim}: batches of at most {n}"
        return best, why

    def check_batching(self, batch_size: int) -> None:
        """Raise SignalConfigError unless windows of ``batch_size`` streams can share one call."""
        model = self.model
        name = model.manifest.name
        if self.stateful:
            missing = [f"{i}<-{o}" for i, o, ax in self.pairs if ax is None]
            if missing:
                raise SignalConfigError(
                    f"batch_size={batch_size}: batching a stateful model across streams needs batch_axis on every [[state]] pair; "
                    f"{name}'s pair(s) {missing} declare none (use batch_size=1, or declare the state's batch axis in the manifest)"
                )
        if model.manifest.decoder.kind in ("detection", "segmentation"):
            raise SignalConfigError(f"batch_size={batch_size}: a {model.manifest.decoder.kind} decoder's result cannot be split per stream")
        if self.max_batch < batch_size:
            raise SignalConfigError(
                f"batch_size={batch_size}: {self._batch_limit} (layout {self.opts_layout!r}; a batch needs a dynamic batch dim "
                f"with bounds [1, n >= batch_size] on axis 0 of the signal input and on batch_axis of each state input)"
            )
        state_out = {o: ax for _, o, ax in self.pairs if ax is not None}  # all of them, when stateful (above)
        for spec in model.outputs:
            ax = state_out.get(spec.name, 0)
            if spec.rank <= ax or isinstance(spec.shape[ax], int):
                raise SignalConfigError(
                    f"batch_size={batch_size}: output {spec.name!r} {list(spec.shape)} has no dynamic batch dim at axis {ax} "
                    f"to split per stream"
                )

    def feed(self, data: np.ndarray) -> dict[str, np.ndarray]:
        f = dict(self.constants)
        f[self.input_name] = data
        return f


def _results(frames: list[_Frame], results: list["Result"], stream_id: Hashable, duration_ms: float) -> list[WindowResult]:
    return [_tnew(WindowResult, (stream_id, f.window, f.start_sample, f.timestamp_ms, duration_ms, f.epoch, f.filled, r)) for f, r in zip(frames, results)]


# --- one stream -------------------------------------------------------------------------------


class SignalStream:
    """One signal source over a model: windows, timestamps, policies, and its own model state.

    ``push(samples, timestamp_ms)`` returns one :class:`WindowResult` per window completed by
    the push, in order (an empty list when none is). ``reset()`` starts over (buffer, clock and
    model state); ``close()`` frees the buffer and state and is safe to call twice. Thread-safe.

    Raises on push: SignalDTypeError, SignalShapeError, NonFiniteSignalError, InputTypeError,
    TimestampError / GapError (per policy), StreamClosedError; a refused push leaves the
    stream as it was. Model errors (SessionError, ...) propagate.
    """

    def __init__(
        self,
        model: "Model",
        options: SignalStreamOptions,
        *,
        stream_id: Hashable = None,
        input_name: str | None = None,
        constants: Mapping[str, np.ndarray] | None = None,
        on_event: Callable[[StreamEvent], None] | None = None,
        _binding: _Binding | None = None,
        _owner: "StreamRouter | None" = None,
        _router: "StreamRouter | None" = None,
        _row: "tuple[int, np.ndarray] | None" = None,
    ) -> None:
        if not isinstance(options, SignalStreamOptions):
            raise SignalConfigError(f"options: expected SignalStreamOptions, got {type(options).__name__}")
        self.options = options
        self.stream_id = stream_id
        self._b = _binding or _Binding(model, options, input_name, constants)
        self._events: deque[StreamEvent] = deque(maxlen=options.max_events)
        self._sink = on_event or self._events.append
        # A router keeps this stream's sample buffer in row ``_row[0]`` of its _Slab (``_row[1]``: that
        # row of the buffers), and every change to the stream takes the router's lock first (its block
        # push reads and writes many streams' rows at once). A batching router (``_owner``) keeps the
        # model state in the slab too, runs the stream's windows in batches with other streams' and
        # resets the state lazily, by epoch, in the router's order (_RowState).
        self._row = None if _row is None else _row[0]
        self._framer = _Framer(options, stream_id, self._sink, None if _row is None else _row[1])
        self._owner = _owner
        self._rlock: Any = _router._lock if _router is not None else _NO_LOCK
        self._slab = _router._slab if _router is not None else None
        self._in_block = False  # the router's block arrays hold this stream's clock (see _unblock)
        self._state: Any = None
        if self._b.stateful:
            self._state = model.stream() if _owner is None else _RowState()
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Free the buffer and the model state (the model stays open). Safe to call twice."""
        with self._rlock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._unblock()
            self._framer.close()
            self._state = None

    def __enter__(self) -> "SignalStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        o = self.options
        state = "closed" if self._closed else f"epoch {self._framer.epoch}"
        return f"SignalStream({self.stream_id!r}, {o.sample_rate_hz:g} Hz, window {o.window}, hop {o.hop_samples}, {state})"

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError(f"stream {self.stream_id!r} is closed")

    # -- data -----------------------------------------------------------------------------

    def push(self, samples: np.ndarray, timestamp_ms: float) -> list[WindowResult]:
        """Add samples ([n] mono or [n, channels], ``options.dtype``) whose first sample is at
        ``timestamp_ms``; run the model on every window they complete."""
        if self._owner is not None:
            raise StreamRouterOwnedError(
                f"stream {self.stream_id!r} belongs to a StreamRouter with batch_size={self._owner.batch_size}: "
                f"push through router.push({self.stream_id!r}, samples, timestamp_ms), which keeps its windows in order with the queued ones"
            )
        return self._push(samples, timestamp_ms)

    def _push(self, samples: Any, timestamp_ms: Any) -> list[WindowResult]:
        """push() without the owner check."""
        with self._rlock, self._lock:
            self._check_open()
            self._unblock()
            f = self._framer.push_steady(samples, timestamp_ms)
            if f is not None:
                return self._run([f])
            plan = self._framer.push(samples, timestamp_ms)
            if plan.reset and self._state is not None:
                self._state.reset()
            return self._run(plan.frames) if plan.frames else []

    def _unblock(self) -> None:
        """Take this stream's clock back from the router's block arrays, where a push_block left it
        (every path but push_block's steady one reads the framer's own attributes)."""
        if self._in_block:
            self._in_block = False
            assert self._slab is not None and self._row is not None  # only a router's streams enter block mode
            self._slab.leave(self._row, self._framer)

    def _run(self, frames: list[_Frame]) -> list[WindowResult]:
        b = self._b
        # windows of samples checked at the push (finite), constants checked when bound: not scanned again
        if self._state is not None:
            results = [self._state._predict_made(b.feed(f.data)) for f in frames]
        else:
            results = [b.model._predict_made(b.feed(f.data)) for f in frames]
        return _results(frames, results, self.stream_id, self.options.window_ms)

    def reset(self) -> None:
        """Drop buffered samples, forget the clock (the next push anchors it) and reset the model state."""
        with self._rlock, self._lock:
            self._check_open()
            self._unblock()
            self._framer.restart()
            if self._state is not None and self._owner is None:
                self._state.reset()  # (a batching router resets the state when this stream's next epoch starts)
            self._sink(StreamEvent("reset", "reset", self.stream_id, math.nan, 0, f"stream {self.stream_id!r}: reset() called"))

    # -- inspection -------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The stream's epoch now: it changes whenever the stream restarts (gap reset, ``reset()``)."""
        return self._framer.epoch

    @property
    def buffered_samples(self) -> int:
        """Samples waiting for the next window (never more than ``options.buffer_samples``)."""
        return self._framer.buffered_samples

    @property
    def nbytes(self) -> int:
        """Bytes of the sample buffer (fixed by the options)."""
        return self._framer.nbytes

    @property
    def stateful(self) -> bool:
        """True when the model carries state between windows (manifest ``state`` pairs)."""
        return self._b.stateful

    @property
    def input_name(self) -> str:
        """The model input that gets the windows."""
        return self._b.input_name

    @property
    def constants(self) -> dict[str, np.ndarray]:
        """The constant inputs fed with every window (read-only copies)."""
        return dict(self._b.constants)

    def expected_timestamp_ms(self) -> float | None:
        """Where the sample clock says the next push starts (None before the first push)."""
        with self._rlock, self._lock:
            self._unblock()
            return self._framer.expected_timestamp_ms()

    @property
    def events(self) -> tuple[StreamEvent, ...]:
        """Recent events, oldest first (at most ``options.max_events``; empty with ``on_event``)."""
        return tuple(self._events)

    def pop_events(self) -> list[StreamEvent]:
        """Recent events, oldest first, and forget them."""
        out = list(self._events)
        self._events.clear()
        return out


# --- many streams -------------------------------------------------------------------------------


class _RowState:
    """One stream's model state in a batching router (the values are in its row of the router's
    :class:`_Slab`): the epoch that state belongs to. A window of a later epoch (the stream
    restarted: gap reset, ``reset()``) starts from the initial state, so a reset takes effect in
    the stream's own order, after its windows queued before it have run."""

    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = 0


def _on_axis(ax: int, index: Any) -> tuple[Any, ...]:
    """The index that applies ``index`` to axis ``ax`` (every axis before it whole)."""
    return (slice(None),) * ax + (index,)


class _Slab:
    """A router's streams as rows of a few arrays, one row per open stream: the sample buffers,
    a batching router's model states, and the clocks of streams in block mode.

    ``buf`` is [rows, buffer_samples, channels] (each stream's framer works on its row); each
    state input's array holds the rows on its pair's batch axis. A block push
    (:meth:`StreamRouter.push_block`) reads and rewrites many streams' buffered samples and clocks
    with one numpy call each; a batch takes its streams' states with one ``np.take`` (or a slice)
    per state input and puts the new ones back with one assignment. A closed stream's row is
    reused; the arrays start at min(64, max_streams) rows and double up to ``max_streams``, the
    open streams' framers re-pointed at their rows of the new buffer."""

    def __init__(self, b: _Binding, opts: SignalStreamOptions, max_rows: int, *, states: bool) -> None:
        self._init = b.row_init
        # a batching router's state pairs (all have a batch axis: check_batching); an unbatched one keeps
        # each stream's state in its StreamState
        self.axes = {i: ax for i, _, ax in b.pairs if ax is not None} if states else {}
        self.max_rows = max_rows
        self.buf = np.zeros((0, opts.buffer_samples, opts.channels), np.dtype(opts.dtype))
        self.states = {i: self._rows_like(i, 0) for i in self.axes}
        # Block mode (push_block): while ``blk[row]``, these hold the row's stream clock in place of its
        # framer's attributes (``enter``/``leave`` move it), so a block checks and advances every clock at once.
        self.blk = np.zeros(0, bool)
        self.in_idx = np.zeros(0, np.int64)
        self.anchor_idx = np.zeros(0, np.int64)
        self.index = np.zeros(0, np.int64)
        self.epoch = np.zeros(0, np.int64)
        self.anchor_ts = np.zeros(0, np.float64)
        self.last_ts = np.zeros(0, np.float64)
        self._free: list[int] = []  # popped from the end: lowest row first
        self._framers: dict[int, _Framer] = {}
        self._grow()

    def _rows_like(self, name: str, rows: int) -> np.ndarray:
        one = self._init[name]
        shape = list(one.shape)
        shape[self.axes[name]] = rows
        return np.zeros(shape, one.dtype)

    def _grow(self) -> None:
        old = self.buf.shape[0]
        cap = min(self.max_rows, max(64, 2 * old))
        buf = np.zeros((cap,) + self.buf.shape[1:], self.buf.dtype)
        buf[:old] = self.buf
        self.buf = buf
        for name, a in self.states.items():
            grown = self._rows_like(name, cap)
            grown[_on_axis(self.axes[name], slice(0, old))] = a
            self.states[name] = grown
        for col in ("blk", "in_idx", "anchor_idx", "index", "epoch", "anchor_ts", "last_ts"):
            a = getattr(self, col)
            grown_col = np.zeros(cap, a.dtype)
            grown_col[:old] = a
            setattr(self, col, grown_col)
        for row, fr in self._framers.items():
            fr.rebind(buf[row])
        self._free.extend(range(cap - 1, old - 1, -1))

    def enter(self, row: int, fr: _Framer) -> None:
        """Block mode for ``row``: its clock moves from ``fr`` into the arrays."""
        self.in_idx[row], self.anchor_idx[row], self.index[row], self.epoch[row] = fr._in_idx, fr._anchor_idx, fr._index, fr.epoch
        self.anchor_ts[row], self.last_ts[row] = fr._anchor_ts, fr._last_ts
        self.blk[row] = True

    def leave(self, row: int, fr: _Framer) -> None:
        """Out of block mode: the clock goes back to ``fr``."""
        fr._in_idx, fr._anchor_idx, fr._index = int(self.in_idx[row]), int(self.anchor_idx[row]), int(self.index[row])
        fr._anchor_ts, fr._last_ts = float(self.anchor_ts[row]), float(self.last_ts[row])
        self.blk[row] = False

    def take(self) -> tuple[int, np.ndarray]:
        """A free row, its state set to the initial one, and its buffer (bind() its framer)."""
        if not self._free:
            self._grow()
        row = self._free.pop()
        self.reset_state(row)
        return row, self.buf[row]

    def bind(self, row: int, fr: _Framer) -> None:
        """``fr`` works on ``row``'s buffer (re-pointed when the slab grows)."""
        self._framers[row] = fr

    def release(self, row: int) -> None:
        self._framers.pop(row, None)
        self.blk[row] = False
        self._free.append(row)

    def reset_state(self, row: int) -> None:
        for name, a in self.states.items():
            a[_on_axis(self.axes[name], slice(row, row + 1))] = self._init[name]


class _Pending(NamedTuple):
    stream: SignalStream
    state: _RowState | None
    frame: _Frame
    enqueued_s: float


class _Fast(NamedTuple):
    """The steady windows of a push_block that ran: their columns and one (Result, columns) per call."""

    ids: tuple[Hashable, ...]
    pos: np.ndarray  # each window's position in the block
    index: np.ndarray  # type: ignore[assignment]  # shadows tuple.index
    start: np.ndarray
    ts: np.ndarray
    epoch: np.ndarray
    parts: "list[tuple[Result, _Columns]]"

    @property
    def columns(self) -> tuple[tuple[Hashable, ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.ids, self.pos, self.index, self.start, self.ts

    @property
    def filled(self) -> np.ndarray:
        return np.zeros(len(self.ids), np.int64)  # steady windows hold no zero fill

    def without(self, lost: list[int]) -> "_Fast":
        """These windows but rows ``lost`` (their call failed)."""
        keep = np.ones(len(self.ids), bool)
        keep[lost] = False
        gone = set(lost)
        return _Fast(tuple(i for j, i in enumerate(self.ids) if j not in gone), self.pos[keep], self.index[keep], self.start[keep], self.ts[keep], self.epoch[keep], self.parts)


class _BlockCut:
    """What :meth:`StreamRouter.push_block` needs of the options to cut steady chunks together."""

    __slots__ = ("ok", "mono", "h", "hop", "window", "ms_per_sample", "tol")

    def __init__(self, o: SignalStreamOptions) -> None:
        self.hop, self.window = o.hop_samples, o.window
        self.ok = self.hop <= self.window and o.layout in ("NT", "NTC")
        self.mono = o.layout == "NT"
        self.h = self.window - self.hop  # the samples a steady stream holds between windows
        self.ms_per_sample = 1000.0 / float(o.sample_rate_hz)
        self.tol = float(o.timestamp_tolerance_ms)


class StreamRouter:
    """Streams keyed by id, each with its own buffer, clock and model state.

    ``push(stream_id, samples, timestamp_ms)`` opens the stream on first use. At most
    ``max_streams`` are open: opening one more closes the least recently pushed
    (``eviction="lru"``, recorded as an "evicted" event) or raises StreamLimitError
    (``eviction="error"``). ``close(id)`` frees a stream; a later push with the same id starts
    a fresh stream (new state, new clock). Memory is bounded by ``max_streams`` x the
    per-stream buffer (``options.buffer_samples``) + ``max_pending`` queued windows.

    Batching (``batch_size`` > 1; the model's batch dim dynamic with bounds [1, >= batch_size]
    on axis 0 of the signal input): windows of up to ``batch_size`` streams run as ONE model
    call, their inputs stacked on axis 0 (constants such as a sample rate are fed as they
    are) and the outputs split back per window. Stateful models batch too when every manifest
    ``[[state]]`` pair declares ``batch_axis``: each stream's state is stacked on that axis and
    the new state split back to its stream, so a stream's state stays its own; a batch never
    holds two windows of the same stream (the second needs the state the first produces).
    Stateless models may put several windows of one stream in a batch.

    When a batch runs: as soon as ``batch_size`` windows can share one (stateful: windows of
    ``batch_size`` different streams); when more than ``max_pending`` windows are queued
    (default 4 x batch_size: a partial batch of the oldest); and once the oldest queued window
    has waited ``max_wait_ms`` (checked on every ``push`` and ``poll``: batches run until no
    queued window is that old); ``flush()`` runs everything now. Windows are taken oldest first;
    per stream they run in order, and results are the same as unbatched (bitwise where the
    runtime computes batch rows independently, as ONNX Runtime does for Silero VAD on CPU).
    Results are returned by whichever call ran them (``push``, ``poll``, ``flush``, ``close``,
    ...), so each carries its ``stream_id``; per stream they are in order. ``reset(id)`` and a
    gap reset take effect in the stream's order: its windows queued before still run with the
    state they had. ``close(id)`` runs every queued window first; evicting a stream runs its
    queued windows first (their results come with the call's, or the next call's, results).
    The streams of a batching router are pushed through the router only (``SignalStream.push``
    on one raises StreamRouterOwnedError). A model error during a batch loses that batch's
    windows (the streams' states stay as they were before it). Thread-safe (one lock, which
    the streams' own calls take too: model calls are serialised).

    ``push_block(ids, samples, timestamps)`` pushes one chunk for each of many streams in one
    call and returns a :class:`WindowBlock` (see push_block).
    """

    def __init__(
        self,
        model: "Model",
        options: SignalStreamOptions,
        max_streams: int = 64,
        *,
        eviction: str = "lru",
        input_name: str | None = None,
        constants: Mapping[str, np.ndarray] | None = None,
        batch_size: int = 1,
        max_wait_ms: float = 10.0,
        max_pending: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(options, SignalStreamOptions):
            raise SignalConfigError(f"options: expected SignalStreamOptions, got {type(options).__name__}")
        _pos_int("max_streams", max_streams)
        _pos_int("batch_size", batch_size)
        _number("max_wait_ms", max_wait_ms, positive=False)
        if max_pending is None:
            max_pending = 4 * batch_size
        else:
            _pos_int("max_pending", max_pending)
            if max_pending < batch_size:
                raise SignalConfigError(f"max_pending: must be >= batch_size ({batch_size}), got {max_pending}")
        if eviction not in EVICTIONS:
            raise SignalConfigError(f"eviction: expected one of {EVICTIONS}, got {eviction!r}")
        self._b = _Binding(model, options, input_name, constants)
        if batch_size > 1:
            self._b.check_batching(batch_size)
        self.model = model
        self.options = options
        self.max_streams = max_streams
        self.eviction = eviction
        self.batch_size = batch_size
        self.max_wait_ms = float(max_wait_ms)
        self.max_pending = max_pending
        self._clock = clock
        self._streams: OrderedDict[Hashable, SignalStream] = OrderedDict()
        self._rowmap: dict[Hashable, int] = {}  # open stream id -> its slab row
        self._queue: deque[_Pending] = deque()  # oldest first
        self._queued: dict[SignalStream, int] = {}  # queued windows per stream (only streams with some)
        self._distinct = self._b.stateful  # one window per stream per batch
        self._slab = _Slab(self._b, options, max_streams, states=batch_size > 1)
        self._out_axes = {o: ax for _, o, ax in self._b.pairs if ax is not None}  # a state output's batch axis
        self._out_check = tuple((o.name, self._out_axes.get(o.name, 0)) for o in model.outputs)  # each output's batch axis
        # per state pair of a batching router: the input, the index prefix that reaches its batch axis, the output
        self._state_axes = tuple((i, (slice(None),) * ax, o) for i, o, ax in self._b.pairs if ax is not None) if batch_size > 1 else ()
        self._window_ms = options.window_ms
        self._winbuf = np.empty((0, options.window) + (() if options.layout == "NT" else (options.channels,)), np.dtype(options.dtype))  # see _windows_for
        self._block = _BlockCut(options)
        self._ready: list[_Batch] = []  # run, not yet returned
        self._events: deque[StreamEvent] = deque(maxlen=options.max_events)
        self._lock = threading.RLock()
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._streams)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._streams

    @property
    def stream_ids(self) -> tuple[Hashable, ...]:
        """Open stream ids, least recently pushed first."""
        return tuple(self._streams)

    @property
    def pending(self) -> int:
        """Windows queued for a batch. After a call returns: fewer than ``batch_size`` for a
        stateless model; for a stateful one, windows of fewer than ``batch_size`` different
        streams, and at most ``max_pending`` in all."""
        return len(self._queue)

    def stream(self, stream_id: Hashable) -> SignalStream:
        """The open stream for ``stream_id`` (KeyError if none)."""
        return self._streams[stream_id]

    def open(self, stream_id: Hashable) -> SignalStream:
        """Open ``stream_id`` explicitly; DuplicateStreamError if it is open already."""
        with self._lock:
            self._check_open()
            if _hashable(stream_id) in self._streams:
                raise DuplicateStreamError(f"stream {stream_id!r} is already open; close() it first to start it over")
            return self._open(stream_id)

    def _open(self, stream_id: Hashable) -> SignalStream:
        if len(self._streams) >= self.max_streams:
            if self.eviction == "error":
                raise StreamLimitError(
                    f"{len(self._streams)} streams open, max_streams={self.max_streams}; close() one first "
                    f"(or use eviction='lru') before opening {stream_id!r}"
                )
            old_id, old = next(iter(self._streams.items()))
            while self._queued.get(old):  # its accepted windows run before it goes
                self._run_batch(self._take(first=old))
            del self._streams[old_id]
            self._drop(old)
            self._events.append(
                StreamEvent("evicted", "close", old_id, math.nan, 0, f"stream {old_id!r} closed to open {stream_id!r} (max_streams={self.max_streams}, least recently pushed)")
            )
        owner = self if self.batch_size > 1 else None
        row, buf = self._slab.take()
        try:
            s = SignalStream(self.model, self.options, stream_id=stream_id, on_event=self._events.append, _binding=self._b, _owner=owner, _router=self, _row=(row, buf))
        except BaseException:
            self._slab.release(row)
            raise
        self._slab.bind(row, s._framer)
        self._streams[stream_id] = s
        self._rowmap[stream_id] = row
        return s

    def _drop(self, s: SignalStream) -> None:
        """Close ``s`` (taken out of ``_streams``) and free its slab row."""
        s.close()
        if s._row is not None:
            self._slab.release(s._row)
            if self._rowmap.get(s.stream_id) == s._row:
                del self._rowmap[s.stream_id]

    def close(self, stream_id: Hashable) -> list[WindowResult]:
        """Close one stream (unknown ids are ignored). Runs windows still queued for a batch
        (of every stream) and returns their results."""
        with self._lock:
            self._run_all()
            s = self._streams.pop(_hashable(stream_id), None)
            if s is not None:
                self._drop(s)
            return self._take_ready()

    def reset(self, stream_id: Hashable) -> None:
        """Reset one open stream (buffer, clock, model state). Its windows already queued
        still run, with the state they had."""
        with self._lock:
            self._check_open()
            self._streams[stream_id].reset()

    def close_all(self) -> list[WindowResult]:
        """Run queued windows, then close every stream. The router stays usable."""
        with self._lock:
            self._run_all()
            for s in self._streams.values():
                self._drop(s)
            self._streams.clear()
            return self._take_ready()

    def shutdown(self) -> list[WindowResult]:
        """close_all() and refuse further pushes. Safe to call twice (the model stays open)."""
        with self._lock:
            if self._closed:
                return []
            out = self.close_all()
            self._closed = True
            return out

    def __enter__(self) -> "StreamRouter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError("stream router is shut down")

    # -- data -----------------------------------------------------------------------------

    def push(self, stream_id: Hashable, samples: np.ndarray, timestamp_ms: float) -> list[WindowResult]:
        """Push to ``stream_id`` (opened on first use). Unbatched: this stream's windows.
        Batched: the results of every batch run since the last call that returned results,
        of any stream."""
        with self._lock:
            if self._closed:
                self._check_open()
            s = self._stream_for(stream_id)
            if self.batch_size == 1:
                return s._push(samples, timestamp_ms)
            self._enqueue(s, samples, timestamp_ms)
            return self._take_ready()

    def _stream_for(self, stream_id: Hashable) -> SignalStream:
        """The open stream for ``stream_id``, opened if need be, now the most recently pushed."""
        streams = self._streams
        try:
            s = streams.get(stream_id)
        except TypeError:
            _hashable(stream_id)  # InputTypeError for an unhashable id
            raise
        if s is None:
            return self._open(stream_id)
        streams.move_to_end(stream_id)
        return s

    def _enqueue(self, s: SignalStream, samples: Any, timestamp_ms: Any) -> None:
        """Cut one push of a batching router into windows, queue them and run the batches now due,
        then those overdue. The clock is read once per push that queues windows or finds some queued,
        and again only after a batch ran (time passed), as often as the overdue check needs it."""
        now = self._frame_one(s, samples, timestamp_ms)
        if now is not None and self._run_due():
            now = None
        self._run_overdue_at(now)

    def _frame_one(self, s: SignalStream, samples: Any, timestamp_ms: Any) -> float | None:
        """Cut one push into windows and queue them, stamped with the clock's reading, which is
        returned (None if the push made no window). Runs no batch."""
        with s._lock:
            s._check_open()
            s._unblock()
            f = s._framer.push_steady(samples, timestamp_ms)
            if f is not None:
                frames: list[_Frame] = [f]
            else:
                frames = s._framer.push(samples, timestamp_ms).frames  # a reset is applied by epoch (_RowState)
        if not frames:
            return None
        now = self._clock()
        q = self._queue
        st = s._state
        for f in frames:
            q.append(_tnew(_Pending, (s, st, f, now)))
        queued = self._queued
        queued[s] = queued.get(s, 0) + len(frames)
        return now

    def _run_overdue_at(self, now: float | None) -> None:
        """Run batches while the oldest queued window has waited ``max_wait_ms``, judged on the clock
        reading ``now`` (None: read it if a window is queued), read again after each batch."""
        q = self._queue
        if not q:
            return
        if now is None:
            now = self._clock()
        max_wait = self.max_wait_ms
        while (now - q[0].enqueued_s) * 1000.0 >= max_wait:
            self._run_batch(self._take())
            if not q:
                return
            now = self._clock()

    def push_block(self, stream_ids: Sequence[Hashable], samples: np.ndarray, timestamps_ms: Any) -> WindowBlock:
        """One chunk for each of several streams, in one call: ``samples[i]`` (``[n]`` mono or
        ``[n, channels]``, so ``samples`` is ``[k, n]`` or ``[k, n, channels]``: every chunk has n
        samples) whose first sample is at ``timestamps_ms[i]`` goes to ``stream_ids[i]`` (opened on
        first use; an id at most once per block). Every window the block completes runs before the
        call returns, and comes back in one :class:`WindowBlock` of columns (``block.windows()``
        gives the WindowResults ``push()`` would have returned).

        The windows, states and results are those of ``push(stream_ids[i], samples[i],
        timestamps_ms[i])`` for each i, then ``flush()``. What differs is the cost: the chunks that
        continue their stream's clock with exactly ``hop`` samples (what a live source sends) onto a
        buffer of window - hop samples (layouts "NT" and "NTC", hop <= window) are checked for
        NaN/Inf in one pass over the block and cut into windows with one gather of the streams'
        buffered samples and one scatter back; a batching router runs them in batches of
        ``batch_size`` straight from the block, their states taken from and put back to its state
        arrays with one call each. The other chunks take ``push()``'s path, after them. Windows
        queued by earlier pushes run first. Per stream, windows run and come back in order.

        Raises, accepting nothing, when the arguments do not fit together: InputTypeError (not a
        list or tuple of hashable ids, not an ndarray, timestamps not numbers), SignalDTypeError,
        SignalShapeError (shape, or rows other than ids), DuplicateStreamError (an id twice).
        Otherwise every chunk is pushed but those ``push()`` would refuse (NaN/Inf, a non-finite
        timestamp, a timestamp or gap policy "error", a closed stream, the stream limit), and a
        failing model call loses only its own windows: BlockPushError is then raised at the end,
        with each such chunk's error and the WindowBlock of the rest.
        """
        with self._lock:
            if self._closed:
                self._check_open()
            ids, x, ts, tf, refused = self._check_block(stream_ids, samples, timestamps_ms)
            k = len(ids)
            errors: dict[Hashable, Exception] = dict((ids[j], e) for j, e in refused)
            self._run_all()  # windows queued before this block run before its windows
            before, self._ready = self._ready, []
            slow, fast = self._run_block(ids, x, tf, [j for j, _ in refused], errors)
            for j in slow:
                try:
                    s = self._stream_for(ids[j])
                    if self.batch_size == 1:
                        self._ready += [_one_row(w) for w in s._push(x[j], ts[j])]  # (runs the model)
                    else:
                        self._frame_one(s, x[j], ts[j])
                except Exception as e:  # refused as push() refuses it, or its call failed: the others go on
                    errors[ids[j]] = e
            self._run_all(errors)
            after, self._ready = self._ready, []
            if slow:
                self._enter_block_mode(ids, slow)
                streams = self._streams
                for sid in ids:  # most recently pushed: the block's streams, in block order
                    if sid in streams:
                        streams.move_to_end(sid)
            block = self._block_of(ids, before, fast, after)
            if errors:
                raise BlockPushError(errors, block, k)
            return block

    def _block_of(self, ids: list[Hashable], before: list[_Batch], fast: "_Fast | None", after: list[_Batch]) -> WindowBlock:
        """The WindowBlock of a push_block of ``ids``: the windows queued before it, the block's
        steady ones, then those that took push()'s path."""
        dur = self._window_ms
        if fast is not None and not before and not after:  # the usual block: its columns as they are
            return WindowBlock(*fast.columns, dur, fast.epoch, fast.filled, fast.parts)
        batches = list(before)
        if fast is not None:
            f = fast
            batches.append(_tnew(_Batch, (f.ids, f.index, f.start, f.ts, f.epoch, f.filled, None, None)))
        parts = [(b.result, b.outputs) for b in before] + (fast.parts if fast is not None else []) + [(b.result, b.outputs) for b in after]
        batches += after
        if not batches:
            e = np.zeros(0, np.int64)
            return WindowBlock((), e, e, e, np.zeros(0, np.float64), dur, e, e, [])
        def cat(cols: list[Any], dtype: Any = np.int64) -> np.ndarray:  # lists (push()'s path) and arrays alike
            return np.concatenate(cols).astype(dtype, copy=False)

        rows = tuple(i for b in batches for i in b.stream_ids)
        where = {sid: j for j, sid in enumerate(ids)}
        return WindowBlock(
            rows,
            np.array([where.get(sid, -1) for sid in rows], np.int64),
            cat([b.index for b in batches]),
            cat([b.start_sample for b in batches]),
            cat([b.timestamp_ms for b in batches], np.float64),
            dur,
            cat([b.epoch for b in batches]),
            cat([b.filled_samples for b in batches]),
            parts,
        )

    def _check_block(
        self, stream_ids: Any, samples: Any, timestamps_ms: Any
    ) -> tuple[list[Hashable], np.ndarray, list[float], np.ndarray, list[tuple[int, Exception]]]:
        """push_block's arguments checked together: the ids, the samples, the timestamps as floats
        (a list and a float64 array), and the chunks refused on their values (NaN/Inf samples, a
        non-finite timestamp)."""
        o = self.options
        if isinstance(stream_ids, (str, bytes)) or not isinstance(stream_ids, (list, tuple)):
            raise InputTypeError(f"push_block: expected stream_ids as a list or tuple of stream ids, got {type(stream_ids).__name__}")
        ids = list(stream_ids)
        k = len(ids)
        want = f"[k={k}, n]" if o.channels == 1 else f"[k={k}, n, {o.channels}]"
        if not isinstance(samples, np.ndarray):
            raise InputTypeError(f"push_block: expected samples as a numpy.ndarray {want} of {o.dtype}, got {type(samples).__name__}")
        if samples.dtype != np.dtype(o.dtype):
            raise SignalDTypeError(f"push_block: expected samples of dtype {o.dtype}, got {samples.dtype} (nothing is cast)")
        mono_ok = o.channels == 1 and samples.ndim == 2
        if not (mono_ok or (samples.ndim == 3 and samples.shape[2] == o.channels)) or samples.shape[0] != k:
            raise SignalShapeError(f"push_block: expected samples of shape {want} (one chunk of n samples per stream id), got shape {samples.shape}")
        if isinstance(timestamps_ms, np.ndarray):
            if timestamps_ms.dtype.kind not in "iuf":
                raise InputTypeError(f"push_block: expected timestamps_ms as numbers, got an array of {timestamps_ms.dtype}")
            t = timestamps_ms
        elif isinstance(timestamps_ms, (list, tuple)):
            kinds = set(map(type, timestamps_ms))  # one C loop; numpy would turn True into 1.0 and "1" into a string
            if not kinds <= {float, int} and any(k is bool or not issubclass(k, (int, float, np.integer, np.floating)) or issubclass(k, np.bool_) for k in kinds):
                v = next(v for v in timestamps_ms if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)))
                raise InputTypeError(f"push_block: expected timestamps_ms as numbers, got a {type(v).__name__} ({v!r})")
            t = np.array(timestamps_ms, dtype=np.float64)
        else:
            raise InputTypeError(f"push_block: expected timestamps_ms as a list, tuple or 1-D array of numbers, got {type(timestamps_ms).__name__}")
        if t.shape != (k,):
            raise SignalShapeError(f"push_block: expected {k} timestamps (one per stream id), got shape {t.shape}")
        try:
            distinct = len(set(ids))
        except TypeError:
            for i in ids:
                _hashable(i)
            raise
        if distinct != k:
            seen: set[Hashable] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise DuplicateStreamError(f"push_block: stream id {dup!r} appears twice in the block (one chunk per stream a block; push the next in the next block)")
        tf = t.astype(np.float64)
        ts = tf.tolist()
        refused: list[tuple[int, Exception]] = []
        if not np.isfinite(tf).all():
            for j in np.flatnonzero(~np.isfinite(tf)).tolist():
                refused.append((j, TimestampError(f"stream {ids[j]!r}: expected a finite timestamp_ms, got {ts[j]}")))
        if o.dtype[0] == "f" and samples.size and not _finite(samples):
            bad = ~np.isfinite(samples.reshape(k, -1))
            for j in np.flatnonzero(bad.any(axis=1)).tolist():
                refused.append(
                    (j, NonFiniteSignalError(f"stream {ids[j]!r}: expected finite samples, got {int(bad[j].sum())} NaN/Inf of {bad[j].size}; the chunk was refused"))
                )
        return ids, samples, ts, tf, refused

    def _run_block(self, ids: list[Hashable], x: np.ndarray, tf: np.ndarray, refused: list[int], errors: dict[Hashable, Exception]) -> "tuple[list[int], _Fast | None]":
        """Cut the block's chunks of streams in block mode (see push_block) into windows and run them:
        the chunks later than the stream's last push and within the tolerance of its clock, of hop
        samples each (a stream in block mode holds window - hop samples and no zero fill: the rows'
        clocks are checked and advanced as arrays). A failing call's error goes to ``errors`` for its
        streams (its windows are left out). Returns the positions of the other chunks that are not
        ``refused`` (for push()'s path, in order) and what ran (None if nothing did)."""
        cut, sl = self._block, self._slab
        k = len(ids)
        if not cut.ok or x.shape[1] != cut.hop or not k:
            return [j for j in range(k) if ids[j] not in errors], None
        h, hop, mps, tol = cut.h, cut.hop, cut.ms_per_sample, cut.tol
        rows_l = list(map(self._rowmap.get, ids))
        missing = None in rows_l
        if missing:  # streams not open yet
            ok_open = np.array([r is not None for r in rows_l])
            rows_l = [0 if r is None else r for r in rows_l]
        r = np.array(rows_l, np.intp)
        ok = sl.blk[r]
        if missing:
            ok &= ok_open
        if refused:
            ok[refused] = False
        li, ai, at = sl.in_idx[r], sl.anchor_idx[r], sl.anchor_ts[r]
        d = tf - (at + (li - ai) * mps)  # as _Framer.push computes it, in the same float64 steps
        ok &= (tf > sl.last_ts[r]) & (d <= tol) & (d >= -tol)
        refused_set = set(refused)
        if ok.all():
            slow: list[int] = []
            sids = ids
            keep = np.arange(k)
        else:
            slow = [j for j in np.flatnonzero(~ok).tolist() if j not in refused_set]
            keep = np.flatnonzero(ok)
            if not keep.size:
                return slow, None
            sids = [ids[j] for j in keep.tolist()]
            r, li, ai, at, tf, x = r[keep], li[keep], ai[keep], at[keep], tf[keep], x[keep]
        m = len(sids)
        start = li - h
        t0 = at + (start - ai) * mps
        wi = sl.index[r]
        sl.index[r] = wi + 1
        sl.in_idx[r] = li + hop
        sl.last_ts[r] = tf
        ep = sl.epoch[r]
        streams = self._streams
        collections.deque(map(streams.move_to_end, sids), 0)  # each is now the most recently pushed, in order
        buf = sl.buf
        win = self._windows_for(m)  # the router's own: no fresh pages per block (no result keeps a view of it)
        if cut.mono:  # [m, window]: the buffered heads, then the chunks
            win[:, :h] = buf[r, :h, 0]
            win[:, h:] = x if x.ndim == 2 else x[:, :, 0]
            buf[r, :h, 0] = win[:, hop:]
        else:
            win[:, :h] = buf[r, :h]
            win[:, h:] = x
            buf[r, :h] = win[:, hop:]
        parts: list[tuple[Result, _Columns]] = []
        lost: list[int] = []  # rows whose call failed
        if self.batch_size > 1:
            stateful = self._b.stateful
            r0 = int(r[0])
            consecutive = bool(r[-1] - r0 == m - 1) and (m < 3 or bool((np.diff(r) == 1).all()))  # slab rows in block order: slices
            bs = self.batch_size
            a = 0
            try:
                while a < m:
                    e = min(a + bs, m)
                    sel: Any = None if not stateful else slice(r0 + a, r0 + e) if consecutive else r[a:e]
                    try:
                        parts.append(self._call_rows(win[a:e], sel))
                    except Exception as exc:  # this call's windows are lost (their states as before it); the rest run
                        for i in range(a, e):
                            errors[sids[i]] = exc
                        lost += range(a, e)
                    a = e
            except BaseException:  # interrupted: the windows not run yet stay queued
                now = self._clock()
                q, queued = self._queue, self._queued
                for i in range(min(a + bs, m), m):
                    s = streams[sids[i]]
                    q.append(_tnew(_Pending, (s, s._state, _tnew(_Frame, (int(wi[i]), int(start[i]), float(t0[i]), int(ep[i]), 0, win[i : i + 1].copy())), now)))
                    queued[s] = queued.get(s, 0) + 1
                raise
        else:
            self._run_singles(win, [streams[sid] for sid in sids], sids, errors, parts, lost)
        fast = _Fast(tuple(sids), keep, wi, start, t0, ep, parts)
        return slow, (fast if not lost else fast.without(lost))

    def _windows_for(self, m: int) -> np.ndarray:
        """A [m, window] (or [m, window, channels]) array for a block's windows: rows of one array the
        router keeps (grown to the largest block), overwritten by the next block."""
        w = self._winbuf
        if w.shape[0] < m:
            w = self._winbuf = np.empty((max(m, 2 * w.shape[0]),) + w.shape[1:], w.dtype)
        return w[:m]

    def _enter_block_mode(self, ids: list[Hashable], positions: list[int]) -> None:
        """Put the streams of ``positions`` that push()'s path left steady (buffer of window - hop
        samples, no zero fill, clock anchored; nothing queued) into block mode, so their next block
        chunk is cut with the others."""
        cut, sl = self._block, self._slab
        if not cut.ok:
            return
        batched_state = self.batch_size > 1 and self._b.stateful
        for j in positions:
            s = self._streams.get(ids[j])
            if s is None or s._closed or s._in_block or self._queued.get(s):
                continue
            fr = s._framer
            if fr._fill != cut.h or fr._filled or fr._anchor_ts is None or fr._last_ts is None:
                continue
            row = s._row
            assert row is not None  # a router's streams have slab rows
            if batched_state:
                st = s._state
                if st.epoch != fr.epoch:  # restarted, none of its windows queued: the initial state now
                    sl.reset_state(row)
                    st.epoch = fr.epoch
            sl.enter(row, fr)
            s._in_block = True

    def _run_singles(
        self, win: np.ndarray, ss: list[SignalStream], sids: list[Hashable], errors: dict[Hashable, Exception], parts: "list[tuple[Result, _Columns]]", lost: list[int]
    ) -> None:
        """An unbatched router's block: one call per window, each stream's state its StreamState's."""
        b = self._b
        model, name, consts = b.model, b.input_name, b.constants
        for i, (s, data) in enumerate(zip(ss, list(win.reshape((len(ss), 1) + win.shape[1:])))):
            feeds = dict(consts)
            feeds[name] = data
            st = s._state
            try:
                r = model._predict_made(feeds) if st is None else st._predict_made(feeds)
            except Exception as exc:  # this window is lost (the state as before it); the rest run
                errors[sids[i]] = exc
                lost.append(i)
                continue
            parts.append((r, _Columns(r.outputs, None)))

    def poll(self) -> list[WindowResult]:
        """Run queued windows if the oldest has waited ``max_wait_ms`` (and return any
        results not yet returned); else nothing."""
        with self._lock:
            self._run_overdue_at(None)
            return self._take_ready()

    def flush(self) -> list[WindowResult]:
        """Run every queued window now."""
        with self._lock:
            self._run_all()
            return self._take_ready()

    # -- batching --------------------------------------------------------------------------

    def _take_ready(self) -> list[WindowResult]:
        ready, self._ready = self._ready, []
        dur = self._window_ms
        if len(ready) == 1:
            return _batch_windows(ready[0], dur)
        out: list[WindowResult] = []
        for batch in ready:
            out += _batch_windows(batch, dur)
        return out

    def _run_due(self) -> bool:
        """Run full batches, and partial ones while more than max_pending windows wait. True if any ran."""
        k, q = self.batch_size, self._queue
        ran = False
        while (len(self._queued) if self._distinct else len(q)) >= k or len(q) > self.max_pending:
            self._run_batch(self._take())
            ran = True
        return ran

    def _run_all(self, errors: dict[Hashable, Exception] | None = None) -> None:
        """Run every queued window. With ``errors``, a failing call's error is recorded there for
        each of its windows' streams and the rest still run; without, it propagates."""
        while self._queue:
            rows = self._take()
            if errors is None:
                self._run_batch(rows)
                continue
            try:
                self._run_batch(rows)
            except Exception as e:
                for p in rows:
                    errors[p.stream.stream_id] = e

    def _take(self, first: SignalStream | None = None) -> list[_Pending]:
        """Up to batch_size queued windows, oldest first (``first``'s oldest in any case);
        for a stateful model at most one per stream, so the others keep their place."""
        q, k = self._queue, self.batch_size
        taken: list[_Pending] = []
        if first is not None:
            i = next(i for i, p in enumerate(q) if p.stream is first)
            taken.append(q[i])
            del q[i]
        if not self._distinct:
            while q and len(taken) < k:
                taken.append(q.popleft())
        else:
            seen = {first}
            skipped: list[_Pending] = []
            while q and len(taken) < k:
                p = q.popleft()
                if p.stream in seen:
                    skipped.append(p)
                else:
                    seen.add(p.stream)
                    taken.append(p)
            if skipped:
                q.extendleft(reversed(skipped))
        queued = self._queued
        for p in taken:
            n = queued[p.stream] - 1
            if n:
                queued[p.stream] = n
            else:
                del queued[p.stream]
        return taken

    def _run_batch(self, rows: list[_Pending]) -> None:
        """One model call for ``rows`` (windows of different streams when stateful); a _Batch of
        the results goes to ``_ready``, the new states to the streams' slab rows."""
        n = len(rows)
        frames = [p.frame for p in rows]
        data = frames[0].data if n == 1 else np.concatenate([f.data for f in frames])
        idx = None
        if self._b.pairs:
            slab = self._slab
            idx = np.empty(n, np.intp)  # the streams' slab rows
            for j, p in enumerate(rows):
                st = p.state
                assert st is not None  # a stateful stream's windows carry its state
                row = p.stream._row
                assert row is not None  # a router's streams have slab rows
                if st.epoch != p.frame.epoch:  # the stream restarted since this state was made
                    slab.reset_state(row)
                    st.epoch = p.frame.epoch
                idx[j] = row
        r, cols = self._call_rows(data, idx)
        ids = tuple(p.stream.stream_id for p in rows)
        index, start, ts, epoch, filled = ([f[i] for f in frames] for i in (0, 1, 2, 3, 4))  # _Frame's fields, as lists
        self._ready.append(_tnew(_Batch, (ids, index, start, ts, epoch, filled, cols, r)))

    def _call_rows(self, data: np.ndarray, rows: "np.ndarray | slice | None") -> "tuple[Result, _Columns]":
        """One model call on ``data`` (the windows stacked on axis 0) with the states of slab
        ``rows`` (an index array or a slice; stateful models); the new states go back to the rows.
        Returns the call's Result (``batch_size``: the rows) and its output columns."""
        b = self._b
        n = data.shape[0]
        feeds = dict(b.constants)
        feeds[b.input_name] = data
        states = self._state_axes  # (state input, its slab array's axis prefix, state output)
        if rows is not None:
            arrays = self._slab.states
            if isinstance(rows, slice):
                for i_name, pre, _ in states:
                    feeds[i_name] = np.ascontiguousarray(arrays[i_name][pre + (rows,)])
            else:
                for i_name, pre, _ in states:
                    feeds[i_name] = np.take(arrays[i_name], rows, axis=len(pre))
        r = b.model._predict_made(feeds, n)  # windows checked at their push, constants when bound, states the model made
        outs = r.outputs
        for name, ax in self._out_check:
            v = outs[name]
            if v.ndim <= ax or v.shape[ax] != n:
                raise SignalConfigError(
                    f"output {name!r} of {b.model.manifest.name} has shape {v.shape} for a batch of {n} windows: "
                    f"expected {n} rows on axis {ax} (batch_size > 1 needs outputs batched like the inputs)"
                )
        if rows is not None:
            for i_name, pre, o_name in states:
                arrays[i_name][pre + (rows,)] = outs[o_name]
        return r, _Columns(outs, self._out_axes)

    # -- events -----------------------------------------------------------------------------

    @property
    def events(self) -> tuple[StreamEvent, ...]:
        """Recent events of the router and its streams, oldest first (at most ``options.max_events``)."""
        return tuple(self._events)

    def pop_events(self) -> list[StreamEvent]:
        """Events of every stream (and evictions), oldest first, and forget them
        (at most ``options.max_events`` are kept)."""
        with self._lock:
            out = list(self._events)
            self._events.clear()
            return out


def _hashable(stream_id: Hashable) -> Hashable:
    try:
        hash(stream_id)
    except TypeError:
        raise InputTypeError(f"stream_id must be hashable (str, int, tuple ...), got {type(stream_id).__name__}") from None
    return stream_id
