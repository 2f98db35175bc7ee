"""What the machine did during a benchmark: sensors, governor state, CPU and memory.

A :class:`ResourceMonitor` samples every ``interval_s`` on a daemon thread: a
:class:`~edge_sdk.budget.sensors.SensorReader` snapshot fed to an *observing*
:class:`~edge_sdk.budget.governor.Governor` (no actions: it only says what state the budget
would be in; ``unknown_policy="hold"`` so a machine without sensors reads NORMAL with the
temperature reported unknown, not CONSTRAINED), the process RSS, and CPU use.

Accounting is per *key* (a target in a scenario): :meth:`window` brackets one block of that key
and adds its process CPU time, wall time and per-core busy time (``psutil.cpu_times(percpu=True)``
differences, the whole machine's); samples taken while a window is open are tagged with its key.
Nothing is invented: a temperature or power the machine does not expose stays None, and
:meth:`sensor_status` says why (the reader's own ``unknown`` reasons).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = ["ResourceMonitor", "Usage", "peak_rss_mb"]

_pc = time.perf_counter


def peak_rss_mb() -> float | None:
    """The process's peak resident set size so far (``getrusage``), MB; None where unsupported."""
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024.0  # bytes on macOS, KiB elsewhere
    except (ImportError, OSError, ValueError):
        return None


@dataclass
class Usage:
    """Accumulated over the windows of one key."""

    wall_s: float = 0.0
    process_cpu_s: float = 0.0
    core_busy_s: list[float] = field(default_factory=list)
    core_total_s: list[float] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """CPU use as percentages: of one core for the process, of the whole machine, and busy per core (None where
        nothing was measured)."""
        cores = [100.0 * b / t if t > 0 else None for b, t in zip(self.core_busy_s, self.core_total_s)]
        n = os.cpu_count() or 1
        pct = 100.0 * self.process_cpu_s / self.wall_s if self.wall_s > 0 else None
        return {
            "process_cpu_pct": pct,
            "process_cpu_pct_of_machine": None if pct is None else pct / n,
            "per_core_busy_pct": cores,
        }


class ResourceMonitor:
    """Background sampler (see the module docs). ``profile``: the device profile (which zones
    to watch, the power sensor); ``root``: where ``/sys`` and ``/proc`` are read from."""

    def __init__(self, profile: Any, *, root: str = "/", interval_s: float = 0.5, origin: float | None = None) -> None:
        import psutil

        from ..budget.governor import Budget, Governor
        from ..budget.sensors import SensorReader

        self.interval_s = interval_s
        self.origin = _pc() if origin is None else origin
        self._psutil = psutil
        self._proc = psutil.Process()
        self.reader = SensorReader(profile, root)
        budget = Budget.from_profile(profile, sample_interval_s=interval_s, unknown_policy="hold")
        self.governor = Governor(self.reader.read, budget, actions=[])
        self.samples: list[dict[str, Any]] = []
        self.usage: dict[str, Usage] = {}
        self._key: str | None = None
        self._phase: str | None = None
        self._phases: list[dict[str, Any]] = []
        self._unknown: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last_cores: list[Any] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "ResourceMonitor":
        """Take a first sample and start sampling on a background thread every ``interval_s``; returns self."""
        self._sample()
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the sampling thread and take a last sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(5.0, 3 * self.interval_s))
        self._sample()

    def __enter__(self) -> "ResourceMonitor":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        due = _pc()
        while not self._stop.is_set():
            due += self.interval_s
            if self._stop.wait(max(0.0, due - _pc())):
                return
            self._sample()
            if _pc() > due + self.interval_s:  # fell behind: no burst
                due = _pc()

    # -- sampling ----------------------------------------------------------------------------------

    def _sample(self) -> None:
        t = _pc() - self.origin
        try:
            state = self.governor.step().value
            snap = self.governor.last_snapshot
        except Exception as e:  # the governor records its own read errors; this guards a bug
            state, snap = None, None
            self._unknown["governor"] = f"{type(e).__name__}: {e}"
        try:
            rss = self._proc.memory_info().rss / (1 << 20)
            cores = self._psutil.cpu_times(percpu=True)
        except Exception:  # psutil can fail in odd sandboxes: the sample keeps what it has
            rss, cores = None, None
        busy = None
        if cores is not None and self._last_cores is not None and len(cores) == len(self._last_cores):
            busy = [_busy_pct(a, b) for a, b in zip(self._last_cores, cores)]
        self._last_cores = cores
        with self._lock:
            if snap is not None:
                self._unknown = {**{k: v for k, v in self._unknown.items() if k == "governor"}, **snap.unknown}
            self.samples.append(
                {
                    "t_s": t,
                    "key": self._key,
                    "phase": self._phase,
                    "temp_c": None if snap is None else snap.temp_c,
                    "power_w": None if snap is None else snap.board_power_w,
                    "cpu_freq_mhz": None if snap is None else snap.cpu_freq_mhz,
                    "throttled": None if snap is None or snap.throttled is None else snap.throttled.any_now,
                    "governor_state": state,
                    "rss_mb": rss,
                    "cpu_busy_pct": None if busy is None else sum(busy) / len(busy),
                }
            )

    # -- windows -----------------------------------------------------------------------------------

    def phase(self, name: str | None) -> None:
        """Tag following samples with a phase (a scenario name); None ends the current one."""
        now = _pc() - self.origin
        with self._lock:
            if self._phases and self._phases[-1]["end_s"] is None:
                self._phases[-1]["end_s"] = now
            if name is not None:
                self._phases.append({"name": name, "start_s": now, "end_s": None})
        self._phase = name

    def phases(self) -> list[dict[str, Any]]:
        """Each phase with its start and end (s since the origin); empty ones (a phase at once
        replaced by a sub-phase) are left out."""
        with self._lock:
            return [dict(p) for p in self._phases if p["end_s"] is None or p["end_s"] - p["start_s"] >= 1e-3]

    @contextlib.contextmanager
    def window(self, key: str) -> Iterator[None]:
        """Account one block of ``key`` (one target in one scenario)."""
        u = self.usage.setdefault(key, Usage())
        self._key = key
        w0, c0, k0 = _pc(), self._cpu(), self._cores()
        try:
            yield
        finally:
            w1, c1, k1 = _pc(), self._cpu(), self._cores()
            self._key = None
            u.wall_s += w1 - w0
            u.spans.append((w0 - self.origin, w1 - self.origin))
            if c0 is not None and c1 is not None:
                u.process_cpu_s += c1 - c0
            if k0 is not None and k1 is not None and len(k0) == len(k1):
                if not u.core_busy_s:
                    u.core_busy_s = [0.0] * len(k0)
                    u.core_total_s = [0.0] * len(k0)
                for j, (a, b) in enumerate(zip(k0, k1)):
                    total = _total(b) - _total(a)
                    u.core_busy_s[j] += total - (_idle(b) - _idle(a))
                    u.core_total_s[j] += total

    def _cpu(self) -> float | None:
        try:
            t = self._proc.cpu_times()
            return float(t.user + t.system)
        except Exception:
            return None

    def _cores(self) -> list[Any] | None:
        try:
            return list(self._psutil.cpu_times(percpu=True))
        except Exception:
            return None

    # -- summaries ---------------------------------------------------------------------------------

    def samples_of(self, key: str) -> list[dict[str, Any]]:
        """The samples taken while ``key`` was being measured."""
        with self._lock:
            return [s for s in self.samples if s["key"] == key]

    def summary(self, key: str, busy_s: float | None, completed: int) -> dict[str, Any]:
        """Resources of ``key``: CPU, memory, temperature, governor states, power and energy.
        ``busy_s``: time with at least one of its queries running; ``completed``: queries done."""
        u = self.usage.get(key, Usage())
        ss = self.samples_of(key)
        temps = [s["temp_c"] for s in ss if s["temp_c"] is not None]
        powers = [s["power_w"] for s in ss if s["power_w"] is not None]
        rss = [s["rss_mb"] for s in ss if s["rss_mb"] is not None]
        states = sorted({s["governor_state"] for s in ss if s["governor_state"] is not None})
        power = sum(powers) / len(powers) if powers else None
        energy = power * busy_s / completed if power is not None and busy_s is not None and completed > 0 else None
        return {
            **u.to_dict(),
            "rss_peak_mb": peak_rss_mb(),
            "rss_max_sampled_mb": max(rss) if rss else None,
            "samples": len(ss),
            "temp_c": {"min": min(temps), "max": max(temps), "mean": sum(temps) / len(temps)} if temps else None,
            "governor_states": states,
            "power_w_mean": power,
            "busy_s": busy_s,
            "energy_per_inference_j": energy,
        }

    def sensor_status(self) -> dict[str, Any]:
        """Whether temperature and power were readable at all during the run, and if not why."""
        with self._lock:
            ss = list(self.samples)
            unknown = dict(self._unknown)
        temp = any(s["temp_c"] is not None for s in ss)
        power = any(s["power_w"] is not None for s in ss)
        why_temp = None if temp else (unknown.get("temp_c") or "no thermal zone or hwmon temperature sensor was found")
        why_power = None if power else (unknown.get("board_power") or "this machine exposes no board power sensor the reader knows")
        g = self.governor
        return {
            "temperature_available": temp,
            "temperature_unknown_reason": why_temp,
            "power_available": power,
            "power_unknown_reason": why_power,
            "unknown": unknown,
            "governor": {
                "observing": True,
                "actions": [],
                "budget": g.budget.to_dict(),
                "final_state": g.state.value,
                "transitions": sum(1 for e in g.events if e.kind == "transition"),
            },
            "sample_interval_s": self.interval_s,
            "samples": len(ss),
        }

    def timeline(self) -> list[dict[str, Any]]:
        """A copy of every sample taken, in order."""
        with self._lock:
            return [dict(s) for s in self.samples]


def _total(t: Any) -> float:
    return float(sum(t))


def _idle(t: Any) -> float:
    return float(getattr(t, "idle", 0.0) + getattr(t, "iowait", 0.0))


def _busy_pct(a: Any, b: Any) -> float:
    total = _total(b) - _total(a)
    return 100.0 * (total - (_idle(b) - _idle(a))) / total if total > 0 else 0.0
