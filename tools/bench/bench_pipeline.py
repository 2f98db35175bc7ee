"""Benchmark the face pipeline: edge_sdk's VisionPipeline on a real video, against the loops and
the library it replaces, on this machine.

The clip (tools/fixtures/face_clip.py, shared with the tests): a 640x480 MJPG .avi written with
``cv2.VideoWriter`` from real photographs
(scikit-image): a 320x320 head-and-shoulders crop of ``skimage.data.astronaut()`` pasted at native
scale on a grey canvas at a position that moves every frame, and, two frames in every ten,
``skimage.data.coffee()`` (no face). Every face frame's expected box follows from the paste offset
and the face box read off the 512x512 photo by hand, ``(182, 82, 270, 176)``. The model: MediaPipe's
BlazeFace short-range detector, fp32 TFLite, out of the pinned mediapipe wheel
(``tools.fixtures.fetch_pretrained``), packaged with a manifest detection decoder (letterbox,
weighted NMS) by ``tools.fixtures.face_package.write_face_package``.

A. Throughput on the clip (frames per second, median over interleaved rounds; each round runs
   every arm once over the whole clip, the order rotating):

   - decode only: a ``cv2.VideoCapture`` read loop;
   - preprocess only: ``edge_sdk.processing.image.preprocess_image`` on the decoded frames (in memory);
   - inference only: ``Model.predict`` on one pre-made 1x128x128x3 tensor, and a raw LiteRT
     ``Interpreter`` (``set_tensor``/``invoke``/``get_tensor``) on the same tensor, 1 and 2 threads;
   - preprocess + inference: ``preprocess_image`` then a raw ``invoke``, frames in memory;
   - ``predict_image`` on the frames in memory (preprocess, validate, inference, decode);
   - the naive loop: ``cap.read()`` -> ``preprocess_image`` -> raw ``invoke`` -> ``decode_blazeface``,
     one Python thread;
   - ``VisionPipeline`` with ``drop_policy="block"`` (every frame processed), model threads 1/2,
     inference workers 1/2.

   Ratios: pipeline / min(decode only, preprocess + inference) (target >= 0.9) and pipeline / naive
   loop at the same model threads (target >= 1.3). Where the time goes: per-stage medians from
   ``Result.timings`` and the process CPU time per wall second (cores kept busy).
B. Import-to-first-result: ``import edge_sdk; edge_sdk.load(PKG); predict_image(IMG)`` in a fresh
   interpreter (median of 5), split into import, load and first predict.
C. MediaPipe Tasks ``FaceDetector`` (VIDEO mode, the same .tflite file by path) in a separate venv
   (mediapipe 0.10.21 needs numpy<2), run by ``tools/bench/mediapipe_bench_worker.py``: fps end to end
   ("with decode": read, convert, detect) and detection only (frames decoded beforehand), on 2
   cores and pinned to 1 core; its import-to-first-result; and its boxes, compared per frame with
   edge_sdk's (IoU). Ratio target: edge_sdk pipeline / MediaPipe >= 1.5.

Nothing here is a test: numbers depend on the machine and on what else runs (load average is
printed). The venv for C costs a ~1 GB pip install (about a minute with a warm pip cache); it is
made in the temp folder and removed, unless ``--mp-venv DIR`` names one to make once and reuse.

Usage::

    python tools/bench/bench_pipeline.py                 # full run, ~3-4 min (C's pip install included)
    python tools/bench/bench_pipeline.py --quick         # ~1 min: 100 frames, 2 rounds, C skipped
    python tools/bench/bench_pipeline.py --json out.json --mp-venv ~/.cache/edge_sdk/mp-venv
    python tools/bench/bench_pipeline.py --no-mediapipe
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_pipeline.py)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402
from tools.fixtures.face_clip import ClipFrame, box_iou, read_clip, write_clip  # noqa: E402
from tools.fixtures.face_package import MODEL_NAME, write_face_package  # noqa: E402

MEDIAPIPE_REQ = ("mediapipe==0.10.21", "numpy<2", "opencv-python-headless")
WORKER = Path(__file__).resolve().parent / "mediapipe_bench_worker.py"

TARGET_VS_BOTTLENECK = 0.9
TARGET_VS_NAIVE = 1.3
TARGET_VS_NAIVE_1CORE = 1.0  # one core: nothing overlaps, so "never slower than the plain loop"
TARGET_VS_MEDIAPIPE = 1.5  # on one core (issue 20)
TARGET_VS_MEDIAPIPE_2CORES = 2.5
TARGET_FIRST_RESULT_MS = 100.0

# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    frames: int
    rounds: int  # section A
    pinned_rounds: int  # section C, edge_sdk pinned to one core
    first_samples: int  # sections B and C
    mp_rounds: int


FULL = Plan(frames=300, rounds=5, pinned_rounds=7, first_samples=9, mp_rounds=3)
QUICK = Plan(frames=100, rounds=2, pinned_rounds=1, first_samples=2, mp_rounds=1)


def _med(v: Sequence[float]) -> float:
    return float(np.median(np.asarray(v, np.float64))) if len(v) else float("nan")


def _p99(v: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(v, np.float64), 99)) if len(v) else float("nan")


# ----------------------------------------------------------------------------- A. throughput


class Arm:
    """One way of getting through the clip. ``fn()`` processes every frame once and returns the
    number of frames; its wall time and process CPU time are recorded per round."""

    def __init__(self, key: str, label: str, fn: Callable[[], int]) -> None:
        self.key, self.label, self.fn = key, label, fn
        self.fps: list[float] = []
        self.cpu: list[float] = []

    def run_once(self) -> None:
        c0, t0 = time.process_time(), time.perf_counter()
        n = self.fn()
        wall = time.perf_counter() - t0
        self.fps.append(n / wall)
        self.cpu.append((time.process_time() - c0) / wall)

    def summary(self) -> dict[str, Any]:
        return {"label": self.label, "fps_median": _med(self.fps), "fps_rounds": self.fps, "cpu_per_wall": _med(self.cpu)}


def rounds(arms: Sequence[Arm], n_rounds: int) -> None:
    """Warm every arm once, then run ``n_rounds`` rounds, rotating the order each round."""
    for a in arms:
        a.fn()
    k = len(arms)
    for r in range(n_rounds):
        for j in range(k):
            arms[(j + r) % k].run_once()


class Setup:
    """Everything section A/C share: the clip, its frames in memory, models and raw interpreters."""

    def __init__(self, work: Path, plan: Plan, profile: str) -> None:
        import cv2

        import edge_sdk
        from edge_sdk.processing.image import preprocess_image
        from tools.fixtures.fetch_pretrained import fetch

        self.work = work
        self.plan = plan
        self.profile = profile
        self.model_file = fetch(MODEL_NAME)
        self.video = work / "faces_640x480.avi"
        self.clip = write_clip(self.video, plan.frames)
        self.pkg = write_face_package(work / "face-pkg", self.model_file)
        self.frames: list[np.ndarray] = read_clip(self.video)
        self.image = work / "frame0.png"
        cv2.imwrite(str(self.image), self.frames[0])
        self.models = {t: edge_sdk.load(self.pkg, profile, threads=t, delegates=(), cache_dir=work / "cache") for t in (1, 2)}
        self.spec = self.models[1].inputs[0]
        self.tensor = preprocess_image(self.frames[0], self.spec, color="BGR")[0]  # 1x128x128x3 float32, a face frame
        self.raw = {t: RawLiteRT(self.model_file, t) for t in (1, 2)}

    def close(self) -> None:
        for m in self.models.values():
            m.close()


class RawLiteRT:
    """The model through ai_edge_litert's Interpreter alone (XNNPACK, ``num_threads``)."""

    def __init__(self, path: Path, threads: int) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.it = Interpreter(model_path=str(path), num_threads=threads)
        self.it.allocate_tensors()
        self.inp = self.it.get_input_details()[0]["index"]
        outs = {d["name"]: d["index"] for d in self.it.get_output_details()}
        self.reg, self.cls = outs["regressors"], outs["classificators"]

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        it = self.it
        it.set_tensor(self.inp, x)
        it.invoke()
        return it.get_tensor(self.reg), it.get_tensor(self.cls)


def plain_loop(video: Path, model: Any) -> int:
    """The loop a user would write on an edge_sdk model: ``cap.read()`` -> ``model.predict_image(frame,
    color="BGR")``, one Python thread; the frames read."""
    import cv2

    cap, n = cv2.VideoCapture(str(video)), 0
    try:
        while True:
            ok, f = cap.read()
            if not ok:
                break
            model.predict_image(f, color="BGR")
            n += 1
    finally:
        cap.release()
    return n


def naive_loop(s: Setup, raw: RawLiteRT) -> list[Any]:
    """The loop a user would write on the clip, one Python thread: ``cap.read()`` -> ``preprocess_image``
    -> raw LiteRT invoke -> ``decode_blazeface``; the Detections of every frame."""
    import cv2

    from edge_sdk.processing.detection import decode_blazeface
    from edge_sdk.processing.image import preprocess_image

    cap = cv2.VideoCapture(str(s.video))
    out = []
    try:
        while True:
            ok, img = cap.read()
            if not ok:
                break
            xin, tf = preprocess_image(img, s.spec, color="BGR")
            reg, cls = raw(xin)
            out.append(decode_blazeface(reg, cls, input_size=(128, 128), transform=tf, score_threshold=0.5, iou_threshold=0.3))
    finally:
        cap.release()
    return out


def _boxes_of(decoded: Any) -> list[list[float]]:
    xyxy = np.asarray(decoded.xyxy, np.float64).reshape(-1, 4)
    sc = np.asarray(decoded.scores, np.float64).reshape(-1)
    return [[*map(float, b), float(s)] for b, s in zip(xyxy, sc)]


class PipelineArm(Arm):
    """VisionPipeline over the clip file (block: every frame processed); keeps the last round's
    per-frame timings, latencies and boxes."""

    def __init__(self, s: Setup, threads: int, workers: int, preprocess: str = "auto") -> None:
        self.s, self.threads, self.workers, self.preprocess = s, threads, workers, preprocess
        self.last: dict[int, tuple[Any, float, list[list[float]]]] = {}
        self.counters: Any = None
        self.resolved = ""  # the preprocess mode the pipeline ran with ("auto" resolved)
        super().__init__(
            f"pipeline_t{threads}_w{workers}_{preprocess}",
            f"VisionPipeline, threads {threads}, workers {workers}, preprocess {preprocess}",
            self._run,
        )

    def _run(self) -> int:
        from edge_sdk.pipelines import CallbackSink, PipelineOptions, VisionPipeline, source_from_uri

        got: dict[int, tuple[Any, float, list[list[float]]]] = {}

        def sink(fr: Any) -> None:
            got[fr.index] = (fr.result.timings, fr.latency_ms, _boxes_of(fr.result.decoded))

        pl = VisionPipeline(
            self.s.models[self.threads],
            source_from_uri(str(self.s.video)),
            PipelineOptions(drop_policy="block", workers=self.workers, preprocess=self.preprocess),
            sinks=[CallbackSink(sink)],
        )
        self.resolved = pl.preprocess
        c = pl.run()
        if c.processed != len(self.s.clip) or c.unaccounted != 0 or c.dropped_total != 0:
            raise RuntimeError(f"{self.label}: expected every frame processed, got {c}")
        self.last, self.counters = got, c
        return c.processed

    def stages(self) -> dict[str, float]:
        t = [v[0] for v in self.last.values()]
        return {
            "preprocess_ms": _med([x.preprocess_ms for x in t]),
            "validate_ms": _med([x.validate_ms for x in t]),
            "inference_ms": _med([x.inference_ms for x in t]),
            "decode_ms": _med([x.decode_ms for x in t]),
            "predict_total_ms": _med([x.total_ms for x in t]),
            "predict_total_p99_ms": _p99([x.total_ms for x in t]),
            "latency_ms": _med([v[1] for v in self.last.values()]),
            "latency_p99_ms": _p99([v[1] for v in self.last.values()]),
        }

    def boxes(self) -> list[list[list[float]]]:
        return [self.last[i][2] for i in range(len(self.s.clip))]


def accuracy(clip: Sequence[ClipFrame], boxes: Sequence[Sequence[Sequence[float]]]) -> dict[str, Any]:
    """Against the clip's ground truth: faces found on face frames (exactly one, IoU >= 0.6), false
    detections on coffee frames, IoU statistics."""
    ious, one, miss, extra, fp = [], 0, 0, 0, 0
    for cf, b in zip(clip, boxes):
        if cf.face_box is None:
            fp += len(b)
            continue
        if not b:
            miss += 1
            continue
        extra += len(b) - 1
        iou = max(box_iou(x[:4], cf.face_box) for x in b)
        ious.append(iou)
        one += int(len(b) == 1 and iou >= 0.6)
    n_face = sum(cf.has_face for cf in clip)
    return {
        "face_frames": n_face,
        "coffee_frames": len(clip) - n_face,
        "face_frames_one_box_iou_ge_0_6": one,
        "face_frames_missed": miss,
        "extra_boxes_on_face_frames": extra,
        "boxes_on_coffee_frames": fp,
        "iou_vs_truth_mean": float(np.mean(ious)) if ious else float("nan"),
        "iou_vs_truth_min": float(np.min(ious)) if ious else float("nan"),
    }


def section_a(s: Setup) -> tuple[dict[str, Any], dict[str, PipelineArm]]:
    import cv2

    from edge_sdk.processing.image import preprocess_image

    video, frames, spec, x = str(s.video), s.frames, s.spec, s.tensor
    n = len(frames)

    def decode_only() -> int:
        cap = cv2.VideoCapture(video)
        k = 0
        while True:
            ok, _ = cap.read()
            if not ok:
                break
            k += 1
        cap.release()
        return k

    def preprocess_only() -> int:
        for f in frames:
            preprocess_image(f, spec, color="BGR")
        return n

    def sdk_predict(t: int) -> Callable[[], int]:
        m = s.models[t]

        def fn() -> int:
            for _ in range(n):
                m.predict(x)
            return n

        return fn

    def raw_invoke(t: int) -> Callable[[], int]:
        raw = s.raw[t]

        def fn() -> int:
            for _ in range(n):
                raw(x)
            return n

        return fn

    def pre_inf(t: int) -> Callable[[], int]:
        raw = s.raw[t]

        def fn() -> int:
            for f in frames:
                raw(preprocess_image(f, spec, color="BGR")[0])
            return n

        return fn

    def predict_image(t: int) -> Callable[[], int]:
        m = s.models[t]

        def fn() -> int:
            for f in frames:
                m.predict_image(f, color="BGR")
            return n

        return fn

    naive_boxes: dict[int, list] = {}

    def naive(t: int) -> Callable[[], int]:
        def fn() -> int:
            out = naive_loop(s, s.raw[t])
            naive_boxes[t] = [_boxes_of(d) for d in out]
            return len(out)

        return fn

    def flip_only() -> int:  # what preprocess_image does first for a BGR frame: the full-frame reorder
        for f in frames:
            np.ascontiguousarray(f[:, :, ::-1])
        return n

    def cvtcolor_only() -> int:
        for f in frames:
            cv2.cvtColor(f, cv2.COLOR_BGR2RGB)
        return n

    def preprocess_rgb() -> int:  # the same call told the frame is RGB already: no reorder
        for f in frames:
            preprocess_image(f, spec, color="RGB")
        return n

    arms: list[Arm] = [Arm("decode", "decode only (cv2.VideoCapture.read)", decode_only)]
    arms.append(Arm("preprocess", "preprocess_image only (BGR frames in memory)", preprocess_only))
    arms.append(Arm("preprocess_rgb", "preprocess_image, color='RGB' (no channel reorder)", preprocess_rgb))
    arms.append(Arm("flip", "np.ascontiguousarray(frame[:, :, ::-1]) (640x480)", flip_only))
    arms.append(Arm("cvtcolor", "cv2.cvtColor(frame, COLOR_BGR2RGB) (640x480)", cvtcolor_only))
    for t in (1, 2):
        arms += [
            Arm(f"predict_t{t}", f"Model.predict on a 128x128 tensor, threads {t}", sdk_predict(t)),
            Arm(f"raw_t{t}", f"raw LiteRT invoke on a 128x128 tensor, threads {t}", raw_invoke(t)),
            Arm(f"preinf_t{t}", f"preprocess_image + raw invoke (in memory), threads {t}", pre_inf(t)),
            Arm(f"predict_image_t{t}", f"Model.predict_image (in memory), threads {t}", predict_image(t)),
            Arm(f"naive_t{t}", f"naive loop: read, preprocess, raw invoke, decode_blazeface; threads {t}", naive(t)),
        ]
    pipes = {f"t{t}_w{w}_{pre}": PipelineArm(s, t, w, pre) for t in (1, 2) for w in (1, 2) for pre in ("capture", "worker")}
    arms += list(pipes.values())
    rounds(arms, s.plan.rounds)

    by = {a.key: a for a in arms}
    fps = {k: _med(a.fps) for k, a in by.items()}
    out: dict[str, Any] = {"arms": {k: a.summary() for k, a in by.items()}, "pipelines": {}}
    from edge_sdk.pipelines.vision import _preprocess_mode

    cpus = os.cpu_count() or 1
    cpu_ms = {k: 1e3 / fps[k] * _med(a.cpu) for k, a in by.items()}  # CPU-ms per frame of each arm alone

    for key, p in pipes.items():
        t = p.threads
        bottleneck = min(fps["decode"], fps[f"preinf_t{t}"])
        # What the CPUs allow at all: every stage's CPU time per frame, measured alone, spread over all cores.
        frame_cpu_ms = cpu_ms["decode"] + cpu_ms["preprocess"] + cpu_ms[f"predict_t{t}"]
        ceiling = min(bottleneck, cpus * 1e3 / frame_cpu_ms)
        out["pipelines"][key] = {
            "threads": t,
            "workers": p.workers,
            "preprocess": p.resolved,
            "auto_picks": _preprocess_mode("auto", s.models[t], p.workers, False) == p.resolved,
            "fps": fps[p.key],
            "predict_fps": fps[f"predict_t{t}"],
            "vs_predict": fps[p.key] / fps[f"predict_t{t}"],
            "raw_fps": fps[f"raw_t{t}"],
            "vs_raw": fps[p.key] / fps[f"raw_t{t}"],
            "bottleneck_fps": bottleneck,
            "bottleneck": "decode" if fps["decode"] <= fps[f"preinf_t{t}"] else f"preprocess+inference (threads {t})",
            "vs_bottleneck": fps[p.key] / bottleneck,
            "frame_cpu_ms": frame_cpu_ms,
            "cpu_ceiling_fps": ceiling,
            "vs_cpu_ceiling": fps[p.key] / ceiling,
            "naive_fps": fps[f"naive_t{t}"],
            "vs_naive": fps[p.key] / fps[f"naive_t{t}"],
            "predict_image_fps": fps[f"predict_image_t{t}"],
            "vs_predict_image": fps[p.key] / fps[f"predict_image_t{t}"],
            "ms_per_frame": 1e3 / fps[p.key],
            "cpu_per_wall": _med(p.cpu),
            "stages": p.stages(),
            "accuracy": accuracy(s.clip, p.boxes()),
        }
    out["naive_accuracy"] = accuracy(s.clip, naive_boxes[1])
    out["stage_ms"] = {
        "decode_ms": 1e3 / fps["decode"],
        "preprocess_ms": 1e3 / fps["preprocess"],
        "preprocess_rgb_ms": 1e3 / fps["preprocess_rgb"],
        "flip_ms": 1e3 / fps["flip"],
        "cvtcolor_ms": 1e3 / fps["cvtcolor"],
        "raw_invoke_t1_ms": 1e3 / fps["raw_t1"],
        "raw_invoke_t2_ms": 1e3 / fps["raw_t2"],
        "predict_t1_ms": 1e3 / fps["predict_t1"],
        "predict_t2_ms": 1e3 / fps["predict_t2"],
        "predict_image_t1_ms": 1e3 / fps["predict_image_t1"],
        "predict_image_t2_ms": 1e3 / fps["predict_image_t2"],
    }
    return out, pipes


# ----------------------------------------------------------------------------- B. first result

_FIRST_CODE = (
    "import time, json; t0 = time.perf_counter(); import edge_sdk; t1 = time.perf_counter(); "
    "m = edge_sdk.load({pkg!r}); t2 = time.perf_counter(); r = m.predict_image({img!r}); t3 = time.perf_counter(); "
    "print(json.dumps({{'total_ms': (t3 - t0) * 1e3, 'import_ms': (t1 - t0) * 1e3, 'load_ms': (t2 - t1) * 1e3, "
    "'first_predict_ms': (t3 - t2) * 1e3, 'faces': len(r.decoded), 'profile': m.detection.profile.name, "
    "'threads': m.session.info.threads}}))"
)


def _json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON line in output: {text[-500:]!r}")


def section_b(s: Setup) -> dict[str, Any]:
    code = _FIRST_CODE.format(pkg=str(s.pkg), img=str(s.image))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env["EDGE_SDK_CACHE"] = str(s.work / "cache-first")
    # As installed: pip byte-compiles a wheel's modules, so let this checkout's .pyc files be
    # written (one warm-up run, not counted) instead of compiling every module in every sample.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", code], cwd=str(s.work), env=env, capture_output=True, text=True, timeout=120)
    samples, proc_ms = [], []
    for _ in range(s.plan.first_samples):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code], cwd=str(s.work), env=env, capture_output=True, text=True, timeout=120)
        proc_ms.append((time.perf_counter() - t0) * 1e3)
        if p.returncode != 0:
            raise RuntimeError(f"first-result run failed (rc {p.returncode}): {p.stderr[-2000:]}")
        samples.append(_json_line(p.stdout))
    keys = ("total_ms", "import_ms", "load_ms", "first_predict_ms")
    return {
        "samples": samples,
        "median": {k: _med([x[k] for x in samples]) for k in keys},
        "min_total_ms": min(x["total_ms"] for x in samples),
        "process_wall_ms": _med(proc_ms),
        "faces": [x["faces"] for x in samples],
        "profile": samples[0]["profile"],
        "threads": samples[0]["threads"],
    }


# ----------------------------------------------------------------------------- C. MediaPipe


class MediaPipeUnavailable(RuntimeError):
    pass


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _venv_ok(py: Path) -> bool:
    if not py.exists():
        return False
    p = subprocess.run(
        [str(py), "-c", "import mediapipe, numpy, cv2; assert mediapipe.__version__ == '0.10.21', mediapipe.__version__; print(numpy.__version__)"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return p.returncode == 0


def ensure_mediapipe_venv(venv: Path, *, install: bool, timeout_s: float = 600.0) -> tuple[Path, float]:
    """A venv at ``venv`` with mediapipe 0.10.21 (reused when it already works). Returns (python,
    seconds spent installing). Raises MediaPipeUnavailable with pip's own words when it cannot."""
    py = _venv_python(venv)
    if _venv_ok(py):
        return py, 0.0
    if not install:
        raise MediaPipeUnavailable(f"no working mediapipe venv at {venv} (and this run does not install one)")
    t0 = time.perf_counter()
    try:
        mk = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise MediaPipeUnavailable(f"`{sys.executable} -m venv {venv}` did not finish in 300 s") from None
    if mk.returncode != 0:
        raise MediaPipeUnavailable(
            f"`python -m venv {venv}` failed (rc {mk.returncode}): {(mk.stderr or mk.stdout).strip()[-1500:]}\n"
            "  (on Debian/Ubuntu the venv module is in the python3-venv package)"
        )
    cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *MEDIAPIPE_REQ]
    print(
        f"[bench_pipeline] installing MediaPipe into {venv} (~1 GB; about a minute with a warm pip cache): {' '.join(cmd)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        pip = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise MediaPipeUnavailable(f"pip install {' '.join(MEDIAPIPE_REQ)} did not finish in {timeout_s:.0f} s") from None
    if pip.returncode != 0:
        tail = "\n    ".join([ln for ln in (pip.stderr or pip.stdout).strip().splitlines() if "is ignored: it is neither" not in ln][-15:])
        raise MediaPipeUnavailable(
            f"pip could not install {' '.join(MEDIAPIPE_REQ)} (rc {pip.returncode}).\n  command: {' '.join(cmd)}\n  pip said:\n    {tail}\n"
            "  mediapipe 0.10.21 has wheels for CPython 3.9-3.12 on x86_64/aarch64 Linux, macOS and Windows; "
            "check that PyPI (or your mirror) is reachable, or pass --no-mediapipe."
        )
    if not _venv_ok(py):
        raise MediaPipeUnavailable(f"pip installed {' '.join(MEDIAPIPE_REQ)} into {venv} but `import mediapipe` fails there")
    return py, time.perf_counter() - t0


def _worker(py: Path, args: list[str], timeout: float = 300.0) -> dict[str, Any]:
    p = subprocess.run([str(py), str(WORKER), *args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise MediaPipeUnavailable(f"mediapipe worker {args[0]} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return _json_line(p.stdout)


def _pinned(cpu: int) -> Any:
    """Context manager: pin this thread (and the threads it starts) to ``cpu``, restore after."""
    import contextlib

    @contextlib.contextmanager
    def cm() -> Any:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)

    return cm()


def compare_boxes(a: Sequence[Sequence[Sequence[float]]], b: Sequence[Sequence[Sequence[float]]]) -> dict[str, Any]:
    """Per frame: IoU where both found exactly one face; frames where the counts differ."""
    ious, differ, both_none = [], [], 0
    for i, (x, y) in enumerate(zip(a, b)):
        if len(x) == 1 and len(y) == 1:
            ious.append(box_iou(x[0][:4], y[0][:4]))
        elif len(x) == 0 and len(y) == 0:
            both_none += 1
        else:
            differ.append({"frame": i, "edge_sdk": len(x), "mediapipe": len(y)})
    return {
        "frames": min(len(a), len(b)),
        "frames_compared": len(ious),
        "frames_both_empty": both_none,
        "frames_count_differs": differ,
        "iou_mean": float(np.mean(ious)) if ious else float("nan"),
        "iou_median": _med(ious),
        "iou_min": float(np.min(ious)) if ious else float("nan"),
        "iou_per_frame": ious,
    }


def section_c(s: Setup, pipes: dict[str, PipelineArm], a: dict[str, Any], venv: Path, install: bool) -> dict[str, Any]:
    py, install_s = ensure_mediapipe_venv(venv, install=install)
    res: dict[str, Any] = {"venv": str(venv), "install_s": install_s, "requirements": list(MEDIAPIPE_REQ)}
    boxes_file = s.work / "mp_boxes.json"
    rounds_arg = ["--rounds", str(s.plan.mp_rounds)]
    base = ["video", "--video", str(s.video), "--model", str(s.model_file), *rounds_arg]
    res["video_2cores"] = _worker(py, [*base, "--boxes", str(boxes_file)])
    mp_boxes = json.loads(boxes_file.read_text())
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin_cpu = cpus[0] if cpus else None
    if pin_cpu is not None and len(cpus) > 1:
        res["video_1core"] = _worker(py, [*base, "--cpus", str(pin_cpu)])
    first = [_worker(py, ["first", "--image", str(s.image), "--model", str(s.model_file)]) for _ in range(s.plan.first_samples)]
    keys = ("total_ms", "import_ms", "create_ms", "first_detect_ms")
    res["first_result"] = {"samples": first, "median": {k: _med([x[k] for x in first]) for k in keys}}
    res["mediapipe_version"] = first[0].get("mediapipe_version")

    # edge_sdk boxes (pipeline, threads 1, workers 1) vs MediaPipe's
    sdk_boxes = pipes["t1_w1_capture"].boxes()
    res["boxes_vs_edge_sdk"] = compare_boxes(sdk_boxes, mp_boxes)
    res["mediapipe_accuracy"] = accuracy(s.clip, mp_boxes)

    # edge_sdk pinned to one core (threads 1, workers 1), for the 1-core comparison
    if "video_1core" in res:
        with _pinned(pin_cpu):  # type: ignore[arg-type]
            import edge_sdk

            m1 = edge_sdk.load(s.pkg, s.profile, threads=1, delegates=(), cache_dir=s.work / "cache")
            try:
                saved = s.models[1]
                s.models[1] = m1
                pipe = PipelineArm(s, 1, 1)
                frames = s.frames

                def compute() -> int:
                    for f in frames:
                        m1.predict_image(f, color="BGR")
                    return len(frames)

                comp = Arm("predict_image_pinned", "Model.predict_image (in memory), 1 core", compute)
                naive1 = Arm("naive_pinned", "naive loop (read, preprocess, raw invoke, decode), 1 core", lambda: len(naive_loop(s, s.raw[1])))
                rounds([pipe, comp, naive1], s.plan.pinned_rounds)
            finally:
                s.models[1] = saved
                m1.close()
        res["edge_sdk_1core"] = {
            "pipeline_fps": _med(pipe.fps),
            "pipeline_preprocess": pipe.resolved,
            "pipeline_cpu_per_wall": _med(pipe.cpu),
            "predict_image_fps": _med(comp.fps),
            "naive_fps": _med(naive1.fps),
            "naive_fps_rounds": naive1.fps,
            "pipeline_fps_rounds": pipe.fps,
            # paired: the median over rounds of that round's pipeline / naive (a round runs both, one
            # after the other, so a slow spell of the host hits both arms of a pair)
            "vs_naive": _med([a / b for a, b in zip(pipe.fps, naive1.fps)]),
            "cpu": pin_cpu,
        }

    best2 = max((p for p in a["pipelines"].values() if p["auto_picks"]), key=lambda p: p["fps"])
    arms = a["arms"]
    mp2 = res["video_2cores"]
    rows = [
        {
            "setting": f"2 cores; edge_sdk {_pipe_name(best2)} (the fastest auto configuration)",
            "edge_e2e_fps": best2["fps"],
            "mp_e2e_fps": mp2["with_decode"]["fps_median"],
            "edge_detect_fps": arms[f"predict_image_t{best2['threads']}"]["fps_median"],
            "mp_detect_fps": mp2["detect_only"]["fps_median"],
            "target": TARGET_VS_MEDIAPIPE_2CORES,
        }
    ]
    for t in (1, 2):
        p = next(p for p in a["pipelines"].values() if p["threads"] == t and p["workers"] == 1 and p["auto_picks"])
        if p is best2:
            continue
        rows.append(
            {
                "setting": f"2 cores; edge_sdk {_pipe_name(p)}",
                "edge_e2e_fps": p["fps"],
                "mp_e2e_fps": mp2["with_decode"]["fps_median"],
                "edge_detect_fps": arms[f"predict_image_t{t}"]["fps_median"],
                "mp_detect_fps": mp2["detect_only"]["fps_median"],
                "target": TARGET_VS_MEDIAPIPE_2CORES,
            }
        )
    if "edge_sdk_1core" in res:
        mp1 = res["video_1core"]
        rows.append(
            {
                "setting": f"1 core (both pinned to CPU {pin_cpu}); edge_sdk threads 1, workers 1, preprocess {res['edge_sdk_1core']['pipeline_preprocess']} *auto*",
                "edge_e2e_fps": res["edge_sdk_1core"]["pipeline_fps"],
                "mp_e2e_fps": mp1["with_decode"]["fps_median"],
                "edge_detect_fps": res["edge_sdk_1core"]["predict_image_fps"],
                "mp_detect_fps": mp1["detect_only"]["fps_median"],
                "target": TARGET_VS_MEDIAPIPE,
            }
        )
    for r in rows:
        r["e2e_ratio"] = r["edge_e2e_fps"] / r["mp_e2e_fps"]
        r["detect_ratio"] = r["edge_detect_fps"] / r["mp_detect_fps"]
    res["fps_rows"] = rows
    return res


# ----------------------------------------------------------------------------- report


def _f(v: float, nd: int = 0) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:,.{nd}f}"


def _table(L: list[str], header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    L.append("| " + " | ".join(header) + " |")
    L.append("|---|" + "|".join("---:" for _ in header[1:]) + "|")
    L.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    L.append("")


def _mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _pipe_name(p: dict[str, Any]) -> str:
    return f"threads {p['threads']}, workers {p['workers']}, preprocess on {p['preprocess']}" + (" *auto*" if p["auto_picks"] else "")


def render(r: dict[str, Any]) -> str:
    meta = r["meta"]
    L: list[str] = [f"# edge_sdk face pipeline benchmark ({'quick' if meta['quick'] else 'full'})", ""]
    L.append(
        f"{meta['machine']} | {meta['cpus']} CPUs | Python {meta['python']} | ai-edge-litert {meta['litert']} | "
        f"OpenCV {meta['opencv']} | numpy {meta['numpy']} | load average before {meta['loadavg_before']}, after "
        f"{meta['loadavg_after']} | {meta['duration_s']:.0f} s | git {meta['git']}"
    )
    L.append("")
    oc = meta.get("other_processes_cores")
    if oc is not None:
        L.append(
            f"Other processes used {meta['other_processes_cpu_s']:.0f} CPU-s during the run ({oc:.2f} cores on average)"
            + (": **the machine was not idle; the figures are low and noisy, rerun on an idle machine**." if oc > 0.1 else ".")
        )
        L.append("")
    L.append(
        f"Clip: {meta['frames']} frames, 640x480 MJPG .avi written with cv2.VideoWriter ({meta['face_frames']} frames with "
        f"the astronaut crop moving, {meta['frames'] - meta['face_frames']} coffee frames). Model: BlazeFace short-range "
        f"fp32 TFLite (sha256 {meta['model_sha256'][:12]}), LiteRT with XNNPACK, profile {meta['profile']}. "
        f"{meta['rounds']} interleaved rounds; fps = frames / wall time of one pass, median over rounds."
    )
    L.append("")

    a = r["A"]
    arms = a["arms"]
    L.append("## A. Throughput on the clip")
    L.append("")
    _table(
        L,
        ["arm", "fps (median)", "rounds min-max", "ms/frame", "CPU s per wall s"],
        [
            [
                v["label"],
                _f(v["fps_median"]),
                f"{_f(min(v['fps_rounds']))}-{_f(max(v['fps_rounds']))}",
                _f(1e3 / v["fps_median"], 3),
                _f(v["cpu_per_wall"], 2),
            ]
            for v in arms.values()
        ],
    )
    L.append(
        "Ratios (targets: pipeline / min(decode only, preprocess + inference) >= 0.9; pipeline / naive loop >= 1.3). Targets are "
        "judged on the configurations `preprocess=\"auto\"` picks (marked *auto*); the others are shown for comparison. "
        "\"vs predict\": against Model.predict on a ready tensor (validate + invoke + decode: the inference stage alone); "
        "\"vs raw\": against a bare LiteRT invoke. \"vs CPU ceiling\": against min(bottleneck, cores x 1000 / CPU-ms per "
        "frame), the CPU-ms being decode + preprocess + Model.predict each measured alone: what the cores allow when every "
        "stage overlaps perfectly."
    )
    L.append("")
    rows = []
    for p in a["pipelines"].values():
        auto = p["auto_picks"]
        rows.append([
            _pipe_name(p), _f(p["fps"]), f"{_f(p['bottleneck_fps'])} ({p['bottleneck']})",
            f"{p['vs_bottleneck']:.2f}x" + (f" {_mark(p['vs_bottleneck'] >= TARGET_VS_BOTTLENECK)}" if auto else ""),
            _f(p["naive_fps"]), f"{p['vs_naive']:.2f}x" + (f" {_mark(p['vs_naive'] >= TARGET_VS_NAIVE)}" if auto else ""),
            f"{_f(p['cpu_ceiling_fps'])} ({p['vs_cpu_ceiling']:.2f}x)",
            f"{p['vs_predict']:.2f}x", f"{p['vs_raw']:.2f}x", f"{_f(p['predict_image_fps'])} ({p['vs_predict_image']:.2f}x)",
        ])  # fmt: skip
    _table(
        L,
        ["pipeline", "fps", "bottleneck fps", "vs bottleneck", "naive fps", "vs naive", "CPU ceiling fps (vs it)", "vs predict", "vs raw",
         "predict_image in memory (pipeline / it)"],
        rows,
    )  # fmt: skip
    L.append("Where the time goes: per-stage medians from `Result.timings` (ms, last round), capture-to-result latency, cores kept busy:")
    L.append("")
    rows = []
    for p in a["pipelines"].values():
        st = p["stages"]
        rows.append([
            _pipe_name(p), _f(p["ms_per_frame"], 3), _f(st["preprocess_ms"], 3),
            _f(st["validate_ms"], 3), _f(st["inference_ms"], 3), _f(st["decode_ms"], 3), _f(st["predict_total_ms"], 3),
            f"{_f(st['latency_ms'], 1)} / {_f(st['latency_p99_ms'], 1)}", _f(p["cpu_per_wall"], 2),
        ])  # fmt: skip
    _table(
        L,
        ["pipeline", "wall ms/frame", "preprocess", "validate", "inference", "decode", "predict total", "latency med / p99", "CPU/wall"],
        rows,
    )
    sm = a["stage_ms"]
    L.append(
        f"Alone, one stage at a time (ms/frame): cv2 decode {sm['decode_ms']:.3f}, preprocess_image {sm['preprocess_ms']:.3f}, "
        f"raw invoke {sm['raw_invoke_t1_ms']:.3f} (1 thread) / {sm['raw_invoke_t2_ms']:.3f} (2 threads), Model.predict "
        f"{sm['predict_t1_ms']:.3f} / {sm['predict_t2_ms']:.3f}, Model.predict_image {sm['predict_image_t1_ms']:.3f} / "
        f"{sm['predict_image_t2_ms']:.3f}. preprocess_image on a BGR frame vs the same call told it is RGB (no channel "
        f"reorder): {sm['preprocess_ms']:.3f} vs {sm['preprocess_rgb_ms']:.3f} (the reorder is done after the resize; a "
        f"full-frame `np.ascontiguousarray(frame[:, :, ::-1])` would cost {sm['flip_ms']:.3f}, cv2.cvtColor {sm['cvtcolor_ms']:.3f})."
    )
    L.append("")
    L.append("Accuracy against the clip's ground truth (the paste offset + the hand-read face box):")
    L.append("")
    rows = []
    for name, acc in [(f"pipeline {_pipe_name(p)}", p["accuracy"]) for p in a["pipelines"].values()] + [
        ("naive loop, threads 1", a["naive_accuracy"])
    ]:
        rows.append([
            name, f"{acc['face_frames_one_box_iou_ge_0_6']} / {acc['face_frames']}", acc["face_frames_missed"],
            acc["extra_boxes_on_face_frames"], f"{acc['boxes_on_coffee_frames']} on {acc['coffee_frames']}",
            _f(acc["iou_vs_truth_mean"], 3), _f(acc["iou_vs_truth_min"], 3),
        ])  # fmt: skip
    _table(L, ["run", "one face, IoU >= 0.6", "missed", "extra boxes", "boxes on coffee", "IoU mean", "IoU min"], rows)

    b = r["B"]
    L.append("## B. Import to first result (fresh interpreter)")
    L.append("")
    L.append(
        f"`import edge_sdk; m = edge_sdk.load(PKG); m.predict_image(IMG)` timed inside `python -c` (interpreter start not "
        f"included; modules byte-compiled as a pip install leaves them, after one warm-up run), median of {len(b['samples'])} "
        f"(fastest {b.get('min_total_ms', float('nan')):.1f} ms); profile detected: {b['profile']}, threads {b['threads']}; "
        f"faces found: {b['faces']}."
    )
    L.append("")
    md = b["median"]
    rows = [
        [
            "edge_sdk",
            _f(md["total_ms"], 1),
            _f(md["import_ms"], 1),
            _f(md["load_ms"], 1),
            _f(md["first_predict_ms"], 1),
            _f(b["process_wall_ms"], 0),
        ]
    ]
    c = r.get("C")
    if isinstance(c, dict) and "first_result" in c:
        mm = c["first_result"]["median"]
        rows.append(
            ["MediaPipe Tasks", _f(mm["total_ms"], 1), _f(mm["import_ms"], 1), _f(mm["create_ms"], 1), _f(mm["first_detect_ms"], 1), "-"]
        )
    _table(L, ["library", "total ms", "import ms", "load / create ms", "first predict ms", "whole process ms"], rows)

    L.append("## C. MediaPipe Tasks FaceDetector (VIDEO mode, the same .tflite by path)")
    L.append("")
    if not isinstance(c, dict) or "fps_rows" not in c:
        L.append(f"Skipped: {r.get('C_skipped', 'not run')}")
        L.append("")
    else:
        L.append(
            f"mediapipe {c['mediapipe_version']} in its own venv ({', '.join(c['requirements'])}; install took "
            f'{c["install_s"]:.0f} s, not counted). "e2e": read + convert + detect for MediaPipe (VIDEO mode: synchronous, '
            'one frame at a time), the VisionPipeline (block) for edge_sdk. "detect only": frames decoded beforehand; '
            "MediaPipe `detect_for_video` on RGB `mp.Image`s, edge_sdk `Model.predict_image` on the BGR arrays (its colour "
            "swap is inside the timer). MediaPipe's Python API has no thread option; the 1-core rows pin both processes "
            "to one CPU (sched_setaffinity)."
        )
        L.append("")
        rows = []
        for x in c["fps_rows"]:
            rows.append([
                x["setting"], _f(x["edge_e2e_fps"]), _f(x["mp_e2e_fps"]), f"{x['e2e_ratio']:.2f}x (target {x['target']}x) {_mark(x['e2e_ratio'] >= x['target'])}",
                _f(x["edge_detect_fps"]), _f(x["mp_detect_fps"]), f"{x['detect_ratio']:.2f}x",
            ])  # fmt: skip
        _table(
            L,
            [
                "setting",
                "edge_sdk e2e fps",
                "MediaPipe e2e fps",
                "e2e ratio (targets: 2.5x on 2 cores, 1.5x on 1)",
                "edge_sdk detect fps",
                "MediaPipe detect fps",
                "detect ratio",
            ],
            rows,
        )
        e1 = c.get("edge_sdk_1core")
        if e1 is not None:
            L.append(
                f"edge_sdk on 1 core (CPU {e1['cpu']}): VisionPipeline (preprocess {e1['pipeline_preprocess']}) {_f(e1['pipeline_fps'])} fps "
                f"against {_f(e1['naive_fps'])} fps for the naive loop (read, preprocess, raw invoke, decode) in the same rounds: "
                f"{e1['vs_naive']:.2f}x (median of the {len(e1['naive_fps_rounds'])} per-round ratios) (target: never slower, {TARGET_VS_NAIVE_1CORE}x) {_mark(e1['vs_naive'] >= TARGET_VS_NAIVE_1CORE)}."
            )
            L.append("")
        mp2 = c["video_2cores"]
        parts = [
            f"MediaPipe per-frame latency, 2 cores: detect only {mp2['detect_only']['latency_median_ms']:.3f} ms (p99 "
            f"{mp2['detect_only']['latency_p99_ms']:.3f}), with decode {mp2['with_decode']['latency_median_ms']:.3f} ms; CPU s per "
            f"wall s {mp2['detect_only']['cpu_per_wall']:.2f} (detect only), {mp2['with_decode']['cpu_per_wall']:.2f} (with decode)."
        ]
        L.append(" ".join(parts))
        L.append("")
        cb = c["boxes_vs_edge_sdk"]
        acc = c["mediapipe_accuracy"]
        L.append(
            f"Boxes, edge_sdk (pipeline, threads 1) vs MediaPipe, per frame: IoU mean {_f(cb['iou_mean'], 3)}, median "
            f"{_f(cb['iou_median'], 3)}, min {_f(cb['iou_min'], 3)} over {cb['frames_compared']} frames where both found one face; "
            f"both empty on {cb['frames_both_empty']} frames; counts differ on {len(cb['frames_count_differs'])} frames"
            + (f" ({cb['frames_count_differs'][:5]})" if cb["frames_count_differs"] else "")
            + f". MediaPipe vs ground truth: {acc['face_frames_one_box_iou_ge_0_6']} / {acc['face_frames']} face frames with one "
            f"face at IoU >= 0.6, IoU mean {_f(acc['iou_vs_truth_mean'], 3)}, {acc['boxes_on_coffee_frames']} boxes on coffee frames."
        )
        L.append("")
    missed = r.get("targets_missed") or []
    L.append("## Targets")
    L.append("")
    if missed:
        L.extend(f"- missed: {m}" for m in missed)
        L.append("")
        L.extend(f"- why: {w}" for w in why(r))
    else:
        L.append("- all targets met")
    L.append("")
    return "\n".join(L)


def why(r: dict[str, Any]) -> list[str]:
    """Where the time goes, from the measured numbers (for the report next to missed targets)."""
    sm = r["A"]["stage_ms"]
    cpus = r["meta"]["cpus"]
    out = []
    for t in (1, 2):
        cpu = sm["decode_ms"] + sm["preprocess_ms"] + sm[f"predict_t{t}_ms"] * t
        out.append(
            f"threads {t}: CPU per frame measured stage by stage: decode {sm['decode_ms']:.2f} + preprocess "
            f"{sm['preprocess_ms']:.2f} + Model.predict {sm[f'predict_t{t}_ms']:.2f} ms x {t} thread(s) = {cpu:.2f} CPU-ms, so "
            f"{cpus} cores can do at most {cpus * 1e3 / cpu:.0f} fps with perfect overlap; one worker's inference stage alone "
            f"caps the pipeline at {1e3 / sm[f'predict_t{t}_ms']:.0f} fps."
        )
    pipes = r["A"]["pipelines"]
    for p in pipes.values():
        if p["auto_picks"] and p["threads"] * p["workers"] >= cpus:
            alone = sm[f"raw_invoke_t{p['threads']}_ms"]
            out.append(
                f"{_pipe_name(p)}: the inference threads ({p['threads']} x {p['workers']}) already fill the {cpus} CPUs, so "
                f"the capture thread takes turns with them: inference inside the pipeline took {p['stages']['inference_ms']:.2f} ms "
                f"(median) against {alone:.2f} ms alone. On N cores, load the model with "
                "threads = N - 1 for a pipeline."
            )
    c = r.get("C")
    if isinstance(c, dict) and c.get("fps_rows"):
        mp = c["video_2cores"]["detect_only"]
        out.append(
            f"MediaPipe detects in {mp['latency_median_ms']:.2f} ms per frame (CPU/wall {mp['cpu_per_wall']:.2f}) against "
            f"{sm['predict_image_t1_ms']:.2f} ms for edge_sdk's predict_image (1 thread): on one core there is nothing to overlap, "
            "and the end-to-end ratio is the detect ratio."
        )
    return out


def targets(r: dict[str, Any]) -> list[str]:
    out = []
    for key, p in r["A"]["pipelines"].items():
        if not p["auto_picks"]:
            continue
        if p["vs_bottleneck"] < TARGET_VS_BOTTLENECK:
            out.append(
                f"pipeline {key}: {p['vs_bottleneck']:.2f}x of its bottleneck ({p['bottleneck']}, {p['bottleneck_fps']:.0f} fps), target {TARGET_VS_BOTTLENECK}x"
            )
        if p["vs_naive"] < TARGET_VS_NAIVE:
            out.append(f"pipeline {key}: {p['vs_naive']:.2f}x the naive loop at threads {p['threads']}, target {TARGET_VS_NAIVE}x")
    b = r.get("B")
    if isinstance(b, dict) and b["median"]["total_ms"] >= TARGET_FIRST_RESULT_MS:
        out.append(f"import to first result: {b['median']['total_ms']:.0f} ms (median), target < {TARGET_FIRST_RESULT_MS:.0f} ms")
    c = r.get("C")
    if isinstance(c, dict):
        e1 = c.get("edge_sdk_1core")
        if e1 is not None and e1["vs_naive"] < TARGET_VS_NAIVE_1CORE:
            out.append(f"pipeline on 1 core: {e1['vs_naive']:.2f}x the naive loop, target {TARGET_VS_NAIVE_1CORE}x (never slower)")
        for x in c.get("fps_rows", []):
            if x["e2e_ratio"] < x["target"]:
                out.append(f"vs MediaPipe ({x['setting']}): {x['e2e_ratio']:.2f}x end to end, target {x['target']}x")
    return out


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, (bool, np.bool_)):
        return bool(o)
    if isinstance(o, (int, np.integer)):
        return int(o)
    if isinstance(o, (float, np.floating)):
        return round(float(o), 6) if math.isfinite(o) else None
    return o


def cpu_snapshot() -> tuple[float, float] | None:
    """(CPU-seconds the whole machine has been busy, CPU-seconds this process and its waited-for children
    used), from /proc/stat and os.times(); None where /proc/stat is missing. The difference over a run is
    what other processes took from it."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / hz  # user nice system irq softirq (not idle, iowait, steal)
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 frames, 2 rounds; C only with an existing --mp-venv (~1 min)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the results as JSON here")
    ap.add_argument("--profile", default="generic-x86_64" if platform.machine() in ("x86_64", "AMD64") else "generic-aarch64",
                    help="device profile for the A/C loads (B uses the detected one, as a user would)")  # fmt: skip
    ap.add_argument(
        "--mp-venv", type=Path, metavar="DIR", help="make (once) and reuse the MediaPipe venv here (default: a temp dir, removed)"
    )
    ap.add_argument("--no-mediapipe", action="store_true", help="skip section C")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="write the clip, package and venv here and keep them")
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL

    import cv2

    from edge_sdk.backends.litert import status as litert_status
    from tools.bench.bench_overhead import _git_state
    from tools.fixtures.fetch_pretrained import MODELS

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    machine = machine_record()
    cpu_before = cpu_snapshot()
    if args.keep:
        work = args.keep
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="edge-bench-pipeline-"))
    s = None
    try:
        s = Setup(work, plan, args.profile)
        res: dict[str, Any] = {}
        res["A"], pipes = section_a(s)
        res["B"] = section_b(s)
        if args.no_mediapipe:
            res["C_skipped"] = "--no-mediapipe"
        else:
            venv = args.mp_venv or work / "mediapipe-venv"
            install = not args.quick
            try:
                res["C"] = section_c(s, pipes, res["A"], venv, install)
            except MediaPipeUnavailable as e:
                res["C_skipped"] = (
                    str(e)
                    if not args.quick
                    else f"--quick skips the MediaPipe install ({e}); run without --quick, or pass --mp-venv DIR holding one"
                )
                print(f"[bench_pipeline] MediaPipe comparison skipped: {res['C_skipped']}", file=sys.stderr, flush=True)
        res["targets_missed"] = targets(res)
        cpu_after = cpu_snapshot()
        wall = time.perf_counter() - t_start
        others = (
            None if cpu_before is None or cpu_after is None else max(0.0, (cpu_after[0] - cpu_before[0]) - (cpu_after[1] - cpu_before[1]))
        )
        res["meta"] = {
            "other_processes_cpu_s": others,
            "other_processes_cores": None if others is None else others / wall,
            "quick": bool(args.quick),
            "argv": list(argv) if argv is not None else sys.argv[1:],
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "litert": litert_status().version,
            "opencv": cv2.__version__,
            "numpy": np.__version__,
            "profile": args.profile,
            "frames": plan.frames,
            "face_frames": sum(cf.has_face for cf in s.clip),
            "rounds": plan.rounds,
            "model_sha256": MODELS[MODEL_NAME].sha256,
            "loadavg_before": [round(v, 2) for v in load_before],
            "loadavg_after": [round(v, 2) for v in os.getloadavg()],
            "duration_s": wall,
            "git": _git_state(),
            "machine_record": finish_record(machine),
        }
        sys.stdout.write(render(res))
        print(f"CPU: {machine_line(machine)}")
        sys.stdout.flush()
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            data = _clean(res)
            c = data.get("C")
            if isinstance(c, dict):
                c.get("boxes_vs_edge_sdk", {}).pop("iou_per_frame", None)
            args.json.write_text(json.dumps(data, indent=1) + "\n")
    finally:
        if s is not None:
            s.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
