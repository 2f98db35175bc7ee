"""Optional dependencies, imported when first needed, with errors that name the extra."""

from __future__ import annotations

from typing import Any

from .errors import MissingDependencyError

VISION = "pip install 'edge-sdk[vision]' (opencv-python-headless, pillow)"


def require_cv2(purpose: str) -> Any:
    """The ``cv2`` module, or MissingDependencyError saying ``purpose`` needs OpenCV."""
    try:
        import cv2
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs OpenCV: {VISION}") from e
    return cv2
