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

Nothing here starts a thread: a router's bounded wait is enforced when ``push``/``poll``
is called (call ``poll()`` from your loop at least every ``max_wait_ms``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, NamedTuple

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
    """``StreamRouter.open`` for a stream id that is already open."""


class StreamRouterOwnedError(EdgeSDKError, RuntimeError):
    """``SignalStream.push`` on a stream of a batching StreamRouter: push through the router,
    which keeps the stream's windows in order with those queued for a batch."""


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

    def __init__(self, opts: SignalStreamOptions, stream_id: Hashable, emit: Callable[[StreamEvent], None]) -> None:
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
        self._buf = np.zeros((opts.buffer_samples, opts.channels), dtype=self._dtype)
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
    ) -> None:
        if not isinstance(options, SignalStreamOptions):
            raise SignalConfigError(f"options: expected SignalStreamOptions, got {type(options).__name__}")
        self.options = options
        self.stream_id = stream_id
        self._b = _binding or _Binding(model, options, input_name, constants)
        self._events: deque[StreamEvent] = deque(maxlen=options.max_events)
        self._sink = on_event or self._events.append
        self._framer = _Framer(options, stream_id, self._sink)
        # A batching router runs this stream's windows in batches with other streams' and
        # keeps the state as a _RowState (reset lazily, by epoch, in the router's order).
        self._owner = _owner
        self._state: Any = (_RowState(self._b) if _owner is not None else model.stream()) if self._b.stateful else None
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Free the buffer and the model state (the model stays open). Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
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
        with self._lock:
            self._check_open()
            f = self._framer.push_steady(samples, timestamp_ms)
            if f is not None:
                return self._run([f])
            plan = self._framer.push(samples, timestamp_ms)
            if plan.reset and self._state is not None:
                self._state.reset()
            return self._run(plan.frames) if plan.frames else []

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
        with self._lock:
            self._check_open()
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
    """One stream's model state in a batching router: one array per state input, with size 1
    on the pair's batch axis, and the epoch it belongs to. A window of a later epoch (the
    stream restarted: gap reset, ``reset()``) starts from the initial state, so a reset takes
    effect in the stream's own order, after its windows queued before it have run."""

    __slots__ = ("arrays", "epoch")

    def __init__(self, b: _Binding) -> None:
        self.arrays: dict[str, np.ndarray] = b.row_init  # read-only; replaced, never written
        self.epoch = 0


class _Pending(NamedTuple):
    stream: SignalStream
    state: _RowState | None
    frame: _Frame
    enqueued_s: float


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
    windows (the streams' states stay as they were before it). Thread-safe (one lock: model
    calls are serialised).

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
        self._queue: deque[_Pending] = deque()  # oldest first
        self._queued: dict[SignalStream, int] = {}  # queued windows per stream (only streams with some)
        self._distinct = self._b.stateful  # one window per stream per batch
        self._ready: list[WindowResult] = []  # run, not yet returned
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
            old.close()
            self._events.append(
                StreamEvent("evicted", "close", old_id, math.nan, 0, f"stream {old_id!r} closed to open {stream_id!r} (max_streams={self.max_streams}, least recently pushed)")
            )
        owner = self if self.batch_size > 1 else None
        s = SignalStream(self.model, self.options, stream_id=stream_id, on_event=self._events.append, _binding=self._b, _owner=owner)
        self._streams[stream_id] = s
        return s

    def close(self, stream_id: Hashable) -> list[WindowResult]:
        """Close one stream (unknown ids are ignored). Runs windows still queued for a batch
        (of every stream) and returns their results."""
        with self._lock:
            self._run_all()
            s = self._streams.pop(_hashable(stream_id), None)
            if s is not None:
                s.close()
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
                s.close()
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
        with s._lock:
            s._check_open()
            f = s._framer.push_steady(samples, timestamp_ms)
            if f is not None:
                frames: list[_Frame] = [f]
            else:
                frames = s._framer.push(samples, timestamp_ms).frames  # a reset is applied by epoch (_RowState)
        q = self._queue
        now: float | None = None
        if frames:
            now = self._clock()
            st = s._state
            for f in frames:
                q.append(_tnew(_Pending, (s, st, f, now)))
            queued = self._queued
            queued[s] = queued.get(s, 0) + len(frames)
            if self._run_due():
                now = None
        if not q:
            return
        if now is None:
            now = self._clock()
        max_wait = self.max_wait_ms
        while (now - q[0].enqueued_s) * 1000.0 >= max_wait:  # _run_overdue, on the reading above
            self._run_batch(self._take())
            if not q:
                return
            now = self._clock()

    def poll(self) -> list[WindowResult]:
        """Run queued windows if the oldest has waited ``max_wait_ms`` (and return any
        results not yet returned); else nothing."""
        with self._lock:
            self._run_overdue()
            return self._take_ready()

    def flush(self) -> list[WindowResult]:
        """Run every queued window now."""
        with self._lock:
            self._run_all()
            return self._take_ready()

    # -- batching --------------------------------------------------------------------------

    def _take_ready(self) -> list[WindowResult]:
        out, self._ready = self._ready, []
        return out

    def _run_due(self) -> bool:
        """Run full batches, and partial ones while more than max_pending windows wait. True if any ran."""
        k, q = self.batch_size, self._queue
        ran = False
        while (len(self._queued) if self._distinct else len(q)) >= k or len(q) > self.max_pending:
            self._run_batch(self._take())
            ran = True
        return ran

    def _run_overdue(self) -> None:
        q = self._queue
        while q and (self._clock() - q[0].enqueued_s) * 1000.0 >= self.max_wait_ms:
            self._run_batch(self._take())

    def _run_all(self) -> None:
        while self._queue:
            self._run_batch(self._take())

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
        """One model call for ``rows`` (windows of different streams when stateful); the
        results go to ``_ready``, the new states to their streams."""
        b = self._b
        n = len(rows)
        feeds = dict(b.constants)
        frames = [p.frame for p in rows]
        feeds[b.input_name] = frames[0].data if n == 1 else np.concatenate([f.data for f in frames])
        pairs = b.pairs
        if pairs:
            states = []
            for p in rows:
                st = p.state
                assert st is not None  # a stateful stream's windows carry its state
                if st.epoch != p.frame.epoch:  # the stream restarted since this state was made
                    st.arrays, st.epoch = b.row_init, p.frame.epoch
                states.append(st.arrays)
            for name, _, ax in pairs:
                feeds[name] = states[0][name] if n == 1 else np.concatenate([a[name] for a in states], axis=ax)
        r = b.model._predict_made(feeds)  # windows checked at their push, constants when bound, states the model made
        outs = r.outputs
        state_out = {o: (i, ax) for i, o, ax in pairs if ax is not None}  # all of them: check_batching
        names: list[str] = []  # each output's name, and its n rows as views of one array
        cols: list[list[np.ndarray]] = []
        feeds_state: list[tuple[int, str]] = []  # (position in names, the state input that output feeds)
        for name, v in outs.items():
            i_name, ax = state_out.get(name, (None, 0))
            if v.ndim <= ax or v.shape[ax] != n:
                raise SignalConfigError(
                    f"output {name!r} of {b.model.manifest.name} has shape {v.shape} for a batch of {n} windows: "
                    f"expected {n} rows on axis {ax} (batch_size > 1 needs outputs batched like the inputs)"
                )
            # Row i keeps its rank, with size 1 on the batch axis, as unbatched. A state's rows are
            # made contiguous (one copy per call) and become the streams' states as they are.
            row_shape = v.shape[:ax] + (1,) + v.shape[ax + 1 :]
            lead = np.ascontiguousarray(np.moveaxis(v, ax, 0)) if ax else v
            if i_name is not None:
                feeds_state.append((len(names), i_name))
            names.append(name)
            cols.append(list(lead.reshape((n,) + row_shape)))
        dec = r.decoded
        assert dec is None or isinstance(dec, tuple)  # check_batching refuses detection and segmentation decoders
        # Each row's Result is the call's (timings, provenance, ...) but for outputs, decoded and batch_size (n).
        R = type(r)
        rest = (*r[2:8], n, *r[9:])
        dur = self.options.window_ms
        decs = [None] * n if dec is None else [(d,) for d in dec]
        rows_out = list(zip(*cols))  # per row: its view of every output, in names' order
        if pairs:
            for p, vals in zip(rows, rows_out):
                st = p.state
                assert st is not None  # as above
                st.arrays = {i_name: vals[j] for j, i_name in feeds_state}
        self._ready += [
            _tnew(WindowResult, (p.stream.stream_id, f.window, f.start_sample, f.timestamp_ms, dur, f.epoch, f.filled, _tnew(R, (dict(zip(names, vals)), d, *rest))))
            for p, f, vals, d in zip(rows, frames, rows_out, decs)
        ]

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
