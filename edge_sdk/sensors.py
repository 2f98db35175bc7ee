"""List the sensors a device exposes (read-only, from a configurable root).

This is discovery for ``edge-sdk profile``: thermal zones, hwmon chips,
power supplies (batteries), INA3221 power monitors (Jetson) and Intel RAPL.
Values are read once; units are in the field names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SensorReading:
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
    for z in sorted((r / "sys/class/thermal").glob("thermal_zone*")):
        t = _num(_read(z / "temp"))
        out.append(SensorReading("thermal", _read(z / "type") or z.name, str(z), None if t is None else t / 1000.0, "temp_c"))
    for h in sorted((r / "sys/class/hwmon").glob("hwmon*")):
        name = _read(h / "name") or h.name
        for t in sorted(h.glob("temp*_input")):
            v = _num(_read(t))
            out.append(SensorReading("hwmon", f"{name}/{t.name}", str(t), None if v is None else v / 1000.0, "temp_c"))
    for ps in sorted((r / "sys/class/power_supply").glob("*")):
        if _read(ps / "type") == "Battery":
            out.append(SensorReading("battery", ps.name, str(ps), _num(_read(ps / "capacity")), "percent"))
    for dev in sorted((r / "sys/bus/i2c/devices").glob("*")):
        if (_read(dev / "name") or "").startswith("ina3221"):
            for lab in sorted(dev.glob("hwmon/hwmon*/in*_label")):
                k = lab.name[2:-6]  # in<K>_label
                mv, ma = _num(_read(lab.parent / f"in{k}_input")), _num(_read(lab.parent / f"curr{k}_input"))
                watts = mv * ma / 1e6 if mv is not None and ma is not None else None  # mV * mA -> W
                out.append(SensorReading("ina3221", _read(lab) or lab.name, str(lab.parent), watts, "power_w"))
            for lab in sorted(dev.glob("iio:device*/rail_name_*")):
                out.append(SensorReading("ina3221", _read(lab) or lab.name, str(lab.parent), None, "rail"))
    for z in sorted((r / "sys/class/powercap").glob("intel-rapl:*")):
        if (z / "energy_uj").exists():
            out.append(SensorReading("rapl", _read(z / "name") or z.name, str(z), _num(_read(z / "energy_uj")), "energy_uj"))
    return out
