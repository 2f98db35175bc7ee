"""Read-only sensor readers for the thermal and power budgets.

Everything is read below a configurable ``root`` (``"/"`` on a device, a recorded fake tree in
tests), and the one external command, Raspberry Pi ``vcgencmd``, goes through a replaceable
:data:`CommandRunner`. Nothing is written, nothing is probed at import time.

What is read (Raspberry Pi's vcgencmd documentation, https://www.raspberrypi.com/documentation/computers/os.html#vcgencmd;
jetson_stats' jtop/core/power.py and energymon's jetson/JetsonPowerRails.md for the Jetson rails):

* Thermal zones ``sys/class/thermal/thermal_zone*/{type,temp}`` (millidegrees C) and their trip
  points ``trip_point_<N>_{type,temp}``; hwmon temperatures ``sys/class/hwmon/hwmon*/{name,
  temp<N>_input, temp<N>_label}``. A zone reading -256 C (Tegra's "offline"), garbage, an empty or
  missing file, a file that vanished since discovery or one we may not read becomes
  ``temp_c=None`` plus an entry in :attr:`SensorSnapshot.unknown`, never an exception and never a
  made-up value.
* Raspberry Pi through ``vcgencmd``: ``get_throttled`` (:class:`ThrottledFlags`), ``measure_temp``
  (only when no zone is readable: it is the same SoC sensor), ``measure_volts core`` (Pi 4:
  voltage only) and ``pmic_read_adc`` (Pi 5: per-rail voltage and current).
* Without ``vcgencmd`` (containers): the under-voltage flag from the kernel's ``rpi_volt`` hwmon
  chip (``in0_lcrit_alarm``; see :data:`RPI_VOLT_HWMON`).
* Jetson INA3221 power monitors, with rail names read at run time: the JetPack 5/6 hwmon layout
  (``in<K>_label``, ``in<K>_input`` mV, ``curr<K>_input`` mA) and the JetPack 4 iio layout
  (``rail_name_<K>``, ``in_power<K>_input`` mW, ``in_voltage<K>_input`` mV,
  ``in_current<K>_input`` mA).
* Intel/AMD RAPL energy counters ``sys/class/powercap/intel-rapl:*/{name,energy_uj,
  max_energy_range_uj}``: power is the energy difference between two reads.
* Battery (psutil, injected), CPU frequency (``scaling_cur_freq``, the maximum over cores) and CPU
  utilisation (``proc/stat`` differences between reads).

Typical use::

    from edge_sdk.budget.sensors import SensorReader
    from edge_sdk.profiles import load_profile

    reader = SensorReader(load_profile("raspberry-pi-5"))
    snap = reader.read()          # cheap; call it from a sampling thread every 0.5-2 s
    snap.temp_c, snap.board_power_w, snap.throttled, dict(snap.unknown)
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, Union

from edge_sdk.budget.types import BatteryReading, RailReading, SensorSnapshot, TempReading, ThrottledFlags
from edge_sdk.errors import EdgeSDKError

if TYPE_CHECKING:  # pragma: no cover
    from edge_sdk.profiles import DeviceProfile

__all__ = [
    "BatterySource",
    "CommandRunner",
    "RPI_VOLT_HWMON",
    "RecordedRunner",
    "SensorReader",
    "SensorUnavailable",
    "TOTAL_RAIL_NAMES",
    "is_cpu_like",
    "parse_measure_temp",
    "parse_measure_volts",
    "parse_pmic_read_adc",
    "parse_throttled",
    "psutil_battery",
    "read_ina3221",
    "read_rpi_volt_alarm",
    "read_thermal_zones",
    "run_command",
]

#: ``(argv, timeout_s) -> stdout``. Raises (anything) when the command is missing, fails or times out.
CommandRunner = Callable[[Sequence[str], float], str]
#: ``() -> BatteryReading | None``; None means "no battery".
BatterySource = Callable[[], Union[BatteryReading, None]]

#: INA3221 rails that carry the whole module's input (energymon jetson/JetsonPowerRails.md, https://github.com/energymon/energymon: Orin/Xavier NX/TX2 and Nano).
TOTAL_RAIL_NAMES: tuple[str, ...] = ("VDD_IN", "POM_5V_IN")

_OFFLINE_MILLIDEG = -256000  # Tegra: a zone that is powered off / not populated reads -256 C
_MIN_C, _MAX_C = -273.15, 250.0  # outside this a reading is not a temperature (absolute zero; no SoC survives 250 C)
_COMMAND_RETRY_S = 30.0  # a failed vcgencmd is retried no sooner than this (a hung one would stall every sample)
_PathLike = Union[str, "os.PathLike[str]"]


class SensorUnavailable(EdgeSDKError):
    """A sensor command (``vcgencmd``) is not installed, exited with an error or timed out."""


# --------------------------------------------------------------------------- commands


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """Run ``argv`` without a shell and return its stdout (the default :data:`CommandRunner`).

    Raises :class:`SensorUnavailable` (chained to the cause) when the program is missing, cannot
    be started, exits non-zero or runs longer than ``timeout_s`` seconds.
    """
    args = [str(a) for a in argv]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as e:
        raise SensorUnavailable(f"{args[0]}: not installed (not found on PATH)") from e
    except subprocess.TimeoutExpired as e:
        raise SensorUnavailable(f"{' '.join(args)}: timed out after {timeout_s:g} s") from e
    except OSError as e:
        raise SensorUnavailable(f"{' '.join(args)}: cannot start ({e.strerror or e})") from e
    if done.returncode != 0:
        detail = (done.stderr or done.stdout or "").strip().splitlines()
        raise SensorUnavailable(f"{' '.join(args)}: exit status {done.returncode}" + (f": {detail[0][:200]}" if detail else ""))
    return done.stdout


class RecordedRunner:
    """A :data:`CommandRunner` that answers from recorded outputs, for tests and simulators.

    ``outputs`` maps the command line joined by single spaces (``"vcgencmd get_throttled"``) to
    its stdout, or to an exception instance to raise. An unrecorded command raises
    :class:`SensorUnavailable`. ``calls`` lists every command line asked for, in order.
    """

    def __init__(self, outputs: Mapping[str, Union[str, BaseException]]) -> None:
        self.outputs = dict(outputs)
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        key = " ".join(argv)
        self.calls.append(key)
        if key not in self.outputs:
            raise SensorUnavailable(f"{key}: no recorded output")
        out = self.outputs[key]
        if isinstance(out, BaseException):
            raise out
        return out


# --------------------------------------------------------------------------- vcgencmd parsers

_THROTTLED_RE = re.compile(r"throttled=(0x[0-9a-fA-F]+|[0-9]+)\b")
_MEASURE_TEMP_RE = re.compile(r"temp=([-+]?[0-9]+(?:\.[0-9]+)?)'C")
_MEASURE_VOLTS_RE = re.compile(r"volt=([0-9]+(?:\.[0-9]+)?)V")
_PMIC_LINE_RE = re.compile(r"^\s*([A-Za-z0-9_]+)_([AV])\s+(current|volt)\(\d+\)=(\S+?)([AV])\s*$")


def _excerpt(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def parse_throttled(text: str) -> ThrottledFlags:
    """``vcgencmd get_throttled`` output (``throttled=0x50005``) -> :class:`ThrottledFlags`.

    Raises ValueError when the output holds no ``throttled=`` value."""
    found = _THROTTLED_RE.search(text)
    if not found:
        raise ValueError(f"expected 'throttled=0x...', got {_excerpt(text)}")
    return ThrottledFlags.from_int(int(found.group(1), 0))


def parse_measure_temp(text: str) -> float:
    """``vcgencmd measure_temp`` output (``temp=45.2'C``) -> degrees C. Raises ValueError otherwise."""
    found = _MEASURE_TEMP_RE.search(text)
    if not found:
        raise ValueError(f'expected "temp=<number>\'C", got {_excerpt(text)}')
    return float(found.group(1))


def parse_measure_volts(text: str) -> float:
    """``vcgencmd measure_volts`` output (``volt=0.8438V``) -> volts. Raises ValueError otherwise."""
    found = _MEASURE_VOLTS_RE.search(text)
    if not found:
        raise ValueError(f"expected 'volt=<number>V', got {_excerpt(text)}")
    return float(found.group(1))


def _parse_pmic(text: str) -> tuple[tuple[RailReading, ...], dict[str, str]]:
    """Rails from ``vcgencmd pmic_read_adc`` plus ``{rail: problem}`` for lines with a bad value."""
    volts: dict[str, float] = {}
    amps: dict[str, float] = {}
    order: list[str] = []
    problems: dict[str, str] = {}
    for line in text.splitlines():
        found = _PMIC_LINE_RE.match(line)
        if not found:
            continue  # headers, blank lines, future additions: tolerated
        rail, tag, kind, value, unit = found.groups()
        if tag != unit or (kind == "current") != (unit == "A"):
            problems[rail] = f"inconsistent line {_excerpt(line)}"
            continue
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            problems[rail] = f"{'current' if unit == 'A' else 'voltage'} {value + unit!r} is not a number"
            continue
        (amps if unit == "A" else volts)[rail] = number
        if rail not in order:
            order.append(rail)
    rails = []
    for rail in order:
        v, a = volts.get(rail), amps.get(rail)
        rails.append(RailReading("pmic", rail, "vcgencmd pmic_read_adc", v, a, None if v is None or a is None else v * a))
    return tuple(rails), problems


def parse_pmic_read_adc(text: str) -> tuple[RailReading, ...]:
    """``vcgencmd pmic_read_adc`` (Raspberry Pi 5) -> one :class:`RailReading` per rail, in output order.

    Lines look like ``   EXT5V_V volt(24)=5.15380000V`` and ``  VDD_CORE_A current(7)=1.23400000A``.
    ``<NAME>_V volt`` and ``<NAME>_A current`` are paired by the rail name ``<NAME>`` (the ADC
    channel numbers in brackets do not pair up), giving ``power_w = V * A``; a rail with only a
    voltage (``EXT5V``, ``BATT``) or only a current keeps the other fields None. Unknown lines and
    lines whose value is not a finite number are skipped. Raises ValueError when no line parses.
    """
    rails, _ = _parse_pmic(text)
    if not rails:
        raise ValueError(f"no '<RAIL>_V volt(N)=...V' or '<RAIL>_A current(N)=...A' line in {_excerpt(text)}")
    return rails


# --------------------------------------------------------------------------- file helpers


def _read(path: str) -> tuple[str | None, str | None]:
    """``(text, None)`` or ``(None, why)``; never raises. Sysfs files are small: one read call."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read(8192)
    except FileNotFoundError:
        return None, f"{path}: missing (vanished since discovery?)"
    except PermissionError:
        return None, f"{path}: permission denied"
    except OSError as e:
        return None, f"{path}: unreadable ({e.strerror or e})"
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None, f"{path}: empty"
    return text, None


def _read_number(path: str) -> tuple[float | None, str | None]:
    text, why = _read(path)
    if text is None:
        return None, why
    try:
        number = float(int(text))
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            return None, f"{path}: not a number: {_excerpt(text)}"
    if not math.isfinite(number):
        return None, f"{path}: not a finite number: {_excerpt(text)}"
    return number, None


def _read_millidegrees(path: str) -> tuple[float | None, str | None]:
    """A sysfs temperature (millidegrees C) -> degrees C, rejecting -256 C (offline) and the impossible."""
    raw, why = _read_number(path)
    if raw is None:
        return None, why
    if raw == _OFFLINE_MILLIDEG:
        return None, f"{path}: offline (reads -256 C)"
    temp_c = raw / 1000.0
    if not _MIN_C <= temp_c <= _MAX_C:
        return None, f"{path}: implausible {temp_c:g} C"
    return temp_c, None


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _sorted_glob(base: Path, pattern: str) -> list[Path]:
    try:
        return sorted(base.glob(pattern), key=_natural_key)
    except OSError:
        return []


def _put(unknown: dict[str, str], key: str, why: str) -> None:
    """Record ``why`` under ``key``, keeping the first reason when a key repeats."""
    unknown.setdefault(key, why)


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class _Temp:
    """One temperature file found at discovery."""

    source: str  # "thermal_zone" | "hwmon"
    name: str  # zone type, or "<chip>/<label>"
    path: str  # zone directory, or the hwmon input file
    file: str
    key: str  # key in SensorSnapshot.unknown
    trips_c: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class _Rail:
    """One power-monitor channel found at discovery (files may be None when absent)."""

    source: str  # "ina3221-hwmon" | "ina3221-iio"
    name: str
    path: str
    millivolt_file: str | None
    milliamp_file: str | None
    milliwatt_file: str | None = None


@dataclass(frozen=True)
class _Rapl:
    """One RAPL domain."""

    name: str  # "package-0" or "package-0/core"
    path: str
    energy_file: str
    max_range_uj: float | None
    top_level: bool


@dataclass(frozen=True)
class _Found:
    """What discovery found below the root."""

    temps: tuple[_Temp, ...]
    rails: tuple[_Rail, ...]
    rapl: tuple[_Rapl, ...]
    cpufreq_files: tuple[str, ...]
    proc_stat: str | None
    under_voltage_alarm: str | None = None  # the rpi_volt hwmon chip's in0_lcrit_alarm file


def _discover_zones(root: Path) -> list[_Temp]:
    zones: list[_Temp] = []
    seen: dict[str, int] = {}
    for zone in _sorted_glob(root / "sys/class/thermal", "thermal_zone*"):
        zone_type, _ = _read(str(zone / "type"))
        name = zone_type or zone.name
        trips: dict[str, float] = {}
        for trip_type_file in _sorted_glob(zone, "trip_point_*_type"):
            trip_type, _ = _read(str(trip_type_file))
            trip_c, _ = _read_millidegrees(str(trip_type_file)[: -len("_type")] + "_temp")
            if trip_type and trip_c is not None:
                trips[trip_type] = min(trips.get(trip_type, trip_c), trip_c)
        seen[name] = seen.get(name, 0) + 1
        key = f"thermal:{name}" if seen[name] == 1 else f"thermal:{name}@{zone.name}"
        zones.append(_Temp("thermal_zone", name, str(zone), str(zone / "temp"), key, MappingProxyType(trips)))
    return zones


def _discover_hwmon_temps(root: Path, zone_types: Iterable[str]) -> list[_Temp]:
    # The kernel mirrors every thermal zone as a hwmon chip named after the zone type with '-' -> '_'
    # (drivers/thermal/thermal_hwmon.c); those would only repeat the zone, so they are skipped.
    mirrors = {t.replace("-", "_") for t in zone_types}
    temps: list[_Temp] = []
    for chip in _sorted_glob(root / "sys/class/hwmon", "hwmon*"):
        chip_name, _ = _read(str(chip / "name"))
        chip_name = chip_name or chip.name
        if chip_name in mirrors:
            continue
        for temp_input in _sorted_glob(chip, "temp*_input"):
            index = temp_input.name[len("temp") : -len("_input")]
            label, _ = _read(str(chip / f"temp{index}_label"))
            name = f"{chip_name}/{label or f'temp{index}'}"
            temps.append(_Temp("hwmon", name, str(temp_input), str(temp_input), f"hwmon:{name}@{chip.name}"))
    return temps


_I2C_DEVICE_RE = re.compile(r"^\d+-[0-9a-fA-F]{4}$")
_NC_RE = re.compile(r"(?:^|[\s_-])NC(?:$|[\s_-])")


def _skip_channel(label: str) -> bool:
    """INA3221 channels that are not rails: the "sum of shunt voltages" channel and unconnected ("NC") ones.

    "NC" is matched as a word (``NC``, ``VDD_NC``, ``NC 2``) so a rail such as ``VDD_SYNC`` is kept."""
    return "sum of shunt" in label.casefold() or bool(_NC_RE.search(label))


def _ina3221_devices(root: Path) -> list[Path]:
    """INA3221 I2C device directories, from ``bus/i2c/devices`` (by ``name``) and ``bus/i2c/drivers/ina3221*``."""
    found: dict[str, Path] = {}
    for name_file in _sorted_glob(root / "sys/bus/i2c/devices", "*/name"):
        name, _ = _read(str(name_file))
        if name and name.startswith("ina3221"):
            found.setdefault(os.path.realpath(name_file.parent), name_file.parent)
    for driver in _sorted_glob(root / "sys/bus/i2c/drivers", "ina3221*"):
        for device in _sorted_glob(driver, "*"):
            if _I2C_DEVICE_RE.match(device.name) and os.path.isdir(device):
                found.setdefault(os.path.realpath(device), device)
    return list(found.values())


def _discover_ina3221(root: Path) -> list[_Rail]:
    rails: list[_Rail] = []
    for device in _ina3221_devices(root):
        # JetPack 5/6: mainline hwmon driver; in<K>_input is the bus voltage (mV), curr<K>_input the current (mA).
        for label_file in _sorted_glob(device, "hwmon/hwmon*/in*_label"):
            k = label_file.name[len("in") : -len("_label")]
            label, _ = _read(str(label_file))
            if label is not None and _skip_channel(label):
                continue
            hwmon = label_file.parent
            volt, curr = hwmon / f"in{k}_input", hwmon / f"curr{k}_input"
            rails.append(
                _Rail("ina3221-hwmon", label or f"{device.name}/in{k}", str(hwmon), str(volt), str(curr) if os.path.exists(curr) else None)
            )
        # JetPack <= 4: L4T staging iio driver, power in mW computed by the driver.
        for name_file in _sorted_glob(device, "iio:device*/rail_name_*"):
            k = name_file.name[len("rail_name_") :]
            label, _ = _read(str(name_file))
            if label is not None and _skip_channel(label):
                continue
            iio = name_file.parent
            files = [iio / f"in_voltage{k}_input", iio / f"in_current{k}_input", iio / f"in_power{k}_input"]
            mv, ma, mw = (str(f) if os.path.exists(f) else None for f in files)
            rails.append(_Rail("ina3221-iio", label or f"{device.name}/rail{k}", str(iio), mv, ma, mw))
    return rails


def _discover_rapl(root: Path) -> list[_Rapl]:
    zones: list[_Rapl] = []
    names: dict[str, str] = {}
    for zone in _sorted_glob(root / "sys/class/powercap", "intel-rapl:*"):
        if not os.path.exists(zone / "energy_uj"):
            continue
        name, _ = _read(str(zone / "name"))
        names[zone.name] = name or zone.name
        max_range, _ = _read_number(str(zone / "max_energy_range_uj"))
        parts = zone.name.split(":")  # intel-rapl:<package>[:<subdomain>]
        top_level = len(parts) == 2
        full = names[zone.name] if top_level else f"{names.get(':'.join(parts[:2]), ':'.join(parts[:2]))}/{names[zone.name]}"
        zones.append(_Rapl(full, str(zone), str(zone / "energy_uj"), max_range if max_range and max_range > 0 else None, top_level))
    return zones


_NOTHING = _Found((), (), (), (), None)

#: Raspberry Pi kernels register the firmware's under-voltage flag as a hwmon chip named ``rpi_volt``
#: with one attribute, ``in0_lcrit_alarm`` (raspberrypi/linux drivers/hwmon/raspberrypi-hwmon.c:
#: ``devm_hwmon_device_register_with_info(dev, "rpi_volt", ...)``, ``HWMON_I_LCRIT_ALARM``). Every 2 s
#: the driver asks the firmware for its throttled word (RPI_FIRMWARE_GET_THROTTLED), clearing the sticky
#: bits, and the alarm reads 1 when bit 16 (under-voltage occurred) was set in that window. It needs no
#: ``vcgencmd`` and no /dev/vchiq, so it works in a container that sees /sys.
RPI_VOLT_HWMON = "rpi_volt"


def _discover_rpi_volt(root: Path) -> str | None:
    for chip in _sorted_glob(root / "sys/class/hwmon", "hwmon*"):
        name, _ = _read(str(chip / "name"))
        alarm = chip / "in0_lcrit_alarm"
        if (name or "").strip() == RPI_VOLT_HWMON and os.path.exists(alarm):
            return str(alarm)
    return None


def _discover(root: Path) -> _Found:
    """Everything below ``root``; os.path tests (never raising) so odd permissions cannot break discovery."""
    zones = _discover_zones(root)
    temps = zones + _discover_hwmon_temps(root, [z.name for z in zones])
    cpufreq = tuple(str(p) for p in _sorted_glob(root / "sys/devices/system/cpu", "cpu[0-9]*/cpufreq/scaling_cur_freq"))
    stat = root / "proc/stat"
    return _Found(
        tuple(temps),
        tuple(_discover_ina3221(root)),
        tuple(_discover_rapl(root)),
        cpufreq,
        str(stat) if os.path.exists(stat) else None,
        _discover_rpi_volt(root),
    )


def read_rpi_volt_alarm(path: str) -> tuple[ThrottledFlags | None, str | None]:
    """The rpi_volt hwmon alarm at ``path`` as :class:`ThrottledFlags` with only the under-voltage bits
    known (``1`` -> bits 0 and 16 set: under-voltage now and since boot; ``0`` -> no flag), or
    ``(None, why)`` when the file cannot be read or holds something other than 0 or 1."""
    value, why = _read_number(path)
    if value is None:
        return None, why
    if value not in (0.0, 1.0):
        return None, f"{path}: expected 0 or 1, got {value:g}"
    return ThrottledFlags.from_int(0x10001 if value else 0), None


def _read_temp(t: _Temp, unknown: dict[str, str]) -> TempReading:
    temp_c, why = _read_millidegrees(t.file)
    if why:
        _put(unknown, t.key, why)
    return TempReading(t.source, t.name, t.path, temp_c, t.trips_c)


def _read_rail(r: _Rail, unknown: dict[str, str]) -> RailReading:
    values: list[float | None] = []
    failed = False
    for file in (r.millivolt_file, r.milliamp_file, r.milliwatt_file):
        number, why = (None, None) if file is None else _read_number(file)
        if why:
            failed = True
            _put(unknown, f"rail:{r.name}", why)
        values.append(None if number is None else number / 1000.0)
    volts, amps, watts = values
    if watts is None and volts is not None and amps is not None:
        watts = volts * amps  # mV * mA / 1e6
    if watts is None and not failed:
        _put(unknown, f"rail:{r.name}", f"{r.path}: no current or power file for this channel")
    return RailReading(r.source, r.name, r.path, volts, amps, watts)


def read_thermal_zones(root: _PathLike = "/") -> tuple[tuple[TempReading, ...], dict[str, str]]:
    """Every thermal zone below ``root``, read once: ``(readings, {what: why unreadable})``."""
    unknown: dict[str, str] = {}
    return tuple(_read_temp(z, unknown) for z in _discover_zones(Path(root))), unknown


def read_ina3221(root: _PathLike = "/") -> tuple[tuple[RailReading, ...], dict[str, str]]:
    """Every INA3221 rail below ``root`` (both JetPack layouts), read once: ``(rails, {what: why})``."""
    unknown: dict[str, str] = {}
    return tuple(_read_rail(r, unknown) for r in _discover_ina3221(Path(root))), unknown


# --------------------------------------------------------------------------- choosing what to watch

_CPU_LIKE_RE = re.compile(r"cpu|soc|x86_pkg|package id|tctl|tdie|(?:^|[^a-z])tj(?:[^a-z]|$)", re.IGNORECASE)
_CPU_HWMON_CHIPS = frozenset({"coretemp", "k10temp", "zenpower"})


def is_cpu_like(reading: TempReading) -> bool:
    """True for a sensor on the CPU or SoC die: what the budget watches when the profile names no zone.

    Rule: the name contains ``cpu`` (cpu-thermal, CPU-therm), ``soc`` (soc0-thermal), ``x86_pkg``
    (x86_pkg_temp), ``package id`` (coretemp), ``tctl``/``tdie`` (AMD k10temp) or the word ``tj``
    (Tegra tj-thermal, the junction maximum); or it is a hwmon reading of the CPU drivers
    coretemp, k10temp or zenpower; or it is ``vcgencmd measure_temp`` (the Pi SoC sensor).
    Board, chipset, radio, disk and PMIC sensors are not CPU-like.
    """
    if _is_pmic(reading):
        return False
    if reading.source == "vcgencmd":
        return True
    if reading.source == "hwmon" and reading.name.split("/", 1)[0] in _CPU_HWMON_CHIPS:
        return True
    return bool(_CPU_LIKE_RE.search(reading.name))


def _is_pmic(reading: TempReading) -> bool:
    # Jetson "PMIC-Die" reports a fixed, meaningless value; jtop skips PMIC zones too (rbonghi/jetson_stats jtop/core/temperature.py).
    return "pmic" in reading.name.casefold()


def _watched(temps: Sequence[TempReading], zones: Sequence[str], unknown: dict[str, str]) -> float | None:
    """The temperature the budget watches; see :class:`SensorReader`."""
    readable = [(t, t.temp_c) for t in temps if t.temp_c is not None and not _is_pmic(t)]
    if zones:
        wanted = {z.casefold() for z in zones}
        named = [c for t, c in readable if t.source == "thermal_zone" and t.name.casefold() in wanted]
        if named:
            return max(named)
        fallback = "the hottest CPU/SoC-like sensor" if any(is_cpu_like(t) for t, _ in readable) else "the hottest sensor"
        _put(unknown, "temp_c", f"none of the profile's zones {list(zones)} could be read; watching {fallback} instead")
    cpu = [c for t, c in readable if is_cpu_like(t)]
    if cpu:
        return max(cpu)
    if readable:
        return max(c for _, c in readable)
    _put(unknown, "temp_c", "no readable temperature sensor" if temps else "no thermal zone or hwmon temperature found")
    return None


def _sum_rails(rails: Sequence[RailReading], what: str, unknown: dict[str, str]) -> float | None:
    missing = [r.name for r in rails if r.power_w is None]
    if missing:
        _put(unknown, "board_power", f"{what}: no power reading for {', '.join(missing)} this time")
        return None
    return sum(r.power_w for r in rails if r.power_w is not None)  # all of them (above)


def _board_power(
    rails: Sequence[RailReading], profile_rails: Sequence[str], rapl: Sequence[tuple[_Rapl, RailReading]], unknown: dict[str, str]
) -> tuple[float | None, str | None]:
    """Total board power and where it came from (see :class:`SensorReader`)."""
    by_name = {r.name.casefold(): r for r in rails}
    for total in TOTAL_RAIL_NAMES:
        rail = by_name.get(total.casefold())
        if rail is not None:
            if rail.power_w is None:
                _put(unknown, "board_power", f"rail {rail.name} (the module input) has no power reading this time")
            return rail.power_w, f"rail {rail.name}"
    if profile_rails:
        chosen = [by_name.get(name.casefold()) for name in profile_rails]
        found = [r for r in chosen if r is not None]
        if len(found) == len(chosen):
            source = f"profile rails {'+'.join(r.name for r in found)}"
            return _sum_rails(found, source, unknown), source
        absent = [n for n, r in zip(profile_rails, chosen) if r is None]
        _put(unknown, "profile_rails", f"profile power.rails {absent} not found; using the sum of the rails found instead")
    if rapl:
        psys = [r for z, r in rapl if z.top_level and z.name.startswith("psys")]
        chosen_rapl = psys[:1] or [r for z, r in rapl if z.top_level]
        if chosen_rapl:
            source = f"rapl {'+'.join(r.name for r in chosen_rapl)}"
            return _sum_rails(chosen_rapl, source, unknown), source
    ina = [r for r in rails if r.source.startswith("ina3221")]
    if ina:
        source = f"sum of {len(ina)} ina3221 rails"
        return _sum_rails(ina, source, unknown), source
    pmic = [r for r in rails if r.source == "pmic" and r.current_a is not None]
    if pmic:
        source = f"sum of {len(pmic)} PMIC rails (under-estimate of wall power)"
        return _sum_rails(pmic, source, unknown), source
    return None, None


# --------------------------------------------------------------------------- battery


def psutil_battery() -> BatteryReading | None:
    """The battery as :func:`psutil.sensors_battery` sees it; None when there is none (not an error).

    ``secs_left`` is None when psutil reports "unlimited" (plugged in) or "unknown"."""
    import psutil  # a core dependency; imported here so importing this module stays cheap

    battery = psutil.sensors_battery()
    if battery is None:
        return None
    secs = battery.secsleft
    unknown_secs = secs in (psutil.POWER_TIME_UNLIMITED, psutil.POWER_TIME_UNKNOWN) or secs is None or secs < 0
    return BatteryReading(
        percent=None if battery.percent is None else float(battery.percent),
        plugged=battery.power_plugged,
        secs_left=None if unknown_secs else float(secs),
    )


# --------------------------------------------------------------------------- the reader


def _wants_vcgencmd(profile: DeviceProfile | None, explicit: bool | None) -> bool:
    if explicit is not None:
        return explicit
    if profile is None:
        return False
    return profile.power.sensor in ("pi-volts", "pi5-pmic") or profile.name.startswith("raspberry-pi")


class SensorReader:
    """Reads every sensor of the device in one cheap pass: :meth:`read` -> :class:`SensorSnapshot`.

    Args:
        profile: the device profile (zones to watch, power sensor kind, rails); None reads
            everything generically and never runs ``vcgencmd`` unless ``vcgencmd=True``.
        root: where ``sys/`` and ``proc/`` are (``"/"`` on a device, a fake tree in tests).
        runner: runs ``vcgencmd``; any exception it raises becomes an ``unknown`` entry.
        battery: returns the battery or None; None here disables battery reading. The default
            reads this machine through psutil whatever ``root`` is: pass a fake with a fake root.
        clock: monotonic seconds; ``timestamp_ms`` is ``clock() * 1000`` and rates (RAPL, CPU
            utilisation) divide by its differences.
        vcgencmd: True/False forces ``vcgencmd`` on/off; None (default) uses it when the profile's
            ``power.sensor`` is ``"pi-volts"``/``"pi5-pmic"`` or its name starts with ``raspberry-pi``.
        command_interval_s: a ``vcgencmd`` output is reused for this long (each call forks a
            process, milliseconds on a Pi); a failed command is retried after 30 s at the earliest.
        command_timeout_s: timeout passed to ``runner``.

    Watched temperature (``temp_c``): the hottest readable thermal zone whose ``type`` is in
    ``profile.thermal.zones`` (case-insensitive); else the hottest CPU/SoC-like sensor (see
    :func:`is_cpu_like`; hwmon included); else the hottest sensor at all. PMIC zones are never
    watched. ``vcgencmd measure_temp`` is read only when no zone or hwmon sensor is readable.

    Board power (``board_power_w`` and ``board_power_source``), first that applies:
    the INA3221 rail ``VDD_IN`` or ``POM_5V_IN`` (the module input); the sum of the profile's
    ``power.rails`` when all are present; RAPL ``psys`` else the sum of the top-level package
    domains; the sum of all INA3221 rails; on a Pi 5 the sum of V*I over the PMIC rails that
    report a current -- the power delivered by the PMIC, an under-estimate of the wall power (no
    correction factor is applied). A sum with any rail unreadable this time is None, not partial.

    Discovery (which zones, chips, rails and domains exist) runs on the first :meth:`read` or
    :meth:`describe` and is cached; a file that vanishes later is reported as unknown; call
    :meth:`rescan` after hot-plugging. Thread-safe; :meth:`read` never raises for a sensor failure.
    """

    def __init__(
        self,
        profile: DeviceProfile | None = None,
        root: _PathLike = "/",
        runner: CommandRunner = run_command,
        battery: BatterySource | None = psutil_battery,
        clock: Callable[[], float] = time.monotonic,
        *,
        vcgencmd: bool | None = None,
        command_interval_s: float = 2.0,
        command_timeout_s: float = 1.0,
    ) -> None:
        self.profile = profile
        self.root = Path(root)
        self._runner = runner
        self._battery = battery
        self._clock = clock
        self._use_vcgencmd = _wants_vcgencmd(profile, vcgencmd)
        self._command_interval_s = float(command_interval_s)
        self._command_timeout_s = float(command_timeout_s)
        self._lock = threading.Lock()
        self._found: _Found | None = None
        self._commands: dict[tuple[str, ...], tuple[float, str | None, str | None]] = {}
        self._energy: dict[str, tuple[float, float]] = {}  # RAPL path -> (energy_uj, t_s)
        self._stat: tuple[float, float] | None = None  # (total, idle) jiffies

    # ------------------------------------------------------------------ public

    def read(self) -> SensorSnapshot:
        """Read every sensor once. Never raises for a sensor failure: what could not be read is
        None in the snapshot with the reason in ``unknown``."""
        with self._lock:
            now = self._clock()
            unknown: dict[str, str] = {}
            found = self._guard("discovery", unknown, self._discovered, _NOTHING)
            temps = [_read_temp(t, unknown) for t in found.temps]
            rails = [_read_rail(r, unknown) for r in found.rails]
            rapl = self._guard("rapl", unknown, lambda: self._read_rapl(found, now, unknown), [])
            rails += [r for _, r in rapl]
            throttled = None
            if self._use_vcgencmd:
                throttled, extra_temps, extra_rails = self._guard(
                    "vcgencmd", unknown, lambda: self._read_vcgencmd(temps, now, unknown), (None, [], [])
                )
                temps += extra_temps
                rails += extra_rails
            if throttled is None and found.under_voltage_alarm is not None:
                # no vcgencmd (a container, or turned off): the kernel's rpi_volt alarm still says under-voltage
                throttled = self._guard("throttled", unknown, lambda: self._read_rpi_volt(found, unknown), None)
            temp_c = self._guard("temp_c", unknown, lambda: _watched(temps, self._zones(), unknown), None)
            profile_rails = self.profile.power.rails if self.profile is not None else ()
            board_w, board_source = self._guard(
                "board_power", unknown, lambda: _board_power(rails, profile_rails, rapl, unknown), (None, None)
            )
            if board_w is None:
                board_source = None  # the reason, if any, is in unknown["board_power"]
                if "board_power" not in unknown and self._expects_power():
                    _put(unknown, "board_power", self._why_no_power(rails))
            return SensorSnapshot(
                timestamp_ms=now * 1000.0,
                temp_c=temp_c,
                temps=tuple(temps),
                board_power_w=board_w,
                rails=tuple(rails),
                throttled=throttled,
                battery=self._guard("battery", unknown, self._read_battery, None),
                cpu_freq_mhz=self._guard("cpu_freq", unknown, lambda: self._read_cpu_freq(found, unknown), None),
                cpu_util_pct=self._guard("cpu_util", unknown, lambda: self._read_cpu_util(found, unknown), None),
                unknown=MappingProxyType(unknown),
                board_power_source=board_source,
            )

    def describe(self) -> dict[str, Any]:
        """What was found (JSON-serialisable): zones with trip points, hwmon sensors, rails,
        RAPL domains, cpufreq files, the vcgencmd commands used and how temp/power are chosen."""
        with self._lock:
            found = self._discovered()
        return {
            "root": str(self.root),
            "profile": None if self.profile is None else self.profile.name,
            "temps": [{"source": t.source, "name": t.name, "path": t.path, "trips_c": dict(t.trips_c)} for t in found.temps],
            "rails": [{"source": r.source, "name": r.name, "path": r.path} for r in found.rails],
            "rapl": [{"name": z.name, "path": z.path, "max_energy_range_uj": z.max_range_uj} for z in found.rapl],
            "cpufreq_files": len(found.cpufreq_files),
            "proc_stat": found.proc_stat,
            "vcgencmd": [" ".join(argv) for argv in self._vcgencmd_commands()],
            "under_voltage_alarm": found.under_voltage_alarm,
            "battery": None if self._battery is None else getattr(self._battery, "__name__", type(self._battery).__name__),
            "watch": (
                f"hottest of the profile zones {list(self._zones())}, else the hottest CPU/SoC-like sensor"
                if self._zones()
                else "hottest CPU/SoC-like sensor, else the hottest sensor"
            ),
            "power_sensor": None if self.profile is None else self.profile.power.sensor,
        }

    def rescan(self) -> None:
        """Forget the cached discovery (and RAPL/CPU baselines); the next read looks again."""
        with self._lock:
            self._found = None
            self._energy.clear()
            self._stat = None

    # ------------------------------------------------------------------ parts

    def _discovered(self) -> _Found:
        if self._found is None:
            self._found = _discover(self.root)
        return self._found

    def _zones(self) -> tuple[str, ...]:
        return () if self.profile is None else self.profile.thermal.zones

    def _expects_power(self) -> bool:
        return self.profile is not None and self.profile.power.sensor not in ("none", "battery")

    def _why_no_power(self, rails: Sequence[RailReading]) -> str:
        sensor = self.profile.power.sensor if self.profile is not None else "none"
        if sensor == "pi-volts":
            return "pi-volts: this board measures voltages only, no current, so no power"
        if not rails:
            return f"{sensor}: no power sensor found below {self.root}"
        return f"{sensor}: no usable rail"

    @staticmethod
    def _guard(what: str, unknown: dict[str, str], fn: Callable[[], Any], default: Any) -> Any:
        """Run one sensor group; an unexpected error costs that group, never the whole snapshot."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a sampling thread must survive any sensor quirk
            _put(unknown, what, f"internal error: {type(e).__name__}: {e}")
            return default

    def _command(self, argv: tuple[str, ...], now: float, unknown: dict[str, str]) -> str | None:
        """Run (or reuse) one command; None with the reason in ``unknown`` when it failed."""
        cached = self._commands.get(argv)
        if cached is not None:
            at, out, why = cached
            if now - at < (self._command_interval_s if why is None else max(self._command_interval_s, _COMMAND_RETRY_S)):
                if why is not None:
                    _put(unknown, " ".join(argv), why)
                return out
        try:
            out, why = self._runner(argv, self._command_timeout_s), None
        except FileNotFoundError:
            out, why = None, f"{argv[0]}: not installed"
        except Exception as e:  # noqa: BLE001 - the runner is injected; any failure is "unavailable"
            out, why = None, f"{type(e).__name__}: {e}"
        self._commands[argv] = (now, out, why)
        if why is not None:
            _put(unknown, " ".join(argv), why)
        return out

    def _vcgencmd_commands(self) -> list[tuple[str, ...]]:
        if not self._use_vcgencmd:
            return []
        commands: list[tuple[str, ...]] = [("vcgencmd", "get_throttled")]
        sensor = self.profile.power.sensor if self.profile is not None else None
        if sensor == "pi5-pmic":
            commands.append(("vcgencmd", "pmic_read_adc"))
        elif sensor == "pi-volts":
            commands.append(("vcgencmd", "measure_volts", "core"))
        commands.append(("vcgencmd", "measure_temp"))  # only when no zone is readable
        return commands

    def _read_vcgencmd(
        self, temps: Sequence[TempReading], now: float, unknown: dict[str, str]
    ) -> tuple[ThrottledFlags | None, list[TempReading], list[RailReading]]:
        throttled = None
        extra_temps: list[TempReading] = []
        extra_rails: list[RailReading] = []
        for argv in self._vcgencmd_commands():
            key = " ".join(argv)
            if argv[1] == "measure_temp" and any(t.temp_c is not None for t in temps):
                continue
            out = self._command(argv, now, unknown)
            if out is None:
                continue
            try:
                if argv[1] == "get_throttled":
                    throttled = parse_throttled(out)
                elif argv[1] == "measure_temp":
                    extra_temps.append(TempReading("vcgencmd", "measure_temp", key, parse_measure_temp(out)))
                elif argv[1] == "measure_volts":
                    extra_rails.append(RailReading("vcgencmd", argv[2], key, voltage_v=parse_measure_volts(out)))
                elif argv[1] == "pmic_read_adc":
                    rails, problems = _parse_pmic(out)
                    if not rails:
                        raise ValueError(f"no rail line in {_excerpt(out)}")
                    extra_rails += rails
                    for rail, problem in problems.items():
                        _put(unknown, f"rail:{rail}", f"{key}: {problem}")
            except ValueError as e:
                _put(unknown, key, f"unparsable output: {e}")
        return throttled, extra_temps, extra_rails

    @staticmethod
    def _read_rpi_volt(found: _Found, unknown: dict[str, str]) -> ThrottledFlags | None:
        assert found.under_voltage_alarm is not None
        flags, why = read_rpi_volt_alarm(found.under_voltage_alarm)
        if flags is None:
            _put(unknown, "throttled", f"rpi_volt hwmon: {why}")
        else:
            _put(unknown, "throttled", f"under-voltage only, from {found.under_voltage_alarm} (frequency-capped and throttled flags need vcgencmd)")
        return flags

    def _read_rapl(self, found: _Found, now: float, unknown: dict[str, str]) -> list[tuple[_Rapl, RailReading]]:
        out = []
        for zone in found.rapl:
            energy, why = _read_number(zone.energy_file)
            watts = None
            key = f"rapl:{zone.name}"
            if energy is None:
                _put(
                    unknown,
                    key,
                    f"{why} (energy_uj is root-only on kernels patched for CVE-2020-8694)" if "permission" in str(why) else str(why),
                )
                self._energy.pop(zone.path, None)
            else:
                before = self._energy.get(zone.path)
                self._energy[zone.path] = (energy, now)
                if before is None:
                    _put(unknown, key, "needs two samples (power is the energy difference between reads)")
                else:
                    diff, dt = energy - before[0], now - before[1]
                    delta: float | None = diff
                    if diff < 0:  # the counter wrapped at max_energy_range_uj
                        delta = diff + zone.max_range_uj if zone.max_range_uj is not None else None
                    if delta is None:
                        _put(unknown, key, "counter went backwards and max_energy_range_uj is unknown")
                    elif dt <= 0:
                        _put(unknown, key, "no time elapsed since the previous sample")
                    else:
                        watts = delta / 1e6 / dt
            out.append((zone, RailReading("rapl", zone.name, zone.path, power_w=watts)))
        return out

    def _read_battery(self) -> BatteryReading | None:
        return None if self._battery is None else self._battery()

    def _read_cpu_freq(self, found: _Found, unknown: dict[str, str]) -> float | None:
        khz: list[float] = []
        for file in found.cpufreq_files:
            value, why = _read_number(file)
            if value is None:
                _put(unknown, "cpu_freq", str(why))
            else:
                khz.append(value)
        return max(khz) / 1000.0 if khz else None

    def _read_cpu_util(self, found: _Found, unknown: dict[str, str]) -> float | None:
        if found.proc_stat is None:
            return None
        text, why = _read(found.proc_stat)
        fields = (text or "").splitlines()[0].split() if text else []
        if text is None or not fields or fields[0] != "cpu" or len(fields) < 5:
            _put(unknown, "cpu_util", str(why) if text is None else f"{found.proc_stat}: no aggregate 'cpu' line")
            self._stat = None
            return None
        try:
            ticks = [float(int(v)) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        except ValueError:
            _put(unknown, "cpu_util", f"{found.proc_stat}: unparsable 'cpu' line {_excerpt(text.splitlines()[0])}")
            self._stat = None
            return None
        total, idle = sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)
        before, self._stat = self._stat, (total, idle)
        if before is None:
            _put(unknown, "cpu_util", "needs two samples (utilisation is the /proc/stat difference between reads)")
            return None
        d_total, d_idle = total - before[0], idle - before[1]
        if d_total <= 0 or d_idle < 0:
            _put(
                unknown,
                "cpu_util",
                "no CPU time elapsed since the previous sample" if d_total == 0 else "/proc/stat counters went backwards",
            )
            if d_total == 0:
                self._stat = before  # keep the older baseline: the next interval is longer
            return None
        return max(0.0, min(100.0, 100.0 * (1.0 - d_idle / d_total)))
