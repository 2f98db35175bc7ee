"""The budget governor: Budget validation, the NORMAL / CONSTRAINED / CRITICAL state machine
(hysteresis, minimum dwell, immediate reaction, unknown readings, the power window), the ladder
(order, reverse undo, CRITICAL all at once, veto, custom and unavailable actions), energy per
inference, telemetry, the real sampling thread, the built-in actions on real VisionPipelines over
the real demo model, and selection.lighter_variants.

Snapshots are real SensorSnapshot objects fed through a scripted ``read``; time is a fake clock
(dwell is tested without sleeping) except for the sampling-thread test, where every wait is
bounded."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

import edge_sdk
from edge_sdk.backends.base import BackendStatus
from edge_sdk.budget.governor import (
    POWER_RELEASE,
    Action,
    ActionContext,
    ActionUnavailable,
    Budget,
    Governor,
    GovernorEvent,
    GovernorState,
    LighterVariant,
    LowerRate,
    Offload,
    PauseLowPriority,
    default_ladder,
)
from edge_sdk.budget.types import SensorSnapshot, ThrottledFlags
from edge_sdk.errors import SelectionError
from edge_sdk.package import Manifest, ModelPackage
from edge_sdk.pipelines import FrameResult, PipelineOptions, SyntheticSource, VisionPipeline
from edge_sdk.profiles import load_profile
from edge_sdk.selection import lighter_variants

N, C, X = GovernorState.NORMAL, GovernorState.CONSTRAINED, GovernorState.CRITICAL
JOIN_S = 15.0


# ----------------------------------------------------------------------------------------------
# helpers


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def snap(temp: float | None, power: float | None = None, throttled: int | None = None, **unknown: str) -> SensorSnapshot:
    return SensorSnapshot(
        timestamp_ms=0.0,
        temp_c=temp,
        board_power_w=power,
        throttled=None if throttled is None else ThrottledFlags.from_int(throttled),
        unknown=unknown,
    )


class Script:
    """A ``read`` that returns the next scripted snapshot (the last one repeats)."""

    def __init__(self, *snaps: SensorSnapshot) -> None:
        self.snaps = list(snaps)
        self.calls = 0

    def __call__(self) -> SensorSnapshot:
        s = self.snaps[min(self.calls, len(self.snaps) - 1)]
        self.calls += 1
        return s


class Step(Action):
    """An app-defined ladder step that writes what happens to a shared log."""

    def __init__(self, name: str, log: list[str], *, unavailable: str | None = None, fail: bool = False) -> None:
        self.name, self.log, self.unavailable, self.fail = name, log, unavailable, fail
        self.contexts: list[ActionContext] = []

    def apply(self, ctx: ActionContext) -> str:
        self.contexts.append(ctx)
        if self.unavailable:
            raise ActionUnavailable(self.unavailable)
        if self.fail:
            raise RuntimeError("boom")
        self.log.append(f"+{self.name}")
        return f"{self.name} on"

    def undo(self, ctx: ActionContext) -> str:
        self.log.append(f"-{self.name}")
        return f"{self.name} off"


def budget(**kw: Any) -> Budget:
    return Budget(**{"soft_c": 80.0, "hard_c": 90.0, "hysteresis_c": 5.0, "min_dwell_s": 10.0, **kw})


def drive(g: Governor, clock: FakeClock, temps: list[Any], dt: float = 1.0, power: float | None = None) -> list[GovernorState]:
    """One step per temperature (a number, None, or a ready SensorSnapshot), ``dt`` apart."""
    states = []
    for t in temps:
        states.append(g.step(t if isinstance(t, SensorSnapshot) else snap(t, power)))
        clock.t += dt
    return states


def kinds(g: Governor, *which: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.action if e.kind != "transition" else e.detail) for e in g.events if not which or e.kind in which]


def ladder(log: list[str], *names: str, **opts: dict[str, Any]) -> list[Step]:
    return [Step(n, log, **opts.get(n, {})) for n in names]


# ----------------------------------------------------------------------------------------------
# Budget


def test_budget_from_profile_and_overrides() -> None:
    b = Budget.from_profile(load_profile("generic-x86_64"))
    assert (b.soft_c, b.hard_c, b.power_budget_w) == (80.0, 90.0, None)  # budget_w = 0: no budget
    pi = Budget.from_profile(load_profile("raspberry-pi-5"), min_dwell_s=3, unknown_policy="hold")
    assert (pi.soft_c, pi.hard_c, pi.power_budget_w, pi.min_dwell_s, pi.unknown_policy) == (70.0, 77.0, 25.0, 3.0, "hold")
    assert b.to_dict()["hysteresis_c"] == 5.0 and b.sample_interval_s == 1.0 and b.power_window_s == 10.0
    # a Pi 4 reads volts only: its 15 W supply rating is no budget (degrade would never end)
    pi4 = Budget.from_profile(load_profile("raspberry-pi-4"))
    assert load_profile("raspberry-pi-4").power.budget_w == 15.0 and pi4.power_budget_w is None
    assert Budget.from_profile(load_profile("jetson-orin-nano")).power_budget_w == 15.0  # INA3221 measures it
    assert Budget.from_profile(load_profile("raspberry-pi-4"), power_budget_w=5.0).power_budget_w == 5.0  # explicit wins


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"soft_c": 90.0, "hard_c": 90.0}, "soft_c: expected soft_c < hard_c"),
        ({"soft_c": 95.0}, "soft_c < hard_c"),
        ({"hysteresis_c": -1}, "hysteresis_c: expected >= 0"),
        ({"min_dwell_s": -0.1}, "min_dwell_s"),
        ({"power_budget_w": 0}, "power_budget_w: expected watts > 0"),
        ({"power_budget_w": float("nan")}, "power_budget_w: expected a finite number"),
        ({"power_window_s": 0}, "power_window_s"),
        ({"sample_interval_s": -1}, "sample_interval_s"),
        ({"unknown_policy": "panic"}, "unknown_policy: expected one of"),
        ({"soft_c": "80"}, "soft_c: expected a finite number"),
        ({"hard_c": True}, "hard_c: expected a finite number"),
    ],
)
def test_budget_is_validated(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        budget(**kw)


# ----------------------------------------------------------------------------------------------
# the state machine


def test_hysteresis_one_transition_for_a_temperature_oscillating_around_the_soft_limit() -> None:
    clock, log = FakeClock(), []
    g = Governor(Script(), budget(), ladder(log, "a"), clock)
    states = drive(g, clock, [79.5, 80.5] * 40)  # 80 s of +-0.5 C around soft_c = 80
    assert kinds(g, "transition") == [("transition", "normal -> constrained")]
    assert states[0] is N and set(states[1:]) == {C}
    # without hysteresis and dwell the same input flips every sample: the test can tell them apart
    clock2 = FakeClock()
    g2 = Governor(Script(), budget(hysteresis_c=0, min_dwell_s=0), [], clock2)
    drive(g2, clock2, [79.5, 80.5] * 40)
    assert len(kinds(g2, "transition")) == 79


def test_going_down_needs_the_hysteresis_and_the_minimum_dwell() -> None:
    clock = FakeClock()
    g = Governor(Script(), budget(), [], clock)
    assert g.step(snap(85)) is C  # t=0
    clock.t += 1
    assert drive(g, clock, [76] * 20) == [C] * 20  # t=1..20: under soft_c, but not by the hysteresis
    assert g.step(snap(75)) is N  # t=21: soft_c - hysteresis_c, and in CONSTRAINED for 21 s >= the dwell
    assert [e.detail for e in g.events if e.kind == "transition"] == ["normal -> constrained", "constrained -> normal"]


def test_minimum_dwell_counts_from_entering_the_state() -> None:
    clock = FakeClock(0.0)
    g = Governor(Script(), budget(), [], clock)
    g.step(snap(85))  # t=0: CONSTRAINED
    for t in range(1, 10):
        clock.t = t
        assert g.step(snap(70)) is C, t  # cool, but only t s in CONSTRAINED
    clock.t = 10.0
    assert g.step(snap(70)) is N
    ev = g.events[-1]
    assert ev.kind == "transition" and ev.detail == "constrained -> normal" and "after 10.0 s in constrained" in ev.reason
    assert "temp 70.0 C" in ev.reason and ev.timestamp_ms == 10_000.0
    clock.t = 10.5
    assert g.step(snap(81)) is C  # going up needs no dwell: at once


def test_critical_steps_down_one_level_at_a_time() -> None:
    clock = FakeClock(0.0)
    g = Governor(Script(), budget(), [], clock)
    assert g.step(snap(95)) is X  # NORMAL straight to CRITICAL
    assert "temp 95.0 C >= hard limit 90 C" in g.events[-1].reason
    clock.t = 5
    assert g.step(snap(84)) is X  # under hard - hysteresis, dwell not reached
    clock.t = 10
    assert g.step(snap(70)) is C  # one level down, even though 70 C is under soft - hysteresis too
    clock.t = 19.9
    assert g.step(snap(70)) is C
    clock.t = 20
    assert g.step(snap(70)) is N
    clock.t = 21
    assert g.step(snap(86)) is C and g.step(snap(90)) is X
    assert [e.detail for e in g.events if e.kind == "transition"] == [
        "normal -> critical",
        "critical -> constrained",
        "constrained -> normal",
        "normal -> constrained",
        "constrained -> critical",
    ]
    clock.t = 40
    assert g.step(snap(86)) is X  # 86 > 90 - 5: not cool enough to leave CRITICAL


def test_throttled_flags_active_now_mean_critical_since_boot_does_not() -> None:
    clock = FakeClock(0.0)
    g = Governor(Script(), budget(), [], clock)
    assert g.step(snap(50, throttled=0x50000)) is N  # occurred since boot only
    assert g.step(snap(50, throttled=0x4)) is X  # throttled now
    assert "firmware throttling now (throttled=0x4)" in g.events[-1].reason
    clock.t = 30
    assert g.step(snap(50, throttled=0x4)) is X  # cannot leave while it lasts
    assert g.step(snap(50, throttled=0x50000)) is C


def test_power_budget_uses_the_rolling_window_mean() -> None:
    clock = FakeClock(0.0)
    g = Governor(Script(), budget(power_budget_w=5.0, power_window_s=10.0), [], clock)
    states = drive(g, clock, [snap(50, 4.0)] * 5 + [snap(50, 6.0)] * 6)  # t=0..10
    # t=9: samples 0..9 -> (5*4 + 5*6)/10 = 5.0, not over; t=10: samples 1..10 -> 5.2
    assert states == [N] * 10 + [C]
    assert "mean power 5.20 W over 10 s > budget 5 W" in g.events[-1].reason
    # 4.6 W is under the budget but not under POWER_RELEASE x budget (4.5): stays CONSTRAINED
    assert drive(g, clock, [snap(50, 4.6)] * 30) == [C] * 30
    assert POWER_RELEASE == 0.9
    states = drive(g, clock, [snap(50, 4.0)] * 12)
    assert states[-1] is N and g.events[-1].detail == "constrained -> normal"
    # a one-sample spike does not trip the budget: the mean over the window does
    clock2 = FakeClock(0.0)
    g2 = Governor(Script(), budget(power_budget_w=5.0), [], clock2)
    assert drive(g2, clock2, [snap(50, 3.0)] * 9 + [snap(50, 20.0)] + [snap(50, 3.0)] * 5) == [N] * 15
    assert clock2.t == 15 and g2.power_mean_w() == pytest.approx((20 + 3 * 8) / 9)  # samples t=6..14


def test_without_a_power_budget_power_is_only_observed() -> None:
    clock = FakeClock(0.0)
    g = Governor(Script(), budget(), [], clock)
    assert drive(g, clock, [snap(50, 500.0)] * 3) == [N] * 3
    assert g.power_mean_w() == 500.0


@pytest.mark.parametrize("policy", ["degrade", "hold", "ignore"])
def test_unknown_temperature_follows_the_policy(policy) -> None:
    clock, log = FakeClock(0.0), []
    g = Governor(Script(), budget(unknown_policy=policy), ladder(log, "a", "b", "c"), clock)
    states = drive(g, clock, [snap(None, thermal_zone0="EIO")] * 40)
    if policy == "degrade":
        assert set(states) == {C} and log == ["+a"]  # one step up, and no further while unknown
        assert "temperature unknown (thermal_zone0: EIO)" in g.events[0].reason and "unknown_policy=degrade" in g.events[0].reason
    else:
        assert set(states) == {N} and log == []
    # from CRITICAL, then the sensor goes away
    clock2, log2 = FakeClock(0.0), []
    g2 = Governor(Script(), budget(unknown_policy=policy), ladder(log2, "a", "b"), clock2)
    g2.step(snap(95))
    clock2.t += 1
    states = drive(g2, clock2, [snap(None)] * 40)
    if policy == "ignore":
        assert states[-1] is N and log2 == ["+a", "+b", "-b", "-a"]  # acts on what is known
    else:
        assert set(states) == {X} and log2 == ["+a", "+b"]  # nothing steps down on an unknown reading


def test_unknown_power_with_a_budget_and_a_failing_read() -> None:
    clock = FakeClock(0.0)
    g = Governor(Script(), budget(power_budget_w=5.0), [], clock)
    assert g.step(snap(50, None)) is C  # degrade: the budget cannot be checked
    assert "board power unknown" in g.events[-1].reason

    def broken() -> SensorSnapshot:
        raise OSError("sysfs vanished")

    g2 = Governor(broken, budget(), [], FakeClock(0.0))
    assert g2.step() is C
    assert kinds(g2) == [("read_error", None), ("transition", "normal -> constrained")]
    assert "OSError: sysfs vanished" in g2.events[0].reason and g2.last_snapshot.unknown["read"] == "OSError: sysfs vanished"


# ----------------------------------------------------------------------------------------------
# the ladder


def test_ladder_applies_one_step_per_dwell_while_hot_and_undoes_in_reverse() -> None:
    clock, log = FakeClock(0.0), []
    steps = ladder(log, "a", "b", "c", "d")
    g = Governor(Script(), budget(), steps, clock)
    for t, temp in [(0, 81), (5, 82), (9.9, 83)]:
        clock.t = t
        g.step(snap(temp))
    assert log == ["+a"]  # entering CONSTRAINED: one step, at once
    clock.t = 10
    g.step(snap(81))
    clock.t = 15
    g.step(snap(79))  # under the soft limit: no new step
    clock.t = 20
    g.step(snap(81))
    assert log == ["+a", "+b", "+c"] and [a.name for a in g.applied] == ["a", "b", "c"]
    clock.t = 21
    assert g.step(snap(70)) is N  # cool for 21 s since entering CONSTRAINED at t=0
    assert log == ["+a", "+b", "+c"]  # the ladder moves once per dwell: last change at t=20
    for t in range(22, 61):
        clock.t = t
        g.step(snap(70))
    assert log == ["+a", "+b", "+c", "-c", "-b", "-a"] and g.applied == ()
    undone = [(e.action, e.timestamp_ms / 1000) for e in g.events if e.kind == "undone"]
    assert undone == [("c", 30.0), ("b", 40.0), ("a", 50.0)]
    ap = [e for e in g.events if e.kind == "applied"]
    assert [e.detail for e in ap] == ["a on", "b on", "c on"] and "temp 81.0 C >= soft limit 80 C" in ap[0].reason
    assert [e.detail for e in g.events if e.kind == "undone"] == ["c off", "b off", "a off"]


def test_constrained_under_the_soft_limit_undoes_down_to_one_step() -> None:
    clock, log = FakeClock(0.0), []
    g = Governor(Script(), budget(), ladder(log, "a", "b", "c", "d"), clock)
    g.step(snap(95))  # CRITICAL: all at once
    assert log == ["+a", "+b", "+c", "+d"] and len([e for e in g.events if e.kind == "applied"]) == 4
    for t in range(1, 60):
        clock.t = t
        g.step(snap(82 if t < 10 else 78))  # CONSTRAINED from t=10, in the band under soft_c
    assert g.state is C
    assert log == ["+a", "+b", "+c", "+d", "-d", "-c", "-b"]  # settles on one step
    clock.t = 60
    g.step(snap(81))
    assert log[-1] == "+b"  # over the soft limit again: one more step per dwell


def test_critical_applies_every_remaining_step_at_once_and_retries_skipped_ones() -> None:
    clock, log = FakeClock(0.0), []
    flaky = Step("remote", log, unavailable="no remote configured")
    steps = [Step("a", log), flaky, Step("c", log)]
    g = Governor(Script(), budget(), steps, clock)
    g.step(snap(81))
    assert log == ["+a"]
    clock.t = 1
    g.step(snap(91))  # CRITICAL within the dwell: does not wait
    assert log == ["+a", "+c"]
    assert kinds(g)[-3:] == [("transition", "constrained -> critical"), ("skipped", "remote"), ("applied", "c")]
    assert g.events[-2].detail == "no remote configured" and g.events[-2].state is X
    clock.t = 5
    g.step(snap(91))
    assert len(flaky.contexts) == 1  # not retried every sample
    flaky.unavailable = None
    clock.t = 11
    g.step(snap(91))  # one dwell after the last ladder change: the remaining step is tried again
    assert [a.name for a in g.applied] == ["a", "c", "remote"] and log[-1] == "+remote"


def test_veto_and_custom_actions() -> None:
    clock, log = FakeClock(0.0), []
    seen: list[tuple[str, GovernorState, float | None]] = []

    def no_b_unless_critical(name: str, state: GovernorState, s: SensorSnapshot | None) -> bool:
        seen.append((name, state, s.temp_c if s else None))
        return name == "b" and state is not X

    g = Governor(Script(), budget(), ladder(log, "a", "b", "c"), clock)
    first = Step("app-first", log)
    g.insert_action(0, first)
    assert [a.name for a in g.actions] == ["app-first", "a", "b", "c"]
    remove = g.veto(no_b_unless_critical)
    g.step(snap(81))
    clock.t = 10
    g.step(snap(81))
    clock.t = 20
    g.step(snap(81))
    assert log == ["+app-first", "+a", "+c"]  # b vetoed, the next step tried in its place
    assert ("vetoed", "b") in kinds(g) and seen[:2] == [("app-first", C, 81.0), ("a", C, 81.0)]
    ev = next(e for e in g.events if e.kind == "vetoed")
    assert ev.state is C and ev.detail == "vetoed by the application" and "81.0" in ev.reason
    remove()
    clock.t = 21
    g.step(snap(95))  # b is tried again on the way to CRITICAL, and not vetoed any more
    assert log[-1] == "+b"
    with pytest.raises(TypeError, match="name, apply"):
        g.insert_action(0, object())  # type: ignore[arg-type]


def test_a_failing_action_is_recorded_and_the_next_step_taken() -> None:
    clock, log = FakeClock(0.0), []
    g = Governor(Script(), budget(), [Step("bad", log, fail=True), Step("good", log)], clock)
    g.step(snap(81))
    assert log == ["+good"] and kinds(g, "failed", "applied") == [("failed", "bad"), ("applied", "good")]
    assert "RuntimeError: boom" in g.events[1].detail
    assert g.telemetry()["counts"]["failed"] == 1


def test_subscribers_get_every_event_and_a_broken_one_is_ignored() -> None:
    clock, log, got = FakeClock(0.0), [], []
    g = Governor(Script(), budget(), ladder(log, "a"), clock)
    g.subscribe(lambda e: 1 / 0)
    unsubscribe = g.subscribe(got.append)
    g.step(snap(95))
    assert [e.kind for e in got] == ["transition", "applied"] and all(isinstance(e, GovernorEvent) for e in got)
    with pytest.raises(AttributeError):
        got[0].kind = "x"  # type: ignore[misc]  # frozen
    unsubscribe()
    g.restore()
    assert log == ["+a", "-a"] and len(got) == 2 and g.events[-1].kind == "undone"


def test_events_are_bounded_and_telemetry_reports_the_state() -> None:
    clock, log = FakeClock(0.0), []
    g = Governor(Script(), budget(min_dwell_s=0, hysteresis_c=0), ladder(log, "a"), clock, max_events=50)
    drive(g, clock, [70, 85] * 100, power=7.5)
    assert len(g.events) == 50
    tm = g.telemetry(last_events=3)
    assert tm["state"] == "constrained" and tm["state_level"] == 1 and tm["temp_c"] == 85 and tm["power_w"] == 7.5
    assert tm["power_mean_w"] == 7.5 and tm["applied"] == ["a"] and tm["samples"] == 200
    assert tm["reading"] == "temp 85.0 C, mean power 7.50 W"
    assert tm["counts"]["transition"] == 199 and tm["counts"]["applied"] == 100 and tm["counts"]["undone"] == 99
    assert len(tm["last_events"]) == 3 and tm["last_events"][-1]["kind"] == "applied"
    assert tm["energy_per_inference_j"] is None  # no inference recorded
    import json

    json.dumps(tm)  # exporter-ready


def test_telemetry_does_not_wait_for_a_step_in_progress() -> None:
    entered, release = threading.Event(), threading.Event()

    class Slow(Action):  # an action that takes its time (a model load)
        name = "slow"

        def apply(self, ctx: ActionContext) -> str:
            entered.set()
            assert release.wait(JOIN_S)
            return "done"

        def undo(self, ctx: ActionContext) -> None:
            pass

    g = Governor(Script(snap(85, 3.0)), budget(), [Slow()])
    t = threading.Thread(target=g.step, name="test-step")
    t.start()
    try:
        assert entered.wait(JOIN_S)
        t0 = time.monotonic()
        tm = g.telemetry()
        assert time.monotonic() - t0 < 1.0
        assert tm["state"] == "constrained" and tm["applied"] == [] and tm["counts"]["transition"] == 1
    finally:
        release.set()
        t.join(JOIN_S)
    assert not t.is_alive() and g.telemetry()["applied"] == ["slow"]


def test_energy_per_inference_from_the_power_window_and_busy_time() -> None:
    clock = FakeClock(0.0)
    g = Governor(Script(), budget(power_window_s=10.0), [], clock)
    for b in [0.02] * 5 + [0.04] * 5:
        g.record_inference(b)
    assert g.energy_per_inference_j is None  # power unknown
    g.step(snap(50, 10.0))
    g.step(snap(50, 14.0))
    assert g.energy_per_inference_j == pytest.approx(12.0 * 0.03)
    g.record_inference(float("nan"))  # ignored
    g.record_inference(-1)  # ignored
    assert g.energy_per_inference_j == pytest.approx(0.36)
    clock.t = 10.5
    g.step(snap(50, 8.0))
    assert g.energy_per_inference_j is None  # the inferences left the window
    g.record_inference(0.05)
    assert g.energy_per_inference_j == pytest.approx(8.0 * 0.05)
    assert g.telemetry()["energy_per_inference_j"] == pytest.approx(0.4)


# ----------------------------------------------------------------------------------------------
# the sampling thread


def _governor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "edge-sdk-governor"]


def test_sampling_thread_reacts_within_two_samples_and_stops() -> None:
    box = {"temp": 60.0, "reads": 0}
    lock = threading.Lock()

    def read() -> SensorSnapshot:
        with lock:
            box["reads"] += 1
            return snap(box["temp"])

    seen = threading.Event()
    at_event: dict[str, int] = {}

    def on_event(e: GovernorEvent) -> None:
        if e.kind == "transition":
            with lock:
                at_event["reads"] = box["reads"]
            seen.set()

    interval = 0.02
    g = Governor(read, budget(sample_interval_s=interval), [])
    g.subscribe(on_event)
    t0 = time.monotonic()
    with g:
        assert g.running and len(_governor_threads()) == 1
        deadline = time.monotonic() + JOIN_S
        while box["reads"] < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert box["reads"] >= 3 and not seen.is_set()
        with lock:
            box["temp"] = 95.0
            flipped_at = box["reads"]
        assert seen.wait(JOIN_S)
        assert at_event["reads"] - flipped_at <= 2, (flipped_at, at_event)  # within two samples of the crossing
        assert g.state is X
    elapsed = time.monotonic() - t0
    assert not g.running and _governor_threads() == []
    assert box["reads"] <= elapsed / interval + 3  # paced, not spinning
    with pytest.raises(RuntimeError, match="already running"):
        g.start()
        g.start()
    assert g.stop(5.0)


# ----------------------------------------------------------------------------------------------
# built-in actions on real pipelines


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("governor-cache")


@pytest.fixture(scope="module")
def int8(cache):
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", cache_dir=cache, variant="int8-onnx") as m:
        assert m.variant.id == "int8-onnx"
        yield m


@pytest.fixture
def fp32(cache):
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", cache_dir=cache, variant="fp32-onnx") as m:
        yield m


@pytest.fixture(autouse=True)
def _no_leftover_threads():
    yield
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and (_governor_threads() or _pipeline_threads()):
        time.sleep(0.01)
    assert _governor_threads() == [] and _pipeline_threads() == [], "threads outlived the test"


def _pipeline_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("edge-sdk-pipeline")]


class Collect:
    def __init__(self) -> None:
        self.results: list[FrameResult] = []
        self.lock = threading.Lock()

    def __call__(self, fr: FrameResult) -> None:
        with self.lock:
            self.results.append(fr)

    def variants(self) -> list[str]:
        with self.lock:
            return [r.result.variant_id for r in self.results]


def live_pipeline(model: Any, name: str, *, fps: float = 100, sinks=(), **opts: Any) -> VisionPipeline:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
    src = SyntheticSource(lambda i: img if i < 100_000 else None, fps=fps, live=True, name=name)
    return VisionPipeline(model, src, PipelineOptions(**opts), sinks=sinks)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = JOIN_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError(f"not reached within {timeout} s: {what}")


def close_all(*ps: VisionPipeline) -> None:
    for p in ps:
        p.close("discard")
        c = p.counters()
        assert c.unaccounted == 0 and c.in_flight == 0 and c.frames_in == c.processed + c.dropped_total, c


def test_lower_rate_halves_the_limit_and_restores_it(int8) -> None:
    clock = FakeClock(0.0)
    cam = live_pipeline(int8, "cam", max_fps=40)
    free = live_pipeline(int8, "free")  # no limit: lowered from its measured rate
    g = Governor(Script(), budget(), [LowerRate([cam, free], factor=0.5, min_fps=15)], clock)
    with pytest.raises(ActionUnavailable, match="free: no rate measured yet"):
        LowerRate([free]).apply(ActionContext(C, None, "test", g))  # not started
    try:
        cam.start(), free.start()
        wait_for(lambda: free.counters().processed >= 20 and cam.counters().processed > 3, "frames through both pipelines")
        # The source delivers frame i at t0 + i * 10 ms and t0 is after start(): n frames take at least
        # (n - 1) * 10 ms, so the measured rate is at most 100 * n / (n - 1) fps, n as read here or later.
        n = free.counters().processed
        assert g.step(snap(81)) is C
        assert cam.max_fps == 20 and free.max_fps is not None and 15 <= free.max_fps <= 0.5 * 100 * n / (n - 1)
        ev = g.events[-1]
        assert ev.kind == "applied" and "cam: max_fps 40 -> 20" in ev.detail and "free: max_fps unlimited ->" in ev.detail
        before = cam.counters().dropped["rate_limit"]
        wait_for(lambda: cam.counters().dropped["rate_limit"] > before + 5, "rate_limit drops at the new rate")
        clock.t = 30
        assert g.step(snap(60)) is N
        assert cam.max_fps == 40 and free.max_fps is None  # undone
        # a second LowerRate at the floor is unavailable
        floor = LowerRate([cam], factor=0.5, min_fps=40)
        with pytest.raises(ActionUnavailable, match="already at 40 fps"):
            floor.apply(ActionContext(C, None, "test", g))
    finally:
        close_all(cam, free)
    with pytest.raises(ValueError, match="factor"):
        LowerRate([], factor=1.0)


def test_lighter_variant_swaps_the_model_and_undo_swaps_back_and_closes_it(int8, fp32) -> None:
    clock = FakeClock(0.0)
    out = Collect()
    cam = live_pipeline(fp32, "cam", sinks=[out], preprocess="capture")
    loaded: list[Any] = []

    def loader(model: Any, variant_id: str) -> Any:  # the default loader, watched
        m = model.with_variant(variant_id)
        loaded.append(m)
        return m

    g = Governor(Script(), budget(), [LighterVariant([cam], loader)], clock)
    try:
        cam.start()
        wait_for(lambda: len(out.variants()) >= 3, "frames on fp32")
        g.step(snap(81))
        assert [m.variant.id for m in loaded] == ["int8-onnx"] and cam.model is loaded[0]
        assert g.events[-1].kind == "applied" and g.events[-1].detail == "cam: fp32-onnx -> int8-onnx"
        n = len(out.variants())
        wait_for(lambda: out.variants()[n + 2 :].count("int8-onnx") >= 3, "frames on the lighter variant")
        clock.t = 20
        assert g.step(snap(60)) is N
        assert cam.model is fp32 and loaded[0].closed and not fp32.closed
        assert g.events[-1].kind == "undone" and g.events[-1].detail == "cam: int8-onnx -> fp32-onnx"
        n = len(out.variants())
        wait_for(lambda: out.variants()[n + 2 :].count("fp32-onnx") >= 3, "frames back on fp32")
        assert cam.counters().dropped["error"] == 0  # no frame ran on a closed model
    finally:
        close_all(cam)
    # already the lightest here: unavailable, with the reason
    p = live_pipeline(int8, "light")
    with pytest.raises(ActionUnavailable, match="int8-onnx is the lightest variant of shapes-classifier for generic-x86_64"):
        LighterVariant([p]).apply(ActionContext(C, None, "test", g))
    p.stop()


def test_pause_low_priority_pauses_only_low_pipelines(int8) -> None:
    clock = FakeClock(0.0)
    cam = live_pipeline(int8, "cam")
    logger = live_pipeline(int8, "logger", priority="low")
    g = Governor(Script(), budget(), [PauseLowPriority([cam, logger])], clock)
    try:
        cam.start(), logger.start()
        g.step(snap(81))
        assert logger.paused and not cam.paused and g.events[-1].detail == "paused logger"
        wait_for(lambda: logger.counters().dropped["paused"] > 3, "paused drops on the low-priority pipeline")
        assert cam.counters().dropped["paused"] == 0
        clock.t = 20
        g.step(snap(60))
        assert not logger.paused and g.events[-1].detail == "resumed logger"
        n = logger.counters().processed
        wait_for(lambda: logger.counters().processed > n + 2, "the logger runs again")
    finally:
        close_all(cam, logger)
    with pytest.raises(ActionUnavailable, match="no running low-priority pipeline"):
        PauseLowPriority([cam]).apply(ActionContext(C, None, "test", g))


def test_offload_needs_a_remote() -> None:
    calls: list[bool] = []
    ctx = ActionContext(C, None, "test", Governor(Script(), budget(), []))
    with pytest.raises(ActionUnavailable, match="no remote configured"):
        Offload(None).apply(ctx)
    o = Offload(lambda on: calls.append(on) or "remote http://edge:8000")
    assert o.apply(ctx) == "offload on: remote http://edge:8000"
    o.undo(ctx)
    assert calls == [True, False]


def test_default_ladder_end_to_end_on_real_pipelines(int8, fp32) -> None:
    clock = FakeClock(0.0)
    out = Collect()
    cam = live_pipeline(fp32, "cam", sinks=[out], max_fps=50)
    logger = live_pipeline(int8, "logger", priority="low")
    read = Script(snap(95), *[snap(60)] * 100)
    g = Governor(read, budget(), clock=clock, pipelines=[cam, logger])
    assert [a.name for a in g.actions] == ["lower_rate", "lighter_variant", "offload", "pause_low_priority"]
    assert [type(a) for a in default_ladder([])] == [LowerRate, LighterVariant, Offload, PauseLowPriority]
    energy_sink = g.inference_sink()
    try:
        cam.start(), logger.start()
        wait_for(lambda: len(out.variants()) >= 2 and logger.processed_fps is not None, "frames through both")
        assert g.step() is X  # 95 C: every remaining step at once
        assert kinds(g) == [
            ("transition", "normal -> critical"),
            ("applied", "lower_rate"),
            ("applied", "lighter_variant"),
            ("skipped", "offload"),
            ("applied", "pause_low_priority"),
        ]
        assert cam.max_fps == 25 and logger.max_fps is not None and cam.model.variant.id == "int8-onnx" and logger.paused
        assert "logger" not in g.events[2].detail  # the logger already runs the lightest variant
        for t in range(10, 60, 1):
            clock.t = t
            g.step()
        assert kinds(g, "undone") == [("undone", "pause_low_priority"), ("undone", "lighter_variant"), ("undone", "lower_rate")]
        assert g.state is N and g.applied == () and not logger.paused and cam.model is fp32 and cam.max_fps == 50
        assert logger.max_fps is None
        # energy per inference from real results: mean power x mean busy time
        with out.lock:
            results = list(out.results)
        for fr in results:
            energy_sink(fr)
        busy = np.mean([r.result.timings.total_ms / 1000 for r in results])
        g.step(snap(60, 6.0))
        assert g.energy_per_inference_j == pytest.approx(6.0 * busy)
    finally:
        close_all(cam, logger)


# ----------------------------------------------------------------------------------------------
# selection.lighter_variants

ORT = BackendStatus("onnxruntime", True, "onnxruntime", "1.x")
LRT = BackendStatus("litert", True, "ai-edge-litert", "2.x")
NO_LRT = BackendStatus("litert", False, detail="not installed")
BOTH = {"onnxruntime": ORT, "litert": LRT}


def manifest(*variants: dict[str, Any]) -> Manifest:
    return Manifest.from_dict(
        {
            "schema": 1, "name": "m", "version": "1", "task": "raw",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4]}],
            "variants": [{"file": f"{v['id']}.bin", "sha256": "a" * 64, **v} for v in variants],
        }  # fmt: skip
    )


def V(vid: str, backend: str, precision: str, size: int, cosine: float | None = None, **kw: Any) -> dict[str, Any]:
    quality = {"quality": {"cosine": cosine}} if cosine else {}
    return {"id": vid, "backend": backend, "precision": precision, "size": size, **quality, **kw}


M = manifest(
    V("fp32-onnx", "onnxruntime", "fp32", 4_000_000, reference=True),
    V("fp16-onnx", "onnxruntime", "fp16", 2_000_000, 0.9999),
    V("int8-onnx", "onnxruntime", "int8", 1_000_000, 0.999),
    V("int8-tfl", "litert", "int8", 1_100_000, 0.998),
    V("int4-onnx", "onnxruntime", "int4", 600_000, 0.95),
    V("fp32-tfl", "litert", "fp32", 4_100_000, 1.0),
)


def test_lighter_variants_on_the_demo_package() -> None:
    m = ModelPackage.open(edge_sdk.demo_package_path()).manifest
    assert {v.id: v.precision for v in m.variants} == {"fp32-onnx": "fp32", "int8-onnx": "int8", "fp32-tflite": "fp32"}
    prof = load_profile("generic-x86_64")
    assert lighter_variants(m, "fp32-onnx", prof) == ["int8-onnx"]
    assert lighter_variants(m, "fp32-tflite", prof) == ["int8-onnx"]  # fp32-onnx: the same precision is no lighter
    assert lighter_variants(m, "int8-onnx", prof) == []
    assert lighter_variants(m, "fp32-onnx", prof, {"onnxruntime": BackendStatus("onnxruntime", False)}) == []
    with pytest.raises(SelectionError, match="'fp8' is not in package"):
        lighter_variants(m, "fp8", prof)


@pytest.mark.parametrize(
    "profile,backends,kw,current,want",
    [
        ("raspberry-pi-5", BOTH, {}, "fp32-onnx", ["fp16-onnx", "int8-tfl", "int8-onnx", "int4-onnx"]),  # litert first on the Pi
        ("raspberry-pi-5", BOTH, {}, "fp32-tfl", ["fp16-onnx", "int8-tfl", "int8-onnx", "int4-onnx"]),
        ("raspberry-pi-5", BOTH, {}, "fp16-onnx", ["int8-tfl", "int8-onnx", "int4-onnx"]),
        ("raspberry-pi-5", BOTH, {}, "int8-onnx", ["int4-onnx"]),
        ("raspberry-pi-5", BOTH, {}, "int4-onnx", []),
        ("jetson-orin-nano", BOTH, {}, "fp32-onnx", ["fp16-onnx", "int8-onnx", "int8-tfl"]),  # no int4 in the profile
        ("generic-x86_64", BOTH, {}, "fp32-onnx", ["int8-onnx", "int8-tfl"]),  # no fp16 on a generic x86 CPU
        ("raspberry-pi-5", {"onnxruntime": ORT, "litert": NO_LRT}, {}, "fp32-onnx", ["fp16-onnx", "int8-onnx", "int4-onnx"]),
        ("raspberry-pi-5", BOTH, {"min_cosine": 0.9995}, "fp32-onnx", ["fp16-onnx"]),  # the quality gate
        ("raspberry-pi-5", BOTH, {"memory_budget_mb": 2.5}, "fp32-onnx", ["int8-tfl", "int8-onnx", "int4-onnx"]),  # fp16 needs ~3.8 MiB
    ],
)
def test_lighter_variants_order_and_eligibility(profile, backends, kw, current, want) -> None:
    assert lighter_variants(M, current, load_profile(profile), backends, **kw) == want


def test_lighter_variants_skip_a_failed_gate_and_one_measured_slower_than_the_reference() -> None:
    pi5 = load_profile("raspberry-pi-5")
    def bench(lat: float, ref: float) -> list[dict[str, Any]]:
        return [{"profile": "raspberry-pi-5", "latency_ms": lat, "threads": 4, "batch": 1, "reference_latency_ms": ref}]

    m = manifest(
        V("fp32", "onnxruntime", "fp32", 4_000_000, reference=True),
        V("fp16", "onnxruntime", "fp16", 2_000_000, 0.9999, gate={"passed": False, "failures": ["cosine"], "forced": True}),
        V("int8", "onnxruntime", "int8", 1_000_000, 0.999, benchmarks=bench(12.0, 10.0)),  # slower than fp32 here
        V("int4", "onnxruntime", "int4", 600_000, 0.95),
    )
    assert lighter_variants(m, "fp32", pi5, BOTH) == ["int4"]
    other = load_profile("jetson-orin-nano")  # the measurement was on another profile: not used
    assert lighter_variants(m, "fp32", other, BOTH) == ["int8"]


def test_lighter_variants_by_measured_latency_when_every_variant_has_one() -> None:
    pi5 = load_profile("raspberry-pi-5")
    bench = lambda lat: [{"profile": "raspberry-pi-5", "latency_ms": lat, "threads": 4, "batch": 1}]  # noqa: E731
    m = manifest(
        V("fp32", "onnxruntime", "fp32", 4_000_000, reference=True, benchmarks=bench(10.0)),
        V("fp16", "onnxruntime", "fp16", 2_000_000, 0.9999, benchmarks=bench(4.0)),
        V("int8", "onnxruntime", "int8", 1_000_000, 0.999, benchmarks=bench(6.0)),  # fewer bits, but slower than fp16 here
        V("int4", "onnxruntime", "int4", 600_000, 0.95, benchmarks=bench(9.9)),  # within the noise margin of fp32
    )
    assert lighter_variants(m, "fp32", pi5, BOTH) == ["int8", "fp16"]  # mildest first: slowest of the faster ones
    assert lighter_variants(m, "int8", pi5, BOTH) == ["fp16"]
    assert lighter_variants(m, "fp16", pi5, BOTH) == []
