"""Thermal and power budgets: sensors, the governor and a thermal simulator.

- :mod:`edge_sdk.budget.types`: what one sampling pass reads (:class:`SensorSnapshot`).
- :mod:`edge_sdk.budget.sensors`: read-only readers from a configurable root (``/`` on a device,
  a fake tree in tests) and one replaceable command runner for ``vcgencmd``.
- :mod:`edge_sdk.budget.governor`: budgets, NORMAL / CONSTRAINED / CRITICAL with hysteresis and
  dwell, and the ordered ladder of actions.
- :mod:`edge_sdk.budget.simulator`: a first-order RC thermal model that writes a fake sysfs.
"""
