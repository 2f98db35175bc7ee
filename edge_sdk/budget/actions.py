"""The governor's ladder: :class:`Action` and the steps it ships with, and the small interface
the things it acts on implement -- so :mod:`edge_sdk.budget` imports none of them.

A step acts on *targets* through a few attributes, written down here as protocols: a
:class:`~edge_sdk.pipelines.VisionPipeline` implements all three target protocols, and a
generation engine or anything else the application owns can implement the ones that fit it.

- :class:`RateTarget` (:class:`LowerRate`): ``max_fps``, ``processed_fps``, ``set_max_fps``.
- :class:`ModelTarget` (:class:`LighterVariant`): ``model``, ``swap_model``, ``wait_model_idle``;
  its model is a :class:`SwappableModel` (``lighter_variant_ids()``, ``with_variant(id)``, as an
  edge_sdk Model has).
- :class:`PausableTarget` (:class:`PauseLowPriority`): ``options.priority``, ``paused``,
  ``pause()``, ``resume()``.
- :class:`Offload` takes a callable (``Router.set_offload``, or the application's own).

Every target has ``source.name`` (for the event's detail) and ``state.value`` ("new" or
"running" while steps may act on it). ``pipelines`` arguments take the targets, or a callable
that returns them when the step is taken.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import OptionsError
from .types import GovernorState, SensorSnapshot, finite_number

if TYPE_CHECKING:  # pragma: no cover
    from .governor import Governor

__all__ = [
    "Action",
    "ActionContext",
    "ActionUnavailable",
    "LighterVariant",
    "LowerRate",
    "ModelTarget",
    "Offload",
    "PausableTarget",
    "PauseLowPriority",
    "RateTarget",
    "SwappableModel",
    "default_ladder",
]

_log = logging.getLogger("edge_sdk.budget.governor")


class _Named(Protocol):
    name: str


class _Target(Protocol):
    @property
    def source(self) -> _Named:
        """What the events name it by (``source.name``)."""
        ...

    @property
    def state(self) -> Any:
        """Its lifecycle state; steps act while ``state.value`` is "new" or "running"."""
        ...


class RateTarget(_Target, Protocol):
    """What :class:`LowerRate` acts on: a rate limit (None: unlimited) and the measured rate."""

    @property
    def max_fps(self) -> float | None:
        """The rate limit now (None: unlimited)."""
        ...

    @property
    def processed_fps(self) -> float | None:
        """The measured processing rate (None: not measured yet)."""
        ...

    def set_max_fps(self, fps: float | None) -> None:
        """Limit the rate (None: unlimited)."""


class SwappableModel(Protocol):
    """A model that knows its lighter variants and loads one (an edge_sdk Model)."""

    @property
    def variant(self) -> Any:
        """The loaded variant (``variant.id`` names it in events)."""
        ...

    def lighter_variant_ids(self) -> list[str]:
        """Lighter variants this device could run instead, the mildest step first."""

    def with_variant(self, variant_id: str) -> "SwappableModel":
        """A new model: the same package and options, with ``variant_id``."""

    def close(self) -> None:
        """Release it."""


class ModelTarget(_Target, Protocol):
    """What :class:`LighterVariant` acts on: a model that can be swapped while running."""

    @property
    def model(self) -> Any:
        """The model it runs now."""
        ...

    def swap_model(self, model: Any) -> None:
        """Use ``model`` from the next item on."""

    def wait_model_idle(self, model: Any, timeout: float | None = None) -> bool:
        """Wait until nothing runs on ``model``; False on timeout."""


class PausableTarget(_Target, Protocol):
    """What :class:`PauseLowPriority` acts on."""

    @property
    def options(self) -> Any:
        """Its options (``options.priority``: "low" ones are paused)."""
        ...

    @property
    def paused(self) -> bool:
        """True while paused."""
        ...

    def pause(self) -> None:
        """Stop taking work (live items are dropped as paused)."""

    def resume(self) -> None:
        """Take work again."""


class ActionUnavailable(Exception):
    """Raised by :meth:`Action.apply` when the step cannot be taken now (nothing to slow down, no
    lighter variant, no remote). The governor records it and tries the next step."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ActionContext:
    """What an action is told: the state that asks for it, the snapshot and reason, the governor."""

    state: GovernorState
    snapshot: SensorSnapshot | None
    reason: str
    governor: Governor


class Action:
    """One step of the ladder. ``apply(ctx)`` takes the step and returns a detail for the event
    (raise :class:`ActionUnavailable` to be skipped); ``undo(ctx)`` gives it back (it may return a
    detail too). The governor calls them from one thread at a time, and undo only after a
    successful apply. Any object with ``name``, ``apply`` and ``undo`` will do."""

    name: str = "action"

    def apply(self, ctx: ActionContext) -> str:  # pragma: no cover - interface
        """Take the step; return a detail for the event, or raise :class:`ActionUnavailable` if it cannot be taken now."""
        raise NotImplementedError

    def undo(self, ctx: ActionContext) -> str | None:  # pragma: no cover - interface
        """Give the step back (called only after a successful :meth:`apply`); may return a detail for the event."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _pipelines_of(spec: Any) -> Callable[[], list[Any]]:
    if callable(spec):
        return lambda: list(spec())
    fixed = list(spec)
    return lambda: list(fixed)


def _running(p: Any) -> bool:
    return p.state.value in ("new", "running")


def _fps(v: float | None) -> str:
    return "unlimited" if v is None else f"{v:.3g}"


class LowerRate(Action):
    """Multiply each pipeline's rate limit by ``factor`` (not under ``min_fps``) through
    ``set_max_fps``; a pipeline without one is limited to ``factor`` x its measured processing rate
    (``processed_fps``). Undo restores the previous limit (unless the app changed it since).
    ``pipelines``: the pipelines, or a callable that returns them when the step is taken."""

    name = "lower_rate"

    def __init__(self, pipelines: Any, factor: float = 0.5, min_fps: float = 1.0) -> None:
        if not 0 < finite_number("factor", factor) < 1:
            raise OptionsError(f"factor: expected a number in (0, 1), got {factor!r}")
        if finite_number("min_fps", min_fps) <= 0:
            raise OptionsError(f"min_fps: expected > 0, got {min_fps!r}")
        self._pipelines = _pipelines_of(pipelines)
        self.factor, self.min_fps = float(factor), float(min_fps)
        self._saved: list[tuple[Any, float | None, float]] = []

    def apply(self, ctx: ActionContext) -> str:
        saved, notes = [], []
        for p in self._pipelines():
            if not _running(p):
                continue
            prev = p.max_fps
            base = prev if prev is not None else p.processed_fps
            if base is None:
                notes.append(f"{p.source.name}: no rate measured yet")
                continue
            new = max(self.min_fps, base * self.factor)
            if new >= base:
                notes.append(f"{p.source.name}: already at {_fps(prev)} fps (min_fps {self.min_fps:g})")
                continue
            p.set_max_fps(new)
            saved.append((p, prev, new))
        if not saved:
            raise ActionUnavailable("no pipeline to slow down" + (": " + "; ".join(notes) if notes else ""))
        self._saved = saved
        return "; ".join(f"{p.source.name}: max_fps {_fps(prev)} -> {new:.3g}" for p, prev, new in saved)

    def undo(self, ctx: ActionContext) -> str:
        out = []
        for p, prev, new in reversed(self._saved):
            if p.max_fps == new:
                p.set_max_fps(prev)
                out.append(f"{p.source.name}: max_fps {new:.3g} -> {_fps(prev)}")
            else:
                out.append(f"{p.source.name}: max_fps changed by the app to {_fps(p.max_fps)}; left as is")
        self._saved = []
        return "; ".join(out)


def _default_loader(model: SwappableModel, variant_id: str) -> SwappableModel:
    return model.with_variant(variant_id)


class LighterVariant(Action):
    """Swap each pipeline's model for a lighter variant of the same package
    (``model.lighter_variant_ids()``, which an edge_sdk Model answers with
    :func:`edge_sdk.selection.lighter_variants`: the mildest step first; a variant that fails to
    load is passed over for the next). ``loader(model, variant_id) -> Model`` loads it (default:
    ``model.with_variant(variant_id)``: the same package and profile with the model's other load
    options); pipelines sharing a model share the light one. Undo swaps the original
    back, waits (up to ``close_timeout_s``) for frames still inferring on the light model, and
    closes it. The original stays open meanwhile (both are in memory while the step is in
    effect). Models that are not edge_sdk Models (no package/variant/detection) are left alone."""

    name = "lighter_variant"

    def __init__(self, pipelines: Any, loader: Callable[[Any, str], Any] | None = None, close_timeout_s: float = 10.0) -> None:
        self._pipelines = _pipelines_of(pipelines)
        self._loader = loader or _default_loader
        self.close_timeout_s = close_timeout_s
        self._swaps: list[tuple[Any, Any, Any]] = []  # (pipeline, original, light)

    def apply(self, ctx: ActionContext) -> str:
        loaded: dict[int, Any] = {}
        swaps, notes = [], []
        for p in self._pipelines():
            if not _running(p):
                continue
            m = p.model
            light = loaded.get(id(m))
            if light is None:
                if not callable(getattr(m, "lighter_variant_ids", None)):
                    notes.append(f"{p.source.name}: {type(m).__name__} is not an edge_sdk Model")
                    continue
                cands = m.lighter_variant_ids()
                if not cands:
                    notes.append(f"{p.source.name}: {m.variant.id} is the lightest variant of {m.manifest.name} for {m.detection.profile.name}")
                    continue
                for vid in cands:
                    try:
                        light = self._loader(m, vid)
                        break
                    except Exception as e:  # a variant that will not load is passed over
                        notes.append(f"{p.source.name}: {vid} failed to load ({type(e).__name__}: {e})")
                if light is None:
                    continue
                loaded[id(m)] = light
            p.swap_model(light)
            swaps.append((p, m, light))
        if not swaps:
            raise ActionUnavailable("no lighter variant to swap in" + (": " + "; ".join(notes) if notes else ""))
        self._swaps = swaps
        return "; ".join(f"{p.source.name}: {m.variant.id} -> {light.variant.id}" for p, m, light in swaps)

    def undo(self, ctx: ActionContext) -> str:
        out, lights = [], {}
        for p, orig, light in reversed(self._swaps):
            lights[id(light)] = light
            if p.model is light:
                p.swap_model(orig)
                out.append(f"{p.source.name}: {light.variant.id} -> {orig.variant.id}")
            else:
                out.append(f"{p.source.name}: model changed by the app since; left as is")
        for p, _, light in self._swaps:
            if not p.wait_model_idle(light, self.close_timeout_s):
                _log.warning("%s: a frame still inferring on %r after %s s; closing it anyway", p.source.name, light, self.close_timeout_s)
        for light in lights.values():
            if not any(p.model is light for p, _, _ in self._swaps):
                light.close()
        self._swaps = []
        return "; ".join(out)


class Offload(Action):
    """Send inference to a remote server: ``enable(True)`` to apply, ``enable(False)`` to undo.
    Unavailable while no remote is configured (``enable`` None)."""

    name = "offload"

    def __init__(self, enable: Callable[[bool], Any] | None = None) -> None:
        self._enable = enable

    def apply(self, ctx: ActionContext) -> str:
        if self._enable is None:
            raise ActionUnavailable("no remote configured")
        r = self._enable(True)
        return "offload on" + (f": {r}" if r else "")

    def undo(self, ctx: ActionContext) -> str:
        r = self._enable(False) if self._enable is not None else None
        return "offload off" + (f": {r}" if r else "")


class PauseLowPriority(Action):
    """Pause the running pipelines whose ``options.priority`` is "low"; undo resumes the ones it
    paused."""

    name = "pause_low_priority"

    def __init__(self, pipelines: Any) -> None:
        self._pipelines = _pipelines_of(pipelines)
        self._paused: list[Any] = []

    def apply(self, ctx: ActionContext) -> str:
        ps = [p for p in self._pipelines() if p.options.priority == "low" and not p.paused and _running(p)]
        if not ps:
            raise ActionUnavailable("no running low-priority pipeline to pause")
        for p in ps:
            p.pause()
        self._paused = ps
        return "paused " + ", ".join(p.source.name for p in ps)

    def undo(self, ctx: ActionContext) -> str:
        for p in self._paused:
            p.resume()
        names = ", ".join(p.source.name for p in self._paused)
        self._paused = []
        return "resumed " + names


def default_ladder(
    pipelines: Any, *, loader: Callable[[Any, str], Any] | None = None, offload: Callable[[bool], Any] | None = None
) -> list[Action]:
    """LowerRate -> LighterVariant -> Offload -> PauseLowPriority over ``pipelines``."""
    return [LowerRate(pipelines), LighterVariant(pipelines, loader), Offload(offload), PauseLowPriority(pipelines)]
