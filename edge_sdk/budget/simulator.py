"""A thermal simulator that writes a fake ``/sys/class/thermal`` tree.

It stands in for a board's SoC where there is none (CI, a laptop), so the governor can be shown
to work against the real sensor-reading code path::

    sim = ThermalSimulator(tmp_root, ThermalModel(tau_s=2.0))
    with sim:                                         # a low-cost thread advances the model
        pipeline = VisionPipeline(model, source, sinks=[sim.work_sink()])
        ...                                           # SensorReader(root=tmp_root) reads sim's zone

The model is first order (one thermal resistance R to ambient, one heat capacity C, time constant
tau = R*C)::

    C dT/dt = P(u) - (T - T_ambient) / R,    P(u) = idle_w + (busy_w - idle_w) * u

where ``u`` in [0, 1] is how busy the inference work kept its workers over the last tick: the
busy seconds the pipeline reports (``add_work``, one call per finished inference) divided by the
tick's wall time and the number of workers. Each tick solves the equation exactly over the tick
(``T <- T_inf + (T - T_inf) * exp(-dt / tau)`` with ``T_inf = T_ambient + R * P(u)``), so the
result does not depend on the tick length. The steady state at full load is
``T_ambient + R * busy_w``.

Real boards take minutes to heat (a Pi 4 in a case: tens of seconds to minutes); tests and the
benchmark use a ``tau_s`` of a few seconds so that the same dynamics play out quickly.

The zone directory holds ``type``, ``temp`` (millidegrees, replaced atomically so a reader never
sees a half-written number) and ``trip_point_<N>_{type,temp}``, like the kernel's.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import OptionsError

__all__ = ["ThermalModel", "ThermalSimulator"]


@dataclass(frozen=True)
class ThermalModel:
    """First-order RC parameters. Defaults: a small passively cooled SoC that settles at
    25 + 10 * 7 = 95 C under full load and at 40 C idle."""

    ambient_c: float = 25.0
    r_c_per_w: float = 10.0
    tau_s: float = 60.0
    idle_w: float = 1.5
    busy_w: float = 7.0

    def __post_init__(self) -> None:
        for name in ("r_c_per_w", "tau_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise OptionsError(f"{name}: expected a number > 0, got {v!r}")
        if not (0 <= self.idle_w <= self.busy_w and math.isfinite(self.busy_w)):
            raise OptionsError(f"expected 0 <= idle_w <= busy_w, got idle_w={self.idle_w!r}, busy_w={self.busy_w!r}")
        if not math.isfinite(self.ambient_c):
            raise OptionsError(f"ambient_c: expected a finite number, got {self.ambient_c!r}")

    def power_w(self, util: float) -> float:
        """Board power at utilisation ``util`` (clamped to 0..1): linear from ``idle_w`` to ``busy_w``."""
        u = min(1.0, max(0.0, util))
        return self.idle_w + (self.busy_w - self.idle_w) * u

    def steady_c(self, util: float) -> float:
        """The temperature the SoC settles at when kept at utilisation ``util``."""
        return self.ambient_c + self.r_c_per_w * self.power_w(util)

    def step(self, temp_c: float, util: float, dt_s: float) -> float:
        """The temperature after ``dt_s`` seconds at utilisation ``util`` (exact solution)."""
        if dt_s <= 0:
            return temp_c
        target = self.steady_c(util)
        return target + (temp_c - target) * math.exp(-dt_s / self.tau_s)

    def util_for(self, temp_c: float) -> float:
        """The utilisation whose steady state is ``temp_c`` (clamped to [0, 1])."""
        span = self.busy_w - self.idle_w
        if span <= 0:
            return 1.0
        return min(1.0, max(0.0, ((temp_c - self.ambient_c) / self.r_c_per_w - self.idle_w) / span))


class ThermalSimulator:
    """Runs a :class:`ThermalModel` and writes its temperature to
    ``<root>/sys/class/thermal/thermal_zone<index>/temp``.

    ``trips_c``: trip points written next to it (type -> °C), e.g. ``{"passive": 80, "critical": 85}``.
    ``workers``: how many inference workers share the work (utilisation = busy seconds / wall
    seconds / workers). ``start_c``: initial temperature (default: the idle steady state).
    ``clock``: seconds, monotonic (tests pass a fake one and call :meth:`tick` themselves).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        model: ThermalModel | None = None,
        *,
        zone_type: str = "cpu-thermal",
        zone_index: int = 0,
        trips_c: Mapping[str, float] | None = None,
        workers: int = 1,
        start_c: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        history: int = 100_000,
    ) -> None:
        if workers < 1:
            raise OptionsError(f"workers: expected >= 1, got {workers!r}")
        self.model = model or ThermalModel()
        self.zone_dir = Path(root) / "sys" / "class" / "thermal" / f"thermal_zone{zone_index}"
        self.zone_type = zone_type
        self.trips_c = dict(trips_c or {})
        self.workers = workers
        self._clock = clock
        self._lock = threading.Lock()
        self._temp = self.model.steady_c(0.0) if start_c is None else float(start_c)
        self._busy_s = 0.0
        self._last_t = clock()
        self._t0 = self._last_t
        self._util = 0.0
        self.history: deque[tuple[float, float, float]] = deque(maxlen=history)  # (seconds since start, temp C, util)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._write_tree()

    # -- the fake sysfs ------------------------------------------------------------------------

    def _write_tree(self) -> None:
        self.zone_dir.mkdir(parents=True, exist_ok=True)
        (self.zone_dir / "type").write_text(self.zone_type + "\n")
        for i, (kind, c) in enumerate(sorted(self.trips_c.items(), key=lambda kv: kv[1])):
            (self.zone_dir / f"trip_point_{i}_type").write_text(f"{kind}\n")
            (self.zone_dir / f"trip_point_{i}_temp").write_text(f"{round(c * 1000)}\n")
        self._write_temp(self._temp)

    def _write_temp(self, temp_c: float) -> None:
        tmp = self.zone_dir / ".temp.tmp"
        tmp.write_text(f"{round(temp_c * 1000)}\n")
        os.replace(tmp, self.zone_dir / "temp")

    # -- the model -----------------------------------------------------------------------------

    @property
    def temp_c(self) -> float:
        """The simulated temperature now, in degrees C."""
        return self._temp

    @property
    def t0(self) -> float:
        """The clock reading that ``history`` times count from."""
        return self._t0

    @property
    def util(self) -> float:
        """Utilisation over the last tick."""
        return self._util

    def add_work(self, busy_s: float) -> None:
        """Report ``busy_s`` seconds of inference work done (thread-safe; cheap)."""
        if busy_s > 0:
            with self._lock:
                self._busy_s += busy_s

    def work_sink(self) -> Callable[[Any], None]:
        """A pipeline sink: each FrameResult adds its ``result.timings.total_ms`` as work.

        ``total_ms`` includes the preparation; a pipeline that prepares on its capture thread
        (``PipelineOptions(preprocess="capture")``) overlaps it with inference, so its busy
        seconds can exceed the wall time: count that thread in ``workers``."""
        return lambda fr: self.add_work(fr.result.timings.total_ms / 1e3)

    def tick(self, now: float | None = None) -> float:
        """Advance the model to ``now`` (default: the clock) with the work reported since the
        last tick, write the temperature, and return it."""
        now = self._clock() if now is None else now
        with self._lock:
            dt = now - self._last_t
            if dt <= 0:
                return self._temp
            util = min(1.0, self._busy_s / dt / self.workers)
            self._busy_s = 0.0
            self._last_t = now
            self._temp = self.model.step(self._temp, util, dt)
            self._util = util
            self.history.append((now - self._t0, self._temp, util))
            temp = self._temp
        self._write_temp(temp)
        return temp

    def time_above(self, limit_c: float) -> float:
        """Seconds of the recorded history spent above ``limit_c``."""
        h = list(self.history)
        total, prev = 0.0, 0.0
        for t, temp, _ in h:
            if temp > limit_c:
                total += t - prev
            prev = t
        return total

    @property
    def max_c(self) -> float:
        """The highest temperature in the history so far (the current one if there is no history)."""
        return max((temp for _, temp, _ in self.history), default=self._temp)

    # -- the thread ----------------------------------------------------------------------------

    def start(self, interval_s: float = 0.02) -> "ThermalSimulator":
        """Tick every ``interval_s`` seconds on a background thread; returns self. ``RuntimeError`` if already started."""
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        self._stop.clear()
        with self._lock:
            self._last_t = self._clock()
            self._busy_s = 0.0

        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.tick()

        self._thread = threading.Thread(target=loop, name="edge-sdk-thermal-sim", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the background thread (waiting up to ``timeout_s``); the simulator can be started again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> "ThermalSimulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
