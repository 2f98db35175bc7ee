"""Optional dependencies, imported when first needed, with errors that name the extra."""

from __future__ import annotations

from typing import Any

from .errors import MissingDependencyError

VISION = "pip install 'edge-sdk[vision]' (opencv-python-headless, pillow)"
GENERATE = "pip install 'edge-sdk[generate]' (tokenizers, jinja2)"


def require_cv2(purpose: str) -> Any:
    """The ``cv2`` module, or MissingDependencyError saying ``purpose`` needs OpenCV."""
    try:
        import cv2
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs OpenCV: {VISION}") from e
    return cv2


def require_tokenizers(purpose: str) -> Any:
    """The ``tokenizers`` module, or MissingDependencyError saying ``purpose`` needs it."""
    try:
        import tokenizers
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs the 'tokenizers' package: {GENERATE}") from e
    return tokenizers


def require_jinja2(purpose: str) -> Any:
    """The ``jinja2`` module, or MissingDependencyError saying ``purpose`` needs it."""
    try:
        import jinja2
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs the 'jinja2' package: {GENERATE}") from e
    return jinja2
