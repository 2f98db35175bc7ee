"""edge_sdk: run machine-learning models on edge devices.

    import edge_sdk
    with edge_sdk.load("shapes-classifier/") as model:
        print(model.selection.explain())
        result = model.predict_image("circle.png")
        print(result.top1, result.timings)

Nothing happens at import time: no runtime is imported and no device probed
until you call a function that needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors
from ._version import __version__
from .errors import EdgeSDKError

# Lazy attributes keep `import edge_sdk` cheap (numpy-only modules load on use).
_LAZY = {
    "load": ("model", "load"),
    "LoadOptions": ("model", "LoadOptions"),
    "Model": ("model", "Model"),
    "Result": ("model", "Result"),
    "PreparedImage": ("model", "PreparedImage"),
    "Timings": ("model", "Timings"),
    "Stream": ("model", "Stream"),
    "ModelPackage": ("package", "ModelPackage"),
    "Manifest": ("package", "Manifest"),
    "Classification": ("processing.decoders", "Classification"),
    "detect": ("profiles", "detect"),
    "load_profile": ("profiles", "load_profile"),
    "list_profiles": ("profiles", "list_profiles"),
    "resolve_profile": ("profiles", "resolve_profile"),
    "DeviceProfile": ("profiles", "DeviceProfile"),
    "Selection": ("selection", "Selection"),
    "demo_package_path": ("assets", "demo_package_path"),
}

if TYPE_CHECKING:  # pragma: no cover
    from .assets import demo_package_path
    from .model import LoadOptions, Model, PreparedImage, Result, Stream, Timings, load
    from .package import Manifest, ModelPackage
    from .processing.decoders import Classification
    from .profiles import DeviceProfile, detect, list_profiles, load_profile, resolve_profile
    from .selection import Selection


def __getattr__(name: str) -> Any:
    try:
        mod, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'edge_sdk' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), attr)
    globals()[name] = value
    return value


__all__ = ["EdgeSDKError", "errors", "__version__", *_LAZY]
