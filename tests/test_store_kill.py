"""Power-loss safety of the model store: the updater SIGKILLed at >= 200 points
across copy, verify, stage, health check and switch (and recovery killed too);
after each restart the active version is a complete, verified old or new one and
every update has exactly one terminal state. See tests/store_kill_driver.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_sigkill_at_random_points() -> None:
    seed = int(os.environ.get("STORE_KILL_SEED", "20261130"))
    out = subprocess.run(
        [sys.executable, str(HERE / "store_kill_driver.py"), "220", "40", str(seed)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    print(summary)
    assert summary["rounds"] == 260 and summary["killed"] >= 200
    # every outcome class was exercised: not begun, nothing changed, rolled back (killed in health), succeeded
    assert {"failed_no_change", "rolled_back", "succeeded"} <= set(summary["states"])
