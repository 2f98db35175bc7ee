"""Events: :class:`EventLog` writes one JSON object per line (a file, a callback or both) for
what it watches -- any :class:`EventSource`: governor transitions and actions, router offloads
and fallbacks, pipeline drops, quality alarms, model errors -- each with a UTC timestamp and the
provenance of the model concerned. Above :mod:`.core`; imports no subsystem."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from .._log import get_logger
from ..errors import OptionsError, OptionsTypeError
from .core import Provenance, emit_model_event, model_listeners

_log = get_logger("edge_sdk.telemetry")


# ----------------------------------------------------------------------------------------------
# events


def _utc(unix_s: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(unix_s, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


@runtime_checkable
class EventSource(Protocol):
    """What :meth:`EventLog.watch` needs of an object: ``watch_events(emit, name=, models=)``
    subscribes ``emit(source, kind, *, provenance=, models=, **fields)`` (:meth:`EventLog.emit`)
    to the object's events and returns the unsubscribe. Each subsystem writes its own records."""

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Sequence[Any] | None = None) -> Callable[[], None]:
        """Call ``emit`` for each event from now on; return the function that stops it."""


class EventLog:
    """JSON-lines events: one object per line, to ``path`` (appended, flushed per line) and/or
    ``callback(record)`` (the same dict). Every record has ``time`` (ISO 8601 UTC), ``unix_s``,
    ``source`` (governor | router | pipeline | model | generation | ...), ``kind`` and what the source says, and
    ``provenance`` (the model concerned) or, for governor events, ``models`` (every model open).

    What it logs: :meth:`watch` a Governor (every event: transitions, applied, undone, skipped,
    vetoed, failed, read errors), a Router (offloads and fallbacks), a VisionPipeline (every drop,
    with its reason), a Model (its errors) or :meth:`watch_models` (every model's errors). Thread-
    safe; a failing write or callback is logged and counted (``write_errors``), never raised into
    the thread that reported the event. :meth:`close` detaches everything and closes the file.
    Opening ``path`` happens here (OSError if it cannot be opened for appending)."""

    def __init__(self, path: str | Path | None = None, *, callback: Callable[[dict[str, Any]], Any] | None = None) -> None:
        if path is None and callback is None:
            raise OptionsError("EventLog: expected a path, a callback or both")
        if callback is not None and not callable(callback):
            raise OptionsTypeError(f"callback: expected a callable, got {type(callback).__name__}")
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
        default every model open when the event happens), a Router, a VisionPipeline, a Model /
        ModelTelemetry, a QualityMonitor or a ShadowChecker -- any :class:`EventSource`.
        ``name`` labels router, pipeline and quality events (default "router" / the source's
        name / the monitor's name). Returns a function that stops it."""
        if not isinstance(obj, EventSource):
            raise TypeError(f"watch: expected a Governor, Router, VisionPipeline, Model, QualityMonitor or ShadowChecker, got {type(obj).__name__}")
        detach = obj.watch_events(self.emit, name=name, models=models)
        self._detach.append(detach)
        return detach

    def watch_models(self) -> Callable[[], None]:
        """Log the errors of every model in the process (loaded now or later)."""
        detach = model_listeners().add(lambda ev: emit_model_event(self.emit, ev))
        self._detach.append(detach)
        return detach

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
