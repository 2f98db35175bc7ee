"""Every benchmark figure carries the machine it was measured on (CPU model, flags, load average, date)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from edge_sdk.bench.machine import CPU_FLAGS, finish_record, machine_line, machine_record
from edge_sdk.profiles import read_facts

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"cpu_model", "cpu_flags", "cpu_count", "usable_cpus", "loadavg_before", "loadavg_after", "date_utc"}


def test_machine_record_fields() -> None:
    rec = machine_record()
    assert FIELDS <= set(rec)
    facts = read_facts("/")
    assert rec["cpu_model"] == facts.cpu_model
    assert set(rec["cpu_flags"]) == {f for f in CPU_FLAGS if f in facts.cpu_features}
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", rec["date_utc"])
    assert rec["loadavg_after"] is None
    finish_record(rec)
    assert isinstance(rec["loadavg_after"], list) and len(rec["loadavg_after"]) == 3
    line = machine_line(rec)
    assert str(rec["cpu_model"]) in line and "load average" in line and rec["date_utc"] in line


def test_every_bench_script_records_the_machine() -> None:
    scripts = sorted((ROOT / "tools" / "bench").glob("bench_*.py"))
    assert len(scripts) >= 12
    missing = [p.name for p in scripts if "machine_record(" not in p.read_text() and "cpu_facts(" not in p.read_text()]
    assert missing == []


def test_a_bench_json_carries_the_record(tmp_path: Path) -> None:
    out = tmp_path / "pp.json"
    r = subprocess.run(
        [sys.executable, "tools/bench/bench_preprocess.py", "--frames", "3", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())["machine_record"]
    assert FIELDS <= set(rec) and rec["loadavg_after"] is not None
