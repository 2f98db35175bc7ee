"""Thermal and power budgets: sensors, the governor and a thermal simulator.

- :mod:`edge_sdk.budget.types`: what one sampling pass reads (:class:`SensorSnapshot`).
- :mod:`edge_sdk.budget.sensors`: read-only readers from a configurable root (``/`` on a device,
  a fake tree in tests) and one replaceable command runner for ``vcgencmd``.
- :mod:`edge_sdk.budget.governor`: budgets, NORMAL / CONSTRAINED / CRITICAL with hysteresis and
  dwell, walking the ordered ladder of actions.
- :mod:`edge_sdk.budget.actions`: the ladder's steps and the small interface (protocols) that
  pipelines, routers and engines implement for them, so this package imports none of those.
- :mod:`edge_sdk.budget.simulator`: a first-order RC thermal model that writes a fake sysfs.
- :mod:`edge_sdk.budget.discovery`: a one-shot list of the sensors a device exposes (``edge-sdk profile``).
- :mod:`edge_sdk.budget.command`: the ``edge-sdk monitor`` subcommand (not loaded from here).

The names below are importable from here; the modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # for type checkers and readers: the same names, imported eagerly
    from .actions import (
        Action,
        ActionContext,
        ActionUnavailable,
        LighterVariant,
        LowerRate,
        ModelTarget,
        Offload,
        PausableTarget,
        PauseLowPriority,
        RateTarget,
        SwappableModel,
        default_ladder,
    )
    from .governor import Budget, Governor, GovernorEvent
    from .sensors import RecordedRunner, SensorReader, SensorUnavailable
    from .simulator import ThermalModel, ThermalSimulator
    from .types import GovernorState, SensorSnapshot, ThrottledFlags


_LAZY = {
    "SensorSnapshot": "types",
    "ThrottledFlags": "types",
    "SensorReader": "sensors",
    "RecordedRunner": "sensors",
    "SensorUnavailable": "sensors",
    "Budget": "governor",
    "Governor": "governor",
    "GovernorState": "types",
    "GovernorEvent": "governor",
    "Action": "actions",
    "ActionUnavailable": "actions",
    "LowerRate": "actions",
    "LighterVariant": "actions",
    "Offload": "actions",
    "PauseLowPriority": "actions",
    "default_ladder": "actions",
    "ActionContext": "actions",
    "RateTarget": "actions",
    "ModelTarget": "actions",
    "PausableTarget": "actions",
    "SwappableModel": "actions",
    "ThermalModel": "simulator",
    "ThermalSimulator": "simulator",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
