"""Budget sensor readers over recorded-style fake trees (tests/fixtures/budget/<device>/).

Each fixture folder is a root: ``sys/`` and ``proc/`` files where the real ones are, plus
``commands.json`` (command line -> recorded stdout) for ``vcgencmd``. Tests that break files copy a
fixture to a temporary folder first; commands come from :class:`RecordedRunner`, never a mocked
subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import ROOT

from edge_sdk.budget.discovery import scan
from edge_sdk.budget.sensors import (
    RecordedRunner,
    SensorReader,
    SensorUnavailable,
    is_cpu_like,
    parse_measure_temp,
    parse_measure_volts,
    parse_pmic_read_adc,
    parse_throttled,
    psutil_battery,
    run_command,
)
from edge_sdk.budget.types import BatteryReading, RailReading, SensorSnapshot, TempReading
from edge_sdk.profiles import DeviceProfile, load_profile, resolve_profile

FIX = ROOT / "tests" / "fixtures" / "budget"

# Pi 5 fixture: rail -> (volts, amps) exactly as in commands.json
PI5_PAIRS = {
    "3V7_WL_SW": (3.71008800, 0.01463820),
    "3V3_SYS": (3.30812300, 0.06735240),
    "1V8_SYS": (1.79951600, 0.15919620),
    "DDR_VDD2": (1.10744400, 0.01561320),
    "DDR_VDDQ": (0.60402800, 0.00000000),
    "1V1_SYS": (1.10561600, 0.13174320),
    "0V8_SW": (0.80292930, 0.30744630),
    "VDD_CORE": (0.77032850, 0.68423000),
    "3V3_DAC": (3.31013100, 0.00006105),
    "3V3_ADC": (3.30860700, 0.00018315),
    "0V8_AON": (0.79981590, 0.00073260),
    "HDMI": (5.14360000, 0.01587180),
}
PI5_TOTAL_W = 1.58351497969753  # sum of V*A above, computed with decimal arithmetic


class Clock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def runner_for(device: str, **override: Any) -> RecordedRunner:
    path = FIX / device / "commands.json"
    outputs = json.loads(path.read_text()) if path.exists() else {}
    outputs.update(override)
    return RecordedRunner(outputs)


def reader_for(root: Path | str, profile: str | DeviceProfile | None, **kw: Any) -> SensorReader:
    if isinstance(root, str):
        kw.setdefault("runner", runner_for(root))
        root = FIX / root
    kw.setdefault("battery", None)
    kw.setdefault("clock", Clock())
    return SensorReader(load_profile(profile) if isinstance(profile, str) else profile, root, **kw)


def copy_fixture(device: str, dest: Path) -> Path:
    root = dest / device
    shutil.copytree(FIX / device, root)
    return root


def temp_of(snap: SensorSnapshot, name: str) -> float | None:
    (reading,) = [t for t in snap.temps if t.name == name]
    return reading.temp_c


def rail_of(snap: SensorSnapshot, name: str) -> RailReading:
    (rail,) = [r for r in snap.rails if r.name == name]
    return rail


def with_zones(profile: str, zones: tuple[str, ...]) -> DeviceProfile:
    p = load_profile(profile)
    return dataclasses.replace(p, thermal=dataclasses.replace(p.thermal, zones=zones))


def with_rails(profile: str, rails: tuple[str, ...]) -> DeviceProfile:
    p = load_profile(profile)
    return dataclasses.replace(p, power=dataclasses.replace(p.power, rails=rails))


# --------------------------------------------------------------------------- parsers


# (output, under_voltage_now, freq_capped_now, throttled_now, soft_temp_now, uv_since_boot, capped_since, throttled_since, soft_since)
THROTTLED = [
    ("throttled=0x0", (False,) * 8),  # healthy
    ("throttled=0x50000", (False, False, False, False, True, False, True, False)),  # under-voltage and throttling earlier
    ("throttled=0x50005", (True, False, True, False, True, False, True, False)),  # under-voltage and throttled now
    ("throttled=0x80008\n", (False, False, False, True, False, False, False, True)),  # soft temperature limit (Pi 3B+)
]


@pytest.mark.parametrize("text,want", THROTTLED)
def test_throttled_bits(text: str, want: tuple[bool, ...]) -> None:
    f = parse_throttled(text)
    got = (
        f.under_voltage_now,
        f.freq_capped_now,
        f.throttled_now,
        f.soft_temp_limit_now,
        f.under_voltage_since_boot,
        f.freq_capped_since_boot,
        f.throttled_since_boot,
        f.soft_temp_limit_since_boot,
    )
    assert got == want
    assert f.raw == int(text.strip().split("=")[1], 16)
    assert f.any_now == any(want[:4])


@pytest.mark.parametrize("parse", [parse_throttled, parse_measure_temp, parse_measure_volts, parse_pmic_read_adc])
@pytest.mark.parametrize("text", ["", 'error=1 error_msg="Command not registered"', "garbage\n"])
def test_parsers_reject_garbage(parse: Callable[[str], Any], text: str) -> None:
    with pytest.raises(ValueError, match="expected|no '"):
        parse(text)


def test_measure_parsers() -> None:
    assert parse_measure_temp("temp=45.2'C\n") == 45.2
    assert parse_measure_temp("temp=-3.5'C") == -3.5
    assert parse_measure_volts("volt=0.8438V\n") == 0.8438


def test_pmic_parser_pairs_by_name_and_tolerates_unknown_lines() -> None:
    text = (
        "PMIC ADC readings\n"  # a header we do not know: skipped
        "  VDD_CORE_A current(7)=1.23400000A\n"
        "   EXT5V_V volt(24)=5.15380000V\n"
        "  VDD_CORE_V volt(15)=0.80000000V\n"
        "      BATT_V volt(25)=nanV\n"  # no battery: not a number, skipped
        "  ONLY_A current(9)=0.5A\n"
    )
    rails = {r.name: r for r in parse_pmic_read_adc(text)}
    assert set(rails) == {"VDD_CORE", "EXT5V", "ONLY"}
    assert rails["VDD_CORE"] == RailReading("pmic", "VDD_CORE", "vcgencmd pmic_read_adc", 0.8, 1.234, pytest.approx(0.9872))
    assert (rails["EXT5V"].voltage_v, rails["EXT5V"].current_a, rails["EXT5V"].power_w) == (5.1538, None, None)
    assert (rails["ONLY"].voltage_v, rails["ONLY"].current_a, rails["ONLY"].power_w) == (None, 0.5, None)


# --------------------------------------------------------------------------- the fixtures


def test_raspberry_pi_4() -> None:
    runner = runner_for("raspberry-pi-4")
    snap = reader_for("raspberry-pi-4", "raspberry-pi-4", runner=runner).read()
    assert snap.temp_c == 45.277  # the sysfs zone, millidegrees / 1000
    assert dict(snap.temps[0].trips_c) == {"critical": 110.0}
    assert snap.throttled is not None and snap.throttled.raw == 0x50005 and snap.throttled.under_voltage_now
    assert snap.rails == (RailReading("vcgencmd", "core", "vcgencmd measure_volts core", voltage_v=0.8438),)
    assert snap.board_power_w is None and snap.board_power_source is None
    assert "voltages only" in snap.unknown["board_power"]
    assert snap.cpu_freq_mhz == 1500.0
    # measure_temp is the same sensor as the zone: not run while the zone is readable
    assert runner.calls == ["vcgencmd get_throttled", "vcgencmd measure_volts core"]


def test_raspberry_pi_5() -> None:
    snap = reader_for("raspberry-pi-5", "raspberry-pi-5").read()
    assert snap.temp_c == 52.35  # the profile zone, although the RP1 ADC reads hotter
    assert temp_of(snap, "rp1_adc/temp1") == 57.306
    assert [t.name for t in snap.temps] == ["cpu-thermal", "rp1_adc/temp1"]  # hwmon cpu_thermal mirrors the zone: skipped
    assert dict(snap.temps[0].trips_c) == {"critical": 110.0, "active": 50.0}
    assert snap.throttled is not None and snap.throttled.raw == 0 and not snap.throttled.any_now
    assert len(snap.rails) == 14
    for name, (volts, amps) in PI5_PAIRS.items():
        rail = rail_of(snap, name)
        assert (rail.source, rail.voltage_v, rail.current_a) == ("pmic", volts, amps)
        assert rail.power_w == pytest.approx(volts * amps, abs=1e-15)
    ext = rail_of(snap, "EXT5V")
    assert (ext.voltage_v, ext.current_a, ext.power_w) == (5.14768, None, None)  # input voltage only: not summed
    assert snap.board_power_w == pytest.approx(PI5_TOTAL_W, abs=1e-12)
    assert snap.board_power_source == "sum of 12 PMIC rails (under-estimate of wall power)"
    assert snap.cpu_freq_mhz == 2400.0
    assert "board_power" not in snap.unknown


def test_jetson_orin_nano_jetpack6() -> None:
    runner = RecordedRunner({})
    snap = reader_for("jetson-orin-nano-jp6", "jetson-orin-nano", runner=runner).read()
    assert snap.temp_c == 47.875  # tj-thermal, the hottest of the profile's zones
    assert [temp_of(snap, f"cv{i}-thermal") for i in range(3)] == [None, None, None]
    assert "offline" in snap.unknown["thermal:cv0-thermal"]
    assert temp_of(snap, "cpu-thermal") == 47.343 and temp_of(snap, "soc2-thermal") == 45.5
    assert [r.name for r in snap.rails] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]  # no "sum of shunt voltages"
    vdd_in = rail_of(snap, "VDD_IN")
    assert (vdd_in.source, vdd_in.voltage_v, vdd_in.current_a) == ("ina3221-hwmon", 5.064, 1.296)
    assert vdd_in.power_w == pytest.approx(6.562944, abs=1e-12)
    assert snap.board_power_w == pytest.approx(6.562944, abs=1e-12) and snap.board_power_source == "rail VDD_IN"
    assert snap.cpu_freq_mhz == 1510.4
    assert snap.throttled is None and runner.calls == []  # never vcgencmd on a Jetson


def test_jetson_nano_jetpack4() -> None:
    snap = reader_for("jetson-nano-jp4", "jetson-nano").read()
    assert snap.temp_c == 38.5  # CPU-therm
    pom = rail_of(snap, "POM_5V_IN")
    # the driver's in_power (3224 mW) is used, not V*I (3224.448 mW)
    assert (pom.source, pom.voltage_v, pom.current_a, pom.power_w) == ("ina3221-iio", 4.976, 0.648, 3.224)
    assert [r.name for r in snap.rails] == ["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"]
    assert snap.board_power_w == 3.224 and snap.board_power_source == "rail POM_5V_IN"


def test_x86_rapl_two_reads(tmp_path: Path) -> None:
    root = copy_fixture("x86-rapl", tmp_path)
    clock = Clock()
    reader = reader_for(root, "generic-x86_64", clock=clock, battery=lambda: BatteryReading(87.0, False, 5400.0))
    first = reader.read()
    assert first.temp_c == 44.0  # x86_pkg_temp / coretemp package; the chipset (58 C) is not CPU-like
    assert temp_of(first, "pch_cannonlake") == 58.0
    assert len(first.temps) == 8  # 4 zones + coretemp x3 + nvme; the acpitz hwmon mirror is skipped
    assert [r.name for r in first.rails] == ["package-0", "package-0/core", "package-0/uncore"]
    assert all(r.power_w is None for r in first.rails)
    assert "needs two samples" in first.unknown["rapl:package-0"]
    assert first.board_power_w is None and first.board_power_source is None
    assert first.battery == BatteryReading(87.0, False, 5400.0)
    assert first.cpu_freq_mhz == 3400.123

    (root / "sys/class/powercap/intel-rapl:0/energy_uj").write_text(f"{123456789 + 25_000_000}\n")
    (root / "sys/class/powercap/intel-rapl:0:0/energy_uj").write_text(f"{45678901 + 10_000_000}\n")
    clock.t += 2.0
    second = reader.read()
    assert rail_of(second, "package-0").power_w == pytest.approx(12.5)  # 25 J in 2 s
    assert rail_of(second, "package-0/core").power_w == pytest.approx(5.0)
    assert rail_of(second, "package-0/uncore").power_w == 0.0
    assert second.board_power_w == pytest.approx(12.5) and second.board_power_source == "rapl package-0"
    assert "rapl:package-0" not in second.unknown


@pytest.mark.parametrize("max_range,want_w", [("262143328850", 5.0), (None, None)])  # wrap with / without the counter range
def test_rapl_counter_wrap(tmp_path: Path, max_range: str | None, want_w: float | None) -> None:
    root = copy_fixture("x86-rapl", tmp_path)
    zone = root / "sys/class/powercap/intel-rapl:0"
    if max_range is None:
        (zone / "max_energy_range_uj").unlink()
    (zone / "energy_uj").write_text(f"{262143328850 - 3_000_000}\n")
    clock = Clock()
    reader = reader_for(root, "generic-x86_64", clock=clock)
    reader.read()
    (zone / "energy_uj").write_text("2000000\n")  # wrapped: 3 J before the top, 2 J after
    clock.t += 1.0
    snap = reader.read()
    assert rail_of(snap, "package-0").power_w == (None if want_w is None else pytest.approx(want_w))
    if want_w is None:
        assert "backwards" in snap.unknown["rapl:package-0"] and snap.board_power_w is None


def test_cpu_utilisation_from_proc_stat_differences(tmp_path: Path) -> None:
    root = copy_fixture("raspberry-pi-4", tmp_path)
    clock = Clock()
    reader = reader_for(root, "raspberry-pi-4", clock=clock, runner=runner_for("raspberry-pi-4"))
    first = reader.read()
    assert first.cpu_util_pct is None and "two samples" in first.unknown["cpu_util"]
    stat = root / "proc/stat"
    # +300 user, +100 system, +600 idle: 400 busy of 1000 ticks
    stat.write_text(stat.read_text().replace("cpu  48213 120 15873 2120456", "cpu  48513 120 15973 2121056", 1))
    clock.t += 1.0
    assert reader.read().cpu_util_pct == pytest.approx(40.0)
    clock.t += 1.0
    still = reader.read()  # nothing elapsed in /proc/stat
    assert still.cpu_util_pct is None and "no CPU time elapsed" in still.unknown["cpu_util"]


# --------------------------------------------------------------------------- broken and vanishing files


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _vanish(path: Path) -> None:
    path.unlink()


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()  # reading it fails with EISDIR, even for root


def _zone_gone(path: Path) -> None:
    shutil.rmtree(path.parent)


# (what is done to cpu-thermal's temp after discovery, expected substring of the reason)
BROKEN = [
    (lambda p: _write(p, "hot\n"), "not a number"),  # garbage
    (lambda p: _write(p, ""), "empty"),
    (lambda p: _write(p, "nan\n"), "not a finite number"),
    (lambda p: _write(p, "-256000\n"), "offline"),  # Tegra's "powered off"
    (lambda p: _write(p, "-300000\n"), "implausible"),  # below absolute zero
    (lambda p: _write(p, "2147483647\n"), "implausible"),
    (_vanish, "missing"),  # the file vanished between listing and reading
    (_zone_gone, "missing"),  # the whole zone vanished
    (_directory, "unreadable"),
]


@pytest.mark.parametrize("breaker,why", BROKEN)
def test_broken_zone_is_none_and_unknown(tmp_path: Path, breaker: Callable[[Path], None], why: str) -> None:
    root = copy_fixture("jetson-orin-nano-jp6", tmp_path)
    reader = reader_for(root, "jetson-orin-nano")
    assert temp_of(reader.read(), "cpu-thermal") == 47.343  # discovered and read once
    breaker(root / "sys/class/thermal/thermal_zone0/temp")
    snap = reader.read()
    assert temp_of(snap, "cpu-thermal") is None
    assert why in snap.unknown["thermal:cpu-thermal"]
    assert snap.temp_c == 47.875 and temp_of(snap, "gpu-thermal") == 46.125  # the others still read
    assert snap.board_power_w == pytest.approx(6.562944)


def test_vanished_total_rail_gives_no_board_power(tmp_path: Path) -> None:
    root = copy_fixture("jetson-orin-nano-jp6", tmp_path)
    reader = reader_for(root, "jetson-orin-nano")
    reader.read()
    (root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/curr1_input").unlink()
    snap = reader.read()
    assert rail_of(snap, "VDD_IN").power_w is None and rail_of(snap, "VDD_IN").voltage_v == 5.064
    assert "missing" in snap.unknown["rail:VDD_IN"]
    # no silent switch to the sum of the other rails: that would be a different quantity
    assert snap.board_power_w is None and "VDD_IN" in snap.unknown["board_power"]


def test_garbage_cpufreq_is_skipped(tmp_path: Path) -> None:
    root = copy_fixture("x86-rapl", tmp_path)
    (root / "sys/devices/system/cpu/cpu1/cpufreq/scaling_cur_freq").write_text("<unknown>\n")
    snap = reader_for(root, "generic-x86_64").read()
    assert snap.cpu_freq_mhz == 2100.0 and "not a number" in snap.unknown["cpu_freq"]


def _read_unprivileged(make_reader: Callable[[], SensorReader]) -> dict[str, Any]:
    """``make_reader().read().to_dict()`` without the right to bypass file permissions.

    As root, permission bits do not apply, so the read runs in a forked child that drops to
    uid/gid 65534 (nobody); otherwise it runs here."""
    if os.geteuid() != 0:
        return make_reader().read().to_dict()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            os.close(rfd)
            os.setgid(65534)
            os.setuid(65534)
            payload = json.dumps(make_reader().read().to_dict())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            payload, code = json.dumps({"error": repr(e)}), 1
        with os.fdopen(wfd, "w") as out:
            out.write(payload)
        os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd) as inp:
        data = json.loads(inp.read())
    os.waitpid(pid, 0)
    assert "error" not in data, data
    return data


def test_permission_denied_is_none_and_unknown() -> None:
    base = Path(tempfile.mkdtemp(prefix="edge-sdk-perm-"))  # not under pytest's 0700 tmp dir: nobody must reach it
    try:
        base.chmod(0o755)
        root = copy_fixture("jetson-orin-nano-jp6", base)
        (root / "sys/class/thermal/thermal_zone0/temp").chmod(0)
        (root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/curr1_input").chmod(0)
        (root / "sys/class/thermal/thermal_zone2").chmod(0)  # even the zone's type cannot be read at discovery
        snap = _read_unprivileged(lambda: reader_for(root, "jetson-orin-nano"))
    finally:
        locked = base / "jetson-orin-nano-jp6/sys/class/thermal/thermal_zone2"
        if locked.exists():
            locked.chmod(0o755)  # so that a non-root run can delete it
        shutil.rmtree(base)
    temps = {t["name"]: t["temp_c"] for t in snap["temps"]}
    assert temps["cpu-thermal"] is None and temps["gpu-thermal"] == 46.125
    assert "permission denied" in snap["unknown"]["thermal:cpu-thermal"]
    assert "permission denied" in snap["unknown"]["rail:VDD_IN"]
    assert temps["thermal_zone2"] is None and "permission denied" in snap["unknown"]["thermal:thermal_zone2"]
    assert snap["temp_c"] == 47.875 and snap["board_power_w"] is None


# --------------------------------------------------------------------------- vcgencmd


@pytest.mark.parametrize(
    "failure,why",
    [
        (FileNotFoundError(2, "No such file or directory", "vcgencmd"), "not installed"),
        (subprocess.TimeoutExpired(["vcgencmd"], 1.0), "TimeoutExpired"),
        (SensorUnavailable("vcgencmd get_throttled: exit status 255: VCHI initialization failed"), "VCHI"),
    ],
)
def test_vcgencmd_failure_is_unknown_and_other_sensors_still_read(failure: BaseException, why: str) -> None:
    runner = RecordedRunner({k: failure for k in ("vcgencmd get_throttled", "vcgencmd pmic_read_adc", "vcgencmd measure_temp")})
    clock = Clock()
    reader = reader_for("raspberry-pi-5", "raspberry-pi-5", runner=runner, clock=clock)
    snap = reader.read()
    assert why in snap.unknown["vcgencmd get_throttled"]
    # the recorded Pi 5 tree has the kernel's rpi_volt chip (hwmon1, alarm 0): under-voltage is still known
    assert snap.throttled is not None and snap.throttled.raw == 0 and "hwmon1/in0_lcrit_alarm" in snap.unknown["throttled"]
    assert why in snap.unknown["vcgencmd pmic_read_adc"]
    assert snap.board_power_w is None and "board_power" in snap.unknown
    assert snap.temp_c == 52.35 and snap.cpu_freq_mhz == 2400.0  # sysfs sensors unaffected
    calls = len(runner.calls)
    clock.t += 10.0
    again = reader.read()  # a failed command is not retried at every sample
    assert len(runner.calls) == calls and why in again.unknown["vcgencmd get_throttled"]
    clock.t += 25.0
    reader.read()
    assert len(runner.calls) == 2 * calls


def test_vcgencmd_outputs_are_reused_for_the_command_interval() -> None:
    runner = runner_for("raspberry-pi-5")
    clock = Clock()
    reader = reader_for("raspberry-pi-5", "raspberry-pi-5", runner=runner, clock=clock, command_interval_s=2.0)
    first = reader.read()
    clock.t += 1.0
    second = reader.read()
    assert runner.calls == ["vcgencmd get_throttled", "vcgencmd pmic_read_adc"]
    assert second.board_power_w == first.board_power_w and second.throttled == first.throttled
    clock.t += 1.5
    reader.read()
    assert len(runner.calls) == 4


def test_measure_temp_is_the_fallback_without_zones(tmp_path: Path) -> None:
    root = copy_fixture("raspberry-pi-4", tmp_path)
    shutil.rmtree(root / "sys/class/thermal")
    runner = runner_for("raspberry-pi-4")
    snap = reader_for(root, "raspberry-pi-4", runner=runner).read()
    assert snap.temp_c == 45.2
    assert [(t.source, t.temp_c) for t in snap.temps] == [("vcgencmd", 45.2)]
    assert "vcgencmd measure_temp" in runner.calls
    assert "none of the profile's zones" in snap.unknown["temp_c"]


@pytest.mark.parametrize(
    "override,key",
    [
        ({"vcgencmd get_throttled": 'error=1 error_msg="Command not registered"\n'}, "vcgencmd get_throttled"),
        ({"vcgencmd pmic_read_adc": 'error=2 error_msg="Invalid arguments"\n'}, "vcgencmd pmic_read_adc"),
    ],
)
def test_unparsable_vcgencmd_output_is_unknown(override: dict[str, str], key: str) -> None:
    snap = reader_for("raspberry-pi-5", "raspberry-pi-5", runner=runner_for("raspberry-pi-5", **override)).read()
    assert "unparsable output" in snap.unknown[key]
    if key.endswith("get_throttled"):
        # the word is not read; the rpi_volt hwmon alarm of the recorded tree still gives the under-voltage bits
        assert snap.throttled is not None and snap.throttled.raw == 0 and "under-voltage only" in snap.unknown["throttled"]
        assert snap.board_power_w == pytest.approx(PI5_TOTAL_W)
    else:
        assert snap.rails == () and snap.board_power_w is None and snap.throttled is not None


def test_pmic_nan_line_is_unknown_but_the_sum_stands() -> None:
    text = json.loads((FIX / "raspberry-pi-5/commands.json").read_text())["vcgencmd pmic_read_adc"]
    text = text.replace("BATT_V volt(25)=0.00000000V", "BATT_V volt(25)=nanV")
    snap = reader_for("raspberry-pi-5", "raspberry-pi-5", runner=runner_for("raspberry-pi-5", **{"vcgencmd pmic_read_adc": text})).read()
    assert "not a number" in snap.unknown["rail:BATT"]
    assert snap.board_power_w == pytest.approx(PI5_TOTAL_W)  # BATT carries no current: never summed


@pytest.mark.parametrize(
    "profile,vcgencmd,want_calls",
    [
        (None, None, []),  # no profile: never guess that this is a Pi
        ("generic-aarch64", None, []),
        (None, True, ["vcgencmd get_throttled"]),  # explicitly asked
        ("raspberry-pi-5", False, []),  # explicitly refused
        ("raspberry-pi-5", None, ["vcgencmd get_throttled", "vcgencmd pmic_read_adc"]),
    ],
)
def test_vcgencmd_only_for_a_pi_or_when_asked(profile: str | None, vcgencmd: bool | None, want_calls: list[str]) -> None:
    runner = runner_for("raspberry-pi-5")
    reader_for("raspberry-pi-5", profile, runner=runner, vcgencmd=vcgencmd).read()
    assert runner.calls == want_calls


def test_run_command_raises_sensor_unavailable() -> None:
    with pytest.raises(SensorUnavailable, match="not installed"):
        run_command(["edge-sdk-no-such-program-4711"], 1.0)
    with pytest.raises(SensorUnavailable, match="exit status 3: boom"):
        run_command([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], 30.0)
    with pytest.raises(SensorUnavailable, match="timed out"):
        run_command([sys.executable, "-c", "import time; time.sleep(30)"], 0.3)
    assert run_command([sys.executable, "-c", "print('throttled=0x0')"], 30.0).strip() == "throttled=0x0"


def test_recorded_runner_refuses_unrecorded_commands() -> None:
    runner = RecordedRunner({"vcgencmd get_throttled": "throttled=0x0\n"})
    assert runner(["vcgencmd", "get_throttled"], 1.0) == "throttled=0x0\n"
    with pytest.raises(SensorUnavailable, match="no recorded output"):
        runner(["vcgencmd", "measure_temp"], 1.0)
    assert runner.calls == ["vcgencmd get_throttled", "vcgencmd measure_temp"]


# --------------------------------------------------------------------------- which temperature is watched


def _zones_tree(root: Path, zones: list[tuple[str, str]]) -> Path:
    for i, (zone_type, temp) in enumerate(zones):
        d = root / f"sys/class/thermal/thermal_zone{i}"
        d.mkdir(parents=True)
        (d / "type").write_text(zone_type + "\n")
        (d / "temp").write_text(temp + "\n")
    return root


@pytest.mark.parametrize(
    "root,profile,want,note",
    [
        ("jetson-orin-nano-jp6", "jetson-orin-nano", 47.875, None),  # hottest profile zone (tj)
        ("jetson-orin-nano-jp6", with_zones("jetson-orin-nano", ("gpu-thermal",)), 46.125, None),  # only the named zone
        ("jetson-orin-nano-jp6", with_zones("jetson-orin-nano", ("GPU-Thermal",)), 46.125, None),  # case-insensitive
        ("jetson-orin-nano-jp6", with_zones("jetson-orin-nano", ("cv0-thermal",)), 47.875, "none of the profile's zones"),  # offline
        ("x86-rapl", "generic-x86_64", 44.0, None),  # no zones named: hottest CPU-like, not the 58 C chipset
        ("jetson-nano-jp4", "generic-aarch64", 38.5, None),  # CPU-therm; PMIC-Die (100 C) is never watched
    ],
)
def test_watched_temperature(root: str, profile: Any, want: float, note: str | None) -> None:
    snap = reader_for(root, profile).read()
    assert snap.temp_c == want
    assert (note in snap.unknown["temp_c"]) if note else ("temp_c" not in snap.unknown)


@pytest.mark.parametrize(
    "source,name,want",
    [
        ("thermal_zone", "cpu-thermal", True),  # Pi, Orin
        ("thermal_zone", "CPU-therm", True),  # Jetson Nano (L4T)
        ("thermal_zone", "soc0-thermal", True),
        ("thermal_zone", "tj-thermal", True),  # Tegra junction maximum
        ("thermal_zone", "x86_pkg_temp", True),
        ("hwmon", "k10temp/Tctl", True),  # AMD
        ("hwmon", "coretemp/Core 0", True),  # Intel, by driver
        ("vcgencmd", "measure_temp", True),
        ("thermal_zone", "cpu-pmic", False),  # PMIC sensors are never watched
        ("thermal_zone", "PMIC-Die", False),
        ("thermal_zone", "pch_cannonlake", False),  # chipset
        ("thermal_zone", "acpitz", False),  # board
        ("thermal_zone", "thermal-fan-est", False),
        ("hwmon", "nvme/Composite", False),
        ("thermal_zone", "gpu-thermal", False),
    ],
)
def test_cpu_like_rule(source: str, name: str, want: bool) -> None:
    assert is_cpu_like(TempReading(source, name, "/x", 50.0)) is want


def test_no_cpu_zone_watches_the_hottest_non_pmic_zone(tmp_path: Path) -> None:
    root = _zones_tree(tmp_path, [("AO-therm", "36500"), ("PMIC-Die", "100000"), ("thermal-fan-est", "37400")])
    assert reader_for(root, "generic-aarch64").read().temp_c == 37.4


def test_reads_the_thermal_simulator_tree(tmp_path: Path) -> None:
    from edge_sdk.budget.simulator import ThermalSimulator

    ThermalSimulator(tmp_path, start_c=61.5, trips_c={"passive": 80.0, "critical": 85.0}, clock=Clock())
    snap = reader_for(tmp_path, "raspberry-pi-5", runner=RecordedRunner({}), vcgencmd=False).read()
    assert snap.temp_c == 61.5 and dict(snap.temps[0].trips_c) == {"passive": 80.0, "critical": 85.0}


def test_no_temperature_at_all(tmp_path: Path) -> None:
    snap = reader_for(_zones_tree(tmp_path, [("cpu-thermal", "-256000")]), "generic-aarch64").read()
    assert snap.temp_c is None and snap.unknown["temp_c"] == "no readable temperature sensor"
    empty = reader_for(tmp_path / "nothing-here", None).read()
    assert empty.temp_c is None and "no thermal zone" in empty.unknown["temp_c"]


# --------------------------------------------------------------------------- INA3221 layouts and board power


def _ina_tree(root: Path, layout: str, rails: list[tuple[str, int, int]]) -> Path:
    """One INA3221 with ``rails`` as (label, mV, mA) in the JetPack 4 (iio) or 5/6 (hwmon) layout."""
    if layout == "hwmon":
        dev = root / "sys/bus/i2c/devices/1-0040"
        hw = dev / "hwmon/hwmon3"
        hw.mkdir(parents=True)
        (dev / "name").write_text("ina3221\n")
        for k, (label, mv, ma) in enumerate(rails, start=1):
            (hw / f"in{k}_label").write_text(label + "\n")
            (hw / f"in{k}_input").write_text(f"{mv}\n")
            (hw / f"curr{k}_input").write_text(f"{ma}\n")
        (hw / "in7_label").write_text("sum of shunt voltages\n")
        (hw / "in7_input").write_text("40\n")
    else:
        iio = root / "sys/bus/i2c/devices/6-0040/iio:device0"
        iio.mkdir(parents=True)
        (iio.parent / "name").write_text("ina3221x\n")
        for k, (label, mv, ma) in enumerate(rails):
            (iio / f"rail_name_{k}").write_text(label + "\n")
            (iio / f"in_voltage{k}_input").write_text(f"{mv}\n")
            (iio / f"in_current{k}_input").write_text(f"{ma}\n")
            (iio / f"in_power{k}_input").write_text(f"{mv * ma // 1000}\n")
    return root


@pytest.mark.parametrize(
    "rails,want_w,want_source",
    [
        ([("POM_5V_IN", 5000, 640), ("POM_5V_GPU", 5000, 40), ("POM_5V_CPU", 5000, 320)], 3.2, "rail POM_5V_IN"),
        ([("GPU", 5000, 560), ("CPU", 5000, 320), ("SOC", 5000, 200)], 5.4, "sum of 3 ina3221 rails"),  # no total rail
    ],
)
def test_jetpack4_and_jetpack5_layouts_agree(tmp_path: Path, rails: list[tuple[str, int, int]], want_w: float, want_source: str) -> None:
    snaps = [reader_for(_ina_tree(tmp_path / layout, layout, rails), "jetson-nano").read() for layout in ("iio", "hwmon")]
    for snap in snaps:
        assert snap.board_power_w == pytest.approx(want_w, abs=1e-12) and snap.board_power_source == want_source
    assert [(r.name, r.power_w) for r in snaps[0].rails] == [(r.name, pytest.approx(r.power_w)) for r in snaps[1].rails]
    assert [r.source for r in snaps[0].rails + snaps[1].rails] == ["ina3221-iio"] * 3 + ["ina3221-hwmon"] * 3


def test_ina3221_seen_twice_is_read_once(tmp_path: Path) -> None:
    root = _ina_tree(tmp_path, "hwmon", [("VDD_IN", 5000, 1000), ("VDD_SOC", 5000, 400)])
    driver = root / "sys/bus/i2c/drivers/ina3221"
    driver.mkdir(parents=True)
    (driver / "1-0040").symlink_to(root / "sys/bus/i2c/devices/1-0040")  # the driver directory links the same device
    snap = reader_for(root, "jetson-orin-nano").read()
    assert [r.name for r in snap.rails] == ["VDD_IN", "VDD_SOC"] and snap.board_power_w == 5.0


def test_nc_channels_are_skipped(tmp_path: Path) -> None:
    root = _ina_tree(tmp_path, "hwmon", [("VDD_SYNC", 5000, 100), ("NC", 0, 0), ("VDD_NC", 0, 0)])
    assert [r.name for r in reader_for(root, "jetson-orin-nano").read().rails] == ["VDD_SYNC"]


def test_profile_rails_when_no_total_rail(tmp_path: Path) -> None:
    root = copy_fixture("jetson-orin-nano-jp6", tmp_path)
    hw = root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1"
    (hw / "in1_label").write_text("VDD_SYS_5V\n")  # no VDD_IN on this carrier
    snap = reader_for(root, with_rails("jetson-orin-nano", ("VDD_CPU_GPU_CV", "VDD_SOC"))).read()
    assert snap.board_power_w == pytest.approx(4.86144) and snap.board_power_source == "profile rails VDD_CPU_GPU_CV+VDD_SOC"
    missing = reader_for(root, with_rails("jetson-orin-nano", ("VDD_GPU",))).read()
    assert missing.board_power_w == pytest.approx(6.562944 + 4.86144) and missing.board_power_source == "sum of 3 ina3221 rails"
    assert "VDD_GPU" in missing.unknown["profile_rails"]


def test_scan_uses_the_same_parsers() -> None:
    got = {(r.kind, r.name, r.value) for r in scan(FIX / "jetson-nano-jp4") if r.kind == "ina3221"}
    assert got == {("ina3221", "POM_5V_IN", 3.224), ("ina3221", "POM_5V_GPU", 0.199), ("ina3221", "POM_5V_CPU", 1.592)}
    zones = {r.name: r.value for r in scan(FIX / "jetson-orin-nano-jp6") if r.kind == "thermal"}
    assert zones["cv0-thermal"] is None and zones["tj-thermal"] == 47.875


# --------------------------------------------------------------------------- battery, describe, this machine


def test_battery_source_failure_is_unknown() -> None:
    def broken() -> BatteryReading | None:
        raise OSError("power_supply went away")

    snap = reader_for("x86-rapl", "generic-x86_64", battery=broken).read()
    assert snap.battery is None and "power_supply went away" in snap.unknown["battery"]
    assert reader_for("x86-rapl", "generic-x86_64", battery=lambda: None).read().battery is None


def test_psutil_battery_on_this_machine() -> None:
    got = psutil_battery()
    assert got is None or (isinstance(got, BatteryReading) and got.percent is not None and 0.0 <= got.percent <= 100.0)


def test_describe() -> None:
    orin = reader_for("jetson-orin-nano-jp6", "jetson-orin-nano").describe()
    assert [r["name"] for r in orin["rails"]] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    assert len(orin["temps"]) == 9 and orin["temps"][0]["trips_c"] == {"critical": 104.5, "passive": 99.0}
    assert orin["vcgencmd"] == [] and orin["cpufreq_files"] == 6 and orin["power_sensor"] == "ina3221"
    pi5 = reader_for("raspberry-pi-5", "raspberry-pi-5").describe()
    assert pi5["vcgencmd"] == ["vcgencmd get_throttled", "vcgencmd pmic_read_adc", "vcgencmd measure_temp"]
    json.dumps(orin), json.dumps(pi5)


def test_reads_are_cheap() -> None:
    reader = reader_for("jetson-orin-nano-jp6", "jetson-orin-nano", clock=time.monotonic)
    reader.read()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        reader.read()
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.02  # target is well under 5 ms; generous for a shared CI box


def test_this_machine_does_not_raise() -> None:
    profile = resolve_profile().profile
    reader = SensorReader(profile)  # root "/", real vcgencmd runner, psutil battery, monotonic clock
    first = reader.read()
    time.sleep(0.1)
    second = reader.read()
    assert isinstance(second, SensorSnapshot) and second.timestamp_ms > first.timestamp_ms
    assert second.cpu_util_pct is not None or "cpu_util" in second.unknown
    if second.cpu_util_pct is not None:
        assert 0.0 <= second.cpu_util_pct <= 100.0
    json.dumps(second.to_dict())
    json.dumps(reader.describe())


# --------------------------------------------------------------------------- rpi_volt hwmon (no vcgencmd)


def _add_rpi_volt(root: Path, alarm: str, *, index: int = 3) -> Path:
    """The chip raspberrypi-hwmon.c registers: hwmon<N>/name 'rpi_volt' and in0_lcrit_alarm (0 or 1)."""
    chip = root / "sys" / "class" / "hwmon" / f"hwmon{index}"
    chip.mkdir(parents=True)
    (chip / "name").write_text("rpi_volt\n")
    (chip / "in0_lcrit_alarm").write_text(alarm)
    return chip


def test_rpi_volt_alarm_gives_under_voltage_without_vcgencmd(tmp_path: Path) -> None:
    root = copy_fixture("raspberry-pi-4", tmp_path)
    # another hwmon chip first: only the one named rpi_volt counts
    other = root / "sys" / "class" / "hwmon" / "hwmon0"
    other.mkdir(parents=True)
    (other / "name").write_text("cpu_thermal\n")
    (other / "in0_lcrit_alarm").write_text("1\n")
    chip = _add_rpi_volt(root, "0\n")
    missing = RecordedRunner({"vcgencmd get_throttled": FileNotFoundError("vcgencmd")})  # a container: no vcgencmd
    reader = reader_for(root, "raspberry-pi-4", runner=missing)
    snap = reader.read()
    assert snap.throttled is not None and snap.throttled.raw == 0 and not snap.throttled.any_now
    assert "vcgencmd get_throttled" in snap.unknown and "under-voltage only" in snap.unknown["throttled"]
    assert reader.describe()["under_voltage_alarm"] == str(chip / "in0_lcrit_alarm")
    (chip / "in0_lcrit_alarm").write_text("1\n")  # the firmware saw under-voltage in the driver's last 2 s poll
    snap = reader.read()
    assert snap.throttled is not None and snap.throttled.under_voltage_now and snap.throttled.under_voltage_since_boot
    assert not snap.throttled.throttled_now and snap.throttled.any_now
    # the governor takes it as firmware throttling (CRITICAL evidence), as it does vcgencmd's flags
    assert snap.throttled.raw == 0x10001


def test_rpi_volt_alarm_is_read_with_vcgencmd_off_and_never_overrides_it(tmp_path: Path) -> None:
    root = copy_fixture("raspberry-pi-4", tmp_path)
    _add_rpi_volt(root, "1\n")
    snap = reader_for(root, None, runner=RecordedRunner({})).read()  # no profile: vcgencmd never runs
    assert snap.throttled is not None and snap.throttled.under_voltage_now
    # where vcgencmd works, its full word is used and the hwmon file is not consulted
    snap = reader_for(root, "raspberry-pi-4", runner=runner_for("raspberry-pi-4", **{"vcgencmd get_throttled": "throttled=0x0\n"})).read()
    assert snap.throttled is not None and snap.throttled.raw == 0 and "throttled" not in snap.unknown


@pytest.mark.parametrize(("content", "why"), [("2\n", "expected 0 or 1, got 2"), ("", "empty"), ("x\n", "not a number: 'x'")])
def test_rpi_volt_alarm_bad_content_is_unknown_not_a_flag(tmp_path: Path, content: str, why: str) -> None:
    root = copy_fixture("raspberry-pi-4", tmp_path)
    chip = _add_rpi_volt(root, content)
    snap = reader_for(root, None, runner=RecordedRunner({})).read()
    assert snap.throttled is None
    assert snap.unknown["throttled"] == f"rpi_volt hwmon: {chip / 'in0_lcrit_alarm'}: {why}"
