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

from .core import (
    DEFAULT_PERCENTILES,
    EDGES_NS,
    FOLD_AT,
    PERCENTILE_ERROR,
    STAGES,
    Histogram,
    HistogramSnapshot,
    ModelEvent,
    ModelTelemetry,
    Provenance,
    Sample,
    forget_model,
    model_samples,
    model_telemetry,
    models,
    open_provenances,
)
from .events import EventLog, EventSource
from .exposition import (
    CONTENT_TYPE,
    MetricsServer,
    Registry,
    Trackable,
    default_registry,
    governor_samples,
    parse,
    pipeline_samples,
    render,
    router_samples,
)

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_PERCENTILES",
    "EDGES_NS",
    "FOLD_AT",
    "PERCENTILE_ERROR",
    "STAGES",
    "EventLog",
    "EventSource",
    "Histogram",
    "HistogramSnapshot",
    "MetricsServer",
    "ModelEvent",
    "ModelTelemetry",
    "Provenance",
    "Registry",
    "Sample",
    "Trackable",
    "default_registry",
    "forget_model",
    "governor_samples",
    "model_samples",
    "model_telemetry",
    "models",
    "open_provenances",
    "parse",
    "pipeline_samples",
    "render",
    "router_samples",
]
