"""Face detection from a Raspberry Pi camera (or a USB camera, or a video file), kept inside the
board's thermal budget by the governor, with an annotated video and/or a preview window.

    python samples/pi_camera_detect.py --camera picamera2 --preview          # on a Pi with a camera
    python samples/pi_camera_detect.py --camera usb:0 --output faces.avi     # a USB webcam
    python samples/pi_camera_detect.py --input clip.avi --simulate-heat --output out.avi   # no camera (CI)
    python samples/pi_camera_detect.py --short --simulate-heat               # writes a test clip first

The detector is MediaPipe's BlazeFace short-range (tools/fixtures/face_package.py builds the package once,
with fp32 TFLite, fp32 ONNX and fp16 ONNX variants; edge_sdk picks one for the device profile).
Every frame is processed, dropped with a reason, or still in flight; the summary at the end says
which. ``--simulate-heat`` replaces the board's sensors with edge_sdk's thermal simulator (a fake
/sys/class/thermal tree that the real SensorReader reads), started over the profile's critical
limit, so the governor acts at once (lower frame rate, lighter variant...) and gives each step back
as the simulated SoC cools. Exit status: 0 done, 1 an edge_sdk error (printed), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools/ (the face package builder) lives in the repository

import cv2  # noqa: E402

import edge_sdk  # noqa: E402
from edge_sdk.budget import Budget, Governor, SensorReader, ThermalModel, ThermalSimulator  # noqa: E402
from edge_sdk.pipelines import JsonLinesSink, PipelineOptions, VisionPipeline  # noqa: E402

STATE_COLOURS = {"normal": (0, 200, 0), "constrained": (0, 200, 255), "critical": (0, 0, 255)}  # BGR


def source_for(camera: str | None, profile) -> str | int:
    """--camera picamera2[:N] | usb:N | csi:N | any edge_sdk source URI; default: the profile's camera."""
    if camera is None:
        return profile.camera_source  # e.g. "picamera2://0" on a Pi
    kind, _, index = camera.partition(":")
    if kind == "picamera2" and not index.startswith("//"):
        return f"picamera2://{index or 0}"
    if kind == "usb":
        return int(index or 0)  # an OpenCV device index (V4L2 /dev/videoN on Linux)
    if kind == "csi" and not index.startswith("//"):
        return f"csi://{index or 0}"
    return camera  # rtsp://..., v4l2:///dev/video1, a GStreamer pipeline ...


class Annotator:
    """A pipeline sink: draws boxes, scores and the governor state on a copy of each frame, writes
    it to a video file and/or hands it to the main thread for the preview window (OpenCV's GUI
    must run on the main thread on some platforms, so the sink never calls imshow itself)."""

    def __init__(self, out_path: Path | None, fps: float, preview: bool) -> None:
        self.out_path, self.fps, self.writer = out_path, fps, None
        self.latest: queue.Queue = queue.Queue(maxsize=1) if preview else None
        self.faces = self.frames_with_faces = 0

    def __call__(self, fr) -> None:
        img = fr.frame.image.copy()  # frames are read-only: draw on a copy
        det = fr.result.decoded
        self.faces += len(det.scores)
        self.frames_with_faces += len(det.scores) > 0
        for (x0, y0, x1, y1), score in zip(det.xyxy, det.scores):
            cv2.rectangle(img, (int(x0), int(y0)), (int(x1), int(y1)), (0, 255, 0), 2)
            cv2.putText(img, f"face {score:.2f}", (int(x0), max(int(y0) - 4, 12)), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 255, 0), 1)
        state = fr.budget_state or "no governor"
        cv2.putText(img, f"governor: {state}", (8, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.6, STATE_COLOURS.get(state, (255, 255, 255)), 2)
        cv2.putText(img, f"frame {fr.index}  {fr.latency_ms:.0f} ms", (8, 42), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1)
        if self.out_path is not None:
            if self.writer is None:
                self.writer = cv2.VideoWriter(str(self.out_path), cv2.VideoWriter_fourcc(*"MJPG"), self.fps, (img.shape[1], img.shape[0]))
                if not self.writer.isOpened():
                    raise edge_sdk.pipelines.SinkError(f"OpenCV cannot write an MJPG video at {self.out_path}")
            self.writer.write(img)
        if self.latest is not None:  # keep only the newest frame for the window
            try:
                self.latest.get_nowait()
            except queue.Empty:
                pass
            self.latest.put_nowait(img)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.release()


def make_sensors(profile, args, work: Path):
    """(read, budget, simulator or None): the board's sensors and the profile's limits, or with
    --simulate-heat the simulator's fake /sys/class/thermal tree, read by the same SensorReader."""
    if not args.simulate_heat:
        return SensorReader(profile).read, Budget.from_profile(profile, unknown_policy=args.unknown_policy), None
    soft, hard = profile.thermal.warn_c, profile.thermal.critical_c
    # A quick SoC (tau 1.5 s instead of about a minute) that idles 14 C under the soft limit, started
    # 1 C over the critical one: the governor goes CRITICAL at its first sample and steps back down as
    # it cools. Only temperatures are simulated, so no power budget; dwell 1 s so it plays out in seconds.
    zone = profile.thermal.zones[0] if profile.thermal.zones else "cpu-thermal"
    sim = ThermalSimulator(work / "sysfs", ThermalModel(ambient_c=soft - 20, r_c_per_w=4.0, tau_s=1.5), zone_type=zone, start_c=hard + 1)
    budget = Budget.from_profile(profile, power_budget_w=None, hysteresis_c=2.0, min_dwell_s=1.0, sample_interval_s=0.1)
    return SensorReader(profile, root=work / "sysfs", vcgencmd=False, battery=None).read, budget, sim


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Face detection from a Pi/USB camera or a video file, with the thermal governor on.")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--camera", help="picamera2[:N], usb:N, csi:N or an edge_sdk source URI (default: the profile's camera)")
    src.add_argument("--input", type=Path, help="a video file instead of a camera")
    src.add_argument("--short", action="store_true", help="write a 60-frame test clip (tools/fixtures/face_clip.py) and use it")
    ap.add_argument("--package", type=Path, help="face package (default: built and cached by tools/fixtures/face_package.py)")
    ap.add_argument("--profile", help="device profile name (default: $EDGE_SDK_PROFILE or the detected board)")
    ap.add_argument("--variant", help="force a variant (default: the selection's choice)")
    ap.add_argument("--output", type=Path, help="write the annotated video here (.avi, MJPG)")
    ap.add_argument("--jsonl", type=Path, help="write one JSON record per frame here (detections, governor state)")
    ap.add_argument("--preview", action="store_true", help="show the annotated frames in a window (q quits)")
    ap.add_argument("--fps", type=float, default=30.0, help="frame-rate limit the governor lowers (0: none; default 30)")
    ap.add_argument("--frames", type=int, default=0, help="stop after this many processed frames (0: until the source ends)")
    ap.add_argument("--simulate-heat", action="store_true", help="use the thermal simulator instead of the board's sensors")
    ap.add_argument(
        "--unknown-policy", default="degrade", choices=["degrade", "hold", "ignore"], help="governor policy for unreadable sensors"
    )
    args = ap.parse_args(argv)
    if args.fps < 0 or args.frames < 0:
        ap.error("--fps and --frames must be >= 0")
    work = Path(tempfile.mkdtemp(prefix="pi-detect-"))  # the --short clip and the simulated sysfs tree
    try:
        return run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> int:
    if args.preview:  # fail early: headless OpenCV builds (opencv-python-headless) have no GUI
        try:
            cv2.namedWindow("faces")
        except cv2.error as e:
            print(f"error: --preview needs OpenCV with a GUI and a display (opencv-python, not -headless): {e}", file=sys.stderr)
            return 1
    try:
        if args.short:  # the benchmark's clip: the astronaut's face pasted at known places
            from tools.fixtures.face_clip import write_clip

            args.input = work / "clip.avi"
            write_clip(args.input, 60)
        if args.package is None:
            from tools.fixtures.face_package import face_package

            args.package = face_package()
        model = edge_sdk.load(args.package, args.profile, variant=args.variant)
    except (edge_sdk.EdgeSDKError, OSError, RuntimeError) as e:
        print(f"error: cannot prepare the model: {e}", file=sys.stderr)
        return 1

    events = []
    with model:
        profile = model.detection.profile
        print(model.selection.explain(), end="\n\n")
        annot = Annotator(args.output, args.fps or 30.0, args.preview)
        jsonl = JsonLinesSink(args.jsonl) if args.jsonl else None
        sinks = [annot, jsonl] if jsonl else [annot]
        try:
            source = str(args.input) if args.input else source_for(args.camera, profile)
            read, budget, sim = make_sensors(profile, args, work)
            if sim is not None:
                sinks.append(sim.work_sink())  # the simulated SoC heats with the real inference work
            # Files: every frame, read no faster than --fps (as a camera would deliver it).
            # Cameras: keep only the newest frame, drop the ones over --fps (reason rate_limit).
            pipe = VisionPipeline(model, source, PipelineOptions(max_fps=args.fps or None), sinks=sinks)
            # The default ladder acts on the pipeline: lower_rate, lighter_variant, offload, pause_low_priority.
            gov = Governor(read, budget, pipelines=[pipe])
            pipe.governor = gov  # its state on every FrameResult
            gov.subscribe(lambda e: e.kind in ("transition", "applied", "undone") and events.append(e))
            print(f"source {source} ({'live' if pipe.source.live else 'file'}), {'simulated heat' if sim else 'board sensors'}, "
                  f"limits soft {gov.budget.soft_c:.0f} C / hard {gov.budget.hard_c:.0f} C")  # fmt: skip
            t0 = time.monotonic()
            with sim or contextlib.nullcontext(), gov:
                pipe.start()
                try:
                    while not pipe.join(timeout=0.03):  # the main thread shows the preview meanwhile
                        if annot.latest is not None and not annot.latest.empty():
                            cv2.imshow("faces", annot.latest.get_nowait())
                            if cv2.waitKey(1) & 0xFF == ord("q"):
                                pipe.stop()
                        if args.frames and pipe.counters().processed >= args.frames:
                            pipe.stop()
                except KeyboardInterrupt:
                    pipe.stop("discard")
                    pipe.join(10)
            if pipe.error is not None:
                raise pipe.error
        except edge_sdk.EdgeSDKError as e:  # a camera that cannot be opened, a file that is not a video ...
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            annot.close()
            if jsonl:
                jsonl.close()
            if args.preview:
                cv2.destroyAllWindows()

    c = pipe.counters()
    wall = time.monotonic() - t0
    dropped = {reason: n for reason, n in c.dropped.items() if n}  # reason -> count, e.g. rate_limit, evicted
    print(f"frames: {c.frames_in} read, {c.processed} processed, dropped {dropped or 'none'} in {wall:.1f} s")
    print(f"faces: {annot.faces} in {annot.frames_with_faces} frames")
    print(f"governor: {len([e for e in events if e.kind == 'transition'])} transitions, final state {gov.state.value}")
    for e in events:
        print(f"  {e.timestamp_ms / 1000 - t0:6.2f} s  {e.kind:10s} {e.action or '':16s} {e.detail}  ({e.reason})")
    if args.output:
        print(f"annotated video: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
