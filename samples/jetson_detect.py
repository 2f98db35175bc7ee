"""Face detection on a Jetson: a CSI or RTSP camera (or a video file) through the fp16 ONNX
variant on TensorRT / CUDA where onnxruntime has them, on the CPU where it does not.

    python samples/jetson_detect.py                                  # the profile's camera (csi://0)
    python samples/jetson_detect.py --camera rtsp://10.0.0.5:8554/cam --output faces.avi
    python samples/jetson_detect.py --camera csi:1 --size 1280x720 --fps 30
    EDGE_SDK_PROFILE=jetson-orin-nano python samples/jetson_detect.py --input clip.avi   # no camera (CI)
    python samples/jetson_detect.py --short                          # writes a test clip first

The package (tools/fixtures/face_package.py: MediaPipe's BlazeFace short-range as fp32 TFLite, fp32 ONNX
and fp16 ONNX) is chosen from by edge_sdk for the device profile: the Jetson profiles rank fp16
first and ask onnxruntime for TensorrtExecutionProvider, CUDAExecutionProvider, then the CPU. The
sample prints the selection with every reason (``model.selection.explain()``) and the providers the
session really runs on, so a missing GPU build of onnxruntime (e.g. the PyPI wheel on a Jetson, or
this sample on a laptop) shows up as "fell back to CPU" rather than as a mystery slowdown.
Exit status: 0 done, 1 an edge_sdk error (printed), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools/ (the face package builder) lives in the repository

import edge_sdk  # noqa: E402
from edge_sdk.pipelines import AnnotatedVideoSink, JsonLinesSink, PipelineOptions, SourceOptions, VisionPipeline  # noqa: E402

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


def source_for(camera: str | None, profile) -> str:
    """--camera csi:N | rtsp://... | any edge_sdk source URI; default: the profile's camera (csi://0)."""
    if camera is None:
        return profile.camera_source
    kind, _, index = camera.partition(":")
    if kind == "csi" and not index.startswith("//"):
        return f"csi://{index or 0}"  # nvarguscamerasrc through OpenCV's GStreamer backend
    return camera


def report_backend(model) -> None:
    """Which variant, runtime and execution providers run the model, and why."""
    print(model.selection.explain())
    d = model.describe()
    gpu = [p for p in d["providers"] if p in GPU_PROVIDERS]
    print(f"variant {d['variant']} ({d['precision']}) on {d['backend']} ({d['runtime']})")
    if d["backend"] == "onnxruntime":
        print(f"providers: {d['providers']}")
        for note in d["notes"]:  # e.g. "CUDAExecutionProvider requested by the profile but not in this onnxruntime build"
            print(f"  note: {note}")
        if gpu:
            print(f"GPU: {gpu[0]} runs the model (the CPU takes only what it cannot)")
        else:
            wanted = [p for p in model.detection.profile.runtime.onnxruntime_providers if p in GPU_PROVIDERS]
            why = f"none of {wanted} is available in this onnxruntime build" if wanted else "the profile asks for no GPU provider"
            print(f"CPU fallback: {why}; running on CPUExecutionProvider")
    print()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description="Face detection from a Jetson CSI/RTSP camera or a video file (fp16 ONNX on TensorRT/CUDA, else CPU)."
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--camera", help="csi:N, rtsp://..., or an edge_sdk source URI (default: the profile's camera)")
    src.add_argument("--input", type=Path, help="a video file instead of a camera")
    src.add_argument("--short", action="store_true", help="write a 60-frame test clip (tools/fixtures/face_clip.py) and use it")
    ap.add_argument("--package", type=Path, help="face package (default: built and cached by tools/fixtures/face_package.py)")
    ap.add_argument("--profile", help="device profile, e.g. jetson-orin-nano (default: $EDGE_SDK_PROFILE or the detected board)")
    ap.add_argument("--variant", help="force a variant, e.g. fp32-tflite (default: the selection's choice)")
    ap.add_argument("--size", default="1280x720", help="capture size WxH asked of a camera (default 1280x720)")
    ap.add_argument("--fps", type=float, default=0.0, help="frame-rate limit (0: none)")
    ap.add_argument("--frames", type=int, default=0, help="stop after this many processed frames (0: until the source ends)")
    ap.add_argument("--output", type=Path, help="write the annotated video here (.avi, MJPG)")
    ap.add_argument("--jsonl", type=Path, help="write one JSON record per frame here")
    args = ap.parse_args(argv)
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
        source_options = SourceOptions(size_wh=(w, h), fps=args.fps or None)
    except ValueError as e:
        ap.error(f"--size: expected WxH such as 1280x720, got {args.size!r} ({e})")
    if args.fps < 0 or args.frames < 0:
        ap.error("--fps and --frames must be >= 0")

    with tempfile.TemporaryDirectory(prefix="jetson-detect-") as work:
        try:
            if args.short:  # the benchmark's clip: the astronaut's face pasted at known places
                from tools.fixtures.face_clip import write_clip

                args.input = Path(work) / "clip.avi"
                write_clip(args.input, 60)
            if args.package is None:
                from tools.fixtures.face_package import face_package

                args.package = face_package()
            model = edge_sdk.load(args.package, args.profile, variant=args.variant)
        except (edge_sdk.EdgeSDKError, OSError, RuntimeError) as e:
            print(f"error: cannot prepare the model: {e}", file=sys.stderr)
            return 1
        with model:
            report_backend(model)
            return run(model, args, source_options)


def run(model, args: argparse.Namespace, source_options: SourceOptions) -> int:
    faces: list[int] = []
    latencies: list[float] = []

    def tally(fr) -> None:
        faces.append(len(fr.result.decoded.scores))
        latencies.append(fr.result.timings.total_ms)

    sinks = [tally]
    try:
        if args.output:
            sinks.append(AnnotatedVideoSink(args.output, fps=args.fps or 30.0))  # boxes, labels and scores drawn
        if args.jsonl:
            sinks.append(JsonLinesSink(args.jsonl))
        source = str(args.input) if args.input else source_for(args.camera, model.detection.profile)
        # A network stream reconnects with backoff (SourceOptions.reconnect) and times out after
        # network_timeout_ms instead of hanging; a camera keeps only the newest frame (drop policy latest).
        pipe = VisionPipeline(model, source, PipelineOptions(max_fps=args.fps or None), sinks=sinks, source_options=source_options)
        print(f"source {source} ({'live' if pipe.source.live else 'file'})")
        t0 = time.monotonic()
        pipe.start()
        try:
            while not pipe.join(timeout=0.05):
                if args.frames and pipe.counters().processed >= args.frames:
                    pipe.stop()
        except KeyboardInterrupt:
            pipe.stop("discard")
            pipe.join(10)
        if pipe.error is not None:
            raise pipe.error
    except edge_sdk.EdgeSDKError as e:  # camera/stream that cannot be opened, a file that is not a video ...
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for s in sinks[1:]:
            s.close()
    wall = time.monotonic() - t0
    c = pipe.counters()
    dropped = {reason: n for reason, n in c.dropped.items() if n}
    print(f"frames: {c.frames_in} read, {c.processed} processed, dropped {dropped or 'none'} in {wall:.1f} s "
          f"({c.processed / wall:.1f} fps)")  # fmt: skip
    if latencies:
        print(f"latency per frame: median {statistics.median(latencies):.2f} ms (preprocess + inference + decode)")
    print(f"faces: {sum(faces)} in {sum(n > 0 for n in faces)} frames, on {model.variant.id}")
    if args.output:
        print(f"annotated video: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
