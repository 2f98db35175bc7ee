"""Camera and video pipelines: frame sources, a threaded inference pipeline with drop
policies and frame accounting, and sinks.

    import edge_sdk
    from edge_sdk.pipelines import VisionPipeline, PipelineOptions, JsonLinesSink

    with edge_sdk.load(edge_sdk.demo_package_path()) as model, JsonLinesSink("out.jsonl") as out:
        pipeline = VisionPipeline(model, "synthetic://320x240?frames=100", PipelineOptions(), sinks=[out])
        print(pipeline.run())   # frames_in=100 processed=100 dropped={} in_flight=0 (stopped)

Importing this package imports numpy only; OpenCV and picamera2 are imported when a source or
sink opens.
"""

from __future__ import annotations

from .errors import (
    InvalidFrameError,
    PipelineError,
    PipelineStateError,
    SinkError,
    SourceClosedError,
    SourceError,
    UnknownSourceError,
)
from .sinks import AnnotatedVideoSink, CallbackSink, JsonLinesSink, Sink, SinkState, frame_result_record
from .sources import (
    Backoff,
    Capture,
    Frame,
    FrameDrop,
    FrameSource,
    GStreamerSource,
    ImageFolderSource,
    NetworkSource,
    OpenCVSource,
    Picamera2Source,
    SourceEvent,
    SourceOptions,
    SourceState,
    SyntheticSource,
    csi_pipeline,
    source_from_uri,
)
from .vision import DROP_POLICIES, DROP_REASONS, FrameResult, PipelineCounters, PipelineOptions, PipelineState, VisionPipeline

__all__ = [
    "AnnotatedVideoSink",
    "Backoff",
    "CallbackSink",
    "Capture",
    "DROP_POLICIES",
    "DROP_REASONS",
    "Frame",
    "FrameDrop",
    "FrameResult",
    "FrameSource",
    "GStreamerSource",
    "ImageFolderSource",
    "InvalidFrameError",
    "JsonLinesSink",
    "NetworkSource",
    "OpenCVSource",
    "Picamera2Source",
    "PipelineCounters",
    "PipelineError",
    "PipelineOptions",
    "PipelineState",
    "PipelineStateError",
    "Sink",
    "SinkError",
    "SinkState",
    "SourceClosedError",
    "SourceError",
    "SourceEvent",
    "SourceOptions",
    "SourceState",
    "SyntheticSource",
    "UnknownSourceError",
    "VisionPipeline",
    "csi_pipeline",
    "frame_result_record",
    "source_from_uri",
]
