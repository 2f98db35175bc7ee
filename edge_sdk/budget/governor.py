"""The budget governor: temperature and power in, NORMAL / CONSTRAINED / CRITICAL out, and an
ordered ladder of actions on the pipelines that it takes and gives back.

::

    from edge_sdk.budget.governor import Budget, Governor
    from edge_sdk.budget.sensors import SensorReader

    profile = model.detection.profile
    budget = Budget.from_profile(profile)                   # soft = warn_c, hard = critical_c, power = budget_w
    cam = VisionPipeline(model, "csi://0", sinks=[...])
    logger = VisionPipeline(model, "v4l2:///dev/video1", PipelineOptions(priority="low"))
    with Governor(SensorReader(profile, "/").read, budget, pipelines=[cam, logger]) as gov:
        gov.subscribe(print)                                # every transition and action, with its reason
        logger.start()
        cam.run()

State machine (one decision per sample; ``step()``)
---------------------------------------------------

Evidence from one snapshot (``T`` = ``snapshot.temp_c``, ``P`` = the mean of the known
``board_power_w`` samples in the last ``power_window_s``, ``B`` = ``power_budget_w``):

- CRITICAL evidence: ``T >= hard_c``, or the firmware's throttled flags are active now
  (``snapshot.throttled.any_now``: under-voltage, frequency capped, throttled, soft temperature
  limit).
- CONSTRAINED evidence: ``T >= soft_c``, or ``P > B``.
- Unknown readings (``T`` is None, or no power sample in the window while a power budget is set)
  follow ``unknown_policy``: "degrade" counts the unknown as CONSTRAINED evidence (at least one
  step up from NORMAL, never more: an unknown reading alone does not walk the ladder further,
  and nothing steps down while it lasts); "hold" counts it as no evidence either way (known
  readings may still raise the state; nothing steps down while a reading is unknown); "ignore"
  treats it as within limits (the state follows the readings that are known).

Going up is immediate: the sample that crosses a limit changes the state (NORMAL may go straight
to CRITICAL), and the ladder reacts in the same ``step()``. With the sampling thread that is
within two sample intervals of the crossing (one to the next sample, one for the step).

Going down is one level at a time and needs both:

- the readings back under the limit by the hysteresis: from CRITICAL ``T <= hard_c -
  hysteresis_c`` and no throttled flag now; from CONSTRAINED ``T <= soft_c - hysteresis_c``,
  ``P <= B * POWER_RELEASE`` (90 % of the budget: the power hysteresis) and no flag;
- at least ``min_dwell_s`` in the current state.

So a temperature that oscillates around a limit by less than ``hysteresis_c`` causes one
transition, not one per sample.

The ladder
----------

An ordered list of :class:`Action` (default: :class:`LowerRate` -> :class:`LighterVariant` ->
:class:`Offload` -> :class:`PauseLowPriority`). Applying a step walks forward from the step after
the last one applied; a step that raises :class:`ActionUnavailable` is recorded ("skipped"), one
that a veto callback refuses is recorded ("vetoed"), one that raises anything else is recorded
("failed"); in each case the next step is tried. Rules (``min_dwell_s`` is also the ladder's
period: the time since the last ladder change, apply or undo, must reach it):

- entering CONSTRAINED from NORMAL applies one step at once; while CONSTRAINED and the known
  readings are still at or over the soft limit (``T >= soft_c`` or ``P > B``), one more step per
  dwell period; while CONSTRAINED and the known readings are under it (no unknown reading), one
  step is undone per dwell period, down to one step (so the ladder settles on the fewest steps
  that keep the device under the soft limit);
- entering CRITICAL applies every step not in effect at once, in ladder order; while CRITICAL
  and still at CRITICAL evidence, the steps not in effect (skipped, vetoed, failed) are tried
  again once per dwell period; nothing is undone in CRITICAL;
- in NORMAL, one step is undone per dwell period, newest first, until none is left (not while a
  reading is unknown, unless ``unknown_policy`` is "ignore").

Skipped, vetoed and failed steps are tried again at the next application (a remote may have come
up, a veto may have changed its mind); in CONSTRAINED only the steps after the last one in effect
are tried, so an action inserted before it is reached in CRITICAL or after the steps above it have
been undone. Undo is always newest first (the reverse of the order the steps were applied in);
``restore()`` undoes every step at once (e.g. at shutdown; ``stop()`` leaves them in effect).

Events and telemetry
--------------------

Every transition and every action applied / undone / skipped / vetoed / failed is a
:class:`GovernorEvent` with the reading that caused it, kept in ``events`` (the last
``max_events``) and passed to ``subscribe`` callbacks on the thread that ran ``step()``.
``record_inference(busy_s)`` (or ``inference_sink()`` as a pipeline sink) feeds the energy
estimate: ``energy_per_inference_j`` = mean board power over the power window x mean busy time per
inference in that window (an upper bound: the board's idle power during the busy time is counted
too), None when the power is unknown. ``telemetry()`` is one dict for an exporter.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .._listeners import Listeners
from ..errors import OptionsError, OptionsTypeError
from ..telemetry.core import Provenance, Sample, open_provenances
from .actions import (
    Action,
    ActionContext,
    ActionUnavailable,
    LighterVariant,
    LowerRate,
    Offload,
    PauseLowPriority,
    SwappableModel,
    default_ladder,
)
from .types import GovernorState, SensorSnapshot, finite_number

if TYPE_CHECKING:  # pragma: no cover
    from ..profiles import DeviceProfile

__all__ = [
    "EVENT_KINDS",
    "POWER_RELEASE",
    "UNKNOWN_POLICIES",
    "UNMEASURED_POWER_SENSORS",
    "Action",
    "ActionContext",
    "ActionUnavailable",
    "Budget",
    "Governor",
    "GovernorEvent",
    "GovernorState",
    "LighterVariant",
    "LowerRate",
    "Offload",
    "PauseLowPriority",
    "default_ladder",
]

_log = logging.getLogger(__name__)

UNKNOWN_POLICIES = ("degrade", "hold", "ignore")
#: Profile power sensors that give no watts: a profile's budget_w is not enforced with them.
UNMEASURED_POWER_SENSORS = ("none", "pi-volts")
#: Leaving CONSTRAINED for power needs the window mean at or under this fraction of the budget.
POWER_RELEASE = 0.9
EVENT_KINDS = ("transition", "applied", "undone", "skipped", "vetoed", "failed", "read_error")
_INFERENCE_HISTORY = 100_000  # bound on the inference samples kept for the energy window


# ----------------------------------------------------------------------------------------------
# budget and state


@dataclass(frozen=True)
class Budget:
    """Limits the governor keeps, validated on construction (ValueError naming the field).

    ``soft_c``: CONSTRAINED at or above (the profile's ``warn_c``). ``hard_c``: CRITICAL at or
    above (``critical_c``); ``soft_c < hard_c``. ``hysteresis_c`` (>= 0): how far under a limit the
    temperature must fall before the state steps down. ``min_dwell_s`` (>= 0): the least time in a
    state before stepping down, and the ladder's period. ``power_budget_w``: board watts (> 0), or
    None for no power budget; compared with the mean over ``power_window_s`` (> 0).
    ``sample_interval_s`` (> 0): the sampling thread's period. ``unknown_policy``: "degrade",
    "hold" or "ignore" (see the module docs)."""

    soft_c: float
    hard_c: float
    hysteresis_c: float = 5.0
    min_dwell_s: float = 10.0
    power_budget_w: float | None = None
    power_window_s: float = 10.0
    sample_interval_s: float = 1.0
    unknown_policy: str = "degrade"

    def __post_init__(self) -> None:
        for name in ("soft_c", "hard_c", "hysteresis_c", "min_dwell_s", "power_window_s", "sample_interval_s"):
            object.__setattr__(self, name, finite_number(name, getattr(self, name)))
        if not self.soft_c < self.hard_c:
            raise OptionsError(f"soft_c: expected soft_c < hard_c ({self.hard_c}), got {self.soft_c}")
        if self.hysteresis_c < 0:
            raise OptionsError(f"hysteresis_c: expected >= 0, got {self.hysteresis_c}")
        if self.min_dwell_s < 0:
            raise OptionsError(f"min_dwell_s: expected >= 0, got {self.min_dwell_s}")
        for name in ("power_window_s", "sample_interval_s"):
            if getattr(self, name) <= 0:
                raise OptionsError(f"{name}: expected > 0 seconds, got {getattr(self, name)}")
        if self.power_budget_w is not None:
            w = finite_number("power_budget_w", self.power_budget_w)
            if w <= 0:
                raise OptionsError(f"power_budget_w: expected watts > 0 or None (no budget), got {w}")
            object.__setattr__(self, "power_budget_w", w)
        if self.unknown_policy not in UNKNOWN_POLICIES:
            raise OptionsError(f"unknown_policy: expected one of {UNKNOWN_POLICIES}, got {self.unknown_policy!r}")

    @classmethod
    def from_profile(cls, profile: "DeviceProfile", **overrides: Any) -> "Budget":
        """``soft_c`` = ``thermal.warn_c``, ``hard_c`` = ``thermal.critical_c``, ``power_budget_w``
        = ``power.budget_w`` -- None when it is 0 (no budget known) or when the profile's power
        sensor cannot measure watts (``"none"``; ``"pi-volts"``: a Pi 4 reads voltages only, so
        its 15 W supply rating is not a budget anything could check, and "degrade" on a power
        reading that can never come would hold the board CONSTRAINED for ever). Keyword
        overrides win."""
        measurable = profile.power.sensor not in UNMEASURED_POWER_SENSORS
        base: dict[str, Any] = {
            "soft_c": profile.thermal.warn_c,
            "hard_c": profile.thermal.critical_c,
            "power_budget_w": (profile.power.budget_w or None) if measurable else None,
        }
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        """Every field, by name."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class GovernorEvent:
    """One thing the governor did. ``kind``: one of EVENT_KINDS. ``state``: the state after it.
    ``action``: the action's name (None for transitions and read errors). ``reason``: why, with
    the reading (e.g. "temp 81.0 C >= soft 80.0 C"). ``detail``: what changed (e.g. "normal ->
    constrained", "cam: 30 -> 15 fps"). ``timestamp_ms``: the governor's clock."""

    timestamp_ms: float
    kind: str
    state: GovernorState
    action: str | None
    reason: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the event (the state as its string value)."""
        return {
            "timestamp_ms": self.timestamp_ms,
            "kind": self.kind,
            "state": self.state.value,
            "action": self.action,
            "reason": self.reason,
            "detail": self.detail,
        }


# ----------------------------------------------------------------------------------------------
# actions


# ----------------------------------------------------------------------------------------------
# the governor


@dataclass(frozen=True)
class _Assessment:
    hot: int  # evidence level with the unknown policy applied: 0, 1 (CONSTRAINED), 2 (CRITICAL)
    hot_known: int  # the same from known readings only
    unknown: bool  # a reading the budget needs is unknown
    cool_from: Mapping[int, bool]  # level -> the readings allow stepping down from it
    reason: str  # why it is hot (the limits crossed), or the reading
    reading: str  # the reading in a few words


class Governor:
    """Samples ``read()``, keeps ``budget`` by the state machine and ladder of the module docs.

    ``actions``: the ladder (None: :func:`default_ladder` over ``pipelines``, with ``loader`` and
    ``offload``). ``clock``: seconds, monotonic (tests pass a fake one; the sampling thread's
    pacing uses the real one). ``max_events``: how many events ``events`` keeps."""

    def __init__(
        self,
        read: Callable[[], SensorSnapshot],
        budget: Budget,
        actions: Sequence[Action] | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        pipelines: Any = (),
        loader: Callable[[SwappableModel, str], SwappableModel] | None = None,
        offload: Callable[[bool], Any] | None = None,
        max_events: int = 1000,
    ) -> None:
        if not isinstance(budget, Budget):
            raise OptionsTypeError(f"budget: expected a Budget, got {type(budget).__name__}")
        self._read = read
        self.budget = budget
        self._clock = clock
        acts = list(default_ladder(pipelines, loader=loader, offload=offload) if actions is None else actions)
        for a in acts:
            self._check_action(a)
        self._actions: list[Action] = acts
        self._applied: list[Action] = []
        self._step_lock = threading.RLock()
        self._state = GovernorState.NORMAL
        t0 = clock()
        self._state_since = t0
        self._last_ladder = t0
        self._last: SensorSnapshot | None = None
        self._last_assessment: _Assessment | None = None
        self._samples = 0
        self._power: deque[tuple[float, float]] = deque()  # (clock s, watts) in the window
        self._power_lock = threading.Lock()
        self._events: deque[GovernorEvent] = deque(maxlen=max_events)
        self._events_lock = threading.Lock()  # events are read from other threads while step() appends
        self._counts: Counter[str] = Counter()
        self._action_counts: Counter[tuple[str, str]] = Counter()  # (kind, action) -> events
        self._transitions: Counter[tuple[str, str]] = Counter()  # (from state, to state) -> transitions
        self._subscribers: Listeners[GovernorEvent] = Listeners("governor")
        self._vetoes: list[Callable[[str, GovernorState, SensorSnapshot | None], bool]] = []
        self._infer_lock = threading.Lock()
        self._inferences: deque[tuple[float, float]] = deque(maxlen=_INFERENCE_HISTORY)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- configuration -----------------------------------------------------------------------------

    @staticmethod
    def _check_action(a: Any) -> None:
        if not (isinstance(getattr(a, "name", None), str) and callable(getattr(a, "apply", None)) and callable(getattr(a, "undo", None))):
            raise OptionsTypeError(f"action: expected an object with name, apply(ctx) and undo(ctx), got {a!r}")

    @property
    def actions(self) -> tuple[Action, ...]:
        """The ladder, in order."""
        return tuple(self._actions)

    def insert_action(self, index: int, action: Action) -> None:
        """Put ``action`` into the ladder at ``index`` (list.insert semantics)."""
        self._check_action(action)
        with self._step_lock:
            self._actions.insert(index, action)

    def subscribe(self, callback: Callable[[GovernorEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event (on the thread running ``step``; keep it quick,
        do not call ``step`` from it; exceptions are logged and ignored). Returns an unsubscribe."""
        return self._subscribers.add(callback)

    def veto(self, callback: Callable[[str, GovernorState, SensorSnapshot | None], bool]) -> Callable[[], None]:
        """Ask ``callback(action_name, state, snapshot)`` before applying a step; True vetoes it
        (recorded, the next step is tried). Undo is never vetoed. Returns a function that removes
        the veto. A veto callback that raises does not veto (logged)."""
        self._vetoes.append(callback)
        return lambda: self._vetoes.remove(callback) if callback in self._vetoes else None

    # -- what it knows --------------------------------------------------------------------------

    @property
    def state(self) -> GovernorState:
        """The current state (NORMAL, CONSTRAINED or CRITICAL)."""
        return self._state

    @property
    def applied(self) -> tuple[Action, ...]:
        """The actions in effect, oldest first."""
        return tuple(self._applied)

    @property
    def events(self) -> tuple[GovernorEvent, ...]:
        """The last ``max_events`` events, oldest first."""
        with self._events_lock:
            return tuple(self._events)

    @property
    def last_snapshot(self) -> SensorSnapshot | None:
        """The sensor snapshot of the latest tick (None before the first)."""
        return self._last

    def power_mean_w(self) -> float | None:
        """Mean of the known board power samples in the last ``power_window_s``; None if none."""
        self._prune_power(self._clock())
        return self._mean_power()

    def record_inference(self, busy_s: float) -> None:
        """Count one inference that kept the device busy ``busy_s`` seconds (cheap; any thread)."""
        if busy_s >= 0 and math.isfinite(busy_s):
            with self._infer_lock:
                self._inferences.append((self._clock(), float(busy_s)))

    def inference_sink(self) -> Callable[[Any], None]:
        """A pipeline sink that feeds :meth:`record_inference` with each FrameResult's ``result.timings.total_ms``."""
        return lambda fr: self.record_inference(fr.result.timings.total_ms / 1000.0)

    @property
    def energy_per_inference_j(self) -> float | None:
        """Mean board power over the window x mean busy seconds per inference in the window;
        None when the power is unknown or no inference was recorded in the window."""
        power = self.power_mean_w()
        if power is None:
            return None
        since = self._clock() - self.budget.power_window_s
        with self._infer_lock:
            while self._inferences and self._inferences[0][0] < since:
                self._inferences.popleft()
            busy = [b for _, b in self._inferences]
        return power * (sum(busy) / len(busy)) if busy else None

    def telemetry(self, last_events: int = 10) -> dict[str, Any]:
        """State, readings, energy, counts and the last events as one JSON-ready dict. Does not
        wait for a ``step()`` in progress (an exporter must not stall behind a model load)."""
        snap, state, since, a = self._last, self._state, self._state_since, self._last_assessment
        with self._events_lock:
            counts = {k: self._counts.get(k, 0) for k in EVENT_KINDS}
            action_counts = [{"kind": k, "action": a, "count": n} for (k, a), n in sorted(self._action_counts.items())]
            transitions = [{"from": f, "to": t, "count": n} for (f, t), n in sorted(self._transitions.items())]
            events = list(self._events)[-last_events:] if last_events > 0 else []
        return {
            "state": state.value,
            "state_level": state.level,
            "state_for_s": self._clock() - since,
            "reading": None if a is None else a.reading,
            "temp_c": None if snap is None else snap.temp_c,
            "power_w": None if snap is None else snap.board_power_w,
            "power_mean_w": self.power_mean_w(),
            "energy_per_inference_j": self.energy_per_inference_j,
            "soft_c": self.budget.soft_c,
            "hard_c": self.budget.hard_c,
            "power_budget_w": self.budget.power_budget_w,
            "samples": self._samples,
            "applied": [x.name for x in tuple(self._applied)],
            "counts": counts,
            "action_counts": action_counts,
            "transitions": transitions,
            "last_events": [e.to_dict() for e in events],
        }

    # -- telemetry: edge_sdk.telemetry Registry.track / EventLog.watch --------------------------------

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "governor" (one per registry)."""
        return "governor", name or "governor"

    def telemetry_samples(self, label: str = "governor") -> list[Sample]:
        """Prometheus samples: the state, the readings of the last sample (every temperature
        sensor and power rail), the power window, energy per inference, the ladder steps in
        effect, the count of events by kind and of transitions by from/to state."""
        t = self.telemetry(last_events=0)
        snap = self.last_snapshot
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
        for a in self.actions:
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

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Sequence[Any] | None = None) -> Callable[[], None]:
        """``EventLog.watch``: every event, carrying the provenance of ``models`` (default: every
        model open when the event happens). Returns the unsubscribe."""
        fixed = None if models is None else [m if isinstance(m, Provenance) else m.provenance for m in models]

        def on_event(ev: GovernorEvent) -> None:
            emit(
                "governor", ev.kind, state=ev.state.value, action=ev.action, reason=ev.reason, detail=ev.detail,
                governor_ms=ev.timestamp_ms, models=fixed if fixed is not None else open_provenances(),
            )  # fmt: skip

        return self.subscribe(on_event)

    # -- deciding ---------------------------------------------------------------------------------

    def step(self, snapshot: SensorSnapshot | None = None) -> GovernorState:
        """One sample and decision: read (unless ``snapshot`` is given), update the state, move
        the ladder. Returns the state. Thread-safe (steps run one at a time)."""
        with self._step_lock:
            now = self._clock()
            if snapshot is None:
                try:
                    snapshot = self._read()
                except Exception as e:
                    why = f"{type(e).__name__}: {e}"
                    self._emit(now, "read_error", None, f"sensor read failed: {why}")
                    snapshot = SensorSnapshot(timestamp_ms=now * 1000.0, temp_c=None, unknown={"read": why})
            self._last = snapshot
            self._samples += 1
            if snapshot.board_power_w is not None and math.isfinite(snapshot.board_power_w):
                with self._power_lock:
                    self._power.append((now, float(snapshot.board_power_w)))
            self._prune_power(now)
            a = self._assess(snapshot)
            self._last_assessment = a
            prev = self._state
            new = self._next_state(prev, a, now)
            if new is not prev:
                held = now - self._state_since
                self._state, self._state_since = new, now
                with self._events_lock:
                    self._transitions[(prev.value, new.value)] += 1
                why = a.reason if new.level > prev.level else f"{a.reading}: {self._release_rule(prev)}, after {held:.1f} s in {prev.value}"
                self._emit(now, "transition", None, why, f"{prev.value} -> {new.value}")
            self._move_ladder(prev, new, a, snapshot, now)
            return self._state

    def _release_rule(self, left: GovernorState) -> str:
        b = self.budget
        if left is GovernorState.CRITICAL:
            return f"temp <= {b.hard_c:g} - {b.hysteresis_c:g} C and no throttling"
        power = f", mean power <= {POWER_RELEASE:g} x {b.power_budget_w:g} W" if b.power_budget_w is not None else ""
        return f"temp <= {b.soft_c:g} - {b.hysteresis_c:g} C{power}"

    def _prune_power(self, now: float) -> None:
        since = now - self.budget.power_window_s
        with self._power_lock:
            while self._power and self._power[0][0] <= since:
                self._power.popleft()

    def _mean_power(self) -> float | None:
        with self._power_lock:
            return sum(w for _, w in self._power) / len(self._power) if self._power else None

    def _assess(self, s: SensorSnapshot) -> _Assessment:
        b = self.budget
        ignore = b.unknown_policy == "ignore"
        hot, why, unknown = 0, [], []
        reading = []
        t = s.temp_c if s.temp_c is not None and math.isfinite(s.temp_c) else None
        if t is None:
            hint = "; ".join(f"{k}: {v}" for k, v in s.unknown.items())
            unknown.append("temperature unknown" + (f" ({hint})" if hint else ""))
            reading.append("temp unknown")
        else:
            reading.append(f"temp {t:.1f} C")
            if t >= b.hard_c:
                hot = 2
                why.append(f"temp {t:.1f} C >= hard limit {b.hard_c:g} C")
            elif t >= b.soft_c:
                hot = 1
                why.append(f"temp {t:.1f} C >= soft limit {b.soft_c:g} C")
        throttled = False
        if s.throttled is not None and s.throttled.any_now:
            throttled = True
            hot = 2
            why.append(f"firmware throttling now (throttled=0x{s.throttled.raw:x})")
        power_cool = True
        mean = self._mean_power()
        if b.power_budget_w is not None:
            if mean is None:
                unknown.append(f"board power unknown (no sample in the last {b.power_window_s:g} s)")
                reading.append("power unknown")
                power_cool = ignore
            else:
                reading.append(f"mean power {mean:.2f} W over {b.power_window_s:g} s")
                if mean > b.power_budget_w:
                    hot = max(hot, 1)
                    why.append(f"mean power {mean:.2f} W over {b.power_window_s:g} s > budget {b.power_budget_w:g} W")
                power_cool = mean <= b.power_budget_w * POWER_RELEASE
        elif mean is not None:
            reading.append(f"mean power {mean:.2f} W")
        hot_known = hot
        if unknown and b.unknown_policy == "degrade":
            hot = max(hot, 1)
        if unknown:
            why.append("; ".join(unknown) + f" (unknown_policy={b.unknown_policy})")
        def temp_ok(limit: float) -> bool:
            return (t <= limit - b.hysteresis_c) if t is not None else ignore

        cool = {
            2: temp_ok(b.hard_c) and not throttled and (hot < 2),
            1: temp_ok(b.soft_c) and power_cool and not throttled and hot == 0,
        }
        text = ", ".join(reading)
        return _Assessment(hot, hot_known, bool(unknown), cool, "; ".join(why) if why else text, text)

    def _next_state(self, cur: GovernorState, a: _Assessment, now: float) -> GovernorState:
        if a.hot > cur.level:
            return GovernorState.at_level(a.hot)  # up: at once
        if cur.level > 0 and a.cool_from[cur.level] and now - self._state_since >= self.budget.min_dwell_s:
            return GovernorState.at_level(cur.level - 1)  # down: one level, after the dwell
        return cur

    def _move_ladder(self, prev: GovernorState, new: GovernorState, a: _Assessment, snap: SensorSnapshot, now: float) -> None:
        due = now - self._last_ladder >= self.budget.min_dwell_s
        reason = f"{new.value}: {a.reason}"
        trusted = not a.unknown or self.budget.unknown_policy == "ignore"  # nothing is undone on an unknown reading
        if new.level > prev.level:
            self._escalate(new, snap, reason, now, all_steps=new is GovernorState.CRITICAL)
        elif not due:
            return
        elif new is GovernorState.CRITICAL:
            if a.hot_known >= 2 and self._remaining(all_steps=True):
                self._escalate(new, snap, reason, now, all_steps=True)
        elif new is GovernorState.CONSTRAINED:
            if a.hot_known >= 1:
                if self._remaining():
                    self._escalate(new, snap, reason, now, all_steps=False)
            elif trusted and len(self._applied) > 1:
                self._undo_last(new, snap, f"constrained, under the soft limit: {a.reading}", now)
        elif self._applied and trusted:
            self._undo_last(new, snap, f"normal: {a.reading}", now)

    def _remaining(self, all_steps: bool = False) -> list[Action]:
        """The steps to try, in ladder order: every step not in effect (``all_steps``, CRITICAL),
        else those after the last one in effect."""
        start = 0 if all_steps else max((self._actions.index(x) for x in self._applied if x in self._actions), default=-1) + 1
        return [x for x in self._actions[start:] if x not in self._applied]

    def _vetoed(self, name: str, state: GovernorState, snap: SensorSnapshot | None) -> bool:
        for v in list(self._vetoes):
            try:
                if v(name, state, snap):
                    return True
            except Exception:
                _log.exception("veto callback raised (ignored: not a veto)")
        return False

    def _escalate(self, state: GovernorState, snap: SensorSnapshot | None, reason: str, now: float, *, all_steps: bool) -> None:
        self._last_ladder = now
        ctx = ActionContext(state, snap, reason, self)
        for action in self._remaining(all_steps):
            if self._vetoed(action.name, state, snap):
                self._emit(now, "vetoed", action.name, reason, "vetoed by the application")
                continue
            try:
                detail = action.apply(ctx)
            except ActionUnavailable as e:
                self._emit(now, "skipped", action.name, reason, e.reason)
                continue
            except Exception as e:
                _log.exception("action %s failed to apply", action.name)
                self._emit(now, "failed", action.name, reason, f"apply raised {type(e).__name__}: {e}")
                continue
            self._applied.append(action)
            self._emit(now, "applied", action.name, reason, str(detail or ""))
            if not all_steps:
                return

    def _undo_last(self, state: GovernorState, snap: SensorSnapshot | None, reason: str, now: float) -> None:
        self._last_ladder = now
        action = self._applied.pop()
        try:
            detail = action.undo(ActionContext(state, snap, reason, self))
        except Exception as e:
            _log.exception("action %s failed to undo", action.name)
            self._emit(now, "failed", action.name, reason, f"undo raised {type(e).__name__}: {e}")
            return
        self._emit(now, "undone", action.name, reason, str(detail or ""))

    def restore(self, reason: str = "restore() called") -> None:
        """Undo every action in effect, newest first (e.g. before shutting down). The state is
        kept; the next ``step`` decides again."""
        with self._step_lock:
            now = self._clock()
            while self._applied:
                self._undo_last(self._state, self._last, reason, now)

    def _emit(self, now: float, kind: str, action: str | None, reason: str, detail: str = "") -> None:
        ev = GovernorEvent(now * 1000.0, kind, self._state, action, reason, detail)
        with self._events_lock:
            self._events.append(ev)
            self._counts[kind] += 1
            if action is not None:
                self._action_counts[(kind, action)] += 1
        self._subscribers.emit(ev)

    # -- the sampling thread ----------------------------------------------------------------------

    def start(self) -> "Governor":
        """Sample every ``budget.sample_interval_s`` on a daemon thread (the first sample at once)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("governor is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="edge-sdk-governor", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        interval = self.budget.sample_interval_s
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # step() records its own failures; this is a bug guard
                _log.exception("governor step failed")
            due += interval
            delay = due - time.monotonic()
            if delay < 0:  # fell behind (a slow read or action): no burst to catch up
                due, delay = time.monotonic(), 0.0
            if self._stop.wait(delay):
                return

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the sampling thread and wait for it (default: up to 5 s or 3 intervals); True when
        it has ended. Actions in effect stay in effect (see :meth:`restore`)."""
        self._stop.set()
        t = self._thread
        if t is None:
            return True
        t.join(timeout if timeout is not None else max(5.0, 3 * self.budget.sample_interval_s))
        return not t.is_alive()

    @property
    def running(self) -> bool:
        """True while the governor's background thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Governor":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Governor({self._state.value}, applied={[a.name for a in self._applied]}, budget={self.budget})"
