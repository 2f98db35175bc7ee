"""Runtime backends behind one seam; see :mod:`edge_sdk.backends.base`."""

from .base import (
    BACKENDS,
    BackendStatus,
    ModelSource,
    Session,
    SessionInfo,
    SessionOptions,
    TensorInfo,
    all_backend_status,
    backend_status,
    open_session,
)

__all__ = [
    "BACKENDS",
    "BackendStatus",
    "ModelSource",
    "Session",
    "SessionInfo",
    "SessionOptions",
    "TensorInfo",
    "all_backend_status",
    "backend_status",
    "open_session",
]
