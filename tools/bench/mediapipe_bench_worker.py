"""MediaPipe Tasks FaceDetector side of tools/bench/bench_pipeline.py (section C).

Runs inside a separate virtual environment that has ``mediapipe==0.10.21`` (which needs
``numpy<2``, so it cannot share edge_sdk's environment). It imports neither edge_sdk nor
anything from this repository: only the standard library, numpy, OpenCV and mediapipe.

Two modes; each prints one JSON object on stdout (everything else goes to stderr)::

    python mediapipe_bench_worker.py video  --video CLIP.avi --model face_detection_short_range.tflite \
        [--rounds 3] [--cpus 0] [--boxes OUT.json]
    python mediapipe_bench_worker.py serve  --video CLIP.avi --model face_detection_short_range.tflite [--cpus 0]
    python mediapipe_bench_worker.py first  --image FRAME.png --model face_detection_short_range.tflite

``video``: a FaceDetector in VIDEO mode (``detect_for_video``: synchronous, one frame at a time,
timestamps increasing) over every frame of the clip, timed two ways, interleaved per round:

- ``with_decode``: end to end, ``cv2.VideoCapture.read`` -> BGR->RGB -> ``mp.Image`` -> detect;
- ``detect_only``: the frames decoded and converted to ``mp.Image`` beforehand, then only
  ``detect_for_video`` is timed.

It reports frames per second (median over rounds), per-frame latency medians/p99, the process CPU
time per wall second (how many cores MediaPipe kept busy), and the boxes of every frame
(``[x0, y0, x1, y1, score]`` in source pixels, from the last ``detect_only`` round).
``--cpus 0`` pins the process (and every thread it starts) to those CPUs before mediapipe is
imported. MediaPipe's Python API has no thread-count option; its TFLite inference calculator
picks its own XNNPACK thread count.

``serve``: the ``video`` setup (frames decoded, detector warmed up), then one round per line read
from stdin, for paired comparisons: the parent writes ``with_decode`` or ``detect_only`` and reads
back one JSON line (``fps``, ``cpu_per_wall``, ``frames``, ``latency_median_ms``); ``quit`` or end
of input ends it. The parent times its own arms between MediaPipe's rounds, so a slow spell of the
host hits both sides of a pair.

``first``: import-to-first-result, split: ``import mediapipe`` (+ the tasks modules),
``FaceDetector.create_from_options`` (IMAGE mode), and the first ``detect`` on an image file
(read with cv2.imread, converted to RGB). The caller starts a fresh interpreter per sample.

The model is passed by path (``BaseOptions(model_asset_path=...)``): the bench hands it the same
``face_detection_short_range.tflite`` file edge_sdk runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _detector(model: str, mode: str):
    from mediapipe.tasks.python import BaseOptions, vision

    opts = vision.FaceDetectorOptions(
        base_options=BaseOptions(model_asset_path=model),
        running_mode=getattr(vision.RunningMode, mode),
        min_detection_confidence=0.5,  # the defaults, spelled out: the same thresholds edge_sdk's manifest uses
        min_suppression_threshold=0.3,
    )
    return vision.FaceDetector.create_from_options(opts)


def _boxes(result) -> list[list[float]]:
    out = []
    for d in result.detections:
        b = d.bounding_box
        score = float(d.categories[0].score) if d.categories else float("nan")
        out.append([float(b.origin_x), float(b.origin_y), float(b.origin_x + b.width), float(b.origin_y + b.height), score])
    return out


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _video_runners(args: argparse.Namespace):
    """Decode the clip, create and warm up a VIDEO-mode detector; the two timed runs and the detector."""
    import cv2
    import mediapipe as mp
    import numpy as np

    cap = cv2.VideoCapture(args.video)
    if not cap.isOpened():
        raise SystemExit(f"cannot open {args.video}")
    images = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        images.append(mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))))
    cap.release()
    n = len(images)
    if n == 0:
        raise SystemExit(f"{args.video}: no frames")

    det = _detector(args.model, "VIDEO")
    ts = [0]

    def next_ts() -> int:
        ts[0] += 33  # ms; VIDEO mode needs strictly increasing timestamps across the detector's life
        return ts[0]

    for img in images[:10]:  # warm-up (graph start, XNNPACK packing)
        det.detect_for_video(img, next_ts())

    def run_detect_only() -> tuple[float, list[float], float, list]:
        lat, boxes = [], []
        c0, t0 = time.process_time(), time.perf_counter()
        for img in images:
            a = time.perf_counter()
            r = det.detect_for_video(img, next_ts())
            lat.append((time.perf_counter() - a) * 1e3)
            boxes.append(_boxes(r))
        wall = time.perf_counter() - t0
        return wall, lat, (time.process_time() - c0) / wall, boxes

    def run_with_decode() -> tuple[float, list[float], float, int]:
        lat = []
        c0, t0 = time.process_time(), time.perf_counter()
        cap = cv2.VideoCapture(args.video)
        k = 0
        while True:
            a = time.perf_counter()
            ok, bgr = cap.read()
            if not ok:
                break
            img = mp.Image(image_format=mp.ImageFormat.SRGB, data=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
            det.detect_for_video(img, next_ts())
            lat.append((time.perf_counter() - a) * 1e3)
            k += 1
        cap.release()
        wall = time.perf_counter() - t0
        return wall, lat, (time.process_time() - c0) / wall, k

    return n, det, run_detect_only, run_with_decode


def cmd_video(args: argparse.Namespace) -> dict:
    n, det, run_detect_only, run_with_decode = _video_runners(args)
    arms = {"detect_only": {"fps": [], "lat": [], "cpu": []}, "with_decode": {"fps": [], "lat": [], "cpu": []}}
    boxes: list = []
    for r in range(args.rounds):
        order = ("detect_only", "with_decode") if r % 2 == 0 else ("with_decode", "detect_only")
        for arm in order:
            if arm == "detect_only":
                wall, lat, cpu, boxes = run_detect_only()
                frames = n
            else:
                wall, lat, cpu, frames = run_with_decode()
            a = arms[arm]
            a["fps"].append(frames / wall)
            a["lat"].extend(lat)
            a["cpu"].append(cpu)
    det.close()

    def summary(a: dict) -> dict:
        return {
            "fps_median": _pct(a["fps"], 50),
            "fps_rounds": a["fps"],
            "latency_median_ms": _pct(a["lat"], 50),
            "latency_p99_ms": _pct(a["lat"], 99),
            "cpu_per_wall": _pct(a["cpu"], 50),
        }

    out = {
        "frames": n,
        "rounds": args.rounds,
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "detect_only": summary(arms["detect_only"]),
        "with_decode": summary(arms["with_decode"]),
    }
    if args.boxes:
        with open(args.boxes, "w", encoding="utf-8") as f:
            json.dump(boxes, f)
        out["boxes_file"] = args.boxes
    else:
        out["boxes"] = boxes
    return out


def cmd_serve(args: argparse.Namespace) -> None:
    n, det, run_detect_only, run_with_decode = _video_runners(args)
    sys.stdout.write(json.dumps({"ready": True, "frames": n}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd == "detect_only":
            wall, lat, cpu, _ = run_detect_only()
            frames = n
        elif cmd == "with_decode":
            wall, lat, cpu, frames = run_with_decode()
        else:
            raise SystemExit(f"serve: unknown command {cmd!r}; expected with_decode, detect_only or quit")
        reply = {"arm": cmd, "fps": frames / wall, "cpu_per_wall": cpu, "frames": frames, "latency_median_ms": _pct(lat, 50)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    det.close()


def cmd_first(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    import mediapipe as mp
    from mediapipe.tasks.python import vision  # noqa: F401 - part of what a user imports

    t1 = time.perf_counter()
    det = _detector(args.model, "IMAGE")
    t2 = time.perf_counter()
    import cv2

    rgb = cv2.cvtColor(cv2.imread(args.image), cv2.COLOR_BGR2RGB)
    r = det.detect(mp.Image(image_format=mp.ImageFormat.SRGB, data=rgb))
    t3 = time.perf_counter()
    det.close()
    return {
        "total_ms": (t3 - t0) * 1e3,
        "import_ms": (t1 - t0) * 1e3,
        "create_ms": (t2 - t1) * 1e3,
        "first_detect_ms": (t3 - t2) * 1e3,
        "faces": len(r.detections),
        "mediapipe_version": mp.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("video")
    v.add_argument("--video", required=True)
    v.add_argument("--model", required=True)
    v.add_argument("--rounds", type=int, default=3)
    v.add_argument("--cpus", default=None, help="comma-separated CPU ids to pin the process to (before importing mediapipe)")
    v.add_argument("--boxes", default=None, help="write the per-frame boxes to this JSON file instead of stdout")
    sv = sub.add_parser("serve")
    sv.add_argument("--video", required=True)
    sv.add_argument("--model", required=True)
    sv.add_argument("--cpus", default=None, help="comma-separated CPU ids to pin the process to (before importing mediapipe)")
    f = sub.add_parser("first")
    f.add_argument("--image", required=True)
    f.add_argument("--model", required=True)
    args = p.parse_args(argv)
    if getattr(args, "cpus", None):
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    if args.cmd == "serve":
        cmd_serve(args)
        return 0
    out = cmd_video(args) if args.cmd == "video" else cmd_first(args)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
