"""Metrics core, the bottom of :mod:`edge_sdk.telemetry`: :class:`Sample`, :class:`Provenance`,
the fixed-bucket :class:`Histogram`, per-model :class:`ModelTelemetry` in a process-wide table
(:func:`model_telemetry`, :func:`models`, :func:`forget_model`) and :func:`model_samples`.

It imports nothing of the SDK but its version and :class:`~edge_sdk._listeners.Listeners`, so
every subsystem (the model, pipelines, the governor, the router, quality) can build its samples
next to its object without an import going up. How the histograms work: the package docstring.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from .._listeners import Listeners
from .._log import get_logger
from .._record import frozen
from .._version import __version__ as _SDK_VERSION
from ..errors import OptionsError

_log = get_logger("edge_sdk.telemetry")

TYPES = ("gauge", "counter", "untyped", "histogram")
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


@frozen
class Sample:
    """One metric sample. ``name``: ``[a-zA-Z_:][a-zA-Z0-9_:]*``; ``kind``: gauge | counter |
    untyped | histogram. A histogram is exposed as its samples: ``<family>_bucket`` (with an
    ``le`` label), ``<family>_sum`` and ``<family>_count``, each of kind "histogram" (the
    exposition writes one ``# TYPE <family> histogram``). A value of None (unknown) is left out of
    the exposition rather than made up."""

    name: str
    value: float | None
    help: str = ""
    kind: str = "gauge"
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.name
        if not n or not (n[0].isalpha() or n[0] in "_:") or not all(c.isalnum() or c in "_:" for c in n) or not n.isascii():
            raise ValueError(f"metric name {n!r}: expected [a-zA-Z_:][a-zA-Z0-9_:]*")
        if self.kind not in TYPES:
            raise ValueError(f"metric {n}: kind must be one of {TYPES}, got {self.kind!r}")
        if self.kind == "histogram":
            if not n.endswith(HIST_SUFFIXES):
                raise ValueError(f"metric {n}: kind 'histogram' is for <family>_bucket / _sum / _count samples")
            if n.endswith("_bucket") and "le" not in self.labels:
                raise ValueError(f"metric {n}: a histogram bucket needs an 'le' label")
        for k in self.labels:
            if not k or not (k[0].isalpha() or k[0] == "_") or not all(c.isalnum() or c == "_" for c in k) or not k.isascii():
                raise ValueError(f"metric {n}: label name {k!r}: expected [a-zA-Z_][a-zA-Z0-9_]*")

    @property
    def family(self) -> str:
        """The metric family: the name, less ``_bucket`` / ``_sum`` / ``_count`` for a histogram."""
        if self.kind == "histogram":
            for suffix in HIST_SUFFIXES:
                if self.name.endswith(suffix):
                    return self.name[: -len(suffix)]
        return self.name


def format_value(v: float) -> str:
    """A sample value as the text format writes it (NaN, +Inf, -Inf, integers without a point)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))



# ----------------------------------------------------------------------------------------------
# provenance


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a result came from, enough to trace a disputed answer months later: the package's
    model name and version, the variant and the SHA-256 of its model file, the backend, the
    runtime and its version, the device profile and the SDK version. One immutable object per
    loaded model, shared by every :class:`~edge_sdk.model.Result` it returns."""

    model: str
    version: str
    sha256: str
    variant: str
    backend: str
    runtime: str
    runtime_version: str
    profile: str
    sdk_version: str = _SDK_VERSION

    def to_dict(self) -> dict[str, str]:
        """Every field, by name (strings)."""
        return {
            "model": self.model,
            "version": self.version,
            "sha256": self.sha256,
            "variant": self.variant,
            "backend": self.backend,
            "runtime": self.runtime,
            "runtime_version": self.runtime_version,
            "profile": self.profile,
            "sdk_version": self.sdk_version,
        }

    def labels(self) -> dict[str, str]:
        """The Prometheus labels of a model's series (the digest cut to 12 hex digits; the full
        provenance is in ``edge_sdk_model_info``)."""
        return {
            "model": self.model,
            "version": self.version,
            "variant": self.variant,
            "sha256": self.sha256[:12],
            "backend": self.backend,
            "profile": self.profile,
        }


# ----------------------------------------------------------------------------------------------
# histograms

BUCKETS_PER_DECADE = 60
#: Upper bucket edges in nanoseconds: 100 ns x 10 ** (j / 60), j = 0..540 (100 ns .. 100 s).
#: Bucket 0 holds [0, 100 ns], bucket j (1..540) holds (EDGES_NS[j-1], EDGES_NS[j]], bucket 541 the rest.
EDGES_NS: tuple[float, ...] = tuple(10.0 ** (2 + j / BUCKETS_PER_DECADE) for j in range(9 * BUCKETS_PER_DECADE + 1))
#: The edges rounded down to whole ns: for the integer ns the clocks give, ``x <= floor(edge)`` is
#: ``x <= edge``, so bucketing is the same, and int-to-int comparisons make ``bisect`` ~2x faster.
_EDGES_INT: tuple[int, ...] = tuple(math.floor(e) for e in EDGES_NS)
N_BUCKETS = len(EDGES_NS) + 1
#: The most a percentile read from a histogram is off, relative, for values in (100 ns, 100 s].
PERCENTILE_ERROR = math.sqrt(10.0 ** (1 / BUCKETS_PER_DECADE)) - 1.0
#: Bucket edges kept in the Prometheus exposition: every tenth, 1 us .. 100 s (indexes into EDGES_NS).
EXPORT_EDGES = tuple(range(BUCKETS_PER_DECADE, len(EDGES_NS), 10))
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def _pct_key(q: float) -> str:
    return f"p{q:g}"


@frozen
class HistogramSnapshot:
    """A copy of a histogram's buckets (``counts``: N_BUCKETS counts) and sum (``sum_ns``)."""

    counts: tuple[int, ...]
    sum_ns: float

    @property
    def count(self) -> int:
        """Number of records."""
        return sum(self.counts)

    @property
    def sum_s(self) -> float:
        """Sum of the records in seconds."""
        return self.sum_ns / 1e9

    @property
    def mean_s(self) -> float | None:
        """Mean in seconds, or None without records."""
        n = self.count
        return self.sum_ns / 1e9 / n if n else None

    def percentiles(self, qs: Sequence[float] = DEFAULT_PERCENTILES) -> dict[float, float | None]:
        """``q`` (0..100) -> seconds, nearest rank (module docs); None for an empty histogram."""
        cum = list(accumulate(self.counts))
        n = cum[-1]
        out: dict[float, float | None] = {}
        for q in qs:
            if not 0.0 <= q <= 100.0:
                raise OptionsError(f"percentile: expected q in [0, 100], got {q!r}")
            if n == 0:
                out[q] = None
                continue
            rank = min(n, max(1, math.ceil(q * n / 100.0 - 1e-9)))
            j = bisect_left(cum, rank)
            if j == 0:
                ns = EDGES_NS[0]
            elif j >= len(EDGES_NS):
                ns = EDGES_NS[-1]
            else:
                ns = math.sqrt(EDGES_NS[j - 1] * EDGES_NS[j])
            out[q] = ns / 1e9
        return out

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0..100) in seconds, or None without records; see :meth:`percentiles`."""
        return self.percentiles((q,))[q]

    def cumulative(self, edge_indexes: Sequence[int] = EXPORT_EDGES) -> list[tuple[float, int]]:
        """``(le seconds, observations <= le)`` at the given edges, then ``(inf, count)``."""
        cum = list(accumulate(self.counts))
        return [(EDGES_NS[j] / 1e9, cum[j]) for j in edge_indexes] + [(math.inf, cum[-1])]

    def to_dict(self, qs: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
        """JSON-ready: count, sum_ms, mean_ms and ``p50_ms`` ... ``p99.9_ms`` (None when empty)."""
        mean = self.mean_s
        d: dict[str, Any] = {"count": self.count, "sum_ms": self.sum_ns / 1e6, "mean_ms": None if mean is None else mean * 1e3}
        for q, v in self.percentiles(qs).items():
            d[f"{_pct_key(q)}_ms"] = None if v is None else v * 1e3
        return d


class _Reader:
    """Percentile reading shared by :class:`Histogram` and a model's stage histograms."""

    __slots__ = ()

    def snapshot(self) -> HistogramSnapshot:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def count(self) -> int:
        return self.snapshot().count

    def percentile(self, q: float) -> float | None:
        """Seconds, nearest rank, within PERCENTILE_ERROR (see :meth:`HistogramSnapshot.percentiles`)."""
        return self.snapshot().percentile(q)

    def percentiles(self, qs: Sequence[float] = DEFAULT_PERCENTILES) -> dict[float, float | None]:
        return self.snapshot().percentiles(qs)

    def histogram_samples(self, name: str, help: str, labels: Mapping[str, str]) -> list[Sample]:
        """The exposition of this histogram as family ``name`` (coarsened to EXPORT_EDGES)."""
        return _histogram_samples(self.snapshot(), name, help, labels)


class Histogram(_Reader):
    """Durations in fixed exponential buckets (module docs); thread-safe (one lock per record).
    For a standalone measurement; a model's stages are recorded by :class:`ModelTelemetry`."""

    __slots__ = ("_c", "_sum", "_lock")

    def __init__(self) -> None:
        self._c = [0] * N_BUCKETS  # bucket counts
        self._sum: int | float = 0  # the sum (ns): an int until a float duration is recorded
        self._lock = threading.Lock()

    def record_ns(self, ns: int | float) -> None:
        """Record one duration in nanoseconds."""
        c = self._c
        i = bisect_left(_EDGES_INT if isinstance(ns, int) else EDGES_NS, ns)
        with self._lock:
            c[i] += 1
            self._sum += ns

    def record_s(self, seconds: float) -> None:
        """Record one duration in seconds."""
        self.record_ns(seconds * 1e9)

    def snapshot(self) -> HistogramSnapshot:
        """The bucket counts and sum now, as a :class:`HistogramSnapshot`."""
        with self._lock:
            counts, total = tuple(self._c), self._sum
        return HistogramSnapshot(counts, total)


def _histogram_samples(snap: HistogramSnapshot, name: str, help: str, labels: Mapping[str, str]) -> list[Sample]:
    out = [Sample(f"{name}_bucket", n, help, "histogram", {**labels, "le": format_value(le)}) for le, n in snap.cumulative()]
    out.append(Sample(f"{name}_sum", snap.sum_s, help, "histogram", labels))
    out.append(Sample(f"{name}_count", snap.count, help, "histogram", labels))
    return out


# ----------------------------------------------------------------------------------------------
# per-model telemetry

#: Stage names, in the order :meth:`ModelTelemetry.record` takes them ("remote" replaces
#: "inference" for a model whose backend is remote).
STAGES = ("validate", "preprocess", "inference", "decode", "total")
_MESSAGE_CHARS = 200
T = TypeVar("T")


@frozen
class ModelEvent:
    """Something that happened to a model (now: ``kind`` "error"): the call that failed
    (``call``: predict, predict_image, ...), the exception type and its message (cut at 200
    characters), the model's provenance and when (``unix_s``)."""

    kind: str
    call: str
    error: str
    message: str
    provenance: Provenance
    unix_s: float


_model_listeners: Listeners[ModelEvent] = Listeners("model events")


def model_listeners() -> Listeners[ModelEvent]:
    """The process-wide listeners told of every model's events (``EventLog.watch_models``)."""
    return _model_listeners


def emit_model_event(emit: Callable[..., Any], ev: ModelEvent) -> None:
    """Hand a :class:`ModelEvent` to an ``EventLog.emit``-like ``emit(source, kind, **fields)``."""
    emit("model", ev.kind, call=ev.call, error=ev.error, message=ev.message, provenance=ev.provenance)


def model_key(p: Provenance) -> str:
    """The name under which ``Registry.track`` keeps a model: its provenance in one string."""
    return f"{p.model} {p.version} {p.variant} {p.sha256} {p.backend} {p.profile}"


FOLD_AT = 4096  # pending values per stage that make the recording thread fold them into the buckets
_np_edges: Any = None


def _edges_array() -> Any:
    global _np_edges
    if _np_edges is None:
        import numpy as np

        _np_edges = np.array(_EDGES_INT, dtype=np.int64)
    return _np_edges


class _StageHistogram(_Reader):
    """One stage of a :class:`ModelTelemetry`, read-only (folds what is pending, then reads)."""

    __slots__ = ("_tm", "_k")

    def __init__(self, tm: "ModelTelemetry", k: int) -> None:
        self._tm, self._k = tm, k

    def snapshot(self) -> HistogramSnapshot:
        counts, sums, _ = self._tm._folded()
        return HistogramSnapshot(counts[self._k], sums[self._k])


class ModelTelemetry:
    """Latency histograms per stage, requests and errors by type for one :class:`Provenance`
    (shared by every Model instance with it; get one with :func:`model_telemetry`).

    ``requests`` counts calls that recorded a result or failed; ``errors`` counts failures by
    exception type name. A call of ``predict_batch`` that runs n rows at once records once.

    Recording (:meth:`record`) appends each stage's duration, an int the caller already has, to
    that stage's pending list: a C-level ``list.append``, atomic in CPython with or without the
    GIL, so no lock and no new object. The pending values are bucketed in bulk (numpy
    ``searchsorted`` over the same edges, then ``bincount``) when anything is read, or by the
    recording thread once FOLD_AT (4096) calls are pending, which bounds the memory (about 0.5 to
    1 ms, once per 4096 calls, on a 2-vCPU x86 box: ``tools/bench/bench_telemetry.py``)."""

    def __init__(self, provenance: Provenance) -> None:
        import numpy as np  # a dependency of the SDK, imported here so `import edge_sdk.telemetry` stays light

        self.provenance = provenance
        self.labels: Mapping[str, str] = MappingProxyType(provenance.labels())
        infer = "remote" if provenance.backend == "remote" else "inference"
        self.stages: tuple[str, ...] = ("validate", "preprocess", infer, "decode", "total")
        self.histograms: Mapping[str, _Reader] = MappingProxyType({s: _StageHistogram(self, k) for k, s in enumerate(self.stages)})
        # pending ns per stage, then one entry per call recorded by record_inference (serve)
        self._pending: tuple[list[int], ...] = tuple([] for _ in range(len(STAGES) + 1))
        self._append = tuple(q.append for q in self._pending)
        self._total = self._pending[4]
        self._fold_lock = threading.Lock()
        self._counts = np.zeros((len(STAGES), N_BUCKETS), dtype=np.int64)  # folded, under _fold_lock
        self._sums = [0] * len(STAGES)
        self._serve_calls = 0
        self._lock = threading.Lock()  # errors and the open count
        self._errors: dict[str, int] = {}
        self._open = 0
        self._listeners: Listeners[ModelEvent] = Listeners("model telemetry")
        self._cache_on = False  # a Model with a result cache (edge_sdk.result_cache) is open or was
        self._cache_counts = [0, 0]  # result-cache hits, misses (under _lock)

    # -- the hot path (Model._finish) ------------------------------------------------------------

    def record(self, validate_ns: int, preprocess_ns: int, inference_ns: int, decode_ns: int, total_ns: int) -> None:
        """Count one call and its stage durations (integer ns, as ``time.perf_counter_ns`` gives).
        ``preprocess_ns`` 0: the call had no preprocessing (a tensor input), so nothing is recorded
        for that stage."""
        av, ap, ai, ad, at, _ = self._append
        av(validate_ns)
        if preprocess_ns:
            ap(preprocess_ns)
        ai(inference_ns)
        ad(decode_ns)
        at(total_ns)
        if len(self._total) >= FOLD_AT:
            self._fold(block=False)

    def record_cached(self, validate_ns: int, preprocess_ns: int, decode_ns: int, total_ns: int) -> None:
        """Count one call answered from the result cache: like :meth:`record`, but the inference
        stage is not recorded (the model did not run)."""
        av, ap, _ai, ad, at, _ = self._append
        av(validate_ns)
        if preprocess_ns:
            ap(preprocess_ns)
        ad(decode_ns)
        at(total_ns)
        if len(self._total) >= FOLD_AT:
            self._fold(block=False)

    def result_cache_enabled(self) -> None:
        """Export the result-cache counters of this model (zero until the first lookup)."""
        self._cache_on = True

    def result_cache_lookup(self, hit: bool) -> None:
        """Count one result-cache lookup (a hit or a miss)."""
        with self._lock:
            self._cache_counts[0 if hit else 1] += 1

    @property
    def result_cache(self) -> dict[str, Any] | None:
        """``{"hits", "misses", "hit_rate"}`` over every instance of this model, None when
        no instance was loaded with a result cache."""
        if not self._cache_on:
            return None
        with self._lock:
            hits, misses = self._cache_counts
        return {"hits": hits, "misses": misses, "hit_rate": hits / (hits + misses) if hits + misses else None}

    def record_inference(self, ns: int) -> None:
        """Count one call that only ran the model (``edge-sdk serve``'s worker: validation and
        encoding are the server's), recorded in the inference (or remote) stage."""
        self._append[2](ns)
        self._append[5](1)
        if len(self._pending[2]) >= FOLD_AT:
            self._fold(block=False)

    def _fold(self, block: bool = True) -> None:
        """Bucket the pending values. Appends that race with it land after the part taken (a
        list's copy and its ``del`` of that part are each atomic), so none is lost or counted twice."""
        if not self._fold_lock.acquire(blocking=block):
            return  # another thread is folding: this thread's values go in the next fold
        try:
            import numpy as np

            edges = _edges_array()
            for k, q in enumerate(self._pending[: len(STAGES)]):
                n = len(q)
                if not n:
                    continue
                a = np.fromiter(q[:n], dtype=np.int64, count=n)
                del q[:n]
                self._counts[k] += np.bincount(np.searchsorted(edges, a, side="left"), minlength=N_BUCKETS)
                self._sums[k] += int(a.sum())
            calls = self._pending[len(STAGES)]
            n = len(calls)
            del calls[:n]
            self._serve_calls += n
        finally:
            self._fold_lock.release()

    def _folded(self) -> tuple[list[tuple[int, ...]], list[int], int]:
        """Fold, then copy: per-stage bucket counts, per-stage sums (ns), calls recorded by serve."""
        self._fold()
        with self._fold_lock:
            return [tuple(c) for c in self._counts.tolist()], list(self._sums), self._serve_calls

    def timed(self, run: Callable[[T], Any]) -> Callable[[T], Any]:
        """``run`` (a session's ``run(feeds)``) wrapped to record each call with
        :meth:`record_inference` and count its failures (call "serve")."""
        clock = time.perf_counter_ns

        def timed_run(feeds: T) -> Any:
            t0 = clock()
            try:
                out = run(feeds)
            except Exception as e:
                self.error(e, "serve")
                raise
            self.record_inference(clock() - t0)
            return out

        return timed_run

    def error(self, exc: BaseException, call: str) -> None:
        """Count a failed call by exception type and tell the listeners (never raises)."""
        name = type(exc).__name__
        with self._lock:
            self._errors[name] = self._errors.get(name, 0) + 1
        if not (self._listeners or _model_listeners):
            return
        ev = ModelEvent("error", call, name, str(exc)[:_MESSAGE_CHARS], self.provenance, time.time())
        self._listeners.emit(ev)
        _model_listeners.emit(ev)

    def subscribe(self, callback: Callable[[ModelEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for every :class:`ModelEvent` of this model (on the calling
        thread; keep it quick). Returns an unsubscribe function."""
        return self._listeners.add(callback)

    # -- lifecycle (Model) -------------------------------------------------------------------------

    def opened(self) -> None:
        """Count one instance of the model opened."""
        with self._lock:
            self._open += 1

    def closed(self) -> None:
        """Count one instance of the model closed."""
        with self._lock:
            self._open = max(0, self._open - 1)

    # -- reading -----------------------------------------------------------------------------------

    @property
    def open_instances(self) -> int:
        """Instances of the model open now."""
        return self._open

    @property
    def errors(self) -> dict[str, int]:
        """Failed calls by error type name."""
        with self._lock:
            return dict(self._errors)

    def _read(self) -> tuple[list[HistogramSnapshot], int, dict[str, int], int]:
        counts, sums, serve_calls = self._folded()
        errors = self.errors
        snaps = [HistogramSnapshot(c, sm) for c, sm in zip(counts, sums)]
        return snaps, snaps[len(STAGES) - 1].count + serve_calls + sum(errors.values()), errors, self._open

    @property
    def requests(self) -> int:
        """Model calls that returned or failed."""
        return self._read()[1]

    def snapshot(self, qs: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
        """JSON-ready: provenance, open instances, requests, errors by type and, per stage with
        records, count / sum / mean / percentiles in ms."""
        snaps, requests, errors, n_open = self._read()
        return {
            "provenance": self.provenance.to_dict(),
            "open": n_open,
            "requests": requests,
            "errors": errors,
            "stages": {s: snap.to_dict(qs) for s, snap in zip(self.stages, snaps) if snap.count},
            **({"result_cache": rc} if (rc := self.result_cache) is not None else {}),
        }

    def samples(self) -> list[Sample]:
        """The model's metrics as Prometheus samples: info (provenance), open instances, requests, errors and per-stage latency
        histograms."""
        lab = dict(self.labels)
        snaps, requests, errors, n_open = self._read()
        out = [
            Sample("edge_sdk_model_info", 1, "provenance of each model loaded (value 1)", "gauge", self.provenance.to_dict()),
            Sample("edge_sdk_model_open", n_open, "instances of the model open now (its series stay after close)", "gauge", lab),
            Sample("edge_sdk_model_requests_total", requests, "model calls that returned or failed", "counter", lab),
        ]
        out += [
            Sample("edge_sdk_model_errors_total", n, "model calls that failed, by exception type", "counter", {**lab, "type": t})
            for t, n in sorted(errors.items())
        ]
        rc = self.result_cache
        if rc is not None:
            out += [
                Sample("edge_sdk_model_result_cache_hits_total", rc["hits"], "calls answered from the result cache", "counter", lab),
                Sample("edge_sdk_model_result_cache_misses_total", rc["misses"], "result-cache lookups that ran the model", "counter", lab),
            ]
        for stage, snap in zip(self.stages, snaps):
            if snap.count:  # a stage's series appear with its first observation (a tensor-input model never preprocesses)
                out += _histogram_samples(snap, "edge_sdk_model_latency_seconds", "model call latency by stage", {**lab, "stage": stage})
        return out

    # -- Registry.track / EventLog.watch ----------------------------------------------------------

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "model" and the provenance as its name (``name`` is not used)."""
        return "model", model_key(self.provenance)

    def telemetry_samples(self, label: str | None = None) -> list[Sample]:
        """``Registry.track``: this model's samples (:meth:`samples`)."""
        return self.samples()

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Sequence[Any] | None = None) -> Callable[[], None]:
        """``EventLog.watch``: this model's errors, as "model" events; returns the unsubscribe."""
        return self.subscribe(lambda ev: emit_model_event(emit, ev))

    def __repr__(self) -> str:
        p = self.provenance
        return f"ModelTelemetry({p.model} {p.version} {p.variant} on {p.backend})"


_models_lock = threading.Lock()
_models: dict[Provenance, ModelTelemetry] = {}


def model_telemetry(provenance: Provenance) -> ModelTelemetry:
    """The process-wide :class:`ModelTelemetry` of ``provenance`` (made on first use)."""
    with _models_lock:
        tm = _models.get(provenance)
        if tm is None:
            tm = _models[provenance] = ModelTelemetry(provenance)
        return tm


def models() -> tuple[ModelTelemetry, ...]:
    """Every model's telemetry in the process, in load order."""
    with _models_lock:
        return tuple(_models.values())


def forget_model(model: Any) -> bool:
    """Drop a model's series from the process-wide table (a Model, its ModelTelemetry or its
    Provenance); True if it was there. Models still open keep recording into the old object,
    which is no longer exported; a later load starts from zero."""
    p = model if isinstance(model, Provenance) else getattr(model, "provenance", None)
    if p is None:
        return False
    with _models_lock:
        return _models.pop(p, None) is not None


def open_provenances() -> list[Provenance]:
    """The provenance of every model with an instance open now (what a governor event carries)."""
    return [tm.provenance for tm in models() if tm.open_instances > 0]


def model_samples(of: Iterable[Any] | None = None) -> Callable[[], list[Sample]]:
    """A collector for models' telemetry: ``of`` Models or ModelTelemetry objects (each exported
    once), or None for every model in the process (:func:`models`, read at each scrape)."""
    fixed: list[ModelTelemetry] | None = None
    if of is not None:
        fixed = []
        for m in of:
            tm = m if isinstance(m, ModelTelemetry) else getattr(m, "telemetry", None)
            if tm is not None and all(tm is not t for t in fixed):
                fixed.append(tm)

    def collect() -> list[Sample]:
        out: list[Sample] = []
        for tm in models() if fixed is None else fixed:
            out += tm.samples()
        return out

    return collect
