"""Soak under overload: a vision pipeline and signal-stream routers fed at 2x, 5x and 10x what the
model sustains alone, with memory, accounting and state isolation checked all along.

::

    python tools/bench/soak.py --minutes 3 --json docs/soak_x86_64.json

The workloads, the load levels and the checks are described in tools/fixtures/soak_runs.py (the
machinery, shared with tests/test_soak.py); this script runs them for ``--minutes``, prints the
table and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fixtures.soak_runs import LEVELS, WORKLOADS, format_table, run_soak  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0, help="total time of the soak runs (split across workloads x levels)")
    ap.add_argument("--levels", type=float, nargs="+", default=list(LEVELS), help="offered load, as multiples of the capacity")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--capacity-seconds", type=float, default=2.0, help="how long each capacity measurement runs")
    ap.add_argument("--rss-margin-mib", type=float, default=24.0, help="allowed RSS growth after the warm-up")
    ap.add_argument("--json", type=Path, help="write the report here")
    a = ap.parse_args(argv)
    report = run_soak(a.minutes, levels=tuple(a.levels), workloads=tuple(a.workloads), capacity_s=a.capacity_seconds,
                      rss_margin_mib=a.rss_margin_mib, log=lambda s: print(s, file=sys.stderr, flush=True))  # fmt: skip
    print(format_table(report))
    print(f"capacity/s: {report['capacity_per_s']}  load avg: {report['machine']['load_avg']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
