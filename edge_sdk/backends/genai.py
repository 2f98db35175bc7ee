"""onnxruntime-genai, the peer ``edge-sdk bench --vs-raw`` measures a decoder package against (the
same ``.onnx`` file in onnxruntime-genai's own generation loop). It is never a runtime dependency:
imported only when asked for, like every runtime, behind this seam."""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import MissingDependencyError

__all__ = ["require_genai"]


def require_genai(purpose: str, install: str) -> Any:
    """The ``onnxruntime_genai`` module (untyped, optional: Any on purpose), or MissingDependencyError
    saying ``purpose`` needs it and how to install it (``install``)."""
    try:
        return importlib.import_module("onnxruntime_genai")
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} compares with onnxruntime-genai, which is not installed: {install}") from e
