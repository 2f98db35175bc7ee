"""Sensor discovery over recorded-style fake /sys trees (the real interface)."""

from __future__ import annotations

import pytest
from conftest import ROOT

from edge_sdk.budget.discovery import scan

FIX = ROOT / "tests" / "fixtures" / "devices"

# (fixture, expected (kind, name, value) readings) — one row per board family
CASES = [
    ("raspberry-pi-5", {("thermal", "cpu-thermal", 52.35)}),  # millidegrees -> degrees C
    (
        "jetson-agx-orin",
        {
            ("thermal", "cpu-thermal", 48.5),
            ("thermal", "gpu-thermal", 46.0),
            ("thermal", "cv0-thermal", -40.0),  # a zone Tegra reports as -40 C when powered off
            ("thermal", "tj-thermal", 49.125),
            ("ina3221", "VDD_GPU_SOC", 2.435),  # 5072 mV x 480 mA
            ("ina3221", "VDD_CPU_CV", 1.623),
            ("ina3221", "VIN_SYS_5V0", 4.838),
        },
    ),
    (
        "x86-64-avx512-vnni",
        {
            ("battery", "BAT0", 87.0),  # the AC supply is not a battery
            ("rapl", "package-0", 123456789.0),
            ("hwmon", "coretemp/temp1_input", 61.0),
            ("hwmon", "coretemp/temp2_input", 59.0),
        },
    ),
    ("raspberry-pi-4", set()),  # no /sys in this recording: nothing, and no error
]


@pytest.mark.parametrize("fixture,want", CASES)
def test_scan(fixture: str, want: set) -> None:
    got = {(r.kind, r.name, None if r.value is None else round(r.value, 3)) for r in scan(FIX / fixture)}
    assert got == want
