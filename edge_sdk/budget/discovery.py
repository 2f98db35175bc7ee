"""List the sensors a device exposes (read-only, from a configurable root).

This is discovery for ``edge-sdk profile`` (:func:`scan`): thermal zones, hwmon chips,
power supplies (batteries), INA3221 power monitors (Jetson) and Intel RAPL.
Values are read once; units are in the field names. Thermal zones and INA3221
rails use the parsers of :mod:`edge_sdk.budget.sensors` (a zone reading -256 C
or garbage has ``value=None``; "sum of shunt voltages" and "NC" channels are
skipped; both JetPack layouts are read). The continuous reader for the budgets
is :class:`edge_sdk.budget.sensors.SensorReader`.

    from edge_sdk.budget.discovery import scan

    for s in scan("/"):
        print(s.kind, s.name, s.value, s.unit)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .sensors import read_ina3221, read_thermal_zones

__all__ = ["SensorReading", "scan"]


@dataclass(frozen=True)
class SensorReading:
    """One sensor found on the device: its kind (thermal, hwmon, battery, ina3221, rapl), name, sysfs path, and value with unit (None if
    unreadable)."""
    kind: str  # thermal | hwmon | battery | ina3221 | rapl
    name: str
    path: str
    value: float | None = None
    unit: str = ""


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _num(s: str | None) -> float | None:
    try:
        return float(s) if s is not None else None
    except ValueError:
        return None


def scan(root: str | Path = "/") -> list[SensorReading]:
    """Every sensor found under ``root`` (``/`` on a real device)."""
    r = Path(root)
    out: list[SensorReading] = []
    zones, _ = read_thermal_zones(r)
    out += [SensorReading("thermal", z.name, z.path, z.temp_c, "temp_c") for z in zones]
    for h in sorted((r / "sys/class/hwmon").glob("hwmon*")):
        name = _read(h / "name") or h.name
        for t in sorted(h.glob("temp*_input")):
            v = _num(_read(t))
            out.append(SensorReading("hwmon", f"{name}/{t.name}", str(t), None if v is None else v / 1000.0, "temp_c"))
    for ps in sorted((r / "sys/class/power_supply").glob("*")):
        if _read(ps / "type") == "Battery":
            out.append(SensorReading("battery", ps.name, str(ps), _num(_read(ps / "capacity")), "percent"))
    rails, _ = read_ina3221(r)
    out += [SensorReading("ina3221", rail.name, rail.path, rail.power_w, "power_w") for rail in rails]
    for z in sorted((r / "sys/class/powercap").glob("intel-rapl:*")):
        if (z / "energy_uj").exists():
            out.append(SensorReading("rapl", _read(z / "name") or z.name, str(z), _num(_read(z / "energy_uj")), "energy_uj"))
    return out
