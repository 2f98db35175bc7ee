"""What runtime telemetry costs ``Model.predict`` (docs/benchmarks.md, section A).

Two loads of the trivial model (``tools.fixtures.mobilenetv2.build_trivial(16)``, 1 thread), one with
``LoadOptions(telemetry=True)`` (the default) and one with ``telemetry=False``, called in
interleaved rounds (the order alternates); reports both arms' median and p99 per call and the
paired difference (median over rounds of the round medians' difference, which resists drift of the
machine's speed). Then ``ModelTelemetry.record`` alone (best of 5 runs of 200,000 calls, the
periodic fold included) and one fold of 4096 pending calls.

Usage::

    python tools/bench/bench_telemetry.py [--rounds 200] [--per-round 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_telemetry.py)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--per-round", type=int, default=200)
    args = ap.parse_args(argv)

    import edge_sdk
    from edge_sdk.bench.machine import finish_record, machine_line, machine_record

    machine = machine_record()
    from converters.packaging import write_package
    from edge_sdk.telemetry import FOLD_AT, ModelTelemetry, Provenance
    from tools.fixtures.mobilenetv2 import build_trivial

    pc = time.perf_counter_ns
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_package(
            work / "trivial",
            {
                "name": "trivial-add", "version": "1", "task": "raw",
                "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 16]}],
                "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 16]}],
                "variants": [{"id": "fp32-onnx", "file": "model.onnx", "backend": "onnxruntime", "precision": "fp32"}],
            },
            files={"model.onnx": build_trivial(16).SerializeToString()},
        )  # fmt: skip
        kw = {"threads": 1, "cache_dir": work / "cache"}
        arms = {
            "telemetry on": edge_sdk.load(work / "trivial", "generic-x86_64", telemetry=True, **kw),
            "telemetry off": edge_sdk.load(work / "trivial", "generic-x86_64", telemetry=False, **kw),
        }
        x = np.ones((1, 16), np.float32)
        for m in arms.values():
            for _ in range(500):
                m.predict(x)
        times: dict[str, list[int]] = {k: [] for k in arms}
        diffs = []
        names = list(arms)
        for r in range(args.rounds):
            med = {}
            for name in names if r % 2 == 0 else names[::-1]:
                m, ts = arms[name], []
                for _ in range(args.per_round):
                    t0 = pc()
                    m.predict(x)
                    ts.append(pc() - t0)
                times[name] += ts
                med[name] = statistics.median(ts)
            diffs.append(med["telemetry on"] - med["telemetry off"])
        for name, ts in times.items():
            us = np.array(ts) / 1e3
            print(f"{name:14s} median {np.median(us):6.2f} us   p99 {np.percentile(us, 99):6.2f} us   ({len(us):,} calls)")
        print(f"paired difference (median over {args.rounds} rounds): {statistics.median(diffs) / 1e3:.2f} us per call")
        for m in arms.values():
            m.close()

    tm = ModelTelemetry(Provenance("bench", "1", "0" * 64, "v", "onnxruntime", "onnxruntime", "0", "p"))
    n, best = 200_000, float("inf")
    for _ in range(5):
        t0 = pc()
        for _ in range(n):
            tm.record(6_000, 0, 9_000, 200, 16_000)
        best = min(best, pc() - t0)
    print(f"ModelTelemetry.record alone: {best / n:.0f} ns per call (4 stages, folds included)")
    tm._fold()  # nothing pending
    rng = np.random.default_rng(0)
    for v in rng.integers(1_000, 10**7, FOLD_AT - 1).tolist():  # just under the writer's threshold
        tm.record(v, 0, v, v, v)
    t0 = pc()
    tm._fold()
    print(f"one fold of {FOLD_AT - 1} pending calls: {(pc() - t0) / 1e3:.0f} us (what the recording thread pays once per {FOLD_AT} calls)")
    print(f"CPU: {machine_line(finish_record(machine))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
