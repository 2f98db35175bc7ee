"""Does selection pick the variant that is fastest here? Every variant of a package timed side by side.

For each package (default: the demo package), in one process:

1. ``edge_sdk.load`` with an empty cache, unforced: what selection chooses, and whether it timed the
   candidates here or trusted a recorded benchmark (``selection.measured``, ``explain()``);
2. every variant loaded forced, then ``predict`` on the same preprocessed input, the variants
   interleaved round by round (``--rounds`` rounds of ``--calls`` calls each), median ms per call;
3. the ratio of each variant to the fastest, and whether the chosen one is the fastest or within
   the selection's noise margin of it (``edge_sdk.selection.SLOWER_MARGIN``), and what the
   profile's rank alone (``measure_backends=False``) would have chosen.

Writes ``tools/bench/results/bench_selection_<arch>.json`` with the CPU model, its flags and the load
average before and after (``edge_sdk.bench.generation.cpu_facts``).

Usage::

    python tools/bench/bench_selection.py [PACKAGE ...] [--rounds 7] [--calls 200] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import edge_sdk  # noqa: E402
from edge_sdk.bench.generation import cpu_facts, environment  # noqa: E402
from edge_sdk.selection import SLOWER_MARGIN  # noqa: E402


def _feeds(model: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """One input per model input at its smallest declared shape (images: a real sample when there is one)."""
    from edge_sdk.assets import demo_samples

    ins = model.manifest.inputs_for(model.variant)
    if len(ins) == 1 and ins[0].preprocess is not None:
        return dict(model.prepare_image(demo_samples()[0]).feeds)
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.min_shape()).astype(s.dtype) for s in ins}


def bench_package(path: Path, rounds: int, calls: int, threads: int | None) -> dict[str, Any]:
    kw: dict[str, Any] = {} if threads is None else {"threads": threads}
    with tempfile.TemporaryDirectory() as cache:
        with edge_sdk.load(path, cache_dir=Path(cache), **kw) as m:
            chosen, measured, explain = m.selection.variant_id, m.selection.measured, m.selection.explain()
            profile = m.detection.profile.name
            ids = [c.variant_id for c in m.selection.candidates if c.accepted]
        with edge_sdk.load(path, cache_dir=Path(cache) / "rank", measure_backends=False, **kw) as m:
            by_rank = m.selection.variant_id
        models = {i: edge_sdk.load(path, cache_dir=Path(cache), variant=i, **kw) for i in ids}
        try:
            feeds = {i: _feeds(mm) for i, mm in models.items()}
            per: dict[str, list[float]] = {i: [] for i in ids}
            for i, mm in models.items():  # warm-up
                for _ in range(20):
                    mm.predict(feeds[i])
            for _ in range(rounds):
                for i, mm in models.items():
                    t0 = time.perf_counter_ns()
                    for _ in range(calls):
                        mm.predict(feeds[i])
                    per[i].append((time.perf_counter_ns() - t0) / calls / 1e6)
        finally:
            for mm in models.values():
                mm.close()
    med = {i: statistics.median(v) for i, v in per.items()}
    fastest = min(med, key=lambda k: med[k])
    return {
        "package": str(path),
        "profile": profile,
        "chosen": chosen,
        "chosen_by_rank_alone": by_rank,
        "timed_at_load": measured,
        "median_ms": {i: round(v, 5) for i, v in med.items()},
        "ratio_to_fastest": {i: round(v / med[fastest], 3) for i, v in med.items()},
        "fastest": fastest,
        "chosen_within_margin": med[chosen] <= med[fastest] * SLOWER_MARGIN,
        "rounds": rounds,
        "calls_per_round": calls,
        "explain": explain.splitlines(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("packages", nargs="*", type=Path, help="package folders (default: the demo package)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--calls", type=int, default=200, help="predict calls per variant per round (default 200)")
    ap.add_argument("--threads", type=int, help="runtime threads (default: the profile's)")
    ap.add_argument("--out", type=Path, default=ROOT / "tools" / "bench" / "results" / f"bench_selection_{platform.machine()}.json")
    args = ap.parse_args(argv)
    pkgs = args.packages or [edge_sdk.demo_package_path()]
    started, t0, cpu = _dt.datetime.now(_dt.timezone.utc), time.monotonic(), cpu_facts()
    rows = [bench_package(p, args.rounds, args.calls, args.threads) for p in pkgs]
    after = cpu_facts()["loadavg"]
    env = environment(started, time.monotonic() - t0, rows[0]["profile"], cpu, after)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": env, "packages": rows}, indent=1) + "\n")
    print(f"CPU {cpu['cpu_model']} ({', '.join(k for k, v in cpu['flags'].items() if v)}), load {cpu['loadavg']} -> {after}")
    for r in rows:
        print(f"{r['package']}: chosen {r['chosen']} (timed at load: {r['timed_at_load']}; by rank alone: {r['chosen_by_rank_alone']})")
        for i, ms in sorted(r["median_ms"].items(), key=lambda kv: kv[1]):
            print(f"  {i:14s} {ms:.4f} ms  x{r['ratio_to_fastest'][i]:.2f}")
        print(f"  chosen within {SLOWER_MARGIN - 1:.0%} of the fastest: {r['chosen_within_margin']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
