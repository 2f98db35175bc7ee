"""The face pipeline against MediaPipe Tasks, paired round by round, on 2 cores and on 1.

``bench_pipeline.py`` section C runs MediaPipe's rounds in one subprocess and edge_sdk's in another
part of the run, minutes apart; on a host whose speed drifts by a third between minutes, that ratio
moves with the drift. Here a MediaPipe FaceDetector (VIDEO mode, the same .tflite by path) stays up
in its own venv (``mediapipe_bench_worker.py serve``), and each round times, back to back, with the
order alternating:

- ``mediapipe``: its end-to-end round (``cv2.VideoCapture.read`` -> BGR->RGB -> ``mp.Image`` ->
  ``detect_for_video``) over the whole 640x480 MJPG clip;
- ``edge_sdk``: ``VisionPipeline(model, clip, PipelineOptions(drop_policy="block"))`` with the model
  loaded as a user would (``edge_sdk.load(pkg)``: threads and pipeline mode left to ``auto``); on 2
  cores also ``model_threads="keep"`` (the model's own 2 threads) and fixed thread/worker counts;
  and ``decode="worker"`` (``auto`` decodes on the output thread there);
- ``plain``: the loop a user would write on the same model (``cap.read()`` ->
  ``model.predict_image(frame, color="BGR")``);
- on 1 core also the floor the two share: ``cap.read()`` then a raw LiteRT ``invoke`` (threads 1)
  on that frame's tensor, preprocessed beforehand, and nothing else. That is what a runtime with
  no cost of its own besides the video decode and the model would take per frame (the two
  interleaved, as in any loop, so each pays for what the other does to the caches); MediaPipe's
  time over it is the ratio such a runtime would reach (``bound``).

Each ratio is the median of the per-round ratios (a slow spell hits both arms of a pair). On 1 core
both processes are pinned to the same CPU (``os.sched_setaffinity``, what ``taskset -c`` does)
before any model is loaded, so edge_sdk's ``auto`` sees one CPU. Targets (issue 20): 2.5x MediaPipe
on 2 cores, 1.5x on 1 core, and never slower than the plain loop.

    python tools/bench/bench_vs_mediapipe.py --mp-venv ~/.cache/edge_sdk/mp-venv [--rounds 15] [--frames 150] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402
from tools.bench.bench_pipeline import WORKER, RawLiteRT, ensure_mediapipe_venv, plain_loop  # noqa: E402
from tools.fixtures.face_clip import read_clip, write_clip  # noqa: E402
from tools.fixtures.face_package import MODEL_NAME, write_face_package  # noqa: E402

TARGETS = {"2 cores": 2.5, "1 core": 1.5}


class MediaPipeServer:
    """``mediapipe_bench_worker.py serve`` in the MediaPipe venv: one timed round per request."""

    def __init__(self, py: Path, video: Path, model: Path, cpu: int | None) -> None:
        cmd = [str(py), str(WORKER), "serve", "--video", str(video), "--model", str(model)]
        if cpu is not None:
            cmd += ["--cpus", str(cpu)]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.frames = int(self._reply()["frames"])

    def _reply(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"the MediaPipe worker ended (rc {self.p.wait(timeout=30)}) without a reply")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def round(self, arm: str = "with_decode") -> float:
        assert self.p.stdin is not None
        self.p.stdin.write(arm + "\n")
        self.p.stdin.flush()
        return float(self._reply()["fps"])

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        self.p.wait(timeout=60)


def _setting(name: str, mp: MediaPipeServer, pkg: Path, model_file: Path, video: Path, cache: Path, rounds: int, floor: bool) -> dict[str, Any]:
    import cv2

    import edge_sdk
    from edge_sdk.pipelines import CallbackSink, PipelineOptions, VisionPipeline, source_from_uri
    from edge_sdk.processing.image import preprocess_image

    model = edge_sdk.load(pkg, cache_dir=cache)  # threads from what this process may use
    frames = read_clip(video)
    resolved: dict[str, Any] = {"model_threads": model.session.info.threads}

    def pipeline(key: str, m: Any, opts: PipelineOptions) -> Callable[[], int]:
        def run() -> int:
            p = VisionPipeline(m, source_from_uri(str(video)), opts, sinks=[CallbackSink(lambda fr: None)])
            resolved[key] = p.preprocess
            resolved[f"{key}_decode"] = p.decode
            resolved[f"{key}_model_threads"] = p.model.session.info.threads
            c = p.run()
            if c.processed != len(frames) or c.dropped_total:
                raise RuntimeError(f"{name} {key}: expected every frame processed, got {c}")
            return c.processed

        return run

    arms: dict[str, Callable[[], int]] = {
        "edge_sdk": pipeline("edge_sdk", model, PipelineOptions(drop_policy="block")),
        "plain": lambda: plain_loop(video, model),
    }
    others: dict[str, Any] = {}
    if not floor:  # 2 cores: also the configurations auto does not pick, to check its choice
        # the decode on the worker (auto puts it on the output thread here; on 1 core "inline" has none)
        arms["edge_sdk_decode_worker"] = pipeline("decode_worker", model, PipelineOptions(drop_policy="block", decode="worker"))
        # the model as loaded (the CPUs' 2 threads), then fixed thread and worker counts
        arms["edge_sdk_keep"] = pipeline("keep", model, PipelineOptions(drop_policy="block", model_threads="keep"))
        for t, w in ((1, 1), (1, 2), (2, 2)):
            m = others[f"t{t}_w{w}"] = edge_sdk.load(pkg, threads=t, cache_dir=cache)
            arms[f"edge_sdk_t{t}_w{w}"] = pipeline(f"t{t}_w{w}", m, PipelineOptions(drop_policy="block", workers=w))
    if floor:
        raw = RawLiteRT(model_file, 1)
        tensors = [preprocess_image(f, model.inputs[0], color="BGR")[0] for f in frames]

        def floor_loop() -> int:
            cap, n = cv2.VideoCapture(str(video)), 0
            while cap.read()[0]:
                raw(tensors[n])
                n += 1
            cap.release()
            return n

        arms["floor"] = floor_loop
    for fn in arms.values():  # warm-up, not timed
        fn()
    mp.round()
    fps: dict[str, list[float]] = {k: [] for k in ("mediapipe", *arms)}
    keys = ["mediapipe", *arms]
    for r in range(rounds):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            if k == "mediapipe":
                fps[k].append(mp.round())
                continue
            t0 = time.perf_counter()
            n = arms[k]()
            fps[k].append(n / (time.perf_counter() - t0))
    model.close()
    for m in others.values():
        m.close()

    def paired(a: str, b: str) -> float:
        return statistics.median([x / y for x, y in zip(fps[a], fps[b])])

    out: dict[str, Any] = {
        "resolved": resolved,
        "fps_median": {k: statistics.median(v) for k, v in fps.items()},
        "fps_rounds": fps,
        "edge_vs_mediapipe": paired("edge_sdk", "mediapipe"),
        "edge_vs_plain": paired("edge_sdk", "plain"),
        "plain_vs_mediapipe": paired("plain", "mediapipe"),
        "target_vs_mediapipe": TARGETS[name],
        "configs_vs_mediapipe": {k: paired(k, "mediapipe") for k in fps if k.startswith("edge_sdk_")},
        # above 1: that configuration beat what auto picked (edge_sdk) in the same rounds
        "configs_vs_auto": {k: paired(k, "edge_sdk") for k in fps if k.startswith("edge_sdk_")},
    }
    if floor:
        out["bound_vs_mediapipe"] = paired("floor", "mediapipe")
        out["edge_vs_floor"] = paired("edge_sdk", "floor")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mp-venv", type=Path, required=True, help="a venv with mediapipe 0.10.21 (made there if missing)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    py, _ = ensure_mediapipe_venv(a.mp_venv.expanduser(), install=True)
    rec = machine_record()
    from tools.fixtures.fetch_pretrained import fetch

    res: dict[str, Any] = {"rounds": a.rounds, "frames": a.frames}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edge-sdk-vs-mp-") as tmp:
        work = Path(tmp)
        video = work / "faces.avi"
        write_clip(video, a.frames)
        model_file = fetch(MODEL_NAME)
        pkg = write_face_package(work / "pkg", model_file)
        cpus = sorted(os.sched_getaffinity(0))
        for name, cpu in (("2 cores", None), ("1 core", cpus[0])):
            if cpu is None and len(cpus) < 2:
                continue
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})  # before this setting's model and threads exist
            mp = MediaPipeServer(py, video, model_file, cpu)
            try:
                res[name] = _setting(name, mp, pkg, model_file, video, work / "cache", a.rounds, floor=cpu is not None)
            finally:
                mp.close()
            res[name]["cpus"] = [cpu] if cpu is not None else cpus
    res["wall_s"] = time.perf_counter() - t_start
    res["machine_record"] = finish_record(rec)
    for name in ("2 cores", "1 core"):
        if name not in res:
            continue
        r = res[name]
        f = r["fps_median"]
        line = ", ".join(f"{k} {v:.0f}" for k, v in f.items())
        print(
            f"{name} (model threads {r['resolved']['model_threads']}, the pipeline's {r['resolved'].get('edge_sdk_model_threads')}, "
            f"preprocess {r['resolved'].get('edge_sdk')}, decode {r['resolved'].get('edge_sdk_decode')}): fps {line}"
        )
        print(
            f"  edge_sdk / MediaPipe {r['edge_vs_mediapipe']:.2f}x (target {r['target_vs_mediapipe']}x), "
            f"edge_sdk / plain loop {r['edge_vs_plain']:.3f}x, plain / MediaPipe {r['plain_vs_mediapipe']:.2f}x"
            + (f"; floor (read + raw invoke) / MediaPipe {r['bound_vs_mediapipe']:.2f}x, edge_sdk / floor {r['edge_vs_floor']:.3f}x" if "bound_vs_mediapipe" in r else "")
        )
        if r["configs_vs_auto"]:
            print("  vs what auto picked: " + ", ".join(f"{k[len('edge_sdk_'):]} {v:.3f}x" for k, v in r["configs_vs_auto"].items()))
    print(f"{a.rounds} paired rounds, {res['wall_s']:.0f} s; {machine_line(rec)}")
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
