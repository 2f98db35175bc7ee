"""On-device quality monitoring: sampled rolling statistics against the reference, drift
indicators with hysteresis, events and Prometheus samples. No input data leaves the monitor:
it keeps one number per summary per sampled row, and reports only statistics.

    monitor = QualityMonitor.for_model(model, sample_every=10)   # the package's reference_stats.json
    monitor.subscribe(print)                                       # QualityEvent on every state change
    r = model.predict_image(frame)                                 # observed by the monitor (every 10th sampled)
    monitor.status()                                               # PSI / KS per summary, rates, states

Cost: a request that is not sampled costs one counter increment (``next()`` on an
``itertools.count``, atomic under the GIL); a sampled one costs O(input size) numpy (the
summaries of :class:`~edge_sdk.package.reference_stats.Extractor`) plus a ring-buffer write; every
``evaluate_every`` sampled rows the indicators are recomputed over the window (O(window log window)).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import numpy as np

from .._listeners import Listeners
from ..errors import OptionsError
from ..package.reference_stats import Extractor, ReferenceStats, ReferenceStatsError, bin_index
from ..telemetry.core import Sample

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

_log = logging.getLogger(__name__)

PSI_EPS = 1e-4  # a share of 0 in a bin counts as this (the usual PSI guard against log(0))
INDICATORS = ("drift", "low_confidence", "schema")


def psi(expected: ArrayLike, actual: ArrayLike, eps: float = PSI_EPS) -> float:
    """Population stability index of two share vectors over the same bins:
    ``sum((a - e) * ln(a / e))`` with shares under ``eps`` raised to ``eps``."""
    e = np.maximum(np.asarray(expected, np.float64), eps)
    a = np.maximum(np.asarray(actual, np.float64), eps)
    return float(np.sum((a - e) * np.log(a / e)))


def ks_pvalue(d: float, n: int, m: int) -> float:
    """Asymptotic two-sample Kolmogorov-Smirnov p-value of statistic ``d`` for sample sizes
    ``n`` and ``m`` (Stephens' small-sample correction; numpy only, no scipy)."""
    if d <= 0:
        return 1.0
    en = math.sqrt(n * m / (n + m))
    lam = (en + 0.12 + 0.11 / en) * d
    k = np.arange(1, 101)
    q = 2.0 * np.sum((-1.0) ** (k - 1) * np.exp(-2.0 * k * k * lam * lam))
    return float(min(1.0, max(0.0, q)))


def ks_statistic(values: np.ndarray, cdf_x: np.ndarray, cdf_p: np.ndarray) -> float:
    """sup |F_window - F_reference| with F_reference given by (cdf_x, cdf_p), linear between points."""
    v = np.sort(np.asarray(values, np.float64))
    if v.size == 0:
        return 0.0
    pts = np.union1d(v, cdf_x)
    fr = np.interp(pts, cdf_x, cdf_p, left=0.0, right=1.0)  # continuous except the jump at cdf_x[0]
    fr_left = np.where(pts == cdf_x[0], 0.0, fr)
    d_right = np.abs(np.searchsorted(v, pts, side="right") / v.size - fr)
    d_left = np.abs(np.searchsorted(v, pts, side="left") / v.size - fr_left)  # the left limits: sup over each gap
    return float(max(d_right.max(), d_left.max()))


def _count_value(counter: "itertools.count[int]") -> int:
    """How many times ``next`` was called on ``counter`` (started at 0): ``itertools.count`` is the
    hot paths' lock-free request counter (``next`` is atomic under the GIL) and has no read, but its
    repr carries the next value."""
    return int(repr(counter)[6:-1])


@dataclass(frozen=True)
class MonitorThresholds:
    """When the monitor's indicators enter and leave their alarm state.

    drift: a summary's PSI >= ``psi_enter`` or its KS p-value < ``ks_alpha`` / (number of
    summaries) (Bonferroni) enters; every PSI < ``psi_exit`` and every KS p-value >=
    ``ks_exit_alpha`` leaves. ``ks``: False uses PSI alone. low_confidence: the share of sampled
    rows whose top-1 probability is under the reference's ``low_confidence`` threshold; enters at
    the reference's rate + ``low_confidence_enter``, leaves under its rate + ``low_confidence_exit``.
    schema: inputs refused by validation per request since the previous evaluation; enters at
    ``schema_enter``, leaves under ``schema_exit``. Every change needs ``consecutive`` evaluations
    in a row that agree (hysteresis: no flapping). ``min_samples``: values in the window before
    anything is evaluated (None: a full window; fewer make PSI noisy: its no-drift bias is about
    (bins - 1) / samples)."""

    psi_enter: float = 0.25
    psi_exit: float = 0.10
    ks: bool = True
    ks_alpha: float = 1e-3
    ks_exit_alpha: float = 0.05
    low_confidence_enter: float = 0.20
    low_confidence_exit: float = 0.10
    schema_enter: float = 0.05
    schema_exit: float = 0.01
    consecutive: int = 2
    min_samples: int | None = None

    def __post_init__(self) -> None:
        for a, b, what in (
            (self.psi_exit, self.psi_enter, "psi_exit < psi_enter"),
            (self.low_confidence_exit, self.low_confidence_enter, "low_confidence_exit < low_confidence_enter"),
            (self.schema_exit, self.schema_enter, "schema_exit < schema_enter"),
            (self.ks_alpha, self.ks_exit_alpha, "ks_alpha < ks_exit_alpha"),
        ):
            if not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and 0 <= a < b):
                raise OptionsError(f"MonitorThresholds: expected 0 <= {what}, got {a} and {b}")
        if not isinstance(self.consecutive, int) or self.consecutive < 1:
            raise OptionsError(f"MonitorThresholds.consecutive: expected an int >= 1, got {self.consecutive!r}")
        if self.min_samples is not None and (not isinstance(self.min_samples, int) or self.min_samples < 2):
            raise OptionsError(f"MonitorThresholds.min_samples: expected an int >= 2 or None, got {self.min_samples!r}")


class QualityEvent(NamedTuple):
    """One state change of an indicator: ``kind`` "entered" | "left"; ``indicator`` drift |
    low_confidence | schema; ``value``: what crossed (max PSI, rate); ``detail``: the summaries
    over their thresholds, e.g. ``{"image.brightness": {"psi": 0.61, "ks_p": 1e-9}}``;
    ``sampled``: rows sampled so far; ``unix_s``: when."""

    kind: str
    indicator: str
    value: float
    detail: Mapping[str, Any]
    sampled: int
    requests: int
    unix_s: float


@dataclass
class _Indicator:
    """An alarm with hysteresis: it enters when ``enter`` held, and leaves when ``calm`` held, for
    ``consecutive`` evaluations in a row (between the two thresholds nothing changes)."""

    alarm: bool = False
    streak: int = 0  # evaluations in a row that disagree with the current state
    value: float | None = None
    changes: int = 0

    def step(self, enter: bool, calm: bool, consecutive: int) -> bool:
        """One evaluation; True when the alarm state changed."""
        wants_change = (not self.alarm and enter) or (self.alarm and calm)
        self.streak = self.streak + 1 if wants_change else 0
        if self.streak < consecutive:
            return False
        self.alarm = not self.alarm
        self.streak = 0
        self.changes += 1
        return True


class QualityMonitor:
    """Sampled rolling statistics of a model's inputs and outputs against :class:`ReferenceStats`.

    ``sample_every``: observe every N-th request (deterministic), or ``rate``: each request with
    this probability (0 < rate <= 1; ``seed`` for reproducibility). ``window``: the rows kept per
    summary (a ring buffer: bounded memory). ``evaluate_every``: sampled rows between evaluations
    (default window // 4). ``thresholds``: :class:`MonitorThresholds`. ``name``: the label of its
    telemetry series (default: the model name once attached, else "model").

    Attach with ``model.attach_monitor(monitor)`` (or :meth:`for_model`): ``Model`` then calls
    :meth:`observe` after every successful call (``predict``, ``predict_image``,
    ``predict_prepared``, ``predict_batch``, streams; hence pipelines) and :meth:`schema_violation`
    for every input refused by validation."""

    def __init__(
        self,
        reference: ReferenceStats,
        *,
        sample_every: int = 1,
        rate: float | None = None,
        window: int = 256,
        evaluate_every: int | None = None,
        thresholds: MonitorThresholds | None = None,
        name: str | None = None,
        seed: int | None = None,
    ) -> None:
        if not isinstance(reference, ReferenceStats):
            raise TypeError(f"reference: expected ReferenceStats, got {type(reference).__name__}")
        if not isinstance(sample_every, int) or isinstance(sample_every, bool) or sample_every < 1:
            raise OptionsError(f"sample_every: expected an int >= 1, got {sample_every!r}")
        if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate <= 1):
            raise OptionsError(f"rate: expected a probability in (0, 1], got {rate!r}")
        if not isinstance(window, int) or window < 8:
            raise OptionsError(f"window: expected an int >= 8, got {window!r}")
        ev = evaluate_every if evaluate_every is not None else max(1, window // 4)
        if not isinstance(ev, int) or ev < 1:
            raise OptionsError(f"evaluate_every: expected an int >= 1, got {evaluate_every!r}")
        self.reference = reference
        self.sample_every = sample_every
        self.rate = rate
        self.window = window
        self.evaluate_every = ev
        self.thresholds = thresholds or MonitorThresholds()
        self.name = name
        self._rng = random.Random(seed)
        self._counter = itertools.count()
        self._requests_at_eval = 0
        self._lock = threading.Lock()
        self._ex: Extractor | None = None
        self._ring: dict[str, np.ndarray] = {}
        self._cls_ring: np.ndarray | None = None
        self._n = 0  # rows written to the rings (sampled)
        self._since_eval = 0
        self._violations = 0
        self._violations_at_eval = 0
        self._violation_types: dict[str, int] = {}
        self._errors = 0
        self._evaluations = 0
        self._ind = {k: _Indicator() for k in INDICATORS}
        self._last: dict[str, dict[str, float]] = {}
        self._low_conf_rate: float | None = None
        self._schema_rate: float | None = None
        self._listeners: Listeners[QualityEvent] = Listeners("quality monitor")
        self.events: list[QualityEvent] = []  # the last 256 events
        ms = self.thresholds.min_samples
        self._min = min(window, ms if ms is not None else window)

    # -- wiring ------------------------------------------------------------------------------

    @classmethod
    def for_model(cls, model: Any, reference: ReferenceStats | None = None, **kw: Any) -> "QualityMonitor":
        """A monitor over ``model``'s package reference stats (or ``reference``), attached to it."""
        ref = reference if reference is not None else model.reference_stats
        if ref is None:
            raise ReferenceStatsError(
                f"model {model.manifest.name}: its package has no reference_stats.json (make it with edge-convert, or pass reference=)"
            )
        kw.setdefault("name", model.manifest.name)
        m = cls(ref, **kw)
        model.attach_monitor(m)
        return m

    def bind(self, model: Any) -> None:
        """Called by ``Model.attach_monitor``: checks the reference fits the model and builds the extractor."""
        ex = Extractor.for_model(model)
        if ex.output_kind != self.reference.output_kind:
            raise ReferenceStatsError(
                f"reference stats are for a {self.reference.output_kind} model, {model.manifest.name} decodes {ex.output_kind}"
            )
        ref_inputs = set(self.reference.inputs)
        ours = set(ex.describe_inputs())
        if ref_inputs and ref_inputs != ours:
            raise ReferenceStatsError(f"reference stats describe inputs {sorted(ref_inputs)}, the model's are {sorted(ours)}")
        with self._lock:
            self._ex = ex
            if self.name is None:
                self.name = model.manifest.name

    def subscribe(self, callback: Callable[[QualityEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` on every :class:`QualityEvent` (from the thread that made the
        request which triggered the evaluation; exceptions are logged, never raised into it).
        Returns a function that unsubscribes."""
        return self._listeners.add(callback)

    # -- the hot path ------------------------------------------------------------------------

    def observe(self, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], decoded: Any = None) -> None:
        """One request (``Model`` calls this). Not sampled: a counter increment. Sampled: its
        summaries go into the window. Never raises (a failure is counted in ``errors``)."""
        n = next(self._counter)
        if self.rate is None:
            if n % self.sample_every:
                return
        elif self._rng.random() >= self.rate:
            return
        try:
            self._sample(feeds, outputs, decoded)
        except Exception:
            self._errors += 1
            _log.exception("quality monitor %s: a sampled request could not be summarised (skipped)", self.name)

    def schema_violation(self, exc: BaseException) -> None:
        """An input refused by validation (``Model`` calls this with the InputError)."""
        with self._lock:
            self._violations += 1
            t = type(exc).__name__
            self._violation_types[t] = self._violation_types.get(t, 0) + 1

    def _sample(self, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], decoded: Any) -> None:
        ex = self._ex
        if ex is None:
            raise RuntimeError("the monitor is not attached to a model (use model.attach_monitor)")
        vals = ex.inputs(feeds)
        ov, cls = ex.outputs(outputs, decoded)
        vals.update(ov)
        rows = len(next(iter(vals.values()))) if vals else 1
        evaluate = False
        with self._lock:
            w = self.window
            for k, v in vals.items():
                ring = self._ring.get(k)
                if ring is None:
                    ring = self._ring[k] = np.full(w, np.nan)
                for j in range(len(v)):
                    ring[(self._n + j) % w] = v[j]
            if cls is not None:
                if self._cls_ring is None:
                    self._cls_ring = np.full(w, -1, np.int64)
                for j in range(len(cls)):
                    self._cls_ring[(self._n + j) % w] = cls[j]
            self._n += rows
            self._since_eval += rows
            if self._since_eval >= self.evaluate_every and min(self._n, w) >= self._min:
                self._since_eval = 0
                evaluate = True
        if evaluate:
            self.evaluate()

    # -- evaluation --------------------------------------------------------------------------

    def evaluate(self) -> dict[str, Any]:
        """Recompute every indicator over the window now, update the states (with hysteresis)
        and tell listeners about changes. Returns :meth:`status`."""
        th = self.thresholds
        ref = self.reference
        with self._lock:
            n_win = min(self._n, self.window)
            rings = {k: r.copy() for k, r in self._ring.items()}
            cls_ring = None if self._cls_ring is None else self._cls_ring.copy()
            requests = self._requests()
            new_req = requests - self._requests_at_eval
            new_viol = self._violations - self._violations_at_eval
            self._requests_at_eval, self._violations_at_eval = requests, self._violations
        per: dict[str, dict[str, float]] = {}
        if n_win >= self._min:
            names = [k for k in rings if k in ref.summaries]
            for k in names:
                v = rings[k]
                v = v[np.isfinite(v)]
                if v.size < 2:
                    continue
                s = ref.summaries[k]
                counts = np.bincount(bin_index(s.edges, v), minlength=len(s.fractions))
                row = {"psi": psi(s.fractions, counts / v.size), "n": float(v.size), "mean": float(v.mean())}
                if th.ks:
                    d = ks_statistic(v, np.asarray(s.cdf_x), np.asarray(s.cdf_p))
                    row["ks"] = d
                    row["ks_p"] = ks_pvalue(d, int(v.size), s.n)
                per[k] = row
            if cls_ring is not None and ref.classes:
                c = cls_ring[cls_ring >= 0]
                if c.size:
                    k_ = max(len(ref.classes), int(c.max()) + 1)
                    exp = np.zeros(k_)
                    exp[: len(ref.classes)] = ref.classes
                    per["class"] = {"psi": psi(exp, np.bincount(c, minlength=k_) / c.size), "n": float(c.size)}
            conf = rings.get("confidence")
            if conf is not None and ref.low_confidence_rate is not None:
                cv = conf[np.isfinite(conf)]
                self._low_conf_rate = float((cv < ref.low_confidence).mean()) if cv.size else None
        self._schema_rate = new_viol / max(1, new_viol + new_req) if (new_req + new_viol) else None
        bonf = max(1, sum(1 for r in per.values() if "ks_p" in r))
        over = {k: r for k, r in per.items() if r["psi"] >= th.psi_enter or r.get("ks_p", 1.0) < th.ks_alpha / bonf}
        calm = all(r["psi"] < th.psi_exit and r.get("ks_p", 1.0) >= th.ks_exit_alpha / bonf for r in per.values())
        max_psi = max((r["psi"] for r in per.values()), default=None)
        events: list[QualityEvent] = []
        with self._lock:
            self._evaluations += 1
            self._last = per
            if per:
                events += self._step("drift", bool(over), calm, max_psi, over, requests)
            lcr, base = self._low_conf_rate, ref.low_confidence_rate
            if lcr is not None and base is not None:
                events += self._step("low_confidence", lcr >= base + th.low_confidence_enter, lcr < base + th.low_confidence_exit, lcr,
                                     {"rate": lcr, "reference_rate": base}, requests)  # fmt: skip
            sr = self._schema_rate
            if sr is not None:
                events += self._step("schema", sr >= th.schema_enter, sr < th.schema_exit, sr,
                                     {"rate": sr, "by_type": dict(self._violation_types)}, requests)  # fmt: skip
            self.events.extend(events)
            del self.events[:-256]
        for ev in events:
            self._listeners.emit(ev)
        return self.status()

    def _step(self, name: str, enter: bool, calm: bool, value: float | None, detail: Mapping[str, Any], requests: int) -> list[QualityEvent]:
        ind = self._ind[name]
        ind.value = value
        if not ind.step(enter, calm, self.thresholds.consecutive):
            return []
        det = {k: ({kk: round(vv, 6) for kk, vv in v.items()} if isinstance(v, dict) else v) for k, v in detail.items()}
        return [QualityEvent("entered" if ind.alarm else "left", name, float(value or 0.0), det, self._n, requests, time.time())]

    # -- reading -----------------------------------------------------------------------------

    def _requests(self) -> int:
        return _count_value(self._counter)

    @property
    def state(self) -> str:
        """"drift" while the drift indicator is in alarm, else "ok"."""
        return "drift" if self._ind["drift"].alarm else "ok"

    @property
    def alarms(self) -> dict[str, bool]:
        """Each indicator's alarm state."""
        return {k: v.alarm for k, v in self._ind.items()}

    @property
    def sampled(self) -> int:
        """Rows summarised so far."""
        return self._n

    @property
    def requests(self) -> int:
        """Requests observed so far (sampled or not)."""
        return self._requests()

    @property
    def errors(self) -> int:
        """Sampled requests that could not be summarised."""
        return self._errors

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot: states, rates, and per summary its PSI, KS statistic and p-value
        and window mean (next to the reference mean)."""
        with self._lock:
            per = {k: dict(v) for k, v in self._last.items()}
            for k, v in per.items():
                s = self.reference.summaries.get(k)
                if s is not None:
                    v["reference_mean"] = s.mean
            return {
                "name": self.name, "state": self.state, "alarms": self.alarms, "requests": self._requests(), "sampled": self._n,
                "evaluations": self._evaluations, "window": min(self._n, self.window), "low_confidence_rate": self._low_conf_rate,
                "reference_low_confidence_rate": self.reference.low_confidence_rate, "schema_violations": self._violations,
                "schema_violation_rate": self._schema_rate, "violations_by_type": dict(self._violation_types), "errors": self._errors,
                "summaries": per,
            }  # fmt: skip

    def samples(self) -> list[Sample]:
        """The Prometheus samples (:class:`edge_sdk.telemetry.Sample`) described at :func:`quality_samples`."""
        st = self.status()
        lab = {"model": str(st["name"] or "model")}
        out = [
            Sample("edge_sdk_quality_drift", 1.0 if st["state"] == "drift" else 0.0, "1 while the input/output drift indicator is in alarm", "gauge", lab),
            Sample("edge_sdk_quality_requests_total", st["requests"], "requests the quality monitor saw", "counter", lab),
            Sample("edge_sdk_quality_sampled_total", st["sampled"], "rows the quality monitor summarised", "counter", lab),
            Sample("edge_sdk_quality_evaluations_total", st["evaluations"], "quality evaluations", "counter", lab),
            Sample("edge_sdk_quality_low_confidence_rate", st["low_confidence_rate"], "share of sampled rows under the low-confidence threshold", "gauge", lab),
            Sample("edge_sdk_quality_schema_violations_total", st["schema_violations"], "inputs refused by validation", "counter", lab),
            Sample("edge_sdk_quality_errors_total", st["errors"], "sampled requests the monitor could not summarise", "counter", lab),
        ]  # fmt: skip
        out += [
            Sample("edge_sdk_quality_alarm", 1.0 if on else 0.0, "1 while an indicator is in alarm", "gauge", {**lab, "indicator": k})
            for k, on in st["alarms"].items()
        ]
        for k, row in st["summaries"].items():
            sl = {**lab, "summary": k}
            out.append(Sample("edge_sdk_quality_psi", row["psi"], "population stability index vs the reference, per summary", "gauge", sl))
            if "ks" in row:
                out.append(Sample("edge_sdk_quality_ks_statistic", row["ks"], "Kolmogorov-Smirnov statistic vs the reference", "gauge", sl))
                out.append(Sample("edge_sdk_quality_ks_pvalue", row["ks_p"], "Kolmogorov-Smirnov p-value vs the reference", "gauge", sl))
        return out

    # -- telemetry: edge_sdk.telemetry Registry.track / EventLog.watch --------------------------------

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "quality", label ``model`` = ``name`` (which becomes the monitor's name) or its name."""
        if name is not None:
            self.name = name
        return "quality", self.name or "model"

    def telemetry_samples(self, label: str | None = None) -> list[Sample]:
        """``Registry.track``: :meth:`samples`."""
        return self.samples()

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Any = None) -> Callable[[], None]:
        """``EventLog.watch``: alarms entered and left (drift, low_confidence, schema), label ``model``. Returns the unsubscribe."""
        return watch_quality_events(self, emit, name or self.name or "model")

    def __repr__(self) -> str:
        return f"QualityMonitor({self.name!r}, state={self.state}, sampled={self._n}, window={self.window})"


def watch_quality_events(source: Any, emit: Callable[..., Any], label: str) -> Callable[[], None]:
    """Subscribe ``emit`` (``EventLog.emit``) to the :class:`QualityEvent` s of ``source`` (a
    QualityMonitor or ShadowChecker) as "quality" events labelled ``model=label``."""

    def on_event(ev: QualityEvent) -> None:
        emit("quality", ev.kind, model=label, indicator=ev.indicator, value=ev.value, detail=ev.detail, sampled=ev.sampled, requests=ev.requests)

    detach: Callable[[], None] = source.subscribe(on_event)
    return detach


def quality_samples(monitor: QualityMonitor) -> Callable[[], list[Sample]]:
    """A telemetry collector (``Registry.add`` / ``Registry.track``) for a monitor: PSI, KS
    statistic and p-value per summary, alarm state per indicator, drift state, requests and
    sampled rows, low-confidence rate, schema violations."""
    return monitor.samples
