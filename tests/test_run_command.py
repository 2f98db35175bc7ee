"""``edge-sdk run`` end to end, as real subprocesses: the demo package over the bundled image
folder, MediaPipe's BlazeFace (real model) over a real video file written here with
cv2.VideoWriter, MediaPipe's selfie segmenter over a real photograph, a live synthetic camera
stopped with Ctrl-C; what comes out is read back (the mp4 with cv2.VideoCapture, the JSON lines,
the annotated images, the summary) and checked against the input."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")
pytest.importorskip("skimage")  # the dev extra installs it
pytest.importorskip("ai_edge_litert")

from conftest import ROOT  # noqa: E402

from edge_sdk.assets import demo_samples  # noqa: E402
from edge_sdk.processing.draw import class_color  # noqa: E402
from tools.fixtures.face_clip import ClipFrame, box_iou, read_clip, write_clip  # noqa: E402
from tools.fixtures.face_package import MODEL_NAME, write_face_package  # noqa: E402

PROFILE = "generic-x86_64"
N_FRAMES = 30
SUMMARY = re.compile(r"^summary: frames_in=(\d+) processed=(\d+) dropped=(\{.*\}) in_flight=(\d+) \((\w+)\)$", re.M)
STATUS = re.compile(
    r"^\s*[\d.]+ s\s+(?:-|[\d.]+) fps  processed \d+  dropped \d+.*  in flight \d+  governor (off|normal|constrained|critical)"
)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _cmd(*args: Any) -> list[str]:
    return [sys.executable, "-m", "edge_sdk.cli", "run", *map(str, args), "--profile", PROFILE]


def _run(*args: Any, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cmd(*args), capture_output=True, text=True, timeout=timeout, env=_env())


def _summary(stderr: str) -> tuple[int, int, dict[str, int], int, str]:
    m = SUMMARY.search(stderr)
    assert m, stderr
    return int(m.group(1)), int(m.group(2)), eval(m.group(3)), int(m.group(4)), m.group(5)  # a dict literal of str -> int


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("run")


@pytest.fixture(scope="module")
def face_pkg(work: Path) -> Path:
    from tools.fixtures.fetch_pretrained import fetch

    return write_face_package(work / "face-pkg", fetch(MODEL_NAME))


@pytest.fixture(scope="module")
def clip(work: Path) -> tuple[Path, list[ClipFrame]]:
    path = work / "faces.avi"
    return path, write_clip(path, N_FRAMES, fps=30.0)


@pytest.fixture(scope="module")
def selfie_pkg(work: Path) -> Path:
    """MediaPipe's selfie segmenter as a segmentation package: letterbox to 256x256, [0, 1], the
    person probability thresholded at 0.5 and mapped back to source pixels."""
    from converters.packaging import write_package
    from tools.fixtures.fetch_pretrained import fetch

    manifest = {
        "schema": 1, "name": "selfie", "version": "0.10.21", "task": "segmentation", "labels": ["background", "person"],
        "decoder": {"kind": "segmentation", "layout": "NHWC", "threshold": 0.5},
        "inputs": [{"name": "input_1", "dtype": "float32", "shape": [1, 256, 256, 3], "layout": "NHWC",
                    "preprocess": {"kind": "image", "size_hw": [256, 256], "resize": "letterbox", "pad_value": 0}}],
        "outputs": [{"name": "activation_10", "dtype": "float32", "shape": [1, 256, 256, 1]}],
        "variants": [{"id": "fp32-tflite", "file": "selfie.tflite", "backend": "litert", "precision": "fp32"}],
    }  # fmt: skip
    write_package(work / "selfie-pkg", manifest, {"selfie.tflite": fetch("mediapipe-selfie-segmentation")})
    return work / "selfie-pkg"


def test_demo_package_over_the_image_folder(demo_package: Path, tmp_path: Path) -> None:
    samples = demo_samples()
    folder = samples[0].parent
    out = tmp_path / "annotated"
    p = _run(demo_package, "--source", folder, "--save", f"{out}/", "--jsonl", "-")
    assert p.returncode == 0, p.stderr
    n = len(samples)
    assert _summary(p.stderr) == (n, n, {}, 0, "stopped")
    records = [json.loads(ln) for ln in p.stdout.splitlines()]  # --jsonl -: standard output holds the records alone
    assert [r["index"] for r in records] == list(range(n))
    for r, s in zip(records, samples):
        assert r["model"] == "shapes-classifier" and r["timings_ms"]["total_ms"] > 0 and r["variant"]
        assert r["classes"][0][0]["label"] == s.stem.rsplit("_", 1)[0]  # the bundled images are classified right
        assert r["budget_state"] in ("normal", "constrained", "critical")  # the governor is on by default
    assert sorted(f.name for f in out.iterdir()) == sorted(s.name for s in samples)
    for s in samples:
        src, drawn = cv2.imread(str(s)), cv2.imread(str(out / s.name))
        assert drawn.shape == src.shape and (drawn != src).any(axis=2)[:8, :8].all()  # the class text box at the top left
    assert f"saved: {out}/ ({n} images)" in p.stderr


def test_a_video_through_the_face_detector_to_mp4_and_jsonl(face_pkg: Path, clip: tuple[Path, list[ClipFrame]], tmp_path: Path) -> None:
    path, plan = clip
    mp4, jl = tmp_path / "out.mp4", tmp_path / "f.jsonl"
    p = _run(face_pkg, "--source", path, "--save", mp4, "--jsonl", jl, "--no-governor")
    assert p.returncode == 0, p.stderr
    frames_in, processed, dropped, in_flight, state = _summary(p.stderr)
    assert (frames_in, processed, dropped, in_flight, state) == (N_FRAMES, N_FRAMES, {}, 0, "stopped")
    records = _jsonl(jl)
    assert len(records) == processed and [r["index"] for r in records] == list(range(N_FRAMES))
    assert all(r["budget_state"] is None and r["variant"] == "fp32-tflite" for r in records)
    assert records[1]["source_timestamp_ms"] > records[0]["source_timestamp_ms"]
    video = read_clip(mp4)
    assert len(video) == processed
    assert video[0].shape == (480, 640, 3)
    original = read_clip(path)
    col = np.array(class_color(0), np.float32)
    n_faces = 0
    for cf, rec, got, src in zip(plan, records, video, original):
        dets = rec["detections"]
        if cf.face_box is None:
            assert dets == []
            assert np.abs(got.astype(np.float32) - src).mean() < 6  # nothing drawn: the frame as it was, up to the codec
            continue
        n_faces += 1
        assert len(dets) == 1 and box_iou(dets[0]["xyxy"], cf.face_box) >= 0.6
        assert len(dets[0]["keypoints"]) == 6  # BlazeFace's landmarks travel in the records
        x1, y1, x2, y2 = (int(round(v)) for v in dets[0]["xyxy"])
        edge = got[(y1 + y2) // 2 - 5 : (y1 + y2) // 2 + 5, x1 - 1 : x1 + 2].reshape(-1, 3).astype(np.float32)
        assert np.abs(edge - col).mean() < 40, (cf.index, edge.mean(axis=0))  # the box's left edge in the class colour
        assert np.abs(got.astype(np.float32) - src)[y1 - 1 : y1 + 2, x1:x2].mean() > 30  # differs from the input there
        far = (slice(0, 40), slice(0, 40)) if x1 > 120 or y1 > 120 else (slice(440, 480), slice(600, 640))
        assert np.abs(got[far].astype(np.float32) - src[far]).mean() < 6  # and not far from the box
    assert n_faces == sum(cf.face_box is not None for cf in plan) > 0
    assert f"saved: {mp4} ({N_FRAMES} frames, mp4v, 30 fps)" in p.stderr and f"jsonl: {jl} ({N_FRAMES} lines)" in p.stderr


def test_max_frames_reads_only_that_many(face_pkg: Path, clip: tuple[Path, list[ClipFrame]], tmp_path: Path) -> None:
    jl, avi = tmp_path / "f.jsonl", tmp_path / "out.avi"
    p = _run(face_pkg, "--source", clip[0], "--max-frames", 5, "--jsonl", jl, "--save", avi, "--no-governor")
    assert p.returncode == 0, p.stderr
    assert _summary(p.stderr) == (5, 5, {}, 0, "stopped")
    assert [r["index"] for r in _jsonl(jl)] == [0, 1, 2, 3, 4]
    assert len(read_clip(avi)) == 5  # .avi: MJPG
    assert "MJPG" in p.stderr


def test_a_segmentation_package_draws_its_mask(selfie_pkg: Path, tmp_path: Path) -> None:
    import skimage.data

    src = tmp_path / "photos"
    src.mkdir()
    astro = np.ascontiguousarray(skimage.data.astronaut()[:, :, ::-1])  # BGR 512x512
    cv2.imwrite(str(src / "astronaut.png"), astro)
    out, jl = tmp_path / "masked", tmp_path / "seg.jsonl"
    p = _run(selfie_pkg, "--source", src, "--save", out, "--jsonl", jl, "--no-labels", "--no-governor")
    assert p.returncode == 0, p.stderr
    assert _summary(p.stderr) == (1, 1, {}, 0, "stopped")
    (rec,) = _jsonl(jl)
    assert rec["shape_hw"] == [512, 512] and rec["labels"] == ["background", "person"]
    person_px = rec["pixels"]["person"]
    assert 0.1 * 512 * 512 < person_px < 0.9 * 512 * 512
    drawn = cv2.imread(str(out / "astronaut.png"))
    changed = (drawn != astro).any(axis=2)
    assert abs(int(changed.sum()) - person_px) < 0.01 * person_px  # the person's pixels, blended, and (almost) nothing else
    face = changed[82:176, 182:270]  # the astronaut's face (read off by hand; tests/test_detection.py)
    assert face.mean() > 0.9 and not changed[0:60, 300:370].any()  # the backdrop between her head and the shuttle
    tint = drawn[82:176, 182:270].astype(np.float32) - astro[82:176, 182:270]
    assert np.sign(tint.mean(axis=(0, 1))).tolist() == np.sign(np.array(class_color(1)) - astro[82:176, 182:270].mean(axis=(0, 1))).tolist()


def test_show_without_a_gui_is_a_typed_error(demo_package: Path) -> None:
    """No display in the child's environment: refused whether this OpenCV has a GUI or not (the
    dev environment's opencv-python-headless has none: that is the message then)."""
    env = {k: v for k, v in _env().items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    p = subprocess.run(
        _cmd(demo_package, "--source", demo_samples()[0].parent, "--show"), capture_output=True, text=True, timeout=120, env=env
    )
    assert p.returncode == 1, p.stderr
    assert "DisplayUnavailableError" in p.stderr
    assert "--show needs a display and an OpenCV build with GUI support (opencv-python, not -headless)" in p.stderr
    if "GUI:                           NONE" in cv2.getBuildInformation():
        assert "built without a GUI backend (GUI: NONE)" in p.stderr
    assert "shapes-classifier" not in p.stderr  # refused before the model was loaded


def test_a_bad_source_names_its_path(demo_package: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "clip.mp4"
    p = _run(demo_package, "--source", missing, timeout=120)
    assert p.returncode == 1 and "SourceError" in p.stderr and str(missing) in p.stderr, p.stderr
    not_video = tmp_path / "notes.mp4"
    not_video.write_text("not a video\n")
    p = _run(demo_package, "--source", not_video, timeout=120)
    assert p.returncode == 1 and str(not_video) in p.stderr, p.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    p = _run(demo_package, "--source", empty, timeout=120)
    assert p.returncode == 1 and "holds no images" in p.stderr and str(empty) in p.stderr, p.stderr


def test_bad_options_are_refused_with_their_name(demo_package: Path, tmp_path: Path) -> None:
    folder = demo_samples()[0].parent
    p = _run(demo_package, "--source", folder, "--save", tmp_path / "out.mov", timeout=120)
    assert p.returncode == 1 and "OptionsError" in p.stderr and "--save" in p.stderr and "out.mov" in p.stderr, p.stderr
    p = _run(demo_package, "--source", folder, "--save", folder, timeout=120)
    assert p.returncode == 1 and "is the source folder" in p.stderr, p.stderr
    assert sorted(f.name for f in folder.iterdir()) == sorted(s.name for s in demo_samples())  # nothing written there
    for bad in (["--max-fps", "0"], ["--max-frames", "-1"], ["--conf", "1.5"], ["--drop-policy", "sometimes"]):
        p = _run(demo_package, "--source", folder, *bad, timeout=120)
        assert p.returncode == 2 and bad[0] in p.stderr, (bad, p.stderr)


def test_max_fps_paces_a_folder_with_a_status_line_a_second(demo_package: Path) -> None:
    n = len(demo_samples())
    t0 = time.monotonic()
    p = _run(demo_package, "--source", demo_samples()[0].parent, "--max-fps", 5, "--no-governor")
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert _summary(p.stderr) == (n, n, {}, 0, "stopped")  # a folder is throttled, not dropped
    assert elapsed >= (n - 1) / 5
    status = [ln for ln in p.stderr.splitlines() if STATUS.match(ln)]
    assert len(status) >= 1 and all(ln.endswith("governor off") for ln in status), p.stderr
    assert "\r" not in p.stderr and "\x1b[K" not in p.stderr  # not a terminal: plain lines
    fps = [float(m) for m in re.findall(r"([\d.]+) fps  processed", p.stderr)]
    assert fps and max(fps) <= 5.0 * 1.05  # never faster than the limit (a status fps is a window's mean)


def test_on_a_terminal_the_status_line_is_redrawn_in_place(demo_package: Path) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            _cmd(demo_package, "--source", demo_samples()[0].parent, "--max-fps", 6, "--max-frames", 9, "--no-governor"),
            stdout=subprocess.DEVNULL, stderr=slave, env=_env(),
        )  # fmt: skip
        os.close(slave)
        chunks = []
        while True:
            try:
                b = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not b:
                break
            chunks.append(b)
        assert proc.wait(120) == 0
    finally:
        os.close(master)
    text = b"".join(chunks).decode()
    assert "\r" in text and "\x1b[K" in text
    redraws = [seg for seg in text.split("\r") if STATUS.match(seg)]
    assert len(redraws) >= 2, text  # about 1.3 s at 6 fps, redrawn every 0.25 s
    assert "summary: frames_in=9 processed=9 dropped={} in_flight=0 (stopped)" in text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_a_live_source_and_still_prints_the_summary(demo_package: Path, tmp_path: Path, sig: int) -> None:
    jl = tmp_path / "live.jsonl"
    proc = subprocess.Popen(
        _cmd(demo_package, "--source", "synthetic://320x240?fps=30&frames=100000", "--jsonl", jl),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not jl.exists() or len(jl.read_text().splitlines()) < 10):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "interrupted; stopping" in err
    frames_in, processed, dropped, in_flight, state = _summary(err)
    assert in_flight == 0 and state == "stopped" and processed >= 10
    assert frames_in == processed + sum(dropped.values())  # every frame processed or dropped with its reason
    assert set(dropped) <= {"evicted", "rate_limit", "shutdown"}
    assert len(_jsonl(jl)) == processed  # every processed frame's line was written before the exit
    assert re.search(r"^governor: (normal|constrained|critical) at the end; events \d+$", err, re.M), err


def test_governor_lines_leave_out_a_reason_they_already_printed() -> None:
    """The status lines of governor events: a transition with its reason, then ladder steps whose reason only
    repeats it as one short line each; a new reason (the run finishing) is printed again."""
    from edge_sdk.budget.governor import GovernorEvent, GovernorState
    from edge_sdk.pipelines.run_command import _GovernorLines

    hot = "temp 81.0 C >= soft limit 80 C"
    lines = _GovernorLines()
    C = GovernorState.CONSTRAINED
    got = [
        lines(GovernorEvent(0.0, "transition", C, None, hot, "normal -> constrained")),
        lines(GovernorEvent(1.0, "applied", C, "lower_rate", f"constrained: {hot}", "cam: 30 -> 15 fps")),
        lines(GovernorEvent(2.0, "skipped", C, "offload", f"constrained: {hot}", "no remote configured")),
        lines(GovernorEvent(3.0, "undone", C, "lower_rate", "edge-sdk run finished", "cam: 15 -> 30 fps")),
    ]
    assert got == [
        f"governor: transition: normal -> constrained ({hot})",
        "governor: applied lower_rate: cam: 30 -> 15 fps",
        "governor: skipped offload: no remote configured",
        "governor: undone lower_rate: cam: 15 -> 30 fps (edge-sdk run finished)",
    ]
