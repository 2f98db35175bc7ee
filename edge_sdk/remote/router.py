"""The router: local first, remote when local capacity is exceeded, and every result says where it
was served and why.

::

    local = edge_sdk.load(pkg)
    remote = remote_model(pkg, RemoteClient("https://gateway:8000", token=...), privacy=PrivacyPolicy("allowed"))
    router = Router(local, remote, RouterOptions(max_local_queue=2, latency_objective_ms=50))
    r = router.predict_image(frame, color="BGR")
    r.served_by, r.reason          # "remote", "local queue full (2 waiting, limit 2)"

Decision, per request (the first that applies):

1. no local model (``local=None``, e.g. no variant fits this device's memory: see
   :meth:`Router.load`) -> remote;
2. forced offload (:meth:`Router.set_offload`, what the budget governor's ``Offload`` step calls)
   or the attached governor is CRITICAL (``offload_on_critical``) -> remote;
3. the local queue is full: ``max_local_queue`` requests already wait for the local model -> remote;
4. the latency objective is at risk: (requests ahead + 1) x the local service time (an
   exponentially weighted mean of recent local calls) > ``latency_objective_ms`` -> remote --
   unless it is time for a probe: the local model is idle and ``probe_every`` requests were
   offloaded by the objective, or ``probe_interval_s`` passed, since the last local call; then
   this one request is served locally (trigger ``latency_probe``) to refresh the estimate;
5. otherwise local.

**The estimate.** The first ``cold_calls`` local calls (default 1: the first call imports and
warms up the runtime, OpenCV, caches) are cold: each one's time stands in for the estimate only
until the next call replaces it; the moving average starts from the first warm call. A probe's
time weighs at least half (``max(ewma_alpha, 0.5)``), so an estimate left high by a slow spell
recovers within a few probes; without probes an offloaded router would never measure local
again and could offload everything for good.

Then:

- local fails with a runtime error (not the caller's bad input: an :class:`InputError` is raised
  at once) and ``offload_on_local_error`` -> remote, reason "local failed: ...";
- remote fails (down, breaker open, privacy refuses, timeout, malformed answer) -> local, reason
  "remote failed (...); served locally" -- local keeps serving, waiting for its turn if it must;
- confidence cascade (``cascade_threshold``): a local classification whose top-1 score is under
  the threshold is sent to the remote model too (which may be a larger model of another package);
  its answer is returned, or the local one with the remote failure in the reason.

Every request ends in a result or a typed error within its deadline (``deadline_s``: waiting for
the local model is bounded by it; the remote client has its own deadline): none is lost, none
hangs. :class:`RouterError` when neither side could serve (its message has both reasons).

Telemetry: each answered request is counted by where it was served and its trigger
(:attr:`Router.requests_by_trigger`), each request sent to the remote model by the trigger that sent
it (:attr:`Router.offloads`); :func:`edge_sdk.telemetry.router_samples` exports both.
:meth:`Router.subscribe` gets a :class:`RouterEvent` for every offload and fallback (what
:class:`edge_sdk.telemetry.EventLog` logs). Triggers (:data:`TRIGGERS`): ``no_local``, ``forced``,
``governor_critical``, ``queue_full``, ``latency_objective``, ``local_error``, ``cascade`` (served
remote); ``local_first``, ``latency_probe``, ``no_remote``, ``remote_failed``,
``cascade_remote_failed`` (served locally).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

from .._listeners import Listeners
from ..errors import EdgeSDKError, InputError, OptionsError, SelectionError
from ..telemetry.core import Sample

__all__ = ["TRIGGERS", "RoutedResult", "Router", "RouterError", "RouterEvent", "RouterOptions", "RouterTimeoutError"]

#: Why a request was served where it was (the ``trigger`` of the counters and events).
TRIGGERS = (
    "no_local", "forced", "governor_critical", "queue_full", "latency_objective", "local_error", "cascade",
    "local_first", "latency_probe", "no_remote", "remote_failed", "cascade_remote_failed",
)  # fmt: skip


class RouterError(EdgeSDKError):
    """Neither the local model nor the remote one could serve the request."""


class RouterTimeoutError(RouterError):
    """The request waited for the local model past its deadline (and no remote could take it)."""


class RoutedResult(NamedTuple):
    """A model Result plus where it was served (``"local"`` or ``"remote"``) and why.
    ``local_result``: with the cascade, the local answer that was escalated."""

    result: Any
    served_by: str
    reason: str
    local_result: Any = None

    @property
    def decoded(self) -> Any:
        """The result's decoded output (classes, detections, mask or None)."""
        return self.result.decoded

    @property
    def outputs(self) -> Any:
        """The result's raw outputs by name."""
        return self.result.outputs

    @property
    def top1(self) -> Any:
        """The result's best class (classification models only)."""
        return self.result.top1


class RouterEvent(NamedTuple):
    """An offload (``kind`` "offload": served by the remote model) or a fallback ("fallback": the
    remote model failed, served locally). ``trigger``: one of TRIGGERS; ``decision``: for a
    fallback, the trigger that sent the request to the remote model. ``error``: the exception type
    that caused a fallback or an offload after a local failure. ``provenance``: of the model that
    served (or, for a fallback, will serve) the request, when it has one."""

    kind: str
    trigger: str
    served_by: str
    reason: str
    decision: str | None = None
    error: str | None = None
    provenance: Any = None


@dataclass(frozen=True)
class RouterOptions:
    """``max_local_inflight``: local calls at once (>= 1). ``max_local_queue``: requests that may
    wait for the local model before new ones are offloaded (>= 0). ``latency_objective_ms``: offload
    when the predicted local latency exceeds it (None: no objective). ``offload_on_critical``:
    offload while the attached governor is CRITICAL. ``offload_on_local_error``: retry a local
    runtime failure remotely. ``cascade_threshold``: escalate local classifications whose top-1
    score is under it (None: no cascade). ``deadline_s``: the most a request may wait for the
    local model. ``ewma_alpha``: weight of the newest local call in the service-time estimate.
    ``cold_calls``: the first local calls whose time is not averaged (each stands in until the
    next replaces it). ``probe_every`` / ``probe_interval_s``: while the objective offloads, serve
    one request locally after this many such offloads / this many seconds since the last local
    call (None: never), to refresh the estimate (module docs)."""

    max_local_inflight: int = 1
    max_local_queue: int = 2
    latency_objective_ms: float | None = None
    offload_on_critical: bool = True
    offload_on_local_error: bool = True
    cascade_threshold: float | None = None
    deadline_s: float = 30.0
    ewma_alpha: float = 0.2
    cold_calls: int = 1
    probe_every: int | None = 10
    probe_interval_s: float | None = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_local_inflight, int) or self.max_local_inflight < 1:
            raise OptionsError(f"max_local_inflight: expected an int >= 1, got {self.max_local_inflight!r}")
        if not isinstance(self.max_local_queue, int) or self.max_local_queue < 0:
            raise OptionsError(f"max_local_queue: expected an int >= 0, got {self.max_local_queue!r}")
        if self.latency_objective_ms is not None and not (math.isfinite(self.latency_objective_ms) and self.latency_objective_ms > 0):
            raise OptionsError(f"latency_objective_ms: expected a number > 0 or None, got {self.latency_objective_ms!r}")
        if self.cascade_threshold is not None and not 0.0 <= self.cascade_threshold <= 1.0:
            raise OptionsError(f"cascade_threshold: expected a score in [0, 1] or None, got {self.cascade_threshold!r}")
        if not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise OptionsError(f"deadline_s: expected a number > 0, got {self.deadline_s!r}")
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise OptionsError(f"ewma_alpha: expected a number in (0, 1], got {self.ewma_alpha!r}")
        if not isinstance(self.cold_calls, int) or isinstance(self.cold_calls, bool) or self.cold_calls < 0:
            raise OptionsError(f"cold_calls: expected an int >= 0, got {self.cold_calls!r}")
        pe = self.probe_every
        if pe is not None and (not isinstance(pe, int) or isinstance(pe, bool) or pe < 1):
            raise OptionsError(f"probe_every: expected an int >= 1 or None, got {pe!r}")
        pi = self.probe_interval_s
        if pi is not None and not (isinstance(pi, (int, float)) and math.isfinite(pi) and pi > 0):
            raise OptionsError(f"probe_interval_s: expected a number > 0 or None, got {pi!r}")


class Router:
    """Routes each request to ``local`` or ``remote`` (edge_sdk Models, or anything with the same
    ``predict`` / ``predict_image``; either may be None). ``governor``: a budget Governor whose
    CRITICAL state offloads. ``on_event(kind, detail)``: every offload decision and fallback.
    ``clock``: seconds (default ``time.perf_counter``) for the local call times and the probe
    interval, injectable for tests."""

    def __init__(
        self,
        local: Any,
        remote: Any = None,
        options: RouterOptions | None = None,
        *,
        governor: Any = None,
        on_event: Callable[[str, str], Any] | None = None,
        local_unavailable_reason: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if local is None and remote is None:
            raise ValueError("Router: expected a local model, a remote one, or both")
        self.local = local
        self.remote = remote
        self.options = opts = options or RouterOptions()
        self.governor = governor
        self._on_event = on_event
        self._no_local_reason = local_unavailable_reason or "no local model"
        self._lock = threading.Condition()
        self._inflight = 0
        self._waiting = 0
        self._service_ms: float | None = None
        self._clock = clock
        self._local_calls = 0  # successful local calls (the first cold_calls are not averaged)
        self._last_local = clock()  # when a local call last finished (or the router was made)
        self._since_local = 0  # requests the objective offloaded since then
        self._probing = False  # a probe is in flight
        self._forced = False
        self._counts: dict[str, int] = {}
        self._by_trigger: dict[tuple[str, str], int] = {}  # (served_by, trigger) -> requests
        self._offloads: dict[str, int] = {}  # trigger -> requests sent to the remote model
        self._listeners: Listeners[RouterEvent] = Listeners("router")
        self._opts = opts

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def load(cls, package: Any, remote: Any = None, options: RouterOptions | None = None, **load_kw: Any) -> "Router":
        """Load ``package`` locally (``edge_sdk.load(package, **load_kw)``); when no variant can
        run here (SelectionError: none fits the memory budget, no runtime for any), route
        everything to ``remote`` and say why."""
        from ..model import load

        try:
            local = load(package, **load_kw)
        except SelectionError as e:
            if remote is None:
                raise
            return cls(None, remote, options, local_unavailable_reason=f"no local variant: {e}")
        return cls(local, remote, options)

    # -- control ----------------------------------------------------------------------------------

    def set_offload(self, on: bool) -> str:
        """Send every request to the remote model while ``on`` (the budget governor's ``Offload``
        step: ``Offload(enable=router.set_offload)``). Without a remote model nothing changes."""
        if self.remote is None:
            from ..budget.actions import ActionUnavailable

            raise ActionUnavailable("the router has no remote model")
        with self._lock:
            self._forced = bool(on)
        return f"router offload {'on' if on else 'off'}"

    @property
    def counts(self) -> Mapping[str, int]:
        """Requests served, by ``"<where>: <reason kind>"``."""
        with self._lock:
            return dict(self._counts)

    @property
    def requests_by_trigger(self) -> Mapping[tuple[str, str], int]:
        """Requests answered, by ``(served_by, trigger)``."""
        with self._lock:
            return dict(self._by_trigger)

    @property
    def offloads(self) -> Mapping[str, int]:
        """Requests sent to the remote model (answered there or not), by trigger."""
        with self._lock:
            return dict(self._offloads)

    @property
    def local_waiting(self) -> int:
        """Requests waiting for the local model now."""
        return self._waiting

    @property
    def local_service_ms(self) -> float | None:
        """Moving average (EWMA, ``ewma_alpha``) of the local model's successful call times in ms; None before the first
        (while only cold calls were seen, the latest one's time: module docs)."""
        return self._service_ms

    # -- telemetry: edge_sdk.telemetry Registry.track / EventLog.watch --------------------------------

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "router", label ``name`` or "router"."""
        return "router", name or "router"

    def telemetry_samples(self, label: str = "router") -> list[Sample]:
        """Prometheus samples: requests by where they were served and why (``trigger``), offloads
        (requests sent to the remote model, whatever came of them) by trigger, the local queue
        and the local service-time estimate; label ``router``."""
        lab = {"router": label}
        out = [
            Sample("edge_sdk_router_requests_total", n, "requests answered, by where they were served and why", "counter",
                   {**lab, "served_by": where, "trigger": trig})
            for (where, trig), n in sorted(self.requests_by_trigger.items())
        ]  # fmt: skip
        out += [
            Sample("edge_sdk_router_offloads_total", n, "requests sent to the remote model, by trigger", "counter",
                   {**lab, "trigger": trig})
            for trig, n in sorted(self.offloads.items())
        ]  # fmt: skip
        svc = self.local_service_ms
        svc_s = None if svc is None else svc / 1e3
        out.append(Sample("edge_sdk_router_local_service_seconds", svc_s, "local service time (EWMA)", "gauge", lab))
        out.append(Sample("edge_sdk_router_local_waiting", self.local_waiting, "requests waiting for the local model", "gauge", lab))
        return out

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Any = None) -> Callable[[], None]:
        """``EventLog.watch``: offloads and fallbacks, label ``router`` (``name`` or "router"). Returns the unsubscribe."""
        label = name or "router"

        def on_event(ev: RouterEvent) -> None:
            emit(
                "router", ev.kind, router=label, trigger=ev.trigger, decision=ev.decision, served_by=ev.served_by, reason=ev.reason,
                error=ev.error, provenance=ev.provenance,
            )  # fmt: skip

        return self.subscribe(on_event)

    def subscribe(self, callback: Callable[[RouterEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for every offload and fallback (on the requesting thread; keep
        it quick; exceptions are ignored). Returns an unsubscribe function."""
        return self._listeners.add(callback)

    # -- requests ---------------------------------------------------------------------------------

    def predict(self, inputs: Any, **kw: Any) -> RoutedResult:
        """Route a ``predict(inputs, **kw)`` call to the local or remote model; returns a :class:`RoutedResult` saying where and why."""
        return self._route(lambda m: m.predict(inputs, **kw))

    def predict_image(self, image: Any, **kw: Any) -> RoutedResult:
        """Route a ``predict_image(image, **kw)`` call to the local or remote model; returns a :class:`RoutedResult` saying where and
        why."""
        return self._route(lambda m: m.predict_image(image, **kw))

    def _offload(self, trigger: str) -> None:
        with self._lock:
            self._offloads[trigger] = self._offloads.get(trigger, 0) + 1

    def _event(
        self, kind: str, detail: str, served_by: str, trigger: str, *, result: Any = None, decision: str | None = None,
        error: BaseException | None = None,
    ) -> None:  # fmt: skip
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            key = (served_by, trigger)
            self._by_trigger[key] = self._by_trigger.get(key, 0) + 1
        if self._on_event is not None:
            try:
                self._on_event(kind, detail)
            except Exception:  # an observer must not break serving
                pass
        fallback = served_by == "local" and trigger in ("remote_failed", "cascade_remote_failed")
        if self._listeners and (served_by == "remote" or fallback):
            model = self.remote if served_by == "remote" else self.local
            prov = getattr(result, "provenance", None) or getattr(model, "provenance", None)
            ev = RouterEvent("offload" if served_by == "remote" else "fallback", trigger, served_by, detail, decision,
                             None if error is None else type(error).__name__, prov)  # fmt: skip
            self._listeners.emit(ev)  # an observer must not break serving: logged, never raised

    def _decide(self) -> tuple[str, str, str]:
        """(where, why, trigger)."""
        o = self._opts
        if self.local is None:
            return "remote", self._no_local_reason, "no_local"
        if self.remote is None:
            return "local", "no remote configured", "no_remote"
        with self._lock:
            forced, waiting, inflight, svc = self._forced, self._waiting, self._inflight, self._service_ms
        if forced:
            return "remote", "offload forced (governor)", "forced"
        gov = self.governor
        if o.offload_on_critical and gov is not None and getattr(gov.state, "value", None) == "critical":
            return "remote", "governor critical", "governor_critical"
        if inflight >= o.max_local_inflight and waiting >= o.max_local_queue:
            return "remote", f"local queue full ({waiting} waiting, limit {o.max_local_queue})", "queue_full"
        if o.latency_objective_ms is not None and svc is not None:
            ahead = waiting + max(0, inflight - o.max_local_inflight + 1)
            predicted = (ahead + 1) * svc
            if predicted > o.latency_objective_ms:
                probe = self._probe_due()
                if probe is not None:
                    return "local", f"latency probe (estimate {svc:.1f} ms is {probe} old; refreshing it)", "latency_probe"
                why = f"latency objective at risk (predicted {predicted:.1f} ms > {o.latency_objective_ms:g} ms)"
                return "remote", why, "latency_objective"
        return "local", "local first", "local_first"

    def _probe_due(self) -> str | None:
        """Called when the objective would offload: claim a probe (and say how old the estimate
        is) when one is due and the local model is idle, else count the offload and return None."""
        o = self._opts
        with self._lock:
            idle = self._inflight == 0 and self._waiting == 0 and not self._probing
            age = self._clock() - self._last_local
            if idle and o.probe_every is not None and self._since_local >= o.probe_every:
                self._probing = True
                return f"{self._since_local} offloads"
            if idle and o.probe_interval_s is not None and age >= o.probe_interval_s:
                self._probing = True
                return f"{age:.1f} s"
            self._since_local += 1
            return None

    def _run_local(self, call: Callable[[Any], Any], deadline: float, probe: bool = False) -> Any:
        with self._lock:
            self._waiting += 1
            try:
                while self._inflight >= self._opts.max_local_inflight:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RouterTimeoutError(f"waited {self._opts.deadline_s:g} s for the local model (deadline_s)")
                    self._lock.wait(left)
            finally:
                self._waiting -= 1
            self._inflight += 1
        t0 = self._clock()
        ok = False
        try:
            r = call(self.local)
            ok = True
            return r
        finally:
            t1 = self._clock()
            ms = (t1 - t0) * 1e3
            with self._lock:
                self._inflight -= 1
                if ok:
                    self._measured(ms, probe, t1)
                self._lock.notify()

    def _measured(self, ms: float, probe: bool, now: float) -> None:
        """Fold one successful local call of ``ms`` into the estimate (under the lock; module docs)."""
        o = self._opts
        self._local_calls += 1
        self._last_local = now
        self._since_local = 0
        if self._service_ms is None or self._local_calls <= o.cold_calls + 1:
            self._service_ms = ms  # a cold call stands in; the first warm one replaces it
        else:
            a = max(o.ewma_alpha, 0.5) if probe else o.ewma_alpha
            self._service_ms = (1 - a) * self._service_ms + a * ms

    def _route(self, call: Callable[[Any], Any]) -> RoutedResult:
        """Serve ``call(model)`` (the request, bound to its arguments) on the model the rules pick."""
        deadline = time.monotonic() + self._opts.deadline_s
        where, why, trigger = self._decide()
        if trigger != "latency_probe":
            return self._serve(call, deadline, where, why, trigger)
        try:
            return self._serve(call, deadline, where, why, trigger)
        finally:
            with self._lock:
                self._probing = False

    def _serve(self, call: Callable[[Any], Any], deadline: float, where: str, why: str, trigger: str) -> RoutedResult:
        if where == "remote":
            self._offload(trigger)
            try:
                r = call(self.remote)
            except InputError:
                raise
            except Exception as e:  # down, breaker open, privacy, timeout, malformed: local keeps serving
                if self.local is None:
                    raise RouterError(
                        f"remote failed ({type(e).__name__}: {e}) and there is no local model ({self._no_local_reason})"
                    ) from e
                r = self._run_local(call, deadline)
                self._event("local: remote failed", f"{why}; remote {type(e).__name__}: {e}", "local", "remote_failed",
                            result=r, decision=trigger, error=e)  # fmt: skip
                return RoutedResult(r, "local", f"{why}; remote failed ({type(e).__name__}: {e}); served locally")
            self._event(f"remote: {why.split(' (')[0]}", why, "remote", trigger, result=r)
            return RoutedResult(r, "remote", why)
        probe = trigger == "latency_probe"
        try:
            r = self._run_local(call, deadline, probe)
        except InputError:
            raise  # the caller's input: the remote would refuse it too
        except RouterTimeoutError:
            raise
        except Exception as e:
            if self.remote is None or not self._opts.offload_on_local_error:
                raise
            why2 = f"local failed ({type(e).__name__}: {e})"
            self._offload("local_error")
            try:
                rr = call(self.remote)
            except Exception as e2:
                raise RouterError(f"{why2}; remote failed too ({type(e2).__name__}: {e2})") from e2
            self._event("remote: local failed", why2, "remote", "local_error", result=rr, error=e)
            return RoutedResult(rr, "remote", why2)
        thr = self._opts.cascade_threshold
        if thr is not None and self.remote is not None:
            score = _top1_score(r)
            if score is not None and score < thr:
                why3 = f"cascade: local top-1 {score:.3f} < {thr:g}"
                self._offload("cascade")
                try:
                    rr = call(self.remote)
                except Exception as e:
                    self._event("local: cascade remote failed", f"{why3}; {type(e).__name__}: {e}", "local", "cascade_remote_failed",
                                result=r, decision="cascade", error=e)  # fmt: skip
                    return RoutedResult(r, "local", f"{why3}; remote failed ({type(e).__name__}: {e}); local answer kept", r)
                self._event("remote: cascade", why3, "remote", "cascade", result=rr)
                return RoutedResult(rr, "remote", why3, r)
        self._event(f"local: {why.split(' (')[0]}", why, "local", trigger, result=r)
        return RoutedResult(r, "local", why)


def _top1_score(result: Any) -> float | None:
    dec = getattr(result, "decoded", None)
    if isinstance(dec, tuple) and dec and isinstance(dec[0], tuple) and dec[0]:
        s = getattr(dec[0][0], "score", None)
        return float(s) if s is not None else None
    return None
