"""The camera samples run as a user runs them (a subprocess, from another folder, PYTHONPATH = the
repository) on a real video file, with the real BlazeFace package of tools/fixtures/face_package.py.

The clip (tools/fixtures/face_clip.write_clip, shared with tests/test_pipeline_faces.py): 60 frames of
640x480 MJPG, the astronaut's face pasted at a known, moving place on 48 of them, coffee (no face)
on the other 12.

- samples/pi_camera_detect.py with --simulate-heat: the thermal simulator's fake sysfs tree,
  read by the real SensorReader, starts over the Pi 5 profile's critical limit; the governor goes
  critical, halves the frame rate (frames really arrive at <= 15 fps then), steps back down as the
  simulated SoC cools and gives the rate back; each face is found where it was pasted, the
  annotated video has every frame with the boxes and the governor state drawn; bad input and bad
  arguments give clear errors and exit status 1 / 2.
- samples/jetson_detect.py under each Jetson profile on this CPU-only machine: the fp16 ONNX
  variant is chosen, the TensorRT/CUDA providers are reported missing and the CPU fallback is
  said; its faces agree with the fp32 TFLite model's frame by frame.
- tools/fixtures/face_package.py: three variants with the expected precisions/backends, cached by digest
  (a rerun reuses the folder, a damaged one is rebuilt).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")
pytest.importorskip("skimage")
pytest.importorskip("ai_edge_litert")
pytest.importorskip("onnxruntime")

from conftest import ROOT  # noqa: E402

import edge_sdk  # noqa: E402
from tools.fixtures.face_clip import ClipFrame, box_iou, write_clip  # noqa: E402
from tools.fixtures.face_package import MODEL_NAME  # noqa: E402

N_FRAMES = 60
MIN_IOU = 0.6
PI = ROOT / "samples" / "pi_camera_detect.py"
JETSON = ROOT / "samples" / "jetson_detect.py"
#: Two Jetson profiles with different precision lists (Orin: int8, fp16, fp32; Nano: fp16, fp32).
JETSON_PROFILES = ["jetson-orin-nano", "jetson-nano"]


@pytest.fixture(scope="module")
def normal_cache() -> Path:
    # Module scope: runs before conftest's per-test cache, so this is the normal edge_sdk cache,
    # where the fetched model and the built package live (rebuilt only when an input changes).
    from tools.fixtures.fetch_pretrained import default_cache_dir

    return default_cache_dir()


@pytest.fixture(scope="module")
def tflite(normal_cache: Path) -> Path:
    from tools.fixtures.fetch_pretrained import fetch

    return fetch(MODEL_NAME, cache_dir=normal_cache)


@pytest.fixture(scope="module")
def pkg(normal_cache: Path, tflite: Path) -> Path:
    from tools.fixtures.face_package import face_package

    return face_package(normal_cache, tflite=tflite)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[ClipFrame]]:
    path = tmp_path_factory.mktemp("clip") / "faces.avi"
    return path, write_clip(path, N_FRAMES, fps=30.0)


def run_sample(script: Path, args: list[str], cwd: Path, profile: str | None = None, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    e.pop("EDGE_SDK_PROFILE", None)
    if profile:
        e["EDGE_SDK_PROFILE"] = profile
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, cwd=cwd, env=e, timeout=120)


def read_video(path: Path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    assert cap.isOpened(), f"{path} is not a readable video"
    frames = []
    while len(frames) < 10 * N_FRAMES:
        ok, img = cap.read()
        if not ok:
            break
        frames.append(img)
    cap.release()
    return frames


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_faces(plan: list[ClipFrame], records: list[dict[str, Any]]) -> None:
    """One face where the crop was pasted (IoU >= MIN_IOU), none on coffee, every frame in order."""
    assert [r["index"] for r in records] == list(range(N_FRAMES))
    for cf, rec in zip(plan, records):
        boxes = [d["xyxy"] for d in rec["detections"]]
        if cf.face_box is None:
            assert boxes == [], f"frame {cf.index} (coffee): expected no face, got {boxes}"
            continue
        assert len(boxes) == 1, f"frame {cf.index}: expected one face near {cf.face_box}, got {boxes}"
        iou = box_iou(boxes[0], cf.face_box)
        assert iou >= MIN_IOU, f"frame {cf.index}: box {boxes[0]} vs pasted {cf.face_box}: IoU {iou:.3f}"
        assert rec["detections"][0]["label"] == "face" and 0.5 <= rec["detections"][0]["score"] <= 1.0


# ----------------------------------------------------------------------------- the Pi sample


def test_pi_sample_governor_on_simulated_heat(pkg: Path, clip: tuple[Path, list[ClipFrame]], tmp_path: Path) -> None:
    path, plan = clip
    out, jl = tmp_path / "annotated.avi", tmp_path / "frames.jsonl"
    p = run_sample(
        PI, ["--input", str(path), "--package", str(pkg), "--simulate-heat", "--output", str(out), "--jsonl", str(jl)],
        tmp_path, "raspberry-pi-5",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    s = p.stdout
    assert "profile raspberry-pi-5" in s and "chosen: " in s and "simulated heat" in s and "soft 70 C / hard 77 C" in s
    assert f"frames: {N_FRAMES} read, {N_FRAMES} processed, dropped none" in s  # a file: throttled, nothing dropped
    assert "faces: 48 in 48 frames" in s
    # the governor really acted: critical at once, the rate halved, then back down as the SoC cooled
    assert re.search(r"transition +normal -> critical  \(temp 7[78]\.\d C >= hard limit 77 C\)", s), s
    assert "applied    lower_rate" in s and "max_fps 30 -> 15" in s
    assert "critical -> constrained" in s and "constrained -> normal" in s
    assert "undone     lower_rate" in s and "max_fps 15 -> 30" in s

    records = read_jsonl(jl)
    check_faces(plan, records)
    states = [r["budget_state"] for r in records]
    assert states[0] == "critical" and states[-1] == "normal" and "constrained" in states, states
    # order: critical, then constrained, then normal (each step down happens once)
    assert states == sorted(states, key=["critical", "constrained", "normal"].index)
    # the lowered rate is real: while critical, frames were read at <= 15 fps (throttled file)
    crit_t = [r["timestamp_ms"] for r in records if r["budget_state"] == "critical"]
    assert len(crit_t) >= 5
    assert float(np.median(np.diff(crit_t))) >= 1000 / 15 * 0.9, np.diff(crit_t)

    frames = read_video(out)
    assert len(frames) == N_FRAMES and frames[0].shape == (480, 640, 3)
    # the governor state is drawn top left in its colour (critical: red), a green box on the face
    banner = frames[0][4:26, 8:160].astype(int)
    red = (banner[..., 2] > 170) & (banner[..., 1] < 90) & (banner[..., 0] < 90)
    assert red.sum() > 30, "no red 'governor: critical' banner on frame 0"
    last = frames[-1][4:26, 8:160].astype(int)
    assert (((last[..., 1] > 150) & (last[..., 2] < 90) & (last[..., 0] < 90)).sum()) > 30, "no green 'normal' banner on the last frame"
    x0, y0, x1, y1 = (int(round(v)) for v in records[0]["detections"][0]["xyxy"])
    edge = frames[0][y0 + 1 : y1 - 1, max(x0 - 1, 0) : x0 + 2].astype(int)  # the box's left side
    green = (edge[..., 1] > 170) & (edge[..., 0] < 110) & (edge[..., 2] < 110)
    assert green.mean() > 0.5, "no green box drawn where the face was found"


def test_pi_sample_live_source_drops_with_reasons(pkg: Path, tmp_path: Path) -> None:
    # A live source (edge_sdk's synthetic camera, 60 fps) under the 30 fps limit the governor halves:
    # frames over the rate are dropped as a camera's would be, each with its reason.
    p = run_sample(
        PI, ["--camera", "synthetic://320x240?fps=60&frames=90", "--package", str(pkg), "--simulate-heat"], tmp_path, "raspberry-pi-5"
    )
    assert p.returncode == 0, p.stderr
    m = re.search(r"frames: (\d+) read, (\d+) processed, dropped (\{.*\}) in", p.stdout)
    assert m, p.stdout
    read, processed, dropped = int(m[1]), int(m[2]), ast.literal_eval(m[3])
    assert read == 90 and processed + sum(dropped.values()) == read
    assert set(dropped) <= {"rate_limit", "evicted"} and dropped.get("rate_limit", 0) >= 40, dropped
    assert "(live), simulated heat" in p.stdout and "max_fps 30 -> 15" in p.stdout


def load_sample(path: Path) -> Any:
    """The sample as a module, to call its main() in this process (cheaper than a subprocess)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"sample_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_pi_sample_errors_and_help(pkg: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    p = run_sample(PI, ["--help"], tmp_path)
    assert p.returncode == 0 and "--camera" in p.stdout and "--simulate-heat" in p.stdout and "--preview" in p.stdout
    if "GUI:                           NONE" in cv2.getBuildInformation() or "headless" in cv2.__file__:
        p = run_sample(PI, ["--short", "--preview", "--package", str(pkg)], tmp_path)  # no GUI here: said, not a traceback
        assert p.returncode == 1 and "--preview needs OpenCV with a GUI" in p.stderr and "Traceback" not in p.stderr
    p = run_sample(PI, ["--input", str(tmp_path / "missing.avi"), "--package", str(pkg)], tmp_path, "raspberry-pi-5")
    assert p.returncode == 1 and "error: no such video, image or folder" in p.stderr and "missing.avi" in p.stderr

    # the rest through main() in this process: same code, without a new interpreter each time
    monkeypatch.setenv("EDGE_SDK_PROFILE", "raspberry-pi-5")
    main = load_sample(PI).main
    with pytest.raises(SystemExit) as ei:
        main(["--fps", "-1", "--package", str(pkg)])
    assert ei.value.code == 2 and "--fps and --frames must be >= 0" in capsys.readouterr().err

    assert main(["--camera", "gopher://cam", "--package", str(pkg)]) == 1
    assert "unknown source scheme 'gopher://'" in capsys.readouterr().err

    not_video = tmp_path / "notes.avi"
    not_video.write_text("not a video")
    assert main(["--input", str(not_video), "--package", str(pkg)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "notes.avi" in err

    assert main(["--input", str(not_video), "--package", str(tmp_path / "no-such-pkg")]) == 1
    assert "error: cannot prepare the model" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the Jetson sample


@pytest.fixture(scope="module")
def tflite_boxes(pkg: Path, clip: tuple[Path, list[ClipFrame]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The fp32 TFLite variant's faces on every frame of the clip, in this process."""
    from edge_sdk.pipelines import CallbackSink, PipelineOptions, VisionPipeline

    got: list[tuple[np.ndarray, np.ndarray]] = []

    def keep(fr: Any) -> None:
        d = fr.result.decoded
        got.append((np.asarray(d.xyxy, np.float64).reshape(-1, 4), np.asarray(d.scores, np.float64)))

    with edge_sdk.load(pkg, "generic-x86_64", variant="fp32-tflite", threads=1) as m:
        assert m.variant.id == "fp32-tflite" and m.describe()["backend"] == "litert"
        VisionPipeline(m, str(clip[0]), PipelineOptions(drop_policy="block"), sinks=[CallbackSink(keep)]).run()
    assert len(got) == N_FRAMES
    return got


@pytest.mark.parametrize("profile", JETSON_PROFILES)
def test_jetson_sample_fp16_onnx_cpu_fallback(
    profile: str, pkg: Path, clip: tuple[Path, list[ClipFrame]], tflite_boxes: list[tuple[np.ndarray, np.ndarray]], tmp_path: Path
) -> None:
    import onnxruntime

    assert not {"TensorrtExecutionProvider", "CUDAExecutionProvider"} & set(onnxruntime.get_available_providers())
    path, plan = clip
    out, jl = tmp_path / "jetson.avi", tmp_path / "jetson.jsonl"
    # Forced: unforced, selection times fp16 against the float variants on this GPU-less CPU (fp16 runs
    # through casts there) and keeps the fastest; a real Jetson times it on CUDA/TensorRT.
    args = ["--input", str(path), "--package", str(pkg), "--output", str(out), "--jsonl", str(jl), "--variant", "fp16-onnx"]
    p = run_sample(JETSON, args, tmp_path, profile)
    assert p.returncode == 0, p.stderr
    s = p.stdout
    assert f"profile {profile}" in s and " * fp16-onnx (onnxruntime, fp16):" in s and "chosen: fp16-onnx (forced)" in s
    assert "variant fp16-onnx (fp16) on onnxruntime" in s
    assert "providers: ['CPUExecutionProvider']" in s
    assert "note: TensorrtExecutionProvider requested by the profile but not in this onnxruntime build; falling back" in s
    assert "note: CUDAExecutionProvider requested by the profile but not in this onnxruntime build; falling back" in s
    assert "CPU fallback: none of ['TensorrtExecutionProvider', 'CUDAExecutionProvider'] is available" in s
    assert f"frames: {N_FRAMES} read, {N_FRAMES} processed, dropped none" in s and "faces: 48 in 48 frames, on fp16-onnx" in s

    records = read_jsonl(jl)
    assert {(r["variant"], r["backend"]) for r in records} == {("fp16-onnx", "onnxruntime")}
    check_faces(plan, records)
    # fp16 on the CPU finds the same faces as the fp32 TFLite original, frame by frame
    for rec, (ref_xyxy, ref_scores) in zip(records, tflite_boxes):
        xyxy = np.asarray([d["xyxy"] for d in rec["detections"]], np.float64).reshape(-1, 4)
        assert len(xyxy) == len(ref_xyxy), f"frame {rec['index']}: {len(xyxy)} faces vs {len(ref_xyxy)} with fp32 TFLite"
        for a, b in zip(xyxy, ref_xyxy):
            assert box_iou(a, b) >= 0.95, f"frame {rec['index']}: fp16 {a} vs fp32 TFLite {b}"
        np.testing.assert_allclose([d["score"] for d in rec["detections"]], ref_scores, atol=0.02)

    frames = read_video(out)
    assert len(frames) == N_FRAMES and frames[0].shape == (480, 640, 3)


def test_jetson_sample_short_mode_forced_tflite(pkg: Path, normal_cache: Path, tmp_path: Path) -> None:
    # --short writes the clip itself and finds the package in the normal cache (no --package)
    p = run_sample(
        JETSON, ["--short", "--variant", "fp32-tflite", "--frames", "20", "--fps", "100"], tmp_path,
        "jetson-orin-nano", EDGE_SDK_CACHE=str(normal_cache.parent),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    s = p.stdout
    assert "chosen: fp32-tflite (forced)" in s and "variant fp32-tflite (fp32) on litert" in s
    assert "providers:" not in s and "CPU fallback" not in s  # LiteRT has no execution providers
    n = int(s.split("frames: ")[1].split(" read")[0])
    processed = int(s.split(" read, ")[1].split(" processed")[0])
    assert 20 <= processed <= n <= N_FRAMES  # stopped after 20 processed frames (those in flight finish)
    assert not list(tmp_path.iterdir())  # the clip went to a temporary folder, now removed

    p = run_sample(JETSON, ["--input", "x.avi", "--size", "big"], tmp_path)
    assert p.returncode == 2 and "--size: expected WxH" in p.stderr


# ----------------------------------------------------------------------------- the package


def test_face_package_variants_and_cache(tflite: Path, tmp_path: Path) -> None:
    import onnx

    from edge_sdk.package import ModelPackage
    from tools.fixtures.face_package import VARIANTS, face_package

    t0 = time.perf_counter()
    first = face_package(tmp_path, tflite=tflite)
    build_s = time.perf_counter() - t0
    assert first.parent == tmp_path / "packages"
    m = ModelPackage.open(first).manifest
    assert {(v.id, v.backend, v.precision) for v in m.variants} == {
        ("fp32-tflite", "litert", "fp32"), ("fp32-onnx", "onnxruntime", "fp32"), ("fp16-onnx", "onnxruntime", "fp16"),
    } and tuple(v.id for v in m.variants) == VARIANTS  # fmt: skip
    fp16 = onnx.load(str(first / "face_fp16.onnx"))
    dtypes = {i.data_type for i in fp16.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in dtypes and onnx.TensorProto.FLOAT not in dtypes  # fp16 weights
    assert fp16.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # fp32 I/O kept
    assert (first / "face.tflite").read_bytes() == tflite.read_bytes()

    mtime = (first / "face_fp16.onnx").stat().st_mtime_ns
    assert face_package(tmp_path, tflite=tflite) == first  # cached: same folder, nothing rewritten
    assert (first / "face_fp16.onnx").stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "packages").iterdir()] == [first.name]  # no build leftovers

    (first / "face_fp16.onnx").write_bytes(b"damaged")
    assert face_package(tmp_path, tflite=tflite) == first  # a damaged package is rebuilt
    assert (first / "face_fp16.onnx").read_bytes() == fp16.SerializeToString()
    ModelPackage.open(first)  # verifies every digest
    assert build_s < 30
