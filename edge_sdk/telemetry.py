"""Telemetry: runtime latency histograms and counters, Prometheus text exposition with a small
``/metrics`` endpoint, and JSON-lines events.

Metrics. Every loaded :class:`~edge_sdk.model.Model` records each call in its
:class:`ModelTelemetry`: a latency histogram per stage (validate, preprocess, inference --
"remote" for a model over a RemoteSession, whose inference is the remote call --, decode, total),
requests and errors by exception type. The histograms are shared by every Model with the same
:class:`Provenance` (same package version, variant, digest, backend, runtime and profile) and live
in a process-wide table that :func:`default_registry` exports. Collectors are callables returning
:class:`Sample` lists; a :class:`Registry` gathers them at scrape time::

    reg = default_registry()                 # every model's histograms and counters already
    reg.track(pipeline)                      # frame accounting, drops by reason
    reg.track(governor)                      # state, temperatures, power, energy, actions, transitions
    reg.track(router)                        # requests by where/why, offloads by trigger
    with MetricsServer() as srv:             # http://127.0.0.1:<srv.port>/metrics (the default registry)
        ...
    model.telemetry.histograms["total"].percentile(99.9)   # seconds, from the histogram

Histograms have fixed exponential buckets: 60 per decade (each ``10 ** (1/60)``, 3.9 % wider than
the one before) from 100 ns to 100 s, plus one bucket for [0, 100 ns] and one above 100 s.
Recording a call (:meth:`ModelTelemetry.record`) appends each stage's duration, an int the call
already has, to that stage's pending list: a C-level ``list.append``, atomic without a lock, no new
object, ~0.1 us a stage. The bucket index computation and the increments are done in bulk with
numpy (``searchsorted`` over the edges, ``bincount``) when anything reads the histograms, or by the
recording thread once 4096 calls are pending, which bounds the memory (that call then takes 0.5 to
1 ms longer on a 2-vCPU x86 box; ``LoadOptions(telemetry=False)`` for a loop that cannot have
it). A percentile follows the nearest-rank definition
(numpy's ``method="inverted_cdf"``) and reads the geometric middle of the bucket that holds that
sample, so it is within ``sqrt(10 ** (1/60)) - 1`` = 1.94 % (:data:`PERCENTILE_ERROR`) of the exact
value for samples in (100 ns, 100 s]; under 100 ns it reads 100 ns (an upper bound), over 100 s
it reads 100 s (a lower bound). The Prometheus exposition coarsens the buckets to every tenth edge
(6 per decade, 1 us to 100 s, plus ``+Inf``): ``_bucket{le=...}`` cumulative, ``_sum``, ``_count``.

A model's series stay after it is closed (counters never go back; the table holds one entry per
distinct provenance a process loads, so it is bounded by the packages and variants it uses);
``edge_sdk_model_open`` says how many instances are open, :func:`forget_model` drops the series.

Events. An :class:`EventLog` writes one JSON object per line (to a file, a callback or both), each
with a UTC timestamp, for what it watches: governor transitions and actions, router offloads and
fallbacks, pipeline drops, model errors. Each line carries the provenance of the model concerned
(``provenance``), or for governor events of every model open at the time (``models``).

Telemetry never holds input data: histograms hold durations, counters hold counts, events hold
kinds, reasons, exception types and messages (the SDK's messages name shapes and dtypes, never
values) and provenance.

The format is the Prometheus text format 0.0.4 (``# HELP`` / ``# TYPE`` lines, one sample per
line, label values escaped). The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import weakref
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from . import __version__ as _SDK_VERSION
from ._listeners import Listeners

__all__ = [
    "EDGES_NS",
    "PERCENTILE_ERROR",
    "STAGES",
    "EventLog",
    "Histogram",
    "HistogramSnapshot",
    "MetricsServer",
    "ModelEvent",
    "ModelTelemetry",
    "Provenance",
    "Registry",
    "Sample",
    "default_registry",
    "forget_model",
    "governor_samples",
    "model_samples",
    "model_telemetry",
    "models",
    "parse",
    "pipeline_samples",
    "render",
    "router_samples",
]

_log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TYPES = ("gauge", "counter", "untyped", "histogram")
_HIST_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
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
            if not n.endswith(_HIST_SUFFIXES):
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
            for suffix in _HIST_SUFFIXES:
                if self.name.endswith(suffix):
                    return self.name[: -len(suffix)]
        return self.name


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def render(samples: Iterable[Sample]) -> str:
    """The text exposition of ``samples`` (grouped by family, HELP/TYPE once per family; the
    samples of a histogram family keep the order they came in)."""
    by_family: dict[str, list[Sample]] = {}
    for s in samples:
        if s.value is None:
            continue
        by_family.setdefault(s.family, []).append(s)
    lines: list[str] = []
    for family, group in by_family.items():
        first = group[0]
        if first.help:
            lines.append(f"# HELP {family} {first.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
        lines.append(f"# TYPE {family} {first.kind}")
        for s in group:
            lab = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(s.labels.items()))
            v = _value(float(s.value))  # type: ignore[arg-type]
            lines.append(f"{s.name}{{{lab}}} {v}" if lab else f"{s.name} {v}")
    return "\n".join(lines) + "\n"


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
_SUM = N_BUCKETS  # a histogram's count list holds the sum of its values (ns) in this last slot
#: The most a percentile read from a histogram is off, relative, for values in (100 ns, 100 s].
PERCENTILE_ERROR = math.sqrt(10.0 ** (1 / BUCKETS_PER_DECADE)) - 1.0
#: Bucket edges kept in the Prometheus exposition: every tenth, 1 us .. 100 s (indexes into EDGES_NS).
EXPORT_EDGES = tuple(range(BUCKETS_PER_DECADE, len(EDGES_NS), 10))
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def _pct_key(q: float) -> str:
    return f"p{q:g}"


@dataclass(frozen=True)
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
                raise ValueError(f"percentile: expected q in [0, 100], got {q!r}")
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

    __slots__ = ("_c", "_lock")

    def __init__(self) -> None:
        self._c = [0] * (N_BUCKETS + 1)  # bucket counts, then the sum (ns)
        self._lock = threading.Lock()

    def record_ns(self, ns: int | float) -> None:
        """Record one duration in nanoseconds."""
        c = self._c
        i = bisect_left(_EDGES_INT if isinstance(ns, int) else EDGES_NS, ns)
        with self._lock:
            c[i] += 1
            c[_SUM] += ns

    def record_s(self, seconds: float) -> None:
        """Record one duration in seconds."""
        self.record_ns(seconds * 1e9)

    def snapshot(self) -> HistogramSnapshot:
        """The bucket counts and sum now, as a :class:`HistogramSnapshot`."""
        with self._lock:
            c = list(self._c)
        return HistogramSnapshot(tuple(c[:N_BUCKETS]), c[_SUM])


def _histogram_samples(snap: HistogramSnapshot, name: str, help: str, labels: Mapping[str, str]) -> list[Sample]:
    out = [Sample(f"{name}_bucket", n, help, "histogram", {**labels, "le": _value(le)}) for le, n in snap.cumulative()]
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


@dataclass(frozen=True)
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
    1 ms, once per 4096 calls, on a 2-vCPU x86 box: ``tools/bench_telemetry.py``)."""

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
    with _models_lock:
        return _models.pop(p, None) is not None  # type: ignore[arg-type]


def _open_provenances() -> list[Provenance]:
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


# ----------------------------------------------------------------------------------------------
# registry


class _Tracked:
    """A collector over an object held weakly: nothing once the object is gone."""

    def __init__(self, obj: Any, kind: str, name: str, make: Callable[[Any], Callable[[], Iterable[Sample]]]) -> None:
        self._ref = weakref.ref(obj)
        self.kind, self.name = kind, name
        self._make = make

    @property
    def alive(self) -> bool:
        return self._ref() is not None

    def __call__(self) -> Iterable[Sample]:
        obj = self._ref()
        return [] if obj is None else self._make(obj)()

    def __repr__(self) -> str:
        return f"<tracked {self.kind} {self.name!r}>"


class Registry:
    """Collectors gathered at scrape time. A collector that raises is logged and skipped (its
    failure is counted in ``edge_sdk_telemetry_collector_errors_total``)."""

    def __init__(self) -> None:
        self._collectors: list[Callable[[], Iterable[Sample]]] = []
        self._lock = threading.Lock()
        self._errors = 0

    def add(self, collector: Callable[[], Iterable[Sample]]) -> Callable[[], Iterable[Sample]]:
        """Add ``collector`` (a callable returning Samples, called at each scrape); returns it. ``TypeError`` if it is not callable."""
        if not callable(collector):
            raise TypeError(f"collector: expected a callable returning Samples, got {type(collector).__name__}")
        with self._lock:
            self._collectors.append(collector)
        return collector

    def remove(self, collector: Callable[[], Iterable[Sample]]) -> None:
        """Remove a collector added with :meth:`add`; ``ValueError`` if it is not there."""
        with self._lock:
            self._collectors.remove(collector)

    def track(self, obj: Any, name: str | None = None) -> Callable[[], Iterable[Sample]]:
        """Export ``obj``'s metrics: a VisionPipeline (:func:`pipeline_samples`, label
        ``pipeline``: ``name`` or its source's name), a Governor (:func:`governor_samples`; one
        per registry), a Router (:func:`router_samples`, label ``router``: ``name`` or "router") or
        a Model (:func:`model_samples`; :func:`default_registry` has every model already). The
        object is held weakly: once it is garbage, its series go. Two objects of one kind under
        one name would export the same series: ValueError. Returns the collector (for remove)."""
        kind, default, make = _collector_for(obj, name)
        label = name or default
        with self._lock:
            self._collectors = [c for c in self._collectors if not (isinstance(c, _Tracked) and not c.alive)]
            if any(isinstance(c, _Tracked) and c.kind == kind and c.name == label for c in self._collectors):
                raise ValueError(f"a {kind} named {label!r} is already tracked by this registry; pass another name=")
            tracked = _Tracked(obj, kind, label, make)
            self._collectors.append(tracked)
        return tracked

    def collect(self) -> list[Sample]:
        """Every collector's samples, plus the count of collectors that raised (those are logged and skipped)."""
        with self._lock:
            self._collectors = [c for c in self._collectors if not (isinstance(c, _Tracked) and not c.alive)]
            collectors = list(self._collectors)
        out: list[Sample] = []
        for c in collectors:
            try:
                out.extend(c())
            except Exception:
                self._errors += 1
                _log.exception("telemetry collector %r raised (skipped)", c)
        out.append(Sample("edge_sdk_telemetry_collector_errors_total", self._errors, "collectors that raised at scrape time", "counter"))
        return out

    def render(self) -> str:
        """The collected samples in the Prometheus text format."""
        return render(self.collect())

    def snapshot(self) -> list[dict[str, Any]]:
        """Every sample as a JSON-ready dict (name, kind, labels, value)."""
        return [{"name": s.name, "kind": s.kind, "labels": dict(s.labels), "value": s.value} for s in self.collect() if s.value is not None]


def _collector_for(obj: Any, name: str | None) -> tuple[str, str, Callable[[Any], Callable[[], Iterable[Sample]]]]:
    from .budget.governor import Governor
    from .model import Model
    from .pipelines.vision import VisionPipeline
    from .remote.router import Router

    if isinstance(obj, VisionPipeline):
        return "pipeline", obj.source.name, lambda p: pipeline_samples(p, name)
    if isinstance(obj, Governor):
        return "governor", "governor", governor_samples
    if isinstance(obj, Router):
        return "router", "router", lambda r: router_samples(r, name or "router")
    if isinstance(obj, (Model, ModelTelemetry)):
        p = obj.provenance
        return "model", f"{p.model} {p.version} {p.variant} {p.sha256} {p.backend} {p.profile}", lambda m: model_samples([m])
    from .quality.monitor import QualityMonitor, quality_samples

    if isinstance(obj, QualityMonitor):  # label model=name or the monitor's name
        if name is not None:
            obj.name = name
        return "quality", obj.name or "model", quality_samples
    from .quality.shadow import ShadowChecker, shadow_samples

    if isinstance(obj, ShadowChecker):  # label model=name or the checker's name
        if name is not None:
            obj.name = name
        return "shadow", obj.name, shadow_samples
    raise TypeError(f"track: expected a VisionPipeline, Governor, Router or Model, got {type(obj).__name__}")


_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """The process-wide registry: every loaded model's histograms and counters (read from the
    process-wide table at each scrape); add pipelines, governors and routers with
    :meth:`Registry.track`."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Registry()
            _default.add(model_samples())
        return _default


# ----------------------------------------------------------------------------------------------
# the endpoint


def _handler(registry: Registry) -> type:
    """The request handler class serving ``registry`` (http.server is imported only when a
    MetricsServer is made: ``edge_sdk.load`` imports this module and should not pay for it)."""
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = registry.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            _log.debug("metrics: " + fmt, *args)

    return Handler


class MetricsServer:
    """Serves ``registry`` (default: :func:`default_registry`) at ``http://host:port/metrics`` on
    a daemon thread. ``port=0`` picks a free port (see :attr:`port`)."""

    def __init__(self, registry: Registry | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        from http.server import ThreadingHTTPServer

        self._httpd = ThreadingHTTPServer((host, port), _handler(registry if registry is not None else default_registry()))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on (useful with ``port=0``)."""
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The ``http://host:port/metrics`` address."""
        host = self._httpd.server_address[0]
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> "MetricsServer":
        """Serve on a background thread (a no-op if already serving); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="edge-sdk-metrics", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "MetricsServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------
# collectors for pipelines, governors and routers


def pipeline_samples(pipeline: Any, name: str | None = None) -> Callable[[], list[Sample]]:
    """A collector for a VisionPipeline's frame accounting (``counters()``)."""
    label = {"pipeline": name or getattr(getattr(pipeline, "source", None), "name", "pipeline")}

    def collect() -> list[Sample]:
        c = pipeline.counters()
        out = [
            Sample("edge_sdk_pipeline_frames_in_total", c.frames_in, "frames the source yielded", "counter", label),
            Sample("edge_sdk_pipeline_frames_processed_total", c.processed, "frames whose result reached the sinks", "counter", label),
            Sample("edge_sdk_pipeline_frames_in_flight", c.in_flight, "frames read and not yet processed or dropped", "gauge", label),
            Sample("edge_sdk_pipeline_max_queue_depth", c.max_queue_depth, "the most frames the queue ever held", "gauge", label),
        ]
        out += [
            Sample("edge_sdk_pipeline_frames_dropped_total", n, "frames dropped, by reason", "counter", {**label, "reason": r})
            for r, n in c.dropped.items()
        ]
        return out

    return collect


def governor_samples(governor: Any) -> Callable[[], list[Sample]]:
    """A collector for a budget Governor: its state, the readings of its last sample (every
    temperature sensor and power rail), the power window, energy per inference, the ladder steps
    in effect, the count of events by kind and of transitions by from/to state."""
    from .budget.governor import EVENT_KINDS, GovernorState

    def collect() -> list[Sample]:
        t = governor.telemetry(last_events=0)
        snap = governor.last_snapshot
        out = [
            Sample("edge_sdk_governor_state", 1.0 if t["state"] == s.value else 0.0, "governor state (1 for the current one)", "gauge",
                   {"state": s.value})
            for s in GovernorState
        ]  # fmt: skip
        out += [
            Sample("edge_sdk_governor_state_level", t.get("state_level"), "0 normal, 1 constrained, 2 critical", "gauge"),
            Sample("edge_sdk_temperature_celsius", t.get("temp_c"), "the temperature the budget watches", "gauge"),
            Sample("edge_sdk_budget_soft_limit_celsius", t.get("soft_c"), "the budget's soft temperature limit", "gauge"),
            Sample("edge_sdk_budget_hard_limit_celsius", t.get("hard_c"), "the budget's hard temperature limit", "gauge"),
            Sample("edge_sdk_board_power_watts", t.get("power_w"), "board power, latest reading", "gauge"),
            Sample("edge_sdk_board_power_window_watts", t.get("power_mean_w"), "board power, mean over the budget window", "gauge"),
            Sample("edge_sdk_budget_power_watts", t.get("power_budget_w"), "the power budget", "gauge"),
            Sample("edge_sdk_energy_per_inference_joules", t.get("energy_per_inference_j"), "estimated energy per inference", "gauge"),
            Sample("edge_sdk_governor_samples_total", t.get("samples"), "sensor samples taken", "counter"),
        ]
        applied = set(t.get("applied", ()))
        for a in governor.actions:
            out.append(Sample("edge_sdk_governor_action_applied", 1.0 if a.name in applied else 0.0, "ladder steps in effect (1) or not (0)",
                              "gauge", {"action": a.name}))  # fmt: skip
        for row in t.get("action_counts", ()):
            out.append(Sample("edge_sdk_governor_action_events_total", row["count"], "ladder events, by action and kind", "counter",
                              {"action": row["action"], "kind": row["kind"]}))  # fmt: skip
        counts = t.get("counts", {})
        for kind in EVENT_KINDS:
            out.append(Sample("edge_sdk_governor_events_total", counts.get(kind, 0), "governor events, by kind", "counter", {"kind": kind}))
        for row in t.get("transitions", ()):
            out.append(Sample("edge_sdk_governor_transitions_total", row["count"], "state transitions, by from and to state", "counter",
                              {"from": row["from"], "to": row["to"]}))  # fmt: skip
        if snap is not None:
            for temp in snap.temps:
                out.append(Sample("edge_sdk_sensor_temperature_celsius", temp.temp_c, "every temperature sensor read", "gauge",
                                  {"sensor": temp.name, "source": temp.source}))  # fmt: skip
            for rail in snap.rails:
                out.append(Sample("edge_sdk_rail_power_watts", rail.power_w, "power per rail", "gauge", {"rail": rail.name, "source": rail.source}))
            if snap.throttled is not None:
                out.append(Sample("edge_sdk_firmware_throttled_flags", snap.throttled.raw, "vcgencmd get_throttled bits (raw)", "gauge"))
        return out

    return collect


def router_samples(router: Any, name: str = "router") -> Callable[[], list[Sample]]:
    """A collector for a remote Router: requests by where they were served and why
    (``trigger``), offloads (requests sent to the remote model, whatever came of them) by
    trigger, the local queue and the local service-time estimate."""
    label = {"router": name}

    def collect() -> list[Sample]:
        out = [
            Sample("edge_sdk_router_requests_total", n, "requests answered, by where they were served and why", "counter",
                   {**label, "served_by": where, "trigger": trig})
            for (where, trig), n in sorted(router.requests_by_trigger.items())
        ]  # fmt: skip
        out += [
            Sample("edge_sdk_router_offloads_total", n, "requests sent to the remote model, by trigger", "counter",
                   {**label, "trigger": trig})
            for trig, n in sorted(router.offloads.items())
        ]  # fmt: skip
        svc = router.local_service_ms
        svc_s = None if svc is None else svc / 1e3
        out.append(Sample("edge_sdk_router_local_service_seconds", svc_s, "local service time (EWMA)", "gauge", label))
        out.append(Sample("edge_sdk_router_local_waiting", router.local_waiting, "requests waiting for the local model", "gauge", label))
        return out

    return collect


# ----------------------------------------------------------------------------------------------
# events


def _is_quality_monitor(obj: Any) -> bool:
    from .quality.monitor import QualityMonitor
    from .quality.shadow import ShadowChecker

    return isinstance(obj, (QualityMonitor, ShadowChecker))  # both report QualityEvents


def _utc(unix_s: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(unix_s, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


class EventLog:
    """JSON-lines events: one object per line, to ``path`` (appended, flushed per line) and/or
    ``callback(record)`` (the same dict). Every record has ``time`` (ISO 8601 UTC), ``unix_s``,
    ``source`` (governor | router | pipeline | model), ``kind`` and what the source says, and
    ``provenance`` (the model concerned) or, for governor events, ``models`` (every model open).

    What it logs: :meth:`watch` a Governor (every event: transitions, applied, undone, skipped,
    vetoed, failed, read errors), a Router (offloads and fallbacks), a VisionPipeline (every drop,
    with its reason), a Model (its errors) or :meth:`watch_models` (every model's errors). Thread-
    safe; a failing write or callback is logged and counted (``write_errors``), never raised into
    the thread that reported the event. :meth:`close` detaches everything and closes the file.
    Opening ``path`` happens here (OSError if it cannot be opened for appending)."""

    def __init__(self, path: str | Path | None = None, *, callback: Callable[[dict[str, Any]], Any] | None = None) -> None:
        if path is None and callback is None:
            raise ValueError("EventLog: expected a path, a callback or both")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback: expected a callable, got {type(callback).__name__}")
        self.path = None if path is None else Path(path)
        self._callback = callback
        self._lock = threading.Lock()
        self._f: Any = None if self.path is None else open(self.path, "a", encoding="utf-8")
        self._detach: list[Callable[[], None]] = []
        self.write_errors = 0
        self.events = 0

    # -- writing -----------------------------------------------------------------------------------

    def emit(
        self,
        source: str,
        kind: str,
        *,
        provenance: Provenance | None = None,
        models: Sequence[Provenance] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Write one event; returns the record."""
        t = time.time()
        rec: dict[str, Any] = {"time": _utc(t), "unix_s": t, "source": source, "kind": kind, **fields}
        if provenance is not None:
            rec["provenance"] = provenance.to_dict()
        if models is not None:
            rec["models"] = [p.to_dict() for p in models]
        line = json.dumps(rec, default=str) + "\n"
        with self._lock:
            self.events += 1
            if self._f is not None:
                try:
                    self._f.write(line)
                    self._f.flush()
                except (OSError, ValueError):
                    self.write_errors += 1
                    _log.exception("event log %s: write failed", self.path)
        if self._callback is not None:
            try:
                self._callback(rec)
            except Exception:
                with self._lock:
                    self.write_errors += 1
                _log.exception("event log callback raised (ignored)")
        return rec

    # -- sources -----------------------------------------------------------------------------------

    def watch(self, obj: Any, *, name: str | None = None, models: Sequence[Any] | None = None) -> Callable[[], None]:
        """Log ``obj``'s events: a Governor (``models``: whose provenance its events carry;
        default every model open when the event happens), a Router, a VisionPipeline, or a
        Model / ModelTelemetry. ``name`` labels router and pipeline events (default "router" /
        the source's name). Returns a function that stops it."""
        from .budget.governor import Governor
        from .model import Model
        from .pipelines.vision import VisionPipeline
        from .remote.router import Router

        if isinstance(obj, Governor):
            fixed = None if models is None else [m if isinstance(m, Provenance) else m.provenance for m in models]
            detach = obj.subscribe(lambda ev: self._governor_event(ev, fixed))
        elif isinstance(obj, Router):
            label = name or "router"
            detach = obj.subscribe(lambda ev: self._router_event(ev, label))
        elif isinstance(obj, VisionPipeline):
            label = name or obj.source.name
            detach = obj.add_drop_listener(lambda d: self._drop_event(d, label, obj))
        elif isinstance(obj, (Model, ModelTelemetry)):
            tm = obj if isinstance(obj, ModelTelemetry) else obj.telemetry
            if tm is None:
                raise ValueError("watch: this model was loaded with telemetry=False, so it reports no events")
            detach = tm.subscribe(self._model_event)
        elif _is_quality_monitor(obj):  # drift / low_confidence / schema alarms entered and left
            label = name or obj.name or "model"
            detach = obj.subscribe(lambda ev: self._quality_event(ev, label))
        else:
            raise TypeError(f"watch: expected a Governor, Router, VisionPipeline or Model, got {type(obj).__name__}")
        self._detach.append(detach)
        return detach

    def watch_models(self) -> Callable[[], None]:
        """Log the errors of every model in the process (loaded now or later)."""
        detach = _model_listeners.add(self._model_event)
        self._detach.append(detach)
        return detach

    def _governor_event(self, ev: Any, fixed: list[Provenance] | None) -> None:
        self.emit(
            "governor", ev.kind, state=ev.state.value, action=ev.action, reason=ev.reason, detail=ev.detail,
            governor_ms=ev.timestamp_ms, models=fixed if fixed is not None else _open_provenances(),
        )  # fmt: skip

    def _router_event(self, ev: Any, name: str) -> None:
        self.emit(
            "router", ev.kind, router=name, trigger=ev.trigger, decision=ev.decision, served_by=ev.served_by, reason=ev.reason,
            error=ev.error, provenance=ev.provenance,
        )  # fmt: skip

    def _drop_event(self, d: Any, name: str, pipeline: Any) -> None:
        self.emit(
            "pipeline", "drop", pipeline=name, reason=d.reason, frame=d.index, detail=d.detail,
            provenance=getattr(pipeline.model, "provenance", None),
        )  # fmt: skip

    def _quality_event(self, ev: Any, name: str) -> None:
        self.emit(
            "quality", ev.kind, model=name, indicator=ev.indicator, value=ev.value, detail=ev.detail, sampled=ev.sampled,
            requests=ev.requests,
        )  # fmt: skip

    def _model_event(self, ev: ModelEvent) -> None:
        self.emit("model", ev.kind, call=ev.call, error=ev.error, message=ev.message, provenance=ev.provenance)

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Detach from everything watched and close the file (idempotent)."""
        detach, self._detach = self._detach, []
        for d in detach:
            d()
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            f.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------
# reading an exposition


def parse(text: str) -> list[Sample]:
    """Parse a text exposition back into samples (for ``edge-sdk monitor --url``). HELP/TYPE
    lines set the help and kind of the samples that follow (a histogram's ``_bucket`` / ``_sum``
    / ``_count`` samples get kind "histogram"); other comments are skipped."""
    helps: dict[str, str] = {}
    kinds: dict[str, str] = {}
    out: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] == "HELP":
                helps[parts[2]] = parts[3] if len(parts) > 3 else ""
            elif len(parts) >= 4 and parts[1] == "TYPE":
                kinds[parts[2]] = parts[3] if parts[3] in TYPES else "untyped"
            continue
        labels: dict[str, str] = {}
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, value = rest.rpartition("}")
            i = 0
            while i < len(body):
                eq = body.index("=", i)
                key = body[i:eq].strip().lstrip(",").strip()
                j = eq + 2  # past ="
                val = []
                while body[j] != '"':
                    if body[j] == "\\":
                        j += 1
                        val.append({"n": "\n"}.get(body[j], body[j]))
                    else:
                        val.append(body[j])
                    j += 1
                labels[key] = "".join(val)
                i = j + 1
        else:
            name, value = line.split(None, 1)
        name = name.strip()
        family = name
        if name not in kinds:
            for suffix in _HIST_SUFFIXES:
                if name.endswith(suffix) and kinds.get(name[: -len(suffix)]) == "histogram":
                    family = name[: -len(suffix)]
                    break
        v = value.split()[0]
        num = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}.get(v)
        out.append(Sample(name, float(v) if num is None else num, helps.get(family, ""), kinds.get(family, "untyped"), labels))
    return out
