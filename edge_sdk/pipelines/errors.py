"""Errors raised by camera/video pipelines (a branch of :class:`edge_sdk.errors.EdgeSDKError`)."""

from __future__ import annotations

from ..errors import EdgeSDKError


class PipelineError(EdgeSDKError):
    """Base of every error a source, pipeline or sink raises on purpose."""


class SourceError(PipelineError):
    """A frame source cannot be opened or stopped delivering frames (device gone,
    network stream lost after every reconnect attempt, file unreadable)."""


class UnknownSourceError(SourceError, ValueError):
    """A source URI has a scheme no implementation handles; the message lists the known ones."""


class SourceClosedError(SourceError, RuntimeError):
    """``read()`` was called on a source that is not open (never opened, or closed)."""


class InvalidFrameError(PipelineError, ValueError):
    """A frame's image is not an HxWx3 / HxWx1 / HxW ``uint8`` array with both sides >= 1.

    Sources turn it into a dropped frame with reason ``"invalid_frame"``; it is raised
    only by direct :class:`~edge_sdk.pipelines.sources.Frame` construction."""


class PipelineStateError(PipelineError, RuntimeError):
    """A pipeline or sink was used out of order (started twice, written after close)."""


class SinkError(PipelineError):
    """A sink cannot write its output (for example OpenCV cannot open a video writer)."""
