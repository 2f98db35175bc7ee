"""Telemetry: Prometheus text exposition and a small ``/metrics`` HTTP endpoint.

Collectors are callables returning :class:`Sample` lists; a :class:`Registry` gathers them at
scrape time (nothing is computed on the inference hot path)::

    reg = Registry()
    reg.add(pipeline_samples(pipeline))      # frame accounting
    reg.add(governor_samples(governor))      # state, temperatures, power, energy, actions
    with MetricsServer(reg) as srv:          # http://127.0.0.1:<srv.port>/metrics
        ...

The format is the Prometheus text format 0.0.4 (``# HELP`` / ``# TYPE`` lines, one sample per
line, label values escaped). The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Mapping

__all__ = ["MetricsServer", "Registry", "Sample", "governor_samples", "parse", "pipeline_samples", "render"]

_log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TYPES = ("gauge", "counter", "untyped")


@dataclass(frozen=True)
class Sample:
    """One metric sample. ``name``: ``[a-zA-Z_:][a-zA-Z0-9_:]*``; ``kind``: gauge | counter | untyped.
    A value of None (unknown) is left out of the exposition rather than made up."""

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
        for k in self.labels:
            if not k or not (k[0].isalpha() or k[0] == "_") or not all(c.isalnum() or c == "_" for c in k) or not k.isascii():
                raise ValueError(f"metric {n}: label name {k!r}: expected [a-zA-Z_][a-zA-Z0-9_]*")


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
    """The text exposition of ``samples`` (grouped by name, HELP/TYPE once per name)."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        if s.value is None:
            continue
        by_name.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name, group in by_name.items():
        first = group[0]
        if first.help:
            lines.append(f"# HELP {name} {first.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
        lines.append(f"# TYPE {name} {first.kind}")
        for s in group:
            lab = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(s.labels.items()))
            lines.append(f"{name}{{{lab}}} {_value(float(s.value))}" if lab else f"{name} {_value(float(s.value))}")  # type: ignore[arg-type]
    return "\n".join(lines) + "\n"


class Registry:
    """Collectors gathered at scrape time. A collector that raises is logged and skipped (its
    failure is counted in ``edge_sdk_telemetry_collector_errors_total``)."""

    def __init__(self) -> None:
        self._collectors: list[Callable[[], Iterable[Sample]]] = []
        self._lock = threading.Lock()
        self._errors = 0

    def add(self, collector: Callable[[], Iterable[Sample]]) -> Callable[[], Iterable[Sample]]:
        if not callable(collector):
            raise TypeError(f"collector: expected a callable returning Samples, got {type(collector).__name__}")
        with self._lock:
            self._collectors.append(collector)
        return collector

    def remove(self, collector: Callable[[], Iterable[Sample]]) -> None:
        with self._lock:
            self._collectors.remove(collector)

    def collect(self) -> list[Sample]:
        with self._lock:
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
        return render(self.collect())


class _Handler(BaseHTTPRequestHandler):
    registry: Registry

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        body = self.registry.render().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: Any) -> None:
        _log.debug("metrics: " + fmt, *args)


class MetricsServer:
    """Serves ``registry`` at ``http://host:port/metrics`` on a daemon thread. ``port=0`` picks a
    free port (see :attr:`port`)."""

    def __init__(self, registry: Registry, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = type("Handler", (_Handler,), {"registry": registry})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> "MetricsServer":
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="edge-sdk-metrics", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "MetricsServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    in effect and the count of events by kind."""
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


def parse(text: str) -> list[Sample]:
    """Parse a text exposition back into samples (for ``edge-sdk monitor --url``). HELP/TYPE
    lines set the help and kind of the samples that follow; other comments are skipped."""
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
        v = value.split()[0]
        num = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}.get(v)
        out.append(Sample(name.strip(), float(v) if num is None else num, helps.get(name.strip(), ""), kinds.get(name.strip(), "untyped"), labels))
    return out
