"""Telemetry (Prometheus text format, the /metrics endpoint on 127.0.0.1) and `edge-sdk monitor`
(local sensors from recorded-style device trees, and --url against a live endpoint)."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from edge_sdk.budget import command as monitor
from edge_sdk.budget.governor import Budget, Governor, GovernorState
from edge_sdk.budget.sensors import RecordedRunner, SensorReader
from edge_sdk.budget.types import SensorSnapshot
from edge_sdk.profiles import load_profile
from edge_sdk.telemetry import MetricsServer, Registry, Sample, governor_samples, parse, render

FIXTURES = Path(__file__).parent / "fixtures" / "budget"
ROOT = Path(__file__).resolve().parents[1]


def pi4_reader(tmp_path: Path) -> SensorReader:
    root = tmp_path / "pi4"
    shutil.copytree(FIXTURES / "raspberry-pi-4", root)
    runner = RecordedRunner(json.loads((root / "commands.json").read_text()))
    return SensorReader(load_profile("raspberry-pi-4"), root=root, runner=runner, battery=None)


def test_exposition_format_escapes_groups_and_leaves_unknowns_out() -> None:
    text = render([
        Sample("edge_sdk_x", 1.5, "a help", "gauge", {"sensor": 'cpu "0"\\n'}),
        Sample("edge_sdk_x", 2, labels={"sensor": "b"}),
        Sample("edge_sdk_unknown", None, "never made up"),
        Sample("edge_sdk_total", 3, kind="counter"),
        Sample("edge_sdk_inf", math.inf),
    ])  # fmt: skip
    lines = text.splitlines()
    assert lines[:4] == ["# HELP edge_sdk_x a help", "# TYPE edge_sdk_x gauge", 'edge_sdk_x{sensor="cpu \\"0\\"\\\\n"} 1.5', 'edge_sdk_x{sensor="b"} 2']
    assert "edge_sdk_unknown" not in text and "edge_sdk_total 3" in lines and "edge_sdk_inf +Inf" in lines
    back = parse(text)
    assert [(s.name, s.value, dict(s.labels), s.kind) for s in back[:2]] == [
        ("edge_sdk_x", 1.5, {"sensor": 'cpu "0"\\n'}, "gauge"),
        ("edge_sdk_x", 2.0, {"sensor": "b"}, "gauge"),
    ]
    for bad in ("1abc", "a-b", ""):
        with pytest.raises(ValueError, match="metric name"):
            Sample(bad, 1)
    with pytest.raises(ValueError, match="label name"):
        Sample("ok", 1, labels={"bad-label": "x"})
    with pytest.raises(ValueError, match="kind"):
        Sample("ok", 1, kind="histogram")


def test_governor_metrics_on_the_endpoint_follow_the_state(tmp_path: Path) -> None:
    reader = pi4_reader(tmp_path)
    zone = tmp_path / "pi4" / "sys/class/thermal/thermal_zone0/temp"
    clock = [0.0]
    class Fan:  # an app's own ladder step
        name = "fan_on"

        def apply(self, ctx):
            return "fan at 100 %"

        def undo(self, ctx):
            return "fan auto"

    gov = Governor(reader.read, Budget.from_profile(reader.profile, min_dwell_s=0), actions=[Fan()], clock=lambda: clock[0])
    reg = Registry()
    reg.add(governor_samples(gov))
    reg.add(lambda: 1 / 0)  # a broken collector is skipped and counted, the rest still served
    with MetricsServer(reg) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        zone.write_text("50000\n")
        gov.step()

        def scrape() -> dict:
            with urllib.request.urlopen(srv.url, timeout=5) as r:
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in parse(r.read().decode())}

        m = scrape()
        # Pi 4 fixture: throttled 0x50005 now (under-voltage, throttled) -> CRITICAL whatever the temperature
        assert m[("edge_sdk_governor_state", (("state", "critical"),))] == 1
        assert m[("edge_sdk_governor_state", (("state", "normal"),))] == 0
        assert m[("edge_sdk_temperature_celsius", ())] == 50.0
        assert m[("edge_sdk_firmware_throttled_flags", ())] == 0x50005
        assert m[("edge_sdk_sensor_temperature_celsius", (("sensor", "cpu-thermal"), ("source", "thermal_zone")))] == 50.0
        assert m[("edge_sdk_governor_events_total", (("kind", "transition"),))] == 1
        assert m[("edge_sdk_governor_action_events_total", (("action", "fan_on"), ("kind", "applied")))] == 1
        assert m[("edge_sdk_governor_action_applied", (("action", "fan_on"),))] == 1
        assert m[("edge_sdk_telemetry_collector_errors_total", ())] == 1
        assert ("edge_sdk_board_power_watts", ()) not in m  # Pi 4: no power reading, so no made-up number
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(srv.url.replace("/metrics", "/other"), timeout=5)


def _snap(temp: float) -> SensorSnapshot:
    return SensorSnapshot(timestamp_ms=0.0, temp_c=temp)


def test_monitor_local_text_and_json_from_a_device_tree(tmp_path: Path) -> None:
    reader = pi4_reader(tmp_path)
    out = io.StringIO()
    assert monitor.watch(profile=reader.profile, reader=reader.read, count=2, interval_s=0.01, out=out, sleep=lambda s: None) == 0
    text = out.getvalue()
    assert text.count("edge-sdk monitor  raspberry-pi-4") == 2
    assert "governor: CRITICAL" in text and "soft 70 C, hard 77 C" in text
    assert "cpu-thermal" in text and "45.2 C" not in text  # the zone is read; vcgencmd temp only without a zone
    assert "throttled: 0x50005  now: under-voltage, throttled; since boot: under-voltage, throttled" in text
    assert "normal -> critical" in text
    out = io.StringIO()
    monitor.watch(profile=reader.profile, reader=reader.read, count=3, interval_s=0.01, as_json=True, out=out, sleep=lambda s: None)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["sample"] for r in rows] == [1, 2, 3]
    assert rows[0]["governor"]["state"] == "critical" and rows[0]["snapshot"]["throttled"]["raw"] == "0x50005"
    assert [e["kind"] for e in rows[0]["events"]] == ["transition"] and rows[1]["events"] == []  # each event once


def test_monitor_url_shows_a_running_apps_governor(tmp_path: Path) -> None:
    temps = iter([60.0, 72.0, 72.0])
    gov = Governor(lambda: _snap(next(temps)), Budget(soft_c=70, hard_c=80, min_dwell_s=0), actions=[])
    gov.step()
    gov.step()
    assert gov.state is GovernorState.CONSTRAINED
    reg = Registry()
    reg.add(governor_samples(gov))
    with MetricsServer(reg) as srv:
        out = io.StringIO()
        assert monitor.watch(url=srv.url, count=1, interval_s=0.01, out=out) == 0
        assert "governor: CONSTRAINED  temp 72.0 C (soft 70, hard 80)" in out.getvalue()
        out = io.StringIO()
        monitor.watch(url=srv.url, count=1, interval_s=0.01, out=out, as_json=True)
        d = json.loads(out.getvalue())
        assert d["state"] == "constrained" and d["temp_c"] == 72.0 and d["events"]["transition"] == 1


def test_edge_sdk_monitor_cli_in_a_subprocess(tmp_path: Path) -> None:
    root = tmp_path / "orin"
    shutil.copytree(FIXTURES / "jetson-orin-nano-jp6", root)
    p = subprocess.run(
        [sys.executable, "-m", "edge_sdk.cli", "monitor", "--profile", "jetson-orin-nano", "--root", str(root), "--count", "2", "--interval", "0.05", "--json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(rows) == 2 and rows[0]["profile"] == "jetson-orin-nano"
    snap = rows[1]["snapshot"]
    assert snap["board_power_source"] == "rail VDD_IN" and snap["board_power_w"] > 0
    assert rows[1]["governor"]["state"] == "normal"
    bad = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "monitor", "--count", "-1"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 1 and "--count >= 0" in bad.stderr


def test_monitor_url_shows_quality_drift_and_shadow_agreement(tmp_path: Path) -> None:
    """A running app with a quality monitor and a shadow checker: `edge-sdk monitor --url` shows the
    drift state, the worst PSI and the shadow agreement read from its /metrics."""
    import time

    import numpy as np

    import edge_sdk
    from edge_sdk.assets import demo_package_path
    from edge_sdk.quality import QualityMonitor, ShadowChecker, reference_from_model
    from tools.fixtures.train_demo import make_split

    with edge_sdk.load(demo_package_path(), "generic-x86_64", threads=1, cache_dir=tmp_path, variant="int8-onnx") as model:
        x, _ = make_split(7, 200)
        tensors = [model.prepare_image(im).feeds["image"] for im in x]
        ref = reference_from_model(model, tensors)
        mon = QualityMonitor(ref, sample_every=1, window=64, evaluate_every=32)
        model.attach_monitor(mon)
        checker = ShadowChecker.local_fp32(model, sample_every=4, max_in_flight=64)
        try:
            dark = make_split(8, 160)[0] // 4  # much darker than the reference: drift
            for im in dark:
                checker.predict_image(np.ascontiguousarray(im))
            deadline = time.monotonic() + 20
            while checker.status()["checked"] < 40 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert mon.status()["state"] == "drift"
            reg = Registry()
            reg.track(mon)
            reg.track(checker)
            with MetricsServer(reg) as srv:
                out = io.StringIO()
                assert monitor.watch(url=srv.url, count=1, interval_s=0.01, out=out) == 0
                out_j = io.StringIO()
                monitor.watch(url=srv.url, count=1, interval_s=0.01, out=out_j, as_json=True)
        finally:
            checker.close()
    text = out.getvalue()
    name = model.manifest.name
    assert f"quality {name}: DRIFT, alarms drift" in text and "sampled 160 of 160" in text and "max PSI" in text, text
    d = json.loads(out_j.getvalue())
    q = d["quality"][name]
    assert q["drift"] and q["sampled"] == 160 and max(q["psi"].values()) >= 0.25
    (key, s), = d["shadow"].items()
    assert key == f"{name} vs local:fp32-onnx" and s["checked"] == 40 and 0.0 <= s["agreement_total"] <= 1.0
    assert f"shadow {key}: agreement" in text and "checked 40 of 160" in text
