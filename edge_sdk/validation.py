"""Strict input validation: dtype, rank, dims, bounds, finiteness, contiguity.

Nothing is cast or copied: a wrong input is an :class:`~edge_sdk.errors.InputError`
subclass whose message says what was expected and what was given.
A :class:`InputValidator` is compiled once per model so a call costs a few
attribute lookups and comparisons per input.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from .errors import (
    InputDTypeError,
    InputShapeError,
    InputTypeError,
    MissingInputError,
    NonContiguousInputError,
    NonFiniteInputError,
    UnexpectedInputError,
)
from .package import TensorSpec

_FLOATS = frozenset({"float16", "float32", "float64"})


#: Up to this many elements, the finiteness check sums the values as Python floats.
_SMALL = 64


def _probably_finite(x: np.ndarray) -> bool:
    """True when ``x`` has no NaN/Inf (False can also mean "look closer": a sum that overflowed).

    Measured right after an ONNX Runtime call (``python tools/bench/bench_finite.py``; on an AMD EPYC
    Zen 3, docs/benchmarks.md), where the first numpy call pays for its evicted dispatch code and the
    input is out of the caches: for 16 elements a Python sum of ``tolist()`` costs 2.5 us against
    ``np.isfinite(x).all()`` 9.7 us; above 64 elements of float32/float64 one BLAS pass,
    ``np.vdot(x, x)``, is the cheapest (about 1.5 us against 6 us for 512 float32, 125 against 171 us
    for a 1x3x224x224 input after MobileNetV2). A sum of squares is NaN or Inf when an element is
    (squares are >= 0: +Inf and -Inf cannot cancel) and finite otherwise, unless it overflowed
    (|x| beyond ~1e19 in float32): then the caller's exact check decides. Unlike ``np.dot``, ``@``
    and ufunc reductions, ``vdot`` reports no floating-point error, so an overflow is an answer,
    not a RuntimeWarning or (under ``np.errstate(all="raise")``) a FloatingPointError, and no
    ``np.errstate`` (~3 us) is needed (tests/test_finite_check.py pins this). Python floats are
    doubles, so a small float16/32 sum cannot overflow. float16 has no BLAS kernel: ``np.isfinite``."""
    if x.size <= _SMALL:
        return math.isfinite(sum(x.ravel().tolist()))
    if x.dtype.char in "fd":
        return math.isfinite(np.vdot(x, x))
    return bool(np.isfinite(x).all())


def nonfinite_error(name: str, x: np.ndarray) -> NonFiniteInputError | None:
    """The error for input ``name`` when ``x`` holds NaN/Inf (the exact element-wise check), else None."""
    if np.isfinite(x).all():
        return None
    bad = int(np.count_nonzero(~np.isfinite(x)))
    return NonFiniteInputError(f"input {name!r}: expected finite values, got {bad} NaN/Inf of {x.size}")


def first_nonfinite(items: Sequence[tuple[str, np.ndarray]]) -> NonFiniteInputError | None:
    """The error for the first of ``items`` (name, array) that holds NaN/Inf, else None."""
    for name, x in items:
        if not _probably_finite(x):
            err = nonfinite_error(name, x)
            if err is not None:
                return err
    return None


#: From this many elements on, a float input's NaN/Inf scan may run on a spare core while the model
#: runs (:class:`FiniteScanner`): a pass over 64K floats costs tens of microseconds, several times
#: what handing it to another thread costs; below it the scan runs inline.
OVERLAP_MIN = 1 << 16


class _Scan:
    """One scan handed to the :class:`FiniteScanner`: :meth:`wait` blocks until it is done."""

    __slots__ = ("items", "done", "error")

    def __init__(self, items: list[tuple[str, np.ndarray]]) -> None:
        self.items = items
        self.done = threading.Lock()
        self.done.acquire()  # released by the scanning thread
        self.error: BaseException | None = None

    def wait(self) -> BaseException | None:
        """Block until the scan has run; the NonFiniteInputError it found (or what it raised), else None."""
        self.done.acquire()
        self.done.release()
        return self.error


class FiniteScanner:
    """Scans large inputs for NaN/Inf on one background thread, while the calling thread runs the
    model: ONNX Runtime's ``run``, LiteRT's ``invoke`` and numpy's reductions all release the GIL,
    so on a core the session's threads leave free the scan costs the caller only the hand-off.
    The caller waits for the verdict before anything of the call is kept or returned: an input
    with NaN/Inf still raises the same :class:`~edge_sdk.errors.NonFiniteInputError`, and the
    outputs computed from it are dropped.

    :meth:`submit` returns None while an earlier scan is still queued or running (several threads
    predicting at once): that caller scans inline instead, so one background thread never becomes
    every caller's bottleneck. The thread starts on first use and again in a forked child."""

    def __init__(self) -> None:
        self._q: Any = None  # a queue.SimpleQueue of _Scan, made with the thread (the import costs a cold start ~2 ms)
        self._thread: threading.Thread | None = None
        self._busy = False  # a scan is queued or running (under _lock)
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):  # a forked child has no scanning thread: start one on its first use
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _forget(ref()))

    def _forget_thread(self) -> None:
        self._q = None
        self._thread = None
        self._busy = False
        self._lock = threading.Lock()

    def submit(self, items: list[tuple[str, np.ndarray]]) -> _Scan | None:
        """Queue a scan of ``items`` (name, array); None when the thread is busy (scan inline then)."""
        with self._lock:
            if self._busy:
                return None
            self._busy = True
            if self._thread is None:
                import queue

                self._q = queue.SimpleQueue()
                t = threading.Thread(target=self._loop, args=(self._q,), name="edge-sdk-finite-scan", daemon=True)
                t.start()
                self._thread = t
        job = _Scan(items)
        self._q.put(job)
        return job

    def _loop(self, q: Any) -> None:
        while True:
            job = q.get()
            try:
                job.error = first_nonfinite(job.items)
            except BaseException as e:  # e.g. MemoryError from the exact check: the caller raises it
                job.error = e
            finally:
                with self._lock:
                    self._busy = False
                job.done.release()


def _forget(scanner: FiniteScanner | None) -> None:
    if scanner is not None:
        scanner._forget_thread()


#: The process's scanner (:meth:`Model.predict <edge_sdk.model.Model.predict>` uses it when the
#: session leaves a CPU free).
SCANNER = FiniteScanner()


class _One:
    __slots__ = ("name", "dtype", "rank", "checks", "fixed_shape", "max_size", "is_float", "shape_text")

    def __init__(self, spec: TensorSpec) -> None:
        self.name = spec.name
        self.dtype = np.dtype(spec.dtype)
        self.rank = len(spec.shape)
        self.is_float = spec.dtype in _FLOATS
        # (axis, fixed value or None, lo, hi, dim name)
        checks: list[tuple[int, int | None, int, int, str | None]] = []
        for ax, d in enumerate(spec.shape):
            if isinstance(d, int):
                checks.append((ax, d, d, d, None))
            else:
                lo, hi = spec.bounds(d) or (1, 2**31 - 1)
                checks.append((ax, None, lo, hi, d))
        self.checks = tuple(checks)
        # every dim fixed: one tuple comparison decides the shape (the loop below only words the error)
        self.fixed_shape = tuple(spec.shape) if all(isinstance(d, int) for d in spec.shape) else None
        self.max_size = math.prod(hi for _, _, _, hi, _ in checks)  # the most elements a valid input can have
        self.shape_text = "[" + ", ".join(
            str(d) if isinstance(d, int) else f"{d}:{lo}..{hi}" for d, (_, _, lo, hi, _) in zip(spec.shape, checks)
        ) + "]"

    def check(self, x: object, finite: bool = True, deferred: list[tuple[str, np.ndarray]] | None = None) -> np.ndarray:
        """``x`` checked, as the ndarray to feed. ``deferred``: where a float input of at least
        :data:`OVERLAP_MIN` elements goes instead of being scanned for NaN/Inf here (the caller
        scans it, see :class:`FiniteScanner`)."""
        if type(x) is not np.ndarray:
            if isinstance(x, np.ndarray):
                x = np.asarray(x)  # ndarray subclass (e.g. memmap): a view, not a copy
            else:
                raise InputTypeError(
                    f"input {self.name!r}: expected numpy.ndarray of {self.dtype} with shape {self.shape_text}, got {type(x).__name__}"
                )
        if x.dtype != self.dtype:
            raise InputDTypeError(f"input {self.name!r}: expected dtype {self.dtype}, got {x.dtype} (nothing is cast silently)")
        if x.ndim != self.rank:
            raise InputShapeError(f"input {self.name!r}: expected rank {self.rank} {self.shape_text}, got shape {x.shape}")
        shape = x.shape
        if shape != self.fixed_shape:
            self._check_dims(shape)
        if not x.flags.c_contiguous:
            raise NonContiguousInputError(
                f"input {self.name!r}: expected a C-contiguous array, got strides {x.strides}; pass np.ascontiguousarray(x)"
            )
        if finite and self.is_float:
            if deferred is not None and x.size >= OVERLAP_MIN:
                deferred.append((self.name, x))
            elif not _probably_finite(x):
                err = nonfinite_error(self.name, x)
                if err is not None:
                    raise err
        return x

    def _check_dims(self, shape: tuple[int, ...]) -> None:
        for ax, fixed, lo, hi, dname in self.checks:
            n = shape[ax]
            if fixed is not None:
                if n != fixed:
                    raise InputShapeError(f"input {self.name!r}: expected dim {ax} = {fixed} in {self.shape_text}, got shape {shape}")
            elif n < lo or n > hi:
                raise InputShapeError(
                    f"input {self.name!r}: dim {ax} ({dname}) must be in [{lo}, {hi}] per {self.shape_text}, got {n} in shape {shape}"
                )


class InputValidator:
    """Validates a call's inputs against the declared specs.

    Accepts one array (single-input models) or a mapping name -> array.
    Returns the feeds dict (the caller's arrays, never copies).
    """

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        self.specs = tuple(specs)
        self._ones = {s.name: _One(s) for s in specs}
        self._single = self._ones[specs[0].name] if len(specs) == 1 else None
        self.names = tuple(s.name for s in specs)
        #: whether a valid input can be a float tensor of OVERLAP_MIN elements or more (one ``deferred`` may receive)
        self.may_defer = any(o.is_float and o.max_size >= OVERLAP_MIN for o in self._ones.values())

    def __call__(
        self, x: Any, *, skip: frozenset[str] = frozenset(), finite: bool = True, deferred: list[tuple[str, np.ndarray]] | None = None
    ) -> dict[str, np.ndarray]:
        """``finite=False`` skips the NaN/Inf scan, for tensors the SDK made itself
        from uint8 pixels and finite constants (it costs a full pass over the input).
        ``deferred``: a list that receives (name, array) of float inputs of at least
        :data:`OVERLAP_MIN` elements instead of scanning them (the caller must scan them)."""
        single = self._single
        if single is not None and type(x) is np.ndarray:  # the common call, before the (slower) Mapping ABC check
            return {single.name: single.check(x, finite, deferred)}
        if type(x) is dict or isinstance(x, Mapping):
            extra = [k for k in x if k not in self._ones]
            if extra:
                raise UnexpectedInputError(f"unexpected input(s) {extra}; the model takes {list(self.names)}")
            feeds = {}
            for name, one in self._ones.items():
                if name in skip:
                    continue
                if name not in x:
                    raise MissingInputError(f"missing input {name!r}; the model takes {list(self.names)}")
                feeds[name] = one.check(x[name], finite, deferred)
            return feeds
        if single is None:
            wanted = [n for n in self.names if n not in skip]
            if len(wanted) == 1:
                return {wanted[0]: self._ones[wanted[0]].check(x, finite, deferred)}
            raise InputTypeError(f"this model has {len(self.names)} inputs {list(self.names)}; pass a dict name -> array")
        return {single.name: single.check(x, finite, deferred)}
