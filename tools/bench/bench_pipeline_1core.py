"""The face pipeline on one core: VisionPipeline's modes against the loop a user would write.

Pins this process to one CPU (``os.sched_setaffinity``, what ``taskset -c N`` does), then runs, in
interleaved rounds over the same 640x480 MJPG clip as ``bench_pipeline.py`` (BlazeFace short-range,
fp32 TFLite, model threads 1), each arm once per round, the order rotating:

- ``decode``: a ``cv2.VideoCapture.read`` loop alone;
- ``predict_image``: ``Model.predict_image`` on the frames decoded beforehand;
- ``plain``: ``cap.read()`` then ``model.predict_image(frame, color="BGR")``, one Python loop;
- ``auto``, ``worker``, ``capture``, ``inline``: ``VisionPipeline`` (drop_policy "block", workers 1)
  with that ``preprocess`` (``auto`` resolves to ``inline`` for a file on one CPU).

Each figure is frames per second, the median over rounds; each ratio the median of the per-round
ratios to ``plain`` (paired: a slow spell of the host hits both arms of a round). Nothing here is a
test: the numbers depend on the machine and its load (recorded with the CPU model and flags).

    python tools/bench/bench_pipeline_1core.py [--rounds 12] [--frames 300] [--cpu 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402
from tools.fixtures.face_clip import read_clip, write_clip  # noqa: E402
from tools.fixtures.face_package import MODEL_NAME, write_face_package  # noqa: E402

MODES = ("auto", "worker", "capture", "inline")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--cpu", type=int, default=None, help="the CPU to pin to (default: the first in this process's mask)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if not hasattr(os, "sched_setaffinity"):
        print("bench_pipeline_1core: this platform has no sched_setaffinity", file=sys.stderr)
        return 2
    cpu = a.cpu if a.cpu is not None else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # before any thread starts: every thread inherits it
    rec = machine_record()

    import cv2

    import edge_sdk
    from edge_sdk.pipelines import CallbackSink, PipelineOptions, VisionPipeline, source_from_uri
    from tools.bench.bench_pipeline import plain_loop
    from tools.fixtures.fetch_pretrained import fetch

    with tempfile.TemporaryDirectory(prefix="edge-sdk-1core-") as tmp:
        work = Path(tmp)
        video = work / "faces.avi"
        write_clip(video, a.frames)
        pkg = write_face_package(work / "pkg", fetch(MODEL_NAME))
        model = edge_sdk.load(pkg, threads=1, delegates=(), cache_dir=work / "cache")
        frames = read_clip(video)

        def decode() -> int:
            c = cv2.VideoCapture(str(video))
            n = 0
            while c.read()[0]:
                n += 1
            c.release()
            return n

        def in_memory() -> int:
            for f in frames:
                model.predict_image(f, color="BGR")
            return len(frames)

        resolved: dict[str, str] = {}

        def pipeline(mode: str) -> Callable[[], int]:
            def run() -> int:
                p = VisionPipeline(
                    model,
                    source_from_uri(str(video)),
                    PipelineOptions(drop_policy="block", workers=1, preprocess=mode),
                    sinks=[CallbackSink(lambda fr: None)],
                )
                resolved[mode] = p.preprocess
                c = p.run()
                if c.processed != len(frames) or c.dropped_total:
                    raise RuntimeError(f"pipeline {mode}: expected every frame processed, got {c}")
                return c.processed

            return run

        arms: dict[str, Callable[[], int]] = {"decode": decode, "predict_image": in_memory, "plain": lambda: plain_loop(video, model)}
        arms.update({f"pipeline_{m}": pipeline(m) for m in MODES})
        fps: dict[str, list[float]] = {k: [] for k in arms}
        for f in arms.values():  # warm-up, not timed
            f()
        keys = list(arms)
        t_start = time.perf_counter()
        for r in range(a.rounds):
            for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
                t0 = time.perf_counter()
                n = arms[k]()
                fps[k].append(n / (time.perf_counter() - t0))
        wall = time.perf_counter() - t_start
        model.close()
    finish_record(rec)
    out: dict[str, Any] = {
        "cpu": cpu,
        "frames": len(frames),
        "rounds": a.rounds,
        "wall_s": wall,
        "resolved": resolved,
        "fps_median": {k: statistics.median(v) for k, v in fps.items()},
        "fps_rounds": fps,
        "vs_plain": {k: statistics.median([x / y for x, y in zip(v, fps["plain"])]) for k, v in fps.items() if k.startswith("pipeline_")},
        "machine_record": rec,
    }
    print(f"pinned to CPU {cpu}; {len(frames)} frames, {a.rounds} rounds, {wall:.0f} s; auto resolved to {resolved.get('auto')}")
    for k, v in out["fps_median"].items():
        extra = f"  {out['vs_plain'][k]:.3f}x the plain loop (paired)" if k in out["vs_plain"] else ""
        print(f"{k:18s} {v:8.1f} fps  {1000 / v:6.3f} ms/frame{extra}")
    print(machine_line(rec))
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
