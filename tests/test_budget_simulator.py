"""The RC thermal simulator: exact first-order dynamics, independent of the tick length, written
to a fake sysfs zone the way the kernel lays it out."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from edge_sdk.budget.simulator import ThermalModel, ThermalSimulator


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def read_zone(root: Path) -> tuple[str, float]:
    z = root / "sys/class/thermal/thermal_zone0"
    return (z / "type").read_text().strip(), int((z / "temp").read_text()) / 1000.0


def test_model_parameters_are_validated() -> None:
    with pytest.raises(ValueError, match="tau_s"):
        ThermalModel(tau_s=0)
    with pytest.raises(ValueError, match="idle_w <= busy_w"):
        ThermalModel(idle_w=5, busy_w=2)
    m = ThermalModel(ambient_c=20, r_c_per_w=5, idle_w=1, busy_w=9)
    assert m.steady_c(0) == 25 and m.steady_c(1) == 65 and m.steady_c(0.5) == 45
    assert m.util_for(45) == pytest.approx(0.5) and m.util_for(0) == 0 and m.util_for(500) == 1


def test_a_step_is_the_exact_exponential_whatever_the_tick(tmp_path: Path) -> None:
    m = ThermalModel(tau_s=10.0)
    one = m.step(40.0, 1.0, 10.0)
    many = 40.0
    for _ in range(1000):
        many = m.step(many, 1.0, 0.01)
    assert one == pytest.approx(many, abs=1e-9)
    assert one == pytest.approx(95 - 55 * math.exp(-1))  # one time constant: 63 % of the way


def test_reported_work_heats_the_zone_file_and_idle_cools_it(tmp_path: Path) -> None:
    clock = Clock()
    sim = ThermalSimulator(tmp_path, ThermalModel(tau_s=5.0), trips_c={"critical": 85, "passive": 80}, clock=clock)
    assert read_zone(tmp_path) == ("cpu-thermal", 40.0)  # idle steady state to start
    z = tmp_path / "sys/class/thermal/thermal_zone0"
    assert (z / "trip_point_0_type").read_text().strip() == "passive" and (z / "trip_point_0_temp").read_text().strip() == "80000"
    assert (z / "trip_point_1_type").read_text().strip() == "critical"
    for _ in range(50):  # 5 s busy half the time
        sim.add_work(0.05)
        clock.t += 0.1
        sim.tick()
    assert sim.util == pytest.approx(0.5)
    want = 67.5 + (40 - 67.5) * math.exp(-1)
    assert sim.temp_c == pytest.approx(want) and read_zone(tmp_path)[1] == pytest.approx(want, abs=1e-3)
    hot = sim.temp_c
    clock.t += 20.0
    sim.tick()  # no work reported: cools toward 40
    assert 40 < sim.temp_c < 40.5  # four time constants later: within 2 % of idle
    above = [t for t, temp, _ in sim.history if temp > 50.0]
    assert above and sim.time_above(50.0) == pytest.approx(0.1 * len(above))  # the busy ticks after crossing 50 C
    assert sim.time_above(99.0) == 0.0
    assert sim.max_c == pytest.approx(hot)


def test_utilisation_is_shared_by_workers_and_capped(tmp_path: Path) -> None:
    clock = Clock()
    sim = ThermalSimulator(tmp_path, ThermalModel(tau_s=1.0), workers=2, clock=clock)
    sim.add_work(1.0)
    clock.t += 1.0
    sim.tick()
    assert sim.util == pytest.approx(0.5)
    sim.add_work(5.0)  # more than the workers could have done: capped
    clock.t += 1.0
    sim.tick()
    assert sim.util == 1.0
    with pytest.raises(ValueError, match="workers"):
        ThermalSimulator(tmp_path, workers=0)


def test_the_thread_advances_on_the_real_clock_and_readers_never_see_torn_files(tmp_path: Path) -> None:
    sim = ThermalSimulator(tmp_path, ThermalModel(tau_s=0.5), start_c=30.0)
    bad: list[str] = []
    stop = threading.Event()

    def reader() -> None:  # reads as fast as it can while the simulator rewrites the file
        f = tmp_path / "sys/class/thermal/thermal_zone0/temp"
        while not stop.is_set():
            s = f.read_text()
            if not s.strip().lstrip("-").isdigit():
                bad.append(s)

    t = threading.Thread(target=reader)
    sim.start(interval_s=0.005)
    try:
        t.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            sim.add_work(0.004)
            time.sleep(0.004)
        with pytest.raises(RuntimeError, match="already"):
            sim.start()
    finally:
        sim.stop()
        stop.set()
        t.join(5)
    assert bad == []
    assert sim.temp_c > 60  # ~2 time constants near full load from 30 C
    assert len(sim.history) > 20
