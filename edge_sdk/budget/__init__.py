"""Thermal and power budgets: sensors, the governor and a thermal simulator.

- :mod:`edge_sdk.budget.types`: what one sampling pass reads (:class:`SensorSnapshot`).
- :mod:`edge_sdk.budget.sensors`: read-only readers from a configurable root (``/`` on a device,
  a fake tree in tests) and one replaceable command runner for ``vcgencmd``.
- :mod:`edge_sdk.budget.governor`: budgets, NORMAL / CONSTRAINED / CRITICAL with hysteresis and
  dwell, and the ordered ladder of actions.
- :mod:`edge_sdk.budget.simulator`: a first-order RC thermal model that writes a fake sysfs.

The names below are importable from here; the modules load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SensorSnapshot": "types",
    "ThrottledFlags": "types",
    "SensorReader": "sensors",
    "RecordedRunner": "sensors",
    "SensorUnavailable": "sensors",
    "Budget": "governor",
    "Governor": "governor",
    "GovernorState": "governor",
    "GovernorEvent": "governor",
    "Action": "governor",
    "ActionUnavailable": "governor",
    "LowerRate": "governor",
    "LighterVariant": "governor",
    "Offload": "governor",
    "PauseLowPriority": "governor",
    "default_ladder": "governor",
    "ThermalModel": "simulator",
    "ThermalSimulator": "simulator",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'edge_sdk.budget' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
