"""Closed-loop thermal benchmark: a real pipeline heats a simulated SoC; with and without the
budget governor.

    python tools/bench/bench_thermal.py [--seconds 20] [--tau 5] [--json OUT]

The loop itself (the pipeline, the simulated SoC, the sensor reader, the governor, the
calibration and what each arm reports) is tools/fixtures/thermal_loop.py, which
tests/test_budget_thermal_loop.py also runs with short settings; this script runs it with the
long ones and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_thermal.py)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402
from tools.fixtures.thermal_loop import HOT_FULL_C, run  # noqa: E402


def render(r: dict[str, Any]) -> str:
    f, g, s = r["free"], r["governed"], r["settings"]
    tm = r["thermal_model"]
    lines = [
        f"# Thermal closed loop ({r['machine']})",
        "",
        f"Simulated SoC: ambient {tm['ambient_c']:g} C, R {tm['r_c_per_w']:g} C/W, tau {tm['tau_s']:g} s, idle {tm['idle_w']:g} W, "
        f"busy {tm['busy_w']:.2f} W (flat-out utilisation measured here: {r['u_full']:.2f} -> settles at {HOT_FULL_C:g} C). "
        f"Profile {s['profile']}: soft {g['soft_c']:g} C, hard {g['hard_c']:g} C, hysteresis {g['hysteresis_c']:g} C; governor "
        f"samples every {s['sample_interval_s']:g} s, dwell {s['min_dwell_s']:g} s; {s['seconds']:g} s per arm.",
        "",
        "| arm | fps | max C | final C | s above soft | s above soft+hysteresis | s above hard |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, a in (("no governor", f), ("governor (default ladder)", g)):
        lines.append(
            f"| {name} | {a['fps']:.0f} | {a['max_c']:.1f} | {a['final_c']:.1f} | {a['time_above_soft_s']:.2f} | "
            f"{a['time_above_soft_plus_hysteresis_s']:.2f} | {a['time_above_hard_s']:.2f} |"
        )
    lines += [
        "",
        f"Throughput kept: {r['throughput_kept'] * 100:.0f} % of the ungoverned rate; the most any controller could keep in steady "
        f"state under the soft limit: {r['best_steady_fraction'] * 100:.0f} %. Reaction: "
        + (f"{g['reaction_s'] * 1e3:.0f} ms from the sample where the zone crossed {g['soft_c']:g} C to the transition." if g.get("reaction_s") is not None else "n/a.")
        + (f" Energy per inference (the governor's estimate): {g['energy_per_inference_j'] * 1e3:.2f} mJ." if g.get("energy_per_inference_j") else ""),
        "",
        "Governor events:",
        "",
    ]
    for e in g.get("events", []):
        lines.append(f"- {e['timestamp_ms'] / 1e3 - g['events'][0]['timestamp_ms'] / 1e3:6.2f} s {e['kind']} {e['action'] or ''} {e['detail']} ({e['reason']})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="per arm (default 20)")
    ap.add_argument("--tau", type=float, default=5.0, help="simulated thermal time constant, s (default 5)")
    ap.add_argument("--interval", type=float, default=0.1, help="governor sampling interval, s (default 0.1)")
    ap.add_argument("--dwell", type=float, default=2.0, help="governor minimum dwell, s (default 2)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    machine = machine_record()
    r = run(args.seconds, args.tau, args.interval, args.dwell)
    r["machine_record"] = finish_record(machine)
    print(f"CPU: {machine_line(machine)}")
    sys.stdout.write(render(r))
    if args.json:
        args.json.write_text(json.dumps(r, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
