"""Data types shared by the budget modules: what the sensors read, in one snapshot, and the
governor's state (:class:`GovernorState`, which the actions are told).

Everything here is plain and immutable. A value that could not be read is ``None``
("unknown"), never a made-up number; ``SensorSnapshot.unknown`` says what was missing and why.
Units are in the field names: ``_c`` degrees Celsius, ``_w`` watts, ``_v`` volts, ``_a`` amperes,
``_mhz`` megahertz, ``_pct`` percent, ``_ms`` milliseconds (monotonic clock).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import OptionsError


@dataclass(frozen=True)
class ThrottledFlags:
    """``vcgencmd get_throttled`` decoded (Raspberry Pi firmware; https://www.raspberrypi.com/documentation/computers/os.html#get_throttled).

    ``*_now``: bits 0-3 (active now); ``*_since_boot``: bits 16-19 (has occurred since boot).
    ``raw``: the integer as read (e.g. 0x50005)."""

    raw: int
    under_voltage_now: bool
    freq_capped_now: bool
    throttled_now: bool
    soft_temp_limit_now: bool
    under_voltage_since_boot: bool
    freq_capped_since_boot: bool
    throttled_since_boot: bool
    soft_temp_limit_since_boot: bool

    @classmethod
    def from_int(cls, raw: int) -> "ThrottledFlags":
        """Decode the integer ``vcgencmd get_throttled`` prints."""
        def b(bit: int) -> bool:
            return bool(raw >> bit & 1)

        return cls(raw, b(0), b(1), b(2), b(3), b(16), b(17), b(18), b(19))

    @property
    def any_now(self) -> bool:
        """True if any of the ``*_now`` flags (bits 0-3) is set."""
        return bool(self.raw & 0xF)


@dataclass(frozen=True)
class TempReading:
    """One temperature sensor. ``source``: "thermal_zone" or "hwmon" or "vcgencmd";
    ``name``: the zone's ``type`` / the hwmon ``name/label``; ``path``: where it was read.
    ``trips_c``: the zone's trip points (type -> lowest temperature of that type), when listed."""

    source: str
    name: str
    path: str
    temp_c: float | None
    trips_c: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class RailReading:
    """One power rail. ``source``: "ina3221-hwmon", "ina3221-iio", "pmic" (Pi 5), "rapl", "vcgencmd"
    (Pi 4 ``measure_volts``: voltage only). Any of voltage/current/power may be None when that file
    is missing or unreadable."""

    source: str
    name: str
    path: str
    voltage_v: float | None = None
    current_a: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class BatteryReading:
    """A battery's charge in percent, whether it is on mains power, and the seconds left (None where unknown)."""
    percent: float | None
    plugged: bool | None
    secs_left: float | None = None


@dataclass(frozen=True)
class SensorSnapshot:
    """Everything read in one sampling pass.

    ``temp_c``: the temperature the budget watches (the hottest of the profile's zones, else of
    the CPU/SoC zones), None when no zone could be read. ``board_power_w``: total board/module
    power (a VDD_IN / POM_5V_IN rail, else the sum of rails, else the Pi 5 PMIC estimate), None
    when not readable. ``unknown``: ``what -> why`` for every sensor the device should have but
    that could not be read this time. ``board_power_source``: where ``board_power_w`` came from
    (e.g. "rail VDD_IN", "sum of 3 ina3221 rails", "rapl package-0"), None when it is None."""

    timestamp_ms: float
    temp_c: float | None
    temps: tuple[TempReading, ...] = ()
    board_power_w: float | None = None
    rails: tuple[RailReading, ...] = ()
    throttled: ThrottledFlags | None = None
    battery: BatteryReading | None = None
    cpu_freq_mhz: float | None = None
    cpu_util_pct: float | None = None
    unknown: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    board_power_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the snapshot: temperatures with their trip points, board power, rails, throttled flags,
        battery."""
        return {
            "timestamp_ms": self.timestamp_ms,
            "temp_c": self.temp_c,
            "temps": [{"source": t.source, "name": t.name, "path": t.path, "temp_c": t.temp_c, "trips_c": dict(t.trips_c)} for t in self.temps],
            "board_power_w": self.board_power_w,
            "board_power_source": self.board_power_source,
            "rails": [
                {"source": r.source, "name": r.name, "path": r.path, "voltage_v": r.voltage_v, "current_a": r.current_a, "power_w": r.power_w}
                for r in self.rails
            ],
            "throttled": None if self.throttled is None else {"raw": hex(self.throttled.raw), **{k: v for k, v in vars(self.throttled).items() if k != "raw"}},
            "battery": None if self.battery is None else vars(self.battery).copy(),
            "cpu_freq_mhz": self.cpu_freq_mhz,
            "cpu_util_pct": self.cpu_util_pct,
            "unknown": dict(self.unknown),
        }


def finite_number(name: str, value: Any) -> float:
    """``value`` as a float if it is a finite int or float (not a bool); else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise OptionsError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


class GovernorState(str, enum.Enum):
    """The governor's state, from NORMAL through CONSTRAINED to CRITICAL; a ``str`` enum (the value is the lower-case
    name)."""
    NORMAL = "normal"
    CONSTRAINED = "constrained"
    CRITICAL = "critical"

    @property
    def level(self) -> int:
        """0 (NORMAL), 1 (CONSTRAINED) or 2 (CRITICAL), for comparing states."""
        return _LEVELS[self]

    @staticmethod
    def at_level(level: int) -> "GovernorState":
        """The state of ``level`` (0, 1 or 2)."""
        return _BY_LEVEL[level]


_LEVELS = {GovernorState.NORMAL: 0, GovernorState.CONSTRAINED: 1, GovernorState.CRITICAL: 2}
_BY_LEVEL = {v: k for k, v in _LEVELS.items()}
