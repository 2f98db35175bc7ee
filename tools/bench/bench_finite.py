"""What a NaN/Inf check of an input costs right after an ONNX Runtime call, method by method.

In ``Model.predict`` the finiteness check runs after the previous call's inference evicted numpy's
dispatch code and the input from the caches, so a tight loop of the check alone measures the wrong
thing. Here every timed check follows one ``InferenceSession.run``: the trivial Add model for small
inputs (1x16 to 1x4096), MobileNetV2 1.0/224 (random weights) for its own 1x3x224x224 input.
Arms interleaved in rounds; medians of round medians, in microseconds.

    python tools/bench/bench_finite.py [--rounds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402
from edge_sdk.validation import _probably_finite  # noqa: E402


def _sum_errstate(x: np.ndarray) -> bool:  # the check before issue 20
    with np.errstate(over="ignore", invalid="ignore"):
        return math.isfinite(np.add.reduce(x, axis=None))


ARMS: dict[str, Callable[[np.ndarray], bool]] = {
    "nothing": lambda x: True,
    "np.isfinite(x).all()": lambda x: bool(np.isfinite(x).all()),
    "sum under np.errstate (before)": _sum_errstate,
    "float64 sum": lambda x: math.isfinite(np.add.reduce(x, axis=None, dtype=np.float64)),
    "sum(x.tolist())": lambda x: math.isfinite(sum(x.ravel().tolist())),
    "np.dot(v, v)": lambda x: math.isfinite(float(np.dot(x.reshape(-1), x.reshape(-1)))),
    "np.vdot(x, x)": lambda x: math.isfinite(np.vdot(x, x)),
    "edge_sdk (_probably_finite)": _probably_finite,
}


def measure(run: Callable[[], Any], x: np.ndarray, rounds: int, per_round: int, arms: dict[str, Callable[[np.ndarray], bool]]) -> dict[str, float]:
    per: dict[str, list[float]] = {k: [] for k in arms}
    names = list(arms)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for k in order:
            f = arms[k]
            ts = []
            for _ in range(per_round):
                run()
                t = time.perf_counter_ns()
                f(x)
                ts.append(time.perf_counter_ns() - t)
            per[k].append(statistics.median(ts))
    return {k: round(statistics.median(v) / 1000, 2) for k, v in per.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import onnxruntime as ort

    from tools.fixtures.mobilenetv2 import build_mobilenetv2, build_trivial

    machine = machine_record()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    triv = ort.InferenceSession(build_trivial(16).SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {triv.get_inputs()[0].name: np.random.rand(1, 16).astype(np.float32)}
    rows: dict[str, dict[str, float]] = {}
    for n in (16, 64, 256, 1024, 4096):
        x = np.random.rand(1, n).astype(np.float32)
        rows[f"1x{n} after the trivial model"] = measure(lambda: triv.run(None, feed), x, args.rounds, 200, ARMS)
    mn = ort.InferenceSession(build_mobilenetv2(1.0, 224, batch=1).SerializeToString(), so, providers=["CPUExecutionProvider"])
    xm = np.random.rand(1, 3, 224, 224).astype(np.float32)
    big = {k: v for k, v in ARMS.items() if k != "sum(x.tolist())"}
    rows["1x3x224x224 after MobileNetV2 (1 thread)"] = measure(lambda: mn.run(None, {mn.get_inputs()[0].name: xm}), xm, max(4, args.rounds // 3), 5, big)
    finish_record(machine)
    cols = list(ARMS)
    print(f"# NaN/Inf check right after an ORT call (median us)\n\nCPU: {machine_line(machine)}\n")
    print("| input | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[c]:.1f}" if c in r else "-" for c in cols) + " |")
    if args.json:
        args.json.write_text(json.dumps({"machine_record": machine, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
