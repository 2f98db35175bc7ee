"""Exposition: the Prometheus text format (:func:`render`, :func:`parse`), the :class:`Registry`
of collectors (``track`` any :class:`Trackable`), :func:`default_registry` and the
:class:`MetricsServer` (``/metrics``, 127.0.0.1 by default). Above :mod:`.core`; imports no
subsystem: what a pipeline, governor or router exports is its own ``telemetry_samples``.

The format is the Prometheus text format 0.0.4 (``# HELP`` / ``# TYPE`` lines, one sample per
line, label values escaped): https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from .._log import get_logger
from ..errors import OptionsError, OptionsTypeError
from .core import HIST_SUFFIXES, TYPES, Sample, format_value, model_samples

_log = get_logger("edge_sdk.telemetry")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: Iterable[Sample]) -> str:
    """The text exposition of ``samples`` (grouped by family, HELP/TYPE once per family; the
    samples of a histogram family keep the order they came in)."""
    by_family: dict[str, list[tuple[Sample, float]]] = {}
    for s in samples:
        if s.value is None:
            continue
        by_family.setdefault(s.family, []).append((s, s.value))
    lines: list[str] = []
    for family, group in by_family.items():
        first = group[0][0]
        if first.help:
            lines.append(f"# HELP {family} {first.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
        lines.append(f"# TYPE {family} {first.kind}")
        for s, value in group:
            lab = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(s.labels.items()))
            v = format_value(float(value))
            lines.append(f"{s.name}{{{lab}}} {v}" if lab else f"{s.name} {v}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# registry


@runtime_checkable
class Trackable(Protocol):
    """What :meth:`Registry.track` needs of an object: ``telemetry_key(name)`` -> (kind, label)
    (two objects of one kind and label cannot share a registry) and ``telemetry_samples(label)``
    -> its samples now. VisionPipeline, Governor, Router, Model, ModelTelemetry, QualityMonitor
    and ShadowChecker implement it, each next to its own code."""

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """(kind, label): label is ``name`` or the object's default."""

    def telemetry_samples(self, label: str) -> list[Sample]:
        """The object's samples, labelled with ``label`` where its kind has a label."""


class _Tracked:
    """A collector over an object held weakly: nothing once the object is gone."""

    def __init__(self, obj: Any, kind: str, name: str) -> None:
        self._ref = weakref.ref(obj)
        self.kind, self.name = kind, name

    @property
    def alive(self) -> bool:
        return self._ref() is not None

    def __call__(self) -> Iterable[Sample]:
        obj = self._ref()
        return [] if obj is None else obj.telemetry_samples(self.name)

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
            raise OptionsTypeError(f"collector: expected a callable returning Samples, got {type(collector).__name__}")
        with self._lock:
            self._collectors.append(collector)
        return collector

    def remove(self, collector: Callable[[], Iterable[Sample]]) -> None:
        """Remove a collector added with :meth:`add`; ``ValueError`` if it is not there."""
        with self._lock:
            self._collectors.remove(collector)

    def track(self, obj: Any, name: str | None = None) -> Callable[[], Iterable[Sample]]:
        """Export ``obj``'s metrics: a VisionPipeline (label ``pipeline``: ``name`` or its
        source's name), a Governor (one per registry), a Router (label ``router``: ``name`` or
        "router"), a Model (:func:`default_registry` has every model already), a QualityMonitor or
        a ShadowChecker -- any :class:`Trackable`, whose ``telemetry_samples`` lives next to it.
        The object is held weakly: once it is garbage, its series go. Two objects of one kind
        under one name would export the same series: ValueError. Returns the collector (for
        remove); TypeError for an object that is not :class:`Trackable`."""
        if not isinstance(obj, Trackable):
            raise TypeError(
                "track: expected a VisionPipeline, Governor, Router, Model, QualityMonitor or ShadowChecker "
                f"(an object with telemetry_key and telemetry_samples), got {type(obj).__name__}"
            )
        kind, label = obj.telemetry_key(name)
        with self._lock:
            self._collectors = [c for c in self._collectors if not (isinstance(c, _Tracked) and not c.alive)]
            if any(isinstance(c, _Tracked) and c.kind == kind and c.name == label for c in self._collectors):
                raise OptionsError(f"a {kind} named {label!r} is already tracked by this registry; pass another name=")
            tracked = _Tracked(obj, kind, label)
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
        host = str(self._httpd.server_address[0])  # str for an AF_INET server (typeshed allows bytes: AF_UNIX)
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
# collectors by kind (what they export is written next to each object: its telemetry_samples)


def pipeline_samples(pipeline: Any, name: str | None = None) -> Callable[[], list[Sample]]:
    """A collector for a VisionPipeline's frame accounting (its ``telemetry_samples``; label
    ``pipeline``: ``name`` or the source's name)."""
    label = pipeline.telemetry_key(name)[1]
    return lambda: pipeline.telemetry_samples(label)


def governor_samples(governor: Any) -> Callable[[], list[Sample]]:
    """A collector for a budget Governor (its ``telemetry_samples``): state, readings, power
    window, energy per inference, ladder steps in effect, events by kind, transitions."""
    return lambda: governor.telemetry_samples("governor")


def router_samples(router: Any, name: str = "router") -> Callable[[], list[Sample]]:
    """A collector for a remote Router (its ``telemetry_samples``): requests by where and why,
    offloads by trigger, the local queue and service-time estimate."""
    return lambda: router.telemetry_samples(name)


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
            for suffix in HIST_SUFFIXES:
                if name.endswith(suffix) and kinds.get(name[: -len(suffix)]) == "histogram":
                    family = name[: -len(suffix)]
                    break
        v = value.split()[0]
        num = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}.get(v)
        out.append(Sample(name, float(v) if num is None else num, helps.get(family, ""), kinds.get(family, "untyped"), labels))
    return out
